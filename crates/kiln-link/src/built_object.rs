//! Objects described in memory: a compiler's sections, symbols and relocations handed to
//! the link as they are, with no ELF file written and parsed again.
//!
//! A JIT front end that has its code in hand (Cranelift's `CompiledCode`, an assembler's
//! buffer) builds a [`BuiltObject`] — sections with their bytes, symbols, relocations
//! named by the ELF relocation type of the target — and gives it to the link as an
//! [`ObjectInput`](crate::ObjectInput) ([`ObjectInput::built`](crate::ObjectInput::built)).
//! The link reads it exactly as it reads a parsed object (the same graph, the same
//! passes, the same errors), so everything a `cc -c` object gets — GOT and stubs,
//! veneers, thread-locals, `.eh_frame` registration, removal — a built object gets too.
//!
//! All names, bytes and relocations of an object live in a handful of flat buffers: the
//! number of heap allocations does not grow with the number of sections or symbols.
//!
//! ```
//! use kiln_link::{Architecture, BuiltObject, BuiltSectionKind, SymbolBinding, BuiltSymbolKind};
//! let mut object = BuiltObject::new(Architecture::X86_64);
//! // mov eax, 7; ret
//! let text = object.add_section(".text.seven", BuiltSectionKind::Code, 16, &[0xb8, 7, 0, 0, 0, 0xc3]);
//! object.add_symbol("seven", Some((text, 0, 6)), SymbolBinding::Global, BuiltSymbolKind::Function);
//! let mut input = kiln_link::ObjectInput::built("seven", object).unwrap();
//! input.check(Architecture::X86_64).unwrap();
//! ```

use crate::object_file::{
    Binding, ObjSection, ObjSym, ObjectFile, Rela, SymSection, SHF_ALLOC, SHF_EXECINSTR, SHF_TLS,
    SHF_WRITE, SHT_NOBITS,
};
use crate::Architecture;
use object::elf;
use object::LittleEndian as LE;
use std::ops::Range;

/// The index of a section of a [`BuiltObject`] (as [`BuiltObject::add_section`] returns
/// it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BuiltSection(pub u32);

/// The index of a symbol of a [`BuiltObject`] (as [`BuiltObject::add_symbol`] returns it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BuiltSymbol(pub u32);

/// What a section of a [`BuiltObject`] holds, which decides its segment and permissions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BuiltSectionKind {
    /// Machine code: read and execute.
    Code,
    /// Constants: read only.
    ReadOnly,
    /// Initialized data: read and write.
    Data,
    /// Zero-filled data (no bytes given, only a size): read and write.
    Zeroed,
    /// The initial image of thread-locals (`.tdata`).
    ThreadData,
    /// Zero-filled thread-locals (`.tbss`).
    ThreadZeroed,
}

impl BuiltSectionKind {
    fn header(self) -> (u32, u64) {
        let progbits = elf::SHT_PROGBITS.0;
        match self {
            BuiltSectionKind::Code => (progbits, SHF_ALLOC | SHF_EXECINSTR),
            BuiltSectionKind::ReadOnly => (progbits, SHF_ALLOC),
            BuiltSectionKind::Data => (progbits, SHF_ALLOC | SHF_WRITE),
            BuiltSectionKind::Zeroed => (SHT_NOBITS, SHF_ALLOC | SHF_WRITE),
            BuiltSectionKind::ThreadData => (progbits, SHF_ALLOC | SHF_WRITE | SHF_TLS),
            BuiltSectionKind::ThreadZeroed => (SHT_NOBITS, SHF_ALLOC | SHF_WRITE | SHF_TLS),
        }
    }
}

/// How a symbol of a [`BuiltObject`] binds, as ELF's `STB_*`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SymbolBinding {
    /// Seen only by this object's relocations.
    Local,
    /// Seen by every module of the library (and the library's lookups).
    Global,
    /// Global, but another definition wins; undefined, it is 0 rather than an error.
    Weak,
}

