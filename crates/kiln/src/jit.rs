//! The session: a [`Jit`] with libraries (namespaces of definitions with a search order),
//! symbol generators, module handles and plugins.

use crate::executor::{EhRegistration, Executor, ExecutorSymbols, ExportHandle};
use crate::generator::{Found, SymbolGenerator};
use crate::library_search::{find_library, search_dirs_for, LibraryFile};
use crate::plugin::{LoadedModule, Plugin, PluginFailure, PluginRegistration, Plugins};
use crate::{DebugSupport, Error};
use kiln_link::{link, ArchiveInput, LinkContext, LinkCounts, LinkOptions, LinkTimes, ObjectInput};
use kiln_memory::{
    FinalizedAllocation, MemoryManager, MemoryStats, Placement, SlabLayout, SlabMemoryManager,
};
use parking_lot::{Mutex, RwLock};
use rustc_hash::FxHashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Weak};

/// A library of a [`Jit`]: a namespace of definitions with a search order. Valid only
/// with the session that made it (another session's id is an error, not a wrong library).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LibraryId {
    session: u32,
    index: u32,
}

impl LibraryId {
    /// The id as one integer (for C and other foreign callers); [`LibraryId::from_raw`]
    /// gives it back. A session checks every id it is given, so a forged one is an error.
    pub fn to_raw(self) -> u64 {
        u64::from(self.session) << 32 | u64::from(self.index)
    }

    /// An id from [`LibraryId::to_raw`].
    pub fn from_raw(raw: u64) -> Self {
        LibraryId {
            session: (raw >> 32) as u32,
            index: raw as u32,
        }
    }
}

static NEXT_SESSION: AtomicU32 = AtomicU32::new(1);

/// A definition in a library's index: its address and the module that holds it (`None`
/// for [`Jit::define_symbol`]'s).
#[derive(Debug, Clone, Copy)]
struct Definition {
    address: u64,
    module: Option<u64>,
}

/// What a library holds. Read by lookups and by links of this and other libraries (a
/// read lock); written briefly when a link ends, a module is removed or an input added.
#[derive(Default)]
struct LibraryState {
    /// Objects added and not linked yet.
    pending: Vec<ObjectInput>,
    /// Objects added with [`Jit::add_lazy_object`], by slot: `None` once linked.
    lazy_objects: Vec<Option<LazyObject>>,
    /// The names the lazy objects define, to their slot.
    lazy: FxHashMap<Arc<str>, usize>,
    /// Archives, lent to every link.
    archives: Arc<Vec<ArchiveInput>>,
    /// Every exported definition of the library, by name: one hash lookup per name,
    /// whatever the number of modules.
    index: FxHashMap<Arc<str>, Definition>,
    /// Hidden definitions of the library's modules (a hidden `main` is still the
    /// program's entry): the last place a lookup looks.
    hidden: FxHashMap<Arc<str>, Definition>,
    /// Live modules, by id.
    modules: FxHashMap<u64, Module>,
    search_order: Vec<LibraryId>,
}

/// An object added lazily: its bytes and what its symbol table says.
struct LazyObject {
    input: ObjectInput,
    symbols: kiln_link::ObjectSymbols,
}

impl LibraryState {
    /// Takes the lazy object in `slot` out of the lazy set (its names go with it).
    fn take_lazy(&mut self, slot: usize) -> Option<LazyObject> {
        let object = self.lazy_objects.get_mut(slot)?.take()?;
        for name in object.symbols.defined.iter().chain(&object.symbols.weak) {
            if self.lazy.get(&**name) == Some(&slot) {
                self.lazy.remove(&**name);
            }
        }
        Some(object)
    }

    /// Puts lazy objects a failed link took back where they were.
    fn restore_lazy(&mut self, taken: Vec<(usize, LazyObject)>) {
        for (slot, object) in taken {
            for name in object.symbols.defined.iter().chain(&object.symbols.weak) {
                self.lazy.entry(Arc::from(&**name)).or_insert(slot);
            }
            self.lazy_objects[slot] = Some(object);
        }
    }

    /// Takes the lazy objects that define `names` — and, transitively, those that define
    /// what they leave undefined — out of the lazy set.
    fn take_lazy_closure<'n>(
        &mut self,
        names: impl IntoIterator<Item = &'n str>,
    ) -> Vec<(usize, LazyObject)> {
        let mut taken = Vec::new();
        if self.lazy.is_empty() {
            return taken;
        }
        let mut work: Vec<Box<str>> = names.into_iter().map(Box::from).collect();
        while let Some(name) = work.pop() {
            if self.index.contains_key(&*name) {
                continue;
            }
            let Some(slot) = self.lazy.get(&*name).copied() else {
                continue;
            };
            if let Some(object) = self.take_lazy(slot) {
                work.extend(object.symbols.undefined.iter().cloned());
                taken.push((slot, object));
            }
        }
        taken
    }
}

/// The generators of a library and what they already answered.
#[derive(Default)]
struct Generators {
    list: Vec<Box<dyn SymbolGenerator>>,
    /// Names the generators resolved (process and shared-library symbols do not move).
    found: FxHashMap<Box<str>, Found>,
}

struct Library {
    id: LibraryId,
    name: String,
    /// Held for the whole of a link into this library (links of other libraries, and
    /// lookups, do not wait for it).
    link: Mutex<()>,
    state: RwLock<LibraryState>,
    generators: Mutex<Generators>,
}

pub(crate) struct Inner {
    /// Call-through stubs and the epochs that free replaced bodies.
    pub(crate) lazy: crate::lazy::LazyFunctions,
    /// The executor's instruction set: what every link is for.
    architecture: kiln_link::Architecture,
    session: u32,
    executor: Executor,
    export_to_libraries: bool,
    noexec: bool,
    memory: Arc<dyn MemoryManager>,
    low_memory: LowMemory,
    libraries: RwLock<Vec<Arc<Library>>>,
    pub(crate) plugins: Arc<Plugins>,
    /// The built-in debugger and profiler listener's registration, if on.
    _debug_support: Option<PluginRegistration>,
    next_module: AtomicU64,
    compiler: Arc<dyn kiln_cache::Compiler>,
    object_cache: Option<Arc<dyn kiln_cache::ObjectCache>>,
}

/// Memory in the low 2 GiB for non-PIC code, reserved on first use (most programs never
/// need it, and reserving costs a round trip to a remote executor).
struct LowMemory {
    given: Option<Option<Arc<dyn MemoryManager>>>,
    /// The executor's architecture's trap bytes, for freed code.
    trap: [u8; 4],
    mapper: Option<Arc<dyn kiln_memory::Mapper>>,
    built: std::sync::OnceLock<Option<SlabMemoryManager>>,
}

impl LowMemory {
    fn get(&self) -> Option<&dyn MemoryManager> {
        if let Some(given) = &self.given {
            return given.as_deref();
        }
        self.built
            .get_or_init(|| {
                let mut builder = SlabMemoryManager::builder()
                    .trap_pattern(self.trap)
                    .placement(Placement::Low2GiB)
                    .layout(SlabLayout {
                        read_execute: 64 << 20,
                        read: 32 << 20,
                        read_write: 32 << 20,
                    });
                if let Some(m) = &self.mapper {
                    builder = builder.mapper(m.clone());
                }
                builder
                    .build()
                    .map_err(
                        |e| tracing::debug!(%e, "no low-2GiB memory: non-PIC code will not link"),
                    )
                    .ok()
            })
            .as_ref()
            .map(|m| m as &dyn MemoryManager)
    }
}

impl MemoryManager for LowMemory {
    fn allocate(
        &self,
        request: &kiln_memory::AllocationRequest,
    ) -> Result<kiln_memory::InFlightAllocation, kiln_memory::MemoryError> {
        match self.get() {
            Some(m) => m.allocate(request),
            None => Err(kiln_memory::MemoryError::InvalidConfiguration(
                "no memory in the low 2 GiB could be reserved for non-PIC code".into(),
            )),
        }
    }
}

