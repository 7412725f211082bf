//! The link graph and the passes over it.
//!
//! Once symbols are resolved ([`crate::symbols`]) the link is a graph: every object's
//! sections (each to be placed in a segment), every relocation decoded once into an
//! [`Edge`] (offset, the architecture's row for its type, target, addend), the GOT entries
//! and stubs the edges need, the segments' layout and, after allocation, their addresses.
//! The link is the list of named passes of `pipeline()` over it; a plugin's passes
//! ([`crate::LinkPass`]) run at the [`crate::PassPoint`]s between them.

use crate::arch::{Check, Relocation, Target};
use crate::fixup::{write_got, write_plt, Resolver, TlsPlace};
use crate::object_file::{
    ObjSection, SHT_FINI_ARRAY, SHT_INIT_ARRAY, SHT_NOBITS, SHT_PREINIT_ARRAY,
};
use crate::pass::{GraphView, PassPoint};
use crate::symbols::{
    is_eh_frame, is_init_section, lossy, priority, segment_of, Def, Key, Linker, Place, Slot,
    SEG_BSS, SEG_R, SEG_RW, SEG_RX, SEG_TLS,
};
use crate::{ImageSegment, LinkCounts, LinkError, LinkOptions, LinkTimes, MAX_TLS_BLOCK};
use kiln_memory::{AllocationRequest, InFlightAllocation, Permission, SegmentRequest};
use object::LittleEndian as LE;
use rustc_hash::FxHashMap;

/// One relocation, decoded: where, what (the architecture's table row), to what.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Edge {
    /// Offset in its section.
    pub(crate) offset: u64,
    /// The relocation type's row.
    pub(crate) row: &'static Relocation,
    /// The target symbol.
    pub(crate) key: Key,
    /// The addend.
    pub(crate) addend: i64,
}

/// The edges of one section.
#[derive(Debug)]
pub(crate) struct EdgeList {
    pub(crate) obj: u32,
    pub(crate) section: u32,
    pub(crate) edges: Vec<Edge>,
}

/// Segment permissions, by segment index.
pub(crate) const PERMISSIONS: [Permission; 4] = [
    Permission::ReadExecute,
    Permission::Read,
    Permission::ReadWrite,
    Permission::ReadWrite,
];

/// Where the link's own pieces are, once laid out.
#[derive(Debug, Default)]
pub(crate) struct Layout {
    pub(crate) seg_size: [u64; 4],
    pub(crate) seg_align: [u64; 4],
    pub(crate) tls_size: u64,
    pub(crate) tls_align: u64,
    /// The initialized part of the TLS block: up to the end of the last `.tdata`.
    pub(crate) tls_image_len: u64,
    pub(crate) eh_frames: Vec<(u32, u32)>,
    pub(crate) init_sections: Vec<(u32, u32)>,
    pub(crate) dso_offset: u64,
    pub(crate) plt_offset: u64,
    pub(crate) tlsdesc_offset: Option<u64>,
    pub(crate) got_offset: u64,
    pub(crate) eh_offset: Option<u64>,
    pub(crate) eh_terminator: Option<u64>,
}

/// What the edges need the link to make: GOT entries and stubs.
#[derive(Debug, Default)]
pub(crate) struct Synthesized {
    pub(crate) slots: FxHashMap<Slot, u64>,
    pub(crate) slot_list: Vec<Slot>,
    pub(crate) stubs: FxHashMap<Key, u64>,
    pub(crate) stub_list: Vec<Key>,
    /// Non-PIC absolute references: the module goes to the low 2 GiB.
    pub(crate) needs_low: bool,
    /// Initial-exec, local-exec or TLS-descriptor code: the block goes to static TLS.
    pub(crate) needs_static_tls: bool,
}

/// The link's memory, once allocated.
pub(crate) struct Allocated {
    pub(crate) in_flight: InFlightAllocation,
    pub(crate) bases: [u64; 4],
    pub(crate) got_base: u64,
    pub(crate) plt_base: u64,
    pub(crate) dso_handle: u64,
    pub(crate) tls_module: u64,
}

