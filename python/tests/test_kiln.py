"""The Python package against real objects: the system C compiler's and llvmlite's."""

from __future__ import annotations

import ctypes
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import kiln

LONG_FN = ctypes.CFUNCTYPE(ctypes.c_long, ctypes.c_long)


def cc_object(tmp_path: Path, name: str, source: str, *flags: str) -> bytes:
    c = tmp_path / f"{name}.c"
    c.write_text(source)
    o = tmp_path / f"{name}.o"
    subprocess.run(["cc", "-O2", "-c", *flags, str(c), "-o", str(o)], check=True)
    return o.read_bytes()


def llvmlite_object(name: str, factor: int) -> bytes:
    """``long name(long x) { return labs(x * factor - 7); }`` built and optimized with
    llvmlite, emitted by its target machine."""
    import llvmlite.binding as llvm

    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    ir = f"""
    declare i64 @labs(i64)
    define i64 @{name}(i64 %x) {{
      %m = mul i64 %x, {factor}
      %s = sub i64 %m, 7
      %r = call i64 @labs(i64 %s)
      ret i64 %r
    }}
    """
    module = llvm.parse_assembly(ir)
    module.verify()
    machine = llvm.Target.from_default_triple().create_target_machine(reloc="pic", codemodel="default")
    return machine.emit_object(module)


def test_a_c_object_links_and_runs(tmp_path: Path) -> None:
    data = cc_object(tmp_path, "twice", "long twice(long x) { return 2 * x; }")
    with kiln.Session() as session:
        session.add_object(data, "twice.o")
        module = session.link()
        assert module is not None
        twice = session.lookup_fn("twice", LONG_FN)
        assert twice(21) == 42
        assert module.symbol("twice") == session.lookup("twice")
        module.release()


def test_llvmlite_objects_link_call_the_c_library_and_are_removed() -> None:
    with kiln.Session() as session:
        session.add_process_symbols()
        modules = []
        for i in range(50):
            session.add_object(llvmlite_object(f"f{i}", i), f"f{i}.o")
            modules.append(session.link())
        for i in range(50):
            assert session.lookup_fn(f"f{i}", LONG_FN)(3) == abs(3 * i - 7)
        stats = session.memory_stats()
        before = stats.live_allocations
        # Its repr names every figure with its value.
        assert repr(stats).startswith("MemoryStats(live_allocations=")
        assert f"bytes_resident={stats.bytes_resident}" in repr(stats)
        for module in modules:
            session.remove(module)
            module.release()
        assert session.memory_stats().live_allocations < before
        with pytest.raises(kiln.KilnError) as caught:
            session.lookup("f3")
        assert caught.value.status == "undefined symbol"
        assert "f3" in str(caught.value)


def test_bad_input_raises_kiln_errors_naming_what_failed(tmp_path: Path) -> None:
    with kiln.Session() as session:
        with pytest.raises(kiln.KilnError) as caught:
            session.add_object(b"\x7fELF not really", "broken.o")
        assert "broken.o" in str(caught.value)
        # A missing symbol fails the link, names the symbol, and leaves the library as before.
        data = cc_object(tmp_path, "needs", "long missing_fn(long); long needs(long x) { return missing_fn(x); }")
        session.add_object(data, "needs.o")
        with pytest.raises(kiln.KilnError) as caught:
            session.link()
        assert caught.value.status == "undefined symbol"
        assert "missing_fn" in str(caught.value)
        ok = cc_object(tmp_path, "fine", "long fine(long x) { return x + 1; }")
        session.add_object(ok, "fine.o")
        session.link()
        assert session.lookup_fn("fine", LONG_FN)(1) == 2
    with pytest.raises(kiln.KilnError):
        session.lookup("fine")  # closed


def test_host_functions_and_libraries_resolve(tmp_path: Path) -> None:
    seen = []

    @ctypes.CFUNCTYPE(ctypes.c_long, ctypes.c_long)
    def host(x: int) -> int:
        seen.append(x)
        return x * 10

    data = cc_object(
        tmp_path,
        "calls_host",
        "#include <math.h>\nlong host(long); long calls(long x) { return host(x) + (long)sqrt(16.0); }",
    )
    with kiln.Session() as session:
        session.define_symbol("host", ctypes.cast(host, ctypes.c_void_p).value)
        session.add_library_by_name("m")
        session.add_process_symbols()
        session.add_object(data, "calls_host.o")
        session.link()
        assert session.lookup_fn("calls", LONG_FN)(4) == 44
    assert seen == [4]


