//! Windows x64 unwind data (`UNWIND_INFO`, for `RtlAddFunctionTable`) from an ELF
//! object's `.eh_frame`: what Windows needs to walk through JIT frames (a crash report, a
//! debugger's backtrace, `longjmp` and C++ exceptions), which objects compiled for
//! `x86_64-w64-windows-gnu-elf` carry only as DWARF call frame information (with
//! `-fdwarf-exceptions`; without it they carry none).
//!
//! Written by hand because no crate converts CFI to Windows unwind codes: gimli evaluates
//! the CFI into rows (where the CFA is, where each register was saved, address by
//! address), and the prologue's rows become unwind codes:
//! - the CFA, still `rsp`-based, moves up by 8 and a register was saved at the new top:
//!   `UWOP_PUSH_NONVOL`;
//! - it moves up otherwise: `UWOP_ALLOC_SMALL` / `UWOP_ALLOC_LARGE`;
//! - it becomes `rbp`-based: `UWOP_SET_FPREG` (rbp = rsp + the difference);
//! - a register saved elsewhere (a `mov` to the frame): `UWOP_SAVE_NONVOL`, or
//!   `UWOP_SAVE_XMM128` for xmm6–xmm15.
//!
//! The prologue is the rows from the function's start up to the first that undoes
//! anything (an epilogue: the CFA moves down, a saved register is restored). A function
//! whose prologue the codes cannot describe (longer than 255 bytes, a CFA on another
//! register, a save below the stack pointer) gets no entry and is reported: Windows then
//! treats it as a leaf, as it does every function today.

use gimli::{
    BaseAddresses, CfaRule, CieOrFde, EhFrame, LittleEndian, Register, RegisterRule, UnwindContext,
    UnwindSection, X86_64,
};

/// One function's unwind data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WindowsUnwind {
    /// The function's first byte.
    pub begin: u64,
    /// One past its last byte.
    pub end: u64,
    /// Its `UNWIND_INFO`: version 1, no handler; a multiple of 4 bytes.
    pub info: Vec<u8>,
}

/// A module's Windows x64 unwind table as COFF objects carry it (`.pdata`): its
/// `RUNTIME_FUNCTION` entries, sorted by their first byte, relative to `image_base`.
/// Their `UNWIND_INFO` (and its handlers' data) is in the module, relative to the same
/// base: the table is registered in place (`RtlAddFunctionTable(entries, n, image_base)`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FunctionTable {
    /// The module's lowest address: what the entries' offsets count from.
    pub image_base: u64,
    /// Each function's (first byte, one past its last byte, `UNWIND_INFO`) as offsets from
    /// `image_base`.
    pub entries: Vec<[u32; 3]>,
}

/// A function of the `.eh_frame` that got no unwind data, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Skipped {
    /// The function's first byte.
    pub begin: u64,
    /// Why its prologue cannot be described.
    pub why: String,
}

/// The unwind codes' operations (the Windows x64 ABI's `UWOP_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UnwindOp {
    /// `push reg` (a Windows register number: 0 rax, 1 rcx, 2 rdx, 3 rbx, 4 rsp, 5 rbp,
    /// 6 rsi, 7 rdi, 8–15 r8–r15).
    PushNonvol(u8),
    /// `sub rsp, size`.
    Alloc(u32),
    /// `lea rbp, [rsp + offset]` (`mov rbp, rsp` for 0): rbp is the frame register.
    SetFpreg(u8),
    /// `mov [rsp + offset], reg`.
    SaveNonvol(u8, u32),
    /// `movaps [rsp + offset], xmmN`.
    SaveXmm128(u8, u32),
}

/// One unwind code: an operation and where in the prologue it ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UnwindCode {
    /// The offset from the function's start of the end of the instruction.
    pub offset: u8,
    /// What it did.
    pub op: UnwindOp,
}