/// A JIT session: load objects and archives into libraries, link, look symbols up, run.
///
/// ```no_run
/// let jit = kiln::Jit::new()?;
/// let lib = jit.main_library();
/// jit.add_object_file(lib, "hello.o")?;
/// jit.add_process_symbols(lib);
/// // SAFETY: hello.o's main is a C `int main(int, char **, char **)`.
/// let status = unsafe { jit.run_main(lib, &["hello".to_string()]) }?;
/// # Ok::<(), kiln::Error>(())
/// ```
///
/// # Lazily
///
/// Objects can be added lazily ([`Jit::add_lazy_object`]: linked when first needed), and
/// functions defined by a compiler called on their first call ([`Jit::add_lazy_functions`],
/// call-through stubs) and replaced while they run ([`Jit::replace_function`]); see
/// [`crate::lazy`].
///
/// # Locking
///
/// Each library has its own locks, so that the session scales with threads:
/// - a link holds its library's *link lock* for its whole length: links into one library
///   run one at a time, links into different libraries in parallel;
/// - a library's index (its definitions and modules) is behind a reader-writer lock that a
///   link takes for reading while it resolves names (its own library's and those in the
///   search order, one at a time) and for writing only for the moment it publishes the new
///   module; so lookups, and links of other libraries, never wait for a link;
/// - generators are called under their library's generator lock, with what they found
///   remembered (a name a generator resolved is not asked again).
///
/// No lock is held while JIT code runs (initializers, finalizers, `main`).
///
/// # Names
///
/// A name resolves, in order: to what the link's own objects define; to the library's
/// index (definitions and earlier modules' exports), then the index of each library in its
/// search order; to the link's archives (a member is pulled only for what no module of the
/// library defines already); to the generators. Defining a name twice in one library —
/// two modules, or a module and [`Jit::define_symbol`] — is an error
/// ([`Error::Redefinition`]); replacing a definition in place is not supported.
///
/// # Modules and removal
///
/// A module records the modules its code refers to. [`Jit::remove_module`] refuses to
/// remove a module that a live module refers to ([`Error::ModuleInUse`], naming them), and
/// a module keeps the modules it refers to mapped for as long as it lives: no call can
/// reach freed memory.
#[derive(Clone)]
pub struct Jit {
    inner: Arc<Inner>,
}

/// Builder for a [`Jit`].
#[derive(Default)]
pub struct JitBuilder {
    executor: Option<Executor>,
    export_to_libraries: bool,
    noexec: bool,
    memory: Option<Arc<dyn MemoryManager>>,
    low_memory: Option<Option<Arc<dyn MemoryManager>>>,
    debug_support: DebugSupport,
    compiler: Option<Arc<dyn kiln_cache::Compiler>>,
    object_cache: Option<Arc<dyn kiln_cache::ObjectCache>>,
}

impl JitBuilder {
    /// The compiler of [`Jit::add_source`] (default: the system's `cc` and `c++`).
    pub fn compiler(mut self, compiler: Arc<dyn kiln_cache::Compiler>) -> Self {
        self.compiler = Some(compiler);
        self
    }

    /// The object cache [`Jit::add_source`] consults before compiling and fills after
    /// (default: none, every source is compiled).
    pub fn object_cache(mut self, cache: Arc<dyn kiln_cache::ObjectCache>) -> Self {
        self.object_cache = Some(cache);
        self
    }

    /// Tells debuggers and profilers of every module (default: all off): see
    /// [`DebugSupport`]. The outputs are written by the executor, in the process that
    /// runs the code.
    pub fn debug_support(mut self, support: DebugSupport) -> Self {
        self.debug_support = support;
        self
    }

    /// Where the code runs (default: this process). A remote executor brings its own
    /// memory managers (shared memory or copy transport).
    pub fn executor(mut self, executor: Executor) -> Self {
        self.executor = Some(executor);
        self
    }

    /// Makes each module's global definitions visible to shared libraries the executor
    /// loads later — a program's plugins, CPython's extension modules — as linking an
    /// executable with `-Wl,-E` does (default: off; `kiln run` turns it on). Each module
    /// then gets a small `RTLD_GLOBAL` object of absolute symbols, withdrawn when the
    /// module is removed.
    pub fn export_to_libraries(mut self, on: bool) -> Self {
        self.export_to_libraries = on;
        self
    }

    /// Links without running any code: no initializers after a link, no finalizers at
    /// removal (default: off). For inspecting what a link does (`kiln run --noexec`).
    pub fn noexec(mut self, on: bool) -> Self {
        self.noexec = on;
        self
    }

    /// The memory manager for code: any [`MemoryManager`] (default: Kiln's slab manager
    /// near the host's libraries). It must place code within ±2 GiB of the host libraries
    /// for PIE code to reach them.
    pub fn memory(mut self, memory: impl MemoryManager + 'static) -> Self {
        self.memory = Some(Arc::new(memory));
        self
    }

    /// The memory manager for non-PIC code with absolute 32-bit relocations (default: a
    /// slab manager in the low 2 GiB; `None` to refuse such code).
    pub fn low_memory(mut self, memory: Option<Arc<dyn MemoryManager>>) -> Self {
        self.low_memory = Some(memory);
        self
    }

    /// Builds the session.
    pub fn build(self) -> Result<Jit, Error> {
        let executor = self.executor.unwrap_or_else(Executor::in_process);
        let architecture = executor.architecture()?;
        // Debug outputs are on before any memory is reserved: an executor maps the code
        // of a debuggable session privately.
        let debug_listener =
            crate::debug_support::DebugListener::start(&self.debug_support, &executor)?;
        let mut mapper = executor.mapper(self.debug_support.gdb)?;
        if mapper.is_none() && (self.debug_support.gdb || self.debug_support.perf_map) {
            // A debugger cannot write a breakpoint into a shared mapping (the kernel
            // refuses a forced write to a shared read-only page), and perf applies a perf
            // map only to anonymous memory, so with either on the code is mapped
            // privately: mmap + mprotect, one view.
            mapper = Some(Arc::new(kiln_memory::InProcessMapper::new()));
        }
        let memory: Arc<dyn MemoryManager> = match self.memory {
            Some(m) => m,
            None => {
                let mut builder =
                    SlabMemoryManager::builder().trap_pattern(architecture.trap_pattern());
                if let Some(m) = &mapper {
                    builder = builder.mapper(m.clone());
                }
                Arc::new(builder.build()?)
            }
        };
        let low_memory = LowMemory {
            given: self.low_memory,
            trap: architecture.trap_pattern(),
            mapper,
            built: std::sync::OnceLock::new(),
        };
        let plugins = Arc::new(Plugins::default());
        let debug_support = debug_listener.map(|listener| plugins.add(Arc::new(listener)));
        let jit = Jit {
            inner: Arc::new(Inner {
                lazy: Default::default(),
                session: NEXT_SESSION.fetch_add(1, Ordering::Relaxed),
                executor,
                architecture,
                export_to_libraries: self.export_to_libraries,
                noexec: self.noexec,
                memory,
                low_memory,
                libraries: RwLock::new(Vec::new()),
                plugins,
                _debug_support: debug_support,
                next_module: AtomicU64::new(1),
                compiler: self
                    .compiler
                    .unwrap_or_else(|| Arc::new(kiln_cache::SystemCompiler::new())),
                object_cache: self.object_cache,
            }),
        };
        jit.create_library("main");
        Ok(jit)
    }
}

/// A file's bytes, read once into memory the session shares (never copied again).
fn read_file(path: &Path) -> Result<Arc<dyn AsRef<[u8]> + Send + Sync>, Error> {
    let bytes = std::fs::read(path).map_err(|source| Error::Io {
        path: path.to_path_buf(),
        source,
    })?;
    Ok(Arc::new(bytes))
}

/// A file's bytes, shared: mapped when it is large (an archive: never copied, pages read
/// as the link touches them), read when it is small — for a short-lived tool that adds
/// them with [`Jit::add_object_shared`] or [`Jit::add_archive_shared`] (`kiln run` does).
///
/// A mapped file must not change while the session may read it: one rewritten in place
/// gives the link inconsistent bytes, and one truncated makes a later read of its pages
/// fault (`SIGBUS`). [`Jit::add_file`] and friends read files instead.
pub fn map_file(path: &Path) -> Result<Arc<dyn AsRef<[u8]> + Send + Sync>, Error> {
    let io = |source| Error::Io {
        path: path.to_path_buf(),
        source,
    };
    let file = std::fs::File::open(path).map_err(io)?;
    let len = file.metadata().map_err(io)?.len();
    if len < 64 << 10 {
        let mut bytes = Vec::with_capacity(len as usize);
        std::io::Read::read_to_end(&mut &file, &mut bytes).map_err(io)?;
        return Ok(Arc::new(bytes));
    }
    // SAFETY: a private read-only mapping of a file Kiln only reads. Link inputs are build
    // outputs that nothing writes while they are linked; one rewritten under a link reads
    // as inconsistent bytes, which the linker checks like any input (bounds, tables), and
    // one truncated under it would fault — the same contract every linker that maps its
    // inputs (mold, lld) has.
    let map = unsafe { memmap2::Mmap::map(&file) }.map_err(io)?;
    Ok(Arc::new(map))
}

/// The first bytes of shared file contents.
fn starts_with(bytes: &Arc<dyn AsRef<[u8]> + Send + Sync>, prefix: &[u8]) -> bool {
    (**bytes).as_ref().starts_with(prefix)
}

/// Figures of one link.
#[derive(Debug, Clone, Default)]
pub struct LinkReport {
    /// Phase times.
    pub times: LinkTimes,
    /// Each pass of the link graph with its time, in order.
    pub pass_times: Vec<(std::borrow::Cow<'static, str>, std::time::Duration)>,
    /// Counts.
    pub counts: LinkCounts,
}

impl Jit {
    pub(crate) fn from_inner(inner: Arc<Inner>) -> Self {
        Jit { inner }
    }

    pub(crate) fn inner(&self) -> &Arc<Inner> {
        &self.inner
    }

