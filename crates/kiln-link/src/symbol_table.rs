//! A module's global symbols as one table: sorted by name, the names in one block of text,
//! 16 bytes a symbol. A program of 20,000 functions keeps its symbols in 20 pages of names
//! and 80 of entries, where a list of shared strings took a string each and 40 bytes a
//! symbol (half the fresh pages of a warm run mapped from the image cache).

use crate::Name;
use std::sync::Arc;

/// `len`'s flag: exported to other modules (default or protected visibility).
const VISIBLE: u32 = 1 << 31;
/// `len`'s flag: the value is absolute, not an offset in the image's span (an image's
/// table, [`crate::relocatable`]).
const ABSOLUTE: u32 = 1 << 30;
/// The longest name a table holds (the flags take `len`'s two high bits).
const MAX_NAME: usize = (ABSOLUTE - 1) as usize;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Entry {
    /// The name's start in the block.
    start: u32,
    /// The name's length, with the flags.
    len: u32,
    value: u64,
}

impl Entry {
    /// The entry of a name of `name_len` bytes appended to a text of `text_len`.
    fn new(
        text_len: usize,
        name_len: usize,
        value: u64,
        visible: bool,
        absolute: bool,
    ) -> Result<Self, NamesTooLarge> {
        let start = u32::try_from(text_len).map_err(|_| NamesTooLarge)?;
        if name_len > MAX_NAME || text_len + name_len > u32::MAX as usize {
            return Err(NamesTooLarge);
        }
        let mut len = name_len as u32;
        if visible {
            len |= VISIBLE;
        }
        if absolute {
            len |= ABSOLUTE;
        }
        Ok(Entry { start, len, value })
    }
}

/// A module's global symbols, sorted by name, with their addresses and whether each is
/// exported (default or protected visibility) or the module's own (hidden, internal).
///
/// ```
/// use kiln_link::SymbolTable;
/// let mut table = SymbolTable::builder(2, 8);
/// table.push("main", 0x1000, false, false).unwrap();
/// table.push("square", 0x1040, true, false).unwrap();
/// let table = table.finish();
/// let square = table.find("square").unwrap();
/// assert_eq!(table.get(square).unwrap().address, 0x1040);
/// assert_eq!(&*table.shared_name(square).unwrap(), "square");
/// assert!(table.find("cube").is_none());
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SymbolTable {
    /// The names' text (`None` for an empty table: an empty table allocates nothing, and
    /// a session takes each linked module's table out of the link's result).
    names: Option<Arc<str>>,
    entries: Box<[Entry]>,
}

/// One symbol of a [`SymbolTable`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Symbol<'t> {
    /// Its name.
    pub name: &'t str,
    /// Its address; in an image's table, an offset in the image's span unless `absolute`.
    pub address: u64,
    /// Exported to other modules (default or protected visibility), or the module's own.
    pub visible: bool,
    /// `address` is absolute (an image's table only; a linked module's addresses are).
    pub absolute: bool,
}

/// The names of a table would take 4 GiB or more, or one name 1 GiB or more.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("a module's symbol names take 4 GiB or more (or one name 1 GiB or more)")]
pub struct NamesTooLarge;

impl SymbolTable {
    /// A table made by pushing symbols in name order, with room for `symbols` symbols
    /// whose names take `bytes` bytes.
    pub fn builder(symbols: usize, bytes: usize) -> SymbolTableBuilder {
        SymbolTableBuilder {
            text: String::with_capacity(bytes),
            entries: Vec::with_capacity(symbols),
        }
    }

    /// How many symbols it holds.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether it holds none.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    fn name_at(&self, e: &Entry) -> &str {
        let start = e.start as usize;
        let len = (e.len & !(VISIBLE | ABSOLUTE)) as usize;
        // Made by the builder from whole pushed strings: in bounds, on boundaries; a
        // damaged range reads as the empty name rather than a panic.
        (self.names.as_deref())
            .and_then(|names| names.get(start..start + len))
            .unwrap_or("")
    }

    fn symbol_at<'t>(&'t self, e: &Entry) -> Symbol<'t> {
        Symbol {
            name: self.name_at(e),
            address: e.value,
            visible: e.len & VISIBLE != 0,
            absolute: e.len & ABSOLUTE != 0,
        }
    }

    /// Symbol `i`.
    pub fn get(&self, i: usize) -> Option<Symbol<'_>> {
        self.entries.get(i).map(|e| self.symbol_at(e))
    }

    /// Symbol `i`'s name, shared with the table (no copy).
    pub fn shared_name(&self, i: usize) -> Option<Name> {
        let e = self.entries.get(i)?;
        let start = e.start as usize;
        let len = (e.len & !(VISIBLE | ABSOLUTE)) as usize;
        Name::in_block(self.names.as_ref()?, start..start + len)
    }

    /// The index of the symbol named `name` (by binary search: the table is sorted).
    pub fn find(&self, name: &str) -> Option<usize> {
        self.entries
            .binary_search_by(|e| self.name_at(e).cmp(name))
            .ok()
    }

    /// Every symbol, in name order.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = Symbol<'_>> + '_ {
        self.entries.iter().map(|e| self.symbol_at(e))
    }

    /// The same symbols (the names shared, not copied) with each address `f(address)`:
    /// the new address, and whether it is absolute.
    pub(crate) fn with_addresses(&self, mut f: impl FnMut(u64) -> (u64, bool)) -> Self {
        let entries = self
            .entries
            .iter()
            .map(|e| {
                let (value, absolute) = f(e.value);
                let len = e.len & !ABSOLUTE;
                Entry {
                    start: e.start,
                    len: if absolute { len | ABSOLUTE } else { len },
                    value,
                }
            })
            .collect();
        SymbolTable {
            names: self.names.clone(),
            entries,
        }
    }

    /// The table with every address that is not absolute moved by `base` (an image's
    /// offsets made a mapped module's addresses); none absolute after.
    pub(crate) fn rebased(mut self, base: u64) -> Self {
        for e in self.entries.iter_mut() {
            if e.len & ABSOLUTE == 0 {
                e.value = e.value.wrapping_add(base);
            }
            e.len &= !ABSOLUTE;
        }
        self
    }
}

