//! The executor that is a `kiln-executor` process (or executor-c): each call a request
//! over the connection.

use super::connection::{Connection, StartingMapper};
use super::service::{EhRegistration, ExecutorService, ExportHandle, Retirement};
use super::{symbol_kind, Transport};
use crate::generator::Found;
use crate::Error;
use kiln_link::TlsTemplate;
use kiln_memory::Mapper;
use kiln_remote::protocol::Hello;
use kiln_remote::protocol::{kind_from_wire, DebugModule, DebugOutputs, Request, Response};
use kiln_remote::{CopyMapper, RemoteExecutor, SharedMemoryMapper};
use kiln_runtime::shared_object::ExportedSymbol;
use std::sync::Arc;

/// An executor process and how code bytes reach it.
pub(crate) struct Remote {
    /// The connection (its hello perhaps still to come).
    pub(crate) connection: Arc<Connection>,
    pub(crate) transport: Transport,
    /// The next handle this side chooses for [`Request::DeferExports`].
    pub(crate) next_export: std::sync::atomic::AtomicU64,
}

/// An export in the executor: its handle there.
struct RemoteExport(u64);

/// An `.eh_frame` registered in the executor: its address there.
struct RemoteEhFrame(u64);

/// A Windows executor's registration of a module's unwind data: its handle.
struct RemoteUnwindInfo(u64);

impl Remote {
    /// The connection, once the executor said hello.
    fn remote(&self) -> Result<&Arc<RemoteExecutor>, Error> {
        self.connection.get()
    }

    /// `f` on the connection if the executor said hello already; else a child still
    /// starting is killed and reaped (nothing was asked of it).
    fn ready_or_abandon(&self, f: impl FnOnce(&RemoteExecutor)) {
        match self.connection.get_if_ready() {
            Some(remote) => f(remote),
            None => self.connection.abandon(),
        }
    }

    /// The executor's hello (waiting for it); `None` if it never came.
    fn hello(&self) -> Option<&Hello> {
        self.remote().ok().map(|r| r.hello())
    }

    fn request(&self, request: Request) -> Result<Response, Error> {
        Ok(self.remote()?.request(&request)?)
    }

    fn value(&self, request: Request) -> Result<u64, Error> {
        match self.request(request)? {
            Response::Value(v) => Ok(v),
            other => Err(Error::Executor(format!("unexpected answer {other:?}"))),
        }
    }
}

impl ExecutorService for Remote {
    fn describe(&self) -> String {
        format!("pid {}, {:?}", self.connection.pid(), self.transport)
    }

    fn pid(&self) -> Option<u32> {
        Some(self.connection.pid())
    }

    fn runs_in_this_process(&self) -> bool {
        false
    }

    fn wait_started(&self) -> Result<(), Error> {
        self.connection.get().map(|_| ())
    }

    fn local_pid(&self) -> Option<u32> {
        self.connection.get_if_ready()?.local_pid()
    }

    fn target_os(&self) -> crate::executor::TargetOs {
        match self.connection.expected() {
            Some(expected) => expected.target_os,
            None => self.hello().map_or(crate::executor::TargetOs::Linux, |h| {
                crate::executor::TargetOs::from_triple(&h.triple)
            }),
        }
    }

    fn stub_entries(&self) -> Option<(u64, u64)> {
        let hello = self.hello()?;
        Some((
            hello.runtime_symbol("__kiln_lazy_entry")?,
            hello.runtime_symbol("__kiln_lazy_call_failed").unwrap_or(0),
        ))
    }

    fn serve_requests(&self, handler: super::service::ExecutorRequestHandler) {
        if let Ok(remote) = self.remote() {
            remote.set_request_handler(handler);
        }
    }

    fn identity(&self) -> Option<usize> {
        self.remote().ok().map(|r| Arc::as_ptr(r) as usize)
    }

