//! Relocation arithmetic per type, for x86-64, AArch64 and RISC-V, without a host compiler.
//!
//! Inputs are built with `object::write`; the link runs on an [`OfflineMapper`], so every
//! address is known; the patched bytes are decoded here, independently of Kiln's encoder,
//! and the first value out of each field's range (and the last in it) is asserted.

// Link errors carry owned strings of context; they are large by design.
#![allow(clippy::result_large_err)]

use kiln_link::{
    link, Architecture, LinkContext, LinkError, LinkOptions, LinkedModule, ObjectInput,
};
use kiln_memory::{OfflineMapper, SlabLayout, SlabMemoryManager};
use object::elf::*;
use object::write::{Object, Relocation, Symbol, SymbolSection};
use object::{
    BinaryFormat, Endianness, RelocationFlags, SectionKind, SymbolFlags, SymbolKind, SymbolScope,
};
use std::sync::Arc;

const BASE: u64 = 0x1000_0000;
const SMALL: SlabLayout = SlabLayout {
    read_execute: 1 << 20,
    read: 1 << 20,
    read_write: 1 << 20,
};
/// Offset of the local function `local_fn` in `.text`.
const LOCAL_FN: u64 = 0x40;
/// Offset of `data_sym` in `.data`.
const DATA_SYM: u64 = 16;
/// Offset of `tls_var` in `.tbss`.
const TLS_VAR: u64 = 8;

#[derive(Default)]
struct Ctx {
    externals: Vec<(&'static str, u64)>,
    tp_offset: Option<i64>,
}

impl LinkContext for Ctx {
    fn resolve(&mut self, name: &str) -> Option<u64> {
        self.externals
            .iter()
            .find(|(n, _)| *n == name)
            .map(|&(_, a)| a)
    }
    fn tls_module_id(&mut self) -> Result<u64, String> {
        Ok(7)
    }
    fn place_static_tls(&mut self, _: u64, _: &[u8], _: u64, _: u64) -> Result<i64, String> {
        self.tp_offset.ok_or_else(|| "no static TLS here".into())
    }
    fn symbol_kind(&mut self, name: &str, _: u64) -> kiln_link::SymbolKind {
        if name.starts_with("fn_") {
            kiln_link::SymbolKind::Function
        } else {
            kiln_link::SymbolKind::Data
        }
    }
}

/// One relocation of the test object: in `.text` at `offset`, type, symbol, addend.
#[derive(Clone, Copy)]
struct Reloc {
    offset: u64,
    r_type: u32,
    symbol: &'static str,
    addend: i64,
}

fn reloc(offset: u64, r_type: u32, symbol: &'static str, addend: i64) -> Reloc {
    Reloc {
        offset,
        r_type,
        symbol,
        addend,
    }
}

/// An object with `.text` = `code` (at least 0x80 bytes, `local_fn` at 0x40), `.data` of 64
/// bytes (`data_sym` at 16), `.tbss` of 16 bytes (`tls_var` at 8), the absolute symbols
/// given, and `relocs` in `.text`; other names are undefined.
fn object(arch: Architecture, code: &[u8], relocs: &[Reloc], absolutes: &[(&str, u64)]) -> Vec<u8> {
    let machine = match arch {
        Architecture::X86_64 => object::Architecture::X86_64,
        Architecture::Aarch64 => object::Architecture::Aarch64,
        Architecture::Riscv64 => object::Architecture::Riscv64,
    };
    let mut o = Object::new(BinaryFormat::Elf, machine, Endianness::Little);
    if arch == Architecture::Riscv64 {
        // LP64D, the ABI Kiln links for.
        o.flags = object::FileFlags::Elf {
            os_abi: object::elf::ELFOSABI_NONE,
            abi_version: 0,
            e_flags: object::elf::EF_RISCV_FLOAT_ABI_DOUBLE,
        };
    }
    let mut text_bytes = code.to_vec();
    text_bytes.resize(text_bytes.len().max(0x80), 0);
    let text = o.add_section(Vec::new(), b".text".to_vec(), SectionKind::Text);
    o.set_section_data(text, text_bytes, 16);
    let data = o.add_section(Vec::new(), b".data".to_vec(), SectionKind::Data);
    o.set_section_data(data, vec![0u8; 64], 16);
    let tbss = o.add_section(Vec::new(), b".tbss".to_vec(), SectionKind::UninitializedTls);
    o.append_section_bss(tbss, 16, 8);
    let add = |o: &mut Object<'_>, name: &str, value, kind, section| {
        o.add_symbol(Symbol {
            name: name.as_bytes().to_vec(),
            value,
            size: 8,
            kind,
            scope: SymbolScope::Linkage,
            weak: false,
            section,
            flags: SymbolFlags::None,
        })
    };
    let mut ids = vec![
        (
            "local_fn".to_string(),
            add(
                &mut o,
                "local_fn",
                LOCAL_FN,
                SymbolKind::Text,
                SymbolSection::Section(text),
            ),
        ),
        (
            "data_sym".to_string(),
            add(
                &mut o,
                "data_sym",
                DATA_SYM,
                SymbolKind::Data,
                SymbolSection::Section(data),
            ),
        ),
        (
            "tls_var".to_string(),
            add(
                &mut o,
                "tls_var",
                TLS_VAR,
                SymbolKind::Tls,
                SymbolSection::Section(tbss),
            ),
        ),
    ];
    for &(name, value) in absolutes {
        let id = add(
            &mut o,
            name,
            value,
            SymbolKind::Data,
            SymbolSection::Absolute,
        );
        ids.push((name.to_string(), id));
    }
    for r in relocs {
        let id = match ids.iter().find(|(n, _)| n == r.symbol) {
            Some(&(_, id)) => id,
            // `text+0x50`: a local label in .text (what RISC-V's %pcrel_lo names).
            None if r.symbol.starts_with("text+0x") => {
                let at = u64::from_str_radix(&r.symbol[7..], 16).expect("a hex offset");
                let id = o.add_symbol(Symbol {
                    name: format!(".Lpcrel_{at:x}").into_bytes(),
                    value: at,
                    size: 0,
                    kind: SymbolKind::Label,
                    scope: SymbolScope::Compilation,
                    weak: false,
                    section: SymbolSection::Section(text),
                    flags: SymbolFlags::None,
                });
                ids.push((r.symbol.to_string(), id));
                id
            }
            None => {
                let kind = if r.symbol.starts_with("fn_") {
                    SymbolKind::Text
                } else {
                    SymbolKind::Data
                };
                let id = add(&mut o, r.symbol, 0, kind, SymbolSection::Undefined);
                ids.push((r.symbol.to_string(), id));
                id
            }
        };
        o.add_relocation(
            text,
            Relocation {
                offset: r.offset,
                symbol: id,
                addend: r.addend,
                flags: RelocationFlags::Elf {
                    r_type: object::elf::RelocationType(r.r_type),
                },
            },
        )
        .expect("relocation");
    }
    o.write().expect("object")
}

/// A linked test object with the memory it lives in.
struct Linked {
    module: LinkedModule,
    _memory: SlabMemoryManager,
}

impl Linked {
    fn section(&self, name: &str) -> u64 {
        self.module
            .sections
            .iter()
            .find(|s| s.name == name)
            .unwrap_or_else(|| panic!("no section {name}"))
            .address
    }
    fn read(&self, address: u64, len: usize) -> &[u8] {
        let seg = self
            .module
            .image
            .iter()
            .find(|s| {
                address >= s.address && address + len as u64 <= s.address + s.bytes.len() as u64
            })
            .unwrap_or_else(|| panic!("{address:#x} is in no segment of the image"));
        let at = (address - seg.address) as usize;
        &seg.bytes[at..at + len]
    }
    fn u32_at(&self, address: u64) -> u32 {
        u32::from_le_bytes(self.read(address, 4).try_into().unwrap())
    }
    fn u64_at(&self, address: u64) -> u64 {
        u64::from_le_bytes(self.read(address, 8).try_into().unwrap())
    }
}

/// Asserts that the error's message names every one of `parts`.
fn assert_mentions(error: &LinkError, parts: &[&str]) {
    let text = error.to_string();
    for part in parts {
        assert!(text.contains(part), "{part} missing from: {text}");
    }
}

fn link_object(arch: Architecture, bytes: Vec<u8>, ctx: &mut Ctx) -> Result<Linked, LinkError> {
    let memory = SlabMemoryManager::builder()
        .mapper(Arc::new(OfflineMapper::new(BASE, 4096)))
        .layout(SMALL)
        .build()
        .expect("offline memory");
    let mut options = LinkOptions::new(&memory);
    options.architecture = arch;
    options.keep_image = true;
    options.report_sections = true;
    let module = link(&[ObjectInput::new("test.o", bytes)], &[], ctx, &options)?;
    Ok(Linked {
        module,
        _memory: memory,
    })
}

/// Where `.text` lands in a fresh offline manager (the same for every test object).
fn text_address(arch: Architecture) -> u64 {
    let linked = link_object(arch, object(arch, &[], &[], &[]), &mut Ctx::default())
        .expect("an empty object links");
    linked.section(".text")
}

/// What a relocation's value is relative to.
#[derive(Clone, Copy, Debug)]
enum Rel {
    Absolute,
    Place,
    Page,
    /// The offset of `tls_var` from the thread pointer (local-exec).
    TpOff,
}

/// How the field holds the value; decoded here without Kiln's encoder.
#[derive(Clone, Copy, Debug)]
enum Holds {
    Word(usize),
    /// Bits [lsb, lsb + width) hold value >> shift.
    Bits {
        lsb: u32,
        width: u32,
        shift: u32,
    },
    /// ADR/ADRP immlo:immhi of value >> shift.
    Adr {
        shift: u32,
    },
    /// Bits 10..22 hold (value & 0xfff) >> shift.
    Lo12 {
        shift: u32,
    },
    /// RISC-V `auipc`/`lui`: bits 12..32 hold (value + 0x800) >> 12.
    RvUpper,
    /// RISC-V I-type: bits 20..32 hold value & 0xfff.
    RvI,
    /// RISC-V S-type: imm[4:0] in bits 7..12, imm[11:5] in bits 25..32.
    RvS,
    /// RISC-V B-type: imm[12|10:5] in bits 31|30..25, imm[4:1|11] in bits 11..8|7.
    RvB,
    /// RISC-V J-type: imm[20|10:1|11|19:12] in bits 31|30..21|20|19..12.
    RvJ,
    /// RISC-V `auipc` + `jalr`: the upper part in the first word, the I-type lower part
    /// in the second.
    RvCall,
    /// RISC-V `c.beqz`: offset[8|4:3] in bits 12|11..10, offset[7:6|2:1|5] in 6..5|4..3|2.
    RvCb,
    /// RISC-V `c.j`: offset[11|4|9:8|10|6|7|3:1|5] in bits 12..2.
    RvCj,
}

