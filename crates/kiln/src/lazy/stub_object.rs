//! The object of a set of call-through stubs (x86-64): written, not compiled, with
//! Kiln's one ELF writer.

/// Which names a stub object carries.
#[derive(Debug, Clone, Copy)]
pub(super) struct Names {
    /// The functions' names, global, at their stubs (the object that is linked).
    pub(super) functions: bool,
    /// A local `NAME.stub` over each stub's bytes (for debuggers and profilers).
    pub(super) stubs: bool,
}

/// The x86-64 stub object for `names`: each stub ([`STUB_SIZE`] bytes) is `endbr64; jmp
/// *slot(%rip)`, and at [`STUB_ENTRY`] its entry `endbr64; push $id; jmp common`; `common`
/// is `jmp *entry(%rip)`; `.data` holds the slots (first pointing at the entries), then the
/// entry's address. Both the stub (called through function pointers) and its entry
/// (reached by `jmp *slot`) are indirect-branch targets, so both start with the landing
/// pad IBT requires; the gaps are `int3`.
///
/// Which names it carries is `names`' choice: the object that is linked has the
/// functions' names, and the local `NAME.stub` symbols only when debuggers or profilers
/// are told of it (10,000 stubs: 10,000 symbols fewer to write and link otherwise); the
/// object shown to them has only the `NAME.stub` symbols, so that `break NAME` finds the
/// body, not the stub.
///
/// Written with Kiln's one ELF writer ([`kiln_elf`]) rather than `object::write`: its
/// general tables (a hash of every symbol, a sorted, suffix-merged string table) cost 2 µs
/// per stub, ten times the rest of defining one; this object has one fixed shape (sections
/// `.text`, `.data`, their `.rela`, `.symtab`, `.strtab`, and the writer's
/// `.note.GNU-stack` and `.shstrtab`).
pub(super) fn stub_object(
    names: &[&str],
    ids: std::ops::Range<u32>,
    entry: u64,
    naming: Names,
) -> Vec<u8> {
    use kiln_elf::{ElfWriter, FileKind, Section, SymbolTable};
    use object::elf;
    let n = names.len();
    let size = STUB_SIZE as usize;
    let common = size * n;
    // .text, its displacements to the slots left 0 (relocated).
    let mut text = vec![0u8; stub_code_size(n)];
    write_stub_code(&mut text, ids.clone(), None);

    // .data: the slots (relocated to the entries), then the entry's address.
    let mut data = vec![0u8; 8 * (n + 1)];
    data[8 * n..].copy_from_slice(&entry.to_le_bytes());
    // Symbols: null, the two section symbols, the locals, then the globals.
    const TEXT: elf::SymbolSection = elf::SymbolSection(1);
    const DATA: elf::SymbolSection = elf::SymbolSection(2);
    let name_bytes = names.iter().map(|n| 2 * n.len() + 5).sum::<usize>() + 32;
    let symbols = 3 + usize::from(naming.functions) * n + usize::from(naming.stubs) * n;
    let mut symtab = SymbolTable::with_capacity(symbols, name_bytes);
    for section in [TEXT, DATA] {
        symtab.push(
            b"",
            elf::STB_LOCAL,
            elf::STT_SECTION,
            elf::STV_DEFAULT,
            section,
            0,
            0,
        );
    }
    let mut stub_name = String::new();
    for (i, name) in names.iter().enumerate().filter(|_| naming.stubs) {
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
    let first_global = symtab.len();
    let slots = slots_symbol(ids.start);
    // Hidden: the module's, not the library's.
    let (bind, kind, visibility) = (elf::STB_GLOBAL, elf::STT_OBJECT, elf::STV_HIDDEN);
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
        // the stub's 32 bytes `NAME.stub`, and the body `NAME`.
        for (i, name) in names.iter().enumerate() {
            let (bind, kind, visibility) = (elf::STB_GLOBAL, elf::STT_FUNC, elf::STV_DEFAULT);
            symtab.push(
                name.as_bytes(),
                bind,
                kind,
                visibility,
                TEXT,
                STUB_SIZE * i as u64,
                0,
            );
        }
    }
    // Relocations against the section symbols (1: .text, 2: .data).
    let rela = |out: &mut Vec<u8>, offset: usize, sym: u64, kind: u32, addend: i64| {
        out.extend_from_slice(&(offset as u64).to_le_bytes());
        out.extend_from_slice(&((sym << 32) | u64::from(kind)).to_le_bytes());
        out.extend_from_slice(&addend.to_le_bytes());
    };
    let mut rela_text = Vec::with_capacity(24 * (n + 1));
    let mut rela_data = Vec::with_capacity(24 * n);
    for i in 0..n {
        let pc32 = elf::R_X86_64_PC32.0;
        rela(&mut rela_text, size * i + 6, 2, pc32, 8 * i as i64 - 4);
        let abs64 = elf::R_X86_64_64.0;
        let entry = (size * i) as i64 + STUB_ENTRY as i64;
        rela(&mut rela_data, 8 * i, 1, abs64, entry);
    }
    let pc32 = elf::R_X86_64_PC32.0;
    rela(&mut rela_text, common + 2, 2, pc32, 8 * n as i64 - 4);

    // The file: header, contents, section headers (1 .text, 2 .data, 3 .rela.text,
    // 4 .rela.data, 5 .symtab, 6 .strtab).
    let bytes = text.len() + data.len() + rela_text.len() + rela_data.len();
    let bytes = bytes + symtab.symbols().len() + symtab.strings().len();
    let mut w = ElfWriter::with_capacity(FileKind::Relocatable, elf::EM_X86_64, 0, bytes);
    let no_flags = elf::SectionFlags(0);
    let at = w.append(&text, 16);
    let flags = elf::SHF_ALLOC | elf::SHF_EXECINSTR;
    w.section(Section::new(
        ".text",
        elf::SHT_PROGBITS,
        flags,
        at,
        text.len() as u64,
        16,
    ));
    let at = w.append(&data, 8);
    let flags = elf::SHF_ALLOC | elf::SHF_WRITE;
    w.section(Section::new(
        ".data",
        elf::SHT_PROGBITS,
        flags,
        at,
        data.len() as u64,
        8,
    ));
    for (name, bytes, target) in [(".rela.text", &rela_text, 1), (".rela.data", &rela_data, 2)] {
        let at = w.append(bytes, 8);
        w.section(Section {
            link: 5,
            info: target,
            entry_size: 24,
            ..Section::new(
                name,
                elf::SHT_RELA,
                elf::SHF_INFO_LINK,
                at,
                bytes.len() as u64,
                8,
            )
        });
    }
    let at = w.append(symtab.symbols(), 8);
    w.section(Section {
        link: 6,
        info: first_global,
        entry_size: kiln_elf::SYM_SIZE as u64,
        ..Section::new(
            ".symtab",
            elf::SHT_SYMTAB,
            no_flags,
            at,
            symtab.symbols().len() as u64,
            8,
        )
    });
    let at = w.append(symtab.strings(), 1);
    let size = symtab.strings().len() as u64;
    w.section(Section::new(
        ".strtab",
        elf::SHT_STRTAB,
        no_flags,
        at,
        size,
        1,
    ));
    w.finish(0)
}

