"""Numba on Kiln: every Numba JIT compilation of the process linked by Kiln instead of
LLVM's MCJIT.

>>> import kiln.numba                                        # doctest: +SKIP
>>> kiln.numba.enable()                                      # before the first compilation
>>> from numba import njit
>>> njit(lambda x: x + 1)(41)
42

Or, for a program one cannot edit, ``KILN_NUMBA=1`` in its environment with
``python -c "import kiln.numba; kiln.numba.enable_from_environment()" …`` (see
:func:`enable_from_environment`).

The seam is Numba's engine wrapper (``numba.core.codegen.JitEngine``): each CPU
codegen made after :func:`enable` gets a :class:`KilnEngine` instead, which emits every
finalized module to an object with a target machine of the codegen's CPU and features —
position-independent, small code model: Kiln places every module of a session in one
reserved range and reaches the process's symbols through its stubs and GOT, so that
model serves it best — and links it into a Kiln session. What Numba resolves through
LLVM resolves the same way: the names it registers with llvmlite (``add_symbol``: its C
helpers and NRT) through LLVM's symbol table, global mappings (``add_global_mapping``),
environments (``set_env`` through :meth:`KilnEngine.get_global_value_address`), and the
process's own symbols.

Numba's final modules each carry copies of shared helpers and environments
(``linkonce_odr``); MCJIT keeps one global namespace where the first definition wins.
Kiln refuses a name defined twice in one library, so each finalized module is linked into
a library of its own, and a name an earlier module defined is bound to that first
definition (the later copy is made ``available_externally`` in a clone of the module:
Numba links the module's IR into later libraries, so the module itself is left as it is).

Not yet: returning a library's memory when Numba lets go of it (its modules stay linked
for the process's life, as MCJIT keeps them) and Numba's on-disk object cache
(``cache=True`` compiles again instead of loading, as if the cache were cold).
"""

from __future__ import annotations

import os
from typing import Any, Callable, Dict, List, Optional, Set

from . import KilnError, Module, Session

__all__ = ["KilnEngine", "enable", "enable_from_environment", "enabled"]

_ENV = "KILN_NUMBA"
_enabled = False


class KilnEngine:
    """What ``numba.core.codegen.JitEngine`` offers Numba, over a Kiln :class:`Session`.

    ``target_machine`` is an llvmlite ``TargetMachine`` that emits the objects."""

    def __init__(self, target_machine: Any) -> None:
        self._tm = target_machine
        self._session = Session()
        self._defined_symbols: Set[str] = set()
        self._mappings: Dict[str, int] = {}
        self._pending: List[Any] = []
        self._modules: List[Module] = []
        # Each name's first definition (its address): what every later module binds to.
        self._first: Dict[str, int] = {}
        self._count = 0

    # -- JitEngine's symbol tracking ---------------------------------------------------------

    def is_symbol_defined(self, name: str) -> bool:
        """Whether a module added (or a global mapping) defines ``name``."""
        return name in self._defined_symbols

    def _load_defined_symbols(self, module: Any) -> None:
        for values in (module.functions, module.global_variables):
            self._defined_symbols |= {v.name for v in values if not v.is_declaration}

    # -- the ExecutionEngine calls Numba makes -----------------------------------------------

    def add_module(self, module: Any) -> None:
        """Takes ``module`` (an llvmlite ``ModuleRef``) to link at the next finalize."""
        self._load_defined_symbols(module)
        self._pending.append(module)

    def add_global_mapping(self, gv: Any, address: int) -> None:
        """Binds the global ``gv`` to ``address`` for every module linked after."""
        self._defined_symbols.add(gv.name)
        self._mappings[gv.name] = address

    def set_object_cache(self, notify: Optional[Callable[..., Any]] = None,
                         getbuffer: Optional[Callable[..., Any]] = None) -> None:
        """Numba's object-cache hooks: not used (every module is compiled; see the module's
        documentation)."""

    def finalize_object(self) -> None:
        """Links every module added since the last finalize, each in a library of its own."""
        import llvmlite.binding as ll

        pending, self._pending = self._pending, []
        for original in pending:
            # Numba links this module's IR into later libraries: it stays as it is.
            module = original.clone()
            self._count += 1
            name = f"numba-{self._count}"
            library = self._session.create_library(name)
            defined: List[str] = []
            for values in (module.functions, module.global_variables):
                for value in values:
                    symbol = value.name
                    if not value.is_declaration:
                        if symbol in self._first:
                            # An earlier module's copy is the one (MCJIT's first wins).
                            value.linkage = ll.Linkage.available_externally
                            self._session.define_symbol(symbol, self._first[symbol], library)
                        else:
                            defined.append(symbol)
                        continue
                    address = (self._mappings.get(symbol) or self._first.get(symbol)
                               or ll.address_of_symbol(symbol))
                    if address:
                        self._session.define_symbol(symbol, address, library)
            self._session.add_process_symbols(library)
            self._session.add_object(self._tm.emit_object(module), f"{name}.o", library)
            linked = self._session.link(library)
            if linked is not None:
                self._modules.append(linked)
            for symbol in defined:
                try:
                    self._first[symbol] = self._session.lookup(symbol, library)
                except KilnError:
                    pass  # not a symbol of the object (an LLVM intrinsic, say)

    def get_function_address(self, name: str) -> int:
        """The address of ``name`` (linking what is pending first), or 0."""
        self.finalize_object()
        return self._mappings.get(name) or self._first.get(name, 0)

    get_global_value_address = get_function_address


def enabled() -> bool:
    """Whether :func:`enable` has switched Numba to Kiln."""
    return _enabled


def enable() -> None:
    """Makes every Numba CPU codegen made from now on link through Kiln. Call it before
    the first compilation (codegens made before keep MCJIT). Raises ``ImportError`` when
    Numba is not installed, or :class:`RuntimeError` when its engine seam is not the one
    this module knows (then nothing is changed)."""
    global _enabled
    if _enabled:
        return
    import llvmlite.binding as ll
    from numba.core import codegen, config

    cls = getattr(codegen, "JITCPUCodegen", None)
    original = getattr(cls, "_init", None)
    if cls is None or original is None or not hasattr(codegen, "JitEngine"):
        raise RuntimeError("this Numba has no JITCPUCodegen._init / JitEngine: kiln.numba does not know it")

    def _init(self: Any, llvm_module: Any) -> None:
        original(self, llvm_module)
        target = ll.Target.from_triple(ll.get_process_triple())
        options: Dict[str, Any] = dict(opt=config.OPT)
        self._customize_tm_options(options)
        options.pop("jit", None)
        options["reloc"] = "pic"
        options["codemodel"] = "small"
        # MCJIT owns the target machine the codegen's pass builders use: it stays alive.
        self._kiln_mcjit = self._engine
        self._engine = KilnEngine(target.create_target_machine(**options))

    cls._init = _init
    _enabled = True


def enable_from_environment() -> bool:
    """:func:`enable` if ``KILN_NUMBA`` is set to ``1`` in the environment; whether it
    did."""
    if os.environ.get(_ENV) == "1":
        enable()
        return True
    return False
