//! RISC-V 64 (RISC-V ELF psABI, LP64D): relocation table, the pairing of `%pcrel_lo`
//! with its `%pcrel_hi`, the stub (`auipc`/`ld`/`jr` through the GOT), `ebreak` as trap,
//! and the TLS-descriptor resolver for static TLS.
//!
//! Relaxation is not done: `R_RISCV_RELAX` and `R_RISCV_ALIGN` are read and left alone.
//! The bytes are valid as compiled (an `ALIGN` pads with `nop`s that stay), and label
//! differences a relaxing assembler left to the linker (`ADD*`/`SUB*`/`SET*`, ULEB128)
//! come out as the assembler would have computed them.

use super::InPlaceOp::{Add, Set, Sub};
use super::{
    Arch, Architecture, Check, Field, InPlaceOp, Relative, Relocation, StubRelocation, StubTarget,
    Target,
};
use object::elf;

/// The RISC-V 64 implementation of [`Arch`].
pub(crate) struct Riscv64;

use Check::{Either, None as NoCheck, Signed, Unsigned};
use Field::{BType, CallPair, CbType, CiLui, CjType, IType, JType, SType, UType, Word};
use Relative::{Absolute, Place};
use Target::{
    Call, DtpMod, DtpOff, GotEntry, Nothing, Partner, Symbol, TlsDescEntry, TlsGdEntry, TpOff,
    TpOffEntry,
};

const fn add(bytes: u8) -> Field {
    Field::InPlace { bytes, op: Add }
}
const fn sub(bytes: u8) -> Field {
    Field::InPlace { bytes, op: Sub }
}
const fn set(bytes: u8) -> Field {
    Field::InPlace { bytes, op: Set }
}
const fn low6(op: InPlaceOp) -> Field {
    Field::Low6 { op }
}
const fn uleb(op: InPlaceOp) -> Field {
    Field::Uleb128 { op }
}

/// Every relocation type Kiln applies, by number. A high part's check is on the value
/// rounded to 4 KiB (what `auipc`/`lui` hold): ±2 GiB.
// One row per line, as the psABI tables read (rustfmt would wrap the longer ones).
#[rustfmt::skip]
static RELOCATIONS: &[Relocation] = &[
    row!(R_RISCV_NONE, Nothing, Absolute, NoCheck, Word(0)),
    row!(R_RISCV_32, Symbol, Absolute, Either(32), Word(4)),
    row!(R_RISCV_64, Symbol, Absolute, NoCheck, Word(8)),
    row!(R_RISCV_TLS_DTPMOD64, DtpMod, Absolute, NoCheck, Word(8)),
    row!(R_RISCV_TLS_DTPREL32, DtpOff, Absolute, Either(32), Word(4)),
    row!(R_RISCV_TLS_DTPREL64, DtpOff, Absolute, NoCheck, Word(8)),
    row!(R_RISCV_TLS_TPREL64, TpOff, Absolute, NoCheck, Word(8)),
    row!(R_RISCV_BRANCH, Symbol, Place, Signed(13), BType),
    row!(R_RISCV_JAL, Call, Place, Signed(21), JType),
    row!(R_RISCV_CALL, Call, Place, Signed(32), CallPair),
    row!(R_RISCV_CALL_PLT, Call, Place, Signed(32), CallPair),
    row!(R_RISCV_GOT_HI20, GotEntry, Place, Signed(32), UType),
    row!(R_RISCV_TLS_GOT_HI20, TpOffEntry, Place, Signed(32), UType),
    row!(R_RISCV_TLS_GD_HI20, TlsGdEntry, Place, Signed(32), UType),
    row!(R_RISCV_PCREL_HI20, Symbol, Place, Signed(32), UType),
    row!(R_RISCV_PCREL_LO12_I, Partner, Place, NoCheck, IType),
    row!(R_RISCV_PCREL_LO12_S, Partner, Place, NoCheck, SType),
    row!(R_RISCV_HI20, Symbol, Absolute, Signed(32), UType),
    row!(R_RISCV_LO12_I, Symbol, Absolute, NoCheck, IType),
    row!(R_RISCV_LO12_S, Symbol, Absolute, NoCheck, SType),
    row!(R_RISCV_TPREL_HI20, TpOff, Absolute, Signed(32), UType),
    row!(R_RISCV_TPREL_LO12_I, TpOff, Absolute, NoCheck, IType),
    row!(R_RISCV_TPREL_LO12_S, TpOff, Absolute, NoCheck, SType),
    row!(R_RISCV_TPREL_ADD, Nothing, Absolute, NoCheck, Word(0)),
    row!(R_RISCV_ADD8, Symbol, Absolute, NoCheck, add(1)),
    row!(R_RISCV_ADD16, Symbol, Absolute, NoCheck, add(2)),
    row!(R_RISCV_ADD32, Symbol, Absolute, NoCheck, add(4)),
    row!(R_RISCV_ADD64, Symbol, Absolute, NoCheck, add(8)),
    row!(R_RISCV_SUB8, Symbol, Absolute, NoCheck, sub(1)),
    row!(R_RISCV_SUB16, Symbol, Absolute, NoCheck, sub(2)),
    row!(R_RISCV_SUB32, Symbol, Absolute, NoCheck, sub(4)),
    row!(R_RISCV_SUB64, Symbol, Absolute, NoCheck, sub(8)),
    row!(R_RISCV_GOT32_PCREL, GotEntry, Place, Signed(32), Word(4)),
    row!(R_RISCV_ALIGN, Nothing, Absolute, NoCheck, Word(0)),
    row!(R_RISCV_RVC_BRANCH, Symbol, Place, Signed(9), CbType),
    row!(R_RISCV_RVC_JUMP, Symbol, Place, Signed(12), CjType),
    row!(R_RISCV_RVC_LUI, Symbol, Absolute, Signed(18), CiLui),
    row!(R_RISCV_RELAX, Nothing, Absolute, NoCheck, Word(0)),
    row!(R_RISCV_SUB6, Symbol, Absolute, NoCheck, low6(Sub)),
    row!(R_RISCV_SET6, Symbol, Absolute, NoCheck, low6(Set)),
    row!(R_RISCV_SET8, Symbol, Absolute, NoCheck, set(1)),
    row!(R_RISCV_SET16, Symbol, Absolute, NoCheck, set(2)),
    row!(R_RISCV_SET32, Symbol, Absolute, NoCheck, set(4)),
    row!(R_RISCV_32_PCREL, Symbol, Place, Signed(32), Word(4)),
    row!(R_RISCV_PLT32, Call, Place, Signed(32), Word(4)),
    row!(R_RISCV_SET_ULEB128, Symbol, Absolute, Unsigned(64), uleb(Set)),
    row!(R_RISCV_SUB_ULEB128, Symbol, Absolute, Unsigned(64), uleb(Sub)),
    row!(R_RISCV_TLSDESC_HI20, TlsDescEntry, Place, Signed(32), UType),
    row!(R_RISCV_TLSDESC_LOAD_LO12, Partner, Place, NoCheck, IType),
    row!(R_RISCV_TLSDESC_ADD_LO12, Partner, Place, NoCheck, IType),
    row!(R_RISCV_TLSDESC_CALL, Nothing, Absolute, NoCheck, Word(0)),
];