def test_a_resolver_is_asked_only_for_names_kiln_cannot_find(tmp_path: Path) -> None:
    @ctypes.CFUNCTYPE(ctypes.c_long, ctypes.c_long)
    def host(x: int) -> int:
        return x * 10

    asked = []

    def resolve(name: str):
        asked.append(name)
        if name == "host_from_resolver":
            return ctypes.cast(host, ctypes.c_void_p).value
        if name == "resolver_raises":
            raise KeyError(name)
        return None

    data = cc_object(
        tmp_path,
        "asks",
        "long host_from_resolver(long); long defined_here(long x) { return x + 1; }\n"
        "long asks(long x) { return host_from_resolver(x) + defined_here(x); }",
    )
    broken = cc_object(tmp_path, "broken", "long resolver_raises(long); long uses(long x) { return resolver_raises(x); }")
    with kiln.Session() as session:
        session.add_session_resolver(resolve)
        lib = session.create_library("asks")
        session.add_object(data, "asks.o", lib)
        session.link(lib)
        assert session.lookup_fn("asks", LONG_FN, lib)(4) == 45
        # Defined by the object itself: never asked.
        assert asked == ["host_from_resolver"]
        # A resolver that raises: the name is unknown, and the link says which.
        other = session.create_library("broken")
        session.add_object(broken, "broken.o", other)
        unraisable = []
        hook, sys.unraisablehook = sys.unraisablehook, unraisable.append
        try:
            with pytest.raises(kiln.KilnError, match="resolver_raises"):
                session.link(other)
        finally:
            sys.unraisablehook = hook
        assert unraisable and isinstance(unraisable[0].exc_value, KeyError)
    assert kiln._RESOLVERS == {}, "the session's close destroyed the resolver"


def test_lazy_functions_compile_on_first_call_and_are_swapped_while_called(tmp_path: Path) -> None:
    compiled = []

    def compile(name: str) -> bytes:
        compiled.append(name)
        if name == "broken":
            raise RuntimeError("no body for broken")
        return llvmlite_object(name, 3)

    def llvmlite_call(x: int, factor: int) -> int:
        return abs(x * factor - 7)

    with kiln.Session() as session:
        session.add_process_symbols()
        stubs = session.add_lazy_functions(["lazy_f", "broken"], compile)
        assert compiled == []
        f = session.lookup_fn("lazy_f", LONG_FN)
        with session.pinned():
            assert f(5) == llvmlite_call(5, 3)
        assert compiled == ["lazy_f"]
        # A compiler that raises: the calls return 0, and the exception is reported.
        unraisable = []
        hook, sys.unraisablehook = sys.unraisablehook, unraisable.append
        try:
            assert session.lookup_fn("broken", LONG_FN)(5) == 0
        finally:
            sys.unraisablehook = hook
        assert isinstance(unraisable[0].exc_value, RuntimeError)
        # Hot swap, with calls running in another thread the whole time.
        stop = threading.Event()
        seen = set()

        def caller() -> None:
            while not stop.is_set():
                with session.pinned():
                    seen.add(f(5))

        worker = threading.Thread(target=caller)
        worker.start()
        for factor in (4, 5, 6):
            body = session.replace_function("lazy_f", llvmlite_object("lazy_f", factor))
            assert body != 0
            time.sleep(0.05)
        stop.set()
        worker.join()
        assert f(5) == llvmlite_call(5, 6)
        assert seen <= {llvmlite_call(5, k) for k in (3, 4, 5, 6)}, seen
        assert session.reclaim() == 0
        with pytest.raises(kiln.KilnError, match="not_lazy"):
            session.replace_function("not_lazy", llvmlite_object("not_lazy", 1))
        assert f(5) == llvmlite_call(5, 6)
        stubs.release()


def test_a_function_linked_swappably_is_replaced_and_the_objects_own_calls_follow(tmp_path: Path) -> None:
    int_fn = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int)
    pair = cc_object(
        tmp_path,
        "pair",
        "int odd(int n);\nint even(int n) { return n == 0 ? 1 : odd(n - 1); }\n"
        "int odd(int n) { return n == 0 ? 0 : even(n - 1); }\n",
        "-fPIC",
    )
    new_odd = cc_object(tmp_path, "new_odd", "int odd(int n) { return 1000 + n; }\n")
    with kiln.Session() as session:
        stubs, module = session.link_swappable("pair.o", pair)
        even = session.lookup_fn("even", int_fn)
        assert (even(10), even(7)) == (1, 0)
        session.replace_function("odd", new_odd)
        with session.pinned():
            assert even(6) == 1005  # even's own call reaches the new odd
        session.remove(stubs)
        session.remove(module)
    with kiln.Session() as plain:
        plain.add_object(pair, "pair.o")
        plain.link()
        with pytest.raises(kiln.KilnError, match="link_swappable"):
            plain.replace_function("odd", new_odd)


