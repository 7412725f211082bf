//! Passes a link's client adds to the link (a session's plugins: instrumentation, lazy
//! stubs, a check of what is linked), and the view of the link graph they get.
//!
//! ```
//! use kiln_link::{GraphView, LinkPass, PassError, PassPoint};
//!
//! /// Fails any link that would put more than `limit` bytes of code in memory.
//! struct CodeBudget { limit: u64 }
//!
//! impl LinkPass for CodeBudget {
//!     fn name(&self) -> &str { "code-budget" }
//!     fn run(&self, graph: &mut GraphView<'_, '_, '_>) -> Result<(), PassError> {
//!         let code: u64 = graph.sections().iter().filter(|s| s.code).map(|s| s.size).sum();
//!         if code > self.limit {
//!             return Err(format!("{code} bytes of code, over the budget of {}", self.limit).into());
//!         }
//!         Ok(())
//!     }
//! }
//! # let _ = (CodeBudget { limit: 1 << 20 }, PassPoint::Decoded);
//! ```

use crate::fixup::Resolver;
use crate::graph::{Allocated, LinkGraph};
use crate::symbols::{lossy, Place, SymbolId, SEG_RX, SEG_TLS};
use crate::Architecture;

/// Where in a link a client's pass runs (between the built-in passes, in this order).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PassPoint {
    /// Symbols are resolved, every loaded section has its segment and its relocations are
    /// decoded into edges; no GOT entry, stub or memory exists yet.
    Decoded,
    /// Memory is allocated: every section and symbol has its target address; nothing is
    /// written yet.
    Allocated,
    /// Every section is written and relocated, initializers are known, the memory is not
    /// finalized yet: a pass may read and patch the bytes.
    FixedUp,
}

/// A pass over the link graph, run at the [`PassPoint`] it was registered for.
pub trait LinkPass: Send + Sync {
    /// Its name, for errors and traces.
    fn name(&self) -> &str;
    /// Runs it. An error fails the link with [`LinkError::Pass`](crate::LinkError::Pass);
    /// nothing of the link is kept.
    fn run(&self, graph: &mut GraphView<'_, '_, '_>) -> Result<(), PassError>;
}

/// Why a pass failed: any error (a string converts: `Err("why".into())`); kept as the
/// [`LinkError::Pass`](crate::LinkError::Pass)'s source.
pub type PassError = Box<dyn std::error::Error + Send + Sync>;

/// A section of the link graph.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SectionId {
    /// Section `index` (in its section header table) of the link's object `object`
    /// (inputs first, then archive members in the order they were loaded).
    Input {
        /// The object's index in the link.
        object: u32,
        /// The section's index in the object.
        index: u32,
    },
    /// A section the link made — the GOT (`.kiln.got`), the stubs that reach far
    /// functions (`.kiln.stubs`, also the veneers of AArch64 calls beyond a branch's
    /// reach), the TLS-descriptor resolver (`.kiln.tlsdesc`) — or a pass added
    /// ([`GraphView::add_section`]).
    Synthesized(u32),
}

/// What a section a pass adds holds ([`GraphView::add_section`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NewSectionKind {
    /// Code (read and executed).
    Code,
    /// Constants (read only).
    Constants,
    /// Data (read and written).
    Data,
}

/// A loaded section, as a pass sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GraphSection {
    /// Which section.
    pub id: SectionId,
    /// Its name.
    pub name: String,
    /// Its size in bytes.
    pub size: u64,
    /// Whether it holds code.
    pub code: bool,
    /// Whether it is part of the thread-local template (it has no address of its own).
    pub thread_local: bool,
    /// Its target address, from [`PassPoint::Allocated`] on (`None` before, and for
    /// thread-local sections).
    pub address: Option<u64>,
    /// How many relocations it has.
    pub edges: usize,
}

/// A relocation of a section, decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GraphEdge {
    /// Offset in its section.
    pub offset: u64,
    /// Its psABI name (`R_X86_64_PLT32`, `R_AARCH64_CALL26`).
    pub kind: &'static str,
    /// The symbol it refers to (a section's name for a section symbol).
    pub target: String,
    /// Its addend.
    pub addend: i64,
}

/// The link graph as a client's pass sees it: sections, edges, symbols, and from
/// [`PassPoint::FixedUp`] on the bytes.
pub struct GraphView<'g, 'a, 'c> {
    graph: &'g mut LinkGraph<'a, 'c>,
    /// The memory, from [`PassPoint::Allocated`] on.
    memory: Option<&'g mut Allocated>,
    point: PassPoint,
}

