//! The `read-function-table` pass: the Windows x64 unwind table of COFF objects — the
//! `RUNTIME_FUNCTION` entries of their `.pdata` sections (a function's first byte, one past
//! its last, its `UNWIND_INFO` in `.xdata`, each relative to the module's image base) —
//! read back relocated, checked to lie in the module, and sorted as `RtlAddFunctionTable`
//! needs. The unwind information stays where the link put it: its handlers' data (C++
//! exceptions' tables, chained entries) is relative to the same base.

use crate::graph::{Allocated, LinkGraph};
use crate::symbols::{Place, SEG_RX};
use crate::windows_unwind::FunctionTable;
use crate::{LinkError, LinkOptions};

/// Whether a section holds `RUNTIME_FUNCTION` entries: `.pdata`, or a COMDAT function's
/// `.pdata$NAME` (gcc names its sections `.pdata.NAME` too).
fn is_pdata(name: &[u8]) -> bool {
    name == b".pdata" || name.starts_with(b".pdata$") || name.starts_with(b".pdata.")
}

impl<'a, 'c> LinkGraph<'a, 'c> {
    /// The module's unwind table from its objects' `.pdata`, if any has one.
    pub(crate) fn read_function_table(
        &mut self,
        memory: &mut Allocated,
        _: &LinkOptions<'_>,
    ) -> Result<(), LinkError> {
        let linker = &self.linker;
        // The placed `.pdata` sections: none in an ELF module, which costs this scan only.
        let placed: Vec<(usize, usize, u8, u64)> = linker
            .objs
            .iter()
            .enumerate()
            .flat_map(|(oi, obj)| {
                obj.sections
                    .iter()
                    .enumerate()
                    .filter_map(move |(si, sec)| {
                        match (is_pdata(sec.name), linker.places[oi][si]) {
                            (true, Place::At { seg, offset }) => Some((oi, si, seg, offset)),
                            _ => None,
                        }
                    })
            })
            .collect();
        if placed.is_empty() {
            return Ok(());
        }
        let base = memory.image_base;
        let code = memory.bases[SEG_RX]..memory.bases[SEG_RX] + self.layout.seg_size[SEG_RX];
        let module: [std::ops::Range<u64>; 4] =
            std::array::from_fn(|s| memory.bases[s]..memory.bases[s] + self.layout.seg_size[s]);
        let segs = memory.in_flight.segments_mut();
        let mut entries = Vec::new();
        for (oi, si, seg, offset) in placed {
            let obj = &linker.objs[oi];
            let sec = &obj.sections[si];
            let bad = |what: String| LinkError::Malformed {
                object: obj.name.to_string(),
                what: format!("section {}: {what}", String::from_utf8_lossy(sec.name)),
            };
            if sec.size % 12 != 0 {
                return Err(bad(format!(
                    "{} bytes, not a whole number of RUNTIME_FUNCTION entries (12 bytes each)",
                    sec.size
                )));
            }
            let bytes = segs
                .get(seg as usize)
                .and_then(|s| s.bytes.get(offset as usize..(offset + sec.size) as usize))
                .ok_or_else(|| bad("placed outside its segment".into()))?;
            for (i, entry) in bytes.chunks_exact(12).enumerate() {
                let word = |at: usize| {
                    u32::from_le_bytes([entry[at], entry[at + 1], entry[at + 2], entry[at + 3]])
                };
                let (begin, end, unwind) = (word(0), word(4), word(8));
                let (b, e, u) = (
                    base + u64::from(begin),
                    base + u64::from(end),
                    base + u64::from(unwind),
                );
                // The unwind info's low bit marks an entry that points at another
                // entry's data (a chained `.pdata` of the same function).
                let info = u & !1;
                if b >= e || !code.contains(&b) || e > code.end {
                    return Err(bad(format!(
                        "entry {i} describes {b:#x}..{e:#x}, not code of the module ({:#x}..{:#x})",
                        code.start, code.end
                    )));
                }
                if !module.iter().any(|r| r.contains(&info)) {
                    return Err(bad(format!(
                        "entry {i}'s unwind information is at {info:#x}, outside the module"
                    )));
                }
                entries.push([begin, end, unwind]);
            }
        }
        if !entries.is_empty() {
            entries.sort_unstable_by_key(|e| e[0]);
            self.function_table = Some(FunctionTable {
                image_base: base,
                entries,
            });
        }
        Ok(())
    }
}
