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
}

impl SymbolTable {
    /// An empty table (the null symbol only) with room for `symbols` symbols whose names
    /// take `name_bytes` bytes.
    pub fn with_capacity(symbols: usize, name_bytes: usize) -> Self {
        let mut table = SymbolTable {
            symbols: Vec::with_capacity(SYM_SIZE * (symbols + 1)),
            strings: Vec::with_capacity(name_bytes + symbols + 1),
        };
        table.symbols.extend_from_slice(&[0u8; SYM_SIZE]);
        table.strings.push(0);
        table
    }

    /// Adds `name` to the string table only (a `DT_SONAME`, say) and returns its offset.
    pub fn add_string(&mut self, name: &[u8]) -> u32 {
        if name.is_empty() {
            return 0;
        }
        let offset = self.strings.len() as u32;
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
        (self.symbols.len() / SYM_SIZE) as u32
    }

    /// Whether the table holds only the null symbol.
    pub fn is_empty(&self) -> bool {
        self.len() == 1
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
