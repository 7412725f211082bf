//! x86-64 (System V psABI §4.4): relocation table, PLT stub, trap byte, TLS-descriptor
//! resolver and `GOTPCRELX` relaxation.

use super::{
    Arch, Architecture, Check, Field, Relative, Relocation, StubRelocation, StubTarget, Target,
};
use object::elf;

/// The x86-64 implementation of [`Arch`].
pub(crate) struct X86_64;

const R_GOTPCRELX: u32 = object::elf::R_X86_64_GOTPCRELX.0;
const R_REX_GOTPCRELX: u32 = object::elf::R_X86_64_REX_GOTPCRELX.0;

use Check::{None as NoCheck, Signed, Unsigned};
use Field::Word;
use Relative::{Absolute, GotBase, ImageBase, Place};
use Target::{
    Call, DtpMod, DtpOff, GotEntry, Nothing, Plt, Size, Symbol, TlsDescEntry, TlsGdEntry,
    TlsLdEntry, TpOff, TpOffEntry, Unsupported,
};

/// Every relocation type Kiln applies, by number.
// One row per line, as the psABI tables read (rustfmt would wrap the longer ones).
#[rustfmt::skip]
static RELOCATIONS: &[Relocation] = &[
    row!(R_X86_64_NONE, Nothing, Absolute, NoCheck, Word(0)),
    row!(R_X86_64_64, Symbol, Absolute, NoCheck, Word(8)),
    row!(R_X86_64_PC32, Symbol, Place, Signed(32), Word(4)),
    row!(R_X86_64_GOT32, GotEntry, GotBase, Signed(32), Word(4)),
    row!(R_X86_64_PLT32, Call, Place, Signed(32), Word(4)),
    row!(R_X86_64_GOTPCREL, GotEntry, Place, Signed(32), Word(4)),
    row!(R_X86_64_32, Symbol, Absolute, Unsigned(32), Word(4)),
    row!(R_X86_64_32S, Symbol, Absolute, Signed(32), Word(4)),
    row!(R_X86_64_16, Symbol, Absolute, Unsigned(16), Word(2)),
    row!(R_X86_64_PC16, Symbol, Place, Signed(16), Word(2)),
    row!(R_X86_64_8, Symbol, Absolute, Unsigned(8), Word(1)),
    row!(R_X86_64_PC8, Symbol, Place, Signed(8), Word(1)),
    row!(R_X86_64_DTPMOD64, DtpMod, Absolute, NoCheck, Word(8)),
    row!(R_X86_64_DTPOFF64, DtpOff, Absolute, NoCheck, Word(8)),
    row!(R_X86_64_TPOFF64, TpOff, Absolute, NoCheck, Word(8)),
    row!(R_X86_64_TLSGD, TlsGdEntry, Place, Signed(32), Word(4)),
    row!(R_X86_64_TLSLD, TlsLdEntry, Place, Signed(32), Word(4)),
    row!(R_X86_64_DTPOFF32, DtpOff, Absolute, Signed(32), Word(4)),
    row!(R_X86_64_GOTTPOFF, TpOffEntry, Place, Signed(32), Word(4)),
    row!(R_X86_64_TPOFF32, TpOff, Absolute, Signed(32), Word(4)),
    row!(R_X86_64_PC64, Symbol, Place, NoCheck, Word(8)),
    row!(R_X86_64_GOTOFF64, Symbol, GotBase, NoCheck, Word(8)),
    row!(R_X86_64_GOTPC32, Target::GotBase, Place, Signed(32), Word(4)),
    row!(R_X86_64_GOT64, GotEntry, GotBase, NoCheck, Word(8)),
    row!(R_X86_64_GOTPCREL64, GotEntry, Place, NoCheck, Word(8)),
    row!(R_X86_64_GOTPC64, Target::GotBase, Place, NoCheck, Word(8)),
    row!(R_X86_64_GOTPLT64, GotEntry, GotBase, NoCheck, Word(8)),
    row!(R_X86_64_PLTOFF64, Plt, GotBase, NoCheck, Word(8)),
    row!(R_X86_64_SIZE32, Size, Absolute, Unsigned(32), Word(4)),
    row!(R_X86_64_SIZE64, Size, Absolute, NoCheck, Word(8)),
    row!(R_X86_64_GOTPC32_TLSDESC, TlsDescEntry, Place, Signed(32), Word(4)),
    row!(R_X86_64_TLSDESC_CALL, Nothing, Absolute, NoCheck, Word(0)),
    row!(R_X86_64_TLSDESC, Unsupported("TLS-descriptor (R_X86_64_TLSDESC in data)"), Absolute, NoCheck, Word(8)),
    row!(R_X86_64_GOTPCRELX, GotEntry, Place, Signed(32), Word(4)),
    row!(R_X86_64_REX_GOTPCRELX, GotEntry, Place, Signed(32), Word(4)),
    // COFF (crate::coff): IMAGE_REL_AMD64_* type t is row 0x400 + t; addends are the
    // fields' values (REL32_N's made relative to the field's end, as ELF's).
    row!(0x400 as IMAGE_REL_AMD64_ABSOLUTE, Nothing, Absolute, NoCheck, Word(0)),
    row!(0x401 as IMAGE_REL_AMD64_ADDR64, Symbol, Absolute, NoCheck, Word(8)),
    row!(0x402 as IMAGE_REL_AMD64_ADDR32, Symbol, Absolute, Unsigned(32), Word(4)),
    row!(0x403 as IMAGE_REL_AMD64_ADDR32NB, Symbol, ImageBase, Unsigned(32), Word(4)),
    row!(0x404 as IMAGE_REL_AMD64_REL32, Symbol, Place, Signed(32), Word(4)),
    row!(0x405 as IMAGE_REL_AMD64_REL32_1, Symbol, Place, Signed(32), Word(4)),
    row!(0x406 as IMAGE_REL_AMD64_REL32_2, Symbol, Place, Signed(32), Word(4)),
    row!(0x407 as IMAGE_REL_AMD64_REL32_3, Symbol, Place, Signed(32), Word(4)),
    row!(0x408 as IMAGE_REL_AMD64_REL32_4, Symbol, Place, Signed(32), Word(4)),
    row!(0x409 as IMAGE_REL_AMD64_REL32_5, Symbol, Place, Signed(32), Word(4)),
    // SECTION (debug information's, never loaded) has no row: in a loaded section it is
    // unsupported. SECREL is a thread-local's offset in its module's block (`.tls`), in
    // a loaded section: the block is in static TLS, and the executor's "thread-pointer
    // offset" is where the block starts in the block `_tls_index` names.
    row!(0x40b as IMAGE_REL_AMD64_SECREL, TpOff, Absolute, Unsigned(32), Word(4)),
    // A REL32 to `__imp_NAME`: NAME's GOT entry is its import-address-table slot.
    row!(0x420 as IMAGE_REL_AMD64_REL32_IMPORT, GotEntry, Place, Signed(32), Word(4)),
    // A REL32 branch operand (or to a function): through a stub when out of reach.
    row!(0x421 as IMAGE_REL_AMD64_REL32_BRANCH, Call, Place, Signed(32), Word(4)),
];

