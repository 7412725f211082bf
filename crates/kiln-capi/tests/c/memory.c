/* memory.c: memory-manager callbacks — none, some, all supplied; a supplied one calling
 * the default; an allocator of its own (mmap + mprotect); a failing one; callbacks from
 * several threads at once. argv[1]: the object directory (math.o). */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/mman.h>
#include <unistd.h>
#include "check.h"

static const char *dir;
static unsigned char *math_o;
static size_t math_size;

typedef struct {
    atomic_int allocs, finalizes, frees, destroys, segments;
} counts;

/* allocate through the default, counting. */
static int counting_allocate(void *c, kiln_default_memory *d, kiln_segment *s, size_t n, void **a)
{
    counts *k = c;
    atomic_fetch_add(&k->allocs, 1);
    atomic_fetch_add(&k->segments, (int)n);
    int rc = kiln_default_allocate(d, s, n, a);
    for (size_t i = 0; rc == 0 && i < n; i++)
        CHECK(s[i].size == 0 || (s[i].target != 0 && s[i].working != NULL &&
                                 s[i].target % s[i].align == 0));
    return rc;
}
static int counting_finalize(void *c, kiln_default_memory *d, void *a, const kiln_segment *s, size_t n)
{
    (void)s; (void)n;
    atomic_fetch_add(&((counts *)c)->finalizes, 1);
    return kiln_default_finalize(d, a);
}
static void counting_free(void *c, kiln_default_memory *d, void *a, const kiln_segment *s, size_t n)
{
    (void)s; (void)n;
    atomic_fetch_add(&((counts *)c)->frees, 1);
    kiln_default_free(d, a);
}
static void counting_destroy(void *c) { atomic_fetch_add(&((counts *)c)->destroys, 1); }

static int failing_allocate(void *c, kiln_default_memory *d, kiln_segment *s, size_t n, void **a)
{
    (void)d; (void)s; (void)n; (void)a;
    atomic_fetch_add(&((counts *)c)->allocs, 1);
    return -1;
}

/* An allocator of its own: one mmap per allocation, RW while Kiln writes, then each
 * segment's pages get their permission (segments page-aligned by this allocator). */
typedef struct { void *base; size_t len; } own_block;
static int own_allocate(void *c, kiln_default_memory *d, kiln_segment *s, size_t n, void **a)
{
    (void)d;
    atomic_fetch_add(&((counts *)c)->allocs, 1);
    size_t page = (size_t)sysconf(_SC_PAGESIZE), len = 0;
    for (size_t i = 0; i < n; i++)
        len += (s[i].size + page - 1) / page * page + page;
    own_block *b = malloc(sizeof *b);
    b->len = len;
    b->base = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (b->base == MAP_FAILED) { free(b); return 1; }
    size_t at = 0;
    for (size_t i = 0; i < n; i++) {
        s[i].target = (uint64_t)(uintptr_t)((char *)b->base + at);
        s[i].working = (char *)b->base + at; /* one view */
        at += (s[i].size + page - 1) / page * page + page;
    }
    *a = b;
    return 0;
}
static int own_finalize(void *c, kiln_default_memory *d, void *a, const kiln_segment *s, size_t n)
{
    (void)d; (void)a;
    atomic_fetch_add(&((counts *)c)->finalizes, 1);
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    for (size_t i = 0; i < n; i++) {
        if (s[i].size == 0) continue;
        int prot = s[i].permission == KILN_PERMISSION_READ_EXECUTE ? PROT_READ | PROT_EXEC
                 : s[i].permission == KILN_PERMISSION_READ         ? PROT_READ
                                                                   : PROT_READ | PROT_WRITE;
        size_t len = (s[i].size + page - 1) / page * page;
        if (mprotect((void *)(uintptr_t)s[i].target, len, prot) != 0) return 1;
    }
    __builtin___clear_cache((char *)((own_block *)a)->base,
                            (char *)((own_block *)a)->base + ((own_block *)a)->len);
    return 0;
}
static void own_free(void *c, kiln_default_memory *d, void *a, const kiln_segment *s, size_t n)
{
    (void)d; (void)s; (void)n;
    atomic_fetch_add(&((counts *)c)->frees, 1);
    own_block *b = a;
    munmap(b->base, b->len);
    free(b);
}

/* Links math.o into a fresh library of `s` and calls square. */
static kiln_status link_square(kiln_session *s, uint64_t lib, long *result)
{
    kiln_error *e = NULL;
    kiln_module *m = NULL;
    kiln_status st = kiln_add_object(s, lib, "math.o", math_o, math_size, NULL, NULL, &e);
    if (st == KILN_OK) st = kiln_link(s, lib, &m, &e);
    if (st != KILN_OK) {
        fprintf(stderr, "link: %s\n", kiln_error_message(e));
        kiln_error_free(e);
        return st;
    }
    uint64_t f = kiln_module_symbol(m, "square");
    *result = ((long (*)(long))(uintptr_t)f)(9);
    OK(kiln_remove_module(s, m, &e));
    kiln_module_release(m);
    return KILN_OK;
}

