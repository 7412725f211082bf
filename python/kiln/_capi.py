"""The C library under the package: ``libkiln_capi.so`` (Kiln's C API, ``kiln.h``),
loaded with ctypes and its functions declared.

ctypes rather than a compiled extension: the C API is already Kiln's stable boundary
(ownership, threads and errors are written down for every function in ``kiln.h``), and
ctypes releases the GIL around every foreign call, so a link in one Python thread lets
the others run. The wheel carries the library built from this repository.
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

KILN_OK = 0

# The statuses of kiln.h, by value.
STATUS_NAMES = {
    1: "invalid argument",
    2: "I/O",
    3: "link",
    4: "undefined symbol",
    5: "redefinition",
    6: "module in use",
    7: "memory",
    8: "executor",
    9: "library",
    10: "panic",
    11: "compile",
}


def _library_path() -> str:
    """``KILN_CAPI_LIB`` if set, else the library the wheel carries."""
    explicit = os.environ.get("KILN_CAPI_LIB")
    if explicit:
        return explicit
    return str(Path(__file__).with_name("_lib") / "libkiln_capi.so")


class MemoryStats(ctypes.Structure):
    """``struct kiln_memory_stats``."""

    _fields_ = [
        ("live_allocations", ctypes.c_uint64),
        ("bytes_requested", ctypes.c_uint64),
        ("bytes_allocated", ctypes.c_uint64),
        ("bytes_reserved", ctypes.c_uint64),
        ("bytes_mapped", ctypes.c_uint64),
        ("bytes_resident", ctypes.c_uint64),
        ("slabs", ctypes.c_uint64),
    ]

    def __repr__(self) -> str:
        fields = ", ".join(f"{name}={getattr(self, name)}" for name, _ in self._fields_)
        return f"MemoryStats({fields})"


RELEASE_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
# ``kiln_resolve_fn``: (context, name, address out) -> 1 found / 0 not.
RESOLVE_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p, ctypes.POINTER(ctypes.c_uint64))


class Resolver(ctypes.Structure):
    """``struct kiln_resolver``."""

    _fields_ = [
        ("context", ctypes.c_void_p),
        ("resolve", RESOLVE_FN),
        ("destroy", RELEASE_FN),
    ]

lib = ctypes.CDLL(_library_path())

_session = ctypes.c_void_p
_error_out = ctypes.POINTER(ctypes.c_void_p)


def _declare(name: str, restype, *argtypes) -> None:
    function = getattr(lib, name)
    function.restype = restype
    function.argtypes = list(argtypes)


_declare("kiln_version", ctypes.c_char_p)
_declare("kiln_error_status", ctypes.c_int, ctypes.c_void_p)
_declare("kiln_error_message", ctypes.c_char_p, ctypes.c_void_p)
_declare("kiln_error_free", None, ctypes.c_void_p)
_declare("kiln_session_create", ctypes.c_int, ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p), _error_out)
_declare("kiln_session_dispose", None, _session)
_declare("kiln_main_library", ctypes.c_uint64, _session)
_declare("kiln_create_library", ctypes.c_int, _session, ctypes.c_char_p, ctypes.POINTER(ctypes.c_uint64), _error_out)
_declare(
    "kiln_add_object",
    ctypes.c_int,
    _session,
    ctypes.c_uint64,
    ctypes.c_char_p,
    ctypes.c_void_p,
    ctypes.c_size_t,
    RELEASE_FN,
    ctypes.c_void_p,
    _error_out,
)
_declare("kiln_add_object_file", ctypes.c_int, _session, ctypes.c_uint64, ctypes.c_char_p, _error_out)
_declare("kiln_add_archive_file", ctypes.c_int, _session, ctypes.c_uint64, ctypes.c_char_p, _error_out)
_declare(
    "kiln_add_library_by_name",
    ctypes.c_int,
    _session,
    ctypes.c_uint64,
    ctypes.c_char_p,
    ctypes.POINTER(ctypes.c_char_p),
    ctypes.c_size_t,
    _error_out,
)
_declare("kiln_add_process_symbols", ctypes.c_int, _session, ctypes.c_uint64, _error_out)
class Compiled(ctypes.Structure):
    """``struct kiln_compiled``."""

    _fields_ = [
        ("bytes", ctypes.c_void_p),
        ("size", ctypes.c_size_t),
        ("error", ctypes.c_void_p),
        ("release", RELEASE_FN),
        ("release_context", ctypes.c_void_p),
    ]


# ``kiln_compile_fn``: (context, name, compiled out) -> 1 compiled / 0 failed.
COMPILE_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p, ctypes.POINTER(Compiled))


class LazyCompiler(ctypes.Structure):
    """``struct kiln_lazy_compiler``."""

    _fields_ = [
        ("context", ctypes.c_void_p),
        ("compile", COMPILE_FN),
        ("destroy", RELEASE_FN),
    ]


_declare(
    "kiln_add_lazy_functions",
    ctypes.c_int,
    _session,
    ctypes.c_uint64,
    ctypes.POINTER(ctypes.c_char_p),
    ctypes.c_size_t,
    ctypes.POINTER(LazyCompiler),
    ctypes.POINTER(ctypes.c_void_p),
    _error_out,
)
_declare(
    "kiln_replace_function",
    ctypes.c_int,
    _session,
    ctypes.c_uint64,
    ctypes.c_char_p,
    ctypes.c_void_p,
    ctypes.c_size_t,
    ctypes.POINTER(ctypes.c_uint64),
    _error_out,
)
_declare(
    "kiln_link_swappable",
    ctypes.c_int,
    _session,
    ctypes.c_uint64,
    ctypes.c_char_p,
    ctypes.c_void_p,
    ctypes.c_size_t,
    ctypes.POINTER(ctypes.c_void_p),
    ctypes.POINTER(ctypes.c_void_p),
    _error_out,
)
_declare("kiln_reclaim", ctypes.c_int, _session, ctypes.POINTER(ctypes.c_size_t), _error_out)
_declare("kiln_code_thread_register", ctypes.c_int, _session, ctypes.POINTER(ctypes.c_void_p), _error_out)
_declare("kiln_code_thread_pin", ctypes.c_void_p, ctypes.c_void_p)
_declare("kiln_code_thread_unpin", None, ctypes.c_void_p)
_declare("kiln_code_thread_release", None, ctypes.c_void_p)
_declare("kiln_add_resolver", ctypes.c_int, _session, ctypes.c_uint64, ctypes.POINTER(Resolver), _error_out)
_declare("kiln_add_session_resolver", ctypes.c_int, _session, ctypes.POINTER(Resolver), _error_out)
_declare("kiln_define_symbol", ctypes.c_int, _session, ctypes.c_uint64, ctypes.c_char_p, ctypes.c_uint64, _error_out)
_declare("kiln_link", ctypes.c_int, _session, ctypes.c_uint64, ctypes.POINTER(ctypes.c_void_p), _error_out)
_declare("kiln_lookup", ctypes.c_int, _session, ctypes.c_uint64, ctypes.c_char_p, ctypes.POINTER(ctypes.c_uint64), _error_out)
_declare("kiln_remove_module", ctypes.c_int, _session, ctypes.c_void_p, _error_out)
_declare("kiln_module_release", None, ctypes.c_void_p)
_declare("kiln_module_symbol", ctypes.c_uint64, ctypes.c_void_p, ctypes.c_char_p)
_declare("kiln_session_memory_stats", ctypes.c_int, _session, ctypes.POINTER(MemoryStats), _error_out)
