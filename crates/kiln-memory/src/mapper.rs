//! Mappers: how memory reaches the code. The platform / transport half of the memory
//! layer, behind one trait.
//!
//! A mapper knows two views of every reservation:
//! - the *target* view, at the addresses the code will run from (in this process, or in an
//!   executor process), and
//! - the *working* view, in this process, that the linker writes through.
//!
//! For the [`InProcessMapper`] both are the same pages; for the [`DualMappedMapper`] they
//! are two mappings of one memfd; for a shared-memory executor mapper the target view lives
//! in another process. The allocator and the linker only ever compute a working address as
//! `working_base + (target - target_base)`.

mod dual_mapped;
mod fork;
mod in_process;
mod offline;
pub(crate) mod placement;
pub(crate) mod sys;

pub use dual_mapped::DualMappedMapper;
pub use in_process::InProcessMapper;
pub use offline::OfflineMapper;
pub use placement::Placement;

use crate::{MapperError, Permission};
use std::fmt;
use std::sync::Arc;

/// A reserved range of address space, as returned by [`Mapper::reserve`].
///
/// The reservation is a plain description: dropping it does nothing; give it back with
/// [`Mapper::release`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reservation {
    /// First target address (page aligned).
    pub target: u64,
    /// Length in bytes (a multiple of the page size).
    pub len: u64,
    /// Base of the working view in this process, `len` bytes long.
    pub working: *mut u8,
    /// A token of the mapper's own (a file descriptor, a remote handle).
    pub handle: u64,
}

// SAFETY: a reservation is a description of address ranges; the raw pointer is never
// dereferenced through it without the allocator's ownership of the range.
unsafe impl Send for Reservation {}
// SAFETY: as above, shared references only read the description.
unsafe impl Sync for Reservation {}

impl Reservation {
    /// One past the last target address.
    pub fn target_end(&self) -> u64 {
        self.target + self.len
    }

    /// Whether `[addr, addr + len)` lies inside the reservation.
    pub fn contains(&self, addr: u64, len: u64) -> bool {
        addr >= self.target
            && addr
                .checked_add(len)
                .is_some_and(|end| end <= self.target_end())
    }

    /// The working-view address of target address `addr`.
    ///
    /// Returns `None` when `addr` lies outside the reservation.
    pub fn working_address(&self, addr: u64) -> Option<*mut u8> {
        if !self.contains(addr, 0) {
            return None;
        }
        let offset = usize::try_from(addr - self.target).ok()?;
        Some(self.working.wrapping_add(offset))
    }
}

/// A finished segment handed to [`Mapper::initialize`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SegmentRange {
    /// First target address.
    pub target: u64,
    /// Length in bytes.
    pub len: u64,
    /// The final permission.
    pub permission: Permission,
}

/// How memory reaches the code: reserve address space, prepare pages for writing,
/// initialize (apply final permissions and make the instruction cache coherent),
/// deinitialize (return pages) and release.
///
/// The [`SlabMemoryManager`](crate::SlabMemoryManager) drives a mapper; the linker never
/// calls it directly.
///
/// # Page sharing
///
/// [`Mapper::shares_pages`] tells the allocator whether read-execute and read-only pages
/// may hold segments of several allocations. A mapper that returns `true` must keep the
/// working view writable for the whole lifetime of a prepared page while the target view
/// already has its final permission, so that new code can be written next to running code
/// without any permission flip (the dual-mapped design). A mapper that returns `false`
/// gets each read-execute or read-only allocation on pages of its own; read-write pages are
/// always shared.
///
/// # Safety
///
/// Implementations must uphold, for the allocator's safe code to be sound:
/// - [`Mapper::reserve`] returns a reservation whose working view is `len` bytes of this
///   process's address space owned by the mapper until [`Mapper::release`];
/// - after [`Mapper::prepare`] of a page range, the working view of those pages is readable
///   and writable until they are deinitialized or the reservation released;
/// - nothing else writes the working view of prepared pages.
pub unsafe trait Mapper: Send + Sync + fmt::Debug {
    /// A short name for messages (`"dual-mapped"`, `"in-process"`).
    fn name(&self) -> &'static str;

    /// The page size of the target.
    fn page_size(&self) -> u64;

    /// Whether read-execute and read-only pages may be shared among allocations (see the
    /// trait documentation).
    fn shares_pages(&self) -> bool;