/// `R_X86_64_PC32`, what a relaxed GOT load becomes.
static PC32: Relocation = row!(R_X86_64_PC32, Symbol, Place, Signed(32), Word(4));

/// Types that exist but that a relocatable object must not hold (dynamic ones).
fn dynamic_name(r_type: u32) -> &'static str {
    match r_type {
        5 => "R_X86_64_COPY",
        6 => "R_X86_64_GLOB_DAT",
        7 => "R_X86_64_JUMP_SLOT",
        8 => "R_X86_64_RELATIVE",
        37 => "R_X86_64_IRELATIVE",
        38 => "R_X86_64_RELATIVE64",
        0x40a => "IMAGE_REL_AMD64_SECTION",
        0x40c => "IMAGE_REL_AMD64_SECREL7",
        0x40d => "IMAGE_REL_AMD64_TOKEN",
        0x40e => "IMAGE_REL_AMD64_SREL32",
        0x40f => "IMAGE_REL_AMD64_PAIR",
        0x410 => "IMAGE_REL_AMD64_SSPAN32",
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

    fn unapplied_name(&self, r_type: u32) -> &'static str {
        dynamic_name(r_type)
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

    fn stub_relocations(&self) -> &'static [StubRelocation] {
        const PC32: u32 = elf::R_X86_64_PC32.0;
        const TABLE: &[StubRelocation] = &[StubRelocation::new(6, PC32, StubTarget::Slot(-4))];
        TABLE
    }

    /// `endbr64; push $id; jmp common; int3; int3`: reached by the stub's `jmp *slot`, so
    /// it starts with the landing pad IBT requires; the entry takes the id from the stack.
    fn write_lazy_entry(&self, entry: &mut [u8], id: u32, to_common: i64) {
        entry[..4].copy_from_slice(&ENDBR64);
        entry[4] = 0x68; // push $id
        entry[5..9].copy_from_slice(&id.to_le_bytes());
        entry[9] = 0xe9; // jmp rel32, from the end of the instruction
        entry[10..14].copy_from_slice(&((to_common - 14) as i32).to_le_bytes());
        entry[14..16].fill(0xcc);
    }

    fn absolute64(&self) -> u32 {
        elf::R_X86_64_64.0
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
            assert!(r.name.starts_with("R_X86_64_") || r.name.starts_with("IMAGE_REL_AMD64_"));
        }
        assert_eq!(X86_64.relocation_name(7), "R_X86_64_JUMP_SLOT");
        assert!(X86_64.relocation(7).is_none());
    }
}
