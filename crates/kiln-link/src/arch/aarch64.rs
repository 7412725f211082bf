//! AArch64 (ELF psABI for the Arm 64-bit architecture, "aaelf64"): relocation table, the
//! stub that is both PLT entry and range-extension veneer, `BRK` as trap, and the
//! TLS-descriptor resolver for static TLS.

use super::{
    Arch, Architecture, Check, Field, Relative, Relocation, StubRelocation, StubTarget, Target,
};
use object::elf;

/// The AArch64 implementation of [`Arch`].
pub(crate) struct Aarch64;

use Check::{Either, None as NoCheck, Signed, Unsigned};
use Field::Word;
use Relative::{Absolute, GotBase, Page, Place};

/// `B`/`BL`: imm26, a multiple of 4 within ±128 MiB.
const IMM26: Field = Field::Imm {
    lsb: 0,
    width: 26,
    shift: 2,
    aligned: true,
};
/// `B.cond`, `CBZ`, `LDR (literal)`: imm19, within ±1 MiB.
const IMM19: Field = Field::Imm {
    lsb: 5,
    width: 19,
    shift: 2,
    aligned: true,
};
/// `TBZ`/`TBNZ`: imm14, within ±32 KiB.
const IMM14: Field = Field::Imm {
    lsb: 5,
    width: 14,
    shift: 2,
    aligned: true,
};
/// `ADR`: 21 bits of byte offset.
const ADR: Field = Field::Adr { shift: 0 };
/// `ADRP`: 21 bits of 4 KiB-page offset.
const ADRP: Field = Field::Adr { shift: 12 };
/// `ADD` with `LSL #12`: bits 12..24 of the value.
const HI12: Field = Field::Imm {
    lsb: 10,
    width: 12,
    shift: 12,
    aligned: false,
};

/// `ADD`/`LDR`/`STR` (unsigned immediate): the low 12 bits of the value, scaled by the
/// access size `2^shift` (which they must be a multiple of).
const fn lo12(shift: u8) -> Field {
    Field::Lo12 { shift }
}

const fn movw(group: u8) -> Field {
    Field::Movw { group }
}

use Target::{Call, GotEntry, Nothing, Symbol, TlsDescEntry, TlsGdEntry, TpOff, TpOffEntry};