/// The whole link in progress.
pub(crate) struct LinkGraph<'a, 'c> {
    pub(crate) linker: Linker<'a, 'c>,
    pub(crate) edges: Vec<EdgeList>,
    pub(crate) layout: Layout,
    pub(crate) synthesized: Synthesized,
    pub(crate) allocated: Option<Allocated>,
    pub(crate) tls_image: Vec<u8>,
    pub(crate) tp_offset: Option<i64>,
    pub(crate) init: Vec<u64>,
    pub(crate) fini: Vec<u64>,
    pub(crate) image: Vec<ImageSegment>,
    pub(crate) counts: LinkCounts,
    pub(crate) times: LinkTimes,
    /// Each pass's time, in order (plugins' passes under their own names).
    pub(crate) pass_times: Vec<(std::borrow::Cow<'static, str>, std::time::Duration)>,
}

/// A built-in pass.
type BuiltinPass<'a, 'c> = fn(&mut LinkGraph<'a, 'c>, &LinkOptions<'_>) -> Result<(), LinkError>;

/// The link's memory, which the `allocate` pass made: every pass after it writes there.
/// Takes the field alone, so that the graph's other fields stay borrowable beside it.
fn allocation(allocated: &mut Option<Allocated>) -> &mut Allocated {
    allocated
        .as_mut()
        .expect("the allocate pass runs before the passes that use the memory")
}

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

/// Saturating placement of a piece of `sec_size` bytes aligned to `sec_align` at the end
/// of a segment: absurd sizes from a damaged object end up huge and are refused before
/// any offset is used.
pub(crate) fn place(size: &mut u64, align: &mut u64, sec_size: u64, sec_align: u64) -> u64 {
    let sec_align = sec_align
        .max(1)
        .checked_next_power_of_two()
        .unwrap_or(1 << 63);
    let offset = size.checked_next_multiple_of(sec_align).unwrap_or(u64::MAX);
    *size = offset.saturating_add(sec_size);
    *align = (*align).max(sec_align);
    offset
}

impl<'a, 'c> LinkGraph<'a, 'c> {
    pub(crate) fn new(linker: Linker<'a, 'c>, times: LinkTimes) -> Self {
        let counts = LinkCounts {
            objects: linker.objs.len(),
            ..LinkCounts::default()
        };
        LinkGraph {
            linker,
            edges: Vec::new(),
            layout: Layout {
                seg_align: [16; 4],
                tls_align: 1,
                ..Layout::default()
            },
            synthesized: Synthesized::default(),
            allocated: None,
            tls_image: Vec::new(),
            tp_offset: None,
            init: Vec::new(),
            fini: Vec::new(),
            image: Vec::new(),
            counts,
            times,
            pass_times: Vec::new(),
        }
    }

    /// Runs every step of the pipeline, with the plugins' passes of `options`. With
    /// [`LinkOptions::times`], one clock reading per pass boundary; else none.
    pub(crate) fn run(&mut self, options: &LinkOptions<'_>) -> Result<(), LinkError> {
        let clock = crate::link::Clock(options.times);
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

    fn first_object(&self) -> String {
        self.linker
            .objs
            .first()
            .map_or_else(String::new, |o| o.name.to_string())
    }

    /// Gives each loaded section its segment and offset; `.eh_frame` waits until the end
    /// of the constants, init arrays are noted.
    fn layout_sections(&mut self, _: &LinkOptions<'_>) -> Result<(), LinkError> {
        let linker = &mut self.linker;
        let l = &mut self.layout;
        for oi in 0..linker.objs.len() {
            for si in 0..linker.objs[oi].sections.len() {
                if linker.places[oi][si] == Place::Discarded {
                    continue;
                }
                let sec = linker.objs[oi].sections[si];
                let Some(seg) = segment_of(&sec) else {
                    continue;
                };
                if is_eh_frame(&sec) {
                    l.eh_frames.push((oi as u32, si as u32));
                    continue;
                }
                if is_init_section(&sec) {
                    if seg == SEG_TLS {
                        return Err(LinkError::Malformed {
                            object: linker.objs[oi].name.to_string(),
                            what: format!(
                                "initializer section {} is marked thread-local (SHF_TLS)",
                                lossy(sec.name)
                            ),
                        });
                    }
                    l.init_sections.push((oi as u32, si as u32));
                }
                self.counts.sections += 1;
                let offset = if seg == SEG_TLS {
                    let offset = place(&mut l.tls_size, &mut l.tls_align, sec.size, sec.align);
                    if sec.sh_type != SHT_NOBITS {
                        l.tls_image_len = l.tls_size;
                    }
                    offset
                } else {
                    let s = seg as usize;
                    place(&mut l.seg_size[s], &mut l.seg_align[s], sec.size, sec.align)
                };
                linker.places[oi][si] = Place::At { seg, offset };
            }
        }
        // Commons go to the zero-filled segment.
        for g in &mut linker.globals {
            if let Def::Common { size, align } = g.def {
                g.common_place = place(
                    &mut l.seg_size[SEG_BSS],
                    &mut l.seg_align[SEG_BSS],
                    size,
                    align,
                );
            }
        }
        // __dso_handle, if used: 8 bytes of data.
        l.dso_offset = place(&mut l.seg_size[SEG_RW], &mut l.seg_align[SEG_RW], 8, 8);
        Ok(())
    }

    /// Decodes every relocation of every loaded section (and of `.eh_frame`) once: its
    /// type's row, its target, its addend. A type the architecture does not know is an
    /// error here, before any memory is allocated.
    fn decode_edges(&mut self, _: &LinkOptions<'_>) -> Result<(), LinkError> {
        let linker = &self.linker;
        let arch = linker.arch;
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
                let mut edges = Vec::with_capacity(relas.len());
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
                    edges.push(Edge {
                        offset,
                        row,
                        key,
                        addend: rela.r_addend.get(LE),
                    });
                }
                self.edges.push(EdgeList {
                    obj: oi as u32,
                    section: target,
                    edges,
                });
            }
        }
        Ok(())
    }