    /// Links the body of a lazy function: `object`, which must define `name`, resolved as
    /// `lib` resolves names, published nowhere. Its address and module.
    pub(crate) fn link_body(
        &self,
        lib: LibraryId,
        name: &str,
        object: Vec<u8>,
    ) -> Result<(u64, Module), Error> {
        // Linked alone: a bad object fails only its own link.
        let input = ObjectInput::new(format!("{name} (body)"), object);
        let (module, _) = self
            .link(lib, Some(input), None, &[], Publish::No, false)?
            .ok_or_else(|| Error::SymbolNotFound(name.to_string()))?;
        let address = module.symbol(name).ok_or_else(|| Error::LazyCompile {
            function: name.to_string(),
            reason: "the compiled object does not define it".into(),
        })?;
        Ok((address, module))
    }

    /// A session with default memory managers.
    pub fn new() -> Result<Self, Error> {
        JitBuilder::default().build()
    }

    /// The instruction set the session links for: its executor's.
    pub fn architecture(&self) -> kiln_link::Architecture {
        self.inner.architecture
    }

    /// A builder.
    pub fn builder() -> JitBuilder {
        JitBuilder::default()
    }

    /// The library every session starts with.
    pub fn main_library(&self) -> LibraryId {
        LibraryId {
            session: self.inner.session,
            index: 0,
        }
    }

    fn library(&self, lib: LibraryId) -> Result<Arc<Library>, Error> {
        if lib.session != self.inner.session {
            return Err(Error::UnknownLibrary(format!(
                "library {} belongs to another session",
                lib.index
            )));
        }
        self.inner
            .libraries
            .read()
            .get(lib.index as usize)
            .cloned()
            .ok_or_else(|| Error::UnknownLibrary(format!("no library {}", lib.index)))
    }

    /// Creates a library.
    pub fn create_library(&self, name: &str) -> LibraryId {
        let mut libraries = self.inner.libraries.write();
        let id = LibraryId {
            session: self.inner.session,
            index: libraries.len() as u32,
        };
        libraries.push(Arc::new(Library {
            id,
            name: name.to_string(),
            link: Mutex::new(()),
            state: RwLock::new(LibraryState::default()),
            generators: Mutex::new(Generators::default()),
        }));
        id
    }

    /// Libraries searched, in order, for what `lib` does not define.
    pub fn set_search_order(&self, lib: LibraryId, order: &[LibraryId]) -> Result<(), Error> {
        for &other in order {
            self.library(other)?;
        }
        self.library(lib)?.state.write().search_order = order.to_vec();
        Ok(())
    }

    /// Adds a relocatable object from bytes (copied once, or shared if given as an
    /// `Arc<[u8]>`); it is linked with the library's next link.
    pub fn add_object(
        &self,
        lib: LibraryId,
        name: &str,
        bytes: impl Into<Arc<[u8]>>,
    ) -> Result<(), Error> {
        self.add_input(lib, ObjectInput::new(name, bytes))
    }

    /// Adds a relocatable object whose bytes the caller lends for as long as the session
    /// needs them (a memory-mapped file, a buffer of a compiler): never copied.
    pub fn add_object_shared(
        &self,
        lib: LibraryId,
        name: &str,
        bytes: Arc<dyn AsRef<[u8]> + Send + Sync>,
    ) -> Result<(), Error> {
        self.add_input(lib, ObjectInput::shared(name, bytes))
    }

    fn add_input(&self, lib: LibraryId, input: ObjectInput) -> Result<(), Error> {
        kiln_link::check_object(&input.name, input.bytes(), self.inner.architecture)?;
        self.library(lib)?.state.write().pending.push(input);
        Ok(())
    }

    /// Adds a relocatable object file.
    pub fn add_object_file(&self, lib: LibraryId, path: impl AsRef<Path>) -> Result<(), Error> {
        let path = path.as_ref();
        self.add_object_shared(lib, &path.display().to_string(), read_file(path)?)
    }

    /// Adds a relocatable object lazily: only its symbol table is read now, and it is
    /// linked — as part of the link that needs it — when one of the names it defines is
    /// first looked up in `lib` or needed by a link that searches `lib`. An object nobody
    /// needs is never linked (nor is the rest of it read: a malformed section is reported
    /// by the link that needs it, and the object then stays lazy).
    ///
    /// Lazy objects that need each other are linked together, as archive members are. A
    /// link of `lib` takes the lazy objects its inputs need from `lib`; a lazy object of a
    /// library in the search order is linked into that library, as a module of its own.
    /// An error if `lib` (or one of its lazy objects) already defines a name the object
    /// defines (weak definitions excepted).
    ///
    /// ```no_run
    /// # fn main() -> Result<(), kiln::Error> {
    /// let jit = kiln::Jit::new()?;
    /// let lib = jit.main_library();
    /// jit.add_process_symbols(lib)?;
    /// for path in ["a.o", "b.o", "c.o"] {
    ///     jit.add_lazy_object(lib, path, std::fs::read(path).unwrap())?;
    /// }
    /// // Links a.o only (and what a.o needs): b.o and c.o stay unread.
    /// let f = jit.lookup(lib, "defined_in_a")?;
    /// # Ok(()) }
    /// ```
    pub fn add_lazy_object(
        &self,
        lib: LibraryId,
        name: &str,
        bytes: impl Into<Arc<[u8]>>,
    ) -> Result<(), Error> {
        self.add_lazy_input(lib, ObjectInput::new(name, bytes))
    }

    /// [`Jit::add_lazy_object`] of bytes the caller lends (never copied).
    pub fn add_lazy_object_shared(
        &self,
        lib: LibraryId,
        name: &str,
        bytes: Arc<dyn AsRef<[u8]> + Send + Sync>,
    ) -> Result<(), Error> {
        self.add_lazy_input(lib, ObjectInput::shared(name, bytes))
    }

    fn add_lazy_input(&self, lib: LibraryId, input: ObjectInput) -> Result<(), Error> {
        let symbols = kiln_link::scan_symbols(&input.name, input.bytes(), self.inner.architecture)?;
        let library = self.library(lib)?;
        let mut state = library.state.write();
        for name in &symbols.defined {
            let previous = match (state.index.get(&**name), state.lazy.get(&**name)) {
                (Some(d), _) => describe(&state, d),
                (None, Some(&slot)) => match &state.lazy_objects[slot] {
                    Some(o) if o.symbols.defined.contains(name) => {
                        format!("lazy object {}", o.input.name)
                    }
                    _ => continue, // a weak definition gives way
                },
                (None, None) => continue,
            };
            return Err(Error::Redefinition {
                symbol: name.to_string(),
                library: library.name.clone(),
                previous,
                new: input.name.clone(),
            });
        }
        let slot = state.lazy_objects.len();
        for name in &symbols.defined {
            state.lazy.insert(Arc::from(&**name), slot);
        }
        for name in &symbols.weak {
            state.lazy.entry(Arc::from(&**name)).or_insert(slot);
        }
        state.lazy_objects.push(Some(LazyObject { input, symbols }));
        Ok(())
    }

    /// The number of lazy objects of `lib` not linked yet.
    pub fn lazy_objects_pending(&self, lib: LibraryId) -> Result<usize, Error> {
        let library = self.library(lib)?;
        let state = library.state.read();
        Ok(state.lazy_objects.iter().filter(|o| o.is_some()).count())
    }

    /// Adds and links one object at once: its module (or the link's error, the library
    /// left as it was). Objects added before and not linked yet are linked with it.
    pub fn link_object(
        &self,
        lib: LibraryId,
        name: &str,
        bytes: impl Into<Arc<[u8]>>,
    ) -> Result<Module, Error> {
        let input = ObjectInput::new(name, bytes);
        // Linked under the library's link lock with what is pending, so that a concurrent
        // lookup's link cannot take it away (checked first when there is something pending:
        // a bad object must not fail a link of good ones).
        match self.link(lib, Some(input), None, &[], Publish::Yes, false)? {
            Some((module, _)) => Ok(module),
            None => Err(Error::Executor("nothing was linked".into())),
        }
    }

    /// As [`Jit::link_object`], with bytes the caller lends for as long as the session
    /// needs them (a compiler's buffer, a memory-mapped file): never copied.
    ///
    /// ```
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # if !cfg!(target_arch = "x86_64") { return Ok(()); }
    /// use std::sync::Arc;
    /// let jit = kiln::Jit::new()?;
    /// let lib = jit.main_library();
    /// let object: Arc<Vec<u8>> = Arc::new(kiln::lazy::testing::constant_function("seven", 7));
    /// let module = jit.link_object_shared(lib, "seven.o", object)?;
    /// assert!(module.symbol("seven").is_some());
    /// # Ok(()) }
    /// ```
    pub fn link_object_shared(
        &self,
        lib: LibraryId,
        name: &str,
        bytes: Arc<dyn AsRef<[u8]> + Send + Sync>,
    ) -> Result<Module, Error> {
        let input = ObjectInput::shared(name, bytes);
        match self.link(lib, Some(input), None, &[], Publish::Yes, false)? {
            Some((module, _)) => Ok(module),
            None => Err(Error::Executor("nothing was linked".into())),
        }
    }

