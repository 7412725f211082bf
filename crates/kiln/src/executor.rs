//! Where linked code runs: this process, or a `kiln-executor` process reached over a
//! socket. The session talks to both the same way.

use crate::Error;
use kiln_executor::runtime::{self, EhFrameRegistration};
use kiln_executor::shared_object::ExportedSymbol;
use kiln_executor::thread_locals::{self, TlsImage};
use kiln_link::TlsTemplate;
use kiln_memory::Mapper;
use kiln_remote::protocol::{kind_from_wire, DebugModule, DebugOutputs, Request, Response};
use kiln_remote::{CopyMapper, RemoteExecutor, SharedMemoryMapper, Timeouts};
use std::ffi::c_void;
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

#[derive(Clone)]
enum Kind {
    InProcess,
    Remote {
        remote: Arc<RemoteExecutor>,
        transport: Transport,
    },
}

/// Where linked code runs and host symbols are looked up.
#[derive(Clone)]
pub struct Executor {
    kind: Kind,
}

impl std::fmt::Debug for Executor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.kind {
            Kind::InProcess => f.write_str("Executor(in-process)"),
            Kind::Remote { remote, transport } => {
                write!(f, "Executor(pid {}, {transport:?})", remote.pid())
            }
        }
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

/// Definitions exported to libraries the executor loads later; withdrawn by
/// [`Executor::unexport_symbols`].
pub(crate) enum ExportHandle {
    Local(runtime::Exports),
    Remote(u64),
}

/// An eh_frame registration, here or in the executor.
pub(crate) enum EhRegistration {
    /// Held for its drop, which deregisters.
    Local(#[allow(dead_code)] EhFrameRegistration),
    /// The address registered in the executor process.
    Remote(u64),
}

impl Executor {
    /// This process.
    pub fn in_process() -> Self {
        Executor {
            kind: Kind::InProcess,
        }
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
    /// let sandbox = kiln::Sandbox { write: vec!["/tmp/out".into()], ..Default::default() };
    /// let executor = kiln::Executor::spawn_with(
    ///     &kiln::default_executor_path(),
    ///     kiln::Transport::SharedMemory,
    ///     Some(&sandbox),
    ///     kiln::Timeouts::default(),
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
        Ok(Executor {
            kind: Kind::Remote {
                remote: Arc::new(remote),
                transport,
            },
        })
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
        Ok(Executor {
            kind: Kind::Remote {
                remote: Arc::new(remote),
                transport,
            },
        })
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
        Ok(Executor {
            kind: Kind::Remote {
                remote: Arc::new(remote),
                transport: Transport::Copy,
            },
        })
    }

    /// Gives a remote executor this process's environment and working directory (see
    /// [`RemoteExecutor::adopt_environment`]); nothing to do in process.
    pub fn adopt_environment(&self) -> Result<(), Error> {
        match &self.kind {
            Kind::InProcess => Ok(()),
            Kind::Remote { remote, .. } => Ok(remote.adopt_environment()?),
        }
    }

    /// The executor process's id (`None` in-process).
    pub fn pid(&self) -> Option<u32> {
        match &self.kind {
            Kind::InProcess => None,
            Kind::Remote { remote, .. } => Some(remote.pid()),
        }
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
        match &self.kind {
            Kind::InProcess => Ok(kiln_link::Architecture::host()),
            Kind::Remote { remote, .. } => {
                let triple = &remote.hello().triple;
                kiln_link::Architecture::from_triple(triple).ok_or_else(|| {
                    Error::Executor(format!(
                        "the executor runs {triple} code, which Kiln does not link for (x86_64 and aarch64 only)"
                    ))
                })
            }
        }
    }

    /// The connection, for a remote executor.
    pub fn remote(&self) -> Option<&Arc<RemoteExecutor>> {
        match &self.kind {
            Kind::InProcess => None,
            Kind::Remote { remote, .. } => Some(remote),
        }
    }

