/* debug_target.c: a small program for the debugger tests (built -g -O0): main calls
 * jit_function, which calls jit_helper in a loop, then jit_later once. */
#include <stdio.h>

int counter;

int jit_helper(int x)
{
    int y = x * 2;
    counter += y;
    return y + 1;
}

int jit_later(int x)
{
    int z = x + counter;
    return z;
}

int jit_function(int x)
{
    int r = 0;
    for (int i = 0; i < x; i++)
        r += jit_helper(i);
    return r;
}

int main(void)
{
    int v = jit_function(5);
    printf("result %d %d\n", v, jit_later(v));
    return 0;
}
