//! Symbol resolution: objects added one by one (COMDAT groups kept once, strong over
//! weak, commons merged), archive members loaded for what is undefined, and the rest asked
//! of the link's context. The result is the symbol side of the link graph: every object's
//! sections with their future place, and every global with its definition.

use crate::arch::Arch;
use crate::object_file::{
    Binding, ObjectFile, SymSection, SHF_ALLOC, SHF_EXCLUDE, SHF_EXECINSTR, SHF_TLS, SHF_WRITE,
    SHT_FINI_ARRAY, SHT_GROUP, SHT_INIT_ARRAY, SHT_NOBITS, SHT_NOTE, SHT_PREINIT_ARRAY,
};
use crate::{ArchiveInput, LinkContext, LinkError, MissingSymbol, MissingSymbols};
use rustc_hash::{FxHashMap, FxHashSet};

pub(crate) const SEG_RX: usize = 0;
pub(crate) const SEG_R: usize = 1;
pub(crate) const SEG_RW: usize = 2;
pub(crate) const SEG_BSS: usize = 3;
pub(crate) const SEG_TLS: u8 = 4;

/// Where a section of an input object lies in the module.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Place {
    /// Not placed: not loaded (debug information, notes), or `.eh_frame` until layout
    /// reaches the end of the constants.
    Unplaced,
    /// A COMDAT member whose group another object's copy already provides.
    Discarded,
    /// In segment `seg` (`SEG_RX`..`SEG_BSS`, or `SEG_TLS` for the thread-local image)
    /// at `offset`.
    At { seg: u8, offset: u64 },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Def {
    None,
    Defined { obj: u32, sym: u32, weak: bool },
    Common { size: u64, align: u64 },
    External(u64),
    Zero,
    GotBase,
    DsoHandle,
    TlsModuleBase,
}

#[derive(Debug)]
pub(crate) struct Global<'a> {
    pub(crate) name: &'a [u8],
    pub(crate) def: Def,
    /// For externals: whether the host symbol is a function.
    pub(crate) external_function: Option<crate::SymbolKind>,
    pub(crate) first_ref: Option<u32>,
    pub(crate) strong_ref: bool,
    pub(crate) tls: bool,
    pub(crate) func: bool,
    pub(crate) common_place: u64,
}

/// A symbol of the link graph, what an edge targets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum SymbolId {
    /// A global symbol, by index into [`Linker::globals`] (one per name in the link).
    Global(u32),
    /// A local symbol: (object, symbol index in its symbol table).
    Local(u32, u32),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Slot {
    Address(SymbolId),
    TlsGd(SymbolId),
    TlsLd,
    /// A thread-local's offset from the thread pointer (initial-exec).
    TpOff(SymbolId),
    /// A TLS descriptor: resolver, argument.
    TlsDesc(SymbolId),
}

pub(crate) struct Linker<'a, 'c> {
    /// The objects: the inputs' parses (borrowed when [`crate::ObjectInput::check`] kept
    /// one) and the archive members loaded.
    pub(crate) objs: Vec<std::borrow::Cow<'a, ObjectFile<'a>>>,
    pub(crate) places: Vec<Vec<Place>>,
    /// Per object, per symbol: the global it binds to (u32::MAX for locals).
    pub(crate) sym_globals: Vec<Vec<u32>>,
    pub(crate) globals: Vec<Global<'a>>,
    pub(crate) global_index: FxHashMap<&'a [u8], u32>,
    pub(crate) comdats: FxHashSet<&'a [u8]>,
    pub(crate) pending: Vec<u32>,
    pub(crate) archives: &'a [ArchiveInput],
    pub(crate) loaded_members: FxHashSet<(usize, u64)>,
    /// Per object: where it came from (for [`crate::LinkedModule::objects`]).
    pub(crate) origins: Vec<Origin>,
    pub(crate) arch: &'static dyn Arch,
    pub(crate) ctx: &'c mut dyn LinkContext,
    /// Globals whose references go through a call-through stub
    /// ([`LinkContext::called_through`]): (global, object, symbol) of the definition that
    /// stays in the module, sorted by global.
    pub(crate) routed: Vec<(u32, u32, u32)>,
}

