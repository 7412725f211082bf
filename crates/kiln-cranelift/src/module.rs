//! `KilnModule`: `cranelift_module::Module` on Kiln. Each function or data object defined
//! becomes a section of an object built in memory ([`kiln_link::BuiltObject`]); each
//! `finalize_definitions` links what is pending as one private module of the session
//! ([`kiln::Jit::link_private`]). References to definitions of earlier finalizes are
//! bound to their addresses; everything else the module does not define resolves as the
//! session's library resolves it (the builder's symbols, its lookups, the process).

use crate::builder::{HostAddress, KilnBuilder, LookupFn};
use crate::relocations::elf_type;
use cranelift_codegen::binemit::Reloc;
use cranelift_codegen::ir;
use cranelift_codegen::isa::{OwnedTargetIsa, TargetIsa};
use cranelift_control::ControlPlane;
use cranelift_module::{
    DataDescription, DataId, FuncId, FuncOrDataId, Init, Linkage, Module, ModuleDeclarations,
    ModuleError, ModuleReloc, ModuleRelocTarget, ModuleResult,
};
use kiln_link::{
    Architecture, BuiltObject, BuiltSection, BuiltSectionKind, BuiltSymbol, BuiltSymbolKind,
    ObjectInput, SymbolBinding,
};
use rustc_hash::FxHashMap;
use std::collections::HashMap;

const WRITABLE_DATA_ALIGNMENT: u64 = 8;
const READONLY_DATA_ALIGNMENT: u64 = 1;

/// A finalized definition: where it is, how big, and which finalize (batch) holds it.
#[derive(Debug, Clone)]
struct Definition {
    /// What references bind to and `get_finalized_function` gives: the body, or with hot
    /// swap the function's call-through stub.
    address: u64,
    /// The current body.
    body: u64,
    size: u64,
    batch: u32,
}

/// Where a declared function or data object stands.
#[derive(Debug, Clone, Default)]
enum Slot {
    /// Not defined (or freed).
    #[default]
    Empty,
    /// Defined, waiting for the next `finalize_definitions` (index into the pending list).
    Pending,
    /// Linked.
    Finalized(Definition),
}

/// A definition waiting for `finalize_definitions`: its section and symbol in the object
/// being built, and its relocations (a range of [`Pending::relocs`]).
#[derive(Debug)]
struct PendingDefinition {
    id: FuncOrDataId,
    section: BuiltSection,
    symbol: BuiltSymbol,
    size: u64,
    /// A compiled function's System V unwind information (for `.eh_frame`).
    unwind: Option<cranelift_codegen::isa::unwind::systemv::UnwindInfo>,
    /// With hot swap, the finalized definition this one replaces (and what it referred
    /// to): restored if the finalize fails.
    replaces: Option<(Definition, smallvec::SmallVec<[FuncOrDataId; 2]>)>,
}

/// What the next `finalize_definitions` links.
#[derive(Default)]
struct Pending {
    object: Option<BuiltObject>,
    definitions: Vec<PendingDefinition>,
    /// The relocations of every pending definition, with its section.
    relocs: Vec<(BuiltSection, ModuleReloc)>,
    /// Relocations already in ELF's terms (a function from the code cache).
    raw: Vec<RawReloc>,
}

/// A relocation in ELF's terms, its target bound at finalize.
struct RawReloc {
    section: BuiltSection,
    offset: u64,
    r_type: u32,
    target: RawTarget,
    addend: i64,
    owner: FuncOrDataId,
}

/// What a [`RawReloc`] refers to.
enum RawTarget {
    /// A declaration of the module (bound as a compiled function's reference to it is).
    Definition(FuncOrDataId),
    /// A name the module does not declare (a libcall, a host symbol).
    Name(String),
    /// A symbol of the object being built.
    Symbol(BuiltSymbol),
}

/// One finalize's module, and how many of its definitions are still live.
struct Batch {
    module: kiln::Module,
    live: u32,
}

/// What a relocation's target is bound to in the object being built.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum TargetKey {
    Definition(FuncOrDataId),
    Name(String),
}

/// A `cranelift_module::Module` whose code Kiln links and runs (see the crate's
/// documentation). Built with a [`KilnBuilder`]; its inherent methods are
/// `cranelift_jit::JITModule`'s, plus [`KilnModule::free_function`],
/// [`KilnModule::free_data`] and [`KilnModule::session`].
///
/// Dropped, it keeps its code mapped (as `JITModule` does: function pointers taken from
/// it stay valid); [`KilnModule::free_memory`] frees everything, and
/// [`KilnModule::free_function`] one function.
pub struct KilnModule {
    isa: OwnedTargetIsa,
    architecture: Architecture,
    jit: kiln::Jit,
    lib: kiln::LibraryId,
    libcall_names: std::sync::Arc<dyn Fn(ir::LibCall) -> String + Send + Sync>,
    declarations: ModuleDeclarations,
    functions: cranelift_codegen::entity::SecondaryMap<FuncId, Slot>,
    data: cranelift_codegen::entity::SecondaryMap<DataId, Slot>,
    pending: Pending,
    batches: Vec<Option<Batch>>,
    /// For each declaration, how many live definitions (pending or finalized) refer to it.
    referrers: FxHashMap<FuncOrDataId, u32>,
    /// For each live definition, what its code refers to (inline for up to two).
    refers_to: FxHashMap<FuncOrDataId, smallvec::SmallVec<[FuncOrDataId; 2]>>,
    /// Whether [`KilnModule::free_memory`] ran (else the code stays mapped when dropped).
    freed: bool,
    finalizes: u64,
    /// A buffer kept between definitions (their section names).
    scratch: String,
    /// Every function is called through a stub whose body can be replaced.
    hot_swap: bool,
    /// The functions that have a stub (hot swap).
    stubbed: rustc_hash::FxHashSet<FuncId>,
    /// The stubs' modules (hot swap).
    stub_modules: Vec<kiln::Module>,
    /// Where freed functions' stubs lead (hot swap): a trap, linked on first use.
    trap: Option<(kiln::Module, u64)>,
    /// Where compiled functions are kept between processes.
    code_cache: Option<std::sync::Arc<dyn kiln::ObjectCache>>,
    /// The functions' declarations, shared with the lazy functions' compiler (with hot
    /// swap).
    shared_functions: Option<crate::lazy::SharedFunctions>,
    /// The compiler of this module's lazy functions, once it has one.
    lazy: Option<std::sync::Arc<crate::lazy::LazyFunctions>>,
}

/// What a function's body is named with hot swap: the function's name is its stub's.
const BODY_SUFFIX: &str = " (body)";

/// The compiler of hot-swap stubs: never asked (each stub's body is set at the finalize
/// that made it, before its address is handed out).
struct LinkedAtFinalize;

impl kiln::LazyCompiler for LinkedAtFinalize {
    fn compile(&self, name: &str) -> Result<Vec<u8>, kiln::CompileError> {
        Err(format!("{name} is linked by finalize_definitions, not on first call").into())
    }
}