/// What a symbol of a [`BuiltObject`] names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BuiltSymbolKind {
    /// A function (a far call to it may go through a stub).
    Function,
    /// Data.
    Data,
    /// A thread-local (in a [`BuiltSectionKind::ThreadData`] or `ThreadZeroed` section).
    ThreadLocal,
    /// Unknown (an undefined name whose kind the caller does not know).
    Unknown,
}

#[derive(Debug, Clone)]
struct SectionEntry {
    name: Range<u32>,
    sh_type: u32,
    flags: u64,
    align: u64,
    size: u64,
    data: Range<usize>,
}

#[derive(Debug, Clone)]
struct SymbolEntry {
    name: Range<u32>,
    section: SymSection,
    value: u64,
    size: u64,
    binding: Binding,
    kind: u8,
}

/// An object described in memory (see [the module](self)): sections, symbols and
/// relocations, as a compiler has them.
#[derive(Debug, Clone)]
pub struct BuiltObject {
    architecture: Architecture,
    names: Vec<u8>,
    bytes: Vec<u8>,
    sections: Vec<SectionEntry>,
    symbols: Vec<SymbolEntry>,
    /// The relocations, in the order added; grouped by section when sealed.
    relocations: Vec<Rela>,
    /// The section of each relocation (parallel to `relocations`).
    relocated: Vec<u32>,
}

impl BuiltObject {
    /// An empty object for `architecture` (its section 0 and symbol 0 are ELF's null
    /// entries, never returned).
    pub fn new(architecture: Architecture) -> Self {
        Self::with_capacity(architecture, 1, 1, 0, 0)
    }

    /// [`BuiltObject::new`] with room for `sections`, `symbols`, `bytes` of contents and
    /// `relocations` (no reallocation while it is filled within them).
    pub fn with_capacity(
        architecture: Architecture,
        sections: usize,
        symbols: usize,
        bytes: usize,
        relocations: usize,
    ) -> Self {
        let mut object = BuiltObject {
            architecture,
            names: Vec::with_capacity(16 * (sections + symbols)),
            bytes: Vec::with_capacity(bytes),
            sections: Vec::with_capacity(sections + 1),
            symbols: Vec::with_capacity(symbols + 1),
            relocations: Vec::with_capacity(relocations),
            relocated: Vec::with_capacity(relocations),
        };
        object.sections.push(SectionEntry {
            name: 0..0,
            sh_type: elf::SHT_NULL.0,
            flags: 0,
            align: 1,
            size: 0,
            data: 0..0,
        });
        object.symbols.push(SymbolEntry {
            name: 0..0,
            section: SymSection::Undefined,
            value: 0,
            size: 0,
            binding: Binding::Local,
            kind: elf::STT_NOTYPE.0,
        });
        object
    }

    /// The architecture it is built for.
    pub fn architecture(&self) -> Architecture {
        self.architecture
    }

    fn name(&mut self, name: &[u8]) -> Range<u32> {
        let start = self.names.len() as u32;
        self.names.extend_from_slice(name);
        start..self.names.len() as u32
    }

    /// Adds a section holding `bytes` (copied once), aligned to `align` (a power of two;
    /// others are rounded up). For [`BuiltSectionKind::Zeroed`] and `ThreadZeroed` use
    /// [`BuiltObject::add_zeroed_section`].
    pub fn add_section(
        &mut self,
        name: &str,
        kind: BuiltSectionKind,
        align: u64,
        bytes: &[u8],
    ) -> BuiltSection {
        let name = self.name(name.as_bytes());
        let (sh_type, flags) = kind.header();
        let start = self.bytes.len();
        if sh_type != SHT_NOBITS {
            self.bytes.extend_from_slice(bytes);
        }
        self.sections.push(SectionEntry {
            name,
            sh_type,
            flags,
            align: align.max(1).checked_next_power_of_two().unwrap_or(1 << 63),
            size: bytes.len() as u64,
            data: start..self.bytes.len(),
        });
        BuiltSection(self.sections.len() as u32 - 1)
    }

