#!/usr/bin/env bash
# Kiln's main job on a bundled example: compile the bundled SQLite driver with the system
# C compiler and JIT-link it with Debian's libsqlite3.a into memory, then run it.
set -euo pipefail
cd "$(dirname "$0")/.."
# Where cargo puts what it builds (CARGO_TARGET_DIR if set), and the profile it builds
# (KILN_PROFILE: release unless set; the test command uses its own, `smoke`).
TARGET="${CARGO_TARGET_DIR:-target}"
PROFILE="${KILN_PROFILE:-release}"
# cargo's `dev` profile builds into target/debug.
OUT="$PROFILE"
[ "$PROFILE" = dev ] && OUT=debug
if [ ! -e /usr/lib/x86_64-linux-gnu/libsqlite3.a ] || ! command -v cc >/dev/null; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  # Only if nothing installed would be removed or upgraded (as scripts/test_deps.sh).
  changes="$(apt-get -s install --no-install-recommends gcc libsqlite3-dev | grep -E '^(Remv |Inst [^ ]+ \[)' || true)"
  if [ -n "$changes" ]; then
    echo "installing gcc and libsqlite3-dev would change installed packages; install them yourself:" >&2
    echo "$changes" >&2
    exit 1
  fi
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends gcc libsqlite3-dev >/dev/null
fi
# (Not in the test command, which built them with its other binaries: KILN_TEST_BINARIES_BUILT
# names that profile; this selection alone unifies other features and compiles 13 crates
# again.)
if [ "${KILN_TEST_BINARIES_BUILT:-}" != "$PROFILE" ]; then
  echo "== building kiln and kiln-executor ($PROFILE; the first build takes a few minutes)" >&2
  cargo build --profile "$PROFILE" -p kiln-cli -p kiln-executor
fi
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
cc -O2 -c tests/programs/sqlite_driver.c -o "$out/sqlite_driver.o"
echo "== kiln run: sqlite_driver.o + Debian's libsqlite3.a + libm, linked in memory (no file is written)" >&2
status=0
"$TARGET/$OUT"/kiln run -v --show-times "$out/sqlite_driver.o" /usr/lib/x86_64-linux-gnu/libsqlite3.a -lm || status=$?
echo "== main returned $status (kiln is $TARGET/$OUT/kiln; kiln --help for more)" >&2
exit "$status"
