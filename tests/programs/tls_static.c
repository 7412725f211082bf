/* Thread-locals in the models of non-PIC and -fPIE code (local-exec, initial-exec) and
 * of -mtls-dialect=gnu2 (TLS descriptors): a block in static TLS, initialized in every
 * thread, existing and future. */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

__thread long counter = 5;
static __thread char greeting[32] = "hello";
static __thread int zeroed[16];
extern long bump(long by);          /* tls_static_other.c: initial-exec access */

static void *work(void *arg) {
    long by = (long)arg;
    zeroed[3] += (int)by;
    strcat(greeting, "!");
    return (void *)(bump(by) + zeroed[3] + (long)strlen(greeting));
}

int main(void) {
    pthread_t threads[3];
    for (long i = 0; i < 3; i++)
        pthread_create(&threads[i], NULL, work, (void *)((i + 1) * 10));
    for (long i = 0; i < 3; i++) {
        void *r;
        pthread_join(threads[i], &r);
        printf("thread %ld: %ld\n", i, (long)r);
    }
    counter += bump(1);
    printf("main: counter=%ld greeting=%s zeroed=%d\n", counter, greeting, zeroed[3]);
    return 0;
}
