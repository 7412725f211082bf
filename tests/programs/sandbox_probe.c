/* Sandbox probe: tries what a sandboxed executor must refuse and prints, for each, "ok" or
 * the errno's name. argv[1]: a file to create in an allowed directory; argv[2]: a file to
 * create in a directory not allowed; argv[3]: a file to read that is not allowed. */
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>
#include <sys/ptrace.h>
#include <sys/socket.h>
#include <unistd.h>

static const char *result(int ok) {
    if (ok) return "ok";
    switch (errno) {
    case EPERM: return "EPERM";
    case EACCES: return "EACCES";
    default: return strerror(errno);
    }
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: sandbox_probe ALLOWED FORBIDDEN SECRET\n");
        return 2;
    }
    char *const args[] = {"/bin/true", NULL};
    int rc = execv("/bin/true", args); /* returns only if refused */
    printf("execve: %s\n", result(rc == 0));
    printf("ptrace: %s\n", result(ptrace(PTRACE_TRACEME, 0, NULL, NULL) == 0));
    int s = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    int bound = bind(s, (struct sockaddr *)&a, sizeof a) == 0;
    printf("listen: %s\n", result(bound && listen(s, 1) == 0));
    close(s);
    int fd = open("/etc/hostname", O_RDONLY);
    printf("read /etc: %s\n", result(fd >= 0));
    if (fd >= 0) close(fd);
    fd = open(argv[1], O_WRONLY | O_CREAT | O_TRUNC, 0644);
    printf("write allowed: %s\n", result(fd >= 0 && write(fd, "x\n", 2) == 2));
    if (fd >= 0) close(fd);
    fd = open(argv[2], O_WRONLY | O_CREAT | O_TRUNC, 0644);
    printf("write elsewhere: %s\n", result(fd >= 0));
    if (fd >= 0) close(fd);
    fd = open(argv[3], O_RDONLY);
    printf("read elsewhere: %s\n", result(fd >= 0));
    if (fd >= 0) close(fd);
    return 0;
}
