#!/usr/bin/env bash
# The fuzz targets (fuzz/, a cargo workspace of its own, and fuzz/c/, libFuzzer harnesses
# of executor-c's C) must build and run with the
# toolchain this machine has (stable: no cargo-fuzz, no nightly). This script checks the
# fuzz crate, builds its targets and runs each for a bounded time over its committed seed
# corpus (fuzz/corpus/<target>/). A crash, a panic or a time-out fails it, and libFuzzer
# leaves the input that did it in fuzz/artifacts/.
#
#   FUZZ_SECONDS    how long each target runs (default 10)
#   FUZZ_COVERAGE=1 a coverage-guided build (the sanitizer-coverage pass, as cargo-fuzz
#                   builds without a sanitizer; it works on stable), in fuzz/target:
#                   slower to build (about 2 minutes on 2 cores), far better at finding
#                   new inputs. Without it the targets are built as plain binaries (in
#                   the workspace's target directory, sharing what the tests built):
#                   libFuzzer runs the corpus and mutates it, unguided.
#
# Never writes to the committed corpus: inputs libFuzzer finds go to a scratch directory.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root/fuzz"
seconds=${FUZZ_SECONDS:-10}
targets=(object_loader protocol_decoder image_description windows_unwind)

# (No separate `cargo check`: the build below checks the same code, and a check first
# compiled every dependency twice, as metadata and then as code.)
if [[ ${FUZZ_COVERAGE:-0} == 1 ]]; then
    host=$(rustc -vV | sed -n 's/^host: //p')
    # --target keeps these flags off build scripts (which have no libFuzzer to link).
    export RUSTFLAGS="--cfg fuzzing -Cpasses=sancov-module \
        -Cllvm-args=-sanitizer-coverage-level=4 \
        -Cllvm-args=-sanitizer-coverage-inline-8bit-counters \
        -Cllvm-args=-sanitizer-coverage-pc-table \
        -Cllvm-args=-sanitizer-coverage-trace-compares \
        -Cdebug-assertions -Coverflow-checks"
    export CARGO_TARGET_DIR="$root/fuzz/target"
    echo "fuzz: coverage-guided build"
    cargo build --release --target "$host" --bins --quiet
    bin="$CARGO_TARGET_DIR/$host/release"
else
    export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$root/target}
    echo "fuzz: plain build"
    # The test command's profile (fuzz/Cargo.toml's `smoke`, as the main workspace's).
    cargo build --profile smoke --bins --quiet
    bin="$CARGO_TARGET_DIR/smoke"
fi

scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
mkdir -p "$root/fuzz/artifacts"
passed=0
failed=0
# run_target NAME BINARY: runs BINARY for $seconds over fuzz/corpus/NAME (new inputs go to
# a scratch directory; the corpus is only read); writes what it says to
# $scratch/NAME.out and "passed" or "failed" to $scratch/NAME.status. Two run at once
# (each libFuzzer process uses one core: every target still fuzzes for $seconds).
run_target() {
    run_one "$@" >"$scratch/$1.out" 2>&1
}
run_one() {
    local target=$1 binary=$2 corpus="$root/fuzz/corpus/$1"
    if [[ ! -d $corpus ]] || [[ -z $(ls -A "$corpus") ]]; then
        echo "fuzz: $target: no seed corpus in $corpus"
        echo failed >"$scratch/$target.status"
        return
    fi
    mkdir -p "$scratch/$target"
    echo "fuzz: $target for ${seconds}s over $(ls "$corpus" | wc -l) seeds"
    if "$binary" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
        -max_len=65536 -print_final_stats=1 \
        -artifact_prefix="$root/fuzz/artifacts/$target-" \
        "$scratch/$target" "$corpus" >"$scratch/$target.log" 2>&1; then
        grep -E '^(Done|stat::number_of_executed_units)' "$scratch/$target.log" | sed "s/^/fuzz: $target: /"
        echo passed >"$scratch/$target.status"
    else
        echo "fuzz: $target FAILED; its output:"
        tail -n 40 "$scratch/$target.log"
        echo failed >"$scratch/$target.status"
    fi
}
# Starts run_target in the background, two at a time.
started=()
start_target() {
    while (($(jobs -rp | wc -l) >= 2)); do wait -n || true; done
    run_target "$@" &
    started+=("$1")
}
for target in "${targets[@]}"; do
    start_target "$target" "$bin/$target"
done
# executor-c's frame parser (executor-c/wire.h, C): a libFuzzer harness built with
# clang-16 (-fsanitize=fuzzer,address: coverage-guided), run as the targets above.
c_target=executor_c_frames
if command -v clang-16 >/dev/null && [[ -e /usr/lib/llvm-16/lib/clang/16/lib/linux/libclang_rt.fuzzer-x86_64.a ]]; then
    clang-16 -g -O1 -fsanitize=fuzzer,address -Wall -Wextra -Werror \
        "$root/fuzz/c/$c_target.c" -o "$scratch/$c_target.bin"
    start_target "$c_target" "$scratch/$c_target.bin"
else
    echo "fuzz: $c_target: no clang-16 with libFuzzer (libclang-rt-16-dev): not run"
    failed=$((failed + 1))
fi
wait
for target in "${started[@]}"; do
    cat "$scratch/$target.out"
    if [[ $(cat "$scratch/$target.status" 2>/dev/null) == passed ]]; then
        passed=$((passed + 1))
    else
        failed=$((failed + 1))
    fi
done
echo "fuzz: $passed passed, $failed failed"
[[ $failed == 0 ]]
