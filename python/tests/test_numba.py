"""Numba on Kiln (``kiln.numba``): Numba's JIT compilations linked by Kiln instead of
MCJIT. Each test runs Numba in a process of its own (``enable()`` must come before the
first compilation)."""

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("numba", reason="Numba is not installed (the test command installs it)")

HERE = os.path.dirname(os.path.abspath(__file__))

# Modules of Numba's own test suite run both ways: closures, generators (environments
# and NRT across modules), exceptions, the object cache (its second processes too, through
# KILN_NUMBA=1).
NUMBA_MODULES = [
    "numba.tests.test_closure",
    "numba.tests.test_generators",
    "numba.tests.test_exceptions",
    "numba.tests.test_caching",
]


def run(code: str) -> str:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_njit_functions_run_linked_by_kiln():
    out = run(
        """
import kiln.numba
kiln.numba.enable()
import numpy as np
from numba import njit
from numba.core.registry import cpu_target

@njit
def affine(x, y):
    return x * y + 1

@njit
def total(a):
    t = 0.0
    for v in a:
        t += v
    return t

@njit
def doubled(n):
    return np.ones(n) * 2

@njit
def squares(n):
    for i in range(n):
        yield i * i

@njit
def grow(n):
    d = {}
    for i in range(n):
        d[i] = i + 0.5
    return d[n - 1]

print(affine(3, 4), total(np.arange(10.0)), doubled(3).tolist(), list(squares(5)), grow(100))
print(type(cpu_target.target_context.codegen()._engine).__name__)
"""
    )
    lines = out.strip().splitlines()
    assert lines[0] == "13 45.0 [2.0, 2.0, 2.0] [0, 1, 4, 9, 16] 99.5"
    assert lines[1] == "KilnEngine", "Numba's engine is Kiln's"


def test_a_module_kiln_cannot_link_raises_with_kilns_message():
    # A function calling a C symbol nobody defines: the link fails with the name.
    out = run(
        """
import kiln, kiln.numba
kiln.numba.enable()
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

@intrinsic
def missing(typingctx):
    sig = types.int64()
    def codegen(context, builder, signature, args):
        fnty = cgutils.ir.FunctionType(cgutils.ir.IntType(64), [])
        fn = cgutils.get_or_insert_function(builder.module, fnty, "kiln_test_no_such_function")
        return builder.call(fn, [])
    return sig, codegen

@njit
def calls_missing():
    return missing()

try:
    calls_missing()
except Exception as e:
    print(type(e).__name__, "|", str(e).replace(chr(10), " "))
"""
    )
    assert "kiln_test_no_such_function" in out, out


