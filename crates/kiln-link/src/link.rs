//! The link driver: load objects (and the archive members they need), resolve symbols,
//! lay sections out in segments with a GOT and PLT stubs, allocate memory, copy and
//! relocate, finalize.

use crate::arch::{self, Arch, EncodeError, Relative, Relocation, Target};
use crate::object_file::{
    Binding, ObjSym, ObjectFile, SymSection, SHF_ALLOC, SHF_EXCLUDE, SHF_EXECINSTR, SHF_TLS,
    SHF_WRITE, SHT_FINI_ARRAY, SHT_GROUP, SHT_INIT_ARRAY, SHT_NOBITS, SHT_NOTE, SHT_PREINIT_ARRAY,
};
use crate::{Architecture, ArchiveInput, LinkError, MissingSymbol, MissingSymbols, ObjectInput};
use kiln_memory::{
    AllocationRequest, FinalizedAllocation, MemoryManager, Permission, SegmentRequest,
};
use object::LittleEndian as LE;
use rustc_hash::{FxHashMap, FxHashSet};
use std::time::{Duration, Instant};

/// What the linker asks of its environment (the session or the executor).
pub trait LinkContext {
    /// Address of a symbol the link's own inputs do not define: another module's, a host
    /// function's or a shared library's. `None` if nobody defines it.
    fn resolve(&mut self, name: &str) -> Option<u64>;

    /// [`LinkContext::resolve`] for many names at once, in order (one round trip to an
    /// executor in another process instead of one per name).
    fn resolve_many(&mut self, names: &[&str]) -> Vec<Option<u64>> {
        names.iter().map(|n| self.resolve(n)).collect()
    }

    /// Addresses of names that code linked *earlier* into the same namespace defines
    /// (another module of the session's library), asked before archive members are pulled
    /// for them: a member already linked is used, not linked twice. `None` for the rest
    /// (the default: nothing is linked earlier).
    fn resolve_defined(&mut self, names: &[&str]) -> Vec<Option<u64>> {
        vec![None; names.len()]
    }

    /// A fresh thread-local-storage module id for this link's TLS block, passed to
    /// `__tls_get_addr` by general- and local-dynamic code; an error if the executor
    /// cannot give one.
    fn tls_module_id(&mut self) -> Result<u64, String>;

    /// Places the TLS block of module `module_id` in static TLS — one offset from the
    /// thread pointer in every thread, initialized from `image` — and returns that offset.
    /// Needed by initial-exec, local-exec and TLS-descriptor code; the default refuses.
    fn place_static_tls(
        &mut self,
        module_id: u64,
        image: &[u8],
        size: u64,
        align: u64,
    ) -> Result<i64, String> {
        let _ = (module_id, image, size, align);
        Err("this executor has no static TLS".into())
    }

    /// Whether the symbol `name`, which [`LinkContext::resolve`] found at `address`, is a
    /// function (so that a far reference may go through a stub) rather than data. `None`
    /// if unknown; such symbols get stubs only for calls.
    fn is_function(&mut self, name: &str, address: u64) -> Option<bool> {
        let _ = (name, address);
        None
    }
}

/// Options of one link.
pub struct LinkOptions<'m> {
    /// Where code and data go: must lie within ±2 GiB of the host's libraries for code
    /// compiled as PIE.
    pub memory: &'m dyn MemoryManager,
    /// Memory in the low 2 GiB, for objects with absolute 32-bit relocations (non-PIC
    /// code); without it such objects fail to link if their addresses do not fit.
    pub low_memory: Option<&'m dyn MemoryManager>,
    /// Also report where every section landed and every symbol
    /// ([`LinkedModule::sections`], [`LinkedModule::symbol_info`]): for plugins,
    /// debuggers and profilers; off, the link does not spend time on it.
    pub report_sections: bool,
    /// The instruction set of the objects and of the executor that runs the code (the
    /// trap pattern, stubs and relocations follow it, not the host).
    pub architecture: Architecture,
    /// Also keep a copy of the linked bytes with their target addresses
    /// ([`LinkedModule::image`]): for a link-only run that writes what it linked to a
    /// file, and for tests.
    pub keep_image: bool,
}

impl<'m> LinkOptions<'m> {
    /// Options for a link into `memory` for this process's architecture, nothing else
    /// asked.
    pub fn new(memory: &'m dyn MemoryManager) -> Self {
        LinkOptions {
            memory,
            low_memory: None,
            report_sections: false,
            architecture: Architecture::host(),
            keep_image: false,
        }
    }
}

/// One segment of a linked module as written, with its target address (see
/// [`LinkOptions::keep_image`]).
#[derive(Debug, Clone)]
pub struct ImageSegment {
    /// Its permission once finalized.
    pub permission: Permission,
    /// Its target address.
    pub address: u64,
    /// Its size in bytes.
    pub size: u64,
    /// Its contents (empty for zero-filled data).
    pub bytes: Vec<u8>,
}

/// A section placed in memory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlacedSection {
    /// The object it came from: an index into [`LinkedModule::objects`].
    pub object: usize,
    /// Its index in that object's section header table.
    pub index: usize,
    /// Its name (`.text.foo`).
    pub name: String,
    /// Its target address.
    pub address: u64,
    /// Its size in bytes.
    pub size: u64,
}

/// What a symbol names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SymbolKind {
    /// Code (`STT_FUNC`, `STT_GNU_IFUNC`).
    Function,
    /// Data (`STT_OBJECT`, `STT_COMMON`).
    Data,
    /// Anything else with an address (`STT_NOTYPE`).
    Other,
}

/// A symbol with its address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SymbolInfo {
    /// Its name.
    pub name: String,
    /// Its target address.
    pub address: u64,
    /// Its size (0 if the object does not say).
    pub size: u64,
    /// What it names.
    pub kind: SymbolKind,
    /// Global (`true`) or local to its object.
    pub global: bool,
}

/// The TLS initialization image of a module.
#[derive(Debug, Clone, Default)]
pub struct TlsTemplate {
    /// Module id passed to `__tls_get_addr`.
    pub module_id: u64,
    /// Initialized part (`.tdata`), relocated.
    pub image: Vec<u8>,
    /// Total block size (`.tdata` + `.tbss`).
    pub size: u64,
    /// Block alignment.
    pub align: u64,
    /// Offset from the thread pointer, when the block was placed in static TLS (it is then
    /// in place already; `None`: a dynamic block, to install).
    pub tp_offset: Option<i64>,
}

/// Largest TLS block of one module (every thread gets a copy).
pub const MAX_TLS_BLOCK: u64 = 1 << 28;