impl<'g, 'a, 'c> GraphView<'g, 'a, 'c> {
    pub(crate) fn new(
        graph: &'g mut LinkGraph<'a, 'c>,
        memory: Option<&'g mut Allocated>,
        point: PassPoint,
    ) -> Self {
        GraphView {
            graph,
            memory,
            point,
        }
    }

    /// Where in the link this pass runs.
    pub fn point(&self) -> PassPoint {
        self.point
    }

    /// The instruction set of the link.
    pub fn architecture(&self) -> Architecture {
        self.graph.linker.arch.architecture()
    }

    /// The names of the objects linked, by index.
    pub fn object_names(&self) -> Vec<&str> {
        self.graph.linker.objs.iter().map(|o| &*o.name).collect()
    }

    /// Every loaded section: the objects', then those the link made and passes added
    /// (the GOT and stubs from [`PassPoint::Allocated`] on: they are made after
    /// [`PassPoint::Decoded`], from the edges).
    pub fn sections(&self) -> Vec<GraphSection> {
        let linker = &self.graph.linker;
        let bases = self.memory.as_ref().map(|a| a.bases);
        let mut edges = rustc_hash::FxHashMap::default();
        for list in &self.graph.edges.lists {
            *edges.entry(list.section).or_insert(0) += (list.end - list.start) as usize;
        }
        let mut out = Vec::new();
        let mut push = |id: SectionId, name: String, size: u64, place: Place| {
            let Place::At { seg, offset } = place else {
                return;
            };
            let thread_local = seg == SEG_TLS;
            out.push(GraphSection {
                id,
                name,
                size,
                code: seg as usize == SEG_RX,
                thread_local,
                address: bases
                    .filter(|_| !thread_local)
                    .map(|b| b[seg as usize] + offset),
                edges: edges.get(&id).copied().unwrap_or(0),
            });
        };
        for (oi, obj) in linker.objs.iter().enumerate() {
            for (si, sec) in obj.sections.iter().enumerate() {
                let id = SectionId::Input {
                    object: oi as u32,
                    index: si as u32,
                };
                push(id, lossy(sec.name), sec.size, linker.places[oi][si]);
            }
        }
        for (i, s) in self.graph.synthesized.sections.iter().enumerate() {
            let id = SectionId::Synthesized(i as u32);
            // Unplaced until `layout-synthesized`: shown at their segment, no address.
            let place = match s.place {
                Place::Unplaced => Place::At {
                    seg: s.segment as u8,
                    offset: 0,
                },
                place => place,
            };
            push(id, s.name.to_string(), s.size, place);
        }
        out
    }

    /// The edges of section `section` (empty if it has none).
    pub fn edges(&self, section: SectionId) -> Vec<GraphEdge> {
        let linker = &self.graph.linker;
        let edges = &self.graph.edges;
        edges
            .lists
            .iter()
            .filter(|l| l.section == section)
            .flat_map(|l| edges.of(l))
            .map(|e| GraphEdge {
                offset: e.offset,
                kind: e.row.name,
                target: lossy(linker.name(e.key)),
                addend: e.addend,
            })
            .collect()
    }

    /// The address of global symbol `name` (defined by the link or resolved from
    /// outside it), from [`PassPoint::Allocated`] on.
    pub fn symbol_address(&self, name: &str) -> Option<u64> {
        let linker = &self.graph.linker;
        let allocated = self.memory.as_deref()?;
        let &id = linker.global_index.get(name.as_bytes())?;
        let resolver = Resolver::new(linker, allocated, &self.graph.synthesized.stubs);
        let (address, discarded) = resolver.address(SymbolId::Global(id));
        (!discarded).then_some(address)
    }

    /// The bytes of section `section` as they will run, at [`PassPoint::FixedUp`] (`None`
    /// before, and for thread-local or zero-filled sections). Changes are the pass's
    /// responsibility: the memory is finalized (made executable, the instruction cache
    /// made coherent) after the pass.
    pub fn section_bytes_mut(&mut self, section: SectionId) -> Option<&mut [u8]> {
        if self.point != PassPoint::FixedUp {
            return None;
        }
        let (place, size) = match section {
            SectionId::Input { object, index } => {
                let linker = &self.graph.linker;
                let place = *linker.places.get(object as usize)?.get(index as usize)?;
                let sec = linker.objs[object as usize].sections[index as usize];
                if sec.data.is_empty() {
                    return None;
                }
                (place, sec.size)
            }
            SectionId::Synthesized(i) => {
                let s = self.graph.synthesized.sections.get(i as usize)?;
                (s.place, s.size)
            }
        };
        let Place::At { seg, offset } = place else {
            return None;
        };
        if seg == SEG_TLS {
            return None;
        }
        let allocated = self.memory.as_deref_mut()?;
        let mut segs = allocated.in_flight.segments_mut();
        let seg = segs.swap_remove(seg as usize);
        let start = offset as usize;
        seg.bytes.get_mut(start..start.checked_add(size as usize)?)
    }

