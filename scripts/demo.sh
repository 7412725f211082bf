#!/usr/bin/env bash
# Kiln's main job on a bundled example: compile the bundled SQLite driver with the system
# C compiler and JIT-link it with Debian's libsqlite3.a into memory, then run it.
set -euo pipefail
cd "$(dirname "$0")/.."
# Where cargo puts what it builds (CARGO_TARGET_DIR if set).
TARGET="${CARGO_TARGET_DIR:-target}"
if [ ! -e /usr/lib/x86_64-linux-gnu/libsqlite3.a ] || ! command -v cc >/dev/null; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq gcc libsqlite3-dev
fi
cargo build --release -q -p kiln-cli -p kiln-executor
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
cc -O2 -c tests/programs/sqlite_driver.c -o "$out/sqlite_driver.o"
"$TARGET"/release/kiln run --show-times "$out/sqlite_driver.o" /usr/lib/x86_64-linux-gnu/libsqlite3.a -lm