/// Why something of a [`KilnModule`] failed, carried in [`ModuleError::Backend`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum KilnModuleError {
    /// The session failed (creating it, or a link: an unresolved name, an out-of-range
    /// target, memory).
    #[error("{what}: {source}")]
    Session {
        /// What was being done.
        what: String,
        /// Kiln's error.
        #[source]
        source: kiln::Error,
    },
    /// Names the module's code refers to that nothing defines: not the module, the
    /// builder's symbols, its lookups, nor the executor's process.
    #[error("unresolved at finalize_definitions: {}", unresolved.iter().map(|(d, s)| format!("{d} refers to {s}")).collect::<Vec<_>>().join("; "))]
    Unresolved {
        /// (the function or data object, the name it refers to).
        unresolved: Vec<(String, String)>,
    },
    /// A relocation kind Kiln does not link on this architecture.
    #[error("{definition}: relocation {kind:?} at offset {offset:#x} is not supported by Kiln on {architecture}")]
    UnsupportedRelocation {
        /// The function or data object.
        definition: String,
        /// Cranelift's kind.
        kind: Reloc,
        /// Its offset in the definition.
        offset: u32,
        /// The target architecture.
        architecture: Architecture,
    },
    /// A definition is referred to but was never defined and has no name to look up.
    #[error("{definition} refers to {target}, which is anonymous and not defined")]
    AnonymousUndefined {
        /// The function or data object that refers to it.
        definition: String,
        /// The anonymous target's name.
        target: String,
    },
    /// A thread-local of an earlier finalize was referred to (its offset belongs to the
    /// module that holds it).
    #[error("{definition} refers to thread-local {target} of an earlier finalize_definitions; define thread-locals with the code that uses them")]
    ThreadLocalAcrossFinalizes {
        /// The function that refers to it.
        definition: String,
        /// The thread-local.
        target: String,
    },
    /// A free of something that is not finalized.
    #[error("{name} is not finalized ({state})")]
    NotFinalized {
        /// The function or data object.
        name: String,
        /// What it is instead.
        state: &'static str,
    },
    /// A free of something other definitions still refer to.
    #[error("{name} cannot be freed: {} still refer to it", users.join(", "))]
    InUse {
        /// The function or data object.
        name: String,
        /// The definitions that refer to it.
        users: Vec<String>,
    },
    /// `Init::Uninitialized` data.
    #[error("data object {name} is defined without contents (Init::Uninitialized)")]
    Uninitialized {
        /// The data object.
        name: String,
    },
}

fn backend(error: KilnModuleError) -> ModuleError {
    ModuleError::Backend(anyhow::Error::new(error))
}

/// A generator of the builder's lookups, newest first.
struct Lookups(Vec<LookupFn>);

impl kiln::SymbolGenerator for Lookups {
    fn name(&self) -> String {
        "KilnBuilder::symbol_lookup_fn".into()
    }
    fn generate(&mut self, symbol: &str) -> Option<u64> {
        self.0
            .iter()
            .rev()
            .find_map(|lookup| lookup(symbol))
            .map(|p| p as u64)
    }
}

impl KilnModule {
    /// A module from `builder` (as `JITModule::new`). Panics if the session cannot be
    /// made (as `JITModule::new` panics on a bad ISA); [`KilnModule::try_new`] returns
    /// the error instead.
    pub fn new(builder: KilnBuilder) -> Self {
        match Self::try_new(builder) {
            Ok(module) => module,
            Err(error) => panic!("kiln-cranelift: {error}"),
        }
    }

    /// [`KilnModule::new`], with the session's failure as an error.
    pub fn try_new(builder: KilnBuilder) -> ModuleResult<Self> {
        let KilnBuilder {
            isa,
            symbols,
            lookup_symbols,
            libcall_names,
            session,
            process_symbols,
            hot_swap,
            code_cache,
        } = builder;
        use target_lexicon::Architecture as Arch;
        let architecture = match isa.triple().architecture {
            Arch::X86_64 => Architecture::X86_64,
            Arch::Aarch64(_) => Architecture::Aarch64,
            Arch::Riscv64(_) => Architecture::Riscv64,
            other => {
                return Err(ModuleError::Backend(anyhow::anyhow!(
                    "Kiln does not link code for {other}"
                )))
            }
        };
        let session_error = |what: &str| {
            let what = what.to_string();
            move |source| backend(KilnModuleError::Session { what, source })
        };
        let jit = match session {
            Some(jit) => jit,
            None => kiln::Jit::new().map_err(session_error("creating the Kiln session"))?,
        };
        let lib = jit.create_library("cranelift");
        let symbols: HashMap<String, HostAddress> = symbols;
        for (name, HostAddress(address)) in &symbols {
            jit.define_symbol(lib, name, *address as u64)
                .map_err(session_error("defining a builder symbol"))?;
        }
        if !lookup_symbols.is_empty() {
            jit.add_generator(lib, Box::new(Lookups(lookup_symbols)))
                .map_err(session_error("adding the builder's lookups"))?;
        }
        if process_symbols {
            jit.add_process_symbols(lib)
                .map_err(session_error("adding the process's symbols"))?;
        }
        Ok(KilnModule {
            isa,
            architecture,
            jit,
            lib,
            libcall_names: std::sync::Arc::from(libcall_names),
            declarations: ModuleDeclarations::default(),
            functions: cranelift_codegen::entity::SecondaryMap::new(),
            data: cranelift_codegen::entity::SecondaryMap::new(),
            pending: Pending::default(),
            batches: Vec::new(),
            referrers: FxHashMap::default(),
            refers_to: FxHashMap::default(),
            freed: false,
            finalizes: 0,
            scratch: String::new(),
            hot_swap,
            stubbed: Default::default(),
            stub_modules: Vec::new(),
            trap: None,
            code_cache,
            shared_functions: hot_swap.then(Default::default),
            lazy: None,
        })
    }

    /// The Kiln session the module links into (its executor, listeners, statistics).
    pub fn session(&self) -> &kiln::Jit {
        &self.jit
    }

    fn slot(&self, id: FuncOrDataId) -> &Slot {
        match id {
            FuncOrDataId::Func(f) => &self.functions[f],
            FuncOrDataId::Data(d) => &self.data[d],
        }
    }

    fn slot_mut(&mut self, id: FuncOrDataId) -> &mut Slot {
        match id {
            FuncOrDataId::Func(f) => &mut self.functions[f],
            FuncOrDataId::Data(d) => &mut self.data[d],
        }
    }

    fn is_thread_local(&self, id: FuncOrDataId) -> bool {
        matches!(id, FuncOrDataId::Data(d) if self.declarations.get_data_decl(d).tls)
    }

    fn name_of(&self, id: FuncOrDataId) -> String {
        self.name(id).into_owned()
    }

