//! An executor made of C callbacks: the code runs in this process (Kiln's runtime, with
//! Kiln's memory or the memory callbacks'), while the host decides what the names JIT code
//! leaves undefined resolve to (an allow-list of host functions, say) and how `main` is
//! run (on a thread or stack of its choosing). Every other step is the in-process
//! executor's.

use kiln::{
    debug::{DebugModule, DebugOutputs, ExportedSymbol},
    executor::{EhRegistration, ExecutorService, ExportHandle},
    link::TlsTemplate,
    memory::Mapper,
    plugin::SymbolKind,
    Architecture, Error, Found,
};
use std::ffi::{c_char, c_int, c_void, CString};
use std::sync::Arc;

/// Callbacks of an executor of the host's making (`KILN_EXECUTOR_CALLBACKS`). Each may be
/// NULL: the in-process executor's behaviour then.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct kiln_executor_callbacks {
    /// Passed to every callback.
    pub context: *mut c_void,
    /// Resolves `name`, which JIT code uses and no library defines: its address through
    /// `*address` (0: the host does not provide it, and the link reports it undefined).
    /// Returns 0, or non-zero for an error (the name then counts as not provided). NULL:
    /// this process's symbols, as the in-process executor finds them.
    pub lookup: Option<
        unsafe extern "C" fn(context: *mut c_void, name: *const c_char, address: *mut u64) -> c_int,
    >,
    /// Runs the `int main(int, char **)` at `address` with `argc` and `argv` (NULL
    /// terminated) and gives its status through `*status`. Returns 0, or non-zero for an
    /// error. NULL: Kiln calls it on the calling thread.
    pub run_main: Option<
        unsafe extern "C" fn(
            context: *mut c_void,
            address: u64,
            argc: c_int,
            argv: *const *const c_char,
            status: *mut c_int,
        ) -> c_int,
    >,
    /// Called once, when the last session using these callbacks is gone (NULL: nothing to
    /// do).
    pub destroy: Option<unsafe extern "C" fn(context: *mut c_void)>,
}

/// The callbacks and the in-process executor they complete.
pub(crate) struct CallbackExecutor {
    callbacks: kiln_executor_callbacks,
    in_process: Arc<dyn ExecutorService>,
}

// SAFETY: the API's contract: executor callbacks may be called from any thread, at once.
unsafe impl Send for CallbackExecutor {}
// SAFETY: as above.
unsafe impl Sync for CallbackExecutor {}

impl CallbackExecutor {
    /// Takes `callbacks` (their `destroy` runs when the executor is dropped).
    pub(crate) fn new(callbacks: kiln_executor_callbacks) -> Arc<Self> {
        Arc::new(CallbackExecutor {
            callbacks,
            in_process: kiln::Executor::in_process().service().clone(),
        })
    }
}

impl Drop for CallbackExecutor {
    fn drop(&mut self) {
        if let Some(destroy) = self.callbacks.destroy {
            // SAFETY: the host's callback, called once, with its own context.
            unsafe { destroy(self.callbacks.context) };
        }
    }
}

impl ExecutorService for CallbackExecutor {
    fn describe(&self) -> String {
        "C callbacks, in process".into()
    }

    fn architecture(&self) -> Result<Architecture, Error> {
        self.in_process.architecture()
    }

    fn page_size(&self) -> u64 {
        self.in_process.page_size()
    }

    fn mapper(&self, debuggable: bool) -> Result<Option<Arc<dyn Mapper>>, Error> {
        self.in_process.mapper(debuggable)
    }

    fn lookup_many(&self, library: u64, names: &[&str]) -> Result<Vec<Option<Found>>, Error> {
        // A library the host had opened through the session is looked up as usual.
        let Some(lookup) = self.callbacks.lookup.filter(|_| library == 0) else {
            return self.in_process.lookup_many(library, names);
        };
        Ok(names
            .iter()
            .map(|name| {
                let name = CString::new(*name).ok()?;
                let mut address = 0u64;
                // SAFETY: the host's callback, with a NUL-terminated name and an
                // out-pointer valid for the call.
                let status = unsafe { lookup(self.callbacks.context, name.as_ptr(), &mut address) };
                (status == 0 && address != 0).then_some((address, SymbolKind::Other))
            })
            .collect())
    }

    fn load_library(&self, path: &str) -> Result<u64, Error> {
        self.in_process.load_library(path)
    }

    fn register_eh_frame(&self, address: u64) -> Result<Option<EhRegistration>, Error> {
        self.in_process.register_eh_frame(address)
    }

