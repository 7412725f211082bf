#!/usr/bin/env bash
# Builds kiln-executor-c (executor.c and the platform file for the compiler's system):
# build.sh OUTPUT [COMPILER]
#   build.sh /tmp/kiln-executor-c                          this machine's
#   build.sh /tmp/kiln-executor-c-a64 aarch64-linux-gnu-gcc    AArch64, to run under qemu
#   build.sh /tmp/kiln-executor-c x86_64-w64-mingw32-gcc       Windows (x86-64): OUTPUT.exe (and OUTPUT), to run under Wine
# -fPIC: the executor's own references to C library data (stderr, environ) go through its
# GOT; a PIE's copy relocations would put them in the executable, out of reach of code
# placed near the C library.
set -euo pipefail
out=${1:?usage: build.sh OUTPUT [COMPILER]}
cc=${2:-cc}
here=$(cd "$(dirname "$0")" && pwd)
case "$cc" in
*mingw32*)
    # executor.c with the Windows platform: Winsock; libgcc and libmingwex are linked
    # statically (the default), their stack probe and C99 stdio offered to JIT code.
    "$cc" -O2 -Wall -Wextra -Werror -o "$out.exe" "$here/executor.c" "$here/platform_windows.c" -lws2_32
    # OUTPUT too (the same file): Wine runs a program by either name, so callers that name
    # the output as for Linux (`wine OUTPUT`) find it.
    ln -f "$out.exe" "$out" 2>/dev/null || cp -f "$out.exe" "$out"
    ;;
*)
    "$cc" -O2 -fPIC -Wall -Wextra -Werror -o "$out" "$here/executor.c" "$here/platform_posix.c" -ldl -lpthread -lm
    ;;
esac
