//! Every failure path returns a typed error and leaks nothing; what was finalized before
//! keeps running. Also: a client mapper (the fault-injecting one) and a client manager.

mod common;

use common::*;
use kiln_memory::*;
use std::sync::Arc;

fn small_layout() -> SlabLayout {
    SlabLayout {
        read_execute: 1 << 20,
        read: 256 << 10,
        read_write: 256 << 10,
    }
}

fn faulty(dual: bool) -> Arc<FaultyMapper> {
    let inner: Arc<dyn Mapper> = if dual {
        Arc::new(DualMappedMapper::new().unwrap())
    } else {
        Arc::new(InProcessMapper::new())
    };
    Arc::new(FaultyMapper::new(inner))
}

fn manager_on(mapper: &Arc<FaultyMapper>) -> Result<SlabMemoryManager, MemoryError> {
    SlabMemoryManager::builder()
        .mapper(mapper.clone())
        .layout(small_layout())
        .prepare_chunk(64 << 10)
        .release_threshold(64 << 10)
        .build()
}

fn code(value: u32) -> AllocationRequest {
    let _ = value;
    AllocationRequest::new()
        .segment(SegmentRequest::new(Permission::ReadExecute, 64, 16))
        .segment(SegmentRequest::new(Permission::ReadWrite, 16, 8).zero_filled())
}

fn make(manager: &SlabMemoryManager, value: u32) -> Result<FinalizedAllocation, MemoryError> {
    let mut in_flight = manager.allocate(&code(value))?;
    let bytes = return_const(value);
    in_flight.working_memory(0).unwrap()[..bytes.len()].copy_from_slice(&bytes);
    in_flight.finalize()
}

fn assert_clean(manager: &SlabMemoryManager, live: u64) {
    let stats = manager.stats();
    assert_eq!(stats.live_allocations, live);
    if live == 0 {
        assert_eq!(stats.bytes_allocated, 0);
        for p in Permission::ALL {
            assert_eq!(
                stats.pool(p).free,
                stats.pool(p).reserved,
                "{p} pool not all free"
            );
            assert_eq!(
                stats.pool(p).free_ranges,
                stats.pool(p).arenas,
                "{p}: one free range per arena"
            );
        }
    }
}

#[test]
fn reserve_failure_at_build_is_an_error_and_reserves_nothing() {
    for dual in [true, false] {
        let mapper = faulty(dual);
        mapper.fail(Op::Reserve, 0);
        let err = manager_on(&mapper).unwrap_err();
        assert!(
            matches!(
                err,
                MemoryError::Mapper {
                    mapper: "faulty",
                    ..
                }
            ),
            "{err}"
        );
        assert!(err.to_string().contains("injected fault"), "{err}");
        assert_eq!(mapper.live_reservations(), 0);
    }
}

#[test]
fn prepare_failure_is_an_error_and_leaves_earlier_code_running() {
    for dual in [true, false] {
        let mapper = faulty(dual);
        let manager = manager_on(&mapper).unwrap();
        let first = make(&manager, 11).unwrap();
        let prepared_before = manager.stats().bytes_mapped;
        // Allocate until a prepare is needed, failing it.
        mapper.fail(Op::Prepare, 0);
        let mut kept = Vec::new();
        let err = loop {
            match make(&manager, 12) {
                Ok(f) => kept.push(f),
                Err(e) => break e,
            }
        };
        assert!(err.to_string().contains("prepare refused"), "{err}");
        assert_eq!(manager.stats().live_allocations, 1 + kept.len() as u64);
        assert!(manager.stats().bytes_mapped >= prepared_before);
        // SAFETY: live code.
        assert_eq!(unsafe { call(first.target(0).unwrap()) }, 11);
        // The next attempt succeeds: nothing is stuck.
        let again = make(&manager, 13).unwrap();
        // SAFETY: live code.
        assert_eq!(unsafe { call(again.target(0).unwrap()) }, 13);
        drop((first, again, kept));
        assert_clean(&manager, 0);
        drop(manager);
        assert_eq!(mapper.live_reservations(), 0, "slab released");
        assert_eq!(
            mapper.prepared.load(std::sync::atomic::Ordering::SeqCst),
            0,
            "pages returned"
        );
    }
}