    /// GOT entries and stubs for the edges that need them.
    fn synthesize(&mut self, _: &LinkOptions<'_>) -> Result<(), LinkError> {
        // A host symbol whose address a checked non-call reference takes gets a stub if it
        // is a function: the context says which (asked once per symbol).
        let mut ask = Vec::new();
        for list in &self.edges {
            for edge in &list.edges {
                if let (Target::Symbol, Key::Global(g)) = (edge.row.target, edge.key) {
                    let global = &self.linker.globals[g as usize];
                    if edge.row.check != Check::None
                        && matches!(global.def, Def::External(_))
                        && global.external_function.is_none()
                        && !ask.contains(&g)
                    {
                        ask.push(g);
                    }
                }
            }
        }
        for g in ask {
            let global = &self.linker.globals[g as usize];
            let (name, Def::External(address)) = (lossy(global.name), global.def) else {
                continue;
            };
            // Asked once: an unknown answer (`Other`) is remembered as "not a function".
            let kind = self.linker.ctx.symbol_kind(&name, address);
            self.linker.globals[g as usize].external_function = Some(kind);
        }
        let linker = &self.linker;
        let s = &mut self.synthesized;
        // Stubs and the TLS resolver come after the code: a margin for them (a module
        // whose code alone nears a call's reach calls its own functions through stubs).
        let code_beyond_reach =
            self.layout.seg_size[SEG_RX].saturating_add(16 << 20) >= linker.arch.call_reach();
        for list in &self.edges {
            for edge in &list.edges {
                let (row, key) = (edge.row, edge.key);
                let mut add_slot = |slot: Slot| {
                    if let std::collections::hash_map::Entry::Vacant(e) = s.slots.entry(slot) {
                        let words = if matches!(slot, Slot::Address(_) | Slot::TpOff(_)) {
                            1
                        } else {
                            2
                        };
                        e.insert(s.slot_list.len() as u64);
                        for _ in 0..words {
                            s.slot_list.push(slot);
                        }
                    }
                };
                match row.target {
                    Target::GotEntry => add_slot(Slot::Address(key)),
                    Target::TlsGdEntry => add_slot(Slot::TlsGd(key)),
                    Target::TlsLdEntry => add_slot(Slot::TlsLd),
                    Target::TpOffEntry => {
                        s.needs_static_tls = true;
                        add_slot(Slot::TpOff(key));
                    }
                    Target::TpOff => s.needs_static_tls = true,
                    Target::TlsDescEntry => {
                        s.needs_static_tls = true;
                        add_slot(Slot::TlsDesc(key));
                    }
                    Target::Call | Target::Plt | Target::Symbol
                        if row.target != Target::Symbol || row.check != Check::None =>
                    {
                        if row.needs_low_memory() {
                            s.needs_low = true;
                        }
                        // Calls to (and, in non-PIC code, addresses of) functions that may
                        // be out of reach go through a stub next to the code; an undefined
                        // weak function gets one too, jumping to 0 as a static link's
                        // would. Code larger than a call reaches calls its own functions
                        // through stubs too (range-extension veneers).
                        let call = row.target != Target::Symbol;
                        let far = match key {
                            Key::Global(g) => {
                                let global = &linker.globals[g as usize];
                                // Data is never reached through a stub: a call is assumed
                                // to target a function, other references must know.
                                let function = call
                                    || global.external_function
                                        == Some(crate::SymbolKind::Function);
                                function
                                    && (matches!(global.def, Def::External(_))
                                        || (global.def == Def::Zero && call))
                            }
                            Key::Local(..) => false,
                        } || (call && code_beyond_reach);
                        if far && !s.stubs.contains_key(&key) {
                            add_slot(Slot::Address(key));
                            s.stubs.insert(key, s.stub_list.len() as u64);
                            s.stub_list.push(key);
                        }
                    }
                    _ => {}
                }
            }
        }
        Ok(())
    }