    /// The name a definition has in the link (borrowed; made for an anonymous one).
    fn name(&self, id: FuncOrDataId) -> std::borrow::Cow<'_, str> {
        match id {
            FuncOrDataId::Func(f) => self.declarations.get_function_decl(f).linkage_name(f),
            FuncOrDataId::Data(d) => self.declarations.get_data_decl(d).linkage_name(d),
        }
    }

    /// Finalizes every function and data object defined since the last finalize: one
    /// link of them all. Then [`KilnModule::get_finalized_function`] and
    /// [`KilnModule::get_finalized_data`] give their addresses.
    ///
    /// An error (an unresolved name — named with the function that uses it —, a
    /// relocation Kiln does not handle, memory) leaves everything finalized before as it
    /// was; the definitions of the failed finalize are dropped (define them again to
    /// retry).
    pub fn finalize_definitions(&mut self) -> ModuleResult<()> {
        let Pending {
            object,
            definitions,
            relocs,
            raw,
        } = std::mem::take(&mut self.pending);
        let Some(object) = object else {
            return Ok(());
        };
        let result = self.link_batch(object, &definitions, &relocs, &raw);
        if result.is_err() {
            for d in &definitions {
                self.forget_references(d.id);
                // A redefinition that failed leaves the definition it was to replace.
                *self.slot_mut(d.id) = match &d.replaces {
                    Some((old, refs)) => {
                        self.record_references(d.id, refs);
                        Slot::Finalized(old.clone())
                    }
                    None => Slot::Empty,
                };
            }
        }
        result
    }

    /// Binds the relocations' targets, links the object as one private module and
    /// records where each definition went.
    fn link_batch(
        &mut self,
        mut object: BuiltObject,
        definitions: &[PendingDefinition],
        relocs: &[(BuiltSection, ModuleReloc)],
        raw: &[RawReloc],
    ) -> ModuleResult<()> {
        let mut targets: FxHashMap<TargetKey, BuiltSymbol> = FxHashMap::default();
        for d in definitions {
            targets.insert(TargetKey::Definition(d.id), d.symbol);
        }
        // With hot swap, the functions defined for the first time get their stubs now
        // (their bodies are linked below, then set): references to every function of the
        // module bind to its stub, by name.
        if self.hot_swap {
            let new: Vec<String> = definitions
                .iter()
                .filter_map(|d| match d.id {
                    FuncOrDataId::Func(f) if !self.stubbed.contains(&f) => Some(self.name_of(d.id)),
                    _ => None,
                })
                .collect();
            if !new.is_empty() {
                let names: Vec<&str> = new.iter().map(String::as_str).collect();
                let stubs = self
                    .jit
                    .add_lazy_functions(self.lib, &names, std::sync::Arc::new(LinkedAtFinalize))
                    .map_err(|source| {
                        backend(KilnModuleError::Session {
                            what: "making the functions' stubs".into(),
                            source,
                        })
                    })?;
                self.stub_modules.push(stubs);
                for d in definitions {
                    if let FuncOrDataId::Func(f) = d.id {
                        self.stubbed.insert(f);
                    }
                }
            }
        }
        let owners: FxHashMap<BuiltSection, FuncOrDataId> =
            definitions.iter().map(|d| (d.section, d.id)).collect();
        let owner_of = |section: BuiltSection| owners.get(&section).copied();
        let mut last_hi20: Option<u64> = None;
        for (section, reloc) in relocs {
            let owner = owner_of(*section);
            let owner_name = || owner.map(|id| self.name_of(id)).unwrap_or_default();
            let r_type = elf_type(self.architecture, reloc.kind).ok_or_else(|| {
                backend(KilnModuleError::UnsupportedRelocation {
                    definition: owner_name(),
                    kind: reloc.kind,
                    offset: reloc.offset,
                    architecture: self.architecture,
                })
            })?;
            match reloc.kind {
                Reloc::RiscvPCRelHi20 => last_hi20 = Some(u64::from(reloc.offset)),
                Reloc::RiscvPCRelLo12I => {
                    // ELF's low part names a label at its high part's instruction.
                    let hi = last_hi20.ok_or_else(|| {
                        ModuleError::Backend(anyhow::anyhow!(
                            "{}: a %pcrel_lo at {:#x} without its %pcrel_hi",
                            owner_name(),
                            reloc.offset
                        ))
                    })?;
                    let label = crate::code_cache::pcrel_label(&mut object, *section, hi);
                    object.add_relocation(*section, u64::from(reloc.offset), r_type, label, 0);
                    continue;
                }
                _ => {}
            }
            let (symbol, extra) =
                self.target_symbol(&mut object, &mut targets, &reloc.name, owner)?;
            object.add_relocation(
                *section,
                u64::from(reloc.offset),
                r_type,
                symbol,
                reloc.addend.wrapping_add(extra),
            );
        }
        for r in raw {
            let (symbol, extra) = match &r.target {
                RawTarget::Definition(id) => self.target_symbol(
                    &mut object,
                    &mut targets,
                    &ModuleRelocTarget::from(*id),
                    Some(r.owner),
                )?,
                RawTarget::Name(name) => (
                    self.named(
                        &mut object,
                        &mut targets,
                        name.clone(),
                        BuiltSymbolKind::Unknown,
                        false,
                    ),
                    0,
                ),
                RawTarget::Symbol(symbol) => (*symbol, 0),
            };
            object.add_relocation(
                r.section,
                r.offset,
                r.r_type,
                symbol,
                r.addend.wrapping_add(extra),
            );
        }
        let unwound: Vec<_> = definitions
            .iter()
            .filter_map(|d| Some((d.symbol, d.unwind.as_ref()?)))
            .collect();
        crate::unwind::add_eh_frame(&*self.isa, self.architecture, &mut object, &unwound)
            .map_err(|e| ModuleError::Backend(anyhow::anyhow!(e)))?;
        self.finalizes += 1;
        let name = format!("cranelift finalize {}", self.finalizes);
        let input = ObjectInput::built(name.clone(), object).map_err(|e| {
            backend(KilnModuleError::Session {
                what: name.clone(),
                source: e.into(),
            })
        })?;
        let module = match self.jit.link_private(self.lib, input) {
            Ok(module) => module,
            Err(kiln::Error::Link(kiln::LinkError::UndefinedSymbols { symbols })) => {
                // Named by the definitions whose code refers to them.
                let mut unresolved = Vec::new();
                for missing in &symbols.0 {
                    for (section, reloc) in relocs {
                        let refers = match &reloc.name {
                            ModuleRelocTarget::LibCall(l) => {
                                (self.libcall_names)(*l) == missing.symbol
                            }
                            ModuleRelocTarget::User { .. } => {
                                let id = if ModuleDeclarations::is_function(&reloc.name) {
                                    FuncOrDataId::Func(FuncId::from_name(&reloc.name))
                                } else {
                                    FuncOrDataId::Data(DataId::from_name(&reloc.name))
                                };
                                self.name(id) == missing.symbol
                            }
                            _ => false,
                        };
                        if let (true, Some(owner)) = (refers, owner_of(*section)) {
                            let pair = (self.name_of(owner), missing.symbol.clone());
                            if !unresolved.contains(&pair) {
                                unresolved.push(pair);
                            }
                        }
                    }
                }
                return Err(backend(KilnModuleError::Unresolved { unresolved }));
            }
            Err(source) => {
                return Err(backend(KilnModuleError::Session {
                    what: format!("linking {name}"),
                    source,
                }))
            }
        };
        let batch = self.batches.len() as u32;
        let mut addresses = Vec::with_capacity(definitions.len());
        for d in definitions {
            if self.is_thread_local(d.id) {
                // Each thread has its own: the code reaches it with `tls_value`.
                addresses.push((0, 0));
                continue;
            }
            let swapped = self.hot_swap && matches!(d.id, FuncOrDataId::Func(_));
            let mut symbol_name = self.name_of(d.id);
            if swapped {
                symbol_name.push_str(BODY_SUFFIX);
            }
            let body = module.symbol(&symbol_name).ok_or_else(|| {
                ModuleError::Backend(anyhow::anyhow!(
                    "{name}: the linked module does not define {symbol_name}"
                ))
            })?;
            addresses.push((body, body));
        }
        if self.hot_swap {
            // Each stub to its new body (an old one is retired: freed once no code guard
            // taken before now is held).
            for (d, (address, body)) in definitions.iter().zip(addresses.iter_mut()) {
                if !matches!(d.id, FuncOrDataId::Func(_)) {
                    continue;
                }
                let function = self.name_of(d.id);
                let session = |source| {
                    backend(KilnModuleError::Session {
                        what: format!("making {function}'s new body current"),
                        source,
                    })
                };
                self.jit
                    .set_function_body(self.lib, &function, *body, &module)
                    .map_err(session)?;
                *address = self.jit.lookup(self.lib, &function).map_err(session)?;
            }
        }
        for (d, (address, body)) in definitions.iter().zip(addresses) {
            if let Some((old, _)) = &d.replaces {
                self.release(old.batch);
            }
            *self.slot_mut(d.id) = Slot::Finalized(Definition {
                address,
                body,
                size: d.size,
                batch,
            });
        }
        self.batches.push(Some(Batch {
            module,
            live: definitions.len() as u32,
        }));
        Ok(())
    }

    /// The symbol of the object being built that `target` binds to, and an addend to add.
    fn target_symbol(
        &self,
        object: &mut BuiltObject,
        targets: &mut FxHashMap<TargetKey, BuiltSymbol>,
        target: &ModuleRelocTarget,
        owner: Option<FuncOrDataId>,
    ) -> ModuleResult<(BuiltSymbol, i64)> {
        let (id, extra) = match target {
            ModuleRelocTarget::User { .. } => {
                let id = if ModuleDeclarations::is_function(target) {
                    FuncOrDataId::Func(FuncId::from_name(target))
                } else {
                    FuncOrDataId::Data(DataId::from_name(target))
                };
                (id, 0)
            }
            ModuleRelocTarget::FunctionOffset(f, offset) => {
                (FuncOrDataId::Func(*f), i64::from(*offset))
            }
            ModuleRelocTarget::LibCall(libcall) => {
                let name = (self.libcall_names)(*libcall);
                return Ok((
                    self.named(object, targets, name, BuiltSymbolKind::Function, false),
                    0,
                ));
            }
            ModuleRelocTarget::KnownSymbol(known) => {
                let name = match known {
                    ir::KnownSymbol::ElfGlobalOffsetTable => "_GLOBAL_OFFSET_TABLE_",
                    ir::KnownSymbol::CoffTlsIndex => "_tls_index",
                };
                return Ok((
                    self.named(object, targets, name.into(), BuiltSymbolKind::Data, false),
                    0,
                ));
            }
        };
        if self.hot_swap
            && matches!(id, FuncOrDataId::Func(_))
            && matches!(target, ModuleRelocTarget::User { .. })
        {
            // Its stub, which the library publishes under its name.
            let name = self.name_of(id);
            return Ok((
                self.named(object, targets, name, BuiltSymbolKind::Function, false),
                extra,
            ));
        }
        if let Some(&symbol) = targets.get(&TargetKey::Definition(id)) {
            return Ok((symbol, extra));
        }
        let (kind, preemptible, tls, anonymous) = match id {
            FuncOrDataId::Func(f) => {
                let decl = self.declarations.get_function_decl(f);
                (
                    BuiltSymbolKind::Function,
                    decl.linkage == Linkage::Preemptible,
                    false,
                    decl.name.is_none(),
                )
            }
            FuncOrDataId::Data(d) => {
                let decl = self.declarations.get_data_decl(d);
                let kind = if decl.tls {
                    BuiltSymbolKind::ThreadLocal
                } else {
                    BuiltSymbolKind::Data
                };
                (
                    kind,
                    decl.linkage == Linkage::Preemptible,
                    decl.tls,
                    decl.name.is_none(),
                )
            }
        };
        let name = self.name_of(id);
        let symbol = match self.slot(id) {
            Slot::Finalized(definition) => {
                if tls {
                    return Err(backend(KilnModuleError::ThreadLocalAcrossFinalizes {
                        definition: owner.map(|o| self.name_of(o)).unwrap_or_default(),
                        target: name,
                    }));
                }
                // Bound to its address: private modules are in no index.
                object.add_absolute_symbol(&name, definition.address, kind)
            }
            _ if anonymous => {
                return Err(backend(KilnModuleError::AnonymousUndefined {
                    definition: owner.map(|o| self.name_of(o)).unwrap_or_default(),
                    target: name,
                }))
            }
            _ => {
                // Declared, not defined here: resolved as the library resolves names.
                return Ok((self.named(object, targets, name, kind, preemptible), extra));
            }
        };
        targets.insert(TargetKey::Definition(id), symbol);
        Ok((symbol, extra))
    }

    /// An undefined name of the object being built (one symbol per name).
    fn named(
        &self,
        object: &mut BuiltObject,
        targets: &mut FxHashMap<TargetKey, BuiltSymbol>,
        name: String,
        kind: BuiltSymbolKind,
        weak: bool,
    ) -> BuiltSymbol {
        let binding = if weak {
            SymbolBinding::Weak
        } else {
            SymbolBinding::Global
        };
        *targets
            .entry(TargetKey::Name(name))
            .or_insert_with_key(|key| match key {
                TargetKey::Name(name) => object.add_symbol(name, None, binding, kind),
                TargetKey::Definition(_) => unreachable!("keyed by name"),
            })
    }

    /// The address of a finalized function (as `JITModule::get_finalized_function`).
    ///
    /// # Panics
    /// If the function is not finalized (not defined, pending, or freed), as
    /// `JITModule`'s does.
    pub fn get_finalized_function(&self, func_id: FuncId) -> *const u8 {
        match &self.functions[func_id] {
            Slot::Finalized(d) => d.address as *const u8,
            Slot::Pending => panic!("function not yet finalized"),
            Slot::Empty => panic!("function must be compiled before it can be finalized"),
        }
    }

    /// The address and size of a finalized data object (as
    /// `JITModule::get_finalized_data`). A thread-local has an address per thread: its
    /// address here is null (its code reaches it with `tls_value`).
    ///
    /// # Panics
    /// If the data object is not finalized, as `JITModule`'s does.
    pub fn get_finalized_data(&self, data_id: DataId) -> (*const u8, usize) {
        match &self.data[data_id] {
            Slot::Finalized(d) => (d.address as *const u8, d.size as usize),
            Slot::Pending => panic!("data object not yet finalized"),
            Slot::Empty => panic!("data object must be compiled before it can be finalized"),
        }
    }

    /// The address `name` resolves to (as `JITModule::get_address`): a finalized
    /// definition's, or the library's resolution of a declared name; null for an
    /// unresolved preemptible name.
    ///
    /// # Panics
    /// If a name that must resolve does not (as `JITModule`'s does).
    pub fn get_address(&self, name: &ModuleRelocTarget) -> *const u8 {
        let lookup = |symbol: &str| self.jit.lookup(self.lib, symbol).ok();
        match name {
            ModuleRelocTarget::User { .. } => {
                let (id, linkage) = if ModuleDeclarations::is_function(name) {
                    let f = FuncId::from_name(name);
                    (
                        FuncOrDataId::Func(f),
                        self.declarations.get_function_decl(f).linkage,
                    )
                } else {
                    let d = DataId::from_name(name);
                    (
                        FuncOrDataId::Data(d),
                        self.declarations.get_data_decl(d).linkage,
                    )
                };
                if let Slot::Finalized(d) = self.slot(id) {
                    return d.address as *const u8;
                }
                let symbol = self.name_of(id);
                match lookup(&symbol) {
                    Some(address) => address as *const u8,
                    None if linkage == Linkage::Preemptible => std::ptr::null(),
                    None => panic!("can't resolve symbol {symbol}"),
                }
            }
            ModuleRelocTarget::LibCall(libcall) => {
                let symbol = (self.libcall_names)(*libcall);
                match lookup(&symbol) {
                    Some(address) => address as *const u8,
                    None => panic!("can't resolve libcall {symbol}"),
                }
            }
            ModuleRelocTarget::FunctionOffset(f, offset) => match &self.functions[*f] {
                Slot::Finalized(d) => (d.address as *const u8).wrapping_add(*offset as usize),
                _ => panic!("function {f} is not finalized"),
            },
            ModuleRelocTarget::KnownSymbol(known) => {
                panic!("no address for the linker's symbol {known:?}")
            }
        }
    }

    /// Defines function `id` from the code cache ([`KilnBuilder::code_cache`]) if it holds
    /// it under `key` — no compile: its code, relocations and unwind table as stored by
    /// [`KilnModule::define_function_and_cache`], in this process or an earlier one.
    /// `Ok(false)` on a miss (or with no cache, or a damaged entry, which is removed):
    /// compile it then. The key is the caller's name for what the function is made from
    /// (its source, say); the function's name, the target and every code generation flag
    /// are added to it.
    ///
    /// [`KilnBuilder::code_cache`]: crate::KilnBuilder::code_cache
    pub fn define_function_from_cache(&mut self, id: FuncId, key: &[u8]) -> ModuleResult<bool> {
        let Some(cache) = self.code_cache.clone() else {
            return Ok(false);
        };
        let me = FuncOrDataId::Func(id);
        self.start_definition(me)?;
        let name = self.name_of(me);
        let key = crate::code_cache::key(&*self.isa, &name, key);
        let entry = match cache.get(&key) {
            Ok(Some(entry)) => entry,
            Ok(None) => return Ok(false),
            Err(error) => {
                tracing::warn!(%error, function = %name, "code cache not read");
                return Ok(false);
            }
        };
        let cached = match crate::code_cache::read(&entry, &name, self.architecture) {
            Ok(cached) => cached,
            Err(error) => {
                tracing::warn!(%error, function = %name, "a damaged code cache entry, removed");
                let _ = cache.remove(&key);
                return Ok(false);
            }
        };
        let (_, _, align, code) = &cached.sections[0];
        self.add_pending(
            me,
            BuiltSectionKind::Code,
            *align,
            Some(code),
            cached.size.max(code.len() as u64),
            &[],
        );
        let Some(definition) = self.pending.definitions.last() else {
            return Ok(false);
        };
        let (text, function) = (definition.section, definition.symbol);
        let architecture = self.architecture;
        let object = self
            .pending
            .object
            .get_or_insert_with(|| BuiltObject::new(architecture));
        let mut sections = vec![text];
        for (section_name, kind, align, bytes) in &cached.sections[1..] {
            sections.push(object.add_section(section_name, *kind, *align, bytes));
        }
        let mut targets = Vec::new();
        for (at, offset, r_type, target, addend) in cached.relocs {
            let section = sections[at];
            let target = match target {
                crate::code_cache::CachedTarget::Itself => RawTarget::Symbol(function),
                crate::code_cache::CachedTarget::Label(s, value) => {
                    RawTarget::Symbol(crate::code_cache::pcrel_label(object, sections[s], value))
                }
                crate::code_cache::CachedTarget::Name(n) => match self.declarations.get_name(&n) {
                    Some(declared) => {
                        targets.push(declared);
                        RawTarget::Definition(declared)
                    }
                    None => RawTarget::Name(n),
                },
            };
            self.pending.raw.push(RawReloc {
                section,
                offset,
                r_type,
                target,
                addend,
                owner: me,
            });
        }
        targets.sort_unstable();
        targets.dedup();
        targets.retain(|&t| t != me);
        self.record_references(me, &targets);
        Ok(true)
    }

    /// `define_function`, then the compiled function stored in the code cache under `key`
    /// (see [`KilnModule::define_function_from_cache`]). A function that cannot be cached
    /// (it refers to an anonymous declaration, whose name is only this module's) or a
    /// store that fails is defined all the same, with a warning.
    pub fn define_function_and_cache(
        &mut self,
        id: FuncId,
        key: &[u8],
        ctx: &mut cranelift_codegen::Context,
    ) -> ModuleResult<()> {
        self.define_function(id, ctx)?;
        let Some(cache) = self.code_cache.clone() else {
            return Ok(());
        };
        let me = FuncOrDataId::Func(id);
        let name = self.name_of(me);
        let Some(code) = ctx.compiled_code() else {
            return Ok(());
        };
        let relocs: Vec<ModuleReloc> = code
            .buffer
            .relocs()
            .iter()
            .map(|r| ModuleReloc::from_mach_reloc(r, &ctx.func, id))
            .collect();
        let align = self.function_align(u64::from(code.buffer.alignment));
        let unwind = self
            .pending
            .definitions
            .last()
            .and_then(|d| d.unwind.as_ref());
        let name_of =
            |target: &ModuleRelocTarget| -> Result<(crate::code_cache::Target, i64), String> {
                use crate::code_cache::Target;
                let (id, extra) = match target {
                    ModuleRelocTarget::User { .. } if ModuleDeclarations::is_function(target) => {
                        (FuncOrDataId::Func(FuncId::from_name(target)), 0)
                    }
                    ModuleRelocTarget::User { .. } => {
                        (FuncOrDataId::Data(DataId::from_name(target)), 0)
                    }
                    ModuleRelocTarget::FunctionOffset(f, offset) => {
                        (FuncOrDataId::Func(*f), i64::from(*offset))
                    }
                    ModuleRelocTarget::LibCall(libcall) => {
                        return Ok((Target::Name((self.libcall_names)(*libcall)), 0))
                    }
                    ModuleRelocTarget::KnownSymbol(ir::KnownSymbol::ElfGlobalOffsetTable) => {
                        return Ok((Target::Name("_GLOBAL_OFFSET_TABLE_".into()), 0))
                    }
                    ModuleRelocTarget::KnownSymbol(ir::KnownSymbol::CoffTlsIndex) => {
                        return Ok((Target::Name("_tls_index".into()), 0))
                    }
                };
                if id == me {
                    return Ok((Target::Itself, extra));
                }
                let anonymous = match id {
                    FuncOrDataId::Func(f) => self.declarations.get_function_decl(f).name.is_none(),
                    FuncOrDataId::Data(d) => self.declarations.get_data_decl(d).name.is_none(),
                };
                if anonymous {
                    return Err(format!(
                        "it refers to {}, which is anonymous",
                        self.name(id)
                    ));
                }
                Ok((Target::Name(self.name_of(id)), extra))
            };
        let stored = crate::code_cache::function_object(
            &*self.isa,
            self.architecture,
            &crate::code_cache::CompiledFunction {
                name: &name,
                code: code.code_buffer(),
                align,
                relocs: &relocs,
                unwind,
            },
            name_of,
        )
        .and_then(|object| {
            let key = crate::code_cache::key(&*self.isa, &name, key);
            cache.put(&key, &object).map_err(|e| e.to_string())
        });
        if let Err(error) = stored {
            tracing::warn!(%error, function = %name, "not stored in the code cache");
        }
        Ok(())
    }

    /// Declares function `name` as lazy (with [`KilnBuilder::hot_swap`]): its stub exists
    /// at once ([`KilnModule::get_finalized_function`] gives it), and its first call builds
    /// it with `compile`, compiles and links it on the calling thread, then continues into
    /// it; later calls go straight to the body. `compile` builds the function in the
    /// [`LazyContext`](crate::LazyContext) it is given, and may call the module's other
    /// functions ([`LazyContext::declare_func_in_func`](crate::LazyContext::declare_func_in_func))
    /// and the host's names; a compile that fails leaves calls to Kiln's fallback (which
    /// returns 0), and the failure in the session's `lazy_failures`. Defined again
    /// (`define_function` and a finalize) or freed, it is as any hot-swap function.
    ///
    /// [`KilnBuilder::hot_swap`]: crate::KilnBuilder::hot_swap
    pub fn declare_lazy_function(
        &mut self,
        name: &str,
        linkage: Linkage,
        signature: &ir::Signature,
        compile: crate::lazy::LazyCompile,
    ) -> ModuleResult<FuncId> {
        if !self.hot_swap {
            return Err(ModuleError::Backend(anyhow::anyhow!(
                "lazy function {name}: lazy functions are called through stubs, which KilnBuilder::hot_swap(true) gives every function"
            )));
        }
        let id = self.declare_function(name, linkage, signature)?;
        self.start_definition(FuncOrDataId::Func(id))?;
        let function = self.name_of(FuncOrDataId::Func(id));
        let lazy = match &self.lazy {
            Some(lazy) => lazy.clone(),
            None => {
                let lazy = std::sync::Arc::new(crate::lazy::LazyFunctions {
                    isa: self.isa.clone(),
                    architecture: self.architecture,
                    functions: self.shared_functions.clone().unwrap_or_default(),
                    libcall_names: self.libcall_names.clone(),
                    callbacks: Default::default(),
                });
                self.lazy = Some(lazy.clone());
                lazy
            }
        };
        if let Ok(mut callbacks) = lazy.callbacks.write() {
            callbacks.push((function.clone(), id, compile));
        }
        let session = |source| {
            backend(KilnModuleError::Session {
                what: format!("making lazy function {function}'s stub"),
                source,
            })
        };
        let stubs = self
            .jit
            .add_lazy_functions(self.lib, &[function.as_str()], lazy)
            .map_err(session)?;
        self.stub_modules.push(stubs);
        self.stubbed.insert(id);
        let address = self.jit.lookup(self.lib, &function).map_err(session)?;
        self.functions[id] = Slot::Finalized(Definition {
            address,
            body: 0,
            size: 0,
            batch: u32::MAX, // in no finalize's module
        });
        Ok(id)
    }

    /// Shares function `id`'s declaration with the lazy functions' compiler.
    fn share_declaration(&mut self, id: FuncId) {
        let Some(shared) = &self.shared_functions else {
            return;
        };
        let decl = self.declarations.get_function_decl(id);
        let declared = crate::lazy::DeclaredFunction {
            name: decl.linkage_name(id).into_owned(),
            signature: decl.signature.clone(),
            linkage: decl.linkage,
        };
        if let Ok(mut functions) = shared.write() {
            let index = id.as_u32() as usize;
            if functions.len() <= index {
                functions.resize(index + 1, None);
            }
            functions[index] = Some(declared);
        }
    }

    /// The finalized function `address` falls in, and the offset into it: for
    /// backtraces and crash reports of JIT code (its frames carry no symbol table a
    /// debugger reads; with the session's debug support, gdb and perf see them too).
    pub fn function_at(&self, address: *const u8) -> Option<(String, usize)> {
        let address = address as u64;
        self.functions.iter().find_map(|(f, slot)| match slot {
            Slot::Finalized(d) if (d.body..d.body + d.size).contains(&address) => Some((
                self.name_of(FuncOrDataId::Func(f)),
                (address - d.body) as usize,
            )),
            _ => None,
        })
    }

    /// Frees one finalized function: its name can be defined again, and once every
    /// definition of its `finalize_definitions` is freed, their memory is returned and
    /// filled with trap instructions (a stale call traps, never runs other code).
    ///
    /// Refused while another live definition (finalized or pending) refers to it.
    pub fn free_function(&mut self, func_id: FuncId) -> ModuleResult<()> {
        self.free(FuncOrDataId::Func(func_id))
    }

    /// [`KilnModule::free_function`] for a data object.
    pub fn free_data(&mut self, data_id: DataId) -> ModuleResult<()> {
        self.free(FuncOrDataId::Data(data_id))
    }

    fn free(&mut self, id: FuncOrDataId) -> ModuleResult<()> {
        let name = self.name_of(id);
        let batch = match self.slot(id) {
            Slot::Finalized(d) => d.batch,
            Slot::Pending => {
                return Err(backend(KilnModuleError::NotFinalized {
                    name,
                    state: "defined, not yet finalized",
                }))
            }
            Slot::Empty => {
                return Err(backend(KilnModuleError::NotFinalized {
                    name,
                    state: "not defined",
                }))
            }
        };
        if self.referrers.get(&id).is_some_and(|&n| n > 0) {
            // Who they are (a scan, on this error only).
            let mut users: Vec<String> = self
                .refers_to
                .iter()
                .filter(|(_, targets)| targets.contains(&id))
                .map(|(&u, _)| self.name_of(u))
                .collect();
            users.sort();
            return Err(backend(KilnModuleError::InUse { name, users }));
        }
        if self.hot_swap && matches!(id, FuncOrDataId::Func(_)) {
            // Its stub leads to a trap from now on; the body is retired (freed once no
            // code guard taken before now is held).
            let trap = self.trap()?;
            self.jit
                .retire_function(self.lib, &name, trap)
                .map_err(|source| {
                    backend(KilnModuleError::Session {
                        what: format!("retiring {name}"),
                        source,
                    })
                })?;
        }
        *self.slot_mut(id) = Slot::Empty;
        self.forget_references(id);
        self.release(batch);
        Ok(())
    }

    /// One definition of `batch` is gone: the last one takes the batch's module with it
    /// (its memory freed and poisoned once no other handle holds it).
    fn release(&mut self, batch: u32) {
        if let Some(Some(b)) = self.batches.get_mut(batch as usize) {
            b.live -= 1;
            if b.live == 0 {
                self.batches[batch as usize] = None;
            }
        }
    }

    /// The address of a function that traps, linked on first use: where a freed
    /// function's stub leads.
    fn trap(&mut self) -> ModuleResult<u64> {
        if let Some((_, address)) = &self.trap {
            return Ok(*address);
        }
        // `ud2`, `udf #0`, and RISC-V's all-zero word, an illegal instruction.
        let code: &[u8] = match self.architecture {
            Architecture::X86_64 => &[0x0f, 0x0b],
            Architecture::Aarch64 | Architecture::Riscv64 => &[0, 0, 0, 0],
        };
        let mut object = BuiltObject::new(self.architecture);
        let text = object.add_section(".text.trap", BuiltSectionKind::Code, 16, code);
        object.add_symbol(
            "kiln_cranelift_freed_function",
            Some((text, 0, code.len() as u64)),
            SymbolBinding::Global,
            BuiltSymbolKind::Function,
        );
        let session = |source| {
            backend(KilnModuleError::Session {
                what: "linking the trap of freed functions".into(),
                source,
            })
        };
        let input =
            ObjectInput::built("freed functions' trap", object).map_err(|e| session(e.into()))?;
        let module = self.jit.link_private(self.lib, input).map_err(session)?;
        let address = module
            .symbol("kiln_cranelift_freed_function")
            .ok_or_else(|| ModuleError::Backend(anyhow::anyhow!("the trap has no address")))?;
        self.trap = Some((module, address));
        Ok(address)
    }

    /// Records that `id`'s code refers to `targets`.
    fn record_references(&mut self, id: FuncOrDataId, targets: &[FuncOrDataId]) {
        if targets.is_empty() {
            return;
        }
        for &t in targets {
            *self.referrers.entry(t).or_default() += 1;
        }
        self.refers_to.insert(id, targets.iter().copied().collect());
    }

    fn forget_references(&mut self, id: FuncOrDataId) {
        if let Some(targets) = self.refers_to.remove(&id) {
            for t in targets.iter() {
                if let Some(count) = self.referrers.get_mut(t) {
                    *count -= 1;
                    if *count == 0 {
                        self.referrers.remove(t);
                    }
                }
            }
        }
    }

    /// Frees everything the module linked (as `JITModule::free_memory`).
    ///
    /// # Safety
    /// No function of the module may be running, nor be called afterwards: their memory
    /// is unmapped or reused (a call into it traps at best).
    pub unsafe fn free_memory(mut self) {
        self.freed = true;
        self.batches.clear();
    }

    /// A function's alignment: what its code asks for, at least the ISA's minimum.
    fn function_align(&self, code: u64) -> u64 {
        code.max(u64::from(self.isa.function_alignment().minimum))
            .max(self.isa.symbol_alignment())
    }

    fn start_definition(&mut self, id: FuncOrDataId) -> ModuleResult<()> {
        let (definable, name) = match id {
            FuncOrDataId::Func(f) => {
                let decl = self.declarations.get_function_decl(f);
                (decl.linkage.is_definable(), decl.linkage_name(f))
            }
            FuncOrDataId::Data(d) => {
                let decl = self.declarations.get_data_decl(d);
                (decl.linkage.is_definable(), decl.linkage_name(d))
            }
        };
        if !definable {
            return Err(ModuleError::InvalidImportDefinition(name.into_owned()));
        }
        match self.slot(id) {
            Slot::Empty => Ok(()),
            // Hot swap: a finalized function is defined again; its next finalize makes the
            // new body current (callers reach it through the function's stub).
            Slot::Finalized(_) if self.hot_swap && matches!(id, FuncOrDataId::Func(_)) => Ok(()),
            _ => Err(ModuleError::DuplicateDefinition(name.into_owned())),
        }
    }

    /// Adds a definition's section and symbol to the pending object.
    #[allow(clippy::too_many_arguments)]
    fn add_pending(
        &mut self,
        id: FuncOrDataId,
        kind: BuiltSectionKind,
        align: u64,
        bytes: Option<&[u8]>,
        size: u64,
        relocs: &[ModuleReloc],
    ) {
        let (symbol_kind, prefix) = match kind {
            BuiltSectionKind::Code => (BuiltSymbolKind::Function, ".text."),
            BuiltSectionKind::ThreadData => (BuiltSymbolKind::ThreadLocal, ".tdata."),
            BuiltSectionKind::ThreadZeroed => (BuiltSymbolKind::ThreadLocal, ".tbss."),
            BuiltSectionKind::ReadOnly => (BuiltSymbolKind::Data, ".rodata."),
            BuiltSectionKind::Data => (BuiltSymbolKind::Data, ".data."),
            BuiltSectionKind::Zeroed => (BuiltSymbolKind::Data, ".bss."),
        };
        let linkage = match id {
            FuncOrDataId::Func(f) => self.declarations.get_function_decl(f).linkage,
            FuncOrDataId::Data(d) => self.declarations.get_data_decl(d).linkage,
        };
        let binding = if linkage == Linkage::Preemptible {
            SymbolBinding::Weak
        } else {
            SymbolBinding::Global
        };
        // `.text.NAME` and so on: what a debugger or an error shows for the definition
        // (made in a buffer kept between definitions: no allocation per definition).
        let mut section_name = std::mem::take(&mut self.scratch);
        section_name.clear();
        section_name.push_str(prefix);
        section_name.push_str(&self.name(id));
        let architecture = self.architecture;
        let object = self
            .pending
            .object
            .get_or_insert_with(|| BuiltObject::with_capacity(architecture, 1, 2, 64, 2));
        let section = match bytes {
            Some(bytes) => object.add_section(&section_name, kind, align, bytes),
            None => object.add_zeroed_section(&section_name, kind, align, size),
        };
        // With hot swap a function's body has a name of its own (` (body)` after the
        // function's): the function's name is its stub's, which references bind to.
        let body = self.hot_swap && matches!(id, FuncOrDataId::Func(_));
        if body {
            section_name.push_str(BODY_SUFFIX);
        }
        let name = &section_name[prefix.len()..];
        let symbol = object.add_symbol(name, Some((section, 0, size)), binding, symbol_kind);
        self.scratch = section_name;
        // A redefinition (hot swap) replaces the finalized definition at finalize.
        let replaces = match self.slot(id) {
            Slot::Finalized(d) => {
                let d = d.clone();
                let refs = self.refers_to.get(&id).cloned().unwrap_or_default();
                self.forget_references(id);
                Some((d, refs))
            }
            _ => None,
        };
        self.pending
            .relocs
            .extend(relocs.iter().map(|r| (section, r.clone())));
        self.pending.definitions.push(PendingDefinition {
            id,
            section,
            symbol,
            size,
            unwind: None,
            replaces,
        });
        *self.slot_mut(id) = Slot::Pending;
        let mut targets: smallvec::SmallVec<[FuncOrDataId; 8]> = relocs
            .iter()
            .filter_map(|r| match &r.name {
                ModuleRelocTarget::User { .. } if ModuleDeclarations::is_function(&r.name) => {
                    Some(FuncOrDataId::Func(FuncId::from_name(&r.name)))
                }
                ModuleRelocTarget::User { .. } => {
                    Some(FuncOrDataId::Data(DataId::from_name(&r.name)))
                }
                ModuleRelocTarget::FunctionOffset(f, _) => Some(FuncOrDataId::Func(*f)),
                _ => None,
            })
            .filter(|&t| t != id)
            .collect();
        targets.sort_unstable();
        targets.dedup();
        self.record_references(id, &targets);
    }
}

