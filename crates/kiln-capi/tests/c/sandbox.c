/* sandbox.c: a sandboxed executor from C. The sandbox probe (tests/programs/sandbox_probe.c)
 * runs in an executor spawned with options.sandbox and one writable directory; it prints
 * what each forbidden thing got (the Rust side checks the lines). Also checks that the
 * sandbox options are refused for an in-process session.
 * argv: scratch-dir executor-path sandbox_probe.o allowed-dir elsewhere-dir */
#include <stdio.h>
#include <string.h>
#include "check.h"

int main(int argc, char **argv)
{
    CHECK(argc == 6);
    kiln_error *e = NULL;
    kiln_session_options o;
    kiln_session_options_init(&o, sizeof o);
    /* In process: no sandbox to enter, an argument error. */
    o.sandbox = 1;
    kiln_session *s = NULL;
    CHECK(kiln_session_create(&o, &s, &e) == KILN_ERR_INVALID_ARGUMENT);
    CHECK(strstr(kiln_error_message(e), "sandbox") != NULL);
    kiln_error_free(e);
    e = NULL;
    /* A spawned executor in a sandbox that may write argv[4]. */
    const char *writable[] = {argv[4]};
    o.executor = KILN_EXECUTOR_SPAWN;
    o.executor_path = argv[2];
    o.sandbox_write = writable;
    o.sandbox_write_count = 1;
    OK(kiln_session_create(&o, &s, &e));
    uint64_t lib = kiln_main_library(s);
    OK(kiln_add_object_file(s, lib, argv[3], &e));
    OK(kiln_add_process_symbols(s, lib, &e));
    kiln_module *m = NULL;
    OK(kiln_link(s, lib, &m, &e));
    char allowed[4096], planted[4096], secret[4096];
    snprintf(allowed, sizeof allowed, "%s/out.txt", argv[4]);
    snprintf(planted, sizeof planted, "%s/planted.txt", argv[5]);
    snprintf(secret, sizeof secret, "%s/secret", argv[5]);
    const char *args[] = {"sandbox_probe", allowed, planted, secret, NULL};
    int status = -1;
    OK(kiln_run_main(s, lib, 4, args, &status, &e));
    CHECK(status == 0);
    kiln_module_release(m);
    kiln_session_dispose(s);
    printf("sandbox: ok\n");
    return 0;
}
