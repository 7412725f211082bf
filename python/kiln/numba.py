"""Numba on Kiln: every Numba JIT compilation of the process linked by Kiln instead of
LLVM's MCJIT, and its code freed when Numba lets go of it.

>>> import kiln.numba                                        # doctest: +SKIP
>>> kiln.numba.enable()                                      # before the first compilation
>>> from numba import njit
>>> njit(lambda x: x + 1)(41)
42

Or, for a program one cannot edit, ``KILN_NUMBA=1`` in its environment: the package
installs a start-up hook (``kiln_numba.pth``) that calls :func:`enable` when Python starts
(in the processes the program starts too, as they inherit the environment).

The seam is Numba's engine wrapper (``numba.core.codegen.JitEngine``): each CPU
codegen made after :func:`enable` gets a :class:`KilnEngine` instead, which emits every
finalized module to an object with a target machine of the codegen's CPU and features —
position-independent, small code model: Kiln places every module of a session in one
reserved range and reaches the process's symbols through its stubs and GOT, so that
model serves it best — and links it into a Kiln library of its own. What a module leaves
undefined resolves as under MCJIT, through one resolver Kiln asks only for the names it
cannot find: global mappings (``add_global_mapping``), an earlier module's definition,
the names Numba registers with llvmlite (``add_symbol``: its C helpers and NRT) and the
process's own (``address_of_symbol``). Environments (``set_env``) are found through
:meth:`KilnEngine.get_global_value_address`.

MCJIT keeps one namespace where a name's first definition wins; Numba's final modules
carry copies of what they link in (``linkonce_odr`` functions: weak symbols, and
environments: ``common`` globals). In Kiln each copy gives way to the first definition
(a weak or common symbol yields to the library's definition, as in an ELF link), so the
module's code binds to it; a strong duplicate is made ``available_externally`` in a clone
of the module (Numba links the module's IR into later libraries: it stays as it is).

Freed when unreachable: Numba registers a finalizer on each code library for the callable
its codegen's ``_add_module`` returns (MCJIT's returns none: its ``remove_module`` leaks).
Under Kiln it returns :meth:`KilnEngine.remove_module`: when the garbage collector takes a
library, its Kiln module is removed and its memory returned — unless a live module is bound
to a name it defined first, in which case it goes with the last such module. A module
whose code hands Numba's runtime a function pointer (an NRT destructor, a generator's
next function, a typed container's method table: objects that outlive the dispatcher call
them) is kept, as MCJIT keeps every module. A call into freed code traps (Kiln poisons
freed code pages).

Numba's object cache (``cache=True``) works as with MCJIT: each compiled object goes to
Numba's ``notify`` hook, and a later process links the object its ``getbuffer`` hook gives
instead of compiling.
"""

from __future__ import annotations

import functools
import os
import struct
from typing import Any, Callable, Dict, List, Optional, Set, Tuple

from . import KilnError, Module, Session

__all__ = ["KilnEngine", "enable", "enable_from_environment", "enabled"]

_ENV = "KILN_NUMBA"
_enabled = False


# ELF64 little-endian, what the symbol scan reads (x86-64 and AArch64 Linux hosts).
_SHT_SYMTAB = 2
_SHN_UNDEF = 0
_SHN_COMMON = 0xFFF2
_STB_GLOBAL = 1
_STB_WEAK = 2
_STV_HIDDEN = 2