    /// Adds a static archive from bytes: its members are linked when they define a symbol
    /// the link needs.
    pub fn add_archive(
        &self,
        lib: LibraryId,
        name: &str,
        bytes: impl Into<Arc<[u8]>>,
    ) -> Result<(), Error> {
        self.push_archive(lib, ArchiveInput::parse(name, bytes)?)
    }

    /// Adds a static archive whose bytes the caller lends (a memory-mapped file): never
    /// copied, its members linked share them.
    pub fn add_archive_shared(
        &self,
        lib: LibraryId,
        name: &str,
        bytes: Arc<dyn AsRef<[u8]> + Send + Sync>,
    ) -> Result<(), Error> {
        self.push_archive(lib, ArchiveInput::parse_shared(name, bytes)?)
    }

    fn push_archive(&self, lib: LibraryId, archive: ArchiveInput) -> Result<(), Error> {
        let library = self.library(lib)?;
        let mut state = library.state.write();
        let mut archives = (*state.archives).clone();
        archives.push(archive);
        state.archives = Arc::new(archives);
        Ok(())
    }

    /// Adds a static archive file.
    pub fn add_archive_file(&self, lib: LibraryId, path: impl AsRef<Path>) -> Result<(), Error> {
        let path = path.as_ref();
        self.add_archive_shared(lib, &path.display().to_string(), read_file(path)?)
    }

    /// Adds an object or an archive, by its contents.
    pub fn add_file(&self, lib: LibraryId, path: impl AsRef<Path>) -> Result<(), Error> {
        let path = path.as_ref();
        let bytes = read_file(path)?;
        if starts_with(&bytes, b"!<arch>\n") {
            self.add_archive_shared(lib, &path.display().to_string(), bytes)
        } else if starts_with(&bytes, b"\x7fELF") {
            self.add_object_shared(lib, &path.display().to_string(), bytes)
        } else {
            Err(Error::UnknownInput {
                path: path.to_path_buf(),
            })
        }
    }

    /// Compiles a C or C++ source with the session's compiler and `flags` (through its
    /// object cache, if it has one: an entry whose signature does not match this compile
    /// is never loaded) and adds the object to `lib`. Returns whether the object came from
    /// the cache.
    pub fn add_source(
        &self,
        lib: LibraryId,
        path: impl AsRef<Path>,
        flags: &[String],
    ) -> Result<bool, Error> {
        let path = path.as_ref();
        let outcome = kiln_cache::compile_cached(
            &*self.inner.compiler,
            self.inner.object_cache.as_deref(),
            path,
            flags,
        )
        .map_err(|e| Error::Compile(e.to_string()))?;
        self.add_object(lib, &path.display().to_string(), outcome.object)?;
        Ok(outcome.hit)
    }

    /// Defines `name` in `lib` at `address` (a host function or data). An error if the
    /// library defines `name` already.
    pub fn define_symbol(&self, lib: LibraryId, name: &str, address: u64) -> Result<(), Error> {
        let library = self.library(lib)?;
        let mut state = library.state.write();
        if let Some(previous) = state.index.get(name) {
            return Err(Error::Redefinition {
                symbol: name.to_string(),
                library: library.name.clone(),
                previous: describe(&state, previous),
                new: format!("an absolute definition at {address:#x} (Jit::define_symbol)"),
            });
        }
        state.index.insert(
            name.into(),
            Definition {
                address,
                module: None,
            },
        );
        Ok(())
    }

    /// Adds a generator for names `lib` does not define.
    pub fn add_generator(
        &self,
        lib: LibraryId,
        generator: Box<dyn SymbolGenerator>,
    ) -> Result<(), Error> {
        self.library(lib)?.generators.lock().list.push(generator);
        Ok(())
    }

    /// Resolves what `lib` does not define from the executor's process symbols (this
    /// process's, for the in-process executor).
    ///
    /// The C library's few functions that a native link takes from `libc_nonshared.a`
    /// rather than `libc.so.6` — `atexit`, `at_quick_exit`, `pthread_atfork` — are linked
    /// from that archive into the module that calls them, as a native link does, so that
    /// their handlers belong to the calling module (its own `__dso_handle`) and run when
    /// it is removed.
    pub fn add_process_symbols(&self, lib: LibraryId) -> Result<(), Error> {
        // The executor's architecture's archive (Debian multiarch).
        let found = search_dirs_for(self.inner.architecture)
            .into_iter()
            .map(|d| d.join("libc_nonshared.a"))
            .find(|p| p.is_file());
        if let Some(path) = found {
            if let Err(error) = self.add_archive_file(lib, &path) {
                tracing::debug!(%error, "libc_nonshared.a not used");
            }
        }
        self.add_generator(
            lib,
            Box::new(ExecutorSymbols {
                executor: self.inner.executor.clone(),
                library: 0,
                name: "process symbols".into(),
            }),
        )
    }

    /// `-l name`: finds the library in `dirs` and then the system directories; adds an
    /// archive, or opens a shared library in the executor (following GNU ld scripts) as a
    /// generator.
    pub fn add_library_by_name(
        &self,
        lib: LibraryId,
        name: &str,
        dirs: &[PathBuf],
    ) -> Result<(), Error> {
        let mut all = dirs.to_vec();
        all.extend(search_dirs_for(self.inner.architecture));
        for file in find_library(name, &all)? {
            match file {
                LibraryFile::Archive(path) => self.add_archive_file(lib, path)?,
                LibraryFile::Shared(path) => self.add_shared_library(lib, &path)?,
            }
        }
        Ok(())
    }

    /// Loads the shared library at `path` in the executor and resolves what `lib` does
    /// not define from it (a `.so` given as an input, as a linker takes one).
    pub fn add_shared_library(&self, lib: LibraryId, path: &Path) -> Result<(), Error> {
        // A relative path is the caller's (dlopen would search the system's directories).
        let path = std::fs::canonicalize(path)
            .unwrap_or_else(|_| path.to_path_buf())
            .display()
            .to_string();
        let handle = self.inner.executor.load_library(&path)?;
        self.add_generator(
            lib,
            Box::new(ExecutorSymbols {
                executor: self.inner.executor.clone(),
                library: handle,
                name: path,
            }),
        )
    }

    /// The executor the session runs code in.
    pub fn executor(&self) -> &Executor {
        &self.inner.executor
    }

    /// Registers a plugin (a listener): it is told of every module loaded while the
    /// returned registration lives, and of each such module's free (see [`Plugin`] for
    /// the contract). Several plugins may be registered at once; they are told in the
    /// order they were registered.
    ///
    /// ```
    /// use std::sync::Arc;
    /// struct Count(std::sync::atomic::AtomicUsize);
    /// impl kiln::Plugin for Count {
    ///     fn name(&self) -> &str { "count" }
    ///     fn module_loaded(&self, _: &kiln::LoadedModule) -> Result<(), kiln::PluginError> {
    ///         self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    ///         Ok(())
    ///     }
    /// }
    /// let jit = kiln::Jit::new()?;
    /// let count = Arc::new(Count(Default::default()));
    /// let registration = jit.add_plugin(count.clone());
    /// // ... link: every module is counted ...
    /// drop(registration); // no more
    /// # Ok::<(), kiln::Error>(())
    /// ```
    pub fn add_plugin(&self, plugin: Arc<dyn Plugin>) -> PluginRegistration {
        self.inner.plugins.add(plugin)
    }

    /// The plugin failures (errors and panics) since the last call, oldest first (at
    /// most 1,024 are kept).
    pub fn plugin_failures(&self) -> Vec<PluginFailure> {
        self.inner.plugins.take_failures()
    }

    /// Links the objects added to `lib` since its last link (and the archive members they
    /// need) into a module, registers its unwind information and runs its initializers.
    /// Returns `None` if there was nothing to link.
    ///
    /// On failure the library is exactly as it was before the link: the objects of the
    /// failed link are dropped (add them again, corrected, to retry), no definition of
    /// theirs is published, their memory is freed.
    pub fn link_pending(&self, lib: LibraryId) -> Result<Option<(Module, LinkReport)>, Error> {
        self.link(lib, None, None, &[], Publish::Yes, true)
    }

