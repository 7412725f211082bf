//! A linked module written as an ELF executable image: one section and one `PT_LOAD` per
//! segment at its target address, and a symbol table with every symbol and every placed
//! input section, so `objdump -d`, `llvm-objdump` or `gdb` show what Kiln linked where.
//!
//! Written directly rather than with `object::write::elf::Writer`: the file is a header,
//! four program headers, four sections and a symbol table, and the 0.40 writer's
//! two-phase reserve/write protocol with raw offsets is longer than the format itself.

use crate::{ImageSegment, LinkedModule, SymbolKind};
use kiln_memory::Permission;
use object::elf;

const EHDR: u64 = 64;
const PHDR: u64 = 56;
const SHDR: u64 = 64;
const SYM: u64 = 24;
const PAGE: u64 = 4096;

/// A symbol of the image file.
struct FileSymbol {
    name: String,
    address: u64,
    size: u64,
    info: u8,
}

impl LinkedModule {
    /// This module as an ELF executable image (`ET_EXEC`) of its target architecture:
    /// segments at their target addresses, every symbol, and each placed input section
    /// as a local symbol `object:section`. `extra` names further addresses (the host
    /// symbols the link resolved, say). `None` unless the link kept its image
    /// ([`LinkOptions::keep_image`](crate::LinkOptions::keep_image)).
    pub fn image_elf(&self, extra: &[(String, u64)]) -> Option<Vec<u8>> {
        if self.image.is_empty() {
            return None;
        }
        let segments: Vec<(&'static str, &ImageSegment)> = ["text", "rodata", "data", "bss"]
            .iter()
            .zip(&self.image)
            .filter(|(_, s)| s.size > 0)
            .map(|(name, s)| (*name, s))
            .collect();
        let section_of = |address: u64| -> u16 {
            segments
                .iter()
                .position(|(_, s)| address >= s.address && address < s.address + s.size.max(1))
                .map_or(elf::SHN_ABS.0, |i| i as u16 + 1)
        };
        let mut locals = Vec::new();
        let mut globals = Vec::new();
        for section in &self.sections {
            let object = self
                .objects
                .get(section.object)
                .map_or("?", |o| o.name.as_str());
            locals.push(FileSymbol {
                name: format!("{object}:{}", section.name),
                address: section.address,
                size: section.size,
                info: elf::STT_SECTION.0 | (elf::STB_LOCAL.0 << 4),
            });
        }
        for symbol in &self.symbol_info {
            let kind = match symbol.kind {
                SymbolKind::Function => elf::STT_FUNC.0,
                SymbolKind::Data => elf::STT_OBJECT.0,
                SymbolKind::Other => elf::STT_NOTYPE.0,
            };
            let (list, bind) = if symbol.global {
                (&mut globals, elf::STB_GLOBAL.0)
            } else {
                (&mut locals, elf::STB_LOCAL.0)
            };
            list.push(FileSymbol {
                name: symbol.name.clone(),
                address: symbol.address,
                size: symbol.size,
                info: kind | (bind << 4),
            });
        }
        for (name, address) in extra {
            globals.push(FileSymbol {
                name: name.clone(),
                address: *address,
                size: 0,
                info: elf::STT_NOTYPE.0 | (elf::STB_GLOBAL.0 << 4),
            });
        }
        let first_global = locals.len() as u32 + 1;
        let symbols: Vec<FileSymbol> = locals.into_iter().chain(globals).collect();

        // Layout: header, program headers, segment contents (offset ≡ address mod page),
        // symbol table, strings, section headers.
        let phnum = segments.len() as u64;
        let mut offset = EHDR + PHDR * phnum;
        let mut offsets = Vec::new();
        for (_, s) in &segments {
            let misalign = s.address % PAGE;
            offset = offset.next_multiple_of(PAGE) + misalign;
            offsets.push(offset);
            offset += s.bytes.len() as u64;
        }
        let mut strtab =
            Vec::with_capacity(1 + symbols.iter().map(|s| s.name.len() + 1).sum::<usize>());
        strtab.push(0u8);
        let mut name_at = Vec::with_capacity(symbols.len());
        for s in &symbols {
            name_at.push(strtab.len() as u32);
            strtab.extend(s.name.as_bytes());
            strtab.push(0);
        }
        let mut shstrtab = vec![0u8];
        let mut add_name = |name: &str| {
            let at = shstrtab.len() as u32;
            shstrtab.extend(name.as_bytes());
            shstrtab.push(0);
            at
        };
        let section_names: Vec<u32> = segments
            .iter()
            .map(|(name, _)| add_name(&format!(".{name}")))
            .collect();
        let (symtab_name, strtab_name, shstrtab_name) = (
            add_name(".symtab"),
            add_name(".strtab"),
            add_name(".shstrtab"),
        );
        let symtab_offset = offset.next_multiple_of(8);
        let strtab_offset = symtab_offset + SYM * (symbols.len() as u64 + 1);
        let shstrtab_offset = strtab_offset + strtab.len() as u64;
        let shoff = (shstrtab_offset + shstrtab.len() as u64).next_multiple_of(8);
        let shnum = segments.len() as u64 + 4;
        // Written once into a buffer of its final size.
        let mut out = Vec::with_capacity((shoff + SHDR * shnum) as usize);

        let entry = self
            .exports
            .binary_search_by(|e| (*e.name).cmp("main"))
            .map_or(0, |i| self.exports[i].address);
        // ELF header.
        out.extend(b"\x7fELF");
        out.extend([2, 1, 1, 0]); // 64-bit, little-endian, version 1, System V
        out.extend([0u8; 8]);
        put16(&mut out, elf::ET_EXEC.0);
        put16(&mut out, self.architecture.elf_machine());
        put32(&mut out, 1);
        put64(&mut out, entry);
        put64(&mut out, EHDR);
        put64(&mut out, shoff);
        put32(&mut out, 0);
        for v in [EHDR, PHDR, phnum, SHDR, shnum, shnum - 1] {
            put16(&mut out, v as u16);
        }
        // Program headers.
        for ((_, s), &file_offset) in segments.iter().zip(&offsets) {
            put32(&mut out, elf::PT_LOAD.0);
            put32(&mut out, flags(s.permission));
            put64(&mut out, file_offset);
            put64(&mut out, s.address);
            put64(&mut out, s.address);
            put64(&mut out, s.bytes.len() as u64);
            put64(&mut out, s.size);
            put64(&mut out, PAGE);
        }
        for ((_, s), &file_offset) in segments.iter().zip(&offsets) {
            out.resize(file_offset as usize, 0);
            out.extend(&s.bytes);
        }
        out.resize(symtab_offset as usize, 0);
        out.extend([0u8; SYM as usize]);
        for (s, &name) in symbols.iter().zip(&name_at) {
            put32(&mut out, name);
            out.push(s.info);
            out.push(0);
            put16(&mut out, section_of(s.address));
            put64(&mut out, s.address);
            put64(&mut out, s.size);
        }
        out.extend(&strtab);
        out.extend(&shstrtab);
        out.resize(shoff as usize, 0);
        // Section headers: null, one per segment, .symtab, .strtab, .shstrtab.
        out.extend([0u8; SHDR as usize]);
        for (((_, s), &file_offset), &name) in segments.iter().zip(&offsets).zip(&section_names) {
            let (kind, flags) = match s.permission {
                Permission::ReadExecute => {
                    (elf::SHT_PROGBITS.0, elf::SHF_ALLOC.0 | elf::SHF_EXECINSTR.0)
                }
                Permission::Read => (elf::SHT_PROGBITS.0, elf::SHF_ALLOC.0),
                Permission::ReadWrite if s.bytes.is_empty() => {
                    (elf::SHT_NOBITS.0, elf::SHF_ALLOC.0 | elf::SHF_WRITE.0)
                }
                Permission::ReadWrite => (elf::SHT_PROGBITS.0, elf::SHF_ALLOC.0 | elf::SHF_WRITE.0),
            };
            section_header(
                &mut out,
                name,
                kind,
                flags,
                s.address,
                file_offset,
                s.size,
                0,
                0,
                16,
                0,
            );
        }
        let strtab_index = segments.len() as u32 + 2;
        section_header(
            &mut out,
            symtab_name,
            elf::SHT_SYMTAB.0,
            0,
            0,
            symtab_offset,
            SYM * (symbols.len() as u64 + 1),
            strtab_index,
            first_global,
            8,
            SYM,
        );
        section_header(
            &mut out,
            strtab_name,
            elf::SHT_STRTAB.0,
            0,
            0,
            strtab_offset,
            strtab.len() as u64,
            0,
            0,
            1,
            0,
        );
        section_header(
            &mut out,
            shstrtab_name,
            elf::SHT_STRTAB.0,
            0,
            0,
            shstrtab_offset,
            shstrtab.len() as u64,
            0,
            0,
            1,
            0,
        );
        Some(out)
    }
}

fn flags(permission: Permission) -> u32 {
    match permission {
        Permission::ReadExecute => elf::PF_R.0 | elf::PF_X.0,
        Permission::Read => elf::PF_R.0,
        Permission::ReadWrite => elf::PF_R.0 | elf::PF_W.0,
    }
}

#[allow(clippy::too_many_arguments)]
fn section_header(
    out: &mut Vec<u8>,
    name: u32,
    kind: u32,
    flags: u64,
    address: u64,
    offset: u64,
    size: u64,
    link: u32,
    info: u32,
    align: u64,
    entsize: u64,
) {
    put32(out, name);
    put32(out, kind);
    put64(out, flags);
    put64(out, address);
    put64(out, offset);
    put64(out, size);
    put32(out, link);
    put32(out, info);
    put64(out, align);
    put64(out, entsize);
}

fn put16(out: &mut Vec<u8>, v: u16) {
    out.extend(v.to_le_bytes());
}
fn put32(out: &mut Vec<u8>, v: u32) {
    out.extend(v.to_le_bytes());
}
fn put64(out: &mut Vec<u8>, v: u64) {
    out.extend(v.to_le_bytes());
}
