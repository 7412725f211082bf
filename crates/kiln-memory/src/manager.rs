//! The memory manager: what a linker talks to. Allocate a request of segments, write them,
//! finalize, and keep an owning handle.

use crate::allocation::Segments;
use crate::slab::{Placed, Slab, SlabLayout, SlabTuning};
use crate::slab_backend::SlabBackend;
use crate::stats::{MemoryStats, PoolStats};
use crate::thread_cache;
use crate::{
    default_mapper, InFlightAllocation, Mapper, MemoryError, Permission, Placement, SegmentRange,
};
use parking_lot::RwLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Ids of managers, so that a thread's cache of freed ranges knows whose they are.
static NEXT_MANAGER_ID: AtomicU64 = AtomicU64::new(1);

/// One segment of an [`AllocationRequest`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SegmentRequest {
    /// Bytes needed.
    pub size: u64,
    /// Alignment of the first byte (a power of two).
    pub align: u64,
    /// Final permission.
    pub permission: Permission,
    /// Whether the working memory must start zeroed (`.bss`).
    pub zero_fill: bool,
}

impl SegmentRequest {
    /// A segment of `size` bytes aligned to `align`, with final `permission`.
    pub fn new(permission: Permission, size: u64, align: u64) -> Self {
        SegmentRequest {
            size,
            align,
            permission,
            zero_fill: false,
        }
    }

    /// Asks for zeroed working memory.
    pub fn zero_filled(mut self) -> Self {
        self.zero_fill = true;
        self
    }
}

/// What a linker asks for: segments that will be finalized together.
///
/// ```
/// use kiln_memory::{AllocationRequest, Permission, SegmentRequest};
/// let request = AllocationRequest::new()
///     .segment(SegmentRequest::new(Permission::ReadExecute, 4096, 16))
///     .segment(SegmentRequest::new(Permission::ReadWrite, 64, 8).zero_filled());
/// assert_eq!(request.segments().len(), 2);
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AllocationRequest {
    segments: Segments<SegmentRequest>,
    allow_out_of_range: bool,
}

impl AllocationRequest {
    /// An empty request.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a segment.
    pub fn segment(mut self, segment: SegmentRequest) -> Self {
        self.segments.push(segment);
        self
    }

    /// Lets the manager reserve a new slab that may lie beyond ±2 GiB of the earlier ones
    /// (and of the placement) when they are full. The segments of one request always stay
    /// within one slab.
    pub fn allow_out_of_range(mut self, allow: bool) -> Self {
        self.allow_out_of_range = allow;
        self
    }

    /// The segments.
    pub fn segments(&self) -> &[SegmentRequest] {
        &self.segments
    }

    /// Whether a new, possibly distant, slab may be reserved.
    pub fn allows_out_of_range(&self) -> bool {
        self.allow_out_of_range
    }
}

/// What a linker talks to. [`SlabMemoryManager`] is the default; clients may supply their
/// own (the tests show one).
pub trait MemoryManager: Send + Sync {
    /// Allocates the segments of `request`, all within one slab.
    fn allocate(&self, request: &AllocationRequest) -> Result<InFlightAllocation, MemoryError>;

    /// Current figures.
    fn stats(&self) -> MemoryStats {
        MemoryStats::default()
    }
}

/// Trap bytes that freed code is filled with: `int3` on x86-64, `brk #0` on AArch64.
#[cfg(target_arch = "aarch64")]
pub const TRAP_PATTERN: [u8; 4] = [0x00, 0x00, 0x20, 0xd4];
/// Trap bytes that freed code is filled with: `int3` on x86-64, `brk #0` on AArch64.
#[cfg(not(target_arch = "aarch64"))]
pub const TRAP_PATTERN: [u8; 4] = [0xcc; 4];

#[derive(Debug)]
struct Shared {
    /// This manager's id (its slabs' `owner`).
    id: u64,
    mapper: Arc<dyn Mapper>,
    layout: SlabLayout,
    tuning: SlabTuning,
    placement: Placement,
    slabs: RwLock<Vec<Arc<Slab>>>,
    /// Smallest arena length per permission (what one segment can be at most).
    arena_len: [u64; 3],
    /// Serializes growth, so that threads that miss at once reserve one slab, not many.
    grow: parking_lot::Mutex<()>,
}

