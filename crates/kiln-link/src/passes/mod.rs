//! The passes of a link: the pipeline that runs them over the graph (with plugins' passes
//! at their points), and the built-in passes, one per file, each adding its method to
//! [`crate::graph::LinkGraph`], whose data is in [`crate::graph`].

mod allocate;
mod decode_edges;
mod fixup;
mod keep_image;
mod layout_sections;
mod layout_synthesized;
mod read_function_table;
mod read_init_arrays;
mod record_fixups;
mod section_bytes;
mod static_tls;
mod synthesize;
mod tls_image;
mod write_contents;
mod write_got_and_stubs;

use crate::fixup::Resolver;
use crate::graph::{Allocated, LinkGraph, SynthesizedKind};
use crate::image_file::ImageSink;
use crate::linked::Clock;
use crate::pass::{GraphView, PassPoint};
use crate::report::{PlacedSink, Reported};
use crate::symbols::{lossy, Def, Place, SymbolId, SEG_RX};
use crate::{LinkError, LinkOptions};
use std::time::{Duration, Instant};

/// A built-in pass before the memory exists: it cannot read an address.
type PassBefore<'a, 'c> = fn(&mut LinkGraph<'a, 'c>, &LinkOptions<'_>) -> Result<(), LinkError>;

/// A built-in pass after `allocate`: it is given the memory.
type PassAfter<'a, 'c> =
    fn(&mut LinkGraph<'a, 'c>, &mut Allocated, &LinkOptions<'_>) -> Result<(), LinkError>;

/// One step of the link: a built-in pass, or the point where plugins' passes run.
pub(crate) enum Step<P> {
    Builtin(&'static str, P),
    Plugins(PassPoint),
}

/// The passes of a link before its memory is allocated, in order.
fn before_allocation<'a, 'c>() -> [Step<PassBefore<'a, 'c>>; 5] {
    [
        Step::Builtin("layout-sections", LinkGraph::layout_sections),
        Step::Builtin("decode-edges", LinkGraph::decode_edges),
        Step::Plugins(PassPoint::Decoded),
        Step::Builtin("synthesize-got-and-stubs", LinkGraph::synthesize),
        Step::Builtin("layout-synthesized", LinkGraph::layout_synthesized),
    ]
}

/// The passes after `allocate`, in order.
fn after_allocation<'a, 'c>() -> [Step<PassAfter<'a, 'c>>; 10] {
    [
        Step::Plugins(PassPoint::Allocated),
        Step::Builtin("write-contents", LinkGraph::write_contents),
        Step::Builtin("fixup-tls-image", LinkGraph::fixup_tls_image),
        Step::Builtin("place-static-tls", LinkGraph::place_static_tls),
        Step::Builtin("write-got-and-stubs", LinkGraph::write_got_and_stubs),
        Step::Builtin("fixup", LinkGraph::fixup),
        Step::Builtin("read-init-arrays", LinkGraph::read_init_arrays),
        Step::Builtin("read-function-table", LinkGraph::read_function_table),
        Step::Plugins(PassPoint::FixedUp),
        Step::Builtin("keep-image", LinkGraph::keep_image),
    ]
}

/// The clock of a link's passes: one reading per pass boundary with
/// [`LinkOptions::times`], none without.
struct PassClock {
    clock: Clock,
    start: Option<Instant>,
    last: Option<Instant>,
}

impl PassClock {
    /// Records the pass `name` just ended; the time since the last boundary.
    fn lap(
        &mut self,
        graph: &mut LinkGraph<'_, '_>,
        name: std::borrow::Cow<'static, str>,
    ) -> Option<Instant> {
        let now = self.clock.now()?;
        graph
            .pass_times
            .push((name, now - self.last.unwrap_or(now)));
        self.last = Some(now);
        Some(now)
    }

    fn since_start(&self, now: Instant) -> Duration {
        now - self.start.unwrap_or(now)
    }
}

impl<'a, 'c> LinkGraph<'a, 'c> {
    /// Runs every step of the pipeline, with the plugins' passes of `options`: the passes
    /// before allocation, `allocate`, the passes after it. Returns the memory, written,
    /// relocated and not yet finalized. With [`LinkOptions::times`], one clock reading per
    /// pass boundary; else none.
    pub(crate) fn run(&mut self, options: &LinkOptions<'_>) -> Result<Allocated, LinkError> {
        let clock = Clock(options.times);
        let start = clock.now();
        let mut laps = PassClock {
            clock,
            start,
            last: start,
        };
        for step in &before_allocation::<'a, 'c>() {
            match step {
                Step::Builtin(name, pass) => {
                    tracing::trace!(pass = name, "link pass");
                    pass(self, options)?;
                    laps.lap(self, (*name).into());
                }
                Step::Plugins(point) => self.run_plugins(*point, None, options, &mut laps)?,
            }
        }
        let mut memory = self.allocate(options)?;
        if let Some(now) = laps.lap(self, "allocate".into()) {
            self.times.layout = laps.since_start(now);
        }
        let fixup_start = laps.last;
        for step in &after_allocation::<'a, 'c>() {
            match step {
                Step::Builtin(name, pass) => {
                    tracing::trace!(pass = name, "link pass");
                    pass(self, &mut memory, options)?;
                    laps.lap(self, (*name).into());
                }
                Step::Plugins(point) => {
                    self.run_plugins(*point, Some(&mut memory), options, &mut laps)?
                }
            }
        }
        if let (Some(now), Some(from)) = (laps.last, fixup_start) {
            self.times.fixup = now - from;
        }
        Ok(memory)
    }

    /// The plugins' passes of `options` registered for `point`.
    fn run_plugins(
        &mut self,
        point: PassPoint,
        mut memory: Option<&mut Allocated>,
        options: &LinkOptions<'_>,
        laps: &mut PassClock,
    ) -> Result<(), LinkError> {
        for (at, pass) in options.passes {
            if *at != point {
                continue;
            }
            let mut view = GraphView::new(self, memory.as_deref_mut(), point);
            pass.run(&mut view).map_err(|source| LinkError::Pass {
                pass: pass.name().to_string(),
                source,
            })?;
            laps.lap(self, pass.name().to_string().into());
        }
        Ok(())
    }

    /// The global symbols the module defines, sorted by name (see
    /// [`crate::LinkedModule::exports`]).
    pub(crate) fn exports(
        &self,
        allocated: &Allocated,
    ) -> Result<crate::SymbolTable, crate::NamesTooLarge> {
        let linker = &self.linker;
        let resolver = Resolver::new(linker, allocated, &self.synthesized.stubs);
        // The exported globals sorted by name before any is copied: small keys move, not
        // the exports. Most names differ in their first 16 bytes, compared as one integer
        // (names hold no NUL, so zero padding keeps the bytes' order); the whole names
        // only on a tie.
        let mut order: Vec<(u128, u32)> = Vec::with_capacity(linker.globals.len());
        for (id, g) in linker.globals.iter().enumerate() {
            if matches!(g.def, Def::Defined { .. } | Def::Common { .. }) && !g.tls {
                order.push((name_prefix(g.name), id as u32));
            }
        }
        // Definitions reached through call-through stubs: the module's own.
        for &(id, _, _) in &linker.routed {
            order.push((name_prefix(linker.globals[id as usize].name), id));
        }
        let name = |id: u32| linker.globals[id as usize].name;
        // By prefix (the tuple's own order, compared inline), then runs of one prefix
        // (names alike in their first 16 bytes) by their whole names.
        order.sort_unstable();
        let mut run = 0;
        while run < order.len() {
            let prefix = order[run].0;
            let mut end = run + 1;
            while order.get(end).is_some_and(|&(p, _)| p == prefix) {
                end += 1;
            }
            if end - run > 1 {
                order[run..end].sort_unstable_by(|&(_, a), &(_, b)| name(a).cmp(name(b)));
            }
            run = end;
        }
        let entry = |id: u32| {
            let g = &linker.globals[id as usize];
            let visible = match g.def {
                Def::Defined { obj, sym, .. } => {
                    let s = &linker.objs[obj as usize].symbols[sym as usize];
                    s.visibility == object::elf::STV_DEFAULT.0
                        || s.visibility == object::elf::STV_PROTECTED.0
                }
                _ => true,
            };
            let routed = linker.routed.binary_search_by_key(&id, |&(g, _, _)| g);
            match routed {
                Ok(i) => {
                    let (_, obj, sym) = linker.routed[i];
                    (resolver.address(SymbolId::Local(obj, sym)).0, false)
                }
                Err(_) => (resolver.address(SymbolId::Global(id)).0, visible),
            }
        };
        // The names in one block, in the table's order (the text made at its size, then
        // shared: no string per name), checked as UTF-8 together.
        let bytes = order.iter().map(|&(_, id)| name(id).len()).sum();
        let mut table = crate::symbol_table::TableFromBytes::with_capacity(order.len(), bytes);
        for &(_, id) in &order {
            let (address, visible) = entry(id);
            table.push(name(id), address, visible, false)?;
        }
        if let Some(table) = table.finish() {
            return Ok(table);
        }
        // A name that is not UTF-8 is kept as its lossy text, whose bytes sort elsewhere
        // (U+FFFD is EF BF BD): the table is then ordered by the text it holds.
        order.sort_by_cached_key(|&(_, id)| lossy(name(id)));
        let mut table = crate::SymbolTable::builder(order.len(), bytes);
        for &(_, id) in &order {
            let (address, visible) = entry(id);
            table.push(&lossy(name(id)), address, visible, false)?;
        }
        Ok(table.finish())
    }

    /// Where every section and symbol landed ([`LinkOptions::report_sections`]).
    pub(crate) fn report(
        &self,
        allocated: &Allocated,
    ) -> (Vec<crate::PlacedSection>, Vec<crate::SymbolInfo>) {
        let mut reported = Reported::default();
        self.visit_placed(allocated, &mut reported);
        (reported.sections, reported.symbols)
    }

    /// The symbol table of the image file ([`LinkOptions::keep_image`]), from the graph.
    pub(crate) fn image_symbols(&self, allocated: &Allocated) -> crate::ImageSymbols {
        let symbols = self.linker.globals.len() + self.counts.sections;
        let mut sink = ImageSink::new(&self.image, symbols);
        self.visit_placed(allocated, &mut sink);
        sink.finish()
    }

    /// Shows `sink` every placed section and symbol (see
    /// [`crate::symbols::Linker::visit_placed`]), and a pass's own sections as symbols
    /// named after them (debuggers and profilers see them).
    fn visit_placed<'s>(&'s self, allocated: &Allocated, sink: &mut impl PlacedSink<'s>) {
        let linker = &self.linker;
        let resolver = Resolver::new(linker, allocated, &self.synthesized.stubs);
        let tlsdesc = self
            .layout
            .tlsdesc_offset
            .map_or(0, |o| allocated.bases[SEG_RX] + o);
        linker.visit_placed(&resolver, &self.synthesized.stub_list, tlsdesc, sink);
        for section in &self.synthesized.sections {
            if let (SynthesizedKind::Client(_), Place::At { seg, offset }) =
                (&section.kind, section.place)
            {
                let kind = if seg as usize == SEG_RX {
                    crate::SymbolKind::Function
                } else {
                    crate::SymbolKind::Data
                };
                let address = allocated.bases[seg as usize] + offset;
                let name = std::borrow::Cow::Borrowed(section.name.as_bytes());
                sink.symbol(name, address, section.size, kind, false);
            }
        }
    }
}

/// The first 16 bytes of `name`, zero-padded, as a big-endian integer: ordered as the
/// bytes are.
fn name_prefix(name: &[u8]) -> u128 {
    let mut prefix = [0u8; 16];
    let n = name.len().min(16);
    prefix[..n].copy_from_slice(&name[..n]);
    u128::from_be_bytes(prefix)
}