    /// The mapper that places code in this executor (`None`: Kiln's default, in-process).
    /// `debuggable`: the executor maps code privately for a debugger's breakpoints, so
    /// allocations get code pages of their own.
    pub(crate) fn mapper(&self, debuggable: bool) -> Result<Option<Arc<dyn Mapper>>, Error> {
        Ok(match &self.kind {
            Kind::InProcess => None,
            Kind::Remote {
                remote,
                transport: Transport::SharedMemory,
            } => Some(Arc::new(
                SharedMemoryMapper::new(remote.clone())?.with_shared_pages(!debuggable),
            )),
            Kind::Remote {
                remote,
                transport: Transport::Copy,
            } => Some(Arc::new(
                CopyMapper::new(remote.clone()).with_shared_pages(!debuggable),
            )),
        })
    }

    fn request(&self, request: Request) -> Result<Response, Error> {
        match &self.kind {
            Kind::InProcess => Ok(Response::Ok),
            Kind::Remote { remote, .. } => Ok(remote.request(&request)?),
        }
    }

    fn value(&self, request: Request) -> Result<u64, Error> {
        match self.request(request)? {
            Response::Value(v) => Ok(v),
            other => Err(Error::Executor(format!("unexpected answer {other:?}"))),
        }
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
        match &self.kind {
            Kind::InProcess => {
                let handle = library as *mut c_void;
                Ok(names
                    .iter()
                    // The kind is left unknown: in process it is asked for only when a
                    // link needs it (`dladdr` per symbol is most of a lookup's cost).
                    .map(|n| runtime::dlsym(handle, n).map(|a| (a, kiln_link::SymbolKind::Other)))
                    .collect())
            }
            Kind::Remote { remote, .. } => match remote.request(&Request::LookupMany {
                library,
                names: names.iter().map(|n| n.to_string()).collect(),
            })? {
                Response::Symbols(list) if list.len() == names.len() => Ok(list
                    .into_iter()
                    .map(|(a, k)| (a != 0).then_some((a, symbol_kind(kind_from_wire(k)))))
                    .collect()),
                other => Err(Error::Executor(format!("unexpected answer {other:?}"))),
            },
        }
    }

    /// Opens a shared library in the executor; returns a handle for lookups.
    pub fn load_library(&self, path: &str) -> Result<u64, Error> {
        match &self.kind {
            Kind::InProcess => {
                runtime::dlopen(path)
                    .map(|h| h as u64)
                    .map_err(|reason| Error::SharedLibrary {
                        name: path.to_string(),
                        reason,
                    })
            }
            Kind::Remote { .. } => self.value(Request::LoadLibrary {
                path: path.to_string(),
            }),
        }
    }

    pub(crate) fn register_eh_frame(&self, address: u64) -> Result<Option<EhRegistration>, Error> {
        match &self.kind {
            Kind::InProcess => {
                Ok(EhFrameRegistration::register(address).map(EhRegistration::Local))
            }
            Kind::Remote { .. } => {
                self.request(Request::RegisterEhFrame { address })?;
                Ok(Some(EhRegistration::Remote(address)))
            }
        }
    }

    pub(crate) fn deregister_eh_frame(&self, registration: EhRegistration) {
        if let EhRegistration::Remote(address) = registration {
            let _ = self.request(Request::DeregisterEhFrame { address });
        }
    }

    /// The page size where the code runs.
    pub(crate) fn page_size(&self) -> u64 {
        match &self.kind {
            // SAFETY: sysconf has no preconditions.
            Kind::InProcess => (unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).max(4096) as u64,
            Kind::Remote { remote, .. } => remote.hello().page_size.max(4096),
        }
    }

    /// Maps whole pages of a module's code guarded (AArch64 `PROT_BTI`); nothing to do on
    /// other architectures.
    pub(crate) fn guard_branch_targets(&self, address: u64, len: u64) -> Result<(), Error> {
        match &self.kind {
            Kind::InProcess => {
                // SAFETY: the session passes whole pages of the code of a module it just
                // linked and finalized read-execute.
                unsafe { runtime::guard_branch_targets(address, len) }.map_err(Error::Executor)
            }
            Kind::Remote { remote, .. } => {
                remote.request(&Request::GuardBranchTargets { address, len })?;
                Ok(())
            }
        }
    }

