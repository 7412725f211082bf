//! The architecture seam: everything the linker knows about one instruction set lives
//! behind [`Arch`] — one table row per relocation type (what it computes, how its field is
//! encoded and range-checked, its psABI name), the stub that reaches a far function
//! through its GOT slot, the trap pattern that fills unused code, the resolver of TLS
//! descriptors in static TLS, and how a relocation that takes its value from a partner
//! (RISC-V's `%pcrel_lo`) is paired. `x86_64.rs`, `aarch64.rs` and `riscv64.rs` are its
//! implementations; nothing outside this folder depends on any of them.

/// One row of a relocation table, on one line: the type's `object::elf` constant (its
/// number and its name both come from it; `NUMBER as NAME` for a number `object` has no
/// constant for), what it refers to, what the value is relative to, the overflow check and
/// the field it is written to.
macro_rules! row {
    ($r_type:ident, $target:expr, $relative:expr, $check:expr, $field:expr) => {
        $crate::arch::Relocation::new(
            object::elf::$r_type.0,
            stringify!($r_type),
            $target,
            $relative,
            $check,
            $field,
        )
    };
    ($number:literal as $name:ident, $target:expr, $relative:expr, $check:expr, $field:expr) => {
        $crate::arch::Relocation::new(
            $number,
            stringify!($name),
            $target,
            $relative,
            $check,
            $field,
        )
    };
}

pub(crate) mod aarch64;
pub(crate) mod riscv64;
pub(crate) mod x86_64;

use std::fmt;

/// An instruction set Kiln links for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Architecture {
    /// x86-64 (AMD64), System V psABI.
    X86_64,
    /// AArch64 (ARM64), little-endian, ELF psABI for the Arm 64-bit architecture.
    Aarch64,
    /// RISC-V 64 (RV64GC), the LP64D ABI of Linux, RISC-V ELF psABI.
    Riscv64,
}

impl Architecture {
    /// The architecture of this process.
    pub const fn host() -> Architecture {
        if cfg!(target_arch = "aarch64") {
            Architecture::Aarch64
        } else if cfg!(target_arch = "riscv64") {
            Architecture::Riscv64
        } else {
            Architecture::X86_64
        }
    }

    /// The architecture a target triple names (`aarch64-unknown-linux-gnu`,
    /// `x86_64-linux-gnu`, `arm64-…`, `riscv64-…`); `None` for one Kiln does not link for.
    ///
    /// ```
    /// use kiln_link::Architecture;
    /// assert_eq!(Architecture::from_triple("aarch64-linux-gnu"), Some(Architecture::Aarch64));
    /// assert_eq!(Architecture::from_triple("riscv64-linux-gnu"), Some(Architecture::Riscv64));
    /// assert_eq!(Architecture::from_triple("riscv32-linux-gnu"), None);
    /// ```
    pub fn from_triple(triple: &str) -> Option<Architecture> {
        let arch = triple.split('-').next().unwrap_or("");
        match arch {
            "x86_64" | "amd64" => Some(Architecture::X86_64),
            "aarch64" | "arm64" => Some(Architecture::Aarch64),
            "riscv64" | "riscv64gc" => Some(Architecture::Riscv64),
            _ => None,
        }
    }

    /// The ELF `e_machine` of its objects.
    pub const fn elf_machine(self) -> u16 {
        match self {
            Architecture::X86_64 => object::elf::EM_X86_64.0,
            Architecture::Aarch64 => object::elf::EM_AARCH64.0,
            Architecture::Riscv64 => object::elf::EM_RISCV.0,
        }
    }

    /// Every relocation type Kiln applies for this architecture: its number and its psABI
    /// name, in the table's order (a type may have two numbers, as AArch64's `NONE`).
    ///
    /// ```
    /// use kiln_link::Architecture;
    /// let types: Vec<_> = Architecture::Riscv64.relocation_types().collect();
    /// assert!(types.contains(&(19, "R_RISCV_CALL_PLT")));
    /// ```
    pub fn relocation_types(self) -> impl Iterator<Item = (u32, &'static str)> {
        self.arch().relocations().iter().map(|r| (r.r_type, r.name))
    }

