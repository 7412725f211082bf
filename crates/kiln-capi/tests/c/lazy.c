/* Lazy functions and hot swap from C: a stub compiled on its first call by the host's
 * compiler callback, a failed compile's fallback, a body replaced while the stub's
 * address stays, pinned threads and reclamation, a function of an object linked
 * swappably replaced, and bad input. argv[1]: the directory with lazy_body_one.o,
 * lazy_body_two.o, swap_pair.o and swap_odd.o. */
#include <stdint.h>
#include "check.h"

struct compiler_state {
    const char *dir;
    int compiles;
    int destroyed;
};

static void free_bytes(void *bytes) { free(bytes); }

static int compile(void *context, const char *name, kiln_compiled *out)
{
    struct compiler_state *state = context;
    state->compiles++;
    if (strcmp(name, "answer") != 0) {
        out->error = "this compiler knows only answer";
        return 0;
    }
    char path[4096];
    snprintf(path, sizeof path, "%s/lazy_body_one.o", state->dir);
    size_t size;
    unsigned char *bytes = read_file(path, &size);
    out->bytes = bytes;
    out->size = size;
    out->release = free_bytes;
    out->release_context = bytes;
    return 1;
}

static void destroy(void *context) { ((struct compiler_state *)context)->destroyed++; }

typedef long (*long_fn)(long);

