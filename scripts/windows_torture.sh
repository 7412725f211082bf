#!/usr/bin/env bash
# The c-torture figure of "Windows as a first-class target": gcc's own execute tests
# (gcc/testsuite/gcc.c-torture/execute/*.c of the gcc-12-source package's tarball)
# compiled as COFF objects by mingw-w64 gcc and by clang-16 for x86_64-w64-windows-gnu,
# each run by `kiln run --connect` on executor-c's Windows executor under Wine. An object
# counts only if it passes linked natively (mingw-w64's linker) and run under Wine (exit
# status 0); Kiln's run of it passes when its status is 0 too.
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

one() { # one test: "name GCC CLANG", each "pass" or "fail" (Kiln's run of the object), or
  # "skip" (the compiler refused it, or its object linked natively fails under Wine)
  local c=$1 name d compiler out=""
  name=$(basename "$c" .c)
  d=$work/run/$name
  mkdir -p "$d"
  for compiler in gcc clang; do
    local obj=$d/$compiler.obj result=skip
    case $compiler in
    gcc) timeout 60 x86_64-w64-mingw32-gcc $opt -w -c "$c" -o "$obj" >/dev/null 2>&1 || obj= ;;
    # (clang 16 makes the old C these tests are written in, implicit int and declarations,
    # errors: they are warnings again, as for gcc 12.)
    clang) timeout 60 clang-16 --target=x86_64-w64-windows-gnu $opt -w -Wno-implicit-function-declaration \
             -Wno-implicit-int -Wno-int-conversion -Wno-incompatible-pointer-types -c "$c" -o "$obj" >/dev/null 2>&1 || obj= ;;
    esac
    # (Wine's crash handler ends a crashed program with status 0: its report marks it.)
    if [ -n "$obj" ] && timeout 60 x86_64-w64-mingw32-gcc "$obj" -o "$d/$compiler.exe" -lm >/dev/null 2>&1 &&
       timeout 20 "$wine" "$d/$compiler.exe" >"$d/$compiler.native" 2>&1 &&
       ! grep -q "Unhandled exception" "$d/$compiler.native"; then
      result=fail
      timeout 30 "$kiln" run --connect "$address" --key-file "$key" "$obj" >"$d/$compiler.out" 2>&1 && result=pass
    fi
    out="$out $result"
  done
  echo "$name$out"
}
export -f one
export work wine kiln key address opt
ls "$work"/execute/*.c | xargs -P 2 -I{} bash -c 'one {}' > "$work/results"
awk '
  $2 != "skip" { gcc_kept++ } $2 == "pass" { gcc++ }
  $3 != "skip" { clang_kept++ } $3 == "pass" { clang++ }
  END {
    printf "c-torture execute tests: %d (%s); each object counted where it passes linked natively under Wine\n", NR, opt
    printf "  kiln, COFF from mingw-w64 gcc:  %d / %d\n", gcc, gcc_kept
    printf "  kiln, COFF from clang-16:       %d / %d\n", clang, clang_kept
  }' opt="$opt" "$work/results"
echo "failures (name gcc clang):"
awk '$2 == "fail" || $3 == "fail"' "$work/results"
