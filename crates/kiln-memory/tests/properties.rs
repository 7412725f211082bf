//! Property tests: random allocate/free sequences never overlap, honour alignment, and
//! after freeing everything each pool is one free range again.

mod common;

use kiln_memory::*;
use proptest::prelude::*;
use std::sync::Arc;

#[derive(Debug, Clone)]
enum Step {
    Allocate {
        size: u64,
        align_log2: u32,
        permission: usize,
    },
    Free {
        pick: usize,
    },
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        3 => (1u64..20_000, 0u32..13, 0usize..3).prop_map(|(size, align_log2, permission)| Step::Allocate { size, align_log2, permission }),
        2 => any::<usize>().prop_map(|pick| Step::Free { pick }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn free_list_never_overlaps_and_coalesces(steps in prop::collection::vec(step(), 1..400)) {
        let base = 0x10_0000u64;
        let len = 4 << 20;
        let mut list = FreeList::new(base, len);
        let mut live: Vec<(u64, u64)> = Vec::new();
        for s in steps {
            match s {
                Step::Allocate { size, align_log2, .. } => {
                    let align = 1u64 << align_log2;
                    if let Some(addr) = list.allocate(size, align) {
                        prop_assert_eq!(addr % align, 0);
                        prop_assert!(addr >= base && addr + size <= base + len);
                        for &(a, l) in &live {
                            prop_assert!(addr + size <= a || a + l <= addr, "overlap {addr:#x}+{size:#x} with {a:#x}+{l:#x}");
                        }
                        live.push((addr, size));
                    }
                }
                Step::Free { pick } => {
                    if !live.is_empty() {
                        let (a, l) = live.swap_remove(pick % live.len());
                        list.free(a, l).unwrap();
                    }
                }
            }
            let used: u64 = live.iter().map(|&(_, l)| l).sum();
            prop_assert_eq!(list.free_bytes() + used, len);
        }
        for (a, l) in live.drain(..) {
            list.free(a, l).unwrap();
        }
        prop_assert_eq!(list.range_count(), 1);
        prop_assert_eq!(list.largest_free(), len);
    }

    #[test]
    fn manager_allocations_never_overlap_and_free_back_to_one_range(
        steps in prop::collection::vec(step(), 1..150),
        dual in any::<bool>(),
    ) {
        let mapper: Arc<dyn Mapper> = if dual {
            Arc::new(DualMappedMapper::new().unwrap())
        } else {
            Arc::new(InProcessMapper::new())
        };
        let manager = SlabMemoryManager::builder()
            .mapper(mapper)
            .layout(SlabLayout { read_execute: 8 << 20, read: 4 << 20, read_write: 4 << 20 })
            .prepare_chunk(64 << 10)
            .release_threshold(16 << 10)
            .build()
            .unwrap();
        let mut live: Vec<(u64, u64, FinalizedAllocation)> = Vec::new();
        for s in steps {
            match s {
                Step::Allocate { size, align_log2, permission } => {
                    let align = 1u64 << align_log2;
                    let request = AllocationRequest::new()
                        .segment(SegmentRequest::new(Permission::ALL[permission], size, align));
                    let mut in_flight = manager.allocate(&request).unwrap();
                    let addr = in_flight.target(0).unwrap();
                    prop_assert_eq!(addr % align, 0);
                    // Write every byte: the working memory is really ours.
                    in_flight.working_memory(0).unwrap().fill(0xab);
                    for &(a, l, _) in &live {
                        prop_assert!(addr + size <= a || a + l <= addr);
                    }
                    live.push((addr, size, in_flight.finalize().unwrap()));
                }
                Step::Free { pick } => {
                    if !live.is_empty() {
                        live.swap_remove(pick % live.len());
                    }
                }
            }
        }
        drop(live);
        let stats = manager.stats();
        prop_assert_eq!(stats.live_allocations, 0);
        for p in Permission::ALL {
            prop_assert_eq!(stats.pool(p).free_ranges, stats.pool(p).arenas);
            prop_assert_eq!(stats.pool(p).free, stats.pool(p).reserved);
            // Everything free: whole pages went back.
            prop_assert_eq!(stats.pool(p).prepared, 0, "{} pages still prepared", p);
        }
    }
}