#[test]
fn initialize_failure_frees_the_allocation() {
    for dual in [true, false] {
        let mapper = faulty(dual);
        let manager = manager_on(&mapper).unwrap();
        let first = make(&manager, 21).unwrap();
        mapper.fail(Op::Initialize, 0);
        let err = make(&manager, 22).unwrap_err();
        assert!(err.to_string().contains("initialize refused"), "{err}");
        assert_clean(&manager, 1);
        // SAFETY: live code.
        assert_eq!(unsafe { call(first.target(0).unwrap()) }, 21);
        drop(first);
        assert_clean(&manager, 0);
    }
}

#[test]
fn deinitialize_failure_is_reported_and_the_memory_stays_usable() {
    for dual in [true, false] {
        let mapper = faulty(dual);
        let manager = manager_on(&mapper).unwrap();
        // Enough code to need whole pages back on free.
        let request = AllocationRequest::new().segment(SegmentRequest::new(
            Permission::ReadExecute,
            128 << 10,
            16,
        ));
        let a = manager.allocate(&request).unwrap().finalize().unwrap();
        mapper.fail(Op::Deinitialize, 0);
        let err = a.free().unwrap_err();
        assert!(err.to_string().contains("deinitialize refused"), "{err}");
        assert_clean(&manager, 0);
        let again = make(&manager, 31).unwrap();
        // SAFETY: live code.
        assert_eq!(unsafe { call(again.target(0).unwrap()) }, 31);
    }
}

#[test]
fn release_failure_is_logged_not_fatal() {
    let mapper = faulty(true);
    let manager = manager_on(&mapper).unwrap();
    mapper.fail(Op::Release, 0);
    drop(manager);
    assert_eq!(mapper.calls(Op::Release), 1);
}

#[test]
fn out_of_reservation_is_an_error_unless_out_of_range_is_allowed() {
    for dual in [true, false] {
        let mapper = faulty(dual);
        let manager = manager_on(&mapper).unwrap();
        let big = AllocationRequest::new().segment(SegmentRequest::new(
            Permission::ReadExecute,
            700 << 10,
            16,
        ));
        let a = manager.allocate(&big).unwrap().finalize().unwrap();
        let err = manager.allocate(&big).unwrap_err();
        match &err {
            MemoryError::OutOfReservation {
                segment: 0,
                permission: Permission::ReadExecute,
                largest_free,
                ..
            } => {
                assert!(*largest_free < 700 << 10)
            }
            other => panic!("unexpected {other}"),
        }
        assert_eq!(mapper.live_reservations(), 1);
        // Allowed: a second slab.
        let b = manager
            .allocate(&big.clone().allow_out_of_range(true))
            .unwrap()
            .finalize()
            .unwrap();
        assert_eq!(mapper.live_reservations(), 2);
        assert_eq!(manager.stats().slabs, 2);
        // A reserve failure while growing is an error; nothing leaks, nothing lost.
        mapper.fail(Op::Reserve, 0);
        mapper.fail(Op::Reserve, 1);
        let err = manager.allocate(&big.clone().allow_out_of_range(true));
        assert!(err.is_err());
        // Larger than any pool: an error even when growth is allowed, found before any
        // slab is reserved.
        let reserves = mapper.calls(Op::Reserve);
        let huge = AllocationRequest::new()
            .segment(SegmentRequest::new(Permission::ReadExecute, 2 << 20, 16))
            .allow_out_of_range(true);
        let err = manager.allocate(&huge).unwrap_err();
        assert!(
            matches!(err, MemoryError::SegmentTooLarge { max: 0x100000, .. }),
            "{err}"
        );
        assert_eq!(mapper.calls(Op::Reserve), reserves);
        assert_eq!(mapper.live_reservations(), 2);
        drop((a, b));
        assert_clean(&manager, 0);
        drop(manager);
        assert_eq!(mapper.live_reservations(), 0);
    }
}

