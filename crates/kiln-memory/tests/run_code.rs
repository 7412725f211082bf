//! Real machine code written through the manager and called, with both mappers; freed code
//! traps; W^X holds throughout.

mod common;

use common::*;
use kiln_memory::*;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

fn managers() -> Vec<(&'static str, SlabMemoryManager)> {
    vec![
        (
            "dual-mapped",
            SlabMemoryManager::builder()
                .mapper(Arc::new(DualMappedMapper::new().expect("memfd mapper")))
                .build()
                .unwrap(),
        ),
        (
            "in-process",
            SlabMemoryManager::builder()
                .mapper(Arc::new(InProcessMapper::new()))
                .build()
                .unwrap(),
        ),
    ]
}

fn code_request(len: usize) -> AllocationRequest {
    AllocationRequest::new()
        .segment(SegmentRequest::new(Permission::ReadExecute, len as u64, 16))
        .segment(SegmentRequest::new(Permission::Read, 8, 8))
        .segment(SegmentRequest::new(Permission::ReadWrite, 64, 8).zero_filled())
}

#[test]
fn code_written_through_the_manager_runs_in_both_mappers() {
    for (name, manager) in managers() {
        let mut modules = Vec::new();
        for i in 0..200u32 {
            let code = return_const(i * 7 + 1);
            let mut in_flight = manager.allocate(&code_request(code.len())).unwrap();
            in_flight.working_memory(0).unwrap().copy_from_slice(&code);
            in_flight
                .working_memory(1)
                .unwrap()
                .copy_from_slice(&(i as u64).to_le_bytes());
            assert!(
                in_flight.working_memory(2).unwrap().iter().all(|&b| b == 0),
                "{name}: zero fill"
            );
            let finalized = in_flight.finalize().unwrap();
            modules.push((i, finalized));
        }
        for (i, m) in &modules {
            // SAFETY: segment 0 holds the function written above.
            assert_eq!(unsafe { call(m.target(0).unwrap()) }, i * 7 + 1, "{name}");
            // SAFETY: the read-only segment is mapped readable.
            assert_eq!(unsafe { *(m.target(1).unwrap() as *const u64) }, *i as u64);
        }
        let stats = manager.stats();
        assert_eq!(stats.live_allocations, 200, "{name}");
        assert!(wx_mappings().is_empty(), "{name}: {:?}", wx_mappings());
        drop(modules);
        let stats = manager.stats();
        assert_eq!(stats.live_allocations, 0);
        assert_eq!(stats.bytes_allocated, 0);
        for p in Permission::ALL {
            assert_eq!(
                stats.pool(p).free_ranges,
                stats.pool(p).arenas,
                "{name} {p}: one free range per arena after freeing all"
            );
            assert_eq!(stats.pool(p).free, stats.pool(p).reserved);
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[test]
fn code_reads_its_constants_across_segments() {
    for (name, manager) in managers() {
        let mut in_flight = manager.allocate(&code_request(32)).unwrap();
        let data = in_flight.target(1).unwrap();
        let code = add_constant_at(data);
        {
            let mut segments = in_flight.segments_mut();
            segments[0].bytes[..code.len()].copy_from_slice(&code);
            segments[1].bytes.copy_from_slice(&1000u64.to_le_bytes());
        }
        let finalized = in_flight.finalize().unwrap();
        // SAFETY: the function takes and returns u64 with the C ABI.
        let f: extern "C" fn(u64) -> u64 =
            unsafe { std::mem::transmute(finalized.target(0).unwrap() as usize) };
        assert_eq!(f(234), 1234, "{name}");
    }
}

#[test]
fn sections_of_many_modules_share_pages_with_the_dual_mapper() {
    let manager = SlabMemoryManager::builder()
        .mapper(Arc::new(DualMappedMapper::new().unwrap()))
        .build()
        .unwrap();
    let a = manager
        .allocate(&code_request(100))
        .unwrap()
        .finalize()
        .unwrap();
    let b = manager
        .allocate(&code_request(100))
        .unwrap()
        .finalize()
        .unwrap();
    let page = manager.mapper().page_size();
    assert_eq!(a.target(0).unwrap() / page, b.target(0).unwrap() / page);
    assert_eq!(a.target(2).unwrap() / page, b.target(2).unwrap() / page);
}

#[test]
fn finalized_code_outlives_the_manager() {
    for (name, manager) in managers() {
        let code = return_const(99);
        let mut in_flight = manager.allocate(&code_request(code.len())).unwrap();
        in_flight.working_memory(0).unwrap().copy_from_slice(&code);
        let finalized = in_flight.finalize().unwrap();
        drop(manager);
        // SAFETY: the allocation keeps its slab alive.
        assert_eq!(unsafe { call(finalized.target(0).unwrap()) }, 99, "{name}");
        // The handle is Send: call from another thread, free there.
        std::thread::spawn(move || {
            // SAFETY: as above.
            assert_eq!(unsafe { call(finalized.target(0).unwrap()) }, 99);
            drop(finalized);
        })
        .join()
        .unwrap();
    }
}

#[test]
fn no_mapping_is_ever_writable_and_executable() {
    for (name, manager) in managers() {
        let stop = Arc::new(AtomicBool::new(false));
        let watcher = {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut checks = 0u64;
                while !stop.load(Ordering::Relaxed) || checks == 0 {
                    let wx = wx_mappings();
                    assert!(wx.is_empty(), "writable+executable mapping: {wx:?}");
                    checks += 1;
                }
                checks
            })
        };
        let mut live = Vec::new();
        for i in 0..2000u32 {
            let code = return_const(i);
            let mut in_flight = manager
                .allocate(&code_request(code.len() + (i as usize % 5000)))
                .unwrap();
            in_flight.working_memory(0).unwrap()[..code.len()].copy_from_slice(&code);
            let finalized = in_flight.finalize().unwrap();
            // SAFETY: the function written above.
            assert_eq!(unsafe { call(finalized.target(0).unwrap()) }, i);
            live.push(finalized);
            if i % 3 == 0 {
                live.swap_remove((i as usize * 7) % live.len());
            }
        }
        stop.store(true, Ordering::Relaxed);
        let checks = watcher.join().unwrap();
        assert!(checks > 0, "{name}");
        assert!(wx_mappings().is_empty());
    }
}

#[test]
fn two_threads_allocate_finalize_call_and_free_at_once() {
    for (name, manager) in managers() {
        let threads: Vec<_> = (0..2u32)
            .map(|t| {
                let manager = manager.clone();
                std::thread::spawn(move || {
                    let mut live: Vec<(u32, FinalizedAllocation)> = Vec::new();
                    for i in 0..3000u32 {
                        let value = t * 1_000_000 + i;
                        let code = return_const(value);
                        let mut in_flight = manager
                            .allocate(&code_request(code.len() + (i as usize * 37) % 3000))
                            .unwrap();
                        in_flight.working_memory(0).unwrap()[..code.len()].copy_from_slice(&code);
                        let f = in_flight.finalize().unwrap();
                        live.push((value, f));
                        if live.len() > 64 {
                            let (v, f) = live.swap_remove((i as usize * 31) % live.len());
                            // SAFETY: the function written above, still live.
                            assert_eq!(unsafe { call(f.target(0).unwrap()) }, v);
                        }
                    }
                    for (v, f) in &live {
                        // SAFETY: as above.
                        assert_eq!(unsafe { call(f.target(0).unwrap()) }, *v);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let stats = manager.stats();
        assert_eq!(stats.live_allocations, 0, "{name}");
        for p in Permission::ALL {
            assert_eq!(
                stats.pool(p).free_ranges,
                stats.pool(p).arenas,
                "{name} {p}"
            );
        }
    }
}

/// Runs in a child process: calls code after freeing it, which must trap.
#[test]
fn stale_call_child() {
    let Ok(mapper) = std::env::var("KILN_STALE_CALL_MAPPER") else {
        return; // only meaningful in the child started below
    };
    let mapper: Arc<dyn Mapper> = match mapper.as_str() {
        "dual-mapped" => Arc::new(DualMappedMapper::new().unwrap()),
        _ => Arc::new(InProcessMapper::new()),
    };
    let manager = SlabMemoryManager::builder().mapper(mapper).build().unwrap();
    // A neighbour keeps the page in use, so the freed range is poisoned, not unmapped.
    let keep = manager
        .allocate(&code_request(16))
        .unwrap()
        .finalize()
        .unwrap();
    let code = return_const(5);
    let mut in_flight = manager.allocate(&code_request(code.len())).unwrap();
    in_flight.working_memory(0).unwrap().copy_from_slice(&code);
    let f = in_flight.finalize().unwrap();
    let addr = f.target(0).unwrap();
    // SAFETY: live code.
    assert_eq!(unsafe { call(addr) }, 5);
    drop(f);
    eprintln!("calling freed code");
    // SAFETY: deliberately unsound in the child: freed code must trap, killing it.
    let v = unsafe { call(addr) };
    eprintln!("freed code returned {v}");
    drop(keep);
    std::process::exit(0);
}

#[test]
fn a_stale_call_into_freed_code_traps() {
    use std::os::unix::process::ExitStatusExt;
    for mapper in ["dual-mapped", "in-process"] {
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "stale_call_child",
                "--nocapture",
                "--test-threads=1",
            ])
            .env("KILN_STALE_CALL_MAPPER", mapper)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains("calling freed code"), "{mapper}: {stderr}");
        let signal = out.status.signal();
        assert!(
            matches!(signal, Some(libc_sig) if libc_sig == 5 || libc_sig == 11 || libc_sig == 4),
            "{mapper}: expected SIGTRAP/SIGSEGV/SIGILL, got {:?}; stderr: {stderr}",
            out.status
        );
    }
}

#[test]
fn a_full_arena_falls_back_to_another_and_one_segment_must_fit_an_arena() {
    let layout = SlabLayout {
        read_execute: 128 << 20,
        read: 4 << 20,
        read_write: 4 << 20,
    };
    let code = |mib: u64| {
        AllocationRequest::new().segment(SegmentRequest::new(
            Permission::ReadExecute,
            mib << 20,
            16,
        ))
    };
    let two = SlabMemoryManager::builder()
        .layout(layout)
        .arenas(2)
        .build()
        .unwrap();
    assert_eq!(two.stats().pool(Permission::ReadExecute).arenas, 2);
    let a = two.allocate(&code(40)).unwrap();
    let b = two.allocate(&code(40)).unwrap();
    let half = two.slab_ranges()[0].0 + (64 << 20);
    assert!(
        (a.target(0).unwrap() < half) != (b.target(0).unwrap() < half),
        "the second 40 MiB segment must go to the other arena"
    );
    drop((a, b));
    assert!(matches!(
        two.allocate(&code(70)),
        Err(MemoryError::SegmentTooLarge { .. })
    ));
    let one = SlabMemoryManager::builder()
        .layout(layout)
        .arenas(1)
        .build()
        .unwrap();
    assert!(one.allocate(&code(70)).is_ok());
}

/// Writes `bytes` at `address` as a debugger does: through `/proc/self/mem`, which the
/// kernel lets write to read-only pages (a copy of a private page; a shared page refuses).
fn debugger_write(address: u64, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::{Seek, SeekFrom, Write};
    let mut mem = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/proc/self/mem")?;
    mem.seek(SeekFrom::Start(address))?;
    mem.write_all(bytes)
}

/// A finalized allocation whose code returns `value`.
fn returning(manager: &SlabMemoryManager, value: u32) -> FinalizedAllocation {
    let mut in_flight = manager
        .allocate(&code_request(return_const(0).len()))
        .unwrap();
    in_flight
        .working_memory(0)
        .unwrap()
        .copy_from_slice(&return_const(value));
    in_flight.finalize().unwrap()
}

#[test]
fn a_debuggable_dual_mapped_mapper_takes_breakpoints_and_drops_them_with_freed_pages() {
    let shared = Arc::new(DualMappedMapper::new().expect("memfd mapper"));
    let private = Arc::new(
        DualMappedMapper::new()
            .expect("memfd mapper")
            .with_private_target(true),
    );
    assert!(shared.shares_pages() && !private.shares_pages());
    let int3 = [0xccu8];
    // Shared target view: a debugger's write is refused.
    let manager = SlabMemoryManager::builder().mapper(shared).build().unwrap();
    let module = returning(&manager, 5);
    let f = module.target(0).unwrap();
    assert!(debugger_write(f, &int3).is_err(), "shared pages refuse it");
    drop(module);
    // Private target view: the write lands in the process's copy, the code runs again
    // once the original byte is back, and freeing the pages drops the copy: code written
    // there later is seen.
    let manager = SlabMemoryManager::builder()
        .mapper(private)
        .build()
        .unwrap();
    let module = returning(&manager, 5);
    let f = module.target(0).unwrap();
    // SAFETY: the target view is readable.
    let original = unsafe { *(f as *const u8) };
    debugger_write(f, &int3).expect("a private page takes a breakpoint");
    // SAFETY: as above.
    assert_eq!(unsafe { *(f as *const u8) }, 0xcc);
    debugger_write(f, &[original]).unwrap();
    // SAFETY: segment 0 holds the function written above, restored.
    assert_eq!(unsafe { call(f) }, 5);
    debugger_write(f, &int3).unwrap(); // left in, as a breakpoint never removed
    drop(module);
    let mut seen = false;
    for _ in 0..64 {
        let module = returning(&manager, 9);
        let g = module.target(0).unwrap();
        // SAFETY: segment 0 holds the function just written.
        assert_eq!(unsafe { call(g) }, 9, "new code is seen, not a stale copy");
        seen |= g == f;
        if seen {
            break;
        }
    }
    assert!(seen, "the freed pages were reused");
    // Data stays shared: what the program writes at a data segment's target and what the
    // working view writes for the next allocation on the same page are one memory.
    let mut modules = Vec::new();
    for i in 0..8u64 {
        let mut in_flight = manager
            .allocate(&code_request(return_const(0).len()))
            .unwrap();
        in_flight
            .working_memory(0)
            .unwrap()
            .copy_from_slice(&return_const(1));
        in_flight.working_memory(2).unwrap()[..8].copy_from_slice(&(100 + i).to_le_bytes());
        let module = in_flight.finalize().unwrap();
        let data = module.target(2).unwrap();
        // SAFETY: segment 2 is read-write data of a live allocation.
        unsafe {
            assert_eq!(
                *(data as *const u64),
                100 + i,
                "the working view's write is seen"
            );
            *(data as *mut u64) += 1000; // the program writes its data
            assert_eq!(*(data as *const u64), 1100 + i);
        }
        modules.push((module, data, i));
    }
    for (_, data, i) in &modules {
        // SAFETY: as above.
        assert_eq!(unsafe { *(*data as *const u64) }, 1100 + i, "no write lost");
    }
}
