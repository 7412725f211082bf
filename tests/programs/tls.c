/* tls.c: thread-local variables seen from main and from other threads.
 *
 * Compiled with -fPIC, so accesses use the general-dynamic model (global symbols,
 * __tls_get_addr with R_X86_64_TLSGD) and local-dynamic model (static symbols,
 * R_X86_64_TLSLD + R_X86_64_DTPOFF32) unless the compiler relaxes them.
 * Every thread's results are stored and printed by main after pthread_join, so the
 * output is deterministic. Exit code 0 when all checks pass. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

__thread int tls_init = 42;                       /* .tdata, global */
_Thread_local long tls_zero;                      /* .tbss, global */
static __thread int tls_static = 7;               /* .tdata, local */
static _Thread_local unsigned tls_static_zero;    /* .tbss, local */
static _Thread_local char tls_buf[32] = "initial-image"; /* .tdata array */
_Thread_local long tls_aligned __attribute__((aligned(64))) = 5; /* over-aligned */
static _Thread_local double tls_big[512];         /* 4 KiB .tbss */

static int failures;

struct snapshot {
    int init;
    long zero;
    int stat;
    unsigned stat_zero;
    char buf[32];
    long aligned;
    double big_sum;
    int aligned_ok;
};

static void take(struct snapshot *s)
{
    s->init = tls_init;
    s->zero = tls_zero;
    s->stat = tls_static;
    s->stat_zero = tls_static_zero;
    memcpy(s->buf, tls_buf, sizeof s->buf);
    s->aligned = tls_aligned;
    double sum = 0;
    for (int i = 0; i < 512; i++)
        sum += tls_big[i];
    s->big_sum = sum;
    s->aligned_ok = ((uintptr_t)&tls_aligned & 63) == 0;
}

static void print_snapshot(const char *who, const char *when, const struct snapshot *s)
{
    printf("%-8s %-6s init=%d zero=%ld static=%d static_zero=%u buf=%s aligned=%ld "
           "big_sum=%.1f aligned_ok=%d\n",
           who, when, s->init, s->zero, s->stat, s->stat_zero, s->buf, s->aligned, s->big_sum,
           s->aligned_ok);
}

/* Mutates this thread's copies in a thread-specific way. */
static void mutate(int id)
{
    tls_init += 100 * id;
    tls_zero = 1000L + id;
    tls_static *= id + 2;
    tls_static_zero = 0xA0u + (unsigned)id;
    snprintf(tls_buf, sizeof tls_buf, "thread-%d", id);
    tls_aligned = -id;
    for (int i = 0; i < 512; i++)
        tls_big[i] = i * 0.5 + id;
}

/* Address of this thread's tls_init, from a non-inlined function. */
__attribute__((noinline)) static int *addr_tls_init(void) { return &tls_init; }

struct thread_result {
    int id;
    struct snapshot before, after;
    int addr_differs_from_main;
    int addr_stable;
    long work;
};

static int *main_tls_init_addr;

static void *thread_main(void *arg)
{
    struct thread_result *r = arg;
    take(&r->before);
    mutate(r->id);
    /* some work that reads and writes TLS in a loop */
    for (int i = 0; i < 100000; i++)
        tls_zero += (i ^ r->id) & 7;
    r->work = tls_zero;
    take(&r->after);
    int *p = addr_tls_init();
    r->addr_differs_from_main = p != main_tls_init_addr;
    r->addr_stable = p == &tls_init;
    return NULL;
}

int main(void)
{
    struct snapshot s;
    main_tls_init_addr = addr_tls_init();

    take(&s);
    print_snapshot("main", "start", &s);
    if (s.init != 42 || s.zero != 0 || s.stat != 7 || s.stat_zero != 0 ||
        strcmp(s.buf, "initial-image") != 0 || s.aligned != 5 || s.big_sum != 0 || !s.aligned_ok)
        failures++;

    mutate(0);
    take(&s);
    print_snapshot("main", "mutated", &s);

    /* Two threads run concurrently, a third after both joined. */
    struct thread_result r[3] = {{.id = 1}, {.id = 2}, {.id = 3}};
    pthread_t t[3];
    for (int i = 0; i < 2; i++)
        if (pthread_create(&t[i], NULL, thread_main, &r[i]) != 0) {
            printf("pthread_create failed\n");
            return 2;
        }
    for (int i = 0; i < 2; i++)
        pthread_join(t[i], NULL);
    if (pthread_create(&t[2], NULL, thread_main, &r[2]) != 0) {
        printf("pthread_create failed\n");
        return 2;
    }
    pthread_join(t[2], NULL);

    for (int i = 0; i < 3; i++) {
        char who[16];
        snprintf(who, sizeof who, "thread%d", r[i].id);
        print_snapshot(who, "before", &r[i].before);
        print_snapshot(who, "after", &r[i].after);
        printf("%-8s work=%ld addr_differs_from_main=%d addr_stable=%d\n", who, r[i].work,
               r[i].addr_differs_from_main, r[i].addr_stable);
        /* each thread must start from the initialization image, not main's values */
        if (r[i].before.init != 42 || r[i].before.zero != 0 || r[i].before.stat != 7 ||
            strcmp(r[i].before.buf, "initial-image") != 0 || r[i].before.aligned != 5 ||
            r[i].before.big_sum != 0 || !r[i].before.aligned_ok)
            failures++;
        if (r[i].after.init != 42 + 100 * r[i].id || !r[i].addr_differs_from_main ||
            !r[i].addr_stable || !r[i].after.aligned_ok)
            failures++;
    }

    /* main's values are untouched by the threads */
    take(&s);
    print_snapshot("main", "end", &s);
    if (s.init != 42 || s.zero != 1000 || s.stat != 14 || strcmp(s.buf, "thread-0") != 0 ||
        addr_tls_init() != main_tls_init_addr)
        failures++;

    printf("failures=%d\n", failures);
    return failures ? 1 : 0;
}
