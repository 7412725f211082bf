/* relocs_other.c: second object of the `relocs` test program (see relocs.c).
 *
 * Everything here is reached from relocs.c through a relocation against a symbol
 * defined in another object: calls, data reads/writes, function pointers, a
 * common symbol, and a strong definition that overrides a weak one.
 *
 * Must be compiled with -fcommon (common_var / common_dbl are common symbols). */
#include <stdio.h>
#include <string.h>

#include "relocs_shared.h"

/* Common symbols: `int common_var;` is tentatively defined here and in relocs.c. */
int common_var;
double common_dbl;

/* Initialized global data, read and written from relocs.c. */
int other_counter = 1000;
long other_array[16] = {3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3};
const char other_greeting[] = "hello from relocs_other";

/* A global zero-initialized array in .bss (not common: it has an initializer-less
 * definition but we force it out of common with an attribute). */
__attribute__((nocommon)) unsigned char other_bss[4096];

/* Static (file-local) state, reached only through functions. */
static int other_static_calls;
static const unsigned short other_static_table[8] = {11, 22, 33, 44, 55, 66, 77, 88};

/* Data that points at other data (R_X86_64_64 with addends in PIC/PIE and non-PIC). */
long *other_array_ptr = &other_array[5];
const char *const other_words[] = {"alpha", "beta", "gamma", "delta", "epsilon"};
int *main_counter_ptr = &main_counter; /* defined in relocs.c */

/* Strong definition that must win over the weak one in relocs.c. */
int pick_impl(int x) { return x * 100 + 2; }

/* Weak definition with no strong counterpart anywhere: this one is used. */
__attribute__((weak)) int only_weak(int x) { return x + 7; }

/* Functions called from relocs.c. */
int other_add(int a, int b)
{
    other_static_calls++;
    return a + b + other_static_table[(a ^ b) & 7];
}

long other_sum_array(void)
{
    long s = 0;
    for (int i = 0; i < 16; i++)
        s += other_array[i] * (i + 1);
    return s;
}

int other_static_calls_get(void) { return other_static_calls; }

/* Writes into the other object's globals and its static through a getter. */
void other_poke_main(int v)
{
    main_counter += v;       /* global defined in relocs.c */
    *main_counter_ptr += 1;  /* same variable through a data pointer */
    main_static_bump(v);     /* function in relocs.c touching its static */
    common_var += 3;
    common_dbl += 0.25;
}

/* Calls back into relocs.c through a pointer received as argument and through a
 * direct call (mutual recursion across objects). */
int other_apply(int (*fn)(int), int v) { return fn(v) + 1; }

int other_collatz_steps(long n)
{
    if (n == 1)
        return 0;
    return 1 + main_collatz_step(n % 2 ? 3 * n + 1 : n / 2);
}

/* Function pointer table stored in data, pointing into both objects. */
static int dbl(int x) { return 2 * x; }
static int sq(int x) { return x * x; }
int (*const other_ops[4])(int) = {dbl, sq, main_negate, main_inc};
int (*other_ops_mut[2])(int) = {sq, main_inc};

/* A string literal that is identical to one in relocs.c (mergeable strings). */
const char *other_shared_literal(void) { return "shared literal"; }

/* Uses stdout/stderr (extern data from libc). */
void other_report(const char *what, long value)
{
    fprintf(stdout, "[other] %s = %ld\n", what, value);
    fflush(stdout);
    fputs("[other] (this line goes to stderr)\n", stderr);
}

/* Constructor in .init_array of this object. */
int other_ctor_ran;
__attribute__((constructor)) static void other_ctor(void) { other_ctor_ran = 17; }

/* Address identity helpers: the same function/data seen from the other object. */
void *other_addr_of_main_negate(void) { return (void *)main_negate; }
void *other_addr_of_common_var(void) { return &common_var; }
void *other_addr_of_strlen(void) { return (void *)strlen; }
