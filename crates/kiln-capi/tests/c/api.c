/* api.c: every function of kiln.h, with its errors. Run with the object directory as
 * argv[1] (tests/c_api.rs compiles math.o, user.o, main.o, archive.a there). */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <unistd.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include "check.h"

static char path_buf[4096];
static const char *path(const char *dir, const char *name)
{
    snprintf(path_buf, sizeof path_buf, "%s/%s", dir, name);
    return path_buf;
}

static atomic_int released;
static void release_bytes(void *context) { free(context); atomic_fetch_add(&released, 1); }

static int resolve_calls;
static int resolve_host(void *context, const char *name, uint64_t *address)
{
    resolve_calls++;
    if (strcmp(name, "host_offset") == 0) {
        *address = (uint64_t)(uintptr_t)context;
        return 1;
    }
    return 0;
}
static int resolver_destroyed;
static void resolver_destroy(void *context) { (void)context; resolver_destroyed++; }

static long host_value = 1000; /* host_offset */

static int loads, frees, listener_destroyed;
static uint64_t seen_square;
static int on_load(void *context, const kiln_module_info *m)
{
    (void)context;
    loads++;
    CHECK(m->name != NULL && m->object_count >= 1 && m->section_count >= 1);
    for (size_t i = 0; i < m->symbol_count; i++)
        if (strcmp(m->symbols[i].name, "square") == 0) {
            CHECK(m->symbols[i].kind == KILN_SYMBOL_FUNCTION && m->symbols[i].size > 0);
            seen_square = m->symbols[i].address;
        }
    return 0;
}
static int on_free(void *context, const kiln_module_info *m) { (void)context; (void)m; frees++; return 0; }
static void on_destroy(void *context) { (void)context; listener_destroyed++; }

/* The same program run by a kiln-executor child process. */
static void out_of_process(const char *dir, const char *executor)
{
    kiln_error *e = NULL;
    kiln_session_options options;
    kiln_session_options_init(&options, sizeof options);
    options.executor = KILN_EXECUTOR_SPAWN;
    options.executor_path = executor;
    options.transport = KILN_TRANSPORT_COPY;
    kiln_session *s = NULL;
    OK(kiln_session_create(&options, &s, &e));
    uint64_t lib = kiln_main_library(s);
    OK(kiln_add_object_file(s, lib, path(dir, "main.o"), &e));
    OK(kiln_add_process_symbols(s, lib, &e));
    const char *args[] = {"prog", "x"};
    int status = -1;
    OK(kiln_run_main(s, lib, 2, args, &status, &e));
    CHECK(status == 2 + 40);
    kiln_session_dispose(s);
    /* A missing executor binary: an executor error, not a crash. */
    options.executor_path = "/no/such/kiln-executor";
    CHECK(kiln_session_create(&options, &s, &e) == KILN_ERR_EXECUTOR);
    CHECK(strstr(kiln_error_message(e), "/no/such/kiln-executor") != NULL);
    kiln_error_free(e);
}

