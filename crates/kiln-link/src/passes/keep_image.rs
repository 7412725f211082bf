//! The `keep-image` pass: the linked image kept for `kiln link`'s ELF file.

use crate::graph::{Allocated, LinkGraph, PERMISSIONS};
use crate::symbols::SEG_BSS;
use crate::{ImageSegment, LinkError, LinkOptions};

impl<'a, 'c> LinkGraph<'a, 'c> {
    /// A copy of the segments as written, with [`LinkOptions::keep_image`].
    pub(crate) fn keep_image(
        &mut self,
        memory: &mut Allocated,
        options: &LinkOptions<'_>,
    ) -> Result<(), LinkError> {
        if !options.keep_image && !options.relocatable {
            return Ok(());
        }
        let seg_size = self.layout.seg_size;
        let allocated = memory;
        let bases = allocated.bases;
        let segs = allocated.in_flight.segments_mut();
        self.image = (0..4)
            .map(|s| ImageSegment {
                permission: PERMISSIONS[s],
                address: bases[s],
                size: seg_size[s],
                bytes: if s == SEG_BSS {
                    Vec::new()
                } else {
                    segs[s].bytes[..seg_size[s] as usize].to_vec()
                },
            })
            .collect();
        Ok(())
    }
}