int main(int argc, char **argv)
{
    CHECK(argc > 1);
    kiln_error *e = NULL;
    kiln_session *s;
    OK(kiln_session_create(NULL, &s, &e));
    uint64_t lib = kiln_main_library(s);

    struct compiler_state state = {argv[1], 0, 0};
    kiln_lazy_compiler compiler = {&state, compile, destroy};
    const char *names[] = {"answer", "unknown"};
    kiln_module *stubs = NULL;
    OK(kiln_add_lazy_functions(s, lib, names, 2, &compiler, &stubs, &e));
    CHECK(stubs != NULL);
    CHECK(state.compiles == 0);

    uint64_t stub;
    OK(kiln_lookup(s, lib, "answer", &stub, &e));
    long_fn answer = (long_fn)(uintptr_t)stub;
    kiln_code_thread *thread;
    OK(kiln_code_thread_register(s, &thread, &e));
    kiln_code_pin *pin = kiln_code_thread_pin(thread);
    CHECK(pin != NULL);
    CHECK(answer(41) == 42); /* compiled now */
    CHECK(state.compiles == 1);
    CHECK(answer(1) == 2);
    CHECK(state.compiles == 1);
    kiln_code_thread_unpin(pin);

    /* A compile that fails: calls go to Kiln's fallback, which returns 0. */
    uint64_t unknown;
    OK(kiln_lookup(s, lib, "unknown", &unknown, &e));
    CHECK(((long_fn)(uintptr_t)unknown)(5) == 0);
    CHECK(state.compiles == 2);

    /* Hot swap: the same stub reaches the new body; the old one is freed once no pin
     * taken before the swap is held. */
    char path[4096];
    snprintf(path, sizeof path, "%s/lazy_body_two.o", argv[1]);
    size_t size;
    unsigned char *two = read_file(path, &size);
    uint64_t body = 0;
    pin = kiln_code_thread_pin(thread);
    OK(kiln_replace_function(s, lib, "answer", two, size, &body, &e));
    CHECK(body != 0 && body != stub);
    size_t retired = 0;
    OK(kiln_reclaim(s, &retired, &e));
    CHECK(retired == 1); /* this thread's pin predates the swap */
    kiln_code_thread_unpin(pin);
    CHECK(answer(3) == 300);
    OK(kiln_reclaim(s, &retired, &e));
    CHECK(retired == 0);

    /* Bad input: a name that is no lazy function, an object that does not define the
     * name, no compiler. The working function is untouched. */
    CHECK(kiln_replace_function(s, lib, "nothing_here", two, size, NULL, &e) != KILN_OK);
    CHECK(strstr(kiln_error_message(e), "nothing_here") != NULL);
    kiln_error_free(e);
    e = NULL;
    snprintf(path, sizeof path, "%s/math.o", argv[1]);
    size_t math_size;
    unsigned char *math = read_file(path, &math_size);
    CHECK(kiln_replace_function(s, lib, "answer", math, math_size, NULL, &e) != KILN_OK);
    CHECK(strstr(kiln_error_message(e), "answer") != NULL);
    kiln_error_free(e);
    e = NULL;
    free(math);
    free(two);
    CHECK(answer(3) == 300);
    const char *more[] = {"more"};
    CHECK(kiln_add_lazy_functions(s, lib, more, 1, NULL, NULL, &e) == KILN_ERR_INVALID_ARGUMENT);
    kiln_error_free(e);
    e = NULL;
    int destroyed_before = state.destroyed;
    kiln_lazy_compiler no_callback = {&state, NULL, destroy};
    CHECK(kiln_add_lazy_functions(s, lib, more, 1, &no_callback, NULL, &e) == KILN_ERR_INVALID_ARGUMENT);
    kiln_error_free(e);
    e = NULL;
    CHECK(state.destroyed == destroyed_before + 1); /* destroyed on failure too */

    /* A function linked at once is replaced when its object was linked swappably: even's
     * own call to odd (inside the object) reaches the new odd. Linked plainly it cannot
     * be, and the error names the way. */
    typedef int (*int_fn)(int);
    snprintf(path, sizeof path, "%s/swap_pair.o", argv[1]);
    size_t pair_size;
    unsigned char *pair = read_file(path, &pair_size);
    kiln_module *swap_stubs = NULL, *swap_module = NULL;
    OK(kiln_link_swappable(s, lib, "swap_pair.o", pair, pair_size, &swap_stubs, &swap_module, &e));
    CHECK(swap_stubs != NULL && swap_module != NULL);
    uint64_t even_at;
    OK(kiln_lookup(s, lib, "even", &even_at, &e));
    int_fn even = (int_fn)(uintptr_t)even_at;
    CHECK(even(10) == 1 && even(7) == 0);
    snprintf(path, sizeof path, "%s/swap_odd.o", argv[1]);
    size_t odd_size;
    unsigned char *odd = read_file(path, &odd_size);
    OK(kiln_replace_function(s, lib, "odd", odd, odd_size, NULL, &e));
    pin = kiln_code_thread_pin(thread);
    CHECK(even(6) == 1005); /* even(6) calls odd(5) */
    kiln_code_thread_unpin(pin);
    kiln_session *plain;
    OK(kiln_session_create(NULL, &plain, &e));
    uint64_t plain_lib = kiln_main_library(plain);
    OK(kiln_add_object(plain, plain_lib, "swap_pair.o", pair, pair_size, NULL, NULL, &e));
    OK(kiln_link(plain, plain_lib, NULL, &e));
    CHECK(kiln_replace_function(plain, plain_lib, "odd", odd, odd_size, NULL, &e) != KILN_OK);
    CHECK(strstr(kiln_error_message(e), "kiln_link_swappable") != NULL || strstr(kiln_error_message(e), "link_swappable") != NULL);
    kiln_error_free(e);
    e = NULL;
    kiln_session_dispose(plain);
    CHECK(kiln_link_swappable(s, lib, "empty", NULL, 0, NULL, NULL, &e) == KILN_ERR_INVALID_ARGUMENT);
    kiln_error_free(e);
    e = NULL;
    free(odd);
    free(pair);
    OK(kiln_remove_module(s, swap_stubs, &e));
    OK(kiln_remove_module(s, swap_module, &e));
    kiln_module_release(swap_stubs);
    kiln_module_release(swap_module);

    kiln_code_thread_release(thread);
    kiln_module_release(stubs);
    kiln_session_dispose(s);
    CHECK(state.destroyed == destroyed_before + 1 + 1);
    puts("lazy: ok");
    return 0;
}