/// The default memory manager: a slab allocator over a [`Mapper`].
///
/// Sections of many modules with the same permission share pages; all slabs of a manager
/// are placed as its [`Placement`] asks, and one request always lies in one slab, so its
/// segments are within ±2 GiB of each other.
///
/// ```
/// use kiln_memory::{AllocationRequest, MemoryManager, Permission, SegmentRequest, SlabMemoryManager};
/// let manager = SlabMemoryManager::new()?;
/// let mut in_flight = manager.allocate(
///     &AllocationRequest::new().segment(SegmentRequest::new(Permission::ReadExecute, 16, 16)),
/// )?;
/// # #[cfg(target_arch = "x86_64")]
/// in_flight.working_memory(0).unwrap()[..6].copy_from_slice(&[0xb8, 42, 0, 0, 0, 0xc3]); // mov eax, 42; ret
/// let code = in_flight.finalize()?;
/// # #[cfg(target_arch = "x86_64")]
/// # {
/// // SAFETY: the segment holds a complete function with the C ABI.
/// let f: extern "C" fn() -> u32 = unsafe { std::mem::transmute(code.target(0).unwrap() as usize) };
/// assert_eq!(f(), 42);
/// # }
/// drop(code); // freed: the range is poisoned with trap bytes and can be reused
/// # Ok::<(), kiln_memory::MemoryError>(())
/// ```
#[derive(Debug, Clone)]
pub struct SlabMemoryManager {
    shared: Arc<Shared>,
}

/// Builder for [`SlabMemoryManager`].
#[derive(Debug, Clone)]
pub struct SlabMemoryManagerBuilder {
    mapper: Option<Arc<dyn Mapper>>,
    layout: SlabLayout,
    placement: Placement,
    prepare_chunk: u64,
    populate_chunk: u64,
    release_threshold: u64,
    poison: bool,
    trap_pattern: [u8; 4],
    arenas: Option<usize>,
}

impl Default for SlabMemoryManagerBuilder {
    fn default() -> Self {
        SlabMemoryManagerBuilder {
            mapper: None,
            layout: SlabLayout::DEFAULT,
            placement: Placement::HostLibraries,
            prepare_chunk: 1 << 20,
            populate_chunk: 256 << 10,
            release_threshold: 64 << 10,
            poison: true,
            trap_pattern: TRAP_PATTERN,
            arenas: None,
        }
    }
}

impl SlabMemoryManagerBuilder {
    /// The mapper (default: [`default_mapper`]).
    pub fn mapper(mut self, mapper: Arc<dyn Mapper>) -> Self {
        self.mapper = Some(mapper);
        self
    }

    /// Pool sizes of each slab (default: [`SlabLayout::DEFAULT`]).
    pub fn layout(mut self, layout: SlabLayout) -> Self {
        self.layout = layout;
        self
    }

    /// Where slabs go (default: [`Placement::HostLibraries`]).
    pub fn placement(mut self, placement: Placement) -> Self {
        self.placement = placement;
        self
    }

    /// Pages of shared pools are prepared at least this many bytes at a time
    /// (default 1 MiB), so that preparing costs well under one system call per module.
    pub fn prepare_chunk(mut self, bytes: u64) -> Self {
        self.prepare_chunk = bytes;
        self
    }

    /// Pages of shared pools are backed with memory and mapped ahead of use this many
    /// bytes at a time (default 256 KiB): one system call per chunk instead of a page
    /// fault per page and view, at the price of up to a chunk per pool backed before it is
    /// used.
    pub fn populate_chunk(mut self, bytes: u64) -> Self {
        self.populate_chunk = bytes;
        self
    }

    /// A run of whole free pages at least this long goes back to the system (default
    /// 64 KiB); shorter runs stay, filled with trap bytes if they held code.
    pub fn release_threshold(mut self, bytes: u64) -> Self {
        self.release_threshold = bytes;
        self
    }

    /// Whether freed code is filled with trap bytes (default `true`), so that a stale call
    /// traps instead of running whatever is allocated there next. Turning it off saves a
    /// `memset` of the freed bytes per free; pages given back to the system become
    /// inaccessible either way.
    pub fn poison_freed_code(mut self, poison: bool) -> Self {
        self.poison = poison;
        self
    }

