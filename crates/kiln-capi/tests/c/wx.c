/* wx.c: the W^X probe (tests/programs/wx_probe.c, compiled with and without static TLS)
 * linked and run through the C API, in process with exports on and off, and in a spawned
 * executor: the probe's main and a second thread must find no mapping writable and
 * executable (the probe's exit status), and this host process must have none either.
 * argv: scratch-dir executor-path wx_probe.o wx_probe_tls.o */
#include <stdio.h>
#include <string.h>
#include "check.h"

static int wx_mappings(void)
{
    FILE *maps = fopen("/proc/self/maps", "r");
    CHECK(maps != NULL);
    char line[1024];
    int wx = 0;
    while (fgets(line, sizeof line, maps)) {
        char perms[5];
        unsigned long a, b;
        if (sscanf(line, "%lx-%lx %4s", &a, &b, perms) == 3 && perms[1] == 'w' && perms[2] == 'x') {
            fprintf(stderr, "W+X in the host: %s", line);
            wx++;
        }
    }
    fclose(maps);
    return wx;
}

static void run_probe(const char *object, unsigned executor, const char *executor_path, int exports)
{
    kiln_error *e = NULL;
    kiln_session_options o;
    kiln_session_options_init(&o, sizeof o);
    o.executor = executor;
    o.executor_path = executor_path;
    o.export_to_libraries = exports;
    kiln_session *s = NULL;
    OK(kiln_session_create(&o, &s, &e));
    uint64_t lib = kiln_main_library(s);
    OK(kiln_add_object_file(s, lib, object, &e));
    OK(kiln_add_process_symbols(s, lib, &e));
    kiln_module *m = NULL;
    OK(kiln_link(s, lib, &m, &e));
    const char *argv[] = {"wx_probe", NULL};
    int status = -1;
    OK(kiln_run_main(s, lib, 1, argv, &status, &e));
    CHECK(status == 0); /* the probe saw no W+X mapping, from main and from a thread */
    CHECK(wx_mappings() == 0);
    kiln_module_release(m);
    kiln_session_dispose(s);
}

int main(int argc, char **argv)
{
    CHECK(argc == 5);
    for (int tls = 0; tls < 2; tls++) {
        const char *object = argv[3 + tls];
        run_probe(object, KILN_EXECUTOR_IN_PROCESS, NULL, 1);
        run_probe(object, KILN_EXECUTOR_IN_PROCESS, NULL, 0);
        run_probe(object, KILN_EXECUTOR_SPAWN, argv[2], 1);
    }
    printf("wx: ok\n");
    return 0;
}
