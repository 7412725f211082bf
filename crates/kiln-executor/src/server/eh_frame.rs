//! The check of `.eh_frame` data before the unwinder sees it: every CIE and FDE parses
//! (gimli), and so do their call-frame instructions.
//!
//! The instructions of ordinary functions are checked by a scan of their bytes first
//! ([`scan_instructions`]): gimli's iterator builds every instruction, about 8 ns each, and
//! SQLite's 60,000 took 0.5 ms of an out-of-process run's 3 ms start. The scan knows the
//! opcodes compilers emit for such functions and accepts a stream only if each is one of
//! them with its operands inside the stream; anything else (an expression, `set_loc`, a
//! vendor's opcode, an operand gimli would refuse) goes to gimli, which decides and names
//! the error.

use gimli::{
    BaseAddresses, CieOrFde, CommonInformationEntry, EhFrame, EndianSlice, LittleEndian,
    UnwindSection,
};
use std::collections::HashMap;

type Slice<'a> = EndianSlice<'a, LittleEndian>;

/// Parses every CIE and FDE of `.eh_frame` data (`bytes`, at target `address`) and their
/// call-frame instructions; returns the FDEs' code ranges (start, length; empty ones left
/// out), in the order of the records.
pub(super) fn check_records(address: u64, bytes: &[u8]) -> Result<Vec<(u64, u64)>, String> {
    let eh_frame = EhFrame::new(bytes, LittleEndian);
    let bases = BaseAddresses::default().set_eh_frame(address);
    let mut entries = eh_frame.entries(&bases);
    // Each CIE is parsed once, not again for every FDE that names it.
    let mut cies = HashMap::new();
    let mut ranges = Vec::new();
    loop {
        let entry = entries
            .next()
            .map_err(|e| format!("eh_frame at {address:#x}: malformed record: {e}"))?;
        let Some(entry) = entry else { break };
        match entry {
            CieOrFde::Cie(cie) => {
                let mut instructions = cie.instructions(&eh_frame, &bases);
                while instructions
                    .next()
                    .map_err(|e| format!("eh_frame at {address:#x}: CIE instructions: {e}"))?
                    .is_some()
                {}
                cies.insert(cie.offset(), cie);
            }
            CieOrFde::Fde(partial) => {
                let fde = partial
                    .parse(|section, bases, offset| match cies.get(&offset.0) {
                        Some(cie) => Ok(cie.clone()),
                        None => EhFrame::cie_from_offset(section, bases, offset),
                    })
                    .map_err(|e| format!("eh_frame at {address:#x}: malformed FDE: {e}"))?;
                let start = fde.initial_address();
                let len = fde.len();
                if start.checked_add(len).is_none() {
                    return Err(format!(
                        "eh_frame at {address:#x}: FDE range {start:#x} + {len:#x} is reversed (wraps around)"
                    ));
                }
                if len > 0 {
                    ranges.push((start, len));
                }
                let scanned = fde_instructions(bytes, fde.offset(), fde.entry_len(), fde.cie())
                    .and_then(scan_instructions);
                if scanned.is_none() {
                    let mut instructions = fde.instructions(&eh_frame, &bases);
                    while instructions
                        .next()
                        .map_err(|e| format!("eh_frame at {address:#x}: FDE instructions: {e}"))?
                        .is_some()
                    {}
                }
            }
        }
    }
    Ok(ranges)
}

/// The call-frame instructions of the FDE whose record starts at `offset` in `bytes` (a
/// 32-bit length `entry_len`, as gimli parsed it): what follows its CIE pointer, its code
/// range (two pointers in the CIE's FDE encoding) and, with a `z` augmentation, the
/// augmentation data. `None` when any of that is not as expected (gimli decides then).
fn fde_instructions<'a>(
    bytes: &'a [u8],
    offset: usize,
    entry_len: usize,
    cie: &CommonInformationEntry<Slice<'_>>,
) -> Option<&'a [u8]> {
    // A 64-bit record (length 0xffffffff, then 8 bytes) is laid out otherwise.
    if bytes.get(offset..offset.checked_add(4)?)? == [0xff; 4] {
        return None;
    }
    let end = offset.checked_add(4)?.checked_add(entry_len)?;
    let record = bytes.get(offset.checked_add(8)?..end)?;
    let encoding = cie.fde_address_encoding().map_or(0, |e| e.0);
    // The pointer's size by the low four bits of its encoding (DW_EH_PE_*): LEB128 forms
    // and anything unusual are left to gimli.
    let pointer = match encoding & 0x0f {
        0x00 => usize::from(cie.address_size()),
        0x02 | 0x0a => 2,
        0x03 | 0x0b => 4,
        0x04 | 0x0c => 8,
        _ => return None,
    };
    let mut rest = record.get(2 * pointer..)?;
    if cie.augmentation().is_some() {
        let len = usize::try_from(uleb(&mut rest, 4)?).ok()?;
        rest = rest.get(len..)?;
    }
    Some(rest)
}