/// Scatters the bits of `v` named in `layout` (instruction bit, value bit) into a word.
fn scatter(v: u64, layout: &[(u32, u32)]) -> (u64, u64) {
    let mut mask = 0;
    let mut bits = 0;
    for &(at, from) in layout {
        mask |= 1 << at;
        bits |= ((v >> from) & 1) << at;
    }
    (mask, bits)
}

impl Holds {
    fn mask_and_bits(self, value: i128) -> (u64, u64) {
        let v = value as u64;
        match self {
            Holds::Word(n) => {
                let mask = if n == 8 {
                    u64::MAX
                } else {
                    (1u64 << (8 * n)) - 1
                };
                (mask, v & mask)
            }
            Holds::Bits { lsb, width, shift } => {
                let m = (1u64 << width) - 1;
                (m << lsb, ((v >> shift) & m) << lsb)
            }
            Holds::Adr { shift } => {
                let imm = (v >> shift) & 0x1f_ffff;
                (
                    (3 << 29) | (0x7ffff << 5),
                    ((imm & 3) << 29) | ((imm >> 2) << 5),
                )
            }
            Holds::Lo12 { shift } => (0xfff << 10, ((v & 0xfff) >> shift) << 10),
            Holds::RvUpper => (0xffff_f000, (v.wrapping_add(0x800) >> 12 & 0xf_ffff) << 12),
            Holds::RvI => (0xfff0_0000, (v & 0xfff) << 20),
            Holds::RvS => (0xfe00_0f80, (v & 0x1f) << 7 | (v >> 5 & 0x7f) << 25),
            Holds::RvB => {
                let mut layout = vec![(31, 12), (7, 11)];
                layout.extend((25..31).map(|b| (b, b - 20)));
                layout.extend((8..12).map(|b| (b, b - 7)));
                scatter(v, &layout)
            }
            Holds::RvJ => {
                let mut layout = vec![(31, 20), (20, 11)];
                layout.extend((21..31).map(|b| (b, b - 20)));
                layout.extend((12..20).map(|b| (b, b)));
                scatter(v, &layout)
            }
            Holds::RvCall => {
                let upper = (v.wrapping_add(0x800) >> 12 & 0xf_ffff) << 12;
                let lower = (v & 0xfff) << 20;
                (0xfff0_0000_ffff_f000, lower << 32 | upper)
            }
            Holds::RvCb => scatter(
                v,
                &[
                    (12, 8),
                    (11, 4),
                    (10, 3),
                    (6, 7),
                    (5, 6),
                    (4, 2),
                    (3, 1),
                    (2, 5),
                ],
            ),
            Holds::RvCj => scatter(
                v,
                &[
                    (12, 11),
                    (11, 4),
                    (10, 9),
                    (9, 8),
                    (8, 10),
                    (7, 6),
                    (6, 7),
                    (5, 3),
                    (4, 2),
                    (3, 1),
                    (2, 5),
                ],
            ),
        }
    }

    /// The step between values the field can hold (a branch's offsets are even).
    fn step(self) -> i128 {
        match self {
            Holds::Bits { shift, .. } => 1i128 << shift,
            Holds::Adr { shift } => 1i128 << shift,
            Holds::RvB | Holds::RvJ | Holds::RvCb | Holds::RvCj => 2,
            Holds::Lo12 { shift } => 1i128 << shift,
            _ => 1,
        }
    }
}

/// One relocation type checked against an absolute symbol: its range (inclusive, `None`
/// for unchecked `_NC` forms), the step values take (4 for branches), and its instruction.
struct Case {
    r_type: u32,
    name: &'static str,
    template: u32,
    rel: Rel,
    holds: Holds,
    range: Option<(i128, i128)>,
}

const fn case(
    r_type: u32,
    name: &'static str,
    template: u32,
    rel: Rel,
    holds: Holds,
    range: Option<(i128, i128)>,
) -> Case {
    Case {
        r_type,
        name,
        template,
        rel,
        holds,
        range,
    }
}

/// Links one relocation at `.text + 0` against `abs_t` so that the formula yields `value`.
fn link_value(arch: Architecture, c: &Case, text: u64, value: i128) -> Result<Linked, LinkError> {
    // S is a fixed absolute symbol, the addend makes up the rest.
    let (s, addend) = match c.rel {
        Rel::Absolute => (0x1000u64, value - 0x1000),
        Rel::Place => (text, value),
        Rel::Page => (text & !0xfff, value),
        // The thread pointer at 0: tls_var's offset is TLS_VAR + A.
        Rel::TpOff => (0, value - i128::from(TLS_VAR)),
    };
    let addend = i64::try_from(addend).expect("addend fits");
    let mut code = vec![0u8; 0x80];
    if !matches!(c.holds, Holds::Word(_)) {
        code[..4].copy_from_slice(&c.template.to_le_bytes());
    }
    if matches!(c.holds, Holds::RvCall) {
        // The `jalr ra, 0(ra)` that completes the `auipc ra`.
        code[4..8].copy_from_slice(&0x0000_80e7u32.to_le_bytes());
    }
    let symbol = if matches!(c.rel, Rel::TpOff) {
        "tls_var"
    } else {
        "abs_t"
    };
    let bytes = object(
        arch,
        &code,
        &[reloc(0, c.r_type, symbol, addend)],
        &[("abs_t", s)],
    );
    let mut ctx = Ctx {
        tp_offset: Some(0),
        ..Ctx::default()
    };
    link_object(arch, bytes, &mut ctx)
}

fn check_cases(arch: Architecture, cases: &[Case]) {
    let text = text_address(arch);
    for c in cases {
        let mut values = vec![0x1230i128, -0x40];
        if let Some((min, max)) = c.range {
            values = vec![min, max, ((min + max) / 2) & !0xf];
        }
        for value in values {
            let linked = link_value(arch, c, text, value)
                .unwrap_or_else(|e| panic!("{} with value {value:#x}: {e}", c.name));
            assert_eq!(linked.section(".text"), text, "the layout moved");
            let (mask, bits) = c.holds.mask_and_bits(value);
            let got = match c.holds {
                Holds::Word(n) => {
                    let mut b = [0u8; 8];
                    b[..n].copy_from_slice(linked.read(text, n));
                    u64::from_le_bytes(b)
                }
                Holds::RvCall => linked.u64_at(text),
                _ => u64::from(linked.u32_at(text)),
            };
            assert_eq!(got & mask, bits, "{} with value {value:#x}: field", c.name);
            if !matches!(c.holds, Holds::Word(_) | Holds::RvCall) {
                assert_eq!(
                    got & !mask,
                    u64::from(c.template) & !mask,
                    "{} changed bits outside its field",
                    c.name
                );
            }
        }
        let Some((min, max)) = c.range else { continue };
        let step = c.holds.step();
        for outside in [max + step, min - step] {
            if matches!(c.rel, Rel::Absolute | Rel::TpOff)
                && outside - 0x1000 > i128::from(i64::MAX)
            {
                continue;
            }
            match link_value(arch, c, text, outside) {
                Err(e @ LinkError::Overflow { .. }) => {
                    let symbol = if matches!(c.rel, Rel::TpOff) {
                        "tls_var"
                    } else {
                        "abs_t"
                    };
                    assert_mentions(&e, &["test.o", ".text", c.name, symbol]);
                }
                Err(other) => panic!("{} with {outside:#x}: {other}", c.name),
                Ok(_) => panic!(
                    "{}: {outside:#x} is out of range [{min:#x}, {max:#x}] but linked",
                    c.name
                ),
            }
        }
    }
}

const fn bits(lsb: u32, width: u32, shift: u32) -> Holds {
    Holds::Bits { lsb, width, shift }
}

