/* relocs.c: exercises many relocation kinds; linked together with relocs_other.c.
 *
 * Built in five variants (see build_native.sh):
 *   -O0 -fPIE | -O2 -fPIE | -O3 -fPIC | -O2 -fno-pic -mcmodel=small (no-pie) | -O2 -mcmodel=large -fPIC
 * always with -fcommon. Output never depends on addresses; it is a trace of lines plus
 * a running FNV-1a checksum of the trace. Exit code 0 when every self-check passes,
 * otherwise 1 (the number of failed checks is printed). */
#define _GNU_SOURCE
#include <setjmp.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "relocs_shared.h"

/* ---- trace + checksum ------------------------------------------------------------ */

static unsigned long long trace_hash = 1469598103934665603ULL;
static int trace_lines;
static int failures;

__attribute__((format(printf, 1, 2))) static void trace(const char *fmt, ...)
{
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    for (const unsigned char *p = (const unsigned char *)buf; *p; p++) {
        trace_hash ^= *p;
        trace_hash *= 1099511628211ULL;
    }
    trace_lines++;
    printf("%s\n", buf);
}

static void check(int ok, const char *what)
{
    if (!ok) {
        failures++;
        trace("CHECK FAILED: %s", what);
    }
}

/* ---- globals of this object ------------------------------------------------------ */

int common_var;                    /* common symbol, also in relocs_other.c */
int main_counter = 5;              /* written from relocs_other.c */
static int main_static = 40;       /* written from relocs_other.c via main_static_bump */
static long main_static_bss;       /* zero-initialized static */
const char main_banner[] = "relocs test";

/* Large zero-initialized arrays (.bss; with -mcmodel=large possibly .lbss). */
static unsigned char sieve[4000000];
static int big_table[1 << 18];

/* Over-aligned data. */
static char aligned64[100] __attribute__((aligned(64))) = "aligned";
static char aligned4k[8192] __attribute__((aligned(4096)));

/* const tables */
static const unsigned int primes[32] = {2,  3,  5,  7,  11, 13, 17, 19, 23, 29,  31,
                                        37, 41, 43, 47, 53, 59, 61, 67, 71, 73,  79,
                                        83, 89, 97, 101, 103, 107, 109, 113, 127, 131};
struct planet {
    const char *name;
    int moons;
    double au;
};
static const struct planet planets[] = {
    {"Mercury", 0, 0.387}, {"Venus", 0, 0.723},   {"Earth", 1, 1.000},
    {"Mars", 2, 1.524},    {"Jupiter", 95, 5.203}, {"Saturn", 146, 9.537},
};

/* Arrays of string pointers: const and mutable. */
static const char *const weekdays[] = {"Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"};
static const char *colors[] = {"red", "green", "blue"};
static char writable_word[] = "mutable";
static char *pointers_to_writable[] = {writable_word, writable_word + 3};

/* Pointers into other objects' data and to libc data. */
static int *ptr_to_other_counter = &other_counter;
static long *ptr_into_other_array = &other_array[10];
static const char *ptr_into_other_greeting = other_greeting + 6;
static FILE **stream_slots[2] = {&stdout, &stderr};
static char ***environ_slot = &environ;
static size_t (*strlen_ptr)(const char *) = strlen;

/* Weak definition overridden by a strong one in relocs_other.c. */
__attribute__((weak)) int pick_impl(int x) { return x * 100 + 1; }

/* Weak undefined references: never defined anywhere, must resolve to NULL. */
extern int kiln_missing_function(int) __attribute__((weak));
extern int kiln_missing_data __attribute__((weak));

/* ---- functions called from relocs_other.c ---------------------------------------- */

int main_negate(int x) { return -x; }
int main_inc(int x) { return x + 1; }
void main_static_bump(int v) { main_static += v; }
int main_collatz_step(long n) { return other_collatz_steps(n); }

/* ---- local helpers ----------------------------------------------------------------- */

/* Dense switch: a jump table at every optimization level. */
__attribute__((noinline)) static int classify(int x)
{
    switch (x) {
    case 0: return 17;
    case 1: return x * 3 + 1;
    case 2: return main_counter;
    case 3: return 4;
    case 4: return (int)strlen(main_banner);
    case 5: return -9;
    case 6: return primes[x];
    case 7: return 123;
    case 8: return x << 4;
    case 9: return common_var;
    case 10: return 77;
    case 11: return other_counter & 0xff;
    case 12: return 5;
    case 13: return 2024;
    default: return -1;
    }
}

/* Second jump table, returning string literals. */
__attribute__((noinline)) static const char *month_name(int m)
{
    switch (m) {
    case 1: return "January";
    case 2: return "February";
    case 3: return "March";
    case 4: return "April";
    case 5: return "May";
    case 6: return "June";
    case 7: return "July";
    case 8: return "August";
    case 9: return "September";
    case 10: return "October";
    case 11: return "November";
    case 12: return "December";
    default: return "?";
    }
}

