#!/usr/bin/env bash
# build_native.sh [OUT_DIR]
#
# Compiles every Kiln test program to relocatable objects under OUT_DIR (default
# /tmp/kiln-programs), links them natively with gcc/g++, runs each binary twice and
# stores the expected stdout as OUT_DIR/<name>.expected (stderr goes to
# OUT_DIR/<name>.stderr and is not part of the expectation). Fails if a program does not
# build, exits non-zero, or produces different stdout on the two runs.
#
# For each program it prints the exact `cc -c` command lines, the native link command
# and the libraries the native link needed (the smallest working set among candidate
# library lists, tried in order), plus the distinct relocation types in its objects.
# The same facts are written to OUT_DIR/manifest.tsv, one line per program:
#   name  driver  cflags  objects  link_flags  libs  args  expected
# (tab-separated; objects are paths relative to OUT_DIR; args may mention @OUT@ which
# stands for OUT_DIR; link_flags is "-no-pie" for the non-PIC variant, else empty).
set -euo pipefail

OUT=${1:-/tmp/kiln-programs}
SRC=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
CC=${CC:-cc}
CXX=${CXX:-g++}
LIBDIR=/usr/lib/x86_64-linux-gnu
WARN="-Wall -Wextra"

mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
MANIFEST="$OUT/manifest.tsv"
printf 'name\tdriver\tcflags\tobjects\tlink_flags\tlibs\targs\texpected\n' >"$MANIFEST"
cp "$SRC/script.lua" "$OUT/script.lua"

failed=0

