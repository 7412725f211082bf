//! Where linked code runs: this process, or a `kiln-executor` process reached over a
//! socket. The session talks to every executor through one interface,
//! [`ExecutorService`]: the in-process executor calls Kiln's runtime directly, a remote one sends
//! each call as a request to the executor process, which serves it with the same runtime.

mod connection;
mod in_process;
mod remote;
mod service;

pub use service::{
    BatchScope, EhRegistration, ExecutorRequestHandler, ExecutorService, ExportHandle, Retirement,
};
// What starting, reaching and securing an executor takes, and what it reports; and the
// types an `ExecutorService` of the caller's making is handed.
pub use crate::generator::Found;
pub use kiln_link::{SymbolKind, TlsTemplate};
pub use kiln_memory::Mapper;
pub use kiln_remote::protocol::{DebugModule, DebugOutputs};
pub use kiln_remote::secure::Key;
pub use kiln_remote::{RemoteError, RoundTrips, Sandbox, Timeouts};
pub use kiln_runtime::shared_object::ExportedSymbol;

use crate::Error;
use kiln_remote::RemoteExecutor;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// How code bytes reach an executor process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    /// The executor's memory is shared (a memfd passed over the Unix socket): the linker
    /// writes code straight into it.
    SharedMemory,
    /// Code bytes are copied over the connection (works over TCP).
    Copy,
}

/// Where linked code runs and host symbols are looked up: a handle on an
/// [`ExecutorService`], cheap to clone.
#[derive(Clone)]
pub struct Executor {
    service: Arc<dyn ExecutorService>,
}

impl std::fmt::Debug for Executor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Executor({})", self.service.describe())
    }
}

/// Where to find the `kiln-executor` binary: `$KILN_EXECUTOR` if set; else the one next
/// to the running executable (`kiln`'s own, or a test's); else the one beside it one level
/// up (a test or example binary in `target/*/deps` or `target/*/examples`); else the first
/// `kiln-executor` on `PATH`; else the bare name. A project that depends on Kiln by path
/// does not build the executor by itself: build it with `cargo build -p kiln-executor`
/// (or install it: `cargo install --path crates/kiln-executor`), or set
/// `KILN_EXECUTOR`. [`Executor::spawn`] names the path it tried when it is not there.
pub fn default_executor_path() -> PathBuf {
    if let Some(path) = std::env::var_os("KILN_EXECUTOR") {
        return PathBuf::from(path);
    }
    let beside = std::env::current_exe().ok().and_then(|exe| {
        let dir = exe.parent()?;
        [
            dir.join("kiln-executor"),
            dir.parent()?.join("kiln-executor"),
        ]
        .into_iter()
        .find(|p| p.is_file())
    });
    let on_path = || {
        std::env::var_os("PATH").and_then(|paths| {
            std::env::split_paths(&paths)
                .map(|d| d.join("kiln-executor"))
                .find(|p| p.is_file())
        })
    };
    beside
        .or_else(on_path)
        .unwrap_or_else(|| PathBuf::from("kiln-executor"))
}

/// The operating system an executor runs its code on, from its hello's triple: what a
/// link for it takes from the system (Linux: the C library's archives and ld scripts,
/// `-lNAME` as `libNAME.so`; Windows: `-lNAME` as `NAME.dll`, the C runtime's DLLs).
///
/// ```
/// use kiln::executor::TargetOs;
/// assert_eq!(TargetOs::from_triple("x86_64-pc-windows-gnu"), TargetOs::Windows);
/// assert_eq!(TargetOs::from_triple("aarch64-unknown-linux-gnu"), TargetOs::Linux);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TargetOs {
    /// Linux with glibc (Kiln's own executor, executor-c).
    Linux,
    /// Windows (executor-c's Windows executor, under Wine or on Windows): ELF objects
    /// compiled for `x86_64-w64-windows-gnu-elf`, calling the C runtime's DLLs.
    Windows,
}

impl TargetOs {
    /// The system a target triple names: Windows for `…-windows-…` and `…-mingw32`,
    /// else Linux.
    pub fn from_triple(triple: &str) -> TargetOs {
        if triple.contains("-windows") || triple.contains("mingw") {
            TargetOs::Windows
        } else {
            TargetOs::Linux
        }
    }
}

