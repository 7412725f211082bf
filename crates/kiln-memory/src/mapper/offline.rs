//! A mapper whose target is not this process: code is laid out for addresses chosen by the
//! caller, written to heap memory here, and never run. For linking ahead of time or for
//! another machine ("show me what you linked"), and for tests that need known addresses.

use super::{Mapper, Placement, Reservation, SegmentRange};
use crate::{MapperError, Permission};
use parking_lot::Mutex;
use std::alloc::{alloc_zeroed, dealloc, Layout};

/// Places reservations at consecutive target addresses from a base the caller chooses;
/// the working view is zeroed heap memory of this process. Nothing is mapped at the target
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
            next: Mutex::new(base.next_multiple_of(page_size)),
        }
    }

    fn layout(&self, len: u64) -> Result<Layout, MapperError> {
        usize::try_from(len)
            .ok()
            .and_then(|len| Layout::from_size_align(len, self.page_size as usize).ok())
            .ok_or(MapperError::Refused {
                operation: "reserve",
                reason: format!("{len:#x} bytes do not fit this process's memory"),
            })
    }
}

// SAFETY: the working view of a reservation is a heap block of `len` bytes that this mapper
// owns from `reserve` until `release` (it is freed nowhere else), and it is readable and
// writable for all of that time, so every prepared page stays writable; nothing else has
// its address.
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
        let layout = self.layout(len)?;
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
        if layout.size() == 0 {
            return Err(MapperError::Refused {
                operation: "reserve",
                reason: "an empty reservation".into(),
            });
        }
        // SAFETY: the layout has a non-zero size (checked above) and a power-of-two
        // alignment.
        let working = unsafe { alloc_zeroed(layout) };
        if working.is_null() {
            return Err(MapperError::Refused {
                operation: "reserve",
                reason: format!("no memory for a working view of {len:#x} bytes"),
            });
        }
        *next = end;
        Ok(Reservation {
            target,
            len,
            working,
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
        if let Some(at) = reservation.working_address(start) {
            // SAFETY: `[start, end)` lies inside the reservation (the caller's contract),
            // whose working view is ours and writable, and nothing refers to it.
            unsafe { std::ptr::write_bytes(at, 0, (end - start) as usize) };
        }
        Ok(())
    }

    unsafe fn release(&self, reservation: &Reservation) -> Result<(), MapperError> {
        let layout = self.layout(reservation.len)?;
        // SAFETY: `working` was allocated by `reserve` with this layout (same length, same
        // page size) and is released once (the caller's contract).
        unsafe { dealloc(reservation.working, layout) };
        Ok(())
    }

    fn resident_bytes(&self, reservation: &Reservation) -> Option<u64> {
        Some(reservation.len)
    }
}