    fn batch(&self) -> super::service::BatchScope<'_> {
        if self.connection.get_if_ready().is_none() {
            // Begun when the link first needs the executor: no wait for it here.
            return self.connection.batch_when_ready();
        }
        match self.remote() {
            Ok(remote) => super::service::BatchScope::new(remote.batch()),
            Err(_) => super::service::BatchScope::none(),
        }
    }

    fn flush_batch(&self) -> Result<(), Error> {
        Ok(self.remote()?.flush()?)
    }

    fn forward_stdin(&self) {
        if let Ok(remote) = self.remote() {
            remote.forward_stdin();
        }
    }

    fn round_trips(&self) -> Vec<kiln_remote::RoundTrips> {
        self.connection
            .get_if_ready()
            .map(|r| r.round_trips())
            .unwrap_or_default()
    }

    fn shutdown(&self) {
        self.ready_or_abandon(RemoteExecutor::shutdown);
    }

    fn shutdown_for_exit(&self) {
        self.ready_or_abandon(RemoteExecutor::shutdown_for_exit);
    }

    fn kill(&self) {
        self.ready_or_abandon(RemoteExecutor::kill);
    }

    fn adopt_environment(&self) -> Result<(), Error> {
        Ok(self.remote()?.adopt_environment()?)
    }

    fn architecture(&self) -> Result<kiln_link::Architecture, Error> {
        if let Some(expected) = self.connection.expected() {
            return Ok(expected.architecture);
        }
        let triple = &self.remote()?.hello().triple;
        kiln_link::Architecture::from_triple(triple).ok_or_else(|| {
            Error::Executor(format!(
                "the executor runs {triple} code, which Kiln does not link for (x86_64, aarch64 and riscv64 only)"
            ))
        })
    }

    fn page_size(&self) -> u64 {
        match self.connection.expected() {
            Some(expected) => expected.page_size,
            None => self.hello().map_or(4096, |h| h.page_size.max(4096)),
        }
    }

    fn mapper(&self, debuggable: bool) -> Result<Option<Arc<dyn Mapper>>, Error> {
        let Some(remote) = self.connection.get_if_ready() else {
            // Still starting: the mapper is made at its first reservation.
            return Ok(Some(Arc::new(StartingMapper::new(
                self.connection.clone(),
                self.transport,
                debuggable,
                self.page_size(),
            ))));
        };
        let remote = remote.clone();
        Ok(Some(match self.transport {
            Transport::SharedMemory => {
                Arc::new(SharedMemoryMapper::new(remote)?.with_shared_pages(!debuggable))
            }
            Transport::Copy => Arc::new(CopyMapper::new(remote).with_shared_pages(!debuggable)),
        }))
    }

    fn lookup_many(&self, library: u64, names: &[&str]) -> Result<Vec<Option<Found>>, Error> {
        let library = self.connection.executor_library(library)?;
        match self.request(Request::LookupMany {
            library,
            names: names.iter().map(|n| n.to_string()).collect(),
        })? {
            Response::Symbols(list) if list.len() == names.len() => Ok(list
                .into_iter()
                .map(|(a, k)| (a != 0).then_some((a, symbol_kind(kind_from_wire(k)))))
                .collect()),
            other => Err(Error::Executor(format!("unexpected answer {other:?}"))),
        }
    }

    fn load_library(&self, path: &str) -> Result<u64, Error> {
        self.connection.load_library(path)
    }

    fn library_failure(&self, library: u64) -> Option<String> {
        self.connection.library_failure(library)
    }

    fn register_eh_frame(&self, address: u64) -> Result<Option<EhRegistration>, Error> {
        self.request(Request::RegisterEhFrame { address })?;
        Ok(Some(EhRegistration::new(RemoteEhFrame(address))))
    }

    fn deregister_eh_frame(&self, registration: EhRegistration) {
        match registration.0.downcast::<RemoteEhFrame>() {
            Ok(frame) => {
                let _ = self.request(Request::DeregisterEhFrame { address: frame.0 });
            }
            Err(other) => {
                if let Ok(table) = other.downcast::<RemoteUnwindInfo>() {
                    let _ = self.request(Request::DeregisterUnwindInfo { handle: table.0 });
                }
            }
        }
    }

    fn register_unwind_info(
        &self,
        functions: &[kiln_link::windows_unwind::WindowsUnwind],
    ) -> Result<Option<EhRegistration>, Error> {
        if functions.is_empty() {
            return Ok(None);
        }
        let functions = functions
            .iter()
            .map(|f| (f.begin, f.end, f.info.clone()))
            .collect();
        let handle = self.value(Request::RegisterUnwindInfo { functions })?;
        Ok(Some(EhRegistration::new(RemoteUnwindInfo(handle))))
    }

    fn register_function_table(
        &self,
        table: &kiln_link::windows_unwind::FunctionTable,
    ) -> Result<Option<EhRegistration>, Error> {
        let entries = table.entries.iter().map(|e| (e[0], e[1], e[2])).collect();
        let handle = self.value(Request::RegisterFunctionTable {
            image_base: table.image_base,
            entries,
        })?;
        Ok(Some(EhRegistration::new(RemoteUnwindInfo(handle))))
    }

    fn guard_branch_targets(&self, address: u64, len: u64) -> Result<(), Error> {
        self.request(Request::GuardBranchTargets { address, len })?;
        Ok(())
    }

    fn run_initializers(&self, functions: &[u64]) -> Result<(), Error> {
        if !functions.is_empty() {
            self.request(Request::RunInitializers {
                functions: functions.to_vec(),
            })?;
        }
        Ok(())
    }

    fn run_finalizers(&self, dso_handle: u64, functions: &[u64]) -> Result<(), Error> {
        self.request(Request::RunFinalizers {
            dso_handle,
            functions: functions.to_vec(),
        })?;
        Ok(())
    }

    fn reserve_tls_module(&self) -> Result<u64, Error> {
        self.value(Request::ReserveTlsModule)
    }

    fn place_static_tls(
        &self,
        module_id: u64,
        image: &[u8],
        size: u64,
        align: u64,
    ) -> Result<i64, Error> {
        self.value(Request::PlaceStaticTls {
            module_id,
            size,
            align,
            image: image.to_vec(),
        })
        .map(|v| v as i64)
    }

    fn install_tls(&self, template: TlsTemplate) -> Result<(), Error> {
        self.request(Request::InstallTls {
            module_id: template.module_id,
            size: template.size,
            align: template.align,
            image: template.image,
        })?;
        Ok(())
    }

    fn remove_tls(&self, module_id: u64) {
        let _ = self.request(Request::RemoveTls { module_id });
    }

    fn runtime_symbol(&self, name: &str) -> Option<u64> {
        self.hello()?.runtime_symbol(name)
    }

    fn export_symbols(&self, symbols: Vec<ExportedSymbol>) -> Result<ExportHandle, Error> {
        self.value(Request::ExportSymbols {
            symbols: symbols
                .into_iter()
                .map(|s| (s.name.to_string(), s.address, s.size, s.function))
                .collect(),
        })
        .map(|handle| ExportHandle::new(RemoteExport(handle)))
    }

    fn defers_exports(&self) -> bool {
        self.hello()
            .is_some_and(|h| h.features & kiln_remote::protocol::FEATURE_DEFERRED_EXPORTS != 0)
    }

    fn defer_exports(&self, symbols: Vec<ExportedSymbol>) -> Result<ExportHandle, Error> {
        if !self.defers_exports() {
            return self.export_symbols(symbols);
        }
        let handle = kiln_remote::protocol::CONTROLLER_HANDLE
            | self
                .next_export
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        // Deferred in a link's batch: no round trip of its own.
        self.request(Request::DeferExports {
            handle,
            symbols: symbols
                .into_iter()
                .map(|s| (s.name.to_string(), s.address, s.size, s.function))
                .collect(),
        })?;
        Ok(ExportHandle::new(RemoteExport(handle)))
    }

    fn loader_shim(&self, name: &str) -> Option<u64> {
        // Asked for every name a link does not find elsewhere: no string made for the
        // names that are no loader function.
        if !matches!(name, "dlopen" | "dlmopen" | "dlsym" | "dlvsym") || !self.defers_exports() {
            return None;
        }
        self.hello()?.runtime_symbol(&format!(
            "{}{name}",
            kiln_remote::protocol::LOADER_SHIM_PREFIX
        ))
    }

    fn unexport_symbols(&self, handle: ExportHandle) {
        if let Some(RemoteExport(handle)) = handle.into_inner() {
            let _ = self.request(Request::UnexportSymbols { handle });
        }
    }

    fn enable_debug_outputs(&self, outputs: &DebugOutputs) -> Result<(), Error> {
        self.request(Request::EnableDebugOutputs(outputs.clone()))
            .map(|_| ())
    }

    fn register_debug(&self, module: DebugModule) -> Result<u64, Error> {
        self.value(Request::RegisterDebug(module))
    }

    fn unregister_debug(&self, handle: u64) {
        let _ = self.request(Request::UnregisterDebug { handle });
    }

    unsafe fn run_main(&self, address: u64, args: &[Vec<u8>]) -> Result<i32, Error> {
        self.value(Request::RunMain {
            address,
            args: args.to_vec(),
        })
        .map(|v| v as u32 as i32)
    }

    unsafe fn store_code_pointer(&self, slot: u64, target: u64) -> Result<Retirement, Error> {
        self.value(Request::StoreCodePointer { slot, target })
            .map(Retirement::ExecutorEpoch)
    }

    fn oldest_code_guard(&self) -> Result<u64, Error> {
        self.value(Request::OldestCodeGuard)
    }

    unsafe fn call(&self, address: u64, args: &[u64]) -> Result<u64, Error> {
        self.value(Request::Call {
            address,
            args: args.to_vec(),
        })
    }
}
