//! Bad input gets a typed error naming the object, section and symbol; nothing panics.
//! Objects come from the system C compiler and are then damaged on purpose.

// LinkError is large by design: see kiln-link/src/lib.rs.
#![allow(clippy::result_large_err)]

use kiln_link::{link, ArchiveInput, LinkContext, LinkError, LinkOptions, ObjectInput};
use kiln_memory::{MemoryManager, SlabMemoryManager};
use std::path::PathBuf;
use std::process::Command;

/// Resolves every external name to a fixed address near the code; links only, runs
/// nothing.
struct Ctx;

impl LinkContext for Ctx {
    fn resolve(&mut self, name: &str) -> Option<u64> {
        (!name.starts_with("missing_")).then_some(libc_like_address())
    }
    fn tls_module_id(&mut self) -> Result<u64, String> {
        Ok(1)
    }
}

fn libc_like_address() -> u64 {
    // An address inside this process's libc, so PC-relative references fit.
    let f: extern "C" fn() -> i32 = getpid_wrapper;
    f as *const () as u64
}

extern "C" fn getpid_wrapper() -> i32 {
    7
}

fn manager() -> SlabMemoryManager {
    SlabMemoryManager::new().unwrap()
}

fn compile(name: &str, source: &str) -> Vec<u8> {
    kiln_testkit::cc_object(name, source, &["-O1"])
}

const GOOD: &str = "#include <stdio.h>\nint counter;\nconst char *greeting = \"hi\";\nint work(int x) { counter += x; return printf(\"%s %d\\n\", greeting, counter); }\n";

fn try_link(objects: &[ObjectInput]) -> Result<kiln_link::LinkedModule, LinkError> {
    let m = manager();
    link(
        objects,
        &[],
        &mut Ctx,
        &LinkOptions::new(&m as &dyn MemoryManager),
    )
}

fn u16_at(d: &[u8], o: usize) -> u16 {
    u16::from_le_bytes([d[o], d[o + 1]])
}
fn u32_at(d: &[u8], o: usize) -> u32 {
    u32::from_le_bytes(d[o..o + 4].try_into().unwrap())
}
fn u64_at(d: &[u8], o: usize) -> u64 {
    u64::from_le_bytes(d[o..o + 8].try_into().unwrap())
}

/// (sh_type, sh_offset, sh_size, name) of every section, read by hand from the ELF64
/// headers (the test damages exactly these structures).
fn sections(d: &[u8]) -> Vec<(u32, usize, usize, String)> {
    let shoff = u64_at(d, 0x28) as usize;
    let shentsize = u16_at(d, 0x3a) as usize;
    let shnum = u16_at(d, 0x3c) as usize;
    let shstrndx = u16_at(d, 0x3e) as usize;
    let hdr = |i: usize| shoff + i * shentsize;
    let strtab = u64_at(d, hdr(shstrndx) + 0x18) as usize;
    (0..shnum)
        .map(|i| {
            let h = hdr(i);
            let name_off = strtab + u32_at(d, h) as usize;
            let end = d[name_off..].iter().position(|&b| b == 0).unwrap() + name_off;
            (
                u32_at(d, h + 4),
                u64_at(d, h + 0x18) as usize,
                u64_at(d, h + 0x20) as usize,
                String::from_utf8_lossy(&d[name_off..end]).into_owned(),
            )
        })
        .collect()
}

#[test]
fn the_good_object_links() {
    let good = compile("good", GOOD);
    let module = try_link(&[ObjectInput::new("good.o", good)]).unwrap();
    assert!(module.symbol("work").is_some());
}

#[test]
fn truncated_objects_are_errors_not_panics() {
    let good = compile("good", GOOD);
    for len in (0..good.len()).step_by(7) {
        let r = try_link(&[ObjectInput::new("cut.o", good[..len].to_vec())]);
        match r {
            Err(LinkError::Malformed { object, .. }) => assert_eq!(object, "cut.o"),
            Err(other) => panic!("truncated to {len}: unexpected error {other}"),
            Ok(_) => panic!("truncated to {len} bytes of {} linked", good.len()),
        }
    }
}

