//! Cranelift's relocation kinds as the ELF relocation types of Kiln's link graph, one row
//! per kind and architecture (the types cranelift-object writes for the same kinds, so a
//! function linked from memory is fixed up exactly as its ELF object would be).

use cranelift_codegen::binemit::Reloc;
use kiln_link::Architecture;
use object::elf::*;

/// The ELF relocation type of `kind` on `architecture`, or `None` if Kiln does not link it
/// there (a COFF or Mach-O kind, another architecture's).
pub(crate) fn elf_type(architecture: Architecture, kind: Reloc) -> Option<u32> {
    let r_type = match (architecture, kind) {
        (Architecture::X86_64, Reloc::Abs4) => R_X86_64_32,
        (Architecture::X86_64, Reloc::Abs8) => R_X86_64_64,
        (Architecture::X86_64, Reloc::X86PCRel4) => R_X86_64_PC32,
        // Calls go through a stub if their target is out of reach (it never is within one
        // session's range, but an absolute host address may be).
        (Architecture::X86_64, Reloc::X86CallPCRel4 | Reloc::X86CallPLTRel4) => R_X86_64_PLT32,
        (Architecture::X86_64, Reloc::X86GOTPCRel4) => R_X86_64_GOTPCREL,
        (Architecture::X86_64, Reloc::ElfX86_64TlsGd) => R_X86_64_TLSGD,
        (Architecture::Aarch64, Reloc::Abs4) => R_AARCH64_ABS32,
        (Architecture::Aarch64, Reloc::Abs8) => R_AARCH64_ABS64,
        (Architecture::Aarch64, Reloc::Arm64Call) => R_AARCH64_CALL26,
        (Architecture::Aarch64, Reloc::Aarch64AdrGotPage21) => R_AARCH64_ADR_GOT_PAGE,
        (Architecture::Aarch64, Reloc::Aarch64Ld64GotLo12Nc) => R_AARCH64_LD64_GOT_LO12_NC,
        (Architecture::Aarch64, Reloc::Aarch64AdrPrelPgHi21) => R_AARCH64_ADR_PREL_PG_HI21,
        (Architecture::Aarch64, Reloc::Aarch64AddAbsLo12Nc) => R_AARCH64_ADD_ABS_LO12_NC,
        (Architecture::Aarch64, Reloc::Aarch64TlsDescAdrPage21) => R_AARCH64_TLSDESC_ADR_PAGE21,
        (Architecture::Aarch64, Reloc::Aarch64TlsDescLd64Lo12) => R_AARCH64_TLSDESC_LD64_LO12,
        (Architecture::Aarch64, Reloc::Aarch64TlsDescAddLo12) => R_AARCH64_TLSDESC_ADD_LO12,
        (Architecture::Aarch64, Reloc::Aarch64TlsDescCall) => R_AARCH64_TLSDESC_CALL,
        (Architecture::Riscv64, Reloc::Abs4) => R_RISCV_32,
        (Architecture::Riscv64, Reloc::Abs8) => R_RISCV_64,
        (Architecture::Riscv64, Reloc::RiscvCallPlt) => R_RISCV_CALL_PLT,
        (Architecture::Riscv64, Reloc::RiscvPCRelHi20) => R_RISCV_PCREL_HI20,
        (Architecture::Riscv64, Reloc::RiscvPCRelLo12I) => R_RISCV_PCREL_LO12_I,
        (Architecture::Riscv64, Reloc::RiscvGotHi20) => R_RISCV_GOT_HI20,
        (Architecture::Riscv64, Reloc::RiscvTlsGdHi20) => R_RISCV_TLS_GD_HI20,
        _ => return None,
    };
    Some(r_type.0)
}

/// Whether `kind` is the high part of a RISC-V PC-relative pair: the instruction whose
/// address a following `%pcrel_lo` (`RiscvPCRelLo12I`) names. The psABI pairs the low
/// part with `PCREL_HI20`, `GOT_HI20` (a GOT load: `auipc` + `ld`) and `TLS_GD_HI20`.
pub(crate) fn opens_pcrel_pair(kind: Reloc) -> bool {
    matches!(
        kind,
        Reloc::RiscvPCRelHi20 | Reloc::RiscvGotHi20 | Reloc::RiscvTlsGdHi20
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_numbers_are_the_abis() {
        // The psABIs' numbers.
        use kiln_link::Architecture::*;
        assert_eq!(elf_type(X86_64, Reloc::X86CallPCRel4), Some(4));
        assert_eq!(elf_type(Aarch64, Reloc::Arm64Call), Some(283));
        assert_eq!(elf_type(Riscv64, Reloc::RiscvCallPlt), Some(19));
        assert_eq!(elf_type(X86_64, Reloc::Arm64Call), None);
        assert_eq!(elf_type(X86_64, Reloc::X86SecRel), None);
    }
}
