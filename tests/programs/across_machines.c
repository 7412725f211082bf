/* across_machines.c: output and an exit status, for the runs on an executor reached across
 * a network link (a veth pair into a namespace of its own). */
#include <stdio.h>

int main(void) {
    printf("%d\n", 6 * 7);
    return 3;
}