impl Executor {
    /// This process.
    pub fn in_process() -> Self {
        Self::from_service(Arc::new(in_process::InProcess))
    }

    /// An executor of the caller's making: the session calls `service` for everything
    /// it asks of where code runs.
    pub fn from_service(service: Arc<dyn ExecutorService>) -> Self {
        Executor { service }
    }

    fn remote_with(remote: RemoteExecutor, transport: Transport) -> Self {
        Self::from_connection(Arc::new(remote), transport)
    }

    /// Starts `executor_binary` (`kiln-executor`) as a child connected by a socketpair.
    pub fn spawn(
        executor_binary: &Path,
        transport: Transport,
        timeouts: Timeouts,
    ) -> Result<Self, Error> {
        Self::spawn_with(executor_binary, transport, None, timeouts)
    }

    /// As [`Executor::spawn`], the executor in `sandbox` (if given) before it serves: the
    /// JIT code it runs cannot start programs, trace others, listen for connections or
    /// change the system, and reaches files only where the sandbox says.
    ///
    /// ```no_run
    /// # fn main() -> Result<(), kiln::Error> {
    /// let sandbox = kiln::executor::Sandbox { write: vec!["/tmp/out".into()], ..Default::default() };
    /// let executor = kiln::Executor::spawn_with(
    ///     &kiln::executor::default_executor_path(),
    ///     kiln::executor::Transport::SharedMemory,
    ///     Some(&sandbox),
    ///     kiln::executor::Timeouts::default(),
    /// )?;
    /// let jit = kiln::Jit::builder().executor(executor).build()?;
    /// # Ok(()) }
    /// ```
    pub fn spawn_with(
        executor_binary: &Path,
        transport: Transport,
        sandbox: Option<&kiln_remote::Sandbox>,
        timeouts: Timeouts,
    ) -> Result<Self, Error> {
        let remote = RemoteExecutor::spawn_with(executor_binary, sandbox, timeouts)?;
        Ok(Self::remote_with(remote, transport))
    }

    /// As [`Executor::spawn_with`], but returns at once, the process started on a thread
    /// of its own: the session is built, loads its inputs and starts linking while the
    /// executor starts, and the first step that needs the executor (the link's first
    /// lookup or reservation) waits for its hello. A shared library's load does not wait:
    /// it is sent right after the hello (see [`Executor::load_library`]). What the session needs before that — architecture, operating
    /// system, page size — is read from `executor_binary`'s ELF header and checked against
    /// the hello; a binary whose header says nothing certain (a script, another
    /// architecture run by an emulator) is waited for here, as by `spawn_with` (so is a
    /// binary that cannot be read: that error is this call's). A process that cannot be
    /// started, or an executor that then fails to say hello, is the error of the first
    /// request. `kiln run --oop` starts its executor so.
    ///
    /// ```no_run
    /// # fn main() -> Result<(), kiln::Error> {
    /// let executor = kiln::Executor::start(
    ///     &kiln::executor::default_executor_path(),
    ///     kiln::executor::Transport::SharedMemory,
    ///     None,
    ///     kiln::executor::Timeouts::default(),
    /// )?;
    /// let jit = kiln::Jit::builder().executor(executor).build()?;
    /// # Ok(()) }
    /// ```
    pub fn start(
        executor_binary: &Path,
        transport: Transport,
        sandbox: Option<&kiln_remote::Sandbox>,
        timeouts: Timeouts,
    ) -> Result<Self, Error> {
        let Some(expected) = connection::Expected::of_binary(executor_binary) else {
            return Self::spawn_with(executor_binary, transport, sandbox, timeouts);
        };
        let binary = executor_binary.to_path_buf();
        let sandbox = sandbox.cloned();
        let connection = connection::Connection::spawning(
            move || RemoteExecutor::start_child(&binary, sandbox.as_ref(), timeouts),
            expected,
        )?;
        Ok(Self::from_service(Arc::new(remote::Remote {
            connection: Arc::new(connection),
            transport,
            next_export: Default::default(),
        })))
    }

