//! # kiln-memory
//!
//! Executable memory for JIT linkers, usable on its own.
//!
//! Three layers, each knowing only the one below:
//!
//! - **Mappers** ([`Mapper`]): how memory reaches the code. [`DualMappedMapper`] (the
//!   default) maps a memfd twice, a read-write working view and a target view with final
//!   permissions, so no page is ever writable and executable and no permission changes when
//!   code is added next to running code. [`InProcessMapper`] reserves `PROT_NONE` address
//!   space and uses `mprotect`.
//! - **Slab allocator**: a slab is one large reservation split into a read-execute, a
//!   read-only and a read-write pool; sections of many modules share pages; frees coalesce,
//!   whole free pages go back to the kernel, freed code is filled with trap bytes.
//! - **Memory manager** ([`MemoryManager`], default [`SlabMemoryManager`]): allocate a
//!   request of segments → [`InFlightAllocation`] (working memory, final addresses) →
//!   [`finalize`](InFlightAllocation::finalize) → [`FinalizedAllocation`], an owning,
//!   `Send` handle that frees on drop and outlives the manager.
//!
//! ```
//! use kiln_memory::{AllocationRequest, MemoryManager, Permission, SegmentRequest, SlabMemoryManager};
//! let manager = SlabMemoryManager::new()?;
//! let request = AllocationRequest::new()
//!     .segment(SegmentRequest::new(Permission::ReadExecute, 64, 16))
//!     .segment(SegmentRequest::new(Permission::Read, 32, 8))
//!     .segment(SegmentRequest::new(Permission::ReadWrite, 8, 8).zero_filled());
//! let mut in_flight = manager.allocate(&request)?;
//! in_flight.working_memory(1).unwrap().copy_from_slice(&[7; 32]);
//! let finalized = in_flight.finalize()?;
//! let constants = finalized.target(1).unwrap();
//! // SAFETY: the read-only segment is mapped readable at its target address.
//! assert_eq!(unsafe { *(constants as *const u8) }, 7);
//! println!("{}", manager.stats());
//! # Ok::<(), kiln_memory::MemoryError>(())
//! ```

mod allocation;
mod error;
mod free_list;
pub mod icache;
mod manager;
mod mapper;
mod mapper_span;
mod page_runs;
mod permission;
mod slab;
mod slab_backend;
mod span;
mod stats;
mod thread_cache;

pub use allocation::{
    FinalizedAllocation, FinalizedBackend, InFlightAllocation, InFlightBackend, SegmentMut,
    Segments, WorkingSegment,
};
pub use error::{MapperError, MemoryError};
pub use free_list::{FreeList, NotAllocated};
pub use manager::{
    AllocationRequest, MemoryManager, SegmentRequest, SlabMemoryManager, SlabMemoryManagerBuilder,
    TRAP_PATTERN,
};
pub use mapper::{
    default_mapper, DualMappedMapper, InProcessMapper, Mapper, OfflineMapper, Placement,
    Reservation, SegmentRange,
};
pub use mapper_span::MapperSpanManager;
pub use page_runs::PageRuns;
pub use permission::Permission;
pub use slab::SlabLayout;
pub use span::{map_span_from_file, FileSegment, SpanLayout, SpanMemoryManager};
pub use stats::{MemoryStats, PoolStats};

/// The page size of this machine.
pub fn page_size() -> u64 {
    mapper::sys::page_size()
}