#[test]
fn aarch64_relocations_patch_their_fields_and_refuse_the_first_value_out_of_range() {
    use Rel::*;
    let i = |bits: u32| 1i128 << bits;
    let cases = [
        case(
            R_AARCH64_ABS64.0,
            "R_AARCH64_ABS64",
            0,
            Absolute,
            Holds::Word(8),
            None,
        ),
        case(
            R_AARCH64_ABS32.0,
            "R_AARCH64_ABS32",
            0,
            Absolute,
            Holds::Word(4),
            Some((-i(31), i(32) - 1)),
        ),
        case(
            R_AARCH64_ABS16.0,
            "R_AARCH64_ABS16",
            0,
            Absolute,
            Holds::Word(2),
            Some((-i(15), i(16) - 1)),
        ),
        case(
            R_AARCH64_PREL64.0,
            "R_AARCH64_PREL64",
            0,
            Place,
            Holds::Word(8),
            None,
        ),
        case(
            R_AARCH64_PREL32.0,
            "R_AARCH64_PREL32",
            0,
            Place,
            Holds::Word(4),
            Some((-i(31), i(32) - 1)),
        ),
        case(
            R_AARCH64_PREL16.0,
            "R_AARCH64_PREL16",
            0,
            Place,
            Holds::Word(2),
            Some((-i(15), i(16) - 1)),
        ),
        case(
            R_AARCH64_MOVW_UABS_G0.0,
            "R_AARCH64_MOVW_UABS_G0",
            0xd280_0000,
            Absolute,
            bits(5, 16, 0),
            Some((0, i(16) - 1)),
        ),
        case(
            R_AARCH64_MOVW_UABS_G0_NC.0,
            "R_AARCH64_MOVW_UABS_G0_NC",
            0xf280_0000,
            Absolute,
            bits(5, 16, 0),
            None,
        ),
        case(
            R_AARCH64_MOVW_UABS_G1.0,
            "R_AARCH64_MOVW_UABS_G1",
            0xf2a0_0000,
            Absolute,
            bits(5, 16, 16),
            Some((0, i(32) - 1)),
        ),
        case(
            R_AARCH64_MOVW_UABS_G1_NC.0,
            "R_AARCH64_MOVW_UABS_G1_NC",
            0xf2a0_0000,
            Absolute,
            bits(5, 16, 16),
            None,
        ),
        case(
            R_AARCH64_MOVW_UABS_G2.0,
            "R_AARCH64_MOVW_UABS_G2",
            0xf2c0_0000,
            Absolute,
            bits(5, 16, 32),
            Some((0, i(48) - 1)),
        ),
        case(
            R_AARCH64_MOVW_UABS_G2_NC.0,
            "R_AARCH64_MOVW_UABS_G2_NC",
            0xf2c0_0000,
            Absolute,
            bits(5, 16, 32),
            None,
        ),
        case(
            R_AARCH64_MOVW_UABS_G3.0,
            "R_AARCH64_MOVW_UABS_G3",
            0xf2e0_0000,
            Absolute,
            bits(5, 16, 48),
            None,
        ),
        case(
            R_AARCH64_LD_PREL_LO19.0,
            "R_AARCH64_LD_PREL_LO19",
            0x5800_0000,
            Place,
            bits(5, 19, 2),
            Some((-i(20), i(20) - 4)),
        ),
        case(
            R_AARCH64_ADR_PREL_LO21.0,
            "R_AARCH64_ADR_PREL_LO21",
            0x1000_0000,
            Place,
            Holds::Adr { shift: 0 },
            Some((-i(20), i(20) - 1)),
        ),
        case(
            R_AARCH64_ADR_PREL_PG_HI21.0,
            "R_AARCH64_ADR_PREL_PG_HI21",
            0x9000_0000,
            Page,
            Holds::Adr { shift: 12 },
            Some((-i(32), i(32) - 4096)),
        ),
        case(
            R_AARCH64_ADR_PREL_PG_HI21_NC.0,
            "R_AARCH64_ADR_PREL_PG_HI21_NC",
            0x9000_0000,
            Page,
            Holds::Adr { shift: 12 },
            None,
        ),
        case(
            R_AARCH64_ADD_ABS_LO12_NC.0,
            "R_AARCH64_ADD_ABS_LO12_NC",
            0x9100_0000,
            Absolute,
            Holds::Lo12 { shift: 0 },
            None,
        ),
        case(
            R_AARCH64_LDST8_ABS_LO12_NC.0,
            "R_AARCH64_LDST8_ABS_LO12_NC",
            0x3940_0000,
            Absolute,
            Holds::Lo12 { shift: 0 },
            None,
        ),
        case(
            R_AARCH64_TSTBR14.0,
            "R_AARCH64_TSTBR14",
            0x3600_0000,
            Place,
            bits(5, 14, 2),
            Some((-i(15), i(15) - 4)),
        ),
        case(
            R_AARCH64_CONDBR19.0,
            "R_AARCH64_CONDBR19",
            0x5400_0000,
            Place,
            bits(5, 19, 2),
            Some((-i(20), i(20) - 4)),
        ),
        case(
            R_AARCH64_JUMP26.0,
            "R_AARCH64_JUMP26",
            0x1400_0000,
            Place,
            bits(0, 26, 2),
            Some((-i(27), i(27) - 4)),
        ),
        case(
            R_AARCH64_CALL26.0,
            "R_AARCH64_CALL26",
            0x9400_0000,
            Place,
            bits(0, 26, 2),
            Some((-i(27), i(27) - 4)),
        ),
        case(
            R_AARCH64_LDST16_ABS_LO12_NC.0,
            "R_AARCH64_LDST16_ABS_LO12_NC",
            0x7940_0000,
            Absolute,
            Holds::Lo12 { shift: 1 },
            None,
        ),
        case(
            R_AARCH64_LDST32_ABS_LO12_NC.0,
            "R_AARCH64_LDST32_ABS_LO12_NC",
            0xb940_0000,
            Absolute,
            Holds::Lo12 { shift: 2 },
            None,
        ),
        case(
            R_AARCH64_LDST64_ABS_LO12_NC.0,
            "R_AARCH64_LDST64_ABS_LO12_NC",
            0xf940_0000,
            Absolute,
            Holds::Lo12 { shift: 3 },
            None,
        ),
        case(
            R_AARCH64_LDST128_ABS_LO12_NC.0,
            "R_AARCH64_LDST128_ABS_LO12_NC",
            0x3dc0_0000,
            Absolute,
            Holds::Lo12 { shift: 4 },
            None,
        ),
    ];
    check_cases(Architecture::Aarch64, &cases);
}

#[test]
fn x86_64_relocations_patch_their_fields_and_refuse_the_first_value_out_of_range() {
    use Rel::*;
    let i = |bits: u32| 1i128 << bits;
    let cases = [
        case(
            R_X86_64_64.0,
            "R_X86_64_64",
            0,
            Absolute,
            Holds::Word(8),
            None,
        ),
        case(
            R_X86_64_32.0,
            "R_X86_64_32",
            0,
            Absolute,
            Holds::Word(4),
            Some((0, i(32) - 1)),
        ),
        case(
            R_X86_64_32S.0,
            "R_X86_64_32S",
            0,
            Absolute,
            Holds::Word(4),
            Some((-i(31), i(31) - 1)),
        ),
        case(
            R_X86_64_16.0,
            "R_X86_64_16",
            0,
            Absolute,
            Holds::Word(2),
            Some((0, i(16) - 1)),
        ),
        case(
            R_X86_64_8.0,
            "R_X86_64_8",
            0,
            Absolute,
            Holds::Word(1),
            Some((0, 255)),
        ),
        case(
            R_X86_64_PC32.0,
            "R_X86_64_PC32",
            0,
            Place,
            Holds::Word(4),
            Some((-i(31), i(31) - 1)),
        ),
        case(
            R_X86_64_PLT32.0,
            "R_X86_64_PLT32",
            0,
            Place,
            Holds::Word(4),
            Some((-i(31), i(31) - 1)),
        ),
        case(
            R_X86_64_PC16.0,
            "R_X86_64_PC16",
            0,
            Place,
            Holds::Word(2),
            Some((-i(15), i(15) - 1)),
        ),
        case(
            R_X86_64_PC8.0,
            "R_X86_64_PC8",
            0,
            Place,
            Holds::Word(1),
            Some((-128, 127)),
        ),
        case(
            R_X86_64_PC64.0,
            "R_X86_64_PC64",
            0,
            Place,
            Holds::Word(8),
            None,
        ),
    ];
    check_cases(Architecture::X86_64, &cases);
}

/// Decodes ADRP at `at`: the 4 KiB page it addresses.
fn adrp_page(linked: &Linked, at: u64) -> u64 {
    let w = u64::from(linked.u32_at(at));
    let imm = ((w >> 29) & 3) | (((w >> 5) & 0x7ffff) << 2);
    let imm = ((imm << 43) as i64 >> 43) << 12;
    (at & !0xfff).wrapping_add(imm as u64)
}

fn lo12(linked: &Linked, at: u64, shift: u32) -> u64 {
    ((u64::from(linked.u32_at(at)) >> 10) & 0xfff) << shift
}

fn branch_target(linked: &Linked, at: u64) -> u64 {
    let imm = u64::from(linked.u32_at(at)) & 0x3ff_ffff;
    let imm = ((imm << 38) as i64 >> 38) << 2;
    at.wrapping_add(imm as u64)
}

#[test]
fn aarch64_got_loads_reach_a_slot_holding_the_symbol() {
    let arch = Architecture::Aarch64;
    let ext = 0x7f12_3456_7890u64;
    let mut code = Vec::new();
    code.extend(0x9000_0000u32.to_le_bytes()); // adrp x0, :got:ext_data
    code.extend(0xf940_0000u32.to_le_bytes()); // ldr x0, [x0, :got_lo12:ext_data]
    let bytes = object(
        arch,
        &code,
        &[
            reloc(0, R_AARCH64_ADR_GOT_PAGE.0, "ext_data", 0),
            reloc(4, R_AARCH64_LD64_GOT_LO12_NC.0, "ext_data", 0),
        ],
        &[],
    );
    let mut ctx = Ctx {
        externals: vec![("ext_data", ext)],
        ..Ctx::default()
    };
    let linked = link_object(arch, bytes, &mut ctx).expect("links");
    let text = linked.section(".text");
    let slot = adrp_page(&linked, text) + lo12(&linked, text + 4, 3);
    assert_eq!(linked.u64_at(slot), ext);
    assert_eq!(linked.module.counts.got_entries, 1);
}

#[test]
fn aarch64_far_calls_go_through_a_veneer_and_near_ones_do_not() {
    let arch = Architecture::Aarch64;
    let text = text_address(arch);
    let far = text + (1 << 28);
    let near = text + 0x2000;
    let mut code = Vec::new();
    code.extend(0x9400_0000u32.to_le_bytes()); // bl fn_far
    code.extend(0x1400_0000u32.to_le_bytes()); // b fn_near
    let bytes = object(
        arch,
        &code,
        &[
            reloc(0, R_AARCH64_CALL26.0, "fn_far", 0),
            reloc(4, R_AARCH64_JUMP26.0, "fn_near", 0),
        ],
        &[],
    );
    let mut ctx = Ctx {
        externals: vec![("fn_far", far), ("fn_near", near)],
        ..Ctx::default()
    };
    let linked = link_object(arch, bytes, &mut ctx).expect("links");
    assert_eq!(branch_target(&linked, text + 4), near);
    let stub = branch_target(&linked, text);
    assert_ne!(stub, far);
    // BTI c (the landing pad) / ADRP x16 / LDR x16, [x16, lo12] / BR x16.
    assert_eq!(linked.u32_at(stub), 0xd503_245f);
    assert_eq!(linked.u32_at(stub + 4) & 0x9f00_001f, 0x9000_0010);
    assert_eq!(linked.u32_at(stub + 8) & 0xffc0_03ff, 0xf940_0210);
    assert_eq!(linked.u32_at(stub + 12), 0xd61f_0200);
    let slot = adrp_page(&linked, stub + 4) + lo12(&linked, stub + 8, 3);
    assert_eq!(linked.u64_at(slot), far);
}