    /// Links what is pending in `lib`, `extra`, and the lazy objects that define `wanted`
    /// or what those need. A failed link puts the lazy objects it took back. Plugins are
    /// shown `shown` in place of the object of the same name (same sections, other
    /// symbols: call-through stubs are shown as `NAME.stub`).
    ///
    /// With [`Publish::No`], links `extra` alone, resolving its names as `lib` would, into
    /// a module kept out of every index (a body of a call-through stub). With `times`, the
    /// report has the link's phase and pass times (else no clock is read).
    pub(crate) fn link(
        &self,
        lib: LibraryId,
        extra: Option<ObjectInput>,
        shown: Option<ObjectInput>,
        wanted: &[&str],
        publish: Publish,
        times: bool,
    ) -> Result<Option<(Module, LinkReport)>, Error> {
        let library = self.library(lib)?;
        let linking = match publish {
            Publish::Yes => Some(lock_for_link(&library)?),
            Publish::No => None,
        };
        // (A body's link publishes nothing, holds no lock: it may link its library's lazy
        // objects.)
        let _linking_here = (publish == Publish::Yes).then(|| LinkingHere::enter(library.id));
        let (mut objects, archives, taken) = {
            let mut state = library.state.write();
            if let (Some(extra), Publish::Yes, false) = (&extra, publish, state.pending.is_empty())
            {
                kiln_link::check_object(&extra.name, extra.bytes(), self.inner.architecture)?;
            }
            let mut objects = match publish {
                Publish::Yes => std::mem::take(&mut state.pending),
                Publish::No => Vec::new(),
            };
            objects.extend(extra);
            let taken = match publish {
                Publish::Yes if !state.lazy.is_empty() => {
                    let scanned: Vec<kiln_link::ObjectSymbols> = objects
                        .iter()
                        .filter_map(|o| {
                            kiln_link::scan_symbols(&o.name, o.bytes(), self.inner.architecture)
                                .ok()
                        })
                        .collect();
                    let undefined = scanned.iter().flat_map(|s| s.undefined.iter());
                    state.take_lazy_closure(
                        wanted
                            .iter()
                            .copied()
                            .chain(undefined.map(|n| &**n))
                            .collect::<Vec<_>>(),
                    )
                }
                _ => Vec::new(),
            };
            (objects, state.archives.clone(), taken)
        };
        if objects.is_empty() && taken.is_empty() {
            return Ok(None);
        }
        // The lazy objects go after the inputs: the module is named after its first input.
        let lazy_start = objects.len();
        objects.extend(taken.iter().map(|(_, o)| o.input.clone()));
        let result = self.link_objects(
            &library,
            &objects,
            shown,
            archives,
            LinkMode { publish, times },
            linking,
        );
        if result.is_err() && !taken.is_empty() {
            objects.truncate(lazy_start);
            library.state.write().restore_lazy(taken);
        }
        result.map(Some)
    }

    /// The link itself, under the library's link lock when it publishes.
    fn link_objects(
        &self,
        library: &Arc<Library>,
        objects: &[ObjectInput],
        shown: Option<ObjectInput>,
        archives: Arc<Vec<ArchiveInput>>,
        mode: LinkMode,
        linking: Option<parking_lot::MutexGuard<'_, ()>>,
    ) -> Result<(Module, LinkReport), Error> {
        let LinkMode { publish, times } = mode;
        let plugins: Vec<Arc<dyn Plugin>> = self.inner.plugins.snapshot();
        let passes: Vec<_> = plugins.iter().flat_map(|p| p.link_passes()).collect();
        let options = LinkOptions {
            memory: &*self.inner.memory,
            low_memory: Some(&self.inner.low_memory as &dyn MemoryManager),
            report_sections: !plugins.is_empty(),
            architecture: self.inner.architecture,
            keep_image: false,
            passes: &passes,
            times,
        };
        let mut ctx = SessionContext::new(self, library, publish);
        let mut linked = match link(objects, &archives, &mut ctx, &options) {
            Ok(linked) => linked,
            // What a lazy object it needed said is the cause.
            Err(error) => return Err(ctx.lazy_error.take().unwrap_or(error.into())),
        };
        let uses_thread_atexit = ctx.thread_atexit;
        let uses: Vec<Module> = ctx.uses.into_values().collect();
        let report = LinkReport {
            times: linked.times,
            pass_times: std::mem::take(&mut linked.pass_times),
            counts: linked.counts,
        };
        let executor = &self.inner.executor;
        let id = self.inner.next_module.fetch_add(1, Ordering::Relaxed);
        // Publishing checks for redefinitions first: on an error nothing is published and
        // the module (its memory) is dropped unrun.
        if publish == Publish::Yes {
            let state = library.state.read();
            if let Some((name, previous)) =
                linked.exports.iter().filter(|e| e.visible).find_map(|e| {
                    let previous = match state.index.get(&*e.name) {
                        Some(d) => describe(&state, d),
                        // A lazy object not linked yet that defines it (not weakly).
                        None => state
                            .lazy
                            .get(&*e.name)
                            .and_then(|&slot| state.lazy_objects[slot].as_ref())
                            .filter(|o| o.symbols.defined.iter().any(|n| **n == *e.name))
                            .map(|o| format!("lazy object {}", o.input.name))?,
                    };
                    Some((&e.name, previous))
                })
            {
                // The object (or archive member) that defines it: read on this error path
                // only, from the inputs' symbol tables.
                let new = objects
                    .iter()
                    .find(|o| {
                        kiln_link::scan_symbols(&o.name, &o.data, linked.architecture)
                            .is_ok_and(|s| s.defined.iter().chain(&s.weak).any(|n| **n == **name))
                    })
                    .map(|o| o.name.clone())
                    .unwrap_or_else(|| {
                        let names: Vec<&str> = objects.iter().map(|o| o.name.as_str()).collect();
                        format!("the link of {}", names.join(", "))
                    });
                return Err(Error::Redefinition {
                    symbol: name.to_string(),
                    library: library.name.clone(),
                    previous,
                    new,
                });
            }
        }
        if linked.branch_protected {
            // BTI-built code (and Kiln's stubs, which start with landing pads): the whole
            // pages of its code are mapped guarded. Pages the slab shares with another
            // module's code stay unguarded (guarding them could break that module).
            if let Some(code) = linked.allocation.segments().first() {
                let page = executor.page_size();
                let start = code.target.next_multiple_of(page);
                let end = (code.target + code.len) / page * page;
                if end > start {
                    executor.guard_branch_targets(start, end - start)?;
                }
            }
        }
        let tls_module = linked.tls.as_ref().map(|t| t.module_id);
        if let Some(template) = linked.tls {
            executor.install_tls(template)?;
        }
        let eh = match linked.eh_frame {
            Some(address) => executor.register_eh_frame(address)?,
            None => None,
        };
        let exports = if self.inner.export_to_libraries
            && publish == Publish::Yes
            && linked.exports.iter().any(|e| e.visible)
        {
            let code = linked
                .allocation
                .segments()
                .first()
                .map(|c| c.target..c.target + c.len);
            let list = linked
                .exports
                .iter()
                .filter(|e| e.visible)
                .map(|e| kiln_executor::shared_object::ExportedSymbol {
                    name: e.name.to_string(),
                    address: e.address,
                    size: 0,
                    function: code.as_ref().is_some_and(|c| c.contains(&e.address)),
                })
                .collect();
            Some(executor.export_symbols(list)?)
        } else {
            None
        };
        let name = objects.first().map(|o| o.name.clone()).unwrap_or_default();
        let event = (!plugins.is_empty()).then(|| {
            Arc::new(LoadedModule {
                id,
                name: name.clone(),
                segments: linked.allocation.segments().to_vec(),
                sections: linked.sections,
                symbols: linked.symbol_info,
                objects: {
                    let mut objects = linked.objects;
                    if let Some(shown) = shown {
                        if let Some(o) = objects.iter_mut().find(|o| o.name == shown.name) {
                            *o = shown;
                        }
                    }
                    objects
                },
            })
        });
        let module = Module {
            inner: Arc::new(ModuleInner {
                id,
                name: name.into_boxed_str(),
                library: library.id,
                // Sorted by name already; the names are shared with the index below.
                symbols: std::mem::take(&mut linked.exports)
                    .into_iter()
                    .map(|e| (e.name, e.address, e.visible))
                    .collect(),
                fini: if self.inner.noexec {
                    Box::default()
                } else {
                    linked.fini.into_boxed_slice()
                },
                dso_handle: linked.dso_handle,
                tls_module,
                eh: Mutex::new(eh),
                exports: Mutex::new(exports),
                finalized: Mutex::new(self.inner.noexec),
                executor: executor.clone(),
                uses: uses.into_boxed_slice(),
                users: Mutex::new(Vec::new()),
                announced: Mutex::new(None),
                allocation: linked.allocation,
            }),
        };
        for used in &module.inner.uses {
            let mut users = used.inner.users.lock();
            // Entries of users dropped without being removed go when the list is full,
            // before it grows: amortized constant time per link, however many users a
            // long-lived runtime module has.
            if users.len() == users.capacity() {
                users.retain(|u| u.strong_count() > 0);
            }
            users.push(Arc::downgrade(&module.inner));
        }
        // A module this one calls may have been removed while it linked (its removal saw
        // no user yet). Now that this one is a user, a removal is refused; one that came
        // first is caught here, and this module never runs.
        for used in &module.inner.uses {
            let listed = self
                .library(used.inner.library)
                .map(|l| l.state.read().modules.contains_key(&used.inner.id))
                .unwrap_or(false);
            if !listed {
                *module.inner.finalized.lock() = true; // its initializers never ran
                return Err(Error::RemovedDuringLink {
                    module: module.inner.name.to_string(),
                    used: used.inner.name.to_string(),
                });
            }
        }
        if uses_thread_atexit {
            // Its thread-local destructors will keep it mapped (a global registry: only
            // for modules that register such destructors).
            let keep_alive: Arc<dyn std::any::Any + Send + Sync> = module.inner.clone();
            executor.register_module(linked.dso_handle, Arc::downgrade(&keep_alive));
        }
        if publish == Publish::Yes {
            let mut state = library.state.write();
            state.index.reserve(module.inner.symbols.len());
            // The index shares the module's name strings (one allocation per name).
            for (name, address, exported) in module.inner.symbols.iter() {
                let map = if *exported {
                    &mut state.index
                } else {
                    &mut state.hidden
                };
                map.insert(
                    name.clone(),
                    Definition {
                        address: *address,
                        module: Some(id),
                    },
                );
            }
            state.modules.insert(id, module.clone());
        }
        // No lock while plugins and JIT code run: an initializer may call back into the
        // session, even to link into this library.
        drop(linking);
        if let Some(event) = event {
            self.inner.plugins.announce(&plugins, &event, true);
            *module.inner.announced.lock() = Some(Box::new(Announced {
                plugins: self.inner.plugins.clone(),
                told: plugins,
                event,
            }));
        }
        if !self.inner.noexec {
            self.inner.executor.run_initializers(&linked.init)?;
        }
        Ok((module, report))
    }

