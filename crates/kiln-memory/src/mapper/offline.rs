//! A mapper whose target is not this process: code is laid out for addresses chosen by the
//! caller, written to heap memory here, and never run. For linking ahead of time or for
//! another machine ("show me what you linked"), and for tests that need known addresses.

use super::sys;
use super::{Mapper, Placement, Reservation, SegmentRange};
use crate::{MapperError, Permission};
use parking_lot::Mutex;

/// Places reservations at consecutive target addresses from a base the caller chooses;
/// the working view is anonymous memory of this process (zero until written, backed only
/// where written). Nothing is mapped at the target
/// addresses: finalizing changes no permission and runs nothing, so the bytes can only be
/// read back (through a link's image) and written to a file.
///
/// ```
/// use kiln_memory::{MemoryManager, OfflineMapper, SlabLayout, SlabMemoryManager};
/// use std::sync::Arc;
/// let mapper = Arc::new(OfflineMapper::new(0x1000_0000, 4096));
/// let small = SlabLayout { read_execute: 1 << 20, read: 1 << 20, read_write: 1 << 20 };
/// let memory = SlabMemoryManager::builder().mapper(mapper).layout(small).build().unwrap();
/// assert!(memory.slab_ranges().iter().all(|&(start, _)| start >= 0x1000_0000));
/// ```
#[derive(Debug)]
pub struct OfflineMapper {
    page_size: u64,
    /// The next reservation's target address.
    next: Mutex<u64>,
}

impl OfflineMapper {
    /// Reservations from `base` on (rounded up to `page_size`, a power of two: 4096, or
    /// 16 or 64 KiB for an AArch64 target configured so).
    pub fn new(base: u64, page_size: u64) -> Self {
        let page_size = page_size.max(1).next_power_of_two();
        OfflineMapper {
            page_size,
            // A base at the very top of the address space stays there (reservations then
            // fail with a typed error instead of wrapping).
            next: Mutex::new(
                base.checked_next_multiple_of(page_size)
                    .unwrap_or(!(page_size - 1)),
            ),
        }
    }
}

// SAFETY: the working view of a reservation is an anonymous read-write mapping of `len`
// bytes that this mapper owns from `reserve` until `release` (unmapped nowhere else), and it
// stays readable and writable for all of that time, so every prepared page stays writable;
// nothing else has its address.
unsafe impl Mapper for OfflineMapper {
    fn name(&self) -> &'static str {
        "offline"
    }

    fn page_size(&self) -> u64 {
        self.page_size
    }

    fn shares_pages(&self) -> bool {
        true
    }

    fn reserve(&self, len: u64, placement: &Placement) -> Result<Reservation, MapperError> {
        let mut next = self.next.lock();
        let target = *next;
        let end = target
            .checked_add(len)
            .ok_or_else(|| MapperError::PlacementUnavailable {
                placement: *placement,
                len,
                reason: format!("{target:#x} + {len:#x} overflows the address space"),
            })?;
        if matches!(placement, Placement::Low2GiB | Placement::Near { .. })
            && !placement.admits(target, len)
        {
            return Err(MapperError::PlacementUnavailable {
                placement: *placement,
                len,
                reason: format!("the next offline address is {target:#x}"),
            });
        }
        let working = sys::mmap(
            None,
            None,
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            None,
        )
        .map_err(|source| MapperError::Os {
            operation: "mmap",
            address: 0,
            len,
            source,
        })?;
        *next = end;
        Ok(Reservation {
            target,
            len,
            working: working as *mut u8,
            handle: 0,
        })
    }

    unsafe fn prepare(
        &self,
        _: &Reservation,
        _: u64,
        _: u64,
        _: Permission,
    ) -> Result<(), MapperError> {
        Ok(())
    }

    unsafe fn initialize(&self, _: &Reservation, _: &[SegmentRange]) -> Result<(), MapperError> {
        Ok(())
    }

    unsafe fn deinitialize(
        &self,
        reservation: &Reservation,
        start: u64,
        end: u64,
        _: Permission,
    ) -> Result<(), MapperError> {
        // Discarded contents read as zeros again, as fresh pages would.
        let at = reservation.working as u64 + (start - reservation.target);
        let host_page = sys::page_size();
        if at % host_page == 0 && (end - start) % host_page == 0 {
            // SAFETY: `[start, end)` lies inside the reservation (the caller's contract),
            // whose working view is our private anonymous mapping, and nothing refers to it.
            unsafe { sys::madvise_dontneed(at, end - start) }.map_err(|source| MapperError::Os {
                operation: "madvise",
                address: start,
                len: end - start,
                source,
            })
        } else {
            // Target pages smaller than this machine's: zeroed in place.
            // SAFETY: as above; the range is ours and writable.
            unsafe { std::ptr::write_bytes(at as *mut u8, 0, (end - start) as usize) };
            Ok(())
        }
    }

    unsafe fn release(&self, reservation: &Reservation) -> Result<(), MapperError> {
        // SAFETY: the working view was mapped by `reserve` with this length and is released
        // once, with no reference into it (the caller's contract).
        unsafe { sys::munmap(reservation.working as u64, reservation.len) }.map_err(|source| {
            MapperError::Os {
                operation: "munmap",
                address: reservation.target,
                len: reservation.len,
                source,
            }
        })
    }

    fn target_is_local(&self) -> bool {
        false
    }

    fn resident_bytes(&self, reservation: &Reservation) -> Option<u64> {
        Some(reservation.len)
    }
}