/// Time spent in each phase of a link.
#[derive(Debug, Clone, Copy, Default)]
pub struct LinkTimes {
    /// Parsing objects and archive members.
    pub parse: Duration,
    /// Resolving symbols (including archive member loading).
    pub resolve: Duration,
    /// Laying out sections, GOT and stubs.
    pub layout: Duration,
    /// Copying contents and applying relocations.
    pub fixup: Duration,
    /// Finalizing memory (permissions, icache).
    pub finalize: Duration,
}

/// Counts of one link.
#[derive(Debug, Clone, Copy, Default)]
pub struct LinkCounts {
    /// Objects linked (including archive members).
    pub objects: usize,
    /// Sections placed in memory.
    pub sections: usize,
    /// Relocations applied.
    pub relocations: usize,
    /// GOT entries.
    pub got_entries: usize,
    /// PLT stubs.
    pub plt_stubs: usize,
    /// Bytes of code, constants, data and zero-filled data.
    pub segment_bytes: [u64; 4],
}

/// A linked module: its memory, its exported symbols, what to run at start and end.
#[derive(Debug)]
pub struct LinkedModule {
    /// The memory, finalized.
    pub allocation: FinalizedAllocation,
    /// Global symbols defined by the module (default or protected visibility), with
    /// their addresses: what other modules may link against.
    pub symbols: FxHashMap<String, u64>,
    /// Global symbols with hidden or internal visibility: not for other modules, but the
    /// module's own (a program's `main` is hidden in CPython's `python.o`).
    pub hidden_symbols: FxHashMap<String, u64>,
    /// Initializers in the order to call them (`.preinit_array`, `.init_array` by
    /// priority, `.ctors`).
    pub init: Vec<u64>,
    /// Finalizers in the order to call them (`.fini_array` reversed, `.dtors`).
    pub fini: Vec<u64>,
    /// Address of the module's `.eh_frame` data (terminated), to register with the
    /// unwinder.
    pub eh_frame: Option<u64>,
    /// The address used for `__dso_handle` (for `__cxa_atexit` / `__cxa_finalize`).
    pub dso_handle: u64,
    /// TLS template, if the module has thread-locals.
    pub tls: Option<TlsTemplate>,
    /// Every object linked, the archive members pulled in included, in link order (with
    /// [`LinkOptions::report_sections`]; else empty). Members share their archive's bytes.
    pub objects: Vec<ObjectInput>,
    /// Where each section landed (with [`LinkOptions::report_sections`]; else empty).
    pub sections: Vec<PlacedSection>,
    /// Every named symbol with an address, local and global, TLS excepted (with
    /// [`LinkOptions::report_sections`]; else empty).
    pub symbol_info: Vec<SymbolInfo>,
    /// The code, constants, data and zero-filled segments as written, with their target
    /// addresses (with [`LinkOptions::keep_image`]; else empty).
    pub image: Vec<ImageSegment>,
    /// The instruction set it was linked for.
    pub architecture: Architecture,
    /// Phase times.
    pub times: LinkTimes,
    /// Counts.
    pub counts: LinkCounts,
}

const SEG_RX: usize = 0;
const SEG_R: usize = 1;
const SEG_RW: usize = 2;
const SEG_BSS: usize = 3;
const SEG_TLS: u8 = 4;
const SEG_NONE: u8 = 255;

#[derive(Debug, Clone, Copy)]
struct Place {
    seg: u8,
    offset: u64,
}

