//! What the runtime reads of a module's definitions without a copy of its own: the crash
//! reporter (to name the function a crash is in) and exports made on demand (to build
//! the exports when the program first calls the loader).

/// What holds a module's definitions, as the session keeps them: name, address, and
/// whether it is exported (any order).
pub trait ModuleSymbols: Send + Sync {
    /// The definitions: (name, address, exported).
    fn definitions(&self) -> Box<dyn Iterator<Item = (&str, u64, bool)> + '_>;
}
