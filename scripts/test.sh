#!/usr/bin/env bash
# Kiln's test command: installs what the tests need that is missing (Debian packages via
# apt-get, Rust components via rustup where possible), then runs format and lint checks,
# every test, and the benchmarks on a small workload (so they keep working).
set -euo pipefail
cd "$(dirname "$0")/.."
# Where cargo puts what it builds (CARGO_TARGET_DIR if set).
TARGET="${CARGO_TARGET_DIR:-target}"

export CARGO_BUILD_JOBS="${CARGO_BUILD_JOBS:-2}"
export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"
# kiln-llvm's feature `llvm` builds against Debian's LLVM 14 (llvm-14-dev).
export LLVM_SYS_140_PREFIX="${LLVM_SYS_140_PREFIX:-/usr/lib/llvm-14}"

# --- what the tests need --------------------------------------------------------------
# command or file -> Debian package
declare -A needs=(
  [cc]=gcc
  [g++]=g++
  [ar]=binutils
  [unshare]=util-linux
  [strace]=strace
  # Debuggers and profilers, driven by the listener tests.
  [gdb]=gdb
  [lldb-16]=lldb-16
  [perf]=linux-perf
  [llvm-jitlink-16]=llvm-16
  # The object cache's Redis backend and the ccache comparison.
  [redis-server]=redis-server
  [ccache]=ccache
  # The C API's tests: compiled against the installed library, run under valgrind.
  [pkg-config]=pkg-config
  [valgrind]=valgrind
  [/usr/lib/x86_64-linux-gnu/libsqlite3.a]=libsqlite3-dev
  [/usr/lib/x86_64-linux-gnu/liblua5.4.a]=liblua5.4-dev
  [/usr/lib/x86_64-linux-gnu/libz.a]=zlib1g-dev
  [/usr/lib/python3.11/config-3.11-x86_64-linux-gnu/libpython3.11-pic.a]=libpython3.11-dev
  [/usr/lib/llvm-14/bin/llvm-config]=llvm-14-dev
  # CPython's own test modules, run by a Kiln-linked interpreter (runtime tests).
  [/usr/lib/python3.11/test/test_json]=libpython3.11-testsuite
  # AArch64: cross compilers for the link checks, and mold for the link-time figures.
  [aarch64-linux-gnu-gcc]=gcc-aarch64-linux-gnu
  [clang-16]=clang-16
  [llvm-objdump-16]=llvm-16
  [qemu-aarch64-static]=qemu-user-static
  [mold]=mold
  # Debian's arm64 static libraries (multiarch), linked for AArch64.
  [/lib/ld-linux-aarch64.so.1]=libc6:arm64
  [/usr/lib/aarch64-linux-gnu/libz.a]=zlib1g-dev:arm64
  [/usr/lib/aarch64-linux-gnu/libsqlite3.a]=libsqlite3-dev:arm64
  [/usr/lib/aarch64-linux-gnu/liblua5.4.a]=liblua5.4-dev:arm64
)
missing=()
for need in "${!needs[@]}"; do
  if [[ $need == /* ]]; then
    [ -e "$need" ] || missing+=("${needs[$need]}")
  else
    command -v "$need" >/dev/null 2>&1 || missing+=("${needs[$need]}")
  fi
done
if ((${#missing[@]})); then
  echo "== installing: ${missing[*]}"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  if [[ " ${missing[*]}" == *":arm64"* ]] && ! dpkg --print-foreign-architectures | grep -qx arm64; then
    $SUDO dpkg --add-architecture arm64
  fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}"
fi
for component in rustfmt clippy; do
  if ! cargo "${component/rustfmt/fmt}" --version >/dev/null 2>&1; then
    rustup component add "$component"
  fi
done

# --- checks ---------------------------------------------------------------------------
echo "== cargo fmt --check"
cargo fmt --all -- --check

echo "== cargo clippy -D warnings"
cargo clippy --workspace --all-targets -- -D warnings

echo "== cargo test"
cargo test --workspace

echo "== kiln-llvm with LLVM 14 (feature llvm)"
cargo clippy -p kiln-llvm --features llvm --all-targets -- -D warnings
cargo test -p kiln-llvm --features llvm
cargo clippy -p kiln-capi --features llvm --all-targets -- -D warnings
cargo test -p kiln-capi --features llvm --test llvm_c

echo "== benchmarks, small workload (figures: see docs/BENCHMARKS.md)"
cargo build --release -p kiln-bench
"$TARGET"/release/many_modules --modules 500 --no-syscalls
"$TARGET"/release/alloc_throughput --ops 5000
cargo build --release -p kiln-cli -p kiln-executor -p kiln-lang
"$TARGET"/release/tls_access --iterations 1000000 --runs 1
"$TARGET"/release/session_scale --modules 200
"$TARGET"/release/debug_support --rounds 2 --modules 200 --gdb-modules 50
"$TARGET"/release/capi_overhead --rounds 3 --batches 1
"$TARGET"/release/cache_figures --functions 200 --runs 2 >/dev/null
"$TARGET"/release/link_floor --runs 2 --dir "$TARGET"/link-floor >/dev/null
"$TARGET"/release/lazy_figures --functions 1000 --runs 1 --calls 1000000 --swap-seconds 0.2 >/dev/null
cargo build --release -p kiln-llvm --features llvm --examples
"$TARGET"/release/examples/shaders 20 >/dev/null

echo "== the main job"
./scripts/demo.sh >/dev/null
echo "all checks passed"
