//! What the runtime reads of a module's definitions without a copy of its own: the crash
//! reporter (to name the function a crash is in) and exports made on demand (to build
//! the exports when the program first calls the loader).

/// What holds a module's definitions, as the session keeps them: name, address, and
/// whether it is exported (any order). Reading one allocates nothing: the crash
/// reporter reads them in its signal handler.
pub trait ModuleSymbols: Send + Sync {
    /// How many definitions it holds.
    fn definition_count(&self) -> usize;
    /// Definition `i`: (name, address, exported); `None` past the end.
    fn definition(&self, i: usize) -> Option<(&str, u64, bool)>;
}

/// Every definition of `module`, in its order (allocates nothing).
pub fn definitions(module: &dyn ModuleSymbols) -> impl Iterator<Item = (&str, u64, bool)> + '_ {
    (0..module.definition_count()).filter_map(move |i| module.definition(i))
}
