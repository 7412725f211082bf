//! Links for other architectures checked independently of Kiln's own code: objects from
//! `aarch64-linux-gnu-gcc -c`, `riscv64-linux-gnu-gcc -c` and `clang-16 --target=… -c`
//! (-O0/-O2, PIC and not, each code model) are linked by `kiln link --target …`, the image
//! is disassembled with `llvm-objdump-16`, and every relocated instruction or word of
//! every loaded section is checked to reach the symbol + addend its relocation names
//! (directly, through a stub, or through a GOT entry that holds it). Debian's arm64
//! libraries come from the private sysroot scripts/test_deps.sh fills;
//! `KILN_TEST_SKIP_CROSS=1` skips every test.

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
        .join("cross_links")
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

/// The image's instructions by address; `options` tell objdump the instruction set
/// where the image does not (RISC-V's extensions live in the objects' attributes).
fn disassemble(image: &Path, options: &[&str]) -> HashMap<u64, Insn> {
    let out = Command::new("llvm-objdump-16")
        .arg("-d")
        .args(options)
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
        let Ok(address) = u64::from_str_radix(address, 16) else {
            continue;
        };
        // AArch64 prints one 32-bit word; RISC-V the instruction's bytes, in memory order.
        let (bytes, _) = rest.split_once('\t').unwrap_or((rest, ""));
        let bytes: Vec<&str> = bytes.split_whitespace().collect();
        let word = match bytes[..] {
            [word] if word.len() == 8 => u32::from_str_radix(word, 16).ok(),
            _ if !bytes.is_empty() && bytes.iter().all(|b| b.len() == 2) => bytes
                .iter()
                .rev()
                .try_fold(0u32, |w, b| Some(w << 8 | u32::from_str_radix(b, 16).ok()?)),
            _ => None,
        };
        let Some(word) = word else {
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

    fn u32_at(&self, address: u64) -> Option<u32> {
        Some(u32::from_le_bytes(self.read(address, 4)?.try_into().ok()?))
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
    /// Label differences changed in place (RISC-V `ADD*`/`SUB*`/`SET*`), each word once.
    in_place: usize,
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

/// One relocation of an input section, with what the image says of its symbol.
struct Reloc {
    /// Its offset in the section, and its address in the image.
    offset: u64,
    place: u64,
    r_type: u32,
    symbol: String,
    /// The symbol's address in the image (where its section landed, for a local; the
    /// definition the link chose, for a global).
    s: Option<u64>,
    addend: i64,
    /// The symbol's offset in this same section, if it is defined there (RISC-V's
    /// `%pcrel_lo` names the label of its high part).
    label: Option<u64>,
    what: String,
}

impl Reloc {
    /// S + A.
    fn x(&self) -> Option<u64> {
        Some(self.s?.wrapping_add(self.addend as u64))
    }
}

/// What a per-architecture check sees of the link.
struct Seen<'a> {
    image: &'a Image,
    insns: &'a HashMap<u64, Insn>,
    tally: Tally,
    failures: Vec<String>,
}

impl Seen<'_> {
    /// Records one relocation's verdict.
    fn verdict(&mut self, r: &Reloc, ok: bool, found: String) {
        if ok {
            self.tally.checked += 1;
        } else {
            let expected = r.x().map_or("no address".into(), |x| format!("{x:#x}"));
            self.failures
                .push(format!("{}: expected {expected}, found {found}", r.what));
        }
    }

    fn insn_text(&self, at: u64) -> String {
        self.insns
            .get(&at)
            .map_or("no instruction".into(), |i| i.text.clone())
    }
}

/// Checks every relocation of `inputs` against the linked image.
fn verify(arch: Arch, inputs: &[PathBuf], image_path: &Path) -> Tally {
    let image = Image::load(image_path);
    let insns = disassemble(image_path, arch.objdump_options());
    let mut seen = Seen {
        image: &image,
        insns: &insns,
        tally: Tally::default(),
        failures: Vec::new(),
    };
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
            let mut relocs = Vec::new();
            for (offset, reloc) in section.relocations() {
                let RelocationFlags::Elf { r_type } = reloc.flags() else {
                    continue;
                };
                let (symbol, s, label) = match reloc.target() {
                    RelocationTarget::Symbol(index) => {
                        let symbol = file.symbol_by_index(index).unwrap();
                        let sname = symbol.name().unwrap_or("").to_string();
                        let s = match symbol.section_index() {
                            Some(sec) if symbol.is_local() => {
                                section_address(sec).map(|b| b + symbol.address())
                            }
                            _ => image.symbols.get(&sname).copied(),
                        };
                        let label = (symbol.section_index() == Some(section.index()))
                            .then(|| symbol.address());
                        (sname, s, label)
                    }
                    _ => (String::new(), None, None),
                };
                relocs.push(Reloc {
                    offset,
                    place: base + offset,
                    r_type: r_type.0,
                    what: format!(
                        "{name} {} +{offset:#x} type {} '{symbol}'",
                        section.name().unwrap_or("?"),
                        r_type.0
                    ),
                    symbol,
                    s,
                    addend: reloc.addend(),
                    label,
                });
            }
            let original = section.data().unwrap_or(&[]);
            match arch {
                Arch::Aarch64 => check_aarch64(&mut seen, &relocs),
                Arch::Riscv64 => check_riscv64(&mut seen, &relocs, original),
            }
        }
    }
    assert!(
        seen.failures.is_empty(),
        "{} of {} relocations do not reach their target:\n{}",
        seen.failures.len(),
        seen.failures.len() + seen.tally.checked,
        seen.failures.join("\n")
    );
    seen.tally
}

