//! The `fixup` pass: every edge applied to the bytes it patches — section by section on
//! every core when the link has many relocations.

use crate::fixup::{Resolver, TlsPlace, Where};
use crate::graph::{Allocated, LinkGraph, Synthesized};
use crate::object_file::SHT_NOBITS;
use crate::passes::section_bytes::runs;
use crate::symbols::{lossy, Linker, Place, SEG_TLS};
use crate::{LinkError, LinkOptions, SectionId};
use rustc_hash::FxHashMap;

/// Relocations from which a link applies them on every core.
const PARALLEL_RELOCATIONS: usize = 16 << 10;

/// A section edges patch: where it is, its names (for errors), its size, whether it has
/// bytes to patch.
struct Patched<'n> {
    place: Place,
    at: Where<'n>,
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
        let resolver = Resolver::new(&self.linker, allocated, &s.stubs);
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
        let resolver = Resolver::new(&self.linker, memory, &s.stubs);
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
        // Where each patched section lies; one without bytes is an error (its turn).
        let mut first_error: Option<(usize, LinkError)> = None;
        let mut places: [Vec<_>; 4] = Default::default();
        for (g, (patched, _, _)) in groups.iter().enumerate() {
            let Place::At { seg, offset } = patched.place else {
                continue;
            };
            if seg == SEG_TLS {
                continue;
            }
            if !patched.has_bytes {
                first_error.get_or_insert((g, no_contents(patched.at)));
                continue;
            }
            let Some(list) = places.get_mut(seg as usize) else {
                continue;
            };
            list.push((g, offset as usize, patched.size as usize));
        }
        let mut segs = memory.in_flight.segments_mut();
        let writable = segs.iter_mut().take(3).map(|s| &mut *s.bytes);
        let edges = &self.edges;
        let count =
            |g: usize| -> usize { lists_of(g).map(|l| edges.of(&edges.lists[l]).len()).sum() };
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
                    |g, offset, bytes| {
                        let patched = &groups[g].0;
                        let address = base + offset as u64;
                        'lists: for list in lists_of(g) {
                            for edge in edges.of(&edges.lists[list]) {
                                let done =
                                    resolver.apply(patched.at, bytes, address, edge, &s.slots, tls);
                                if let Err(e) = done {
                                    if first.as_ref().is_none_or(|(f, _)| g < *f) {
                                        first = Some((g, e));
                                    }
                                    break 'lists;
                                }
                                applied += 1;
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

/// The section `id` as the edges patch it.
fn patched<'n>(
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
