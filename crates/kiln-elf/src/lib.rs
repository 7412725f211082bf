//! Kiln's one ELF writer.
//!
//! Kiln writes four kinds of ELF file: the small shared objects it hands to the C
//! runtime's loader (exports, a static-TLS block), the call-through stub objects it links,
//! the images `kiln link` writes for disassemblers and debuggers, and (by patching a copy of
//! the input, not by writing headers) the objects given to the GDB JIT interface. The first
//! three are written here, on `object`'s ELF structures ([`object::elf::FileHeader64`],
//! [`object::elf::ProgramHeader64`], [`object::elf::SectionHeader64`],
//! [`object::elf::Sym64`], [`object::elf::Rela64`]), so that what every loadable file must
//! carry is decided in one place:
//!
//! - every `ET_DYN` and `ET_EXEC` file gets a `PT_GNU_STACK` program header without
//!   `PF_X`: without it, glibc makes every thread's stack executable for the rest of the
//!   process when it loads the file;
//! - every `ET_REL` file gets an empty `.note.GNU-stack` section, the relocatable
//!   object's way of saying the same.
//!
//! Why not `object::write::elf::Writer`: its two-phase reserve/write protocol with raw
//! offsets is longer than these files, and its general tables (a hash of every symbol, a
//! sorted, suffix-merged string table) cost ten times the rest of defining a stub. The files
//! here have fixed, small shapes; the writer appends contents, then writes the headers.
//!
//! ```
//! use kiln_elf::{ElfWriter, FileKind, Segment};
//! use object::elf;
//! let mut w = ElfWriter::new(FileKind::Shared, elf::EM_X86_64, 1);
//! let at = w.append(b"data", 8);
//! w.segment(Segment::load(elf::PF_R | elf::PF_W, at, at, 4, 4));
//! let file = w.finish(0);
//! assert_eq!(&file[..4], b"\x7fELF");
//! ```

mod symbol_table;
mod writer;

pub use symbol_table::SymbolTable;
pub use writer::{ElfWriter, FileKind, Section, Segment, EHDR_SIZE, PHDR_SIZE, SYM_SIZE};