    /// Places the stubs, the TLS-descriptor resolver, the GOT and `.eh_frame`, and checks
    /// the sizes.
    fn layout_synthesized(&mut self, _: &LinkOptions<'_>) -> Result<(), LinkError> {
        let arch = self.linker.arch;
        let l = &mut self.layout;
        let s = &self.synthesized;
        l.plt_offset = place(
            &mut l.seg_size[SEG_RX],
            &mut l.seg_align[SEG_RX],
            s.stub_list.len() as u64 * arch.stub_size(),
            16,
        );
        let has_tlsdesc = s.slot_list.iter().any(|s| matches!(s, Slot::TlsDesc(_)));
        l.tlsdesc_offset = has_tlsdesc.then(|| {
            place(
                &mut l.seg_size[SEG_RX],
                &mut l.seg_align[SEG_RX],
                arch.tlsdesc_static_resolver().len() as u64,
                16,
            )
        });
        l.got_offset = place(
            &mut l.seg_size[SEG_R],
            &mut l.seg_align[SEG_R],
            (s.slot_list.len() as u64).max(1) * 8,
            8,
        );
        // eh_frame last in R, contiguous, plus a zero terminator.
        for &(oi, si) in &l.eh_frames {
            let sec = self.linker.objs[oi as usize].sections[si as usize];
            let offset = place(
                &mut l.seg_size[SEG_R],
                &mut l.seg_align[SEG_R],
                sec.size,
                sec.align.max(4),
            );
            l.eh_offset.get_or_insert(offset);
            self.linker.places[oi as usize][si as usize] = Place::At {
                seg: SEG_R as u8,
                offset,
            };
            self.counts.sections += 1;
        }
        l.eh_terminator = l
            .eh_offset
            .map(|_| place(&mut l.seg_size[SEG_R], &mut l.seg_align[SEG_R], 4, 4));
        self.counts.got_entries = s.slot_list.len();
        self.counts.plt_stubs = s.stub_list.len();
        self.counts.segment_bytes = l.seg_size;
        let (tls_size, seg_size) = (l.tls_size, l.seg_size);
        if tls_size > MAX_TLS_BLOCK {
            return Err(LinkError::Malformed {
                object: self.first_object(),
                what: format!(
                    "thread-local sections add up to {tls_size:#x} bytes, more than the {MAX_TLS_BLOCK:#x} Kiln gives one module's TLS block"
                ),
            });
        }
        const MAX_SEGMENT: u64 = 1 << 40;
        if let Some(s) = seg_size
            .iter()
            .chain([&tls_size])
            .find(|&&s| s > MAX_SEGMENT)
        {
            return Err(LinkError::Malformed {
                object: self.first_object(),
                what: format!("sections add up to {s:#x} bytes in one segment (over 1 TiB)"),
            });
        }
        Ok(())
    }