def numba_suite(kiln: bool) -> subprocess.Popen:
    args = [sys.executable, os.path.join(HERE, "numba_suite.py")]
    if kiln:
        args.append("--kiln")
    return subprocess.Popen(args + NUMBA_MODULES, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def outcomes(run: subprocess.Popen) -> dict:
    out, err = run.communicate(timeout=900)
    assert run.returncode == 0, err[-4000:]
    return json.loads(out.strip().splitlines()[-1])


def test_numbas_own_tests_pass_on_kiln_as_on_mcjit():
    # Both at once (two processes: the suites are single-threaded Python).
    mcjit_run, kiln_run = numba_suite(kiln=False), numba_suite(kiln=True)
    mcjit, kiln = outcomes(mcjit_run), outcomes(kiln_run)
    assert sum(1 for o in mcjit.values() if o == "passed") > 50
    differ = {t: (mcjit.get(t), kiln.get(t)) for t in set(mcjit) | set(kiln) if mcjit.get(t) != kiln.get(t)}
    assert differ == {}, differ


def test_dropped_functions_are_freed_and_a_stale_call_traps():
    # Fifty dispatchers compiled, called, dropped: the garbage collector takes their code
    # libraries, Numba runs the finalizers `_add_module` returned, and Kiln frees the
    # modules. Then a cfunc's address is called after its library went: it must trap.
    code = """
import ctypes, gc, sys
import kiln.numba
kiln.numba.enable()
from numba import njit, cfunc
from numba.core.registry import cpu_target

engine = cpu_target.target_context.codegen()._engine
njit(lambda x: x)(1)  # Numba's own helpers and NRT linked once
gc.collect()
before = engine._session.memory_stats().live_allocations

def make(k):
    @njit
    def f(x):
        return x * k + 1
    return f

fs = [make(k) for k in range(50)]
assert [f(2) for f in fs] == [2 * k + 1 for k in range(50)]
alive = engine._session.memory_stats().live_allocations
freed = engine.freed
del fs
gc.collect()
print(engine.freed - freed, alive - before, engine._session.memory_stats().live_allocations - before)

@cfunc("int64(int64)")
def g(x):
    return x + 5

call = ctypes.CFUNCTYPE(ctypes.c_int64, ctypes.c_int64)(g.address)
print(call(1))
freed = engine.freed
del g
gc.collect()
print(engine.freed - freed)
sys.stdout.flush()
print("stale call returned", call(1), flush=True)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    lines = out.stdout.split()
    assert lines[:5] == ["50", "50", "0", "6", "1"], (out.stdout, out.stderr[-3000:])
    assert "stale call returned" not in out.stdout
    assert out.returncode < 0, f"the stale call must end the process by a signal: {out.returncode}"


def test_a_module_others_are_bound_to_is_freed_with_the_last_of_them():
    # Two modules as Numba makes them: each carries its own copy of a linkonce_odr helper.
    # The second binds to the first one's copy (MCJIT's first definition wins); so when
    # Numba drops the first, it stays until the second goes too.
    out = run(
        """
import ctypes
import llvmlite.binding as ll
import kiln.numba

ll.initialize_native_target()
ll.initialize_native_asmprinter()
tm = ll.Target.from_triple(ll.get_process_triple()).create_target_machine(reloc="pic", codemodel="small")
helper = "define linkonce_odr i64 @helper(i64 %x) { %y = mul i64 %x, 3\\n ret i64 %y }\\n"
first = ll.parse_assembly(helper + "define i64 @first(i64 %x) { %y = call i64 @helper(i64 %x)\\n ret i64 %y }")
second = ll.parse_assembly(helper + "define i64 @second(i64 %x) { %y = call i64 @helper(i64 %x)\\n %z = add i64 %y, 1\\n ret i64 %z }")
engine = kiln.numba.KilnEngine(tm)
fn = ctypes.CFUNCTYPE(ctypes.c_int64, ctypes.c_int64)
engine.add_module(first)
engine.finalize_object()
engine.add_module(second)
engine.finalize_object()
f, s = fn(engine.get_function_address("first")), fn(engine.get_function_address("second"))
print(f(2), s(2), engine.get_function_address("helper") != 0)
engine.remove_module(first)
print(engine.freed, s(3), engine.is_symbol_defined("helper"))
engine.remove_module(second)
print(engine.freed, engine.is_symbol_defined("helper"), engine._session.memory_stats().live_allocations)
"""
    )
    assert out.split() == ["6", "7", "True", "0", "10", "True", "2", "False", "0"], out


def test_numbas_object_cache_is_stored_and_loaded_under_kiln(tmp_path):
    # cache=True: the first process compiles and Numba stores each object Kiln's engine
    # hands its hook; the second links the stored objects instead of compiling.
    (tmp_path / "cached_functions.py").write_text(
        """
from numba import njit

@njit(cache=True)
def inner(x):
    return x * 3 + 1

@njit(cache=True)
def outer(a):
    t = 0
    for v in a:
        t += inner(v)
    return t

@njit(cache=True)
def squares(n):
    for i in range(n):
        yield i * i
"""
    )
    code = """
import numpy as np
import kiln.numba
kiln.numba.enable()
import cached_functions as c
from numba.core.registry import cpu_target
print(c.outer(np.arange(10)), list(c.squares(4)), c.inner(2), cpu_target.target_context.codegen()._engine.cache_hits)
"""
    path = os.pathsep.join(p for p in (str(tmp_path), os.environ.get("PYTHONPATH")) if p)
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "cache"), PYTHONPATH=path)
    runs = []
    for _ in range(2):
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path)
        assert out.returncode == 0, out.stderr[-3000:]
        runs.append(out.stdout.split())
    assert runs[0] == ["145", "[0,", "1,", "4,", "9]", "7", "0"], runs
    assert runs[1][:-1] == runs[0][:-1] and int(runs[1][-1]) >= 3, runs


def test_kiln_numba_in_the_environment_switches_numba_at_start_up():
    # The installed package's start-up hook: a program that never imports kiln.
    code = "from numba import njit; from numba.core.registry import cpu_target; print(njit(lambda x: x * 2)(21), type(cpu_target.target_context.codegen()._engine).__name__)"
    on = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, env=dict(os.environ, KILN_NUMBA="1"))
    off = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, env={k: v for k, v in os.environ.items() if k != "KILN_NUMBA"})
    assert on.stdout.split() == ["42", "KilnEngine"], on.stderr[-3000:]
    assert off.stdout.split() == ["42", "JitEngine"], off.stderr[-3000:]


def test_a_module_that_hands_numbas_runtime_a_function_is_kept():
    # An exception raised with a dict carries a typed dict whose method table and
    # destructor point into the raising function's module; the exception outlives the
    # dispatcher, so the module must too (freed, the dict's lookups ran other code).
    out = run(
        """
import gc
import kiln.numba
kiln.numba.enable()
from numba import njit
from numba.core.registry import cpu_target

engine = cpu_target.target_context.codegen()._engine

def factory():
    @njit
    def raises():
        raise ValueError({'a': 1, 'b': 3})
    return raises

kept = []
for _ in range(3):
    try:
        factory()()
    except ValueError as e:
        kept.append(e)
gc.collect()
print(str(kept[0]).replace(" ", ""), engine.kept > 0)
kept.clear()
gc.collect()
print("destroyed")
"""
    )
    assert out.split() == ["{a:1,b:3}", "True", "destroyed"], out
