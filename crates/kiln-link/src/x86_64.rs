//! ELF x86-64 relocation types (psABI §4.4): what each computes and how wide its field is.

#![allow(missing_docs)]

pub(crate) const R_NONE: u32 = 0;
pub(crate) const R_64: u32 = 1;
pub(crate) const R_PC32: u32 = 2;
pub(crate) const R_GOT32: u32 = 3;
pub(crate) const R_PLT32: u32 = 4;
pub(crate) const R_GOTPCREL: u32 = 9;
pub(crate) const R_32: u32 = 10;
pub(crate) const R_32S: u32 = 11;
pub(crate) const R_16: u32 = 12;
pub(crate) const R_PC16: u32 = 13;
pub(crate) const R_8: u32 = 14;
pub(crate) const R_PC8: u32 = 15;
pub(crate) const R_DTPMOD64: u32 = 16;
pub(crate) const R_DTPOFF64: u32 = 17;
pub(crate) const R_TPOFF64: u32 = 18;
pub(crate) const R_TLSGD: u32 = 19;
pub(crate) const R_TLSLD: u32 = 20;
pub(crate) const R_DTPOFF32: u32 = 21;
pub(crate) const R_GOTTPOFF: u32 = 22;
pub(crate) const R_TPOFF32: u32 = 23;
pub(crate) const R_PC64: u32 = 24;
pub(crate) const R_GOTOFF64: u32 = 25;
pub(crate) const R_GOTPC32: u32 = 26;
pub(crate) const R_GOT64: u32 = 27;
pub(crate) const R_GOTPCREL64: u32 = 28;
pub(crate) const R_GOTPC64: u32 = 29;
pub(crate) const R_GOTPLT64: u32 = 30;
pub(crate) const R_PLTOFF64: u32 = 31;
pub(crate) const R_SIZE32: u32 = 32;
pub(crate) const R_SIZE64: u32 = 33;
pub(crate) const R_GOTPC32_TLSDESC: u32 = 34;
pub(crate) const R_TLSDESC_CALL: u32 = 35;
pub(crate) const R_TLSDESC: u32 = 36;
pub(crate) const R_GOTPCRELX: u32 = 41;
pub(crate) const R_REX_GOTPCRELX: u32 = 42;

/// What a relocation computes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RelocKind {
    None,
    Abs64,
    Abs32,
    Abs32S,
    Abs16,
    Abs8,
    PcRel64,
    PcRel32,
    PcRel16,
    PcRel8,
    /// A call or jump: direct if in range, else through a PLT stub.
    Branch,
    /// GOT slot address (PC-relative) or offset (GOT32/GOT64/GOTPLT64).
    Got,
    GotOff64,
    GotPc,
    PltOff,
    Size,
    TlsGd,
    TlsLd,
    DtpOff,
    DtpMod64,
    GotTpOff,
    TpOff,
    TlsDesc,
    Unknown,
}

pub(crate) fn kind(r_type: u32) -> RelocKind {
    match r_type {
        R_NONE => RelocKind::None,
        R_64 => RelocKind::Abs64,
        R_32 => RelocKind::Abs32,
        R_32S => RelocKind::Abs32S,
        R_16 => RelocKind::Abs16,
        R_8 => RelocKind::Abs8,
        R_PC64 => RelocKind::PcRel64,
        R_PC32 => RelocKind::PcRel32,
        R_PC16 => RelocKind::PcRel16,
        R_PC8 => RelocKind::PcRel8,
        R_PLT32 => RelocKind::Branch,
        R_GOT32 | R_GOTPCREL | R_GOTPCRELX | R_REX_GOTPCRELX | R_GOT64 | R_GOTPCREL64
        | R_GOTPLT64 => RelocKind::Got,
        R_GOTOFF64 => RelocKind::GotOff64,
        R_GOTPC32 | R_GOTPC64 => RelocKind::GotPc,
        R_PLTOFF64 => RelocKind::PltOff,
        R_SIZE32 | R_SIZE64 => RelocKind::Size,
        R_TLSGD => RelocKind::TlsGd,
        R_TLSLD => RelocKind::TlsLd,
        R_DTPOFF32 | R_DTPOFF64 => RelocKind::DtpOff,
        R_DTPMOD64 => RelocKind::DtpMod64,
        R_GOTTPOFF => RelocKind::GotTpOff,
        R_TPOFF32 | R_TPOFF64 => RelocKind::TpOff,
        R_GOTPC32_TLSDESC | R_TLSDESC_CALL | R_TLSDESC => RelocKind::TlsDesc,
        _ => RelocKind::Unknown,
    }
}

