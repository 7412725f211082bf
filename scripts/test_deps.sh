#!/usr/bin/env bash
# What Kiln's tests need, without changing what the machine already has.
#
#   scripts/test_deps.sh            (run by scripts/test.sh; can be run alone)
#
# - Native tools and libraries missing from the machine are installed with
#   `apt-get install --no-install-recommends`, and only when apt's simulation shows that
#   nothing installed would be removed or upgraded (no `Remv`, no `Inst pkg [oldversion]`).
# - A package whose install is not clean but that the tests need only for its files
#   (headers, static libraries, CPython's test modules) is fetched with `apt-get download`
#   and unpacked with `dpkg -x` under $KILN_NATIVE_SYSROOT instead; the tests look there
#   when the file is not on the machine.
# - Debian's arm64 libraries never go into the machine (no `dpkg --add-architecture`):
#   they are downloaded through a private apt state (arm64 package lists under
#   $KILN_SYSROOT_DIR/apt-arm64) and unpacked under $KILN_AARCH64_SYSROOT. The cross
#   compiler (gcc-aarch64-linux-gnu, libc6-dev-arm64-cross: Architecture all, files under
#   /usr/aarch64-linux-gnu) and qemu-user-static are native packages, installed as above.
#
# Environment:
#   KILN_TEST_SKIP_CROSS=1   install nothing for other architectures: AArch64 and RISC-V, and
#                            the Wine parts when they come (their tests skip and say so)
#   KILN_SYSROOT_DIR         where private files go (default: $CARGO_TARGET_DIR/sysroot,
#                            or target/sysroot)
#   KILN_TEST_DEPS_LOG       apt's output (default: $KILN_SYSROOT_DIR/test_deps.log),
#                            printed only if something fails
#
# Quiet unless something fails: one line per step.
set -euo pipefail
cd "$(dirname "$0")/.."

TARGET="${CARGO_TARGET_DIR:-target}"
mkdir -p "$TARGET"
TARGET="$(cd "$TARGET" && pwd)"
SYSROOTS="${KILN_SYSROOT_DIR:-$TARGET/sysroot}"
mkdir -p "$SYSROOTS"
SYSROOTS="$(cd "$SYSROOTS" && pwd)"
NATIVE_SYSROOT="${KILN_NATIVE_SYSROOT:-$SYSROOTS/native}"
AARCH64_SYSROOT="${KILN_AARCH64_SYSROOT:-$SYSROOTS/aarch64}"
LOG="${KILN_TEST_DEPS_LOG:-$SYSROOTS/test_deps.log}"
SKIP_CROSS="${KILN_TEST_SKIP_CROSS:-}"
[ "$SKIP_CROSS" = 0 ] && SKIP_CROSS=""
: >"$LOG"

SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive

# Runs a command with its output appended to the log; on failure prints the log and
# stops.
logged() {
  echo "\$ $*" >>"$LOG"
  if ! "$@" >>"$LOG" 2>&1; then
    echo "test_deps: failed: $*" >&2
    echo "---- $LOG" >&2
    cat "$LOG" >&2
    exit 1
  fi
}