    /// The bytes that fill code memory nobody may run: a stray jump into them traps.
    pub fn trap_pattern(self) -> [u8; 4] {
        self.arch().trap()
    }

    pub(crate) fn arch(self) -> &'static dyn Arch {
        match self {
            Architecture::X86_64 => &x86_64::X86_64,
            Architecture::Aarch64 => &aarch64::Aarch64,
            Architecture::Riscv64 => &riscv64::Riscv64,
        }
    }
}

impl fmt::Display for Architecture {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Architecture::X86_64 => "x86-64",
            Architecture::Aarch64 => "AArch64",
            Architecture::Riscv64 => "RISC-V",
        })
    }
}

/// What a relocation's value is computed from (the "target" of its formula).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Target {
    /// Nothing to write (`R_*_NONE`, markers such as `TLSDESC_CALL`).
    Nothing,
    /// The symbol's address, S.
    Symbol,
    /// A call or jump to the symbol: S, or its stub's address when S is out of reach.
    Call,
    /// The symbol's GOT entry, G.
    GotEntry,
    /// The GOT's base, GOT.
    GotBase,
    /// The symbol's stub if it has one, else S (x86-64 `PLTOFF64`).
    Plt,
    /// The symbol's size, Z.
    Size,
    /// The GOT pair (module id, offset) of a general-dynamic thread-local.
    TlsGdEntry,
    /// The GOT pair of the module's own block (local-dynamic).
    TlsLdEntry,
    /// The GOT entry holding a thread-local's offset from the thread pointer
    /// (initial-exec).
    TpOffEntry,
    /// The GOT pair of a TLS descriptor.
    TlsDescEntry,
    /// The thread-local's offset from the thread pointer (local-exec).
    TpOff,
    /// The thread-local's offset in its module's block.
    DtpOff,
    /// The module's TLS module id.
    DtpMod,
    /// A form Kiln cannot support for JIT code; the text names the TLS model.
    Unsupported(&'static str),
    /// Whatever the partner relocation computes: the symbol is a label at an instruction
    /// whose own relocation (RISC-V's `%pcrel_hi`, `%got_pcrel_hi`, …) gives the value,
    /// taken relative to that instruction. The link replaces the edge by the row
    /// [`Arch::pair`] gives, aimed at the partner's target, before anything else reads it.
    Partner,
}

/// What the target is taken relative to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Relative {
    /// T + A.
    Absolute,
    /// T + A − P.
    Place,
    /// Page(T + A) − Page(P), 4 KiB pages (AArch64 `ADRP`).
    Page,
    /// T + A − GOT.
    GotBase,
    /// T + A − the module's image base, its lowest address (Windows' relative virtual
    /// addresses, `IMAGE_REL_AMD64_ADDR32NB`: unwind tables and their handlers' data).
    ImageBase,
}

/// Which values a field accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Check {
    /// Any (the value is truncated: `_NC` forms).
    None,
    /// −2^(bits−1) ≤ v < 2^(bits−1).
    Signed(u32),
    /// 0 ≤ v < 2^bits.
    Unsigned(u32),
    /// −2^(bits−1) ≤ v < 2^bits (a field read as either sign).
    Either(u32),
}

impl Check {
    pub(crate) fn accepts(self, v: i128) -> bool {
        match self {
            Check::None => true,
            Check::Signed(bits) => v >= -(1i128 << (bits - 1)) && v < (1i128 << (bits - 1)),
            Check::Unsigned(bits) => v >= 0 && v < (1i128 << bits),
            Check::Either(bits) => v >= -(1i128 << (bits - 1)) && v < (1i128 << bits),
        }
    }

    pub(crate) fn bits(self) -> u32 {
        match self {
            Check::None => 64,
            Check::Signed(b) | Check::Unsigned(b) | Check::Either(b) => b,
        }
    }
}

