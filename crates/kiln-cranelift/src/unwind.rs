//! `.eh_frame` for the functions of one finalize: Cranelift's System V unwind information
//! (a CIE of the ISA's, an FDE per function) written with gimli, its addresses left as
//! relocations against the functions' symbols, so that the link fixes them up and Kiln
//! registers the table as it does a C object's. A Rust panic (or a C++ exception) then
//! passes through JIT frames, and debuggers and profilers can walk them.

use cranelift_codegen::gimli;
use cranelift_codegen::gimli::write::{Address, EhFrame, EndianVec, FrameTable, Writer};
use cranelift_codegen::isa::unwind::systemv::UnwindInfo;
use cranelift_codegen::isa::TargetIsa;
use kiln_link::{Architecture, BuiltObject, BuiltSectionKind, BuiltSymbol};

/// A relocation the writer left: at `offset`, the address of symbol number `symbol` (an
/// index into the caller's list) plus `addend`, PC-relative or absolute.
struct Fixup {
    offset: usize,
    symbol: usize,
    addend: i64,
    pc_relative: bool,
    size: u8,
}

/// gimli's writer, keeping symbol addresses as relocations.
struct RelocatingWriter {
    bytes: EndianVec<gimli::LittleEndian>,
    fixups: Vec<Fixup>,
}

impl Writer for RelocatingWriter {
    type Endian = gimli::LittleEndian;

    fn endian(&self) -> Self::Endian {
        gimli::LittleEndian
    }
    fn len(&self) -> usize {
        self.bytes.len()
    }
    fn write(&mut self, bytes: &[u8]) -> gimli::write::Result<()> {
        self.bytes.write(bytes)
    }
    fn write_at(&mut self, offset: usize, bytes: &[u8]) -> gimli::write::Result<()> {
        self.bytes.write_at(offset, bytes)
    }
    fn write_address(&mut self, address: Address, size: u8) -> gimli::write::Result<()> {
        match address {
            Address::Constant(value) => self.write_udata(value, size),
            Address::Symbol { symbol, addend } => {
                self.fixups.push(Fixup {
                    offset: self.len(),
                    symbol,
                    addend,
                    pc_relative: false,
                    size,
                });
                self.write_udata(0, size)
            }
        }
    }
    fn write_eh_pointer(
        &mut self,
        address: Address,
        eh_pe: gimli::DwEhPe,
        size: u8,
    ) -> gimli::write::Result<()> {
        let Address::Symbol { symbol, addend } = address else {
            return self.write_eh_pointer_data(
                match address {
                    Address::Constant(v) if eh_pe.application() == gimli::DW_EH_PE_pcrel => {
                        v.wrapping_sub(self.len() as u64)
                    }
                    Address::Constant(v) => v,
                    Address::Symbol { .. } => 0,
                },
                eh_pe.format(),
                size,
            );
        };
        let (pc_relative, size) = match (eh_pe.application(), eh_pe.format()) {
            (gimli::DW_EH_PE_absptr, gimli::DW_EH_PE_absptr) => (false, size),
            (gimli::DW_EH_PE_absptr, gimli::DW_EH_PE_udata8 | gimli::DW_EH_PE_sdata8) => (false, 8),
            (gimli::DW_EH_PE_pcrel, gimli::DW_EH_PE_sdata4) => (true, 4),
            _ => return Err(gimli::write::Error::UnsupportedPointerEncoding(eh_pe)),
        };
        self.fixups.push(Fixup {
            offset: self.len(),
            symbol,
            addend,
            pc_relative,
            size,
        });
        self.write_udata(0, size)
    }
}

/// The ELF relocation types of an address in `.eh_frame`: (PC-relative 32-bit, absolute
/// 64-bit).
fn relocation_types(architecture: Architecture) -> (u32, u32) {
    use object::elf::*;
    let (pc32, abs64) = match architecture {
        Architecture::X86_64 => (R_X86_64_PC32, R_X86_64_64),
        Architecture::Aarch64 => (R_AARCH64_PREL32, R_AARCH64_ABS64),
        Architecture::Riscv64 => (R_RISCV_32_PCREL, R_RISCV_64),
    };
    (pc32.0, abs64.0)
}

/// Adds `.eh_frame` for `functions` (each function's symbol in `object` and its unwind
/// information) to `object`. Nothing is added if the ISA has no System V CIE or no
/// function has unwind information.
pub(crate) fn add_eh_frame(
    isa: &dyn TargetIsa,
    architecture: Architecture,
    object: &mut BuiltObject,
    functions: &[(BuiltSymbol, &UnwindInfo)],
) -> Result<(), String> {
    if functions.is_empty() {
        return Ok(());
    }
    let Some(cie) = isa.create_systemv_cie() else {
        return Ok(());
    };
    let mut table = FrameTable::default();
    let cie = table.add_cie(cie);
    for (i, (_, info)) in functions.iter().enumerate() {
        table.add_fde(
            cie,
            info.to_fde(Address::Symbol {
                symbol: i,
                addend: 0,
            }),
        );
    }
    let mut eh_frame = EhFrame(RelocatingWriter {
        bytes: EndianVec::new(gimli::LittleEndian),
        fixups: Vec::new(),
    });
    table
        .write_eh_frame(&mut eh_frame)
        .map_err(|e| format!("writing .eh_frame: {e}"))?;
    let RelocatingWriter { bytes, fixups } = eh_frame.0;
    let mut bytes = bytes.into_vec();
    // The unwinder stops at a zero-length entry.
    bytes.extend_from_slice(&[0; 4]);
    let section = object.add_section(".eh_frame", BuiltSectionKind::ReadOnly, 8, &bytes);
    let (pc32, abs64) = relocation_types(architecture);
    for fixup in fixups {
        let r_type = match (fixup.pc_relative, fixup.size) {
            (true, 4) => pc32,
            (false, 8) => abs64,
            (pc, size) => {
                return Err(format!(
                    "an .eh_frame address of {size} bytes ({}) Kiln does not relocate",
                    if pc { "PC-relative" } else { "absolute" }
                ))
            }
        };
        let (symbol, _) = functions[fixup.symbol];
        object.add_relocation(section, fixup.offset as u64, r_type, symbol, fixup.addend);
    }
    Ok(())
}