# --- what the tests need: command or file -> Debian package ---------------------------
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
  [llvm-objdump-16]=llvm-16
  [clang-16]=clang-16
  # libFuzzer for C (the fuzz phase's harness of executor-c's frame parser).
  [/usr/lib/llvm-16/lib/clang/16/lib/linux/libclang_rt.fuzzer-x86_64.a]=libclang-rt-16-dev
  # The object cache's Redis backend and the ccache comparison.
  [redis-server]=redis-server
  [ccache]=ccache
  # The C API's tests: compiled against the installed library, run under valgrind.
  [pkg-config]=pkg-config
  [valgrind]=valgrind
  [/usr/lib/x86_64-linux-gnu/libsqlite3.a]=libsqlite3-dev
  [/usr/lib/x86_64-linux-gnu/liblua5.4.a]=liblua5.4-dev
  [/usr/lib/x86_64-linux-gnu/libz.a]=zlib1g-dev
  [/usr/lib/x86_64-linux-gnu/libexpat.so]=libexpat1-dev
  [/usr/lib/python3.11/config-3.11-x86_64-linux-gnu/libpython3.11-pic.a]=libpython3.11-dev
  [/usr/lib/llvm-14/bin/llvm-config]=llvm-14-dev
  # The Python package's virtual environment (Debian's Python with ensurepip).
  [/usr/lib/python3.11/ensurepip/__init__.py]=python3.11-venv
  # LLVM 16's C API (LLJIT, target machines) for the LLVM-C -> Kiln example and figure.
  [/usr/lib/llvm-16/include/llvm-c/LLJIT.h]=llvm-16-dev
  # CPython's own test modules, run by a Kiln-linked interpreter (runtime tests).
  [/usr/lib/python3.11/test/test_json]=libpython3.11-testsuite
  # Link-time figures.
  [mold]=mold
)
# AArch64 and RISC-V 64 (skipped with KILN_TEST_SKIP_CROSS=1): the cross compilers with
# their C libraries (under /usr/TRIPLE, which qemu uses as the guest's root) and qemu.
declare -A cross_needs=(
  [aarch64-linux-gnu-gcc]=gcc-aarch64-linux-gnu
  [/usr/aarch64-linux-gnu/lib/libc.so]=libc6-dev-arm64-cross
  # RISC-V 64: the cross compiler and its C library (/usr/riscv64-linux-gnu, the
  # qemu-riscv64 guest's root).
  [riscv64-linux-gnu-gcc]=gcc-riscv64-linux-gnu
  [/usr/riscv64-linux-gnu/lib/libc.so]=libc6-dev-riscv64-cross
  # C++ for both (libstdc++ under /usr/lib/gcc-cross/TRIPLE).
  [aarch64-linux-gnu-g++]=g++-aarch64-linux-gnu
  [riscv64-linux-gnu-g++]=g++-riscv64-linux-gnu
  [qemu-aarch64-static]=qemu-user-static
  # Windows: the mingw-w64 cross compiler (and its headers and import libraries, which
  # clang-16 --target=x86_64-w64-windows-gnu-elf uses too) and Wine to run what it builds.
  [x86_64-w64-mingw32-gcc]=gcc-mingw-w64-x86-64
  # ... and its C++ (libstdc++ as COFF archives: C++ exceptions in JIT code on Windows).
  [x86_64-w64-mingw32-g++]=g++-mingw-w64-x86-64-win32
  [/usr/lib/wine/wine64]=wine64
)
# Packages the tests need only for their files, and look for under $NATIVE_SYSROOT too:
# when apt cannot install them cleanly, they are unpacked there.
files_only=" libpython3.11-dev libpython3.11-testsuite "
# Debian's arm64 packages unpacked under $AARCH64_SYSROOT (static libraries and headers).
arm64_packages=(zlib1g-dev libsqlite3-dev liblua5.4-dev)

