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
        // Locals first (each placed section as `object:section`, then the local
        // symbols), then the globals: written straight into the table, names copied once
        // into its strings (no string per symbol on the way).
        let object_name = |i: usize| self.objects.get(i).map_or("?", |o| o.name.as_str());
        let name_bytes = self
            .sections
            .iter()
            .map(|s| object_name(s.object).len() + 1 + s.name.len())
            .chain(self.symbol_info.iter().map(|s| s.name.len()))
            .chain(extra.iter().map(|e| e.0.len()))
            .sum::<usize>();
        let mut table = SymbolTable::with_capacity(
            self.sections.len() + self.symbol_info.len() + extra.len(),
            name_bytes,
        );
        let kind_of = |kind: SymbolKind| match kind {
            SymbolKind::Function => elf::STT_FUNC,
            SymbolKind::Data => elf::STT_OBJECT,
            SymbolKind::Other => elf::STT_NOTYPE,
        };
        let mut push = |name: &[u8], bind, kind, address: u64, size: u64| {
            let section = elf::SymbolSection(section_of(address));
            table.push(name, bind, kind, elf::STV_DEFAULT, section, address, size);
        };
        let mut name = Vec::new();
        for section in &self.sections {
            name.clear();
            name.extend_from_slice(object_name(section.object).as_bytes());
            name.push(b':');
            name.extend_from_slice(section.name.as_bytes());
            let (address, size) = (section.address, section.size);
            push(&name, elf::STB_LOCAL, elf::STT_SECTION, address, size);
        }
        for global in [false, true] {
            let bind = if global {
                elf::STB_GLOBAL
            } else {
                elf::STB_LOCAL
            };
            for symbol in self.symbol_info.iter().filter(|s| s.global == global) {
                let kind = kind_of(symbol.kind);
                push(
                    symbol.name.as_bytes(),
                    bind,
                    kind,
                    symbol.address,
                    symbol.size,
                );
            }
        }
        for (name, address) in extra {
            push(
                name.as_bytes(),
                elf::STB_GLOBAL,
                elf::STT_NOTYPE,
                *address,
                0,
            );
        }
        let first_global =
            (1 + self.sections.len() + self.symbol_info.iter().filter(|s| !s.global).count())
                as u32;

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