impl Drop for KilnModule {
    fn drop(&mut self) {
        if !self.freed {
            // As JITModule: dropping the module keeps its code (pointers taken from it stay
            // valid); `free_memory` or `free_function` free it.
            for batch in self.batches.drain(..).flatten() {
                std::mem::forget(batch.module);
            }
        }
    }
}

impl Module for KilnModule {
    fn isa(&self) -> &dyn TargetIsa {
        &*self.isa
    }

    fn declarations(&self) -> &ModuleDeclarations {
        &self.declarations
    }

    fn declare_function(
        &mut self,
        name: &str,
        linkage: Linkage,
        signature: &ir::Signature,
    ) -> ModuleResult<FuncId> {
        let (id, _) = self
            .declarations
            .declare_function(name, linkage, signature)?;
        self.share_declaration(id);
        Ok(id)
    }

    fn declare_anonymous_function(&mut self, signature: &ir::Signature) -> ModuleResult<FuncId> {
        let id = self.declarations.declare_anonymous_function(signature)?;
        self.share_declaration(id);
        Ok(id)
    }

    fn declare_data(
        &mut self,
        name: &str,
        linkage: Linkage,
        writable: bool,
        tls: bool,
    ) -> ModuleResult<DataId> {
        let (id, _) = self
            .declarations
            .declare_data(name, linkage, writable, tls)?;
        Ok(id)
    }

