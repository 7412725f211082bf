//! COFF x86-64 objects — from `clang-16 --target=x86_64-w64-windows-gnu -c` and
//! `x86_64-w64-mingw32-gcc -c` — linked in this process and their functions called with
//! the Windows x64 calling convention (`extern "win64"`), which Rust speaks on Linux: every
//! relocation kind the compilers emit for code and data, `dllimport` references through
//! the GOT, calls to host functions, COMDAT, weak externals, constructors and the unwind
//! table (`.pdata`). Bad COFF input gets typed errors. (The same objects run on the
//! Windows executor under Wine in kiln-cli's `windows_executor` tests.)
//! `KILN_TEST_SKIP_CROSS=1` skips them.

// LinkError is large by design: see kiln-link/src/lib.rs.
#![allow(clippy::result_large_err)]

use kiln_link::{link, LinkContext, LinkError, LinkOptions, LinkedModule, ObjectInput};
use kiln_memory::{MemoryManager, SlabMemoryManager};

const CLANG: &str = "clang-16 --target=x86_64-w64-windows-gnu";
const MINGW: &str = "x86_64-w64-mingw32-gcc";

/// What the JIT code imports: `host_scale` through `__imp_host_scale` (a `dllimport`),
/// `host_offset` by a direct call.
extern "win64" fn host_scale(x: i32) -> i32 {
    x * 10
}
extern "win64" fn host_offset(x: i32) -> i32 {
    x + 7
}

extern "win64" fn host_hook() -> i32 {
    77
}

struct Host;

impl LinkContext for Host {
    fn resolve(&mut self, name: &str) -> Option<u64> {
        match name {
            "host_scale" => Some(host_scale as *const () as u64),
            "host_offset" => Some(host_offset as *const () as u64),
            "low_sym" => Some(0x1234),
            "weak_hook" => Some(host_hook as *const () as u64),
            _ => None,
        }
    }
    fn tls_module_id(&mut self) -> Result<u64, String> {
        Err("no thread-locals here".into())
    }
}

const MAIN: &str = r#"
__declspec(dllimport) int host_scale(int);
int host_offset(int);
static int counter;
int table[4] = {1, 2, 3, 4};
int *middle = &table[2];
__declspec(selectany) int shared = 5;
__attribute__((weak)) int tunable(void) { return 100; }
__attribute__((constructor)) static void init(void) { counter = host_offset(-4); }
int other(void);
int entry(int x) {
    counter++;
    return host_scale(x) + host_offset(*middle) + counter + shared + tunable() + other();
}
"#;

const OTHER: &str = r#"
__declspec(selectany) int shared = 5;
#ifdef STRONG
int tunable(void) { return 1000; }
#endif
int other(void) { return shared * 2; }
"#;

fn coff(compiler: &str, name: &str, source: &str, flags: &[&str]) -> ObjectInput {
    let bytes = kiln_testkit::compiled_object(compiler, "c", name, source, flags);
    assert!(kiln_link::is_coff(&bytes), "{compiler} wrote COFF");
    ObjectInput::new(format!("{name}.o"), bytes)
}

fn try_link(objects: &[ObjectInput]) -> Result<LinkedModule, LinkError> {
    let memory = SlabMemoryManager::new().unwrap();
    link(
        objects,
        &[],
        &mut Host,
        &LinkOptions::new(&memory as &dyn MemoryManager),
    )
}

