//! The session: a [`Jit`] with libraries (namespaces of definitions with a search order),
//! symbol generators, and module handles.

use crate::executor::{EhRegistration, Executor, ExecutorSymbols, ExportHandle};
use crate::generator::SymbolGenerator;
use crate::library_search::{default_search_dirs, find_library, LibraryFile};
use crate::Error;
use kiln_link::{link, ArchiveInput, LinkContext, LinkCounts, LinkOptions, LinkTimes, ObjectInput};
use kiln_memory::{
    FinalizedAllocation, MemoryManager, MemoryStats, Placement, SlabLayout, SlabMemoryManager,
};
use parking_lot::Mutex;
use rustc_hash::FxHashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// A library of a [`Jit`]: a namespace of definitions with a search order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LibraryId(usize);

struct Library {
    name: String,
    objects: Vec<ObjectInput>,
    archives: Vec<ArchiveInput>,
    definitions: FxHashMap<String, u64>,
    generators: Vec<Box<dyn SymbolGenerator>>,
    modules: Vec<Module>,
    search_order: Vec<LibraryId>,
}

struct State {
    libraries: Vec<Library>,
}

struct Inner {
    executor: Executor,
    export_to_libraries: bool,
    noexec: bool,
    memory: SlabMemoryManager,
    low_memory: LowMemory,
    state: Mutex<State>,
}

/// Memory in the low 2 GiB for non-PIC code, reserved on first use (most programs never
/// need it, and reserving costs a round trip to a remote executor).
struct LowMemory {
    given: Option<Option<SlabMemoryManager>>,
    mapper: Option<Arc<dyn kiln_memory::Mapper>>,
    built: std::sync::OnceLock<Option<SlabMemoryManager>>,
}

