//! A module's global symbols as one table: sorted by name, the names in one block of text,
//! 16 bytes a symbol. A program of 20,000 functions keeps its symbols in 20 pages of names
//! and 80 of entries, where a list of shared strings took a string each and 40 bytes a
//! symbol (half the fresh pages of a warm run mapped from the image cache).
//!
//! A table mapped from the image cache is not even copied: its entries and names are read
//! where they lie in the image file ([`crate::in_place`]), in the same 16-byte form.

use crate::in_place::InPlace;
use crate::Name;
use std::sync::{Arc, OnceLock};

/// `len`'s flag: exported to other modules (default or protected visibility).
const VISIBLE: u32 = 1 << 31;
/// `len`'s flag: the value is absolute, not an offset in the image's span (an image's
/// table, [`crate::relocatable`]).
const ABSOLUTE: u32 = 1 << 30;
/// The longest name a table holds (the flags take `len`'s two high bits).
const MAX_NAME: usize = (ABSOLUTE - 1) as usize;

/// The bytes an entry takes in an image's description: `start`, `len` (with the flags)
/// and `value`, little-endian.
pub(crate) const ENTRY_BYTES: usize = 16;

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

    /// The entry's name's range in the text.
    fn range(&self) -> std::ops::Range<usize> {
        let start = self.start as usize;
        start..start + (self.len & !(VISIBLE | ABSOLUTE)) as usize
    }

    /// The entry as an image's description holds it.
    fn to_bytes(self) -> [u8; ENTRY_BYTES] {
        let mut b = [0; ENTRY_BYTES];
        b[..4].copy_from_slice(&self.start.to_le_bytes());
        b[4..8].copy_from_slice(&self.len.to_le_bytes());
        b[8..].copy_from_slice(&self.value.to_le_bytes());
        b
    }

    /// [`Entry::to_bytes`] read back (`None` if `b` is short).
    fn from_bytes(b: &[u8]) -> Option<Self> {
        Some(Entry {
            start: u32::from_le_bytes(b.get(..4)?.try_into().ok()?),
            len: u32::from_le_bytes(b.get(4..8)?.try_into().ok()?),
            value: u64::from_le_bytes(b.get(8..16)?.try_into().ok()?),
        })
    }
}

/// A module's global symbols, sorted by name, with their addresses and whether each is
/// exported (default or protected visibility) or the module's own (hidden, internal).
/// A link's table owns its entries and names; one decoded from a mapped image
/// ([`crate::relocatable::RelocatableImage::decode_in_place`]) reads them where they lie
/// in the file, and answers the same.
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
#[derive(Clone, Default)]
pub struct SymbolTable {
    storage: Storage,
}

#[derive(Clone)]
enum Storage {
    /// Made by a link, or by a builder.
    Owned {
        /// The names' text (`None` for an empty table: an empty table allocates nothing,
        /// and a session takes each linked module's table out of the link's result).
        names: Option<Arc<str>>,
        entries: Box<[Entry]>,
    },
    /// Read where it lies in an image's description (boxed: a session keeps a table per
    /// module, and most are a link's, as small as the owned variant keeps them).
    InPlace(Box<InPlaceTable>),
}

impl Default for Storage {
    fn default() -> Self {
        Storage::Owned {
            names: None,
            entries: Box::default(),
        }
    }
}

/// A table in an image's description: [`ENTRY_BYTES`] an entry, then the names' text
/// (checked when the table was made: in order, on character boundaries, UTF-8).
#[derive(Clone)]
struct InPlaceTable {
    entries: InPlace,
    names: InPlace,
    /// Added to every value that is not absolute when read (the module's address: the
    /// table rebased, [`SymbolTable::rebased`]), the flag then reading clear; `None`: the
    /// image's offsets as they are.
    base: Option<u64>,
    /// The names copied into one block of text, made the first time a name is shared
    /// ([`SymbolTable::shared_name`]: when the session hashes them for another link).
    block: Arc<OnceLock<Arc<str>>>,
}

