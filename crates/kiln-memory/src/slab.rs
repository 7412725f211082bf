//! A slab: one reservation split into three pools, one per permission. Each pool hands out
//! sub-page ranges (or whole pages when the mapper cannot share pages), prepares pages in
//! chunks as they are first needed and gives whole free pages back.

use crate::free_list::FreeList;
use crate::page_runs::PageRuns;
use crate::{Mapper, MapperError, MemoryError, Permission, Reservation};
use parking_lot::{Mutex, MutexGuard};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

/// Sizes of the three pools of every slab (multiples of the page size).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlabLayout {
    /// Bytes of read-execute pool.
    pub read_execute: u64,
    /// Bytes of read-only pool.
    pub read: u64,
    /// Bytes of read-write pool.
    pub read_write: u64,
}

impl SlabLayout {
    /// The default: 128 MiB of code, 64 MiB of constants, 64 MiB of data; 256 MiB of
    /// address space in all (only what is used is backed by memory). That holds programs
    /// far larger than CPython, and leaves room for many managers within the ±2 GiB window
    /// around the host's libraries.
    pub const DEFAULT: SlabLayout = SlabLayout {
        read_execute: 128 << 20,
        read: 64 << 20,
        read_write: 64 << 20,
    };

    /// Total size.
    pub fn total(&self) -> u64 {
        self.read_execute + self.read + self.read_write
    }

    /// Size of the pool for `permission`.
    pub fn pool_len(&self, permission: Permission) -> u64 {
        match permission {
            Permission::ReadExecute => self.read_execute,
            Permission::Read => self.read,
            Permission::ReadWrite => self.read_write,
        }
    }
}

impl Default for SlabLayout {
    fn default() -> Self {
        Self::DEFAULT
    }
}

/// Smallest arena: pools smaller than twice this have one arena.
pub(crate) const MIN_ARENA: u64 = 32 << 20;

/// Tuning shared by all slabs of a manager.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SlabTuning {
    pub(crate) page: u64,
    /// Pages are prepared at least this many bytes at a time in shared pools.
    pub(crate) prepare_chunk: u64,
    /// Pages are populated (backed and mapped ahead) this many bytes at a time.
    pub(crate) populate_chunk: u64,
    /// A run of whole free pages at least this long is given back to the system.
    pub(crate) release_threshold: u64,
    /// Smallest unit (and alignment) of shared-pool allocations.
    pub(crate) granule: u64,
    /// Whether freed code on shared pages is filled with trap bytes.
    pub(crate) poison: bool,
    /// What freed code is filled with.
    pub(crate) trap_pattern: [u8; 4],
    /// Arenas per pool: each has its own lock and address range, and a thread keeps to
    /// one, so threads neither wait for each other nor write into each other's pages.
    pub(crate) arenas: usize,
}

/// One pool: the free ranges and the pages not prepared.
#[derive(Debug)]
pub(crate) struct Pool {
    pub(crate) shared: bool,
    pub(crate) free: FreeList,
    pub(crate) unprepared: PageRuns,
    /// Pages not populated ahead yet (shared pools).
    pub(crate) unpopulated: PageRuns,
}

/// One arena of a pool: its free ranges under a lock, and the figures that the threads'
/// caches of freed ranges keep up to date without taking that lock.
#[derive(Debug)]
pub(crate) struct Arena {
    pool: Mutex<Pool>,
    /// Bytes the live ranges of this arena were asked for.
    requested: AtomicU64,
    /// Live allocations whose first segment lies in this arena.
    allocations: AtomicU64,
    /// Bytes of this arena's freed ranges that threads hold in their caches.
    cached_bytes: AtomicU64,
    /// Number of those ranges.
    cached_ranges: AtomicU64,
    /// Segments served from a thread's cache, without this arena's lock.
    cache_hits: AtomicU64,
}

/// Adds a signed amount to a counter (two's complement: a negative amount subtracts).
fn add(counter: &AtomicU64, amount: i64) {
    counter.fetch_add(amount as u64, Ordering::Relaxed);
}

impl Pool {
    fn rounded(&self, size: u64, align: u64, tuning: &SlabTuning) -> Option<(u64, u64)> {
        let unit = if self.shared {
            tuning.granule
        } else {
            tuning.page
        };
        Some((size.max(1).checked_next_multiple_of(unit)?, align.max(unit)))
    }
}

