/* Sandbox probe: tries what a sandboxed executor must refuse and prints, for each, "ok" or
 * the errno's name. argv[1]: a file to create in an allowed directory; argv[2]: a file to
 * create in a directory not allowed; argv[3]: a file to read that is not allowed.
 * Every attempt that a sandbox would refuse is harmless when it is not refused: modes,
 * owners, times and file attributes are set to what they are already, namespaces made are
 * left at once, the descriptor taken through a pidfd is the probe's own, memory made
 * writable and executable is unmapped and the personality restored (execve and ptrace
 * excepted: run unsandboxed, it becomes /bin/true). Run as a user, the files the metadata
 * cases touch must be the user's (argv[3] chowned to it) for their refusal to mean
 * anything. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/fs.h>
#include <netinet/in.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/personality.h>
#include <sys/ptrace.h>
#include <sys/shm.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <sys/xattr.h>
#include <unistd.h>

static const char *result(int ok) {
    if (ok) return "ok";
    switch (errno) {
    case EPERM: return "EPERM";
    case EACCES: return "EACCES";
    case ENOSYS: return "ENOSYS";
    default: return strerror(errno);
    }
}

/* A raw clone with `flags`: the child leaves at once; true if it was made. */
static int clone_with(unsigned long flags) {
    long pid = syscall(SYS_clone, flags | SIGCHLD, 0, 0, 0, 0);
    if (pid == 0) _exit(0);
    if (pid < 0) return 0;
    waitpid((pid_t)pid, NULL, 0);
    return 1;
}

/* clone3 asking for a new user namespace. */
static int clone3_newuser(void) {
    struct {
        uint64_t flags, pidfd, child_tid, parent_tid, exit_signal, stack, stack_size, tls;
    } args = {.flags = CLONE_NEWUSER, .exit_signal = SIGCHLD};
    long pid = syscall(SYS_clone3, &args, sizeof args);
    if (pid == 0) _exit(0);
    if (pid < 0) return 0;
    waitpid((pid_t)pid, NULL, 0);
    return 1;
}

/* "none" if this process holds no capability (and its bounding set is empty, or it is
 * not root: an unprivileged process cannot empty it and gains nothing by it). */
static void capabilities(void) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    unsigned long long eff = ~0ULL, prm = ~0ULL, bnd = ~0ULL;
    while (f && fgets(line, sizeof line, f)) {
        sscanf(line, "CapEff: %llx", &eff);
        sscanf(line, "CapPrm: %llx", &prm);
        sscanf(line, "CapBnd: %llx", &bnd);
    }
    if (f) fclose(f);
    if (eff == 0 && prm == 0 && (bnd == 0 || geteuid() != 0))
        printf("capabilities: none\n");
    else
        printf("capabilities: effective %llx, permitted %llx, bounding %llx\n", eff, prm, bnd);
}

static void *thread_main(void *arg) { return arg; }

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

    /* File metadata, outside the writable directories: to what it is already. */
    struct stat st;
    stat(argv[3], &st);
    printf("chmod: %s\n", result(chmod(argv[3], st.st_mode & 07777) == 0));
    printf("chown: %s\n", result(chown(argv[3], st.st_uid, st.st_gid) == 0));
    struct timespec keep[2] = {{.tv_nsec = UTIME_OMIT}, {.tv_nsec = UTIME_OMIT}};
    printf("utimensat: %s\n", result(utimensat(AT_FDCWD, argv[3], keep, 0) == 0));
    printf("setxattr: %s\n", result(setxattr(argv[3], "user.kiln_probe", "x", 1, 0) == 0));
    struct stat hs;
    fd = open("/etc/hostname", O_RDONLY);
    int fchmod_ok = fd >= 0 && fstat(fd, &hs) == 0 && fchmod(fd, hs.st_mode & 07777) == 0;
    printf("fchmod: %s\n", result(fchmod_ok));
    if (fd >= 0) close(fd);
    /* Inside the writable directory too, on the probe's own file (so refused by nothing
     * but the sandbox, for root and for a user alike). */
    fd = open(argv[1], O_RDONLY);
    int own_ok = fd >= 0 && fstat(fd, &hs) == 0 && fchmod(fd, hs.st_mode & 07777) == 0;
    printf("fchmod allowed: %s\n", result(own_ok));
    int attributes = 0;
    int attributes_ok = fd >= 0 && ioctl(fd, FS_IOC_GETFLAGS, &attributes) == 0 &&
                        ioctl(fd, FS_IOC_SETFLAGS, &attributes) == 0;
    printf("file attributes: %s\n", result(attributes_ok));
    if (fd >= 0) close(fd);

    /* Reaching into a process (this one) through a pidfd. */
    long pidfd = syscall(SYS_pidfd_open, getpid(), 0);
    long stolen = pidfd >= 0 ? syscall(SYS_pidfd_getfd, (int)pidfd, 0, 0) : -1;
    printf("pidfd_getfd: %s\n", result(stolen >= 0));
    if (stolen >= 0) close((int)stolen);
    if (pidfd >= 0) close((int)pidfd);

    /* Namespaces, io_uring. */
    printf("clone newuser: %s\n", result(clone_with(CLONE_NEWUSER)));
    printf("clone newnet: %s\n", result(clone_with(CLONE_NEWNET)));
    printf("clone3: %s\n", result(clone3_newuser()));
    unsigned char params[120] = {0};
    long ring = syscall(SYS_io_uring_setup, 4, params);
    printf("io_uring: %s\n", result(ring >= 0));
    if (ring >= 0) close((int)ring);

    /* Memory writable and executable at once. */
    long page = sysconf(_SC_PAGESIZE);
    void *p = mmap(NULL, (size_t)page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    printf("mprotect wx: %s\n",
           result(p != MAP_FAILED && mprotect(p, (size_t)page, PROT_READ | PROT_WRITE | PROT_EXEC) == 0));
    void *q = mmap(NULL, (size_t)page, PROT_READ | PROT_WRITE | PROT_EXEC, MAP_PRIVATE | MAP_ANONYMOUS,
                   -1, 0);
    printf("mmap wx: %s\n", result(q != MAP_FAILED));
    if (q != MAP_FAILED) munmap(q, (size_t)page);
    if (p != MAP_FAILED) munmap(p, (size_t)page);
    int shm = shmget(IPC_PRIVATE, (size_t)page, IPC_CREAT | 0700);
    void *r = shm >= 0 ? shmat(shm, NULL, SHM_EXEC) : (void *)-1;
    printf("shmat exec: %s\n", result(r != (void *)-1));
    if (r != (void *)-1) shmdt(r);
    if (shm >= 0) shmctl(shm, IPC_RMID, NULL);
    /* READ_IMPLIES_EXEC: the kernel would add PROT_EXEC to every readable mapping made
     * after it (a writable one too), past the filter's look at mmap's arguments. */
    int persona = personality(0xffffffff);
    int implied = personality((unsigned long)persona | READ_IMPLIES_EXEC) != -1;
    printf("personality: %s\n", result(implied));
    if (implied) personality((unsigned long)persona);

    capabilities();

    /* What stays: threads. */
    pthread_t t;
    int made = pthread_create(&t, NULL, thread_main, NULL) == 0 && pthread_join(t, NULL) == 0;
    printf("thread: %s\n", result(made));
    return 0;
}