    /// Adds a zero-filled section of `size` bytes ([`BuiltSectionKind::Zeroed`] or
    /// `ThreadZeroed`; another kind gets `size` zero bytes as its contents).
    pub fn add_zeroed_section(
        &mut self,
        name: &str,
        kind: BuiltSectionKind,
        align: u64,
        size: u64,
    ) -> BuiltSection {
        let (sh_type, _) = kind.header();
        if sh_type == SHT_NOBITS {
            let section = self.add_section(name, kind, align, &[]);
            self.sections[section.0 as usize].size = size;
            section
        } else {
            let zeros = vec![0; usize::try_from(size).unwrap_or(0)];
            self.add_section(name, kind, align, &zeros)
        }
    }

    /// Adds a symbol: defined at `(section, offset, size)`, or undefined with `None`
    /// (resolved by the link as a `cc -c` object's undefined names are).
    pub fn add_symbol(
        &mut self,
        name: &str,
        definition: Option<(BuiltSection, u64, u64)>,
        binding: SymbolBinding,
        kind: BuiltSymbolKind,
    ) -> BuiltSymbol {
        let name = self.name(name.as_bytes());
        let (section, value, size) = match definition {
            Some((section, offset, size)) => (SymSection::Section(section.0), offset, size),
            None => (SymSection::Undefined, 0, 0),
        };
        self.symbols.push(SymbolEntry {
            name,
            section,
            value,
            size,
            binding: match binding {
                SymbolBinding::Local => Binding::Local,
                SymbolBinding::Global => Binding::Global,
                SymbolBinding::Weak => Binding::Weak,
            },
            kind: match kind {
                BuiltSymbolKind::Function => elf::STT_FUNC.0,
                BuiltSymbolKind::Data => elf::STT_OBJECT.0,
                BuiltSymbolKind::ThreadLocal => elf::STT_TLS.0,
                BuiltSymbolKind::Unknown => elf::STT_NOTYPE.0,
            },
        });
        BuiltSymbol(self.symbols.len() as u32 - 1)
    }

    /// Adds a local symbol at the absolute address `address` (a definition that lives
    /// elsewhere — another module, the host — whose address the caller knows): a
    /// relocation against it is fixed up to that address, as against a defined name.
    pub fn add_absolute_symbol(
        &mut self,
        name: &str,
        address: u64,
        kind: BuiltSymbolKind,
    ) -> BuiltSymbol {
        let symbol = self.add_symbol(name, None, SymbolBinding::Local, kind);
        let entry = &mut self.symbols[symbol.0 as usize];
        entry.section = SymSection::Absolute;
        entry.value = address;
        symbol
    }

    /// Adds a relocation of `section` at `offset`: ELF relocation type `r_type` of the
    /// object's architecture (`R_X86_64_PLT32`, `R_AARCH64_CALL26`, `R_RISCV_CALL_PLT`…),
    /// against `symbol`, with `addend`. A type the link does not handle is the link's
    /// error, naming it.
    pub fn add_relocation(
        &mut self,
        section: BuiltSection,
        offset: u64,
        r_type: u32,
        symbol: BuiltSymbol,
        addend: i64,
    ) {
        let info = (u64::from(symbol.0) << 32) | u64::from(r_type);
        self.relocated.push(section.0);
        self.relocations.push(Rela {
            r_offset: object::U64::new(LE, offset),
            r_info: object::U64::new(LE, info),
            r_addend: object::I64::new(LE, addend),
        });
    }

