//! A linked module written as an ELF executable image: one section and one `PT_LOAD` per
//! segment at its target address, and a symbol table with every symbol and every placed
//! input section, so `objdump -d`, `llvm-objdump` or `gdb` show what Kiln linked where.
//!
//! Written with Kiln's one ELF writer ([`kiln_elf`]), which adds the non-executable
//! `PT_GNU_STACK` every loadable file carries.

use crate::{ImageSegment, LinkedModule, SymbolKind};
use kiln_elf::{ElfWriter, FileKind, Section, Segment, SymbolTable};
use kiln_memory::Permission;
use object::elf;

const PAGE: u64 = 4096;

/// A symbol of the image file.
struct FileSymbol {
    name: String,
    address: u64,
    size: u64,
    kind: elf::SymbolType,
    bind: elf::SymbolBind,
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
                kind: elf::STT_SECTION,
                bind: elf::STB_LOCAL,
            });
        }
        for symbol in &self.symbol_info {
            let kind = match symbol.kind {
                SymbolKind::Function => elf::STT_FUNC,
                SymbolKind::Data => elf::STT_OBJECT,
                SymbolKind::Other => elf::STT_NOTYPE,
            };
            let (list, bind) = if symbol.global {
                (&mut globals, elf::STB_GLOBAL)
            } else {
                (&mut locals, elf::STB_LOCAL)
            };
            list.push(FileSymbol {
                name: symbol.name.clone(),
                address: symbol.address,
                size: symbol.size,
                kind,
                bind,
            });
        }
        for (name, address) in extra {
            globals.push(FileSymbol {
                name: name.clone(),
                address: *address,
                size: 0,
                kind: elf::STT_NOTYPE,
                bind: elf::STB_GLOBAL,
            });
        }
        let first_global = locals.len() as u32 + 1;
        let symbols: Vec<FileSymbol> = locals.into_iter().chain(globals).collect();

        let name_bytes = symbols.iter().map(|s| s.name.len()).sum::<usize>();
        let mut table = SymbolTable::with_capacity(symbols.len(), name_bytes);
        for s in &symbols {
            let section = elf::SymbolSection(section_of(s.address));
            table.push(
                s.name.as_bytes(),
                s.bind,
                s.kind,
                elf::STV_DEFAULT,
                section,
                s.address,
                s.size,
            );
        }

        // Layout: header, program headers, segment contents (offset ≡ address mod page),
        // symbol table, strings, section headers.
        let contents = segments.iter().map(|(_, s)| s.bytes.len()).sum::<usize>();
        let mut w = ElfWriter::with_capacity(
            FileKind::Executable,
            elf::Machine(self.architecture.elf_machine()),
            segments.len(),
            contents + PAGE as usize * segments.len() + table.symbols().len(),
        );
        let mut offsets = Vec::with_capacity(segments.len());
        for (_, s) in &segments {
            let offset = w.offset().next_multiple_of(PAGE) + s.address % PAGE;
            offsets.push(w.append_at(offset, &s.bytes));
        }
        let symtab_offset = w.append(table.symbols(), 8);
        let strtab_offset = w.append(table.strings(), 1);
        for ((name, s), &file_offset) in segments.iter().zip(&offsets) {
            w.segment(Segment::load(
                flags(s.permission),
                file_offset,
                s.address,
                s.bytes.len() as u64,
                s.size,
            ));
            let (kind, flags) = match s.permission {
                Permission::ReadExecute => (elf::SHT_PROGBITS, elf::SHF_ALLOC | elf::SHF_EXECINSTR),
                Permission::Read => (elf::SHT_PROGBITS, elf::SHF_ALLOC),
                Permission::ReadWrite if s.bytes.is_empty() => {
                    (elf::SHT_NOBITS, elf::SHF_ALLOC | elf::SHF_WRITE)
                }
                Permission::ReadWrite => (elf::SHT_PROGBITS, elf::SHF_ALLOC | elf::SHF_WRITE),
            };
            w.section(Section {
                address: s.address,
                ..Section::new(&format!(".{name}"), kind, flags, file_offset, s.size, 16)
            });
        }
        let strtab_index = w.next_section_index() + 1;
        w.section(Section {
            link: strtab_index,
            info: first_global,
            entry_size: kiln_elf::SYM_SIZE as u64,
            ..Section::new(
                ".symtab",
                elf::SHT_SYMTAB,
                elf::SectionFlags(0),
                symtab_offset,
                table.symbols().len() as u64,
                8,
            )
        });
        w.section(Section::new(
            ".strtab",
            elf::SHT_STRTAB,
            elf::SectionFlags(0),
            strtab_offset,
            table.strings().len() as u64,
            1,
        ));
        let entry = self
            .exports
            .binary_search_by(|e| (*e.name).cmp("main"))
            .map_or(0, |i| self.exports[i].address);
        Some(w.finish(entry))
    }
}

fn flags(permission: Permission) -> elf::ProgramFlags {
    match permission {
        Permission::ReadExecute => elf::PF_R | elf::PF_X,
        Permission::Read => elf::PF_R,
        Permission::ReadWrite => elf::PF_R | elf::PF_W,
    }
}