/// How many instructions `instructions` holds if it is a stream of the call-frame opcodes
/// ordinary functions use, each with its operands inside the stream (register numbers
/// within 16 bits, as gimli reads them). `None` says nothing about the stream: gimli checks
/// it then.
fn scan_instructions(mut instructions: &[u8]) -> Option<usize> {
    let mut count = 0;
    while let Some((&op, rest)) = instructions.split_first() {
        count += 1;
        instructions = rest;
        let i = &mut instructions;
        let ok = match op >> 6 {
            // DW_CFA_advance_loc (delta in the low bits), DW_CFA_restore (register there).
            1 | 3 => true,
            // DW_CFA_offset: register in the low bits, factored offset.
            2 => uleb(i, 9).is_some(),
            _ => match op {
                // DW_CFA_nop, remember_state, restore_state.
                0x00 | 0x0a | 0x0b => true,
                // DW_CFA_advance_loc1, 2, 4.
                0x02 => skip(i, 1),
                0x03 => skip(i, 2),
                0x04 => skip(i, 4),
                // DW_CFA_offset_extended, def_cfa: register, unsigned operand.
                0x05 | 0x0c => register(i) && uleb(i, 9).is_some(),
                // DW_CFA_restore_extended, undefined, same_value, def_cfa_register.
                0x06 | 0x07 | 0x08 | 0x0d => register(i),
                // DW_CFA_register: two registers.
                0x09 => register(i) && register(i),
                // DW_CFA_def_cfa_offset, DW_CFA_GNU_args_size.
                0x0e | 0x2e => uleb(i, 9).is_some(),
                _ => false,
            },
        };
        if !ok {
            return None;
        }
    }
    Some(count)
}

/// Reads an unsigned LEB128 of at most `max_bytes` bytes (9 hold 63 bits: no overflow to
/// check) from the front of `bytes`.
fn uleb(bytes: &mut &[u8], max_bytes: usize) -> Option<u64> {
    let mut value = 0u64;
    for (i, &byte) in bytes.iter().enumerate().take(max_bytes) {
        value |= u64::from(byte & 0x7f) << (7 * i);
        if byte & 0x80 == 0 {
            *bytes = &bytes[i + 1..];
            return Some(value);
        }
    }
    None
}

/// A register number (unsigned LEB128) that fits gimli's 16-bit registers.
fn register(bytes: &mut &[u8]) -> bool {
    uleb(bytes, 3).is_some_and(|r| r <= u64::from(u16::MAX))
}