    pub(crate) fn run_initializers(&self, functions: &[u64]) -> Result<(), Error> {
        match &self.kind {
            // SAFETY: the session passes initializers of a module it just linked and keeps.
            Kind::InProcess => unsafe { runtime::run_initializers(functions) },
            Kind::Remote { .. } => {
                if !functions.is_empty() {
                    self.request(Request::RunInitializers {
                        functions: functions.to_vec(),
                    })?;
                }
            }
        }
        Ok(())
    }

    pub(crate) fn run_finalizers(&self, dso_handle: u64, functions: &[u64]) -> Result<(), Error> {
        match &self.kind {
            // SAFETY: the session passes finalizers of a module whose memory is still live.
            Kind::InProcess => unsafe { runtime::run_finalizers(dso_handle, functions) },
            Kind::Remote { .. } => {
                self.request(Request::RunFinalizers {
                    dso_handle,
                    functions: functions.to_vec(),
                })?;
            }
        }
        Ok(())
    }

    pub(crate) fn reserve_tls_module(&self) -> Result<u64, Error> {
        match &self.kind {
            Kind::InProcess => Ok(thread_locals::tls_reserve_module()),
            Kind::Remote { .. } => self.value(Request::ReserveTlsModule),
        }
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
        match &self.kind {
            Kind::InProcess => thread_locals::tls_place_static(&TlsImage {
                module_id,
                image: image.to_vec(),
                size,
                align,
            })
            .map_err(Error::Executor),
            Kind::Remote { .. } => self
                .value(Request::PlaceStaticTls {
                    module_id,
                    size,
                    align,
                    image: image.to_vec(),
                })
                .map(|v| v as i64),
        }
    }

    pub(crate) fn install_tls(&self, template: TlsTemplate) -> Result<(), Error> {
        if template.tp_offset.is_some() {
            // In static TLS: placed during the link.
            return Ok(());
        }
        match &self.kind {
            Kind::InProcess => {
                let image = TlsImage {
                    module_id: template.module_id,
                    image: template.image,
                    size: template.size,
                    align: template.align,
                };
                if !thread_locals::tls_install(image) {
                    return Err(Error::Executor("TLS module id not reserved".into()));
                }
            }
            Kind::Remote { .. } => {
                self.request(Request::InstallTls {
                    module_id: template.module_id,
                    size: template.size,
                    align: template.align,
                    image: template.image,
                })?;
            }
        }
        Ok(())
    }

    pub(crate) fn remove_tls(&self, module_id: u64) {
        match &self.kind {
            Kind::InProcess => thread_locals::tls_remove(module_id),
            Kind::Remote { .. } => {
                let _ = self.request(Request::RemoveTls { module_id });
            }
        }
    }

    /// The address of a name Kiln's runtime provides in place of the C runtime's
    /// (`__tls_get_addr`, `__cxa_thread_atexit`, …), if `name` is one.
    pub(crate) fn runtime_symbol(&self, name: &str) -> Option<u64> {
        match &self.kind {
            Kind::InProcess => thread_locals::runtime_symbol(name),
            Kind::Remote { remote, .. } => remote.hello().runtime_symbol(name),
        }
    }

    /// Tells an in-process runtime about a module, so that its thread-local destructors
    /// keep it alive (`keep_alive`); a remote executor needs nothing.
    pub(crate) fn register_module(
        &self,
        dso_handle: u64,
        keep_alive: std::sync::Weak<dyn std::any::Any + Send + Sync>,
    ) {
        if let Kind::InProcess = self.kind {
            thread_locals::register_module(dso_handle, Some(keep_alive));
        }
    }

    pub(crate) fn unregister_module(&self, dso_handle: u64) {
        if let Kind::InProcess = self.kind {
            thread_locals::unregister_module(dso_handle);
        }
    }