    /// The four bytes freed code is filled with (default [`TRAP_PATTERN`], this
    /// machine's): the code's architecture's trap when it runs elsewhere (an AArch64
    /// executor driven from x86-64 wants `brk #0`, not `int3`).
    pub fn trap_pattern(mut self, pattern: [u8; 4]) -> Self {
        self.trap_pattern = pattern;
        self
    }

    /// Arenas per pool (default: the number of CPUs, at most 4). Each arena has its own
    /// lock and address range, and each thread keeps to one while it has room, so threads
    /// that link at once neither wait for each other nor write into each other's pages.
    /// An arena is never smaller than 32 MiB (smaller pools get fewer arenas), and one
    /// segment must fit in one arena; use `arenas(1)` for segments larger than that.
    pub fn arenas(mut self, arenas: usize) -> Self {
        self.arenas = Some(arenas.max(1));
        self
    }

    /// Reserves the first slab and returns the manager.
    pub fn build(self) -> Result<SlabMemoryManager, MemoryError> {
        let mapper = self.mapper.unwrap_or_else(default_mapper);
        let page = mapper.page_size();
        let invalid = |what: String| MemoryError::InvalidConfiguration(what);
        let round = |v: u64| {
            v.checked_next_multiple_of(page)
                .filter(|&r| r >= page && r <= 1 << 46)
                .ok_or_else(|| {
                    invalid(format!("pool size {v:#x} is not between a page and 64 TiB"))
                })
        };
        let layout = SlabLayout {
            read_execute: round(self.layout.read_execute)?,
            read: round(self.layout.read)?,
            read_write: round(self.layout.read_write)?,
        };
        let largest = layout.read_execute.max(layout.read).max(layout.read_write);
        let tuning = SlabTuning {
            page,
            prepare_chunk: round(self.prepare_chunk.clamp(page, largest))?,
            populate_chunk: round(self.populate_chunk.clamp(page, largest))?,
            release_threshold: round(self.release_threshold.clamp(page, largest))?,
            granule: 16,
            poison: self.poison,
            trap_pattern: self.trap_pattern,
            arenas: self.arenas.unwrap_or_else(|| usable_cpus().min(4)),
        };
        let id = NEXT_MANAGER_ID.fetch_add(1, Ordering::Relaxed);
        let first = Slab::reserve(mapper.clone(), layout, tuning, &self.placement, id)?;
        let arena_len = Permission::ALL.map(|p| first.arena_len(p));
        Ok(SlabMemoryManager {
            shared: Arc::new(Shared {
                id,
                mapper,
                layout,
                tuning,
                placement: self.placement,
                slabs: RwLock::new(vec![Arc::new(first)]),
                arena_len,
                grow: parking_lot::Mutex::new(()),
            }),
        })
    }
}

impl SlabMemoryManager {
    /// A manager with the default mapper, layout and placement.
    pub fn new() -> Result<Self, MemoryError> {
        Self::builder().build()
    }

    /// A builder.
    pub fn builder() -> SlabMemoryManagerBuilder {
        SlabMemoryManagerBuilder::default()
    }

    /// The mapper in use.
    pub fn mapper(&self) -> &Arc<dyn Mapper> {
        &self.shared.mapper
    }

    /// The target address ranges of the slabs, `(start, end)`.
    pub fn slab_ranges(&self) -> Vec<(u64, u64)> {
        self.slabs()
            .iter()
            .map(|s| (s.reservation.target, s.reservation.target_end()))
            .collect()
    }

    fn slabs(&self) -> Vec<Arc<Slab>> {
        self.shared.slabs.read().clone()
    }

