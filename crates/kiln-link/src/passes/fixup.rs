//! The `fixup` pass: every edge applied to the bytes it patches.

use crate::fixup::{Resolver, TlsPlace, Where};
use crate::graph::{Allocated, LinkGraph};
use crate::object_file::{ObjSection, SHT_NOBITS};
use crate::symbols::{lossy, Place, SEG_TLS};
use crate::{LinkError, LinkOptions, SectionId};

impl<'a, 'c> LinkGraph<'a, 'c> {
    /// Every other relocation.
    pub(crate) fn fixup(
        &mut self,
        memory: &mut Allocated,
        _: &LinkOptions<'_>,
    ) -> Result<(), LinkError> {
        self.apply_edges(memory, false)
    }

    pub(crate) fn tls_place(&self, memory: &Allocated) -> TlsPlace {
        TlsPlace {
            module: memory.tls_module,
            tp_offset: self.tp_offset,
        }
    }

    /// Applies the edges of the TLS image's sections (`tls_image`) or of the others.
    pub(crate) fn apply_edges(
        &mut self,
        memory: &mut Allocated,
        tls_image: bool,
    ) -> Result<(), LinkError> {
        let tls = self.tls_place(memory);
        let linker = &self.linker;
        let s = &self.synthesized;
        let synthesized = &s.sections;
        let allocated = memory;
        let resolver = Resolver::new(linker, allocated, &s.stubs);
        let bases = allocated.bases;
        let mut segs = allocated.in_flight.segments_mut();
        for list in &self.edges.lists {
            // Where the section is, what it is called (for errors), whether it has bytes.
            let (place, object, name, size, has_bytes) = match list.section {
                SectionId::Input { object, index } => {
                    let obj = &linker.objs[object as usize];
                    let sec: ObjSection<'_> = obj.sections[index as usize];
                    let place = linker.places[object as usize][index as usize];
                    let has_bytes = sec.sh_type != SHT_NOBITS;
                    (place, &*obj.name, sec.name, sec.size, has_bytes)
                }
                SectionId::Synthesized(i) => {
                    let s = &synthesized[i as usize];
                    (s.place, "kiln", s.name.as_bytes(), s.size, true)
                }
            };
            let Place::At { seg, offset } = place else {
                continue;
            };
            if (seg == SEG_TLS) != tls_image {
                continue;
            }
            let range = offset as usize..offset.saturating_add(size) as usize;
            let (section_bytes, section_addr): (Option<&mut [u8]>, u64) = if seg == SEG_TLS {
                (self.tls_image.get_mut(range), offset)
            } else {
                let seg = seg as usize;
                (segs[seg].bytes.get_mut(range), bases[seg] + offset)
            };
            let Some(section_bytes) = section_bytes.filter(|_| has_bytes) else {
                return Err(LinkError::Malformed {
                    object: object.to_string(),
                    what: format!(
                        "relocations for section {}, which has no contents",
                        lossy(name)
                    ),
                });
            };
            let at = Where {
                object,
                section: name,
            };
            for edge in self.edges.of(list) {
                self.counts.relocations += 1;
                resolver.apply(at, section_bytes, section_addr, edge, &s.slots, tls)?;
            }
        }
        Ok(())
    }
}
