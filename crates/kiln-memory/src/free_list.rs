//! Free-range bookkeeping for one pool: constant-time good-fit allocation with alignment
//! and constant-time coalescing frees. Pure data structure, no system calls.
//!
//! Written by hand because the allocator crates on crates.io either own their memory
//! (`jit-allocator`, `linked_list_allocator`, `talc`) or keep their metadata inside the
//! managed memory; Kiln needs bookkeeping *outside* the memory (which may be
//! execute-only, or live in another process) over target addresses, with arbitrary sizes,
//! alignment and neighbour coalescing.
//!
//! The structure is TLSF's (Masmano et al., "TLSF: a new dynamic memory allocator for
//! real-time systems", 2004): free ranges are binned by size into 16 classes per power of
//! two; two levels of bitmaps find the first non-empty class that is large enough in O(1).
//! Boundary tags are replaced by two hash maps (start → range, end → range) so that a
//! freed range finds its free neighbours in O(1).

use rustc_hash::FxHashMap;

/// Second-level classes per power of two (log2).
const SL_BITS: u32 = 4;
const SL_COUNT: usize = 1 << SL_BITS;
/// First-level classes: lengths up to 2^63.
const FL_COUNT: usize = 61;
const NIL: u32 = u32::MAX;

#[derive(Debug, Clone, Copy)]
struct Node {
    start: u64,
    end: u64,
    prev: u32,
    next: u32,
}

/// A set of free, disjoint, non-adjacent address ranges inside one pool.
#[derive(Debug, Clone)]
pub struct FreeList {
    start: u64,
    end: u64,
    nodes: Vec<Node>,
    spare: Vec<u32>,
    by_start: FxHashMap<u64, u32>,
    by_end: FxHashMap<u64, u32>,
    heads: Vec<u32>,
    fl_bitmap: u64,
    sl_bitmaps: [u16; FL_COUNT],
    free_bytes: u64,
}

/// A double free or a free outside the pool: the caller's bookkeeping is broken.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("range {start:#x}+{len:#x} is not allocated in this free list")]
pub struct NotAllocated {
    /// Start of the range.
    pub start: u64,
    /// Length of the range.
    pub len: u64,
}

/// The class `(fl, sl)` a free range of `len` bytes is filed under.
fn class_of(len: u64) -> (usize, usize) {
    if len < SL_COUNT as u64 {
        return (0, len as usize);
    }
    let log = 63 - len.leading_zeros();
    let fl = (log - SL_BITS + 1) as usize;
    let sl = ((len >> (log - SL_BITS)) as usize) & (SL_COUNT - 1);
    (fl, sl)
}

/// The first class whose every range holds at least `len` bytes.
fn class_at_least(len: u64) -> Option<(usize, usize)> {
    if len < SL_COUNT as u64 {
        return Some((0, len as usize));
    }
    let log = 63 - len.leading_zeros();
    let rounded = len.checked_add((1u64 << (log - SL_BITS)) - 1)?;
    let (fl, sl) = class_of(rounded);
    (fl < FL_COUNT).then_some((fl, sl))
}

impl FreeList {
    /// A free list over `[start, start + len)`, all free.
    pub fn new(start: u64, len: u64) -> Self {
        let len = len.min(u64::MAX - start);
        let mut list = FreeList {
            start,
            end: start + len,
            nodes: Vec::new(),
            spare: Vec::new(),
            by_start: FxHashMap::default(),
            by_end: FxHashMap::default(),
            heads: vec![NIL; FL_COUNT * SL_COUNT],
            fl_bitmap: 0,
            sl_bitmaps: [0; FL_COUNT],
            free_bytes: 0,
        };
        if len > 0 {
            list.insert(start, start + len);
        }
        list
    }

    /// A free list over `[start, start + len)`, all free but the `hidden` ranges
    /// (`(start, end)` pairs, sorted and disjoint), which are never handed out.
    pub fn with_hidden(start: u64, len: u64, hidden: &[(u64, u64)]) -> Self {
        let mut list = FreeList::new(start, 0);
        list.end = start + len.min(u64::MAX - start);
        let mut at = start;
        for &(from, to) in hidden {
            let (from, to) = (from.clamp(start, list.end), to.clamp(start, list.end));
            if from > at {
                list.insert(at, from);
            }
            at = at.max(to);
        }
        if list.end > at {
            list.insert(at, list.end);
        }
        list
    }

    /// Start of the managed range.
    pub fn start(&self) -> u64 {
        self.start
    }

    /// End (exclusive) of the managed range.
    pub fn end(&self) -> u64 {
        self.end
    }

    /// Total free bytes.
    pub fn free_bytes(&self) -> u64 {
        self.free_bytes
    }

    /// Length of the largest free range.
    pub fn largest_free(&self) -> u64 {
        if self.fl_bitmap == 0 {
            return 0;
        }
        let fl = 63 - self.fl_bitmap.leading_zeros() as usize;
        let sl = 15 - self.sl_bitmaps[fl].leading_zeros() as usize;
        let mut best = 0;
        let mut i = self.heads[fl * SL_COUNT + sl];
        while i != NIL {
            let n = self.nodes[i as usize];
            best = best.max(n.end - n.start);
            i = n.next;
        }
        best
    }