/// The bytes of the code of `n` stubs: the stubs, then `common`'s `jmp *entry(%rip)`.
pub(super) fn stub_code_size(n: usize) -> usize {
    STUB_SIZE as usize * n + 8
}

/// Writes the code of the stubs of `ids` into `text` ([`stub_code_size`] bytes): stub
/// `i` at `STUB_SIZE * i`, `common` after the last. With `slots` (the distance from the
/// code's start to the slots', which the entry's address follows), the displacements to
/// the slots are written too; without, they are 0 (an object's relocations fill them).
pub(super) fn write_stub_code(text: &mut [u8], ids: std::ops::Range<u32>, slots: Option<i64>) {
    const ENDBR64: [u8; 4] = [0xf3, 0x0f, 0x1e, 0xfa];
    const INT3: u8 = 0xcc;
    let size = STUB_SIZE as usize;
    let common = size * ids.len();
    // From the end of an instruction at `end` to slot `i` (the entry's at `n`).
    let displacement =
        |end: usize, i: usize| slots.map_or(0, |s| (s + 8 * i as i64 - end as i64) as i32);
    let n = ids.len();
    for (i, (stub, id)) in text.chunks_exact_mut(size).zip(ids).enumerate() {
        let at = size * i;
        stub[..4].copy_from_slice(&ENDBR64);
        stub[4..6].copy_from_slice(&[0xff, 0x25]); // jmp *slot(%rip)
        stub[6..10].copy_from_slice(&displacement(at + 10, i).to_le_bytes());
        stub[10..16].fill(INT3);
        stub[16..20].copy_from_slice(&ENDBR64);
        stub[20] = 0x68; // push $id
        stub[21..25].copy_from_slice(&id.to_le_bytes());
        stub[25] = 0xe9; // jmp common
        stub[26..30].copy_from_slice(&((common - (at + 30)) as i32).to_le_bytes());
        stub[30..32].fill(INT3);
    }
    let tail = &mut text[common..common + 8];
    tail[..2].copy_from_slice(&[0xff, 0x25]); // jmp *entry(%rip)
    tail[2..6].copy_from_slice(&displacement(common + 6, n).to_le_bytes());
    tail[6..8].fill(INT3);
}