#[test]
fn coff_objects_link_and_run_with_the_windows_calling_convention() {
    if kiln_testkit::skip_cross("coff_objects_link_and_run_with_the_windows_calling_convention") {
        return;
    }
    for compiler in [CLANG, MINGW] {
        for opt in ["-O0", "-O2"] {
            for (strong, expected) in [(true, 1049), (false, 149)] {
                let what = format!("{compiler} {opt} strong={strong}");
                let mut other_flags = vec![opt];
                if strong {
                    other_flags.push("-DSTRONG");
                }
                let objects = [
                    coff(compiler, "coff_main", MAIN, &[opt]),
                    coff(compiler, "coff_other", OTHER, &other_flags),
                ];
                let linked = try_link(&objects).unwrap_or_else(|e| panic!("{what}: {e}"));
                // The constructor (`.ctors`) is the module's one initializer.
                assert_eq!(linked.init.len(), 1, "{what}");
                let entry = linked.symbol("entry").expect("entry is exported");
                // SAFETY: the link put `init` and `entry` in executable memory, compiled
                // for the Windows x64 calling convention, which `extern "win64"` is.
                let result = unsafe {
                    let init: extern "win64" fn() = std::mem::transmute(linked.init[0] as usize);
                    init();
                    let entry: extern "win64" fn(i32) -> i32 = std::mem::transmute(entry as usize);
                    entry(2)
                };
                // host_scale(2) 20 + host_offset(3) 10 + counter 4 + shared 5
                // + tunable (1000 strong, else the weak default's 100) + other 10.
                // (host_scale is reached through `__imp_host_scale`: its GOT entry;
                // host_offset by a call, through a stub where it is out of reach.)
                let rows = [
                    "IMAGE_REL_AMD64_REL32_IMPORT",
                    "IMAGE_REL_AMD64_REL32_BRANCH",
                ];
                assert_eq!(result, expected, "{what}: {rows:?}");
                // The unwind table: sorted, every entry in the module's code, `entry`'s
                // among them (it calls functions: it is no leaf).
                let table = linked.function_table.as_ref().expect("a .pdata table");
                assert!(
                    table.entries.windows(2).all(|w| w[0][0] <= w[1][0]),
                    "{what}"
                );
                assert!(
                    table
                        .entries
                        .iter()
                        .any(|e| table.image_base + u64::from(e[0]) == entry),
                    "{what}: no entry for entry() at {entry:#x} in {table:x?}"
                );
            }
        }
    }
}

/// A weak reference (`extern … __attribute__((weak))`, which the compilers write as a weak
/// external whose default is an absolute 0) is whatever defines the name — the host here —
/// and null where nothing does.
#[test]
fn a_weak_reference_is_what_defines_it_or_null() {
    if kiln_testkit::skip_cross("a_weak_reference_is_what_defines_it_or_null") {
        return;
    }
    let source = |name: &str| {
        format!(
            "extern int {name}(void) __attribute__((weak));\n\
             int call_hook(void) {{ return {name} ? {name}() : -1; }}\n"
        )
    };
    for compiler in [CLANG, MINGW] {
        for (name, expected) in [("weak_hook", 77), ("nobody_defines_this", -1)] {
            let linked = try_link(&[coff(compiler, "weak_ref", &source(name), &["-O1"])])
                .unwrap_or_else(|e| panic!("{compiler} {name}: {e}"));
            let call = linked.symbol("call_hook").unwrap();
            // SAFETY: code of the module, Windows x64 calling convention.
            let got = unsafe {
                let call: extern "win64" fn() -> i32 = std::mem::transmute(call as usize);
                call()
            };
            assert_eq!(got, expected, "{compiler} {name}");
        }
    }
}

/// The C runtime's tables of initializers (`.CRT$XCU`, what MSVC-style code and
/// `-fno-use-cxa-atexit` C++ put their static constructors in) are the module's
/// initializers.
#[test]
fn crt_initializer_tables_are_the_modules_initializers() {
    if kiln_testkit::skip_cross("crt_initializer_tables_are_the_modules_initializers") {
        return;
    }
    let source = "static int value;\n\
                  static void set_value(void) { value = 42; }\n\
                  __attribute__((section(\".CRT$XCU\"), used)) static void (*const init_entry)(void) = set_value;\n\
                  int get_value(void) { return value; }\n";
    for compiler in [CLANG, MINGW] {
        let linked = try_link(&[coff(compiler, "crt_init", source, &["-O2"])]).expect("links");
        assert_eq!(linked.init.len(), 1, "{compiler}: the table's entry");
        let get = linked.symbol("get_value").unwrap();
        // SAFETY: code of the module, Windows x64 calling convention.
        let value = unsafe {
            let init: extern "win64" fn() = std::mem::transmute(linked.init[0] as usize);
            init();
            let get: extern "win64" fn() -> i32 = std::mem::transmute(get as usize);
            get()
        };
        assert_eq!(value, 42, "{compiler}");
    }
}

