//! The writer: contents appended in file order, headers written at the end.

use object::elf;
use object::endian::{LittleEndian as LE, U16, U32, U64};
use object::pod::bytes_of;

/// Size of an `Elf64_Ehdr`.
pub const EHDR_SIZE: usize = 64;
/// Size of an `Elf64_Phdr`.
pub const PHDR_SIZE: usize = 56;
/// Size of an `Elf64_Shdr`.
const SHDR_SIZE: usize = 64;
/// Size of an `Elf64_Sym`.
pub const SYM_SIZE: usize = 24;

/// What kind of ELF file is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileKind {
    /// `ET_REL`: a relocatable object (gets an empty `.note.GNU-stack` section).
    Relocatable,
    /// `ET_DYN`: a shared object (gets a non-executable `PT_GNU_STACK`).
    Shared,
    /// `ET_EXEC`: an executable image (gets a non-executable `PT_GNU_STACK`).
    Executable,
}

impl FileKind {
    fn loadable(self) -> bool {
        self != FileKind::Relocatable
    }
}

/// A program header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Segment {
    /// `p_type` (`PT_LOAD`, `PT_DYNAMIC`, `PT_TLS`, …).
    pub kind: elf::ProgramType,
    /// `p_flags` (`PF_R | PF_W`, …).
    pub flags: elf::ProgramFlags,
    /// Where its bytes start in the file.
    pub offset: u64,
    /// Its virtual address (`p_vaddr` and `p_paddr`).
    pub address: u64,
    /// How many bytes the file holds.
    pub file_size: u64,
    /// How many bytes it takes in memory (≥ `file_size`; the rest is zero).
    pub memory_size: u64,
    /// Its alignment.
    pub align: u64,
}

impl Segment {
    /// A page-aligned `PT_LOAD`.
    pub fn load(
        flags: elf::ProgramFlags,
        offset: u64,
        address: u64,
        file_size: u64,
        memory_size: u64,
    ) -> Self {
        Segment {
            kind: elf::PT_LOAD,
            flags,
            offset,
            address,
            file_size,
            memory_size,
            align: 0x1000,
        }
    }
}

/// A section header, named.
#[derive(Debug, Clone, Copy)]
pub struct Section<'a> {
    /// Its name (`.text`, …).
    pub name: &'a str,
    /// `sh_type`.
    pub kind: elf::SectionType,
    /// `sh_flags`.
    pub flags: elf::SectionFlags,
    /// `sh_addr`.
    pub address: u64,
    /// Where its bytes start in the file.
    pub offset: u64,
    /// Its size.
    pub size: u64,
    /// `sh_link`.
    pub link: u32,
    /// `sh_info`.
    pub info: u32,
    /// Its alignment.
    pub align: u64,
    /// `sh_entsize`.
    pub entry_size: u64,
}

impl<'a> Section<'a> {
    /// A section of `kind` with `flags` at `offset`, `size` bytes, aligned to `align`;
    /// the other fields zero.
    pub fn new(
        name: &'a str,
        kind: elf::SectionType,
        flags: elf::SectionFlags,
        offset: u64,
        size: u64,
        align: u64,
    ) -> Self {
        Section {
            name,
            kind,
            flags,
            address: 0,
            offset,
            size,
            link: 0,
            info: 0,
            align,
            entry_size: 0,
        }
    }
}

/// A little-endian ELF64 file under construction: the header and the program headers'
/// room come first, then the contents the caller appends, then the section headers, which
/// [`ElfWriter::finish`] writes along with the file header and the program headers.
#[derive(Debug)]
pub struct ElfWriter {
    kind: FileKind,
    machine: elf::Machine,
    flags: u32,
    out: Vec<u8>,
    room: usize,
    segments: Vec<elf::ProgramHeader64<LE>>,
    sections: Vec<elf::SectionHeader64<LE>>,
    section_names: Vec<u8>,
}

impl ElfWriter {
    /// A file of `kind` for `machine` (`EM_X86_64`, `EM_AARCH64`, …) with room for
    /// `segments` program headers (the `PT_GNU_STACK` of a loadable file comes on top).
    pub fn new(kind: FileKind, machine: elf::Machine, segments: usize) -> Self {
        Self::with_capacity(kind, machine, segments, 0)
    }

    /// As [`ElfWriter::new`], with room for `bytes` bytes of contents.
    pub fn with_capacity(
        kind: FileKind,
        machine: elf::Machine,
        segments: usize,
        bytes: usize,
    ) -> Self {
        let room = segments + usize::from(kind.loadable());
        let header = EHDR_SIZE + PHDR_SIZE * room;
        let mut out = Vec::with_capacity(header + bytes + 16 * SHDR_SIZE);
        out.resize(header, 0);
        ElfWriter {
            kind,
            machine,
            flags: 0,
            out,
            room,
            segments: Vec::with_capacity(room),
            sections: Vec::new(),
            section_names: vec![0],
        }
    }