/// Bytes per call-through stub.
pub(super) const STUB_SIZE: u64 = 32;
/// Where a stub's entry (`endbr64; push $id; jmp common`) starts in it.
pub(super) const STUB_ENTRY: u64 = 16;

/// The hidden symbol at the slots of the stubs whose first id is `first`.
pub(super) fn slots_symbol(first: u32) -> String {
    format!("__kiln_stub_slots.{first}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use object::{Object, ObjectSection, ObjectSymbol};

    #[test]
    fn the_stub_object_is_an_elf_object_other_tools_read() {
        for (functions, stubs) in [(true, false), (true, true), (false, true)] {
            let naming = Names { functions, stubs };
            let bytes = stub_object(&["alpha", "beta"], 7..9, 0x1122_3344_5566_7788, naming);
            let file = object::File::parse(&*bytes).expect("parses");
            // A relocatable object says its stack is not executable.
            let stack = file
                .section_by_name(".note.GNU-stack")
                .expect(".note.GNU-stack");
            assert_eq!(stack.size(), 0);
            let text = file.section_by_name(".text").expect(".text");
            assert_eq!(text.size(), 2 * STUB_SIZE + 8);
            let code = text.data().expect("data");
            // Every stub and every entry starts with a landing pad; the second stub's
            // entry pushes its id.
            for at in [0, 16, 32, 48] {
                assert_eq!(&code[at..at + 4], &[0xf3, 0x0f, 0x1e, 0xfa], "at {at}");
            }
            assert_eq!(&code[32 + 20..32 + 25], &[0x68, 8, 0, 0, 0]);
            let names: Vec<String> = file
                .symbols()
                .filter_map(|s| s.name().ok().map(str::to_string))
                .collect();
            assert_eq!(
                names.contains(&"alpha.stub".to_string()),
                stubs,
                "{names:?}"
            );
            assert!(names.contains(&slots_symbol(7)), "{names:?}");
            assert_eq!(names.contains(&"beta".to_string()), functions, "{names:?}");
            let data = file.section_by_name(".data").expect(".data");
            assert_eq!(data.relocations().count(), 2);
            assert_eq!(text.relocations().count(), 3);
            assert_eq!(
                &data.data().expect("data")[16..24],
                &0x1122_3344_5566_7788u64.to_le_bytes()
            );
        }
    }
}
