//! Module handles: what a link made, the modules it uses and those that use it. Removal
//! is in [`crate::removal`].

use crate::executor::{EhRegistration, Executor, ExportHandle};
use crate::library_id::LibraryId;
use crate::plugin::{LoadedModule, Plugin, Plugins};
use kiln_memory::FinalizedAllocation;
use parking_lot::Mutex;
use std::sync::{Arc, Weak};

/// What a module's free is to be announced to: the plugins told of its load.
pub(crate) struct Announced {
    pub(crate) plugins: Arc<Plugins>,
    pub(crate) told: Vec<Arc<dyn Plugin>>,
    pub(crate) event: Arc<LoadedModule>,
}

pub(crate) struct ModuleInner {
    pub(crate) id: u64,
    pub(crate) name: Box<str>,
    pub(crate) library: LibraryId,
    /// The module's global definitions, sorted by name, with whether each is exported.
    pub(crate) symbols: kiln_link::SymbolTable,
    pub(crate) fini: Box<[u64]>,
    pub(crate) dso_handle: u64,
    pub(crate) tls_module: Option<u64>,
    /// Its registrations with the executor's unwinder (`.eh_frame`; on Windows, the
    /// unwind data made from it and its COFF objects' table).
    pub(crate) eh: Mutex<Vec<EhRegistration>>,
    pub(crate) exports: Mutex<Option<ExportHandle>>,
    pub(crate) finalized: Mutex<bool>,
    pub(crate) executor: Executor,
    /// The modules whose definitions this one's code refers to: kept alive with it.
    pub(crate) uses: Box<[Module]>,
    /// The modules that refer to this one.
    pub(crate) users: Mutex<Vec<Weak<ModuleInner>>>,
    /// The plugins told of the module's load, to be told of its free.
    /// (Boxed: most sessions have no plugin, and every module pays for the field.)
    pub(crate) announced: Mutex<Option<Box<Announced>>>,
    pub(crate) allocation: FinalizedAllocation,
}

impl ModuleInner {
    /// The module's global definition of `name` (its table is sorted by name): its
    /// index in the table and the symbol.
    fn entry(&self, name: &str) -> Option<(usize, kiln_link::Symbol<'_>)> {
        let i = self.symbols.find(name)?;
        Some((i, self.symbols.get(i)?))
    }

    /// A global definition of the module: its name (shared with the module's table) and
    /// address.
    pub(crate) fn symbol_entry(&self, name: &str) -> Option<(kiln_link::Name, u64)> {
        let (i, symbol) = self.entry(name)?;
        Some((self.symbols.shared_name(i)?, symbol.address))
    }

    /// The module's definition of `name`, if it defines it exported (`exported`) or
    /// hidden (not): for its library's lookups before its names are hashed.
    pub(crate) fn definition(
        &self,
        name: &str,
        exported: bool,
    ) -> Option<crate::library::Definition> {
        let (_, symbol) = self.entry(name)?;
        (symbol.visible == exported).then(|| crate::library::Definition {
            address: symbol.address,
            module: std::num::NonZeroU64::new(self.id),
        })
    }

    /// Takes this module out of the user lists of the modules it uses (at removal and
    /// when it is dropped): a JIT that churns modules calling a long-lived one must not
    /// grow that one's list.
    pub(crate) fn leave_users_lists(&self) {
        let me = self as *const ModuleInner;
        for used in self.uses.iter() {
            used.inner.users.lock().retain(|u| u.as_ptr() != me);
        }
    }

    /// Runs the module's finalizers unless they ran already: the calling thread's
    /// thread-local destructors, `atexit` handlers, `.fini_array`.
    pub(crate) fn run_finalizers(&self) {
        let run = {
            let mut done = self.finalized.lock();
            let run = !*done;
            *done = true;
            run
        };
        if run {
            if let Err(error) = self.executor.run_finalizers(self.dso_handle, &self.fini) {
                tracing::warn!(%error, module = %self.name, "running finalizers failed");
            }
        }
    }

    /// Runs finalizers once, withdraws exported definitions and unregisters unwind
    /// information; the memory stays until the last handle goes.
    pub(crate) fn finalize(&self) {
        // Exports go first: a library loaded meanwhile must not bind to a module whose
        // finalizers are running.
        if let Some(exports) = self.exports.lock().take() {
            self.executor.unexport_symbols(exports);
        }
        self.run_finalizers();
        self.executor.unregister_module(self.dso_handle);
        for registration in std::mem::take(&mut *self.eh.lock()) {
            self.executor.deregister_eh_frame(registration);
        }
    }
}

impl kiln_runtime::crash_report::ModuleSymbols for ModuleInner {
    fn definition_count(&self) -> usize {
        self.symbols.len()
    }

    fn definition(&self, i: usize) -> Option<(&str, u64, bool)> {
        let s = self.symbols.get(i)?;
        Some((s.name, s.address, s.visible))
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
/// [`Jit`](crate::Jit) is dropped), and when the last handle goes its finalizers run and its memory is
/// freed.
#[derive(Clone)]
pub struct Module {
    pub(crate) inner: Arc<ModuleInner>,
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
        self.inner.entry(name).map(|(_, s)| s.address)
    }

    /// The names the module exports to its library.
    pub fn exported_names(&self) -> impl Iterator<Item = &str> {
        self.inner
            .symbols
            .iter()
            .filter(|s| s.visible)
            .map(|s| s.name)
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