/// How a value is written into the relocated bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Field {
    /// A little-endian data word of 1, 2, 4 or 8 bytes.
    Word(u8),
    /// An AArch64 instruction's immediate: bits `[lsb, lsb + width)` of the 32-bit word
    /// get `value >> shift`; `value` must be a multiple of `2^shift` when `aligned`.
    Imm {
        lsb: u8,
        width: u8,
        shift: u8,
        aligned: bool,
    },
    /// AArch64 `ADR`/`ADRP`: 21 bits split into immlo (29..31) and immhi (5..24), of
    /// `value >> shift`.
    Adr { shift: u8 },
    /// AArch64 `MOVZ`/`MOVK`: imm16 (bits 5..21) = bits `[16 g, 16 g + 16)` of the value.
    Movw { group: u8 },
    /// AArch64 `ADD`/`LDR`/`STR` (unsigned immediate, bits 10..22): the low 12 bits of the
    /// value scaled down by the access size `2^shift`, which they must be a multiple of.
    Lo12 { shift: u8 },
    /// RISC-V U-type (`LUI`, `AUIPC`): bits 12..32 get the value rounded to the nearest
    /// 4 KiB, `(v + 0x800) >> 12`, so that a signed 12-bit low part completes it.
    UType,
    /// RISC-V I-type (`ADDI`, loads, `JALR`): bits 20..32 get the value's low 12 bits.
    IType,
    /// RISC-V S-type (stores): the value's low 12 bits, split over bits 7..12 and 25..32.
    SType,
    /// RISC-V B-type (conditional branches): a 13-bit even offset, scattered.
    BType,
    /// RISC-V J-type (`JAL`): a 21-bit even offset, scattered.
    JType,
    /// RISC-V `AUIPC` + `JALR` (`call`, `tail`): the U-type and I-type halves of one value
    /// in two consecutive instructions.
    CallPair,
    /// RISC-V compressed `C.BEQZ`/`C.BNEZ`: a 9-bit even offset in a 16-bit instruction.
    CbType,
    /// RISC-V compressed `C.J`: a 12-bit even offset in a 16-bit instruction.
    CjType,
    /// RISC-V compressed `C.LUI`: the U-type value's low 6 bits in a 16-bit instruction.
    CiLui,
    /// A data word of 1, 2, 4 or 8 bytes changed in place: the value added to, subtracted
    /// from or stored in what is there (RISC-V `ADD*`/`SUB*`/`SET*`, which give label
    /// differences that a relaxing assembler could not compute).
    InPlace { bytes: u8, op: InPlaceOp },
    /// The low 6 bits of a byte changed in place (RISC-V `SET6`/`SUB6`: DWARF's
    /// `DW_CFA_advance_loc` operand); the top two bits are kept.
    Low6 { op: InPlaceOp },
    /// A ULEB128 number changed in place, in as many bytes as it already has (RISC-V
    /// `SET_ULEB128`/`SUB_ULEB128`).
    Uleb128 { op: InPlaceOp },
}

/// What an in-place field does with the value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum InPlaceOp {
    /// Adds it to what is there.
    Add,
    /// Subtracts it from what is there.
    Sub,
    /// Replaces what is there.
    Set,
}

impl InPlaceOp {
    fn apply(self, old: u64, value: u64) -> u64 {
        match self {
            InPlaceOp::Add => old.wrapping_add(value),
            InPlaceOp::Sub => old.wrapping_sub(value),
            InPlaceOp::Set => value,
        }
    }
}

impl Field {
    /// Whether a checked value is the one rounded to 4 KiB that a U-type instruction
    /// holds (`v + 0x800`): a RISC-V high part, a `call`, or a low part checked as its
    /// high partner is. (Unchecked, the rounding changes nothing.)
    pub(crate) fn rounds_to_page(self, check: Check) -> bool {
        check != Check::None
            && matches!(
                self,
                Field::UType | Field::CallPair | Field::CiLui | Field::IType | Field::SType
            )
    }

