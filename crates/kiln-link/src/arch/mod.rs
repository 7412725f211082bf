//! The architecture seam: everything the linker knows about one instruction set lives
//! behind [`Arch`] — one table row per relocation type (what it computes, how its field is
//! encoded and range-checked, its psABI name), the stub that reaches a far function
//! through its GOT slot, the trap pattern that fills unused code, and the resolver of TLS
//! descriptors in static TLS. `x86_64.rs` and `aarch64.rs` are its two implementations;
//! nothing outside this folder depends on either.

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
pub(crate) mod x86_64;

use std::fmt;

/// An instruction set Kiln links for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Architecture {
    /// x86-64 (AMD64), System V psABI.
    X86_64,
    /// AArch64 (ARM64), little-endian, ELF psABI for the Arm 64-bit architecture.
    Aarch64,
}

impl Architecture {
    /// The architecture of this process.
    pub const fn host() -> Architecture {
        if cfg!(target_arch = "aarch64") {
            Architecture::Aarch64
        } else {
            Architecture::X86_64
        }
    }

    /// The architecture a target triple names (`aarch64-unknown-linux-gnu`,
    /// `x86_64-linux-gnu`, `arm64-…`); `None` for one Kiln does not link for.
    ///
    /// ```
    /// use kiln_link::Architecture;
    /// assert_eq!(Architecture::from_triple("aarch64-linux-gnu"), Some(Architecture::Aarch64));
    /// assert_eq!(Architecture::from_triple("riscv64-linux-gnu"), None);
    /// ```
    pub fn from_triple(triple: &str) -> Option<Architecture> {
        let arch = triple.split('-').next().unwrap_or("");
        match arch {
            "x86_64" | "amd64" => Some(Architecture::X86_64),
            "aarch64" | "arm64" => Some(Architecture::Aarch64),
            _ => None,
        }
    }

    /// The ELF `e_machine` of its objects.
    pub const fn elf_machine(self) -> u16 {
        match self {
            Architecture::X86_64 => object::elf::EM_X86_64.0,
            Architecture::Aarch64 => object::elf::EM_AARCH64.0,
        }
    }

    /// The bytes that fill code memory nobody may run: a stray jump into them traps.
    pub fn trap_pattern(self) -> [u8; 4] {
        self.arch().trap()
    }

    pub(crate) fn arch(self) -> &'static dyn Arch {
        match self {
            Architecture::X86_64 => &x86_64::X86_64,
            Architecture::Aarch64 => &aarch64::Aarch64,
        }
    }
}

impl fmt::Display for Architecture {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Architecture::X86_64 => "x86-64",
            Architecture::Aarch64 => "AArch64",
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
}

impl Field {
    /// Bytes the field covers.
    pub(crate) fn len(self) -> u64 {
        match self {
            Field::Word(n) => u64::from(n),
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

    /// Whether this is a non-PIC absolute reference that only fits in the low 2 GiB.
    pub(crate) fn needs_low_memory(&self) -> bool {
        self.target == Target::Symbol
            && self.relative == Relative::Absolute
            && matches!(self.field, Field::Word(4))
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
    if !check.accepts(value) {
        return Err(EncodeError::Range);
    }
    let v = value as u64;
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
    }
    Ok(())
}

/// Puts `value` in bits `[lsb, lsb + width)` of the little-endian instruction word.
fn insert(bytes: &mut [u8], lsb: u32, width: u32, value: u32) {
    let mut word = u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
    let mask = (((1u64 << width) - 1) as u32) << lsb;
    word = (word & !mask) | ((value << lsb) & mask);
    bytes[..4].copy_from_slice(&word.to_le_bytes());
}

/// The row of `r_type` in `table`, through an index by type number built on first use
/// (a link looks a row up once per relocation).
pub(crate) fn index(
    cell: &'static std::sync::OnceLock<Vec<Option<&'static Relocation>>>,
    table: &'static [Relocation],
    r_type: u32,
) -> Option<&'static Relocation> {
    let index = cell.get_or_init(|| {
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
    });
    index.get(r_type as usize).copied().flatten()
}

/// What an instruction set brings to a link.
pub(crate) trait Arch: Sync {
    /// Which one it is.
    fn architecture(&self) -> Architecture;
    /// The row of relocation type `r_type`, `None` if Kiln does not implement it.
    fn relocation(&self, r_type: u32) -> Option<&'static Relocation>;
    /// Every relocation type Kiln applies, one row each.
    fn relocations(&self) -> &'static [Relocation];
    /// The row of the relocation type named `name` (`R_X86_64_64`), if Kiln applies it.
    fn relocation_named(&self, name: &str) -> Option<&'static Relocation> {
        self.relocations().iter().find(|r| r.name == name)
    }
    /// The psABI name of `r_type`, also for types Kiln does not implement.
    fn relocation_name(&self, r_type: u32) -> &'static str;
    /// Bytes of one stub.
    fn stub_size(&self) -> u64;
    /// Writes a stub at `stub_address` that jumps to the address held in the GOT entry at
    /// `slot_address`; `Err` with the displacement that does not fit.
    fn write_stub(&self, stub: &mut [u8], stub_address: u64, slot_address: u64)
        -> Result<(), i128>;
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