    /// Sets the file header's `e_flags` (0 unless set: RISC-V's ABI, for one).
    pub fn set_flags(&mut self, flags: u32) {
        self.flags = flags;
    }

    /// The offset the next byte goes to.
    pub fn offset(&self) -> u64 {
        self.out.len() as u64
    }

    /// Pads with zeros to a multiple of `align` and returns the offset.
    pub fn pad_to(&mut self, align: u64) -> u64 {
        let len = self.out.len().next_multiple_of(align.max(1) as usize);
        self.out.resize(len, 0);
        len as u64
    }

    /// Appends `bytes` at the next multiple of `align`; returns where they start.
    pub fn append(&mut self, bytes: &[u8], align: u64) -> u64 {
        let at = self.pad_to(align);
        self.out.extend_from_slice(bytes);
        at
    }

    /// Appends `bytes` at `offset`, which must not be behind [`ElfWriter::offset`]
    /// (a segment whose offset must be congruent to its address modulo the page size).
    pub fn append_at(&mut self, offset: u64, bytes: &[u8]) -> u64 {
        assert!(
            offset >= self.offset(),
            "append_at({offset}) behind the end"
        );
        self.out.resize(offset as usize, 0);
        self.out.extend_from_slice(bytes);
        offset
    }

    /// The contents written so far (to patch a value whose place was reserved).
    pub fn contents_mut(&mut self) -> &mut [u8] {
        &mut self.out
    }

    /// Adds a program header. At most as many as [`ElfWriter::new`] made room for.
    pub fn segment(&mut self, s: Segment) {
        assert!(
            self.segments.len() + usize::from(self.kind.loadable()) < self.room,
            "more program headers than ElfWriter::new made room for"
        );
        self.segments.push(elf::ProgramHeader64 {
            p_type: U32::new(LE, s.kind),
            p_flags: U32::new(LE, s.flags),
            p_offset: U64::new(LE, s.offset),
            p_vaddr: U64::new(LE, s.address),
            p_paddr: U64::new(LE, s.address),
            p_filesz: U64::new(LE, s.file_size),
            p_memsz: U64::new(LE, s.memory_size),
            p_align: U64::new(LE, s.align),
        });
    }

    /// The index the next section gets (the null section is 0).
    pub fn next_section_index(&self) -> u32 {
        self.sections.len() as u32 + 1
    }

    /// Adds a section header; returns its index.
    pub fn section(&mut self, s: Section<'_>) -> u32 {
        let name = self.section_names.len() as u32;
        self.section_names.extend_from_slice(s.name.as_bytes());
        self.section_names.push(0);
        self.sections.push(elf::SectionHeader64 {
            sh_name: U32::new(LE, name),
            sh_type: U32::new(LE, s.kind),
            sh_flags: U64::new(LE, s.flags),
            sh_addr: U64::new(LE, s.address),
            sh_offset: U64::new(LE, s.offset),
            sh_size: U64::new(LE, s.size),
            sh_link: U32::new(LE, s.link),
            sh_info: U32::new(LE, s.info),
            sh_addralign: U64::new(LE, s.align),
            sh_entsize: U64::new(LE, s.entry_size),
        });
        self.next_section_index() - 1
    }

