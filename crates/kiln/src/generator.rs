//! Symbol generators: where a library finds definitions its modules do not have.

use kiln_link::SymbolKind;

/// A symbol found by a generator: its address and its kind ([`SymbolKind::Other`] when
/// the generator does not know: the link asks the executor if it needs to).
pub type Found = (u64, SymbolKind);

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
        self.generate(symbol).map(|a| (a, SymbolKind::Other))
    }

    /// [`SymbolGenerator::generate_with_kind`] for many names at once, in order.
    fn generate_many(&mut self, symbols: &[&str]) -> Vec<Option<Found>> {
        symbols.iter().map(|s| self.generate_with_kind(s)).collect()
    }

    /// Why this generator cannot answer at all, if it cannot (a shared library an
    /// executor could not load): a link that searches its library fails with this.
    fn unusable(&self) -> Option<String> {
        None
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