/// What a low part becomes once paired: its high partner's target, relative to the
/// partner's place, checked as the partner is (so both take the same stub, if any).
#[rustfmt::skip]
static PAIRED: &[Relocation] = &[
    row!(R_RISCV_PCREL_LO12_I, Symbol, Place, Signed(32), IType),
    row!(R_RISCV_PCREL_LO12_S, Symbol, Place, Signed(32), SType),
    row!(R_RISCV_PCREL_LO12_I, GotEntry, Place, Signed(32), IType),
    row!(R_RISCV_PCREL_LO12_S, GotEntry, Place, Signed(32), SType),
    row!(R_RISCV_PCREL_LO12_I, TpOffEntry, Place, Signed(32), IType),
    row!(R_RISCV_PCREL_LO12_S, TpOffEntry, Place, Signed(32), SType),
    row!(R_RISCV_PCREL_LO12_I, TlsGdEntry, Place, Signed(32), IType),
    row!(R_RISCV_PCREL_LO12_S, TlsGdEntry, Place, Signed(32), SType),
    row!(R_RISCV_TLSDESC_LOAD_LO12, TlsDescEntry, Place, Signed(32), IType),
    row!(R_RISCV_TLSDESC_ADD_LO12, TlsDescEntry, Place, Signed(32), IType),
];

/// A `SET_ULEB128` with the `SUB_ULEB128` after it at the same offset: together they
/// write a label difference, each part modulo the number's length.
#[rustfmt::skip]
static ULEB128_PAIR: [Relocation; 2] = [
    row!(R_RISCV_SET_ULEB128, Symbol, Absolute, NoCheck, uleb(Set)),
    row!(R_RISCV_SUB_ULEB128, Symbol, Absolute, NoCheck, uleb(Sub)),
];

