//! AArch64 links checked independently of Kiln's own code: objects from
//! `aarch64-linux-gnu-gcc -c` and `clang-16 --target=aarch64-linux-gnu -c` (-O0/-O2, PIC
//! and not) are linked by `kiln link --target aarch64`, the image is disassembled with
//! `llvm-objdump-16`, and every relocated instruction or word of every loaded section is
//! checked to reach the symbol + addend its relocation names (directly, through a
//! veneer, or through a GOT entry that holds it). Debian's arm64 libraries come from the
//! private sysroot scripts/test_deps.sh fills; `KILN_TEST_SKIP_CROSS=1` skips every test.

use object::read::elf::ElfFile64;
use object::{Object, ObjectSection, ObjectSymbol, RelocationFlags, RelocationTarget, SectionKind};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;

fn kiln() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_kiln"))
}

fn programs() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/programs")
}

fn work_dir(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join("aarch64")
        .join(name);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Compiles `sources` with `compiler` (its arguments first) into objects in `dir`.
fn compile(dir: &Path, compiler: &[&str], flags: &[&str], sources: &[&str]) -> Vec<PathBuf> {
    sources
        .iter()
        .map(|source| {
            let out = dir.join(format!("{}.o", source.trim_end_matches(".c")));
            let status = Command::new(compiler[0])
                .args(&compiler[1..])
                .args(flags)
                .arg("-c")
                .arg(programs().join(source))
                .arg("-o")
                .arg(&out)
                .status()
                .unwrap_or_else(|e| panic!("{}: {e}", compiler[0]));
            assert!(status.success(), "{compiler:?} {flags:?} {source}");
            out
        })
        .collect()
}

/// One instruction of the disassembly: its word and its text.
struct Insn {
    word: u32,
    text: String,
}

fn disassemble(image: &Path) -> HashMap<u64, Insn> {
    let out = Command::new("llvm-objdump-16")
        .arg("-d")
        .arg(image)
        .output()
        .expect("llvm-objdump-16 runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut insns = HashMap::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Some((address, rest)) = line.trim_start().split_once(": ") else {
            continue;
        };
        let (Ok(address), Some(word)) = (
            u64::from_str_radix(address, 16),
            rest.split_whitespace().next(),
        ) else {
            continue;
        };
        let Ok(word) = u32::from_str_radix(word, 16) else {
            continue;
        };
        let text = rest
            .split_once('\t')
            .map_or("", |(_, t)| t)
            .trim()
            .to_string();
        insns.insert(address, Insn { word, text });
    }
    insns
}

/// The last `0x…` address operand objdump printed (branch and ADR/ADRP targets).
fn address_operand(text: &str) -> Option<u64> {
    let text = text.split('<').next().unwrap_or(text);
    text.split([' ', ',', '\t'])
        .filter_map(|t| t.strip_prefix("0x"))
        .filter_map(|h| u64::from_str_radix(h, 16).ok())
        .next_back()
}

/// The last `#…` immediate (an ADD's, or a load's or store's offset in brackets; 0 for
/// `[x0]`).
fn immediate_operand(text: &str) -> u64 {
    let operand = text
        .rsplit('#')
        .next()
        .filter(|_| text.contains('#'))
        .map(|t| t.trim_end_matches([']', '!', ' ']));
    match operand {
        Some(t) => {
            let t = t.split([']', ',', ' ']).next().unwrap_or(t);
            match t.strip_prefix("0x") {
                Some(h) => u64::from_str_radix(h, 16).unwrap_or(u64::MAX),
                None => t.parse().unwrap_or(u64::MAX),
            }
        }
        None => 0,
    }
}

struct Image {
    data: Vec<u8>,
    /// Image symbols by name: every symbol, `object:section` for placed sections.
    symbols: HashMap<String, u64>,
    segments: Vec<(u64, u64, u64)>,
}