/// The unwind data of every function described in `eh_frame`, which lies at `address`
/// (its pointers are read as placed there), and the functions that got none.
///
/// ```
/// // An empty .eh_frame (its terminator): no function.
/// let (entries, skipped) = kiln_link::windows_unwind::from_eh_frame(&[0, 0, 0, 0], 0x1000).unwrap();
/// assert!(entries.is_empty() && skipped.is_empty());
/// ```
pub fn from_eh_frame(
    eh_frame: &[u8],
    address: u64,
) -> Result<(Vec<WindowsUnwind>, Vec<Skipped>), String> {
    let section = EhFrame::new(eh_frame, LittleEndian);
    let bases = BaseAddresses::default().set_eh_frame(address);
    let mut ctx = Box::new(UnwindContext::new());
    let (mut entries, mut skipped) = (Vec::new(), Vec::new());
    let mut iter = section.entries(&bases);
    while let Some(entry) = iter.next().map_err(|e| format!(".eh_frame: {e}"))? {
        let CieOrFde::Fde(partial) = entry else {
            continue;
        };
        let fde = partial
            .parse(|s, b, o| s.cie_from_offset(b, o))
            .map_err(|e| format!(".eh_frame: an FDE: {e}"))?;
        let begin = fde.initial_address();
        let Some(end) = begin.checked_add(fde.len()) else {
            return Err(format!(
                ".eh_frame: the FDE of {begin:#x} runs past the end of the address space ({:#x} bytes)",
                fde.len()
            ));
        };
        let mut rows = fde
            .rows(&section, &bases, &mut ctx)
            .map_err(|e| format!(".eh_frame: the FDE of {begin:#x}: {e}"))?;
        let mut states = Vec::new();
        while let Some(row) = rows
            .next_row()
            .map_err(|e| format!(".eh_frame: the FDE of {begin:#x}: {e}"))?
        {
            let CfaRule::RegisterAndOffset { register, offset } = *row.cfa() else {
                states.push(None);
                continue;
            };
            let saved: Vec<(Register, i64)> = row
                .registers()
                .filter_map(|(r, rule)| match rule {
                    RegisterRule::Offset(o) if *r != X86_64::RA => Some((*r, *o)),
                    _ => None,
                })
                .collect();
            states.push(Some(State {
                at: row.start_address().saturating_sub(begin),
                cfa: register,
                offset,
                saved,
            }));
        }
        match codes(&states) {
            Ok((codes, frame)) => entries.push(WindowsUnwind {
                begin,
                end,
                info: encode(&codes, frame)?,
            }),
            Err(why) => skipped.push(Skipped { begin, why }),
        }
    }
    Ok((entries, skipped))
}

/// A row: from `at`, the CFA is `cfa + offset` and each register of `saved` was saved
/// at the CFA plus its offset.
struct State {
    at: u64,
    cfa: Register,
    offset: i64,
    saved: Vec<(Register, i64)>,
}

/// The Windows number of a DWARF x86-64 general register, or of xmm0–15 (+ 100).
fn windows_register(r: Register) -> Option<u8> {
    Some(match r.0 {
        0 => 0, // rax
        1 => 2, // rdx
        2 => 1, // rcx
        3 => 3, // rbx
        4 => 6, // rsi
        5 => 7, // rdi
        6 => 5, // rbp
        7 => 4, // rsp
        8..=15 => r.0 as u8,
        17..=32 => 100 + (r.0 - 17) as u8,
        _ => return None,
    })
}

