//! The passes of a link: the pipeline that runs them over the graph (with plugins' passes
//! at their points), and the built-in passes, one per file, each adding its method to
//! [`crate::graph::LinkGraph`], whose data is in [`crate::graph`].

mod allocate;
mod decode_edges;
mod fixup;
mod keep_image;
mod layout_sections;
mod layout_synthesized;
mod read_init_arrays;
mod static_tls;
mod synthesize;
mod tls_image;
mod write_contents;
mod write_got_and_stubs;

use crate::fixup::Resolver;
use crate::graph::{allocation, LinkGraph, SynthesizedKind};
use crate::linked::Clock;
use crate::pass::{GraphView, PassPoint};
use crate::symbols::{lossy, Def, Place, SymbolId, SEG_RX};
use crate::{LinkError, LinkOptions};

/// A built-in pass.
type BuiltinPass<'a, 'c> = fn(&mut LinkGraph<'a, 'c>, &LinkOptions<'_>) -> Result<(), LinkError>;

/// One step of the link: a built-in pass, or the point where plugins' passes run.
pub(crate) enum Step<'a, 'c> {
    Builtin(&'static str, BuiltinPass<'a, 'c>),
    Plugins(PassPoint),
}

/// The passes of a link, in order.
fn pipeline<'a, 'c>() -> [Step<'a, 'c>; 15] {
    [
        Step::Builtin("layout-sections", LinkGraph::layout_sections),
        Step::Builtin("decode-edges", LinkGraph::decode_edges),
        Step::Plugins(PassPoint::Decoded),
        Step::Builtin("synthesize-got-and-stubs", LinkGraph::synthesize),
        Step::Builtin("layout-synthesized", LinkGraph::layout_synthesized),
        Step::Builtin("allocate", LinkGraph::allocate),
        Step::Plugins(PassPoint::Allocated),
        Step::Builtin("write-contents", LinkGraph::write_contents),
        Step::Builtin("fixup-tls-image", LinkGraph::fixup_tls_image),
        Step::Builtin("place-static-tls", LinkGraph::place_static_tls),
        Step::Builtin("write-got-and-stubs", LinkGraph::write_got_and_stubs),
        Step::Builtin("fixup", LinkGraph::fixup),
        Step::Builtin("read-init-arrays", LinkGraph::read_init_arrays),
        Step::Plugins(PassPoint::FixedUp),
        Step::Builtin("keep-image", LinkGraph::keep_image),
    ]
}

impl<'a, 'c> LinkGraph<'a, 'c> {
    /// Runs every step of the pipeline, with the plugins' passes of `options`. With
    /// [`LinkOptions::times`], one clock reading per pass boundary; else none.
    pub(crate) fn run(&mut self, options: &LinkOptions<'_>) -> Result<(), LinkError> {
        let clock = Clock(options.times);
        let phase_start = clock.now();
        let mut last = phase_start;
        let mut fixup_start = phase_start;
        for step in &pipeline::<'a, 'c>() {
            match step {
                Step::Builtin(name, pass) => {
                    tracing::trace!(pass = name, "link pass");
                    pass(self, options)?;
                    let Some(now) = clock.now() else { continue };
                    self.pass_times
                        .push(((*name).into(), now - last.unwrap_or(now)));
                    last = Some(now);
                    // Phase times, as LinkTimes reports them.
                    match *name {
                        "allocate" => {
                            self.times.layout = now - phase_start.unwrap_or(now);
                            fixup_start = Some(now);
                        }
                        "keep-image" => self.times.fixup = now - fixup_start.unwrap_or(now),
                        _ => {}
                    }
                }
                Step::Plugins(point) => {
                    for (at, pass) in options.passes {
                        if at == point {
                            let mut view = GraphView::new(self, *point);
                            pass.run(&mut view).map_err(|source| LinkError::Pass {
                                pass: pass.name().to_string(),
                                source,
                            })?;
                            let Some(now) = clock.now() else { continue };
                            self.pass_times
                                .push((pass.name().to_string().into(), now - last.unwrap_or(now)));
                            last = Some(now);
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// The global symbols the module defines, sorted by name (see
    /// [`crate::LinkedModule::exports`]).
    pub(crate) fn exports(&mut self) -> Vec<crate::Export> {
        let linker = &self.linker;
        let allocated = allocation(&mut self.allocated);
        let resolver = Resolver::new(linker, allocated, &self.synthesized.stubs);
        let mut exports = Vec::with_capacity(linker.globals.len());
        for (id, g) in linker.globals.iter().enumerate() {
            let visible = match g.def {
                Def::Defined { obj, sym, .. } => {
                    let s = &linker.objs[obj as usize].symbols[sym as usize];
                    s.visibility == object::elf::STV_DEFAULT.0
                        || s.visibility == object::elf::STV_PROTECTED.0
                }
                Def::Common { .. } => true,
                _ => continue,
            };
            if g.tls {
                continue;
            }
            let (address, _) = resolver.address(SymbolId::Global(id as u32));
            let name: std::sync::Arc<str> = match std::str::from_utf8(g.name) {
                Ok(name) => name.into(),
                Err(_) => lossy(g.name).into(),
            };
            exports.push(crate::Export {
                name,
                address,
                visible,
            });
        }
        exports.sort_unstable_by(|a, b| a.name.cmp(&b.name));
        exports
    }

    /// Where every section and symbol landed ([`LinkOptions::report_sections`]).
    pub(crate) fn report(&mut self) -> (Vec<crate::PlacedSection>, Vec<crate::SymbolInfo>) {
        let linker = &self.linker;
        let allocated = allocation(&mut self.allocated);
        let resolver = Resolver::new(linker, allocated, &self.synthesized.stubs);
        let tlsdesc = self
            .layout
            .tlsdesc_offset
            .map_or(0, |o| allocated.bases[SEG_RX] + o);
        let (sections, mut symbols) =
            linker.report(&resolver, &self.synthesized.stub_list, tlsdesc);
        // A pass's own sections, named as symbols (debuggers and profilers see them).
        for section in &self.synthesized.sections {
            if let (SynthesizedKind::Client(_), Place::At { seg, offset }) =
                (&section.kind, section.place)
            {
                symbols.push(crate::SymbolInfo {
                    name: section.name.to_string(),
                    address: allocated.bases[seg as usize] + offset,
                    size: section.size,
                    kind: if seg as usize == SEG_RX {
                        crate::SymbolKind::Function
                    } else {
                        crate::SymbolKind::Data
                    },
                    global: false,
                });
            }
        }
        (sections, symbols)
    }
}
