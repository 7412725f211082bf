"""Kiln against llvmlite's MCJIT on a Numba-style workload: N small functions, one LLVM
module each (built, verified and optimized with llvmlite), all kept callable.

  python python/benchmarks/llvmlite_functions.py [--functions 2000] [--rounds 3]

(with the package installed: `pip install ./python llvmlite`).

Modes, each in a process of its own (so that resident bytes are the mode's alone), run in
turn for ``--rounds`` rounds; medians printed with the issue's targets:

- ``kiln``: llvmlite's target machine emits each module to an object
  (``emit_object``), Kiln links it (``Session.add_object`` + ``link`` + ``lookup``); the
  LLVM module is dropped.
- ``kiln-own``: the objects emitted first, then only Kiln's links measured: Kiln's own
  resident bytes per function.
- ``mcjit``: one MCJIT engine per module (``create_mcjit_compiler`` +
  ``finalize_object``), each engine kept.
- ``mcjit-shared``: one engine, every module added to it (``add_module`` +
  ``finalize_object``).

Time per function: from the optimized module to a callable address (emit + link for
Kiln, engine + finalize for MCJIT). Resident per function: growth of the process's
resident set over the N functions / N.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import statistics
import subprocess
import sys
import time

MODES = ("kiln", "kiln-own", "mcjit", "mcjit-shared")

# What a mode keeps callable, alive until its process ends.
_KEPT: list = []


def resident() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def ir(i: int) -> str:
    return f"""
    declare i64 @labs(i64)
    define i64 @f{i}(i64 %x) {{
    entry:
      %c = icmp sgt i64 %x, 0
      br i1 %c, label %loop, label %done
    loop:
      %k = phi i64 [0, %entry], [%k2, %loop]
      %acc = phi i64 [0, %entry], [%acc2, %loop]
      %t = mul i64 %k, {i + 1}
      %acc2 = add i64 %acc, %t
      %k2 = add i64 %k, 1
      %more = icmp slt i64 %k2, %x
      br i1 %more, label %loop, label %done
    done:
      %s = phi i64 [0, %entry], [%acc2, %loop]
      %d = sub i64 %s, 1000
      %r = call i64 @labs(i64 %d)
      ret i64 %r
    }}
    """


def expected(i: int, x: int) -> int:
    return abs(sum(k * (i + 1) for k in range(x)) - 1000)


def run_mode(mode: str, n: int) -> dict:
    import llvmlite.binding as llvm

    import kiln

    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    target = llvm.Target.from_default_triple()

    def new_machine():
        return target.create_target_machine(opt=2, reloc="pic", codemodel="default")

    # One target machine for every use, as a JIT keeps one. An MCJIT engine takes
    # ownership of the machine it is given, so engines sharing one would each dispose it:
    # the mode's process ends without disposing them (`os._exit`, after its figures).
    machine = new_machine()
    tuning = llvm.create_pipeline_tuning_options(speed_level=2)

    def module(i: int):
        m = llvm.parse_assembly(ir(i))
        m.verify()
        builder = llvm.create_pass_builder(machine, tuning)
        builder.getModulePassManager().run(m, builder)
        return m

    signature = ctypes.CFUNCTYPE(ctypes.c_int64, ctypes.c_int64)
    # Warm-up: one function through the same path, not counted.
    modules = [module(i) for i in range(n + 1)]
    functions = []
    kept = []
    session = None
    shared = None
    if mode.startswith("kiln"):
        session = kiln.Session()
        session.add_process_symbols()
    if mode == "mcjit-shared":
        shared = llvm.create_mcjit_compiler(llvm.parse_assembly(""), machine)
    objects = None
    if mode == "kiln-own":
        objects = [machine.emit_object(m) for m in modules]
        modules = [None] * len(modules)
    before = 0
    elapsed = 0.0
    for i in range(-1, n):
        index = n if i < 0 else i
        name = f"f{index}"
        start = time.perf_counter()
        if mode == "kiln":
            session.add_object(machine.emit_object(modules[index]), f"{name}.o")
            kept.append(session.link())
            address = session.lookup(name)
        elif mode == "kiln-own":
            session.add_object(objects[index], f"{name}.o")
            kept.append(session.link())
            address = session.lookup(name)
        elif mode == "mcjit":
            engine = llvm.create_mcjit_compiler(modules[index], machine)
            engine.finalize_object()
            address = engine.get_function_address(name)
            kept.append(engine)
        else:
            shared.add_module(modules[index])
            shared.finalize_object()
            address = shared.get_function_address(name)
        spent = time.perf_counter() - start
        modules[index] = None  # Kiln's and the per-module engines' callers drop it
        if objects is not None:
            objects[index] = None
        if i < 0:
            before = resident()
            continue
        elapsed += spent
        functions.append(signature(address))
    after = resident()
    _KEPT.extend([kept, session, shared, machine])
    for i, f in enumerate(functions):
        if f(10) != expected(i, 10):
            raise SystemExit(f"f{i}(10) = {f(10)}, expected {expected(i, 10)}")
    return {
        "mode": mode,
        "functions": n,
        "us_per_function": elapsed / n * 1e6,
        "resident_kb_per_function": (after - before) / n / 1000,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--functions", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--mode", choices=MODES, help="one mode, in this process (JSON out)")
    args = parser.parse_args()
    if args.mode:
        print(json.dumps(run_mode(args.mode, args.functions)), flush=True)
        # Engines sharing a target machine cannot all be disposed (see run_mode).
        os._exit(0)
    runs: dict = {m: [] for m in MODES}
    for _ in range(args.rounds):
        for mode in MODES:
            out = subprocess.run(
                [sys.executable, __file__, "--mode", mode, "--functions", str(args.functions)],
                check=True,
                capture_output=True,
                text=True,
            ).stdout
            runs[mode].append(json.loads(out.strip().splitlines()[-1]))

    def med(mode: str, key: str) -> float:
        return statistics.median(r[key] for r in runs[mode])

    print(f"{args.functions} functions, one module each, all kept; median of {args.rounds} processes per mode")
    for mode in MODES:
        print(
            f"  {mode:<13} {med(mode, 'us_per_function'):8.1f} µs/function  "
            f"{med(mode, 'resident_kb_per_function'):6.2f} KB resident/function"
        )
    k, own = med("kiln", "resident_kb_per_function"), med("kiln-own", "resident_kb_per_function")
    per_engine, shared = med("mcjit", "resident_kb_per_function"), med("mcjit-shared", "resident_kb_per_function")

    def verdict(ok: bool) -> str:
        return "met" if ok else "MISSED"

    print(f"resident, Kiln / one engine per module: {k / per_engine:.3f} (target <= 1/3: {verdict(k <= per_engine / 3)})")
    print(f"resident, Kiln / one shared engine: {k / shared:.3f} (target <= 1/2: {verdict(k <= shared / 2)})")
    print(f"Kiln's own part: {own:.2f} KB per function (target <= 1.5: {verdict(own <= 1.5)})")
    t_kiln = med("kiln", "us_per_function")
    t_mcjit = min(med("mcjit", "us_per_function"), med("mcjit-shared", "us_per_function"))
    print(
        f"time per function, Kiln (emit + link) / MCJIT's faster mode: {t_kiln / t_mcjit:.3f} "
        f"(target <= 1: {verdict(t_kiln <= t_mcjit)})"
    )


if __name__ == "__main__":
    main()
