#!/usr/bin/env bash
# Kiln's test command (CI's .ci/run calls exactly this):
#
#   ./scripts/test.sh
#
# installs what the tests need without changing what the machine has
# (scripts/test_deps.sh: no package removed, replaced or upgraded; Debian's arm64
# libraries and anything apt could not install cleanly go into target/sysroot), then runs
# format and lint checks, every test, the benchmarks on a small workload (so they keep
# working) and the demo; then checks that no installed Debian package was removed or
# changed version. One line per phase with its time, then the tests' totals.
#
# Environment:
#   KILN_TEST_SKIP_CROSS=1   skip the cross-architecture parts (AArch64: cross compiler,
#                            qemu, arm64 libraries; their tests skip and say so)
#   CARGO_TARGET_DIR         where cargo builds (default target/); the private sysroots
#                            are under it, in sysroot/
#   KILN_TEST_LOGS           where the tests' and benchmarks' full output goes (default
#                            $CARGO_TARGET_DIR/test-logs)
set -euo pipefail
cd "$(dirname "$0")/.."
# Where cargo puts what it builds (CARGO_TARGET_DIR if set).
TARGET="${CARGO_TARGET_DIR:-target}"
mkdir -p "$TARGET"
TARGET="$(cd "$TARGET" && pwd)"
LOGS="${KILN_TEST_LOGS:-$TARGET/test-logs}"
mkdir -p "$LOGS"

export CARGO_BUILD_JOBS="${CARGO_BUILD_JOBS:-2}"
export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"
# One build from scratch: incremental caches would only cost time and ~1 GB of target/.
export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"
# kiln-llvm's feature `llvm` builds against Debian's LLVM 14 (llvm-14-dev).
export LLVM_SYS_140_PREFIX="${LLVM_SYS_140_PREFIX:-/usr/lib/llvm-14}"
# The private sysroots scripts/test_deps.sh fills, for the tests and benchmarks.
export KILN_SYSROOT_DIR="${KILN_SYSROOT_DIR:-$TARGET/sysroot}"
export KILN_AARCH64_SYSROOT="${KILN_AARCH64_SYSROOT:-$KILN_SYSROOT_DIR/aarch64}"
export KILN_NATIVE_SYSROOT="${KILN_NATIVE_SYSROOT:-$KILN_SYSROOT_DIR/native}"
# kiln run's caches (objects, linked images, launchers) for the tests and benchmarks: one
# of this run's, not the user's ~/.cache/kiln (a run leaves the home as it found it).
export KILN_CACHE_DIR="$TARGET/tmp/kiln-cache"
rm -rf "$KILN_CACHE_DIR"
if [ -n "${KILN_TEST_SKIP_CROSS:-}" ] && [ "$KILN_TEST_SKIP_CROSS" != 0 ]; then
  export KILN_TEST_SKIP_CROSS=1
else
  unset KILN_TEST_SKIP_CROSS
fi

# --- phases -----------------------------------------------------------------------------
# `phase NAME COMMAND...` runs COMMAND, then prints one line with NAME, its time and
# whether it passed. A failed phase does not stop the run (the later phases still say
# what they find); the command exits 1 at the end if any failed.
started=$SECONDS
summary=()
failed_phases=()
duration() { printf '%dm%02ds' $(($1 / 60)) $(($1 % 60)); }
phase() {
  local name=$1 start=$SECONDS status=0
  shift
  echo "== $name"
  "$@" || status=$?
  local line
  line="$(printf -- '-- %-44s %8s' "$name" "$(duration $((SECONDS - start)))")"
  if [ "$status" -eq 0 ]; then
    line+="  ok"
  else
    line+="  FAILED (exit $status)"
    failed_phases+=("$name")
  fi
  echo "$line"
  summary+=("$line")
}

# The installed Debian packages, `package:arch version` (to compare before and after).
dpkg_snapshot() {
  dpkg-query -W -f='${db:Status-Abbrev} ${Package}:${Architecture} ${Version}\n' |
    awk '$1 == "ii" { print $2, $3 }' | sort
}
# Fails if a package of the snapshot `$1` is gone or has another version now (packages
# added since are fine).
dpkg_unchanged() {
  local changed
  changed="$(dpkg_snapshot | awk 'NR == FNR { now[$1] = $2; next }
    !($1 in now) { print "removed: " $1 " " $2; next }
    now[$1] != $2 { print "changed: " $1 " " $2 " -> " now[$1] }' - "$1")"
  if [ -n "$changed" ]; then
    echo "the test command changed installed packages:"
    echo "$changed"
    return 1
  fi
  echo "no installed package removed or changed ($(wc -l <"$1") before, $(dpkg_snapshot | wc -l) now)"
}