impl Image {
    fn load(path: &Path) -> Image {
        let data = std::fs::read(path).unwrap();
        let file = ElfFile64::<object::Endianness>::parse(&*data).expect("the image is ELF");
        let symbols = file
            .symbols()
            .filter_map(|s| Some((s.name().ok()?.to_string(), s.address())))
            .collect();
        let segments = file
            .sections()
            .filter(|s| s.kind() != SectionKind::UninitializedData)
            .filter_map(|s| Some((s.address(), s.size(), s.file_range()?.0)))
            .collect();
        Image {
            data,
            symbols,
            segments,
        }
    }

    fn read(&self, address: u64, len: usize) -> Option<&[u8]> {
        let &(start, _, offset) = self
            .segments
            .iter()
            .find(|&&(start, size, _)| address >= start && address + len as u64 <= start + size)?;
        let at = (offset + address - start) as usize;
        self.data.get(at..at + len)
    }

    fn u64_at(&self, address: u64) -> Option<u64> {
        Some(u64::from_le_bytes(self.read(address, 8)?.try_into().ok()?))
    }
}

/// What the check found.
#[derive(Default, Debug)]
struct Tally {
    checked: usize,
    through_veneer: usize,
    through_got: usize,
    /// TLS relocations, whose values are thread-pointer offsets (their arithmetic is
    /// asserted by kiln-link's relocation tests).
    tls: usize,
}

/// The objects of the link's inputs, named as Kiln names them: a path, or
/// `archive(member)` for every member of an archive (those not linked have no placed
/// section and are skipped).
fn input_objects(inputs: &[PathBuf]) -> Vec<(String, Vec<u8>)> {
    let mut objects = Vec::new();
    for path in inputs {
        let name = path.display().to_string();
        let data = std::fs::read(path).unwrap();
        if data.starts_with(b"!<arch>\n") {
            let archive = object::read::archive::ArchiveFile::parse(&*data).unwrap();
            for member in archive.members() {
                let member = member.unwrap();
                let member_name = String::from_utf8_lossy(member.name()).into_owned();
                objects.push((
                    format!("{name}({member_name})"),
                    member.data(&*data).unwrap().to_vec(),
                ));
            }
        } else {
            objects.push((name, data));
        }
    }
    objects
}