    fn validate(&self, request: &AllocationRequest) -> Result<(), MemoryError> {
        if request.segments.is_empty() {
            return Err(MemoryError::EmptyRequest);
        }
        for (segment, s) in request.segments.iter().enumerate() {
            if !s.align.is_power_of_two() {
                return Err(MemoryError::InvalidAlignment {
                    segment,
                    align: s.align,
                });
            }
            let max = self.shared.arena_len[s.permission.index()];
            if s.align > max {
                return Err(MemoryError::AlignmentTooLarge {
                    segment,
                    align: s.align,
                    max,
                });
            }
            if s.size.checked_add(s.align).is_none() || usize::try_from(s.size).is_err() {
                return Err(MemoryError::SizeOverflow {
                    segment,
                    size: s.size,
                    align: s.align,
                });
            }
            // The worst case a fresh arena must hold: the size rounded to the pool's unit
            // plus alignment padding.
            let unit = if self.shared.mapper.shares_pages() || s.permission == Permission::ReadWrite
            {
                self.shared.tuning.granule
            } else {
                self.shared.tuning.page
            };
            let worst =
                s.size.max(1).next_multiple_of(unit) + s.align.saturating_sub(unit.min(s.align));
            if worst > max {
                return Err(MemoryError::SegmentTooLarge {
                    segment,
                    size: s.size,
                    align: s.align,
                    permission: s.permission,
                    max,
                });
            }
        }
        Ok(())
    }

    /// Tries to place every segment in `slab`; `Ok(None)` if one does not fit (nothing is
    /// kept), with the index of that segment.
    fn place_in(
        slab: &Slab,
        request: &AllocationRequest,
    ) -> Result<Result<Segments<Placed>, usize>, MemoryError> {
        let mut placed = Segments::new();
        for (index, s) in request.segments.iter().enumerate() {
            let outcome = slab.allocate(s.permission, s.size, s.align, index == 0);
            match outcome {
                Ok(Some(p)) => placed.push(p),
                Ok(None) | Err(_) => {
                    for p in placed {
                        // Nothing was written: no trap fill needed.
                        let _ = slab.free(p);
                    }
                    return match outcome {
                        Err(e) => Err(e),
                        _ => Ok(Err(index)),
                    };
                }
            }
        }
        Ok(Ok(placed))
    }

    fn out_of_reservation(&self, request: &AllocationRequest, index: usize) -> MemoryError {
        let s = request.segments[index];
        let largest_free = self
            .slabs()
            .iter()
            .map(|slab| slab.largest_free(s.permission))
            .max()
            .unwrap_or(0);
        MemoryError::OutOfReservation {
            segment: index,
            size: s.size,
            align: s.align,
            permission: s.permission,
            largest_free,
            hint: if request.allow_out_of_range {
                "; the segment is larger than a slab's pool"
            } else {
                "; allow out-of-range slabs or reserve a larger layout"
            },
        }
    }

    fn in_flight(
        &self,
        slab: Arc<Slab>,
        request: &AllocationRequest,
        targets: impl IntoIterator<Item = u64>,
    ) -> InFlightAllocation {
        let mut ranges: Segments<SegmentRange> = Segments::new();
        let mut working: Segments<*mut u8> = Segments::new();
        for (target, s) in targets.into_iter().zip(&request.segments) {
            let at = slab.working(target);
            if s.zero_fill {
                // SAFETY: the pool (or this thread's cache) just gave us
                // `[target, target + taken)`, prepared, so its working view is writable and
                // ours alone; `size <= taken`.
                unsafe { std::ptr::write_bytes(at, 0, s.size as usize) };
            }
            ranges.push(SegmentRange {
                target,
                len: s.size,
                permission: s.permission,
            });
            working.push(at);
        }
        // SAFETY: the ranges come from the slab's free lists or this thread's cache of
        // them, so they are disjoint and ours alone; their pages are prepared, so the
        // working view is writable; they stay ours until the backend frees them.
        unsafe { InFlightAllocation::from_slab(ranges, working, SlabBackend(slab)) }
    }

    /// The fast path: every segment from this thread's cache of freed ranges, in one slab,
    /// with no lock and no heap allocation.
    fn take_cached(&self, request: &AllocationRequest) -> Option<InFlightAllocation> {
        let unit = self.shared.tuning.granule;
        let wanted = request.segments.iter().map(|s| {
            (
                s.permission,
                s.size.max(1).next_multiple_of(unit),
                s.align.max(unit),
            )
        });
        let (slab, placed) = thread_cache::take_all(self.shared.id, wanted)?;
        for (index, (s, &(_, arena))) in request.segments.iter().zip(&placed).enumerate() {
            slab.note_cache_hit(s.permission, arena, s.size, index == 0);
        }
        Some(self.in_flight(slab, request, placed.iter().map(|&(target, _)| target)))
    }
}