    /// The object as an ELF relocatable file (`cc -c`'s kind): the same sections at the
    /// same indexes, its symbols (locals first, as ELF orders them) and its relocations
    /// (`.rela` sections). What a debugger is shown of a built object, and what an object
    /// cache stores: the link of the file is the link of the object.
    ///
    /// ```
    /// use kiln_link::{Architecture, BuiltObject, BuiltSectionKind, BuiltSymbolKind, SymbolBinding};
    /// let mut object = BuiltObject::new(Architecture::X86_64);
    /// let text = object.add_section(".text.seven", BuiltSectionKind::Code, 16, &[0xb8, 7, 0, 0, 0, 0xc3]);
    /// object.add_symbol("seven", Some((text, 0, 6)), SymbolBinding::Global, BuiltSymbolKind::Function);
    /// let elf = object.to_elf();
    /// kiln_link::check_object("seven.o", &elf, Architecture::X86_64).unwrap();
    /// ```
    pub fn to_elf(&self) -> Vec<u8> {
        use kiln_elf::{ElfWriter, FileKind, Section, SymbolTable};
        // Relocations grouped by section, as the `.rela` sections hold them: an object given
        // to `ObjectInput::built` is already (a copy only for one that is not).
        let unsealed;
        let sorted = if self.relocated.is_sorted() {
            self
        } else {
            let mut copy = self.clone();
            copy.seal();
            unsealed = copy;
            &unsealed
        };
        let text = |r: &Range<u32>| &sorted.names[r.start as usize..r.end as usize];
        let mut w = ElfWriter::with_capacity(
            FileKind::Relocatable,
            elf::Machine(self.architecture.elf_machine()),
            0,
            sorted.bytes.len() + 24 * sorted.relocations.len(),
        );
        if self.architecture == Architecture::Riscv64 {
            // The psABI's double-float ABI, as the objects Kiln links are built.
            w.set_flags(elf::EF_RISCV_FLOAT_ABI_DOUBLE.0);
        }
        // The sections, at their indexes.
        for section in sorted.sections.iter().skip(1) {
            let offset = if section.sh_type == SHT_NOBITS {
                w.offset()
            } else {
                w.append(&sorted.bytes[section.data.clone()], section.align)
            };
            let name = String::from_utf8_lossy(text(&section.name));
            w.section(Section::new(
                &name,
                elf::SectionType(section.sh_type),
                elf::SectionFlags(section.flags),
                offset,
                section.size,
                section.align,
            ));
        }
        // Symbols: locals first, then the others (each one's new index kept).
        let mut order: Vec<usize> = (1..sorted.symbols.len()).collect();
        order.sort_by_key(|&i| sorted.symbols[i].binding != Binding::Local);
        let mut index = vec![0u32; sorted.symbols.len()];
        let mut table = SymbolTable::with_capacity(order.len(), sorted.names.len());
        let mut first_global = None;
        for &i in &order {
            let sym = &sorted.symbols[i];
            if sym.binding != Binding::Local && first_global.is_none() {
                first_global = Some(table.len());
            }
            let bind = match sym.binding {
                Binding::Local => elf::STB_LOCAL,
                Binding::Global => elf::STB_GLOBAL,
                Binding::Weak => elf::STB_WEAK,
            };
            let shndx = match sym.section {
                SymSection::Undefined => elf::SHN_UNDEF,
                SymSection::Absolute => elf::SHN_ABS,
                SymSection::Common => elf::SHN_COMMON,
                SymSection::Section(n) => elf::SymbolSection(n as u16),
            };
            index[i] = table.push(
                text(&sym.name),
                bind,
                elf::SymbolType(sym.kind),
                elf::STV_DEFAULT,
                shndx,
                sym.value,
                sym.size,
            );
        }
        let symtab_index = w.next_section_index() + {
            // One `.rela` section per relocated section comes first.
            let mut sections = sorted.relocated.clone();
            sections.dedup();
            sections.len() as u32
        };
        let mut at = 0;
        while let Some(&section) = sorted.relocated.get(at) {
            let run = sorted.relocated[at..]
                .iter()
                .take_while(|&&s| s == section)
                .count();
            let mut relas = Vec::with_capacity(24 * run);
            for rela in &sorted.relocations[at..at + run] {
                let sym = rela.r_sym(LE, false) as usize;
                let r_type = rela.r_type(LE, false);
                let info =
                    (u64::from(index.get(sym).copied().unwrap_or(0)) << 32) | u64::from(r_type.0);
                let out = Rela {
                    r_offset: rela.r_offset,
                    r_info: object::U64::new(LE, info),
                    r_addend: rela.r_addend,
                };
                relas.extend_from_slice(object::pod::bytes_of(&out));
            }
            let offset = w.append(&relas, 8);
            let name = format!(
                ".rela{}",
                String::from_utf8_lossy(text(&sorted.sections[section as usize].name))
            );
            let mut header = Section::new(
                &name,
                elf::SHT_RELA,
                elf::SHF_INFO_LINK,
                offset,
                relas.len() as u64,
                8,
            );
            header.link = symtab_index;
            header.info = section;
            header.entry_size = 24;
            w.section(header);
            at += run;
        }
        let symbols_at = w.append(table.symbols(), 8);
        let strings_at = w.append(table.strings(), 1);
        let mut symtab = Section::new(
            ".symtab",
            elf::SHT_SYMTAB,
            elf::SectionFlags(0),
            symbols_at,
            table.symbols().len() as u64,
            8,
        );
        symtab.link = symtab_index + 1;
        symtab.info = first_global.unwrap_or(table.len());
        symtab.entry_size = 24;
        w.section(symtab);
        w.section(Section::new(
            ".strtab",
            elf::SHT_STRTAB,
            elf::SectionFlags(0),
            strings_at,
            table.strings().len() as u64,
            1,
        ));
        w.finish(0)
    }

