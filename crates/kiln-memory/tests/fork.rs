//! A forked child gets its own copy of dual-mapped JIT memory, as it gets its own copy of
//! a native program's code and data: what the child writes, frees (trap-filled) or links
//! anew never reaches the parent.

mod common;

use common::*;
use kiln_memory::*;
use std::sync::Arc;

#[test]
fn a_forked_child_cannot_touch_the_parents_code_or_data() {
    let manager = SlabMemoryManager::builder()
        .mapper(Arc::new(DualMappedMapper::new().expect("memfd mapper")))
        .build()
        .unwrap();
    let code = return_const(41);
    let request = AllocationRequest::new()
        .segment(SegmentRequest::new(
            Permission::ReadExecute,
            code.len() as u64,
            16,
        ))
        .segment(SegmentRequest::new(Permission::ReadWrite, 8, 8));
    let mut in_flight = manager.allocate(&request).unwrap();
    in_flight.working_memory(0).unwrap().copy_from_slice(&code);
    in_flight
        .working_memory(1)
        .unwrap()
        .copy_from_slice(&7u64.to_le_bytes());
    let module = in_flight.finalize().unwrap();
    let function = module.target(0).unwrap();
    let data = module.target(1).unwrap() as *mut u64;

    // SAFETY: fork in a test process; the child only runs the code below and _exits.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0);
    if pid == 0 {
        // Child: write the data, free the code (poisoned with traps), link new code that
        // would return something else into the freed space.
        // SAFETY: the data segment is the module's, mapped read-write.
        unsafe { *data = 1000 };
        drop(module);
        let other = return_const(99);
        let mut in_flight = manager.allocate(&request).unwrap();
        in_flight.working_memory(0).unwrap().copy_from_slice(&other);
        let _kept = in_flight.finalize().unwrap();
        // SAFETY: ends the child without running the test harness's exit code.
        unsafe { libc::_exit(0) };
    }
    let mut status = 0;
    // SAFETY: waiting for our own child.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0);
    // SAFETY: the parent's module is alive and finalized.
    assert_eq!(unsafe { *data }, 7, "the child's write reached the parent");
    // SAFETY: as above: `function` is `extern "C" fn() -> u32` returning 41.
    let f: extern "C" fn() -> u32 = unsafe { std::mem::transmute(function as usize) };
    assert_eq!(f(), 41, "the child's free or new code reached the parent");
}