# build NAME DRIVER "CFLAGS" "SOURCES" "LINK_FLAGS" "ARGS" LIBSET1 [LIBSET2 ...]
#   SOURCES: space-separated source file names in $SRC; object i is
#   <source basename><suffix>.o where suffix is "-<variant>" when NAME has one.
#   LIBSETn: candidate library lists for the native link, tried in order.
build() {
    local name=$1 driver=$2 cflags=$3 sources=$4 ldflags=$5 args=$6
    shift 6
    local suffix=""
    [[ $name == *-* ]] && suffix="-${name#*-}"
    local objs=() src base obj compiler
    compiler=$CC
    [[ $driver == c++ ]] && compiler=$CXX
    echo "== $name"
    for src in $sources; do
        base=${src%.*}
        obj="$base$suffix.o"
        echo "   compile: $compiler -c $cflags $WARN $src -o $obj"
        if ! (cd "$SRC" && $compiler -c $cflags $WARN "$src" -o "$OUT/$obj"); then
            echo "   FAILED to compile $src"
            failed=$((failed + 1))
            return
        fi
        objs+=("$obj")
    done

    local libs="" linked=0 libset
    for libset in "$@"; do
        if (cd "$OUT" && $compiler $ldflags "${objs[@]}" $libset -o "$name.native") 2>"$OUT/$name.linklog"; then
            libs=$libset
            linked=1
            break
        fi
    done
    if [[ $linked != 1 ]]; then
        echo "   FAILED to link; last attempt's errors:"
        sed 's/^/     /' "$OUT/$name.linklog" | head -20
        failed=$((failed + 1))
        return
    fi
    rm -f "$OUT/$name.linklog"
    echo "   link:    $compiler $ldflags ${objs[*]} $libs -o $name.native"
    echo "   libs:    ${libs:-(none beyond the driver defaults)}"

    local rargs=${args//@OUT@/$OUT}
    local rc1=0 rc2=0
    (cd "$OUT" && "./$name.native" $rargs >"$name.expected" 2>"$name.stderr") || rc1=$?
    (cd "$OUT" && "./$name.native" $rargs >"$name.run2" 2>/dev/null) || rc2=$?
    local same=yes
    cmp -s "$OUT/$name.expected" "$OUT/$name.run2" || same=NO
    rm -f "$OUT/$name.run2"

    local types
    types=$(cd "$OUT" && readelf -rW "${objs[@]}" | awk '$3 ~ /^R_X86_64_/ {print $3}' | sort -u | tr '\n' ' ')
    echo "   relocs:  $types"

    local lines
    lines=$(wc -l <"$OUT/$name.expected")
    if [[ $rc1 == 0 && $rc2 == 0 && $same == yes ]]; then
        echo "OK   $name: exit 0, $lines lines of stdout, deterministic, -> $name.expected"
    else
        echo "FAIL $name: exit codes $rc1/$rc2, deterministic=$same"
        failed=$((failed + 1))
    fi
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$name" "$driver" "$cflags" "${objs[*]}" "$ldflags" \
        "$libs" "$args" "$name.expected" >>"$MANIFEST"
}

# Static archives are named by full path so the native link is guaranteed to use
# exactly the archive Kiln will load; -l flags are what the archive itself needs.
build sqlite_driver cc "-O2 -fPIE" "sqlite_driver.c" "" "" \
    "$LIBDIR/libsqlite3.a" "$LIBDIR/libsqlite3.a -lm" "$LIBDIR/libsqlite3.a -lm -lpthread -ldl"
build lua_driver cc "-O2 -fPIE -I/usr/include/lua5.4" "lua_driver.c" "" "@OUT@/script.lua" \
    "$LIBDIR/liblua5.4.a" "$LIBDIR/liblua5.4.a -lm" "$LIBDIR/liblua5.4.a -lm -ldl"
build zlib_driver cc "-O2 -fPIE" "zlib_driver.c" "" "" \
    "$LIBDIR/libz.a" "$LIBDIR/libz.a -lm"
build cxx_exceptions c++ "-O2 -fPIE" "cxx_exceptions.cpp" "" "" ""
build tls cc "-O2 -fPIC" "tls.c" "" "" "" "-lpthread"
build cxx_comdat c++ "-O2 -fPIE" "cxx_comdat_a.cpp cxx_comdat_b.cpp" "" "" ""
build runtime_exit cc "-O2 -fPIE" "runtime_exit.c" "" "" "" "-lpthread"
build thread_local_dtors c++ "-O2 -fPIC -pthread" "thread_local_dtors.cpp" "" "" "" "-pthread"
# Static TLS: local-exec and initial-exec (-fPIE), TLS descriptors (gnu2).
build tls_static-pie cc "-O2 -fPIE" "tls_static.c tls_static_other.c" "" "" "" "-lpthread"
build tls_static-desc cc "-O2 -fPIC -mtls-dialect=gnu2" "tls_static.c tls_static_other.c" "" "" "" "-lpthread"

# relocs: five code-model / PIC variants, each a separate pair of objects.
build relocs-O0-pie cc "-O0 -fPIE -fcommon" "relocs.c relocs_other.c" "" "" ""
build relocs-O2-pie cc "-O2 -fPIE -fcommon" "relocs.c relocs_other.c" "" "" ""
build relocs-O3-pic cc "-O3 -fPIC -fcommon" "relocs.c relocs_other.c" "" "" ""
build relocs-O2-nopic cc "-O2 -fno-pic -mcmodel=small -fcommon" "relocs.c relocs_other.c" "-no-pie" "" ""
build relocs-O2-large-pic cc "-O2 -mcmodel=large -fPIC -fcommon" "relocs.c relocs_other.c" "" "" ""

# All relocs variants must print the same thing.
for v in O2-pie O3-pic O2-nopic O2-large-pic; do
    if [[ -f $OUT/relocs-$v.expected ]] && ! cmp -s "$OUT/relocs-O0-pie.expected" "$OUT/relocs-$v.expected"; then
        echo "FAIL relocs-$v output differs from relocs-O0-pie"
        failed=$((failed + 1))
    fi
done

echo "manifest: $MANIFEST"
if [[ $failed != 0 ]]; then
    echo "$failed failure(s)"
    exit 1
fi
echo "all programs built and ran natively"
