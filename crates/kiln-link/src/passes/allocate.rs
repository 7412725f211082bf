//! The `allocate` pass: the module's memory, and the segments' addresses.

use crate::graph::{Allocated, LinkGraph, PERMISSIONS};
use crate::symbols::{SEG_BSS, SEG_R, SEG_RW, SEG_RX};
use crate::{LinkError, LinkOptions};
use kiln_memory::{AllocationRequest, SegmentRequest};

impl<'a, 'c> LinkGraph<'a, 'c> {
    /// Asks the memory manager for the four segments (the low one for non-PIC code), and
    /// the executor for a TLS module id if there are thread-locals.
    pub(crate) fn allocate(&mut self, options: &LinkOptions<'_>) -> Result<Allocated, LinkError> {
        let memory = match (self.synthesized.needs_low, options.low_memory) {
            (true, Some(low)) => low,
            _ => options.memory,
        };
        let l = &self.layout;
        let mut request = AllocationRequest::new();
        for (s, &permission) in PERMISSIONS.iter().enumerate() {
            let mut seg = SegmentRequest::new(permission, l.seg_size[s], l.seg_align[s]);
            if s == SEG_BSS {
                seg = seg.zero_filled();
            }
            request = request.segment(seg);
        }
        let in_flight = memory.allocate(&request)?;
        let bases: [u64; 4] = std::array::from_fn(|s| in_flight.target(s).unwrap_or(0));
        self.relocatable = options.relocatable;
        let tls_module = if l.tls_size > 0 {
            self.linker
                .ctx
                .tls_module_id()
                .map_err(LinkError::Environment)?
        } else {
            0
        };
        // The lowest address of the module (where Windows' relative addresses count from).
        let image_base = (0..4)
            .filter(|&s| l.seg_size[s] > 0)
            .map(|s| bases[s])
            .min()
            .unwrap_or(bases[SEG_RX]);
        Ok(Allocated {
            in_flight,
            bases,
            image_base,
            got_base: bases[SEG_R] + l.got_offset,
            plt_base: bases[SEG_RX] + l.plt_offset,
            dso_handle: bases[SEG_RW] + l.dso_offset,
            tls_module,
        })
    }
}