    fn deregister_eh_frame(&self, registration: EhRegistration) {
        self.in_process.deregister_eh_frame(registration)
    }

    fn guard_branch_targets(&self, address: u64, len: u64) -> Result<(), Error> {
        self.in_process.guard_branch_targets(address, len)
    }

    fn run_initializers(&self, functions: &[u64]) -> Result<(), Error> {
        self.in_process.run_initializers(functions)
    }

    fn run_finalizers(&self, dso_handle: u64, functions: &[u64]) -> Result<(), Error> {
        self.in_process.run_finalizers(dso_handle, functions)
    }

    fn reserve_tls_module(&self) -> Result<u64, Error> {
        self.in_process.reserve_tls_module()
    }

    fn place_static_tls(
        &self,
        module_id: u64,
        image: &[u8],
        size: u64,
        align: u64,
    ) -> Result<i64, Error> {
        self.in_process
            .place_static_tls(module_id, image, size, align)
    }

    fn install_tls(&self, template: TlsTemplate) -> Result<(), Error> {
        self.in_process.install_tls(template)
    }

    fn remove_tls(&self, module_id: u64) {
        self.in_process.remove_tls(module_id)
    }

    fn runtime_symbol(&self, name: &str) -> Option<u64> {
        self.in_process.runtime_symbol(name)
    }

    fn register_module(
        &self,
        dso_handle: u64,
        keep_alive: std::sync::Weak<dyn std::any::Any + Send + Sync>,
    ) {
        self.in_process.register_module(dso_handle, keep_alive)
    }

    fn unregister_module(&self, dso_handle: u64) {
        self.in_process.unregister_module(dso_handle)
    }

    fn export_symbols(&self, symbols: Vec<ExportedSymbol>) -> Result<ExportHandle, Error> {
        self.in_process.export_symbols(symbols)
    }

    fn export_module_on_demand(
        &self,
        module: std::sync::Weak<dyn kiln::debug::ModuleSymbols>,
        code: std::ops::Range<u64>,
    ) -> Option<Result<ExportHandle, Error>> {
        self.in_process.export_module_on_demand(module, code)
    }

    fn loader_shim(&self, name: &str) -> Option<u64> {
        self.in_process.loader_shim(name)
    }

    fn unexport_symbols(&self, handle: ExportHandle) {
        self.in_process.unexport_symbols(handle)
    }

    fn enable_debug_outputs(&self, outputs: &DebugOutputs) -> Result<(), Error> {
        self.in_process.enable_debug_outputs(outputs)
    }

    fn register_debug(&self, module: DebugModule) -> Result<u64, Error> {
        self.in_process.register_debug(module)
    }

    fn unregister_debug(&self, handle: u64) {
        self.in_process.unregister_debug(handle)
    }

    unsafe fn run_main(&self, address: u64, args: &[Vec<u8>]) -> Result<i32, Error> {
        let Some(run_main) = self.callbacks.run_main else {
            // SAFETY: the caller's contract.
            return unsafe { self.in_process.run_main(address, args) };
        };
        let strings: Vec<CString> = args
            .iter()
            .map(|a| CString::new(a.as_slice()))
            .collect::<Result<_, _>>()
            .map_err(|_| Error::Executor("an argument holds a NUL byte".into()))?;
        let mut argv: Vec<*const c_char> = strings.iter().map(|s| s.as_ptr()).collect();
        argv.push(std::ptr::null());
        let mut status: c_int = 0;
        // SAFETY: the host's callback; argv (NULL terminated) and the out-pointer live for
        // the call; `address` is main of a live module (the caller's contract).
        let failed = unsafe {
            run_main(
                self.callbacks.context,
                address,
                strings.len() as c_int,
                argv.as_ptr(),
                &mut status,
            )
        };
        if failed != 0 {
            return Err(Error::Executor(format!(
                "the host's run_main callback failed ({failed})"
            )));
        }
        Ok(status)
    }

    unsafe fn call(&self, address: u64, args: &[u64]) -> Result<u64, Error> {
        // SAFETY: the caller's contract.
        unsafe { self.in_process.call(address, args) }
    }

    unsafe fn store_code_pointer(
        &self,
        slot: u64,
        target: u64,
    ) -> Result<kiln::executor::Retirement, Error> {
        // SAFETY: the caller's contract.
        unsafe { self.in_process.store_code_pointer(slot, target) }
    }

    fn flush(&self) {
        self.in_process.flush()
    }
}
