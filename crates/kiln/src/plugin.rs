//! Plugins: code told of every module a session loads and frees — what debugger and
//! profiler listeners, and lazy-compilation stubs, build on.

use kiln_link::{ObjectInput, PlacedSection, SymbolInfo};
use kiln_memory::SegmentRange;

/// A plugin's registration, for [`crate::Jit::remove_plugin`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PluginId(pub(crate) u64);

/// A module just loaded: where its sections landed, its symbols, the objects it was
/// linked from.
#[derive(Debug, Clone)]
pub struct LoadedModule {
    /// The module's name (its first object's).
    pub name: String,
    /// Every section placed in memory: object, section name, target address, size.
    pub sections: Vec<PlacedSection>,
    /// Every symbol defined with an address: name, address, size, kind.
    pub symbols: Vec<SymbolInfo>,
    /// The objects' bytes (shared, not copied).
    pub objects: Vec<ObjectInput>,
}

/// Told of every module a session loads and before each is freed.
///
/// Calls come from the thread that links or frees, with no session lock held; a plugin
/// must not block for long. A plugin that panics is reported (a `tracing` warning) and
/// the link or free goes on: plugins observe, they cannot make a link fail.
pub trait Plugin: Send + Sync {
    /// A short name for messages.
    fn name(&self) -> &str;

    /// A module was linked and published (before its initializers run).
    fn module_loaded(&self, module: &LoadedModule) {
        let _ = module;
    }

    /// A module's memory is about to be freed (its finalizers have run); `segments` are
    /// its memory ranges.
    fn module_freed(&self, name: &str, segments: &[SegmentRange]) {
        let _ = (name, segments);
    }
}