#[test]
fn coff_comdat_keeps_one_copy_and_noduplicates_is_a_duplicate() {
    if kiln_testkit::skip_cross("coff_comdat_keeps_one_copy_and_noduplicates_is_a_duplicate") {
        return;
    }
    // C++ inline functions, their statics and template data: COMDAT sections with their
    // associated `.pdata` and `.xdata`, in both objects; one copy of each is kept.
    let inline =
        "inline int twice(int x) { static int calls; calls++; return 2 * x + calls * 0; }\n\
                  template <typename T> struct Box { static T value; };\n\
                  template <typename T> T Box<T>::value = 7;\n";
    let a =
        format!("{inline}extern \"C\" int fa(int x) {{ return twice(x) + Box<int>::value; }}\n");
    let b = format!(
        "{inline}extern \"C\" int fb(int x) {{ Box<int>::value++; return twice(x) + Box<int>::value; }}\n"
    );
    let cxx = "clang++-16 --target=x86_64-w64-windows-gnu";
    let objects: Vec<ObjectInput> = [("comdat_a", &a), ("comdat_b", &b)]
        .into_iter()
        .map(|(name, source)| {
            let bytes =
                kiln_testkit::compiled_object(cxx, "cc", name, source, &["-O0", "-fno-exceptions"]);
            ObjectInput::new(format!("{name}.o"), bytes)
        })
        .collect();
    let linked = try_link(&objects).expect("COMDAT copies are one");
    // SAFETY: as above.
    let (fa, fb) = unsafe {
        let fa: extern "win64" fn(i32) -> i32 =
            std::mem::transmute(linked.symbol("fa").unwrap() as usize);
        let fb: extern "win64" fn(i32) -> i32 =
            std::mem::transmute(linked.symbol("fb").unwrap() as usize);
        (fa(1), fb(2))
    };
    // One Box<int>::value: fb's increment is seen by both.
    assert_eq!((fa, fb), (9, 12));
    // `-ffunction-sections`: each function a NODUPLICATES COMDAT; two definitions of one
    // are a duplicate symbol, as for a linker.
    let dup = |name: &str| {
        coff(
            CLANG,
            name,
            "int dup(void) { return 1; }",
            &["-ffunction-sections"],
        )
    };
    match try_link(&[dup("dup_a"), dup("dup_b")]) {
        Err(LinkError::DuplicateSymbol {
            symbol,
            first,
            second,
        }) => {
            assert_eq!(
                (symbol.as_str(), first.as_str(), second.as_str()),
                ("dup", "dup_a.o", "dup_b.o")
            );
        }
        other => panic!("two NODUPLICATES definitions: {other:?}"),
    }
}