    /// The address of `name` as `lib` sees it: its definitions and modules; else, after
    /// linking what is pending (with the lazy objects that define `name` or what the link
    /// needs), those again, the libraries in its search order (linking their lazy objects
    /// that define it), and its generators. A lazy function's name gives its stub.
    pub fn lookup(&self, lib: LibraryId, name: &str) -> Result<u64, Error> {
        // The common case, one hash lookup under a read lock.
        if lib.session == self.inner.session {
            if let Some(library) = self.inner.libraries.read().get(lib.index as usize) {
                if let Some(d) = library.state.read().index.get(name) {
                    return Ok(d.address);
                }
            }
        }
        Ok(self.lookup_many(lib, &[name])?[0])
    }

    /// [`Jit::lookup`] of many names (one batch to a remote executor for those the
    /// generators answer); an error names the first name not found.
    pub fn lookup_many(&self, lib: LibraryId, names: &[&str]) -> Result<Vec<u64>, Error> {
        let library = self.library(lib)?;
        // What is linked already answers without linking what is pending.
        {
            let state = library.state.read();
            let known: Option<Vec<u64>> = names
                .iter()
                .map(|n| state.index.get(*n).map(|d| d.address))
                .collect();
            if let Some(known) = known {
                return Ok(known);
            }
        }
        self.link(lib, None, None, names, Publish::Yes, false)?;
        let mut ctx = SessionContext::new(self, &library, Publish::Yes);
        let found = ctx.resolve_many(names);
        let state = library.state.read();
        names
            .iter()
            .zip(found)
            .map(|(name, address)| {
                address
                    // Last, the library's modules' hidden definitions (a hidden `main` is
                    // still the program's entry).
                    .or_else(|| state.hidden.get(*name).map(|d| d.address))
                    .ok_or_else(|| Error::SymbolNotFound(name.to_string()))
            })
            .collect()
    }

    /// The function `name` as a typed function pointer, e.g.
    /// `jit.lookup_fn::<extern "C" fn(i64) -> i64>(lib, "square")`.
    ///
    /// # Safety
    /// `F` must be a function pointer type matching the function's real signature and ABI,
    /// the executor must be this process, and the caller must keep the module alive (it
    /// stays in its library until removed) while calling it.
    pub unsafe fn lookup_fn<F: Copy>(&self, lib: LibraryId, name: &str) -> Result<F, Error> {
        if std::mem::size_of::<F>() != std::mem::size_of::<usize>() {
            return Err(Error::Executor(format!(
                "lookup_fn::<{}>: not a function pointer type",
                std::any::type_name::<F>()
            )));
        }
        if self.inner.executor.pid().is_some() {
            return Err(Error::Executor(
                "lookup_fn: the code runs in another process; use Executor::call".into(),
            ));
        }
        let address = self.lookup(lib, name)? as usize;
        // SAFETY: sizes checked above; the caller vouches for the type.
        Ok(unsafe { std::mem::transmute_copy::<usize, F>(&address) })
    }

    /// The module of `lib` that defines `name`, if a module does.
    pub fn module_of(&self, lib: LibraryId, name: &str) -> Result<Option<Module>, Error> {
        let library = self.library(lib)?;
        let state = library.state.read();
        Ok(state
            .index
            .get(name)
            .or_else(|| state.hidden.get(name))
            .and_then(|d| d.module)
            .and_then(|id| state.modules.get(&id).cloned()))
    }

    /// The live modules of `lib`, oldest first.
    pub fn modules(&self, lib: LibraryId) -> Result<Vec<Module>, Error> {
        let library = self.library(lib)?;
        let state = library.state.read();
        let mut modules: Vec<Module> = state.modules.values().cloned().collect();
        modules.sort_by_key(|m| m.inner.id);
        Ok(modules)
    }

    /// Links what is pending and calls `main(argc, argv, envp)` with `args` (`argv[0]`
    /// first); returns its status. The C library's buffered output is flushed after.
    ///
    /// # Safety
    /// `main` of `lib` must be a C `int main(int, char **, char **)` (or compatible): Kiln
    /// calls whatever address the name resolves to, including one given to
    /// [`Jit::define_symbol`].
    pub unsafe fn run_main(&self, lib: LibraryId, args: &[String]) -> Result<i32, Error> {
        let main = self.lookup(lib, "main")?;
        // SAFETY: the caller's contract.
        unsafe { self.inner.executor.run_main(main, args) }
    }

    /// Removes every module of `modules`, in an order that removes users before the
    /// modules they use (as [`Jit::remove_module`] each). Refused before anything is
    /// removed, with [`Error::ModuleInUse`] naming them, if live modules outside the set
    /// use one of it.
    ///
    /// ```
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # if !cfg!(target_arch = "x86_64") { return Ok(()); }
    /// use kiln::lazy::testing::constant_function;
    /// let jit = kiln::Jit::new()?;
    /// let lib = jit.main_library();
    /// jit.add_object(lib, "one.o", constant_function("one", 1))?;
    /// let (one, _) = jit.link_pending(lib)?.expect("a module");
    /// jit.add_object(lib, "two.o", constant_function("two", 2))?;
    /// let (two, _) = jit.link_pending(lib)?.expect("a module");
    /// jit.remove_modules(&[one, two])?;
    /// assert!(jit.lookup(lib, "one").is_err());
    /// # Ok(()) }
    /// ```
    pub fn remove_modules(&self, modules: &[Module]) -> Result<(), Error> {
        // Members by identity (a module listed twice counts once).
        let key = |m: &ModuleInner| m as *const ModuleInner;
        let index: FxHashMap<*const ModuleInner, usize> = modules
            .iter()
            .enumerate()
            .map(|(i, m)| (key(&m.inner), i))
            .collect();
        let in_set = |m: &ModuleInner| index.contains_key(&key(m));
        // Users outside the set (live, or still listed) refuse the whole removal.
        for module in modules {
            let library = self.library(module.inner.library)?;
            let state = library.state.read();
            let outside: Vec<String> = module
                .inner
                .users
                .lock()
                .iter()
                .filter_map(Weak::upgrade)
                .filter(|u| !in_set(u))
                .filter(|u| !*u.finalized.lock() || u.is_listed(&state))
                .map(|u| u.name.to_string())
                .collect();
            if !outside.is_empty() {
                return Err(Error::ModuleInUse {
                    module: module.inner.name.to_string(),
                    users: outside,
                });
            }
        }
        // Users first (Kahn's order): a member goes once no remaining member uses it.
        let mut users_left = vec![0usize; modules.len()];
        for (i, m) in modules.iter().enumerate() {
            if index.get(&key(&m.inner)) != Some(&i) {
                continue; // a repeat
            }
            for used in m.inner.uses.iter() {
                if let Some(&j) = index.get(&key(&used.inner)) {
                    users_left[j] += 1;
                }
            }
        }
        let mut ready: Vec<usize> = (0..modules.len())
            .filter(|&i| index.get(&key(&modules[i].inner)) == Some(&i) && users_left[i] == 0)
            .collect();
        let mut removed = 0;
        while let Some(i) = ready.pop() {
            self.remove_module(&modules[i])?;
            removed += 1;
            for used in modules[i].inner.uses.iter() {
                if let Some(&j) = index.get(&key(&used.inner)) {
                    users_left[j] -= 1;
                    if users_left[j] == 0 {
                        ready.push(j);
                    }
                }
            }
        }
        if removed < index.len() {
            // Modules cannot use each other in a cycle (a module uses only earlier ones).
            let left: Vec<String> = index
                .values()
                .filter(|&&i| users_left[i] > 0)
                .map(|&i| modules[i].inner.name.to_string())
                .collect();
            return Err(Error::ModuleInUse {
                module: left.first().cloned().unwrap_or_default(),
                users: left,
            });
        }
        Ok(())
    }

