/* Non-PIC code (-fno-pic -mcmodel=small): absolute 32-bit addresses (R_X86_64_32/32S)
 * for its own data and functions, calls to libc through PLT stubs, the address of a libc
 * function taken as an absolute 32-bit value. It reaches no libc *data* (that would need
 * a copy relocation, which a JIT cannot make). */
#include <stdio.h>
#include <string.h>

int table[64];
static const char *names[] = {"alpha", "beta", "gamma", "delta"};
static int (*ops[])(int, int) = {0, 0};
static int add(int a, int b) { return a + b; }
static int mul(int a, int b) { return a * b; }
size_t (*len_fn)(const char *) = strlen;

int main(void) {
    ops[0] = add;
    ops[1] = mul;
    for (int i = 0; i < 64; i++)
        table[i] = i * i;
    long sum = 0;
    for (int i = 0; i < 64; i++)
        sum += table[i];
    int k = 0;
    for (int i = 0; i < 4; i++)
        k = ops[i & 1](k, (int)len_fn(names[i]) + 1);
    printf("nopic: sum=%ld k=%d table_addr_low=%d strlen_ok=%d\n", sum, k,
           (unsigned long)table < 0x80000000UL, len_fn("kiln") == 4);
    return 0;
}