/// Skips `n` bytes if the stream has them.
fn skip(bytes: &mut &[u8], n: usize) -> bool {
    match bytes.get(n..) {
        Some(rest) => {
            *bytes = rest;
            true
        }
        None => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every instruction stream gimli can reach in `bytes`: for each FDE, how many
    /// instructions the scan counted (if it took the stream) and gimli parsed (if it could).
    fn verdicts(bytes: &[u8]) -> Vec<(Option<usize>, Option<usize>)> {
        let eh_frame = EhFrame::new(bytes, LittleEndian);
        let bases = BaseAddresses::default().set_eh_frame(0x10_0000);
        let mut entries = eh_frame.entries(&bases);
        let mut out = Vec::new();
        while let Ok(Some(entry)) = entries.next() {
            let CieOrFde::Fde(partial) = entry else {
                continue;
            };
            let Ok(fde) = partial.parse(EhFrame::cie_from_offset) else {
                continue;
            };
            let scanned = fde_instructions(bytes, fde.offset(), fde.entry_len(), fde.cie())
                .and_then(scan_instructions);
            let mut instructions = fde.instructions(&eh_frame, &bases);
            let mut count = 0;
            let parsed = loop {
                match instructions.next() {
                    Ok(Some(_)) => count += 1,
                    Ok(None) => break Some(count),
                    Err(_) => break None,
                }
            };
            out.push((scanned, parsed));
        }
        out
    }

    /// This executor's own `.eh_frame` (the system compiler's and rustc's records).
    fn own_eh_frame() -> Vec<u8> {
        use object::{Object, ObjectSection};
        let exe = std::fs::read("/proc/self/exe").expect("this test binary reads");
        let file = object::File::parse(&*exe).expect("this test binary parses");
        let section = file
            .section_by_name(".eh_frame")
            .expect("an .eh_frame section");
        section.data().expect("its data").to_vec()
    }

    #[test]
    fn the_scan_takes_ordinary_functions_and_agrees_with_gimli() {
        let bytes = own_eh_frame();
        let verdicts = verdicts(&bytes);
        assert!(verdicts.len() > 1000, "{} FDEs", verdicts.len());
        // Whatever the scan takes, gimli parses, to as many instructions (the scan read
        // the same bytes).
        for &(scanned, parsed) in &verdicts {
            if scanned.is_some() {
                assert_eq!(scanned, parsed);
            }
        }
        let scanned = verdicts.iter().filter(|v| v.0.is_some()).count();
        assert!(
            scanned * 10 >= verdicts.len() * 9,
            "the scan took {scanned} of {} FDEs",
            verdicts.len()
        );
        // And the check passes them all.
        let ranges = check_records(0x10_0000, &bytes).expect("its own .eh_frame checks");
        assert!(ranges.len() > 1000);
    }

    #[test]
    fn every_truncated_or_unknown_stream_is_left_to_gimli() {
        // A whole stream: advance_loc, def_cfa_offset 16, offset r6 at cfa-16, advance_loc1,
        // def_cfa_register r6, remember/restore, restore r6, nop.
        let good = [
            0x41, 0x0e, 0x10, 0x86, 0x02, 0x02, 0x05, 0x0d, 0x06, 0x0a, 0x0b, 0xc6, 0x00,
        ];
        assert_eq!(scan_instructions(&good), Some(9));
        // Each prefix that cuts an operand short is not taken.
        for cut in [2, 4, 6, 8] {
            assert_eq!(scan_instructions(&good[..cut]), None, "cut at {cut}");
        }
        // advance_loc4 needs four bytes.
        assert_eq!(scan_instructions(&[0x04, 1, 2, 3]), None);
        assert_eq!(scan_instructions(&[0x04, 1, 2, 3, 4]), Some(1));
        // An unterminated LEB128, a register past 16 bits, an expression, an unknown
        // opcode: gimli decides.
        assert_eq!(scan_instructions(&[0x0e, 0x80, 0x80]), None);
        assert_eq!(scan_instructions(&[0x0d, 0x80, 0x80, 0x04]), None);
        assert_eq!(scan_instructions(&[0x0f, 0x01, 0x9c]), None);
        assert_eq!(scan_instructions(&[0x3f]), None);
    }

    #[test]
    fn a_corrupted_eh_frame_is_still_refused_by_name() {
        let mut bytes = own_eh_frame();
        // The first instruction of the first FDE that has any made 0x1f, an opcode in the
        // vendors' range that no one defines: the scan leaves it to gimli, which refuses it.
        let eh_frame = EhFrame::new(&bytes, LittleEndian);
        let bases = BaseAddresses::default().set_eh_frame(0x10_0000);
        let mut entries = eh_frame.entries(&bases);
        let mut target = None;
        while let Ok(Some(entry)) = entries.next() {
            let CieOrFde::Fde(partial) = entry else {
                continue;
            };
            let fde = partial.parse(EhFrame::cie_from_offset).expect("FDE parses");
            if let Some(ins) = fde_instructions(&bytes, fde.offset(), fde.entry_len(), fde.cie()) {
                if !ins.is_empty() {
                    target = Some(ins.as_ptr() as usize - bytes.as_ptr() as usize);
                    break;
                }
            }
        }
        let at = target.expect("an FDE with instructions");
        bytes[at] = 0x1f;
        let error = check_records(0x10_0000, &bytes).expect_err("an unknown opcode is refused");
        assert!(error.contains("FDE instructions"), "{error}");
    }
}
