//! The `write-contents` pass: each section's bytes, written once.

use crate::graph::{Allocated, LinkGraph};
use crate::object_file::SHT_NOBITS;
use crate::passes::section_bytes::{split, Piece};
use crate::symbols::{Place, SEG_R, SEG_RW, SEG_RX, SEG_TLS};
use crate::{LinkError, LinkOptions};

/// Bytes of contents from which a link writes its sections on every core.
const PARALLEL_BYTES: usize = 2 << 20;

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
        // What lies between sections: the trap pattern in code (repeating every 4 bytes
        // from the segment's start: code is 4-aligned on AArch64), zeros elsewhere (the
        // GOT, stubs and `.eh_frame`'s terminator are written by later passes).
        let fill = |seg: usize, at: usize, bytes: &mut [u8]| {
            if seg == SEG_RX {
                for (i, b) in bytes.iter_mut().enumerate() {
                    *b = trap[(at + i) % 4];
                }
            } else {
                bytes.fill(0);
            }
        };
        // Every placed section with contents: thread-local ones go to the TLS image,
        // the others to their segment.
        let mut places: smallvec::SmallVec<[_; 16]> = smallvec::SmallVec::new();
        let mut bytes = 0;
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
                places.push((sec.data, seg as usize, start, sec.data.len()));
                bytes += sec.data.len();
            }
        }
        // Each byte is written once: sections' contents, then what lies between them —
        // on every core when the link is large.
        let writable = segs.iter_mut().take(3).map(|s| &mut *s.bytes);
        let pieces = split(writable, &mut places).map_err(|seg| LinkError::Malformed {
            object: self.first_object(),
            what: format!("sections overlap in segment {seg}"),
        })?;
        let write = |piece: Piece<'_, &[u8]>| match piece.item {
            Some(data) => piece.bytes.copy_from_slice(data),
            None => fill(piece.seg, piece.offset, piece.bytes),
        };
        if crate::link::parallel(pieces.len(), bytes, PARALLEL_BYTES) {
            use rayon::prelude::*;
            pieces.into_vec().into_par_iter().for_each(write);
        } else {
            pieces.into_iter().for_each(write);
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
