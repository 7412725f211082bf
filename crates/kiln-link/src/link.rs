//! The link driver and what it returns: parse the objects, resolve symbols (loading the
//! archive members they need), then run the passes of the link graph (lay out, synthesize
//! GOT entries and stubs, allocate, write, fix up — with a plugin's passes between them)
//! and finalize.

use crate::graph::LinkGraph;
use crate::linked::{Clock, LinkTimes, LinkedModule, SymbolKind, TlsTemplate};
use crate::object_file::{Binding, ObjectFile};
use crate::pass::{LinkPass, PassPoint};
use crate::symbols::{Linker, Origin};
use crate::{Architecture, ArchiveInput, LinkError, ObjectInput};
use kiln_memory::MemoryManager;
use std::borrow::Cow;
use std::sync::Arc;

/// What the linker asks of its environment (the session or the executor).
pub trait LinkContext {
    /// Address of a symbol the link's own inputs do not define: another module's, a host
    /// function's or a shared library's. `None` if nobody defines it.
    fn resolve(&mut self, name: &str) -> Option<u64>;

    /// [`LinkContext::resolve`] for many names at once, in order (one round trip to an
    /// executor in another process instead of one per name).
    fn resolve_many(&mut self, names: &[&str]) -> Vec<Option<u64>> {
        names.iter().map(|n| self.resolve(n)).collect()
    }

    /// Addresses of names that code linked *earlier* into the same namespace defines
    /// (another module of the session's library), asked before archive members are pulled
    /// for them: a member already linked is used, not linked twice. `None` for the rest
    /// (the default: nothing is linked earlier).
    fn resolve_defined(&mut self, names: &[&str]) -> Vec<Option<u64>> {
        vec![None; names.len()]
    }

    /// Addresses of names the link's own namespace (the session's library, not its search
    /// order) defines already: a weak definition of the link's inputs with default or
    /// protected visibility gives way to them, as a weak definition gives way to a strong
    /// one in ELF (two copies of an `inline` or `linkonce_odr` function, the second linked
    /// later). `None` for the rest (the default: the namespace is empty).
    fn defined_here(&mut self, names: &[&str]) -> Vec<Option<u64>> {
        vec![None; names.len()]
    }

    /// Whether references to the inputs' own functions may be routed elsewhere
    /// ([`LinkContext::called_through`] is asked only when this answers yes; the default
    /// is no).
    fn routes_calls(&self) -> bool {
        false
    }

    /// Addresses that every reference to the inputs' own definitions of `names` is to
    /// reach instead of the definition: call-through stubs, through which a definition is
    /// replaced later (`kiln::Jit::link_swappable`). Asked for functions of default or
    /// protected visibility (not thread-locals) when [`LinkContext::routes_calls`] says
    /// so, before weak definitions give way. A routed definition stays in the module,
    /// listed in its exports under its name as the module's own (not visible to other
    /// modules: the stub is what they reach). `None` binds references to the definition,
    /// as the default does for every name.
    fn called_through(&mut self, names: &[&str]) -> Vec<Option<u64>> {
        vec![None; names.len()]
    }

    /// A fresh thread-local-storage module id for this link's TLS block, passed to
    /// `__tls_get_addr` by general- and local-dynamic code; an error if the executor
    /// cannot give one.
    fn tls_module_id(&mut self) -> Result<u64, String>;

    /// Places the TLS block of module `module_id` in static TLS — one offset from the
    /// thread pointer in every thread, initialized from `image` — and returns that offset.
    /// Needed by initial-exec, local-exec and TLS-descriptor code; the default refuses.
    fn place_static_tls(
        &mut self,
        module_id: u64,
        image: &[u8],
        size: u64,
        align: u64,
    ) -> Result<i64, String> {
        let _ = (module_id, image, size, align);
        Err("this executor has no static TLS".into())
    }

    /// The kind of the symbol `name`, which [`LinkContext::resolve`] found at `address`:
    /// a [`SymbolKind::Function`] may be reached through a stub by any far reference,
    /// anything else ([`SymbolKind::Other`] when unknown) only by calls.
    fn symbol_kind(&mut self, name: &str, address: u64) -> SymbolKind {
        let _ = (name, address);
        SymbolKind::Other
    }

    /// [`LinkContext::symbol_kind`] of several symbols at once (one request to an executor
    /// in another process): what the link asks, once per link.
    fn symbol_kinds(&mut self, symbols: &[(&str, u64)]) -> Vec<SymbolKind> {
        symbols
            .iter()
            .map(|&(name, address)| self.symbol_kind(name, address))
            .collect()
    }
}