    fn declare_anonymous_data(&mut self, writable: bool, tls: bool) -> ModuleResult<DataId> {
        self.declarations.declare_anonymous_data(writable, tls)
    }

    fn define_function_with_control_plane(
        &mut self,
        id: FuncId,
        ctx: &mut cranelift_codegen::Context,
        ctrl_plane: &mut ControlPlane,
    ) -> ModuleResult<()> {
        self.start_definition(FuncOrDataId::Func(id))?;
        let alignment = ctx.compile(&*self.isa, ctrl_plane)?.buffer.alignment;
        let Some(code) = ctx.compiled_code() else {
            return Err(ModuleError::Backend(anyhow::anyhow!(
                "Cranelift compiled {id} but kept no code"
            )));
        };
        let relocs: Vec<ModuleReloc> = code
            .buffer
            .relocs()
            .iter()
            .map(|reloc| ModuleReloc::from_mach_reloc(reloc, &ctx.func, id))
            .collect();
        let align = self.function_align(u64::from(alignment));
        let unwind = match code.create_unwind_info(&*self.isa)? {
            Some(cranelift_codegen::isa::unwind::UnwindInfo::SystemV(info)) => Some(info),
            _ => None,
        };
        let bytes = code.code_buffer();
        self.add_pending(
            FuncOrDataId::Func(id),
            BuiltSectionKind::Code,
            align,
            Some(bytes),
            bytes.len() as u64,
            &relocs,
        );
        if let Some(d) = self.pending.definitions.last_mut() {
            d.unwind = unwind;
        }
        Ok(())
    }