/// Checks every relocation of `inputs` against the linked image.
fn verify(inputs: &[PathBuf], image_path: &Path) -> Tally {
    let image = Image::load(image_path);
    let insns = disassemble(image_path);
    let mut tally = Tally::default();
    let mut failures = Vec::new();
    for (name, data) in input_objects(inputs) {
        let file = ElfFile64::<object::Endianness>::parse(&*data).unwrap();
        let section_address = |index: object::SectionIndex| -> Option<u64> {
            let section = file.section_by_index(index).ok()?;
            image
                .symbols
                .get(&format!("{name}:{}", section.name().ok()?))
                .copied()
        };
        for section in file.sections() {
            let Some(base) = section_address(section.index()) else {
                continue; // not loaded (debug info, notes)
            };
            // ADRP pages of GOT-loading pairs, by symbol, for the LO12 halves that follow.
            let mut got_pages: HashMap<String, u64> = HashMap::new();
            for (offset, reloc) in section.relocations() {
                let RelocationFlags::Elf { r_type } = reloc.flags() else {
                    continue;
                };
                let r_type = r_type.0;
                let place = base + offset;
                let (symbol_name, s) = match reloc.target() {
                    RelocationTarget::Symbol(index) => {
                        let symbol = file.symbol_by_index(index).unwrap();
                        let sname = symbol.name().unwrap_or("").to_string();
                        // A local is where its section landed; a global is the
                        // definition the link chose (a strong one over a weak one).
                        let s = match symbol.section_index() {
                            Some(sec) if symbol.is_local() => {
                                section_address(sec).map(|b| b + symbol.address())
                            }
                            _ => image.symbols.get(&sname).copied(),
                        };
                        (sname, s)
                    }
                    _ => (String::new(), None),
                };
                if (512..=573).contains(&r_type) {
                    tally.tls += 1;
                    continue;
                }
                let what = format!(
                    "{name} {} +{offset:#x} type {r_type} '{symbol_name}'",
                    section.name().unwrap_or("?")
                );
                let Some(s) = s else {
                    failures.push(format!("{what}: symbol has no address in the image"));
                    continue;
                };
                let x = s.wrapping_add(reloc.addend() as u64);
                let insn = insns.get(&place);
                let ok = match r_type {
                    257 => image.u64_at(place) == Some(x),
                    258 => {
                        image
                            .read(place, 4)
                            .map(|b| u32::from_le_bytes(b.try_into().unwrap()))
                            == Some(x as u32)
                    }
                    260 => image.u64_at(place) == Some(x.wrapping_sub(place)),
                    261 => {
                        image
                            .read(place, 4)
                            .map(|b| i32::from_le_bytes(b.try_into().unwrap()) as i64)
                            == Some(x.wrapping_sub(place) as i64)
                    }
                    // Branches: the target directly, or a veneer whose GOT entry holds it.
                    282 | 283 | 279 | 280 | 273 | 274 => {
                        match insn.and_then(|i| address_operand(&i.text)) {
                            Some(target) if target == x => true,
                            Some(veneer) if r_type == 282 || r_type == 283 => {
                                let slot = veneer_slot(&insns, veneer);
                                let ok = slot.and_then(|slot| image.u64_at(slot)) == Some(x);
                                tally.through_veneer += usize::from(ok);
                                ok
                            }
                            _ => false,
                        }
                    }
                    275 | 276 => insn.and_then(|i| address_operand(&i.text)) == Some(x & !0xfff),
                    311 => match insn.and_then(|i| address_operand(&i.text)) {
                        Some(page) => {
                            got_pages.insert(symbol_name.clone(), page);
                            true
                        }
                        None => false,
                    },
                    312 => match (got_pages.get(&symbol_name), insn) {
                        (Some(&page), Some(i)) => {
                            let ok = image.u64_at(page + immediate_operand(&i.text)) == Some(x);
                            tally.through_got += usize::from(ok);
                            ok
                        }
                        _ => false,
                    },
                    277 | 278 | 284 | 285 | 286 | 299 => {
                        insn.map(|i| immediate_operand(&i.text)) == Some(x & 0xfff)
                    }
                    263..=269 => {
                        let group = (r_type - 263) / 2;
                        insn.map(|i| (i.word >> 5) & 0xffff)
                            == Some(((x >> (16 * group)) & 0xffff) as u32)
                    }
                    _ => {
                        failures.push(format!("{what}: the check does not know this type"));
                        continue;
                    }
                };
                if ok {
                    tally.checked += 1;
                } else {
                    failures.push(format!(
                        "{what}: expected {x:#x}, found {:?}",
                        insn.map(|i| i.text.as_str())
                    ));
                }
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} relocations do not reach their target:\n{}",
        failures.len(),
        failures.len() + tally.checked,
        failures.join("\n")
    );
    tally
}

/// The GOT entry a veneer (`adrp x16; ldr x16, [x16, #off]; br x16`) jumps through.
/// The GOT slot a veneer loads: `bti c` (its landing pad), `adrp x16`, `ldr x16`, `br x16`.
fn veneer_slot(insns: &HashMap<u64, Insn>, veneer: u64) -> Option<u64> {
    let bti = insns.get(&veneer)?;
    let adrp = insns.get(&(veneer + 4))?;
    let ldr = insns.get(&(veneer + 8))?;
    let br = insns.get(&(veneer + 12))?;
    if !bti.text.starts_with("bti")
        || !adrp.text.starts_with("adrp")
        || !ldr.text.starts_with("ldr")
        || !br.text.starts_with("br")
    {
        return None;
    }
    Some(address_operand(&adrp.text)? + immediate_operand(&ldr.text))
}

fn link(objects: &[PathBuf], image: &Path, extra: &[&str]) {
    let out = Command::new(kiln())
        .args(["link", "--target", "aarch64", "--allow-undefined", "-o"])
        .arg(image)
        .args(extra)
        .args(objects)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "kiln link failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

const SOURCES: &[&[&str]] = &[
    &["relocs.c", "relocs_other.c"],
    &["tls.c"],
    &["nopic.c"],
    &["zlib_driver.c"],
    &["sqlite_driver.c"],
    &["lua_driver.c"],
    &["debug_target.c"],
];

fn check_compiler(label: &str, compiler: &[&str], flag_sets: &[&[&str]]) {
    let includes = kiln_testkit::aarch64_includes();
    let mut total = Tally::default();
    for (f, flags) in flag_sets.iter().enumerate() {
        for (n, sources) in SOURCES.iter().enumerate() {
            let dir = work_dir(&format!("{label}-{f}-{n}"));
            let mut flags = flags.to_vec();
            flags.push("-fcommon");
            flags.extend(includes.iter().map(String::as_str));
            let objects = compile(&dir, compiler, &flags, sources);
            let image = dir.join("image.elf");
            link(&objects, &image, &[]);
            let tally = verify(&objects, &image);
            total.checked += tally.checked;
            total.through_veneer += tally.through_veneer;
            total.through_got += tally.through_got;
            total.tls += tally.tls;
        }
    }
    eprintln!("{label}: {total:?}");
    assert!(total.checked > 500, "{label}: only {total:?}");
    assert!(
        total.through_got > 0,
        "{label}: no GOT load checked: {total:?}"
    );
    assert!(
        total.through_veneer > 0,
        "{label}: no veneer checked: {total:?}"
    );
}

#[test]
fn gcc_objects_reach_their_targets() {
    if kiln_testkit::skip_cross("gcc_objects_reach_their_targets") {
        return;
    }
    check_compiler(
        "gcc",
        &["aarch64-linux-gnu-gcc"],
        &[
            &["-O0"],
            &["-O2"],
            &["-O2", "-fPIC"],
            &["-O0", "-fno-pic"],
            &["-O2", "-fno-pic", "-mcmodel=large"],
        ],
    );
}

#[test]
fn clang_objects_reach_their_targets() {
    if kiln_testkit::skip_cross("clang_objects_reach_their_targets") {
        return;
    }
    check_compiler(
        "clang",
        &["clang-16", "--target=aarch64-linux-gnu"],
        &[&["-O0"], &["-O2", "-fPIC"], &["-O2", "-fno-pic"]],
    );
}

/// Debian's arm64 static libraries (from the private sysroot), each with its driver
/// program.
#[test]
fn debian_arm64_static_libraries_reach_their_targets() {
    if kiln_testkit::skip_cross("debian_arm64_static_libraries_reach_their_targets") {
        return;
    }
    let lib = kiln_testkit::aarch64_lib_dir();
    let mut flags = vec!["-O2"];
    let includes = kiln_testkit::aarch64_includes();
    flags.extend(includes.iter().map(String::as_str));
    let mut total = Tally::default();
    for (driver, archive) in [
        ("zlib_driver.c", "libz.a"),
        ("sqlite_driver.c", "libsqlite3.a"),
        ("lua_driver.c", "liblua5.4.a"),
    ] {
        let dir = work_dir(&format!("debian-{archive}"));
        let mut inputs = compile(&dir, &["aarch64-linux-gnu-gcc"], &flags, &[driver]);
        inputs.push(lib.join(archive));
        let image = dir.join("image.elf");
        link(&inputs, &image, &[]);
        let tally = verify(&inputs, &image);
        eprintln!("{archive}: {tally:?}");
        assert!(tally.checked > 500, "{archive}: only {tally:?}");
        total.checked += tally.checked;
    }
    eprintln!("arm64 archives: {} relocations checked", total.checked);
}

#[test]
fn an_aarch64_object_into_an_x86_64_link_is_refused() {
    if kiln_testkit::skip_cross("an_aarch64_object_into_an_x86_64_link_is_refused") {
        return;
    }
    let dir = work_dir("mismatch");
    let objects = compile(
        &dir,
        &["aarch64-linux-gnu-gcc"],
        &["-O2"],
        &["relocs_other.c"],
    );
    let out = Command::new(kiln())
        .args(["link", "--target", "x86_64", "-o"])
        .arg(dir.join("x.elf"))
        .args(&objects)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("relocs_other.o")
            && stderr.contains("AArch64")
            && stderr.contains("x86-64"),
        "{stderr}"
    );
}
