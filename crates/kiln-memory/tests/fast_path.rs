//! The allocator's fast path: an allocation that fits a range this thread freed takes it
//! from the thread's cache, with no lock and no heap allocation, and the code written
//! there runs; what the cache holds is free in the figures and goes back to the arenas
//! when asked for figures or when the thread exits.

mod common;

use common::*;
use kiln_memory::*;
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::Arc;

/// Counts heap allocations per thread (the tests run in parallel).
struct Counting;

thread_local! {
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
}

fn allocations() -> u64 {
    ALLOCATIONS.with(Cell::get)
}

fn count() {
    // `try_with`: a thread's last frees may come after its locals are gone.
    let _ = ALLOCATIONS.try_with(|n| n.set(n.get() + 1));
}

// SAFETY: forwards to the system allocator, only counting.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count();
        // SAFETY: the caller's contract, passed on.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract, passed on.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count();
        // SAFETY: the caller's contract, passed on.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

fn manager() -> SlabMemoryManager {
    SlabMemoryManager::builder()
        .mapper(Arc::new(DualMappedMapper::new().expect("memfd mapper")))
        .build()
        .unwrap()
}

/// Allocates code and data, writes a function returning `value`, finalizes and calls it.
fn make(manager: &SlabMemoryManager, len: usize, value: u32) -> FinalizedAllocation {
    make_from(manager, len, &return_const(value), value)
}

/// As [`make`], with the function's machine code made beforehand.
fn make_from(
    manager: &SlabMemoryManager,
    len: usize,
    code: &[u8],
    value: u32,
) -> FinalizedAllocation {
    let request = AllocationRequest::new()
        .segment(SegmentRequest::new(
            Permission::ReadExecute,
            len.max(code.len()) as u64,
            16,
        ))
        .segment(SegmentRequest::new(Permission::ReadWrite, 64, 8).zero_filled());
    let mut in_flight = manager.allocate(&request).unwrap();
    in_flight.working_memory(0).unwrap()[..code.len()].copy_from_slice(code);
    assert!(in_flight.working_memory(1).unwrap().iter().all(|&b| b == 0));
    in_flight.working_memory(1).unwrap().fill(0x5a); // dirty it: the next user must get zeros
    let f = in_flight.finalize().unwrap();
    // SAFETY: the function just written.
    assert_eq!(unsafe { call(f.target(0).unwrap()) }, value);
    f
}

#[test]
fn a_freed_range_comes_back_without_a_heap_allocation() {
    let manager = manager();
    let mut live: Vec<FinalizedAllocation> = (0..64).map(|i| make(&manager, 80, i)).collect();
    // Warm: the thread's cache and its tables reach their size.
    for i in 0..256u32 {
        drop(live.swap_remove((i as usize * 7) % live.len()));
        live.push(make(&manager, 80, 1000 + i));
    }
    let rounds = 2000u32;
    // The functions' machine code, made before counting (the helper allocates).
    let codes: Vec<Vec<u8>> = (0..rounds).map(|i| return_const(5000 + i)).collect();
    let hits_before = manager.stats().cache_hits;
    let mut allocated = 0;
    for i in 0..rounds {
        // Free (into this thread's cache), then ask for the same sizes: they fit.
        drop(live.swap_remove((i as usize * 13) % live.len()));
        let before = allocations();
        let f = make_from(&manager, 80, &codes[i as usize], 5000 + i);
        allocated += allocations() - before;
        live.push(f);
    }
    let hits = manager.stats().cache_hits - hits_before;
    assert_eq!(
        hits,
        2 * u64::from(rounds),
        "every segment of every round from the thread's cache"
    );
    assert_eq!(
        allocated, 0,
        "{allocated} heap allocations in {rounds} allocations from the cache (allocate, \
         write, finalize, call)"
    );
    for (i, f) in live.iter().enumerate() {
        // SAFETY: each function is live; its value is one `make` above wrote.
        let v = unsafe { call(f.target(0).unwrap()) };
        assert!(v >= 1000, "slot {i} returned {v}");
    }
}

#[test]
fn cached_ranges_count_as_free_and_go_back_when_the_thread_exits() {
    let manager = manager();
    let worker = {
        let manager = manager.clone();
        std::thread::spawn(move || {
            let kept: Vec<_> = (0..8).map(|i| make(&manager, 256, i)).collect();
            drop(kept); // into this thread's cache
            let stats = manager.stats(); // flushes this thread's cache
            assert_eq!(stats.live_allocations, 0);
            let kept: Vec<_> = (0..8).map(|i| make(&manager, 256, i)).collect();
            drop(kept); // cached again; the thread exits holding them
        })
    };
    worker.join().unwrap();
    let stats = manager.stats();
    assert_eq!(stats.live_allocations, 0);
    assert_eq!(stats.bytes_requested, 0);
    for p in Permission::ALL {
        let pool = stats.pool(p);
        assert_eq!(pool.free, pool.reserved, "{p}: everything free");
        // Joined again on the arena's free list: nothing stayed behind in a cache.
        assert_eq!(pool.free_ranges, pool.arenas, "{p}");
        assert_eq!(pool.prepared, 0, "{p}: whole pages went back");
    }
}

#[test]
fn a_stale_call_into_a_cached_range_still_finds_trap_bytes() {
    let manager = manager();
    let f = make(&manager, 64, 7);
    let target = f.target(0).unwrap();
    // Into this thread's cache, poisoned first.
    drop(f);
    // SAFETY: the range is still mapped readable (a shared page of a live pool).
    let first = unsafe { std::ptr::read_volatile(target as *const u8) };
    assert_eq!(
        first, TRAP_PATTERN[0],
        "freed code holds trap bytes while cached"
    );
    let g = make(&manager, 64, 8);
    assert_eq!(g.target(0), Some(target), "the cached range is reused");
}

#[test]
fn ranges_of_a_dropped_manager_are_forgotten_not_reused() {
    let first = manager();
    let f = make(&first, 64, 1);
    drop(first);
    drop(f); // the slab goes with its last allocation; the cache keeps no reference
    let second = manager();
    let g = make(&second, 64, 2);
    assert_eq!(second.stats().live_allocations, 1);
    drop(g);
    assert_eq!(second.stats().live_allocations, 0);
}
