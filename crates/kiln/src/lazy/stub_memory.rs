//! Call-through stubs written straight into code memory: what the stub object
//! ([`kiln_link::call_through::CallThrough::object`]) would link to, without an object or
//! a link. The session publishes the result as any linked module. Used when no plugin
//! (debugger, profiler) is to be shown the stubs: those are shown the object.

use crate::Error;
use kiln_link::call_through::{STUB_ENTRY, STUB_SIZE};
use kiln_link::{Architecture, LinkedModule};
use kiln_memory::{AllocationRequest, MemoryManager, Permission, SegmentRequest};

/// Stubs placed in memory: the module to publish (its exports the functions' names, at
/// their stubs, sorted by name), and where stub 0 and slot 0 are (the others follow,
/// [`STUB_SIZE`] and 8 bytes apart).
pub(super) struct PlacedStubs {
    pub(super) linked: LinkedModule,
    pub(super) stubs: u64,
    pub(super) slots: u64,
}

/// Allocates code for `architecture`'s stubs of the functions `names` (ids `ids`)
/// and writable slots, writes both (each slot pointing at its stub's entry; the entry's
/// address, `entry`, after the last slot) and makes the code executable. `order` is the
/// names' order ([`name_order`]).
pub(super) fn place_stubs(
    memory: &dyn MemoryManager,
    architecture: Architecture,
    names: &[&str],
    order: &[u32],
    ids: std::ops::Range<u32>,
    entry: u64,
) -> Result<PlacedStubs, Error> {
    let n = order.len();
    let stub_code = architecture.call_through();
    let code_size = stub_code.code_size(n);
    let request = AllocationRequest::new()
        .segment(SegmentRequest::new(
            Permission::ReadExecute,
            code_size as u64,
            16,
        ))
        .segment(SegmentRequest::new(
            Permission::ReadWrite,
            8 * (n as u64 + 1),
            8,
        ));
    let mut in_flight = memory.allocate(&request)?;
    let (Some(stubs), Some(slots)) = (in_flight.target(0), in_flight.target(1)) else {
        return Err(Error::Unsupported(
            "the memory manager gave fewer segments than asked for the stubs".into(),
        ));
    };
    let short = || Error::Unsupported("the stubs' memory is shorter than asked for".into());
    let code = in_flight
        .working_memory(0)
        .filter(|code| code.len() >= code_size)
        .ok_or_else(short)?;
    // The code reaches the slots PC-relative (±2 GiB on x86-64 and RISC-V, ±4 GiB on
    // AArch64: one slab is within reach).
    stub_code
        .write_code(code, ids, Some((stubs, slots)))
        .map_err(|distance| {
            Error::Unsupported(format!(
                "the stubs' slots were placed {distance:#x} bytes from their code, out of its reach on {architecture}"
            ))
        })?;
    let data = in_flight
        .working_memory(1)
        .filter(|data| data.len() >= 8 * (n + 1))
        .ok_or_else(short)?;
    for (i, slot) in data.chunks_exact_mut(8).take(n).enumerate() {
        let stub_entry = stubs + STUB_SIZE * i as u64 + STUB_ENTRY;
        slot.copy_from_slice(&stub_entry.to_le_bytes());
    }
    data[8 * n..8 * n + 8].copy_from_slice(&entry.to_le_bytes());
    let allocation = in_flight.finalize()?;
    let bytes = order.iter().map(|&i| names[i as usize].len()).sum();
    let mut exports = kiln_link::SymbolTable::builder(order.len(), bytes);
    for i in order.iter().map(|&i| i as usize) {
        exports
            .push(names[i], stubs + STUB_SIZE * i as u64, true, false)
            .map_err(|e| Error::Unsupported(e.to_string()))?;
    }
    let exports = exports.finish();
    Ok(PlacedStubs {
        linked: LinkedModule {
            allocation,
            exports,
            init: Vec::new(),
            fini: Vec::new(),
            eh_frame: None,
            function_table: None,
            // No `__cxa_atexit` names it: any address of the module's own.
            dso_handle: slots + 8 * n as u64,
            tls: None,
            objects: Vec::new(),
            sections: Vec::new(),
            symbol_info: Vec::new(),
            image: Vec::new(),
            image_symbols: None,
            architecture,
            branch_protected: false,
            times: Default::default(),
            pass_times: Vec::new(),
            counts: Default::default(),
            relocatable: None,
        },
        stubs,
        slots,
    })
}

/// The indexes of `names` in the order of the names (bytewise, as `str`'s `Ord`).
///
/// Sorted by a key of each name's first eight bytes (zero-padded: no name holds a zero
/// byte), radix-sorted, and only names that share those bytes compared whole: comparing
/// 10,000 names as strings took a third of defining their stubs.
pub(super) fn name_order(names: &[&str]) -> Vec<u32> {
    let key = |name: &str| {
        let mut bytes = [0u8; 8];
        let n = name.len().min(8);
        bytes[..n].copy_from_slice(&name.as_bytes()[..n]);
        u64::from_be_bytes(bytes)
    };
    let mut keyed: Vec<(u64, u32)> = names
        .iter()
        .enumerate()
        .map(|(i, name)| (key(name), i as u32))
        .collect();
    radsort::sort_by_key(&mut keyed, |k| k.0);
    // Runs of one key: names that begin alike, in full.
    let mut start = 0;
    while start < keyed.len() {
        let mut end = start + 1;
        while end < keyed.len() && keyed[end].0 == keyed[start].0 {
            end += 1;
        }
        if end - start > 1 {
            keyed[start..end].sort_unstable_by(|a, b| names[a.1 as usize].cmp(names[b.1 as usize]));
        }
        start = end;
    }
    keyed.into_iter().map(|(_, i)| i).collect()
}

#[cfg(test)]
mod tests {
    use super::name_order;

    #[test]
    fn names_are_ordered_as_strings_are() {
        let words = [
            "f10",
            "f1",
            "f2",
            "a",
            "ab",
            "abcdefgh",
            "abcdefghz",
            "abcdefgha",
            "abcdefg",
            "é",
            "e",
            "z",
            "_",
            "f100000000",
            "f10000000",
            "Zeta",
        ];
        let ordered: Vec<&str> = name_order(&words)
            .into_iter()
            .map(|i| words[i as usize])
            .collect();
        let mut expected = words.to_vec();
        expected.sort();
        assert_eq!(ordered, expected);
    }
}
