//! The `decode-edges` pass: every relocation decoded once into an edge — per object on
//! every core when the link has many relocations.

use crate::arch::Target;
use crate::graph::{Edge, EdgeList, Edges, LinkGraph};
use crate::symbols::{is_eh_frame, lossy, Place, ResolvedSymbols};
use crate::{LinkError, LinkOptions, SectionId};
use object::LittleEndian as LE;

/// Relocations from which a link decodes them on every core.
const PARALLEL_RELOCATIONS: usize = 16 << 10;

impl<'a, 'c> LinkGraph<'a, 'c> {
    /// Decodes every relocation of every loaded section (and of `.eh_frame`) once: its
    /// type's row, its target, its addend. A type the architecture does not know is an
    /// error here, before any memory is allocated. The edges end in one array, in the
    /// objects' order, however many threads decoded them.
    pub(crate) fn decode_edges(&mut self, _: &LinkOptions<'_>) -> Result<(), LinkError> {
        let linker = &self.linker;
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
        let resolved = linker.resolved();
        let objects = linker.objs.len();
        let edges = if crate::link::parallel(objects, relocations, PARALLEL_RELOCATIONS) {
            use rayon::prelude::*;
            // Each object's edges apart, then one array; the first error in the objects'
            // order, as on one thread.
            let parts: Vec<Result<Edges, LinkError>> = (0..objects)
                .into_par_iter()
                .map(|oi| {
                    let mut part = Edges::default();
                    decode_object(resolved, oi, &mut part).map(|()| part)
                })
                .collect();
            let mut edges = Edges {
                all: Vec::with_capacity(relocations),
                lists: Vec::with_capacity(sections),
            };
            for part in parts {
                let part = part?;
                let base = edges.all.len() as u32;
                edges.all.extend_from_slice(&part.all);
                edges.lists.extend(part.lists.iter().map(|l| EdgeList {
                    start: l.start + base,
                    end: l.end + base,
                    ..*l
                }));
            }
            edges
        } else {
            // One array for every edge, sized from the relocation counts.
            let mut edges = Edges {
                all: Vec::with_capacity(relocations),
                lists: Vec::with_capacity(sections),
            };
            for oi in 0..objects {
                decode_object(resolved, oi, &mut edges)?;
            }
            edges
        };
        self.edges = edges;
        Ok(())
    }
}

/// Decodes the relocations of object `oi`'s loaded sections, appending to `edges`.
fn decode_object(
    linker: ResolvedSymbols<'_, '_>,
    oi: usize,
    edges: &mut Edges,
) -> Result<(), LinkError> {
    let arch = linker.arch;
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
    Ok(())
}