/// Options of one link.
pub struct LinkOptions<'m> {
    /// Where code and data go: must lie within ±2 GiB of the host's libraries for code
    /// compiled as PIE.
    pub memory: &'m dyn MemoryManager,
    /// Memory in the low 2 GiB, for objects with absolute 32-bit relocations (non-PIC
    /// code); without it such objects fail to link if their addresses do not fit.
    pub low_memory: Option<&'m dyn MemoryManager>,
    /// Also report where every section landed and every symbol
    /// ([`LinkedModule::sections`], [`LinkedModule::symbol_info`]): for plugins,
    /// debuggers and profilers; off, the link does not spend time on it.
    pub report_sections: bool,
    /// The instruction set of the objects and of the executor that runs the code (the
    /// trap pattern, stubs and relocations follow it, not the host).
    pub architecture: Architecture,
    /// Also keep a copy of the linked bytes with their target addresses
    /// ([`LinkedModule::image`]): for a link-only run that writes what it linked to a
    /// file, and for tests.
    pub keep_image: bool,
    /// Passes of the link's client (a session's plugins), each run at its point of the
    /// link ([`PassPoint`]); an error from one fails the link.
    pub passes: &'m [(PassPoint, Arc<dyn LinkPass>)],
    /// Make the module relocatable ([`LinkedModule::relocatable`]): calls of host
    /// functions through stubs, and every field whose value depends on where the module
    /// is or on the process recorded. `memory` must lay modules out as one span
    /// ([`kiln_memory::SpanMemoryManager`]); the segments' bytes are kept as with
    /// [`LinkOptions::keep_image`].
    pub relocatable: bool,
    /// Measure each phase and pass ([`LinkedModule::times`], [`LinkedModule::pass_times`]);
    /// off, the link reads no clock (a small module's link is a few microseconds, and a
    /// clock read costs tens of nanoseconds).
    pub times: bool,
}

impl<'m> LinkOptions<'m> {
    /// Options for a link into `memory` for this process's architecture, nothing else
    /// asked.
    pub fn new(memory: &'m dyn MemoryManager) -> Self {
        LinkOptions {
            memory,
            low_memory: None,
            report_sections: false,
            architecture: Architecture::host(),
            keep_image: false,
            passes: &[],
            relocatable: false,
            times: false,
        }
    }
}

/// Whether work over `items` pieces of `work` units in all (bytes, relocations) is spread
/// over the cores: only for several pieces and at least `threshold` units (a small
/// module's link stays on the calling thread, and never starts the thread pool).
pub(crate) fn parallel(items: usize, work: usize, threshold: usize) -> bool {
    items > 1 && work >= threshold && rayon::current_num_threads() > 1
}

/// [`ObjectInput::check`] of every object, on every core when they are several and large
/// (as a link parses them); the first error in their order, as one by one.
pub fn check_objects(
    objects: &mut [ObjectInput],
    architecture: Architecture,
) -> Result<(), LinkError> {
    let bytes = objects.iter().map(|o| o.data.len()).sum();
    if parallel(objects.len(), bytes, PARALLEL_BYTES) {
        use rayon::prelude::*;
        let results: Vec<_> = objects
            .par_iter_mut()
            .map(|o| o.check(architecture))
            .collect();
        results.into_iter().collect()
    } else {
        objects.iter_mut().try_for_each(|o| o.check(architecture))
    }
}

/// Input bytes from which a link parses on every core.
const PARALLEL_BYTES: usize = 2 << 20;