    /// Asks the memory manager for the four segments (the low one for non-PIC code), and
    /// the executor for a TLS module id if there are thread-locals.
    fn allocate(&mut self, options: &LinkOptions<'_>) -> Result<(), LinkError> {
        let memory = match (self.synthesized.needs_low, options.low_memory) {
            (true, Some(low)) => low,
            _ => options.memory,
        };
        let l = &self.layout;
        let mut request = AllocationRequest::new();
        for (s, &permission) in PERMISSIONS.iter().enumerate() {
            let mut seg = SegmentRequest::new(permission, l.seg_size[s], l.seg_align[s]);
            if s == SEG_BSS {
                seg = seg.zero_filled();
            }
            request = request.segment(seg);
        }
        let in_flight = memory.allocate(&request)?;
        let bases: [u64; 4] = std::array::from_fn(|s| in_flight.target(s).unwrap_or(0));
        let tls_module = if l.tls_size > 0 {
            self.linker
                .ctx
                .tls_module_id()
                .map_err(LinkError::Environment)?
        } else {
            0
        };
        self.allocated = Some(Allocated {
            in_flight,
            bases,
            got_base: bases[SEG_R] + l.got_offset,
            plt_base: bases[SEG_RX] + l.plt_offset,
            dso_handle: bases[SEG_RW] + l.dso_offset,
            tls_module,
        });
        Ok(())
    }

    /// Copies every section's contents to its place; unused code is the architecture's
    /// trap pattern, `__dso_handle` holds its own address.
    fn write_contents(&mut self, _: &LinkOptions<'_>) -> Result<(), LinkError> {
        // Only the initialized part of the TLS block is an image (`.tbss` is zeros by
        // definition), so a huge `.tbss` costs nothing here.
        let tls_image_len = self.layout.tls_image_len as usize;
        let mut tls_image = Vec::new();
        tls_image
            .try_reserve_exact(tls_image_len)
            .map_err(|_| LinkError::Malformed {
                object: self.first_object(),
                what: format!("no memory for a TLS image of {tls_image_len} bytes"),
            })?;
        tls_image.resize(tls_image_len, 0);
        let trap = self.linker.arch.trap();
        let dso_offset = self.layout.dso_offset as usize;
        let linker = &self.linker;
        let allocated = allocation(&mut self.allocated);
        let dso_handle = allocated.dso_handle;
        let mut segs = allocated.in_flight.segments_mut();
        // Each byte is written once: sections' contents, then what lies between them —
        // the trap pattern in code, zeros elsewhere (the GOT, stubs and `.eh_frame`'s
        // terminator are written by later passes).
        let mut covered: [smallvec::SmallVec<[(usize, usize); 8]>; 3] = Default::default();
        for oi in 0..linker.objs.len() {
            for (si, sec) in linker.objs[oi].sections.iter().enumerate() {
                let Place::At { seg, offset } = linker.places[oi][si] else {
                    continue;
                };
                if sec.sh_type == SHT_NOBITS {
                    continue;
                }
                let start = offset as usize;
                if seg == SEG_TLS {
                    tls_image[start..start + sec.data.len()].copy_from_slice(sec.data);
                    continue;
                }
                let seg = seg as usize;
                segs[seg].bytes[start..start + sec.data.len()].copy_from_slice(sec.data);
                if let Some(list) = covered.get_mut(seg) {
                    list.push((start, start + sec.data.len()));
                }
            }
        }
        for (seg, list) in covered.iter_mut().enumerate() {
            list.sort_unstable();
            let bytes = &mut *segs[seg].bytes;
            let len = bytes.len();
            let mut fill = |from: usize, to: usize| {
                if from >= to {
                    return;
                }
                if seg == SEG_RX {
                    // The pattern repeats every 4 bytes from the segment's start (code is
                    // 4-aligned on AArch64).
                    for (i, b) in bytes[from..to].iter_mut().enumerate() {
                        *b = trap[(from + i) % 4];
                    }
                } else {
                    bytes[from..to].fill(0);
                }
            };
            let mut at = 0;
            for &(start, end) in list.iter() {
                fill(at, start);
                at = at.max(end);
            }
            fill(at, len);
        }
        // `__dso_handle` holds its own address, as crtbeginS.o's does: g++ passes its
        // address to `__cxa_atexit`, libc_nonshared's `atexit` passes its value.
        segs[SEG_RW].bytes[dso_offset..dso_offset + 8].copy_from_slice(&dso_handle.to_le_bytes());
        if let Some(end) = self.layout.eh_terminator {
            segs[SEG_R].bytes[end as usize..end as usize + 4].fill(0);
        }
        drop(segs);
        self.tls_image = tls_image;
        Ok(())
    }