    /// Reserves `len` bytes (a multiple of the page size) of address space, inaccessible,
    /// placed as `placement` asks.
    fn reserve(&self, len: u64, placement: &Placement) -> Result<Reservation, MapperError>;

    /// Makes the page range `[start, end)` of `reservation` writable in the working view.
    /// `permission` is the final permission of every segment that will live there; a
    /// page-sharing mapper applies it to the target view now.
    ///
    /// # Safety
    /// `reservation` must come from this mapper's [`Mapper::reserve`] and not be released;
    /// `[start, end)` must be page-aligned, inside it, and owned by the caller (no live
    /// allocation may use it under another permission).
    unsafe fn prepare(
        &self,
        reservation: &Reservation,
        start: u64,
        end: u64,
        permission: Permission,
    ) -> Result<(), MapperError>;

    /// Applies the final permissions of `segments` (all inside `reservation`, on prepared
    /// pages) and makes the instruction cache coherent for executable ones, so that any
    /// thread of the target may run them once this returns.
    ///
    /// # Safety
    /// `reservation` as for [`Mapper::prepare`]; the segments must lie on prepared pages of
    /// it, be owned by the caller, and no longer be borrowed as working memory.
    unsafe fn initialize(
        &self,
        reservation: &Reservation,
        segments: &[SegmentRange],
    ) -> Result<(), MapperError>;

    /// Returns the page range `[start, end)` to the system: its contents are discarded,
    /// it becomes inaccessible in the target view and must be prepared again before use.
    ///
    /// # Safety
    /// `reservation` as for [`Mapper::prepare`]; no allocation may live in `[start, end)`
    /// and nothing may refer to it.
    unsafe fn deinitialize(
        &self,
        reservation: &Reservation,
        start: u64,
        end: u64,
        permission: Permission,
    ) -> Result<(), MapperError>;

    /// Backs the prepared pages `[start, end)` with memory and maps them in every view
    /// this side uses, ahead of the first write (one call instead of a page fault per
    /// page). Best effort, and optional: the default does nothing and pages fault in on
    /// first touch.
    fn populate(&self, reservation: &Reservation, start: u64, end: u64) {
        let _ = (reservation, start, end);
    }

    /// Copies `len` bytes of `file` from `offset` to the prepared pages at target address
    /// `start` of `reservation` without going through the working view, if this mapper
    /// can (one whose memory is a file: the kernel copies page to page, and this process
    /// faults in none of them). `Ok(false)`: it cannot (the default), nothing was
    /// written, and the caller writes the working view itself.
    ///
    /// # Safety
    /// `reservation` as for [`Mapper::prepare`]; `[start, start + len)` must lie on
    /// prepared pages of it owned by the caller, not borrowed as working memory.
    unsafe fn copy_from_file(
        &self,
        reservation: &Reservation,
        start: u64,
        file: &std::fs::File,
        offset: u64,
        len: u64,
    ) -> Result<bool, MapperError> {
        let _ = (reservation, start, file, offset, len);
        Ok(false)
    }

    /// Gives the whole reservation back.
    ///
    /// # Safety
    /// `reservation` must come from this mapper's [`Mapper::reserve`], be released only
    /// once, and hold no live allocation or reference.
    unsafe fn release(&self, reservation: &Reservation) -> Result<(), MapperError>;

    /// Bytes of `reservation` that are resident in physical memory, counted once even when
    /// two views map them; `None` if the mapper cannot tell.
    fn resident_bytes(&self, reservation: &Reservation) -> Option<u64>;

    /// Whether the target view is in this process, so that this process may make its
    /// instruction cache coherent (default: yes). A mapper whose code runs elsewhere (an
    /// executor process, or nowhere: an offline link) answers no; the code's own side
    /// keeps its cache coherent.
    fn target_is_local(&self) -> bool {
        true
    }
}

/// The default mapper: dual-mapped when the kernel allows an executable memfd, otherwise
/// in-process, with the reason logged through `tracing`.
pub fn default_mapper() -> Arc<dyn Mapper> {
    match DualMappedMapper::new() {
        Ok(mapper) => Arc::new(mapper),
        Err(error) => {
            tracing::warn!(
                %error,
                "dual-mapped memory unavailable, falling back to the in-process mapper"
            );
            Arc::new(InProcessMapper::new())
        }
    }
}