/// Links `objects` (and the members of `archives` they need) into one module.
pub fn link<'a>(
    objects: &'a [ObjectInput],
    archives: &'a [ArchiveInput],
    ctx: &mut dyn LinkContext,
    options: &LinkOptions<'_>,
) -> Result<LinkedModule, LinkError> {
    let mut times = LinkTimes::default();
    let clock = Clock(options.times);
    let t = clock.now();
    // One parse per object: the one ObjectInput::check kept, or made here — on every
    // core when the link is large enough to pay for it, in the inputs' order either way.
    let unchecked: usize = objects
        .iter()
        .filter(|o| o.checked(options.architecture).is_none())
        .map(|o| o.data.len())
        .sum();
    let parse = |input: &'a ObjectInput| -> Result<Cow<'a, ObjectFile<'a>>, LinkError> {
        if let Some(error) = input.built_mismatch(options.architecture) {
            return Err(error);
        }
        Ok(match input.checked(options.architecture) {
            Some(checked) => Cow::Borrowed(checked),
            None => Cow::Owned(ObjectFile::parse(
                input.name.as_str(),
                &input.data,
                options.architecture,
            )?),
        })
    };
    let parsed: Vec<Cow<'a, ObjectFile<'a>>> = if parallel(objects.len(), unchecked, PARALLEL_BYTES)
    {
        use rayon::prelude::*;
        // Every result first, then the first error in the inputs' order (as on one
        // thread), not whichever thread failed first.
        let results: Vec<_> = objects.par_iter().map(parse).collect();
        results.into_iter().collect::<Result<_, _>>()?
    } else {
        objects.iter().map(parse).collect::<Result<_, _>>()?
    };
    times.parse = clock.since(t);
    let t = clock.now();
    let mut linker = Linker::new(archives, options.architecture.arch(), ctx);
    // Room for every non-local symbol of the inputs at once (archive members add more).
    let globals: usize = parsed
        .iter()
        .map(|o| {
            o.symbols
                .iter()
                .filter(|s| s.binding != Binding::Local)
                .count()
        })
        .sum();
    linker.globals.reserve(globals);
    linker.global_index.reserve(globals);
    for (i, obj) in parsed.into_iter().enumerate() {
        linker.origins.push(Origin::Input(i));
        linker.add_object(obj)?;
    }
    // Archive members are parsed while resolving; their parse time counts as resolve.
    linker.pending.reverse();
    linker.load_archive_members()?;
    linker.route_calls_through_stubs();
    linker.yield_weak_definitions();
    linker.resolve_externals()?;
    times.resolve = clock.since(t);

    let mut graph = LinkGraph::new(linker, times);
    let allocated = graph.run(options)?;
    // What the link gives back is timed as steps of its own (they are no pass).
    let mut step = clock.now();
    let mut lap = |graph: &mut LinkGraph<'_, '_>, name: &'static str| {
        if let (Some(now), Some(then)) = (clock.now(), step) {
            graph.pass_times.push((name.into(), now - then));
            step = Some(now);
        }
    };
    let exports = graph.exports(&allocated)?;
    lap(&mut graph, "(exports)");
    let branch_protected = options.architecture == Architecture::Aarch64
        && !graph.linker.objs.is_empty()
        && graph.linker.objs.iter().all(|o| o.branch_protected);
    let (linked_objects, sections, symbol_info) = if options.report_sections {
        let (sections, symbols) = graph.report(&allocated);
        let linked = graph.linker.linked_objects(objects)?;
        lap(&mut graph, "(report)");
        (linked, sections, symbols)
    } else {
        (Vec::new(), Vec::new(), Vec::new())
    };
    let image_symbols = options.keep_image.then(|| graph.image_symbols(&allocated));
    if image_symbols.is_some() {
        lap(&mut graph, "(image symbols)");
    }
    // A relocatable link's fixups, read from what the passes wrote (none kept when a
    // client's pass ran: the image is refused).
    let fixups = options.relocatable.then(|| {
        let fixups = match options.passes.is_empty() {
            true => graph.record_fixups(&allocated),
            false => Err("client passes ran in the link".to_string()),
        };
        (allocated.bases[0], fixups)
    });
    if fixups.is_some() {
        lap(&mut graph, "(record fixups)");
    }
    let t = clock.now();
    let allocation = allocated.in_flight.finalize()?;
    let mut times = graph.times;
    times.finalize = clock.since(t);
    let l = &graph.layout;
    let tls = (l.tls_size > 0).then(|| TlsTemplate {
        module_id: allocated.tls_module,
        image: std::mem::take(&mut graph.tls_image),
        size: l.tls_size,
        align: l.tls_align,
        tp_offset: graph.tp_offset,
    });
    let mut linked = LinkedModule {
        allocation,
        exports,
        init: graph.init,
        fini: graph.fini,
        function_table: graph.function_table,
        eh_frame: l
            .eh_offset
            .map(|o| allocated.bases[crate::symbols::SEG_R] + o),
        dso_handle: allocated.dso_handle,
        tls,
        objects: linked_objects,
        sections,
        symbol_info,
        image: graph.image,
        image_symbols,
        architecture: options.architecture,
        branch_protected,
        times,
        pass_times: graph.pass_times,
        counts: graph.counts,
        relocatable: None,
    };
    if let Some((base, fixups)) = fixups {
        let page = kiln_memory::page_size();
        linked.relocatable = Some(match fixups {
            Err(why) => Err(why),
            Ok(fixups) => crate::relocatable::RelocatableImage::of(&mut linked, base, page, fixups),
        });
    }
    Ok(linked)
}
