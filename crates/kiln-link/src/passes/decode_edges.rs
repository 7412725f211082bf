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
            decode_on_every_core(resolved, relocations, sections)?
        } else {
            // One array for every edge, sized from the relocation counts.
            let mut edges = Edges {
                all: Vec::with_capacity(relocations),
                lists: Vec::with_capacity(sections),
            };
            for oi in 0..objects {
                decode_object(resolved, oi, &mut edges.all, &mut edges.lists)?;
            }
            edges
        };
        self.edges = edges;
        Ok(())
    }
}

/// The decoding on every core: each object's edges written in its own part of the one
/// array (as long as its relocations; the array filled with a placeholder on every core
/// first, so its pages are touched on every core), then the parts closed up in the
/// objects' order. The first error in the objects' order is the one reported, as on one
/// thread.
fn decode_on_every_core(
    linker: ResolvedSymbols<'_, '_>,
    relocations: usize,
    sections: usize,
) -> Result<Edges, LinkError> {
    use rayon::prelude::*;
    let Some(row) = linker.arch.relocations().first() else {
        return Ok(Edges::default());
    };
    let placeholder = Edge {
        offset: 0,
        row,
        key: crate::symbols::SymbolId::Global(0),
        addend: 0,
        place_delta: 0,
    };
    let mut all = Vec::with_capacity(relocations);
    all.par_extend(rayon::iter::repeat_n(placeholder, relocations));
    let mut parts = Vec::with_capacity(linker.objs.len());
    let mut rest = &mut all[..];
    for obj in linker.objs {
        let count = obj.relocations.iter().map(|r| r.1.len()).sum();
        let (part, tail) = std::mem::take(&mut rest).split_at_mut(count);
        parts.push(part);
        rest = tail;
    }
    // Each part: its length, how many edges it holds, their lists.
    type Decoded = Result<(usize, usize, Vec<EdgeList>), LinkError>;
    let decoded: Vec<Decoded> = parts
        .into_par_iter()
        .enumerate()
        .map(|(oi, part)| {
            let part_len = part.len();
            let mut out = PartOut { part, len: 0 };
            let mut lists = Vec::with_capacity(linker.objs[oi].relocations.len());
            decode_object(linker, oi, &mut out, &mut lists)?;
            Ok((part_len, out.len, lists))
        })
        .collect();
    let mut edges = Edges {
        all: Vec::new(),
        lists: Vec::with_capacity(sections),
    };
    // Where each part begins, and where its edges go.
    let (mut from, mut to) = (0, 0);
    for result in decoded {
        let (part_len, len, lists) = result?;
        if from != to {
            all.copy_within(from..from + len, to);
        }
        edges.lists.extend(lists.iter().map(|l| EdgeList {
            start: l.start + to as u32,
            end: l.end + to as u32,
            ..*l
        }));
        to += len;
        from += part_len;
    }
    all.truncate(to);
    edges.all = all;
    Ok(edges)
}

/// Where [`decode_object`] writes edges: the one array, or an object's part of it.
trait EdgeOut {
    fn len(&self) -> usize;
    fn push(&mut self, edge: Edge);
}

impl EdgeOut for Vec<Edge> {
    fn len(&self) -> usize {
        Vec::len(self)
    }
    fn push(&mut self, edge: Edge) {
        Vec::push(self, edge);
    }
}

/// An object's part of the one array, as long as its relocations (never overrun: an
/// edge per relocation at most).
struct PartOut<'p> {
    part: &'p mut [Edge],
    len: usize,
}

impl EdgeOut for PartOut<'_> {
    fn len(&self) -> usize {
        self.len
    }
    fn push(&mut self, edge: Edge) {
        self.part[self.len] = edge;
        self.len += 1;
    }
}

