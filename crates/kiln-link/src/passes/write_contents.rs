//! The `write-contents` pass: each section's bytes, written once.

use crate::graph::{Allocated, LinkGraph};
use crate::object_file::SHT_NOBITS;
use crate::symbols::{Place, SEG_R, SEG_RW, SEG_RX, SEG_TLS};
use crate::{LinkError, LinkOptions};

impl<'a, 'c> LinkGraph<'a, 'c> {
    /// Copies every section's contents to its place; unused code is the architecture's
    /// trap pattern, `__dso_handle` holds its own address.
    pub(crate) fn write_contents(
        &mut self,
        memory: &mut Allocated,
        _: &LinkOptions<'_>,
    ) -> Result<(), LinkError> {
        // Only the initialized part of the TLS block is an image (`.tbss` is zeros by
        // definition), so a huge `.tbss` costs nothing here.
        let tls_image_len = self.layout.tls_image_len as usize;
        let mut tls_image = Vec::new();
        tls_image
            .try_reserve_exact(tls_image_len)
            .map_err(|_| LinkError::Malformed {
                object: self.first_object(),
                what: format!("no memory for a TLS image of {tls_image_len} bytes"),
            })?;
        tls_image.resize(tls_image_len, 0);
        let trap = self.linker.arch.trap();
        let dso_offset = self.layout.dso_offset as usize;
        let linker = &self.linker;
        let allocated = memory;
        let dso_handle = allocated.dso_handle;
        let mut segs = allocated.in_flight.segments_mut();
        // Each byte is written once: sections' contents, then what lies between them —
        // the trap pattern in code, zeros elsewhere (the GOT, stubs and `.eh_frame`'s
        // terminator are written by later passes).
        let mut covered: [smallvec::SmallVec<[(usize, usize); 8]>; 3] = Default::default();
        for oi in 0..linker.objs.len() {
            for (si, sec) in linker.objs[oi].sections.iter().enumerate() {
                let Place::At { seg, offset } = linker.places[oi][si] else {
                    continue;
                };
                if sec.sh_type == SHT_NOBITS {
                    continue;
                }
                let start = offset as usize;
                if seg == SEG_TLS {
                    tls_image[start..start + sec.data.len()].copy_from_slice(sec.data);
                    continue;
                }
                let seg = seg as usize;
                segs[seg].bytes[start..start + sec.data.len()].copy_from_slice(sec.data);
                if let Some(list) = covered.get_mut(seg) {
                    list.push((start, start + sec.data.len()));
                }
            }
        }
        for (seg, list) in covered.iter_mut().enumerate() {
            list.sort_unstable();
            let bytes = &mut *segs[seg].bytes;
            let len = bytes.len();
            let mut fill = |from: usize, to: usize| {
                if from >= to {
                    return;
                }
                if seg == SEG_RX {
                    // The pattern repeats every 4 bytes from the segment's start (code is
                    // 4-aligned on AArch64).
                    for (i, b) in bytes[from..to].iter_mut().enumerate() {
                        *b = trap[(from + i) % 4];
                    }
                } else {
                    bytes[from..to].fill(0);
                }
            };
            let mut at = 0;
            for &(start, end) in list.iter() {
                fill(at, start);
                at = at.max(end);
            }
            fill(at, len);
        }
        // `__dso_handle` holds its own address, as crtbeginS.o's does: g++ passes its
        // address to `__cxa_atexit`, libc_nonshared's `atexit` passes its value.
        segs[SEG_RW].bytes[dso_offset..dso_offset + 8].copy_from_slice(&dso_handle.to_le_bytes());
        if let Some(end) = self.layout.eh_terminator {
            segs[SEG_R].bytes[end as usize..end as usize + 4].fill(0);
        }
        drop(segs);
        self.tls_image = tls_image;
        Ok(())
    }
}
