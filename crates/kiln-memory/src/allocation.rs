//! Allocations: in flight (writable working memory, not yet runnable) and finalized
//! (runnable, owned, freed on drop). Two types, so that writing into finalized code does
//! not compile.

use crate::slab_backend::SlabBackend;
use crate::{MemoryError, Permission, SegmentRange};
use smallvec::SmallVec;
use std::fmt;

/// Segments of one allocation, inline up to the four a link asks for (code, constants,
/// data, zero-filled data): no heap allocation for them.
pub type Segments<T> = SmallVec<[T; 4]>;

/// One segment of an in-flight allocation: where it will run and where to write it.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct WorkingSegment {
    range: SegmentRange,
    working: *mut u8,
}

impl WorkingSegment {
    /// Describes a segment at target address `target`, `len` bytes long, whose contents are
    /// written at `working` in this process.
    pub fn new(target: u64, len: u64, permission: Permission, working: *mut u8) -> Self {
        WorkingSegment {
            range: SegmentRange {
                target,
                len,
                permission,
            },
            working,
        }
    }

    /// The segment's target range and permission.
    pub fn range(&self) -> SegmentRange {
        self.range
    }
}

impl fmt::Debug for WorkingSegment {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WorkingSegment")
            .field("target", &format_args!("{:#x}", self.range.target))
            .field("len", &self.range.len)
            .field("permission", &self.range.permission)
            .finish()
    }
}

/// A segment's working memory, borrowed from an [`InFlightAllocation`].
#[derive(Debug)]
pub struct SegmentMut<'a> {
    /// Target address of the first byte.
    pub target: u64,
    /// Final permission.
    pub permission: Permission,
    /// The bytes to write (contents are unspecified unless the segment was requested
    /// zero-filled).
    pub bytes: &'a mut [u8],
}

/// What a memory manager does when an in-flight allocation is finalized or abandoned.
///
/// Implemented by [`SlabMemoryManager`](crate::SlabMemoryManager) and by client managers.
pub trait InFlightBackend: Send {
    /// Applies final permissions and cache coherence to `segments`; returns what frees
    /// them later. On error the backend must have released the memory itself.
    fn finalize(
        self: Box<Self>,
        segments: &[SegmentRange],
    ) -> Result<Box<dyn FinalizedBackend>, MemoryError>;

    /// Releases memory that will never be finalized.
    fn abandon(self: Box<Self>, segments: &[SegmentRange]);
}

/// What frees a finalized allocation.
pub trait FinalizedBackend: Send + Sync {
    /// Frees `segments`: the code must not run any more.
    fn free(self: Box<Self>, segments: &[SegmentRange]) -> Result<(), MemoryError>;
}

/// Who finalizes or frees an allocation: the slab manager's backend, held inline (no heap
/// allocation per allocation), or a client manager's.
enum Backend<C: ?Sized> {
    Slab(SlabBackend),
    Client(Box<C>),
}

/// Memory being written by a linker: target addresses are fixed, the contents are written
/// through working memory, nothing may run it yet. Dropping it without
/// [`finalize`](InFlightAllocation::finalize) frees it.
pub struct InFlightAllocation {
    ranges: Segments<SegmentRange>,
    /// Working-memory pointer of each segment, in the same order.
    working: Segments<*mut u8>,
    backend: Option<Backend<dyn InFlightBackend>>,
}

// SAFETY: the working pointers are owned exclusively by this allocation (the constructor's
// contract), so moving it to another thread moves that ownership.
unsafe impl Send for InFlightAllocation {}

impl fmt::Debug for InFlightAllocation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("InFlightAllocation")
            .field("segments", &self.ranges)
            .finish()
    }
}

impl InFlightAllocation {
    /// Assembles an in-flight allocation (for client memory managers).
    ///
    /// # Safety
    /// Each segment's working pointer must be valid for reads and writes of its `len`
    /// bytes, exclusively owned by this allocation, until `backend` is called; segments
    /// must not overlap.
    pub unsafe fn from_parts(
        segments: impl IntoIterator<Item = WorkingSegment>,
        backend: Box<dyn InFlightBackend>,
    ) -> Self {
        let (ranges, working) = segments.into_iter().map(|s| (s.range, s.working)).unzip();
        InFlightAllocation {
            ranges,
            working,
            backend: Some(Backend::Client(backend)),
        }
    }