/// Where a linked object came from.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Origin {
    /// The link's objects, by index.
    Input(usize),
    /// An archive's member: (archive index, member header offset).
    Member(usize, u64),
}

pub(crate) fn lossy(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

impl<'a, 'c> Linker<'a, 'c> {
    /// An empty link of `archives`' members as needed, for `arch`, asking `ctx`.
    pub(crate) fn new(
        archives: &'a [ArchiveInput],
        arch: &'static dyn Arch,
        ctx: &'c mut dyn LinkContext,
    ) -> Self {
        Linker {
            objs: Vec::new(),
            places: Vec::new(),
            sym_globals: Vec::new(),
            globals: Vec::new(),
            global_index: FxHashMap::default(),
            comdats: FxHashSet::default(),
            pending: Vec::new(),
            archives,
            loaded_members: FxHashSet::default(),
            origins: Vec::new(),
            arch,
            ctx,
            routed: Vec::new(),
        }
    }

    pub(crate) fn add_object(
        &mut self,
        obj: std::borrow::Cow<'a, ObjectFile<'a>>,
    ) -> Result<(), LinkError> {
        let obj_index = self.objs.len() as u32;
        let mut places = vec![Place::Unplaced; obj.sections.len()];
        let mut discarded = vec![false; obj.sections.len()];
        for (signature, members) in &obj.groups {
            if !self.comdats.insert(signature) {
                for &m in members {
                    discarded[m as usize] = true;
                }
            }
        }
        // Sections stay unplaced until layout; discarded ones are marked now.
        for (i, d) in discarded.iter().enumerate() {
            if *d {
                places[i] = Place::Discarded;
            }
        }
        let mut sym_globals = vec![u32::MAX; obj.symbols.len()];
        for (i, sym) in obj.symbols.iter().enumerate().skip(1) {
            if sym.binding == Binding::Local {
                continue;
            }
            let id = match self.global_index.get(sym.name) {
                Some(&id) => id,
                None => {
                    let id = self.globals.len() as u32;
                    self.globals.push(Global {
                        name: sym.name,
                        def: Def::None,
                        external_function: None,
                        first_ref: None,
                        strong_ref: false,
                        tls: false,
                        func: false,
                        common_place: 0,
                    });
                    self.global_index.insert(sym.name, id);
                    id
                }
            };
            sym_globals[i] = id;
            let in_discarded =
                matches!(sym.section, SymSection::Section(s) if discarded[s as usize]);
            let g = &mut self.globals[id as usize];
            g.tls |= sym.is_tls();
            g.func |= sym.is_func();
            match sym.section {
                SymSection::Undefined => {
                    if g.first_ref.is_none() {
                        g.first_ref = Some(obj_index);
                    }
                    if sym.binding == Binding::Global && !g.strong_ref {
                        g.strong_ref = true;
                        if g.def == Def::None {
                            self.pending.push(id);
                        }
                    }
                }
                _ if in_discarded => {
                    // Defined in a COMDAT copy that is not kept: the kept copy defines it.
                    if g.first_ref.is_none() {
                        g.first_ref = Some(obj_index);
                    }
                }
                SymSection::Common => match g.def {
                    Def::None | Def::Zero => {
                        g.def = Def::Common {
                            size: sym.size,
                            align: sym.value.max(1),
                        }
                    }
                    Def::Common { size, align } => {
                        g.def = Def::Common {
                            size: size.max(sym.size),
                            align: align.max(sym.value.max(1)),
                        }
                    }
                    _ => {}
                },
                SymSection::Absolute | SymSection::Section(_) => {
                    let weak = sym.binding == Binding::Weak;
                    match g.def {
                        Def::Defined {
                            obj: other,
                            weak: false,
                            ..
                        } if !weak => {
                            return Err(LinkError::DuplicateSymbol {
                                symbol: lossy(sym.name),
                                // Both may be in this object (not yet in `objs`).
                                first: self
                                    .objs
                                    .get(other as usize)
                                    .map_or_else(|| obj.name.to_string(), |o| o.name.to_string()),
                                second: obj.name.to_string(),
                            });
                        }
                        Def::Defined { weak: false, .. } => {}
                        Def::Defined { weak: true, .. } if weak => {}
                        _ => {
                            g.def = Def::Defined {
                                obj: obj_index,
                                sym: i as u32,
                                weak,
                            }
                        }
                    }
                }
            }
        }
        self.objs.push(obj);
        self.places.push(places);
        self.sym_globals.push(sym_globals);
        Ok(())
    }

    /// Loads archive members for undefined symbols until none can be found; names that
    /// earlier links define ([`LinkContext::resolve_defined`]) are taken from them instead.
    pub(crate) fn load_archive_members(&mut self) -> Result<(), LinkError> {
        loop {
            // Ask about every name still undefined at once.
            let batch: smallvec::SmallVec<[u32; 16]> = self
                .pending
                .iter()
                .copied()
                .filter(|&id| self.globals[id as usize].def == Def::None)
                .collect();
            if batch.is_empty() {
                self.pending.clear();
                return Ok(());
            }
            let names: smallvec::SmallVec<[std::borrow::Cow<'a, str>; 16]> = batch
                .iter()
                .map(|&id| String::from_utf8_lossy(self.globals[id as usize].name))
                .collect();
            let refs: smallvec::SmallVec<[&str; 16]> = names.iter().map(|n| &**n).collect();
            let found = self.ctx.resolve_defined(&refs);
            for (&id, address) in batch.iter().zip(found) {
                if let Some(address) = address {
                    self.globals[id as usize].def = Def::External(address);
                }
            }
            self.load_members_for_pending()?;
            if self.pending.is_empty() {
                return Ok(());
            }
        }
    }

    /// One pass of archive loading over the pending names (members may add more).
    pub(crate) fn load_members_for_pending(&mut self) -> Result<(), LinkError> {
        let pending = std::mem::take(&mut self.pending);
        for id in pending.into_iter().rev() {
            if self.globals[id as usize].def != Def::None {
                continue;
            }
            let name = self.globals[id as usize].name;
            let archives = self.archives;
            'archives: for (ai, archive) in archives.iter().enumerate() {
                for &offset in archive.definers(name)? {
                    if self.loaded_members.insert((ai, offset)) {
                        let (member_name, data) = archive.member(offset)?;
                        let obj = ObjectFile::parse(member_name, data, self.arch.architecture())?;
                        self.origins.push(Origin::Member(ai, offset));
                        self.add_object(std::borrow::Cow::Owned(obj))?;
                    }
                    if self.globals[id as usize].def != Def::None {
                        break 'archives;
                    }
                }
            }
        }
        Ok(())
    }

    /// References to the inputs' own functions that the context routes through stubs
    /// ([`LinkContext::called_through`]) bind to those; the definitions stay, listed in
    /// [`Linker::routed`].
    pub(crate) fn route_calls_through_stubs(&mut self) {
        if !self.ctx.routes_calls() {
            return;
        }
        let functions: Vec<(u32, u32, u32)> = self
            .globals
            .iter()
            .enumerate()
            .filter_map(|(id, g)| match g.def {
                Def::Defined { obj, sym, .. } if !g.tls => {
                    let s = &self.objs[obj as usize].symbols[sym as usize];
                    let exported = s.visibility == object::elf::STV_DEFAULT.0
                        || s.visibility == object::elf::STV_PROTECTED.0;
                    // Not an indirect function: its symbol is its resolver.
                    let function = s.kind == object::elf::STT_FUNC.0;
                    (exported && function).then_some((id as u32, obj, sym))
                }
                _ => None,
            })
            .collect();
        if functions.is_empty() {
            return;
        }
        let names: Vec<std::borrow::Cow<'a, str>> = functions
            .iter()
            .map(|&(id, _, _)| String::from_utf8_lossy(self.globals[id as usize].name))
            .collect();
        let refs: Vec<&str> = names.iter().map(|n| &**n).collect();
        let found = self.ctx.called_through(&refs);
        for (&(id, obj, sym), address) in functions.iter().zip(found) {
            if let Some(address) = address {
                self.globals[id as usize].def = Def::External(address);
                self.routed.push((id, obj, sym));
            }
        }
    }

    /// Weak definitions and common symbols of the inputs that the link's namespace defines
    /// already ([`LinkContext::defined_here`]) bind to that definition: a weak copy stays
    /// in the module, unused and not exported; a common one takes no room. Hidden and
    /// thread-local ones stay the module's.
    pub(crate) fn yield_weak_definitions(&mut self) {
        let weak: Vec<u32> = self
            .globals
            .iter()
            .enumerate()
            .filter(|(_, g)| match g.def {
                Def::Defined {
                    obj,
                    sym,
                    weak: true,
                } if !g.tls => {
                    let s = &self.objs[obj as usize].symbols[sym as usize];
                    s.visibility == object::elf::STV_DEFAULT.0
                        || s.visibility == object::elf::STV_PROTECTED.0
                }
                // A common symbol (`int x;` built with -fcommon, LLVM's `common` globals)
                // gives way to a definition as a weak one does.
                Def::Common { .. } => !g.tls,
                _ => false,
            })
            .map(|(id, _)| id as u32)
            .collect();
        if weak.is_empty() {
            return;
        }
        let names: Vec<std::borrow::Cow<'a, str>> = weak
            .iter()
            .map(|&id| String::from_utf8_lossy(self.globals[id as usize].name))
            .collect();
        let refs: Vec<&str> = names.iter().map(|n| &**n).collect();
        let found = self.ctx.defined_here(&refs);
        for (&id, address) in weak.iter().zip(found) {
            if let Some(address) = address {
                self.globals[id as usize].def = Def::External(address);
            }
        }
    }

    /// Resolves what the inputs do not define through the context; lists what nobody
    /// defines.
    pub(crate) fn resolve_externals(&mut self) -> Result<(), LinkError> {
        let mut missing = Vec::new();
        // Everything the inputs leave undefined, asked for in one batch.
        let mut wanted: Vec<u32> = Vec::new();
        for (id, g) in self.globals.iter_mut().enumerate() {
            if g.def != Def::None {
                continue;
            }
            match g.name {
                b"_GLOBAL_OFFSET_TABLE_" => g.def = Def::GotBase,
                b"__dso_handle" => g.def = Def::DsoHandle,
                // The start of the module's own TLS block (TLS-descriptor code reaches its
                // local thread-locals as this plus their DTPOFF).
                b"_TLS_MODULE_BASE_" => {
                    g.def = Def::TlsModuleBase;
                    g.tls = true;
                }
                _ => wanted.push(id as u32),
            }
        }
        if wanted.is_empty() {
            return Ok(());
        }
        // Names borrowed from the inputs (copied only if not UTF-8).
        let names: Vec<std::borrow::Cow<'a, str>> = wanted
            .iter()
            .map(|&id| String::from_utf8_lossy(self.globals[id as usize].name))
            .collect();
        let refs: Vec<&str> = names.iter().map(|n| &**n).collect();
        let found = self.ctx.resolve_many(&refs);
        for (&id, address) in wanted.iter().zip(found) {
            let g = &mut self.globals[id as usize];
            g.def = match address {
                // Whether it is a function is asked later, only for the few symbols
                // whose address non-PIC code takes (a `dladdr` each).
                Some(addr) => Def::External(addr),
                None if !g.strong_ref => Def::Zero,
                None => {
                    if let Some(obj) = g.first_ref {
                        missing.push(MissingSymbol {
                            symbol: lossy(g.name),
                            wanted_by: self.objs[obj as usize].name.to_string(),
                        });
                    }
                    Def::Zero
                }
            };
        }
        if missing.is_empty() {
            Ok(())
        } else {
            missing.sort_by(|a, b| a.symbol.cmp(&b.symbol));
            Err(LinkError::UndefinedSymbols {
                symbols: MissingSymbols(missing),
            })
        }
    }

    /// A symbol's name for messages (a section symbol's is its section's).
    pub(crate) fn name(&self, key: SymbolId) -> &[u8] {
        self.resolved().name(key)
    }

    pub(crate) fn key(&self, obj: u32, sym: u32) -> SymbolId {
        self.resolved().key(obj, sym)
    }

    /// What the passes after resolution read of the symbols, without the link's context:
    /// shared by the threads of a parallel pass.
    pub(crate) fn resolved(&self) -> ResolvedSymbols<'_, 'a> {
        ResolvedSymbols {
            objs: &self.objs,
            places: &self.places,
            sym_globals: &self.sym_globals,
            globals: &self.globals,
            arch: self.arch,
        }
    }
}

/// The link's objects, the places of their sections and their symbols' bindings, once
/// resolved: what the passes read (and threads share: the link's context is not here).
#[derive(Clone, Copy)]
pub(crate) struct ResolvedSymbols<'l, 'a> {
    pub(crate) objs: &'l [std::borrow::Cow<'a, ObjectFile<'a>>],
    pub(crate) places: &'l [Vec<Place>],
    pub(crate) sym_globals: &'l [Vec<u32>],
    pub(crate) globals: &'l [Global<'a>],
    pub(crate) arch: &'static dyn Arch,
}