    /// Bytes the field covers.
    pub(crate) fn len(self) -> u64 {
        match self {
            Field::Word(n) | Field::InPlace { bytes: n, .. } => u64::from(n),
            Field::CallPair => 8,
            Field::CbType | Field::CjType | Field::CiLui => 2,
            // At least one byte; the number's end is found as it is written.
            Field::Low6 { .. } | Field::Uleb128 { .. } => 1,
            _ => 4,
        }
    }
}

/// One relocation type: its psABI number and name, what it computes, which values fit,
/// how it is written.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Relocation {
    pub(crate) r_type: u32,
    pub(crate) name: &'static str,
    pub(crate) target: Target,
    pub(crate) relative: Relative,
    pub(crate) check: Check,
    pub(crate) field: Field,
}

impl Relocation {
    pub(crate) const fn new(
        r_type: u32,
        name: &'static str,
        target: Target,
        relative: Relative,
        check: Check,
        field: Field,
    ) -> Self {
        Relocation {
            r_type,
            name,
            target,
            relative,
            check,
            field,
        }
    }

    /// Whether this is a non-PIC absolute reference that only fits in the low 2 (or 4)
    /// GiB: a 32-bit word, or RISC-V's `LUI`.
    pub(crate) fn needs_low_memory(&self) -> bool {
        self.target == Target::Symbol
            && self.relative == Relative::Absolute
            && self.check != Check::None
            && self.check.bits() == 32
    }

    /// Whether the checked value is the one rounded to 4 KiB that a U-type instruction
    /// holds (`v + 0x800`): a RISC-V high part, a `call`, or a low part checked as its
    /// high partner is.
    pub(crate) fn rounds_to_page(&self) -> bool {
        self.field.rounds_to_page(self.check)
    }
}

/// Why a value could not be written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum EncodeError {
    /// The value does not fit the field.
    Range,
    /// The value is not a multiple of what the instruction scales by.
    Misaligned(u32),
}

