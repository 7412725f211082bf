//! The `fixup` pass: every edge applied to the bytes it patches — section by section on
//! every core when the link has many relocations.

use crate::fixup::{Resolver, TlsPlace, Where};
use crate::graph::{Allocated, Edge, LinkGraph, Synthesized};
use crate::object_file::SHT_NOBITS;
use crate::passes::section_bytes::runs;
use crate::symbols::{lossy, Linker, Place, SEG_TLS};
use crate::{LinkError, LinkOptions, SectionId};
use rustc_hash::FxHashMap;

/// Relocations from which a link applies them on every core.
pub(super) const PARALLEL_RELOCATIONS: usize = 16 << 10;

/// A section edges patch: where it is, its names (for errors), its size, whether it has
/// bytes to patch.
pub(super) struct Patched<'n> {
    pub(super) place: Place,
    pub(super) at: Where<'n>,
    size: u64,
    has_bytes: bool,
}

impl<'a, 'c> LinkGraph<'a, 'c> {
    /// Every other relocation.
    pub(crate) fn fixup(
        &mut self,
        memory: &mut Allocated,
        _: &LinkOptions<'_>,
    ) -> Result<(), LinkError> {
        let lists = self.edges.lists.len();
        if crate::link::parallel(lists, self.edges.all.len(), PARALLEL_RELOCATIONS) {
            return self.apply_edges_on_every_core(memory);
        }
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
        let s = &self.synthesized;
        let allocated = memory;
        let mut resolver =
            Resolver::new(&self.linker, allocated, &s.stubs).relocatable(self.relocatable);
        resolver.tls_image = tls_image;
        let bases = allocated.bases;
        let mut segs = allocated.in_flight.segments_mut();
        let mut applied = 0;
        for list in &self.edges.lists {
            let patched = patched(&self.linker, s, list.section);
            let Place::At { seg, offset } = patched.place else {
                continue;
            };
            if (seg == SEG_TLS) != tls_image {
                continue;
            }
            let range = offset as usize..offset.saturating_add(patched.size) as usize;
            let (section_bytes, section_addr): (Option<&mut [u8]>, u64) = if seg == SEG_TLS {
                (self.tls_image.get_mut(range), offset)
            } else {
                let seg = seg as usize;
                (segs[seg].bytes.get_mut(range), bases[seg] + offset)
            };
            let Some(section_bytes) = section_bytes.filter(|_| patched.has_bytes) else {
                return Err(no_contents(patched.at));
            };
            for edge in self.edges.of(list) {
                resolver.apply(patched.at, section_bytes, section_addr, edge, &s.slots, tls)?;
                applied += 1;
            }
        }
        self.counts.relocations += applied;
        Ok(())
    }

