/* wait_then_work.c: says "ready" on stderr, waits for a line on stdin, then calls
 * jit_work: lets a test attach a debugger to the process running it first. */
#include <stdio.h>

int jit_work(int n)
{
    int s = 0;
    for (int i = 0; i < n; i++)
        s += i;
    return s;
}

int main(void)
{
    char line[64];
    fprintf(stderr, "ready\n");
    if (!fgets(line, sizeof line, stdin))
        return 2;
    printf("work %d\n", jit_work(10));
    return 0;
}
