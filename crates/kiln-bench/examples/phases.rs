//! Times the phases of the throughput op separately (diagnostics).
use kiln_bench::*;
use kiln_memory::*;
use std::time::{Duration, Instant};
fn main() {
    let manager = SlabMemoryManager::new().unwrap();
    let mut rng = Rng::new(7);
    let mut live: Vec<Option<FinalizedAllocation>> = (0..1024).map(|_| None).collect();
    let (mut ta, mut tw, mut tf, mut tc, mut tr) = (
        Duration::ZERO,
        Duration::ZERO,
        Duration::ZERO,
        Duration::ZERO,
        Duration::ZERO,
    );
    let n = 50_000;
    for i in 0..n {
        let v = (rng.next_u64() % 1024) as usize;
        let t = Instant::now();
        live[v] = None;
        tr += t.elapsed();
        let size = rng.range(64, 16384);
        let t = Instant::now();
        let mut f = manager
            .allocate(&AllocationRequest::new().segment(SegmentRequest::new(
                Permission::ReadExecute,
                size,
                16,
            )))
            .unwrap();
        ta += t.elapsed();
        let t = Instant::now();
        write_function(f.working_memory(0).unwrap(), i);
        tw += t.elapsed();
        let t = Instant::now();
        let f = f.finalize().unwrap();
        tf += t.elapsed();
        let t = Instant::now();
        // SAFETY: the block holds the function just written and finalized.
        assert_eq!(unsafe { call(f.target(0).unwrap() as usize) }, i);
        tc += t.elapsed();
        live[v] = Some(f);
    }
    let p = |d: Duration| d.as_nanos() as f64 / n as f64;
    println!(
        "free {:.0} alloc {:.0} write {:.0} finalize {:.0} call {:.0} ns",
        p(tr),
        p(ta),
        p(tw),
        p(tf),
        p(tc)
    );
}