    /// Removes `module` from its library, as `dlclose` would: its definitions leave the
    /// library's index, its finalizers run now, and its memory is freed when the last
    /// handle to it (and the last module that refers to it) is gone.
    ///
    /// Refused, with [`Error::ModuleInUse`] naming them, while live modules refer to it
    /// (remove those first): their code calls into it.
    ///
    /// The finalizers run in this order, on the calling thread:
    /// 1. the calling thread's destructors of the module's C++ `thread_local` objects
    ///    (newest first);
    /// 2. the handlers the module registered with `atexit` / `__cxa_atexit` (newest first,
    ///    through `__cxa_finalize` of the module's own `__dso_handle`, which also forgets
    ///    its `pthread_atfork` handlers);
    /// 3. its `.fini_array` (and `.dtors`).
    ///
    /// Thread-local destructors never run in freed memory: those of *other* threads run
    /// when those threads exit, and every such registration holds the module's memory
    /// mapped until it has run — so a module whose thread-locals are alive in other
    /// threads stays mapped (though removed from its library) until those threads exit.
    /// Handlers still registered when the process exits run in `exit()` while their code
    /// is mapped. (Out of process, the executor runs steps 1–3 on its serving thread.)
    pub fn remove_module(&self, module: &Module) -> Result<(), Error> {
        let library = self.library(module.inner.library)?;
        {
            let mut state = library.state.write();
            let users: Vec<String> = module
                .inner
                .users
                .lock()
                .iter()
                .filter_map(Weak::upgrade)
                .filter(|u| !*u.finalized.lock() || u.is_listed(&state))
                .map(|u| u.name.to_string())
                .collect();
            if !users.is_empty() {
                return Err(Error::ModuleInUse {
                    module: module.inner.name.to_string(),
                    users,
                });
            }
            if state.modules.remove(&module.inner.id).is_none() {
                return Ok(()); // removed already
            }
            // Only the module's own names: removal costs what the module defines, not
            // what the library holds.
            let id = module.inner.id;
            for (name, _, exported) in module.inner.symbols.iter() {
                let map = if *exported {
                    &mut state.index
                } else {
                    &mut state.hidden
                };
                if map.get(&**name).is_some_and(|d| d.module == Some(id)) {
                    map.remove(&**name);
                }
            }
        }
        module.inner.leave_users_lists();
        module.inner.finalize();
        Ok(())
    }

    /// Runs the finalizers of every module (newest first) and forgets them, as a program's
    /// exit would.
    pub fn shutdown(&self) {
        let mut modules: Vec<Module> = Vec::new();
        for library in self.inner.libraries.read().iter() {
            let mut state = library.state.write();
            modules.extend(state.modules.drain().map(|(_, m)| m));
            state.index.retain(|_, d| d.module.is_none());
            state.hidden.clear();
        }
        modules.sort_by_key(|m| std::cmp::Reverse(m.inner.id));
        for m in &modules {
            m.inner.finalize();
        }
        self.inner.executor.flush();
    }

    /// For code run in this process: reports a crash of JIT code (signal, faulting address,
    /// the JIT function it falls in) on standard error and ends the process with status
    /// 128 + the signal number, as a shell reports a killed program. Covers the modules
    /// linked so far; a remote executor reports crashes itself, so this does nothing
    /// there. Installs process-wide signal handlers: for programs like `kiln run`, not
    /// for a library embedding Kiln.
    pub fn report_crashes(&self) {
        if self.inner.executor.pid().is_some() {
            return;
        }
        let mut code = Vec::new();
        let mut functions = Vec::new();
        for library in self.inner.libraries.read().iter() {
            let state = library.state.read();
            for module in state.modules.values() {
                let Some(text) = module.inner.allocation.segments().first() else {
                    continue;
                };
                code.push((text.target, text.target + text.len));
            }
            for (name, d) in state.index.iter().chain(&state.hidden) {
                if d.module.is_some() && code.iter().any(|&(a, b)| (a..b).contains(&d.address)) {
                    functions.push((d.address, name.to_string()));
                }
            }
        }
        kiln_executor::crash_report::install(code, functions);
    }

    /// The JIT function `address` falls in: its name and the offset into it (the nearest
    /// definition at or below `address` in the code of a module of this session). For
    /// reports of crashes in an executor process, which has no symbol table of its own.
    pub fn function_at(&self, address: u64) -> Option<(String, u64)> {
        let mut best: Option<(u64, String)> = None;
        for library in self.inner.libraries.read().iter() {
            let state = library.state.read();
            let in_code = state.modules.values().any(|m| {
                m.inner
                    .allocation
                    .segments()
                    .first()
                    .is_some_and(|t| (t.target..t.target + t.len).contains(&address))
            });
            if !in_code {
                continue;
            }
            for (name, d) in state.index.iter().chain(&state.hidden) {
                if d.module.is_some()
                    && d.address <= address
                    && best.as_ref().is_none_or(|(a, _)| d.address > *a)
                {
                    best = Some((d.address, name.to_string()));
                }
            }
        }
        best.map(|(start, name)| (name, address - start))
    }

    /// Memory figures of the session's memory manager.
    pub fn memory_stats(&self) -> MemoryStats {
        self.inner.memory.stats()
    }

    /// The name of a library.
    pub fn library_name(&self, lib: LibraryId) -> Result<String, Error> {
        Ok(self.library(lib)?.name.clone())
    }
}

/// "module NAME" or "define_symbol", for messages.
fn describe(state: &LibraryState, d: &Definition) -> String {
    match d.module.and_then(|id| state.modules.get(&id)) {
        Some(m) => format!("module {}", m.inner.name),
        None => format!(
            "an absolute definition at {:#x} (Jit::define_symbol)",
            d.address
        ),
    }
}

/// What a module's free is to be announced to: the plugins told of its load.
struct Announced {
    plugins: Arc<Plugins>,
    told: Vec<Arc<dyn Plugin>>,
    event: Arc<LoadedModule>,
}

thread_local! {
    /// The libraries this thread is linking into, outermost first (a link may link the
    /// lazy objects of another library it needs).
    static LINKING: std::cell::RefCell<Vec<LibraryId>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Marks a library as being linked into by this thread, while the value lives.
struct LinkingHere;

impl LinkingHere {
    fn enter(lib: LibraryId) -> Self {
        LINKING.with(|l| l.borrow_mut().push(lib));
        LinkingHere
    }
}

impl Drop for LinkingHere {
    fn drop(&mut self) {
        LINKING.with(|l| l.borrow_mut().pop());
    }
}

/// Takes a library's link lock. A link nested in another (lazy objects of a library in
/// the search order) neither waits for a library this thread is already linking into
/// (libraries whose lazy objects need each other) nor forever for one another thread
/// links into (two threads each linking into one library of such a pair): both are
/// errors, not deadlocks.
fn lock_for_link(library: &Library) -> Result<parking_lot::MutexGuard<'_, ()>, Error> {
    let nested = LINKING.with(|l| {
        let l = l.borrow();
        if l.contains(&library.id) {
            Err(Error::Unsupported(format!(
                "library {} is being linked on this thread already: its lazy objects and another library's need each other",
                library.name
            )))
        } else {
            Ok(!l.is_empty())
        }
    })?;
    if !nested {
        return Ok(library.link.lock());
    }
    library
        .link
        .try_lock_for(std::time::Duration::from_secs(10))
        .ok_or_else(|| {
            Error::Unsupported(format!(
                "waited 10 s to link lazy objects of library {} (another thread links into it and may wait for this one)",
                library.name
            ))
        })
}

/// How a link runs: whether it publishes, whether it reads the clock for its report.
#[derive(Debug, Clone, Copy)]
struct LinkMode {
    publish: Publish,
    times: bool,
}

/// Whether a link publishes its module's definitions in its library.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Publish {
    Yes,
    No,
}

struct SessionContext<'s> {
    jit: &'s Jit,
    library: &'s Arc<Library>,
    /// Whether the link publishes into `library` (it then holds the library's link lock:
    /// the library's lazy objects were taken before the link, not during it).
    publish: Publish,
    /// Whether the names generators resolved are functions, as far as they know.
    kinds: FxHashMap<String, bool>,
    /// The modules whose definitions the link used, by id.
    uses: FxHashMap<u64, Module>,
    /// Whether the link resolved `__cxa_thread_atexit` (the module registers thread-local
    /// destructors).
    thread_atexit: bool,
    /// Why a lazy object of another library that this link needed could not be linked.
    lazy_error: Option<Error>,
    /// The search order, once read.
    order: Option<SearchOrder>,
}

/// A link's libraries in search order.
type SearchOrder = smallvec::SmallVec<[Arc<Library>; 4]>;

impl<'s> SessionContext<'s> {
    fn new(jit: &'s Jit, library: &'s Arc<Library>, publish: Publish) -> Self {
        SessionContext {
            jit,
            library,
            publish,
            kinds: FxHashMap::default(),
            uses: FxHashMap::default(),
            thread_atexit: false,
            lazy_error: None,
            order: None,
        }
    }

