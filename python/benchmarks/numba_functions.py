"""Numba on Kiln against Numba on MCJIT, the PyTensor shape: N distinct ``@njit``
functions (each a small graph op calling a shared one), compiled, each called once (its
result checked), then all dropped and collected.

  python python/benchmarks/numba_functions.py [--functions 2000] [--rounds 3]

(with the package and Numba installed: `pip install ./python numba`).

Modes, each in a process of its own (so that resident bytes are the mode's alone), run in
turn for ``--rounds`` rounds (alternating which goes first); medians printed with the
issue's targets:

- ``mcjit``: Numba as it ships (its MCJIT engine);
- ``kiln``: the same program after ``kiln.numba.enable()``.

Per function: compile time (the first call: typing, lowering, LLVM's optimization and
code generation, and the link), resident growth while every function is alive. After
``del`` and ``gc.collect()``: resident and ``/proc/self/maps`` lines against before the
functions (and resident after ``malloc_trim(0)``, which returns the C library's free heap).
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import os
import statistics
import subprocess
import sys
import time

MODES = ("mcjit", "kiln")


def resident() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def mappings() -> int:
    with open("/proc/self/maps") as f:
        return sum(1 for _ in f)


def trim() -> None:
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (AttributeError, OSError):
        pass


def child(mode: str, n: int) -> dict:
    if mode == "kiln":
        import kiln.numba

        kiln.numba.enable()
    from numba import njit

    @njit
    def base(x):
        return x * 2 + 1

    def make(k):
        # A distinct function per k: Numba freezes the closure's k into the code.
        @njit
        def op(x):
            return base(x) * k + k

        return op

    def kiln_bytes() -> int:
        """Kiln's executable memory in use (0 under MCJIT)."""
        if mode != "kiln":
            return 0
        from numba.core.registry import cpu_target

        return cpu_target.target_context.codegen()._engine._session.memory_stats().bytes_allocated

    # Numba's runtime, helpers and `base` linked before the measured functions.
    make(-1)(1)
    gc.collect()
    trim()
    rss0, maps0, code0 = resident(), mappings(), kiln_bytes()
    ops = []
    start = time.perf_counter()
    for k in range(n):
        op = make(k)
        got = op(3)
        if got != 7 * k + k:
            raise SystemExit(f"{mode}: op {k}(3) returned {got}, not {8 * k}")
        ops.append(op)
    compile_s = time.perf_counter() - start
    gc.collect()
    rss1, maps1, code1 = resident(), mappings(), kiln_bytes()
    del ops, op
    gc.collect()
    rss2, maps2, code2 = resident(), mappings(), kiln_bytes()
    trim()
    rss3 = resident()
    result = {
        "mode": mode,
        "n": n,
        "compile_ms": compile_s * 1e3 / n,
        "rss_before": rss0,
        "rss_alive": rss1,
        "rss_dropped": rss2,
        "rss_trimmed": rss3,
        "maps_before": maps0,
        "maps_alive": maps1,
        "maps_dropped": maps2,
        "kiln_code_alive": code1 - code0,
        "kiln_code_dropped": code2 - code0,
    }
    if mode == "kiln":
        from numba.core.registry import cpu_target

        engine = cpu_target.target_context.codegen()._engine
        result["freed_modules"] = engine.freed
    return result


def run_child(mode: str, n: int) -> dict:
    out = subprocess.run(
        [sys.executable, os.path.abspath(__file__), "--child", mode, "--functions", str(n)],
        capture_output=True,
        text=True,
    )
    if out.returncode != 0:
        raise SystemExit(f"{mode} failed:\n{out.stderr[-4000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--functions", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--child", choices=MODES, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.functions)))
        return
    runs: dict = {m: [] for m in MODES}
    for r in range(args.rounds):
        for mode in MODES if r % 2 == 0 else reversed(MODES):
            runs[mode].append(run_child(mode, args.functions))
    n = args.functions

    def med(mode: str, f) -> float:
        return statistics.median(f(x) for x in runs[mode])

    print(f"Numba {n} @njit functions, medians of {args.rounds} interleaved rounds, each mode in its own process")
    print(f"  {'mode':<6} {'compile/fn':>11} {'RSS/fn alive':>13} {'RSS before':>11} {'dropped':>9} {'trimmed':>9} {'maps b/a/d':>12}")
    for mode in MODES:
        print(
            f"  {mode:<6} {med(mode, lambda x: x['compile_ms']):>9.2f}ms"
            f" {med(mode, lambda x: (x['rss_alive'] - x['rss_before']) / n):>11.0f} B"
            f" {med(mode, lambda x: x['rss_before']) / 2**20:>8.1f}MiB"
            f" {med(mode, lambda x: x['rss_dropped']) / 2**20:>6.1f}MiB"
            f" {med(mode, lambda x: x['rss_trimmed']) / 2**20:>6.1f}MiB"
            f" {med(mode, lambda x: x['maps_before']):>4.0f}/{med(mode, lambda x: x['maps_alive']):.0f}/{med(mode, lambda x: x['maps_dropped']):.0f}"
        )
    k_alive = med("kiln", lambda x: (x["rss_alive"] - x["rss_before"]) / n)
    m_alive = med("mcjit", lambda x: (x["rss_alive"] - x["rss_before"]) / n)
    ratio = k_alive / m_alive if m_alive else float("nan")
    print(f"  resident per function alive: Kiln / MCJIT {ratio:.2f}, target <= 0.33: {'met' if ratio <= 1 / 3 else 'MISSED'}")
    back = med("kiln", lambda x: x["rss_dropped"] / x["rss_before"])
    print(f"  Kiln after dropping all: {back:.2f}x its resident before, target <= 1.10: {'met' if back <= 1.1 else 'MISSED'}"
          f" (after malloc_trim {med('kiln', lambda x: x['rss_trimmed'] / x['rss_before']):.2f}x;"
          f" MCJIT {med('mcjit', lambda x: x['rss_dropped'] / x['rss_before']):.2f}x)")
    maps = med("kiln", lambda x: x["maps_dropped"] - x["maps_before"])
    print(f"  Kiln mappings after dropping all: {maps:+.0f} lines against before (target: flat)")
    c = med("kiln", lambda x: x["compile_ms"]) / med("mcjit", lambda x: x["compile_ms"])
    print(f"  compile time per function: Kiln / MCJIT {c:.3f}, target <= 1.05: {'met' if c <= 1.05 else 'MISSED'}")
    print(f"  Kiln modules freed by Numba's finalizers: {med('kiln', lambda x: x['freed_modules']):.0f} of {n} functions")
    print(f"  Kiln's executable memory per function alive: {med('kiln', lambda x: x['kiln_code_alive']) / n:.0f} B;"
          f" after dropping all: {med('kiln', lambda x: x['kiln_code_dropped']):+.0f} B against before"
          f" (the rest of the resident bytes per function are Numba's and LLVM's, the same under both)")


if __name__ == "__main__":
    main()
