//! The `decode-edges` pass: every relocation decoded once into an edge.

use crate::arch::Target;
use crate::graph::{Edge, EdgeList, Edges, LinkGraph};
use crate::symbols::{is_eh_frame, lossy, Place};
use crate::{LinkError, LinkOptions, SectionId};
use object::LittleEndian as LE;

impl<'a, 'c> LinkGraph<'a, 'c> {
    /// Decodes every relocation of every loaded section (and of `.eh_frame`) once: its
    /// type's row, its target, its addend. A type the architecture does not know is an
    /// error here, before any memory is allocated.
    pub(crate) fn decode_edges(&mut self, _: &LinkOptions<'_>) -> Result<(), LinkError> {
        let linker = &self.linker;
        let arch = linker.arch;
        // One array for every edge, sized from the relocation counts.
        let (mut sections, mut relocations) = (0, 0);
        for obj in &linker.objs {
            sections += obj.relocations.len();
            relocations += obj.relocations.iter().map(|r| r.1.len()).sum::<usize>();
        }
        if relocations > u32::MAX as usize {
            return Err(LinkError::Malformed {
                object: self.first_object(),
                what: format!("{relocations} relocations in one link (at most 2^32 - 1)"),
            });
        }
        let mut edges = Edges {
            all: Vec::with_capacity(relocations),
            lists: Vec::with_capacity(sections),
        };
        for oi in 0..linker.objs.len() {
            let obj = &linker.objs[oi];
            for &(target, relas) in &obj.relocations {
                let p = linker.places[oi][target as usize];
                let sec = obj.sections[target as usize];
                let loaded = match p {
                    Place::At { .. } => true,
                    // `.eh_frame` is placed after the edges are decoded.
                    Place::Unplaced => is_eh_frame(&sec),
                    Place::Discarded => false,
                };
                if !loaded {
                    // Not loaded (debug info, notes, a discarded COMDAT copy).
                    continue;
                }
                let start = edges.all.len() as u32;
                for rela in relas {
                    let r_type = rela.r_type(LE, false).0;
                    let key = linker.key(oi as u32, rela.r_sym(LE, false));
                    let offset = rela.r_offset.get(LE);
                    let Some(row) = arch.relocation(r_type) else {
                        return Err(LinkError::UnknownRelocation {
                            object: obj.name.to_string(),
                            section: lossy(sec.name),
                            offset,
                            r_type,
                            name: arch.relocation_name(r_type),
                            symbol: lossy(linker.name(key)),
                        });
                    };
                    if row.target == Target::Nothing {
                        continue;
                    }
                    edges.all.push(Edge {
                        offset,
                        row,
                        key,
                        addend: rela.r_addend.get(LE),
                    });
                }
                edges.lists.push(EdgeList {
                    section: SectionId::Input {
                        object: oi as u32,
                        index: target,
                    },
                    start,
                    end: edges.all.len() as u32,
                });
            }
        }
        self.edges = edges;
        Ok(())
    }
}