    /// The libraries whose indexes resolve names for this link, in order (read once per
    /// link; inline for up to four libraries).
    fn order(&mut self) -> SearchOrder {
        if let Some(order) = &self.order {
            return order.clone();
        }
        let mut order = SearchOrder::new();
        order.push(self.library.clone());
        let state = self.library.state.read();
        order.extend(
            state
                .search_order
                .iter()
                .filter_map(|&l| self.jit.library(l).ok()),
        );
        drop(state);
        self.order = Some(order.clone());
        order
    }

    /// Names found in the indexes of `order`; records the modules they come from. A name
    /// that a library has only in a lazy object is linked there first (as a module of its
    /// own), except in the library this link publishes into.
    fn search_indexes(&mut self, order: &[Arc<Library>], names: &[&str]) -> Vec<Option<u64>> {
        let mut out = vec![None; names.len()];
        for library in order {
            let own = Arc::ptr_eq(library, self.library) && self.publish == Publish::Yes;
            if !own {
                let lazy: Vec<&str> = {
                    let state = library.state.read();
                    names
                        .iter()
                        .zip(&out)
                        .filter(|(n, slot)| {
                            slot.is_none()
                                && !state.index.contains_key(**n)
                                && state.lazy.contains_key(**n)
                        })
                        .map(|(n, _)| *n)
                        .collect()
                };
                if !lazy.is_empty() {
                    if let Err(error) =
                        self.jit
                            .link(library.id, None, None, &lazy, Publish::Yes, false)
                    {
                        // The names stay undefined; this link fails with this error.
                        self.lazy_error.get_or_insert(error);
                    }
                }
            }
            let state = library.state.read();
            for (slot, name) in out.iter_mut().zip(names) {
                if slot.is_some() {
                    continue;
                }
                if let Some(d) = state.index.get(*name) {
                    *slot = Some(d.address);
                    if let Some(id) = d.module {
                        if let Some(m) = state.modules.get(&id) {
                            self.uses.entry(id).or_insert_with(|| m.clone());
                        }
                    }
                }
            }
        }
        out
    }
}

impl LinkContext for SessionContext<'_> {
    fn resolve(&mut self, name: &str) -> Option<u64> {
        self.resolve_many(&[name]).pop().flatten()
    }

    fn resolve_defined(&mut self, names: &[&str]) -> Vec<Option<u64>> {
        let order = self.order();
        self.search_indexes(&order, names)
    }

    fn resolve_many(&mut self, names: &[&str]) -> Vec<Option<u64>> {
        let executor = &self.jit.inner.executor;
        let order = self.order();
        let mut out = self.search_indexes(&order, names);
        for (slot, name) in out.iter_mut().zip(names) {
            if slot.is_none() {
                // What Kiln's runtime provides in place of the C runtime's.
                *slot = executor.runtime_symbol(name);
                if slot.is_some() && name.starts_with("__cxa_thread_atexit") {
                    self.thread_atexit = true;
                }
            }
        }
        // Generators, library by library, each asked once for everything still missing
        // that it has not answered before.
        for library in &order {
            let mut pending: Vec<usize> = (0..names.len()).filter(|&i| out[i].is_none()).collect();
            if pending.is_empty() {
                break;
            }
            let mut generators = library.generators.lock();
            pending.retain(|&i| match generators.found.get(names[i]) {
                Some(&(address, kind)) => {
                    out[i] = Some(address);
                    if let Some(kind) = kind {
                        self.kinds.insert(names[i].to_string(), kind);
                    }
                    false
                }
                None => true,
            });
            let Generators { list, found } = &mut *generators;
            for generator in list.iter_mut() {
                if pending.is_empty() {
                    break;
                }
                let ask: Vec<&str> = pending.iter().map(|&i| names[i]).collect();
                let got = generator.generate_many(&ask);
                let mut still = Vec::new();
                for (&i, hit) in pending.iter().zip(got) {
                    match hit {
                        Some((address, kind)) => {
                            out[i] = Some(address);
                            found.insert(names[i].into(), (address, kind));
                            if let Some(kind) = kind {
                                self.kinds.insert(names[i].to_string(), kind);
                            }
                        }
                        None => still.push(i),
                    }
                }
                pending = still;
            }
        }
        out
    }

    fn tls_module_id(&mut self) -> Result<u64, String> {
        self.jit
            .inner
            .executor
            .reserve_tls_module()
            .map_err(|e| e.to_string())
    }

    fn place_static_tls(
        &mut self,
        module_id: u64,
        image: &[u8],
        size: u64,
        align: u64,
    ) -> Result<i64, String> {
        self.jit
            .inner
            .executor
            .place_static_tls(module_id, image, size, align)
            .map_err(|e| e.to_string())
    }

    fn is_function(&mut self, name: &str, address: u64) -> Option<bool> {
        self.kinds.get(name).copied().or_else(|| {
            // In process, a symbol's kind is looked up only when the link asks (a
            // `dladdr` each): few links need it.
            self.jit
                .inner
                .executor
                .remote()
                .is_none()
                .then(|| kiln_executor::runtime::host_symbol_is_function(address))
                .flatten()
        })
    }
}

struct ModuleInner {
    id: u64,
    name: Box<str>,
    library: LibraryId,
    /// The module's global definitions, sorted by name: (name, address, exported).
    symbols: Box<[(Arc<str>, u64, bool)]>,
    fini: Box<[u64]>,
    dso_handle: u64,
    tls_module: Option<u64>,
    eh: Mutex<Option<EhRegistration>>,
    exports: Mutex<Option<ExportHandle>>,
    finalized: Mutex<bool>,
    executor: Executor,
    /// The modules whose definitions this one's code refers to: kept alive with it.
    uses: Box<[Module]>,
    /// The modules that refer to this one.
    users: Mutex<Vec<Weak<ModuleInner>>>,
    /// The plugins told of the module's load, to be told of its free.
    /// (Boxed: most sessions have no plugin, and every module pays for the field.)
    announced: Mutex<Option<Box<Announced>>>,
    allocation: FinalizedAllocation,
}

impl ModuleInner {
    /// Takes this module out of the user lists of the modules it uses (at removal and
    /// when it is dropped): a JIT that churns modules calling a long-lived one must not
    /// grow that one's list.
    fn leave_users_lists(&self) {
        let me = self as *const ModuleInner;
        for used in self.uses.iter() {
            used.inner.users.lock().retain(|u| u.as_ptr() != me);
        }
    }

    /// Whether the module is still in its library's index.
    fn is_listed(&self, state: &LibraryState) -> bool {
        state.modules.contains_key(&self.id)
    }

    /// Runs finalizers once (the calling thread's thread-local destructors, `atexit`
    /// handlers, `.fini_array`), withdraws exported definitions and unregisters unwind
    /// information; the memory stays until the last handle goes.
    fn finalize(&self) {
        let run = {
            let mut done = self.finalized.lock();
            let run = !*done;
            *done = true;
            run
        };
        if let Some(exports) = self.exports.lock().take() {
            self.executor.unexport_symbols(exports);
        }
        if run {
            if let Err(error) = self.executor.run_finalizers(self.dso_handle, &self.fini) {
                tracing::warn!(%error, module = %self.name, "running finalizers failed");
            }
        }
        self.executor.unregister_module(self.dso_handle);
        if let Some(registration) = self.eh.lock().take() {
            self.executor.deregister_eh_frame(registration);
        }
    }
}

impl Drop for ModuleInner {
    fn drop(&mut self) {
        self.leave_users_lists();
        self.finalize();
        // Thread-local storage goes last: other threads' thread-local destructors, which
        // kept the module alive until now, may have used it.
        if let Some(id) = self.tls_module {
            self.executor.remove_tls(id);
        }
        if let Some(announced) = self.announced.lock().take() {
            announced
                .plugins
                .announce(&announced.told, &announced.event, false);
        }
    }
}

/// A linked module. Clones share it; it keeps its code and data alive (even after the
/// [`Jit`] is dropped), and when the last handle goes its finalizers run and its memory is
/// freed.
#[derive(Clone)]
pub struct Module {
    inner: Arc<ModuleInner>,
}

impl std::fmt::Debug for Module {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Module")
            .field("name", &self.inner.name)
            .field("symbols", &self.inner.symbols.len())
            .finish()
    }
}

impl Module {
    /// The address of a global symbol the module defines (exported or hidden).
    pub fn symbol(&self, name: &str) -> Option<u64> {
        let symbols = &self.inner.symbols;
        symbols
            .binary_search_by(|(n, _, _)| (**n).cmp(name))
            .ok()
            .map(|i| symbols[i].1)
    }

    /// The names the module exports to its library.
    pub fn exported_names(&self) -> impl Iterator<Item = &str> {
        self.inner
            .symbols
            .iter()
            .filter(|(_, _, exported)| *exported)
            .map(|(n, _, _)| &**n)
    }

    /// The module's memory segments.
    pub fn allocation(&self) -> &FinalizedAllocation {
        &self.inner.allocation
    }

    /// A name for messages (its first object's).
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// The modules whose definitions this module's code refers to.
    pub fn uses(&self) -> impl Iterator<Item = &Module> {
        self.inner.uses.iter()
    }

    /// Whether two handles are the same module.
    pub fn same(&self, other: &Module) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }
}
