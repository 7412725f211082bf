#!/usr/bin/env bash
# Builds kiln-executor-c: build.sh OUTPUT [COMPILER]
#   build.sh /tmp/kiln-executor-c                          this machine's
#   build.sh /tmp/kiln-executor-c-a64 aarch64-linux-gnu-gcc    AArch64, to run under qemu
# -fPIC: the executor's own references to C library data (stderr, environ) go through its
# GOT; a PIE's copy relocations would put them in the executable, out of reach of code
# placed near the C library.
set -euo pipefail
out=${1:?usage: build.sh OUTPUT [COMPILER]}
cc=${2:-cc}
here=$(cd "$(dirname "$0")" && pwd)
"$cc" -O2 -fPIC -Wall -Wextra -Werror -o "$out" "$here/kiln_executor.c" -ldl -lpthread -lm
