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
# and NRT across modules), exceptions, typed dictionaries.
NUMBA_MODULES = [
    "numba.tests.test_closure",
    "numba.tests.test_generators",
    "numba.tests.test_exceptions",
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


def numba_outcomes(kiln: bool) -> dict:
    args = [sys.executable, os.path.join(HERE, "numba_suite.py")]
    if kiln:
        args.append("--kiln")
    out = subprocess.run(args + NUMBA_MODULES, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-4000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_numbas_own_tests_pass_on_kiln_as_on_mcjit():
    mcjit = numba_outcomes(kiln=False)
    kiln = numba_outcomes(kiln=True)
    assert sum(1 for o in mcjit.values() if o == "passed") > 50
    differ = {t: (mcjit.get(t), kiln.get(t)) for t in set(mcjit) | set(kiln) if mcjit.get(t) != kiln.get(t)}
    assert differ == {}, differ
