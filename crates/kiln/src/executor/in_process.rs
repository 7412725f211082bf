//! The executor that is this process: Kiln's runtime (`kiln-runtime`, the one
//! the `kiln-executor` binary serves requests with) called directly.

use super::service::{EhRegistration, ExecutorService, ExportHandle, Retirement};
use crate::generator::Found;
use crate::Error;
use kiln_link::TlsTemplate;
use kiln_memory::Mapper;
use kiln_remote::protocol::{DebugModule, DebugOutputs};
use kiln_runtime::runtime::{self, EhFrameRegistration};
use kiln_runtime::shared_object::ExportedSymbol;
use kiln_runtime::thread_locals::{self, TlsImage};
use std::ffi::c_void;
use std::sync::Arc;

/// This process.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct InProcess;

impl ExecutorService for InProcess {
    fn describe(&self) -> String {
        "in-process".into()
    }

    fn architecture(&self) -> Result<kiln_link::Architecture, Error> {
        Ok(kiln_link::Architecture::host())
    }

    fn stub_entries(&self) -> Option<(u64, u64)> {
        Some((
            kiln_runtime::lazy_entry::lazy_entry_address()?,
            kiln_runtime::lazy_entry::lazy_call_failed_address(),
        ))
    }

    fn page_size(&self) -> u64 {
        // SAFETY: sysconf has no preconditions.
        (unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).max(4096) as u64
    }

    fn mapper(&self, _debuggable: bool) -> Result<Option<Arc<dyn Mapper>>, Error> {
        Ok(None)
    }

    fn lookup_many(&self, library: u64, names: &[&str]) -> Result<Vec<Option<Found>>, Error> {
        let handle = library as *mut c_void;
        Ok(names
            .iter()
            // The kind is left unknown: in process it is asked for only when a link needs
            // it (`dladdr` per symbol is most of a lookup's cost).
            .map(|n| runtime::dlsym(handle, n).map(|a| (a, kiln_link::SymbolKind::Other)))
            .collect())
    }

    fn load_library(&self, path: &str) -> Result<u64, Error> {
        // A library new to the process may need the program's names when it loads (its
        // constructors, its undefined symbols) or look for them itself later: exports made
        // on demand are published before it where it could see them (see
        // `runtime::LibraryNeed`), as eager ones would have been.
        if let (_, Err(error)) = runtime::note_library_loading(path) {
            tracing::warn!(%error, library = path, "the program's exports could not be published");
        }
        runtime::dlopen(path)
            .map(|h| h as u64)
            .map_err(|reason| Error::SharedLibrary {
                name: path.to_string(),
                reason,
            })
    }

    fn register_eh_frame(&self, address: u64) -> Result<Option<EhRegistration>, Error> {
        Ok(EhFrameRegistration::register(address).map(EhRegistration::new))
    }

    fn deregister_eh_frame(&self, registration: EhRegistration) {
        // Its drop deregisters.
        drop(registration.into_inner::<EhFrameRegistration>());
    }

    fn guard_branch_targets(&self, address: u64, len: u64) -> Result<(), Error> {
        // SAFETY: the session passes whole pages of the code of a module it just linked
        // and finalized read-execute.
        unsafe { runtime::guard_branch_targets(address, len) }.map_err(Error::Executor)
    }

    fn run_initializers(&self, functions: &[u64]) -> Result<(), Error> {
        // SAFETY: the session passes initializers of a module it just linked and keeps.
        unsafe { runtime::run_initializers(functions) };
        Ok(())
    }

    fn run_finalizers(&self, dso_handle: u64, functions: &[u64]) -> Result<(), Error> {
        // SAFETY: the session passes finalizers of a module whose memory is still live.
        unsafe { runtime::run_finalizers(dso_handle, functions) };
        Ok(())
    }

    fn reserve_tls_module(&self) -> Result<u64, Error> {
        Ok(thread_locals::tls_reserve_module())
    }

