//! Call-through stubs for every architecture Kiln links for: the code of lazy functions'
//! stubs (`kiln::Jit::add_lazy_functions`), and the relocatable object that holds them.
//!
//! Stub `i` of a batch is [`STUB_SIZE`] bytes: first a jump through its slot (the
//! architecture's range-extension stub, `Arch::write_stub`), then at [`STUB_ENTRY`] its
//! entry (`Arch::write_lazy_entry`), where the slot leads until the function has a body:
//! it puts the stub's id where the executor's lazy entry takes it and branches to the
//! common tail after the last stub, itself a jump through the slot after the last, which
//! holds the executor's lazy entry's address. Both halves are reached by indirect
//! branches, so both start with the landing pad the architecture needs (x86-64 IBT's
//! `endbr64`, AArch64 BTI's `bti c`).
//!
//! | | stub (reached by a call) | entry (id in) | common tail |
//! |---|---|---|---|
//! | x86-64 | `endbr64; jmp *slot(%rip)` | `endbr64; push $id; jmp common` (the stack) | `endbr64; jmp *entry(%rip)` |
//! | AArch64 | `bti c; adrp x16, slot; ldr x16, [x16, :lo12:slot]; br x16` | `bti c; movz/movk x17, #id; b common` (x17) | as a stub |
//! | RISC-V | `auipc t3, %hi(slot); ld t3, %lo(slot)(t3); jr t3; nop` | `lui/addiw t5, id; auipc t3; jr t3` (t5) | as a stub |
//!
//! The slots are 8-byte words in writable data; a stub's slot is only ever changed by one
//! aligned 64-bit store, which the stub's load sees whole on each architecture.

use crate::arch::{Arch, StubTarget};
use crate::Architecture;
use std::ops::Range;

/// Bytes per call-through stub, on every architecture.
pub const STUB_SIZE: u64 = 32;
/// Where a stub's entry (what its slot first points at) starts in it.
pub const STUB_ENTRY: u64 = 16;

/// Which names an object of stubs carries.
#[derive(Debug, Clone, Copy)]
pub struct StubNames {
    /// The functions' names, global, at their stubs (the object that is linked).
    pub functions: bool,
    /// A local `NAME.stub` over each stub's bytes (for debuggers and profilers).
    pub stubs: bool,
}

/// The call-through stubs of one architecture ([`Architecture::call_through`]).
#[derive(Clone, Copy)]
pub struct CallThrough {
    arch: &'static dyn Arch,
}

impl Architecture {
    /// How this architecture's call-through stubs are written.
    ///
    /// ```
    /// use kiln_link::Architecture;
    /// let stubs = Architecture::Riscv64.call_through();
    /// // Two stubs and the common tail.
    /// assert_eq!(stubs.code_size(2), 2 * 32 + 16);
    /// ```
    pub fn call_through(self) -> CallThrough {
        CallThrough { arch: self.arch() }
    }
}

impl std::fmt::Debug for CallThrough {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CallThrough({})", self.arch.architecture())
    }
}

/// The hidden symbol at the slots of the stubs whose first id is `first`.
pub fn slots_symbol(first: u32) -> String {
    format!("__kiln_stub_slots.{first}")
}

/// The local symbol at the common tail of an object of stubs.
const COMMON_SYMBOL: &str = "__kiln_stub_common";

impl CallThrough {
    /// The bytes of the code of `n` stubs: the stubs, then the common tail.
    pub fn code_size(&self, n: usize) -> usize {
        STUB_SIZE as usize * n + self.arch.stub_size() as usize
    }

    /// Writes the code of the stubs of `ids` into `text` ([`CallThrough::code_size`]
    /// bytes): stub `i` at `STUB_SIZE * i`, the common tail after the last. With
    /// `placed`, `(code, slots)`: where `text` runs and where the slots are (stub `i`'s
    /// at `slots + 8 * i`, the entry's address after the last), the references to the
    /// slots are written too; `Err` with a displacement that does not fit. Without, they
    /// are left for the object's relocations ([`CallThrough::object`]).
    pub fn write_code(
        &self,
        text: &mut [u8],
        ids: Range<u32>,
        placed: Option<(u64, u64)>,
    ) -> Result<(), i128> {
        let n = ids.len();
        let common = STUB_SIZE as usize * n;
        let at = |offset: usize, slot: usize| {
            placed.map_or((0, 0), |(code, slots)| {
                (code + offset as u64, slots + 8 * slot as u64)
            })
        };
        for (i, (stub, id)) in text
            .chunks_exact_mut(STUB_SIZE as usize)
            .zip(ids)
            .enumerate()
        {
            let offset = STUB_SIZE as usize * i;
            let (stub_address, slot_address) = at(offset, i);
            let (jump, entry) = stub.split_at_mut(STUB_ENTRY as usize);
            self.arch.write_stub(jump, stub_address, slot_address)?;
            let to_common = common as i64 - (offset as i64 + STUB_ENTRY as i64);
            self.arch.write_lazy_entry(entry, id, to_common);
        }
        let (common_address, entry_slot) = at(common, n);
        let tail = &mut text[common..common + self.arch.stub_size() as usize];
        self.arch.write_stub(tail, common_address, entry_slot)
    }