#[test]
fn invalid_requests_are_typed_errors() {
    let manager = SlabMemoryManager::builder()
        .layout(small_layout())
        .build()
        .unwrap();
    let one = |s: SegmentRequest| {
        manager
            .allocate(&AllocationRequest::new().segment(s))
            .unwrap_err()
    };
    assert!(matches!(
        one(SegmentRequest::new(Permission::Read, 16, 3)),
        MemoryError::InvalidAlignment {
            segment: 0,
            align: 3
        }
    ));
    assert!(matches!(
        one(SegmentRequest::new(Permission::Read, 16, 0)),
        MemoryError::InvalidAlignment { .. }
    ));
    assert!(matches!(
        one(SegmentRequest::new(Permission::Read, 16, 1 << 40)),
        MemoryError::AlignmentTooLarge { .. }
    ));
    assert!(matches!(
        one(SegmentRequest::new(Permission::ReadWrite, u64::MAX - 2, 16)),
        MemoryError::SizeOverflow { .. }
    ));
    assert!(matches!(
        one(SegmentRequest::new(Permission::ReadWrite, 1 << 40, 16)),
        MemoryError::SegmentTooLarge { .. }
    ));
    // Fits an arena but not what is left: out of reservation.
    let most = manager
        .allocate(&AllocationRequest::new().segment(SegmentRequest::new(
            Permission::ReadWrite,
            200 << 10,
            16,
        )))
        .unwrap();
    assert!(matches!(
        one(SegmentRequest::new(Permission::ReadWrite, 100 << 10, 16)),
        MemoryError::OutOfReservation { .. }
    ));
    drop(most);
    // Impossible configurations are errors, not panics or overlapping pools.
    for layout in [
        SlabLayout {
            read_execute: 1 << 63,
            read: 1 << 63,
            read_write: 1 << 20,
        },
        SlabLayout {
            read_execute: 0,
            read: 4096,
            read_write: 4096,
        },
    ] {
        let err = SlabMemoryManager::builder()
            .layout(layout)
            .build()
            .unwrap_err();
        assert!(matches!(err, MemoryError::InvalidConfiguration(_)), "{err}");
    }
    let odd = SlabMemoryManager::builder()
        .layout(small_layout())
        .prepare_chunk(u64::MAX)
        .release_threshold(u64::MAX)
        .mapper(Arc::new(InProcessMapper::new()))
        .build()
        .unwrap();
    let a = odd
        .allocate(&AllocationRequest::new().segment(SegmentRequest::new(
            Permission::ReadWrite,
            16,
            16,
        )))
        .unwrap();
    let b = odd
        .allocate(&AllocationRequest::new().segment(SegmentRequest::new(
            Permission::ReadWrite,
            16,
            16,
        )))
        .unwrap();
    drop(a);
    drop(b);
    assert_clean(&odd, 0);
    assert!(matches!(
        manager.allocate(&AllocationRequest::new()),
        Err(MemoryError::EmptyRequest)
    ));
    assert_clean(&manager, 0);
}

#[test]
fn placement_low_2gib_and_near_host_libraries() {
    for mapper in [
        Arc::new(DualMappedMapper::new().unwrap()) as Arc<dyn Mapper>,
        Arc::new(InProcessMapper::new()),
    ] {
        let low = SlabMemoryManager::builder()
            .mapper(mapper.clone())
            .layout(small_layout())
            .placement(Placement::Low2GiB)
            .build()
            .unwrap();
        for (start, end) in low.slab_ranges() {
            assert!(end <= 1 << 31, "{start:#x}..{end:#x} not in the low 2 GiB");
        }
        let near = SlabMemoryManager::builder()
            .mapper(mapper.clone())
            .build()
            .unwrap();
        // libc's data (`stdout`) must be reachable with a 32-bit PC-relative displacement.
        extern "C" {
            static stdout: *mut libc::FILE;
        }
        let stdout_addr = std::ptr::addr_of!(stdout) as u64;
        for (start, end) in near.slab_ranges() {
            assert!(stdout_addr.abs_diff(start) < 1 << 31 && stdout_addr.abs_diff(end) < 1 << 31);
        }
        // A placement that cannot be met says so.
        let err = SlabMemoryManager::builder()
            .mapper(mapper)
            .placement(Placement::Near {
                start: 0x1000,
                end: 0x7ff0_0000_0000,
            })
            .build()
            .unwrap_err();
        assert!(err.to_string().contains("no free address range"), "{err}");
    }
}