/// The architectures checked here.
#[derive(Clone, Copy, Debug)]
enum Arch {
    Aarch64,
    Riscv64,
}

impl Arch {
    fn target(self) -> &'static str {
        match self {
            Arch::Aarch64 => "aarch64",
            Arch::Riscv64 => "riscv64",
        }
    }

    /// RISC-V's extensions are named in the objects' `.riscv.attributes`, which an
    /// image does not carry: RV64GC is said to objdump.
    fn objdump_options(self) -> &'static [&'static str] {
        match self {
            Arch::Aarch64 => &[],
            Arch::Riscv64 => &["--mattr=+m,+a,+f,+d,+c"],
        }
    }
}

fn check_aarch64(seen: &mut Seen<'_>, relocs: &[Reloc]) {
    // ADRP pages of GOT-loading pairs, by symbol, for the LO12 halves that follow.
    let mut got_pages: HashMap<String, u64> = HashMap::new();
    for r in relocs {
        let (r_type, place) = (r.r_type, r.place);
        if (512..=573).contains(&r_type) {
            seen.tally.tls += 1;
            continue;
        }
        let Some(x) = r.x() else {
            seen.failures
                .push(format!("{}: symbol has no address in the image", r.what));
            continue;
        };
        let image = seen.image;
        let insn = seen.insns.get(&place);
        let ok = match r_type {
            257 => image.u64_at(place) == Some(x),
            258 => image.u32_at(place) == Some(x as u32),
            260 => image.u64_at(place) == Some(x.wrapping_sub(place)),
            261 => {
                image.u32_at(place).map(|w| w as i32 as i64) == Some(x.wrapping_sub(place) as i64)
            }
            // Branches: the target directly, or a veneer whose GOT entry holds it.
            282 | 283 | 279 | 280 | 273 | 274 => {
                match insn.and_then(|i| address_operand(&i.text)) {
                    Some(target) if target == x => true,
                    Some(veneer) if r_type == 282 || r_type == 283 => {
                        let slot = veneer_slot(seen.insns, veneer);
                        let ok = slot.and_then(|slot| image.u64_at(slot)) == Some(x);
                        seen.tally.through_veneer += usize::from(ok);
                        ok
                    }
                    _ => false,
                }
            }
            275 | 276 => insn.and_then(|i| address_operand(&i.text)) == Some(x & !0xfff),
            311 => match insn.and_then(|i| address_operand(&i.text)) {
                Some(page) => {
                    got_pages.insert(r.symbol.clone(), page);
                    true
                }
                None => false,
            },
            312 => match (got_pages.get(&r.symbol), insn) {
                (Some(&page), Some(i)) => {
                    let ok = image.u64_at(page + immediate_operand(&i.text)) == Some(x);
                    seen.tally.through_got += usize::from(ok);
                    ok
                }
                _ => false,
            },
            277 | 278 | 284 | 285 | 286 | 299 => {
                insn.map(|i| immediate_operand(&i.text)) == Some(x & 0xfff)
            }
            263..=269 => {
                let group = (r_type - 263) / 2;
                insn.map(|i| (i.word >> 5) & 0xffff) == Some(((x >> (16 * group)) & 0xffff) as u32)
            }
            _ => {
                seen.failures
                    .push(format!("{}: the check does not know this type", r.what));
                continue;
            }
        };
        let found = seen.insn_text(place);
        seen.verdict(r, ok, found);
    }
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

/// The RISC-V immediate objdump printed last: `addi a0, a0, -28` → -28, `ld a5, -1844(a5)`
/// → -1844, `auipc a5, 32769` → 32769 (decimal, or `0x…`).
fn riscv_immediate(text: &str) -> Option<i64> {
    let last = text.rsplit([',', '\t']).next()?.trim();
    let number = last.split('(').next()?.trim();
    let (negative, digits) = match number.strip_prefix('-') {
        Some(d) => (true, d),
        None => (false, number),
    };
    let value = match digits.strip_prefix("0x") {
        Some(h) => i64::from_str_radix(h, 16).ok()?,
        None => digits.parse().ok()?,
    };
    Some(if negative { -value } else { value })
}

/// What `auipc`/`lui` at `at` adds: its 20-bit immediate, sign-extended, times 4 KiB.
fn riscv_upper(seen: &Seen<'_>, at: u64, mnemonic: &str) -> Option<i64> {
    let insn = seen.insns.get(&at)?;
    if !insn.text.starts_with(mnemonic) {
        return None;
    }
    let imm = riscv_immediate(&insn.text)?;
    Some((((imm as u64 & 0xf_ffff) << 44) as i64) >> 32)
}

/// The 12-bit immediate of the load, store, `addi` or `jalr` at `at`.
fn riscv_lower(seen: &Seen<'_>, at: u64) -> Option<i64> {
    let text = &seen.insns.get(&at)?.text;
    // `addi rd, rs, 0` and `addiw rd, rs, 0` print as their aliases.
    if text.starts_with("mv\t") || text.starts_with("sext.w\t") {
        return Some(0);
    }
    let imm = riscv_immediate(text)?;
    (-2048..2048).contains(&imm).then_some(imm)
}

/// The GOT slot a stub (`auipc t3; ld t3, lo(t3); jr t3`) jumps through.
fn riscv_stub_slot(seen: &Seen<'_>, stub: u64) -> Option<u64> {
    let hi = riscv_upper(seen, stub, "auipc\tt3")?;
    let ld = seen.insns.get(&(stub + 4))?;
    let jr = seen.insns.get(&(stub + 8))?;
    if !ld.text.starts_with("ld\tt3") || !jr.text.starts_with("jr\tt3") {
        return None;
    }
    Some(stub.wrapping_add((hi + riscv_lower(seen, stub + 4)?) as u64))
}

fn check_riscv64(seen: &mut Seen<'_>, relocs: &[Reloc], original: &[u8]) {
    use object::elf::*;
    // What each high part's `auipc` addresses, by its offset (for the low parts).
    let mut high: HashMap<u64, (RelocationType, u64, Option<u64>)> = HashMap::new();
    for r in relocs {
        if matches!(
            RelocationType(r.r_type),
            R_RISCV_PCREL_HI20 | R_RISCV_GOT_HI20 | R_RISCV_TLS_GOT_HI20 | R_RISCV_TLS_GD_HI20
        ) {
            high.insert(r.offset, (RelocationType(r.r_type), r.place, r.x()));
        }
    }
    // Label differences changed in place: the word's value after every relocation at it.
    let mut in_place: HashMap<u64, (usize, u64)> = HashMap::new();
    let image = seen.image;
    // A target reached directly, or through a stub whose slot holds it.
    let reaches = |seen: &mut Seen<'_>, target: u64, x: u64| -> bool {
        if target == x {
            return true;
        }
        let ok = riscv_stub_slot(seen, target).and_then(|slot| image.u64_at(slot)) == Some(x);
        seen.tally.through_veneer += usize::from(ok);
        ok
    };
    for r in relocs {
        let place = r.place;
        let found = seen.insn_text(place);
        let x = r.x();
        let ok = match RelocationType(r.r_type) {
            R_RISCV_RELAX | R_RISCV_ALIGN | R_RISCV_NONE => continue,
            R_RISCV_TPREL_HI20
            | R_RISCV_TPREL_LO12_I
            | R_RISCV_TPREL_LO12_S
            | R_RISCV_TPREL_ADD
            | R_RISCV_TLS_GOT_HI20
            | R_RISCV_TLS_GD_HI20
            | R_RISCV_TLS_DTPREL64
            | R_RISCV_TLS_DTPREL32
            | R_RISCV_TLSDESC_HI20
            | R_RISCV_TLSDESC_LOAD_LO12
            | R_RISCV_TLSDESC_ADD_LO12
            | R_RISCV_TLSDESC_CALL => {
                seen.tally.tls += 1;
                continue;
            }
            R_RISCV_ADD8 | R_RISCV_ADD16 | R_RISCV_ADD32 | R_RISCV_ADD64 | R_RISCV_SUB8
            | R_RISCV_SUB16 | R_RISCV_SUB32 | R_RISCV_SUB64 | R_RISCV_SET8 | R_RISCV_SET16
            | R_RISCV_SET32 | R_RISCV_SET6 | R_RISCV_SUB6 => {
                let Some(x) = x else {
                    seen.failures
                        .push(format!("{}: symbol has no address", r.what));
                    continue;
                };
                let size = match RelocationType(r.r_type) {
                    R_RISCV_ADD8 | R_RISCV_SUB8 | R_RISCV_SET8 | R_RISCV_SET6 | R_RISCV_SUB6 => 1,
                    R_RISCV_ADD16 | R_RISCV_SUB16 | R_RISCV_SET16 => 2,
                    R_RISCV_ADD64 | R_RISCV_SUB64 => 8,
                    _ => 4,
                };
                let entry = in_place.entry(r.offset).or_insert_with(|| {
                    let at = r.offset as usize;
                    let mut word = [0u8; 8];
                    word[..size].copy_from_slice(&original[at..at + size]);
                    (size, u64::from_le_bytes(word))
                });
                entry.1 = match RelocationType(r.r_type) {
                    R_RISCV_SET6 => (entry.1 & !0x3f) | (x & 0x3f),
                    R_RISCV_SUB6 => (entry.1 & !0x3f) | (entry.1.wrapping_sub(x) & 0x3f),
                    R_RISCV_SET8 | R_RISCV_SET16 | R_RISCV_SET32 => x,
                    R_RISCV_SUB8 | R_RISCV_SUB16 | R_RISCV_SUB32 | R_RISCV_SUB64 => {
                        entry.1.wrapping_sub(x)
                    }
                    _ => entry.1.wrapping_add(x),
                };
                continue;
            }
            _ if x.is_none() => {
                seen.failures
                    .push(format!("{}: symbol has no address in the image", r.what));
                continue;
            }
            R_RISCV_64 => image.u64_at(place) == x,
            R_RISCV_32 => image.u32_at(place).map(u64::from) == x.map(|x| x & 0xffff_ffff),
            R_RISCV_32_PCREL => {
                image.u32_at(place).map(|w| w as i32 as i64)
                    == x.map(|x| x.wrapping_sub(place) as i64)
            }
            R_RISCV_BRANCH | R_RISCV_JAL | R_RISCV_RVC_BRANCH | R_RISCV_RVC_JUMP => {
                match seen
                    .insns
                    .get(&place)
                    .and_then(|i| address_operand(&i.text))
                {
                    Some(target) => reaches(seen, target, x.unwrap_or(0)),
                    None => false,
                }
            }
            R_RISCV_CALL | R_RISCV_CALL_PLT => {
                let hi = riscv_upper(seen, place, "auipc");
                let lo = riscv_lower(seen, place + 4);
                match (hi, lo) {
                    (Some(hi), Some(lo)) => {
                        let target = place.wrapping_add((hi + lo) as u64);
                        reaches(seen, target, x.unwrap_or(0))
                    }
                    _ => false,
                }
            }
            R_RISCV_PCREL_HI20 | R_RISCV_GOT_HI20 => {
                // Checked with its low part, which completes the address.
                riscv_upper(seen, place, "auipc").is_some()
            }
            R_RISCV_PCREL_LO12_I | R_RISCV_PCREL_LO12_S => {
                let partner = r.label.and_then(|label| high.get(&label)).copied();
                let Some((hi_type, hi_place, hi_x)) = partner else {
                    seen.failures
                        .push(format!("{}: no high part at its label", r.what));
                    continue;
                };
                if matches!(hi_type, R_RISCV_TLS_GOT_HI20 | R_RISCV_TLS_GD_HI20) {
                    seen.tally.tls += 1;
                    continue;
                }
                let (Some(hi), Some(lo)) = (
                    riscv_upper(seen, hi_place, "auipc"),
                    riscv_lower(seen, place),
                ) else {
                    seen.verdict(r, false, found);
                    continue;
                };
                let address = hi_place.wrapping_add((hi + lo) as u64);
                let Some(hi_x) = hi_x else {
                    seen.failures
                        .push(format!("{}: its high part has no target", r.what));
                    continue;
                };
                if hi_type == R_RISCV_GOT_HI20 {
                    let ok = image.u64_at(address) == Some(hi_x);
                    seen.tally.through_got += usize::from(ok);
                    ok
                } else {
                    reaches(seen, address, hi_x)
                }
            }
            R_RISCV_HI20 => {
                riscv_upper(seen, place, "lui").map(|hi| hi as u64)
                    == x.map(|x| (x.wrapping_add(0x800) & !0xfff) as u32 as i32 as i64 as u64)
            }
            R_RISCV_LO12_I | R_RISCV_LO12_S => {
                riscv_lower(seen, place).map(|lo| lo as u64 & 0xfff) == x.map(|x| x & 0xfff)
            }
            _ => {
                seen.failures
                    .push(format!("{}: the check does not know this type", r.what));
                continue;
            }
        };
        seen.verdict(r, ok, found);
    }
    for (offset, (size, expected)) in in_place {
        let place = relocs.iter().find(|r| r.offset == offset).map(|r| r.place);
        let bytes = place.and_then(|p| image.read(p, size));
        let mut word = [0u8; 8];
        if let Some(bytes) = bytes {
            word[..size].copy_from_slice(bytes);
        }
        let mask = if size == 8 {
            u64::MAX
        } else {
            (1u64 << (8 * size)) - 1
        };
        if bytes.is_some() && u64::from_le_bytes(word) == expected & mask {
            seen.tally.checked += 1;
            seen.tally.in_place += 1;
        } else {
            seen.failures.push(format!(
                "label difference at +{offset:#x}: expected {:#x}, found {:#x}",
                expected & mask,
                u64::from_le_bytes(word)
            ));
        }
    }
}