#[test]
fn aarch64_thread_locals_in_static_tls() {
    let arch = Architecture::Aarch64;
    let tp = 16i64;
    let mut code = Vec::new();
    for word in [
        0x9000_0000u32, // 0: adrp x0, :tlsdesc:tls_var
        0xf940_0001,    // 4: ldr x1, [x0, :tlsdesc_lo12:tls_var]
        0x9100_0000,    // 8: add x0, x0, :tlsdesc_lo12:tls_var
        0xd63f_0020,    // c: blr x1
        0x9000_0002,    // 10: adrp x2, :gottprel:tls_var
        0xf940_0042,    // 14: ldr x2, [x2, :gottprel_lo12:tls_var]
        0x9140_0063,    // 18: add x3, x3, :tprel_hi12:tls_var, lsl #12
        0x9100_0063,    // 1c: add x3, x3, :tprel_lo12_nc:tls_var
    ] {
        code.extend(word.to_le_bytes());
    }
    let relocs = [
        reloc(0, R_AARCH64_TLSDESC_ADR_PAGE21.0, "tls_var", 0),
        reloc(4, R_AARCH64_TLSDESC_LD64_LO12.0, "tls_var", 0),
        reloc(8, R_AARCH64_TLSDESC_ADD_LO12.0, "tls_var", 0),
        reloc(0xc, R_AARCH64_TLSDESC_CALL.0, "tls_var", 0),
        reloc(0x10, R_AARCH64_TLSIE_ADR_GOTTPREL_PAGE21.0, "tls_var", 0),
        reloc(0x14, R_AARCH64_TLSIE_LD64_GOTTPREL_LO12_NC.0, "tls_var", 0),
        reloc(0x18, R_AARCH64_TLSLE_ADD_TPREL_HI12.0, "tls_var", 0),
        reloc(0x1c, R_AARCH64_TLSLE_ADD_TPREL_LO12_NC.0, "tls_var", 0),
    ];
    let mut ctx = Ctx {
        tp_offset: Some(tp),
        ..Ctx::default()
    };
    let linked = link_object(arch, object(arch, &code, &relocs, &[]), &mut ctx).expect("links");
    let text = linked.section(".text");
    let offset = tp as u64 + TLS_VAR;
    // The descriptor: resolver, then the variable's offset from the thread pointer.
    let desc = adrp_page(&linked, text) + lo12(&linked, text + 4, 3);
    assert_eq!(desc, adrp_page(&linked, text) + lo12(&linked, text + 8, 0));
    let resolver = linked.u64_at(desc);
    assert_eq!(linked.u64_at(desc + 8), offset);
    assert_eq!(
        linked.u32_at(resolver),
        0xd503_245f,
        "bti c: reached by blr"
    );
    assert_eq!(linked.u32_at(resolver + 4), 0xf940_0400, "ldr x0, [x0, #8]");
    assert_eq!(linked.u32_at(resolver + 8), 0xd65f_03c0, "ret");
    // Initial-exec: a GOT entry holding the offset.
    let slot = adrp_page(&linked, text + 0x10) + lo12(&linked, text + 0x14, 3);
    assert_eq!(linked.u64_at(slot), offset);
    // Local-exec: the offset in two ADD immediates.
    assert_eq!(lo12(&linked, text + 0x18, 0), offset >> 12);
    assert_eq!(lo12(&linked, text + 0x1c, 0), offset & 0xfff);
    let tls = linked.module.tls.as_ref().expect("a TLS block");
    assert_eq!(tls.tp_offset, Some(tp));

    // TLSLE_ADD_TPREL_LO12 (checked) refuses an offset over 12 bits.
    let mut ctx = Ctx {
        tp_offset: Some(4096),
        ..Ctx::default()
    };
    let bytes = object(
        arch,
        &0x9100_0000u32.to_le_bytes(),
        &[reloc(0, R_AARCH64_TLSLE_ADD_TPREL_LO12.0, "tls_var", 0)],
        &[],
    );
    assert!(matches!(
        link_object(arch, bytes, &mut ctx),
        Err(LinkError::Overflow {
            kind: "R_AARCH64_TLSLE_ADD_TPREL_LO12",
            ..
        })
    ));
}

#[test]
fn aarch64_bad_input_gets_typed_errors_naming_object_section_offset_and_symbol() {
    let arch = Architecture::Aarch64;
    // A relocation Kiln does not know.
    let bytes = object(arch, &[0; 8], &[reloc(4, 270, "data_sym", 0)], &[]);
    match link_object(arch, bytes, &mut Ctx::default()) {
        Err(e @ LinkError::UnknownRelocation { .. }) => {
            assert_mentions(
                &e,
                &[
                    "test.o",
                    ".text",
                    "0x4",
                    "270",
                    "R_AARCH64_MOVW_SABS_G0",
                    "data_sym",
                ],
            );
        }
        other => panic!("{:?}", other.err()),
    }
    // A misaligned 8-byte load offset.
    let bytes = object(
        arch,
        &0xf940_0000u32.to_le_bytes(),
        &[reloc(0, R_AARCH64_LDST64_ABS_LO12_NC.0, "abs_t", 0)],
        &[("abs_t", 0x1004)],
    );
    match link_object(arch, bytes, &mut Ctx::default()) {
        Err(e @ LinkError::Misaligned { align: 8, .. }) => {
            assert_mentions(
                &e,
                &[
                    "test.o",
                    ".text",
                    "R_AARCH64_LDST64_ABS_LO12_NC",
                    "abs_t",
                    "0x1004",
                ],
            );
        }
        other => panic!("{:?}", other.err()),
    }
    // An AArch64 object in an x86-64 link, and the other way round.
    let bytes = object(arch, &[0; 8], &[], &[]);
    assert!(matches!(
        link_object(Architecture::X86_64, bytes, &mut Ctx::default()),
        Err(LinkError::WrongArchitecture {
            expected: Architecture::X86_64,
            ..
        })
    ));
    let bytes = object(Architecture::X86_64, &[0; 8], &[], &[]);
    assert!(matches!(
        link_object(arch, bytes, &mut Ctx::default()),
        Err(LinkError::WrongArchitecture {
            expected: Architecture::Aarch64,
            ..
        })
    ));
    // A branch beyond ±128 MiB to a symbol with no stub (an absolute one): no veneer.
    let text = text_address(arch);
    let bytes = object(
        arch,
        &0x9400_0000u32.to_le_bytes(),
        &[reloc(0, R_AARCH64_CALL26.0, "abs_t", 0)],
        &[("abs_t", text + (1 << 27))],
    );
    match link_object(arch, bytes, &mut Ctx::default()) {
        Err(e @ LinkError::Overflow { .. }) => {
            assert!(e.to_string().contains("R_AARCH64_CALL26"), "{e}")
        }
        other => panic!("{:?}", other.err()),
    }
}

#[test]
fn aarch64_unused_code_is_brk() {
    let arch = Architecture::Aarch64;
    let bytes = object(
        arch,
        &[0; 8],
        &[reloc(0, R_AARCH64_CALL26.0, "fn_x", 0)],
        &[],
    );
    let mut ctx = Ctx {
        externals: vec![("fn_x", 0x7000_0000_0000)],
        ..Ctx::default()
    };
    let linked = link_object(arch, bytes, &mut ctx).expect("links");
    let code = &linked.module.image[0];
    // The stub starts with its landing pad.
    let stub = branch_target(&linked, linked.section(".text"));
    assert_eq!(linked.u32_at(stub), 0xd503_245f);
    assert_eq!(code.bytes.len() % 4, 0);
    // Past the last stub, to the end of the code segment: BRK.
    let tail: Vec<u32> = (stub + 16..code.address + code.bytes.len() as u64)
        .step_by(4)
        .map(|a| linked.u32_at(a))
        .collect();
    assert!(tail.iter().all(|&w| w == 0xd420_0000), "{tail:x?}");
}

#[test]
fn x86_64_gotpcrelx_loads_of_local_symbols_become_direct() {
    let arch = Architecture::X86_64;
    let mut code = Vec::new();
    code.extend([0x48, 0x8b, 0x05, 0, 0, 0, 0]); // 0: mov data_sym@GOTPCREL(%rip), %rax
    code.extend([0xff, 0x15, 0, 0, 0, 0]); // 7: call *local_fn@GOTPCREL(%rip)
    code.extend([0xff, 0x25, 0, 0, 0, 0]); // d: jmp *local_fn@GOTPCREL(%rip)
    code.extend([0x48, 0x8b, 0x05, 0, 0, 0, 0]); // 13: mov ext_data@GOTPCREL(%rip), %rax
    code.extend([0x48, 0x8b, 0x05, 0, 0, 0, 0]); // 1a: mov data_sym@GOTPCREL(%rip) (no X)
    let relocs = [
        reloc(3, R_X86_64_REX_GOTPCRELX.0, "data_sym", -4),
        reloc(9, R_X86_64_GOTPCRELX.0, "local_fn", -4),
        reloc(0xf, R_X86_64_GOTPCRELX.0, "local_fn", -4),
        reloc(0x16, R_X86_64_REX_GOTPCRELX.0, "ext_data", -4),
        reloc(0x1d, R_X86_64_GOTPCREL.0, "data_sym", -4),
    ];
    let mut ctx = Ctx {
        externals: vec![("ext_data", 0x7f00_0000_0000)],
        ..Ctx::default()
    };
    let linked = link_object(arch, object(arch, &code, &relocs, &[]), &mut ctx).expect("links");
    let text = linked.section(".text");
    let data = linked.section(".data");
    let disp = |at: u64| i32::from_le_bytes(linked.read(at, 4).try_into().unwrap()) as i64;
    let target = |at: u64, next: u64| (next as i64 + disp(at)) as u64;
    // mov → lea of the symbol itself.
    assert_eq!(linked.read(text, 3), [0x48, 0x8d, 0x05]);
    assert_eq!(target(text + 3, text + 7), data + DATA_SYM);
    // call * → addr32 call.
    assert_eq!(linked.read(text + 7, 2), [0x67, 0xe8]);
    assert_eq!(target(text + 9, text + 0xd), text + LOCAL_FN);
    // jmp * → jmp; nop.
    assert_eq!(linked.read(text + 0xd, 1), [0xe9]);
    assert_eq!(target(text + 0xe, text + 0x12), text + LOCAL_FN);
    assert_eq!(linked.read(text + 0x12, 1), [0x90]);
    // A host symbol keeps its GOT load.
    assert_eq!(linked.read(text + 0x13, 3), [0x48, 0x8b, 0x05]);
    assert_eq!(
        linked.u64_at(target(text + 0x16, text + 0x1a)),
        0x7f00_0000_0000
    );
    // Plain GOTPCREL is not relaxed (the psABI allows it only for the X forms).
    assert_eq!(linked.read(text + 0x1a, 3), [0x48, 0x8b, 0x05]);
    assert_eq!(
        linked.u64_at(target(text + 0x1d, text + 0x21)),
        data + DATA_SYM
    );
}

#[test]
fn x86_64_far_calls_go_through_a_stub() {
    let arch = Architecture::X86_64;
    let far = 0x7f00_1234_5678u64;
    let bytes = object(
        arch,
        &[0xe8, 0, 0, 0, 0],
        &[reloc(1, R_X86_64_PLT32.0, "fn_far", -4)],
        &[],
    );
    let mut ctx = Ctx {
        externals: vec![("fn_far", far)],
        ..Ctx::default()
    };
    let linked = link_object(arch, bytes, &mut ctx).expect("links");
    let text = linked.section(".text");
    let disp = i32::from_le_bytes(linked.read(text + 1, 4).try_into().unwrap()) as i64;
    let stub = (text as i64 + 5 + disp) as u64;
    // endbr64 (the landing pad), jmp *slot(%rip), traps.
    assert_eq!(linked.read(stub, 4), [0xf3, 0x0f, 0x1e, 0xfa]);
    assert_eq!(linked.read(stub + 4, 2), [0xff, 0x25]);
    let slot_disp = i32::from_le_bytes(linked.read(stub + 6, 4).try_into().unwrap()) as i64;
    assert_eq!(linked.u64_at((stub as i64 + 10 + slot_disp) as u64), far);
    assert_eq!(linked.read(stub + 10, 1), [0xcc]);
}