    /// Relocations of the TLS image come first: a block placed in static TLS is copied
    /// into every thread as it is now.
    fn fixup_tls_image(&mut self, _: &LinkOptions<'_>) -> Result<(), LinkError> {
        self.apply_edges(true)
    }

    /// Initial-exec, local-exec and TLS-descriptor code need the block in static TLS; the
    /// offset it gets is what their relocations need.
    fn place_static_tls(&mut self, _: &LinkOptions<'_>) -> Result<(), LinkError> {
        let l = &self.layout;
        if !self.synthesized.needs_static_tls || l.tls_size == 0 {
            return Ok(());
        }
        let module = allocation(&mut self.allocated).tls_module;
        let (size, align) = (self.layout.tls_size, self.layout.tls_align);
        let offset = self
            .linker
            .ctx
            .place_static_tls(module, &self.tls_image, size, align)
            .map_err(|reason| LinkError::StaticTls {
                object: self.first_object(),
                size,
                reason,
            })?;
        self.tp_offset = Some(offset);
        Ok(())
    }

    /// The GOT's entries, the stubs, the TLS-descriptor resolver.
    fn write_got_and_stubs(&mut self, _: &LinkOptions<'_>) -> Result<(), LinkError> {
        let tls = self.tls_place();
        let linker = &self.linker;
        let l = &self.layout;
        let s = &self.synthesized;
        let allocated = allocation(&mut self.allocated);
        let resolver = Resolver::new(linker, allocated, &s.stubs);
        let tlsdesc_resolver = l.tlsdesc_offset.map_or(0, |o| allocated.bases[SEG_RX] + o);
        let mut segs = allocated.in_flight.segments_mut();
        write_got(
            &mut segs[SEG_R].bytes[l.got_offset as usize..],
            &s.slot_list,
            &resolver,
            tls,
            tlsdesc_resolver,
        );
        write_plt(
            segs[SEG_RX].bytes,
            &s.stub_list,
            &s.slots,
            &resolver,
            l.plt_offset,
        )?;
        if let Some(at) = l.tlsdesc_offset {
            let code = linker.arch.tlsdesc_static_resolver();
            let at = at as usize;
            segs[SEG_RX].bytes[at..at + code.len()].copy_from_slice(code);
        }
        Ok(())
    }

    /// Every other relocation.
    fn fixup(&mut self, _: &LinkOptions<'_>) -> Result<(), LinkError> {
        self.apply_edges(false)
    }

    fn tls_place(&self) -> TlsPlace {
        TlsPlace {
            module: self.allocated.as_ref().map_or(0, |a| a.tls_module),
            tp_offset: self.tp_offset,
        }
    }

    /// Applies the edges of the TLS image's sections (`tls_image`) or of the others.
    fn apply_edges(&mut self, tls_image: bool) -> Result<(), LinkError> {
        let tls = self.tls_place();
        let linker = &self.linker;
        let s = &self.synthesized;
        let allocated = allocation(&mut self.allocated);
        let resolver = Resolver::new(linker, allocated, &s.stubs);
        let bases = allocated.bases;
        let mut segs = allocated.in_flight.segments_mut();
        for list in &self.edges {
            let (oi, target) = (list.obj as usize, list.section as usize);
            let obj = &linker.objs[oi];
            let Place::At { seg, offset } = linker.places[oi][target] else {
                continue;
            };
            if (seg == SEG_TLS) != tls_image {
                continue;
            }
            let sec: ObjSection<'_> = obj.sections[target];
            let range = offset as usize..offset.saturating_add(sec.size) as usize;
            let (section_bytes, section_addr): (Option<&mut [u8]>, u64) = if seg == SEG_TLS {
                (self.tls_image.get_mut(range), offset)
            } else {
                let seg = seg as usize;
                (segs[seg].bytes.get_mut(range), bases[seg] + offset)
            };
            let Some(section_bytes) = section_bytes.filter(|_| sec.sh_type != SHT_NOBITS) else {
                return Err(LinkError::Malformed {
                    object: obj.name.to_string(),
                    what: format!(
                        "relocations for section {}, which has no contents",
                        lossy(sec.name)
                    ),
                });
            };
            for edge in &list.edges {
                self.counts.relocations += 1;
                resolver.apply(
                    oi as u32,
                    &sec,
                    section_bytes,
                    section_addr,
                    edge,
                    &s.slots,
                    tls,
                )?;
            }
        }
        Ok(())
    }

