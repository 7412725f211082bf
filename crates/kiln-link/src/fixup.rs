//! Relocation arithmetic: the value each edge asks for (the architecture's row says from
//! what, relative to what, checked how, written how), the GOT's entries and the stubs.

use crate::arch::{self, EncodeError, Relative, Relocation, Target};
use crate::graph::{Allocated, Edge};
use crate::object_file::{ObjSym, SymSection};
use crate::relocatable::{invariant, Binding, FixupRow, ImageFixup};
use crate::symbols::{
    lossy, Def, Linker, Place, ResolvedSymbols, Slot, SymbolId, SEG_BSS, SEG_TLS,
};
use crate::LinkError;
use rustc_hash::FxHashMap;

/// The section an edge patches, as errors name it: its object's name and its own.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Where<'n> {
    pub(crate) object: &'n str,
    pub(crate) section: &'n [u8],
    /// Where the bytes given with it start in the section (a piece of a large section
    /// patched on its own core); offsets in errors are the section's.
    pub(crate) origin: u64,
}

/// Where the module's TLS block is: its module id, and its offset from the thread pointer
/// when it is in static TLS.
#[derive(Debug, Clone, Copy)]
pub(crate) struct TlsPlace {
    pub(crate) module: u64,
    pub(crate) tp_offset: Option<i64>,
}

/// Writes the GOT: addresses, TLS index pairs, thread-pointer offsets, TLS descriptors.
pub(crate) fn write_got(
    got: &mut [u8],
    slot_list: &[Slot],
    resolver: &Resolver<'_, '_>,
    tls: TlsPlace,
    tlsdesc_resolver: u64,
) {
    each_got_entry(
        slot_list,
        resolver,
        tls,
        tlsdesc_resolver,
        None,
        |i, v, _| {
            got[i * 8..i * 8 + 8].copy_from_slice(&v.to_le_bytes());
        },
    );
}

/// Every GOT entry: its index, its value, and — with `base`, the span's start — where
/// the value comes from (`None` without `base`, for a discarded symbol's entry, and for
/// the second word of a TLS index pair, an offset the same everywhere).
pub(crate) fn each_got_entry(
    slot_list: &[Slot],
    resolver: &Resolver<'_, '_>,
    tls: TlsPlace,
    tlsdesc_resolver: u64,
    base: Option<u64>,
    mut entry: impl FnMut(usize, u64, Option<Binding>),
) {
    let tp_off = |key: SymbolId| -> u64 {
        let (offset, _) = resolver.address(key);
        (tls.tp_offset.unwrap_or(0) as u64).wrapping_add(offset)
    };
    let bound = |binding: &dyn Fn(u64) -> Binding| base.map(binding);
    let mut i = 0;
    while i < slot_list.len() {
        match slot_list[i] {
            Slot::Address(key) => {
                let (address, discarded) = resolver.address(key);
                let binding = (!discarded)
                    .then(|| bound(&|base| resolver.binding(key, address, base)))
                    .flatten();
                entry(i, address, binding);
                i += 1;
            }
            Slot::TpOff(key) => {
                let binding = bound(&|_| Binding::TpOff(resolver.address(key).0));
                entry(i, tp_off(key), binding);
                i += 1;
            }
            Slot::TlsGd(key) => {
                entry(i, tls.module, bound(&|_| Binding::DtpMod));
                let offset = resolver.address(key).0;
                let dtv = offset.wrapping_sub(resolver.linker.arch.dtv_offset());
                entry(i + 1, dtv, None);
                i += 2;
            }
            Slot::TlsLd => {
                entry(i, tls.module, bound(&|_| Binding::DtpMod));
                entry(i + 1, 0, None);
                i += 2;
            }
            Slot::TlsDesc(key) => {
                let resolver_at =
                    bound(&|base| Binding::Image(tlsdesc_resolver.wrapping_sub(base)));
                entry(i, tlsdesc_resolver, resolver_at);
                let binding = bound(&|_| Binding::TpOff(resolver.address(key).0));
                entry(i + 1, tp_off(key), binding);
                i += 2;
            }
        }
    }
}