    /// [`LinkGraph::apply_edges`] of the sections outside the TLS image, each section's
    /// edges on one thread, the sections spread over the cores (each thread patches only
    /// the bytes of the sections it was given). The first error in the edges' order is
    /// the one reported, as on one thread.
    fn apply_edges_on_every_core(&mut self, memory: &mut Allocated) -> Result<(), LinkError> {
        use rayon::prelude::*;
        let tls = self.tls_place(memory);
        let s = &self.synthesized;
        let resolver = Resolver::new(&self.linker, memory, &s.stubs).relocatable(self.relocatable);
        let bases = memory.bases;
        // The sections, in the order of their first edge list; each with its lists.
        // A section's lists are chained (`next`), not gathered in a vector of their own: no
        // allocation per section.
        let lists = &self.edges.lists;
        let mut group_of: FxHashMap<SectionId, usize> = FxHashMap::default();
        group_of.reserve(lists.len());
        let mut groups: Vec<(Patched<'_>, usize, usize)> = Vec::with_capacity(lists.len());
        let mut next = vec![usize::MAX; lists.len()];
        for (i, list) in lists.iter().enumerate() {
            match group_of.entry(list.section) {
                std::collections::hash_map::Entry::Occupied(g) => {
                    let last = &mut groups[*g.get()].2;
                    next[*last] = i;
                    *last = i;
                }
                std::collections::hash_map::Entry::Vacant(v) => {
                    v.insert(groups.len());
                    groups.push((patched(&self.linker, s, list.section), i, i));
                }
            }
        }
        // The lists of group `g`, in order.
        let lists_of = |g: usize| {
            std::iter::successors(Some(groups[g].1), |&l| {
                Some(next[l]).filter(|&n| n != usize::MAX)
            })
        };
        // Each section is one piece, but one with many edges in offset order (a large
        // object's `.text`, compiled without -ffunction-sections) is cut into pieces
        // patched on different cores. Pieces are numbered in the edges' order.
        let threads = rayon::current_num_threads().max(1);
        let edges = &self.edges;
        let mut pieces: Vec<Piece> = Vec::with_capacity(groups.len());
        let mut first_error: Option<(usize, LinkError)> = None;
        let mut places: [Vec<_>; 4] = Default::default();
        for (g, (patched, first, last)) in groups.iter().enumerate() {
            let Place::At { seg, offset } = patched.place else {
                continue;
            };
            if seg == SEG_TLS {
                continue;
            }
            if !patched.has_bytes {
                first_error.get_or_insert((pieces.len(), no_contents(patched.at)));
                pieces.push(Piece::whole(g));
                continue;
            }
            let Some(list) = places.get_mut(seg as usize) else {
                continue;
            };
            let single = (first == last).then(|| lists[*first]);
            let cuts = single
                .map(|l| piece_cuts(edges.of(&l), patched.size, threads))
                .unwrap_or_default();
            if cuts.is_empty() {
                list.push((pieces.len(), offset as usize, patched.size as usize));
                pieces.push(Piece::whole(g));
                continue;
            }
            let l = single.expect("cuts come from a single list");
            let from = l.start as usize;
            let bounds = std::iter::once((from, 0u64))
                .chain(cuts.iter().map(|&(i, byte)| (from + i, byte)))
                .chain(std::iter::once((l.end as usize, patched.size)));
            let bounds: smallvec::SmallVec<[(usize, u64); 16]> = bounds.collect();
            for w in bounds.windows(2) {
                let ((e0, b0), (e1, b1)) = (w[0], w[1]);
                list.push((pieces.len(), (offset + b0) as usize, (b1 - b0) as usize));
                pieces.push(Piece {
                    group: g,
                    edges: Some((e0, e1)),
                    start: b0,
                });
            }
        }
        let mut segs = memory.in_flight.segments_mut();
        let writable = segs.iter_mut().take(3).map(|s| &mut *s.bytes);
        let count = |p: usize| -> usize {
            match pieces[p].edges {
                Some((a, b)) => b - a,
                None => lists_of(pieces[p].group)
                    .map(|l| edges.of(&edges.lists[l]).len())
                    .sum(),
            }
        };
        let per_segment = 2 * rayon::current_num_threads();
        let mut runs = runs(writable, &mut places, per_segment, |p| count(p.0)).map_err(|seg| {
            LinkError::Malformed {
                object: self.first_object(),
                what: format!("sections overlap in segment {seg}"),
            }
        })?;
        // Each run: how many edges it applied, and its first error in the edges' order.
        let results: Vec<(usize, Option<(usize, LinkError)>)> = runs
            .par_iter_mut()
            .map(|run| {
                let base = bases[run.seg];
                let mut applied = 0;
                let mut first: Option<(usize, LinkError)> = None;
                let Ok(()) = run.visit::<std::convert::Infallible>(
                    |_, _| {},
                    |p, offset, bytes| {
                        let piece = pieces[p];
                        let at = Where {
                            origin: piece.start,
                            ..groups[piece.group].0.at
                        };
                        let address = base + offset as u64;
                        let mut apply = |edge: &Edge| {
                            if piece.start == 0 {
                                return resolver.apply(at, bytes, address, edge, &s.slots, tls);
                            }
                            // In a piece: its offset from the piece's bytes.
                            let mut edge = *edge;
                            edge.offset -= piece.start;
                            resolver.apply(at, bytes, address, &edge, &s.slots, tls)
                        };
                        let done = match piece.edges {
                            Some((a, b)) => edges.all[a..b].iter().try_for_each(|e| {
                                apply(e)?;
                                applied += 1;
                                Ok(())
                            }),
                            None => lists_of(piece.group).try_for_each(|l| {
                                edges.of(&edges.lists[l]).iter().try_for_each(|e| {
                                    apply(e)?;
                                    applied += 1;
                                    Ok(())
                                })
                            }),
                        };
                        if let Err(e) = done {
                            if first.as_ref().is_none_or(|(f, _)| p < *f) {
                                first = Some((p, e));
                            }
                        }
                        Ok(())
                    },
                );
                (applied, first)
            })
            .collect();
        let mut applied = 0;
        for (n, error) in results {
            applied += n;
            if let Some((g, e)) = error {
                if first_error.as_ref().is_none_or(|(first, _)| g < *first) {
                    first_error = Some((g, e));
                }
            }
        }
        if let Some((_, e)) = first_error {
            return Err(e);
        }
        self.counts.relocations += applied;
        Ok(())
    }
}

/// Part of a section's edges and the bytes they patch, on one core.
#[derive(Clone, Copy)]
struct Piece {
    /// The section (its group of edge lists).
    group: usize,
    /// A range of `Edges::all`, or `None` for every list of the section.
    edges: Option<(usize, usize)>,
    /// Where the piece's bytes start in the section.
    start: u64,
}

impl Piece {
    fn whole(group: usize) -> Piece {
        Piece {
            group,
            edges: None,
            start: 0,
        }
    }
}

/// Edges from which a section's are cut into pieces.
const PIECE_EDGES: usize = 16 << 10;

/// Where to cut one section's edges (`list`) into pieces of about equal work for
/// `threads`: pairs of (first edge of a piece, in `list`; first byte of its bytes). None if the section is small or its edges are not in offset order. A cut
/// falls only where 16 bytes separate the fields before from the next edge, and 4 bytes
/// before that edge: an in-place number (a ULEB128) stays whole before it, and an
/// instruction an edge rewrites (x86-64's GOT-load relaxation, 3 bytes before its
/// field) after it.
fn piece_cuts(list: &[Edge], size: u64, threads: usize) -> Vec<(usize, u64)> {
    let n = list.len();
    if n < PIECE_EDGES || threads < 2 {
        return Vec::new();
    }
    let share = (n / (2 * threads)).max(PIECE_EDGES / 2);
    let mut cuts = Vec::new();
    let mut end = 0u64;
    let mut last = 0usize;
    for (i, e) in list.iter().enumerate() {
        if i > 0 && e.offset < list[i - 1].offset {
            return Vec::new();
        }
        if i >= last + share && e.offset >= end.saturating_add(16) && e.offset - 4 < size {
            cuts.push((i, e.offset - 4));
            last = i;
        }
        end = end.max(e.offset.saturating_add(e.row.field.len()));
    }
    cuts
}

/// The section `id` as the edges patch it.
pub(super) fn patched<'n>(
    linker: &'n Linker<'_, '_>,
    synthesized: &'n Synthesized,
    id: SectionId,
) -> Patched<'n> {
    match id {
        SectionId::Input { object, index } => {
            let obj = &linker.objs[object as usize];
            let sec = obj.sections[index as usize];
            Patched {
                place: linker.places[object as usize][index as usize],
                at: Where {
                    object: &obj.name,
                    section: sec.name,
                    origin: 0,
                },
                size: sec.size,
                has_bytes: sec.sh_type != SHT_NOBITS,
            }
        }
        SectionId::Synthesized(i) => {
            let s = &synthesized.sections[i as usize];
            Patched {
                place: s.place,
                at: Where {
                    object: "kiln",
                    section: s.name.as_bytes(),
                    origin: 0,
                },
                size: s.size,
                has_bytes: true,
            }
        }
    }
}

/// Edges for a section without bytes (`SHT_NOBITS`): an error naming it.
fn no_contents(at: Where<'_>) -> LinkError {
    LinkError::Malformed {
        object: at.object.to_string(),
        what: format!(
            "relocations for section {}, which has no contents",
            lossy(at.section)
        ),
    }
}