    /// Number of free ranges.
    pub fn range_count(&self) -> usize {
        self.by_start.len()
    }

    /// The free ranges as `(start, end)`, by address.
    pub fn ranges(&self) -> Vec<(u64, u64)> {
        let mut ranges: Vec<(u64, u64)> = self
            .by_start
            .values()
            .map(|&i| {
                let n = self.nodes[i as usize];
                (n.start, n.end)
            })
            .collect();
        ranges.sort_unstable();
        ranges
    }

    /// Allocates `size` bytes aligned to `align` (a power of two); returns the start
    /// address. Takes a range from the first size class that is large enough.
    pub fn allocate(&mut self, size: u64, align: u64) -> Option<u64> {
        if !align.is_power_of_two() {
            return None;
        }
        let size = size.max(1);
        // First: a range from the class that fits `size`, if its start happens to be
        // aligned (always, when the caller uses one granule for sizes and alignment).
        let (fl, sl) = class_at_least(size)?;
        if let Some(found) = self.find(fl, sl) {
            if let Some(addr) = self.fits(found, size, align) {
                return Some(self.take(found, addr, size));
            }
        }
        // Then: a class large enough for any alignment padding.
        let padded = size.checked_add(align - 1)?;
        if let Some((fl, sl)) = class_at_least(padded) {
            if let Some(found) = self.find(fl, sl) {
                if let Some(addr) = self.fits(found, size, align) {
                    return Some(self.take(found, addr, size));
                }
            }
        }
        // Last: the classes in between hold ranges that may fit, or not; look at each
        // (rare: only near-full pools and large alignments get here).
        let (lo_fl, lo_sl) = class_of(size);
        let (hi_fl, hi_sl) = class_at_least(padded).unwrap_or((FL_COUNT - 1, SL_COUNT - 1));
        for class in
            lo_fl * SL_COUNT + lo_sl..=(hi_fl * SL_COUNT + hi_sl).min(FL_COUNT * SL_COUNT - 1)
        {
            let mut i = self.heads[class];
            while i != NIL {
                if let Some(addr) = self.fits(i, size, align) {
                    return Some(self.take(i, addr, size));
                }
                i = self.nodes[i as usize].next;
            }
        }
        None
    }

    /// Returns `[start, start + len)` to the list, merging it with free neighbours.
    /// Returns the merged free range that now contains it.
    ///
    /// Freeing a range whose start or end coincides with a free range's is detected in
    /// every build; other overlaps with free ranges (a partial double free) only in debug
    /// builds: the list is bookkeeping for a caller that frees only what it allocated.
    pub fn free(&mut self, start: u64, len: u64) -> Result<(u64, u64), NotAllocated> {
        let len = len.max(1);
        let err = NotAllocated { start, len };
        let end = start.checked_add(len).ok_or(err.clone())?;
        if start < self.start || end > self.end || self.overlaps_free(start, end) {
            return Err(err);
        }
        let mut new_start = start;
        let mut new_end = end;
        if let Some(&i) = self.by_end.get(&start) {
            new_start = self.nodes[i as usize].start;
            self.remove(i);
        }
        if let Some(&i) = self.by_start.get(&end) {
            new_end = self.nodes[i as usize].end;
            self.remove(i);
        }
        self.insert(new_start, new_end);
        Ok((new_start, new_end))
    }

    /// Whether `[start, end)` overlaps a free range (a double free). Checks the ranges that
    /// could overlap its two ends: O(1) for the usual case through the maps, with a full
    /// scan only in debug builds.
    fn overlaps_free(&self, start: u64, end: u64) -> bool {
        if self.by_start.contains_key(&start) || self.by_end.contains_key(&end) {
            return true;
        }
        if cfg!(debug_assertions) {
            return self.by_start.values().any(|&i| {
                self.nodes[i as usize].start < end && start < self.nodes[i as usize].end
            });
        }
        false
    }

    /// The first non-empty class at or above `(fl, sl)`, and its head range.
    fn find(&self, fl: usize, sl: usize) -> Option<u32> {
        let sl_map = u32::from(self.sl_bitmaps[fl]) & (u32::MAX << sl);
        let (fl, sl) = if sl_map != 0 {
            (fl, sl_map.trailing_zeros() as usize)
        } else {
            let fl_map = self.fl_bitmap & (u64::MAX.checked_shl(fl as u32 + 1).unwrap_or(0));
            if fl_map == 0 {
                return None;
            }
            let fl = fl_map.trailing_zeros() as usize;
            (fl, self.sl_bitmaps[fl].trailing_zeros() as usize)
        };
        let head = self.heads[fl * SL_COUNT + sl];
        (head != NIL).then_some(head)
    }

