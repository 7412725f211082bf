//! The session: a [`Jit`] with libraries (namespaces of definitions with a search order),
//! symbol generators, module handles and plugins. This file holds the session's handle and
//! builder and what is not one library's or one module's. Its state is
//! [`crate::state`], which imports no room; the rooms around it each add methods to
//! [`Jit`] and work on that state:
//! - [`crate::libraries`]: libraries made, ordered, defined into and looked up in, over
//!   the data of [`crate::library`];
//! - [`crate::inputs`]: what a library is given (objects, archives, lazy objects,
//!   sources, generators, the host's libraries);
//! - [`crate::linking`]: the links users ask for, each a [`crate::link_request`] run by
//!   [`crate::link_job`] (gather → link → check → install → publish → start) under
//!   [`crate::link_lock`];
//! - [`crate::resolve`]: how a link's names resolve (the search order, generators, and
//!   the nested link of another library's lazy objects);
//! - [`crate::module`] (handles, dependency records) and [`crate::removal`];
//! - [`crate::lazy`], on top: call-through stubs and hot swap.
//!
//! No room imports another in a circle (`farm-studio look --place crates/kiln`).

use crate::debug::DebugSupport;
use crate::executor::Executor;
use crate::library::LibraryId;
use crate::plugin::{Plugin, PluginFailure, PluginRegistration, Plugins};
use crate::state::{Extensions, Inner, LowMemory, NEXT_SESSION};
use crate::Error;
use kiln_memory::{MemoryManager, MemoryStats};
use parking_lot::RwLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// A JIT session: load objects and archives into libraries, link, look symbols up, run.
///
/// ```no_run
/// let jit = kiln::Jit::new()?;
/// let lib = jit.main_library();
/// jit.library(lib).add(kiln::Input::object_file("hello.o"))?;
/// jit.library(lib).add(kiln::Input::ProcessSymbols)?;
/// // SAFETY: hello.o's main is a C `int main(int, char **, char **)`.
/// let status = unsafe { jit.run_main(lib, &["hello".to_string()]) }?;
/// # Ok::<(), kiln::Error>(())
/// ```
///
/// # Lazily
///
/// Objects can be added lazily ([`Input::lazy_object`](crate::Input::lazy_object): linked when first needed), and
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
/// two modules, or a module and [`Library::define_symbol`](crate::Library::define_symbol) — is an error
/// ([`Error::Redefinition`]), except that a module's weak definition or common symbol
/// (an `inline` function's copy, LLVM's `linkonce_odr` and `common` globals, `int x;` built
/// with `-fcommon`) gives way to the library's definition, as it would to a strong one in
/// an ELF link: the module's code binds to that definition, and uses its module. Replacing
/// a definition in place is not supported.
///
/// # Modules and removal
///
/// A module records the modules its code refers to. [`Jit::remove_module`] refuses to
/// remove a module that a live module refers to ([`Error::ModuleInUse`], naming them), and
/// a module keeps the modules it refers to mapped for as long as it lives: no call can
/// reach freed memory.
#[derive(Clone)]
pub struct Jit {
    pub(crate) inner: Arc<Inner>,
}

/// Builder for a [`Jit`].
#[derive(Default)]
pub struct JitBuilder {
    executor: Option<Executor>,
    export_to_libraries: bool,
    exports_on_demand: bool,
    noexec: bool,
    memory: Option<Arc<dyn MemoryManager>>,
    low_memory: Option<Option<Arc<dyn MemoryManager>>>,
    debug_support: DebugSupport,
    compiler: Option<Arc<dyn kiln_cache::Compiler>>,
    object_cache: Option<Arc<dyn kiln_cache::ObjectCache>>,
    image_cache: Option<Arc<dyn kiln_cache::ImageCache>>,
}

impl JitBuilder {
    /// The linked-image cache [`Jit::link_pending_cached`] maps modules from and stores
    /// them in (default: none). Used for code that runs in this process; a remote
    /// executor's links do not use it. Objects added to such a session are parsed by the
    /// link that needs them, not when added (a module mapped from its image reads none):
    /// a malformed object is reported by that link.
    pub fn image_cache(mut self, cache: Arc<dyn kiln_cache::ImageCache>) -> Self {
        self.image_cache = Some(cache);
        self
    }

    /// The compiler of [`Library::compile`](crate::Library::compile) (default: the system's `cc` and `c++`).
    pub fn compiler(mut self, compiler: Arc<dyn kiln_cache::Compiler>) -> Self {
        self.compiler = Some(compiler);
        self
    }

    /// The object cache [`Library::compile`](crate::Library::compile) consults before compiling and fills after
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

