//! The `write-contents` pass: each section's bytes, written once.

use crate::graph::{Allocated, LinkGraph};
use crate::object_file::SHT_NOBITS;
use crate::passes::section_bytes::runs;
use crate::symbols::{Linker, Place, SEG_R, SEG_RW, SEG_RX, SEG_TLS};
use crate::{LinkError, LinkOptions};

/// Bytes of contents from which a link writes its sections on every core.
const PARALLEL_BYTES: usize = 2 << 20;

/// Threads from which a link writes its sections on every core.
const MIN_THREADS: usize = 4;

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
        // the others to their segment's list (zero-filled sections have no contents:
        // the last list stays empty).
        let writable: usize = segs.iter().take(3).map(|s| s.bytes.len()).sum();
        let sections = linker.objs.iter().map(|o| o.sections.len()).sum();
        // Copying is bound by the page faults of fresh memory: on 2 threads the runs took
        // 1.34 ms against 1.10 on one (20,000-function AArch64 input), so the copy is
        // spread only from 4 threads.
        // (`parallel` asks for the number of threads last: asking starts the pool.)
        if crate::link::parallel(sections, writable, PARALLEL_BYTES)
            && rayon::current_num_threads() >= MIN_THREADS
        {
            let threads = rayon::current_num_threads();
            let mut places: [Vec<_>; 4] = Default::default();
            placed_contents(linker, &mut tls_image, |data, seg, start| {
                places[seg].push((data, start, data.len()));
            });
            // Each byte is written once: a few runs of sections per segment, each with
            // what lies between its sections, on every core.
            let per_segment = 2 * threads;
            let writable = segs.iter_mut().take(3).map(|s| &mut *s.bytes);
            let mut runs = runs(writable, &mut places, per_segment, |p| p.2).map_err(|seg| {
                LinkError::Malformed {
                    object: self.first_object(),
                    what: format!("sections overlap in segment {seg}"),
                }
            })?;
            use rayon::prelude::*;
            runs.par_iter_mut().for_each(|run| {
                let seg = run.seg;
                let Ok(()) = run.visit::<std::convert::Infallible>(
                    |at, bytes| fill(seg, at, bytes),
                    |data, _, bytes| {
                        bytes.copy_from_slice(data);
                        Ok(())
                    },
                );
            });
        } else {
            // On one thread: each section where it goes, in the objects' order, then what
            // lies between them (this order measured faster than the runs' on one thread:
            // no list of places to build).
            let mut covered: [smallvec::SmallVec<[(usize, usize); 8]>; 3] = Default::default();
            placed_contents(linker, &mut tls_image, |data, seg, start| {
                segs[seg].bytes[start..start + data.len()].copy_from_slice(data);
                if let Some(list) = covered.get_mut(seg) {
                    list.push((start, start + data.len()));
                }
            });
            for (seg, list) in covered.iter_mut().enumerate() {
                list.sort_unstable();
                let bytes = &mut *segs[seg].bytes;
                let mut at = 0;
                for &(start, end) in list.iter() {
                    if at < start {
                        fill(seg, at, &mut bytes[at..start]);
                    }
                    at = at.max(end);
                }
                let len = bytes.len();
                if at < len {
                    fill(seg, at, &mut bytes[at..len]);
                }
            }
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

/// Shows `each` every placed section with contents — its bytes, segment and offset —
/// in the objects' order, after copying thread-local ones into `tls_image` (at their
/// offset in the TLS block) instead.
fn placed_contents<'l>(
    linker: &'l Linker<'_, '_>,
    tls_image: &mut [u8],
    mut each: impl FnMut(&'l [u8], usize, usize),
) {
    for (obj, obj_places) in linker.objs.iter().zip(linker.places.iter()) {
        for (sec, place) in obj.sections.iter().zip(obj_places) {
            let Place::At { seg, offset } = *place else {
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
            each(sec.data, seg as usize, start);
        }
    }
}