/// Writes `value` into the field at the start of `bytes` (which holds at least
/// [`Field::len`] bytes), after checking it.
pub(crate) fn encode(
    field: Field,
    check: Check,
    value: i128,
    bytes: &mut [u8],
) -> Result<(), EncodeError> {
    // A U-type high part is the value rounded to 4 KiB: that is what must fit.
    let checked = if field.rounds_to_page(check) {
        value + 0x800
    } else {
        value
    };
    if !check.accepts(checked) {
        return Err(EncodeError::Range);
    }
    let v = value as u64;
    let even = |bits: u64| -> Result<u64, EncodeError> {
        if bits & 1 != 0 {
            Err(EncodeError::Misaligned(2))
        } else {
            Ok(bits)
        }
    };
    match field {
        Field::Word(8) => bytes[..8].copy_from_slice(&v.to_le_bytes()),
        Field::Word(4) => bytes[..4].copy_from_slice(&(v as u32).to_le_bytes()),
        Field::Word(2) => bytes[..2].copy_from_slice(&(v as u16).to_le_bytes()),
        Field::Word(_) => bytes[0] = v as u8,
        Field::Imm {
            lsb,
            width,
            shift,
            aligned,
        } => {
            if aligned && v & ((1u64 << shift) - 1) != 0 {
                return Err(EncodeError::Misaligned(1 << shift));
            }
            let imm = (v >> shift) & ((1u64 << width) - 1);
            insert(bytes, u32::from(lsb), u32::from(width), imm as u32);
        }
        Field::Adr { shift } => {
            let imm = (v >> shift) as u32 & 0x1f_ffff;
            insert(bytes, 29, 2, imm & 3);
            insert(bytes, 5, 19, imm >> 2);
        }
        Field::Lo12 { shift } => {
            let low = v & 0xfff;
            if low & ((1u64 << shift) - 1) != 0 {
                return Err(EncodeError::Misaligned(1 << shift));
            }
            insert(bytes, 10, 12, (low >> shift) as u32);
        }
        Field::Movw { group } => {
            let imm = (v >> (16 * u32::from(group))) as u32 & 0xffff;
            insert(bytes, 5, 16, imm);
        }
        Field::UType => insert(bytes, 12, 20, (v.wrapping_add(0x800) >> 12) as u32),
        Field::IType => insert(bytes, 20, 12, v as u32),
        Field::SType => {
            insert(bytes, 7, 5, v as u32);
            insert(bytes, 25, 7, (v >> 5) as u32);
        }
        Field::BType => {
            let v = even(v)?;
            insert(bytes, 8, 4, (v >> 1) as u32);
            insert(bytes, 25, 6, (v >> 5) as u32);
            insert(bytes, 7, 1, (v >> 11) as u32);
            insert(bytes, 31, 1, (v >> 12) as u32);
        }
        Field::JType => {
            let v = even(v)?;
            insert(bytes, 21, 10, (v >> 1) as u32);
            insert(bytes, 20, 1, (v >> 11) as u32);
            insert(bytes, 12, 8, (v >> 12) as u32);
            insert(bytes, 31, 1, (v >> 20) as u32);
        }
        Field::CallPair => {
            insert(bytes, 12, 20, (v.wrapping_add(0x800) >> 12) as u32);
            insert(&mut bytes[4..], 20, 12, v as u32);
        }
        Field::CbType => {
            let v = even(v)?;
            // offset[8|4:3] in bits 12|11:10, offset[7:6|2:1|5] in bits 6:5|4:3|2.
            let bit = |n: u32| ((v >> n) & 1) as u16;
            let mut half = u16::from_le_bytes([bytes[0], bytes[1]]) & !0b1_1100_0111_1100;
            half |= bit(8) << 12 | bit(4) << 11 | bit(3) << 10;
            half |= bit(7) << 6 | bit(6) << 5 | bit(2) << 4 | bit(1) << 3 | bit(5) << 2;
            bytes[..2].copy_from_slice(&half.to_le_bytes());
        }
        Field::CjType => {
            let v = even(v)?;
            // offset[11|4|9:8|10|6|7|3:1|5] in bits 12..2.
            let bit = |n: u32| ((v >> n) & 1) as u16;
            let mut half = u16::from_le_bytes([bytes[0], bytes[1]]) & !0b1_1111_1111_1100;
            half |= bit(11) << 12 | bit(4) << 11 | bit(9) << 10 | bit(8) << 9 | bit(10) << 8;
            half |= bit(6) << 7 | bit(7) << 6 | bit(3) << 5 | bit(2) << 4 | bit(1) << 3;
            half |= bit(5) << 2;
            bytes[..2].copy_from_slice(&half.to_le_bytes());
        }
        Field::CiLui => {
            // nzimm[17] in bit 12, nzimm[16:12] in bits 6:2; 0 is not a C.LUI.
            let hi = v.wrapping_add(0x800) >> 12;
            if hi & 0x3f == 0 {
                return Err(EncodeError::Range);
            }
            let mut half = u16::from_le_bytes([bytes[0], bytes[1]]) & !0b1_0000_0111_1100;
            half |= (((hi >> 5) & 1) as u16) << 12 | ((hi & 0x1f) as u16) << 2;
            bytes[..2].copy_from_slice(&half.to_le_bytes());
        }
        Field::InPlace { bytes: n, op } => {
            let n = usize::from(n);
            let mut word = [0u8; 8];
            word[..n].copy_from_slice(&bytes[..n]);
            let new = op.apply(u64::from_le_bytes(word), v).to_le_bytes();
            bytes[..n].copy_from_slice(&new[..n]);
        }
        Field::Low6 { op } => {
            let new = op.apply(u64::from(bytes[0] & 0x3f), v) as u8;
            bytes[0] = (bytes[0] & 0xc0) | (new & 0x3f);
        }
        Field::Uleb128 { op } => {
            // The number keeps its length: its last byte is the first without bit 7.
            let len = bytes
                .iter()
                .position(|b| b & 0x80 == 0)
                .ok_or(EncodeError::Range)?
                + 1;
            let mut old = 0u64;
            for (i, b) in bytes[..len].iter().enumerate().take(10) {
                old |= u64::from(b & 0x7f) << (7 * i);
            }
            let mut new = op.apply(old, v);
            // Unchecked (a pair's parts): modulo the number's length.
            if check != Check::None && len < 10 && new >> (7 * len) != 0 {
                return Err(EncodeError::Range);
            }
            for (i, b) in bytes[..len].iter_mut().enumerate() {
                *b = (new & 0x7f) as u8 | if i + 1 < len { 0x80 } else { 0 };
                new >>= 7;
            }
        }
    }
    Ok(())
}