/// The unwind codes of a function's rows (prologue first), and its frame register's
/// offset if it sets one.
fn codes(states: &[Option<State>]) -> Result<(Vec<UnwindCode>, Option<u8>), String> {
    let mut codes = Vec::new();
    let mut frame = None;
    let Some(Some(first)) = states.first() else {
        return Ok((codes, None));
    };
    // A function's first instruction sees its caller's frame: the CFA 8 bytes above rsp
    // (the return address), nothing saved. Anything else is a fragment of another
    // function's frame (gcc's `.cold` parts), which unwind codes cannot describe.
    if first.cfa != X86_64::RSP || first.offset != 8 || !first.saved.is_empty() {
        return Err(format!(
            "its first row is not a function's entry (CFA register {} + {}, {} saved): a fragment of another function",
            first.cfa.0,
            first.offset,
            first.saved.len()
        ));
    }
    let (mut cfa, mut offset) = (first.cfa, first.offset);
    let mut saved: Vec<(Register, i64)> = first.saved.clone();
    for state in states.iter().skip(1) {
        let Some(state) = state else {
            return Err("a CFA that is an expression".into());
        };
        // An epilogue (or anything that undoes the prologue) ends it.
        let undoes = saved.iter().any(|s| !state.saved.contains(s))
            || (state.cfa == cfa && state.offset < offset)
            || (cfa == X86_64::RBP && state.cfa != X86_64::RBP);
        if undoes {
            break;
        }
        let at = u8::try_from(state.at)
            .map_err(|_| format!("a prologue of {} bytes (at most 255)", state.at))?;
        let new: Vec<(Register, i64)> = state
            .saved
            .iter()
            .copied()
            .filter(|s| !saved.contains(s))
            .collect();
        let mut pushed = None;
        if state.cfa == X86_64::RSP && cfa == X86_64::RSP && state.offset > offset {
            let grown = state.offset - offset;
            // A push wrote the new top of the stack: the CFA minus the new offset.
            pushed = (grown == 8)
                .then(|| {
                    new.iter()
                        .find(|(_, o)| *o == -state.offset)
                        .map(|(r, _)| *r)
                })
                .flatten()
                .or_else(|| {
                    // LLVM lists the pushes' saves at the end of the prologue: the
                    // register that ends up saved at that slot.
                    (grown == 8)
                        .then(|| {
                            states
                                .iter()
                                .flatten()
                                .flat_map(|s| &s.saved)
                                .find(|(_, o)| *o == -state.offset)
                                .map(|(r, _)| *r)
                        })
                        .flatten()
                });
            match pushed {
                Some(r) => {
                    let reg = windows_register(r)
                        .filter(|&n| n < 16)
                        .ok_or_else(|| format!("a push of DWARF register {}", r.0))?;
                    codes.push(UnwindCode {
                        offset: at,
                        op: UnwindOp::PushNonvol(reg),
                    });
                }
                None => codes.push(UnwindCode {
                    offset: at,
                    op: UnwindOp::Alloc(
                        u32::try_from(grown).map_err(|_| "an allocation beyond 4 GiB")?,
                    ),
                }),
            }
        } else if state.cfa == X86_64::RBP && cfa == X86_64::RSP {
            // rbp = rsp + (offset - state.offset).
            let difference = offset - state.offset;
            if difference < 0 || difference % 16 != 0 || difference > 240 {
                return Err(format!(
                    "a frame pointer {difference} bytes above the stack pointer"
                ));
            }
            let scaled = (difference / 16) as u8;
            codes.push(UnwindCode {
                offset: at,
                op: UnwindOp::SetFpreg(scaled),
            });
            frame = Some(scaled);
        } else if state.cfa != cfa || state.offset != offset {
            return Err(format!(
                "a CFA change the unwind codes cannot say (register {} + {})",
                state.cfa.0, state.offset
            ));
        }
        // Saves that no push made: moves to the frame, at rsp + (CFA offset + o).
        for (r, o) in new {
            if pushed == Some(r) || codes_push(&codes, r) {
                continue;
            }
            if frame.is_some() {
                return Err("a register saved by a move in a frame-pointer function".into());
            }
            let from_rsp = state.offset + o;
            let reg =
                windows_register(r).ok_or_else(|| format!("a save of DWARF register {}", r.0))?;
            let from_rsp = u32::try_from(from_rsp)
                .map_err(|_| format!("a save {from_rsp} bytes below the stack pointer"))?;
            codes.push(UnwindCode {
                offset: at,
                op: if reg >= 100 {
                    UnwindOp::SaveXmm128(reg - 100, from_rsp)
                } else {
                    UnwindOp::SaveNonvol(reg, from_rsp)
                },
            });
        }
        cfa = state.cfa;
        offset = state.offset;
        saved = state.saved.clone();
    }
    Ok((codes, frame))
}

/// Whether `codes` pushed the register DWARF numbers `r`.
fn codes_push(codes: &[UnwindCode], r: Register) -> bool {
    let Some(reg) = windows_register(r) else {
        return false;
    };
    codes.iter().any(|c| c.op == UnwindOp::PushNonvol(reg))
}

/// `UNWIND_INFO` for `codes` (in prologue order; written newest first, as Windows reads
/// them).
fn encode(codes: &[UnwindCode], frame: Option<u8>) -> Result<Vec<u8>, String> {
    let mut slots: Vec<u16> = Vec::new();
    let slot =
        |offset: u8, op: u8, info: u8| u16::from(offset) | (u16::from(op | (info << 4)) << 8);
    for code in codes.iter().rev() {
        let o = code.offset;
        match code.op {
            UnwindOp::PushNonvol(reg) => slots.push(slot(o, 0, reg)),
            UnwindOp::Alloc(size) if (8..=128).contains(&size) && size % 8 == 0 => {
                slots.push(slot(o, 2, (size / 8 - 1) as u8));
            }
            UnwindOp::Alloc(size) if size % 8 == 0 && size / 8 <= 0xffff => {
                slots.push(slot(o, 1, 0));
                slots.push((size / 8) as u16);
            }
            UnwindOp::Alloc(size) => {
                slots.push(slot(o, 1, 1));
                slots.push(size as u16);
                slots.push((size >> 16) as u16);
            }
            UnwindOp::SetFpreg(_) => slots.push(slot(o, 3, 0)),
            UnwindOp::SaveNonvol(reg, at) if at % 8 == 0 && at / 8 <= 0xffff => {
                slots.push(slot(o, 4, reg));
                slots.push((at / 8) as u16);
            }
            UnwindOp::SaveNonvol(reg, at) => {
                slots.push(slot(o, 5, reg));
                slots.push(at as u16);
                slots.push((at >> 16) as u16);
            }
            UnwindOp::SaveXmm128(reg, at) if at % 16 == 0 && at / 16 <= 0xffff => {
                slots.push(slot(o, 8, reg));
                slots.push((at / 16) as u16);
            }
            UnwindOp::SaveXmm128(reg, at) => {
                slots.push(slot(o, 9, reg));
                slots.push(at as u16);
                slots.push((at >> 16) as u16);
            }
        }
    }
    let count = u8::try_from(slots.len()).map_err(|_| "more than 255 unwind code slots")?;
    let prolog = codes.iter().map(|c| c.offset).max().unwrap_or(0);
    let mut info = vec![
        1, // version 1, no flags
        prolog,
        count,
        frame.map_or(0, |scaled| 5 | (scaled << 4)), // rbp
    ];
    for s in &slots {
        info.extend_from_slice(&s.to_le_bytes());
    }
    if slots.len() % 2 == 1 {
        info.extend_from_slice(&[0, 0]);
    }
    Ok(info)
}

