//! The signature inside a cached object: a `.note.kiln.signature` section appended to the
//! ELF object (linkers load no note that is not allocated), read back before an object is
//! used.
//!
//! Written by hand: `object`'s writer would rebuild the whole object; appending one
//! section keeps every byte of the compiler's output as it was.

use crate::CacheError;
use object::elf::{FileHeader64, SHT_NOTE};
use object::read::elf::{FileHeader, SectionHeader};
use object::LittleEndian;

const NAME: &[u8] = b".note.kiln.signature";
const SHDR: usize = 64;

fn malformed(what: impl std::fmt::Display) -> CacheError {
    CacheError::Object(format!("cannot add the signature note: {what}"))
}

/// `object` with a note section holding `signature` (an ELF64 little-endian object).
pub(crate) fn embed(object: &[u8], signature: &str) -> Result<Vec<u8>, CacheError> {
    let header = FileHeader64::<LittleEndian>::parse(object).map_err(malformed)?;
    let e = header.endian().map_err(malformed)?;
    let sections = header.sections(e, object).map_err(malformed)?;
    let count = sections.len();
    let strtab_index = header.e_shstrndx(e).0 as usize;
    // Extended numbering (a count or name-table index in section 0) is not rewritten.
    if header.e_shnum(e) == 0
        || header.e_shstrndx(e).0 == object::elf::SHN_XINDEX.0
        || count + 1 >= usize::from(object::elf::SHN_LORESERVE)
    {
        return Err(malformed("too many sections for a 16-bit section count"));
    }
    if count == 0 || strtab_index == 0 || strtab_index >= count {
        return Err(malformed("no section name table"));
    }
    let strtab = sections
        .section(object::SectionIndex(strtab_index))
        .map_err(malformed)?;
    let old_names = strtab.data(e, object).map_err(malformed)?;
    let mut out = object.to_vec();
    let pad = |out: &mut Vec<u8>, align: usize| {
        while !out.len().is_multiple_of(align) {
            out.push(0);
        }
    };
    // The note: namesz, descsz, type, "kiln\0" padded, the signature padded.
    pad(&mut out, 4);
    let note_offset = out.len();
    out.extend_from_slice(&5u32.to_le_bytes());
    out.extend_from_slice(&(signature.len() as u32).to_le_bytes());
    out.extend_from_slice(&1u32.to_le_bytes());
    out.extend_from_slice(b"kiln\0\0\0\0");
    out.extend_from_slice(signature.as_bytes());
    pad(&mut out, 4);
    let note_size = out.len() - note_offset;
    // A new name table: the old one and the note's name.
    let names_offset = out.len();
    out.extend_from_slice(old_names);
    let name_index = old_names.len();
    out.extend_from_slice(NAME);
    out.push(0);
    let names_size = out.len() - names_offset;
    // The section headers: the old ones (the name table's moved), then the note's.
    pad(&mut out, 8);
    let shoff = out.len();
    let old_shoff = header.e_shoff(e) as usize;
    out.extend_from_slice(&object[old_shoff..old_shoff + count * SHDR]);
    let table = shoff + strtab_index * SHDR;
    out[table + 24..table + 32].copy_from_slice(&(names_offset as u64).to_le_bytes());
    out[table + 32..table + 40].copy_from_slice(&(names_size as u64).to_le_bytes());
    let mut note = [0u8; SHDR];
    note[0..4].copy_from_slice(&(name_index as u32).to_le_bytes());
    note[4..8].copy_from_slice(&SHT_NOTE.0.to_le_bytes());
    note[24..32].copy_from_slice(&(note_offset as u64).to_le_bytes());
    note[32..40].copy_from_slice(&(note_size as u64).to_le_bytes());
    note[48..56].copy_from_slice(&4u64.to_le_bytes());
    out.extend_from_slice(&note);
    // The file header: where the headers are, how many.
    out[0x28..0x30].copy_from_slice(&(shoff as u64).to_le_bytes());
    out[0x3c..0x3e].copy_from_slice(&((count + 1) as u16).to_le_bytes());
    Ok(out)
}

/// The signature an object's note holds, if it has one.
pub(crate) fn read(object: &[u8]) -> Option<String> {
    let header = FileHeader64::<LittleEndian>::parse(object).ok()?;
    let e = header.endian().ok()?;
    let sections = header.sections(e, object).ok()?;
    let section = sections
        .iter()
        .find(|s| s.sh_type(e) == SHT_NOTE && sections.section_name(e, s).ok() == Some(NAME))?;
    let data = section.data(e, object).ok()?;
    if data.len() < 20 || &data[12..17] != b"kiln\0" {
        return None;
    }
    let len = u32::from_le_bytes(data[4..8].try_into().ok()?) as usize;
    let text = data.get(20..20 + len)?;
    String::from_utf8(text.to_vec()).ok()
}
