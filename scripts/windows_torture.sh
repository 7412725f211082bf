#!/usr/bin/env bash
# The c-torture figure of "Windows as a first-class target": gcc's own execute tests
# (gcc/testsuite/gcc.c-torture/execute/*.c of the gcc-12-source package's tarball)
# compiled as COFF objects by mingw-w64 gcc and by clang-16 for x86_64-w64-windows-gnu,
# each run by `kiln run --connect` on executor-c's Windows executor under Wine. A test
# counts only if the same source built natively by mingw-w64 gcc passes under Wine (exit
# status 0); a Kiln run passes when its status is 0 too.
#   scripts/windows_torture.sh [KILN] [OPT]     (KILN: target/release/kiln; OPT: -O1)
# Needs gcc-12-source (apt-get install gcc-12-source), mingw-w64, clang-16, wine64.
# Prints the counts and writes each test's result to $TMPDIR/kiln-torture/results.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
kiln=${1:-$here/target/release/kiln}
opt=${2:--O1}
work=${TMPDIR:-/tmp}/kiln-torture
mkdir -p "$work"
tarball=$(ls /usr/src/gcc-12/gcc-*.tar.* 2>/dev/null | head -n 1)
[ -n "$tarball" ] || { echo "windows_torture: no /usr/src/gcc-12/gcc-*.tar.*: apt-get install gcc-12-source" >&2; exit 1; }
if [ ! -d "$work/execute" ]; then
  tar -xf "$tarball" -C "$work" --wildcards '*/gcc/testsuite/gcc.c-torture/execute/*.c'
  mv "$work"/gcc-*/gcc/testsuite/gcc.c-torture/execute "$work/execute"
fi
export WINEPREFIX=$work/wine WINEDEBUG=-all
wine=/usr/lib/wine/wine64
"$here/executor-c/build.sh" "$work/executor" x86_64-w64-mingw32-gcc
key=$work/key
[ -f "$key" ] || (umask 077 && head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$key")
"$wine" cmd.exe /c exit >/dev/null 2>&1 || true
"$wine" "$work/executor.exe" --listen 127.0.0.1:0 --key-file "$key" > "$work/executor.out" 2>&1 &
executor=$!
trap 'kill $executor 2>/dev/null || true' EXIT
for _ in $(seq 100); do grep -q "listening on" "$work/executor.out" && break; sleep 0.2; done
address=$(grep -o "listening on [^ ]*" "$work/executor.out" | head -n 1 | cut -d' ' -f3)
[ -n "$address" ] || { echo "windows_torture: the executor did not listen: $(cat "$work/executor.out")" >&2; exit 1; }

one() { # one test: prints "name native gcc clang" (pass, fail, or skip)
  local c=$1 name d native=fail gcc=fail clang=fail
  name=$(basename "$c" .c)
  d=$work/run/$name
  mkdir -p "$d"
  if timeout 60 x86_64-w64-mingw32-gcc $opt -w "$c" -o "$d/native.exe" -lm >/dev/null 2>&1 &&
     timeout 20 "$wine" "$d/native.exe" >/dev/null 2>&1; then
    native=pass
  else
    echo "$name skip skip skip"; return
  fi
  if timeout 60 x86_64-w64-mingw32-gcc $opt -w -c "$c" -o "$d/gcc.obj" >/dev/null 2>&1; then
    timeout 30 "$kiln" run --connect "$address" --key-file "$key" "$d/gcc.obj" >"$d/gcc.out" 2>&1 && gcc=pass
  fi
  # (clang 16 makes the old C these tests are written in, implicit int and declarations,
  # errors: they are warnings again, as for gcc 12.)
  if timeout 60 clang-16 --target=x86_64-w64-windows-gnu $opt -w -Wno-implicit-function-declaration \
       -Wno-implicit-int -Wno-int-conversion -Wno-incompatible-pointer-types -c "$c" -o "$d/clang.obj" >/dev/null 2>&1; then
    timeout 30 "$kiln" run --connect "$address" --key-file "$key" "$d/clang.obj" >"$d/clang.out" 2>&1 && clang=pass
  else
    clang=skip
  fi
  echo "$name $native $gcc $clang"
}
export -f one
export work wine kiln key address opt
ls "$work"/execute/*.c | xargs -P 2 -I{} bash -c 'one {}' > "$work/results"
awk '
  $2 == "pass" { kept++ }
  $2 == "pass" && $3 == "pass" { gcc++ }
  $2 == "pass" && $4 != "skip" { clang_kept++ }
  $2 == "pass" && $4 == "pass" { clang++ }
  END {
    printf "c-torture execute tests: %d; passing natively under Wine (mingw-w64 gcc %s): %d\n", NR, opt, kept
    printf "  kiln, COFF from mingw-w64 gcc:  %d / %d\n", gcc, kept
    printf "  kiln, COFF from clang-16:       %d / %d (clang compiled %d of them)\n", clang, clang_kept, clang_kept
  }' opt="$opt" "$work/results"
grep -v " skip skip skip$" "$work/results" | awk '$3 != "pass" || $4 == "fail"' | head -n 40