/// The unwind codes of an `UNWIND_INFO` (as [`from_eh_frame`] writes them), for tests
/// and tools: newest first, as stored.
pub fn decode(info: &[u8]) -> Vec<UnwindCode> {
    let count = info.get(2).copied().unwrap_or(0) as usize;
    let slot = |i: usize| {
        info.get(4 + 2 * i..6 + 2 * i)
            .map_or(0, |b| u16::from_le_bytes([b[0], b[1]]))
    };
    let mut codes = Vec::new();
    let mut i = 0;
    while i < count {
        let s = slot(i);
        let (offset, op, reg) = ((s & 0xff) as u8, ((s >> 8) & 0xf) as u8, (s >> 12) as u8);
        let large = |i: usize| u32::from(slot(i)) | (u32::from(slot(i + 1)) << 16);
        let (op, used) = match op {
            0 => (UnwindOp::PushNonvol(reg), 1),
            1 if reg == 0 => (UnwindOp::Alloc(u32::from(slot(i + 1)) * 8), 2),
            1 => (UnwindOp::Alloc(large(i + 1)), 3),
            2 => (UnwindOp::Alloc((u32::from(reg) + 1) * 8), 1),
            3 => (UnwindOp::SetFpreg(info.get(3).map_or(0, |f| f >> 4)), 1),
            4 => (UnwindOp::SaveNonvol(reg, u32::from(slot(i + 1)) * 8), 2),
            5 => (UnwindOp::SaveNonvol(reg, large(i + 1)), 3),
            8 => (UnwindOp::SaveXmm128(reg, u32::from(slot(i + 1)) * 16), 2),
            9 => (UnwindOp::SaveXmm128(reg, large(i + 1)), 3),
            _ => break,
        };
        codes.push(UnwindCode { offset, op });
        i += used;
    }
    codes
}

/// A link pass ([`crate::PassPoint::FixedUp`]) that makes the Windows unwind data of
/// everything the link's `.eh_frame` sections describe, relocated and at their target
/// addresses; a session linking for a Windows executor registers what it collects
/// ([`WindowsUnwindPass::take`]).
#[derive(Default)]
pub struct WindowsUnwindPass {
    collected: std::sync::Mutex<(Vec<WindowsUnwind>, Vec<Skipped>)>,
}

impl WindowsUnwindPass {
    /// What the last link it ran in collected: the functions' unwind data, and those that
    /// got none.
    pub fn take(&self) -> (Vec<WindowsUnwind>, Vec<Skipped>) {
        let mut collected = self.collected.lock().unwrap_or_else(|p| p.into_inner());
        std::mem::take(&mut *collected)
    }
}

impl crate::LinkPass for WindowsUnwindPass {
    fn name(&self) -> &str {
        "windows-unwind"
    }

    fn run(&self, graph: &mut crate::GraphView<'_, '_, '_>) -> Result<(), crate::PassError> {
        let mut found = (Vec::new(), Vec::new());
        let all = graph.sections();
        // Where the module's code lies: an FDE of a function outside it (a discarded COMDAT
        // copy's, relocated against nothing) describes no code of this module.
        let code: Vec<(u64, u64)> = all
            .iter()
            .filter(|s| s.code)
            .filter_map(|s| s.address.map(|a| (a, a + s.size)))
            .collect();
        let sections: Vec<crate::GraphSection> = all
            .into_iter()
            .filter(|s| s.name == ".eh_frame" && s.address.is_some())
            .collect();
        for section in sections {
            let address = section.address.unwrap_or(0);
            let Some(bytes) = graph.section_bytes_mut(section.id) else {
                continue;
            };
            let (entries, skipped) = from_eh_frame(bytes, address)?;
            let (inside, outside): (Vec<_>, Vec<_>) = entries.into_iter().partition(|e| {
                e.begin < e.end && code.iter().any(|&(lo, hi)| lo <= e.begin && e.end <= hi)
            });
            found.0.extend(inside);
            found.1.extend(skipped);
            found.1.extend(outside.into_iter().map(|e| Skipped {
                begin: e.begin,
                why: "a function outside the module's code (a discarded COMDAT copy's)".into(),
            }));
        }
        *self.collected.lock().unwrap_or_else(|p| p.into_inner()) = found;
        Ok(())
    }
}
