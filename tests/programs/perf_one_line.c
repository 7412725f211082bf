/* perf_one_line.c: the hot function written on one line (line 5), for the profiler
 * tests: every sample in it must get that line, not `??:0`. */
#include <stdio.h>
volatile double sink;
double jit_one_line(long n) { double s = 0; for (long i = 1; i < n; i++) s += 1.0 / (double)i; return s; }
int main(void) { double t = 0; for (int r = 0; r < 30; r++) t += jit_one_line(10000000); sink = t; printf("%f\n", t); return 0; }
