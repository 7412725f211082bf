//! What an executor does for a session: the one interface the session calls, whatever
//! runs the code.

use crate::generator::Found;
use crate::Error;
use kiln_link::TlsTemplate;
use kiln_memory::Mapper;
use kiln_remote::protocol::{DebugModule, DebugOutputs};
use kiln_runtime::shared_object::ExportedSymbol;
use std::any::Any;
use std::sync::Arc;

/// What answers an executor's requests of the session ([`ExecutorService::serve_requests`]).
pub use kiln_remote::ExecutorRequestHandler;

/// A scope of deferred requests ([`ExecutorService::batch`]): what it deferred is sent
/// when it ends.
pub struct BatchScope<'a> {
    _scope: Option<kiln_remote::Batching<'a>>,
    /// Called when the scope ends (a scope begun later than made: see
    /// [`BatchScope::ending_with`]).
    end: Option<Box<dyn FnOnce() + 'a>>,
}

impl<'a> BatchScope<'a> {
    /// A scope that defers nothing (an executor that answers at once).
    pub fn none() -> Self {
        BatchScope {
            _scope: None,
            end: None,
        }
    }

    /// The scope of a connection's [`kiln_remote::RemoteExecutor::batch`].
    pub fn new(scope: kiln_remote::Batching<'a>) -> Self {
        BatchScope {
            _scope: Some(scope),
            end: None,
        }
    }

    /// A scope whose batching is the executor's business (begun when it can be, say, an
    /// executor still starting): `end` is called when the scope ends.
    pub fn ending_with(end: impl FnOnce() + 'a) -> Self {
        BatchScope {
            _scope: None,
            end: Some(Box::new(end)),
        }
    }
}

impl Drop for BatchScope<'_> {
    fn drop(&mut self) {
        if let Some(end) = self.end.take() {
            end();
        }
    }
}

/// Definitions exported to libraries the executor loads later, as the executor that
/// exported them keeps them; given back to [`ExecutorService::unexport_symbols`].
pub struct ExportHandle(pub(crate) Box<dyn Any + Send + Sync>);

/// A registration of a module's `.eh_frame` with an executor's unwinder; given back to
/// [`ExecutorService::deregister_eh_frame`].
pub struct EhRegistration(pub(crate) Box<dyn Any + Send + Sync>);

impl ExportHandle {
    /// Wraps what an executor keeps for an export.
    pub fn new(kept: impl Any + Send + Sync) -> Self {
        ExportHandle(Box::new(kept))
    }

    /// What the executor kept, if it is a `T`.
    pub fn into_inner<T: Any>(self) -> Option<T> {
        self.0.downcast().ok().map(|b| *b)
    }
}

impl EhRegistration {
    /// Wraps what an executor keeps for a registration.
    pub fn new(kept: impl Any + Send + Sync) -> Self {
        EhRegistration(Box::new(kept))
    }

    /// What the executor kept, if it is a `T`.
    pub fn into_inner<T: Any>(self) -> Option<T> {
        self.0.downcast().ok().map(|b| *b)
    }
}

/// When a body that [`ExecutorService::store_code_pointer`] replaced may be freed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Retirement {
    /// Once no [`CodeGuard`](crate::lazy::CodeGuard) of the session taken before the store is held: the
    /// session's own threads run the code (in process).
    SessionGuards,
    /// Once the executor's oldest guard ([`ExecutorService::oldest_code_guard`]) is later
    /// than this epoch: the executor guards the threads that run code for it (each
    /// request's run of code holds a guard of its own there).
    ExecutorEpoch(u64),
}

/// Where linked code runs and host symbols are looked up: this process
/// ([`crate::Executor::in_process`]), a `kiln-executor` process ([`crate::Executor::spawn`],
/// [`crate::Executor::connect`]), or anything else that implements it
/// ([`crate::Executor::from_service`]). The session calls only these methods; each
/// implementation answers for its process. Addresses are the executor's.
pub trait ExecutorService: Send + Sync {
    /// Names the executor in messages (`in-process`, `pid 1234, SharedMemory`).
    fn describe(&self) -> String;

