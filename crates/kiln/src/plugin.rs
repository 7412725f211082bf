//! Plugins: code told of every module a session loads and frees — the listener API that
//! debugger and profiler support ([`crate::debug::DebugSupport`]) is built on, and what
//! lazy-compilation stubs will build on.

use kiln_link::ObjectInput;
// What a plugin's link passes see and do (`Plugin::link_passes`); from kiln-link.
pub use kiln_link::{
    GraphEdge, GraphSection, GraphView, LinkPass, NewSectionKind, PassError, PassPoint,
    PlacedSection, SectionId, SymbolInfo, SymbolKind,
};
use kiln_memory::SegmentRange;
use parking_lot::Mutex;
use std::sync::{Arc, Weak};

/// A module just loaded, or about to be freed: where its sections landed, its symbols,
/// the objects it was linked from. A plugin is given the same value at load and at free.
#[derive(Debug, Clone)]
pub struct LoadedModule {
    /// The module's id, unique within its session.
    pub id: u64,
    /// The module's name (its first object's).
    pub name: String,
    /// Its memory segments.
    pub segments: Vec<SegmentRange>,
    /// Every section placed in memory: object (an index into `objects`), section index and
    /// name, target address, size.
    pub sections: Vec<PlacedSection>,
    /// Every symbol defined with an address: name, address, size, kind.
    pub symbols: Vec<SymbolInfo>,
    /// Every object linked into the module, archive members included (bytes shared, not
    /// copied).
    pub objects: Vec<ObjectInput>,
}

/// What a plugin's failure says.
pub type PluginError = Box<dyn std::error::Error + Send + Sync>;

/// Told of every module a session loads and before each is freed.
///
/// # Contract
/// - Calls come from the thread that links or frees, with no session lock held (a plugin
///   may call into the session); a plugin must not block for long.
/// - Each module's load is announced after it is linked and published, before its
///   initializers run; its free before its memory is released (its finalizers have run).
/// - A plugin is told of the free of every module whose load it was told of, even if its
///   registration was dropped meanwhile: what a listener registers, it can always take
///   back. Modules loaded while no registration of it exists are not announced.
/// - Plugins observe, they cannot make a link fail: a plugin that returns an error or
///   panics is reported ([`crate::Jit::plugin_failures`] and a `tracing` warning) and the
///   link, or the free, goes on.
pub trait Plugin: Send + Sync {
    /// A short name for messages.
    fn name(&self) -> &str;

    /// A module was linked and published (before its initializers run).
    fn module_loaded(&self, module: &LoadedModule) -> Result<(), PluginError> {
        let _ = module;
        Ok(())
    }

    /// A module's memory is about to be freed (its finalizers have run).
    fn module_freed(&self, module: &LoadedModule) -> Result<(), PluginError> {
        let _ = module;
        Ok(())
    }

    /// Whether this plugin reads the symbols of the modules it is told of
    /// ([`LoadedModule::symbols`]; default: yes). A module mapped from the linked-image
    /// cache is told of with its symbols only if its image kept them, so a session whose
    /// plugins want them links again rather than map an image stored without them; a
    /// plugin that does not read them (one that prints what was linked) says `false` and
    /// lets such an image be mapped.
    fn wants_symbols(&self) -> bool {
        true
    }

    /// Passes to add to each link of the session, each at its point of the link (asked
    /// once per link). Unlike a failing event, a failing pass fails the link: a pass may
    /// change what is linked. See [`kiln_link::LinkPass`].
    fn link_passes(&self) -> Vec<(kiln_link::PassPoint, Arc<dyn kiln_link::LinkPass>)> {
        Vec::new()
    }
}

/// A plugin's failure, as [`crate::Jit::plugin_failures`] reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PluginFailure {
    /// The plugin's name.
    pub plugin: String,
    /// The module whose load or free it failed on.
    pub module: String,
    /// `"load"` or `"free"`.
    pub event: &'static str,
    /// Its error, or the panic's message.
    pub message: String,
}

/// Where a session's plugins live: the registrations, and the failures not yet taken.
/// Modules hold it too (their free is announced even after the session is gone).
#[derive(Default)]
pub(crate) struct Plugins {
    pub(crate) list: parking_lot::RwLock<Vec<(u64, Arc<dyn Plugin>)>>,
    next: std::sync::atomic::AtomicU64,
    failures: Mutex<Vec<PluginFailure>>,
}

/// At most this many failures are kept until taken (the oldest go first).
const MAX_FAILURES: usize = 1024;

impl Plugins {
    pub(crate) fn add(self: &Arc<Self>, plugin: Arc<dyn Plugin>) -> PluginRegistration {
        let id = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.list.write().push((id, plugin));
        PluginRegistration {
            plugins: Arc::downgrade(self),
            id,
        }
    }

    pub(crate) fn snapshot(&self) -> Vec<Arc<dyn Plugin>> {
        self.list.read().iter().map(|(_, p)| p.clone()).collect()
    }

    pub(crate) fn take_failures(&self) -> Vec<PluginFailure> {
        std::mem::take(&mut *self.failures.lock())
    }

    /// Tells each plugin of `module`'s load or free, containing errors and panics.
    pub(crate) fn announce(&self, plugins: &[Arc<dyn Plugin>], module: &LoadedModule, load: bool) {
        for plugin in plugins {
            let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                if load {
                    plugin.module_loaded(module)
                } else {
                    plugin.module_freed(module)
                }
            }));
            let message = match result {
                Ok(Ok(())) => continue,
                Ok(Err(error)) => error.to_string(),
                Err(panic) => panic
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .map_or("panicked".to_string(), |m| format!("panicked: {m}")),
            };
            let event = if load { "load" } else { "free" };
            tracing::warn!(
                plugin = plugin.name(),
                module = %module.name,
                event,
                %message,
                "a plugin failed; the session goes on"
            );
            let mut failures = self.failures.lock();
            if failures.len() == MAX_FAILURES {
                failures.remove(0);
            }
            failures.push(PluginFailure {
                plugin: plugin.name().to_string(),
                module: module.name.clone(),
                event,
                message,
            });
        }
    }
}

/// A plugin's registration with a session: the plugin is told of modules loaded while
/// this lives. Dropping it unregisters the plugin (modules it was told of still announce
/// their free to it).
#[must_use = "dropping the registration unregisters the plugin at once"]
#[derive(Debug)]
pub struct PluginRegistration {
    plugins: Weak<Plugins>,
    id: u64,
}

impl Drop for PluginRegistration {
    fn drop(&mut self) {
        if let Some(plugins) = self.plugins.upgrade() {
            plugins.list.write().retain(|(id, _)| *id != self.id);
        }
    }
}