/// Every relocation type Kiln applies, by number.
// One row per line, as the psABI tables read (rustfmt would wrap the longer ones).
#[rustfmt::skip]
static RELOCATIONS: &[Relocation] = &[
    row!(R_AARCH64_NONE, Nothing, Absolute, NoCheck, Word(0)),
    row!(256 as R_AARCH64_NONE, Nothing, Absolute, NoCheck, Word(0)),
    row!(R_AARCH64_ABS64, Symbol, Absolute, NoCheck, Word(8)),
    row!(R_AARCH64_ABS32, Symbol, Absolute, Either(32), Word(4)),
    row!(R_AARCH64_ABS16, Symbol, Absolute, Either(16), Word(2)),
    row!(R_AARCH64_PREL64, Symbol, Place, NoCheck, Word(8)),
    row!(R_AARCH64_PREL32, Symbol, Place, Either(32), Word(4)),
    row!(R_AARCH64_PREL16, Symbol, Place, Either(16), Word(2)),
    row!(R_AARCH64_MOVW_UABS_G0, Symbol, Absolute, Unsigned(16), movw(0)),
    row!(R_AARCH64_MOVW_UABS_G0_NC, Symbol, Absolute, NoCheck, movw(0)),
    row!(R_AARCH64_MOVW_UABS_G1, Symbol, Absolute, Unsigned(32), movw(1)),
    row!(R_AARCH64_MOVW_UABS_G1_NC, Symbol, Absolute, NoCheck, movw(1)),
    row!(R_AARCH64_MOVW_UABS_G2, Symbol, Absolute, Unsigned(48), movw(2)),
    row!(R_AARCH64_MOVW_UABS_G2_NC, Symbol, Absolute, NoCheck, movw(2)),
    row!(R_AARCH64_MOVW_UABS_G3, Symbol, Absolute, NoCheck, movw(3)),
    row!(R_AARCH64_LD_PREL_LO19, Symbol, Place, Signed(21), IMM19),
    row!(R_AARCH64_ADR_PREL_LO21, Symbol, Place, Signed(21), ADR),
    row!(R_AARCH64_ADR_PREL_PG_HI21, Symbol, Page, Signed(33), ADRP),
    row!(R_AARCH64_ADR_PREL_PG_HI21_NC, Symbol, Page, NoCheck, ADRP),
    row!(R_AARCH64_ADD_ABS_LO12_NC, Symbol, Absolute, NoCheck, lo12(0)),
    row!(R_AARCH64_LDST8_ABS_LO12_NC, Symbol, Absolute, NoCheck, lo12(0)),
    row!(R_AARCH64_TSTBR14, Symbol, Place, Signed(16), IMM14),
    row!(R_AARCH64_CONDBR19, Symbol, Place, Signed(21), IMM19),
    row!(R_AARCH64_JUMP26, Call, Place, Signed(28), IMM26),
    row!(R_AARCH64_CALL26, Call, Place, Signed(28), IMM26),
    row!(R_AARCH64_LDST16_ABS_LO12_NC, Symbol, Absolute, NoCheck, lo12(1)),
    row!(R_AARCH64_LDST32_ABS_LO12_NC, Symbol, Absolute, NoCheck, lo12(2)),
    row!(R_AARCH64_LDST64_ABS_LO12_NC, Symbol, Absolute, NoCheck, lo12(3)),
    row!(R_AARCH64_LDST128_ABS_LO12_NC, Symbol, Absolute, NoCheck, lo12(4)),
    row!(R_AARCH64_GOTREL64, Symbol, GotBase, NoCheck, Word(8)),
    row!(R_AARCH64_GOTREL32, Symbol, GotBase, Either(32), Word(4)),
    row!(R_AARCH64_GOT_LD_PREL19, GotEntry, Place, Signed(21), IMM19),
    row!(R_AARCH64_ADR_GOT_PAGE, GotEntry, Page, Signed(33), ADRP),
    row!(R_AARCH64_LD64_GOT_LO12_NC, GotEntry, Absolute, NoCheck, lo12(3)),
    row!(R_AARCH64_PLT32, Call, Place, Signed(32), Word(4)),
    row!(R_AARCH64_GOTPCREL32, GotEntry, Place, Signed(32), Word(4)),
    row!(R_AARCH64_TLSGD_ADR_PREL21, TlsGdEntry, Place, Signed(21), ADR),
    row!(R_AARCH64_TLSGD_ADR_PAGE21, TlsGdEntry, Page, Signed(33), ADRP),
    row!(R_AARCH64_TLSGD_ADD_LO12_NC, TlsGdEntry, Absolute, NoCheck, lo12(0)),
    row!(R_AARCH64_TLSIE_ADR_GOTTPREL_PAGE21, TpOffEntry, Page, Signed(33), ADRP),
    row!(R_AARCH64_TLSIE_LD64_GOTTPREL_LO12_NC, TpOffEntry, Absolute, NoCheck, lo12(3)),
    row!(R_AARCH64_TLSIE_LD_GOTTPREL_PREL19, TpOffEntry, Place, Signed(21), IMM19),
    row!(R_AARCH64_TLSLE_MOVW_TPREL_G2, TpOff, Absolute, Unsigned(48), movw(2)),
    row!(R_AARCH64_TLSLE_MOVW_TPREL_G1, TpOff, Absolute, Unsigned(32), movw(1)),
    row!(R_AARCH64_TLSLE_MOVW_TPREL_G1_NC, TpOff, Absolute, NoCheck, movw(1)),
    row!(R_AARCH64_TLSLE_MOVW_TPREL_G0, TpOff, Absolute, Unsigned(16), movw(0)),
    row!(R_AARCH64_TLSLE_MOVW_TPREL_G0_NC, TpOff, Absolute, NoCheck, movw(0)),
    row!(R_AARCH64_TLSLE_ADD_TPREL_HI12, TpOff, Absolute, Unsigned(24), HI12),
    row!(R_AARCH64_TLSLE_ADD_TPREL_LO12, TpOff, Absolute, Unsigned(12), lo12(0)),
    row!(R_AARCH64_TLSLE_ADD_TPREL_LO12_NC, TpOff, Absolute, NoCheck, lo12(0)),
    row!(R_AARCH64_TLSLE_LDST8_TPREL_LO12, TpOff, Absolute, Unsigned(12), lo12(0)),
    row!(R_AARCH64_TLSLE_LDST8_TPREL_LO12_NC, TpOff, Absolute, NoCheck, lo12(0)),
    row!(R_AARCH64_TLSLE_LDST16_TPREL_LO12, TpOff, Absolute, Unsigned(12), lo12(1)),
    row!(R_AARCH64_TLSLE_LDST16_TPREL_LO12_NC, TpOff, Absolute, NoCheck, lo12(1)),
    row!(R_AARCH64_TLSLE_LDST32_TPREL_LO12, TpOff, Absolute, Unsigned(12), lo12(2)),
    row!(R_AARCH64_TLSLE_LDST32_TPREL_LO12_NC, TpOff, Absolute, NoCheck, lo12(2)),
    row!(R_AARCH64_TLSLE_LDST64_TPREL_LO12, TpOff, Absolute, Unsigned(12), lo12(3)),
    row!(R_AARCH64_TLSLE_LDST64_TPREL_LO12_NC, TpOff, Absolute, NoCheck, lo12(3)),
    row!(R_AARCH64_TLSDESC_LD_PREL19, TlsDescEntry, Place, Signed(21), IMM19),
    row!(R_AARCH64_TLSDESC_ADR_PREL21, TlsDescEntry, Place, Signed(21), ADR),
    row!(R_AARCH64_TLSDESC_ADR_PAGE21, TlsDescEntry, Page, Signed(33), ADRP),
    row!(R_AARCH64_TLSDESC_LD64_LO12, TlsDescEntry, Absolute, NoCheck, lo12(3)),
    row!(R_AARCH64_TLSDESC_ADD_LO12, TlsDescEntry, Absolute, NoCheck, lo12(0)),
    row!(R_AARCH64_TLSDESC_LDR, Nothing, Absolute, NoCheck, Word(0)),
    row!(R_AARCH64_TLSDESC_ADD, Nothing, Absolute, NoCheck, Word(0)),
    row!(R_AARCH64_TLSDESC_CALL, Nothing, Absolute, NoCheck, Word(0)),
    row!(R_AARCH64_TLSLE_LDST128_TPREL_LO12, TpOff, Absolute, Unsigned(12), lo12(4)),
    row!(R_AARCH64_TLSLE_LDST128_TPREL_LO12_NC, TpOff, Absolute, NoCheck, lo12(4)),
];