#[test]
fn x86_64_thread_local_offsets() {
    let arch = Architecture::X86_64;
    let tp = -64i64;
    let mut code = vec![0u8; 0x20];
    code[..4].fill(0);
    let relocs = [
        reloc(0, R_X86_64_TPOFF32.0, "tls_var", 0), // R_X86_64_TPOFF32
        reloc(4, R_X86_64_GOTTPOFF.0, "tls_var", -4), // R_X86_64_GOTTPOFF
        reloc(8, R_X86_64_DTPOFF32.0, "tls_var", 0), // R_X86_64_DTPOFF32
        reloc(0x10, R_X86_64_DTPOFF64.0, "tls_var", 0), // R_X86_64_DTPOFF64
    ];
    let mut ctx = Ctx {
        tp_offset: Some(tp),
        ..Ctx::default()
    };
    let linked = link_object(arch, object(arch, &code, &relocs, &[]), &mut ctx).expect("links");
    let text = linked.section(".text");
    let i32_at = |at: u64| i32::from_le_bytes(linked.read(at, 4).try_into().unwrap()) as i64;
    assert_eq!(i32_at(text), tp + TLS_VAR as i64);
    let slot = (text as i64 + 8 + i32_at(text + 4)) as u64;
    assert_eq!(linked.u64_at(slot) as i64, tp + TLS_VAR as i64);
    assert_eq!(i32_at(text + 8), TLS_VAR as i64);
    assert_eq!(linked.u64_at(text + 0x10), TLS_VAR);
}

#[test]
fn x86_64_unknown_relocation_is_named() {
    let arch = Architecture::X86_64;
    let bytes = object(arch, &[0; 16], &[reloc(8, 7, "data_sym", 0)], &[]);
    match link_object(arch, bytes, &mut Ctx::default()) {
        Err(e @ LinkError::UnknownRelocation { .. }) => {
            assert_mentions(
                &e,
                &["test.o", ".text", "0x8", "R_X86_64_JUMP_SLOT", "data_sym"],
            );
        }
        other => panic!("{:?}", other.err()),
    }
}

#[test]
fn riscv64_relocations_patch_their_fields_and_refuse_the_first_value_out_of_range() {
    use Rel::*;
    let i = |bits: u32| 1i128 << bits;
    // A high part holds the value rounded to 4 KiB: ±2 GiB, offset by half a page.
    let upper = Some((-i(31) - 0x800, i(31) - 0x801));
    let cases = [
        case(
            R_RISCV_64.0,
            "R_RISCV_64",
            0,
            Absolute,
            Holds::Word(8),
            None,
        ),
        case(
            R_RISCV_32.0,
            "R_RISCV_32",
            0,
            Absolute,
            Holds::Word(4),
            Some((-i(31), i(32) - 1)),
        ),
        case(
            R_RISCV_32_PCREL.0,
            "R_RISCV_32_PCREL",
            0,
            Place,
            Holds::Word(4),
            Some((-i(31), i(31) - 1)),
        ),
        case(
            R_RISCV_PLT32.0,
            "R_RISCV_PLT32",
            0,
            Place,
            Holds::Word(4),
            Some((-i(31), i(31) - 1)),
        ),
        case(
            R_RISCV_SET8.0,
            "R_RISCV_SET8",
            0,
            Absolute,
            Holds::Word(1),
            None,
        ),
        case(
            R_RISCV_SET16.0,
            "R_RISCV_SET16",
            0,
            Absolute,
            Holds::Word(2),
            None,
        ),
        case(
            R_RISCV_SET32.0,
            "R_RISCV_SET32",
            0,
            Absolute,
            Holds::Word(4),
            None,
        ),
        // beq x0, x0; jal x0; auipc ra (+ jalr ra); auipc a0; lui a0; addi a0, a0;
        // sd a0, 0(a0); c.beqz a0; c.j.
        case(
            R_RISCV_BRANCH.0,
            "R_RISCV_BRANCH",
            0x0000_0063,
            Place,
            Holds::RvB,
            Some((-i(12), i(12) - 2)),
        ),
        case(
            R_RISCV_JAL.0,
            "R_RISCV_JAL",
            0x0000_006f,
            Place,
            Holds::RvJ,
            Some((-i(20), i(20) - 2)),
        ),
        case(
            R_RISCV_CALL.0,
            "R_RISCV_CALL",
            0x0000_0097,
            Place,
            Holds::RvCall,
            upper,
        ),
        case(
            R_RISCV_CALL_PLT.0,
            "R_RISCV_CALL_PLT",
            0x0000_0097,
            Place,
            Holds::RvCall,
            upper,
        ),
        case(
            R_RISCV_PCREL_HI20.0,
            "R_RISCV_PCREL_HI20",
            0x0000_0517,
            Place,
            Holds::RvUpper,
            upper,
        ),
        case(
            R_RISCV_HI20.0,
            "R_RISCV_HI20",
            0x0000_0537,
            Absolute,
            Holds::RvUpper,
            upper,
        ),
        case(
            R_RISCV_LO12_I.0,
            "R_RISCV_LO12_I",
            0x0005_0513,
            Absolute,
            Holds::RvI,
            None,
        ),
        case(
            R_RISCV_LO12_S.0,
            "R_RISCV_LO12_S",
            0x00a5_3023,
            Absolute,
            Holds::RvS,
            None,
        ),
        case(
            R_RISCV_RVC_BRANCH.0,
            "R_RISCV_RVC_BRANCH",
            0xc101,
            Place,
            Holds::RvCb,
            Some((-i(8), i(8) - 2)),
        ),
        case(
            R_RISCV_RVC_JUMP.0,
            "R_RISCV_RVC_JUMP",
            0xa001,
            Place,
            Holds::RvCj,
            Some((-i(11), i(11) - 2)),
        ),
    ];
    check_cases(Architecture::Riscv64, &cases);
}

/// RISC-V instructions of the tests below, and their decoding.
mod rv {
    pub(crate) const AUIPC_A0: u32 = 0x0000_0517;
    pub(crate) const ADDI_A0: u32 = 0x0005_0513;
    pub(crate) const LD_A0: u32 = 0x0005_3503;
    pub(crate) const SD_A1: u32 = 0x00b5_3023;
    pub(crate) const LUI_A0: u32 = 0x0000_0537;

    fn sext(v: u64, bits: u32) -> i64 {
        ((v << (64 - bits)) as i64) >> (64 - bits)
    }
    pub(crate) fn upper(word: u32) -> i64 {
        sext(u64::from(word >> 12), 20) << 12
    }
    pub(crate) fn lower_i(word: u32) -> i64 {
        sext(u64::from(word >> 20), 12)
    }
    pub(crate) fn lower_s(word: u32) -> i64 {
        sext(u64::from((word >> 25) << 5 | (word >> 7 & 0x1f)), 12)
    }
}

fn words(list: &[(usize, u32)]) -> Vec<u8> {
    let mut code = vec![0u8; 0x80];
    for &(at, word) in list {
        code[at..at + 4].copy_from_slice(&word.to_le_bytes());
    }
    code
}

#[test]
fn riscv64_low_parts_take_the_value_of_their_high_part() {
    let arch = Architecture::Riscv64;
    let text = text_address(arch);
    let ext = 0x7f12_3456_7890u64;
    let far = text + (1 << 33);
    let code = words(&[
        (0x40, rv::AUIPC_A0), // local_fn: auipc a0, %pcrel_hi(data_sym + 8)
        (0x44, rv::ADDI_A0),  // addi a0, a0, %pcrel_lo(local_fn)
        (0x48, rv::SD_A1),    // sd a1, %pcrel_lo(local_fn)(a0)
        (0x50, rv::AUIPC_A0), // auipc a0, %got_pcrel_hi(ext_data)
        (0x54, rv::LD_A0),    // ld a0, %pcrel_lo(.L50)(a0)
        (0x60, rv::AUIPC_A0), // auipc a0, %pcrel_hi(fn_far): a host function 8 GiB away
        (0x64, rv::ADDI_A0),  // addi a0, a0, %pcrel_lo(.L60)
        (0x70, rv::LUI_A0),   // lui a0, %hi(fn_far) (non-PIC: the address of a function)
        (0x74, rv::ADDI_A0),  // addi a0, a0, %lo(fn_far)
    ]);
    let relocs = [
        reloc(0x40, R_RISCV_PCREL_HI20.0, "data_sym", 8),
        reloc(0x44, R_RISCV_PCREL_LO12_I.0, "local_fn", 0),
        reloc(0x48, R_RISCV_PCREL_LO12_S.0, "local_fn", 0),
        reloc(0x50, R_RISCV_GOT_HI20.0, "ext_data", 0),
        reloc(0x54, R_RISCV_PCREL_LO12_I.0, "text+0x50", 0),
        reloc(0x60, R_RISCV_PCREL_HI20.0, "fn_far", 0),
        reloc(0x64, R_RISCV_PCREL_LO12_I.0, "text+0x60", 0),
        reloc(0x70, R_RISCV_HI20.0, "fn_far", 0),
        reloc(0x74, R_RISCV_LO12_I.0, "fn_far", 0),
    ];
    let mut ctx = Ctx {
        externals: vec![("ext_data", ext), ("fn_far", far)],
        ..Ctx::default()
    };
    let linked = link_object(arch, object(arch, &code, &relocs, &[]), &mut ctx).expect("links");
    assert_eq!(linked.section(".text"), text);
    let at = |offset: u64| linked.u32_at(text + offset);
    let pair = |hi: u64, lo: i64| (text + hi).wrapping_add((rv::upper(at(hi)) + lo) as u64);
    let data_sym = linked.section(".data") + DATA_SYM + 8;
    assert_eq!(pair(0x40, rv::lower_i(at(0x44))), data_sym);
    assert_eq!(pair(0x40, rv::lower_s(at(0x48))), data_sym);
    let slot = pair(0x50, rv::lower_i(at(0x54)));
    assert_eq!(linked.u64_at(slot), ext);
    // Both halves of the far address take the stub, whose slot holds the function.
    let stub = pair(0x60, rv::lower_i(at(0x64)));
    assert_ne!(stub, far);
    assert_eq!(linked.u32_at(stub) & 0xfff, 0xe17, "auipc t3");
    let stub_slot = stub.wrapping_add(
        (rv::upper(linked.u32_at(stub)) + rv::lower_i(linked.u32_at(stub + 4))) as u64,
    );
    assert_eq!(linked.u64_at(stub_slot), far);
    assert_eq!(linked.u32_at(stub + 8), 0x000e_0067, "jr t3");
    // Non-PIC, `lui` + `addi` of the same far function: both halves give the stub.
    let absolute = (rv::upper(at(0x70)) + rv::lower_i(at(0x74))) as u64;
    assert_eq!(
        absolute, stub,
        "%hi and %lo of a far function agree on its stub"
    );

    // A low part whose label has no high part: an error naming where.
    let relocs = [reloc(0x44, R_RISCV_PCREL_LO12_I.0, "text+0x48", 0)];
    match link_object(arch, object(arch, &code, &relocs, &[]), &mut Ctx::default()) {
        Err(e @ LinkError::BadRelocation { .. }) => {
            assert_mentions(
                &e,
                &[
                    "test.o",
                    ".text",
                    "R_RISCV_PCREL_LO12_I",
                    ".Lpcrel_48",
                    "no high part",
                ],
            );
        }
        Err(other) => panic!("{other}"),
        Ok(_) => panic!("a low part without its high part linked"),
    }
}