int main(int argc, char **argv)
{
    CHECK(argc == 2 || argc == 3);
    const char *dir = argv[1];
    if (argc == 3)
        out_of_process(dir, argv[2]);
    CHECK(strcmp(kiln_version(), "0.1.0") == 0);

    /* Errors: NULL arguments, bad options. */
    kiln_error *e = NULL;
    kiln_session *s = NULL;
    CHECK(kiln_session_create(NULL, NULL, &e) == KILN_ERR_INVALID_ARGUMENT);
    CHECK(kiln_error_status(e) == KILN_ERR_INVALID_ARGUMENT);
    CHECK(strstr(kiln_error_message(e), "session is NULL") != NULL);
    kiln_error_free(e);
    e = NULL;
    kiln_session_options options;
    kiln_session_options_init(&options, sizeof options);
    options.size = 3;
    CHECK(kiln_session_create(&options, &s, &e) == KILN_ERR_INVALID_ARGUMENT);
    CHECK(strstr(kiln_error_message(e), "kiln_session_options_init") != NULL);
    kiln_error_free(e);
    e = NULL;
    kiln_error_free(NULL);
    CHECK(strcmp(kiln_error_message(NULL), "") == 0);

    /* A caller built against an earlier, smaller struct: the rest is defaulted. */
    {
        kiln_session_options older;
        memset(&older, 0xee, sizeof older);
        size_t old_size = offsetof(kiln_session_options, cache_dir);
        kiln_session_options_init(&older, old_size);
        CHECK(older.size == old_size);
        CHECK(*(unsigned char *)&older.cache_dir == 0xee); /* nothing written past it */
        kiln_session *old_session = NULL;
        OK(kiln_session_create(&older, &old_session, &e));
        kiln_session_dispose(old_session);
    }
    kiln_session_options_init(&options, sizeof options);
    OK(kiln_session_create(&options, &s, &e));
    uint64_t lib = kiln_main_library(s);

    /* A listener. */
    kiln_listener_callbacks lc = {NULL, on_load, on_free, on_destroy};
    kiln_listener *listener = NULL;
    OK(kiln_add_listener(s, &lc, &listener, &e));

    /* Objects: from a file, from memory copied, from memory lent; an archive; -lm;
     * a resolver; the process. */
    OK(kiln_add_object_file(s, lib, path(dir, "math.o"), &e));
    size_t size;
    unsigned char *user = read_file(path(dir, "user.o"), &size);
    OK(kiln_add_object(s, lib, "user.o", user, size, NULL, NULL, &e)); /* copied */
    memset(user, 0, size);                                              /* ours again */
    free(user);
    unsigned char *main_o = read_file(path(dir, "main.o"), &size);
    OK(kiln_add_object(s, lib, "main.o", main_o, size, release_bytes, main_o, &e)); /* lent */
    unsigned char *archive = read_file(path(dir, "archive.a"), &size);
    OK(kiln_add_archive(s, lib, "archive.a", archive, size, &e));
    free(archive);
    OK(kiln_add_library_by_name(s, lib, "m", NULL, 0, &e));
    kiln_resolver resolver = {&host_value, resolve_host, resolver_destroy};
    OK(kiln_add_resolver(s, lib, &resolver, &e));
    OK(kiln_add_process_symbols(s, lib, &e));
    OK(kiln_define_symbol(s, lib, "defined_constant", 77, &e));
    CHECK(kiln_define_symbol(s, lib, "defined_constant", 78, &e) == KILN_ERR_REDEFINITION);
    kiln_error_free(e);
    e = NULL;

    /* Link: one module; the listener saw it; the lent bytes are still Kiln's. */
    kiln_module *module = NULL;
    OK(kiln_link(s, lib, &module, &e));
    CHECK(module != NULL);
    CHECK(loads == 1);
    CHECK(resolve_calls >= 1);

    uint64_t square = 0;
    OK(kiln_lookup(s, lib, "square", &square, &e));
    CHECK(square == seen_square && square == kiln_module_symbol(module, "square"));
    long (*square_fn)(long) = (long (*)(long))(uintptr_t)square;
    CHECK(square_fn(12) == 144);
    const char *names[] = {"use_all", "archived", "defined_constant"};
    uint64_t addresses[3];
    OK(kiln_lookup_many(s, lib, names, 3, addresses, &e));
    CHECK(addresses[2] == 77);
    long (*use_all)(long) = (long (*)(long))(uintptr_t)addresses[0];
    /* use_all(x) = square(x) + archived(x) + host_offset + (long)sqrt(x*x) */
    CHECK(use_all(3) == 9 + 30 + 1000 + 3);

    /* A missing name: an error naming it. */
    uint64_t nothing;
    CHECK(kiln_lookup(s, lib, "no_such_symbol", &nothing, &e) == KILN_ERR_UNDEFINED_SYMBOL);
    CHECK(strstr(kiln_error_message(e), "no_such_symbol") != NULL);
    kiln_error_free(e);
    e = NULL;

    /* run main */
    const char *args[] = {"prog", "a", "b"};
    int status = -1;
    OK(kiln_run_main(s, lib, 3, args, &status, &e));
    CHECK(status == 3 + 40); /* main returns argc + 40 */

    /* Libraries and search order; a session resolver reaches a library created later. */
    uint64_t other = 0;
    kiln_resolver session_resolver = {&host_value, resolve_host, NULL};
    OK(kiln_add_session_resolver(s, &session_resolver, &e));
    OK(kiln_create_library(s, "other", &other, &e));
    OK(kiln_set_search_order(s, other, &lib, 1, &e));
    unsigned char *math = read_file(path(dir, "twice.o"), &size);
    kiln_module *twice_module = NULL;
    OK(kiln_add_object(s, other, "twice.o", math, size, NULL, NULL, &e));
    free(math);
    OK(kiln_link(s, other, &twice_module, &e));
    uint64_t twice = 0;
    OK(kiln_lookup(s, other, "twice_square_plus_host", &twice, &e));
    CHECK(((long (*)(long))(uintptr_t)twice)(4) == 2 * 16 + 1000);

    /* A module in use cannot be removed; once its user is gone it can. */
    CHECK(kiln_remove_module(s, module, &e) == KILN_ERR_MODULE_IN_USE);
    CHECK(strstr(kiln_error_message(e), "twice.o") != NULL);
    kiln_error_free(e);
    e = NULL;
    OK(kiln_remove_module(s, twice_module, &e));
    kiln_module_release(twice_module);
    OK(kiln_remove_module(s, module, &e));
    kiln_module_release(module);
    CHECK(frees == 2);

    /* Bad input: garbage bytes, an unknown library id. */
    unsigned char garbage[64];
    memset(garbage, 0x5a, sizeof garbage);
    CHECK(kiln_add_object(s, lib, "garbage.o", garbage, sizeof garbage, NULL, NULL, &e) ==
          KILN_ERR_LINK);
    CHECK(strstr(kiln_error_message(e), "garbage.o") != NULL);
    kiln_error_free(e);
    e = NULL;
    CHECK(kiln_add_process_symbols(s, 0xdead00000001ull, &e) == KILN_ERR_INVALID_ARGUMENT);
    kiln_error_free(e);
    e = NULL;
    CHECK(kiln_add_object_file(s, lib, "/no/such/file.o", &e) == KILN_ERR_IO);
    kiln_error_free(e);
    e = NULL;

    /* Argument errors: a negative argc, a library name taken, an empty object. */
    CHECK(kiln_run_main(s, lib, -5, args, &status, &e) == KILN_ERR_INVALID_ARGUMENT);
    CHECK(strstr(kiln_error_message(e), "argc is -5") != NULL);
    kiln_error_free(e);
    e = NULL;
    uint64_t again = 0;
    CHECK(kiln_create_library(s, "other", &again, &e) == KILN_ERR_INVALID_ARGUMENT);
    CHECK(strstr(kiln_error_message(e), "already has a library named 'other'") != NULL);
    kiln_error_free(e);
    e = NULL;
    CHECK(kiln_create_library(s, "main", &again, &e) == KILN_ERR_INVALID_ARGUMENT);
    kiln_error_free(e);
    e = NULL;
    CHECK(kiln_add_object(s, lib, "empty.o", garbage, 0, NULL, NULL, &e) ==
          KILN_ERR_INVALID_ARGUMENT);
    kiln_error_free(e);
    e = NULL;

    /* A source through the cache: compiled, then from the cache; a bad one is the
     * compiler's error. */
    {
        kiln_session_options o2;
        kiln_session_options_init(&o2, sizeof o2);
        char cache_dir[4096];
        snprintf(cache_dir, sizeof cache_dir, "%s/c-cache-%d", dir, (int)getpid());
        o2.cache_dir = cache_dir;
        for (int round = 0; round < 2; round++) {
            kiln_session *s2 = NULL;
            OK(kiln_session_create(&o2, &s2, &e));
            uint64_t l2 = kiln_main_library(s2);
            const char *flags[] = {"-O1", "-DTHREE=3"};
            int from_cache = -1;
            OK(kiln_add_source(s2, l2, path(dir, "source.c"), flags, 2, &from_cache, &e));
            CHECK(from_cache == round);
            uint64_t three;
            OK(kiln_lookup(s2, l2, "three", &three, &e));
            CHECK(((int (*)(void))(uintptr_t)three)() == 3);
            CHECK(kiln_add_source(s2, l2, path(dir, "broken.c"), NULL, 0, NULL, &e) == KILN_ERR_COMPILE);
            CHECK(strstr(kiln_error_message(e), "undeclared") != NULL);
            kiln_error_free(e);
            e = NULL;
            kiln_session_dispose(s2);
        }
    }

    /* A module through the image cache: linked and stored, then mapped from the image in
     * a new session (the key is the client's name for its inputs). An image is stored
     * only once every file the key names is older than the seconds in which a change may
     * keep its times (this program and math.o were just built): wait them out. */
    sleep(3);
    {
        kiln_session_options o3;
        kiln_session_options_init(&o3, sizeof o3);
        char image_dir[4096];
        snprintf(image_dir, sizeof image_dir, "%s/c-images-%d", dir, (int)getpid());
        o3.image_cache_dir = image_dir;
        static const char key[] = "math.o, version 1";
        for (int round = 0; round < 2; round++) {
            kiln_session *s3 = NULL;
            OK(kiln_session_create(&o3, &s3, &e));
            uint64_t l3 = kiln_main_library(s3);
            OK(kiln_add_object_file(s3, l3, path(dir, "math.o"), &e));
            OK(kiln_add_process_symbols(s3, l3, &e));
            kiln_module *m3 = NULL;
            int mapped = -1;
            OK(kiln_link_cached(s3, l3, (const uint8_t *)key, sizeof key - 1, &m3, &mapped, &e));
            CHECK(m3 != NULL);
            CHECK(mapped == round);
            uint64_t sq;
            OK(kiln_lookup(s3, l3, "square", &sq, &e));
            CHECK(((long (*)(long))(uintptr_t)sq)(12) == 144);
            kiln_module_release(m3);
            kiln_session_dispose(s3);
        }
    }

    kiln_memory_stats stats;
    OK(kiln_session_memory_stats(s, &stats, &e));
    CHECK(stats.slabs >= 1 && stats.bytes_reserved > 0);

    kiln_listener_remove(listener);
    kiln_session_dispose(s);
    CHECK(released == 1);        /* the lent main.o */
    CHECK(resolver_destroyed == 1);
    CHECK(listener_destroyed == 1);
    printf("api: ok\n");
    return 0;
}