missing=()
add_missing() {
  local -n map=$1
  local need
  for need in "${!map[@]}"; do
    if [[ $need == /* ]]; then
      [ -e "$need" ] || [ -e "$NATIVE_SYSROOT$need" ] || missing+=("${map[$need]}")
    else
      command -v "$need" >/dev/null 2>&1 || missing+=("${map[$need]}")
    fi
  done
}
add_missing needs
if [ -n "$SKIP_CROSS" ]; then
  echo "test_deps: KILN_TEST_SKIP_CROSS is set: skipped the AArch64 and RISC-V cross compilers, qemu and Debian's arm64 libraries (${arm64_packages[*]})"
else
  add_missing cross_needs
fi
mapfile -t missing < <(printf '%s\n' "${missing[@]}" | sort -u | sed '/^$/d')

updated=""
apt_update() {
  if [ -z "$updated" ]; then
    logged $SUDO apt-get update -q
    updated=1
  fi
}

# Why `apt-get install` of these packages would change the machine, empty if it would
# not: the `Remv` lines and the upgrades (`Inst pkg [installed version] (...)`).
install_changes() {
  apt-get -s install --no-install-recommends "$@" 2>>"$LOG" | grep -E '^(Remv |Inst [^ ]+ \[)' || true
}

# Fetches `package` (the version the machine has of the same source package if the
# archive still offers it, otherwise apt's candidate) and unpacks it under `root`.
unpack_into() {
  local root=$1 package=$2
  shift 2
  local dl
  dl="$(mktemp -d "$SYSROOTS/download.XXXXXX")"
  (cd "$dl" && logged "$@" download "$package")
  local deb
  for deb in "$dl"/*.deb; do
    logged dpkg -x "$deb" "$root"
  done
  rm -rf "$dl"
}

# The version of `package` matching what is installed from its source package, if the
# archive has it: `package=version`, else `package`.
matching_version() {
  local package=$1 source version
  source="$(apt-cache show --no-all-versions "$package" 2>/dev/null | sed -n 's/^Source: \([^ ]*\).*/\1/p' | head -1)"
  source="${source:-$package}"
  version="$(dpkg-query -W -f='${db:Status-Abbrev} ${source:Package} ${Version}\n' 2>/dev/null |
    awk -v s="$source" '$1 == "ii" && $2 == s { print $3; exit }')"
  if [ -n "$version" ] && apt-cache madison "$package" | awk -F' \\| ' '{print $2}' | grep -qxF "$version"; then
    echo "$package=$version"
  else
    echo "$package"
  fi
}

native_apt=(apt-get -q -o APT::Sandbox::User="$(id -un)")
if ((${#missing[@]})); then
  apt_update
  changes="$(install_changes "${missing[@]}")"
  if [ -z "$changes" ]; then
    echo "test_deps: installing ${missing[*]}"
    logged $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
  else
    # One at a time: install the clean ones (together), unpack the files-only ones,
    # refuse the rest.
    clean=()
    refused=()
    for package in "${missing[@]}"; do
      changes="$(install_changes "$package")"
      if [ -z "$changes" ]; then
        clean+=("$package")
      elif [[ $files_only == *" $package "* ]]; then
        echo "test_deps: apt would change installed packages to install $package ($(echo "$changes" | awk '{print $2}' | paste -sd' ' -)): unpacking it under $NATIVE_SYSROOT instead"
        echo "$changes" >>"$LOG"
        mkdir -p "$NATIVE_SYSROOT"
        if [ "$package" = libpython3.11-testsuite ]; then
          # The test modules live inside packages the machine has (test/, ctypes/test/,
          # unittest/test/, ...): the private tree gets copies of those packages first,
          # so that PYTHONPATH=$NATIVE_SYSROOT/usr/lib/python3.11 finds both.
          staging="$(mktemp -d "$SYSROOTS/testsuite.XXXXXX")"
          unpack_into "$staging" "$(matching_version "$package")" "${native_apt[@]}"
          mkdir -p "$NATIVE_SYSROOT/usr/lib/python3.11"
          for dir in "$staging"/usr/lib/python3.11/*/; do
            host=/usr/lib/python3.11/$(basename "$dir")
            [ -d "$host" ] && cp -a "$host" "$NATIVE_SYSROOT/usr/lib/python3.11/"
          done
          cp -a "$staging"/. "$NATIVE_SYSROOT"/
          rm -rf "$staging"
        else
          unpack_into "$NATIVE_SYSROOT" "$(matching_version "$package")" "${native_apt[@]}"
        fi
      else
        refused+=("$package: $(echo "$changes" | paste -sd';' -)")
      fi
    done
    if ((${#refused[@]})); then
      echo "test_deps: these would remove or upgrade installed packages; install them yourself or run on a machine where they install cleanly:" >&2
      printf '  %s\n' "${refused[@]}" >&2
      exit 1
    fi
    if ((${#clean[@]})); then
      if [ -n "$(install_changes "${clean[@]}")" ]; then
        echo "test_deps: ${clean[*]} install cleanly one by one but not together" >&2
        install_changes "${clean[@]}" >&2
        exit 1
      fi
      echo "test_deps: installing ${clean[*]}"
      logged $SUDO apt-get install -y -q --no-install-recommends "${clean[@]}"
    fi
  fi
fi

for component in rustfmt clippy; do
  if ! cargo "${component/rustfmt/fmt}" --version >/dev/null 2>&1; then
    logged rustup component add "$component"
  fi
done

# --- Debian's arm64 libraries, private --------------------------------------------------
if [ -z "$SKIP_CROSS" ]; then
  stamp="$AARCH64_SYSROOT/.packages"
  if [ "$(cat "$stamp" 2>/dev/null)" != "${arm64_packages[*]}" ]; then
    echo "test_deps: unpacking arm64 ${arm64_packages[*]} under $AARCH64_SYSROOT"
    state="$SYSROOTS/apt-arm64"
    mkdir -p "$state/lists/partial" "$state/cache/archives/partial"
    : >"$state/status"
    # The machine's sources, arm64 indices only, into private lists; an empty dpkg
    # status (nothing is installed there, nothing is resolved against the machine).
    arm64_apt=(apt-get -q
      -o APT::Architecture=arm64 -o APT::Architectures::=arm64
      -o Dir::State::Lists="$state/lists" -o Dir::Cache="$state/cache"
      -o Dir::State::status="$state/status"
      -o Acquire::IndexTargets::deb::DEP-11::DefaultEnabled=false
      -o APT::Sandbox::User=root)
    logged "${arm64_apt[@]}" update
    rm -rf "$AARCH64_SYSROOT"
    mkdir -p "$AARCH64_SYSROOT"
    for package in "${arm64_packages[@]}"; do
      unpack_into "$AARCH64_SYSROOT" "$package" "${arm64_apt[@]}"
    done
    echo "${arm64_packages[*]}" >"$stamp"
  fi
fi
# --- C sources carried by crates (SQLite, Lua, zlib: compiled by the cross tests;
# Monocypher: executor-c's cryptography, for every executor-c test) --------------------------
logged cargo fetch --manifest-path tests/c-sources/Cargo.toml
echo "test_deps: done (apt's output: $LOG)"
