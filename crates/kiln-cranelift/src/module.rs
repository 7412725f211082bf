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

mod addresses;
mod cache;
mod free;
mod lazy_functions;

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
    code_cache: Option<std::sync::Arc<dyn kiln::cache::ObjectCache>>,
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

impl kiln::lazy::LazyCompiler for LinkedAtFinalize {
    fn compile(&self, name: &str) -> Result<Vec<u8>, kiln::lazy::CompileError> {
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

/// The declaration a relocation target names, and the offset into it (`FunctionOffset`'s);
/// `None` for a libcall or a linker's symbol.
pub(crate) fn declared_target(target: &ModuleRelocTarget) -> Option<(FuncOrDataId, i64)> {
    match target {
        ModuleRelocTarget::User { .. } if ModuleDeclarations::is_function(target) => {
            Some((FuncOrDataId::Func(FuncId::from_name(target)), 0))
        }
        ModuleRelocTarget::User { .. } => Some((FuncOrDataId::Data(DataId::from_name(target)), 0)),
        ModuleRelocTarget::FunctionOffset(f, offset) => {
            Some((FuncOrDataId::Func(*f), i64::from(*offset)))
        }
        ModuleRelocTarget::LibCall(_) | ModuleRelocTarget::KnownSymbol(_) => None,
    }
}

/// The parts of a compiled function the link and the code cache take: its relocations,
/// System V unwind information and alignment (at least the ISA's minimum).
pub(crate) struct CompiledParts {
    pub(crate) relocs: Vec<ModuleReloc>,
    pub(crate) unwind: Option<cranelift_codegen::isa::unwind::systemv::UnwindInfo>,
    pub(crate) align: u64,
}

/// [`CompiledParts`] of function `id`, compiled in `ctx`, and its code.
pub(crate) fn compiled_parts<'c>(
    isa: &dyn TargetIsa,
    ctx: &'c cranelift_codegen::Context,
    id: FuncId,
) -> ModuleResult<(&'c [u8], CompiledParts)> {
    let Some(code) = ctx.compiled_code() else {
        return Err(ModuleError::Backend(anyhow::anyhow!(
            "Cranelift compiled {id} but kept no code"
        )));
    };
    let unwind = match code.create_unwind_info(isa)? {
        Some(cranelift_codegen::isa::unwind::UnwindInfo::SystemV(info)) => Some(info),
        _ => None,
    };
    let parts = CompiledParts {
        relocs: code
            .buffer
            .relocs()
            .iter()
            .map(|r| ModuleReloc::from_mach_reloc(r, &ctx.func, id))
            .collect(),
        unwind,
        align: function_align(isa, u64::from(code.buffer.alignment)),
    };
    Ok((code.code_buffer(), parts))
}

/// A function's alignment: what its code asks for, at least the ISA's minimum.
pub(crate) fn function_align(isa: &dyn TargetIsa, code: u64) -> u64 {
    code.max(u64::from(isa.function_alignment().minimum))
        .max(isa.symbol_alignment())
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
            jit.library(lib)
                .define_symbol(name, *address as u64)
                .map_err(session_error("defining a builder symbol"))?;
        }
        if !lookup_symbols.is_empty() {
            jit.library(lib)
                .add(kiln::Input::Generator(Box::new(Lookups(lookup_symbols))))
                .map_err(session_error("adding the builder's lookups"))?;
        }
        if process_symbols {
            jit.library(lib)
                .add(kiln::Input::ProcessSymbols)
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

    /// The session's library the module's definitions are linked into (where
    /// [`kiln::Jit::lookup`] finds them by name).
    pub fn library(&self) -> kiln::LibraryId {
        self.lib
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
                kind if crate::relocations::opens_pcrel_pair(kind) => {
                    last_hi20 = Some(u64::from(reloc.offset))
                }
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
            Err(kiln::Error::Link(kiln::link::LinkError::UndefinedSymbols { symbols })) => {
                // Named by the definitions whose code refers to them.
                let mut unresolved = Vec::new();
                for missing in &symbols.0 {
                    for (section, reloc) in relocs {
                        let refers = match &reloc.name {
                            ModuleRelocTarget::LibCall(l) => {
                                (self.libcall_names)(*l) == missing.symbol
                            }
                            _ => declared_target(&reloc.name)
                                .is_some_and(|(id, _)| self.name(id) == missing.symbol),
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
            ModuleRelocTarget::User { .. } | ModuleRelocTarget::FunctionOffset(..) => {
                declared_target(target).ok_or_else(|| {
                    ModuleError::Backend(anyhow::anyhow!("{target:?} names no declaration"))
                })?
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

    /// Adds compiled function `id` (`code` and its `parts`) to what the next finalize links.
    pub(super) fn add_compiled(&mut self, id: FuncId, code: &[u8], parts: &CompiledParts) {
        self.add_pending(
            FuncOrDataId::Func(id),
            BuiltSectionKind::Code,
            parts.align,
            Some(code),
            code.len() as u64,
            &parts.relocs,
        );
        if let Some(d) = self.pending.definitions.last_mut() {
            d.unwind = parts.unwind.clone();
        }
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
            .filter_map(|r| declared_target(&r.name).map(|(t, _)| t))
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
        ctx.compile(&*self.isa, ctrl_plane)?;
        let (code, parts) = compiled_parts(&*self.isa, ctx, id)?;
        self.add_compiled(id, code, &parts);
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
        let align = function_align(&*self.isa, alignment);
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