/// Bytes written by a relocation.
pub(crate) fn width(r_type: u32) -> u64 {
    match r_type {
        R_64 | R_PC64 | R_GOTOFF64 | R_GOT64 | R_GOTPCREL64 | R_GOTPC64 | R_GOTPLT64
        | R_PLTOFF64 | R_SIZE64 | R_DTPOFF64 | R_DTPMOD64 | R_TPOFF64 | R_TLSDESC => 8,
        R_16 | R_PC16 => 2,
        R_8 | R_PC8 => 1,
        R_NONE | R_TLSDESC_CALL => 0,
        _ => 4,
    }
}

/// The psABI name of a relocation type.
pub(crate) fn name(r_type: u32) -> &'static str {
    match r_type {
        R_NONE => "R_X86_64_NONE",
        R_64 => "R_X86_64_64",
        R_PC32 => "R_X86_64_PC32",
        R_GOT32 => "R_X86_64_GOT32",
        R_PLT32 => "R_X86_64_PLT32",
        5 => "R_X86_64_COPY",
        6 => "R_X86_64_GLOB_DAT",
        7 => "R_X86_64_JUMP_SLOT",
        8 => "R_X86_64_RELATIVE",
        R_GOTPCREL => "R_X86_64_GOTPCREL",
        R_32 => "R_X86_64_32",
        R_32S => "R_X86_64_32S",
        R_16 => "R_X86_64_16",
        R_PC16 => "R_X86_64_PC16",
        R_8 => "R_X86_64_8",
        R_PC8 => "R_X86_64_PC8",
        R_DTPMOD64 => "R_X86_64_DTPMOD64",
        R_DTPOFF64 => "R_X86_64_DTPOFF64",
        R_TPOFF64 => "R_X86_64_TPOFF64",
        R_TLSGD => "R_X86_64_TLSGD",
        R_TLSLD => "R_X86_64_TLSLD",
        R_DTPOFF32 => "R_X86_64_DTPOFF32",
        R_GOTTPOFF => "R_X86_64_GOTTPOFF",
        R_TPOFF32 => "R_X86_64_TPOFF32",
        R_PC64 => "R_X86_64_PC64",
        R_GOTOFF64 => "R_X86_64_GOTOFF64",
        R_GOTPC32 => "R_X86_64_GOTPC32",
        R_GOT64 => "R_X86_64_GOT64",
        R_GOTPCREL64 => "R_X86_64_GOTPCREL64",
        R_GOTPC64 => "R_X86_64_GOTPC64",
        R_GOTPLT64 => "R_X86_64_GOTPLT64",
        R_PLTOFF64 => "R_X86_64_PLTOFF64",
        R_SIZE32 => "R_X86_64_SIZE32",
        R_SIZE64 => "R_X86_64_SIZE64",
        R_GOTPC32_TLSDESC => "R_X86_64_GOTPC32_TLSDESC",
        R_TLSDESC_CALL => "R_X86_64_TLSDESC_CALL",
        R_TLSDESC => "R_X86_64_TLSDESC",
        37 => "R_X86_64_IRELATIVE",
        38 => "R_X86_64_RELATIVE64",
        R_GOTPCRELX => "R_X86_64_GOTPCRELX",
        R_REX_GOTPCRELX => "R_X86_64_REX_GOTPCRELX",
        _ => "unknown",
    }
}