/// Names of types Kiln does not apply (for messages).
fn other_name(r_type: u32) -> &'static str {
    match r_type {
        3 => "R_RISCV_RELATIVE",
        4 => "R_RISCV_COPY",
        5 => "R_RISCV_JUMP_SLOT",
        6 => "R_RISCV_TLS_DTPMOD32",
        10 => "R_RISCV_TLS_TPREL32",
        12 => "R_RISCV_TLSDESC",
        47 => "R_RISCV_GPREL_I",
        48 => "R_RISCV_GPREL_S",
        49 => "R_RISCV_TPREL_I",
        50 => "R_RISCV_TPREL_S",
        58 => "R_RISCV_IRELATIVE",
        _ => "unknown",
    }
}

/// `auipc t3, %hi(slot)`; `ld t3, %lo(slot)(t3)`; `jr t3`; `nop`. t3 (x28) is a
/// temporary the calling convention lets a stub clobber (as lld's PLT does).
const STUB: [u32; 4] = [0x0000_0e17, 0x000e_3e03, 0x000e_0067, 0x0000_0013];

impl Arch for Riscv64 {
    fn architecture(&self) -> Architecture {
        Architecture::Riscv64
    }

    fn relocations(&self) -> &'static [Relocation] {
        RELOCATIONS
    }

    fn unapplied_name(&self, r_type: u32) -> &'static str {
        other_name(r_type)
    }

    fn write_stub(
        &self,
        stub: &mut [u8],
        stub_address: u64,
        slot_address: u64,
    ) -> Result<(), i128> {
        super::write_words(stub, &STUB);
        let offset = slot_address as i128 - stub_address as i128;
        super::encode(UType, Signed(32), offset, &mut stub[0..4]).map_err(|_| offset)?;
        super::encode(IType, NoCheck, offset, &mut stub[4..8]).map_err(|_| offset)?;
        Ok(())
    }

    fn stub_relocations(&self) -> &'static [StubRelocation] {
        const HI: u32 = elf::R_RISCV_PCREL_HI20.0;
        const LO: u32 = elf::R_RISCV_PCREL_LO12_I.0;
        const TABLE: &[StubRelocation] = &[
            StubRelocation::new(0, HI, StubTarget::Slot(0)),
            StubRelocation::new(4, LO, StubTarget::Start),
        ];
        TABLE
    }

    /// `lui t5, %hi(id)`, `addiw t5, t5, %lo(id)`, `auipc t3, %hi(common)`, `jr
    /// %lo(common)(t3)`: the entry takes the id from t5; `auipc`/`jr` reaches the common
    /// tail however many stubs there are (`jal` would reach 32,768).
    fn write_lazy_entry(&self, entry: &mut [u8], id: u32, to_common: i64) {
        const LUI_T5: u32 = 0x0000_0f37;
        const ADDIW_T5_T5: u32 = 0x000f_0f1b;
        const AUIPC_T3: u32 = 0x0000_0e17;
        const JR_T3: u32 = 0x000e_0067;
        super::write_words(entry, &[LUI_T5, ADDIW_T5_T5, AUIPC_T3, JR_T3]);
        // Neither fails: an id is below 2^31 (`addiw` sign-extends 32 bits), and the
        // common tail lies within the stubs' section.
        let id = i128::from(id);
        let _ = super::encode(UType, NoCheck, id, &mut entry[0..4]);
        let _ = super::encode(IType, NoCheck, id, &mut entry[4..8]);
        let to_common = i128::from(to_common - 8);
        let _ = super::encode(UType, NoCheck, to_common, &mut entry[8..12]);
        let _ = super::encode(IType, NoCheck, to_common, &mut entry[12..16]);
    }

    fn absolute64(&self) -> u32 {
        elf::R_RISCV_64.0
    }

    /// LP64D with compressed instructions allowed (`EF_RISCV_RVC | EF_RISCV_FLOAT_ABI_DOUBLE`).
    fn elf_flags(&self) -> u32 {
        elf::EF_RISCV_RVC.0 | elf::EF_RISCV_FLOAT_ABI_DOUBLE.0
    }

    /// `ebreak`. Read from its middle (code may be 2-byte aligned), `0x0010` is a
    /// reserved compressed instruction: it traps too.
    fn trap(&self) -> [u8; 4] {
        0x0010_0073u32.to_le_bytes()
    }

    /// `ld a0, 8(a0)`; `jr t0`: a0 holds the descriptor's address, the result is the
    /// offset from the thread pointer, and t0 the return address (the psABI's TLSDESC
    /// call is `jalr t0, 0(t0)`); no other register changes.
    fn tlsdesc_static_resolver(&self) -> &'static [u8] {
        &[0x03, 0x35, 0x85, 0x00, 0x67, 0x80, 0x02, 0x00]
    }

    /// `call` (`auipc` + `jalr`) reaches ±2 GiB; a `jal` that cannot reach is an error
    /// naming it (compilers emit `call` for anything outside the function).
    fn call_reach(&self) -> u64 {
        1 << 31
    }

    /// A high part's value is checked rounded to 4 KiB. An absolute low part
    /// (`%lo(sym)`, non-PIC) follows its `%hi`: a symbol whose `lui` cannot hold it is
    /// reached through its stub by both halves.
    fn reaches(&self, row: &Relocation, direct: i128, s: u64, a: i64, p: u64) -> bool {
        let _ = (s, a, p);
        let absolute_low =
            row.relative == Absolute && row.check == NoCheck && matches!(row.field, IType | SType);
        if absolute_low {
            Signed(32).accepts(direct + 0x800)
        } else if row.rounds_to_page() {
            row.check.accepts(direct + 0x800)
        } else {
            row.check.accepts(direct)
        }
    }

    fn pair(&self, lo: &Relocation, hi: &Relocation) -> Option<&'static Relocation> {
        if lo.target != Partner || hi.field != UType || hi.relative != Place {
            return None;
        }
        // A TLS descriptor's low parts pair with its high part only, and the other way.
        let descriptor = lo.name.starts_with("R_RISCV_TLSDESC");
        if descriptor != (hi.target == TlsDescEntry) {
            return None;
        }
        PAIRED
            .iter()
            .find(|r| r.target == hi.target && r.field == lo.field && r.name == lo.name)
    }

    fn pair_at_one_offset(
        &self,
        first: &Relocation,
        second: &Relocation,
    ) -> Option<(&'static Relocation, &'static Relocation)> {
        (first.r_type == object::elf::R_RISCV_SET_ULEB128.0
            && second.r_type == object::elf::R_RISCV_SUB_ULEB128.0)
            .then(|| (&ULEB128_PAIR[0], &ULEB128_PAIR[1]))
    }

    /// glibc's `TLS_DTV_OFFSET` on RISC-V: `__tls_get_addr` adds it back.
    fn dtv_offset(&self) -> u64 {
        0x800
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_row_is_found_under_its_own_number() {
        for r in RELOCATIONS {
            assert_eq!(Riscv64.relocation(r.r_type).map(|x| x.name), Some(r.name));
            assert!(r.name.starts_with("R_RISCV_"));
        }
        assert_eq!(Riscv64.relocation_name(3), "R_RISCV_RELATIVE");
    }

    #[test]
    fn every_low_part_pairs_with_each_high_part_of_its_kind() {
        let row = |name| Riscv64.relocation_named(name).expect(name);
        for lo in ["R_RISCV_PCREL_LO12_I", "R_RISCV_PCREL_LO12_S"] {
            for hi in [
                "R_RISCV_PCREL_HI20",
                "R_RISCV_GOT_HI20",
                "R_RISCV_TLS_GOT_HI20",
                "R_RISCV_TLS_GD_HI20",
            ] {
                let paired = Riscv64.pair(row(lo), row(hi)).expect(hi);
                assert_eq!((paired.name, paired.target), (lo, row(hi).target));
            }
            assert!(Riscv64.pair(row(lo), row("R_RISCV_TLSDESC_HI20")).is_none());
            assert!(Riscv64.pair(row(lo), row("R_RISCV_HI20")).is_none());
        }
        for lo in ["R_RISCV_TLSDESC_LOAD_LO12", "R_RISCV_TLSDESC_ADD_LO12"] {
            let paired = Riscv64
                .pair(row(lo), row("R_RISCV_TLSDESC_HI20"))
                .expect(lo);
            assert_eq!(paired.target, TlsDescEntry);
            assert!(Riscv64.pair(row(lo), row("R_RISCV_PCREL_HI20")).is_none());
        }
    }

    #[test]
    fn the_stub_loads_its_slot_and_jumps() {
        let mut stub = [0u8; 16];
        // The slot 0x1804 bytes ahead: %hi rounds up to 2 pages, %lo is -0x7fc.
        Riscv64
            .write_stub(&mut stub, 0x1000_0000, 0x1000_1804)
            .expect("in reach");
        let word = |i: usize| u32::from_le_bytes(stub[i * 4..i * 4 + 4].try_into().unwrap());
        assert_eq!(word(0), 0x0000_0e17 | (2 << 12));
        assert_eq!(word(1), 0x000e_3e03 | ((-0x7fci32 as u32) << 20));
        assert_eq!(word(2), 0x000e_0067);
        assert!(Riscv64.write_stub(&mut stub, 0, 1 << 32).is_err());
    }
}