    /// Connects to a pre-started `kiln-executor --listen-unix PATH`: a process forked for
    /// this session, with `transport` (shared memory works: it is a Unix socket) and this
    /// process's standard input, output and error. Saves starting a process per session.
    pub fn connect_unix(
        path: &Path,
        transport: Transport,
        timeouts: Timeouts,
    ) -> Result<Self, Error> {
        let remote = RemoteExecutor::connect_unix(path, timeouts)?;
        Ok(Self::remote_with(remote, transport))
    }

    /// Connects to `kiln-executor --listen --no-auth` at `address` (plaintext, loopback
    /// only); code travels by copy. See [`Executor::connect_with_key`].
    pub fn connect(address: &str, timeouts: Timeouts) -> Result<Self, Error> {
        Self::connect_with_key(address, None, timeouts)
    }

    /// Connects to `kiln-executor --listen` at `address`, authenticating with `key` (the
    /// executor's key file's) and encrypting every message; code travels by copy.
    /// `None` connects in plaintext, which only an executor started with `--no-auth`
    /// accepts.
    pub fn connect_with_key(
        address: &str,
        key: Option<&kiln_remote::secure::Key>,
        timeouts: Timeouts,
    ) -> Result<Self, Error> {
        let remote = RemoteExecutor::connect_with_key(address, key, timeouts)?;
        Ok(Self::remote_with(remote, Transport::Copy))
    }

    /// The service behind this handle.
    pub fn service(&self) -> &Arc<dyn ExecutorService> {
        &self.service
    }

    /// Gives a remote executor this process's environment and working directory (see
    /// [`RemoteExecutor::adopt_environment`]); nothing to do in process.
    pub fn adopt_environment(&self) -> Result<(), Error> {
        self.service.adopt_environment()
    }

    /// The executor process's id (`None` in-process).
    pub fn pid(&self) -> Option<u32> {
        self.service.pid()
    }

    /// Whether the executor runs code of this process's architecture (its C library's
    /// archives are then usable for it).
    pub fn is_host_architecture(&self) -> bool {
        self.architecture().ok() == Some(kiln_link::Architecture::host())
    }

    /// The instruction set of the code this executor runs: this process's, or the one
    /// its handshake's target triple names. Links for it follow it (relocations, stubs,
    /// trap bytes); an error if Kiln does not link for that triple.
    pub fn architecture(&self) -> Result<kiln_link::Architecture, Error> {
        self.service.architecture()
    }

    /// The operating system the executor runs code on (this process's: Linux).
    pub fn target_os(&self) -> TargetOs {
        self.service.target_os()
    }

    /// Whether the code runs in this process (an executor process: no).
    pub fn runs_in_this_process(&self) -> bool {
        self.service.runs_in_this_process()
    }

    /// Sends this process's standard input to the program an executor reached over TCP
    /// runs (`kiln run --connect`); nothing to do for one that reads its own.
    pub fn forward_stdin(&self) {
        self.service.forward_stdin();
    }

    /// The round trips made to an executor process so far, per kind of request, in the
    /// order of each kind's first (`kiln run --show-times` prints them); none in process.
    pub fn round_trips(&self) -> Vec<kiln_remote::RoundTrips> {
        self.service.round_trips()
    }

    /// Ends an executor process: asks it to exit after its program's last output and
    /// waits for it (a session ending does this too). Nothing to do in process.
    pub fn shutdown(&self) {
        self.service.shutdown();
    }

    /// As [`Executor::shutdown`], for a process about to exit (`kiln run`): a child
    /// executor is not waited for once it has answered — it sent the program's last
    /// output and let go of its standard streams first — and the system reaps it after
    /// this process exits. Its teardown then goes on beside this process's own instead
    /// of before it. Nothing to do in process.
    pub fn shutdown_for_exit(&self) {
        self.service.shutdown_for_exit();
    }

    /// Kills an executor process (`SIGKILL`), even while a request waits for it (which
    /// then fails, naming the signal). Nothing to do in process.
    pub fn kill(&self) {
        self.service.kill();
    }

