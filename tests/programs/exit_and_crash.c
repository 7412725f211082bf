/* How a program ends, chosen by its first argument: "return" (status 3), "exit" (exit(7)
 * after output on both streams), "crash" (SIGSEGV). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv) {
    const char *how = argc > 1 ? argv[1] : "return";
    printf("ending by %s\n", how);
    fprintf(stderr, "a line on stderr\n");
    if (strcmp(how, "exit") == 0)
        exit(7);
    if (strcmp(how, "crash") == 0) {
        fflush(stdout);
        *(volatile int *)16 = 1;
    }
    return 3;
}
