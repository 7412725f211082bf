//! x86-64 (System V psABI §4.4): relocation table, PLT stub, trap byte, TLS-descriptor
//! resolver and `GOTPCRELX` relaxation.

use super::{Arch, Architecture, Check, Field, Relative, Relocation, Target};

/// The x86-64 implementation of [`Arch`].
pub(crate) struct X86_64;

const R_GOTPCRELX: u32 = 41;
const R_REX_GOTPCRELX: u32 = 42;

use Check::{Signed, Unsigned};
use Relative::{Absolute, GotBase, Place};

const fn row(
    r_type: u32,
    name: &'static str,
    target: Target,
    relative: Relative,
    check: Check,
    bytes: u8,
) -> Relocation {
    Relocation::new(r_type, name, target, relative, check, Field::Word(bytes))
}

/// Every relocation type Kiln applies, by number.
static RELOCATIONS: &[Relocation] = &[
    row(
        0,
        "R_X86_64_NONE",
        Target::Nothing,
        Absolute,
        Check::None,
        0,
    ),
    row(1, "R_X86_64_64", Target::Symbol, Absolute, Check::None, 8),
    row(2, "R_X86_64_PC32", Target::Symbol, Place, Signed(32), 4),
    row(
        3,
        "R_X86_64_GOT32",
        Target::GotEntry,
        GotBase,
        Signed(32),
        4,
    ),
    row(4, "R_X86_64_PLT32", Target::Call, Place, Signed(32), 4),
    row(
        9,
        "R_X86_64_GOTPCREL",
        Target::GotEntry,
        Place,
        Signed(32),
        4,
    ),
    row(10, "R_X86_64_32", Target::Symbol, Absolute, Unsigned(32), 4),
    row(11, "R_X86_64_32S", Target::Symbol, Absolute, Signed(32), 4),
    row(12, "R_X86_64_16", Target::Symbol, Absolute, Unsigned(16), 2),
    row(13, "R_X86_64_PC16", Target::Symbol, Place, Signed(16), 2),
    row(14, "R_X86_64_8", Target::Symbol, Absolute, Unsigned(8), 1),
    row(15, "R_X86_64_PC8", Target::Symbol, Place, Signed(8), 1),
    row(
        16,
        "R_X86_64_DTPMOD64",
        Target::DtpMod,
        Absolute,
        Check::None,
        8,
    ),
    row(
        17,
        "R_X86_64_DTPOFF64",
        Target::DtpOff,
        Absolute,
        Check::None,
        8,
    ),
    row(
        18,
        "R_X86_64_TPOFF64",
        Target::TpOff,
        Absolute,
        Check::None,
        8,
    ),
    row(
        19,
        "R_X86_64_TLSGD",
        Target::TlsGdEntry,
        Place,
        Signed(32),
        4,
    ),
    row(
        20,
        "R_X86_64_TLSLD",
        Target::TlsLdEntry,
        Place,
        Signed(32),
        4,
    ),
    row(
        21,
        "R_X86_64_DTPOFF32",
        Target::DtpOff,
        Absolute,
        Signed(32),
        4,
    ),
    row(
        22,
        "R_X86_64_GOTTPOFF",
        Target::TpOffEntry,
        Place,
        Signed(32),
        4,
    ),
    row(
        23,
        "R_X86_64_TPOFF32",
        Target::TpOff,
        Absolute,
        Signed(32),
        4,
    ),
    row(24, "R_X86_64_PC64", Target::Symbol, Place, Check::None, 8),
    row(
        25,
        "R_X86_64_GOTOFF64",
        Target::Symbol,
        GotBase,
        Check::None,
        8,
    ),
    row(
        26,
        "R_X86_64_GOTPC32",
        Target::GotBase,
        Place,
        Signed(32),
        4,
    ),
    row(
        27,
        "R_X86_64_GOT64",
        Target::GotEntry,
        GotBase,
        Check::None,
        8,
    ),
    row(
        28,
        "R_X86_64_GOTPCREL64",
        Target::GotEntry,
        Place,
        Check::None,
        8,
    ),
    row(
        29,
        "R_X86_64_GOTPC64",
        Target::GotBase,
        Place,
        Check::None,
        8,
    ),
    row(
        30,
        "R_X86_64_GOTPLT64",
        Target::GotEntry,
        GotBase,
        Check::None,
        8,
    ),
    row(
        31,
        "R_X86_64_PLTOFF64",
        Target::Plt,
        GotBase,
        Check::None,
        8,
    ),
    row(
        32,
        "R_X86_64_SIZE32",
        Target::Size,
        Absolute,
        Unsigned(32),
        4,
    ),
    row(
        33,
        "R_X86_64_SIZE64",
        Target::Size,
        Absolute,
        Check::None,
        8,
    ),
    row(
        34,
        "R_X86_64_GOTPC32_TLSDESC",
        Target::TlsDescEntry,
        Place,
        Signed(32),
        4,
    ),
    row(
        35,
        "R_X86_64_TLSDESC_CALL",
        Target::Nothing,
        Absolute,
        Check::None,
        0,
    ),
    row(
        36,
        "R_X86_64_TLSDESC",
        Target::Unsupported("TLS-descriptor (R_X86_64_TLSDESC in data)"),
        Absolute,
        Check::None,
        8,
    ),
    row(
        R_GOTPCRELX,
        "R_X86_64_GOTPCRELX",
        Target::GotEntry,
        Place,
        Signed(32),
        4,
    ),
    row(
        R_REX_GOTPCRELX,
        "R_X86_64_REX_GOTPCRELX",
        Target::GotEntry,
        Place,
        Signed(32),
        4,
    ),
];

