/* check.h: the C tests' assertions: a failed one prints where and exits 1. */
#ifndef CHECK_H
#define CHECK_H
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "kiln.h"

#define CHECK(cond)                                                                    \
    do {                                                                               \
        if (!(cond)) {                                                                 \
            fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond);   \
            exit(1);                                                                   \
        }                                                                              \
    } while (0)

/* A call that must succeed, its error out-pointer `&e` (a `kiln_error *e` in scope);
 * prints Kiln's message if not. */
#define OK(call)                                                                       \
    do {                                                                               \
        kiln_status ok_status_ = (call);                                               \
        if (ok_status_ != KILN_OK) {                                                   \
            fprintf(stderr, "%s:%d: %s failed: %d: %s\n", __FILE__, __LINE__, #call,   \
                    (int)ok_status_, kiln_error_message(e));                           \
            exit(1);                                                                   \
        }                                                                              \
    } while (0)

/* Reads a whole file (exits on failure); *size receives its size. */
static inline unsigned char *read_file(const char *path, size_t *size)
{
    FILE *f = fopen(path, "rb");
    CHECK(f != NULL);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *bytes = malloc((size_t)n);
    CHECK(fread(bytes, 1, (size_t)n, f) == (size_t)n);
    fclose(f);
    *size = (size_t)n;
    return bytes;
}
#endif