    /// The aligned address for `size` bytes inside range `i`, if it fits.
    fn fits(&self, i: u32, size: u64, align: u64) -> Option<u64> {
        let n = self.nodes[i as usize];
        let addr = n.start.checked_add(align - 1)? & !(align - 1);
        (addr.checked_add(size)? <= n.end).then_some(addr)
    }

    /// Takes `[addr, addr + size)` out of range `i`, filing what is left.
    fn take(&mut self, i: u32, addr: u64, size: u64) -> u64 {
        let n = self.nodes[i as usize];
        self.remove(i);
        if addr > n.start {
            self.insert(n.start, addr);
        }
        if addr + size < n.end {
            self.insert(addr + size, n.end);
        }
        addr
    }

    fn insert(&mut self, start: u64, end: u64) {
        let (fl, sl) = class_of(end - start);
        let class = fl * SL_COUNT + sl;
        let head = self.heads[class];
        let node = Node {
            start,
            end,
            prev: NIL,
            next: head,
        };
        let i = match self.spare.pop() {
            Some(i) => {
                self.nodes[i as usize] = node;
                i
            }
            None => {
                self.nodes.push(node);
                (self.nodes.len() - 1) as u32
            }
        };
        if head != NIL {
            self.nodes[head as usize].prev = i;
        }
        self.heads[class] = i;
        self.fl_bitmap |= 1 << fl;
        self.sl_bitmaps[fl] |= 1 << sl;
        self.by_start.insert(start, i);
        self.by_end.insert(end, i);
        self.free_bytes += end - start;
    }

    fn remove(&mut self, i: u32) {
        let n = self.nodes[i as usize];
        let (fl, sl) = class_of(n.end - n.start);
        let class = fl * SL_COUNT + sl;
        if n.prev != NIL {
            self.nodes[n.prev as usize].next = n.next;
        } else {
            self.heads[class] = n.next;
            if n.next == NIL {
                self.sl_bitmaps[fl] &= !(1 << sl);
                if self.sl_bitmaps[fl] == 0 {
                    self.fl_bitmap &= !(1 << fl);
                }
            }
        }
        if n.next != NIL {
            self.nodes[n.next as usize].prev = n.prev;
        }
        self.by_start.remove(&n.start);
        self.by_end.remove(&n.end);
        self.spare.push(i);
        self.free_bytes -= n.end - n.start;
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn hidden_ranges_are_never_handed_out() {
        let mut list = FreeList::with_hidden(0x1000, 0x4000, &[(0x1000, 0x1010), (0x3000, 0x3010)]);
        assert_eq!(list.free_bytes(), 0x4000 - 0x20);
        let mut got = Vec::new();
        while let Some(a) = list.allocate(0x10, 0x10) {
            got.push(a);
        }
        assert!(!got.contains(&0x1000) && !got.contains(&0x3000));
        assert_eq!(got.len(), 0x4000 / 0x10 - 2);
        // What was handed out comes back; the hidden ranges were never out.
        for a in got {
            list.free(a, 0x10).unwrap();
        }
        assert_eq!(list.free_bytes(), 0x4000 - 0x20);
    }

    use super::*;

    #[test]
    fn classes_are_monotonic_and_lower_bounds() {
        let mut last = (0, 0);
        for len in 1..100_000u64 {
            let c = class_of(len);
            assert!(c >= last, "{len}");
            last = c;
            // Every range filed in class_at_least(len) is at least len long.
            let want = class_at_least(len).unwrap();
            for probe in [len, len + 1, len * 2] {
                if class_of(probe) >= want {
                    assert!(probe >= len);
                }
            }
            assert!(class_of(len) <= want);
        }
    }

    #[test]
    fn allocates_aligned_and_coalesces() {
        let mut list = FreeList::new(0x1000, 0x1000);
        let a = list.allocate(0x10, 16).unwrap();
        let b = list.allocate(0x30, 64).unwrap();
        assert_eq!(a, 0x1000);
        assert_eq!(b % 64, 0);
        assert!(b >= a + 0x10);
        list.free(a, 0x10).unwrap();
        list.free(b, 0x30).unwrap();
        assert_eq!(list.range_count(), 1);
        assert_eq!(list.free_bytes(), 0x1000);
        assert_eq!(list.largest_free(), 0x1000);
        assert_eq!(list.ranges(), vec![(0x1000, 0x2000)]);
    }

    #[test]
    fn double_free_is_an_error() {
        let mut list = FreeList::new(0, 0x100);
        let a = list.allocate(0x10, 16).unwrap();
        list.free(a, 0x10).unwrap();
        assert_eq!(
            list.free(a, 0x10),
            Err(NotAllocated {
                start: a,
                len: 0x10
            })
        );
        assert!(list.free(0x200, 0x10).is_err());
    }

    #[test]
    fn full_list_refuses() {
        let mut list = FreeList::new(0, 0x100);
        assert!(list.allocate(0x100, 16).is_some());
        assert!(list.allocate(1, 1).is_none());
        assert!(list.allocate(u64::MAX, 1).is_none());
    }
}