/// Decodes the relocations of object `oi`'s loaded sections, appending to `edges` and
/// their lists to `lists` (ranges of what `edges` holds).
fn decode_object(
    linker: ResolvedSymbols<'_, '_>,
    oi: usize,
    edges: &mut impl EdgeOut,
    lists: &mut Vec<EdgeList>,
) -> Result<(), LinkError> {
    let arch = linker.arch;
    let index = arch.relocation_index();
    let obj = &linker.objs[oi];
    for (target, relas) in &obj.relocations {
        let (target, relas) = (*target, &relas[..]);
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
        let start = edges.len() as u32;
        // The row the next relocation takes instead of its own (the second of a pair at
        // one offset).
        let mut paired_next: Option<&'static crate::arch::Relocation> = None;
        for (i, rela) in relas.iter().enumerate() {
            let r_type = rela.r_type(LE, false).0;
            let offset = rela.r_offset.get(LE);
            let row = paired_next
                .take()
                .or_else(|| index.get(r_type as usize).copied().flatten());
            let Some(mut row) = row else {
                let key = linker.key(oi as u32, rela.r_sym(LE, false));
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
            if let Some(next) = relas.get(i + 1).filter(|n| n.r_offset.get(LE) == offset) {
                let next_row = index
                    .get(next.r_type(LE, false).0 as usize)
                    .copied()
                    .flatten();
                if let Some((first, second)) =
                    next_row.and_then(|n| arch.pair_at_one_offset(row, n))
                {
                    row = first;
                    paired_next = Some(second);
                }
            }
            if row.target == Target::Partner {
                edges.push(paired(linker, oi, target, relas, rela, row)?);
                continue;
            }
            edges.push(Edge {
                offset,
                row,
                key: linker.key(oi as u32, rela.r_sym(LE, false)),
                addend: rela.r_addend.get(LE),
                place_delta: 0,
            });
        }
        lists.push(EdgeList {
            section: SectionId::Input {
                object: oi as u32,
                index: target,
            },
            start,
            end: edges.len() as u32,
        });
    }
    Ok(())
}

/// The edge of a low part that takes its value from a partner (RISC-V `%pcrel_lo`): its
/// symbol is a label at the high part's instruction, in the same section, whose
/// relocation gives the target; the edge computes that target relative to the label and
/// writes the low part. The low part's own addend is ignored, as by other linkers.
fn paired(
    linker: ResolvedSymbols<'_, '_>,
    oi: usize,
    section: u32,
    relas: &[object::elf::Rela64<object::LittleEndian>],
    lo: &object::elf::Rela64<object::LittleEndian>,
    lo_row: &'static crate::arch::Relocation,
) -> Result<Edge, LinkError> {
    let obj = &linker.objs[oi];
    let offset = lo.r_offset.get(LE);
    let label = obj.symbols.get(lo.r_sym(LE, false) as usize);
    let fail = |what: String| LinkError::BadRelocation {
        object: obj.name.to_string(),
        section: lossy(obj.sections[section as usize].name),
        offset,
        what: format!("{} {what}", lo_row.name),
    };
    let Some(label) = label else {
        return Err(fail("refers to a symbol the object does not have".into()));
    };
    if label.section != crate::object_file::SymSection::Section(section) {
        return Err(fail(format!(
            "refers to '{}', which is not a label in this section: its high part must be",
            lossy(label.name)
        )));
    }
    let at = label.value;
    // Compilers write relocations in offset order: a binary search finds the partner;
    // a hand-made object in another order is searched whole.
    let start = relas.partition_point(|r| r.r_offset.get(LE) < at);
    let candidates = relas[start..]
        .iter()
        .take_while(|r| r.r_offset.get(LE) == at)
        .chain(relas.iter().filter(|r| r.r_offset.get(LE) == at));
    for hi in candidates {
        let Some(hi_row) = linker.arch.relocation(hi.r_type(LE, false).0) else {
            continue;
        };
        let Some(row) = linker.arch.pair(lo_row, hi_row) else {
            continue;
        };
        let place_delta = i32::try_from(at as i64 - offset as i64)
            .map_err(|_| fail(format!("is more than 2 GiB from its high part at {at:#x}")))?;
        return Ok(Edge {
            offset,
            row,
            key: linker.key(oi as u32, hi.r_sym(LE, false)),
            addend: hi.r_addend.get(LE),
            place_delta,
        });
    }
    Err(fail(format!(
        "refers to '{}' at {at:#x}, where no high part it can pair with is (a %pcrel_hi, \
         %got_pcrel_hi, %tls_ie_pcrel_hi, %tls_gd_pcrel_hi or %tlsdesc_hi relocation)",
        lossy(label.name)
    )))
}
