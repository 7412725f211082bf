"""Kiln from Python: link relocatable object files (from llvmlite, the system C compiler,
Cranelift, ...) into executable memory of this process, and call them.

>>> import ctypes, kiln
>>> with kiln.Session() as session:                        # doctest: +SKIP
...     session.add_object(object_bytes, "add.o")            # e.g. llvmlite's emit_object()
...     module = session.link()
...     add = session.lookup_fn("add", ctypes.CFUNCTYPE(ctypes.c_long, ctypes.c_long, ctypes.c_long))
...     add(2, 3)
5

The API mirrors Kiln's Rust one (``Jit``): a :class:`Session` holds libraries (a
namespace of symbols; the main library by default), objects are added to a library and
linked into a :class:`Module`, names are looked up to addresses. Every failure raises
:class:`KilnError` carrying Kiln's message (which names the object, section and symbol
involved). Links release the GIL: other Python threads run meanwhile, and links into
different libraries run in parallel.

Sessions and modules are safe to share between threads: :meth:`Session.close` (and
:meth:`Module.release`) waits for the calls on it in flight to return, and calls made
after it raise :class:`KilnError`. A name or path with an embedded NUL character raises
:class:`ValueError` (C strings end at the first NUL: it would be cut short).
"""

from __future__ import annotations

import contextlib
import ctypes
import itertools
import os
import sys
import threading
from typing import Any, Callable, Dict, Iterator, Optional, Sequence, Tuple, TypeVar, Union

from . import _capi

__all__ = ["KilnError", "Module", "Session", "version"]

F = TypeVar("F")

BytesLike = Union[bytes, bytearray, memoryview]

# The resolvers Kiln holds, by key: their ctypes thunks must live until Kiln destroys them.
_RESOLVERS: Dict[int, Tuple[Any, Any]] = {}
_RESOLVER_KEYS = itertools.count()


class _CodeThread:
    """A thread's registration for :meth:`Session.pinned`: released with the thread's
    local storage, on that thread."""

    def __init__(self, handle: int) -> None:
        self.handle = handle

    def __del__(self) -> None:
        _capi.lib.kiln_code_thread_release(ctypes.c_void_p(self.handle))


class _Unraisable:
    """What ``sys.unraisablehook`` takes (the fields of ``sys.UnraisableHookArgs``)."""

    def __init__(self, exc_type: Any, exc_value: Any, exc_traceback: Any, err_msg: str, obj: Any) -> None:
        self.exc_type = exc_type
        self.exc_value = exc_value
        self.exc_traceback = exc_traceback
        self.err_msg = err_msg
        self.object = obj


def version() -> str:
    """Kiln's version (the C library's)."""
    return _capi.lib.kiln_version().decode()