# cargo test with the passing tests' lines left out of the console (all of it is in
# $LOGS/NAME.log); failures, panics and `test result:` lines stay visible. The output goes
# to the file, and the console follows the file until cargo exits: a process a failed
# test leaves behind (an executor it did not get to kill) cannot hold the phase open.
tests_log=()
cargo_test() {
  local name=$1
  shift
  local log="$LOGS/$name.log"
  tests_log+=("$log")
  : >"$log"
  cargo test "$@" >"$log" 2>&1 &
  local pid=$!
  tail -n +1 -f --pid="$pid" "$log" |
    { grep --line-buffered -v -E '^test .* \.\.\. ok$|^running [0-9]+ tests?$|^$|Blocking waiting for file lock' || true; }
  wait "$pid"
}

# --- what the tests need ----------------------------------------------------------------
dpkg_snapshot >"$LOGS/dpkg-before.txt"
phase "dependencies (scripts/test_deps.sh)" ./scripts/test_deps.sh
if ((${#failed_phases[@]})); then
  echo "FAILED: what the tests need could not be installed without changing the machine"
  exit 1
fi

# --- checks -----------------------------------------------------------------------------
phase "cargo fmt --check" cargo fmt --all -- --check
# Every library and binary crate a user would depend on packages as `cargo publish` would
# make it (versions on path dependencies, metadata, the files it ships); not built again
# from the package (`--no-verify`: that build would double the test command's).
# kiln-bench, kiln-testkit and kiln-cranelift-peer are `publish = false`. The packaging
# resolves offline, from the registry's index cache: `cargo fetch` fills it first (on a
# fresh machine it is empty, and the phases after it download the crates anyway).
package_crates() {
  cargo fetch --locked &&
    CARGO_TARGET_DIR="$TARGET/package-check" cargo package --offline --workspace \
    --exclude kiln-bench --exclude kiln-testkit --exclude kiln-cranelift-peer \
    --no-verify --allow-dirty &&
    rm -rf "$TARGET/package-check"
}
phase "crates package (cargo package --no-verify)" package_crates
# Clippy's metadata (half a gigabyte, read by nothing else) goes to a directory of its own,
# removed after: the build scripts and procedural macros it compiles are compiled again for
# the tests, which costs less than keeping it. One run, with kiln-llvm's and kiln-capi's
# `llvm` feature on (no code of theirs is only for builds without it, so this checks every
# line; two more runs for those crates alone cost the LLVM phase half a minute).
CLIPPY_DIR="$TARGET/clippy"
# Then `kiln` as a user with `default-features = false` builds it (no Noise, no Redis): its
# library checked too, and the lean build's dependency tree shown to hold neither crate.
clippy_all() {
  CARGO_TARGET_DIR="$CLIPPY_DIR" cargo clippy --workspace --all-targets \
    --features kiln-llvm/llvm,kiln-capi/llvm -- -D warnings &&
    CARGO_TARGET_DIR="$CLIPPY_DIR" cargo clippy -p kiln --lib --no-default-features \
      -- -D warnings &&
    lean_kiln_has_no_optional_crates &&
    rm -rf "$CLIPPY_DIR"
}
lean_kiln_has_no_optional_crates() {
  local found
  found=$(cargo tree --offline -p kiln --no-default-features -e normal --prefix none |
    grep -E '^(snow|redis) ' || true)
  if [ -n "$found" ]; then
    echo "kiln without default features still depends on: $found" >&2
    return 1
  fi
}
phase "cargo clippy -D warnings" clippy_all
# kiln-bench has no tests (its benchmarks run below): building its thirteen empty test
# harnesses in debug cost the phase time for nothing (clippy still checks it).
WORKSPACE_TESTS=(--profile smoke --workspace --exclude kiln-bench --no-fail-fast)
# The test binaries that mostly wait (on sockets, children, the clock: each keeps less than
# a core busy) run in a lane of their own beside the others, and so does c_executor (its
# executors under qemu, one at a time: one core for 35 s, the other idle in the main lane). The executors' security tests
# run after both, alone: they time how fast a keyed client is served during a flood of
# 2,000 connections (under 1 s), which a machine busy with the other lane missed (1.47 s).
WAITING_TESTS=(image_cache runtime stamps c_api c_executor)
TIMED_TESTS=(executor_security executor_c_security)
# The binaries of the phase below (`cargo build` of these packages unifies to the tests'
# features: kiln-bench's Cargo.toml), built here once; then no test builds the executor or
# the C library (KILN_TEST_BINARIES_BUILT: kiln_testkit::cargo_build, install_capi.sh),
# which would replace them while the other lane's tests start them.
BINARY_PACKAGES=(-p kiln-bench -p kiln-cli -p kiln-executor -p kiln-lang -p kiln-capi)
workspace_tests() {
  local build_log="$LOGS/workspace-build.log"
  echo "building the tests and the binaries (output in $build_log)"
  if ! { cargo test "${WORKSPACE_TESTS[@]}" --no-run &&
    cargo build --profile smoke "${BINARY_PACKAGES[@]}"; } >"$build_log" 2>&1; then
    tail -n 40 "$build_log"
    return 1
  fi
  export KILN_TEST_BINARIES_BUILT=smoke
  # Every other test target by name (cargo test has no option to leave some out).
  local others
  others=$(cargo metadata --offline --no-deps --format-version 1 |
    python3 -c 'import json, sys
apart = set(sys.argv[1:])
names = sorted({t["name"] for p in json.load(sys.stdin)["packages"] if p["name"] != "kiln-bench"
    for t in p["targets"] if "test" in t["kind"] and t["name"] not in apart})
print(" ".join("--test " + n for n in names))' "${WAITING_TESTS[@]}" "${TIMED_TESTS[@]}") || return 1
  local waiting_args=() timed_args=() name
  for name in "${WAITING_TESTS[@]}"; do waiting_args+=(--test "$name"); done
  for name in "${TIMED_TESTS[@]}"; do timed_args+=(--test "$name"); done
  local waiting_log="$LOGS/workspace-waiting.log" status=0
  tests_log+=("$waiting_log")
  cargo test "${WORKSPACE_TESTS[@]}" "${waiting_args[@]}" >"$waiting_log" 2>&1 &
  local waiting_pid=$!
  # shellcheck disable=SC2086 # $others is the list of --test NAME words
  cargo_test workspace "${WORKSPACE_TESTS[@]}" --lib --bins $others || status=1
  cargo_test workspace-doc "${WORKSPACE_TESTS[@]}" --doc || status=1
  wait "$waiting_pid" || status=1
  echo "the tests that wait, run beside the others (${WAITING_TESTS[*]}):"
  grep -v -E '^test .* \.\.\. ok$|^running [0-9]+ tests?$|^$|Blocking waiting for file lock' "$waiting_log" || true
  echo "the timed tests, alone (${TIMED_TESTS[*]}):"
  cargo_test workspace-timed "${WORKSPACE_TESTS[@]}" "${timed_args[@]}" || status=1
  return "$status"
}
phase "cargo test --workspace" workspace_tests
# kiln-wire as `kiln` without default features builds it: a keyed connection is a clear
# error there (its one test that only such a build runs; a few seconds).
phase "kiln-wire without Noise" cargo_test wire-lean --profile smoke -p kiln-wire \
  --no-default-features --lib --no-fail-fast

# With the workspace phase's selection and the LLVM features: the dependencies unify as
# they did there, so only llvm-sys, kiln-llvm and kiln-capi compile again (`-p kiln-llvm`
# and `-p kiln-capi` alone unified others and compiled 40 crates again: 55 s). The C
# library with LLVM-C is built first, with the binaries' selection (the tests' build does
# not put it in the profile's directory), and install_capi.sh told so.
LLVM_FEATURES=(--features kiln-llvm/llvm,kiln-capi/llvm)
llvm_checks() {
  local build_log="$LOGS/llvm-build.log"
  if ! cargo build --profile smoke "${BINARY_PACKAGES[@]}" -p kiln-llvm "${LLVM_FEATURES[@]}" \
    --lib --bins --example shaders --example shader_memory >"$build_log" 2>&1; then
    tail -n 40 "$build_log"
    return 1
  fi
  KILN_TEST_CAPI_FEATURES=llvm cargo_test llvm "${WORKSPACE_TESTS[@]}" "${LLVM_FEATURES[@]}" \
    --test mcjit --test llvm_c
}
phase "kiln-llvm with LLVM 14 (feature llvm)" llvm_checks

# The binaries of the phases below, in the tests' profile (Cargo.toml's `smoke`: the dev
# profile's checks at opt-level 1, in target/smoke; the tests built most of it): the
# benchmarks are a smoke run of small workloads that keeps them working (the figures in
# docs/BENCHMARKS.md come from a plain `cargo build --release`), and target/release is
# left as `cargo build --release` (the README's first command) made it. The Python package
# and the demo use this build.
SMOKE="$TARGET/smoke"
phase "the binaries (kiln, executor, C library, benchmarks; profile smoke)" \
  cargo build --profile smoke -p kiln-bench -p kiln-cli -p kiln-executor -p kiln-lang -p kiln-capi

# Their figures go to $LOGS/benchmarks.log (printed if one fails).
benchmarks() {
  local log="$LOGS/benchmarks.log"
  if ! (
    set -e
    "$SMOKE"/many_modules --modules 500 --no-syscalls
    "$SMOKE"/alloc_throughput --ops 5000
    "$SMOKE"/tls_access --iterations 1000000 --runs 1
    "$SMOKE"/session_scale --modules 200 --churn 2000
    "$SMOKE"/cranelift_backend --modules 2000 --batch 200 --rounds 1
    "$SMOKE"/debug_support --rounds 2 --modules 200 --gdb-modules 50
    "$SMOKE"/capi_overhead --rounds 3 --batches 1 --queries 500 --llvm-rounds 1
    "$SMOKE"/cache_figures --functions 200 --runs 2 --image-functions 2000 --image-runs 2
    # RISC-V's inputs take 30 s to compile (SQLite's amalgamation): its links are
    # exercised by the cross tests; its stub-call row is printed here. 2,000 generated
    # functions, not the figure's 20,000 (25 s of compiling).
    "$SMOKE"/link_floor --runs 2 --arch x86-64,aarch64 --functions 2000 --dir "$TARGET"/link-floor
    "$SMOKE"/lazy_figures --functions 1000 --runs 1 --calls 1000000 --swap-seconds 0.2
    # SQLite at -O0 (the figures' -O2 builds take a minute here), under Wine.
    "$SMOKE"/windows_figures --runs 1 --opt -O0 --dir "$TARGET"/windows-figures
    "$SMOKE"/executor_security --connections 300 --runs 1 --handshakes 3 --executors kiln-executor,x86_64 --dir "$TARGET"/executor-security
    # The MCJIT example as the LLVM phase's `cargo test` built it: a smoke run of the
    # example; its release figures are in docs/BENCHMARKS.md.
    "$SMOKE"/examples/shaders 20
  ) >"$log" 2>&1; then
    cat "$log"
    return 1
  fi
  echo "figures in $log"
}
phase "benchmarks, small workload" benchmarks

# The Python package: built into a wheel by pip from ./python (its C library is the
# kiln-capi of the optimized build above, given with KILN_CAPI_LIB), tested with pytest against objects of
# the C compiler and of llvmlite, in a virtual environment of Debian's Python under the
# target directory (nothing is installed on the host's Python).
python_package() {
  local venv="$TARGET/python-venv"
  [ -x "$venv/bin/python" ] || /usr/bin/python3 -m venv "$venv" || return 1
  KILN_CAPI_LIB="$SMOKE/libkiln_capi.so" \
    "$venv/bin/pip" install --quiet --disable-pip-version-check ./python pytest llvmlite numba==0.68.1 &&
    # From elsewhere than the source tree: `import kiln` is the installed wheel's.
    (cd "$TARGET" && "$venv/bin/python" -m pytest -q -p no:cacheprovider "$OLDPWD/python/tests") &&
    "$venv/bin/python" python/benchmarks/llvmlite_functions.py --functions 100 --rounds 1 \
      >>"$LOGS/benchmarks.log" &&
    "$venv/bin/python" python/benchmarks/numba_functions.py --functions 20 --rounds 1 \
      >>"$LOGS/benchmarks.log" &&
    python_wheel "$venv"
}
# The wheel a user gets (`pip wheel ./python`), installed alone in a fresh virtual
# environment: it imports from site-packages, finds its C library, links and calls.
python_wheel() {
  local wheels="$TARGET/wheel-check"
  rm -rf "$wheels" && mkdir -p "$wheels" &&
    KILN_CAPI_LIB="$SMOKE/libkiln_capi.so" "$1/bin/pip" wheel --quiet --no-deps \
      --disable-pip-version-check ./python -w "$wheels" &&
    /usr/bin/python3 -m venv "$wheels/venv" &&
    "$wheels/venv/bin/pip" install --quiet --no-index --disable-pip-version-check "$wheels"/kiln-*.whl &&
    (cd "$wheels" && venv/bin/python "$OLDPWD/python/tests/wheel_smoke.py") &&
    python_sdist "$1" "$wheels" &&
    rm -rf "$wheels"
}
# The sdist (`python setup.py sdist`: the package and the Rust workspace under rust/),
# installed alone by pip in a fresh virtual environment, which runs cargo in the sdist's
# own workspace: every manifest, the lock file (`--locked`) and every source file the C
# library is built from must be in it (a missing one is a failed build). With this
# command's target directory and profile, cargo reuses the artifacts of the sources it
# already compiled (the same files, by path in the workspace and age), so the phase takes
# seconds; a build from nothing (the same command without CARGO_TARGET_DIR: a release
# build) took 56 s here.
python_sdist() {
  local dists="$2/sdist"
  mkdir -p "$dists" &&
    (cd python && "$1/bin/python" setup.py -q sdist -d "$dists" 2>/dev/null) &&
    /usr/bin/python3 -m venv "$dists/venv" &&
    CARGO_TARGET_DIR="$TARGET" KILN_CARGO_PROFILE=smoke "$dists/venv/bin/pip" install \
      --quiet --disable-pip-version-check "$dists"/kiln-*.tar.gz &&
    (cd "$dists" && venv/bin/python "$OLDPWD/python/tests/wheel_smoke.py")
}
phase "Python package (pip install ./python, pytest)" python_package
phase "the main job (scripts/demo.sh)" bash -c 'KILN_PROFILE=smoke ./scripts/demo.sh >/dev/null'

phase "fuzz targets (scripts/fuzz_check.sh)" ./scripts/fuzz_check.sh

# --- more phases go here ------------------------------------------------------------------
# Add a phase as `phase "what it checks" COMMAND ARGS...` (a shell function for several
# commands); its time and result join the summary. Keep them above the package check.

# The tests' scratch files (target/tmp): removed once every phase passed (a failed run
# keeps them for a look); the logs stay in $LOGS.
clean_scratch() {
  if ((${#failed_phases[@]})); then
    echo "kept $TARGET/tmp (a phase failed)"
  else
    rm -rf "$TARGET/tmp" "$TARGET/link-floor" "$TARGET/windows-figures" "$TARGET/executor-security"
    echo "removed the tests' scratch files; target is $(du -sh "$TARGET" | cut -f1)"
  fi
}
phase "scratch files removed" clean_scratch

# --- the machine as it was ------------------------------------------------------------------
phase "installed packages unchanged (dpkg -l)" dpkg_unchanged "$LOGS/dpkg-before.txt"

# --- summary ------------------------------------------------------------------------------
echo
echo "== summary"
printf '%s\n' "${summary[@]}"
echo "-- total $(duration $((SECONDS - started)))"
if ((${#tests_log[@]})); then
  cat "${tests_log[@]}" | awk '/^test result:/ {
      for (i = 1; i <= NF; i++) {
        if ($(i) ~ /^passed/) p += $(i - 1)
        if ($(i) ~ /^failed/) f += $(i - 1)
        if ($(i) ~ /^ignored/) g += $(i - 1)
      }
    }
    END { printf "-- tests: %d passed, %d failed, %d ignored\n", p, f, g }'
  # The failed tests by name, and the first lines of what each printed: the end of the
  # output is often all a reader of the CI run sees.
  failed_tests=$(cat "${tests_log[@]}" | grep -E '^test .* \.\.\. FAILED$' | sed -E 's/^test (.*) \.\.\. FAILED$/\1/' || true)
  if [ -n "$failed_tests" ]; then
    echo "-- failed tests:"
    printf '%s\n' "$failed_tests" | sed 's/^/   /'
    for log in "${tests_log[@]}"; do
      awk '/^---- .* stdout ----$/ {show = 1; n = 0}
        /^failures:$/ && show {show = 0}
        show && n < 25 {print "   | " $0; n++}' "$log"
    done
  fi
fi
if [ -n "${KILN_TEST_SKIP_CROSS:-}" ]; then
  echo "-- skipped (KILN_TEST_SKIP_CROSS): AArch64 cross compiler, qemu and arm64 libraries; their tests passed without running (kiln-cli tests aarch64, c_executor's AArch64 ones)"
fi
if ((${#failed_phases[@]})); then
  echo "FAILED: ${failed_phases[*]}"
  exit 1
fi
echo "all checks passed"