def _object_symbols(obj: bytes) -> Tuple[List[str], List[str], Set[str]]:
    """The names an ELF64 little-endian relocatable object defines for others to use — its
    strong definitions, and its weak and common ones (which give way to a definition the
    library has: ``linkonce_odr`` copies and ``common`` environment globals) — and the
    names it leaves undefined. Read here, with ``struct``, because llvmlite's object file
    gives no symbol bindings and the package has no other ELF reader; anything but ELF64
    little-endian raises ``ValueError``."""
    if obj[:6] != b"\x7fELF\x02\x01":
        raise ValueError("kiln.numba reads ELF64 little-endian objects only")
    shoff, = struct.unpack_from("<Q", obj, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", obj, 0x3A)
    if shnum == 0 and shoff:
        raise ValueError("kiln.numba does not read objects with extended section numbering")
    strong: List[str] = []
    weak: List[str] = []
    undefined: Set[str] = set()
    for i in range(shnum):
        sh = shoff + i * shentsize
        sh_type, = struct.unpack_from("<I", obj, sh + 4)
        if sh_type != _SHT_SYMTAB:
            continue
        offset, size, link = struct.unpack_from("<QQI", obj, sh + 0x18)
        str_sh = shoff + link * shentsize
        str_offset, = struct.unpack_from("<Q", obj, str_sh + 0x18)
        for name_at, info, other, shndx, _, _ in struct.iter_unpack("<IBBHQQ", obj[offset:offset + size]):
            bind = info >> 4
            if bind not in (_STB_GLOBAL, _STB_WEAK) or other & 3 == _STV_HIDDEN:
                continue
            at = str_offset + name_at
            name = obj[at:obj.index(b"\0", at)].decode("utf-8", "surrogateescape")
            if shndx == _SHN_UNDEF:
                undefined.add(name)
            else:
                (weak if bind == _STB_WEAK or shndx == _SHN_COMMON else strong).append(name)
    return strong, weak, undefined


# What Numba's runtime keeps a function pointer from: an NRT destructor, a generator's
# next function and finalizer, a typed container's method table. A module that calls one
# may hand the runtime a function of its own that runs after Numba drops the module (a
# typed dict returned to Python is destroyed later): it is kept, as MCJIT keeps all.
_KEEPS_FUNCTION_POINTERS = frozenset({
    "NRT_MemInfo_alloc_dtor_safe",
    "NRT_MemInfo_alloc_dtor",
    "NRT_MemInfo_new",
    "NRT_MemInfo_new_varsize_dtor",
    "numba_make_generator",
    "numba_dict_set_method_table",
    "numba_list_set_method_table",
})


class _Linked:
    """One finalized Numba module in Kiln: its library and module, the names it defined
    first, the records it is bound to and how many live records are bound to it."""

    __slots__ = ("library", "module", "defined", "uses", "users", "dropped", "kept")

    def __init__(self, library: int) -> None:
        self.library = library
        self.module: Optional[Module] = None
        self.defined: List[str] = []
        self.uses: Set["_Linked"] = set()
        self.users = 0
        self.dropped = False
        # Never freed: its code may be called through a pointer Numba's runtime holds.
        self.kept = False


class KilnEngine:
    """What ``numba.core.codegen.JitEngine`` offers Numba, over a Kiln :class:`Session`.

    ``target_machine`` is an llvmlite ``TargetMachine`` that emits the objects."""

    def __init__(self, target_machine: Any) -> None:
        self._tm = target_machine
        self._session = Session()
        self._defined_symbols: Set[str] = set()
        self._mappings: Dict[str, int] = {}
        self._pending: List[Any] = []
        # Each name's first definition (its address) and the record defining it: what
        # every later module binds to.
        self._first: Dict[str, int] = {}
        self._owner: Dict[str, _Linked] = {}
        # The record of each finalized module still held by Numba (by the module's id: the
        # finalizer Numba registers holds the module, so the id is not reused before).
        self._linked: Dict[int, _Linked] = {}
        # The record being linked (what the resolver records uses for).
        self._linking: Optional[_Linked] = None
        # Finalizes in progress, and the modules Numba dropped meanwhile (removed after).
        self._finalizing = 0
        self._deferred: List[Any] = []
        self._notify: Optional[Callable[..., Any]] = None
        self._getbuffer: Optional[Callable[..., Any]] = None
        self._count = 0
        self.freed = 0
        self.kept = 0
        self.cache_hits = 0
        self._session.add_session_resolver(self._resolve)

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
        """Numba's object-cache hooks (``cache=True``): ``getbuffer(module)`` may give the
        object a previous process stored for ``module`` (linked instead of compiling), and
        ``notify(module, object)`` is given each object compiled."""
        self._notify = notify
        self._getbuffer = getbuffer

    def _resolve(self, name: str) -> Optional[int]:
        """What a module leaves undefined, as MCJIT resolves it: global mappings, an earlier
        module's first definition (a use of it: kept while this module lives), then
        llvmlite's symbol table and the process (``address_of_symbol``)."""
        address = self._mappings.get(name)
        if address:
            return address
        address = self._first.get(name)
        if address:
            if self._linking is not None:
                self._use(self._linking, self._owner[name])
            return address
        import llvmlite.binding as ll

        return ll.address_of_symbol(name) or None

    def finalize_object(self) -> None:
        """Links every module added since the last finalize, each in a library of its own.
        A library Numba drops meanwhile (the garbage collector runs Numba's finalizers in
        the middle of any Python code, the resolver's included) is removed after."""
        self._finalizing += 1
        try:
            while self._pending:
                self._finalize(self._pending.pop(0))
        finally:
            self._finalizing -= 1
            if not self._finalizing:
                deferred, self._deferred = self._deferred, []
                for module in deferred:
                    self.remove_module(module)

    @staticmethod
    def _use(record: _Linked, owner: _Linked) -> None:
        """Records that ``record`` is bound to ``owner`` (counted at once: ``owner`` cannot
        be freed while ``record`` is being linked)."""
        if owner is not record and owner not in record.uses:
            record.uses.add(owner)
            owner.users += 1

    def _unuse_all(self, record: _Linked) -> None:
        """Drops ``record``'s uses (its link failed, or it was freed)."""
        uses, record.uses = record.uses, set()
        for used in uses:
            used.users -= 1
            self._free(used)

    def _finalize(self, module: Any) -> None:
        self._count += 1
        name = f"numba-{self._count}"
        record = _Linked(self._session.create_library(name))
        library = record.library
        obj = self._getbuffer(module) if self._getbuffer is not None else None
        if obj is not None:
            self.cache_hits += 1
        else:
            obj = self._tm.emit_object(module)
        strong, weak, undefined = _object_symbols(obj)
        record.kept = not undefined.isdisjoint(_KEEPS_FUNCTION_POINTERS)
        self.kept += record.kept
        duplicates = [s for s in strong if s in self._first]
        for symbol in duplicates:
            # Numba reaches the name at its first definition (get_function_address) while
            # this library lives: that module must live as long.
            self._use(record, self._owner[symbol])
        clone = module.clone() if duplicates else None
        if clone is not None and all(_value(clone, s) is not None for s in duplicates):
            # A strong definition an earlier module made first: the copy goes (it is
            # `available_externally` in a clone: Numba links the module's IR into later
            # libraries, so the module itself stays as it is) and the code binds to the
            # first one, as MCJIT's first definition wins.
            import llvmlite.binding as ll

            for symbol in duplicates:
                _value(clone, symbol).linkage = ll.Linkage.available_externally
            linked_obj = self._tm.emit_object(clone)
            strong, weak, _ = _object_symbols(linked_obj)
        else:
            # (An object from the cache has no IR to change: its strong copies stay its
            # own, in its own library, and its code uses them.)
            linked_obj = obj
        for symbol in weak:
            if symbol in self._first:
                # A weak or common copy gives way to the first definition.
                self._use(record, self._owner[symbol])
                self._session.define_symbol(symbol, self._first[symbol], library)
        self._linking = record
        try:
            self._session.add_object(linked_obj, f"{name}.o", library)
            record.module = self._session.link(library)
        except BaseException:
            self._unuse_all(record)
            raise
        finally:
            self._linking = None
        if record.module is not None:
            for symbol in strong + weak:
                if symbol in self._first:
                    continue
                address = record.module.symbol(symbol)
                if address:
                    self._first[symbol] = address
                    self._owner[symbol] = record
                    record.defined.append(symbol)
        self._linked[id(module)] = record
        if self._notify is not None:
            # What a later process links in its place: the whole object (it defines
            # everything it uses, as the module did).
            self._notify(module, obj)

    def remove_module(self, module: Any) -> None:
        """Numba let go of ``module``'s library (the finalizer it registers for what
        ``_add_module`` returns): its Kiln module is removed and its memory returned, now
        or, while live modules are bound to names it defined first, with the last of them."""
        if self._finalizing:
            self._deferred.append(module)
            return
        if any(m is module for m in self._pending):
            self._pending = [m for m in self._pending if m is not module]
            return
        record = self._linked.pop(id(module), None)
        if record is not None:
            record.dropped = True
            self._free(record)

    def _free(self, record: _Linked) -> None:
        """Frees ``record`` if Numba dropped it and nothing live is bound to it, then what it
        was bound to, on the same terms."""
        work = [record]
        while work:
            r = work.pop()
            if not r.dropped or r.kept or r.users > 0 or self._session.closed:
                continue
            for symbol in r.defined:
                if self._owner.get(symbol) is r:
                    del self._owner[symbol]
                    del self._first[symbol]
                    if symbol not in self._mappings:
                        self._defined_symbols.discard(symbol)
            r.defined = []
            if r.module is not None:
                self._session.remove(r.module)
                r.module.release()
                r.module = None
                self.freed += 1
            uses, r.uses = r.uses, set()
            for used in uses:
                used.users -= 1
                work.append(used)

    def get_function_address(self, name: str) -> int:
        """The address of ``name`` (linking what is pending first), or 0."""
        self.finalize_object()
        return self._mappings.get(name) or self._first.get(name, 0)

    get_global_value_address = get_function_address


def _value(module: Any, name: str) -> Any:
    """The function or global variable ``name`` of an llvmlite module, or None."""
    for get in (module.get_function, module.get_global_variable):
        try:
            return get(name)
        except NameError:
            continue
    return None


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
    if cls is None or original is None or not hasattr(cls, "_add_module") or not hasattr(codegen, "JitEngine"):
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
        # Numba's `_init` gave its object-cache hooks to MCJIT's engine: ours takes them.
        self._engine.set_object_cache(self._library_class._object_compiled_hook,
                                      self._library_class._object_getbuffer_hook)

    def _add_module(self: Any, module: Any) -> Any:
        engine = self._engine
        if not isinstance(engine, KilnEngine):
            return original_add_module(self, module)
        engine.add_module(module)
        # Bound to the engine, not the codegen (as Numba's disabled MCJIT line does): the
        # library's finalizer must not keep the codegen alive.
        return functools.partial(engine.remove_module, module)

    original_add_module = cls._add_module
    cls._init = _init
    cls._add_module = _add_module
    _enabled = True


def enable_from_environment() -> bool:
    """:func:`enable` if ``KILN_NUMBA`` is set to ``1`` in the environment; whether it
    did."""
    if os.environ.get(_ENV) == "1":
        enable()
        return True
    return False