class KilnError(Exception):
    """A failed Kiln call: :attr:`status` is the kind (``"link"``, ``"undefined symbol"``,
    ...), the message Kiln's own."""

    def __init__(self, status: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message

    def __str__(self) -> str:
        return self.message


def _check(status: int, error: ctypes.c_void_p) -> None:
    if status == _capi.KILN_OK:
        return
    message = "unknown error"
    if error.value:
        raw = _capi.lib.kiln_error_message(error)
        message = raw.decode("utf-8", "replace") if raw else message
        _capi.lib.kiln_error_free(error)
    raise KilnError(_capi.STATUS_NAMES.get(status, f"status {status}"), message)


def _cstring(value: str, what: str) -> bytes:
    """``value`` as a C string (UTF-8); :class:`ValueError` if it holds a NUL, which C
    would read as its end."""
    if "\0" in value:
        raise ValueError(f"{what} contains a NUL character: {value!r}")
    return value.encode()


def _cpath(path: Union[str, os.PathLike], what: str = "path") -> bytes:
    """``path`` as a C string (its bytes, ``os.fsencode``); :class:`ValueError` if it
    holds a NUL."""
    encoded = os.fsencode(path)
    if b"\0" in encoded:
        raise ValueError(f"{what} contains a NUL character: {encoded!r}")
    return encoded


class _Handle:
    """A C handle shared between threads: calls on it count themselves in flight
    (:meth:`use`), and :meth:`close` refuses new calls, waits for those in flight, then
    frees it. So the handle is never freed under a call (the C API's contract: no call
    on a session or module runs while it is disposed)."""

    def __init__(self, handle: int, what: str) -> None:
        self._handle: Optional[int] = handle
        self._what = what
        self._closing = False
        self._calls = 0
        self._cond = threading.Condition(threading.RLock())
        self._local = threading.local()

    @property
    def closed(self) -> bool:
        return self._handle is None or self._closing

    @contextlib.contextmanager
    def use(self) -> Iterator[int]:
        """The handle, held open for the ``with`` block; :class:`KilnError` if closed."""
        with self._cond:
            if self._handle is None or self._closing:
                raise KilnError("invalid argument", f"the {self._what} is closed")
            self._calls += 1
            handle = self._handle
        depth = getattr(self._local, "depth", 0)
        self._local.depth = depth + 1
        try:
            yield handle
        finally:
            self._local.depth = depth
            with self._cond:
                self._calls -= 1
                if self._calls == 0:
                    self._cond.notify_all()

    def close(self, free: Any) -> None:
        """Refuses new calls, waits for those in flight, then calls ``free(handle)``
        (once: later closes return at once; a concurrent one waits for the first)."""
        with self._cond:
            if self._handle is None:
                return
            if getattr(self._local, "depth", 0):
                # Waiting would wait for ourselves.
                raise KilnError(
                    "invalid argument",
                    f"the {self._what} cannot be closed from within a call on it",
                )
            self._closing = True
            while self._calls:
                self._cond.wait()
            if self._handle is None:
                return
            handle, self._handle = self._handle, None
            # Freed with the lock held: a concurrent close() returns only once it is
            # freed; a call made meanwhile (even from a finalizer on this thread) sees
            # it closed.
            free(handle)


class Module:
    """A linked module. While it is held its code stays; :meth:`release` (or the end of
    a ``with`` block) lets it go once nothing else holds it. Remove it from its library
    with :meth:`Session.remove`."""

    def __init__(self, session: "Session", handle: int, library: int) -> None:
        self._session = session
        self._handle = _Handle(handle, "module")
        self.library = library

    @property
    def handle(self) -> int:
        """The C handle (``kiln_module*``); valid only while the module is not released:
        prefer the methods, which keep it so for their call."""
        with self._use() as handle:
            return handle

    def _use(self) -> "contextlib.AbstractContextManager[int]":
        """The module's handle, kept (not released) for the ``with`` block."""
        if self._handle.closed:
            raise KilnError("invalid argument", "the module was released")
        return self._handle.use()

    def symbol(self, name: str) -> int:
        """The address of a global symbol the module defines (0 if it defines none)."""
        encoded = _cstring(name, "the symbol's name")
        with self._use() as handle:
            return int(_capi.lib.kiln_module_symbol(ctypes.c_void_p(handle), encoded))

    def release(self) -> None:
        """Gives up this handle (idempotent); waits for calls using it in flight (a
        :meth:`Session.remove` of it in another thread)."""
        self._handle.close(lambda handle: _capi.lib.kiln_module_release(ctypes.c_void_p(handle)))

    def __enter__(self) -> "Module":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()

    def __del__(self) -> None:
        # A session closed first has released its modules' code already; the handle
        # itself is still ours to free.
        try:
            self.release()
        except Exception:
            pass


class Session:
    """A Kiln session in this process: libraries, objects, links, lookups.

    Use it as a context manager, or call :meth:`close`; code linked by a session must not
    be called after it is closed. Its methods may be called from several threads at
    once; :meth:`close` waits for those in flight, and later calls raise
    :class:`KilnError`.
    """

    def __init__(self) -> None:
        handle = ctypes.c_void_p()
        error = ctypes.c_void_p()
        _check(_capi.lib.kiln_session_create(None, ctypes.byref(handle), ctypes.byref(error)), error)
        if not handle.value:
            raise KilnError("invalid argument", "kiln_session_create returned no session")
        self._handle = _Handle(handle.value, "session")

    # -- the session ------------------------------------------------------------------------

    def _use(self) -> "contextlib.AbstractContextManager[int]":
        """The session's handle, kept open (not disposed) for the ``with`` block."""
        return self._handle.use()

    @property
    def main_library(self) -> int:
        """The id of the library objects go to by default."""
        with self._use() as h:
            return int(_capi.lib.kiln_main_library(ctypes.c_void_p(h)))

    def create_library(self, name: str) -> int:
        """A new library (its own namespace of symbols); its id."""
        encoded = _cstring(name, "the library's name")
        library = ctypes.c_uint64()
        error = ctypes.c_void_p()
        with self._use() as h:
            status = _capi.lib.kiln_create_library(
                ctypes.c_void_p(h), encoded, ctypes.byref(library), ctypes.byref(error)
            )
        _check(status, error)
        return library.value

    def _library(self, library: Optional[int]) -> int:
        return self.main_library if library is None else library

    # -- inputs -----------------------------------------------------------------------------

    def add_object(self, data: BytesLike, name: str = "object.o", library: Optional[int] = None) -> None:
        """Adds an ELF relocatable object (its bytes; Kiln copies them) to ``library``,
        to be linked by the next :meth:`link`. A malformed object is refused at once."""
        encoded = _cstring(name, "the object's name")
        data = bytes(data)
        error = ctypes.c_void_p()
        with self._use() as h:
            status = _capi.lib.kiln_add_object(
                ctypes.c_void_p(h),
                self._library(library),
                encoded,
                data,
                len(data),
                _capi.RELEASE_FN(),
                None,
                ctypes.byref(error),
            )
        _check(status, error)

    def add_object_file(self, path: Union[str, os.PathLike], library: Optional[int] = None) -> None:
        """Adds an object file (read now)."""
        encoded = _cpath(path)
        error = ctypes.c_void_p()
        with self._use() as h:
            status = _capi.lib.kiln_add_object_file(
                ctypes.c_void_p(h), self._library(library), encoded, ctypes.byref(error)
            )
        _check(status, error)

    def add_archive_file(self, path: Union[str, os.PathLike], library: Optional[int] = None) -> None:
        """Adds a static library (``.a``): its members are linked as they are needed."""
        encoded = _cpath(path)
        error = ctypes.c_void_p()
        with self._use() as h:
            status = _capi.lib.kiln_add_archive_file(
                ctypes.c_void_p(h), self._library(library), encoded, ctypes.byref(error)
            )
        _check(status, error)

    def add_library_by_name(
        self, name: str, dirs: Sequence[Union[str, os.PathLike]] = (), library: Optional[int] = None
    ) -> None:
        """``-lNAME``: a shared library (loaded) or a static one, searched as the system
        linker searches (``dirs`` first)."""
        encoded = _cstring(name, "the library's name")
        array = (ctypes.c_char_p * len(dirs))(*[_cpath(d, "a directory") for d in dirs])
        error = ctypes.c_void_p()
        with self._use() as h:
            status = _capi.lib.kiln_add_library_by_name(
                ctypes.c_void_p(h), self._library(library), encoded, array, len(dirs), ctypes.byref(error)
            )
        _check(status, error)

    def add_process_symbols(self, library: Optional[int] = None) -> None:
        """Names the objects leave undefined resolve in this process too (the C library,
        Python's own symbols, what was ``dlopen``ed)."""
        error = ctypes.c_void_p()
        with self._use() as h:
            status = _capi.lib.kiln_add_process_symbols(
                ctypes.c_void_p(h), self._library(library), ctypes.byref(error)
            )
        _check(status, error)

    def define_symbol(self, name: str, address: int, library: Optional[int] = None) -> None:
        """Defines ``name`` at an absolute address (a host function the JIT code calls:
        ``ctypes.cast(callback, ctypes.c_void_p).value``)."""
        encoded = _cstring(name, "the symbol's name")
        error = ctypes.c_void_p()
        with self._use() as h:
            status = _capi.lib.kiln_define_symbol(
                ctypes.c_void_p(h), self._library(library), encoded, address, ctypes.byref(error)
            )
        _check(status, error)

    def add_resolver(self, resolve: Callable[[str], Optional[int]], library: Optional[int] = None) -> None:
        """Adds a resolver to ``library``: a link asks ``resolve(name)`` for each name it
        cannot find otherwise (after the library's definitions and search order), once per
        name; it returns the address or ``None``. Kiln calls it from the linking thread
        (with the GIL taken for the call); it must not add to, link into or look up in the
        library it resolves for. An exception it raises counts as ``None`` and goes to
        ``sys.unraisablehook``."""
        error = ctypes.c_void_p()
        with self._use() as h:
            resolver = self._resolver(resolve)
            status = _capi.lib.kiln_add_resolver(
                ctypes.c_void_p(h), self._library(library), ctypes.byref(resolver), ctypes.byref(error)
            )
        _check(status, error)

    def add_session_resolver(self, resolve: Callable[[str], Optional[int]]) -> None:
        """:meth:`add_resolver` for every library of the session, those created later
        included."""
        error = ctypes.c_void_p()
        with self._use() as h:
            resolver = self._resolver(resolve)
            status = _capi.lib.kiln_add_session_resolver(ctypes.c_void_p(h), ctypes.byref(resolver), ctypes.byref(error))
        _check(status, error)

    def _resolver(self, resolve: Callable[[str], Optional[int]]) -> "_capi.Resolver":
        """A ``kiln_resolver`` calling ``resolve``: kept alive (with its ctypes thunks)
        until Kiln destroys it."""
        key = next(_RESOLVER_KEYS)

        def call(_context: Any, name: bytes, address: Any) -> int:
            try:
                found = resolve(name.decode("utf-8", "surrogateescape"))
            except BaseException as e:  # noqa: BLE001 - reported, and the name is unknown
                sys.unraisablehook(_Unraisable(type(e), e, e.__traceback__, f"kiln resolver {resolve!r}", None))
                return 0
            if not found:
                return 0
            address[0] = found
            return 1

        def destroy(_context: Any) -> None:
            _RESOLVERS.pop(key, None)

        thunks = (_capi.RESOLVE_FN(call), _capi.RELEASE_FN(destroy))
        _RESOLVERS[key] = thunks
        return _capi.Resolver(None, thunks[0], thunks[1])

    # -- lazy functions and hot swap -------------------------------------------------------

    def add_lazy_functions(
        self, names: Sequence[str], compile: Callable[[str], BytesLike], library: Optional[int] = None
    ) -> Module:
        """Defines each of ``names`` in ``library`` by a stub: its first call asks
        ``compile(name)`` for an object (bytes) that defines it, links that and goes on into
        the body; later calls go straight there. Returns the stubs' module. ``compile`` runs
        on the calling thread with the GIL taken for it; an exception it raises sends the
        function's calls to a fallback that returns 0 (until :meth:`replace_function`), and
        goes to ``sys.unraisablehook``."""
        key = next(_RESOLVER_KEYS)
        # What each compile hands Kiln (the object's bytes or the error's text), kept
        # until Kiln releases it (it copies it first), by release context.
        lent: Dict[int, Any] = {}
        tickets = itertools.count(1)

        def lend(out: Any, value: Any) -> None:
            ticket = next(tickets)
            lent[ticket] = value
            out.release = thunks[2]
            out.release_context = ticket

        def call(_context: Any, name: bytes, out: Any) -> int:
            text = name.decode("utf-8", "surrogateescape")
            try:
                data = bytes(compile(text))
            except BaseException as e:  # noqa: BLE001 - reported, and the compile failed
                sys.unraisablehook(_Unraisable(type(e), e, e.__traceback__, f"kiln lazy compiler for {text}", None))
                message = ctypes.create_string_buffer(f"{type(e).__name__}: {e}".encode("utf-8", "replace"))
                lend(out[0], message)
                out[0].error = ctypes.addressof(message)
                return 0
            buffer = ctypes.create_string_buffer(data, len(data))
            lend(out[0], buffer)
            out[0].bytes = ctypes.addressof(buffer)
            out[0].size = len(data)
            return 1

        def destroy(_context: Any) -> None:
            _RESOLVERS.pop(key, None)

        def release(context: Any) -> None:
            lent.pop(context or 0, None)

        encoded = [_cstring(n, "a function's name") for n in names]
        array = (ctypes.c_char_p * len(encoded))(*encoded)
        thunks = (_capi.COMPILE_FN(call), _capi.RELEASE_FN(destroy), _capi.RELEASE_FN(release))
        compiler = _capi.LazyCompiler(None, thunks[0], thunks[1])
        module = ctypes.c_void_p()
        error = ctypes.c_void_p()
        with self._use() as h:
            # Registered only once the call is made: Kiln then calls `destroy` exactly once.
            _RESOLVERS[key] = thunks
            library = self._library(library)
            status = _capi.lib.kiln_add_lazy_functions(
                ctypes.c_void_p(h), library, array, len(encoded), ctypes.byref(compiler), ctypes.byref(module),
                ctypes.byref(error),
            )
        _check(status, error)
        return Module(self, module.value, library)

    def replace_function(self, name: str, data: BytesLike, library: Optional[int] = None) -> int:
        """Gives the lazy function ``name`` a new body linked from the object ``data``
        (which must define ``name``); returns its address. Calls through the stub after this
        returns run it; the old body is freed once no thread pinned before (:meth:`pinned`)
        is still pinned. On failure the old body stays."""
        encoded = _cstring(name, "the function's name")
        raw = bytes(data)
        address = ctypes.c_uint64()
        error = ctypes.c_void_p()
        with self._use() as h:
            status = _capi.lib.kiln_replace_function(
                ctypes.c_void_p(h), self._library(library), encoded, raw, len(raw), ctypes.byref(address),
                ctypes.byref(error),
            )
        _check(status, error)
        return address.value

    def link_swappable(
        self, name: str, data: BytesLike, library: Optional[int] = None
    ) -> "tuple[Module, Module]":
        """Links the object ``data`` at once with every function it defines (default
        visibility) reached through a call-through stub, by the object's own calls too, so
        that :meth:`replace_function` can give any of them a new body later (a function
        linked plainly is called straight and cannot be replaced). Returns the stubs'
        module and the object's module; remove the stubs first."""
        encoded = _cstring(name, "the object's name")
        raw = bytes(data)
        stubs = ctypes.c_void_p()
        module = ctypes.c_void_p()
        error = ctypes.c_void_p()
        with self._use() as h:
            library = self._library(library)
            status = _capi.lib.kiln_link_swappable(
                ctypes.c_void_p(h), library, encoded, raw, len(raw), ctypes.byref(stubs), ctypes.byref(module),
                ctypes.byref(error),
            )
        _check(status, error)
        return Module(self, stubs.value, library), Module(self, module.value, library)

    def reclaim(self) -> int:
        """Frees replaced bodies no pinned thread can reach any more; returns how many are
        still kept."""
        left = ctypes.c_size_t()
        error = ctypes.c_void_p()
        with self._use() as h:
            status = _capi.lib.kiln_reclaim(ctypes.c_void_p(h), ctypes.byref(left), ctypes.byref(error))
        _check(status, error)
        return left.value

    @contextlib.contextmanager
    def pinned(self) -> Iterator[None]:
        """While the ``with`` block runs, no body this thread may be running is freed by a
        :meth:`replace_function` in another thread: wrap calls into functions that may be
        replaced concurrently. The thread registers with the session on first use."""
        threads = self.__dict__.setdefault("_code_threads", threading.local())
        thread = getattr(threads, "handle", None)
        if thread is None:
            handle = ctypes.c_void_p()
            error = ctypes.c_void_p()
            with self._use() as h:
                status = _capi.lib.kiln_code_thread_register(ctypes.c_void_p(h), ctypes.byref(handle), ctypes.byref(error))
            _check(status, error)
            thread = threads.handle = _CodeThread(handle.value)
        pin = _capi.lib.kiln_code_thread_pin(ctypes.c_void_p(thread.handle))
        try:
            yield
        finally:
            _capi.lib.kiln_code_thread_unpin(ctypes.c_void_p(pin))

    # -- linking ----------------------------------------------------------------------------

    def link(self, library: Optional[int] = None) -> Optional[Module]:
        """Links what was added to ``library`` since its last link into a module (``None``
        when nothing was added), runs its initializers. The GIL is released meanwhile.
        On failure the library is as before and :class:`KilnError` names what failed."""
        module = ctypes.c_void_p()
        error = ctypes.c_void_p()
        with self._use() as h:
            library = self._library(library)
            status = _capi.lib.kiln_link(ctypes.c_void_p(h), library, ctypes.byref(module), ctypes.byref(error))
        _check(status, error)
        if not module.value:
            return None
        return Module(self, module.value, library)

    def lookup(self, name: str, library: Optional[int] = None) -> int:
        """The address of ``name`` as ``library`` sees it (linking what is pending first if
        the name is not defined yet)."""
        encoded = _cstring(name, "the symbol's name")
        address = ctypes.c_uint64()
        error = ctypes.c_void_p()
        with self._use() as h:
            status = _capi.lib.kiln_lookup(
                ctypes.c_void_p(h), self._library(library), encoded, ctypes.byref(address), ctypes.byref(error)
            )
        _check(status, error)
        return address.value

    def lookup_fn(self, name: str, signature: F, library: Optional[int] = None) -> F:
        """``name`` as a callable of ``signature``, a ctypes function type
        (``ctypes.CFUNCTYPE(ctypes.c_long, ctypes.c_long)``). The caller vouches that the
        function has that signature."""
        return signature(self.lookup(name, library))  # type: ignore[operator]

    def remove(self, module: Module) -> None:
        """Removes ``module`` from its library: its names go, its finalizers run; its code
        is freed once no handle holds it (release ``module`` too)."""
        error = ctypes.c_void_p()
        with self._use() as h, module._use() as m:
            status = _capi.lib.kiln_remove_module(ctypes.c_void_p(h), ctypes.c_void_p(m), ctypes.byref(error))
        _check(status, error)

    def memory_stats(self) -> _capi.MemoryStats:
        """The executable-memory manager's figures (live allocations, bytes mapped and
        resident, ...)."""
        stats = _capi.MemoryStats()
        error = ctypes.c_void_p()
        with self._use() as h:
            status = _capi.lib.kiln_session_memory_stats(ctypes.c_void_p(h), ctypes.byref(stats), ctypes.byref(error))
        _check(status, error)
        return stats

    # -- lifetime ---------------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._handle.closed

    def close(self) -> None:
        """Disposes the session (idempotent): its modules' finalizers run and the code of
        those no :class:`Module` holds is freed. Calls on the session in flight in other
        threads are waited for first; calls made after it raise :class:`KilnError`.
        Closing from within a call on the session (a callback it runs) raises
        :class:`KilnError`."""
        self._handle.close(lambda handle: _capi.lib.kiln_session_dispose(ctypes.c_void_p(handle)))

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
