/* What a program gets from the C runtime rather than from relocations: atexit handlers
 * (from libc_nonshared.a, run in reverse order at exit), pthread_atfork handlers, and a
 * fork whose child has its own copy of the program's data and returns from main. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

static int counter = 100;
static int forks_prepared;

static void prepare(void) { forks_prepared++; }
static void in_child(void) { counter += 1000; }
static void registered_first(void) { printf("atexit: registered first, runs last (counter=%d)\n", counter); }
static void registered_second(void) { printf("atexit: registered second, runs first\n"); }

int main(void) {
    atexit(registered_first);
    atexit(registered_second);
    pthread_atfork(prepare, NULL, in_child);
    printf("before fork\n");
    fflush(stdout);
    pid_t pid = fork();
    if (pid < 0) {
        perror("fork");
        return 1;
    }
    if (pid == 0) {
        counter += 1;
        printf("child: counter=%d\n", counter);
        fflush(stdout);
        return 7; /* the child returns from main: its exit handlers run in the child */
    }
    int status = 0;
    waitpid(pid, &status, 0);
    printf("parent: counter=%d forks_prepared=%d child exit=%d\n", counter, forks_prepared,
           WIFEXITED(status) ? WEXITSTATUS(status) : -1);
    return 0;
}
