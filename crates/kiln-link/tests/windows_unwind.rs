//! Windows unwind data made from `.eh_frame` ([`kiln_link::windows_unwind`]) against
//! LLVM's own: the same C source compiled by clang-16 as an ELF object for
//! `x86_64-w64-windows-gnu-elf` (with `-fdwarf-exceptions`: CFI) and as a COFF object for
//! `x86_64-w64-windows-gnu` (LLVM writes `.pdata`/`.xdata` itself, read back with
//! `llvm-readobj-16 --unwind`). Every function gets the same operations and the same
//! prologue size. (The offsets inside the prologue may differ: LLVM's CFI for ELF names
//! several prologue instructions at the prologue's end.)

use kiln_link::windows_unwind::{decode, from_eh_frame, UnwindOp};
use object::{Object, ObjectSection, ObjectSymbol, RelocationTarget};
use std::collections::BTreeMap;
use std::process::Command;

const SOURCE: &str = r#"
extern long g(long *, long);
long big(long n) { volatile long a[600]; long s = 0; for (long i = 0; i < n && i < 600; i++) { a[i] = g((long *)&a[i], i); s += a[i]; } return s; }
long saves(long a, long b, long c, long d) { long x = g(&a, b), y = g(&b, c), z = g(&c, d); return x * y + z * g(&d, a) + a + b + c + d; }
long leafy(long a) { return a * 3; }
long framed(long n) { long *p = __builtin_alloca(n * 8); p[0] = n; return g(p, n); }
double fp(double a, double b) { double x = a * b; double y = g((long *)&x, 1); return x + y * a + b; }
long huge(long n) { volatile char a[600000]; a[n] = 1; return g((long *)&a[n], n); }
"#;

const TEXT: u64 = 0x10_0000;
const EH_FRAME: u64 = 0x20_0000;

fn clang(target: &str, flags: &[&str], out: &std::path::Path) {
    let dir = out.parent().unwrap();
    let source = dir.join("functions.c");
    std::fs::write(&source, SOURCE).unwrap();
    let status = Command::new("clang-16")
        .arg(format!("--target={target}"))
        .args(["-O2", "-c"])
        .args(flags)
        .arg(&source)
        .arg("-o")
        .arg(out)
        .status()
        .expect("clang-16 runs");
    assert!(status.success(), "clang-16 --target={target}");
}

/// The ELF object's `.eh_frame`, its PC-relative relocations applied as if `.text` lay
/// at [`TEXT`] and `.eh_frame` at [`EH_FRAME`]; and its functions by offset.
fn relocated_eh_frame(bytes: &[u8]) -> (Vec<u8>, BTreeMap<u64, String>) {
    let file = object::File::parse(bytes).unwrap();
    let text = file.section_by_name(".text").unwrap();
    let eh = file
        .section_by_name(".eh_frame")
        .expect("-fdwarf-exceptions gives .eh_frame");
    let mut data = eh.data().unwrap().to_vec();
    for (offset, reloc) in eh.relocations() {
        let RelocationTarget::Symbol(index) = reloc.target() else {
            panic!("a relocation of .eh_frame against no symbol");
        };
        let symbol = file.symbol_by_index(index).unwrap();
        assert_eq!(
            symbol.section_index(),
            Some(text.index()),
            "{:?}",
            symbol.name()
        );
        let s = TEXT + symbol.address();
        let p = EH_FRAME + offset;
        let value = (s as i64 + reloc.addend() - p as i64) as i32;
        data[offset as usize..offset as usize + 4].copy_from_slice(&value.to_le_bytes());
    }
    let functions = file
        .symbols()
        .filter(|s| s.kind() == object::SymbolKind::Text && s.section_index() == Some(text.index()))
        .map(|s| (s.address(), s.name().unwrap().to_string()))
        .collect();
    (data, functions)
}