    fn define_function_bytes(
        &mut self,
        id: FuncId,
        alignment: u64,
        bytes: &[u8],
        relocs: &[ModuleReloc],
    ) -> ModuleResult<()> {
        self.start_definition(FuncOrDataId::Func(id))?;
        let align = self.function_align(alignment);
        self.add_pending(
            FuncOrDataId::Func(id),
            BuiltSectionKind::Code,
            align,
            Some(bytes),
            bytes.len() as u64,
            relocs,
        );
        Ok(())
    }

    fn define_data(&mut self, id: DataId, data: &DataDescription) -> ModuleResult<()> {
        self.start_definition(FuncOrDataId::Data(id))?;
        let decl = self.declarations.get_data_decl(id);
        let (writable, tls) = (decl.writable, decl.tls);
        let align = data.align.unwrap_or(if writable {
            WRITABLE_DATA_ALIGNMENT
        } else {
            READONLY_DATA_ALIGNMENT
        });
        let pointer_reloc = match self.isa.pointer_bytes() {
            4 => Reloc::Abs4,
            _ => Reloc::Abs8,
        };
        let relocs: Vec<ModuleReloc> = data.all_relocs(pointer_reloc).collect();
        let (bytes, size): (Option<&[u8]>, u64) = match &data.init {
            Init::Uninitialized => {
                return Err(backend(KilnModuleError::Uninitialized {
                    name: self.name_of(FuncOrDataId::Data(id)),
                }))
            }
            // At least one byte: every data object has an address of its own.
            Init::Zeros { size } => (None, (*size as u64).max(1)),
            Init::Bytes { contents } if contents.is_empty() => (Some(&[0]), 1),
            Init::Bytes { contents } => (Some(contents), contents.len() as u64),
        };
        let kind = match (tls, writable, bytes.is_some()) {
            (true, _, false) => BuiltSectionKind::ThreadZeroed,
            (true, _, true) => BuiltSectionKind::ThreadData,
            (false, true, false) => BuiltSectionKind::Zeroed,
            (false, true, true) => BuiltSectionKind::Data,
            (false, false, _) => BuiltSectionKind::ReadOnly,
        };
        self.add_pending(FuncOrDataId::Data(id), kind, align, bytes, size, &relocs);
        Ok(())
    }
}

const _ASSERT_KILN_MODULE_IS_SEND: () = {
    const fn assert_is_send<T: Send>() {}
    assert_is_send::<KilnModule>();
};