    /// Number of sections (without the null one).
    pub fn section_count(&self) -> usize {
        self.sections.len() - 1
    }

    /// Number of symbols (without the null one).
    pub fn symbol_count(&self) -> usize {
        self.symbols.len() - 1
    }

    /// Groups the relocations by section (stable: each section's in the order added).
    pub(crate) fn seal(&mut self) {
        if !self.relocated.is_sorted() {
            let mut order: Vec<usize> = (0..self.relocated.len()).collect();
            order.sort_by_key(|&i| self.relocated[i]);
            self.relocations = order.iter().map(|&i| self.relocations[i]).collect();
            self.relocated = order.iter().map(|&i| self.relocated[i]).collect();
        }
    }

    /// The link's view of it: borrowed, nothing copied.
    pub(crate) fn view<'a>(&'a self, name: &'a str) -> Result<ObjectFile<'a>, crate::LinkError> {
        let text = |r: &Range<u32>| &self.names[r.start as usize..r.end as usize];
        let sections = self
            .sections
            .iter()
            .map(|s| ObjSection {
                name: text(&s.name),
                sh_type: s.sh_type,
                flags: s.flags,
                size: s.size,
                align: s.align,
                info: 0,
                data: &self.bytes[s.data.clone()],
            })
            .collect();
        let count = self.sections.len() as u32;
        let symbols: Vec<ObjSym<'_>> = self
            .symbols
            .iter()
            .map(|s| ObjSym {
                name: text(&s.name),
                value: s.value,
                size: s.size,
                section: s.section,
                binding: s.binding,
                kind: s.kind,
                visibility: elf::STV_DEFAULT.0,
            })
            .collect();
        for s in &symbols {
            if let SymSection::Section(i) = s.section {
                if i >= count {
                    return Err(crate::LinkError::SectionIndexOutOfRange {
                        object: name.to_string(),
                        symbol: String::from_utf8_lossy(s.name).into_owned(),
                        index: i,
                        count: count as usize,
                    });
                }
            }
        }
        let mut relocations: Vec<(u32, std::borrow::Cow<'_, [Rela]>)> = Vec::new();
        let mut at = 0;
        while let Some(&section) = self.relocated.get(at) {
            let run = self.relocated[at..]
                .iter()
                .take_while(|&&s| s == section)
                .count();
            if section == 0 || section >= count {
                return Err(crate::LinkError::Malformed {
                    object: name.to_string(),
                    what: format!("a relocation of section {section} of {count}"),
                });
            }
            let relas = &self.relocations[at..at + run];
            for rela in relas {
                let sym = rela.r_sym(LE, false) as usize;
                if sym >= symbols.len() {
                    return Err(crate::LinkError::BadRelocation {
                        object: name.to_string(),
                        section: String::from_utf8_lossy(text(
                            &self.sections[section as usize].name,
                        ))
                        .into_owned(),
                        offset: rela.r_offset.get(LE),
                        what: format!("symbol index {sym} of {}", symbols.len()),
                    });
                }
            }
            relocations.push((section, std::borrow::Cow::Borrowed(relas)));
            at += run;
        }
        Ok(ObjectFile {
            name: std::borrow::Cow::Borrowed(name),
            sections,
            symbols,
            relocations,
            groups: Vec::new(),
            branch_protected: false,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{LinkError, ObjectInput};

    #[test]
    fn tables_that_do_not_hold_together_are_refused_by_name() {
        let mut object = BuiltObject::new(Architecture::X86_64);
        let text = object.add_section(".text.f", BuiltSectionKind::Code, 16, &[0xc3; 8]);
        object.add_symbol(
            "f",
            Some((text, 0, 8)),
            SymbolBinding::Global,
            BuiltSymbolKind::Function,
        );
        object.add_relocation(text, 0, 4, BuiltSymbol(9), -4);
        match ObjectInput::built("bad relocation", object) {
            Err(LinkError::BadRelocation {
                object, section, ..
            }) => {
                assert_eq!(
                    (object.as_str(), section.as_str()),
                    ("bad relocation", ".text.f")
                );
            }
            other => panic!("{other:?}"),
        }
        let mut object = BuiltObject::new(Architecture::X86_64);
        object.add_symbol(
            "g",
            Some((BuiltSection(7), 0, 1)),
            SymbolBinding::Global,
            BuiltSymbolKind::Data,
        );
        assert!(matches!(
            ObjectInput::built("bad section", object),
            Err(LinkError::SectionIndexOutOfRange { symbol, .. }) if symbol == "g"
        ));
    }

    #[test]
    fn another_architectures_object_is_refused() {
        let object = BuiltObject::new(Architecture::Aarch64);
        let mut input = ObjectInput::built("arm", object).unwrap();
        assert!(matches!(
            input.check(Architecture::X86_64),
            Err(LinkError::WrongArchitecture { .. })
        ));
        assert!(input.check(Architecture::Aarch64).is_ok());
    }

    #[test]
    fn relocations_added_out_of_order_are_grouped_by_section() {
        let mut object = BuiltObject::new(Architecture::X86_64);
        let a = object.add_section(".text.a", BuiltSectionKind::Code, 16, &[0x90; 16]);
        let b = object.add_section(".text.b", BuiltSectionKind::Code, 16, &[0x90; 16]);
        let s = object.add_symbol("x", None, SymbolBinding::Global, BuiltSymbolKind::Function);
        object.add_relocation(b, 1, 4, s, -4);
        object.add_relocation(a, 2, 4, s, -4);
        object.add_relocation(b, 3, 4, s, -4);
        object.seal();
        let view = object.view("o").unwrap();
        let runs: Vec<(u32, Vec<u64>)> = view
            .relocations
            .iter()
            .map(|(s, r)| (*s, r.iter().map(|r| r.r_offset.get(LE)).collect()))
            .collect();
        assert_eq!(runs, vec![(a.0, vec![2]), (b.0, vec![1, 3])]);
    }
}