    /// The executor process's id (`None` in process).
    fn pid(&self) -> Option<u32> {
        None
    }

    /// Whether the code runs in this process (the default). An executor process answers
    /// no: this process then keeps no instruction cache, image cache or symbol kinds of
    /// its own for the code.
    fn runs_in_this_process(&self) -> bool {
        true
    }

    /// The operating system the code runs on (the default: this process's, Linux).
    fn target_os(&self) -> crate::executor::TargetOs {
        crate::executor::TargetOs::Linux
    }

    /// Where call-through stubs go in this executor: the lazy entry (a stub's slot leads
    /// there until its function has a body) and the fallback of a call that cannot be
    /// resolved (0: none). `None`: the executor has no entry for stubs.
    fn stub_entries(&self) -> Option<(u64, u64)> {
        None
    }

    /// Who answers the requests this executor makes of the session (a stub's first call
    /// in an executor process), from now on. Nothing to do where the session's own
    /// threads resolve stubs (in process, the default).
    fn serve_requests(&self, handler: ExecutorRequestHandler) {
        let _ = handler;
    }

    /// Names this executor among the session's stub batches: `Some` for an executor
    /// whose stubs ask the session through [`ExecutorService::serve_requests`] (the
    /// identity of its connection), `None` in process.
    fn identity(&self) -> Option<usize> {
        None
    }