    /// Defers the calling thread's requests that need only an `Ok` until the scope ends
    /// or the next request that needs an answer ([`ExecutorService::batch`]).
    pub(crate) fn batch(&self) -> BatchScope<'_> {
        self.service.batch()
    }

    /// Sends what the calling thread's batch deferred so far.
    pub(crate) fn flush_batch(&self) -> Result<(), Error> {
        self.service.flush_batch()
    }

    /// Where this executor's call-through stubs go ([`ExecutorService::stub_entries`]).
    pub(crate) fn stub_entries(&self) -> Option<(u64, u64)> {
        self.service.stub_entries()
    }

    /// Who answers this executor's requests of the session from now on.
    pub(crate) fn serve_requests(&self, handler: ExecutorRequestHandler) {
        self.service.serve_requests(handler);
    }

    /// This executor among the session's stub batches (`None` in process).
    pub(crate) fn identity(&self) -> Option<usize> {
        self.service.identity()
    }

    /// An executor over a connection made with [`kiln_remote::RemoteExecutor`], which the
    /// caller may keep to speak the protocol itself (a test of the executor, a tool).
    pub fn from_connection(remote: Arc<RemoteExecutor>, transport: Transport) -> Self {
        Self::from_service(Arc::new(remote::Remote {
            connection: Arc::new(connection::Connection::ready(remote)),
            transport,
            next_export: Default::default(),
        }))
    }

    /// The mapper that places code in this executor (`None`: Kiln's default, in-process).
    /// `debuggable`: the executor maps code privately for a debugger's breakpoints, so
    /// allocations get code pages of their own.
    pub(crate) fn mapper(&self, debuggable: bool) -> Result<Option<Arc<dyn Mapper>>, Error> {
        self.service.mapper(debuggable)
    }

    /// Looks `name` up in the executor: the whole process (`library` 0) or a library
    /// loaded with [`Executor::load_library`]. Returns the address and whether it is a
    /// function, if known.
    pub fn lookup(
        &self,
        library: u64,
        name: &str,
    ) -> Result<Option<crate::generator::Found>, Error> {
        Ok(self.lookup_many(library, &[name])?.pop().flatten())
    }

    /// [`Executor::lookup`] for many names, in one request to a remote executor.
    pub fn lookup_many(
        &self,
        library: u64,
        names: &[&str],
    ) -> Result<Vec<Option<crate::generator::Found>>, Error> {
        self.service.lookup_many(library, names)
    }

    /// Opens a shared library in the executor; returns a handle for lookups. An executor
    /// still starting ([`Executor::start`]) loads it right after its hello, before any
    /// other request (the session goes on loading and linking meanwhile): a library that
    /// cannot be loaded is then no error here but of every link that searches it (as
    /// [`Input::shared_library`](crate::Input::shared_library) adds it), naming it and
    /// why; a lookup in it is that error.
    pub fn load_library(&self, path: &str) -> Result<u64, Error> {
        self.service.load_library(path)
    }

    /// Why the library of handle `library` could not be loaded, when its load was put off
    /// (see [`Executor::load_library`]).
    pub(crate) fn library_failure(&self, library: u64) -> Option<String> {
        self.service.library_failure(library)
    }

    pub(crate) fn register_eh_frame(&self, address: u64) -> Result<Option<EhRegistration>, Error> {
        self.service.register_eh_frame(address)
    }

    pub(crate) fn register_unwind_info(
        &self,
        functions: &[kiln_link::windows_unwind::WindowsUnwind],
    ) -> Result<Option<EhRegistration>, Error> {
        self.service.register_unwind_info(functions)
    }

    pub(crate) fn register_function_table(
        &self,
        table: &kiln_link::windows_unwind::FunctionTable,
    ) -> Result<Option<EhRegistration>, Error> {
        self.service.register_function_table(table)
    }

    pub(crate) fn deregister_eh_frame(&self, registration: EhRegistration) {
        self.service.deregister_eh_frame(registration)
    }

    /// The page size where the code runs.
    pub(crate) fn page_size(&self) -> u64 {
        self.service.page_size()
    }

    /// Maps whole pages of a module's code guarded (AArch64 `PROT_BTI`); nothing to do on
    /// other architectures.
    pub(crate) fn guard_branch_targets(&self, address: u64, len: u64) -> Result<(), Error> {
        self.service.guard_branch_targets(address, len)
    }

    pub(crate) fn run_initializers(&self, functions: &[u64]) -> Result<(), Error> {
        self.service.run_initializers(functions)
    }

    pub(crate) fn run_finalizers(&self, dso_handle: u64, functions: &[u64]) -> Result<(), Error> {
        self.service.run_finalizers(dso_handle, functions)
    }

    pub(crate) fn reserve_tls_module(&self) -> Result<u64, Error> {
        self.service.reserve_tls_module()
    }

    /// Places a module's TLS block in static TLS; returns its offset from the thread
    /// pointer.
    pub(crate) fn place_static_tls(
        &self,
        module_id: u64,
        image: &[u8],
        size: u64,
        align: u64,
    ) -> Result<i64, Error> {
        self.service.place_static_tls(module_id, image, size, align)
    }

    pub(crate) fn install_tls(&self, template: TlsTemplate) -> Result<(), Error> {
        if template.tp_offset.is_some() {
            // In static TLS: placed during the link.
            return Ok(());
        }
        self.service.install_tls(template)
    }

    pub(crate) fn remove_tls(&self, module_id: u64) {
        self.service.remove_tls(module_id)
    }

    /// The address of a name Kiln's runtime provides in place of the C runtime's
    /// (`__tls_get_addr`, `__cxa_thread_atexit`, …), if `name` is one.
    pub(crate) fn runtime_symbol(&self, name: &str) -> Option<u64> {
        self.service.runtime_symbol(name)
    }

    /// Tells an in-process runtime about a module, so that its thread-local destructors
    /// keep it alive (`keep_alive`); a remote executor needs nothing.
    pub(crate) fn register_module(
        &self,
        dso_handle: u64,
        keep_alive: std::sync::Weak<dyn std::any::Any + Send + Sync>,
    ) {
        self.service.register_module(dso_handle, keep_alive)
    }

    pub(crate) fn unregister_module(&self, dso_handle: u64) {
        self.service.unregister_module(dso_handle)
    }

    /// Makes `symbols` visible to libraries the executor loads from now on.
    pub(crate) fn export_symbols(
        &self,
        symbols: Vec<ExportedSymbol>,
    ) -> Result<ExportHandle, Error> {
        self.service.export_symbols(symbols)
    }

    /// `module`'s exports when JIT code first calls the loader; `None` where the executor
    /// cannot wait.
    pub(crate) fn export_module_on_demand(
        &self,
        module: std::sync::Weak<dyn kiln_runtime::module_symbols::ModuleSymbols>,
        code: std::ops::Range<u64>,
    ) -> Option<Result<ExportHandle, Error>> {
        self.service.export_module_on_demand(module, code)
    }

    /// Waits for an executor still starting to say hello.
    pub(crate) fn wait_started(&self) -> Result<(), Error> {
        self.service.wait_started()
    }

    /// The executor process's id as this machine names it (see
    /// [`ExecutorService::local_pid`]).
    pub(crate) fn local_pid(&self) -> Option<u32> {
        self.service.local_pid()
    }

    /// Whether the executor takes exports to publish at the loader's first use as a list.
    pub(crate) fn defers_exports(&self) -> bool {
        self.service.defers_exports()
    }

    /// `symbols` exported at the loader's first use (see [`Executor::defers_exports`]).
    pub(crate) fn defer_exports(
        &self,
        symbols: Vec<ExportedSymbol>,
    ) -> Result<ExportHandle, Error> {
        self.service.defer_exports(symbols)
    }

    /// The shim for loader function `name`, where the executor has one.
    pub(crate) fn loader_shim(&self, name: &str) -> Option<u64> {
        self.service.loader_shim(name)
    }

    pub(crate) fn unexport_symbols(&self, handle: ExportHandle) {
        self.service.unexport_symbols(handle)
    }

    /// Turns on the executor's debugger and profiler outputs.
    pub(crate) fn enable_debug_outputs(&self, outputs: &DebugOutputs) -> Result<(), Error> {
        self.service.enable_debug_outputs(outputs)
    }

    /// Tells the executor's debuggers and profilers of a module; answers a handle for
    /// [`Executor::unregister_debug`].
    pub(crate) fn register_debug(&self, module: DebugModule) -> Result<u64, Error> {
        self.service.register_debug(module)
    }

    pub(crate) fn unregister_debug(&self, handle: u64) {
        self.service.unregister_debug(handle)
    }

    /// Calls `main(argc, argv, envp)` at `address` (an address in the executor).
    ///
    /// # Safety
    /// For the in-process executor, `address` must be a finalized `int main(int, char**,
    /// char**)` of a live module (a remote executor checks the address lies in memory it
    /// reserved; a crash there is reported as an error).
    ///
    /// `args` are the operating system's strings (`String`, `OsString`, `&str`…), passed
    /// on as their bytes: an argument need not be UTF-8.
    pub unsafe fn run_main<A: AsRef<std::ffi::OsStr>>(
        &self,
        address: u64,
        args: &[A],
    ) -> Result<i32, Error> {
        use std::os::unix::ffi::OsStrExt;
        let args: Vec<Vec<u8>> = args
            .iter()
            .map(|a| a.as_ref().as_bytes().to_vec())
            .collect();
        if args.iter().any(|a| a.contains(&0)) {
            return Err(Error::Executor("an argument holds a NUL byte".into()));
        }
        // SAFETY: the caller's contract.
        unsafe { self.service.run_main(address, &args) }
    }

    /// Calls `u64 f(u64, …)` at `address` with up to six integer arguments.
    ///
    /// # Safety
    /// As for [`Executor::run_main`], for a function of that signature.
    pub unsafe fn call(&self, address: u64, args: &[u64]) -> Result<u64, Error> {
        if args.len() > 6 {
            return Err(Error::Executor("at most six arguments".into()));
        }
        // SAFETY: the caller's contract; at most six arguments (checked).
        unsafe { self.service.call(address, args) }
    }

    /// Stores `target` in a call-through stub's slot, in the executor, atomically.
    ///
    /// # Safety
    /// As [`ExecutorService::store_code_pointer`].
    pub(crate) unsafe fn store_code_pointer(
        &self,
        slot: u64,
        target: u64,
    ) -> Result<Retirement, Error> {
        // SAFETY: the caller's contract.
        unsafe { self.service.store_code_pointer(slot, target) }
    }

    /// The executor's oldest code guard ([`ExecutorService::oldest_code_guard`]).
    pub(crate) fn oldest_code_guard(&self) -> Result<u64, Error> {
        self.service.oldest_code_guard()
    }

    /// Flushes the executor's C stdio buffers (in-process; a remote executor flushes after
    /// each run itself).
    pub(crate) fn flush(&self) {
        self.service.flush()
    }
}