/// A client memory manager: one anonymous mapping per segment, the strategy of a naive
/// JIT. Shows that [`MemoryManager`] and the backend traits are enough to plug one in.
struct MmapPerSegment;

struct MmapBackend {
    maps: Vec<(usize, usize)>,
}

impl InFlightBackend for MmapBackend {
    fn finalize(
        self: Box<Self>,
        segments: &[SegmentRange],
    ) -> Result<Box<dyn FinalizedBackend>, MemoryError> {
        for (s, &(addr, len)) in segments.iter().zip(&self.maps) {
            let prot = match s.permission {
                Permission::ReadExecute => libc::PROT_READ | libc::PROT_EXEC,
                Permission::Read => libc::PROT_READ,
                Permission::ReadWrite => libc::PROT_READ | libc::PROT_WRITE,
            };
            // SAFETY: our own mapping, no longer borrowed as working memory.
            if unsafe { libc::mprotect(addr as *mut _, len, prot) } != 0 {
                return Err(MemoryError::Mapper {
                    mapper: "mmap-per-segment",
                    source: MapperError::last_os_error("mprotect", addr as u64, len as u64),
                });
            }
        }
        Ok(self)
    }
    fn abandon(self: Box<Self>, _: &[SegmentRange]) {}
}

impl FinalizedBackend for MmapBackend {
    fn free(self: Box<Self>, _: &[SegmentRange]) -> Result<(), MemoryError> {
        Ok(())
    }
}

impl Drop for MmapBackend {
    fn drop(&mut self) {
        for &(addr, len) in &self.maps {
            // SAFETY: our own mapping; nothing refers to it any more.
            unsafe { libc::munmap(addr as *mut _, len) };
        }
    }
}

impl MemoryManager for MmapPerSegment {
    fn allocate(&self, request: &AllocationRequest) -> Result<InFlightAllocation, MemoryError> {
        let mut maps = Vec::new();
        let mut segments = Vec::new();
        for s in request.segments() {
            let len = (s.size as usize).max(1).next_multiple_of(4096);
            // SAFETY: a fresh anonymous mapping.
            let ptr = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    len,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                    -1,
                    0,
                )
            };
            if ptr == libc::MAP_FAILED {
                drop(MmapBackend { maps });
                return Err(MemoryError::Mapper {
                    mapper: "mmap-per-segment",
                    source: MapperError::last_os_error("mmap", 0, len as u64),
                });
            }
            maps.push((ptr as usize, len));
            segments.push(WorkingSegment::new(
                ptr as u64,
                s.size,
                s.permission,
                ptr as *mut u8,
            ));
        }
        // SAFETY: each segment is a fresh private mapping of at least its size, ours alone.
        Ok(unsafe { InFlightAllocation::from_parts(segments, Box::new(MmapBackend { maps })) })
    }
}

#[test]
fn a_client_memory_manager_plugs_in() {
    let managers: Vec<Box<dyn MemoryManager>> = vec![
        Box::new(MmapPerSegment),
        Box::new(SlabMemoryManager::new().unwrap()),
    ];
    for manager in managers {
        let bytes = return_const(77);
        let mut in_flight = manager.allocate(&code(77)).unwrap();
        in_flight.working_memory(0).unwrap()[..bytes.len()].copy_from_slice(&bytes);
        let f = in_flight.finalize().unwrap();
        // SAFETY: the function written above.
        assert_eq!(unsafe { call(f.target(0).unwrap()) }, 77);
    }
}