impl MemoryManager for SlabMemoryManager {
    fn allocate(&self, request: &AllocationRequest) -> Result<InFlightAllocation, MemoryError> {
        self.validate(request)?;
        if let Some(in_flight) = self.take_cached(request) {
            return Ok(in_flight);
        }
        let mut last_miss = 0;
        let seen = {
            let slabs = self.shared.slabs.read();
            for slab in slabs.iter() {
                match Self::place_in(slab, request)? {
                    Ok(placed) => {
                        return Ok(self.in_flight(
                            slab.clone(),
                            request,
                            placed.iter().map(|p| p.target),
                        ))
                    }
                    Err(index) => last_miss = index,
                }
            }
            slabs.len()
        };
        if !request.allow_out_of_range {
            return Err(self.out_of_reservation(request, last_miss));
        }
        let shared = &self.shared;
        let _grow = shared.grow.lock();
        // Slabs another thread added while this one waited.
        let newer: Vec<Arc<Slab>> = shared.slabs.read()[seen..].to_vec();
        for slab in newer {
            if let Ok(placed) = Self::place_in(&slab, request)? {
                return Ok(self.in_flight(slab, request, placed.iter().map(|p| p.target)));
            }
        }
        let slab = match Slab::reserve(
            shared.mapper.clone(),
            shared.layout,
            shared.tuning,
            &shared.placement,
            shared.id,
        ) {
            Ok(slab) => slab,
            Err(_) => Slab::reserve(
                shared.mapper.clone(),
                shared.layout,
                shared.tuning,
                &Placement::Anywhere,
                shared.id,
            )?,
        };
        let slab = Arc::new(slab);
        match Self::place_in(&slab, request)? {
            Ok(placed) => {
                shared.slabs.write().push(slab.clone());
                Ok(self.in_flight(slab, request, placed.iter().map(|p| p.target)))
            }
            Err(index) => Err(self.out_of_reservation(request, index)),
        }
    }

    /// The calling thread's cached free ranges of this manager go back to their arenas
    /// first, so that one thread's figures are exact; other threads' cached ranges count
    /// as free.
    fn stats(&self) -> MemoryStats {
        thread_cache::flush(self.shared.id);
        let mut stats = MemoryStats::default();
        let mut resident = Some(0);
        for slab in self.slabs() {
            stats.slabs += 1;
            stats.bytes_reserved += slab.reservation.len;
            resident = resident
                .zip(self.shared.mapper.resident_bytes(&slab.reservation))
                .map(|(a, b)| a + b);
            for f in slab.pool_figures() {
                let pool: &mut PoolStats = &mut stats.pools[f.permission.index()];
                pool.reserved += f.len;
                pool.prepared += f.prepared;
                pool.free += f.free;
                pool.largest_free = pool.largest_free.max(f.largest_free);
                pool.free_ranges += f.free_ranges;
                pool.arenas += 1;
                stats.live_allocations += f.allocations;
                stats.cache_hits += f.cache_hits;
                stats.bytes_requested += f.requested;
                stats.bytes_allocated += f.len - f.free;
                stats.bytes_mapped += f.prepared;
                stats.bytes_free += f.free;
                stats.largest_free_range = stats.largest_free_range.max(f.largest_free);
            }
        }
        stats.bytes_resident = resident;
        stats
    }
}

/// The CPUs this thread may run on (`sched_getaffinity`), at least 1. Not
/// `std::thread::available_parallelism`, which also reads the cgroup's CPU quota from
/// `/proc` and `/sys` (six system calls at every session's start, for an arena count that
/// only needs the cores the threads can use).
fn usable_cpus() -> usize {
    // SAFETY: an all-zero cpu_set_t is a valid (empty) set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a writable cpu_set_t of the size passed.
    let status =
        unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) };
    if status != 0 {
        return 1;
    }
    // SAFETY: `set` was filled by sched_getaffinity.
    (unsafe { libc::CPU_COUNT(&set) }).max(1) as usize
}
