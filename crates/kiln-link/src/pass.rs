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
use crate::graph::LinkGraph;
use crate::symbols::{lossy, Key, Place, SEG_RX, SEG_TLS};
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

/// A loaded section, as a pass sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GraphSection {
    /// Index of its object in the link (inputs first, then archive members in the order
    /// they were loaded).
    pub object: usize,
    /// Its index in that object's section header table.
    pub index: usize,
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
    point: PassPoint,
}

impl<'g, 'a, 'c> GraphView<'g, 'a, 'c> {
    pub(crate) fn new(graph: &'g mut LinkGraph<'a, 'c>, point: PassPoint) -> Self {
        GraphView { graph, point }
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

    /// Every loaded section.
    pub fn sections(&self) -> Vec<GraphSection> {
        let linker = &self.graph.linker;
        let bases = self.graph.allocated.as_ref().map(|a| a.bases);
        let mut edges = rustc_hash::FxHashMap::default();
        for list in &self.graph.edges.lists {
            *edges
                .entry((list.obj as usize, list.section as usize))
                .or_insert(0) += (list.end - list.start) as usize;
        }
        let mut out = Vec::new();
        for (oi, obj) in linker.objs.iter().enumerate() {
            for (si, sec) in obj.sections.iter().enumerate() {
                let Place::At { seg, offset } = linker.places[oi][si] else {
                    continue;
                };
                let thread_local = seg == SEG_TLS;
                out.push(GraphSection {
                    object: oi,
                    index: si,
                    name: lossy(sec.name),
                    size: sec.size,
                    code: seg as usize == SEG_RX,
                    thread_local,
                    address: bases
                        .filter(|_| !thread_local)
                        .map(|b| b[seg as usize] + offset),
                    edges: edges.get(&(oi, si)).copied().unwrap_or(0),
                });
            }
        }
        out
    }

    /// The edges of section `index` of object `object` (empty if it has none).
    pub fn edges(&self, object: usize, index: usize) -> Vec<GraphEdge> {
        let linker = &self.graph.linker;
        let edges = &self.graph.edges;
        edges
            .lists
            .iter()
            .filter(|l| l.obj as usize == object && l.section as usize == index)
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
        let allocated = self.graph.allocated.as_ref()?;
        let &id = linker.global_index.get(name.as_bytes())?;
        let resolver = Resolver::new(linker, allocated, &self.graph.synthesized.stubs);
        let (address, discarded) = resolver.address(Key::Global(id));
        (!discarded).then_some(address)
    }

    /// The bytes of section `index` of object `object` as they will run, at
    /// [`PassPoint::FixedUp`] (`None` before, and for thread-local or zero-filled
    /// sections). Changes are the pass's responsibility: the memory is finalized (made
    /// executable, the instruction cache made coherent) after the pass.
    pub fn section_bytes_mut(&mut self, object: usize, index: usize) -> Option<&mut [u8]> {
        if self.point != PassPoint::FixedUp {
            return None;
        }
        let linker = &self.graph.linker;
        let Place::At { seg, offset } = *linker.places.get(object)?.get(index)? else {
            return None;
        };
        let sec = linker.objs[object].sections[index];
        if seg == SEG_TLS || sec.data.is_empty() {
            return None;
        }
        let allocated = self.graph.allocated.as_mut()?;
        let mut segs = allocated.in_flight.segments_mut();
        let seg = segs.swap_remove(seg as usize);
        let start = offset as usize;
        seg.bytes.get_mut(start..start + sec.size as usize)
    }
}