/// Each relocation type computes what the PE format says, whatever the compiler chose to
/// emit: the `REL32_N` forms and `ABSOLUTE` (which LLVM and GNU as rarely write) are made
/// by changing the types of an assembled object's `REL32`s.
#[test]
fn coff_relocations_compute_what_the_pe_format_says() {
    if kiln_testkit::skip_cross("coff_relocations_compute_what_the_pe_format_says") {
        return;
    }
    let asm = "\t.text\n\t.globl probe\nprobe:\n\tleaq target(%rip), %rax\n\tcmpb $1, target(%rip)\n\
               \tcmpw $1, target(%rip)\n\tcmpl $1, target(%rip)\n\tretq\n\
               \t.section .rdata,\"dr\"\n\t.globl target\ntarget:\n\t.quad 0\n\
               \t.data\n\t.globl words\nwords:\n\t.quad target\n\t.long target@IMGREL\n\t.long low_sym\n"
        .to_string()
        + &"\t.long target - .\n".repeat(7);
    let mut bytes = kiln_testkit::compiled_object(CLANG, "s", "kinds", &asm, &[]);
    // The seven `target - .` (REL32, implicit addend 4): REL32, REL32_1 … REL32_5, ABSOLUTE.
    let (_, relocs, count) = section(&bytes, b".data");
    assert_eq!(count, 10, "ADDR64, ADDR32NB, ADDR32 and seven REL32");
    for (i, typ) in [4u16, 5, 6, 7, 8, 9, 0].into_iter().enumerate() {
        let at = relocs + 10 * (3 + i) + 8;
        bytes[at..at + 2].copy_from_slice(&typ.to_le_bytes());
    }
    let linked = try_link(&[ObjectInput::new("kinds.o", bytes)]).expect("links");
    let target = linked.symbol("target").unwrap() as i64;
    let words = linked.symbol("words").unwrap();
    let probe = linked.symbol("probe").unwrap();
    let image_base = linked
        .allocation
        .segments()
        .iter()
        .filter(|s| s.len > 0)
        .map(|s| s.target)
        .min()
        .unwrap() as i64;
    // SAFETY: the module's code and data, mapped readable by the link, in this process.
    let read = |at: u64, n: usize| unsafe { std::slice::from_raw_parts(at as *const u8, n) };
    let i32_at = |at: u64| i64::from(i32::from_le_bytes(read(at, 4).try_into().unwrap()));
    let u32_at = |at: u64| i64::from(u32::from_le_bytes(read(at, 4).try_into().unwrap()));
    assert_eq!(
        i64::from_le_bytes(read(words, 8).try_into().unwrap()),
        target,
        "IMAGE_REL_AMD64_ADDR64"
    );
    assert_eq!(
        u32_at(words + 8),
        target - image_base,
        "IMAGE_REL_AMD64_ADDR32NB"
    );
    assert_eq!(u32_at(words + 12), 0x1234, "IMAGE_REL_AMD64_ADDR32");
    for (i, name) in [
        "IMAGE_REL_AMD64_REL32",
        "IMAGE_REL_AMD64_REL32_1",
        "IMAGE_REL_AMD64_REL32_2",
        "IMAGE_REL_AMD64_REL32_3",
        "IMAGE_REL_AMD64_REL32_4",
        "IMAGE_REL_AMD64_REL32_5",
    ]
    .into_iter()
    .enumerate()
    {
        let p = words + 16 + 4 * i as u64;
        // S + A − (P + 4 + N), A the field's 4.
        assert_eq!(i32_at(p), target - p as i64 - i as i64, "{name}");
    }
    assert_eq!(
        i32_at(words + 40),
        4,
        "{} writes nothing",
        "IMAGE_REL_AMD64_ABSOLUTE"
    );
    // The code's RIP-relative operands reach `target` from their instruction's end (LLVM
    // folds the 8-bit immediate after the field into the addend: -1).
    for (field, after) in [(3, 0), (9, 1), (17, 1), (24, 1)] {
        let p = probe + field;
        assert_eq!(
            p as i64 + 4 + after + i32_at(p),
            target,
            "REL32 at .text+{field}"
        );
    }
}

/// A thread-local's `SECREL` is its offset in the block the executor names by `_tls_index`:
/// where the module's `.tls` was placed in static TLS, plus the variable's offset in it.
#[test]
fn coff_thread_locals_are_offsets_in_the_executors_static_block() {
    if kiln_testkit::skip_cross("coff_thread_locals_are_offsets_in_the_executors_static_block") {
        return;
    }
    struct Static(Vec<(Vec<u8>, u64)>);
    impl LinkContext for Static {
        fn resolve(&mut self, _: &str) -> Option<u64> {
            None
        }
        fn tls_module_id(&mut self) -> Result<u64, String> {
            Ok(7)
        }
        fn place_static_tls(
            &mut self,
            module: u64,
            image: &[u8],
            size: u64,
            _: u64,
        ) -> Result<i64, String> {
            assert_eq!(module, 7);
            self.0.push((image.to_vec(), size));
            Ok(0x1000)
        }
    }
    let asm =
        "\t.section .tls$,\"dw\"\n\t.p2align 2\npad:\n\t.long 7\n\t.globl tvar\ntvar:\n\t.long 5\n\
               \t.data\n\t.globl offs\noffs:\n\t.secrel32 tvar\n\t.secrel32 pad\n";
    let object = kiln_testkit::compiled_object(CLANG, "s", "tls", asm, &[]);
    let memory = SlabMemoryManager::new().unwrap();
    let mut ctx = Static(Vec::new());
    let linked = link(
        &[ObjectInput::new("tls.o", object)],
        &[],
        &mut ctx,
        &LinkOptions::new(&memory as &dyn MemoryManager),
    )
    .expect("links");
    assert_eq!(
        ctx.0,
        vec![(vec![7, 0, 0, 0, 5, 0, 0, 0], 8)],
        "the block placed once, with its image"
    );
    let offs = linked.symbol("offs").unwrap();
    // SAFETY: 8 bytes of the module's data, readable in this process.
    let fields = unsafe { std::slice::from_raw_parts(offs as *const u32, 2) };
    assert_eq!(fields, [0x1004, 0x1000], "{}", "IMAGE_REL_AMD64_SECREL");
}

