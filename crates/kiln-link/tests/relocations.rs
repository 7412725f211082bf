//! Relocation arithmetic per type, for x86-64 and AArch64, without a host compiler.
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
    };
    let addend = i64::try_from(addend).expect("addend fits");
    let mut code = vec![0u8; 0x80];
    if !matches!(c.holds, Holds::Word(_)) {
        code[..4].copy_from_slice(&c.template.to_le_bytes());
    }
    let bytes = object(
        arch,
        &code,
        &[reloc(0, c.r_type, "abs_t", addend)],
        &[("abs_t", s)],
    );
    link_object(arch, bytes, &mut Ctx::default())
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
                _ => u64::from(linked.u32_at(text)),
            };
            assert_eq!(got & mask, bits, "{} with value {value:#x}: field", c.name);
            if !matches!(c.holds, Holds::Word(_)) {
                assert_eq!(
                    got & !mask,
                    u64::from(c.template) & !mask,
                    "{} changed bits outside its field",
                    c.name
                );
            }
        }
        let Some((min, max)) = c.range else { continue };
        let step = match c.holds {
            Holds::Bits { shift, .. } => 1i128 << shift,
            Holds::Adr { shift } => 1i128 << shift,
            _ => 1,
        };
        for outside in [max + step, min - step] {
            if matches!(c.rel, Rel::Absolute) && outside - 0x1000 > i128::from(i64::MAX) {
                continue;
            }
            match link_value(arch, c, text, outside) {
                Err(e @ LinkError::Overflow { .. }) => {
                    assert_mentions(&e, &["test.o", ".text", c.name, "abs_t"]);
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
        case(257, "R_AARCH64_ABS64", 0, Absolute, Holds::Word(8), None),
        case(
            258,
            "R_AARCH64_ABS32",
            0,
            Absolute,
            Holds::Word(4),
            Some((-i(31), i(32) - 1)),
        ),
        case(
            259,
            "R_AARCH64_ABS16",
            0,
            Absolute,
            Holds::Word(2),
            Some((-i(15), i(16) - 1)),
        ),
        case(260, "R_AARCH64_PREL64", 0, Place, Holds::Word(8), None),
        case(
            261,
            "R_AARCH64_PREL32",
            0,
            Place,
            Holds::Word(4),
            Some((-i(31), i(32) - 1)),
        ),
        case(
            262,
            "R_AARCH64_PREL16",
            0,
            Place,
            Holds::Word(2),
            Some((-i(15), i(16) - 1)),
        ),
        case(
            263,
            "R_AARCH64_MOVW_UABS_G0",
            0xd280_0000,
            Absolute,
            bits(5, 16, 0),
            Some((0, i(16) - 1)),
        ),
        case(
            264,
            "R_AARCH64_MOVW_UABS_G0_NC",
            0xf280_0000,
            Absolute,
            bits(5, 16, 0),
            None,
        ),
        case(
            265,
            "R_AARCH64_MOVW_UABS_G1",
            0xf2a0_0000,
            Absolute,
            bits(5, 16, 16),
            Some((0, i(32) - 1)),
        ),
        case(
            266,
            "R_AARCH64_MOVW_UABS_G1_NC",
            0xf2a0_0000,
            Absolute,
            bits(5, 16, 16),
            None,
        ),
        case(
            267,
            "R_AARCH64_MOVW_UABS_G2",
            0xf2c0_0000,
            Absolute,
            bits(5, 16, 32),
            Some((0, i(48) - 1)),
        ),
        case(
            268,
            "R_AARCH64_MOVW_UABS_G2_NC",
            0xf2c0_0000,
            Absolute,
            bits(5, 16, 32),
            None,
        ),
        case(
            269,
            "R_AARCH64_MOVW_UABS_G3",
            0xf2e0_0000,
            Absolute,
            bits(5, 16, 48),
            None,
        ),
        case(
            273,
            "R_AARCH64_LD_PREL_LO19",
            0x5800_0000,
            Place,
            bits(5, 19, 2),
            Some((-i(20), i(20) - 4)),
        ),
        case(
            274,
            "R_AARCH64_ADR_PREL_LO21",
            0x1000_0000,
            Place,
            Holds::Adr { shift: 0 },
            Some((-i(20), i(20) - 1)),
        ),
        case(
            275,
            "R_AARCH64_ADR_PREL_PG_HI21",
            0x9000_0000,
            Page,
            Holds::Adr { shift: 12 },
            Some((-i(32), i(32) - 4096)),
        ),
        case(
            276,
            "R_AARCH64_ADR_PREL_PG_HI21_NC",
            0x9000_0000,
            Page,
            Holds::Adr { shift: 12 },
            None,
        ),
        case(
            277,
            "R_AARCH64_ADD_ABS_LO12_NC",
            0x9100_0000,
            Absolute,
            Holds::Lo12 { shift: 0 },
            None,
        ),
        case(
            278,
            "R_AARCH64_LDST8_ABS_LO12_NC",
            0x3940_0000,
            Absolute,
            Holds::Lo12 { shift: 0 },
            None,
        ),
        case(
            279,
            "R_AARCH64_TSTBR14",
            0x3600_0000,
            Place,
            bits(5, 14, 2),
            Some((-i(15), i(15) - 4)),
        ),
        case(
            280,
            "R_AARCH64_CONDBR19",
            0x5400_0000,
            Place,
            bits(5, 19, 2),
            Some((-i(20), i(20) - 4)),
        ),
        case(
            282,
            "R_AARCH64_JUMP26",
            0x1400_0000,
            Place,
            bits(0, 26, 2),
            Some((-i(27), i(27) - 4)),
        ),
        case(
            283,
            "R_AARCH64_CALL26",
            0x9400_0000,
            Place,
            bits(0, 26, 2),
            Some((-i(27), i(27) - 4)),
        ),
        case(
            284,
            "R_AARCH64_LDST16_ABS_LO12_NC",
            0x7940_0000,
            Absolute,
            Holds::Lo12 { shift: 1 },
            None,
        ),
        case(
            285,
            "R_AARCH64_LDST32_ABS_LO12_NC",
            0xb940_0000,
            Absolute,
            Holds::Lo12 { shift: 2 },
            None,
        ),
        case(
            286,
            "R_AARCH64_LDST64_ABS_LO12_NC",
            0xf940_0000,
            Absolute,
            Holds::Lo12 { shift: 3 },
            None,
        ),
        case(
            299,
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
        case(1, "R_X86_64_64", 0, Absolute, Holds::Word(8), None),
        case(
            10,
            "R_X86_64_32",
            0,
            Absolute,
            Holds::Word(4),
            Some((0, i(32) - 1)),
        ),
        case(
            11,
            "R_X86_64_32S",
            0,
            Absolute,
            Holds::Word(4),
            Some((-i(31), i(31) - 1)),
        ),
        case(
            12,
            "R_X86_64_16",
            0,
            Absolute,
            Holds::Word(2),
            Some((0, i(16) - 1)),
        ),
        case(
            14,
            "R_X86_64_8",
            0,
            Absolute,
            Holds::Word(1),
            Some((0, 255)),
        ),
        case(
            2,
            "R_X86_64_PC32",
            0,
            Place,
            Holds::Word(4),
            Some((-i(31), i(31) - 1)),
        ),
        case(
            4,
            "R_X86_64_PLT32",
            0,
            Place,
            Holds::Word(4),
            Some((-i(31), i(31) - 1)),
        ),
        case(
            13,
            "R_X86_64_PC16",
            0,
            Place,
            Holds::Word(2),
            Some((-i(15), i(15) - 1)),
        ),
        case(
            15,
            "R_X86_64_PC8",
            0,
            Place,
            Holds::Word(1),
            Some((-128, 127)),
        ),
        case(24, "R_X86_64_PC64", 0, Place, Holds::Word(8), None),
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
        &[reloc(0, 311, "ext_data", 0), reloc(4, 312, "ext_data", 0)],
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
        &[reloc(0, 283, "fn_far", 0), reloc(4, 282, "fn_near", 0)],
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
        reloc(0, 562, "tls_var", 0),
        reloc(4, 563, "tls_var", 0),
        reloc(8, 564, "tls_var", 0),
        reloc(0xc, 569, "tls_var", 0),
        reloc(0x10, 541, "tls_var", 0),
        reloc(0x14, 542, "tls_var", 0),
        reloc(0x18, 549, "tls_var", 0),
        reloc(0x1c, 551, "tls_var", 0),
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
        &[reloc(0, 550, "tls_var", 0)],
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
        &[reloc(0, 286, "abs_t", 0)],
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
        &[reloc(0, 283, "abs_t", 0)],
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
    let bytes = object(arch, &[0; 8], &[reloc(0, 283, "fn_x", 0)], &[]);
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
        reloc(3, 42, "data_sym", -4),
        reloc(9, 41, "local_fn", -4),
        reloc(0xf, 41, "local_fn", -4),
        reloc(0x16, 42, "ext_data", -4),
        reloc(0x1d, 9, "data_sym", -4),
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
    let bytes = object(arch, &[0xe8, 0, 0, 0, 0], &[reloc(1, 4, "fn_far", -4)], &[]);
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
        reloc(0, 23, "tls_var", 0),    // R_X86_64_TPOFF32
        reloc(4, 22, "tls_var", -4),   // R_X86_64_GOTTPOFF
        reloc(8, 21, "tls_var", 0),    // R_X86_64_DTPOFF32
        reloc(0x10, 17, "tls_var", 0), // R_X86_64_DTPOFF64
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