/// Writes 32-bit instruction words, little-endian, at the start of `bytes`.
pub(crate) fn write_words(bytes: &mut [u8], words: &[u32]) {
    for (at, word) in bytes.chunks_exact_mut(4).zip(words) {
        at.copy_from_slice(&word.to_le_bytes());
    }
}

/// Puts `value` in bits `[lsb, lsb + width)` of the little-endian instruction word.
fn insert(bytes: &mut [u8], lsb: u32, width: u32, value: u32) {
    let mut word = u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
    let mask = (((1u64 << width) - 1) as u32) << lsb;
    word = (word & !mask) | ((value << lsb) & mask);
    bytes[..4].copy_from_slice(&word.to_le_bytes());
}

/// The rows of `table` by type number.
fn index(table: &'static [Relocation]) -> Vec<Option<&'static Relocation>> {
    let len = table
        .iter()
        .map(|r| r.r_type as usize + 1)
        .max()
        .unwrap_or(0);
    let mut index = vec![None; len];
    for row in table {
        index[row.r_type as usize] = Some(row);
    }
    index
}

/// A relocation at a stub [`Arch::write_stub`] wrote, in an object.
#[derive(Debug, Clone, Copy)]
pub(crate) struct StubRelocation {
    /// Its offset from the stub's start.
    pub(crate) offset: u64,
    /// Its type.
    pub(crate) r_type: u32,
    /// What it refers to.
    pub(crate) target: StubTarget,
}

impl StubRelocation {
    /// A relocation of type `r_type` at `offset` against `target`.
    pub(crate) const fn new(offset: u64, r_type: u32, target: StubTarget) -> Self {
        StubRelocation {
            offset,
            r_type,
            target,
        }
    }
}

/// What a [`StubRelocation`] refers to.
#[derive(Debug, Clone, Copy)]
pub(crate) enum StubTarget {
    /// The stub's slot, plus an addend.
    Slot(i64),
    /// A label at the stub's first byte (RISC-V: `%pcrel_lo` names its `%pcrel_hi`).
    Start,
}

/// What an instruction set brings to a link.
pub(crate) trait Arch: Sync {
    /// Which one it is.
    fn architecture(&self) -> Architecture;
    /// Every relocation type Kiln applies, one row each.
    fn relocations(&self) -> &'static [Relocation];
    /// Every row by type number (`None` where Kiln applies none), built on first use: a
    /// link looks a row up once per relocation, and takes this once per object.
    fn relocation_index(&self) -> &'static [Option<&'static Relocation>] {
        static INDEXES: [std::sync::OnceLock<Vec<Option<&'static Relocation>>>; 3] =
            [const { std::sync::OnceLock::new() }; 3];
        INDEXES[self.architecture() as usize].get_or_init(|| index(self.relocations()))
    }
    /// The row of relocation type `r_type`, `None` if Kiln does not implement it.
    fn relocation(&self, r_type: u32) -> Option<&'static Relocation> {
        self.relocation_index()
            .get(r_type as usize)
            .copied()
            .flatten()
    }
    /// The psABI name of a type Kiln does not apply (dynamic ones, forms compilers do not
    /// emit), for messages; `"unknown"` if the psABI has none.
    fn unapplied_name(&self, r_type: u32) -> &'static str;
    /// The row of the relocation type named `name` (`R_X86_64_64`), if Kiln applies it.
    fn relocation_named(&self, name: &str) -> Option<&'static Relocation> {
        self.relocations().iter().find(|r| r.name == name)
    }
    /// The psABI name of `r_type`, also for types Kiln does not implement.
    fn relocation_name(&self, r_type: u32) -> &'static str {
        self.relocation(r_type)
            .map_or_else(|| self.unapplied_name(r_type), |r| r.name)
    }
    /// Bytes of one stub.
    fn stub_size(&self) -> u64 {
        16
    }
    /// Writes a stub at `stub_address` that jumps to the address held in the GOT entry at
    /// `slot_address`; `Err` with the displacement that does not fit.
    fn write_stub(&self, stub: &mut [u8], stub_address: u64, slot_address: u64)
        -> Result<(), i128>;
    /// The relocations an object needs at a stub [`Arch::write_stub`] wrote at the start
    /// of a section, for it to reach its slot (a call-through stub's object:
    /// [`crate::call_through`]).
    fn stub_relocations(&self) -> &'static [StubRelocation];
    /// Writes the second half of a call-through stub (16 bytes at `entry`), where its
    /// slot leads before its function has a body: a landing pad where indirect branches
    /// need one, the stub's `id` put where the executor's lazy entry takes it, and a
    /// branch `to_common` bytes on (to the tail of the stubs, a stub of the entry's
    /// address). Fixed code, no relocation: `to_common` is within the stubs' section.
    fn write_lazy_entry(&self, entry: &mut [u8], id: u32, to_common: i64);
    /// The psABI's 64-bit absolute relocation (`R_X86_64_64`): the slots of an object of
    /// call-through stubs point at their entries with it.
    fn absolute64(&self) -> u32;
    /// The ELF `e_flags` of an object Kiln writes (the ABI Kiln links for).
    fn elf_flags(&self) -> u32 {
        0
    }
    /// Four bytes that trap when executed, repeated over unused code.
    fn trap(&self) -> [u8; 4];
    /// Code that resolves a TLS descriptor of a block in static TLS: the descriptor's
    /// second word is the variable's offset from the thread pointer.
    fn tlsdesc_static_resolver(&self) -> &'static [u8];
    /// How far a direct call reaches (bytes either way); a module whose code is larger
    /// calls its own functions through stubs.
    fn call_reach(&self) -> u64;
    /// Whether `row` can reach its target directly: `direct` is the value computed
    /// without a stub, `s`, `a` and `p` its parts. A symbol that cannot be reached
    /// directly is reached through its stub, if it has one.
    fn reaches(&self, row: &Relocation, direct: i128, s: u64, a: i64, p: u64) -> bool {
        let _ = (s, a, p);
        row.check.accepts(direct)
    }
    /// The row a relocation whose target is [`Target::Partner`] (`lo`) becomes when its
    /// partner is `hi`: the partner's target, taken relative to the partner's place,
    /// written in `lo`'s field. `None` if `hi` cannot be its partner.
    fn pair(&self, lo: &Relocation, hi: &Relocation) -> Option<&'static Relocation> {
        let _ = (lo, hi);
        None
    }
    /// The rows two relocations at one offset become when they compute one value together
    /// (RISC-V's `SET_ULEB128` then `SUB_ULEB128`: a label difference, written modulo the
    /// number's length as other linkers do, where either alone is checked); `None` for
    /// any other two.
    fn pair_at_one_offset(
        &self,
        first: &Relocation,
        second: &Relocation,
    ) -> Option<(&'static Relocation, &'static Relocation)> {
        let _ = (first, second);
        None
    }
    /// What a thread-local's offset in its block is biased by in the GOT and in debug
    /// information (`DTPOFF`): glibc's `TLS_DTV_OFFSET`, 0x800 on RISC-V, else 0.
    fn dtv_offset(&self) -> u64 {
        0
    }
    /// Rewrites an instruction so it no longer goes through a GOT entry, when the psABI
    /// allows it (x86-64 `GOTPCRELX`): returns the new relocation to apply at the new
    /// offset, or `None` to keep the GOT load. `section` is the whole section, `offset`
    /// the relocation's.
    fn relax_got(
        &self,
        r_type: u32,
        section: &mut [u8],
        offset: u64,
    ) -> Option<(&'static Relocation, u64)> {
        let _ = (r_type, section, offset);
        None
    }
}