    /// With [`JitBuilder::export_to_libraries`], in this process: a module's exports are
    /// published when JIT code first calls `dlopen`, `dlmopen`, `dlsym` or `dlvsym` (the
    /// session binds those names to shims that publish what is pending, then call the C
    /// library), or when a shared library new to the process is added to the session —
    /// not at every link. A program of 20,000 functions that never loads a library starts
    /// 1.5 ms sooner. Default: off, because host code that looks for a JIT definition with
    /// `dlsym` itself would not find it before then (`kiln run`, whose own code never
    /// does, turns it on). `kiln-executor` in another process waits the same way (the
    /// list goes to it in the link's batch); executor-c exports at once. A shared library
    /// new to the process publishes them first when it imports one of their names or a
    /// loader function, or needs a library not yet loaded.
    pub fn exports_on_demand(mut self, on: bool) -> Self {
        self.exports_on_demand = on;
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

    /// Builds the session. Its default memory manager reserves its first slab at the
    /// first allocation (a session whose one module is mapped from the image cache
    /// reserves none): a slab that cannot be had is that allocation's error, tried again
    /// at the next, not this call's.
    pub fn build(self) -> Result<Jit, Error> {
        let executor = self.executor.unwrap_or_else(Executor::in_process);
        let architecture = executor.architecture()?;
        let target_os = executor.target_os();
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
        let memory: Arc<dyn MemoryManager> = match (self.memory, &mapper) {
            (Some(m), _) => m,
            // Reserved at the first allocation: after the inputs loaded (an executor
            // may still be starting), and never for a module mapped from the image cache.
            (None, mapper) => Arc::new(crate::state::MemoryAtFirstUse {
                mapper: mapper.clone(),
                trap: architecture.trap_pattern(),
                built: std::sync::OnceLock::new(),
                building: parking_lot::Mutex::new(()),
            }),
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
                extensions: Extensions::default(),
                session: NEXT_SESSION.fetch_add(1, Ordering::Relaxed),
                executor,
                architecture,
                target_os,
                export_to_libraries: self.export_to_libraries,
                exports_on_demand: self.exports_on_demand,
                noexec: self.noexec,
                memory,
                low_memory,
                libraries: RwLock::new(Vec::new()),
                plugins,
                _debug_support: debug_support,
                gdb: self.debug_support.gdb,
                next_module: AtomicU64::new(1),
                compiler: self
                    .compiler
                    .unwrap_or_else(|| Arc::new(kiln_cache::SystemCompiler::new())),
                object_cache: self.object_cache,
                image_cache: self.image_cache,
                files_read: Default::default(),
            }),
        };
        jit.create_library("main");
        Ok(jit)
    }
}

impl Jit {
    pub(crate) fn from_inner(inner: Arc<Inner>) -> Self {
        Jit { inner }
    }

    pub(crate) fn inner(&self) -> &Arc<Inner> {
        &self.inner
    }

    /// A session with default memory managers.
    pub fn new() -> Result<Self, Error> {
        JitBuilder::default().build()
    }

    /// The instruction set the session links for: its executor's.
    pub fn architecture(&self) -> kiln_link::Architecture {
        self.inner.architecture
    }

    /// The operating system the session's code runs on (its executor's).
    pub fn target_os(&self) -> crate::executor::TargetOs {
        self.inner.target_os
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
    /// use kiln::plugin::{LoadedModule, Plugin, PluginError};
    /// use std::sync::Arc;
    /// struct Count(std::sync::atomic::AtomicUsize);
    /// impl Plugin for Count {
    ///     fn name(&self) -> &str { "count" }
    ///     fn module_loaded(&self, _: &LoadedModule) -> Result<(), PluginError> {
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

    /// Links what is pending and calls `main(argc, argv, envp)` with `args` (`argv[0]`
    /// first); returns its status. The C library's buffered output is flushed after.
    ///
    /// # Safety
    /// `main` of `lib` must be a C `int main(int, char **, char **)` (or compatible): Kiln
    /// calls whatever address the name resolves to, including one given to
    /// [`Library::define_symbol`](crate::Library::define_symbol).
    pub unsafe fn run_main<A: AsRef<std::ffi::OsStr>>(
        &self,
        lib: LibraryId,
        args: &[A],
    ) -> Result<i32, Error> {
        let main = self.lookup(lib, "main")?;
        // SAFETY: the caller's contract.
        unsafe { self.inner.executor.run_main(main, args) }
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
        let mut tables = Vec::new();
        for library in self.inner.libraries.read().iter() {
            let state = library.state.read();
            // Each module's code and its own definitions (the module itself, weakly: no copy,
            // and a module removed later is still freed).
            for module in state.modules.values() {
                let Some(text) = module.inner.allocation.segments().first() else {
                    continue;
                };
                tables.push(kiln_runtime::crash_report::CodeTable {
                    start: text.target,
                    end: text.target + text.len,
                    symbols: std::sync::Arc::downgrade(&module.inner) as std::sync::Weak<_>,
                });
            }
        }
        kiln_runtime::crash_report::install(tables);
    }

    /// The JIT function `address` falls in: its name and the offset into it (the nearest
    /// definition at or below `address` in the code of a module of this session). For
    /// reports of crashes in an executor process, which has no symbol table of its own.
    pub fn function_at(&self, address: u64) -> Option<(String, u64)> {
        let mut best: Option<(u64, String)> = None;
        for library in self.inner.libraries.read().iter() {
            // The modules' own tables (every definition of each, exported or hidden): no
            // hashing, and no write lock taken under the libraries' lock.
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
            for s in state.modules.values().flat_map(|m| m.inner.symbols.iter()) {
                if s.address <= address && best.as_ref().is_none_or(|(a, _)| s.address > *a) {
                    best = Some((s.address, s.name.to_string()));
                }
            }
        }
        best.map(|(start, name)| (name, address - start))
    }

    /// Memory figures of the session's memory manager (all zero before its first
    /// allocation: see [`JitBuilder::build`]).
    pub fn memory_stats(&self) -> MemoryStats {
        self.inner.memory.stats()
    }
}