static kiln_session *session_with(const kiln_memory_callbacks *cb)
{
    kiln_session_options o;
    kiln_session_options_init(&o, sizeof o);
    o.memory = cb;
    kiln_session *s = NULL;
    kiln_error *e = NULL;
    if (kiln_session_create(&o, &s, &e) != KILN_OK) {
        fprintf(stderr, "create: %s\n", kiln_error_message(e));
        exit(1);
    }
    return s;
}

typedef struct { kiln_session *s; int index; int ok; } job;
static void *thread_links(void *p)
{
    job *j = p;
    char name[32];
    snprintf(name, sizeof name, "lib%d", j->index);
    uint64_t lib;
    kiln_error *e = NULL;
    OK(kiln_create_library(j->s, name, &lib, &e));
    for (int i = 0; i < 50; i++) {
        long r = 0;
        if (link_square(j->s, lib, &r) != KILN_OK || r != 81) return NULL;
    }
    j->ok = 1;
    return NULL;
}

int main(int argc, char **argv)
{
    CHECK(argc == 2);
    dir = argv[1];
    char p[4096];
    snprintf(p, sizeof p, "%s/math.o", dir);
    math_o = read_file(p, &math_size);
    long r;

    /* None supplied: every callback NULL is Kiln's default. */
    counts none = {0};
    kiln_memory_callbacks cb0 = {&none, NULL, NULL, NULL, counting_destroy};
    kiln_session *s = session_with(&cb0);
    CHECK(link_square(s, kiln_main_library(s), &r) == KILN_OK && r == 81);
    kiln_session_dispose(s);
    CHECK(none.destroys == 1);

    /* Some: allocate supplied (calling the default), finalize and free defaulted. */
    counts some = {0};
    kiln_memory_callbacks cb1 = {&some, counting_allocate, NULL, NULL, counting_destroy};
    s = session_with(&cb1);
    CHECK(link_square(s, kiln_main_library(s), &r) == KILN_OK && r == 81);
    kiln_session_dispose(s);
    CHECK(some.allocs == 1 && some.segments >= 1 && some.destroys == 1);

    /* All supplied, each calling the default. */
    counts all = {0};
    kiln_memory_callbacks cb2 = {&all, counting_allocate, counting_finalize, counting_free, counting_destroy};
    s = session_with(&cb2);
    for (int i = 0; i < 5; i++)
        CHECK(link_square(s, kiln_main_library(s), &r) == KILN_OK && r == 81);
    kiln_session_dispose(s);
    CHECK(all.allocs == 5 && all.finalizes == 5 && all.frees == 5 && all.destroys == 1);

    /* Memory of its own. */
    counts own = {0};
    kiln_memory_callbacks cb3 = {&own, own_allocate, own_finalize, own_free, counting_destroy};
    s = session_with(&cb3);
    CHECK(link_square(s, kiln_main_library(s), &r) == KILN_OK && r == 81);
    kiln_session_dispose(s);
    CHECK(own.allocs == 1 && own.finalizes == 1 && own.frees == 1 && own.destroys == 1);

    /* Own allocate without finalize: the default refuses an allocation not its own. */
    counts half = {0};
    kiln_memory_callbacks cb4 = {&half, own_allocate, NULL, own_free, counting_destroy};
    s = session_with(&cb4);
    CHECK(link_square(s, kiln_main_library(s), &r) == KILN_ERR_MEMORY);
    CHECK(half.frees == 1); /* the allocation went back */
    kiln_session_dispose(s);

    /* A failing allocator: the link fails cleanly and the library is as before. */
    counts fail = {0};
    kiln_memory_callbacks cb5 = {&fail, failing_allocate, NULL, NULL, counting_destroy};
    s = session_with(&cb5);
    uint64_t lib = kiln_main_library(s);
    CHECK(link_square(s, lib, &r) == KILN_ERR_MEMORY);
    uint64_t addr;
    kiln_error *e = NULL;
    CHECK(kiln_lookup(s, lib, "square", &addr, &e) == KILN_ERR_UNDEFINED_SYMBOL);
    kiln_error_free(e);
    kiln_session_dispose(s);
    CHECK(fail.allocs >= 1 && fail.destroys == 1);

    /* Callbacks from several threads at once. */
    counts threads = {0};
    kiln_memory_callbacks cb6 = {&threads, counting_allocate, counting_finalize, counting_free, counting_destroy};
    s = session_with(&cb6);
    pthread_t t[4];
    job jobs[4];
    for (int i = 0; i < 4; i++) {
        jobs[i] = (job){s, i, 0};
        pthread_create(&t[i], NULL, thread_links, &jobs[i]);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(t[i], NULL);
        CHECK(jobs[i].ok);
    }
    kiln_session_dispose(s);
    CHECK(threads.allocs == 200 && threads.finalizes == 200 && threads.frees == 200);
    CHECK(threads.destroys == 1);

    free(math_o);
    printf("memory: ok\n");
    return 0;
}
