//! A symbol table and its string table, as written into an ELF file.

use crate::writer::SYM_SIZE;
use object::elf;
use object::endian::{LittleEndian as LE, U16, U32, U64};
use object::pod::bytes_of;

/// A `.symtab`/`.dynsym` under construction, with its string table: the null symbol first,
/// then symbols in the order pushed (locals before globals, as ELF requires: the caller
/// pushes them in that order and reads [`SymbolTable::len`] where the globals start).
#[derive(Debug, Clone)]
pub struct SymbolTable {
    symbols: Vec<u8>,
    strings: Vec<u8>,
    /// Index of this table's first symbol (non-zero for a [`SymbolTable::continuing`]).
    index_base: u32,
    /// Offset of this table's first string byte.
    string_base: u32,
}

impl SymbolTable {
    /// An empty table (the null symbol only) with room for `symbols` symbols whose names
    /// take `name_bytes` bytes.
    pub fn with_capacity(symbols: usize, name_bytes: usize) -> Self {
        let mut table = SymbolTable {
            symbols: Vec::with_capacity(SYM_SIZE * (symbols + 1)),
            strings: Vec::with_capacity(name_bytes + symbols + 1),
            index_base: 0,
            string_base: 0,
        };
        table.symbols.extend_from_slice(&[0u8; SYM_SIZE]);
        table.strings.push(0);
        table
    }

    /// A table whose symbols and strings are written right after `before`'s (indexes and
    /// string offsets count on from `before`'s end; no null symbol of its own): more
    /// symbols for a table made earlier, without copying it.
    pub fn continuing(before: &SymbolTable, symbols: usize, name_bytes: usize) -> Self {
        SymbolTable {
            symbols: Vec::with_capacity(SYM_SIZE * symbols),
            strings: Vec::with_capacity(name_bytes + symbols),
            index_base: before.len(),
            string_base: before.string_base + before.strings.len() as u32,
        }
    }

    /// Adds `name` to the string table only (a `DT_SONAME`, say) and returns its offset.
    pub fn add_string(&mut self, name: &[u8]) -> u32 {
        if name.is_empty() {
            return 0;
        }
        let offset = self.string_base + self.strings.len() as u32;
        self.strings.extend_from_slice(name);
        self.strings.push(0);
        offset
    }

    /// Adds a symbol; `name` may be empty (section symbols). Returns its index.
    #[allow(clippy::too_many_arguments)]
    pub fn push(
        &mut self,
        name: &[u8],
        bind: elf::SymbolBind,
        kind: elf::SymbolType,
        visibility: elf::SymbolVisibility,
        section: elf::SymbolSection,
        value: u64,
        size: u64,
    ) -> u32 {
        let index = self.len();
        let st_name = self.add_string(name);
        let sym = elf::Sym64::<LE> {
            st_name: U32::new(LE, st_name),
            st_info: elf::SymbolInfo::new(bind, kind),
            st_other: visibility.into(),
            st_shndx: U16::new(LE, section),
            st_value: U64::new(LE, value),
            st_size: U64::new(LE, size),
        };
        self.symbols.extend_from_slice(bytes_of(&sym));
        index
    }

    /// How many symbols, the null symbol included (the index of the next one).
    pub fn len(&self) -> u32 {
        self.index_base + (self.symbols.len() / SYM_SIZE) as u32
    }

    /// Whether the table holds only the null symbol (a continuing table: no symbol).
    pub fn is_empty(&self) -> bool {
        if self.index_base == 0 {
            self.len() == 1
        } else {
            self.symbols.is_empty()
        }
    }

    /// The symbol entries' bytes.
    pub fn symbols(&self) -> &[u8] {
        &self.symbols
    }

    /// The string table's bytes.
    pub fn strings(&self) -> &[u8] {
        &self.strings
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The name of symbol `index` of `symbols`, from `strings`.
    fn name_of(symbols: &[u8], strings: &[u8], index: usize) -> String {
        let at = index * SYM_SIZE;
        let offset = u32::from_le_bytes(symbols[at..at + 4].try_into().unwrap()) as usize;
        let end = strings[offset..].iter().position(|&b| b == 0).unwrap() + offset;
        String::from_utf8(strings[offset..end].to_vec()).unwrap()
    }

    #[test]
    fn a_continuing_table_is_written_right_after_the_first() {
        let push = |t: &mut SymbolTable, name: &[u8]| {
            t.push(
                name,
                elf::STB_GLOBAL,
                elf::STT_FUNC,
                elf::STV_DEFAULT,
                elf::SymbolSection(1),
                0x1000,
                4,
            )
        };
        let mut first = SymbolTable::with_capacity(2, 16);
        assert_eq!(push(&mut first, b"alpha"), 1);
        assert_eq!(push(&mut first, b"beta"), 2);
        let mut more = SymbolTable::continuing(&first, 1, 8);
        assert!(more.is_empty());
        assert_eq!(push(&mut more, b"gamma"), 3);
        assert_eq!(more.len(), 4);
        assert!(!more.is_empty());
        let symbols = [first.symbols(), more.symbols()].concat();
        let strings = [first.strings(), more.strings()].concat();
        let names: Vec<String> = (1..4).map(|i| name_of(&symbols, &strings, i)).collect();
        assert_eq!(names, ["alpha", "beta", "gamma"]);
    }
}