    /// Starts deferring the calling thread's requests that need only an `Ok` (see
    /// [`kiln_remote::Batching`]); they go as one round trip with the next request that
    /// needs an answer, or when the scope ends. Nothing is deferred in process.
    fn batch(&self) -> BatchScope<'_> {
        BatchScope::none()
    }

    /// Sends what the calling thread's [`ExecutorService::batch`] scope deferred so far
    /// (the scope stays open); the first failure among it.
    fn flush_batch(&self) -> Result<(), Error> {
        Ok(())
    }

    /// Sends this process's standard input to the program the executor runs, where the
    /// executor does not read it itself (one reached over TCP).
    fn forward_stdin(&self) {}

    /// The round trips made to the executor so far, per kind of request (none in
    /// process).
    fn round_trips(&self) -> Vec<kiln_remote::RoundTrips> {
        Vec::new()
    }

    /// Ends an executor process: asks it to exit (after its program's last output) and
    /// waits for it. Nothing to do in process.
    fn shutdown(&self) {}

    /// Waits for an executor still starting to say hello (its process then runs, its
    /// libraries mapped); an error if it never does. Nothing to wait for in process.
    fn wait_started(&self) -> Result<(), Error> {
        Ok(())
    }

    /// The executor process's id as this machine names it, so that its `/proc/PID`
    /// files describe it (an image's key reads its mapped files): a child this process
    /// started, or the peer of a Unix socket; `None` in process, over TCP, or while the
    /// executor is still starting.
    fn local_pid(&self) -> Option<u32> {
        None
    }

    /// As [`ExecutorService::shutdown`], for a process about to exit: an executor process
    /// is not waited for once it has answered.
    fn shutdown_for_exit(&self) {
        self.shutdown();
    }

    /// Kills an executor process (`SIGKILL`), even while a request waits for it. Nothing
    /// to do in process.
    fn kill(&self) {}

    /// Gives the executor this process's environment and working directory, where it
    /// has its own.
    fn adopt_environment(&self) -> Result<(), Error> {
        Ok(())
    }

    /// The instruction set of the code the executor runs.
    fn architecture(&self) -> Result<kiln_link::Architecture, Error>;

    /// The page size where the code runs.
    fn page_size(&self) -> u64;

    /// The mapper that places code in the executor (`None`: Kiln's default, in process).
    /// `debuggable`: code pages of their own per allocation, for a debugger's breakpoints.
    fn mapper(&self, debuggable: bool) -> Result<Option<Arc<dyn Mapper>>, Error>;

    /// Looks names up in the whole process (`library` 0) or a library from
    /// [`ExecutorService::load_library`], in the order given.
    fn lookup_many(&self, library: u64, names: &[&str]) -> Result<Vec<Option<Found>>, Error>;

    /// Opens a shared library in the executor; a handle for lookups. An executor still
    /// starting may load it later, before its first other request: a failure then is
    /// [`ExecutorService::library_failure`]'s to tell.
    fn load_library(&self, path: &str) -> Result<u64, Error>;

    /// Why the library of handle `library`, whose load this service put off, could not be
    /// loaded, once it was tried. `None` for a service that loads at once.
    fn library_failure(&self, library: u64) -> Option<String> {
        let _ = library;
        None
    }

    /// Registers a module's terminated `.eh_frame` data at `address` with the unwinder
    /// (`None`: the executor has no unwinder to tell).
    fn register_eh_frame(&self, address: u64) -> Result<Option<EhRegistration>, Error>;

    /// Withdraws a registration (of `.eh_frame`, or of Windows unwind data).
    fn deregister_eh_frame(&self, registration: EhRegistration);

    /// Registers a module's Windows unwind data (a Windows executor's: made from its
    /// `.eh_frame` by [`kiln_link::windows_unwind`]) with the system's unwinder; withdrawn
    /// with [`ExecutorService::deregister_eh_frame`]. Executors of other systems have none
    /// to register: `Error::Unsupported`.
    fn register_unwind_info(
        &self,
        functions: &[kiln_link::windows_unwind::WindowsUnwind],
    ) -> Result<Option<EhRegistration>, Error> {
        let _ = functions;
        Err(Error::Unsupported(
            "Windows unwind data, for an executor that is not a Windows one".into(),
        ))
    }

    /// Registers a module's Windows unwind table as its COFF objects carry it (their
    /// `.pdata`, linked in the module: [`kiln_link::windows_unwind::FunctionTable`]) with
    /// the system's unwinder, in place; withdrawn with
    /// [`ExecutorService::deregister_eh_frame`]. Executors of other systems have none to
    /// register: `Error::Unsupported`.
    fn register_function_table(
        &self,
        table: &kiln_link::windows_unwind::FunctionTable,
    ) -> Result<Option<EhRegistration>, Error> {
        let _ = table;
        Err(Error::Unsupported(
            "a COFF unwind table (.pdata), for an executor that is not a Windows one".into(),
        ))
    }

    /// Maps whole pages of BTI-built code guarded, where the architecture has the guard.
    fn guard_branch_targets(&self, address: u64, len: u64) -> Result<(), Error>;

    /// Runs a module's initializers, `f(argc, argv, envp)` each.
    fn run_initializers(&self, functions: &[u64]) -> Result<(), Error>;

    /// Runs a module's finalizers: its thread-local destructors and `atexit` handlers
    /// (by `dso_handle`), then `functions`.
    fn run_finalizers(&self, dso_handle: u64, functions: &[u64]) -> Result<(), Error>;

    /// A new thread-local storage module id.
    fn reserve_tls_module(&self) -> Result<u64, Error>;

    /// Places a module's TLS block in static TLS; its offset from the thread pointer.
    fn place_static_tls(
        &self,
        module_id: u64,
        image: &[u8],
        size: u64,
        align: u64,
    ) -> Result<i64, Error>;

    /// Installs a module's dynamic TLS template.
    fn install_tls(&self, template: TlsTemplate) -> Result<(), Error>;

    /// Removes a module's TLS.
    fn remove_tls(&self, module_id: u64);

    /// The address of a name the executor's runtime provides in place of the C
    /// runtime's (`__tls_get_addr`, `__cxa_thread_atexit`, …), if `name` is one.
    fn runtime_symbol(&self, name: &str) -> Option<u64>;

    /// Tells the runtime about a module whose thread-local destructors keep it alive
    /// (`keep_alive`); an executor in another process needs nothing.
    fn register_module(
        &self,
        _dso_handle: u64,
        _keep_alive: std::sync::Weak<dyn Any + Send + Sync>,
    ) {
    }

    /// Forgets what [`ExecutorService::register_module`] told.
    fn unregister_module(&self, _dso_handle: u64) {}

    /// Makes `symbols` visible to libraries the executor loads from now on.
    fn export_symbols(&self, symbols: Vec<ExportedSymbol>) -> Result<ExportHandle, Error>;

    /// Makes `module`'s exported definitions (functions where they lie in `code`) visible
    /// when JIT code first calls the loader, read from the module then; `None` where the
    /// executor cannot wait (the caller exports a list at once).
    fn export_module_on_demand(
        &self,
        _module: std::sync::Weak<dyn kiln_runtime::module_symbols::ModuleSymbols>,
        _code: std::ops::Range<u64>,
    ) -> Option<Result<ExportHandle, Error>> {
        None
    }

    /// Whether [`ExecutorService::defer_exports`] waits for the loader's first use (an
    /// executor in another process that serves it); the session then hands it the list
    /// during the link instead of reading the module later.
    fn defers_exports(&self) -> bool {
        false
    }

    /// Makes `symbols` visible when JIT code first calls the loader through a shim (or a
    /// library new to the executor is loaded for the program). Only called where
    /// [`ExecutorService::defers_exports`]; otherwise exports at once.
    fn defer_exports(&self, symbols: Vec<ExportedSymbol>) -> Result<ExportHandle, Error> {
        self.export_symbols(symbols)
    }

    /// The shim JIT code calls in place of loader function `name` (`dlopen`, `dlsym`, …)
    /// so that exports made on demand are published first; `None` where there is none.
    fn loader_shim(&self, _name: &str) -> Option<u64> {
        None
    }

    /// Withdraws an export.
    fn unexport_symbols(&self, handle: ExportHandle);

    /// Turns on the executor's debugger and profiler outputs.
    fn enable_debug_outputs(&self, outputs: &DebugOutputs) -> Result<(), Error>;

    /// Tells the executor's debuggers and profilers of a module; a handle for
    /// [`ExecutorService::unregister_debug`].
    fn register_debug(&self, module: DebugModule) -> Result<u64, Error>;

    /// Withdraws a module from debuggers and profilers.
    fn unregister_debug(&self, handle: u64);

    /// Calls `main(argc, argv, envp)` at `address`.
    ///
    /// # Safety
    /// In process, `address` must be a finalized `int main(int, char**, char**)` of a
    /// live module (an executor process checks it lies in memory it reserved and reports
    /// a crash as an error).
    unsafe fn run_main(&self, address: u64, args: &[Vec<u8>]) -> Result<i32, Error>;

    /// Calls `u64 f(u64, …)` at `address` with up to six integer arguments.
    ///
    /// # Safety
    /// As for [`ExecutorService::run_main`], for a function of that signature.
    unsafe fn call(&self, address: u64, args: &[u64]) -> Result<u64, Error>;

    /// Stores `target` in a call-through stub's slot with one atomic store: calls that
    /// load the slot afterwards reach `target` (hot swap).
    ///
    /// # Safety
    /// `slot` must be a stub slot of a live stub module of this executor (8-byte aligned,
    /// touched only by atomic stores and the stub's loads), `target` a finalized function
    /// there (an executor process checks both lie in memory it reserved).
    unsafe fn store_code_pointer(&self, slot: u64, target: u64) -> Result<Retirement, Error>;

    /// For an executor whose stores answer [`Retirement::ExecutorEpoch`]: the epoch of the
    /// oldest guard its threads hold (or its epoch now, when none is). Others need not
    /// implement it.
    fn oldest_code_guard(&self) -> Result<u64, Error> {
        Err(Error::Unsupported(format!(
            "{} keeps no code guards of its own",
            self.describe()
        )))
    }

    /// Flushes the C stdio buffers of the code's process, where that is this one.
    fn flush(&self) {}
}
