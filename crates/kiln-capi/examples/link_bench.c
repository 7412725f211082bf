/* link_bench.c: SQLite (sqlite_driver.o + libsqlite3.a) linked in process through the C
 * API, no code run, ROUNDS times, each in a fresh session; prints each link's time in
 * nanoseconds, one per line (kiln-bench's capi_overhead compares them with the same
 * links through the Rust API).
 *
 *   link_bench DRIVER.o LIBSQLITE3.a ROUNDS */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include "kiln.h"

static unsigned char *read_file(const char *path, size_t *size)
{
    FILE *f = fopen(path, "rb");
    if (!f) { perror(path); exit(1); }
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *bytes = malloc((size_t)n);
    if (fread(bytes, 1, (size_t)n, f) != (size_t)n) exit(1);
    fclose(f);
    *size = (size_t)n;
    return bytes;
}

static long long now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

int main(int argc, char **argv)
{
    if (argc != 4) return 2;
    size_t driver_size, archive_size;
    unsigned char *driver = read_file(argv[1], &driver_size);
    unsigned char *archive = read_file(argv[2], &archive_size);
    int rounds = atoi(argv[3]);
    kiln_session_options options;
    kiln_session_options_init(&options, sizeof options);
    options.noexec = 1;
    for (int r = 0; r < rounds; r++) {
        kiln_session *s = NULL;
        kiln_error *e = NULL;
        if (kiln_session_create(&options, &s, &e) != KILN_OK) goto fail;
        uint64_t lib = kiln_main_library(s);
        if (kiln_add_object(s, lib, "sqlite_driver.o", driver, driver_size, NULL, NULL, &e) ||
            kiln_add_archive(s, lib, "libsqlite3.a", archive, archive_size, &e) ||
            kiln_add_library_by_name(s, lib, "m", NULL, 0, &e) ||
            kiln_add_process_symbols(s, lib, &e))
            goto fail;
        long long t = now_ns();
        if (kiln_link(s, lib, NULL, &e) != KILN_OK) goto fail;
        printf("%lld\n", now_ns() - t);
        kiln_session_dispose(s);
        continue;
    fail:
        fprintf(stderr, "link_bench: %s\n", kiln_error_message(e));
        return 1;
    }
    free(driver);
    free(archive);
    return 0;
}
