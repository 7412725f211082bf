//! A linked module written as an ELF executable image: one section and one `PT_LOAD` per
//! segment at its target address, and a symbol table with every symbol and every placed
//! input section, so `objdump -d`, `llvm-objdump` or `gdb` show what Kiln linked where.
//!
//! Written with Kiln's one ELF writer ([`kiln_elf`]), which adds the non-executable
//! `PT_GNU_STACK` every loadable file carries.

use crate::report::PlacedSink;
use crate::{ImageSegment, LinkedModule, SymbolKind};
use kiln_elf::{ElfWriter, FileKind, Section, Segment, SymbolTable};
use kiln_memory::Permission;
use object::elf;
use std::borrow::Cow;

const PAGE: u64 = 4096;

/// The symbol table of [`LinkedModule::image_elf`], made during the link from the graph
/// with [`LinkOptions::keep_image`](crate::LinkOptions::keep_image) (names copied once,
/// from the inputs' bytes, into the table's strings).
#[derive(Debug, Clone)]
pub struct ImageSymbols {
    table: SymbolTable,
    first_global: u32,
}

/// The image's non-empty segments, with their section names.
fn image_segments(image: &[ImageSegment]) -> Vec<(&'static str, &ImageSegment)> {
    ["text", "rodata", "data", "bss"]
        .iter()
        .zip(image)
        .filter(|(_, s)| s.size > 0)
        .map(|(name, s)| (*name, s))
        .collect()
}