    /// Writes the section headers (with `.note.GNU-stack` for a relocatable object and
    /// `.shstrtab` when there are sections), the program headers (with `PT_GNU_STACK`,
    /// `PF_R | PF_W`, for a loadable file) and the file header; returns the file.
    pub fn finish(mut self, entry: u64) -> Vec<u8> {
        if self.kind == FileKind::Relocatable {
            let at = self.offset();
            self.section(Section::new(
                ".note.GNU-stack",
                elf::SHT_PROGBITS,
                elf::SectionFlags(0),
                at,
                0,
                1,
            ));
        }
        let (shoff, shnum, shstrndx) = if self.sections.is_empty() {
            (0, 0, 0)
        } else {
            let at = self.offset();
            let size = self.section_names.len() as u64 + ".shstrtab\0".len() as u64;
            let index = self.section(Section::new(
                ".shstrtab",
                elf::SHT_STRTAB,
                elf::SectionFlags(0),
                at,
                size,
                1,
            ));
            let names = std::mem::take(&mut self.section_names);
            self.out.extend_from_slice(&names);
            let shoff = self.pad_to(8);
            self.out.extend_from_slice(&[0u8; SHDR_SIZE]);
            for header in &self.sections {
                self.out.extend_from_slice(bytes_of(header));
            }
            (shoff, self.sections.len() + 1, index)
        };
        if self.kind.loadable() {
            self.segments.push(elf::ProgramHeader64 {
                p_type: U32::new(LE, elf::PT_GNU_STACK),
                p_flags: U32::new(LE, elf::PF_R | elf::PF_W),
                p_offset: U64::new(LE, 0),
                p_vaddr: U64::new(LE, 0),
                p_paddr: U64::new(LE, 0),
                p_filesz: U64::new(LE, 0),
                p_memsz: U64::new(LE, 0),
                p_align: U64::new(LE, 16),
            });
        }
        let kind = match self.kind {
            FileKind::Relocatable => elf::ET_REL,
            FileKind::Shared => elf::ET_DYN,
            FileKind::Executable => elf::ET_EXEC,
        };
        let phnum = self.segments.len();
        let header = elf::FileHeader64::<LE> {
            e_ident: elf::Ident {
                magic: elf::ELFMAG,
                class: elf::ELFCLASS64,
                data: elf::ELFDATA2LSB,
                version: elf::EV_CURRENT,
                os_abi: elf::ELFOSABI_SYSV,
                abi_version: 0,
                padding: [0; 7],
            },
            e_type: U16::new(LE, kind),
            e_machine: U16::new(LE, self.machine),
            e_version: U32::new(LE, u32::from(elf::EV_CURRENT.0)),
            e_entry: U64::new(LE, entry),
            e_phoff: U64::new(LE, if phnum == 0 { 0 } else { EHDR_SIZE as u64 }),
            e_shoff: U64::new(LE, shoff),
            e_flags: U32::new(LE, elf::FileFlags(self.flags)),
            e_ehsize: U16::new(LE, EHDR_SIZE as u16),
            e_phentsize: U16::new(LE, if phnum == 0 { 0 } else { PHDR_SIZE as u16 }),
            e_phnum: U16::new(LE, phnum as u16),
            e_shentsize: U16::new(LE, if shnum == 0 { 0 } else { SHDR_SIZE as u16 }),
            e_shnum: U16::new(LE, shnum as u16),
            e_shstrndx: U16::new(LE, elf::SymbolSection(shstrndx as u16)),
        };
        self.out[..EHDR_SIZE].copy_from_slice(bytes_of(&header));
        for (i, ph) in self.segments.iter().enumerate() {
            let at = EHDR_SIZE + i * PHDR_SIZE;
            self.out[at..at + PHDR_SIZE].copy_from_slice(bytes_of(ph));
        }
        self.out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use object::read::elf::{ElfFile64, FileHeader, ProgramHeader};
    use object::{Object, ObjectSection};

    fn stack_headers(file: &[u8]) -> Vec<elf::ProgramFlags> {
        let header = elf::FileHeader64::<LE>::parse(file).expect("header");
        header
            .program_headers(LE, file)
            .expect("program headers")
            .iter()
            .filter(|p| p.p_type(LE) == elf::PT_GNU_STACK)
            .map(|p| p.p_flags(LE))
            .collect()
    }

    #[test]
    fn loadable_files_carry_a_non_executable_stack_header() {
        for kind in [FileKind::Shared, FileKind::Executable] {
            let mut w = ElfWriter::new(kind, elf::EM_X86_64, 1);
            let at = w.append(&[1, 2, 3, 4], 8);
            w.segment(Segment::load(elf::PF_R, at, at, 4, 4));
            let file = w.finish(0);
            assert_eq!(
                stack_headers(&file),
                vec![elf::PF_R | elf::PF_W],
                "{kind:?}"
            );
        }
    }

    #[test]
    fn relocatable_objects_carry_a_gnu_stack_note_and_parse() {
        let mut w = ElfWriter::new(FileKind::Relocatable, elf::EM_AARCH64, 0);
        let at = w.append(&[0xc0, 0x03, 0x5f, 0xd6], 16);
        let text = w.section(Section::new(
            ".text",
            elf::SHT_PROGBITS,
            elf::SHF_ALLOC | elf::SHF_EXECINSTR,
            at,
            4,
            16,
        ));
        assert_eq!(text, 1);
        let file = w.finish(0);
        let parsed = ElfFile64::<LE>::parse(&*file).expect("parses");
        let names: Vec<&str> = parsed.sections().filter_map(|s| s.name().ok()).collect();
        assert_eq!(names, [".text", ".note.GNU-stack", ".shstrtab"]);
        let text = parsed.section_by_name(".text").expect(".text");
        assert_eq!(text.data().expect("data"), [0xc0, 0x03, 0x5f, 0xd6]);
        assert!(stack_headers(&file).is_empty());
    }

    #[test]
    #[should_panic(expected = "more program headers")]
    fn more_segments_than_room_is_a_programming_error() {
        let mut w = ElfWriter::new(FileKind::Shared, elf::EM_X86_64, 0);
        w.segment(Segment::load(elf::PF_R, 0, 0, 0, 0));
    }
}