    fn place_static_tls(
        &self,
        module_id: u64,
        image: &[u8],
        size: u64,
        align: u64,
    ) -> Result<i64, Error> {
        thread_locals::tls_place_static(&TlsImage {
            module_id,
            image: image.to_vec(),
            size,
            align,
        })
        .map_err(Error::Executor)
    }

    fn install_tls(&self, template: TlsTemplate) -> Result<(), Error> {
        let image = TlsImage {
            module_id: template.module_id,
            image: template.image,
            size: template.size,
            align: template.align,
        };
        if thread_locals::tls_install(image) {
            Ok(())
        } else {
            Err(Error::Executor("TLS module id not reserved".into()))
        }
    }

    fn remove_tls(&self, module_id: u64) {
        thread_locals::tls_remove(module_id)
    }

    fn runtime_symbol(&self, name: &str) -> Option<u64> {
        thread_locals::runtime_symbol(name)
    }

    fn register_module(
        &self,
        dso_handle: u64,
        keep_alive: std::sync::Weak<dyn std::any::Any + Send + Sync>,
    ) {
        thread_locals::register_module(dso_handle, Some(keep_alive));
    }

    fn unregister_module(&self, dso_handle: u64) {
        thread_locals::unregister_module(dso_handle);
    }

    fn export_symbols(&self, symbols: Vec<ExportedSymbol>) -> Result<ExportHandle, Error> {
        runtime::export_symbols(&symbols)
            .map(ExportHandle::new)
            .map_err(Error::Executor)
    }

    fn export_module_on_demand(
        &self,
        module: std::sync::Weak<dyn kiln_runtime::module_symbols::ModuleSymbols>,
        code: std::ops::Range<u64>,
    ) -> Option<Result<ExportHandle, Error>> {
        Some(
            runtime::export_module_on_demand(module, code)
                .map(ExportHandle::new)
                .map_err(Error::Executor),
        )
    }

    fn loader_shim(&self, name: &str) -> Option<u64> {
        runtime::loader_shim(name)
    }

    fn unexport_symbols(&self, handle: ExportHandle) {
        if let Some(exports) = handle.into_inner::<runtime::Exports>() {
            runtime::unexport_symbols(exports);
        }
    }

    fn enable_debug_outputs(&self, outputs: &DebugOutputs) -> Result<(), Error> {
        kiln_runtime::debug_outputs::enable(outputs).map_err(Error::Executor)
    }

    fn register_debug(&self, module: DebugModule) -> Result<u64, Error> {
        // SAFETY: the functions are those of a module just linked and published by this
        // session, whose memory lives until after its free is announced.
        unsafe { kiln_runtime::debug_outputs::register(module) }.map_err(Error::Executor)
    }

    fn unregister_debug(&self, handle: u64) {
        kiln_runtime::debug_outputs::unregister(handle)
    }

    unsafe fn run_main(&self, address: u64, args: &[Vec<u8>]) -> Result<i32, Error> {
        // SAFETY: the caller's contract.
        let status = unsafe { runtime::call_main(address, args) };
        runtime::flush_stdio();
        Ok(status)
    }

    unsafe fn call(&self, address: u64, args: &[u64]) -> Result<u64, Error> {
        let mut a = [0u64; 6];
        a[..args.len()].copy_from_slice(args);
        // SAFETY: the caller's contract (at most six arguments, checked by the session);
        // extra integer arguments are ignored by a callee with fewer parameters (SysV ABI).
        let f: extern "C" fn(u64, u64, u64, u64, u64, u64) -> u64 =
            unsafe { std::mem::transmute(address as usize) };
        Ok(f(a[0], a[1], a[2], a[3], a[4], a[5]))
    }

    unsafe fn store_code_pointer(&self, slot: u64, target: u64) -> Result<Retirement, Error> {
        // SAFETY: the caller's contract: a live stub slot, touched atomically.
        unsafe { kiln_runtime::lazy_entry::store_code_pointer(slot, target) };
        Ok(Retirement::SessionGuards)
    }

    fn flush(&self) {
        runtime::flush_stdio();
    }
}
