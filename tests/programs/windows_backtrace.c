/* windows_backtrace.c: the system's unwinder walking through the program's frames, as a
 * debugger's backtrace or a crash report does. depth() recurses ten times (through a
 * volatile pointer: no compiler turns it into a loop), and the deepest call captures the
 * stack with RtlCaptureStackBackTrace; the program counts the frames in depth() and whether
 * the walk reached main. Natively (mingw-w64's unwind tables) every frame is found; for JIT
 * code, only if its unwind data was registered (objects compiled with -fdwarf-exceptions
 * carry the call frame information Kiln makes it from). */
#include <stdio.h>
#include <windows.h>

static void *frames[64];
static USHORT captured;

static long depth(long n);
static long (*volatile self)(long) = depth;

__attribute__((noinline)) static long depth(long n) {
    if (n == 0) {
        captured = RtlCaptureStackBackTrace(0, 64, frames, NULL);
        return 0;
    }
    return self(n - 1) + 1;
}

int main(void) {
    long d = self(10);
    int in_depth = 0, reached_main = 0;
    /* Each function's extent: 256 and 512 bytes at most, and not past the other's start
     * (a link may place them next to each other, in either order). */
    char *f = (char *)depth, *m = (char *)main, *f_end = f + 256, *m_end = m + 512;
    if (f < m && f_end > m) f_end = m;
    if (m < f && m_end > f) m_end = f;
    for (int i = 0; i < captured; i++) {
        char *pc = frames[i];
        /* A return address follows a call: never a function's first byte (a stack word
         * holding a function's address, which a walk without unwind data may take for a
         * return address, is not counted). */
        in_depth += pc > f && pc < f_end;
        reached_main |= pc > m && pc < m_end;
    }
    printf("depth %ld: %d frames in depth(), main %s\n", d, in_depth, reached_main ? "reached" : "not reached");
    return 0;
}
