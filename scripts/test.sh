#!/usr/bin/env bash
# Kiln's test command: installs what the tests need that is missing (Debian packages via
# apt-get, Rust components via rustup where possible), then runs format and lint checks,
# every test, and the benchmarks on a small workload (so they keep working).
set -euo pipefail
cd "$(dirname "$0")/.."

export CARGO_BUILD_JOBS="${CARGO_BUILD_JOBS:-2}"
export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"

# --- what the tests need --------------------------------------------------------------
# command -> Debian package
declare -A needs=(
  [cc]=gcc
  [unshare]=util-linux
  [strace]=strace
)
missing=()
for cmd in "${!needs[@]}"; do
  command -v "$cmd" >/dev/null 2>&1 || missing+=("${needs[$cmd]}")
done
if ((${#missing[@]})); then
  echo "== installing: ${missing[*]}"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
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

echo "== benchmarks, small workload (figures: see docs/BENCHMARKS.md)"
cargo build --release -p kiln-bench
./target/release/many_modules --modules 500 --no-syscalls
./target/release/alloc_throughput --ops 5000

echo "== the main job"
cargo run --release -p kiln-cli -- demo --modules 200 >/dev/null
echo "all checks passed"
