//! The link graph and the passes over it.
//!
//! Once symbols are resolved ([`crate::symbols`]) the link is a graph: every object's
//! sections (each to be placed in a segment), every relocation decoded once into an
//! [`Edge`] (offset, the architecture's row for its type, target, addend), the GOT entries
//! and stubs the edges need, the segments' layout and, after allocation, their addresses.
//! The link is the list of named passes of `pipeline()` over it; a plugin's passes
//! ([`crate::LinkPass`]) run at the [`crate::PassPoint`]s between them.

use crate::arch::Relocation;
use crate::symbols::{Linker, Place, Slot, SymbolId};
use crate::SectionId;
use crate::{ImageSegment, LinkCounts, LinkTimes};
use kiln_memory::{InFlightAllocation, Permission};
use rustc_hash::FxHashMap;

/// One relocation, decoded: where, what (the architecture's table row), to what.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Edge {
    /// Offset in its section.
    pub(crate) offset: u64,
    /// The relocation type's row.
    pub(crate) row: &'static Relocation,
    /// The target symbol.
    pub(crate) key: SymbolId,
    /// The addend.
    pub(crate) addend: i64,
    /// Where the formula's place P is, from the patched bytes: 0 but for a low part
    /// paired with its high part (RISC-V `%pcrel_lo`), whose P is the high part's.
    pub(crate) place_delta: i32,
}

/// The edges of one section: a range of [`Edges::all`]. A section may have several
/// lists (a pass's edges come after the object's).
#[derive(Debug, Clone, Copy)]
pub(crate) struct EdgeList {
    pub(crate) section: SectionId,
    pub(crate) start: u32,
    pub(crate) end: u32,
}

/// Every edge of the link in one array (sized from the relocation counts before it is
/// filled: no allocation per section), and which sections they belong to.
#[derive(Debug, Default)]
pub(crate) struct Edges {
    pub(crate) all: Vec<Edge>,
    pub(crate) lists: Vec<EdgeList>,
}

impl Edges {
    /// The edges of `list`.
    pub(crate) fn of(&self, list: &EdgeList) -> &[Edge] {
        &self.all[list.start as usize..list.end as usize]
    }
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

/// What a synthesized section holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum SynthesizedKind {
    /// The GOT: one or two words per [`Synthesized::slot_list`] entry.
    Got,
    /// The stubs: one per [`Synthesized::stub_list`] entry. On AArch64 they are also the
    /// veneers of calls beyond a branch's reach.
    Stubs,
    /// The code that resolves TLS descriptors of static-TLS blocks.
    TlsDescResolver,
    /// A client pass's section, with its bytes.
    Client(Vec<u8>),
}

/// A section the link makes, or a client pass adds: a section of the graph like an
/// object's, placed after them in its segment.
#[derive(Debug, Clone)]
pub(crate) struct SynthesizedSection {
    pub(crate) name: std::borrow::Cow<'static, str>,
    pub(crate) kind: SynthesizedKind,
    /// Its segment (`SEG_RX`, `SEG_R` or `SEG_RW`).
    pub(crate) segment: usize,
    pub(crate) size: u64,
    pub(crate) align: u64,
    pub(crate) place: Place,
}

/// What the edges need the link to make: GOT entries and stubs.
#[derive(Debug, Default)]
pub(crate) struct Synthesized {
    /// The sections the link made and client passes added, by
    /// [`SectionId::Synthesized`] index.
    pub(crate) sections: Vec<SynthesizedSection>,
    pub(crate) slots: FxHashMap<Slot, u64>,
    pub(crate) slot_list: Vec<Slot>,
    pub(crate) stubs: FxHashMap<SymbolId, u64>,
    pub(crate) stub_list: Vec<SymbolId>,
    /// Non-PIC absolute references: the module goes to the low 2 GiB.
    pub(crate) needs_low: bool,
    /// Initial-exec, local-exec or TLS-descriptor code: the block goes to static TLS.
    pub(crate) needs_static_tls: bool,
}

/// The link's memory, which the `allocate` pass makes: the passes after it are given it,
/// the passes before it cannot read an address (there is none yet).
pub(crate) struct Allocated {
    pub(crate) in_flight: InFlightAllocation,
    pub(crate) bases: [u64; 4],
    /// The module's lowest address: what `Relative::ImageBase` values count from.
    pub(crate) image_base: u64,
    pub(crate) got_base: u64,
    pub(crate) plt_base: u64,
    pub(crate) dso_handle: u64,
    pub(crate) tls_module: u64,
}

/// The whole link in progress.
pub(crate) struct LinkGraph<'a, 'c> {
    pub(crate) linker: Linker<'a, 'c>,
    pub(crate) edges: Edges,
    pub(crate) layout: Layout,
    pub(crate) synthesized: Synthesized,
    pub(crate) tls_image: Vec<u8>,
    pub(crate) tp_offset: Option<i64>,
    pub(crate) init: Vec<u64>,
    pub(crate) fini: Vec<u64>,
    /// COFF objects' unwind table (`.pdata`), from `read-function-table` on.
    pub(crate) function_table: Option<crate::windows_unwind::FunctionTable>,
    pub(crate) image: Vec<ImageSegment>,
    /// Whether the link is relocatable (see [`crate::relocatable`]; its fixups are kept
    /// by `record_fixups`, after `fixup`), from `allocate` on.
    pub(crate) relocatable: bool,
    pub(crate) counts: LinkCounts,
    pub(crate) times: LinkTimes,
    /// Each pass's time, in order (plugins' passes under their own names).
    pub(crate) pass_times: Vec<(std::borrow::Cow<'static, str>, std::time::Duration)>,
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
            edges: Edges::default(),
            layout: Layout {
                seg_align: [16; 4],
                tls_align: 1,
                ..Layout::default()
            },
            synthesized: Synthesized::default(),
            tls_image: Vec::new(),
            tp_offset: None,
            init: Vec::new(),
            fini: Vec::new(),
            function_table: None,
            image: Vec::new(),
            relocatable: false,
            counts,
            times,
            pass_times: Vec::new(),
        }
    }

    pub(crate) fn first_object(&self) -> String {
        self.linker
            .objs
            .first()
            .map_or_else(String::new, |o| o.name.to_string())
    }
}
