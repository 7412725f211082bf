"""Sessions and modules shared between threads: close() and release() racing the calls
made meanwhile never crash the interpreter (each call finishes first or raises
KilnError), and names are never cut short at an embedded NUL."""

from __future__ import annotations

import ctypes
import os
import subprocess
import threading
import time
from pathlib import Path
from typing import Callable, Dict, List

import pytest

import kiln

LONG_FN = ctypes.CFUNCTYPE(ctypes.c_long, ctypes.c_long)


def cc_object(tmp_path: Path, name: str, source: str) -> bytes:
    c = tmp_path / f"{name}.c"
    c.write_text(source)
    o = tmp_path / f"{name}.o"
    subprocess.run(["cc", "-O2", "-c", str(c), "-o", str(o)], check=True)
    return o.read_bytes()


def test_close_racing_link_add_object_lookup_and_remove(tmp_path: Path) -> None:
    racer = cc_object(tmp_path, "racer", "long racer(long x) { return x + 1; }")
    local = cc_object(tmp_path, "local", "long local_fn(long x) { return x * 3; }")
    done: Dict[str, int] = {"ok": 0, "refused": 0, "closed": 0}
    count = threading.Lock()
    # A fixed number of rounds (no deadline: a busy machine must not change what is
    # checked). Each of the five workers makes at least one call a round (the first after
    # the close is refused), so 400 rounds are at least 2,000 calls.
    rounds = 0
    while rounds < 400:
        rounds += 1
        session = kiln.Session()
        session.add_object(racer, "racer.o")
        held = session.link()
        assert held is not None
        libraries = [session.create_library(f"worker{k}") for k in range(2)]
        start = threading.Barrier(6)

        def linker(library: int) -> Callable[[], None]:
            # add_object, link, lookup (and call), remove, release: in a library of
            # its own, so that each succeeds while the session is open.
            def step() -> None:
                session.add_object(local, "local.o", library)
                module = session.link(library)
                assert module is not None
                try:
                    assert session.lookup_fn("local_fn", LONG_FN, library)(2) == 6
                    session.remove(module)
                finally:
                    module.release()

            return step

        def looker() -> None:
            assert session.lookup_fn("racer", LONG_FN)(1) == 2
            with pytest.raises(kiln.KilnError):
                session.lookup("no_such_symbol")

        def failing_link() -> None:
            # A link that fails (a redefinition) while the session closes; or finds
            # nothing to link when the looker's lookup linked (and failed on) it first.
            session.add_object(racer, "again.o")
            assert session.link() is None

        def other_calls() -> None:
            session.memory_stats()
            assert session.main_library == held.library
            assert held.symbol("racer") != 0

        steps: List[Callable[[], None]] = [
            linker(libraries[0]),
            linker(libraries[1]),
            looker,
            failing_link,
            other_calls,
        ]
        failures: List[BaseException] = []

        def worker(step: Callable[[], None]) -> None:
            tally = {"ok": 0, "refused": 0}
            start.wait()
            while True:
                try:
                    step()
                    tally["ok"] += 1
                except kiln.KilnError:
                    # Refused: the session (or a module of it) is closing or closed.
                    tally["refused"] += 1
                    if session.closed:
                        break
                except BaseException as e:  # noqa: BLE001 - reported below
                    failures.append(e)
                    break
                if session.closed:
                    break
            with count:
                done["ok"] += tally["ok"]
                done["refused"] += tally["refused"]

        threads = [threading.Thread(target=worker, args=(s,)) for s in steps]
        for t in threads:
            t.start()
        start.wait()
        # Close after a varying number of calls: sometimes at once, sometimes later.
        time.sleep((rounds % 7) * 0.0004)
        session.close()
        session.close()  # idempotent
        for t in threads:
            t.join()
        assert not failures, failures
        with pytest.raises(kiln.KilnError, match="closed"):
            session.lookup("racer")
        with pytest.raises(kiln.KilnError, match="closed"):
            session.link()
        with pytest.raises(kiln.KilnError, match="closed"):
            session.add_object(racer, "late.o")
        # The module held stays runnable after its session is closed.
        assert LONG_FN(held.symbol("racer"))(41) == 42
        held.release()
        done["closed"] += 1
    calls = done["ok"] + done["refused"]
    assert calls >= 2000, (rounds, done)
    assert done["ok"] > 0 and done["refused"] > 0, done


def test_concurrent_closes_and_releases(tmp_path: Path) -> None:
    data = cc_object(tmp_path, "twice", "long twice(long x) { return 2 * x; }")
    for _ in range(200):
        session = kiln.Session()
        session.add_object(data, "twice.o")
        module = session.link()
        assert module is not None
        start = threading.Barrier(4)
        errors: List[BaseException] = []

        def run(call: Callable[[], None]) -> None:
            start.wait()
            try:
                call()
            except kiln.KilnError:
                pass
            except BaseException as e:  # noqa: BLE001 - reported below
                errors.append(e)

        calls: List[Callable[[], None]] = [
            session.close,
            session.close,
            module.release,
            lambda: session.remove(module),
        ]
        threads = [threading.Thread(target=run, args=(c,)) for c in calls]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors, errors
        assert session.closed
        with pytest.raises(kiln.KilnError):
            module.symbol("twice")


def test_names_with_an_embedded_nul_raise_value_error(tmp_path: Path) -> None:
    data = cc_object(tmp_path, "add", "long add(long x) { return x + 2; }")
    path = tmp_path / "add.o"
    with kiln.Session() as session:
        session.add_object(data, "add.o")
        module = session.link()
        assert module is not None
        assert session.lookup_fn("add", LONG_FN)(1) == 3
        calls: List[Callable[[], object]] = [
            lambda: session.lookup("add\0x"),
            lambda: session.lookup_fn("add\0x", LONG_FN),
            lambda: session.define_symbol("x\0y", 1),
            lambda: session.create_library("lib\0rary"),
            lambda: session.add_object(data, "a\0b.o"),
            lambda: session.add_object_file(f"{path}\0.x"),
            lambda: session.add_object_file(os.fsencode(path) + b"\0.x"),
            lambda: session.add_archive_file(f"{path}\0.a"),
            lambda: session.add_library_by_name("m\0x"),
            lambda: session.add_library_by_name("m", [f"{tmp_path}\0/x"]),
            lambda: module.symbol("add\0"),
        ]
        for call in calls:
            with pytest.raises(ValueError, match="NUL"):
                call()
        # Nothing was added or defined by the refused calls.
        assert session.lookup("add") == module.symbol("add")
        with pytest.raises(kiln.KilnError):
            session.lookup("x")
        module.release()