impl<'l, 'a> ResolvedSymbols<'l, 'a> {
    /// The name of `key` (a section symbol's is its section's).
    pub(crate) fn name(&self, key: SymbolId) -> &'l [u8] {
        match key {
            SymbolId::Global(g) => self.globals[g as usize].name,
            SymbolId::Local(o, s) => {
                let sym = &self.objs[o as usize].symbols[s as usize];
                if sym.is_section() {
                    if let SymSection::Section(i) = sym.section {
                        return self.objs[o as usize].sections[i as usize].name;
                    }
                }
                sym.name
            }
        }
    }

    /// The symbol symbol `sym` of object `obj` binds to.
    pub(crate) fn key(&self, obj: u32, sym: u32) -> SymbolId {
        match self.sym_globals[obj as usize].get(sym as usize) {
            Some(&g) if g != u32::MAX => SymbolId::Global(g),
            _ => SymbolId::Local(obj, sym),
        }
    }
}

/// The segment a section goes to, or `None` if it is not loaded.
pub(crate) fn segment_of(sec: &crate::object_file::ObjSection<'_>) -> Option<u8> {
    if sec.flags & SHF_ALLOC == 0 || sec.flags & SHF_EXCLUDE != 0 {
        return None;
    }
    if sec.sh_type == SHT_NOTE || sec.sh_type == SHT_GROUP {
        return None;
    }
    if sec.flags & SHF_TLS != 0 {
        return Some(SEG_TLS);
    }
    if is_init_section(sec) {
        return Some(SEG_R as u8);
    }
    if sec.flags & SHF_EXECINSTR != 0 {
        return Some(SEG_RX as u8);
    }
    if sec.flags & SHF_WRITE != 0 {
        return Some(if sec.sh_type == SHT_NOBITS {
            SEG_BSS as u8
        } else {
            SEG_RW as u8
        });
    }
    Some(if sec.sh_type == SHT_NOBITS {
        SEG_BSS as u8
    } else {
        SEG_R as u8
    })
}

pub(crate) fn is_init_section(sec: &crate::object_file::ObjSection<'_>) -> bool {
    matches!(
        sec.sh_type,
        SHT_INIT_ARRAY | SHT_FINI_ARRAY | SHT_PREINIT_ARRAY
    ) || sec.name.starts_with(b".ctors")
        || sec.name.starts_with(b".dtors")
}

pub(crate) fn is_eh_frame(sec: &crate::object_file::ObjSection<'_>) -> bool {
    sec.name == b".eh_frame"
}

/// Init-array priority from a section name: `.init_array.00100` → 100; plain → 65536.
pub(crate) fn priority(name: &[u8], prefix: &[u8]) -> u32 {
    name.strip_prefix(prefix)
        .and_then(|rest| rest.strip_prefix(b"."))
        .and_then(|digits| std::str::from_utf8(digits).ok())
        .and_then(|d| d.parse().ok())
        .unwrap_or(65536)
}
