//! Symbol generators: where a library finds definitions its modules do not have.

use crate::Error;
use kiln_executor::runtime as executor;
use std::ffi::c_void;

/// A symbol found by a generator: its address and whether it is a function, if known.
pub type Found = (u64, Option<bool>);

/// Supplies addresses for names nobody in a library defines.
///
/// Called during linking, once per undefined name, in the library's generator order.
pub trait SymbolGenerator: Send {
    /// A short description for messages.
    fn name(&self) -> String;
    /// The address of `symbol`, or `None`.
    fn generate(&mut self, symbol: &str) -> Option<u64>;

    /// The address of `symbol` and whether it is a function (if the generator knows: a
    /// far reference to a function can go through a stub, to data it cannot).
    fn generate_with_kind(&mut self, symbol: &str) -> Option<Found> {
        self.generate(symbol).map(|a| (a, None))
    }

    /// [`SymbolGenerator::generate_with_kind`] for many names at once, in order.
    fn generate_many(&mut self, symbols: &[&str]) -> Vec<Option<Found>> {
        symbols.iter().map(|s| self.generate_with_kind(s)).collect()
    }
}

/// The symbols of this process: its executable and every shared library it has loaded
/// (`dlsym(RTLD_DEFAULT)`).
#[derive(Debug, Default, Clone, Copy)]
pub struct ProcessSymbols;

impl SymbolGenerator for ProcessSymbols {
    fn name(&self) -> String {
        "process symbols".into()
    }
    fn generate(&mut self, symbol: &str) -> Option<u64> {
        executor::dlsym(std::ptr::null_mut(), symbol)
    }
    fn generate_with_kind(&mut self, symbol: &str) -> Option<Found> {
        self.generate(symbol)
            .map(|a| (a, executor::host_symbol_is_function(a)))
    }
}

/// A shared library opened with `dlopen` (kept open for the life of the process: code
/// linked against it may still run).
#[derive(Debug)]
pub struct SharedLibrary {
    path: String,
    handle: *mut c_void,
}

// SAFETY: a dlopen handle may be used from any thread; dlsym is thread-safe.
unsafe impl Send for SharedLibrary {}

impl SharedLibrary {
    /// Opens `path` (a path, or a name the dynamic loader finds such as `libm.so.6`).
    pub fn open(path: &str) -> Result<Self, Error> {
        let handle = executor::dlopen(path).map_err(|reason| Error::SharedLibrary {
            name: path.to_string(),
            reason,
        })?;
        Ok(SharedLibrary {
            path: path.to_string(),
            handle,
        })
    }
}

impl SymbolGenerator for SharedLibrary {
    fn name(&self) -> String {
        self.path.clone()
    }
    fn generate(&mut self, symbol: &str) -> Option<u64> {
        executor::dlsym(self.handle, symbol)
    }
    fn generate_with_kind(&mut self, symbol: &str) -> Option<Found> {
        self.generate(symbol)
            .map(|a| (a, executor::host_symbol_is_function(a)))
    }
}

/// A generator from a closure.
pub struct FnGenerator<F>(pub F);

impl<F: FnMut(&str) -> Option<u64> + Send> SymbolGenerator for FnGenerator<F> {
    fn name(&self) -> String {
        "callback".into()
    }
    fn generate(&mut self, symbol: &str) -> Option<u64> {
        (self.0)(symbol)
    }
}