#[test]
fn riscv64_label_differences_change_the_bytes_in_place() {
    let arch = Architecture::Riscv64;
    let mut code = vec![0u8; 0x80];
    code[0..4].copy_from_slice(&100u32.to_le_bytes());
    code[0x10] = 0xc3; // DW_CFA_advance_loc 3
    code[0x11] = 0x45; // DW_CFA_advance_loc 5
    code[0x20..0x23].copy_from_slice(&[0x80, 0x80, 0x00]); // ULEB128 0 in three bytes
    code[0x28..0x30].copy_from_slice(&7u64.to_le_bytes());
    let absolutes = [("abs_a", 0x5000), ("abs_b", 0x1000), ("abs_big", 0x300)];
    let relocs = [
        reloc(0, R_RISCV_ADD32.0, "abs_a", 0),
        reloc(0, R_RISCV_SUB32.0, "abs_b", 0),
        reloc(0x10, R_RISCV_SET6.0, "abs_b", 0x25),
        reloc(0x11, R_RISCV_SUB6.0, "abs_b", -0x1000 + 2),
        reloc(0x20, R_RISCV_SET_ULEB128.0, "abs_big", 0),
        reloc(0x20, R_RISCV_SUB_ULEB128.0, "abs_b", -0x1000 + 0x200),
        reloc(0x28, R_RISCV_ADD64.0, "abs_a", 1),
        reloc(0x28, R_RISCV_SUB64.0, "abs_b", 0),
        reloc(0x30, R_RISCV_ADD16.0, "abs_b", 2),
        reloc(0x38, R_RISCV_SUB8.0, "abs_b", 1),
    ];
    let bytes = object(arch, &code, &relocs, &absolutes);
    let linked = link_object(arch, bytes, &mut Ctx::default()).expect("links");
    let text = linked.section(".text");
    assert_eq!(linked.u32_at(text), 100 + 0x4000);
    assert_eq!(linked.read(text + 0x10, 2), &[0xc0 | 0x25, 0x40 | 3]);
    // 0x300 − 0x200 = 256, still in three bytes.
    assert_eq!(linked.read(text + 0x20, 3), &[0x80, 0x82, 0x00]);
    assert_eq!(linked.u64_at(text + 0x28), 7 + 0x4001);
    assert_eq!(linked.read(text + 0x30, 2), &0x1002u16.to_le_bytes());
    assert_eq!(linked.read(text + 0x38, 1), &[(0u8).wrapping_sub(1)]);

    // A pair whose SET is an address (a label's, as `.uleb128 .L2 - .L1` gives in
    // `.gcc_except_table`): only the difference must fit the number's one byte.
    code[0x48] = 0;
    let relocs = [
        reloc(0x48, R_RISCV_SET_ULEB128.0, "text+0x30", 0),
        reloc(0x48, R_RISCV_SUB_ULEB128.0, "text+0x10", 0),
    ];
    let linked = link_object(
        arch,
        object(arch, &code, &relocs, &absolutes),
        &mut Ctx::default(),
    )
    .expect("a label difference links");
    let text = linked.section(".text");
    assert_eq!(linked.read(text + 0x48, 1), &[0x20]);

    // A ULEB128 that would need more bytes than it has: an error, not a longer number.
    let relocs = [reloc(0x40, R_RISCV_SET_ULEB128.0, "abs_big", 0)];
    match link_object(
        arch,
        object(arch, &code, &relocs, &absolutes),
        &mut Ctx::default(),
    ) {
        Err(e @ LinkError::Overflow { .. }) => {
            assert_mentions(&e, &["test.o", ".text", "R_RISCV_SET_ULEB128", "abs_big"]);
        }
        Err(other) => panic!("{other}"),
        Ok(_) => panic!("a 0x300 fit a one-byte ULEB128"),
    }
}

#[test]
fn riscv64_thread_locals_in_static_tls() {
    let arch = Architecture::Riscv64;
    // TLS variant I: the module's block at the thread pointer.
    let tp = 0i64;
    let code = words(&[
        (0x00, rv::LUI_A0),   // lui a0, %tprel_hi(tls_var)
        (0x04, ADD_A0_A0_TP), // add a0, a0, tp, %tprel_add(tls_var)
        (0x08, rv::ADDI_A0),  // addi a0, a0, %tprel_lo(tls_var)
        (0x0c, rv::SD_A1),    // sd a1, %tprel_lo(tls_var)(a0)
        (0x10, rv::AUIPC_A0), // auipc a0, %tls_ie_pcrel_hi(tls_var)
        (0x14, rv::LD_A0),    // ld a0, %pcrel_lo(.L10)(a0)
        (0x20, rv::AUIPC_A0), // auipc a0, %tls_gd_pcrel_hi(tls_var)
        (0x24, rv::ADDI_A0),  // addi a0, a0, %pcrel_lo(.L20)
        (0x30, rv::AUIPC_A0), // auipc a0, %tlsdesc_hi(tls_var)
        (0x34, rv::LD_A0),    // ld t0, %tlsdesc_load_lo(.L30)(a0)
        (0x38, rv::ADDI_A0),  // addi a0, a0, %tlsdesc_add_lo(.L30)
    ]);
    const ADD_A0_A0_TP: u32 = 0x0045_0533;
    let relocs = [
        reloc(0x00, R_RISCV_TPREL_HI20.0, "tls_var", 0),
        reloc(0x04, R_RISCV_TPREL_ADD.0, "tls_var", 0),
        reloc(0x08, R_RISCV_TPREL_LO12_I.0, "tls_var", 0),
        reloc(0x0c, R_RISCV_TPREL_LO12_S.0, "tls_var", 0),
        reloc(0x10, R_RISCV_TLS_GOT_HI20.0, "tls_var", 0),
        reloc(0x14, R_RISCV_PCREL_LO12_I.0, "text+0x10", 0),
        reloc(0x20, R_RISCV_TLS_GD_HI20.0, "tls_var", 0),
        reloc(0x24, R_RISCV_PCREL_LO12_I.0, "text+0x20", 0),
        reloc(0x30, R_RISCV_TLSDESC_HI20.0, "tls_var", 0),
        reloc(0x34, R_RISCV_TLSDESC_LOAD_LO12.0, "text+0x30", 0),
        reloc(0x38, R_RISCV_TLSDESC_ADD_LO12.0, "text+0x30", 0),
        reloc(0x38, R_RISCV_TLSDESC_CALL.0, "text+0x30", 0),
    ];
    let mut ctx = Ctx {
        tp_offset: Some(tp),
        ..Ctx::default()
    };
    let linked = link_object(arch, object(arch, &code, &relocs, &[]), &mut ctx).expect("links");
    let text = linked.section(".text");
    let at = |offset: u64| linked.u32_at(text + offset);
    let pair = |hi: u64, lo: i64| (text + hi).wrapping_add((rv::upper(at(hi)) + lo) as u64);
    let offset = tp + TLS_VAR as i64;
    assert_eq!(rv::upper(at(0)) + rv::lower_i(at(8)), offset);
    assert_eq!(rv::upper(at(0)) + rv::lower_s(at(0xc)), offset);
    assert_eq!(at(4), ADD_A0_A0_TP, "TPREL_ADD changes nothing");
    // Initial-exec: a GOT entry holding the offset from the thread pointer.
    assert_eq!(
        linked.u64_at(pair(0x10, rv::lower_i(at(0x14)))) as i64,
        offset
    );
    // General-dynamic: the GOT pair (module, offset − glibc's TLS_DTV_OFFSET).
    let gd = pair(0x20, rv::lower_i(at(0x24)));
    assert_eq!(linked.u64_at(gd), 7);
    assert_eq!(linked.u64_at(gd + 8), TLS_VAR.wrapping_sub(0x800));
    // A descriptor: Kiln's static resolver, then the offset it returns.
    let desc = pair(0x30, rv::lower_i(at(0x34)));
    assert_eq!(pair(0x30, rv::lower_i(at(0x38))), desc);
    let resolver = linked.u64_at(desc);
    assert_eq!(linked.u32_at(resolver), 0x0085_3503, "ld a0, 8(a0)");
    assert_eq!(linked.u32_at(resolver + 4), 0x0002_8067, "jr t0");
    assert_eq!(linked.u64_at(desc + 8) as i64, offset);
}

#[test]
fn riscv64_objects_of_another_abi_are_refused() {
    let arch = Architecture::Riscv64;
    let mut bytes = object(arch, &[], &[], &[]);
    // e_flags: RVC, soft-float (LP64).
    bytes[48..52].copy_from_slice(&1u32.to_le_bytes());
    match link_object(arch, bytes, &mut Ctx::default()) {
        Err(e @ LinkError::WrongArchitecture { .. }) => {
            assert_mentions(&e, &["test.o", "LP64 (soft-float)", "-mabi=lp64d"]);
        }
        Err(other) => panic!("{other}"),
        Ok(_) => panic!("a soft-float object linked for LP64D"),
    }
}

/// Rows whose value is not a plain function of S, A and P (GOT entries, the GOT's base,
/// sizes, TLS ids and offsets, markers), each put as a data word (or instruction) in
/// `.text` and its result read back through what it refers to.
struct Words {
    linked: Linked,
    text: u64,
    got: u64,
}

