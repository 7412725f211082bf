#!/usr/bin/env bash
# Builds kiln-executor-c (executor.c, noise.c and the platform file for the compiler's
# system, with Monocypher's cryptography): build.sh OUTPUT [COMPILER]
#   build.sh /tmp/kiln-executor-c                          this machine's
#   build.sh /tmp/kiln-executor-c-a64 aarch64-linux-gnu-gcc    AArch64, to run under qemu
#   build.sh /tmp/kiln-executor-c x86_64-w64-mingw32-gcc       Windows (x86-64): OUTPUT.exe (and OUTPUT), to run under Wine
# Monocypher's sources are those the monocypher-sys crate carries, fetched by
# scripts/test_deps.sh (`cargo fetch --manifest-path tests/c-sources/Cargo.toml`) and found
# here with `cargo metadata`; KILN_MONOCYPHER=DIR (Monocypher's src/) names others.
# -fPIC: the executor's own references to C library data (stderr, environ) go through its
# GOT; a PIE's copy relocations would put them in the executable, out of reach of code
# placed near the C library.
set -euo pipefail
out=${1:?usage: build.sh OUTPUT [COMPILER]}
cc=${2:-cc}
here=$(cd "$(dirname "$0")" && pwd)
mono=${KILN_MONOCYPHER:-}
if [ -z "$mono" ]; then
    crate=$(cargo metadata --format-version 1 --offline --manifest-path "$here/../tests/c-sources/Cargo.toml" 2>/dev/null |
        grep -o '"manifest_path":"[^"]*/monocypher-sys-[0-9][^"]*/Cargo.toml"' | head -n 1 |
        sed 's/^"manifest_path":"//; s|/Cargo.toml"$||') || true
    mono=${crate:+$crate/Monocypher/src}
fi
if [ -z "$mono" ] || [ ! -f "$mono/monocypher.c" ]; then
    echo "build.sh: Monocypher's sources not found: run scripts/test_deps.sh (or cargo fetch --manifest-path tests/c-sources/Cargo.toml), or set KILN_MONOCYPHER to Monocypher's src directory" >&2
    exit 1
fi
sources=("$here/executor.c" "$here/noise.c" "$mono/monocypher.c" "$mono/optional/monocypher-ed25519.c")
flags=(-O2 -Wall -Wextra -Werror -I"$mono")
case "$cc" in
*mingw32*)
    # The Windows platform: Winsock, BCryptGenRandom; libgcc and libmingwex are linked
    # statically (the default), their stack probe and C99 stdio offered to JIT code.
    "$cc" "${flags[@]}" -o "$out.exe" "${sources[@]}" "$here/platform_windows.c" -lws2_32 -lbcrypt
    # OUTPUT too (the same file): Wine runs a program by either name, so callers that name
    # the output as for Linux (`wine OUTPUT`) find it.
    ln -f "$out.exe" "$out" 2>/dev/null || cp -f "$out.exe" "$out"
    ;;
*)
    "$cc" "${flags[@]}" -fPIC -o "$out" "${sources[@]}" "$here/platform_posix.c" -ldl -lpthread -lm
    ;;
esac