    /// Assembles an allocation of the slab manager.
    ///
    /// # Safety
    /// As [`from_parts`](Self::from_parts): `working[i]` is valid, exclusive and
    /// `ranges[i].len` bytes long; segments do not overlap.
    pub(crate) unsafe fn from_slab(
        ranges: Segments<SegmentRange>,
        working: Segments<*mut u8>,
        backend: SlabBackend,
    ) -> Self {
        InFlightAllocation {
            ranges,
            working,
            backend: Some(Backend::Slab(backend)),
        }
    }

    /// The segments, in request order.
    pub fn segments(&self) -> &[SegmentRange] {
        &self.ranges
    }

    /// Target address of segment `index`.
    pub fn target(&self, index: usize) -> Option<u64> {
        self.ranges.get(index).map(|r| r.target)
    }

    /// Working memory of segment `index`.
    pub fn working_memory(&mut self, index: usize) -> Option<&mut [u8]> {
        let (range, &working) = self.ranges.get(index).zip(self.working.get(index))?;
        // SAFETY: the constructor's contract: valid, exclusive, `len` bytes; the borrow of
        // `self` keeps any other view from being handed out.
        Some(unsafe { std::slice::from_raw_parts_mut(working, range.len as usize) })
    }

    /// Working memory of every segment at once, so that a linker can write one segment
    /// while reading addresses of the others.
    pub fn segments_mut(&mut self) -> Segments<SegmentMut<'_>> {
        self.ranges
            .iter()
            .zip(&self.working)
            .map(|(range, &working)| SegmentMut {
                target: range.target,
                permission: range.permission,
                // SAFETY: segments are disjoint (the constructor's contract), so these
                // slices do not alias; they live as long as the borrow of `self`.
                bytes: unsafe { std::slice::from_raw_parts_mut(working, range.len as usize) },
            })
            .collect()
    }

    /// Applies final permissions and makes the instruction cache coherent; after this the
    /// code may run, from any thread. On error the memory has been freed.
    pub fn finalize(mut self) -> Result<FinalizedAllocation, MemoryError> {
        let ranges = std::mem::take(&mut self.ranges);
        let backend = self.backend.take().ok_or(MemoryError::EmptyRequest)?;
        let finalized = match backend {
            Backend::Slab(slab) => Backend::Slab(slab.finalize(&ranges)?),
            Backend::Client(client) => Backend::Client(client.finalize(&ranges)?),
        };
        Ok(FinalizedAllocation {
            segments: ranges,
            backend: Some(finalized),
        })
    }
}

impl Drop for InFlightAllocation {
    fn drop(&mut self) {
        match self.backend.take() {
            Some(Backend::Slab(slab)) => slab.abandon(&self.ranges),
            Some(Backend::Client(client)) => client.abandon(&self.ranges),
            None => {}
        }
    }
}

/// Memory holding finished code and data: it owns the memory, frees it on drop (after
/// which a stale call traps), and lives independently of the manager, linker or session
/// that made it.
pub struct FinalizedAllocation {
    segments: Segments<SegmentRange>,
    backend: Option<Backend<dyn FinalizedBackend>>,
}

impl fmt::Debug for FinalizedAllocation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FinalizedAllocation")
            .field("segments", &self.segments)
            .finish()
    }
}

impl FinalizedAllocation {
    /// The segments, in request order.
    pub fn segments(&self) -> &[SegmentRange] {
        &self.segments
    }

    /// Target address of segment `index`.
    pub fn target(&self, index: usize) -> Option<u64> {
        self.segments.get(index).map(|r| r.target)
    }

    /// Frees the memory now and reports failure (dropping frees too, and logs failures).
    pub fn free(mut self) -> Result<(), MemoryError> {
        match self.backend.take() {
            Some(Backend::Slab(slab)) => slab.free(&self.segments),
            Some(Backend::Client(client)) => client.free(&self.segments),
            None => Ok(()),
        }
    }
}

impl Drop for FinalizedAllocation {
    fn drop(&mut self) {
        let freed = match self.backend.take() {
            Some(Backend::Slab(slab)) => slab.free(&self.segments),
            Some(Backend::Client(client)) => client.free(&self.segments),
            None => Ok(()),
        };
        if let Err(error) = freed {
            tracing::warn!(%error, "freeing a finalized allocation failed");
        }
    }
}
