/* W^X probe: run inside the JIT, it scans the process's own /proc/self/maps (from main
 * and from a second thread) and prints every mapping that is writable and executable, the
 * stack's permissions, and a count. With -DSTATIC_TLS it also uses initial-exec and
 * local-exec thread-locals, which make Kiln place a static TLS block. Exit status 1 if any
 * mapping was writable and executable. */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#ifdef STATIC_TLS
__attribute__((tls_model("initial-exec"))) __thread int ie_counter = 40;
__attribute__((tls_model("local-exec"))) static __thread int le_counter = 2;
#endif

static int scan(const char *who) {
    FILE *maps = fopen("/proc/self/maps", "r");
    if (!maps) {
        perror("/proc/self/maps");
        return 1;
    }
    char line[1024], stack[5] = "none";
    int wx = 0, count = 0;
    while (fgets(line, sizeof line, maps)) {
        unsigned long start, end;
        char perms[5];
        if (sscanf(line, "%lx-%lx %4s", &start, &end, perms) != 3)
            continue;
        count++;
        if (perms[1] == 'w' && perms[2] == 'x') {
            wx++;
            printf("W+X %s", line);
        }
        if (strstr(line, "[stack]"))
            memcpy(stack, perms, sizeof stack);
    }
    fclose(maps);
    printf("%s stack=%s wx=%d maps=%d\n", who, stack, wx, count > 0);
    return wx;
}

static void *second(void *result) {
    *(int *)result = scan("thread");
    return NULL;
}

int main(void) {
#ifdef STATIC_TLS
    ie_counter += le_counter;
    printf("tls=%d\n", ie_counter);
#endif
    int wx = scan("main"), thread_wx = 0;
    pthread_t t;
    if (pthread_create(&t, NULL, second, &thread_wx) != 0)
        return 2;
    pthread_join(t, NULL);
    return wx || thread_wx;
}