/// Figures of one pool of one slab.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PoolFigures {
    pub(crate) permission: Permission,
    pub(crate) len: u64,
    pub(crate) free: u64,
    pub(crate) largest_free: u64,
    pub(crate) prepared: u64,
    pub(crate) free_ranges: u64,
    pub(crate) requested: u64,
    pub(crate) allocations: u64,
    pub(crate) cache_hits: u64,
}

/// A reservation and its three pools.
#[derive(Debug)]
pub(crate) struct Slab {
    pub(crate) reservation: Reservation,
    pub(crate) mapper: Arc<dyn Mapper>,
    pub(crate) tuning: SlabTuning,
    /// The manager the slab belongs to (its id): what a thread's cache files ranges under.
    pub(crate) owner: u64,
    shared: [bool; 3],
    /// Where each pool's first arena starts, and how far apart its arenas are.
    arena_start: [u64; 3],
    arena_stride: [u64; 3],
    pools: [Box<[Arena]>; 3],
}

/// A range handed out by a pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Placed {
    pub(crate) target: u64,
    /// Bytes asked for.
    pub(crate) requested: u64,
    /// Bytes taken from the pool (the request rounded up).
    pub(crate) taken: u64,
    pub(crate) permission: Permission,
    /// Index of the arena within the pool.
    pub(crate) arena: usize,
    /// Whether this is the first segment of its allocation (counts the allocation).
    pub(crate) first: bool,
}

thread_local! {
    /// This thread's preferred arena (modulo the arena count), handed out round-robin.
    static PREFERRED_ARENA: usize = {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        NEXT.fetch_add(1, Ordering::Relaxed)
    };
}

/// The addresses in `[start, end)` whose low 32 bits are all 0 (every 4 GiB): libgcc's
/// unwinder reads a registered FDE whose 4-byte start is 0 there as a function a linker
/// removed (`classify_object_over_fdes`, "Assume 0 in the representable bits is NULL"),
/// so code must not start at one of them.
pub(crate) fn unwinder_blind_spots(start: u64, end: u64) -> impl Iterator<Item = u64> {
    const SPAN: u64 = 1 << 32;
    let first = start.div_ceil(SPAN).saturating_mul(SPAN);
    (first..end).step_by(SPAN as usize)
}

fn mapper_error(mapper: &dyn Mapper, source: MapperError) -> MemoryError {
    MemoryError::Mapper {
        mapper: mapper.name(),
        source,
    }
}

impl Slab {
    /// Reserves a slab through `mapper`.
    pub(crate) fn reserve(
        mapper: Arc<dyn Mapper>,
        layout: SlabLayout,
        tuning: SlabTuning,
        placement: &crate::Placement,
        owner: u64,
    ) -> Result<Slab, MemoryError> {
        let reservation = mapper
            .reserve(layout.total(), placement)
            .map_err(|e| mapper_error(&*mapper, e))?;
        // A code pool over a 4 GiB boundary hides a unit there (see below), so a segment
        // as large as the pool no longer fits: one more reservation is tried (the first
        // still held, the mapper places it elsewhere) and the one whose code pool has no
        // boundary kept.
        let code_len = layout.pool_len(Permission::ReadExecute);
        let crosses = |r: &Reservation| {
            code_len > 0
                && unwinder_blind_spots(r.target, r.target + code_len)
                    .next()
                    .is_some()
        };
        let reservation = if crosses(&reservation) {
            match mapper.reserve(layout.total(), placement) {
                Ok(other) if !crosses(&other) => {
                    // SAFETY: a reservation this mapper just made, never used.
                    if let Err(error) = unsafe { mapper.release(&reservation) } {
                        tracing::warn!(%error, "releasing a reservation over a 4 GiB boundary failed");
                    }
                    other
                }
                Ok(other) => {
                    // SAFETY: as above.
                    if let Err(error) = unsafe { mapper.release(&other) } {
                        tracing::warn!(%error, "releasing a second reservation failed");
                    }
                    reservation
                }
                Err(_) => reservation,
            }
        } else {
            reservation
        };
        let shares = mapper.shares_pages();
        let mut start = reservation.target;
        let mut arena_start = [0; 3];
        let mut arena_stride = [0; 3];
        let pools = Permission::ALL.map(|permission| {
            let len = layout.pool_len(permission);
            let shared = shares || permission == Permission::ReadWrite;
            // Arenas never smaller than MIN_ARENA, so one segment of up to that size
            // always fits an empty arena.
            let arenas = (tuning.arenas.max(1) as u64).min((len / MIN_ARENA).max(1));
            let arena_len = (len / arenas) & !(tuning.page - 1);
            let pool_start = start;
            start += len;
            arena_start[permission.index()] = pool_start;
            arena_stride[permission.index()] = arena_len;
            (0..arenas)
                .map(|k| {
                    let a_start = pool_start + k * arena_len;
                    let a_end = if k + 1 == arenas {
                        pool_start + len
                    } else {
                        a_start + arena_len
                    };
                    // No code starts at an address whose low 32 bits are 0: the C
                    // library's unwinder (libgcc's registered frames) takes a function
                    // there, its FDE's 4-byte start 0, for one a linker removed, and
                    // cannot unwind through it.
                    let unit = if shared { tuning.granule } else { tuning.page };
                    let hidden: Vec<(u64, u64)> = if permission == Permission::ReadExecute {
                        unwinder_blind_spots(a_start, a_end)
                            .map(|b| (b, b + unit))
                            .collect()
                    } else {
                        Vec::new()
                    };
                    Arena {
                        pool: Mutex::new(Pool {
                            shared,
                            free: FreeList::with_hidden(a_start, a_end - a_start, &hidden),
                            unprepared: PageRuns::new(a_start, a_end),
                            unpopulated: PageRuns::new(a_start, a_end),
                        }),
                        requested: AtomicU64::new(0),
                        allocations: AtomicU64::new(0),
                        cached_bytes: AtomicU64::new(0),
                        cached_ranges: AtomicU64::new(0),
                        cache_hits: AtomicU64::new(0),
                    }
                })
                .collect::<Vec<_>>()
                .into_boxed_slice()
        });
        let shared = Permission::ALL.map(|p| shares || p == Permission::ReadWrite);
        Ok(Slab {
            reservation,
            mapper,
            tuning,
            owner,
            shared,
            arena_start,
            arena_stride,
            pools,
        })
    }