/// Names of types Kiln does not apply (for messages).
fn other_name(r_type: u32) -> &'static str {
    match r_type {
        270 => "R_AARCH64_MOVW_SABS_G0",
        271 => "R_AARCH64_MOVW_SABS_G1",
        272 => "R_AARCH64_MOVW_SABS_G2",
        287..=293 => "R_AARCH64_MOVW_PREL_*",
        300..=306 => "R_AARCH64_MOVW_GOTOFF_*",
        310 => "R_AARCH64_LD64_GOTOFF_LO15",
        313 => "R_AARCH64_LD64_GOTPAGE_LO15",
        515 | 516 => "R_AARCH64_TLSGD_MOVW_*",
        517..=538 => "R_AARCH64_TLSLD_* (traditional local-dynamic)",
        539 | 540 => "R_AARCH64_TLSIE_MOVW_GOTTPREL_*",
        565 | 566 => "R_AARCH64_TLSDESC_OFF_*",
        572 | 573 => "R_AARCH64_TLSLD_LDST128_DTPREL_LO12*",
        1024 => "R_AARCH64_COPY",
        1025 => "R_AARCH64_GLOB_DAT",
        1026 => "R_AARCH64_JUMP_SLOT",
        1027 => "R_AARCH64_RELATIVE",
        1028 => "R_AARCH64_TLS_DTPMOD",
        1029 => "R_AARCH64_TLS_DTPREL",
        1030 => "R_AARCH64_TLS_TPREL",
        1031 => "R_AARCH64_TLSDESC",
        1032 => "R_AARCH64_IRELATIVE",
        _ => "unknown",
    }
}

/// `BTI c` (a landing pad for `BR x16`/`BLR`: pages mapped `PROT_BTI` trap any other
/// indirect branch target), `ADRP x16, slot`, `LDR x16, [x16, :lo12:slot]`, `BR x16`.
const STUB: [u32; 4] = [BTI_C, 0x9000_0010, 0xf940_0210, 0xd61f_0200];

/// `BTI c`: a hint (a `nop` where BTI is not implemented or the page is not guarded).
const BTI_C: u32 = 0xd503_245f;

impl Arch for Aarch64 {
    fn architecture(&self) -> Architecture {
        Architecture::Aarch64
    }