const NOWHERE: Place = Place {
    seg: SEG_NONE,
    offset: 0,
};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Def {
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
struct Global<'a> {
    name: &'a [u8],
    def: Def,
    /// For externals: whether the host symbol is a function.
    external_function: Option<bool>,
    first_ref: Option<u32>,
    strong_ref: bool,
    tls: bool,
    func: bool,
    common_place: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Key {
    Global(u32),
    Local(u32, u32),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Slot {
    Address(Key),
    TlsGd(Key),
    TlsLd,
    /// A thread-local's offset from the thread pointer (initial-exec).
    TpOff(Key),
    /// A TLS descriptor: resolver, argument.
    TlsDesc(Key),
}

struct Linker<'a, 'c> {
    objs: Vec<ObjectFile<'a>>,
    places: Vec<Vec<Place>>,
    /// Per object, per symbol: the global it binds to (u32::MAX for locals).
    sym_globals: Vec<Vec<u32>>,
    globals: Vec<Global<'a>>,
    global_index: FxHashMap<&'a [u8], u32>,
    comdats: FxHashSet<&'a [u8]>,
    pending: Vec<u32>,
    archives: &'a [ArchiveInput],
    loaded_members: FxHashSet<(usize, u64)>,
    /// Per object: where it came from (for [`LinkedModule::objects`]).
    origins: Vec<Origin>,
    arch: &'static dyn Arch,
    ctx: &'c mut dyn LinkContext,
}

/// Where a linked object came from.
#[derive(Debug, Clone, Copy)]
enum Origin {
    /// The link's objects, by index.
    Input(usize),
    /// An archive's member: (archive index, member header offset).
    Member(usize, u64),
}

fn lossy(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

impl<'a, 'c> Linker<'a, 'c> {
    fn add_object(&mut self, obj: ObjectFile<'a>) -> Result<(), LinkError> {
        let obj_index = self.objs.len() as u32;
        let mut places = vec![NOWHERE; obj.sections.len()];
        let mut discarded = vec![false; obj.sections.len()];
        for (signature, members) in &obj.groups {
            if !self.comdats.insert(signature) {
                for &m in members {
                    discarded[m as usize] = true;
                }
            }
        }
        // Sections stay NOWHERE until layout; discarded ones are marked now.
        for (i, d) in discarded.iter().enumerate() {
            if *d {
                places[i] = Place {
                    seg: SEG_NONE,
                    offset: u64::MAX,
                };
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
                                    .map_or_else(|| obj.name.clone(), |o| o.name.clone()),
                                second: obj.name.clone(),
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
    fn load_archive_members(&mut self) -> Result<(), LinkError> {
        loop {
            // Ask about every name still undefined at once.
            let batch: Vec<u32> = self
                .pending
                .iter()
                .copied()
                .filter(|&id| self.globals[id as usize].def == Def::None)
                .collect();
            if batch.is_empty() {
                self.pending.clear();
                return Ok(());
            }
            let names: Vec<String> = batch
                .iter()
                .map(|&id| lossy(self.globals[id as usize].name))
                .collect();
            let refs: Vec<&str> = names.iter().map(String::as_str).collect();
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
    fn load_members_for_pending(&mut self) -> Result<(), LinkError> {
        let pending = std::mem::take(&mut self.pending);
        for id in pending.into_iter().rev() {
            if self.globals[id as usize].def != Def::None {
                continue;
            }
            let name = self.globals[id as usize].name;
            let archives = self.archives;
            'archives: for (ai, archive) in archives.iter().enumerate() {
                for &offset in archive.definers(name) {
                    if self.loaded_members.insert((ai, offset)) {
                        let (member_name, data) = archive.member(offset)?;
                        let obj = ObjectFile::parse(member_name, data, self.arch.architecture())?;
                        self.origins.push(Origin::Member(ai, offset));
                        self.add_object(obj)?;
                    }
                    if self.globals[id as usize].def != Def::None {
                        break 'archives;
                    }
                }
            }
        }
        Ok(())
    }

    /// Resolves what the inputs do not define through the context; lists what nobody
    /// defines.
    fn resolve_externals(&mut self) -> Result<(), LinkError> {
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
        let names: Vec<String> = wanted
            .iter()
            .map(|&id| String::from_utf8_lossy(self.globals[id as usize].name).into_owned())
            .collect();
        let refs: Vec<&str> = names.iter().map(String::as_str).collect();
        let found = self.ctx.resolve_many(&refs);
        for ((&id, name), address) in wanted.iter().zip(&names).zip(found) {
            let g = &mut self.globals[id as usize];
            g.def = match address {
                Some(addr) => {
                    g.external_function = self.ctx.is_function(name, addr);
                    Def::External(addr)
                }
                None if !g.strong_ref => Def::Zero,
                None => {
                    if let Some(obj) = g.first_ref {
                        missing.push(MissingSymbol {
                            symbol: lossy(g.name),
                            wanted_by: self.objs[obj as usize].name.clone(),
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

    fn key(&self, obj: u32, sym: u32) -> Key {
        match self.sym_globals[obj as usize].get(sym as usize) {
            Some(&g) if g != u32::MAX => Key::Global(g),
            _ => Key::Local(obj, sym),
        }
    }
}

/// The segment a section goes to, or `None` if it is not loaded.
fn segment_of(sec: &crate::object_file::ObjSection<'_>) -> Option<u8> {
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

fn is_init_section(sec: &crate::object_file::ObjSection<'_>) -> bool {
    matches!(
        sec.sh_type,
        SHT_INIT_ARRAY | SHT_FINI_ARRAY | SHT_PREINIT_ARRAY
    ) || sec.name.starts_with(b".ctors")
        || sec.name.starts_with(b".dtors")
}

fn is_eh_frame(sec: &crate::object_file::ObjSection<'_>) -> bool {
    sec.name == b".eh_frame"
}

/// Init-array priority from a section name: `.init_array.00100` → 100; plain → 65536.
fn priority(name: &[u8], prefix: &[u8]) -> u32 {
    name.strip_prefix(prefix)
        .and_then(|rest| rest.strip_prefix(b"."))
        .and_then(|digits| std::str::from_utf8(digits).ok())
        .and_then(|d| d.parse().ok())
        .unwrap_or(65536)
}

/// Links `objects` (and the members of `archives` they need) into one module.
pub fn link(
    objects: &[ObjectInput],
    archives: &[ArchiveInput],
    ctx: &mut dyn LinkContext,
    options: &LinkOptions<'_>,
) -> Result<LinkedModule, LinkError> {
    let mut times = LinkTimes::default();
    let t = Instant::now();
    let mut parsed = Vec::with_capacity(objects.len());
    for input in objects {
        parsed.push(ObjectFile::parse(
            input.name.clone(),
            &input.data,
            options.architecture,
        )?);
    }
    times.parse = t.elapsed();
    let t = Instant::now();
    let mut linker = Linker {
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
        arch: options.architecture.arch(),
        ctx,
    };
    for (i, obj) in parsed.into_iter().enumerate() {
        linker.origins.push(Origin::Input(i));
        linker.add_object(obj)?;
    }
    // Archive members are parsed while resolving; their parse time counts as resolve.
    linker.pending.reverse();
    linker.load_archive_members()?;
    linker.resolve_externals()?;
    times.resolve = t.elapsed();
    linker.finish(objects, options, times)
}

impl Linker<'_, '_> {
    fn finish(
        mut self,
        objects: &[ObjectInput],
        options: &LinkOptions<'_>,
        mut times: LinkTimes,
    ) -> Result<LinkedModule, LinkError> {
        let t = Instant::now();
        let mut counts = LinkCounts {
            objects: self.objs.len(),
            ..LinkCounts::default()
        };
        // --- layout of sections -------------------------------------------------------
        let mut seg_size = [0u64; 4];
        let mut seg_align = [16u64; 4];
        let mut tls_size = 0u64;
        let mut tls_align = 1u64;
        // The initialized part of the TLS block: up to the end of the last `.tdata`.
        let mut tls_image_len = 0u64;
        let mut eh_frames: Vec<(u32, u32)> = Vec::new();
        let mut init_sections: Vec<(u32, u32)> = Vec::new();
        // Saturating: absurd sizes from a damaged object end up huge and are refused below,
        // before any offset is used.
        let place = |size: &mut u64, align: &mut u64, sec_size: u64, sec_align: u64| -> u64 {
            let sec_align = sec_align
                .max(1)
                .checked_next_power_of_two()
                .unwrap_or(1 << 63);
            let offset = size.checked_next_multiple_of(sec_align).unwrap_or(u64::MAX);
            *size = offset.saturating_add(sec_size);
            *align = (*align).max(sec_align);
            offset
        };
        for oi in 0..self.objs.len() {
            for si in 0..self.objs[oi].sections.len() {
                if self.places[oi][si].offset == u64::MAX {
                    continue; // discarded COMDAT member
                }
                let sec = self.objs[oi].sections[si];
                let Some(seg) = segment_of(&sec) else {
                    continue;
                };
                if is_eh_frame(&sec) {
                    eh_frames.push((oi as u32, si as u32));
                    continue;
                }
                if is_init_section(&sec) {
                    if seg == SEG_TLS {
                        return Err(LinkError::Malformed {
                            object: self.objs[oi].name.clone(),
                            what: format!(
                                "initializer section {} is marked thread-local (SHF_TLS)",
                                lossy(sec.name)
                            ),
                        });
                    }
                    init_sections.push((oi as u32, si as u32));
                }
                counts.sections += 1;
                let offset = if seg == SEG_TLS {
                    let offset = place(&mut tls_size, &mut tls_align, sec.size, sec.align);
                    if sec.sh_type != SHT_NOBITS {
                        tls_image_len = tls_size;
                    }
                    offset
                } else {
                    let s = seg as usize;
                    place(&mut seg_size[s], &mut seg_align[s], sec.size, sec.align)
                };
                self.places[oi][si] = Place { seg, offset };
            }
        }
        // Commons go to the zero-filled segment.
        for g in &mut self.globals {
            if let Def::Common { size, align } = g.def {
                g.common_place =
                    place(&mut seg_size[SEG_BSS], &mut seg_align[SEG_BSS], size, align);
            }
        }
        // __dso_handle, if used: 8 bytes of data.
        let dso_offset = place(&mut seg_size[SEG_RW], &mut seg_align[SEG_RW], 8, 8);

        // --- GOT and PLT ---------------------------------------------------------------
        let mut slots: FxHashMap<Slot, u64> = FxHashMap::default();
        let mut slot_list: Vec<Slot> = Vec::new();
        let mut stubs: FxHashMap<Key, u64> = FxHashMap::default();
        let mut stub_list: Vec<Key> = Vec::new();
        let mut needs_low = false;
        // Initial-exec, local-exec or TLS-descriptor code: the block goes to static TLS.
        let mut needs_static_tls = false;
        let code_beyond_reach = seg_size[SEG_RX] >= self.arch.call_reach();
        let stub_size = self.arch.stub_size();
        let tlsdesc_resolver_code = self.arch.tlsdesc_static_resolver();
        for oi in 0..self.objs.len() {
            for ri in 0..self.objs[oi].relocations.len() {
                let (target, relas) = self.objs[oi].relocations[ri];
                let tp = self.places[oi][target as usize];
                if tp.seg == SEG_NONE || tp.offset == u64::MAX {
                    // Not loaded (debug info, notes, discarded COMDAT): its relocations are
                    // not applied, and an eh_frame's are handled with the section.
                    let sec = self.objs[oi].sections[target as usize];
                    if !is_eh_frame(&sec) || tp.offset == u64::MAX {
                        continue;
                    }
                }
                for rela in relas {
                    let r_type = rela.r_type(LE, false).0;
                    let sym = rela.r_sym(LE, false);
                    // Unknown types are reported when relocations are applied.
                    let Some(row) = self.arch.relocation(r_type) else {
                        continue;
                    };
                    let key = self.key(oi as u32, sym);
                    let mut add_slot = |slot: Slot| {
                        if let std::collections::hash_map::Entry::Vacant(e) = slots.entry(slot) {
                            let words = if matches!(slot, Slot::Address(_) | Slot::TpOff(_)) {
                                1
                            } else {
                                2
                            };
                            e.insert(slot_list.len() as u64);
                            for _ in 0..words {
                                slot_list.push(slot);
                            }
                        }
                    };
                    match row.target {
                        Target::GotEntry => add_slot(Slot::Address(key)),
                        Target::TlsGdEntry => add_slot(Slot::TlsGd(key)),
                        Target::TlsLdEntry => add_slot(Slot::TlsLd),
                        Target::TpOffEntry => {
                            needs_static_tls = true;
                            add_slot(Slot::TpOff(key));
                        }
                        Target::TpOff => needs_static_tls = true,
                        Target::TlsDescEntry => {
                            needs_static_tls = true;
                            add_slot(Slot::TlsDesc(key));
                        }
                        Target::Call | Target::Plt | Target::Symbol
                            if row.target != Target::Symbol || row.check != arch::Check::None =>
                        {
                            if row.needs_low_memory() {
                                needs_low = true;
                            }
                            // Calls to (and, in non-PIC code, addresses of) functions that
                            // may be out of reach go through a stub next to the code; an
                            // undefined weak function gets one too, jumping to 0 as a
                            // static link's would. Code larger than a call reaches calls
                            // its own functions through stubs too (range-extension
                            // veneers).
                            let call = row.target != Target::Symbol;
                            let far = match key {
                                Key::Global(g) => {
                                    let global = &self.globals[g as usize];
                                    let def = global.def;
                                    // Data is never reached through a stub: a call is
                                    // assumed to target a function, other references must
                                    // know.
                                    let function = call || global.external_function == Some(true);
                                    function
                                        && (matches!(def, Def::External(_))
                                            || (def == Def::Zero && call))
                                }
                                Key::Local(..) => false,
                            } || (call && code_beyond_reach);
                            if far && !stubs.contains_key(&key) {
                                add_slot(Slot::Address(key));
                                stubs.insert(key, stub_list.len() as u64);
                                stub_list.push(key);
                            }
                        }
                        _ => {}
                    }
                }
            }
        }
        let plt_offset = place(
            &mut seg_size[SEG_RX],
            &mut seg_align[SEG_RX],
            stub_list.len() as u64 * stub_size,
            16,
        );
        let has_tlsdesc = slot_list.iter().any(|s| matches!(s, Slot::TlsDesc(_)));
        let tlsdesc_offset = has_tlsdesc.then(|| {
            place(
                &mut seg_size[SEG_RX],
                &mut seg_align[SEG_RX],
                tlsdesc_resolver_code.len() as u64,
                16,
            )
        });
        let got_offset = place(
            &mut seg_size[SEG_R],
            &mut seg_align[SEG_R],
            (slot_list.len() as u64).max(1) * 8,
            8,
        );
        // eh_frame last in R, contiguous, plus a zero terminator.
        let mut eh_offset = None;
        for &(oi, si) in &eh_frames {
            let sec = self.objs[oi as usize].sections[si as usize];
            let offset = place(
                &mut seg_size[SEG_R],
                &mut seg_align[SEG_R],
                sec.size,
                sec.align.max(4),
            );
            eh_offset.get_or_insert(offset);
            self.places[oi as usize][si as usize] = Place {
                seg: SEG_R as u8,
                offset,
            };
            counts.sections += 1;
        }
        let eh_terminator =
            eh_offset.map(|_| place(&mut seg_size[SEG_R], &mut seg_align[SEG_R], 4, 4));
        counts.got_entries = slot_list.len();
        counts.plt_stubs = stub_list.len();
        counts.segment_bytes = seg_size;
        if tls_size > MAX_TLS_BLOCK {
            return Err(LinkError::Malformed {
                object: self
                    .objs
                    .first()
                    .map_or_else(String::new, |o| o.name.clone()),
                what: format!(
                    "thread-local sections add up to {tls_size:#x} bytes, more than the {MAX_TLS_BLOCK:#x} Kiln gives one module's TLS block"
                ),
            });
        }
        const MAX_SEGMENT: u64 = 1 << 40;
        if let Some(s) = seg_size
            .iter()
            .chain([&tls_size])
            .find(|&&s| s > MAX_SEGMENT)
        {
            return Err(LinkError::Malformed {
                object: self
                    .objs
                    .first()
                    .map_or_else(String::new, |o| o.name.clone()),
                what: format!("sections add up to {s:#x} bytes in one segment (over 1 TiB)"),
            });
        }

        // --- allocation --------------------------------------------------------------------
        let memory = match (needs_low, options.low_memory) {
            (true, Some(low)) => low,
            _ => options.memory,
        };
        let perms = [
            Permission::ReadExecute,
            Permission::Read,
            Permission::ReadWrite,
            Permission::ReadWrite,
        ];
        let mut request = AllocationRequest::new();
        for s in 0..4 {
            let mut seg = SegmentRequest::new(perms[s], seg_size[s], seg_align[s]);
            if s == SEG_BSS {
                seg = seg.zero_filled();
            }
            request = request.segment(seg);
        }
        let mut in_flight = memory.allocate(&request)?;
        let bases: [u64; 4] = std::array::from_fn(|s| in_flight.target(s).unwrap_or(0));
        let got_base = bases[SEG_R] + got_offset;
        let plt_base = bases[SEG_RX] + plt_offset;
        let dso_handle = bases[SEG_RW] + dso_offset;
        let tls_module = if tls_size > 0 {
            self.ctx.tls_module_id().map_err(LinkError::Environment)?
        } else {
            0
        };
        times.layout = t.elapsed();

        // The context is needed once more (static TLS) while the resolver reads the linker.
        let ctx = std::mem::replace(&mut self.ctx, Box::leak(Box::new(Detached)));
        let resolver = Resolver {
            linker: &self,
            bases,
            got_base,
            plt_base,
            dso_handle,
            stubs: &stubs,
        };

        // --- copy and relocate --------------------------------------------------------
        let t = Instant::now();
        // Only the initialized part of the block is an image (`.tbss` is zeros by
        // definition), so a huge `.tbss` costs nothing here.
        let mut tls_image = Vec::new();
        tls_image
            .try_reserve_exact(tls_image_len as usize)
            .map_err(|_| LinkError::Malformed {
                object: self
                    .objs
                    .first()
                    .map_or_else(String::new, |o| o.name.clone()),
                what: format!("no memory for a TLS image of {tls_image_len} bytes"),
            })?;
        tls_image.resize(tls_image_len as usize, 0);
        let tlsdesc_resolver = tlsdesc_offset.map_or(0, |o| bases[SEG_RX] + o);
        let static_tp_offset;
        {
            let mut segs = in_flight.segments_mut();
            let trap = self.arch.trap();
            for chunk in segs[SEG_RX].bytes.chunks_mut(4) {
                chunk.copy_from_slice(&trap[..chunk.len()]);
            }
            segs[SEG_R].bytes.fill(0);
            segs[SEG_RW].bytes.fill(0);
            for oi in 0..self.objs.len() {
                for (si, sec) in self.objs[oi].sections.iter().enumerate() {
                    let p = self.places[oi][si];
                    if p.seg == SEG_NONE || p.offset == u64::MAX || sec.sh_type == SHT_NOBITS {
                        continue;
                    }
                    let dest: &mut [u8] = if p.seg == SEG_TLS {
                        &mut tls_image
                    } else {
                        segs[p.seg as usize].bytes
                    };
                    let start = p.offset as usize;
                    dest[start..start + sec.data.len()].copy_from_slice(sec.data);
                }
            }
            // `__dso_handle` holds its own address, as crtbeginS.o's does: g++ passes its
            // address to `__cxa_atexit`, libc_nonshared's `atexit` passes its value.
            segs[SEG_RW].bytes[dso_offset as usize..dso_offset as usize + 8]
                .copy_from_slice(&dso_handle.to_le_bytes());
            // Relocations of the TLS image first: a block placed in static TLS is copied
            // into every thread as it is now, and the offset it gets is what the code's
            // initial-exec and local-exec relocations need.
            let mut tp_offset = None;
            for pass in [Pass::TlsImage, Pass::Rest] {
                if pass == Pass::Rest {
                    if needs_static_tls && tls_size > 0 {
                        let offset = ctx
                            .place_static_tls(tls_module, &tls_image, tls_size, tls_align)
                            .map_err(|reason| LinkError::StaticTls {
                                object: self
                                    .objs
                                    .first()
                                    .map_or_else(String::new, |o| o.name.clone()),
                                size: tls_size,
                                reason,
                            })?;
                        tp_offset = Some(offset);
                    }
                    let tls = TlsPlace {
                        module: tls_module,
                        tp_offset,
                    };
                    write_got(
                        &mut segs[SEG_R].bytes[got_offset as usize..],
                        &slot_list,
                        &resolver,
                        tls,
                        tlsdesc_resolver,
                    );
                    write_plt(
                        segs[SEG_RX].bytes,
                        &stub_list,
                        &slots,
                        &resolver,
                        plt_offset,
                    )?;
                    if let Some(at) = tlsdesc_offset {
                        let at = at as usize;
                        segs[SEG_RX].bytes[at..at + tlsdesc_resolver_code.len()]
                            .copy_from_slice(tlsdesc_resolver_code);
                    }
                    if let Some(end) = eh_terminator {
                        segs[SEG_R].bytes[end as usize..end as usize + 4].fill(0);
                    }
                }
                let tls = TlsPlace {
                    module: tls_module,
                    tp_offset,
                };
                for oi in 0..self.objs.len() {
                    let obj = &self.objs[oi];
                    for &(target, relas) in &obj.relocations {
                        let p = self.places[oi][target as usize];
                        if p.seg == SEG_NONE || p.offset == u64::MAX {
                            continue;
                        }
                        if (p.seg == SEG_TLS) != (pass == Pass::TlsImage) {
                            continue;
                        }
                        let sec = obj.sections[target as usize];
                        let range = p.offset as usize..p.offset.saturating_add(sec.size) as usize;
                        let (section_bytes, section_addr): (Option<&mut [u8]>, u64) =
                            if p.seg == SEG_TLS {
                                (tls_image.get_mut(range), p.offset)
                            } else {
                                let s = p.seg as usize;
                                (segs[s].bytes.get_mut(range), bases[s] + p.offset)
                            };
                        let Some(section_bytes) =
                            section_bytes.filter(|_| sec.sh_type != SHT_NOBITS)
                        else {
                            return Err(LinkError::Malformed {
                                object: obj.name.clone(),
                                what: format!(
                                    "relocations for section {}, which has no contents",
                                    lossy(sec.name)
                                ),
                            });
                        };
                        for rela in relas {
                            counts.relocations += 1;
                            resolver.apply(
                                oi as u32,
                                &sec,
                                section_bytes,
                                section_addr,
                                rela,
                                &slots,
                                tls,
                            )?;
                        }
                    }
                }
            }
            static_tp_offset = tp_offset;
        }
        // Initializers and finalizers, read back from the relocated arrays.
        let mut init = Vec::new();
        let mut fini = Vec::new();
        {
            let segs = in_flight.segments_mut();
            let read_array = |oi: u32, si: u32| -> Vec<u64> {
                let p = self.places[oi as usize][si as usize];
                let sec = self.objs[oi as usize].sections[si as usize];
                segs[p.seg as usize].bytes[p.offset as usize..(p.offset + sec.size) as usize]
                    .chunks_exact(8)
                    .map(|c| u64::from_le_bytes(c.try_into().unwrap_or([0; 8])))
                    .filter(|&f| f != 0 && f != u64::MAX)
                    .collect()
            };
            let mut pre = Vec::new();
            let mut inits: Vec<(u32, usize, Vec<u64>)> = Vec::new();
            let mut ctors = Vec::new();
            let mut finis: Vec<(u32, usize, Vec<u64>)> = Vec::new();
            let mut dtors = Vec::new();
            for (n, &(oi, si)) in init_sections.iter().enumerate() {
                let sec = self.objs[oi as usize].sections[si as usize];
                let entries = read_array(oi, si);
                match sec.sh_type {
                    SHT_PREINIT_ARRAY => pre.extend(entries),
                    SHT_INIT_ARRAY => inits.push((priority(sec.name, b".init_array"), n, entries)),
                    SHT_FINI_ARRAY => finis.push((priority(sec.name, b".fini_array"), n, entries)),
                    _ if sec.name.starts_with(b".ctors") => ctors.extend(entries),
                    _ => dtors.extend(entries),
                }
            }
            inits.sort_by_key(|&(prio, n, _)| (prio, n));
            finis.sort_by_key(|&(prio, n, _)| (prio, n));
            init.extend(pre);
            for (_, _, e) in inits {
                init.extend(e);
            }
            init.extend(ctors.into_iter().rev());
            let mut fini_forward = Vec::new();
            for (_, _, e) in finis {
                fini_forward.extend(e);
            }
            fini.extend(fini_forward.into_iter().rev());
            fini.extend(dtors);
        }
        let image = if options.keep_image {
            let segs = in_flight.segments_mut();
            (0..4)
                .map(|s| ImageSegment {
                    permission: perms[s],
                    address: bases[s],
                    size: seg_size[s],
                    bytes: if s == SEG_BSS {
                        Vec::new()
                    } else {
                        segs[s].bytes[..seg_size[s] as usize].to_vec()
                    },
                })
                .collect()
        } else {
            Vec::new()
        };
        times.fixup = t.elapsed();

        // Exported symbols.
        let mut symbols = FxHashMap::default();
        let mut hidden_symbols = FxHashMap::default();
        {
            for (id, g) in self.globals.iter().enumerate() {
                let exported = match g.def {
                    Def::Defined { obj, sym, .. } => {
                        let s = &self.objs[obj as usize].symbols[sym as usize];
                        Some(
                            s.visibility == object::elf::STV_DEFAULT.0
                                || s.visibility == object::elf::STV_PROTECTED.0,
                        )
                    }
                    Def::Common { .. } => Some(true),
                    _ => None,
                };
                if let (Some(exported), false) = (exported, g.tls) {
                    let (addr, _) = resolver.address(Key::Global(id as u32));
                    let map = if exported {
                        &mut symbols
                    } else {
                        &mut hidden_symbols
                    };
                    map.insert(lossy(g.name), addr);
                }
            }
        }

        let (linked_objects, sections, symbol_info) = if options.report_sections {
            let (sections, symbols) = self.report(&resolver, &stub_list, tlsdesc_resolver);
            (self.linked_objects(objects)?, sections, symbols)
        } else {
            (Vec::new(), Vec::new(), Vec::new())
        };

        let t = Instant::now();
        let allocation = in_flight.finalize()?;
        times.finalize = t.elapsed();
        let tls = (tls_size > 0).then_some(TlsTemplate {
            module_id: tls_module,
            image: tls_image,
            size: tls_size,
            align: tls_align,
            tp_offset: static_tp_offset,
        });
        Ok(LinkedModule {
            allocation,
            symbols,
            hidden_symbols,
            init,
            fini,
            eh_frame: eh_offset.map(|o| bases[SEG_R] + o),
            dso_handle,
            tls,
            objects: linked_objects,
            sections,
            symbol_info,
            image,
            architecture: options.architecture,
            times,
            counts,
        })
    }

    /// Every object linked, members included (for [`LinkOptions::report_sections`]).
    fn linked_objects(&self, inputs: &[ObjectInput]) -> Result<Vec<ObjectInput>, LinkError> {
        self.origins
            .iter()
            .map(|origin| match *origin {
                Origin::Input(i) => Ok(inputs[i].clone()),
                Origin::Member(archive, offset) => self.archives[archive].member_input(offset),
            })
            .collect()
    }

    /// Where every loaded section landed and every symbol with an address (for
    /// [`LinkOptions::report_sections`]).
    fn report(
        &self,
        resolver: &Resolver<'_, '_, '_>,
        stub_list: &[Key],
        tlsdesc_resolver: u64,
    ) -> (Vec<PlacedSection>, Vec<SymbolInfo>) {
        let mut sections = Vec::new();
        let mut symbols = Vec::new();
        for (oi, obj) in self.objs.iter().enumerate() {
            for (si, sec) in obj.sections.iter().enumerate() {
                let p = self.places[oi][si];
                if p.seg == SEG_NONE || p.seg == SEG_TLS || p.offset == u64::MAX {
                    continue;
                }
                sections.push(PlacedSection {
                    object: oi,
                    index: si,
                    name: lossy(sec.name),
                    address: resolver.bases[p.seg as usize] + p.offset,
                    size: sec.size,
                });
            }
            for (si, sym) in obj.symbols.iter().enumerate().skip(1) {
                if sym.name.is_empty()
                    || sym.is_section()
                    || sym.is_tls()
                    || sym.kind == object::elf::STT_FILE.0
                    || !matches!(sym.section, SymSection::Section(_))
                {
                    continue;
                }
                let global = sym.binding != Binding::Local;
                if global {
                    // Only the definition the link kept.
                    let kept = matches!(
                        self.key(oi as u32, si as u32),
                        Key::Global(g) if matches!(self.globals[g as usize].def,
                            Def::Defined { obj, sym, .. } if obj == oi as u32 && sym == si as u32)
                    );
                    if !kept {
                        continue;
                    }
                }
                let (address, discarded) = resolver.sym_address(oi as u32, sym);
                if discarded {
                    continue;
                }
                symbols.push(SymbolInfo {
                    name: lossy(sym.name),
                    address,
                    size: sym.size,
                    kind: if sym.is_func() {
                        SymbolKind::Function
                    } else if sym.kind == object::elf::STT_OBJECT.0
                        || sym.kind == object::elf::STT_COMMON.0
                    {
                        SymbolKind::Data
                    } else {
                        SymbolKind::Other
                    },
                    global,
                });
            }
        }
        // The code the link made: a stub per far function (`name@plt`), the
        // TLS-descriptor resolver. On AArch64 a `$x` mapping symbol tells disassemblers
        // that code starts there again (an object's `$d` may precede it).
        let stub_size = self.arch.stub_size();
        let mut code = |name: String, address: u64, size: u64| {
            if self.arch.architecture() == Architecture::Aarch64 {
                symbols.push(SymbolInfo {
                    name: "$x".into(),
                    address,
                    size: 0,
                    kind: SymbolKind::Other,
                    global: false,
                });
            }
            symbols.push(SymbolInfo {
                name,
                address,
                size,
                kind: SymbolKind::Function,
                global: false,
            });
        };
        for (n, key) in stub_list.iter().enumerate() {
            let address = resolver.stub_address(n as u64);
            code(
                format!("{}@plt", lossy(resolver.name(*key))),
                address,
                stub_size,
            );
        }
        if tlsdesc_resolver != 0 {
            let size = self.arch.tlsdesc_static_resolver().len() as u64;
            code("kiln_tlsdesc_static".into(), tlsdesc_resolver, size);
        }
        // Commons, placed by the link in the zero-filled segment.
        for (id, g) in self.globals.iter().enumerate() {
            if let Def::Common { size, .. } = g.def {
                symbols.push(SymbolInfo {
                    name: lossy(g.name),
                    address: resolver.address(Key::Global(id as u32)).0,
                    size,
                    kind: SymbolKind::Data,
                    global: true,
                });
            }
        }
        (sections, symbols)
    }
}

/// Stands in for the link's context once the link no longer needs it.
struct Detached;

impl LinkContext for Detached {
    fn resolve(&mut self, _: &str) -> Option<u64> {
        None
    }
    fn tls_module_id(&mut self) -> Result<u64, String> {
        Err("the link's context is detached".into())
    }
}

/// The two relocation passes: the TLS image, then everything else.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pass {
    TlsImage,
    Rest,
}

/// Where the module's TLS block is: its module id, and its offset from the thread pointer
/// when it is in static TLS.
#[derive(Debug, Clone, Copy)]
struct TlsPlace {
    module: u64,
    tp_offset: Option<i64>,
}

/// Writes the GOT: addresses, TLS index pairs, thread-pointer offsets, TLS descriptors.
fn write_got(
    got: &mut [u8],
    slot_list: &[Slot],
    resolver: &Resolver<'_, '_, '_>,
    tls: TlsPlace,
    tlsdesc_resolver: u64,
) {
    let mut put = |i: usize, v: u64| got[i * 8..i * 8 + 8].copy_from_slice(&v.to_le_bytes());
    let tp_off = |key: Key| -> u64 {
        let (offset, _) = resolver.address(key);
        (tls.tp_offset.unwrap_or(0) as u64).wrapping_add(offset)
    };
    let mut i = 0;
    while i < slot_list.len() {
        match slot_list[i] {
            Slot::Address(key) => {
                put(i, resolver.address(key).0);
                i += 1;
            }
            Slot::TpOff(key) => {
                put(i, tp_off(key));
                i += 1;
            }
            Slot::TlsGd(key) => {
                put(i, tls.module);
                put(i + 1, resolver.address(key).0);
                i += 2;
            }
            Slot::TlsLd => {
                put(i, tls.module);
                put(i + 1, 0);
                i += 2;
            }
            Slot::TlsDesc(key) => {
                put(i, tlsdesc_resolver);
                put(i + 1, tp_off(key));
                i += 2;
            }
        }
    }
}

/// Writes the stubs, each jumping to the address in its symbol's GOT entry.
fn write_plt(
    code: &mut [u8],
    stub_list: &[Key],
    slots: &FxHashMap<Slot, u64>,
    resolver: &Resolver<'_, '_, '_>,
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
struct Resolver<'l, 'a, 'c> {
    linker: &'l Linker<'a, 'c>,
    bases: [u64; 4],
    got_base: u64,
    plt_base: u64,
    dso_handle: u64,
    stubs: &'l FxHashMap<Key, u64>,
}

impl Resolver<'_, '_, '_> {
    fn name(&self, key: Key) -> &[u8] {
        match key {
            Key::Global(g) => self.linker.globals[g as usize].name,
            Key::Local(o, s) => {
                let sym = &self.linker.objs[o as usize].symbols[s as usize];
                if sym.is_section() {
                    if let SymSection::Section(i) = sym.section {
                        return self.linker.objs[o as usize].sections[i as usize].name;
                    }
                }
                sym.name
            }
        }
    }

    /// Address of an object's symbol (a TLS offset for thread-locals), and whether its
    /// section was discarded.
    fn sym_address(&self, obj: u32, sym: &ObjSym<'_>) -> (u64, bool) {
        match sym.section {
            SymSection::Section(i) => {
                let p = self.linker.places[obj as usize][i as usize];
                if p.offset == u64::MAX || p.seg == SEG_NONE {
                    (0, true)
                } else if p.seg == SEG_TLS {
                    (p.offset.wrapping_add(sym.value), false)
                } else {
                    // Modulo 2^64 like any address; fields that cannot hold the result
                    // are caught when relocations are applied.
                    let base = self.bases[p.seg as usize].wrapping_add(p.offset);
                    (base.wrapping_add(sym.value), false)
                }
            }
            SymSection::Absolute => (sym.value, false),
            _ => (0, false),
        }
    }

    /// Address of a relocation target, and whether it lies in a discarded section.
    fn address(&self, key: Key) -> (u64, bool) {
        match key {
            Key::Local(o, s) => {
                let sym = &self.linker.objs[o as usize].symbols[s as usize];
                self.sym_address(o, sym)
            }
            Key::Global(g) => match self.linker.globals[g as usize].def {
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

    fn size(&self, key: Key) -> u64 {
        match key {
            Key::Local(o, s) => self.linker.objs[o as usize].symbols[s as usize].size,
            Key::Global(g) => match self.linker.globals[g as usize].def {
                Def::Defined { obj, sym, .. } => {
                    self.linker.objs[obj as usize].symbols[sym as usize].size
                }
                Def::Common { size, .. } => size,
                _ => 0,
            },
        }
    }

    fn is_tls(&self, key: Key) -> bool {
        match key {
            Key::Local(o, s) => self.linker.objs[o as usize].symbols[s as usize].is_tls(),
            Key::Global(g) => self.linker.globals[g as usize].tls,
        }
    }

    fn is_external(&self, key: Key) -> bool {
        matches!(key, Key::Global(g) if matches!(self.linker.globals[g as usize].def, Def::External(_)))
    }

    #[allow(clippy::too_many_arguments)]
    fn apply(
        &self,
        obj: u32,
        sec: &crate::object_file::ObjSection<'_>,
        bytes: &mut [u8],
        section_addr: u64,
        rela: &crate::object_file::Rela,
        slots: &FxHashMap<Slot, u64>,
        tls: TlsPlace,
    ) -> Result<(), LinkError> {
        let o = &self.linker.objs[obj as usize];
        let r_type = rela.r_type(LE, false).0;
        let sym_index = rela.r_sym(LE, false);
        let offset = rela.r_offset.get(LE);
        let addend = rela.r_addend.get(LE);
        let err_bad = |what: String| LinkError::BadRelocation {
            object: o.name.clone(),
            section: lossy(sec.name),
            offset,
            what,
        };
        if sym_index as usize >= o.symbols.len().max(1) {
            return Err(err_bad(format!(
                "symbol index {sym_index} of {}",
                o.symbols.len()
            )));
        }
        let arch = self.linker.arch;
        let Some(mut row) = arch.relocation(r_type) else {
            return Err(LinkError::UnknownRelocation {
                object: o.name.clone(),
                section: lossy(sec.name),
                offset,
                r_type,
                name: arch.relocation_name(r_type),
                symbol: lossy(self.name(self.linker.key(obj, sym_index))),
            });
        };
        if row.target == Target::Nothing {
            return Ok(());
        }
        let width = row.field.len();
        if offset
            .checked_add(width)
            .is_none_or(|end| end > bytes.len() as u64)
        {
            return Err(err_bad(format!(
                "{} of {width} bytes does not fit the section ({} bytes)",
                row.name,
                bytes.len()
            )));
        }
        let key = self.linker.key(obj, sym_index);
        let (s, discarded) = self.address(key);
        let mut offset = offset;
        let mut p = section_addr + offset;
        let a = addend as i128;
        let slot_addr =
            |slot: Slot| -> u64 { self.got_base + slots.get(&slot).copied().unwrap_or(0) * 8 };
        let symbol_name = || lossy(self.name(key));
        let reloc_offset = offset;
        let unsupported_tls = |model: &'static str| LinkError::UnsupportedTls {
            object: o.name.clone(),
            section: lossy(sec.name),
            offset: reloc_offset,
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
            Target::DtpOff => s as i128,
            Target::DtpMod => {
                return self.write(o, sec, bytes, offset, row, tls.module as i128, key, false)
            }
            Target::Unsupported(model) => {
                tls_checked(model)?;
                return Err(unsupported_tls(model));
            }
        };
        let relative = |t: i128| -> i128 {
            match row.relative {
                Relative::Absolute => t + a,
                Relative::Place => t + a - p as i128,
                Relative::Page => ((t + a) & !0xfff) - (p & !0xfff) as i128,
                Relative::GotBase => t + a - self.got_base as i128,
            }
        };
        let mut value = relative(t);
        // A function out of the instruction's reach is reached through its stub.
        if matches!(row.target, Target::Symbol | Target::Call) {
            if let Some(&n) = self.stubs.get(&key) {
                if !arch.reaches(row, value, s, addend, p) {
                    value = relative(self.stub_address(n) as i128);
                }
            }
        }
        self.write(o, sec, bytes, offset, row, value, key, discarded)
    }

    fn stub_address(&self, n: u64) -> u64 {
        self.plt_base + n * self.linker.arch.stub_size()
    }

    /// Whether `key` is defined by this link's objects (not a host's or another
    /// module's symbol, not absolute, not undefined).
    fn is_defined_here(&self, key: Key) -> bool {
        let defined = |obj: u32, sym: u32| {
            matches!(
                self.linker.objs[obj as usize].symbols[sym as usize].section,
                SymSection::Section(_)
            )
        };
        match key {
            Key::Local(o, s) => defined(o, s),
            Key::Global(g) => match self.linker.globals[g as usize].def {
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
        o: &ObjectFile<'_>,
        sec: &crate::object_file::ObjSection<'_>,
        bytes: &mut [u8],
        offset: u64,
        row: &Relocation,
        value: i128,
        key: Key,
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
                object: o.name.clone(),
                section: lossy(sec.name),
                offset,
                kind: row.name,
                symbol: lossy(self.name(key)),
                value,
                align,
            }),
            Err(EncodeError::Range) => Err(LinkError::Overflow {
                object: o.name.clone(),
                section: lossy(sec.name),
                offset,
                kind: row.name,
                symbol: lossy(self.name(key)),
                value,
                bits: row.check.bits(),
                hint: self.overflow_hint(row, key),
            }),
        }
    }

    /// What the user can do about a value that does not fit.
    fn overflow_hint(&self, row: &Relocation, key: Key) -> &'static str {
        match (row.target, row.relative) {
            (Target::Symbol, Relative::Absolute) if row.needs_low_memory() => {
                "; non-PIC code needs memory in the low 2 GiB (give the linker low_memory)"
            }
            (Target::Symbol, Relative::Place | Relative::Page) if self.is_external(key) => {
                "; the host symbol is more than 2 GiB away. Non-PIC code (in the low 2 GiB) cannot reach a shared library's data: that needs a copy relocation, which a JIT cannot make. Compile with -fPIE or -fPIC"
            }
            (Target::Call, _) => {
                "; the branch reaches neither its target nor a stub: the module's code is larger than a branch reaches"
            }
            _ => "",
        }
    }
}
