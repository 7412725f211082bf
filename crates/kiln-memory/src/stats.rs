//! Memory figures of a manager.

use crate::Permission;
use std::fmt;

/// Figures of one pool kind (all slabs together).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PoolStats {
    /// Address space of the pools.
    pub reserved: u64,
    /// Bytes of pages prepared (accessible, possibly backed).
    pub prepared: u64,
    /// Free bytes.
    pub free: u64,
    /// Largest free range in any one slab.
    pub largest_free: u64,
    /// Number of free ranges (a measure of fragmentation).
    pub free_ranges: u64,
    /// Number of arenas (over all slabs); when nothing is allocated each arena is one
    /// free range.
    pub arenas: u64,
}

/// Figures of a memory manager, from [`MemoryManager::stats`](crate::MemoryManager::stats).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MemoryStats {
    /// Live allocations (in flight or finalized).
    pub live_allocations: u64,
    /// Bytes the live allocations asked for.
    pub bytes_requested: u64,
    /// Bytes they occupy (requests rounded up to the pool's granule).
    pub bytes_allocated: u64,
    /// Address space reserved.
    pub bytes_reserved: u64,
    /// Bytes of pages prepared (mapped and accessible).
    pub bytes_mapped: u64,
    /// Bytes resident in physical memory, counted once, if the mapper can tell.
    pub bytes_resident: Option<u64>,
    /// Free bytes in the pools.
    pub bytes_free: u64,
    /// Largest free range of any permission.
    pub largest_free_range: u64,
    /// Number of slabs (reservations).
    pub slabs: u64,
    /// Segments served from a thread's cache of freed ranges, without a lock (the
    /// allocator's fast path), since the manager was made.
    pub cache_hits: u64,
    /// Per permission, indexed by [`Permission::index`].
    pub pools: [PoolStats; 3],
}

impl MemoryStats {
    /// Figures of the pools of `permission`.
    pub fn pool(&self, permission: Permission) -> &PoolStats {
        &self.pools[permission.index()]
    }
}

impl fmt::Display for MemoryStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "live allocations   {}", self.live_allocations)?;
        writeln!(f, "bytes requested    {}", self.bytes_requested)?;
        writeln!(f, "bytes allocated    {}", self.bytes_allocated)?;
        writeln!(f, "bytes reserved     {}", self.bytes_reserved)?;
        writeln!(f, "bytes mapped       {}", self.bytes_mapped)?;
        match self.bytes_resident {
            Some(r) => writeln!(f, "bytes resident     {r}")?,
            None => writeln!(f, "bytes resident     unknown")?,
        }
        writeln!(f, "bytes free         {}", self.bytes_free)?;
        writeln!(f, "largest free range {}", self.largest_free_range)?;
        write!(f, "slabs              {}", self.slabs)
    }
}