def test_a_link_releases_the_gil(tmp_path: Path) -> None:
    # SQLite's archive, linked in one call of several milliseconds. With no forced switch
    # between threads (a switch interval of 1000 s), another Python thread can run during
    # the call only if the call released the GIL.
    driver = cc_object(
        tmp_path,
        "sqlite_version",
        "const char *sqlite3_libversion(void); const char *version(void) { return sqlite3_libversion(); }",
    )
    ticks = []
    stop = threading.Event()

    def ticker() -> None:
        while not stop.is_set():
            ticks.append(1)
            time.sleep(0)  # gives the GIL back: the main thread takes it between ticks

    with kiln.Session() as session:
        session.add_object(driver, "sqlite_version.o")
        session.add_archive_file("/usr/lib/x86_64-linux-gnu/libsqlite3.a")
        session.add_library_by_name("m")
        session.add_process_symbols()
        interval = sys.getswitchinterval()
        background = threading.Thread(target=ticker)
        background.start()
        sys.setswitchinterval(1000)
        try:
            before = len(ticks)
            session.link()
            during = len(ticks) - before
        finally:
            sys.setswitchinterval(interval)
            stop.set()
            background.join()
        assert during > 0, "no other thread ran during the link"
        version = ctypes.CFUNCTYPE(ctypes.c_char_p)(session.lookup("version"))
        assert version().startswith(b"3.")


def test_libraries_link_in_parallel_from_threads() -> None:
    objects = [llvmlite_object(f"g{i}", i) for i in range(40)]
    with kiln.Session() as session:
        libraries = [session.create_library(f"lib{t}") for t in range(4)]
        for library in libraries:
            session.add_process_symbols(library)

        def worker(t: int) -> None:
            for i in range(t, 40, 4):
                session.add_object(objects[i], f"g{i}.o", libraries[t])
                session.link(libraries[t])

        workers = [threading.Thread(target=worker, args=(t,)) for t in range(4)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        for i in range(40):
            assert session.lookup_fn(f"g{i}", LONG_FN, libraries[i % 4])(2) == abs(2 * i - 7)
        # Each library is its own namespace.
        with pytest.raises(kiln.KilnError):
            session.lookup("g1", libraries[0])


def test_version_and_context_managers() -> None:
    assert kiln.version()
    session = kiln.Session()
    session.close()
    session.close()
    with pytest.raises(kiln.KilnError, match="closed"):
        _ = session.main_library


def test_close_racing_every_call_never_crashes_the_interpreter(tmp_path: Path) -> None:
    # Threads call link, add_object, lookup and remove while the main thread closes the
    # session: each call either finishes before the close disposes the session or raises
    # KilnError; nothing crashes (the interpreter would die with it).
    data = cc_object(tmp_path, "racer", "long racer(long x) { return x + 1; }")
    other = cc_object(tmp_path, "other", "long other(long x) { return x - 1; }")
    outcomes = {"ok": 0, "refused": 0}
    lock = threading.Lock()
    for round in range(150):
        session = kiln.Session()
        session.add_object(data, "racer.o")
        module = session.link()
        assert module is not None
        start = threading.Barrier(5)

        def worker(kind: int) -> None:
            start.wait()
            for _ in range(10):
                try:
                    if kind == 0:
                        session.add_object(other, "other.o")
                        session.link()
                    elif kind == 1:
                        # Looked up, not called: after a remove, the lookup links
                        # again.o into a module no handle holds, freed by the close
                        # (code must not be called after its session is closed).
                        assert session.lookup("racer") != 0
                    elif kind == 2:
                        session.remove(module)
                    else:
                        session.add_object(data, "again.o")
                    result = "ok"
                except kiln.KilnError:
                    result = "refused"
                with lock:
                    outcomes[result] += 1

        threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
        for t in threads:
            t.start()
        start.wait()
        # Close after a varying delay: at once (every call refused) or after some ran.
        time.sleep((round % 5) * 0.0005)
        session.close()
        for t in threads:
            t.join()
        module.release()
        with pytest.raises(kiln.KilnError):
            session.lookup("racer")
    # Both ends of the race were seen: calls that ran and calls refused.
    assert outcomes["ok"] > 0 and outcomes["refused"] > 0, outcomes


def test_a_name_with_an_embedded_nul_is_refused(tmp_path: Path) -> None:
    data = cc_object(tmp_path, "add", "long add(long x) { return x + 2; }")
    with kiln.Session() as session:
        session.add_object(data, "add.o")
        module = session.link()
        assert module is not None
        assert session.lookup_fn("add", LONG_FN)(1) == 3
        for call in (
            lambda: session.lookup("add\0x"),
            lambda: session.define_symbol("x\0y", 1),
            lambda: session.add_object(data, "a\0b.o"),
            lambda: session.add_object_file("add\0.o"),
            lambda: module.symbol("add\0"),
        ):
            with pytest.raises(ValueError):
                call()
        module.release()
