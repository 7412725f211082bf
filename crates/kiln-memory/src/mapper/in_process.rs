//! The in-process mapper: one private anonymous mapping per reservation, pages committed
//! with `mprotect` as they are needed.

use super::{placement, sys, Mapper, Placement, Reservation, SegmentRange};
use crate::{icache, MapperError, Permission};

/// Reserves address space with `PROT_NONE`, makes pages read-write while the linker
/// writes them and flips them to their final permission at initialize.
///
/// Because a page changes permission, read-execute and read-only allocations get pages of
/// their own ([`Mapper::shares_pages`] is `false`): flipping a page that holds running code
/// would fault the thread running it. Use the [`DualMappedMapper`](super::DualMappedMapper)
/// (the default) to pack code of many modules into shared pages.
#[derive(Debug, Clone)]
pub struct InProcessMapper {
    page: u64,
}

impl InProcessMapper {
    /// An in-process mapper for this machine's page size.
    pub fn new() -> Self {
        InProcessMapper {
            page: sys::page_size(),
        }
    }
}

impl Default for InProcessMapper {
    fn default() -> Self {
        Self::new()
    }
}

fn os(
    operation: &'static str,
    address: u64,
    len: u64,
) -> impl FnOnce(std::io::Error) -> MapperError {
    move |source| MapperError::Os {
        operation,
        address,
        len,
        source,
    }
}

// SAFETY: the working view is the target view, a private mapping this mapper created and
// owns until release; prepare makes pages read-write, and only the allocator's owner of a
// range writes it.
unsafe impl Mapper for InProcessMapper {
    fn name(&self) -> &'static str {
        "in-process"
    }

    fn page_size(&self) -> u64 {
        self.page
    }

    fn shares_pages(&self) -> bool {
        false
    }

    fn reserve(&self, len: u64, placement: &Placement) -> Result<Reservation, MapperError> {
        let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE;
        let base = placement::reserve_placed(
            len,
            self.page,
            placement,
            |fixed| sys::mmap(fixed, None, len, libc::PROT_NONE, flags, None),
            // SAFETY: a mapping reserve_placed just made and nobody else knows.
            |misplaced| drop(unsafe { sys::munmap(misplaced, len) }),
        )?;
        Ok(Reservation {
            target: base,
            len,
            working: base as *mut u8,
            handle: 0,
        })
    }

    unsafe fn prepare(
        &self,
        reservation: &Reservation,
        start: u64,
        end: u64,
        _permission: Permission,
    ) -> Result<(), MapperError> {
        debug_assert!(reservation.contains(start, end - start));
        // SAFETY: the range is inside our reservation and unused (it is being prepared for
        // a new owner), so adding access breaks nothing.
        unsafe { sys::mprotect(start, end - start, libc::PROT_READ | libc::PROT_WRITE) }
            .map_err(os("mprotect", start, end - start))
    }

    unsafe fn initialize(
        &self,
        reservation: &Reservation,
        segments: &[SegmentRange],
    ) -> Result<(), MapperError> {
        let mut executable = false;
        for segment in segments {
            debug_assert!(reservation.contains(segment.target, segment.len));
            if segment.permission == Permission::ReadWrite {
                continue; // already read-write since prepare
            }
            let start = segment.target & !(self.page - 1);
            let end = (segment.target + segment.len.max(1)).next_multiple_of(self.page);
            // SAFETY: non-shared pools give each read-only or read-execute segment pages of
            // its own, so this flip affects only the allocation being finalized, whose
            // working memory the caller no longer borrows.
            unsafe { sys::mprotect(start, end - start, sys::prot_of(segment.permission)) }
                .map_err(os("mprotect", start, end - start))?;
            if segment.permission.is_executable() {
                icache::make_coherent(segment.target, segment.len);
                executable = true;
            }
        }
        if executable {
            icache::synchronize_cores();
        }
        Ok(())
    }

    unsafe fn deinitialize(
        &self,
        reservation: &Reservation,
        start: u64,
        end: u64,
        _permission: Permission,
    ) -> Result<(), MapperError> {
        debug_assert!(reservation.contains(start, end - start));
        // SAFETY: the allocator hands us only pages no allocation owns any more.
        unsafe { sys::madvise_dontneed(start, end - start) }.map_err(os(
            "madvise",
            start,
            end - start,
        ))?;
        // SAFETY: as above; inaccessible pages make a stale call fault.
        unsafe { sys::mprotect(start, end - start, libc::PROT_NONE) }.map_err(os(
            "mprotect",
            start,
            end - start,
        ))
    }

    unsafe fn release(&self, reservation: &Reservation) -> Result<(), MapperError> {
        // SAFETY: the caller gives the whole reservation back; no allocation lives in it.
        unsafe { sys::munmap(reservation.target, reservation.len) }.map_err(os(
            "munmap",
            reservation.target,
            reservation.len,
        ))
    }

    fn resident_bytes(&self, reservation: &Reservation) -> Option<u64> {
        sys::resident_in(reservation.target, reservation.len, self.page).ok()
    }
}