/// The symbols of the executor's process (or of one library loaded there).
pub struct ExecutorSymbols {
    pub(crate) executor: Executor,
    pub(crate) library: u64,
    pub(crate) name: String,
}

impl crate::SymbolGenerator for ExecutorSymbols {
    fn name(&self) -> String {
        self.name.clone()
    }
    fn unusable(&self) -> Option<String> {
        self.executor.library_failure(self.library)
    }
    fn generate(&mut self, symbol: &str) -> Option<u64> {
        self.generate_with_kind(symbol).map(|(a, _)| a)
    }
    fn generate_with_kind(&mut self, symbol: &str) -> Option<crate::generator::Found> {
        self.executor.lookup(self.library, symbol).ok().flatten()
    }
    fn generate_many(&mut self, symbols: &[&str]) -> Vec<Option<crate::generator::Found>> {
        self.executor
            .lookup_many(self.library, symbols)
            .unwrap_or_else(|_| vec![None; symbols.len()])
    }
}

/// A symbol's kind from what the executor knows (whether it is a function, if it knows).
pub(crate) fn symbol_kind(is_function: Option<bool>) -> kiln_link::SymbolKind {
    match is_function {
        Some(true) => kiln_link::SymbolKind::Function,
        Some(false) => kiln_link::SymbolKind::Data,
        None => kiln_link::SymbolKind::Other,
    }
}