/// The section header of `name` in a COFF object: (its offset in the file, its
/// relocations' offset, their count).
fn section(bytes: &[u8], name: &[u8]) -> (usize, usize, usize) {
    let u16_at = |o: usize| u16::from_le_bytes([bytes[o], bytes[o + 1]]) as usize;
    let u32_at = |o: usize| u32::from_le_bytes(bytes[o..o + 4].try_into().unwrap()) as usize;
    let count = u16_at(2);
    let first = 20 + u16_at(16);
    (0..count)
        .map(|i| first + 40 * i)
        .find(|&h| {
            bytes[h..h + 8].starts_with(name)
                && bytes[h + name.len()..h + 8].iter().all(|&b| b == 0)
        })
        .map(|h| (h, u32_at(h + 24), u16_at(h + 32)))
        .unwrap_or_else(|| panic!("no section {}", String::from_utf8_lossy(name)))
}

#[test]
fn bad_coff_input_gets_typed_errors() {
    if kiln_testkit::skip_cross("bad_coff_input_gets_typed_errors") {
        return;
    }
    // ARM64 COFF: named, and said to be unsupported.
    let arm = kiln_testkit::compiled_object(
        "clang-16 --target=aarch64-w64-windows-gnu",
        "c",
        "arm",
        "int f(void) { return 1; }",
        &[],
    );
    let error = try_link(&[ObjectInput::new("arm.o", arm)]).unwrap_err();
    assert!(
        matches!(error, LinkError::WrongArchitecture { .. })
            && error.to_string().contains("arm.o")
            && error.to_string().contains("ARM64")
            && error.to_string().contains("not supported"),
        "{error}"
    );
    // A section-relative reference in loaded data to a variable that is no thread-local.
    let asm = "\t.data\n\t.globl where\nwhere:\n\t.secrel32 target\n\t.globl target\ntarget:\n\t.long 0\n";
    let secrel = kiln_testkit::compiled_object(CLANG, "s", "secrel", asm, &[]);
    let error = try_link(&[ObjectInput::new("secrel.o", secrel.clone())]).unwrap_err();
    match &error {
        LinkError::BadRelocation {
            object,
            section,
            what,
            ..
        } => {
            assert_eq!(
                (object.as_str(), section.as_str()),
                ("secrel.o", ".data"),
                "{error}"
            );
            assert!(
                what.contains("IMAGE_REL_AMD64_SECREL")
                    && what.contains("'target'")
                    && what.contains("no thread-local"),
                "{error}"
            );
        }
        other => panic!("SECREL in .data: {other:?}"),
    }
    // Its relocation damaged three ways: a type no compiler emits for x86-64 objects
    // (PAIR), a field past the section's end, a symbol the table does not have.
    let (_, relocs, count) = section(&secrel, b".data");
    assert_eq!(count, 1);
    let damaged = |at: usize, bytes: &[u8]| {
        let mut copy = secrel.clone();
        copy[relocs + at..relocs + at + bytes.len()].copy_from_slice(bytes);
        try_link(&[ObjectInput::new("damaged.o", copy)]).unwrap_err()
    };
    let error = damaged(8, &0x0fu16.to_le_bytes());
    assert!(
        matches!(&error, LinkError::UnknownRelocation { name, .. } if *name == "IMAGE_REL_AMD64_PAIR"),
        "{error}"
    );
    let error = damaged(0, &0x100u32.to_le_bytes());
    assert!(
        matches!(&error, LinkError::BadRelocation { object, section, what, .. }
            if object == "damaged.o" && section == ".data" && what.contains("past the section's end")),
        "{error}"
    );
    let error = damaged(4, &0xffffu32.to_le_bytes());
    assert!(
        matches!(&error, LinkError::BadRelocation { what, .. } if what.contains("symbol index 65535")),
        "{error}"
    );
    // Cut short anywhere: an error, never a panic.
    let good = kiln_testkit::compiled_object(MINGW, "c", "cut", MAIN, &["-O2"]);
    for len in [2, 20, 60, good.len() / 2, good.len() - 1] {
        let result = try_link(&[ObjectInput::new("cut.o", good[..len].to_vec())]);
        assert!(result.is_err(), "{len} of {} bytes linked", good.len());
    }
}