impl LowMemory {
    fn get(&self) -> Option<&SlabMemoryManager> {
        if let Some(given) = &self.given {
            return given.as_ref();
        }
        self.built
            .get_or_init(|| {
                let mut builder = SlabMemoryManager::builder()
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
/// let status = jit.run_main(lib, &["hello".to_string()])?;
/// # Ok::<(), kiln::Error>(())
/// ```
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
    memory: Option<SlabMemoryManager>,
    low_memory: Option<Option<SlabMemoryManager>>,
}

impl JitBuilder {
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

    /// The memory manager for code (default: Kiln's slab manager near the host's
    /// libraries).
    pub fn memory(mut self, memory: SlabMemoryManager) -> Self {
        self.memory = Some(memory);
        self
    }

    /// The memory manager for non-PIC code with absolute 32-bit relocations (default: a
    /// slab manager in the low 2 GiB; `None` to refuse such code).
    pub fn low_memory(mut self, memory: Option<SlabMemoryManager>) -> Self {
        self.low_memory = Some(memory);
        self
    }

    /// Builds the session.
    pub fn build(self) -> Result<Jit, Error> {
        let executor = self.executor.unwrap_or_else(Executor::in_process);
        let mapper = executor.mapper()?;
        let with_mapper = |b: kiln_memory::SlabMemoryManagerBuilder| match &mapper {
            Some(m) => b.mapper(m.clone()),
            None => b,
        };
        let memory = match self.memory {
            Some(m) => m,
            None => with_mapper(SlabMemoryManager::builder()).build()?,
        };
        let low_memory = LowMemory {
            given: self.low_memory,
            mapper,
            built: std::sync::OnceLock::new(),
        };
        let main = Library {
            name: "main".into(),
            objects: Vec::new(),
            archives: Vec::new(),
            definitions: FxHashMap::default(),
            generators: Vec::new(),
            modules: Vec::new(),
            search_order: Vec::new(),
        };
        Ok(Jit {
            inner: Arc::new(Inner {
                executor,
                export_to_libraries: self.export_to_libraries,
                noexec: self.noexec,
                memory,
                low_memory,
                state: Mutex::new(State {
                    libraries: vec![main],
                }),
            }),
        })
    }
}

fn read_file(path: &Path) -> Result<Vec<u8>, Error> {
    std::fs::read(path).map_err(|source| Error::Io {
        path: path.to_path_buf(),
        source,
    })
}

/// Figures of one link.
#[derive(Debug, Clone, Copy, Default)]
pub struct LinkReport {
    /// Phase times.
    pub times: LinkTimes,
    /// Counts.
    pub counts: LinkCounts,
}

impl Jit {
    /// A session with default memory managers.
    pub fn new() -> Result<Self, Error> {
        JitBuilder::default().build()
    }

    /// A builder.
    pub fn builder() -> JitBuilder {
        JitBuilder::default()
    }

    /// The library every session starts with.
    pub fn main_library(&self) -> LibraryId {
        LibraryId(0)
    }

    /// Creates a library.
    pub fn create_library(&self, name: &str) -> LibraryId {
        let mut state = self.inner.state.lock();
        state.libraries.push(Library {
            name: name.to_string(),
            objects: Vec::new(),
            archives: Vec::new(),
            definitions: FxHashMap::default(),
            generators: Vec::new(),
            modules: Vec::new(),
            search_order: Vec::new(),
        });
        LibraryId(state.libraries.len() - 1)
    }

    /// Libraries searched, in order, for what `lib` does not define.
    pub fn set_search_order(&self, lib: LibraryId, order: &[LibraryId]) {
        self.inner.state.lock().libraries[lib.0].search_order = order.to_vec();
    }

    /// Adds a relocatable object from bytes.
    pub fn add_object(&self, lib: LibraryId, name: &str, bytes: Vec<u8>) -> Result<(), Error> {
        kiln_link::check_object(name, &bytes)?;
        self.inner.state.lock().libraries[lib.0]
            .objects
            .push(ObjectInput::new(name, bytes));
        Ok(())
    }

    /// Adds a relocatable object file.
    pub fn add_object_file(&self, lib: LibraryId, path: impl AsRef<Path>) -> Result<(), Error> {
        let path = path.as_ref();
        self.add_object(lib, &path.display().to_string(), read_file(path)?)
    }

    /// Adds a static archive from bytes: its members are linked when they define a symbol
    /// the link needs.
    pub fn add_archive(&self, lib: LibraryId, name: &str, bytes: Vec<u8>) -> Result<(), Error> {
        let archive = ArchiveInput::parse(name, bytes)?;
        self.inner.state.lock().libraries[lib.0]
            .archives
            .push(archive);
        Ok(())
    }

    /// Adds a static archive file.
    pub fn add_archive_file(&self, lib: LibraryId, path: impl AsRef<Path>) -> Result<(), Error> {
        let path = path.as_ref();
        self.add_archive(lib, &path.display().to_string(), read_file(path)?)
    }

    /// Adds an object or an archive, by its contents.
    pub fn add_file(&self, lib: LibraryId, path: impl AsRef<Path>) -> Result<(), Error> {
        let path = path.as_ref();
        let bytes = read_file(path)?;
        if bytes.starts_with(b"!<arch>\n") {
            self.add_archive(lib, &path.display().to_string(), bytes)
        } else if bytes.starts_with(b"\x7fELF") {
            self.add_object(lib, &path.display().to_string(), bytes)
        } else {
            Err(Error::UnknownInput {
                path: path.to_path_buf(),
            })
        }
    }

    /// Defines `name` in `lib` at `address` (a host function or data).
    pub fn define_symbol(&self, lib: LibraryId, name: &str, address: u64) {
        self.inner.state.lock().libraries[lib.0]
            .definitions
            .insert(name.to_string(), address);
    }

    /// Adds a generator for names `lib` does not define.
    pub fn add_generator(&self, lib: LibraryId, generator: Box<dyn SymbolGenerator>) {
        self.inner.state.lock().libraries[lib.0]
            .generators
            .push(generator);
    }

    /// Resolves what `lib` does not define from the executor's process symbols (this
    /// process's, for the in-process executor).
    ///
    /// The C library's few functions that a native link takes from `libc_nonshared.a`
    /// rather than `libc.so.6` — `atexit`, `at_quick_exit`, `pthread_atfork` — are linked
    /// from that archive into the module that calls them, as a native link does, so that
    /// their handlers belong to the calling module (its own `__dso_handle`) and run when
    /// it is removed.
    pub fn add_process_symbols(&self, lib: LibraryId) {
        if self.inner.executor.is_host_architecture() {
            let found = default_search_dirs()
                .into_iter()
                .map(|d| d.join("libc_nonshared.a"))
                .find(|p| p.is_file());
            if let Some(path) = found {
                if let Err(error) = self.add_archive_file(lib, &path) {
                    tracing::debug!(%error, "libc_nonshared.a not used");
                }
            }
        }
        self.add_generator(
            lib,
            Box::new(ExecutorSymbols {
                executor: self.inner.executor.clone(),
                library: 0,
                name: "process symbols".into(),
            }),
        );
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
        all.extend(default_search_dirs());
        for file in find_library(name, &all)? {
            match file {
                LibraryFile::Archive(path) => self.add_archive_file(lib, path)?,
                LibraryFile::Shared(path) => {
                    let path = path.display().to_string();
                    let handle = self.inner.executor.load_library(&path)?;
                    self.add_generator(
                        lib,
                        Box::new(ExecutorSymbols {
                            executor: self.inner.executor.clone(),
                            library: handle,
                            name: path,
                        }),
                    );
                }
            }
        }
        Ok(())
    }

    /// The executor the session runs code in.
    pub fn executor(&self) -> &Executor {
        &self.inner.executor
    }

    /// Links the objects added to `lib` since its last link (and the archive members they
    /// need) into a module, registers its unwind information and runs its initializers.
    /// Returns `None` if there was nothing to link.
    pub fn link_pending(&self, lib: LibraryId) -> Result<Option<(Module, LinkReport)>, Error> {
        let mut state = self.inner.state.lock();
        let objects = std::mem::take(&mut state.libraries[lib.0].objects);
        if objects.is_empty() {
            return Ok(None);
        }
        // The archives stay the library's; they are lent to the link, not copied.
        let archives = std::mem::take(&mut state.libraries[lib.0].archives);
        let options = LinkOptions {
            memory: &self.inner.memory,
            low_memory: Some(&self.inner.low_memory as &dyn MemoryManager),
        };
        let mut ctx = SessionContext::new(&mut state, lib, &self.inner.executor);
        let result = link(&objects, &archives, &mut ctx, &options);
        state.libraries[lib.0].archives = archives;
        let linked = match result {
            Ok(linked) => linked,
            Err(e) => {
                // Nothing was linked: the objects stay pending so the caller can add what
                // is missing and try again.
                state.libraries[lib.0].objects = objects;
                return Err(e.into());
            }
        };
        let report = LinkReport {
            times: linked.times,
            counts: linked.counts,
        };
        let executor = &self.inner.executor;
        let tls_module = linked.tls.as_ref().map(|t| t.module_id);
        if let Some(template) = linked.tls {
            executor.install_tls(template)?;
        }
        let eh = match linked.eh_frame {
            Some(address) => executor.register_eh_frame(address)?,
            None => None,
        };
        let exports = if self.inner.export_to_libraries && !linked.symbols.is_empty() {
            let code = linked
                .allocation
                .segments()
                .first()
                .map(|c| c.target..c.target + c.len);
            let list = linked
                .symbols
                .iter()
                .map(
                    |(name, &address)| kiln_executor::shared_object::ExportedSymbol {
                        name: name.clone(),
                        address,
                        size: 0,
                        function: code.as_ref().is_some_and(|c| c.contains(&address)),
                    },
                )
                .collect();
            Some(executor.export_symbols(list)?)
        } else {
            None
        };
        let module = Module {
            inner: Arc::new(ModuleInner {
                name: objects.first().map(|o| o.name.clone()).unwrap_or_default(),
                symbols: linked.symbols,
                hidden_symbols: linked.hidden_symbols,
                fini: if self.inner.noexec {
                    Vec::new()
                } else {
                    linked.fini
                },
                dso_handle: linked.dso_handle,
                tls_module,
                eh: Mutex::new(eh),
                exports: Mutex::new(exports),
                finalized: Mutex::new(self.inner.noexec),
                executor: executor.clone(),
                allocation: linked.allocation,
            }),
        };
        let keep_alive: Arc<dyn std::any::Any + Send + Sync> = module.inner.clone();
        executor.register_module(linked.dso_handle, Arc::downgrade(&keep_alive));
        drop(keep_alive);
        state.libraries[lib.0].modules.push(module.clone());
        drop(state);
        if !self.inner.noexec {
            self.inner.executor.run_initializers(&linked.init)?;
        }
        Ok(Some((module, report)))
    }

    /// The address of `name` as `lib` sees it: its modules and definitions; else, after
    /// linking what is pending, those again, the libraries in its search order, and its
    /// generators.
    pub fn lookup(&self, lib: LibraryId, name: &str) -> Result<u64, Error> {
        // What is linked already answers without linking what is pending (which may not
        // link yet).
        if let Some(address) = self.inner.state.lock().defined(lib, name) {
            return Ok(address);
        }
        self.link_pending(lib)?;
        let mut state = self.inner.state.lock();
        let mut ctx = SessionContext::new(&mut state, lib, &self.inner.executor);
        if let Some(address) = ctx.resolve(name) {
            return Ok(address);
        }
        // Last, the library's own modules' hidden definitions (a hidden `main` is still
        // the program's entry).
        state.libraries[lib.0]
            .modules
            .iter()
            .rev()
            .find_map(|m| m.inner.hidden_symbols.get(name).copied())
            .ok_or_else(|| Error::SymbolNotFound(name.to_string()))
    }

    /// Links what is pending and calls `main(argc, argv, envp)` with `args` (argv[0]
    /// first); returns its status. The C library's buffered output is flushed after.
    pub fn run_main(&self, lib: LibraryId, args: &[String]) -> Result<i32, Error> {
        let main = self.lookup(lib, "main")?;
        // SAFETY: `main` comes from a linked module that the library keeps alive.
        unsafe { self.inner.executor.run_main(main, args) }
    }

    /// Removes `module` from its library, as `dlclose` would: its finalizers run now and
    /// its memory is freed when the last handle to it is dropped.
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
    pub fn remove_module(&self, module: &Module) {
        let mut state = self.inner.state.lock();
        for library in &mut state.libraries {
            library
                .modules
                .retain(|m| !Arc::ptr_eq(&m.inner, &module.inner));
        }
        drop(state);
        module.inner.finalize();
    }

    /// Runs the finalizers of every module (newest first) and forgets them, as a program's
    /// exit would.
    pub fn shutdown(&self) {
        let modules: Vec<Module> = {
            let mut state = self.inner.state.lock();
            state
                .libraries
                .iter_mut()
                .flat_map(|l| std::mem::take(&mut l.modules))
                .collect()
        };
        for m in modules.iter().rev() {
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
        let state = self.inner.state.lock();
        let mut code = Vec::new();
        let mut functions = Vec::new();
        for module in state.libraries.iter().flat_map(|l| &l.modules) {
            let Some(text) = module.inner.allocation.segments().first() else {
                continue;
            };
            let range = text.target..text.target + text.len;
            code.push((range.start, range.end));
            for (name, &address) in module
                .inner
                .symbols
                .iter()
                .chain(&module.inner.hidden_symbols)
            {
                if range.contains(&address) {
                    functions.push((address, name.clone()));
                }
            }
        }
        kiln_executor::crash_report::install(code, functions);
    }

    /// Memory figures of the default memory manager.
    pub fn memory_stats(&self) -> MemoryStats {
        self.inner.memory.stats()
    }

    /// Names of the libraries.
    pub fn library_name(&self, lib: LibraryId) -> String {
        self.inner.state.lock().libraries[lib.0].name.clone()
    }
}

struct SessionContext<'s> {
    state: &'s mut State,
    lib: LibraryId,
    executor: &'s Executor,
    /// Whether the names generators resolved are functions, as far as they know.
    kinds: FxHashMap<String, bool>,
}

impl<'s> SessionContext<'s> {
    fn new(state: &'s mut State, lib: LibraryId, executor: &'s Executor) -> Self {
        SessionContext {
            state,
            lib,
            executor,
            kinds: FxHashMap::default(),
        }
    }
}

impl State {
    /// `name` as library `lib` itself defines it: its definitions, then its modules'
    /// exported symbols, newest first.
    fn defined(&self, lib: LibraryId, name: &str) -> Option<u64> {
        let library = &self.libraries[lib.0];
        if let Some(&a) = library.definitions.get(name) {
            return Some(a);
        }
        library
            .modules
            .iter()
            .rev()
            .find_map(|m| m.inner.symbols.get(name).copied())
    }
}

impl LinkContext for SessionContext<'_> {
    fn resolve(&mut self, name: &str) -> Option<u64> {
        self.resolve_many(&[name]).pop().flatten()
    }

    fn resolve_many(&mut self, names: &[&str]) -> Vec<Option<u64>> {
        let mut out: Vec<Option<u64>> = vec![None; names.len()];
        let mut order = vec![self.lib];
        order.extend(
            self.state.libraries[self.lib.0]
                .search_order
                .iter()
                .copied(),
        );
        let mut pending: Vec<usize> = Vec::new();
        for (i, name) in names.iter().enumerate() {
            // What Kiln's runtime provides in place of the C runtime's.
            if let Some(address) = self.executor.runtime_symbol(name) {
                out[i] = Some(address);
                continue;
            }
            match order.iter().find_map(|&lib| self.state.defined(lib, name)) {
                Some(a) => out[i] = Some(a),
                None => pending.push(i),
            }
        }
        // Generators, in order, each asked once for everything still missing.
        for &lib in &order {
            for generator in &mut self.state.libraries[lib.0].generators {
                if pending.is_empty() {
                    return out;
                }
                let ask: Vec<&str> = pending.iter().map(|&i| names[i]).collect();
                let got = generator.generate_many(&ask);
                let mut still = Vec::new();
                for (&i, found) in pending.iter().zip(got) {
                    match found {
                        Some((a, kind)) => {
                            out[i] = Some(a);
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
        self.executor
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
        self.executor
            .place_static_tls(module_id, image, size, align)
            .map_err(|e| e.to_string())
    }

    fn is_function(&mut self, name: &str, _address: u64) -> Option<bool> {
        self.kinds.get(name).copied()
    }
}

struct ModuleInner {
    name: String,
    symbols: FxHashMap<String, u64>,
    hidden_symbols: FxHashMap<String, u64>,
    fini: Vec<u64>,
    dso_handle: u64,
    tls_module: Option<u64>,
    eh: Mutex<Option<EhRegistration>>,
    exports: Mutex<Option<ExportHandle>>,
    finalized: Mutex<bool>,
    executor: Executor,
    allocation: FinalizedAllocation,
}

impl ModuleInner {
    /// Runs finalizers once (the calling thread's thread-local destructors, `atexit`
    /// handlers, `.fini_array`), withdraws exported definitions and unregisters unwind
    /// information; the memory stays until the last handle goes.
    fn finalize(&self) {
        let mut done = self.finalized.lock();
        if let Some(exports) = self.exports.lock().take() {
            self.executor.unexport_symbols(exports);
        }
        if *done {
            return;
        }
        *done = true;
        if let Err(error) = self.executor.run_finalizers(self.dso_handle, &self.fini) {
            tracing::warn!(%error, module = %self.name, "running finalizers failed");
        }
        self.executor.unregister_module(self.dso_handle);
        if let Some(registration) = self.eh.lock().take() {
            self.executor.deregister_eh_frame(registration);
        }
        if let Some(id) = self.tls_module {
            self.executor.remove_tls(id);
        }
    }
}

impl Drop for ModuleInner {
    fn drop(&mut self) {
        self.finalize();
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
        self.inner
            .symbols
            .get(name)
            .or_else(|| self.inner.hidden_symbols.get(name))
            .copied()
    }

    /// The module's memory segments.
    pub fn allocation(&self) -> &FinalizedAllocation {
        &self.inner.allocation
    }

    /// A name for messages (its first object's).
    pub fn name(&self) -> &str {
        &self.inner.name
    }
}