/// `llvm-readobj-16 --unwind`'s view of a COFF object: per function, its prologue size
/// and its operations (as this test names them).
fn llvm_unwind(object: &std::path::Path) -> BTreeMap<String, (u8, Vec<String>)> {
    let out = Command::new("llvm-readobj-16")
        .arg("--unwind")
        .arg(object)
        .output()
        .expect("llvm-readobj-16 runs");
    let text = String::from_utf8_lossy(&out.stdout);
    let mut functions = BTreeMap::new();
    let mut current: Option<(String, u8, Vec<String>)> = None;
    for line in text.lines().map(str::trim) {
        if let Some(rest) = line.strip_prefix("StartAddress: ") {
            if let Some((name, prolog, ops)) = current.take() {
                functions.insert(name, (prolog, ops));
            }
            let name = rest.split_whitespace().next().unwrap().to_string();
            current = Some((name, 0, Vec::new()));
        } else if let Some(rest) = line.strip_prefix("PrologSize: ") {
            if let Some(c) = current.as_mut() {
                c.1 = rest.parse().unwrap();
            }
        } else if let Some((_, op)) = line.split_once(": ") {
            if line.starts_with("0x") {
                if let Some(c) = current.as_mut() {
                    c.2.push(llvm_op(op));
                }
            }
        }
    }
    if let Some((name, prolog, ops)) = current {
        functions.insert(name, (prolog, ops));
    }
    functions
}

/// An operation as llvm-readobj prints it, in this test's words.
fn llvm_op(op: &str) -> String {
    let op = op
        .replace("ALLOC_LARGE", "ALLOC")
        .replace("ALLOC_SMALL", "ALLOC");
    op.replace("SAVE_NONVOL_FAR", "SAVE_NONVOL")
        .replace("SAVE_XMM128_FAR", "SAVE_XMM128")
}

const REGISTERS: [&str; 16] = [
    "RAX", "RCX", "RDX", "RBX", "RSP", "RBP", "RSI", "RDI", "R8", "R9", "R10", "R11", "R12", "R13",
    "R14", "R15",
];

fn our_op(op: UnwindOp) -> String {
    match op {
        UnwindOp::PushNonvol(r) => format!("PUSH_NONVOL reg={}", REGISTERS[r as usize]),
        UnwindOp::Alloc(size) => format!("ALLOC size={size}"),
        UnwindOp::SetFpreg(scaled) => {
            format!("SET_FPREG reg=RBP, offset={:#x}", u32::from(scaled) * 16)
        }
        UnwindOp::SaveNonvol(r, at) => {
            format!("SAVE_NONVOL reg={}, offset={at:#x}", REGISTERS[r as usize])
        }
        UnwindOp::SaveXmm128(r, at) => format!("SAVE_XMM128 reg=XMM{r}, offset={at:#x}"),
    }
}

#[test]
fn unwind_data_from_cfi_matches_what_llvm_writes_for_coff() {
    let dir = std::env::temp_dir().join(format!("kiln-windows-unwind-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (elf, coff) = (dir.join("functions.elf.o"), dir.join("functions.coff.o"));
    clang("x86_64-w64-windows-gnu-elf", &["-fdwarf-exceptions"], &elf);
    clang("x86_64-w64-windows-gnu", &[], &coff);
    let bytes = std::fs::read(&elf).unwrap();
    let (eh_frame, functions) = relocated_eh_frame(&bytes);
    let (entries, skipped) = from_eh_frame(&eh_frame, EH_FRAME).unwrap();
    assert!(skipped.is_empty(), "{skipped:?}");
    let expected = llvm_unwind(&coff);
    assert!(expected.len() >= 5, "llvm-readobj gave {expected:?}");
    let mut compared = 0;
    for entry in &entries {
        let name = &functions[&(entry.begin - TEXT)];
        let codes = decode(&entry.info);
        let mut ours: Vec<String> = codes.iter().map(|c| our_op(c.op)).collect();
        let prolog = entry.info[1];
        match expected.get(name) {
            Some((llvm_prolog, llvm_ops)) => {
                let mut llvm_ops = llvm_ops.clone();
                ours.sort();
                llvm_ops.sort();
                assert_eq!(ours, llvm_ops, "{name}: the operations");
                assert_eq!(prolog, *llvm_prolog, "{name}: the prologue's size");
                eprintln!("{name}: prologue {prolog} bytes, {ours:?}");
                compared += 1;
            }
            // LLVM gives a leaf function no entry: ours has no operation either.
            None => assert!(ours.is_empty(), "{name}: {ours:?}"),
        }
    }
    assert!(compared >= 5, "compared {compared} functions");
    let _ = std::fs::remove_dir_all(&dir);
}
