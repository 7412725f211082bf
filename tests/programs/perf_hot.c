/* perf_hot.c: a compute loop for the profiler tests; jit_hot_loop takes nearly all the
 * time. */
#include <stdio.h>

volatile double sink;

double jit_hot_loop(long n)
{
    double s = 0;
    for (long i = 1; i < n; i++)
        s += 1.0 / (double)i;
    return s;
}

int main(void)
{
    double t = 0;
    for (int r = 0; r < 30; r++)
        t += jit_hot_loop(10000000);
    sink = t;
    printf("%f\n", t);
    return 0;
}