    /// Adds a section of `bytes` to the link, at [`PassPoint::Decoded`]: placed after the
    /// objects' sections of its kind's segment, aligned to `align` (a power of two), its
    /// bytes written before the link's relocations are applied. Give it edges with
    /// [`GraphView::add_edge`]; an error at another point.
    pub fn add_section(
        &mut self,
        name: &str,
        kind: NewSectionKind,
        bytes: Vec<u8>,
        align: u64,
    ) -> Result<SectionId, PassError> {
        if self.point != PassPoint::Decoded {
            return Err(format!("add_section({name}) at {:?}: only at Decoded", self.point).into());
        }
        if !align.is_power_of_two() || align > crate::object_file::MAX_SECTION_ALIGN {
            return Err(format!(
                "add_section({name}): alignment {align} is not a power of two up to {:#x}",
                crate::object_file::MAX_SECTION_ALIGN
            )
            .into());
        }
        let segment = match kind {
            NewSectionKind::Code => SEG_RX,
            NewSectionKind::Constants => crate::symbols::SEG_R,
            NewSectionKind::Data => crate::symbols::SEG_RW,
        };
        let sections = &mut self.graph.synthesized.sections;
        sections.push(crate::graph::SynthesizedSection {
            name: name.to_string().into(),
            size: bytes.len() as u64,
            kind: crate::graph::SynthesizedKind::Client(bytes),
            segment,
            align,
            place: Place::Unplaced,
        });
        Ok(SectionId::Synthesized(sections.len() as u32 - 1))
    }

    /// Adds an edge to section `section` at [`PassPoint::Decoded`]: a relocation of type
    /// `kind` (its psABI name, `R_X86_64_64`, `R_AARCH64_ABS64`) at `offset`, to the
    /// global symbol `target` (defined by the link or resolved from outside it) plus
    /// `addend`. The GOT entries and stubs it needs are made with the others'; it is
    /// applied with them. An error at another point, for a type this architecture does
    /// not know, an unknown symbol, or an edge that does not fit the section.
    pub fn add_edge(
        &mut self,
        section: SectionId,
        offset: u64,
        kind: &str,
        target: &str,
        addend: i64,
    ) -> Result<(), PassError> {
        if self.point != PassPoint::Decoded {
            return Err(format!(
                "add_edge({kind} -> {target}) at {:?}: only at Decoded",
                self.point
            )
            .into());
        }
        let linker = &self.graph.linker;
        let row = linker.arch.relocation_named(kind).ok_or_else(|| {
            format!(
                "add_edge: {kind} is not a relocation Kiln applies on {}",
                linker.arch.architecture()
            )
        })?;
        if row.target == crate::arch::Target::Partner {
            return Err(format!(
                "add_edge: {kind} takes its value from a partner relocation at a label; \
                 add the edge its partner computes instead"
            )
            .into());
        }
        let &id = linker
            .global_index
            .get(target.as_bytes())
            .ok_or_else(|| format!("add_edge: no symbol {target} in this link"))?;
        let size = match section {
            SectionId::Input { object, index } => linker
                .objs
                .get(object as usize)
                .and_then(|o| o.sections.get(index as usize))
                .filter(|_| {
                    matches!(
                        linker.places[object as usize][index as usize],
                        Place::At { .. }
                    )
                })
                .map(|s| s.size),
            SectionId::Synthesized(i) => self
                .graph
                .synthesized
                .sections
                .get(i as usize)
                .map(|s| s.size),
        }
        .ok_or_else(|| format!("add_edge: no loaded section {section:?}"))?;
        if offset
            .checked_add(row.field.len())
            .is_none_or(|end| end > size)
        {
            return Err(format!(
                "add_edge: {kind} at {offset:#x} does not fit the section ({size} bytes)"
            )
            .into());
        }
        let edges = &mut self.graph.edges;
        let start = edges.all.len() as u32;
        edges.all.push(crate::graph::Edge {
            offset,
            row,
            key: SymbolId::Global(id),
            addend,
            place_delta: 0,
        });
        edges.lists.push(crate::graph::EdgeList {
            section,
            start,
            end: start + 1,
        });
        Ok(())
    }
}