#[test]
fn corrupted_objects_never_panic() {
    let good = compile("good", GOOD);
    let mut seed = 0x1234_5678_9abc_def1u64;
    let mut errors = 0;
    for _ in 0..400 {
        let mut bad = good.clone();
        for _ in 0..4 {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            let at = (seed % bad.len() as u64) as usize;
            bad[at] = (seed >> 32) as u8;
        }
        // Either links (the damage hit nothing that matters) or is a typed error.
        if try_link(&[ObjectInput::new("corrupt.o", bad)]).is_err() {
            errors += 1;
        }
    }
    assert!(
        errors > 0,
        "400 corruptions and not one error: the checks do not look"
    );
}

#[test]
fn wrong_architecture_and_wrong_type() {
    let good = compile("good", GOOD);
    let mut arm = good.clone();
    arm[18..20].copy_from_slice(&0xb7u16.to_le_bytes());
    match try_link(&[ObjectInput::new("arm.o", arm)]) {
        Err(e @ LinkError::WrongArchitecture { .. }) => {
            let LinkError::WrongArchitecture {
                object,
                found,
                expected,
            } = &e
            else {
                unreachable!()
            };
            assert_eq!(object, "arm.o");
            assert!(found.contains("AArch64"), "{found}");
            assert_eq!(*expected, kiln_link::Architecture::X86_64);
            assert!(e.to_string().contains("this link is for x86-64"), "{e}");
        }
        other => panic!("{other:?}"),
    }
    let mut exec = good.clone();
    exec[16..18].copy_from_slice(&2u16.to_le_bytes());
    assert!(matches!(
        try_link(&[ObjectInput::new("exec.o", exec)]),
        Err(LinkError::NotRelocatable { e_type: 2, .. })
    ));
    let true_bin = std::fs::read("/bin/true").unwrap();
    assert!(matches!(
        try_link(&[ObjectInput::new("/bin/true", true_bin)]),
        Err(LinkError::NotRelocatable { e_type: 3, .. })
    ));
    assert!(matches!(
        try_link(&[ObjectInput::new("text.o", b"hello, not an object".to_vec())]),
        Err(LinkError::Malformed { .. })
    ));
}