/* Computed goto: a table of label addresses in data. */
__attribute__((noinline)) static long run_bytecode(const unsigned char *code)
{
    static const void *const dispatch[] = {&&op_inc, &&op_dbl, &&op_dec, &&op_sq, &&op_halt};
    long acc = 0;
    goto *dispatch[*code++];
op_inc:
    acc += 1;
    goto *dispatch[*code++];
op_dbl:
    acc *= 2;
    goto *dispatch[*code++];
op_dec:
    acc -= 1;
    goto *dispatch[*code++];
op_sq:
    acc *= acc;
    goto *dispatch[*code++];
op_halt:
    return acc;
}

static int triple(int x) { return 3 * x; }
static int add_ten(int x) { return x + 10; }
/* Function pointers in data, local and cross-object targets. */
static int (*const local_ops[])(int) = {triple, add_ten, main_negate, main_inc, pick_impl, only_weak};
static int (*mutable_op)(int) = triple;

static int cmp_int_desc(const void *a, const void *b)
{
    int x = *(const int *)a, y = *(const int *)b;
    return (x < y) - (x > y);
}

static long vsum(int n, ...)
{
    va_list ap;
    long s = 0;
    va_start(ap, n);
    for (int i = 0; i < n; i++)
        s += va_arg(ap, long);
    va_end(ap);
    return s;
}

static int call_counter(void)
{
    static int calls = 100; /* function-local static */
    return ++calls;
}

static jmp_buf jump_env;
__attribute__((noinline)) static void deep_jump(int depth)
{
    if (depth < 0)
        return; /* never taken; keeps -Winfinite-recursion quiet */
    if (depth == 0)
        longjmp(jump_env, 42);
    deep_jump(depth - 1);
}

static int local_ctor_value;
__attribute__((constructor)) static void local_ctor(void) { local_ctor_value = 99; }

/* ---- main ------------------------------------------------------------------------ */