/// Writes the stubs, each jumping to the address in its symbol's GOT entry.
pub(crate) fn write_plt(
    code: &mut [u8],
    stub_list: &[SymbolId],
    slots: &FxHashMap<Slot, u64>,
    resolver: &Resolver<'_, '_>,
    plt_offset: u64,
) -> Result<(), LinkError> {
    let arch = resolver.linker.arch;
    let size = arch.stub_size();
    for (n, key) in stub_list.iter().enumerate() {
        let slot = slots[&Slot::Address(*key)];
        let stub_addr = resolver.plt_base + n as u64 * size;
        let at = (plt_offset + n as u64 * size) as usize;
        let stub = &mut code[at..at + size as usize];
        arch.write_stub(stub, stub_addr, resolver.got_base + slot * 8)
            .map_err(|value| LinkError::Overflow {
                object: "<plt>".into(),
                section: ".plt".into(),
                offset: n as u64 * size,
                kind: "PLT stub",
                symbol: lossy(resolver.name(*key)),
                value,
                bits: 32,
                hint: "",
            })?;
    }
    Ok(())
}

/// Computes addresses once the segments have their target addresses.
#[derive(Clone)]
pub(crate) struct Resolver<'l, 'a> {
    pub(crate) linker: ResolvedSymbols<'l, 'a>,
    pub(crate) bases: [u64; 4],
    pub(crate) image_base: u64,
    pub(crate) got_base: u64,
    pub(crate) plt_base: u64,
    pub(crate) dso_handle: u64,
    pub(crate) stubs: &'l FxHashMap<SymbolId, u64>,
    /// A relocatable link's (see [`crate::relocatable`]): calls of host functions go
    /// through their stubs, so that the code needs no fixup.
    pub(crate) relocatable: bool,
    /// Whether the edges applied are the TLS image's (whose addresses are offsets in the
    /// block, not in the span).
    pub(crate) tls_image: bool,
}