    /// Makes `symbols` visible to libraries the executor loads from now on.
    pub(crate) fn export_symbols(
        &self,
        symbols: Vec<ExportedSymbol>,
    ) -> Result<ExportHandle, Error> {
        match &self.kind {
            Kind::InProcess => runtime::export_symbols(&symbols)
                .map(ExportHandle::Local)
                .map_err(Error::Executor),
            Kind::Remote { .. } => self
                .value(Request::ExportSymbols {
                    symbols: symbols
                        .into_iter()
                        .map(|s| (s.name, s.address, s.size, s.function))
                        .collect(),
                })
                .map(ExportHandle::Remote),
        }
    }

    pub(crate) fn unexport_symbols(&self, handle: ExportHandle) {
        match handle {
            ExportHandle::Local(exports) => runtime::unexport_symbols(exports),
            ExportHandle::Remote(handle) => {
                let _ = self.request(Request::UnexportSymbols { handle });
            }
        }
    }

    /// Turns on the executor's debugger and profiler outputs.
    pub(crate) fn enable_debug_outputs(&self, outputs: &DebugOutputs) -> Result<(), Error> {
        match &self.kind {
            Kind::InProcess => {
                kiln_executor::debug_outputs::enable(outputs).map_err(Error::Executor)
            }
            Kind::Remote { .. } => self
                .request(Request::EnableDebugOutputs(outputs.clone()))
                .map(|_| ()),
        }
    }

    /// Tells the executor's debuggers and profilers of a module; answers a handle for
    /// [`Executor::unregister_debug`].
    pub(crate) fn register_debug(&self, module: DebugModule) -> Result<u64, Error> {
        match &self.kind {
            Kind::InProcess => {
                // SAFETY: the functions are those of a module just linked and published by
                // this session, whose memory lives until after its free is announced.
                unsafe { kiln_executor::debug_outputs::register(module) }.map_err(Error::Executor)
            }
            Kind::Remote { .. } => self.value(Request::RegisterDebug(module)),
        }
    }

    pub(crate) fn unregister_debug(&self, handle: u64) {
        match &self.kind {
            Kind::InProcess => kiln_executor::debug_outputs::unregister(handle),
            Kind::Remote { .. } => {
                let _ = self.request(Request::UnregisterDebug { handle });
            }
        }
    }

    /// Calls `main(argc, argv, envp)` at `address` (an address in the executor).
    ///
    /// # Safety
    /// For the in-process executor, `address` must be a finalized `int main(int, char**,
    /// char**)` of a live module (a remote executor checks the address lies in memory it
    /// reserved; a crash there is reported as an error).
    pub unsafe fn run_main(&self, address: u64, args: &[String]) -> Result<i32, Error> {
        match &self.kind {
            Kind::InProcess => {
                // SAFETY: the caller's contract.
                let status = unsafe { runtime::call_main(address, args) };
                runtime::flush_stdio();
                Ok(status)
            }
            Kind::Remote { .. } => self
                .value(Request::RunMain {
                    address,
                    args: args.to_vec(),
                })
                .map(|v| v as u32 as i32),
        }
    }

    /// Calls `u64 f(u64, …)` at `address` with up to six integer arguments.
    ///
    /// # Safety
    /// As for [`Executor::run_main`], for a function of that signature.
    pub unsafe fn call(&self, address: u64, args: &[u64]) -> Result<u64, Error> {
        if args.len() > 6 {
            return Err(Error::Executor("at most six arguments".into()));
        }
        match &self.kind {
            Kind::InProcess => {
                let mut a = [0u64; 6];
                a[..args.len()].copy_from_slice(args);
                // SAFETY: the caller's contract; extra integer arguments are ignored by a
                // callee with fewer parameters (SysV ABI).
                let f: extern "C" fn(u64, u64, u64, u64, u64, u64) -> u64 =
                    unsafe { std::mem::transmute(address as usize) };
                Ok(f(a[0], a[1], a[2], a[3], a[4], a[5]))
            }
            Kind::Remote { .. } => self.value(Request::Call {
                address,
                args: args.to_vec(),
            }),
        }
    }

    /// Flushes the executor's C stdio buffers (in-process; a remote executor flushes after
    /// each run itself).
    pub(crate) fn flush(&self) {
        if let Kind::InProcess = self.kind {
            runtime::flush_stdio();
        }
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
