//! Free-range bookkeeping for one pool: best-fit allocation with alignment, coalescing
//! frees. Pure data structure, no system calls.
//!
//! Written by hand because the allocator crates on crates.io either own their memory
//! (`jit-allocator`, `linked_list_allocator`) or work on a single power-of-two heap
//! (`buddy_system_allocator`); Kiln needs bookkeeping over *target* addresses that may
//! live in another process, with arbitrary sizes, alignment and neighbour coalescing.

use std::collections::{BTreeMap, BTreeSet};

/// A set of free, disjoint, non-adjacent address ranges inside one pool.
///
/// Ranges are kept twice: by start address (to find neighbours when freeing) and by
/// `(length, start)` (to find the smallest range that fits when allocating).
#[derive(Debug, Clone)]
pub struct FreeList {
    start: u64,
    end: u64,
    by_start: BTreeMap<u64, u64>,
    by_len: BTreeSet<(u64, u64)>,
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

impl FreeList {
    /// A free list over `[start, start + len)`, all free.
    pub fn new(start: u64, len: u64) -> Self {
        let mut list = FreeList {
            start,
            end: start + len,
            by_start: BTreeMap::new(),
            by_len: BTreeSet::new(),
            free_bytes: 0,
        };
        if len > 0 {
            list.insert(start, start + len);
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
        self.by_len.last().map_or(0, |&(len, _)| len)
    }

    /// Number of free ranges.
    pub fn range_count(&self) -> usize {
        self.by_start.len()
    }

    /// The free ranges as `(start, end)`, by address.
    pub fn ranges(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.by_start.iter().map(|(&s, &e)| (s, e))
    }

    /// The free range that contains `addr`, if any.
    pub fn range_containing(&self, addr: u64) -> Option<(u64, u64)> {
        let (&s, &e) = self.by_start.range(..=addr).next_back()?;
        (addr < e).then_some((s, e))
    }

    /// Allocates `size` bytes aligned to `align` (a power of two) from the smallest free
    /// range that fits; returns the start address.
    pub fn allocate(&mut self, size: u64, align: u64) -> Option<u64> {
        debug_assert!(align.is_power_of_two());
        let size = size.max(1);
        let mut found = None;
        for &(len, start) in self.by_len.range((size, 0)..) {
            let aligned = start.checked_add(align - 1)? & !(align - 1);
            if aligned.checked_add(size)? <= start + len {
                found = Some((start, start + len, aligned));
                break;
            }
        }
        let (start, end, aligned) = found?;
        self.remove(start, end);
        if aligned > start {
            self.insert(start, aligned);
        }
        if aligned + size < end {
            self.insert(aligned + size, end);
        }
        Some(aligned)
    }

    /// Returns `[start, start + len)` to the list, merging it with free neighbours.
    /// Returns the merged free range that now contains it.
    pub fn free(&mut self, start: u64, len: u64) -> Result<(u64, u64), NotAllocated> {
        let len = len.max(1);
        let end = start.checked_add(len).ok_or(NotAllocated { start, len })?;
        if start < self.start || end > self.end {
            return Err(NotAllocated { start, len });
        }
        let mut new_start = start;
        let mut new_end = end;
        // The free range at or before `start` must end at or before it.
        if let Some((&ps, &pe)) = self.by_start.range(..=start).next_back() {
            if pe > start {
                return Err(NotAllocated { start, len });
            }
            if pe == start {
                new_start = ps;
            }
        }
        // The free range after `start` must begin at or after `end`.
        if let Some((&ns, &ne)) = self.by_start.range(start + 1..).next() {
            if ns < end {
                return Err(NotAllocated { start, len });
            }
            if ns == end {
                new_end = ne;
                self.remove(ns, ne);
            }
        }
        if new_start != start {
            let pe = start;
            self.remove(new_start, pe);
        }
        self.insert(new_start, new_end);
        Ok((new_start, new_end))
    }

    fn insert(&mut self, start: u64, end: u64) {
        self.by_start.insert(start, end);
        self.by_len.insert((end - start, start));
        self.free_bytes += end - start;
    }

    fn remove(&mut self, start: u64, end: u64) {
        self.by_start.remove(&start);
        self.by_len.remove(&(end - start, start));
        self.free_bytes -= end - start;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