/// A table's names' text: checked text, or bytes read in place (checked when the table
/// was made).
#[derive(Clone, Copy)]
enum Text<'t> {
    Owned(&'t str),
    InPlace(&'t [u8]),
}

impl<'t> Text<'t> {
    /// Entry `e`'s name. Made by the builder from whole pushed strings, or checked when
    /// read from an image: in bounds, on boundaries; a damaged range reads as the empty
    /// name rather than a panic.
    fn name(self, e: &Entry) -> &'t str {
        match self {
            Text::Owned(text) => text.get(e.range()).unwrap_or(""),
            Text::InPlace(bytes) => bytes
                .get(e.range())
                .and_then(|b| std::str::from_utf8(b).ok())
                .unwrap_or(""),
        }
    }
}

impl InPlaceTable {
    fn entry(&self, i: usize) -> Option<Entry> {
        let at = i.checked_mul(ENTRY_BYTES)?;
        Entry::from_bytes(self.entries.bytes().get(at..at.checked_add(ENTRY_BYTES)?)?)
    }

    fn name_bytes(&self, e: &Entry) -> &[u8] {
        self.names.bytes().get(e.range()).unwrap_or_default()
    }
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
        match &self.storage {
            Storage::Owned { entries, .. } => entries.len(),
            Storage::InPlace(t) => t.entries.bytes().len() / ENTRY_BYTES,
        }
    }

    /// Whether it holds none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn entry(&self, i: usize) -> Option<Entry> {
        match &self.storage {
            Storage::Owned { entries, .. } => entries.get(i).copied(),
            Storage::InPlace(t) => t.entry(i),
        }
    }

    /// The names' text as it lies: fetched once for many entries.
    fn text(&self) -> Text<'_> {
        match &self.storage {
            Storage::Owned { names, .. } => Text::Owned(names.as_deref().unwrap_or("")),
            Storage::InPlace(t) => Text::InPlace(t.names.bytes()),
        }
    }

    fn name_at(&self, e: &Entry) -> &str {
        self.text().name(e)
    }

    fn symbol_at(&self, e: &Entry) -> Symbol<'_> {
        self.symbol_in(e, self.text())
    }

    /// Entry `e`'s address, and whether it is absolute.
    fn address_of(&self, e: &Entry) -> (u64, bool) {
        let absolute = e.len & ABSOLUTE != 0;
        match &self.storage {
            Storage::InPlace(t) => match t.base {
                Some(base) if !absolute => (e.value.wrapping_add(base), false),
                Some(_) => (e.value, false),
                None => (e.value, absolute),
            },
            Storage::Owned { .. } => (e.value, absolute),
        }
    }

    fn symbol_in<'t>(&'t self, e: &Entry, text: Text<'t>) -> Symbol<'t> {
        let (address, absolute) = self.address_of(e);
        Symbol {
            name: text.name(e),
            address,
            visible: e.len & VISIBLE != 0,
            absolute,
        }
    }

    /// Symbol `i`.
    pub fn get(&self, i: usize) -> Option<Symbol<'_>> {
        self.entry(i).map(|e| self.symbol_at(&e))
    }

    /// Symbol `i`'s name, shared with the table (no copy; a table read in place from an
    /// image copies its names into one block the first time).
    pub fn shared_name(&self, i: usize) -> Option<Name> {
        let e = self.entry(i)?;
        match &self.storage {
            Storage::Owned { names, .. } => Name::in_block(names.as_ref()?, e.range()),
            Storage::InPlace(t) => {
                let block = t
                    .block
                    .get_or_init(|| Arc::from(std::str::from_utf8(t.names.bytes()).unwrap_or("")));
                Name::in_block(block, e.range())
            }
        }
    }

    /// The index of the symbol named `name` (by binary search: the table is sorted).
    pub fn find(&self, name: &str) -> Option<usize> {
        match &self.storage {
            Storage::Owned { entries, .. } => {
                entries.binary_search_by(|e| self.name_at(e).cmp(name)).ok()
            }
            Storage::InPlace(t) => {
                // By halves over the entries as they lie (names compare as their bytes).
                let (mut low, mut high) = (0, self.len());
                while low < high {
                    let mid = low + (high - low) / 2;
                    let e = t.entry(mid)?;
                    match t.name_bytes(&e).cmp(name.as_bytes()) {
                        std::cmp::Ordering::Less => low = mid + 1,
                        std::cmp::Ordering::Greater => high = mid,
                        std::cmp::Ordering::Equal => return Some(mid),
                    }
                }
                None
            }
        }
    }

    /// Every symbol, in name order.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = Symbol<'_>> + '_ {
        let text = self.text();
        self.entries().map(move |e| self.symbol_in(&e, text))
    }

    /// Every symbol's address and whether it is absolute, in name order (no name read).
    pub(crate) fn addresses(&self) -> impl Iterator<Item = (u64, bool)> + '_ {
        self.entries().map(|e| self.address_of(&e))
    }

    /// Every entry, in order (the bytes of a table in place fetched once).
    fn entries(&self) -> impl ExactSizeIterator<Item = Entry> + '_ {
        let (owned, in_place): (&[Entry], &[u8]) = match &self.storage {
            Storage::Owned { entries, .. } => (entries, &[]),
            Storage::InPlace(t) => (&[], t.entries.bytes()),
        };
        let len = owned.len() + in_place.len() / ENTRY_BYTES;
        (0..len).map(move |i| {
            owned
                .get(i)
                .copied()
                .or_else(|| Entry::from_bytes(in_place.get(i * ENTRY_BYTES..)?))
                .unwrap_or(Entry {
                    start: 0,
                    len: 0,
                    value: 0,
                })
        })
    }

    /// The same symbols (the names shared, not copied) with each address `f(address)`:
    /// the new address, and whether it is absolute.
    pub(crate) fn with_addresses(&self, mut f: impl FnMut(u64) -> (u64, bool)) -> Self {
        let Storage::Owned { names, entries } = &self.storage else {
            // A table read from an image, made an image's again: rebuilt from its symbols.
            let mut b = SymbolTable::builder(self.len(), 0);
            for s in self.iter() {
                let (value, absolute) = f(s.address);
                // The names fitted the table they come from.
                let _ = b.push(s.name, value, s.visible, absolute);
            }
            return b.finish();
        };
        let entries = entries
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
            storage: Storage::Owned {
                names: names.clone(),
                entries,
            },
        }
    }

    /// The table with every address that is not absolute moved by `base` (an image's
    /// offsets made a mapped module's addresses); none absolute after.
    pub(crate) fn rebased(mut self, base: u64) -> Self {
        match &mut self.storage {
            Storage::Owned { entries, .. } => {
                for e in entries.iter_mut() {
                    if e.len & ABSOLUTE == 0 {
                        e.value = e.value.wrapping_add(base);
                    }
                    e.len &= !ABSOLUTE;
                }
            }
            Storage::InPlace(t) => {
                t.base = Some(t.base.unwrap_or(0).wrapping_add(base));
            }
        }
        self
    }

    /// The table as an image's description holds it: the count, the names' length, the
    /// entries ([`ENTRY_BYTES`] each), the names.
    pub(crate) fn put(&self, w: &mut kiln_codec::Writer) {
        let mut text = 0usize;
        let entries: Vec<[u8; ENTRY_BYTES]> =
            self.iter()
                .map(|s| {
                    // The names fitted the table they come from.
                    let e = Entry::new(text, s.name.len(), s.address, s.visible, s.absolute)
                        .unwrap_or(Entry {
                            start: 0,
                            len: 0,
                            value: 0,
                        });
                    text += s.name.len();
                    e.to_bytes()
                })
                .collect();
        w.u32(entries.len() as u32);
        w.u32(text as u32);
        for e in &entries {
            w.raw(e);
        }
        for s in self.iter() {
            w.raw(s.name.as_bytes());
        }
    }

    /// The table [`SymbolTable::put`] wrote, read where it lies: `entries` and `names`
    /// of an image's description, checked — every name inside the text, on character
    /// boundaries, UTF-8, and the names in order, each once (the lookups search by halves).
    pub(crate) fn in_place(entries: InPlace, names: InPlace) -> Result<Self, &'static str> {
        if entries.bytes().len() % ENTRY_BYTES != 0 {
            return Err("exports' entries");
        }
        let text = std::str::from_utf8(names.bytes()).map_err(|_| "exports' names (not UTF-8)")?;
        let mut previous: Option<&[u8]> = None;
        for chunk in entries.bytes().chunks_exact(ENTRY_BYTES) {
            let e = Entry::from_bytes(chunk).ok_or("exports' entries")?;
            let range = e.range();
            if range.end > text.len()
                || !text.is_char_boundary(range.start)
                || !text.is_char_boundary(range.end)
            {
                return Err("an export's name");
            }
            let name = &text.as_bytes()[range];
            if previous.is_some_and(|p| p >= name) {
                return Err("exports' order");
            }
            previous = Some(name);
        }
        let table = InPlaceTable {
            entries,
            names,
            base: None,
            block: Arc::default(),
        };
        Ok(SymbolTable {
            storage: Storage::InPlace(Box::new(table)),
        })
    }
}

