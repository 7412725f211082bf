/* BTI probe: calls a function through a pointer to its landing pad (allowed) and, with
 * argument "skip", through a pointer past it (a BTI violation where code is guarded). */
#include <stdio.h>
#include <string.h>
__attribute__((noinline)) int target(int x) { return x + 1; }
/* Enough code to fill several pages, so the guard covers whole pages of this module. */
#define F(n) __attribute__((noinline)) int filler##n(int x) { volatile int a[64]; for (int i = 0; i < 64; i++) a[i] = x * i + n; return a[x & 63]; }
#define F10(n) F(n##0) F(n##1) F(n##2) F(n##3) F(n##4) F(n##5) F(n##6) F(n##7) F(n##8) F(n##9)
F10(1) F10(2) F10(3) F10(4) F10(5) F10(6) F10(7) F10(8) F10(9)
int (*volatile pointer)(int) = target;
int main(int argc, char **argv) {
    int (*f)(int) = pointer;
    if (argc > 1 && strcmp(argv[1], "skip") == 0)
        f = (int (*)(int))((char *)pointer + 4); /* past `bti c` */
    printf("through the pointer: %d\n", f(41) + filler10(1) * 0);
    return 0;
}
