//! Typed errors of the memory layer.

use crate::{Permission, Placement};
use std::io;

/// An error from a [`Mapper`](crate::Mapper): a system call that failed, or a request the
/// mapper cannot honour.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MapperError {
    /// A system call failed.
    #[error("{operation} of {len:#x} bytes at {address:#x} failed: {source}")]
    Os {
        /// What the mapper was doing (`"mmap"`, `"mprotect"`, `"memfd_create"`, ...).
        operation: &'static str,
        /// The target address involved (0 when the kernel chooses).
        address: u64,
        /// The length involved.
        len: u64,
        /// The error the kernel returned.
        #[source]
        source: io::Error,
    },
    /// No free address range satisfies the placement.
    #[error("no free address range of {len:#x} bytes satisfies placement {placement}: {reason}")]
    PlacementUnavailable {
        /// The placement that was asked for.
        placement: Placement,
        /// The size of the reservation.
        len: u64,
        /// Why it failed.
        reason: String,
    },
    /// The mapper refused an operation for a reason of its own (used by client mappers and
    /// by the fault-injecting mapper of the tests).
    #[error("{operation} refused by mapper: {reason}")]
    Refused {
        /// The operation refused.
        operation: &'static str,
        /// Why.
        reason: String,
    },
}

impl MapperError {
    /// Builds an [`MapperError::Os`] from `errno`.
    pub fn last_os_error(operation: &'static str, address: u64, len: u64) -> Self {
        MapperError::Os {
            operation,
            address,
            len,
            source: io::Error::last_os_error(),
        }
    }
}

/// An error from the memory manager: an allocation that cannot be made, or a mapper that
/// failed underneath.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MemoryError {
    /// A size plus its alignment padding overflows the address space.
    #[error("segment {segment}: size {size:#x} with alignment {align:#x} overflows")]
    SizeOverflow {
        /// Index of the segment in the request.
        segment: usize,
        /// Requested size.
        size: u64,
        /// Requested alignment.
        align: u64,
    },
    /// The alignment is zero or not a power of two.
    #[error("segment {segment}: alignment {align:#x} is not a power of two")]
    InvalidAlignment {
        /// Index of the segment in the request.
        segment: usize,
        /// Requested alignment.
        align: u64,
    },
    /// The alignment is a power of two but larger than any pool can honour.
    #[error("segment {segment}: alignment {align:#x} exceeds the largest supported ({max:#x})")]
    AlignmentTooLarge {
        /// Index of the segment in the request.
        segment: usize,
        /// Requested alignment.
        align: u64,
        /// Largest alignment this manager supports.
        max: u64,
    },
    /// No slab has room and the request does not allow another reservation out of range.
    #[error(
        "out of reservation: segment {segment} needs {size:#x} bytes {permission} \
         (aligned {align:#x}); largest free range is {largest_free:#x} bytes{hint}"
    )]
    OutOfReservation {
        /// Index of the segment that did not fit.
        segment: usize,
        /// Its size.
        size: u64,
        /// Its alignment.
        align: u64,
        /// Its permission.
        permission: Permission,
        /// Largest free range of that permission over all slabs.
        largest_free: u64,
        /// A hint on what to change.
        hint: &'static str,
    },
    /// A segment larger than any arena of its pool can ever hold.
    #[error(
        "segment {segment}: {size:#x} bytes {permission} (aligned {align:#x}) can never fit: \
         the largest arena holds {max:#x} bytes (use a larger layout or fewer arenas)"
    )]
    SegmentTooLarge {
        /// Index of the segment in the request.
        segment: usize,
        /// Its size.
        size: u64,
        /// Its alignment.
        align: u64,
        /// Its permission.
        permission: Permission,
        /// Bytes of the smallest arena of that pool.
        max: u64,
    },
    /// The manager's configuration is impossible (a layout whose size overflows, a pool
    /// smaller than a page).
    #[error("invalid memory manager configuration: {0}")]
    InvalidConfiguration(String),
    /// A request with no segments.
    #[error("allocation request has no segments")]
    EmptyRequest,
    /// The mapper failed.
    #[error("mapper {mapper}: {source}")]
    Mapper {
        /// The mapper's name.
        mapper: &'static str,
        /// What failed.
        #[source]
        source: MapperError,
    },
}