    pub(crate) fn arena(&self, permission: Permission, arena: usize) -> MutexGuard<'_, Pool> {
        self.pools[permission.index()][arena].pool.lock()
    }

    /// The arena of `permission` that `target` (an address of that pool) lies in.
    pub(crate) fn arena_of(&self, permission: Permission, target: u64) -> usize {
        let p = permission.index();
        let k = (target - self.arena_start[p]) / self.arena_stride[p];
        (k as usize).min(self.pools[p].len() - 1)
    }

    /// What a pool hands out in: the granule for pools that share pages, whole pages
    /// otherwise. A range of `size` bytes takes `size` rounded up to it.
    pub(crate) fn unit(&self, permission: Permission) -> u64 {
        if self.is_shared(permission) {
            self.tuning.granule
        } else {
            self.tuning.page
        }
    }

    /// Counts a range of `size` bytes handed out from a thread's cache (no lock taken).
    pub(crate) fn note_cache_hit(
        &self,
        permission: Permission,
        arena: usize,
        size: u64,
        first: bool,
    ) {
        let a = &self.pools[permission.index()][arena];
        a.requested.fetch_add(size, Ordering::Relaxed);
        a.allocations.fetch_add(u64::from(first), Ordering::Relaxed);
        a.cache_hits.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a live range of `size` bytes given up (to a thread's cache or the arena).
    pub(crate) fn note_freed(&self, permission: Permission, arena: usize, size: u64, first: bool) {
        let a = &self.pools[permission.index()][arena];
        a.requested.fetch_sub(size, Ordering::Relaxed);
        a.allocations.fetch_sub(u64::from(first), Ordering::Relaxed);
    }

    /// Counts bytes and ranges of an arena that went into (positive) or out of (negative)
    /// threads' caches.
    pub(crate) fn note_cached(
        &self,
        permission: Permission,
        arena: usize,
        bytes: i64,
        ranges: i64,
    ) {
        let a = &self.pools[permission.index()][arena];
        add(&a.cached_bytes, bytes);
        add(&a.cached_ranges, ranges);
    }

    /// Largest free range of any arena of `permission`.
    pub(crate) fn largest_free(&self, permission: Permission) -> u64 {
        self.pools[permission.index()]
            .iter()
            .map(|a| a.pool.lock().free.largest_free())
            .max()
            .unwrap_or(0)
    }

    /// Length of the smallest arena of `permission`: the largest segment that always fits.
    pub(crate) fn arena_len(&self, permission: Permission) -> u64 {
        self.pools[permission.index()]
            .iter()
            .map(|a| {
                let a = a.pool.lock();
                a.free.end() - a.free.start()
            })
            .min()
            .unwrap_or(0)
    }

    /// Whether the pool of `permission` shares pages among allocations.
    pub(crate) fn is_shared(&self, permission: Permission) -> bool {
        self.shared[permission.index()]
    }

    /// Takes `size` bytes aligned to `align` from the pool of `permission`, preparing the
    /// pages it needs: from this thread's arena, else from any other. `Ok(None)` when no
    /// arena has room.
    pub(crate) fn allocate(
        &self,
        permission: Permission,
        size: u64,
        align: u64,
        first: bool,
    ) -> Result<Option<Placed>, MemoryError> {
        let arenas = self.pools[permission.index()].len();
        let preferred = PREFERRED_ARENA.with(|p| *p) % arenas;
        for k in (0..arenas).map(|i| (preferred + i) % arenas) {
            if let Some(placed) = self.allocate_in(permission, k, size, align, first)? {
                return Ok(Some(placed));
            }
        }
        Ok(None)
    }

    fn allocate_in(
        &self,
        permission: Permission,
        arena: usize,
        size: u64,
        align: u64,
        first: bool,
    ) -> Result<Option<Placed>, MemoryError> {
        let tuning = &self.tuning;
        let mut pool = self.arena(permission, arena);
        let Some((taken, align)) = pool.rounded(size, align, tuning) else {
            return Ok(None);
        };
        let Some(target) = pool.free.allocate(taken, align) else {
            return Ok(None);
        };
        let page_start = target & !(tuning.page - 1);
        let page_end = (target + taken).next_multiple_of(tuning.page);
        if !pool.unprepared.is_disjoint(page_start, page_end) {
            // The pages the range needs; for shared pools, with the rest of a chunk ahead,
            // best effort. Where the two touch they are prepared in one call (a remote
            // mapper's call is a round trip to the executor).
            let ahead_end = if pool.shared {
                page_start
                    .saturating_add(tuning.prepare_chunk)
                    .min(pool.free.end())
                    .max(page_end)
            } else {
                page_end
            };
            let needed = pool.unprepared.remove(page_start, page_end);
            let mut ahead = pool.unprepared.remove(page_end, ahead_end);
            for (i, &(start, mut end)) in needed.iter().enumerate() {
                // The read-ahead that continues the last needed part joins it.
                let joined = match ahead.first() {
                    Some(&(a, b)) if i + 1 == needed.len() && a == end => {
                        ahead.remove(0);
                        end = b;
                        Some((a, b))
                    }
                    _ => None,
                };
                // A failure fails the allocation, the read-ahead joined or not.
                // SAFETY: the reservation is this slab's, alive while the slab is; the
                // pages lie in this pool's arena, were unprepared (no allocation on them)
                // and are now ours under the pool lock.
                let prepared = unsafe {
                    self.mapper
                        .prepare(&self.reservation, start, end, permission)
                };
                if let Err(e) = prepared {
                    // Undo: the parts not prepared go back; the range goes back.
                    for &(s, e) in &needed[i..] {
                        pool.unprepared.insert(s, e);
                    }
                    for &(s, e) in joined.iter().chain(&ahead) {
                        pool.unprepared.insert(s, e);
                    }
                    let _ = pool.free.free(target, taken);
                    return Err(mapper_error(&*self.mapper, e));
                }
            }
            for (start, end) in ahead {
                // SAFETY: as above: unprepared pages of this arena, under its lock.
                let prepared = unsafe {
                    self.mapper
                        .prepare(&self.reservation, start, end, permission)
                };
                if prepared.is_err() {
                    // Only the read-ahead failed: leave those pages for later.
                    pool.unprepared.insert(start, end);
                }
            }
        }
        if pool.shared && !pool.unpopulated.is_disjoint(page_start, page_end) {
            // Back the pages this range needs, and a little ahead, in one call: fewer page
            // faults than touching them, less memory than populating whole chunks.
            // Ahead by a quarter of what the pool holds, between 16 KiB and the chunk:
            // a pool that holds little (64-byte data of each module, or one small
            // program's code) is not backed a whole chunk ahead, nor 64 KiB (zeroing 48
            // pages for a program that needs 3 was a tenth of `kiln run`'s start-up).
            let used = (pool.free.end() - pool.free.start()) - pool.free.free_bytes();
            let chunk = (used / 4).clamp(16 << 10, tuning.populate_chunk.max(16 << 10));
            // Only prepared pages: a page populated while unprepared would hold memory
            // that no release gives back (releases punch out what they unprepare), and
            // resident would exceed mapped.
            let prepared_end = pool
                .unprepared
                .next_covered(page_end)
                .unwrap_or(pool.free.end());
            let ahead = page_end
                .max(page_start.saturating_add(chunk))
                .min(pool.free.end())
                .min(prepared_end.max(page_end));
            for (start, end) in pool.unpopulated.remove(page_start, ahead) {
                self.mapper.populate(&self.reservation, start, end);
            }
        }
        drop(pool);
        let counted = &self.pools[permission.index()][arena];
        counted.requested.fetch_add(size, Ordering::Relaxed);
        counted
            .allocations
            .fetch_add(u64::from(first), Ordering::Relaxed);
        Ok(Some(Placed {
            target,
            requested: size,
            taken,
            permission,
            arena,
            first,
        }))
    }

    /// Returns a range to its pool; whole free pages go back to the system (at once for
    /// private pools, in runs of at least the release threshold for shared ones).
    pub(crate) fn free(&self, placed: Placed) -> Result<(), MemoryError> {
        self.note_freed(
            placed.permission,
            placed.arena,
            placed.requested,
            placed.first,
        );
        self.free_range(placed.permission, placed.arena, placed.target, placed.taken)
    }

    /// Returns a range already counted as freed ([`note_freed`](Self::note_freed)) to
    /// arena `arena` of `permission`.
    pub(crate) fn free_range(
        &self,
        permission: Permission,
        arena: usize,
        target: u64,
        taken: u64,
    ) -> Result<(), MemoryError> {
        let mut pool = self.arena(permission, arena);
        self.return_range(&mut pool, permission, target, taken)
    }

    /// Returns free ranges of one arena (from a thread's cache) under one lock.
    pub(crate) fn return_ranges(
        &self,
        permission: Permission,
        arena: usize,
        ranges: impl IntoIterator<Item = (u64, u64)>,
    ) -> Result<(), MemoryError> {
        let mut pool = self.arena(permission, arena);
        let mut result = Ok(());
        for (start, end) in ranges {
            if let Err(e) = self.return_range(&mut pool, permission, start, end - start) {
                result = Err(e);
            }
        }
        result
    }

    /// Puts `[target, target + taken)` back on the free list of `pool` (locked) and gives
    /// whole free pages back to the system as [`free`](Self::free) says.
    fn return_range(
        &self,
        pool: &mut Pool,
        permission: Permission,
        target: u64,
        taken: u64,
    ) -> Result<(), MemoryError> {
        let tuning = &self.tuning;
        let (run_start, run_end) =
            pool.free
                .free(target, taken)
                .map_err(|e| MemoryError::Mapper {
                    mapper: self.mapper.name(),
                    source: MapperError::Refused {
                        operation: "free",
                        reason: e.to_string(),
                    },
                })?;
        let (start, end) = if pool.shared {
            let whole_pool = run_start == pool.free.start() && run_end == pool.free.end();
            // A free run keeps its first `prepare_chunk` bytes prepared, as a cushion: without
            // it, freeing next to the prepared-but-unused end of a pool would return those
            // pages and the next allocation would prepare them again, two system calls and
            // fresh page faults per operation.
            let cushion = if whole_pool { 0 } else { tuning.prepare_chunk };
            let Some(start) = run_start
                .saturating_add(cushion)
                .min(run_end)
                .checked_next_multiple_of(tuning.page)
            else {
                return Ok(());
            };
            let end = run_end & !(tuning.page - 1);
            if end <= start {
                return Ok(());
            }
            // Give pages back when that returns at least the threshold at once (so freeing
            // modules one after another costs a system call per threshold's worth, not per
            // module), and always when the pool is entirely free.
            let returnable = (end - start) - pool.unprepared.covered(start, end);
            if returnable == 0 || (returnable < tuning.release_threshold && !whole_pool) {
                return Ok(());
            }
            (start, end)
        } else {
            (target, target + taken)
        };
        // Even when deinitialize fails the pages count as unprepared: whatever state the
        // mapper left them in, the next use prepares them again, which restores access.
        // Only their memory is not returned meanwhile.
        let parts = pool.unprepared.insert(start, end);
        pool.unpopulated.insert(start, end);
        let mut result = Ok(());
        for (s, e) in parts {
            // SAFETY: the pages lie in this arena and were free (the free list just took
            // the range back, coalesced), so no allocation lives there; we hold the lock.
            let done = unsafe {
                self.mapper
                    .deinitialize(&self.reservation, s, e, permission)
            };
            if let Err(error) = done {
                result = Err(mapper_error(&*self.mapper, error));
            }
        }
        result
    }

    /// Working-view pointer of `target`, which must lie inside the reservation.
    pub(crate) fn working(&self, target: u64) -> *mut u8 {
        // Pools tile the reservation (checked when the manager is built), so every target
        // a pool hands out has a working address.
        self.reservation
            .working_address(target)
            .unwrap_or(self.reservation.working)
    }

    /// Figures of each arena of each pool.
    pub(crate) fn pool_figures(&self) -> Vec<PoolFigures> {
        let mut figures = Vec::new();
        for permission in Permission::ALL {
            for arena in self.pools[permission.index()].iter() {
                let pool = arena.pool.lock();
                let len = pool.free.end() - pool.free.start();
                let load = |c: &AtomicU64| c.load(Ordering::Relaxed);
                // Ranges in threads' caches are free, though no other thread can have them.
                figures.push(PoolFigures {
                    permission,
                    len,
                    free: pool.free.free_bytes() + load(&arena.cached_bytes),
                    largest_free: pool.free.largest_free(),
                    prepared: len - pool.unprepared.total(),
                    free_ranges: pool.free.range_count() as u64 + load(&arena.cached_ranges),
                    requested: load(&arena.requested),
                    allocations: load(&arena.allocations),
                    cache_hits: load(&arena.cache_hits),
                });
            }
        }
        figures
    }
}

impl Drop for Slab {
    fn drop(&mut self) {
        // SAFETY: the slab is being dropped: no allocation holds it (each holds an `Arc`),
        // and its reservation came from this mapper, released once here.
        if let Err(error) = unsafe { self.mapper.release(&self.reservation) } {
            tracing::warn!(%error, target = self.reservation.target, "releasing a slab failed");
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::{
        AllocationRequest, MemoryManager, OfflineMapper, Permission, SegmentRequest, SlabLayout,
        SlabMemoryManager,
    };
    use std::sync::Arc;

    #[test]
    fn no_code_starts_where_the_unwinder_is_blind() {
        // A slab whose code pool starts at 4 GiB × 3: its first unit is never handed out.
        // (Its reservation is 4 GiB, so the one tried after it starts on a boundary too.)
        let base = 3 << 32;
        let mapper = Arc::new(OfflineMapper::new(base, 4096));
        let small = SlabLayout {
            read_execute: 1 << 20,
            read: (1 << 32) - (2 << 20),
            read_write: 1 << 20,
        };
        let memory = SlabMemoryManager::builder()
            .mapper(mapper)
            .layout(small)
            .build()
            .unwrap();
        let mut starts = Vec::new();
        let mut live = Vec::new();
        for _ in 0..64 {
            let allocation = memory
                .allocate(&AllocationRequest::new().segment(SegmentRequest::new(
                    Permission::ReadExecute,
                    16,
                    16,
                )))
                .unwrap();
            starts.push(allocation.segments()[0].target);
            live.push(allocation);
        }
        assert!(starts.iter().all(|&s| s >= base));
        assert!(!starts.contains(&base), "{starts:x?}");
        assert_eq!(
            super::unwinder_blind_spots(base - 1, base + 1).collect::<Vec<_>>(),
            vec![base]
        );
        assert_eq!(
            super::unwinder_blind_spots(base + 1, base + (1 << 32)).count(),
            0
        );
    }

    /// A code pool that would hold a 4 GiB boundary (a unit there hidden) is reserved
    /// again elsewhere: a segment as large as the whole pool still fits.
    #[test]
    fn a_code_pool_over_a_4_gib_boundary_is_placed_again() {
        let pool = 8 << 20;
        // The first reservation's code pool holds the boundary 1 MiB in.
        let boundary: u64 = 5 << 32;
        let mapper = Arc::new(OfflineMapper::new(boundary - (1 << 20), 4096));
        let memory = SlabMemoryManager::builder()
            .mapper(mapper)
            .layout(SlabLayout {
                read_execute: pool,
                read: 1 << 20,
                read_write: 1 << 20,
            })
            .arenas(1)
            .build()
            .unwrap();
        let whole = memory
            .allocate(&AllocationRequest::new().segment(SegmentRequest::new(
                Permission::ReadExecute,
                pool,
                16,
            )))
            .expect("a segment as large as the code pool fits");
        let start = whole.segments()[0].target;
        assert!(start > boundary, "{start:#x}");
        assert_eq!(
            super::unwinder_blind_spots(start, start + pool).count(),
            0,
            "{start:#x}"
        );
    }
}