#[test]
fn unknown_relocation_type_names_object_section_offset_and_symbol() {
    let mut obj = compile("good", GOOD);
    let (_, off, _, _) = sections(&obj)
        .into_iter()
        .find(|s| s.3 == ".rela.text")
        .unwrap();
    // r_info = (sym << 32) | type: set the type of the first relocation to 200.
    obj[off + 8..off + 12].copy_from_slice(&200u32.to_le_bytes());
    match try_link(&[ObjectInput::new("reloc.o", obj)]) {
        Err(e @ LinkError::UnknownRelocation { .. }) => {
            let text = e.to_string();
            assert!(
                text.contains("reloc.o") && text.contains(".text") && text.contains("200"),
                "{text}"
            );
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn section_index_out_of_range() {
    let mut obj = compile("good", GOOD);
    let (_, off, size, _) = sections(&obj)
        .into_iter()
        .find(|s| s.3 == ".symtab")
        .unwrap();
    // The last symbol (a global): st_shndx at +6 of the 24-byte entry.
    let last = off + size - 24;
    obj[last + 6..last + 8].copy_from_slice(&999u16.to_le_bytes());
    match try_link(&[ObjectInput::new("shndx.o", obj)]) {
        Err(LinkError::SectionIndexOutOfRange { object, index, .. }) => {
            assert_eq!(object, "shndx.o");
            assert_eq!(index, 999);
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn every_missing_symbol_is_listed_with_its_object() {
    let a = compile(
        "wants_a",
        "int missing_a(void); int fa(void) { return missing_a(); }",
    );
    let b = compile("wants_b", "int missing_b(void); extern int missing_data; int fb(void) { return missing_b() + missing_data; }");
    match try_link(&[ObjectInput::new("a.o", a), ObjectInput::new("b.o", b)]) {
        Err(e @ LinkError::UndefinedSymbols { .. }) => {
            let text = e.to_string();
            assert!(text.contains("3 undefined symbols"), "{text}");
            assert!(text.contains("missing_a (referenced by a.o)"), "{text}");
            assert!(text.contains("missing_b (referenced by b.o)"), "{text}");
            assert!(text.contains("missing_data (referenced by b.o)"), "{text}");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn duplicate_strong_definitions_name_both_objects() {
    let a = compile("dup_a", "int shared_name(void) { return 1; }");
    let b = compile("dup_b", "int shared_name(void) { return 2; }");
    match try_link(&[ObjectInput::new("a.o", a), ObjectInput::new("b.o", b)]) {
        Err(LinkError::DuplicateSymbol {
            symbol,
            first,
            second,
        }) => {
            assert_eq!(
                (symbol.as_str(), first.as_str(), second.as_str()),
                ("shared_name", "a.o", "b.o")
            );
        }
        other => panic!("{other:?}"),
    }
    // Weak + strong is fine: the strong one wins.
    let w = compile(
        "weak",
        "__attribute__((weak)) int shared_name(void) { return 3; }",
    );
    let a = compile("dup_a", "int shared_name(void) { return 1; }");
    assert!(try_link(&[ObjectInput::new("w.o", w), ObjectInput::new("a.o", a)]).is_ok());
}

#[test]
fn out_of_range_target_is_an_error_not_a_truncation() {
    // PC-relative data reference to an address more than 2 GiB away.
    struct Far;
    impl LinkContext for Far {
        fn resolve(&mut self, name: &str) -> Option<u64> {
            Some(if name == "far_away" {
                0x1000
            } else {
                libc_like_address()
            })
        }
        fn tls_module_id(&mut self) -> Result<u64, String> {
            Ok(1)
        }
    }
    let obj = compile(
        "far",
        "extern int far_away; int read_far(void) { return far_away; }",
    );
    let m = manager();
    let r = link(
        &[ObjectInput::new("far.o", obj)],
        &[],
        &mut Far,
        &LinkOptions::new(&m),
    );
    match r {
        Err(e @ LinkError::Overflow { .. }) => {
            let text = e.to_string();
            assert!(
                text.contains("far.o")
                    && text.contains("far_away")
                    && text.contains("R_X86_64_PC32"),
                "{text}"
            );
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn malformed_archive_is_an_error() {
    assert!(matches!(
        ArchiveInput::parse("junk.a", b"!<arch>\nnot really".to_vec()),
        Err(LinkError::Archive { .. })
    ));
    assert!(ArchiveInput::parse("empty.a", b"!<arch>\n".to_vec()).is_ok());
}

fn assemble(name: &str, source: &str) -> Vec<u8> {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("bad-input");
    std::fs::create_dir_all(&dir).unwrap();
    let s = dir.join(format!("{name}.s"));
    let o = dir.join(format!("{name}.o"));
    std::fs::write(&s, source).unwrap();
    let status = Command::new("cc")
        .arg("-c")
        .arg(&s)
        .arg("-o")
        .arg(&o)
        .status()
        .unwrap();
    assert!(status.success());
    std::fs::read(&o).unwrap()
}

#[test]
fn a_tls_block_too_large_to_give_each_thread_is_an_error_not_an_abort() {
    // Found by fuzzing: a 64 GiB .tbss made the linker allocate the whole block up front.
    let bytes = compile(
        "huge_tbss",
        "static __thread char big[1L << 36];\nchar *first(void) { return big; }\n",
    );
    match try_link(&[ObjectInput::new("huge_tbss.o", bytes)]) {
        Err(LinkError::Malformed { object, what }) => {
            assert_eq!(object, "huge_tbss.o");
            assert!(what.contains("thread-local"), "{what}");
        }
        other => panic!("expected a Malformed error, got {other:?}"),
    }
}

#[test]
fn initializer_sections_marked_thread_local_are_an_error_not_a_panic() {
    // Found by fuzzing: .init_array / .ctors with SHF_TLS indexed past the segments.
    for (name, section) in [
        ("tls_init_array", ".init_array,\"awT\",@init_array"),
        ("tls_ctors", ".ctors,\"awT\",@progbits"),
    ] {
        let bytes = assemble(
            name,
            &format!(".text\n.globl f\nf: ret\n.section {section}\n.quad f\n"),
        );
        let object = format!("{name}.o");
        match try_link(&[ObjectInput::new(&object, bytes)]) {
            Err(LinkError::Malformed { object: o, what }) => {
                assert_eq!(o, object);
                assert!(what.contains("SHF_TLS"), "{what}");
            }
            other => panic!("{name}: expected a Malformed error, got {other:?}"),
        }
    }
}