/// Builds a [`SymbolTable`] ([`SymbolTable::builder`]).
#[derive(Debug)]
pub struct SymbolTableBuilder {
    text: String,
    entries: Vec<Entry>,
}

impl SymbolTableBuilder {
    /// Appends a symbol. Symbols are pushed in name order (byte order): the table's
    /// lookups search it by halves.
    pub fn push(
        &mut self,
        name: &str,
        address: u64,
        visible: bool,
        absolute: bool,
    ) -> Result<(), NamesTooLarge> {
        let entry = Entry::new(self.text.len(), name.len(), address, visible, absolute)?;
        self.text.push_str(name);
        self.entries.push(entry);
        Ok(())
    }

    /// The table.
    pub fn finish(self) -> SymbolTable {
        SymbolTable {
            names: (!self.entries.is_empty()).then(|| Arc::from(self.text)),
            entries: self.entries.into_boxed_slice(),
        }
    }
}

/// Builds a [`SymbolTable`] from names given as bytes, checked as UTF-8 once, all
/// together, at the end (an image's exports: 20,000 short names checked one by one took
/// an eighth of their decode).
#[derive(Debug)]
pub(crate) struct TableFromBytes {
    text: Vec<u8>,
    entries: Vec<Entry>,
}

impl TableFromBytes {
    /// Room for `symbols` symbols whose names take `bytes` bytes.
    pub(crate) fn with_capacity(symbols: usize, bytes: usize) -> Self {
        TableFromBytes {
            text: Vec::with_capacity(bytes),
            entries: Vec::with_capacity(symbols),
        }
    }

    /// Appends a symbol (in name order, as [`SymbolTableBuilder::push`]).
    pub(crate) fn push(
        &mut self,
        name: &[u8],
        address: u64,
        visible: bool,
        absolute: bool,
    ) -> Result<(), NamesTooLarge> {
        let entry = Entry::new(self.text.len(), name.len(), address, visible, absolute)?;
        self.text.extend_from_slice(name);
        self.entries.push(entry);
        Ok(())
    }

    /// The table; `None` if the names are not UTF-8, each of them (the text as a whole,
    /// and every name starting on a character's first byte).
    pub(crate) fn finish(self) -> Option<SymbolTable> {
        let text = String::from_utf8(self.text).ok()?;
        if !self
            .entries
            .iter()
            .all(|e| text.is_char_boundary(e.start as usize))
        {
            return None;
        }
        Some(SymbolTable {
            names: (!self.entries.is_empty()).then(|| Arc::from(text)),
            entries: self.entries.into_boxed_slice(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_table_answers_by_name_and_shares_its_names() {
        let mut b = SymbolTable::builder(3, 0);
        b.push("a", 1, true, false).unwrap();
        b.push("bb", 2, false, true).unwrap();
        b.push("c", 3, true, false).unwrap();
        let t = b.finish();
        assert_eq!(t.len(), 3);
        let bb = t.find("bb").unwrap();
        assert_eq!(
            t.get(bb),
            Some(Symbol {
                name: "bb",
                address: 2,
                visible: false,
                absolute: true
            })
        );
        assert_eq!(t.find("b"), None);
        assert_eq!(
            t.iter().map(|s| s.name).collect::<Vec<_>>(),
            ["a", "bb", "c"]
        );
        let rebased = t.clone().rebased(0x1000);
        assert_eq!(
            rebased
                .iter()
                .map(|s| (s.address, s.absolute))
                .collect::<Vec<_>>(),
            [(0x1001, false), (2, false), (0x1003, false)]
        );
        assert_eq!(&*t.shared_name(2).unwrap(), "c");
        assert!(t.shared_name(3).is_none());
        assert!(SymbolTable::default().is_empty());
    }

    #[test]
    fn names_given_as_bytes_are_checked_as_utf8_each() {
        let mut b = TableFromBytes::with_capacity(2, 4);
        b.push(b"a", 1, true, false).unwrap();
        b.push("é".as_bytes(), 2, true, false).unwrap();
        let t = b.finish().expect("UTF-8 names");
        assert_eq!(t.iter().map(|s| s.name).collect::<Vec<_>>(), ["a", "é"]);
        // "é" cut in two: the text as a whole is UTF-8, each name is not.
        let mut b = TableFromBytes::with_capacity(2, 2);
        b.push(&"é".as_bytes()[..1], 1, true, false).unwrap();
        b.push(&"é".as_bytes()[1..], 2, true, false).unwrap();
        assert!(b.finish().is_none());
        let mut b = TableFromBytes::with_capacity(1, 1);
        b.push(&[0xff], 1, true, false).unwrap();
        assert!(b.finish().is_none());
    }
}
