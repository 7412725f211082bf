#!/usr/bin/env bash
# Installs Kiln's C library: PREFIX/lib/libkiln_capi.{so,a}, PREFIX/include/kiln.h and
# PREFIX/lib/pkgconfig/kiln.pc, so that a C program builds with
#   cc prog.c $(pkg-config --cflags --libs kiln)
# (with PKG_CONFIG_PATH=PREFIX/lib/pkgconfig unless PREFIX is a system prefix).
#
#   scripts/install_capi.sh PREFIX [--debug | --profile NAME] [--features llvm]
#
# The library is built with cargo's release profile unless --debug (the dev profile) or
# --profile NAME (a profile of Cargo.toml's: the test command's `smoke`) says otherwise.
set -euo pipefail
cd "$(dirname "$0")/.."
PREFIX="${1:?usage: scripts/install_capi.sh PREFIX [--debug | --profile NAME] [--features llvm]}"
shift
PROFILE=release
FEATURES=()
while (($#)); do
  case "$1" in
    --debug) PROFILE=debug ;;
    --profile) PROFILE="$2"; shift ;;
    --features) FEATURES=(--features "kiln-capi/$2"); shift ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
TARGET="${CARGO_TARGET_DIR:-target}"
# cargo's `dev` profile builds into target/debug.
[ "$PROFILE" = dev ] && PROFILE=debug
# With the executor, as the tests build it (kiln_testkit::cargo_build): the same packages
# unify the same features, so neither build undoes the other's. Not in the test command
# once it built its binaries of this profile (KILN_TEST_BINARIES_BUILT names it, and
# KILN_TEST_CAPI_FEATURES the features it built the library with): its tests run in two
# lanes, and a build would replace files the other lane's tests are using.
# KILN_TEST_CAPI_FEATURES names the features it built the library with (none, or llvm in
# its LLVM phase).
BUILT_FEATURES=()
[ -n "${KILN_TEST_CAPI_FEATURES:-}" ] && BUILT_FEATURES=(--features "kiln-capi/$KILN_TEST_CAPI_FEATURES")
if [ "${KILN_TEST_BINARIES_BUILT:-}" = "$PROFILE" ] && [ "${FEATURES[*]}" = "${BUILT_FEATURES[*]}" ]; then
  :
elif [ "$PROFILE" = debug ]; then
  cargo build -p kiln-capi -p kiln-executor "${FEATURES[@]}"
else
  cargo build --profile "$PROFILE" -p kiln-capi -p kiln-executor "${FEATURES[@]}"
fi
mkdir -p "$PREFIX/lib/pkgconfig" "$PREFIX/include"
PREFIX="$(cd "$PREFIX" && pwd)"
install -m 0644 crates/kiln-capi/include/kiln.h "$PREFIX/include/kiln.h"
install -m 0755 "$TARGET/$PROFILE/libkiln_capi.so" "$PREFIX/lib/libkiln_capi.so"
install -m 0644 "$TARGET/$PROFILE/libkiln_capi.a" "$PREFIX/lib/libkiln_capi.a"
# The executor binary, for sessions that run code out of process.
if [ -x "$TARGET/$PROFILE/kiln-executor" ]; then
  mkdir -p "$PREFIX/bin"
  install -m 0755 "$TARGET/$PROFILE/kiln-executor" "$PREFIX/bin/kiln-executor"
fi
CFLAGS_EXTRA=""
LIBS_EXTRA=""
if [ "${FEATURES[1]:-}" = kiln-capi/llvm ]; then
  # The LLVM-C part of the header, and the LLVM it was built against.
  CFLAGS_EXTRA=" -DKILN_WITH_LLVM"
  LLVM_CONFIG="${LLVM_SYS_140_PREFIX:-/usr/lib/llvm-14}/bin/llvm-config"
  LIBS_EXTRA=" $("$LLVM_CONFIG" --ldflags) -lLLVM-14"
fi
VERSION="$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)"
cat > "$PREFIX/lib/pkgconfig/kiln.pc" <<PC
prefix=$PREFIX
libdir=\${prefix}/lib
includedir=\${prefix}/include

Name: kiln
Description: Kiln, a JIT linker and executable-memory manager
Version: $VERSION
Cflags: -I\${includedir}$CFLAGS_EXTRA
Libs: -L\${libdir} -Wl,-rpath,\${libdir} -lkiln_capi$LIBS_EXTRA
Libs.private: -lpthread -ldl -lm -lgcc_s -lstdc++
PC
echo "installed kiln $VERSION ($PROFILE) in $PREFIX"