/// `R_X86_64_PC32`, what a relaxed GOT load becomes.
static PC32: Relocation = row(2, "R_X86_64_PC32", Target::Symbol, Place, Signed(32), 4);

/// Types that exist but that a relocatable object must not hold (dynamic ones).
fn dynamic_name(r_type: u32) -> &'static str {
    match r_type {
        5 => "R_X86_64_COPY",
        6 => "R_X86_64_GLOB_DAT",
        7 => "R_X86_64_JUMP_SLOT",
        8 => "R_X86_64_RELATIVE",
        37 => "R_X86_64_IRELATIVE",
        38 => "R_X86_64_RELATIVE64",
        _ => "unknown",
    }
}

/// `endbr64`: the landing pad of indirect branches under Intel CET's IBT (a `nop` on
/// processors without it).
pub(crate) const ENDBR64: [u8; 4] = [0xf3, 0x0f, 0x1e, 0xfa];

impl Arch for X86_64 {
    fn architecture(&self) -> Architecture {
        Architecture::X86_64
    }

    fn relocations(&self) -> &'static [Relocation] {
        RELOCATIONS
    }
    fn relocation(&self, r_type: u32) -> Option<&'static Relocation> {
        static INDEX: std::sync::OnceLock<Vec<Option<&'static Relocation>>> =
            std::sync::OnceLock::new();
        super::index(&INDEX, RELOCATIONS, r_type)
    }

    fn relocation_name(&self, r_type: u32) -> &'static str {
        self.relocation(r_type)
            .map_or_else(|| dynamic_name(r_type), |r| r.name)
    }

    fn stub_size(&self) -> u64 {
        16
    }

    /// `endbr64` (a landing pad: a stub may be reached by an indirect branch, and code
    /// under IBT enforcement may only land on one), `jmp *slot(%rip)`, then traps.
    fn write_stub(
        &self,
        stub: &mut [u8],
        stub_address: u64,
        slot_address: u64,
    ) -> Result<(), i128> {
        let disp = slot_address as i128 - (stub_address as i128 + 10);
        let disp = i32::try_from(disp).map_err(|_| disp)?;
        stub[..4].copy_from_slice(&ENDBR64);
        stub[4..6].copy_from_slice(&[0xff, 0x25]);
        stub[6..10].copy_from_slice(&disp.to_le_bytes());
        stub[10..16].fill(0xcc);
        Ok(())
    }

    fn call_reach(&self) -> u64 {
        1 << 31
    }

    fn trap(&self) -> [u8; 4] {
        [0xcc; 4]
    }

    /// `endbr64; mov 8(%rax), %rax; ret`: `%rax` holds the descriptor's address and every
    /// other register is preserved; reached by `call *(%rax)`, so it starts with a landing
    /// pad.
    fn tlsdesc_static_resolver(&self) -> &'static [u8] {
        &[0xf3, 0x0f, 0x1e, 0xfa, 0x48, 0x8b, 0x40, 0x08, 0xc3]
    }

    /// psABI §B.2: `mov foo@GOTPCREL(%rip), %reg` becomes `lea foo(%rip), %reg`;
    /// `call *foo@GOTPCREL(%rip)` becomes `addr32 call foo`; `jmp *foo@GOTPCREL(%rip)`
    /// becomes `jmp foo; nop`. Other instructions keep their GOT load.
    fn relax_got(
        &self,
        r_type: u32,
        section: &mut [u8],
        offset: u64,
    ) -> Option<(&'static Relocation, u64)> {
        if r_type != R_GOTPCRELX && r_type != R_REX_GOTPCRELX {
            return None;
        }
        let at = usize::try_from(offset).ok()?;
        if at < 2 || at + 4 > section.len() {
            return None;
        }
        match (section[at - 2], section[at - 1]) {
            // mov r/m64 → lea (ModRM with mod 00, r/m 101: RIP-relative).
            (0x8b, modrm) if modrm & 0xc7 == 0x05 => {
                section[at - 2] = 0x8d;
                Some((&PC32, offset))
            }
            (0xff, 0x15) if r_type == R_GOTPCRELX => {
                section[at - 2] = 0x67;
                section[at - 1] = 0xe8;
                Some((&PC32, offset))
            }
            (0xff, 0x25) if r_type == R_GOTPCRELX => {
                section[at - 2] = 0xe9;
                section[at + 3] = 0x90;
                Some((&PC32, offset - 1))
            }
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_row_is_found_under_its_own_number_and_named_in_the_psabi_style() {
        for r in RELOCATIONS {
            assert_eq!(X86_64.relocation(r.r_type).map(|x| x.name), Some(r.name));
            assert!(r.name.starts_with("R_X86_64_"));
        }
        assert_eq!(X86_64.relocation_name(7), "R_X86_64_JUMP_SLOT");
        assert!(X86_64.relocation(7).is_none());
    }
}
