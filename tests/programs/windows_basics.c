/* windows_basics.c: what a C program compiled for Windows asks of its C runtime — stdio,
 * qsort with a callback, malloc/realloc/free, varargs of its own and printf's, floating
 * point (printed, and through the math library), a stack frame larger than a page (the
 * compiler's stack probe, ___chkstk_ms), setjmp/longjmp across frames, strings, environment
 * and arguments, and an atexit handler that runs after main returns. Built natively
 * with x86_64-w64-mingw32-gcc and as an ELF object with clang --target=x86_64-w64-windows-gnu-elf;
 * both runs must print the same and exit with the same status (the count of lines, mod 64). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int lines;

static void say(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    putchar('\n');
    lines++;
}

static int by_value(const void *a, const void *b) {
    long x = *(const long *)a, y = *(const long *)b;
    return (x > y) - (x < y);
}

static long sum_longs(int n, ...) {
    va_list ap;
    long sum = 0;
    va_start(ap, n);
    for (int i = 0; i < n; i++) sum += va_arg(ap, long);
    va_end(ap);
    return sum;
}

/* More than a page of locals: the compiler probes the stack (___chkstk_ms). */
static __attribute__((noinline)) unsigned big_frame(unsigned seed) {
    volatile unsigned char buffer[64 * 1024];
    for (unsigned i = 0; i < sizeof buffer; i++) buffer[i] = (unsigned char)(seed + i * 7);
    unsigned hash = 2166136261u;
    for (unsigned i = 0; i < sizeof buffer; i += 97) hash = (hash ^ buffer[i]) * 16777619u;
    return hash;
}

static jmp_buf escape;

/* longjmp out of three frames of calls back to main's setjmp. */
static __attribute__((noinline)) void deeper(int n) {
    if (n == 0) longjmp(escape, 42);
    deeper(n - 1);
    lines += 1000; /* never reached */
}

static void bye(void) {
    printf("atexit: bye after %d lines\n", lines);
}

int main(int argc, char **argv) {
    atexit(bye);
    say("arguments: %d, first %s", argc, argc > 1 ? argv[1] : "(none)");
    long values[] = {42, -7, 1000000007, 3, 0, -123456789, 99};
    size_t n = sizeof values / sizeof *values;
    qsort(values, n, sizeof *values, by_value);
    char joined[256] = "";
    for (size_t i = 0; i < n; i++) {
        char one[32];
        snprintf(one, sizeof one, "%s%ld", i ? "," : "", values[i]);
        strcat(joined, one);
    }
    say("sorted: %s", joined);
    say("varargs: %ld", sum_longs(5, 1L, 20L, 300L, 4000L, 50000L));
    double x = 2.0;
    say("floating point: sqrt(2) = %.12f, pow(2, 0.5) = %.12f, %g, %e", sqrt(x), pow(x, 0.5), 1.0 / 3, 6.02214076e23);
    say("integers: %d %u %x %lld %llu", -5, 4000000000u, 0xbeef, -9000000000000000000LL, 18000000000000000000ULL);
    char *grown = NULL;
    size_t len = 0;
    for (int i = 0; i < 1000; i++) {
        grown = realloc(grown, len + 8);
        if (!grown) return 100;
        len += (size_t)sprintf(grown + len, "%d", i % 10);
    }
    say("realloc: %zu bytes, ends %s", len, grown + len - 10);
    free(grown);
    say("stack probe: %08x", big_frame(3));
    volatile int jumps = 0;
    int value = setjmp(escape);
    if (value == 0) {
        jumps++;
        deeper(3);
    }
    say("longjmp: value %d after %d jump", value, jumps);
    char copy[64];
    strncpy(copy, "kiln on windows", sizeof copy);
    copy[0] = 'K';
    say("strings: %s, %zu, %d", copy, strlen(copy), strcmp(copy, "Kiln"));
    const char *path = getenv("PATH");
    say("environment: PATH %s", path && *path ? "set" : "unset");
    fprintf(stderr, "to stderr\n");
    fflush(stdout);
    return lines % 64;
}
