//! The global names an object defines and the names it leaves undefined, read from its
//! symbol table alone: what a lazy library needs to know of an object before linking it.

use crate::object_file::check_header;
use crate::{Architecture, LinkError};
use object::elf;
use object::read::elf::{FileHeader, Sym as _};
use object::LittleEndian as LE;

/// What an object's symbol table says, without its sections being read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ObjectSymbols {
    /// Global names it defines (in a section, absolute or common).
    pub defined: Vec<Box<str>>,
    /// Weak names it defines (another definition may take their place).
    pub weak: Vec<Box<str>>,
    /// Global and weak names it refers to and does not define.
    pub undefined: Vec<Box<str>>,
    /// Of the names it defines (global or weak), the functions (`STT_FUNC`, not indirect
    /// ones) of default or protected visibility: what a link that routes calls through
    /// stubs routes ([`crate::LinkContext::called_through`]).
    pub functions: Vec<Box<str>>,
}

/// Reads the symbol table of `data` (an ELF relocatable object for `architecture`). The
/// sections and relocations are not checked: a malformed one is reported when the object
/// is linked.
pub fn scan_symbols(
    name: &str,
    data: &[u8],
    architecture: Architecture,
) -> Result<ObjectSymbols, LinkError> {
    let malformed = |what: String| LinkError::Malformed {
        object: name.to_string(),
        what,
    };
    if crate::coff::is_coff(data) {
        return scan_coff(name, data, architecture);
    }
    check_header(name, data, architecture)?;
    let header = elf::FileHeader64::<LE>::parse(data).map_err(|e| malformed(e.to_string()))?;
    let endian = header.endian().map_err(|e| malformed(e.to_string()))?;
    let sections = header
        .sections(endian, data)
        .map_err(|e| malformed(e.to_string()))?;
    let symbols = sections
        .symbols(endian, data, elf::SHT_SYMTAB)
        .map_err(|e| malformed(format!("symbol table: {e}")))?;
    let mut out = ObjectSymbols::default();
    for (index, sym) in symbols.iter().enumerate().skip(1) {
        let binding = sym.st_bind();
        if binding != elf::STB_GLOBAL && binding != elf::STB_WEAK {
            continue;
        }
        let sym_name = symbols
            .symbol_name(endian, sym)
            .map_err(|e| malformed(format!("symbol {index}: {e}")))?;
        if sym_name.is_empty() {
            continue;
        }
        let sym_name: Box<str> = String::from_utf8_lossy(sym_name).into();
        if sym.st_shndx(endian) == elf::SHN_UNDEF {
            out.undefined.push(sym_name);
            continue;
        }
        let visibility = sym.st_visibility();
        if sym.st_type() == elf::STT_FUNC
            && (visibility == elf::STV_DEFAULT || visibility == elf::STV_PROTECTED)
        {
            out.functions.push(sym_name.clone());
        }
        if binding == elf::STB_WEAK {
            out.weak.push(sym_name);
        } else {
            out.defined.push(sym_name);
        }
    }
    Ok(out)
}

/// [`scan_symbols`] of a COFF object: read as the link reads it.
fn scan_coff(
    name: &str,
    data: &[u8],
    architecture: Architecture,
) -> Result<ObjectSymbols, LinkError> {
    use crate::object_file::{Binding, ObjectFile, SymSection};
    let obj = ObjectFile::parse(name, data, architecture)?;
    let mut out = ObjectSymbols::default();
    for sym in obj.symbols.iter().skip(1) {
        if sym.binding == Binding::Local || sym.name.is_empty() {
            continue;
        }
        let sym_name: Box<str> = String::from_utf8_lossy(sym.name).into();
        if sym.section == SymSection::Undefined {
            out.undefined.push(sym_name);
            continue;
        }
        if sym.is_func() {
            out.functions.push(sym_name.clone());
        }
        if sym.binding == Binding::Weak {
            out.weak.push(sym_name);
        } else {
            out.defined.push(sym_name);
        }
    }
    Ok(out)
}