    fn relocations(&self) -> &'static [Relocation] {
        RELOCATIONS
    }

    fn unapplied_name(&self, r_type: u32) -> &'static str {
        other_name(r_type)
    }

    /// `BTI c; ADRP x16, slot; LDR x16, [x16, :lo12:slot]; BR x16` (x16 is IP0, the
    /// register the procedure-call standard gives veneers).
    fn write_stub(
        &self,
        stub: &mut [u8],
        stub_address: u64,
        slot_address: u64,
    ) -> Result<(), i128> {
        super::write_words(stub, &STUB);
        // The ADRP is the second instruction: its page is that of its own address.
        let page = (slot_address & !0xfff) as i128 - ((stub_address + 4) & !0xfff) as i128;
        super::encode(ADRP, Signed(33), page, &mut stub[4..8]).map_err(|_| page)?;
        super::encode(lo12(3), Check::None, slot_address as i128, &mut stub[8..12])
            .map_err(|_| slot_address as i128)?;
        Ok(())
    }

    fn stub_relocations(&self) -> &'static [StubRelocation] {
        const PAGE: u32 = elf::R_AARCH64_ADR_PREL_PG_HI21.0;
        const LO12: u32 = elf::R_AARCH64_LDST64_ABS_LO12_NC.0;
        const TABLE: &[StubRelocation] = &[
            StubRelocation::new(4, PAGE, StubTarget::Slot(0)),
            StubRelocation::new(8, LO12, StubTarget::Slot(0)),
        ];
        TABLE
    }

    /// `BTI c` (reached by the stub's `BR x16`), `MOVZ x17, #id`, `MOVK x17, #id >> 16,
    /// LSL #16`, `B common`: the entry takes the id from x17 (IP1, which a veneer may
    /// clobber).
    fn write_lazy_entry(&self, entry: &mut [u8], id: u32, to_common: i64) {
        let movz = 0xd280_0011 | ((id & 0xffff) << 5);
        let movk = 0xf2a0_0011 | ((id >> 16) << 5);
        // `B` at 12 reaches ±128 MiB: four million stubs.
        let b = 0x1400_0000 | (((to_common - 12) >> 2) as u32 & 0x03ff_ffff);
        super::write_words(entry, &[BTI_C, movz, movk, b]);
    }

    fn absolute64(&self) -> u32 {
        elf::R_AARCH64_ABS64.0
    }

    /// `BRK #0`.
    fn trap(&self) -> [u8; 4] {
        0xd420_0000u32.to_le_bytes()
    }

    /// `BTI c; LDR x0, [x0, #8]; RET`: x0 holds the descriptor's address, the result is
    /// the offset from the thread pointer, and no other register changes; reached by
    /// `BLR`, so it starts with a landing pad.
    fn tlsdesc_static_resolver(&self) -> &'static [u8] {
        &[
            0x5f, 0x24, 0x03, 0xd5, 0x00, 0x04, 0x40, 0xf9, 0xc0, 0x03, 0x5f, 0xd6,
        ]
    }

    fn call_reach(&self) -> u64 {
        1 << 27
    }

    /// The low 12 bits of an `ADRP` pair follow the `ADRP`: a symbol whose page is out of
    /// the `ADRP`'s reach is reached through its stub by both halves.
    fn reaches(&self, row: &Relocation, direct: i128, s: u64, a: i64, p: u64) -> bool {
        if matches!(row.field, Field::Lo12 { .. }) && row.relative == Absolute {
            let page = ((s as i128 + a as i128) & !0xfff) - (p & !0xfff) as i128;
            return Signed(33).accepts(page);
        }
        row.check.accepts(direct)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_row_is_found_under_its_own_number() {
        for r in RELOCATIONS {
            assert_eq!(Aarch64.relocation(r.r_type).map(|x| x.name), Some(r.name));
            assert!(r.name.starts_with("R_AARCH64_"));
        }
        assert_eq!(Aarch64.relocation_name(1026), "R_AARCH64_JUMP_SLOT");
    }

    #[test]
    fn the_stub_loads_its_slot_and_branches() {
        let mut stub = [0u8; 16];
        Aarch64
            .write_stub(&mut stub, 0x1000_0000, 0x1000_2008)
            .expect("in reach");
        let word = |i: usize| u32::from_le_bytes(stub[i * 4..i * 4 + 4].try_into().unwrap());
        assert_eq!(word(0), BTI_C);
        // ADRP x16, +2 pages: immlo = 2 (bits 29-30), immhi = 0.
        assert_eq!(word(1), 0x9000_0010 | (2 << 29));
        // LDR x16, [x16, #8]: imm12 = 8 / 8 = 1.
        assert_eq!(word(2), 0xf940_0210 | (1 << 10));
        assert_eq!(word(3), 0xd61f_0200);
        assert!(Aarch64.write_stub(&mut stub, 0, 1 << 33).is_err());
    }
}
