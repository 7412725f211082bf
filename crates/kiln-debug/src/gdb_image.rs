//! The in-memory object the GDB JIT interface is given.

use crate::DebugError;
use object::elf::{FileHeader64, SHF_ALLOC, SHN_UNDEF, SHT_SYMTAB, STT_SECTION};
use object::read::elf::{FileHeader, SectionHeader, Sym};
use object::LittleEndian;

/// Offset of `sh_addr` in an `Elf64_Shdr`.
const SH_ADDR: usize = 16;
/// Offset of `st_shndx` in an `Elf64_Sym`.
const ST_SHNDX: usize = 6;
const SHDR_SIZE: usize = 64;
const SYM_SIZE: usize = 24;

/// A copy of the relocatable object `data` for the GDB JIT interface: each section of
/// `placed` (section index, target address) gets that address in its header.
///
/// Symbols defined in allocated sections the link did not place (COMDAT copies another
/// object provided, thread-locals, whose addresses are per thread) become undefined in the
/// copy, so a debugger never sets a breakpoint at a section's address 0. Section symbols
/// stay: the debugger's relocation of the DWARF refers to them (a debug entry of a
/// discarded section then lands at address 0, which debuggers ignore, as a static linker's
/// output has it).
///
/// Only the section headers and the symbol table change; nothing is parsed beyond them.
///
/// ```no_run
/// let object = std::fs::read("f.o")?;
/// // .text (section 1) landed at 0x7f00_0000_1000.
/// let image = kiln_debug::gdb_image("f.o", &object, &[(1, 0x7f00_0000_1000)])?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn gdb_image(name: &str, data: &[u8], placed: &[(usize, u64)]) -> Result<Vec<u8>, DebugError> {
    let malformed = |what: String| DebugError::Malformed {
        object: name.to_string(),
        what,
    };
    let header = FileHeader64::<LittleEndian>::parse(data).map_err(|e| malformed(e.to_string()))?;
    let endian = header.endian().map_err(|e| malformed(e.to_string()))?;
    let sections = header
        .sections(endian, data)
        .map_err(|e| malformed(e.to_string()))?;
    if header.e_shentsize(endian) as usize != SHDR_SIZE && !sections.is_empty() {
        return Err(malformed(format!(
            "section header size {} (expected {SHDR_SIZE})",
            header.e_shentsize(endian)
        )));
    }
    let shoff = header.e_shoff(endian) as usize;
    let mut image = data.to_vec();
    let mut address = vec![None; sections.len()];
    for &(index, target) in placed {
        let slot = address
            .get_mut(index)
            .ok_or_else(|| malformed(format!("placed section {index} does not exist")))?;
        *slot = Some(target);
    }
    let mut unplaced = vec![false; sections.len()];
    for (index, section) in sections.iter().enumerate() {
        match address[index] {
            Some(target) => {
                let at = shoff + index * SHDR_SIZE + SH_ADDR;
                image[at..at + 8].copy_from_slice(&target.to_le_bytes());
            }
            None => {
                unplaced[index] =
                    section.sh_flags(endian).0 & SHF_ALLOC.0 != 0 && section.sh_size(endian) > 0;
            }
        }
    }
    // Symbols of unplaced allocated sections become undefined.
    // An object has one symbol table.
    if let Some(section) = sections.iter().find(|s| s.sh_type(endian) == SHT_SYMTAB) {
        let symbols = sections
            .symbols(endian, data, SHT_SYMTAB)
            .map_err(|e| malformed(e.to_string()))?;
        let base = section.sh_offset(endian) as usize;
        for (i, symbol) in symbols.iter().enumerate() {
            let shndx = symbol.st_shndx(endian).0 as usize;
            if symbol.st_type() != STT_SECTION && shndx < unplaced.len() && unplaced[shndx] {
                let at = base + i * SYM_SIZE + ST_SHNDX;
                image[at..at + 2].copy_from_slice(&SHN_UNDEF.0.to_le_bytes());
            }
        }
    }
    Ok(image)
}

#[cfg(test)]
mod tests {
    use super::*;
    use object::read::elf::ElfFile64;
    use object::write::{Object as WriteObject, Symbol, SymbolSection};
    use object::{Object, ObjectSection, ObjectSymbol, SymbolFlags, SymbolKind, SymbolScope};

    /// An object with `.text` (a function `f`) and `.text.unused` (a function `g`).
    fn object_with_two_sections() -> (Vec<u8>, usize, usize) {
        let mut obj = WriteObject::new(
            object::BinaryFormat::Elf,
            object::Architecture::X86_64,
            object::Endianness::Little,
        );
        let text = obj.section_id(object::write::StandardSection::Text);
        let unused = obj.add_section(
            Vec::new(),
            b".text.unused".to_vec(),
            object::SectionKind::Text,
        );
        for (name, section) in [("f", text), ("g", unused)] {
            let offset = obj.append_section_data(section, &[0xc3; 16], 16);
            obj.add_symbol(Symbol {
                name: name.as_bytes().to_vec(),
                value: offset,
                size: 16,
                kind: SymbolKind::Text,
                scope: SymbolScope::Dynamic,
                weak: false,
                section: SymbolSection::Section(section),
                flags: SymbolFlags::None,
            });
        }
        let bytes = obj.write().unwrap();
        let file = ElfFile64::<LittleEndian>::parse(&*bytes).unwrap();
        let index = |name: &str| file.section_by_name(name).unwrap().index().0;
        let (t, u) = (index(".text"), index(".text.unused"));
        (bytes, t, u)
    }

    #[test]
    fn placed_sections_get_their_addresses_and_unplaced_ones_lose_their_symbols() {
        let (bytes, text, unused) = object_with_two_sections();
        let image = gdb_image("two.o", &bytes, &[(text, 0x7f00_1234_0000)]).unwrap();
        assert_eq!(image.len(), bytes.len(), "nothing added or cut");
        let file = ElfFile64::<LittleEndian>::parse(&*image).unwrap();
        let section = |i: usize| file.section_by_index(object::SectionIndex(i)).unwrap();
        assert_eq!(section(text).address(), 0x7f00_1234_0000);
        assert_eq!(section(unused).address(), 0);
        let f = file.symbols().find(|s| s.name() == Ok("f")).unwrap();
        assert_eq!(f.section_index(), Some(object::SectionIndex(text)));
        let g = file.symbols().find(|s| s.name() == Ok("g")).unwrap();
        assert!(g.is_undefined(), "g's section was not placed");
        // The section contents are the object's.
        assert_eq!(section(text).data().unwrap(), &[0xc3; 16]);
    }

    #[test]
    fn bad_input_is_an_error_naming_the_object() {
        let (bytes, text, _) = object_with_two_sections();
        let err = gdb_image("cut.o", &bytes[..100], &[(text, 0x1000)]).unwrap_err();
        assert!(err.to_string().starts_with("cut.o: "), "{err}");
        let err = gdb_image("two.o", &bytes, &[(999, 0x1000)]).unwrap_err();
        assert!(err.to_string().contains("placed section 999"), "{err}");
        let err = gdb_image("text.o", b"not an object at all, just text", &[]).unwrap_err();
        assert!(err.to_string().starts_with("text.o: "), "{err}");
    }
}