/// The index of the image section (one per segment) that holds `address`; `SHN_ABS` for
/// an address outside them.
fn section_of(segments: &[(&'static str, &ImageSegment)], address: u64) -> u16 {
    segments
        .iter()
        .position(|(_, s)| address >= s.address && address < s.address + s.size.max(1))
        .map_or(elf::SHN_ABS.0, |i| i as u16 + 1)
}

fn symbol_type(kind: SymbolKind) -> elf::SymbolType {
    match kind {
        SymbolKind::Function => elf::STT_FUNC,
        SymbolKind::Data => elf::STT_OBJECT,
        SymbolKind::Other => elf::STT_NOTYPE,
    }
}

/// Builds [`ImageSymbols`] from what [`crate::symbols::Linker::visit_placed`] shows:
/// each placed section as a local `object:section` (in order), then the local symbols,
/// then the globals.
pub(crate) struct ImageSink<'s, 'i> {
    segments: Vec<(&'static str, &'i ImageSegment)>,
    table: SymbolTable,
    locals: Vec<(Cow<'s, [u8]>, u64, u64, SymbolKind)>,
    globals: Vec<(Cow<'s, [u8]>, u64, u64, SymbolKind)>,
    name: Vec<u8>,
}

impl<'s, 'i> ImageSink<'s, 'i> {
    /// A sink for an image of `image`'s segments, sized for about `symbols` symbols.
    pub(crate) fn new(image: &'i [ImageSegment], symbols: usize) -> Self {
        ImageSink {
            segments: image_segments(image),
            table: SymbolTable::with_capacity(symbols, symbols * 16),
            locals: Vec::with_capacity(symbols),
            globals: Vec::new(),
            name: Vec::new(),
        }
    }

    /// The table: sections, locals, globals.
    pub(crate) fn finish(self) -> ImageSymbols {
        let ImageSink {
            segments,
            mut table,
            locals,
            globals,
            ..
        } = self;
        let push =
            |table: &mut SymbolTable, list: Vec<(Cow<'s, [u8]>, u64, u64, SymbolKind)>, bind| {
                for (name, address, size, kind) in list {
                    let section = elf::SymbolSection(section_of(&segments, address));
                    let kind = symbol_type(kind);
                    table.push(&name, bind, kind, elf::STV_DEFAULT, section, address, size);
                }
            };
        push(&mut table, locals, elf::STB_LOCAL);
        let first_global = table.len();
        push(&mut table, globals, elf::STB_GLOBAL);
        ImageSymbols {
            table,
            first_global,
        }
    }
}

impl<'s> PlacedSink<'s> for ImageSink<'s, '_> {
    fn section(
        &mut self,
        _: usize,
        _: usize,
        object: &'s str,
        name: &'s [u8],
        address: u64,
        size: u64,
    ) {
        self.name.clear();
        self.name.extend_from_slice(object.as_bytes());
        self.name.push(b':');
        self.name.extend_from_slice(name);
        let section = elf::SymbolSection(section_of(&self.segments, address));
        let (bind, kind) = (elf::STB_LOCAL, elf::STT_SECTION);
        self.table.push(
            &self.name,
            bind,
            kind,
            elf::STV_DEFAULT,
            section,
            address,
            size,
        );
    }
    fn symbol(
        &mut self,
        name: Cow<'s, [u8]>,
        address: u64,
        size: u64,
        kind: SymbolKind,
        global: bool,
    ) {
        let list = if global {
            &mut self.globals
        } else {
            &mut self.locals
        };
        list.push((name, address, size, kind));
    }
}

impl LinkedModule {
    /// The image's symbol table from the link's report ([`LinkedModule::sections`],
    /// [`LinkedModule::symbol_info`]), for a module whose link made none.
    fn symbols_from_report(&self, segments: &[(&'static str, &ImageSegment)]) -> ImageSymbols {
        let object_name = |i: usize| self.objects.get(i).map_or("?", |o| o.name.as_str());
        let name_bytes = self
            .sections
            .iter()
            .map(|s| object_name(s.object).len() + 1 + s.name.len())
            .chain(self.symbol_info.iter().map(|s| s.name.len()))
            .sum::<usize>();
        let mut table =
            SymbolTable::with_capacity(self.sections.len() + self.symbol_info.len(), name_bytes);
        let mut push = |name: &[u8], bind, kind, address: u64, size: u64| {
            let section = elf::SymbolSection(section_of(segments, address));
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
        let mut first_global = 0;
        for global in [false, true] {
            let bind = if global {
                elf::STB_GLOBAL
            } else {
                elf::STB_LOCAL
            };
            for symbol in self.symbol_info.iter().filter(|s| s.global == global) {
                let kind = symbol_type(symbol.kind);
                push(
                    symbol.name.as_bytes(),
                    bind,
                    kind,
                    symbol.address,
                    symbol.size,
                );
            }
            if !global {
                first_global = 1
                    + self.sections.len() as u32
                    + self.symbol_info.iter().filter(|s| !s.global).count() as u32;
            }
        }
        ImageSymbols {
            table,
            first_global,
        }
    }

    /// This module as an ELF executable image (`ET_EXEC`) of its target architecture:
    /// segments at their target addresses, every symbol, and each placed input section
    /// as a local symbol `object:section`. `extra` names further addresses (the host
    /// symbols the link resolved, say). `None` unless the link kept its image
    /// ([`LinkOptions::keep_image`](crate::LinkOptions::keep_image)).
    pub fn image_elf(&self, extra: &[(String, u64)]) -> Option<Vec<u8>> {
        if self.image.is_empty() {
            return None;
        }
        let segments = image_segments(&self.image);
        let reported;
        let symbols = match &self.image_symbols {
            Some(symbols) => symbols,
            None => {
                reported = self.symbols_from_report(&segments);
                &reported
            }
        };
        let (table, first_global) = (&symbols.table, symbols.first_global);
        // The extra names after the table's, without copying it.
        let name_bytes = extra.iter().map(|e| e.0.len()).sum();
        let mut more = SymbolTable::continuing(table, extra.len(), name_bytes);
        for (name, address) in extra {
            let section = elf::SymbolSection(section_of(&segments, *address));
            let (bind, kind) = (elf::STB_GLOBAL, elf::STT_NOTYPE);
            more.push(
                name.as_bytes(),
                bind,
                kind,
                elf::STV_DEFAULT,
                section,
                *address,
                0,
            );
        }
        let symbol_bytes = table.symbols().len() + more.symbols().len();
        let string_bytes = table.strings().len() + more.strings().len();

        // Layout: header, program headers, segment contents (offset ≡ address mod page),
        // symbol table, strings, section headers.
        let contents = segments.iter().map(|(_, s)| s.bytes.len()).sum::<usize>();
        let mut w = ElfWriter::with_capacity(
            FileKind::Executable,
            elf::Machine(self.architecture.elf_machine()),
            segments.len(),
            contents + PAGE as usize * segments.len() + symbol_bytes + string_bytes,
        );
        let mut offsets = Vec::with_capacity(segments.len());
        for (_, s) in &segments {
            let offset = w.offset().next_multiple_of(PAGE) + s.address % PAGE;
            offsets.push(w.append_at(offset, &s.bytes));
        }
        let symtab_offset = w.append(table.symbols(), 8);
        w.append(more.symbols(), 1);
        let strtab_offset = w.append(table.strings(), 1);
        w.append(more.strings(), 1);
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
                symbol_bytes as u64,
                8,
            )
        });
        w.section(Section::new(
            ".strtab",
            elf::SHT_STRTAB,
            elf::SectionFlags(0),
            strtab_offset,
            string_bytes as u64,
            1,
        ));
        let entry = (self.exports.find("main"))
            .and_then(|i| self.exports.get(i))
            .map_or(0, |main| main.address);
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