    /// The relocatable object of the stubs of `names` (ids `ids`): `.text` the code of
    /// [`CallThrough::write_code`], its references to the slots relocated; `.data` the
    /// slots (each relocated to its stub's entry), then `entry`, the executor's lazy
    /// entry's address; the hidden symbol [`slots_symbol`] at the slots.
    ///
    /// Which names it carries is `naming`'s choice: the object that is linked has the
    /// functions' names, and the local `NAME.stub` symbols only when debuggers or
    /// profilers are told of it (10,000 stubs: 10,000 symbols fewer to write and link
    /// otherwise); the object shown to them has only the `NAME.stub` symbols, so that
    /// `break NAME` finds the body, not the stub. A RISC-V `%pcrel_lo` names a label at
    /// its `%pcrel_hi`: a stub's own symbol, and a local one at the common tail.
    ///
    /// Written with Kiln's one ELF writer ([`kiln_elf`]) rather than `object::write`: its
    /// general tables (a hash of every symbol, a sorted, suffix-merged string table) cost
    /// 2 µs per stub, ten times the rest of defining one; this object has one fixed shape
    /// (sections `.text`, `.data`, their `.rela`, `.symtab`, `.strtab`, and the writer's
    /// `.note.GNU-stack` and `.shstrtab`).
    pub fn object(
        &self,
        names: &[&str],
        ids: Range<u32>,
        entry: u64,
        naming: StubNames,
    ) -> Vec<u8> {
        use kiln_elf::{ElfWriter, FileKind, Section, SymbolTable};
        use object::elf;
        let n = names.len();
        let size = STUB_SIZE as usize;
        let common = size * n;
        let mut text = vec![0u8; self.code_size(n)];
        // Not placed: nothing to reach, nothing out of reach.
        let _ = self.write_code(&mut text, ids.clone(), None);

        // .data: the slots (relocated to the entries), then the entry's address.
        let mut data = vec![0u8; 8 * (n + 1)];
        data[8 * n..].copy_from_slice(&entry.to_le_bytes());
        // Symbols: null, the two section symbols, the locals, then the globals. Each stub
        // has a label at its start: `NAME.stub` where the object has those, else `NAME`.
        const TEXT: elf::SymbolSection = elf::SymbolSection(1);
        const DATA: elf::SymbolSection = elf::SymbolSection(2);
        let stubs_named = naming.stubs || !naming.functions;
        let name_bytes = names.iter().map(|n| 2 * n.len() + 5).sum::<usize>() + 64;
        let symbols = 4 + usize::from(naming.functions) * n + usize::from(stubs_named) * n;
        let mut symtab = SymbolTable::with_capacity(symbols, name_bytes);
        for section in [TEXT, DATA] {
            let (bind, kind) = (elf::STB_LOCAL, elf::STT_SECTION);
            symtab.push(b"", bind, kind, elf::STV_DEFAULT, section, 0, 0);
        }
        let mut stub_name = String::new();
        for (i, name) in names.iter().enumerate().filter(|_| stubs_named) {
            stub_name.clear();
            stub_name.push_str(name);
            stub_name.push_str(".stub");
            let at = STUB_SIZE * i as u64;
            let (bind, kind, visibility) = (elf::STB_LOCAL, elf::STT_FUNC, elf::STV_DEFAULT);
            symtab.push(
                stub_name.as_bytes(),
                bind,
                kind,
                visibility,
                TEXT,
                at,
                STUB_SIZE,
            );
        }
        let common_symbol = symtab.len();
        let (bind, kind, visibility) = (elf::STB_LOCAL, elf::STT_FUNC, elf::STV_DEFAULT);
        let common_size = self.arch.stub_size();
        let common_at = common as u64;
        symtab.push(
            COMMON_SYMBOL.as_bytes(),
            bind,
            kind,
            visibility,
            TEXT,
            common_at,
            common_size,
        );
        let first_global = symtab.len();
        // Hidden: the module's, not the library's.
        let (bind, kind, visibility) = (elf::STB_GLOBAL, elf::STT_OBJECT, elf::STV_HIDDEN);
        let slots = slots_symbol(ids.start);
        symtab.push(
            slots.as_bytes(),
            bind,
            kind,
            visibility,
            DATA,
            0,
            8 * n as u64,
        );
        if naming.functions {
            // The name resolves to the stub, but has no size: profilers and debuggers name
            // the stub's bytes `NAME.stub`, and the body `NAME`.
            for (i, name) in names.iter().enumerate() {
                let (bind, kind, visibility) = (elf::STB_GLOBAL, elf::STT_FUNC, elf::STV_DEFAULT);
                let at = STUB_SIZE * i as u64;
                symtab.push(name.as_bytes(), bind, kind, visibility, TEXT, at, 0);
            }
        }
        let label = |i: usize| -> u64 {
            if stubs_named {
                3 + i as u64
            } else {
                u64::from(first_global) + 1 + i as u64
            }
        };
        // Relocations: against the section symbols (1: .text, 2: .data), or a label.
        let rela = |out: &mut Vec<u8>, offset: usize, sym: u64, kind: u32, addend: i64| {
            out.extend_from_slice(&(offset as u64).to_le_bytes());
            out.extend_from_slice(&((sym << 32) | u64::from(kind)).to_le_bytes());
            out.extend_from_slice(&addend.to_le_bytes());
        };
        let per_stub = self.arch.stub_relocations();
        let mut rela_text = Vec::with_capacity(24 * per_stub.len() * (n + 1));
        let mut rela_data = Vec::with_capacity(24 * n);
        let absolute = self.arch.absolute64();
        for i in 0..=n {
            let (at, label) = if i < n {
                (size * i, label(i))
            } else {
                (common, u64::from(common_symbol))
            };
            for r in per_stub {
                let (sym, addend) = match r.target {
                    StubTarget::Slot(addend) => (2, 8 * i as i64 + addend),
                    StubTarget::Start => (label, 0),
                };
                rela(
                    &mut rela_text,
                    at + r.offset as usize,
                    sym,
                    r.r_type,
                    addend,
                );
            }
            if i < n {
                let entry = (size * i) as i64 + STUB_ENTRY as i64;
                rela(&mut rela_data, 8 * i, 1, absolute, entry);
            }
        }

        // The file: header, contents, section headers (1 .text, 2 .data, 3 .rela.text,
        // 4 .rela.data, 5 .symtab, 6 .strtab).
        let bytes = text.len() + data.len() + rela_text.len() + rela_data.len();
        let bytes = bytes + symtab.symbols().len() + symtab.strings().len();
        let machine = elf::Machine(self.arch.architecture().elf_machine());
        let mut w = ElfWriter::with_capacity(FileKind::Relocatable, machine, 0, bytes);
        w.set_flags(self.arch.elf_flags());
        let no_flags = elf::SectionFlags(0);
        let at = w.append(&text, 16);
        let flags = elf::SHF_ALLOC | elf::SHF_EXECINSTR;
        let len = text.len() as u64;
        w.section(Section::new(".text", elf::SHT_PROGBITS, flags, at, len, 16));
        let at = w.append(&data, 8);
        let flags = elf::SHF_ALLOC | elf::SHF_WRITE;
        let len = data.len() as u64;
        w.section(Section::new(".data", elf::SHT_PROGBITS, flags, at, len, 8));
        for (name, bytes, target) in [(".rela.text", &rela_text, 1), (".rela.data", &rela_data, 2)]
        {
            let at = w.append(bytes, 8);
            let len = bytes.len() as u64;
            w.section(Section {
                link: 5,
                info: target,
                entry_size: 24,
                ..Section::new(name, elf::SHT_RELA, elf::SHF_INFO_LINK, at, len, 8)
            });
        }
        let at = w.append(symtab.symbols(), 8);
        let len = symtab.symbols().len() as u64;
        w.section(Section {
            link: 6,
            info: first_global,
            entry_size: kiln_elf::SYM_SIZE as u64,
            ..Section::new(".symtab", elf::SHT_SYMTAB, no_flags, at, len, 8)
        });
        let at = w.append(symtab.strings(), 1);
        let len = symtab.strings().len() as u64;
        w.section(Section::new(
            ".strtab",
            elf::SHT_STRTAB,
            no_flags,
            at,
            len,
            1,
        ));
        w.finish(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use object::{Object, ObjectSection, ObjectSymbol};

    #[test]
    fn the_stub_object_is_an_elf_object_other_tools_read() {
        for arch in [
            Architecture::X86_64,
            Architecture::Aarch64,
            Architecture::Riscv64,
        ] {
            let stubs = arch.call_through();
            for (functions, stubs_named) in [(true, false), (true, true), (false, true)] {
                let naming = StubNames {
                    functions,
                    stubs: stubs_named,
                };
                let entry = 0x1122_3344_5566_7788;
                let bytes = stubs.object(&["alpha", "beta"], 7..9, entry, naming);
                let file = object::File::parse(&*bytes).expect("parses");
                assert_eq!(
                    file.architecture(),
                    match arch {
                        Architecture::X86_64 => object::Architecture::X86_64,
                        Architecture::Aarch64 => object::Architecture::Aarch64,
                        Architecture::Riscv64 => object::Architecture::Riscv64,
                    }
                );
                // Kiln links it (a RISC-V object says LP64D).
                crate::check_object("stubs", &bytes, arch).expect("Kiln reads it");
                // A relocatable object says its stack is not executable.
                let stack = file
                    .section_by_name(".note.GNU-stack")
                    .expect(".note.GNU-stack");
                assert_eq!(stack.size(), 0);
                let text = file.section_by_name(".text").expect(".text");
                assert_eq!(text.size(), stubs.code_size(2) as u64);
                let code = text.data().expect("data");
                match arch {
                    // Every stub and every entry starts with a landing pad; the second
                    // stub's entry pushes its id.
                    Architecture::X86_64 => {
                        for at in [0, 16, 32, 48, 64] {
                            assert_eq!(&code[at..at + 4], &[0xf3, 0x0f, 0x1e, 0xfa], "at {at}");
                        }
                        assert_eq!(&code[32 + 20..32 + 25], &[0x68, 8, 0, 0, 0]);
                    }
                    // `bti c`, then `movz x17, #8` in the second stub's entry.
                    Architecture::Aarch64 => {
                        for at in [0, 16, 32, 48, 64] {
                            assert_eq!(&code[at..at + 4], &0xd503_245fu32.to_le_bytes());
                        }
                        assert_eq!(
                            &code[48 + 4..48 + 8],
                            &(0xd280_0011u32 | 8 << 5).to_le_bytes()
                        );
                    }
                    // `lui t5, 0; addiw t5, t5, 8` in the second stub's entry.
                    Architecture::Riscv64 => {
                        assert_eq!(&code[48..52], &0x0000_0f37u32.to_le_bytes());
                        assert_eq!(&code[52..56], &(0x000f_0f1bu32 | 8 << 20).to_le_bytes());
                    }
                }
                let names: Vec<String> = file
                    .symbols()
                    .filter_map(|s| s.name().ok().map(str::to_string))
                    .collect();
                assert_eq!(
                    names.contains(&"alpha.stub".to_string()),
                    stubs_named,
                    "{names:?}"
                );
                assert!(names.contains(&slots_symbol(7)), "{names:?}");
                assert_eq!(names.contains(&"beta".to_string()), functions, "{names:?}");
                let data = file.section_by_name(".data").expect(".data");
                assert_eq!(data.relocations().count(), 2);
                let per_stub = arch.arch().stub_relocations().len();
                assert_eq!(text.relocations().count(), 3 * per_stub);
                assert_eq!(&data.data().expect("data")[16..24], &entry.to_le_bytes());
            }
        }
    }

    #[test]
    fn placed_stubs_reach_their_slots_or_say_how_far_they_are() {
        for arch in [
            Architecture::X86_64,
            Architecture::Aarch64,
            Architecture::Riscv64,
        ] {
            let stubs = arch.call_through();
            let mut text = vec![0u8; stubs.code_size(3)];
            let near = stubs.write_code(&mut text, 0..3, Some((0x10_0000, 0x20_0000)));
            assert_eq!(near, Ok(()), "{arch}");
            // 8 GiB away: beyond every architecture's reach.
            let far = stubs.write_code(&mut text, 0..3, Some((0x10_0000, 0x2_0010_0000)));
            assert!(far.is_err(), "{arch}");
        }
    }
}