fn link(arch: Arch, objects: &[PathBuf], image: &Path, extra: &[&str]) {
    let out = Command::new(kiln())
        .args(["link", "--target", arch.target(), "--allow-undefined", "-o"])
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

/// Host functions far from the code (beyond ±2 GiB), so that calls to them go through
/// stubs: RISC-V's `call` reaches ±2 GiB, the placeholders `--allow-undefined` gives
/// would all be in reach.
const FAR_HOST_FUNCTIONS: &[&str] = &[
    "--defsym",
    "printf=0x7f0000001000",
    "--defsym",
    "puts=0x7f0000002000",
    "--defsym",
    "memcpy=0x7f0000003000",
    "--defsym",
    "malloc=0x7f0000004000",
];

fn check_compiler(arch: Arch, label: &str, compiler: &[&str], flag_sets: &[&[&str]]) {
    // The arm64 sysroot's zlib, SQLite and Lua headers serve every architecture.
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
            let extra = match arch {
                Arch::Riscv64 => FAR_HOST_FUNCTIONS,
                Arch::Aarch64 => &[],
            };
            link(arch, &objects, &image, extra);
            let tally = verify(arch, &objects, &image);
            total.checked += tally.checked;
            total.through_veneer += tally.through_veneer;
            total.through_got += tally.through_got;
            total.tls += tally.tls;
            total.in_place += tally.in_place;
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
        Arch::Aarch64,
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
        Arch::Aarch64,
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
        link(Arch::Aarch64, &inputs, &image, &[]);
        let tally = verify(Arch::Aarch64, &inputs, &image);
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

#[test]
fn riscv64_gcc_objects_reach_their_targets() {
    if kiln_testkit::skip_cross("riscv64_gcc_objects_reach_their_targets") {
        return;
    }
    check_compiler(
        Arch::Riscv64,
        "riscv64-gcc",
        &["riscv64-linux-gnu-gcc"],
        &[
            &["-O0"],
            &["-O2", "-fPIC"],
            &["-O2", "-fno-pic", "-mcmodel=medlow"],
            &["-O1", "-fno-pic", "-mcmodel=medany"],
        ],
    );
}

#[test]
fn riscv64_clang_objects_reach_their_targets() {
    if kiln_testkit::skip_cross("riscv64_clang_objects_reach_their_targets") {
        return;
    }
    check_compiler(
        Arch::Riscv64,
        "riscv64-clang",
        &["clang-16", "--target=riscv64-linux-gnu"],
        &[
            &["-O0"],
            &["-O2", "-fPIC"],
            &["-O2", "-fno-pic", "-mcmodel=medany"],
        ],
    );
}
