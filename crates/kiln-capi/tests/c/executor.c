/* executor.c: an executor of the host's making (KILN_EXECUTOR_CALLBACKS): the host's
 * lookup decides what undefined names resolve to (an allow-list: host_add yes, getpid
 * no), its run_main runs main, its destroy is called once. Run with the object directory
 * as argv[1] (tests/c_api.rs compiles host_calls.o there). */
#define _POSIX_C_SOURCE 200809L
#include <stdint.h>
#include <unistd.h>
#include "check.h"

static char path_buf[4096];
static const char *path(const char *dir, const char *name)
{
    snprintf(path_buf, sizeof path_buf, "%s/%s", dir, name);
    return path_buf;
}

static long host_add(long a, long b) { return a + b; }

static int lookups, refused;
static int lookup(void *context, const char *name, uint64_t *address)
{
    CHECK(context == &lookups);
    lookups++;
    if (strcmp(name, "host_add") == 0) {
        *address = (uint64_t)(uintptr_t)host_add;
        return 0;
    }
    refused++;
    *address = 0;
    return 0;
}

static int mains;
static int run_main(void *context, uint64_t address, int argc, const char *const *argv, int *status)
{
    CHECK(context == &lookups);
    CHECK(argv[argc] == NULL && strcmp(argv[0], "host") == 0);
    mains++;
    int (*entry)(int, char **) = (int (*)(int, char **))(uintptr_t)address;
    *status = entry(argc, (char **)argv);
    return 0;
}

static int destroyed;
static void destroy(void *context)
{
    CHECK(context == &lookups);
    destroyed++;
}

int main(int argc, char **argv)
{
    CHECK(argc >= 2);
    const char *dir = argv[1];
    kiln_error *e = NULL;
    kiln_executor_callbacks callbacks = {&lookups, lookup, run_main, destroy};
    kiln_session_options o;
    kiln_session_options_init(&o, sizeof o);
    o.executor = KILN_EXECUTOR_CALLBACKS;
    o.executor_callbacks = &callbacks;
    kiln_session *s = NULL;
    OK(kiln_session_create(&o, &s, &e));
    uint64_t lib = kiln_main_library(s);
    OK(kiln_add_object_file(s, lib, path(dir, "host_calls.o"), &e));
    OK(kiln_add_process_symbols(s, lib, &e));
    /* getpid is refused by the host: the link fails, naming it; nothing is linked. */
    kiln_module *m = NULL;
    CHECK(kiln_link(s, lib, &m, &e) == KILN_ERR_UNDEFINED_SYMBOL);
    CHECK(strstr(kiln_error_message(e), "getpid") != NULL);
    CHECK(refused >= 1 && m == NULL);
    kiln_error_free(e);
    e = NULL;
    /* The failed link dropped its object. With getpid defined by the host itself, the
     * object links, and main runs through the host's run_main, calling host_add. */
    OK(kiln_define_symbol(s, lib, "getpid", (uint64_t)(uintptr_t)getpid, &e));
    OK(kiln_add_object_file(s, lib, path(dir, "host_calls.o"), &e));
    OK(kiln_link(s, lib, &m, &e));
    CHECK(m != NULL);
    const char *args[] = {"host", "x", NULL};
    int status = -1;
    OK(kiln_run_main(s, lib, 2, args, &status, &e));
    CHECK(status == 42 && mains == 1 && lookups >= 2);
    /* Without callbacks the kind is refused; callbacks with another kind too. */
    kiln_session *bad = NULL;
    o.executor_callbacks = NULL;
    CHECK(kiln_session_create(&o, &bad, &e) == KILN_ERR_INVALID_ARGUMENT && bad == NULL);
    kiln_error_free(e);
    e = NULL;
    CHECK(destroyed == 0);
    kiln_module_release(m);
    kiln_session_dispose(s);
    CHECK(destroyed == 1);
    printf("executor: ok\n");
    return 0;
}