int main(void)
{
    trace("== %s ==", main_banner);

    /* constructors (.init_array of both objects) */
    trace("ctors: local=%d other=%d", local_ctor_value, other_ctor_ran);
    check(local_ctor_value == 99 && other_ctor_ran == 17, "constructors ran");

    /* calls across objects */
    int a = other_add(20, 22);
    long s = other_sum_array();
    int ap = other_apply(main_negate, 5);
    int cs = other_collatz_steps(27);
    trace("calls: other_add=%d sum_array=%ld apply=%d collatz27=%d static_calls=%d", a, s, ap, cs,
          other_static_calls_get());
    check(cs == 111, "collatz(27) == 111");

    /* data in the other object: read and write */
    other_counter += 234;
    *ptr_to_other_counter += 1;
    other_array[0] = 100;
    *ptr_into_other_array += 1000;
    *other_array_ptr += 50;
    trace("other data: counter=%d array0=%ld array5=%ld array10=%ld sum=%ld", other_counter,
          other_array[0], other_array[5], other_array[10], other_sum_array());
    trace("other strings: greeting='%s' tail='%s' len=%zu words=%s,%s,%s", other_greeting,
          ptr_into_other_greeting, strlen_ptr(other_greeting), other_words[0], other_words[2],
          other_words[4]);
    for (int i = 0; i < 4096; i++)
        other_bss[i] = (unsigned char)(i * 7 + 3);
    long bss_sum = 0;
    for (int i = 0; i < 4096; i++)
        bss_sum += other_bss[i];
    trace("other bss sum=%ld", bss_sum);

    /* this object's globals written by the other object */
    other_poke_main(10);
    other_poke_main(5);
    trace("main data: counter=%d static=%d static_bss=%ld", main_counter, main_static,
          main_static_bss);
    check(main_counter == 5 + 10 + 1 + 5 + 1 && main_static == 55, "cross-object writes");

    /* common symbols */
    common_var += 100;
    common_dbl += 1.5;
    trace("common: var=%d dbl=%.2f same_addr=%d", common_var, common_dbl,
          (void *)&common_var == other_addr_of_common_var());
    check(common_var == 106, "common_var shared");

    /* weak symbols */
    trace("weak: pick_impl(3)=%d only_weak(1)=%d missing_fn_null=%d missing_data_null=%d",
          pick_impl(3), only_weak(1), kiln_missing_function == NULL, &kiln_missing_data == NULL);
    check(pick_impl(3) == 302, "strong definition wins over weak");
    if (kiln_missing_function)
        trace("missing function unexpectedly present: %d", kiln_missing_function(1));

    /* switch jump tables */
    long sw = 0;
    for (int i = -2; i < 16; i++)
        sw = sw * 31 + classify(i);
    trace("switch: classify checksum=%ld c(4)=%d c(9)=%d", sw, classify(4), classify(9));
    trace("months: %s %s %s %s", month_name(1), month_name(6), month_name(12), month_name(13));

    /* computed goto */
    static const unsigned char prog1[] = {0, 0, 0, 1, 3, 2, 1, 4};
    static const unsigned char prog2[] = {0, 1, 1, 1, 3, 3, 4};
    trace("bytecode: %ld %ld", run_bytecode(prog1), run_bytecode(prog2));

    /* function pointers stored in data */
    long fp = 0;
    for (size_t i = 0; i < sizeof local_ops / sizeof local_ops[0]; i++)
        fp = fp * 7 + local_ops[i]((int)i + 2);
    for (int i = 0; i < 4; i++)
        fp = fp * 5 + other_ops[i](i + 3);
    trace("fnptr: local+other tables=%ld mutable=%d", fp, mutable_op(4));
    mutable_op = add_ten;
    other_ops_mut[0] = triple;
    trace("fnptr: after rewrite mutable=%d other_mut0=%d other_mut1=%d apply=%d", mutable_op(4),
          other_ops_mut[0](4), other_ops_mut[1](4), other_apply(triple, 7));
    trace("fnptr identity: main_negate=%d strlen=%d",
          (void *)main_negate == other_addr_of_main_negate(),
          (void *)strlen == other_addr_of_strlen());

    /* string literals, including one that also appears in relocs_other.c */
    trace("literals: '%s' eq=%d '%s'", other_shared_literal(),
          strcmp(other_shared_literal(), "shared literal") == 0, "a literal with\ttab");

    /* const tables and arrays of strings */
    unsigned long psum = 0;
    for (int i = 0; i < 32; i++)
        psum = psum * 3 + primes[i];
    int moons = 0;
    double au = 0;
    for (size_t i = 0; i < sizeof planets / sizeof planets[0]; i++) {
        moons += planets[i].moons;
        au += planets[i].au;
    }
    trace("const: primes=%lu moons=%d au=%.3f last=%s", psum, moons, au, planets[5].name);
    char joined[128] = "";
    for (int i = 0; i < 7; i++) {
        strcat(joined, weekdays[i]);
        strcat(joined, i < 6 ? "," : "");
    }
    colors[1] = "cyan";
    pointers_to_writable[1][0] = 'U';
    trace("strings: %s | %s %s %s | %s %s", joined, colors[0], colors[1], colors[2],
          pointers_to_writable[0], pointers_to_writable[1]);

    /* large .bss array: sieve of Eratosthenes */
    int nprimes = 0;
    for (long i = 2; i < (long)sizeof sieve; i++) {
        if (sieve[i])
            continue;
        nprimes++;
        for (long j = i * i; j < (long)sizeof sieve; j += i)
            sieve[j] = 1;
    }
    for (int i = 0; i < (1 << 18); i++)
        big_table[i] = i ^ (i >> 3);
    long bt = 0;
    for (int i = 0; i < (1 << 18); i += 97)
        bt += big_table[i];
    trace("bss: primes below 4000000=%d big_table=%ld", nprimes, bt);
    check(nprimes == 283146, "prime count");

    /* alignment */
    trace("align: a64=%d a4k=%d text='%s'", ((uintptr_t)aligned64 & 63) == 0,
          ((uintptr_t)aligned4k & 4095) == 0, aligned64);
    check(((uintptr_t)aligned64 & 63) == 0 && ((uintptr_t)aligned4k & 4095) == 0, "alignment");
    aligned4k[4000] = 1;

    /* libc callbacks into this code */
    int vals[10] = {5, 3, 9, 1, 7, 2, 8, 6, 4, 0};
    qsort(vals, 10, sizeof vals[0], cmp_int_desc);
    int key = 6;
    int *found = bsearch(&key, vals, 10, sizeof vals[0], cmp_int_desc);
    trace("qsort: %d %d %d ... %d, bsearch(6) index=%ld", vals[0], vals[1], vals[2], vals[9],
          found ? (long)(found - vals) : -1L);

    /* varargs, local statics, floating point constants */
    int c1 = call_counter();
    int c2 = call_counter();
    trace("misc: vsum=%ld counter=%d,%d fp=%.6f", vsum(4, 1L, 20L, 300L, 4000L), c1, c2,
          3.14159 * 2.5 / 1.75 + 0.1);

    /* setjmp/longjmp */
    int jr = setjmp(jump_env);
    if (jr == 0)
        deep_jump(10);
    trace("longjmp: returned %d", jr);

    /* libc extern data: stdout/stderr/environ */
    setenv("KILN_RELOCS_PROBE", "value-42", 1);
    const char *probe = NULL;
    for (char **e = environ; *e; e++)
        if (strncmp(*e, "KILN_RELOCS_PROBE=", 18) == 0)
            probe = *e + 18;
    trace("environ: probe=%s slot_matches=%d getenv=%s", probe ? probe : "(none)",
          *environ_slot == environ, getenv("KILN_RELOCS_PROBE"));
    check(probe != NULL, "environ sees setenv");
    fflush(stdout);
    fprintf(*stream_slots[1], "relocs: this goes to stderr\n");
    fprintf(*stream_slots[0], "streams: stdout!=stderr %d, slot0==stdout %d\n", stdout != stderr,
            *stream_slots[0] == stdout);
    other_report("counter", other_counter);

    trace("lines=%d failures=%d", trace_lines, failures);
    printf("checksum=%016llx\n", trace_hash);
    return failures ? 1 : 0;
}
