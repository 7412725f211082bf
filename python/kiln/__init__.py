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
"""

from __future__ import annotations

import ctypes
import os
import threading
from typing import Any, Optional, Sequence, TypeVar, Union

from . import _capi

__all__ = ["KilnError", "Module", "Session", "version"]

F = TypeVar("F")

BytesLike = Union[bytes, bytearray, memoryview]


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


class Module:
    """A linked module. While it is held its code stays; :meth:`release` (or the end of
    a ``with`` block) lets it go once nothing else holds it. Remove it from its library
    with :meth:`Session.remove`."""

    def __init__(self, session: "Session", handle: int, library: int) -> None:
        self._session = session
        self._handle: Optional[int] = handle
        self.library = library

    @property
    def handle(self) -> int:
        if self._handle is None:
            raise KilnError("invalid argument", "the module was released")
        return self._handle

    def symbol(self, name: str) -> int:
        """The address of a global symbol the module defines (0 if it defines none)."""
        return int(_capi.lib.kiln_module_symbol(ctypes.c_void_p(self.handle), name.encode()))

    def release(self) -> None:
        """Gives up this handle (idempotent)."""
        if self._handle is not None:
            _capi.lib.kiln_module_release(ctypes.c_void_p(self._handle))
            self._handle = None

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
    be called after it is closed.
    """

    def __init__(self) -> None:
        handle = ctypes.c_void_p()
        error = ctypes.c_void_p()
        _check(_capi.lib.kiln_session_create(None, ctypes.byref(handle), ctypes.byref(error)), error)
        self._handle: Optional[ctypes.c_void_p] = handle
        self._lock = threading.Lock()

    # -- the session ------------------------------------------------------------------------

    @property
    def _h(self) -> ctypes.c_void_p:
        if self._handle is None:
            raise KilnError("invalid argument", "the session is closed")
        return self._handle

    @property
    def main_library(self) -> int:
        """The id of the library objects go to by default."""
        return int(_capi.lib.kiln_main_library(self._h))

    def create_library(self, name: str) -> int:
        """A new library (its own namespace of symbols); its id."""
        library = ctypes.c_uint64()
        error = ctypes.c_void_p()
        _check(
            _capi.lib.kiln_create_library(self._h, name.encode(), ctypes.byref(library), ctypes.byref(error)),
            error,
        )
        return library.value

    def _library(self, library: Optional[int]) -> int:
        return self.main_library if library is None else library

    # -- inputs -----------------------------------------------------------------------------

    def add_object(self, data: BytesLike, name: str = "object.o", library: Optional[int] = None) -> None:
        """Adds an ELF relocatable object (its bytes; Kiln copies them) to ``library``,
        to be linked by the next :meth:`link`. A malformed object is refused at once."""
        data = bytes(data)
        error = ctypes.c_void_p()
        _check(
            _capi.lib.kiln_add_object(
                self._h,
                self._library(library),
                name.encode(),
                data,
                len(data),
                _capi.RELEASE_FN(),
                None,
                ctypes.byref(error),
            ),
            error,
        )

    def add_object_file(self, path: Union[str, os.PathLike], library: Optional[int] = None) -> None:
        """Adds an object file (read now)."""
        error = ctypes.c_void_p()
        _check(
            _capi.lib.kiln_add_object_file(self._h, self._library(library), os.fsencode(path), ctypes.byref(error)),
            error,
        )

    def add_archive_file(self, path: Union[str, os.PathLike], library: Optional[int] = None) -> None:
        """Adds a static library (``.a``): its members are linked as they are needed."""
        error = ctypes.c_void_p()
        _check(
            _capi.lib.kiln_add_archive_file(self._h, self._library(library), os.fsencode(path), ctypes.byref(error)),
            error,
        )

    def add_library_by_name(
        self, name: str, dirs: Sequence[str] = (), library: Optional[int] = None
    ) -> None:
        """``-lNAME``: a shared library (loaded) or a static one, searched as the system
        linker searches (``dirs`` first)."""
        array = (ctypes.c_char_p * len(dirs))(*[d.encode() for d in dirs])
        error = ctypes.c_void_p()
        _check(
            _capi.lib.kiln_add_library_by_name(
                self._h, self._library(library), name.encode(), array, len(dirs), ctypes.byref(error)
            ),
            error,
        )

    def add_process_symbols(self, library: Optional[int] = None) -> None:
        """Names the objects leave undefined resolve in this process too (the C library,
        Python's own symbols, what was ``dlopen``ed)."""
        error = ctypes.c_void_p()
        _check(_capi.lib.kiln_add_process_symbols(self._h, self._library(library), ctypes.byref(error)), error)

    def define_symbol(self, name: str, address: int, library: Optional[int] = None) -> None:
        """Defines ``name`` at an absolute address (a host function the JIT code calls:
        ``ctypes.cast(callback, ctypes.c_void_p).value``)."""
        error = ctypes.c_void_p()
        _check(
            _capi.lib.kiln_define_symbol(
                self._h, self._library(library), name.encode(), address, ctypes.byref(error)
            ),
            error,
        )

    # -- linking ----------------------------------------------------------------------------

    def link(self, library: Optional[int] = None) -> Optional[Module]:
        """Links what was added to ``library`` since its last link into a module (``None``
        when nothing was added), runs its initializers. The GIL is released meanwhile.
        On failure the library is as before and :class:`KilnError` names what failed."""
        library = self._library(library)
        module = ctypes.c_void_p()
        error = ctypes.c_void_p()
        _check(_capi.lib.kiln_link(self._h, library, ctypes.byref(module), ctypes.byref(error)), error)
        if not module.value:
            return None
        return Module(self, module.value, library)

    def lookup(self, name: str, library: Optional[int] = None) -> int:
        """The address of ``name`` as ``library`` sees it (linking what is pending first if
        the name is not defined yet)."""
        address = ctypes.c_uint64()
        error = ctypes.c_void_p()
        _check(
            _capi.lib.kiln_lookup(self._h, self._library(library), name.encode(), ctypes.byref(address), ctypes.byref(error)),
            error,
        )
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
        _check(_capi.lib.kiln_remove_module(self._h, ctypes.c_void_p(module.handle), ctypes.byref(error)), error)

    def memory_stats(self) -> _capi.MemoryStats:
        """The executable-memory manager's figures (live allocations, bytes mapped and
        resident, ...)."""
        stats = _capi.MemoryStats()
        error = ctypes.c_void_p()
        _check(_capi.lib.kiln_session_memory_stats(self._h, ctypes.byref(stats), ctypes.byref(error)), error)
        return stats

    # -- lifetime ---------------------------------------------------------------------------

    def close(self) -> None:
        """Disposes the session (idempotent): its modules' finalizers run and the code of
        those no :class:`Module` holds is freed."""
        with self._lock:
            if self._handle is not None:
                _capi.lib.kiln_session_dispose(self._handle)
                self._handle = None

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