impl PartialEq for SymbolTable {
    fn eq(&self, other: &Self) -> bool {
        self.len() == other.len() && self.iter().eq(other.iter())
    }
}

impl Eq for SymbolTable {}

impl std::fmt::Debug for SymbolTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.iter()).finish()
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
            storage: Storage::Owned {
                names: (!self.entries.is_empty()).then(|| Arc::from(self.text)),
                entries: self.entries.into_boxed_slice(),
            },
        }
    }
}

/// Builds a [`SymbolTable`] from names given as bytes, checked as UTF-8 once, all
/// together, at the end (a link's exports: 20,000 short names checked one by one cost
/// more than their sort).
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
            storage: Storage::Owned {
                names: (!self.entries.is_empty()).then(|| Arc::from(text)),
                entries: self.entries.into_boxed_slice(),
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_table_stays_as_small_as_a_links_needs() {
        // A session keeps one per module: the in-place variant is boxed.
        // Four words: the names' shared text (two) and the entries (two).
        assert_eq!(
            std::mem::size_of::<SymbolTable>(),
            4 * std::mem::size_of::<usize>()
        );
    }

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

    /// A table written as an image's description holds it and read back in place.
    fn written_and_read_in_place(t: &SymbolTable) -> Result<SymbolTable, &'static str> {
        let mut w = kiln_codec::Writer::new();
        t.put(&mut w);
        let bytes = w.into_bytes();
        let n = u32::from_le_bytes(bytes[..4].try_into().unwrap()) as usize;
        let entries_end = 8 + n * ENTRY_BYTES;
        let owner: crate::SharedBytes = Arc::new(bytes.clone());
        SymbolTable::in_place(
            InPlace::new(owner.clone(), 8..entries_end).unwrap(),
            InPlace::new(owner, entries_end..bytes.len()).unwrap(),
        )
    }

    #[test]
    fn a_table_read_in_place_answers_as_the_table_written() {
        let mut b = SymbolTable::builder(3, 0);
        b.push("a", 1, true, false).unwrap();
        b.push("bb", 2, false, true).unwrap();
        b.push("é", 3, true, false).unwrap();
        let t = b.finish();
        let read = written_and_read_in_place(&t).expect("a table in order");
        assert_eq!(read, t);
        assert_eq!(read.find("bb"), Some(1));
        assert_eq!(read.find("b"), None);
        assert_eq!(read.find("é"), Some(2));
        assert_eq!(&*read.shared_name(2).unwrap(), "é");
        assert_eq!(read.clone().rebased(0x1000), t.clone().rebased(0x1000));
        assert_eq!(read.get(3), None);
        assert!(written_and_read_in_place(&SymbolTable::default())
            .unwrap()
            .is_empty());
    }

    #[test]
    fn a_damaged_table_in_place_is_refused() {
        // Out of order, twice, outside the text, a name cut inside a character.
        let entry = |start: u32, len: u32| {
            Entry {
                start,
                len: len | VISIBLE,
                value: 0,
            }
            .to_bytes()
        };
        let text = "abé";
        for (entries, why) in [
            (vec![entry(1, 1), entry(0, 1)], "exports' order"),
            (vec![entry(0, 1), entry(0, 1)], "exports' order"),
            (vec![entry(0, 9)], "an export's name"),
            (vec![entry(0, 3)], "an export's name"),
        ] {
            let mut bytes: Vec<u8> = entries.concat();
            let end = bytes.len();
            bytes.extend_from_slice(text.as_bytes());
            let owner: crate::SharedBytes = Arc::new(bytes.clone());
            let read = SymbolTable::in_place(
                InPlace::new(owner.clone(), 0..end).unwrap(),
                InPlace::new(owner, end..bytes.len()).unwrap(),
            );
            assert_eq!(read.err(), Some(why));
        }
        let owner: crate::SharedBytes = Arc::new(vec![0xffu8; 17]);
        assert_eq!(
            SymbolTable::in_place(
                InPlace::new(owner.clone(), 0..16).unwrap(),
                InPlace::new(owner, 16..17).unwrap()
            )
            .err(),
            Some("exports' names (not UTF-8)")
        );
    }
}