    /// Initializers and finalizers, read back from the relocated arrays, in the order to
    /// call them.
    fn read_init_arrays(&mut self, _: &LinkOptions<'_>) -> Result<(), LinkError> {
        let linker = &self.linker;
        let allocated = allocation(&mut self.allocated);
        // Every entry must be code of this module: a pointer elsewhere (a corrupt or
        // crafted array) is refused here, before anything runs, in process as out of it.
        let code = allocated.bases[SEG_RX]..allocated.bases[SEG_RX] + self.layout.seg_size[SEG_RX];
        let segs = allocated.in_flight.segments_mut();
        let read_array = |oi: u32, si: u32| -> Result<Vec<u64>, LinkError> {
            let sec = linker.objs[oi as usize].sections[si as usize];
            // Layout placed every initializer section it listed.
            let Place::At { seg, offset } = linker.places[oi as usize][si as usize] else {
                return Ok(Vec::new());
            };
            let entries: Vec<u64> = segs[seg as usize].bytes
                [offset as usize..(offset + sec.size) as usize]
                .chunks_exact(8)
                .map(|c| u64::from_le_bytes(c.try_into().unwrap_or([0; 8])))
                .filter(|&f| f != 0 && f != u64::MAX)
                .collect();
            if let Some((i, f)) = entries.iter().enumerate().find(|(_, f)| !code.contains(f)) {
                return Err(LinkError::Malformed {
                    object: linker.objs[oi as usize].name.to_string(),
                    what: format!(
                        "section {}: entry {i} is {f:#x}, outside the module's code ({:#x}..{:#x}): an initializer or finalizer must be a function of the module",
                        String::from_utf8_lossy(sec.name),
                        code.start,
                        code.end
                    ),
                });
            }
            Ok(entries)
        };
        let mut pre = Vec::new();
        let mut inits: Vec<(u32, usize, Vec<u64>)> = Vec::new();
        let mut ctors = Vec::new();
        let mut finis: Vec<(u32, usize, Vec<u64>)> = Vec::new();
        let mut dtors = Vec::new();
        for (n, &(oi, si)) in self.layout.init_sections.iter().enumerate() {
            let sec = linker.objs[oi as usize].sections[si as usize];
            let entries = read_array(oi, si)?;
            match sec.sh_type {
                SHT_PREINIT_ARRAY => pre.extend(entries),
                SHT_INIT_ARRAY => inits.push((priority(sec.name, b".init_array"), n, entries)),
                SHT_FINI_ARRAY => finis.push((priority(sec.name, b".fini_array"), n, entries)),
                _ if sec.name.starts_with(b".ctors") => ctors.extend(entries),
                _ => dtors.extend(entries),
            }
        }
        inits.sort_by_key(|&(prio, n, _)| (prio, n));
        finis.sort_by_key(|&(prio, n, _)| (prio, n));
        self.init.extend(pre);
        for (_, _, e) in inits {
            self.init.extend(e);
        }
        self.init.extend(ctors.into_iter().rev());
        let mut fini_forward = Vec::new();
        for (_, _, e) in finis {
            fini_forward.extend(e);
        }
        self.fini.extend(fini_forward.into_iter().rev());
        self.fini.extend(dtors);
        Ok(())
    }

    /// A copy of the segments as written, with [`LinkOptions::keep_image`].
    fn keep_image(&mut self, options: &LinkOptions<'_>) -> Result<(), LinkError> {
        if !options.keep_image {
            return Ok(());
        }
        let seg_size = self.layout.seg_size;
        let allocated = allocation(&mut self.allocated);
        let bases = allocated.bases;
        let segs = allocated.in_flight.segments_mut();
        self.image = (0..4)
            .map(|s| ImageSegment {
                permission: PERMISSIONS[s],
                address: bases[s],
                size: seg_size[s],
                bytes: if s == SEG_BSS {
                    Vec::new()
                } else {
                    segs[s].bytes[..seg_size[s] as usize].to_vec()
                },
            })
            .collect();
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
            let (address, _) = resolver.address(Key::Global(id as u32));
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
        linker.report(&resolver, &self.synthesized.stub_list, tlsdesc)
    }
}
