//! The `fixup` pass: every edge applied to the bytes it patches.

use crate::fixup::{Resolver, TlsPlace};
use crate::graph::{allocation, LinkGraph};
use crate::object_file::{ObjSection, SHT_NOBITS};
use crate::symbols::{lossy, Place, SEG_TLS};
use crate::{LinkError, LinkOptions};

impl<'a, 'c> LinkGraph<'a, 'c> {
    /// Every other relocation.
    pub(crate) fn fixup(&mut self, _: &LinkOptions<'_>) -> Result<(), LinkError> {
        self.apply_edges(false)
    }

    pub(crate) fn tls_place(&self) -> TlsPlace {
        TlsPlace {
            module: self.allocated.as_ref().map_or(0, |a| a.tls_module),
            tp_offset: self.tp_offset,
        }
    }

    /// Applies the edges of the TLS image's sections (`tls_image`) or of the others.
    pub(crate) fn apply_edges(&mut self, tls_image: bool) -> Result<(), LinkError> {
        let tls = self.tls_place();
        let linker = &self.linker;
        let s = &self.synthesized;
        let allocated = allocation(&mut self.allocated);
        let resolver = Resolver::new(linker, allocated, &s.stubs);
        let bases = allocated.bases;
        let mut segs = allocated.in_flight.segments_mut();
        for list in &self.edges.lists {
            let (oi, target) = (list.obj as usize, list.section as usize);
            let obj = &linker.objs[oi];
            let Place::At { seg, offset } = linker.places[oi][target] else {
                continue;
            };
            if (seg == SEG_TLS) != tls_image {
                continue;
            }
            let sec: ObjSection<'_> = obj.sections[target];
            let range = offset as usize..offset.saturating_add(sec.size) as usize;
            let (section_bytes, section_addr): (Option<&mut [u8]>, u64) = if seg == SEG_TLS {
                (self.tls_image.get_mut(range), offset)
            } else {
                let seg = seg as usize;
                (segs[seg].bytes.get_mut(range), bases[seg] + offset)
            };
            let Some(section_bytes) = section_bytes.filter(|_| sec.sh_type != SHT_NOBITS) else {
                return Err(LinkError::Malformed {
                    object: obj.name.to_string(),
                    what: format!(
                        "relocations for section {}, which has no contents",
                        lossy(sec.name)
                    ),
                });
            };
            for edge in self.edges.of(list) {
                self.counts.relocations += 1;
                resolver.apply(
                    oi as u32,
                    &sec,
                    section_bytes,
                    section_addr,
                    edge,
                    &s.slots,
                    tls,
                )?;
            }
        }
        Ok(())
    }
}