impl<'l, 'a> Resolver<'l, 'a> {
    /// A resolver for `linker`'s symbols in `allocated` memory.
    pub(crate) fn new<'c>(
        linker: &'l Linker<'a, 'c>,
        allocated: &Allocated,
        stubs: &'l FxHashMap<SymbolId, u64>,
    ) -> Self {
        Resolver {
            linker: linker.resolved(),
            bases: allocated.bases,
            image_base: allocated.image_base,
            got_base: allocated.got_base,
            plt_base: allocated.plt_base,
            dso_handle: allocated.dso_handle,
            stubs,
            relocatable: false,
            tls_image: false,
        }
    }

    /// The same resolver, for a relocatable link's edges if `relocatable`.
    pub(crate) fn relocatable(mut self, relocatable: bool) -> Self {
        self.relocatable = relocatable;
        self
    }

    /// Where `key`'s address `s` comes from, for a fixup.
    pub(crate) fn binding(&self, key: SymbolId, s: u64, base: u64) -> Binding {
        let by_section =
            |obj: u32, sym: u32| match self.linker.objs[obj as usize].symbols[sym as usize].section
            {
                SymSection::Section(_) => Binding::Image(s.wrapping_sub(base)),
                _ => Binding::Absolute(s),
            };
        match key {
            SymbolId::Local(o, sym) => by_section(o, sym),
            SymbolId::Global(g) => match self.linker.globals[g as usize].def {
                Def::Defined { obj, sym, .. } => by_section(obj, sym),
                Def::Common { .. } | Def::GotBase | Def::DsoHandle => {
                    Binding::Image(s.wrapping_sub(base))
                }
                Def::External(_) => Binding::Symbol(lossy(self.name(key)).into()),
                Def::None | Def::Zero | Def::TlsModuleBase => Binding::Absolute(s),
            },
        }
    }

    /// The fixup of the field at `field` (a target address) of `row` if its value
    /// `binding` gives depends on where the span is or on the process (`None` if not); an
    /// error saying why if such a field cannot be written again.
    #[allow(clippy::too_many_arguments)]
    fn fixup_for(
        &self,
        base: u64,
        at: Where<'_>,
        field: u64,
        p: u64,
        row: &Relocation,
        binding: Binding,
        addend: i64,
        stub: Option<u64>,
    ) -> Option<Result<ImageFixup, String>> {
        if invariant(&binding, row.relative, row.field) {
            return None;
        }
        let fixup = FixupRow::of(row);
        let refuse = |why: &str| {
            Some(Err(format!(
                "{} in {} section {} at {:#x} ({binding:?}): {why}",
                row.name,
                at.object,
                lossy(at.section),
                field
            )))
        };
        if self.tls_image {
            refuse("a thread-local initialized with an address")
        } else if fixup.in_place() {
            refuse("a field changed in place cannot be written again")
        } else if row.relative == Relative::GotBase {
            refuse("GOT-relative to a value of the process")
        } else if row.relative == Relative::ImageBase {
            refuse("image-relative to a value of the process")
        } else {
            Some(Ok(ImageFixup {
                at: field.wrapping_sub(base),
                place: p.wrapping_sub(base),
                row: fixup,
                binding,
                addend,
                stub: stub.map(|s| s.wrapping_sub(base)),
            }))
        }
    }

    /// The fixup a relocatable link keeps of `edge` (see [`crate::relocatable`]), the
    /// span starting at `base`: `None` when the value [`Resolver::apply`] wrote is the
    /// same wherever the span is mapped, in any process; an error (why the module cannot
    /// be an image) when it is not and cannot be written again. Asked after the edges
    /// were applied: of the same addresses, stubs and GOT entries. (A GOT load `apply`
    /// relaxed into a direct reference is PC-relative either way: no fixup.)
    pub(crate) fn image_fixup(
        &self,
        at: Where<'_>,
        section_addr: u64,
        edge: &Edge,
        slots: &FxHashMap<Slot, u64>,
        base: u64,
    ) -> Option<Result<ImageFixup, String>> {
        let (offset, addend, key) = (edge.offset, edge.addend, edge.key);
        let row = edge.row;
        // Most edges first: PC-relative to the span's own GOT entries, or to what the
        // module defines (not through a stub): the same wherever the span is.
        let pc_relative = row.relative != Relative::Absolute;
        match row.target {
            Target::GotEntry
            | Target::GotBase
            | Target::TlsGdEntry
            | Target::TlsLdEntry
            | Target::TpOffEntry
            | Target::TlsDescEntry
                if pc_relative =>
            {
                return None
            }
            Target::Symbol | Target::Call
                if pc_relative && !self.stubs.contains_key(&key) && self.is_defined_here(key) =>
            {
                return None
            }
            _ => {}
        }
        let field = section_addr + offset;
        let p = field.wrapping_add(edge.place_delta as i64 as u64);
        let (s, discarded) = self.address(key);
        let slot_addr = |slot: Slot| self.got_base + slots.get(&slot).copied().unwrap_or(0) * 8;
        let image = |address: u64| Binding::Image(address.wrapping_sub(base));
        let mut stub = None;
        let binding = match row.target {
            Target::DtpMod => Binding::DtpMod,
            _ if discarded => return None,
            Target::Symbol | Target::Call => match self.via_stub(row, key, s, addend, p) {
                Some(via) => image(via),
                None => {
                    stub = self.stubs.get(&key).map(|&n| self.stub_address(n));
                    self.binding(key, s, base)
                }
            },
            Target::Plt => match self.stubs.get(&key) {
                Some(&n) => image(self.stub_address(n)),
                None => self.binding(key, s, base),
            },
            Target::GotEntry => image(slot_addr(Slot::Address(key))),
            Target::GotBase => image(self.got_base),
            Target::TlsGdEntry => image(slot_addr(Slot::TlsGd(key))),
            Target::TlsLdEntry => image(slot_addr(Slot::TlsLd)),
            Target::TpOffEntry => image(slot_addr(Slot::TpOff(key))),
            Target::TlsDescEntry => image(slot_addr(Slot::TlsDesc(key))),
            Target::TpOff => Binding::TpOff(s),
            _ => return None,
        };
        self.fixup_for(base, at, field, p, row, binding, addend, stub)
    }

    /// The stub a reference to `key` (whose address is `s`) goes through: in a
    /// relocatable link every call of a host function does (the code then needs no
    /// fixup: the stub jumps through the GOT); else one whose target the instruction does
    /// not reach.
    fn via_stub(
        &self,
        row: &Relocation,
        key: SymbolId,
        s: u64,
        addend: i64,
        p: u64,
    ) -> Option<u64> {
        let &n = self.stubs.get(&key)?;
        let prefer = self.relocatable && row.target == Target::Call && self.is_external(key);
        let value = self.formula(row, s as i128, addend as i128, p);
        (prefer || !self.linker.arch.reaches(row, value, s, addend, p))
            .then(|| self.stub_address(n))
    }

    /// The relocation's formula: `t + a`, relative to what its row says.
    fn formula(&self, row: &Relocation, t: i128, a: i128, p: u64) -> i128 {
        match row.relative {
            Relative::Absolute => t + a,
            Relative::Place => t + a - p as i128,
            Relative::Page => ((t + a) & !0xfff) - (p & !0xfff) as i128,
            Relative::GotBase => t + a - self.got_base as i128,
            Relative::ImageBase => t + a - self.image_base as i128,
        }
    }

    pub(crate) fn name(&self, key: SymbolId) -> &'l [u8] {
        self.linker.name(key)
    }

    /// Address of an object's symbol (a TLS offset for thread-locals), and whether its
    /// section was discarded.
    pub(crate) fn sym_address(&self, obj: u32, sym: &ObjSym<'_>) -> (u64, bool) {
        match sym.section {
            SymSection::Section(i) => {
                match self.linker.places[obj as usize][i as usize] {
                    Place::Unplaced | Place::Discarded => (0, true),
                    Place::At { seg, offset } if seg == SEG_TLS => {
                        (offset.wrapping_add(sym.value), false)
                    }
                    Place::At { seg, offset } => {
                        // Modulo 2^64 like any address; fields that cannot hold the result
                        // are caught when relocations are applied.
                        let base = self.bases[seg as usize].wrapping_add(offset);
                        (base.wrapping_add(sym.value), false)
                    }
                }
            }
            SymSection::Absolute => (sym.value, false),
            _ => (0, false),
        }
    }

    /// Address of a relocation target, and whether it lies in a discarded section.
    pub(crate) fn address(&self, key: SymbolId) -> (u64, bool) {
        match key {
            SymbolId::Local(o, s) => {
                let sym = &self.linker.objs[o as usize].symbols[s as usize];
                self.sym_address(o, sym)
            }
            SymbolId::Global(g) => match self.linker.globals[g as usize].def {
                Def::Defined { obj, sym, .. } => {
                    let s = &self.linker.objs[obj as usize].symbols[sym as usize];
                    self.sym_address(obj, s)
                }
                Def::Common { .. } => (
                    self.bases[SEG_BSS] + self.linker.globals[g as usize].common_place,
                    false,
                ),
                Def::External(a) => (a, false),
                Def::None | Def::Zero => (0, false),
                Def::GotBase => (self.got_base, false),
                Def::DsoHandle => (self.dso_handle, false),
                Def::TlsModuleBase => (0, false),
            },
        }
    }

    fn size(&self, key: SymbolId) -> u64 {
        match key {
            SymbolId::Local(o, s) => self.linker.objs[o as usize].symbols[s as usize].size,
            SymbolId::Global(g) => match self.linker.globals[g as usize].def {
                Def::Defined { obj, sym, .. } => {
                    self.linker.objs[obj as usize].symbols[sym as usize].size
                }
                Def::Common { size, .. } => size,
                _ => 0,
            },
        }
    }

    fn is_tls(&self, key: SymbolId) -> bool {
        match key {
            SymbolId::Local(o, s) => self.linker.objs[o as usize].symbols[s as usize].is_tls(),
            SymbolId::Global(g) => self.linker.globals[g as usize].tls,
        }
    }

    fn is_external(&self, key: SymbolId) -> bool {
        matches!(key, SymbolId::Global(g) if matches!(self.linker.globals[g as usize].def, Def::External(_)))
    }

    /// Applies one edge to its section's bytes (`bytes`, at target address
    /// `section_addr`).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn apply(
        &self,
        at: Where<'_>,
        bytes: &mut [u8],
        section_addr: u64,
        edge: &Edge,
        slots: &FxHashMap<Slot, u64>,
        tls: TlsPlace,
    ) -> Result<(), LinkError> {
        let (offset, addend, key) = (edge.offset, edge.addend, edge.key);
        let r_type = edge.row.r_type;
        let err_bad = |what: String| LinkError::BadRelocation {
            object: at.object.to_string(),
            section: lossy(at.section),
            offset: offset + at.origin,
            what,
        };
        let arch = self.linker.arch;
        let mut row = edge.row;
        let width = row.field.len();
        if offset
            .checked_add(width)
            .is_none_or(|end| end > bytes.len() as u64)
        {
            return Err(err_bad(format!(
                "{} of {width} bytes does not fit the section ({} bytes)",
                row.name,
                bytes.len() as u64 + at.origin
            )));
        }
        let (s, discarded) = self.address(key);
        let mut offset = offset;
        // A paired low part's P is its high part's.
        let mut p = (section_addr + offset).wrapping_add(edge.place_delta as i64 as u64);
        let a = addend as i128;
        let slot_addr =
            |slot: Slot| -> u64 { self.got_base + slots.get(&slot).copied().unwrap_or(0) * 8 };
        let symbol_name = || lossy(self.name(key));
        let reloc_offset = offset;
        let unsupported_tls = |model: &'static str| LinkError::UnsupportedTls {
            object: at.object.to_string(),
            section: lossy(at.section),
            offset: reloc_offset + at.origin,
            symbol: symbol_name(),
            model,
        };
        // A GOT load of a symbol this module defines, near enough for a direct reference,
        // becomes that reference where the instruction allows it (x86-64 GOTPCRELX).
        if row.target == Target::GotEntry && !discarded && self.is_defined_here(key) {
            let direct = s as i128 + a - p as i128;
            if i32::try_from(direct).is_ok() {
                if let Some((relaxed, at)) = arch.relax_got(r_type, bytes, offset) {
                    row = relaxed;
                    offset = at;
                    p = section_addr + offset;
                }
            }
        }
        let tls_checked = |model: &'static str| -> Result<(), LinkError> {
            if !self.is_tls(key) || self.is_external(key) {
                Err(unsupported_tls(model))
            } else {
                Ok(())
            }
        };
        // COFF's section-relative offsets: a thread-local's in its block; any other is
        // debug information's, never loaded.
        if row.target == Target::TpOff && row.name == "IMAGE_REL_AMD64_SECREL" && !self.is_tls(key)
        {
            return Err(err_bad(format!(
                "IMAGE_REL_AMD64_SECREL to '{}', which is no thread-local: section-relative offsets are supported for thread-locals only (debug information is not loaded)",
                symbol_name()
            )));
        }
        // T, the value the formula starts from.
        let t: i128 = match row.target {
            Target::Nothing => return Ok(()),
            Target::Symbol | Target::Call => s as i128,
            Target::GotEntry => slot_addr(Slot::Address(key)) as i128,
            Target::GotBase => self.got_base as i128,
            Target::Plt => match self.stubs.get(&key) {
                Some(&n) => self.stub_address(n) as i128,
                None => s as i128,
            },
            Target::Size => self.size(key) as i128,
            Target::TlsGdEntry => {
                tls_checked("general-dynamic access to a host (not JIT) thread-local")?;
                slot_addr(Slot::TlsGd(key)) as i128
            }
            Target::TlsLdEntry => slot_addr(Slot::TlsLd) as i128,
            Target::TpOffEntry => {
                tls_checked("initial-exec access to a host (not JIT) thread-local")?;
                slot_addr(Slot::TpOff(key)) as i128
            }
            Target::TlsDescEntry => {
                tls_checked("TLS-descriptor access to a host (not JIT) thread-local")?;
                slot_addr(Slot::TlsDesc(key)) as i128
            }
            Target::TpOff => {
                tls_checked("local-exec access to a host (not JIT) thread-local")?;
                match tls.tp_offset {
                    Some(tp) => i128::from(tp) + s as i128,
                    None => return Err(unsupported_tls("local-exec (in a TLS initializer)")),
                }
            }
            Target::DtpOff => s as i128 - i128::from(arch.dtv_offset()),
            Target::DtpMod => {
                return self.write(at, bytes, offset, row, tls.module as i128, key, false);
            }
            Target::Unsupported(model) => {
                tls_checked(model)?;
                return Err(unsupported_tls(model));
            }
            // Replaced by its partner's row when the edges were decoded.
            Target::Partner => return Err(err_bad(format!("{} without its high part", row.name))),
        };
        let mut value = self.formula(row, t, a, p);
        // A function out of the instruction's reach is reached through its stub (in a
        // relocatable link, every call of a host function is).
        if matches!(row.target, Target::Symbol | Target::Call) {
            if let Some(stub) = self.via_stub(row, key, s, addend, p) {
                value = self.formula(row, stub as i128, a, p);
            }
        }
        self.write(at, bytes, offset, row, value, key, discarded)
    }

    pub(crate) fn stub_address(&self, n: u64) -> u64 {
        self.plt_base + n * self.linker.arch.stub_size()
    }

    /// Whether `key` is defined by this link's objects (not a host's or another
    /// module's symbol, not absolute, not undefined).
    fn is_defined_here(&self, key: SymbolId) -> bool {
        let defined = |obj: u32, sym: u32| {
            matches!(
                self.linker.objs[obj as usize].symbols[sym as usize].section,
                SymSection::Section(_)
            )
        };
        match key {
            SymbolId::Local(o, s) => defined(o, s),
            SymbolId::Global(g) => match self.linker.globals[g as usize].def {
                Def::Defined { obj, sym, .. } => defined(obj, sym),
                Def::Common { .. } => true,
                _ => false,
            },
        }
    }

    /// Writes `value` into the relocation's field, or says why it cannot.
    #[allow(clippy::too_many_arguments)]
    fn write(
        &self,
        at: Where<'_>,
        bytes: &mut [u8],
        offset: u64,
        row: &Relocation,
        value: i128,
        key: SymbolId,
        discarded: bool,
    ) -> Result<(), LinkError> {
        // A reference from a discarded COMDAT copy's leftovers is written truncated: the
        // copy is never run.
        let check = if discarded {
            arch::Check::None
        } else {
            row.check
        };
        let field = &mut bytes[offset as usize..];
        match arch::encode(row.field, check, value, field) {
            Ok(()) => Ok(()),
            Err(EncodeError::Misaligned(align)) => Err(LinkError::Misaligned {
                object: at.object.to_string(),
                section: lossy(at.section),
                offset: offset + at.origin,
                kind: row.name,
                symbol: lossy(self.name(key)),
                value,
                align,
            }),
            Err(EncodeError::Range) => Err(LinkError::Overflow {
                object: at.object.to_string(),
                section: lossy(at.section),
                offset: offset + at.origin,
                kind: row.name,
                symbol: lossy(self.name(key)),
                value,
                bits: row.check.bits(),
                hint: self.overflow_hint(row, key),
            }),
        }
    }

    /// What the user can do about a value that does not fit.
    fn overflow_hint(&self, row: &Relocation, key: SymbolId) -> &'static str {
        match (row.target, row.relative) {
            (Target::Symbol, Relative::Absolute) if row.needs_low_memory() && self.is_external(key) => {
                "; the symbol is in a shared library, far above the low 4 GiB. Non-PIC code (-fno-pic) refers to data with 32-bit absolute addresses, expecting a copy of it in the executable (a copy relocation, which a JIT cannot make). Compile with -fPIE or -fPIC"
            }
            (Target::Symbol, Relative::Absolute) if row.needs_low_memory() => {
                "; non-PIC code (-fno-pic, -mcmodel=kernel) needs its code and data in the low 2 GiB of the address space. Compile with -fPIE or -fPIC (from the Rust API, a session can be given low memory: JitBuilder::low_memory)"
            }
            (Target::Symbol, Relative::Place | Relative::Page) if self.is_external(key) => {
                "; the symbol (a host symbol, or an absolute definition such as --defsym) is more than 2 GiB from this code. Code compiled as a position-independent executable (-fPIE, gcc's default) or without PIC refers to data it does not define directly, expecting it in the executable (a copy relocation, which a JIT cannot make). Compile with -fPIC: such references then go through the GOT, which reaches any address"
            }
            (Target::Call, _) => {
                "; the branch reaches neither its target nor a stub: the module's code is larger than a branch reaches"
            }
            _ => "",
        }
    }
}
