//! The slab manager's backend: what an allocation of [`crate::SlabMemoryManager`] holds
//! (inline, no box) to finalize and free its segments.

use crate::slab::Slab;
use crate::{thread_cache, MemoryError, SegmentRange};
use std::sync::Arc;

/// Fills `len` bytes at `ptr` with `pattern` (a manager's trap pattern: [`crate::TRAP_PATTERN`]
/// unless the code is for another architecture).
///
/// One `memset` where the pattern is one repeated byte (x86-64): a loop of small stores
/// into memory that was just executed through another view is ~10× slower on x86, where
/// every store into a line the core has fetched as code may clear the pipeline, while
/// `rep stosb` pays that once.
///
/// # Safety
/// `ptr` must be valid for writes of `len` bytes and 4-byte aligned.
unsafe fn fill_trap(ptr: *mut u8, len: usize, pattern: [u8; 4]) {
    if pattern.iter().all(|&b| b == pattern[0]) {
        // SAFETY: the caller's contract.
        unsafe { std::ptr::write_bytes(ptr, pattern[0], len) };
    } else {
        let word = u32::from_le_bytes(pattern);
        // SAFETY: the caller's contract: valid and 4-byte aligned; `len / 4` whole words.
        let words = unsafe { std::slice::from_raw_parts_mut(ptr.cast::<u32>(), len / 4) };
        words.fill(word);
    }
}

/// The backend of the slab manager's allocations: keeps the slab alive and frees into it.
/// Held inline by the allocation (no box); each segment's arena is found from its address.
#[derive(Debug)]
pub(crate) struct SlabBackend(pub(crate) Arc<Slab>);

impl SlabBackend {
    /// Frees `segments` (an allocation of this slab, in request order): each to this
    /// thread's cache when it may hold it, else to its arena.
    fn release(self, segments: &[SegmentRange], poison: bool) -> Result<(), MemoryError> {
        let slab = &self.0;
        let mut result = Ok(());
        let mut poisoned = false;
        for (index, s) in segments.iter().enumerate() {
            let taken = s.len.max(1).next_multiple_of(slab.unit(s.permission));
            if poison
                && slab.tuning.poison
                && s.permission.is_executable()
                && slab.is_shared(s.permission)
            {
                // A shared page stays mapped executable: fill the freed bytes with traps so
                // a stale call traps instead of running whatever comes next.
                let working = slab.working(s.target);
                // SAFETY: the range is still ours (not yet returned to the pool or a cache)
                // and its working view is writable (shared pools keep it so).
                unsafe { fill_trap(working, taken as usize, slab.tuning.trap_pattern) };
                // The trap bytes must be what a core fetches (AArch64 keeps stale lines):
                // here when the code runs here; elsewhere its side does it.
                if slab.mapper.target_is_local() {
                    crate::icache::make_coherent(s.target, taken);
                    poisoned = true;
                }
            }
            let arena = slab.arena_of(s.permission, s.target);
            let first = index == 0;
            slab.note_freed(s.permission, arena, s.len, first);
            if thread_cache::put(slab, s.permission, arena, s.target, taken) {
                continue;
            }
            if let Err(e) = slab.free_range(s.permission, arena, s.target, taken) {
                result = Err(e);
            }
        }
        if poisoned {
            crate::icache::synchronize_cores();
        }
        result
    }

    /// Applies final permissions and cache coherence; on error the memory is freed.
    pub(crate) fn finalize(self, segments: &[SegmentRange]) -> Result<Self, MemoryError> {
        // SAFETY: the segments were allocated from this slab (prepared pages, ours), and
        // `InFlightAllocation::finalize` consumed the working-memory borrows.
        match unsafe { self.0.mapper.initialize(&self.0.reservation, segments) } {
            Ok(()) => Ok(self),
            Err(source) => {
                let mapper = self.0.mapper.name();
                // Whatever the mapper did, the code never ran: free without poisoning.
                let _ = self.release(segments, false);
                Err(MemoryError::Mapper { mapper, source })
            }
        }
    }

    /// Frees memory that was never finalized.
    pub(crate) fn abandon(self, segments: &[SegmentRange]) {
        if let Err(error) = self.release(segments, true) {
            tracing::warn!(%error, "freeing an abandoned allocation failed");
        }
    }

    /// Frees finalized memory: the code must not run any more.
    pub(crate) fn free(self, segments: &[SegmentRange]) -> Result<(), MemoryError> {
        self.release(segments, true)
    }
}