impl Words {
    fn link(
        arch: Architecture,
        code: &[u8],
        relocs: &[Reloc],
        externals: Vec<(&'static str, u64)>,
    ) -> Words {
        let mut ctx = Ctx {
            externals,
            tp_offset: Some(TP),
        };
        let linked = link_object(arch, object(arch, code, relocs, &[]), &mut ctx)
            .unwrap_or_else(|e| panic!("links: {e}"));
        let text = linked.section(".text");
        // The object has no read-only section: the read-only segment is the GOT alone.
        let got = linked
            .module
            .image
            .iter()
            .find(|s| s.permission == kiln_memory::Permission::Read)
            .expect("a read-only segment: the GOT")
            .address;
        Words { linked, text, got }
    }
    fn i32_at(&self, offset: u64) -> i64 {
        i64::from(self.linked.u32_at(self.text + offset) as i32)
    }
    fn u64_at(&self, offset: u64) -> u64 {
        self.linked.u64_at(self.text + offset)
    }
    fn place(&self, offset: u64) -> u64 {
        self.text + offset
    }
}

/// The thread pointer's offset the tests give static TLS.
const TP: i64 = 0x20;
const EXT: u64 = 0x7f12_3456_7890;

#[test]
fn x86_64_got_size_and_tls_rows() {
    let arch = Architecture::X86_64;
    let mut code = vec![0u8; 0x80];
    code[0x70..0x78].copy_from_slice(&[0xab; 8]);
    let relocs = [
        reloc(0x00, R_X86_64_GOT32.0, "ext_data", 4),
        reloc(0x08, R_X86_64_GOT64.0, "ext_data", 4),
        reloc(0x10, R_X86_64_GOTPCREL64.0, "ext_data", 4),
        reloc(0x18, R_X86_64_GOTPLT64.0, "ext_data", 0),
        reloc(0x20, R_X86_64_GOTOFF64.0, "data_sym", 2),
        reloc(0x28, R_X86_64_GOTPC32.0, "_GLOBAL_OFFSET_TABLE_", 3),
        reloc(0x30, R_X86_64_GOTPC64.0, "_GLOBAL_OFFSET_TABLE_", 3),
        reloc(0x38, R_X86_64_PLTOFF64.0, "local_fn", 0),
        reloc(0x40, R_X86_64_SIZE32.0, "data_sym", 1),
        reloc(0x48, R_X86_64_SIZE64.0, "data_sym", 2),
        reloc(0x50, R_X86_64_DTPMOD64.0, "tls_var", 0),
        reloc(0x58, R_X86_64_TPOFF64.0, "tls_var", 0),
        reloc(0x60, R_X86_64_TLSGD.0, "tls_var", -4),
        reloc(0x64, R_X86_64_TLSLD.0, "tls_var", -4),
        reloc(0x68, R_X86_64_GOTPC32_TLSDESC.0, "tls_var", -4),
        reloc(0x6c, R_X86_64_TLSDESC_CALL.0, "tls_var", 0),
        reloc(0x70, R_X86_64_NONE.0, "data_sym", 0),
    ];
    let w = Words::link(arch, &code, &relocs, vec![("ext_data", EXT)]);
    let got_slot = |offset_in_got: i64| w.linked.u64_at(w.got.wrapping_add(offset_in_got as u64));
    assert_eq!(got_slot(w.i32_at(0) - 4), EXT, "GOT32: G + A − GOT");
    assert_eq!(got_slot(w.u64_at(0x08) as i64 - 4), EXT, "GOT64");
    let slot = w.place(0x10).wrapping_add(w.u64_at(0x10)).wrapping_sub(4);
    assert_eq!(w.linked.u64_at(slot), EXT, "GOTPCREL64: G + A − P");
    assert_eq!(got_slot(w.u64_at(0x18) as i64), EXT, "GOTPLT64");
    let data_sym = w.linked.section(".data") + DATA_SYM;
    assert_eq!(
        w.got.wrapping_add(w.u64_at(0x20)),
        data_sym + 2,
        "GOTOFF64: S + A − GOT"
    );
    assert_eq!(
        w.place(0x28).wrapping_add(w.i32_at(0x28) as u64),
        w.got + 3,
        "GOTPC32"
    );
    assert_eq!(
        w.place(0x30).wrapping_add(w.u64_at(0x30)),
        w.got + 3,
        "GOTPC64"
    );
    assert_eq!(
        w.got.wrapping_add(w.u64_at(0x38)),
        w.text + LOCAL_FN,
        "PLTOFF64 of a near function: S − GOT"
    );
    assert_eq!(w.i32_at(0x40), 8 + 1, "SIZE32: Z + A");
    assert_eq!(w.u64_at(0x48), 8 + 2, "SIZE64");
    assert_eq!(w.u64_at(0x50), 7, "DTPMOD64: the module id");
    assert_eq!(w.u64_at(0x58) as i64, TP + TLS_VAR as i64, "TPOFF64");
    let pair = |offset: u64| {
        w.place(offset)
            .wrapping_add(w.i32_at(offset) as u64)
            .wrapping_add(4)
    };
    let gd = pair(0x60);
    assert_eq!(
        (w.linked.u64_at(gd), w.linked.u64_at(gd + 8)),
        (7, TLS_VAR),
        "TLSGD"
    );
    let ld = pair(0x64);
    assert_eq!(
        (w.linked.u64_at(ld), w.linked.u64_at(ld + 8)),
        (7, 0),
        "TLSLD"
    );
    let desc = pair(0x68);
    assert_eq!(
        w.linked.u64_at(desc + 8) as i64,
        TP + TLS_VAR as i64,
        "GOTPC32_TLSDESC"
    );
    assert_ne!(w.linked.u64_at(desc), 0, "the descriptor's resolver");
    assert_eq!(w.i32_at(0x6c), 0, "TLSDESC_CALL writes nothing");
    assert_eq!(
        w.linked.read(w.place(0x70), 8),
        &[0xab; 8],
        "NONE writes nothing"
    );

    // A TLS descriptor in data needs the loader's lazy resolution: refused, named.
    let bytes = object(
        arch,
        &[0; 8],
        &[reloc(0, R_X86_64_TLSDESC.0, "tls_var", 0)],
        &[],
    );
    let mut ctx = Ctx {
        tp_offset: Some(TP),
        ..Ctx::default()
    };
    match link_object(arch, bytes, &mut ctx) {
        Err(e @ LinkError::UnsupportedTls { .. }) => {
            assert_mentions(&e, &["test.o", ".text", "tls_var", "R_X86_64_TLSDESC"]);
        }
        Err(other) => panic!("{other}"),
        Ok(_) => panic!("R_X86_64_TLSDESC in data linked"),
    }
}

#[test]
fn aarch64_got_and_tls_rows() {
    let arch = Architecture::Aarch64;
    let mut code = vec![0u8; 0x80];
    let mut put = |at: usize, word: u32| code[at..at + 4].copy_from_slice(&word.to_le_bytes());
    put(0x10, 0x5800_0000); // ldr x0, :got:ext_data (literal)
    put(0x14, 0x5800_0000); // ldr x0, :gottprel:tls_var (literal)
    put(0x18, 0x1000_0000); // adr x0, :tlsgd:tls_var
    put(0x1c, 0x9000_0000); // adrp x0, :tlsgd:tls_var
    put(0x20, 0x9100_0000); // add x0, x0, :tlsgd_lo12:tls_var
    put(0x24, 0x5800_0000); // ldr x0, :tlsdesc:tls_var (literal)
    put(0x28, 0x1000_0000); // adr x0, :tlsdesc:tls_var
    put(0x2c, 0xf940_0001); // ldr x1, [x0] (TLSDESC_LDR marker)
    put(0x30, 0x9100_0000); // add x0, x0 (TLSDESC_ADD marker)
    code[0x70..0x78].copy_from_slice(&[0xab; 8]);
    let relocs = [
        reloc(0x00, R_AARCH64_GOTREL64.0, "data_sym", 2),
        reloc(0x08, R_AARCH64_GOTREL32.0, "data_sym", 2),
        reloc(0x0c, R_AARCH64_GOTPCREL32.0, "ext_data", 0),
        reloc(0x10, R_AARCH64_GOT_LD_PREL19.0, "ext_data", 0),
        reloc(0x14, R_AARCH64_TLSIE_LD_GOTTPREL_PREL19.0, "tls_var", 0),
        reloc(0x18, R_AARCH64_TLSGD_ADR_PREL21.0, "tls_var", 0),
        reloc(0x1c, R_AARCH64_TLSGD_ADR_PAGE21.0, "tls_var", 0),
        reloc(0x20, R_AARCH64_TLSGD_ADD_LO12_NC.0, "tls_var", 0),
        reloc(0x24, R_AARCH64_TLSDESC_LD_PREL19.0, "tls_var", 0),
        reloc(0x28, R_AARCH64_TLSDESC_ADR_PREL21.0, "tls_var", 0),
        reloc(0x2c, R_AARCH64_TLSDESC_LDR.0, "tls_var", 0),
        reloc(0x30, R_AARCH64_TLSDESC_ADD.0, "tls_var", 0),
        reloc(0x34, R_AARCH64_PLT32.0, "local_fn", 0),
        reloc(0x70, R_AARCH64_NONE.0, "data_sym", 0),
        reloc(0x74, 256, "data_sym", 0),
    ];
    let w = Words::link(arch, &code, &relocs, vec![("ext_data", EXT)]);
    let data_sym = w.linked.section(".data") + DATA_SYM;
    assert_eq!(
        w.got.wrapping_add(w.u64_at(0)),
        data_sym + 2,
        "GOTREL64: S + A − GOT"
    );
    assert_eq!(
        w.got.wrapping_add(w.i32_at(8) as u64),
        data_sym + 2,
        "GOTREL32"
    );
    let slot = w.place(0x0c).wrapping_add(w.i32_at(0x0c) as u64);
    assert_eq!(w.linked.u64_at(slot), EXT, "GOTPCREL32: G + A − P");
    // imm19 of a literal load, times 4, from the instruction.
    let literal = |offset: u64| {
        let imm = (u64::from(w.linked.u32_at(w.place(offset))) >> 5) & 0x7ffff;
        w.place(offset)
            .wrapping_add((((imm << 45) as i64) >> 43) as u64)
    };
    assert_eq!(w.linked.u64_at(literal(0x10)), EXT, "GOT_LD_PREL19");
    assert_eq!(
        w.linked.u64_at(literal(0x14)) as i64,
        TP + TLS_VAR as i64,
        "TLSIE_LD_GOTTPREL_PREL19"
    );
    let adr = |offset: u64| {
        let word = u64::from(w.linked.u32_at(w.place(offset)));
        let imm = ((word >> 29) & 3) | (((word >> 5) & 0x7ffff) << 2);
        w.place(offset)
            .wrapping_add((((imm << 43) as i64) >> 43) as u64)
    };
    let gd = adr(0x18);
    assert_eq!(
        (w.linked.u64_at(gd), w.linked.u64_at(gd + 8)),
        (7, TLS_VAR),
        "TLSGD_ADR_PREL21"
    );
    assert_eq!(
        adrp_page(&w.linked, w.place(0x1c)) + lo12(&w.linked, w.place(0x20), 0),
        gd,
        "TLSGD_ADR_PAGE21 + ADD_LO12_NC"
    );
    let desc = literal(0x24);
    assert_eq!(adr(0x28), desc, "TLSDESC_ADR_PREL21");
    assert_eq!(
        w.linked.u64_at(desc + 8) as i64,
        TP + TLS_VAR as i64,
        "TLSDESC_LD_PREL19"
    );
    assert_eq!(
        w.linked.u32_at(w.place(0x2c)),
        0xf940_0001,
        "TLSDESC_LDR writes nothing"
    );
    assert_eq!(
        w.linked.u32_at(w.place(0x30)),
        0x9100_0000,
        "TLSDESC_ADD writes nothing"
    );
    assert_eq!(
        w.place(0x34).wrapping_add(w.i32_at(0x34) as u64),
        w.text + LOCAL_FN,
        "PLT32: S + A − P"
    );
    assert_eq!(
        w.linked.read(w.place(0x70), 8),
        &[0xab; 8],
        "NONE (0 and 256) writes nothing"
    );
}

#[test]
fn aarch64_local_exec_rows_patch_their_fields_and_refuse_the_first_value_out_of_range() {
    use Rel::TpOff;
    let i = |bits: u32| 1i128 << bits;
    let lo = |shift: u32| Holds::Lo12 { shift };
    let checked = |shift: u32| Some((0, i(12) - (1 << shift)));
    let cases = [
        case(
            R_AARCH64_TLSLE_MOVW_TPREL_G2.0,
            "R_AARCH64_TLSLE_MOVW_TPREL_G2",
            0xd2c0_0000,
            TpOff,
            bits(5, 16, 32),
            Some((0, i(48) - 1)),
        ),
        case(
            R_AARCH64_TLSLE_MOVW_TPREL_G1.0,
            "R_AARCH64_TLSLE_MOVW_TPREL_G1",
            0xf2a0_0000,
            TpOff,
            bits(5, 16, 16),
            Some((0, i(32) - 1)),
        ),
        case(
            R_AARCH64_TLSLE_MOVW_TPREL_G1_NC.0,
            "R_AARCH64_TLSLE_MOVW_TPREL_G1_NC",
            0xf2a0_0000,
            TpOff,
            bits(5, 16, 16),
            None,
        ),
        case(
            R_AARCH64_TLSLE_MOVW_TPREL_G0.0,
            "R_AARCH64_TLSLE_MOVW_TPREL_G0",
            0xf280_0000,
            TpOff,
            bits(5, 16, 0),
            Some((0, i(16) - 1)),
        ),
        case(
            R_AARCH64_TLSLE_MOVW_TPREL_G0_NC.0,
            "R_AARCH64_TLSLE_MOVW_TPREL_G0_NC",
            0xf280_0000,
            TpOff,
            bits(5, 16, 0),
            None,
        ),
        case(
            R_AARCH64_TLSLE_LDST8_TPREL_LO12.0,
            "R_AARCH64_TLSLE_LDST8_TPREL_LO12",
            0x3940_0000,
            TpOff,
            lo(0),
            checked(0),
        ),
        case(
            R_AARCH64_TLSLE_LDST8_TPREL_LO12_NC.0,
            "R_AARCH64_TLSLE_LDST8_TPREL_LO12_NC",
            0x3940_0000,
            TpOff,
            lo(0),
            None,
        ),
        case(
            R_AARCH64_TLSLE_LDST16_TPREL_LO12.0,
            "R_AARCH64_TLSLE_LDST16_TPREL_LO12",
            0x7940_0000,
            TpOff,
            lo(1),
            checked(1),
        ),
        case(
            R_AARCH64_TLSLE_LDST16_TPREL_LO12_NC.0,
            "R_AARCH64_TLSLE_LDST16_TPREL_LO12_NC",
            0x7940_0000,
            TpOff,
            lo(1),
            None,
        ),
        case(
            R_AARCH64_TLSLE_LDST32_TPREL_LO12.0,
            "R_AARCH64_TLSLE_LDST32_TPREL_LO12",
            0xb940_0000,
            TpOff,
            lo(2),
            checked(2),
        ),
        case(
            R_AARCH64_TLSLE_LDST32_TPREL_LO12_NC.0,
            "R_AARCH64_TLSLE_LDST32_TPREL_LO12_NC",
            0xb940_0000,
            TpOff,
            lo(2),
            None,
        ),
        case(
            R_AARCH64_TLSLE_LDST64_TPREL_LO12.0,
            "R_AARCH64_TLSLE_LDST64_TPREL_LO12",
            0xf940_0000,
            TpOff,
            lo(3),
            checked(3),
        ),
        case(
            R_AARCH64_TLSLE_LDST64_TPREL_LO12_NC.0,
            "R_AARCH64_TLSLE_LDST64_TPREL_LO12_NC",
            0xf940_0000,
            TpOff,
            lo(3),
            None,
        ),
        case(
            R_AARCH64_TLSLE_LDST128_TPREL_LO12.0,
            "R_AARCH64_TLSLE_LDST128_TPREL_LO12",
            0x3dc0_0000,
            TpOff,
            lo(4),
            checked(4),
        ),
        case(
            R_AARCH64_TLSLE_LDST128_TPREL_LO12_NC.0,
            "R_AARCH64_TLSLE_LDST128_TPREL_LO12_NC",
            0x3dc0_0000,
            TpOff,
            lo(4),
            None,
        ),
    ];
    check_cases(Architecture::Aarch64, &cases);
}

#[test]
fn riscv64_data_rows_markers_and_c_lui() {
    let arch = Architecture::Riscv64;
    let mut code = vec![0u8; 0x80];
    code[0x30..0x32].copy_from_slice(&0x6501u16.to_le_bytes()); // c.lui a0, %hi(abs)
    code[0x34] = 7;
    code[0x36..0x38].copy_from_slice(&9u16.to_le_bytes());
    code[0x70..0x78].copy_from_slice(&[0xab; 8]);
    let relocs = [
        reloc(0x00, R_RISCV_TLS_DTPMOD64.0, "tls_var", 0),
        reloc(0x08, R_RISCV_TLS_DTPREL64.0, "tls_var", 0),
        reloc(0x10, R_RISCV_TLS_DTPREL32.0, "tls_var", 0),
        reloc(0x18, R_RISCV_TLS_TPREL64.0, "tls_var", 0),
        reloc(0x20, R_RISCV_GOT32_PCREL.0, "ext_data", 0),
        reloc(0x34, R_RISCV_ADD8.0, "text+0x0", 3),
        reloc(0x36, R_RISCV_SUB16.0, "text+0x0", 2),
        reloc(0x70, R_RISCV_NONE.0, "data_sym", 0),
        reloc(0x70, R_RISCV_RELAX.0, "data_sym", 0),
        reloc(0x74, R_RISCV_ALIGN.0, "data_sym", 4),
    ];
    let w = Words::link(arch, &code, &relocs, vec![("ext_data", EXT)]);
    assert_eq!(w.u64_at(0), 7, "TLS_DTPMOD64");
    assert_eq!(
        w.u64_at(8),
        TLS_VAR.wrapping_sub(0x800),
        "TLS_DTPREL64: glibc's DTV offset"
    );
    assert_eq!(w.i32_at(0x10), TLS_VAR as i64 - 0x800, "TLS_DTPREL32");
    assert_eq!(w.u64_at(0x18) as i64, TP + TLS_VAR as i64, "TLS_TPREL64");
    let slot = w.place(0x20).wrapping_add(w.i32_at(0x20) as u64);
    assert_eq!(w.linked.u64_at(slot), EXT, "GOT32_PCREL: G + A − P");
    assert_eq!(
        w.linked.read(w.place(0x34), 1)[0],
        7u8.wrapping_add((w.text + 3) as u8),
        "ADD8"
    );
    let sub = u16::from_le_bytes(w.linked.read(w.place(0x36), 2).try_into().unwrap());
    assert_eq!(sub, 9u16.wrapping_sub((w.text + 2) as u16), "SUB16");
    assert_eq!(
        w.linked.read(w.place(0x70), 8),
        &[0xab; 8],
        "NONE, RELAX and ALIGN write nothing"
    );

    // C.LUI: the upper part of 0x5000 + 0x123 (rounded), in its 6 bits.
    let relocs = [reloc(0x30, R_RISCV_RVC_LUI.0, "abs_lui", 0x123)];
    let bytes = object(arch, &code, &relocs, &[("abs_lui", 0x5000)]);
    let linked = link_object(arch, bytes, &mut Ctx::default()).expect("links");
    let at = linked.section(".text") + 0x30;
    let half = u64::from(u16::from_le_bytes(linked.read(at, 2).try_into().unwrap()));
    assert_eq!(
        half & 0xef83,
        0x6501 & 0xef83,
        "C.LUI keeps its opcode and register"
    );
    assert_eq!(((half >> 12) & 1) << 5 | ((half >> 2) & 0x1f), 5, "RVC_LUI");
    // C.LUI cannot hold 0.
    let relocs = [reloc(0x30, R_RISCV_RVC_LUI.0, "abs_zero", 0x100)];
    let bytes = object(arch, &code, &relocs, &[("abs_zero", 0)]);
    match link_object(arch, bytes, &mut Ctx::default()) {
        Err(e @ LinkError::Overflow { .. }) => {
            assert_mentions(&e, &["test.o", ".text", "R_RISCV_RVC_LUI", "abs_zero"]);
        }
        Err(other) => panic!("{other}"),
        Ok(_) => panic!("c.lui 0 linked"),
    }
}

/// Every row of every architecture's table is applied by some test of this file (named
/// by its `object::elf` constant where a relocation is made), not only the rows a
/// compiler happened to emit.
#[test]
fn every_row_of_every_architecture_is_exercised_here() {
    let source = include_str!("relocations.rs");
    for arch in [
        Architecture::X86_64,
        Architecture::Aarch64,
        Architecture::Riscv64,
    ] {
        // COFF's rows (x86-64) are applied in tests/coff.rs, by name.
        let coff = include_str!("coff.rs");
        let missing: Vec<&str> = arch
            .relocation_types()
            .map(|(_, name)| name)
            .filter(|name| {
                if name.starts_with("IMAGE_REL_AMD64_") {
                    !coff.contains(&format!("\"{name}\""))
                } else {
                    !source.contains(&format!("{name}.0,"))
                }
            })
            .collect();
        assert!(
            missing.is_empty(),
            "{arch}: rows no test applies: {missing:?}"
        );
    }
}
