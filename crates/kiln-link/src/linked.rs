//! What a link gives back: the linked module, its exports, its sections and symbols as
//! a report, its thread-local template, the image kept for `kiln link`, and the link's
//! figures (times, counts).

use crate::{Architecture, ObjectInput};
use kiln_memory::{FinalizedAllocation, Permission};
use std::borrow::Cow;
use std::time::{Duration, Instant};

/// One segment of a linked module as written, with its target address (see
/// [`LinkOptions::keep_image`](crate::LinkOptions::keep_image)).
#[derive(Debug, Clone)]
pub struct ImageSegment {
    /// Its permission once finalized.
    pub permission: Permission,
    /// Its target address.
    pub address: u64,
    /// Its size in bytes.
    pub size: u64,
    /// Its contents (empty for zero-filled data).
    pub bytes: Vec<u8>,
}

/// A section placed in memory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlacedSection {
    /// The object it came from: an index into [`LinkedModule::objects`].
    pub object: usize,
    /// Its index in that object's section header table.
    pub index: usize,
    /// Its name (`.text.foo`).
    pub name: String,
    /// Its target address.
    pub address: u64,
    /// Its size in bytes.
    pub size: u64,
}

/// What a symbol names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SymbolKind {
    /// Code (`STT_FUNC`, `STT_GNU_IFUNC`).
    Function,
    /// Data (`STT_OBJECT`, `STT_COMMON`).
    Data,
    /// Anything else with an address (`STT_NOTYPE`).
    Other,
}

/// A symbol with its address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SymbolInfo {
    /// Its name.
    pub name: String,
    /// Its target address.
    pub address: u64,
    /// Its size (0 if the object does not say).
    pub size: u64,
    /// What it names.
    pub kind: SymbolKind,
    /// Global (`true`) or local to its object.
    pub global: bool,
}

/// The TLS initialization image of a module.
#[derive(Debug, Clone, Default)]
pub struct TlsTemplate {
    /// Module id passed to `__tls_get_addr`.
    pub module_id: u64,
    /// Initialized part (`.tdata`), relocated.
    pub image: Vec<u8>,
    /// Total block size (`.tdata` + `.tbss`).
    pub size: u64,
    /// Block alignment.
    pub align: u64,
    /// Offset from the thread pointer, when the block was placed in static TLS (it is then
    /// in place already; `None`: a dynamic block, to install).
    pub tp_offset: Option<i64>,
}

/// Largest TLS block of one module (every thread gets a copy).
pub const MAX_TLS_BLOCK: u64 = 1 << 28;

/// Time spent in each phase of a link.
#[derive(Debug, Clone, Copy, Default)]
pub struct LinkTimes {
    /// Parsing objects and archive members.
    pub parse: Duration,
    /// Resolving symbols (including archive member loading).
    pub resolve: Duration,
    /// Laying out sections, GOT and stubs.
    pub layout: Duration,
    /// Copying contents and applying relocations.
    pub fixup: Duration,
    /// Finalizing memory (permissions, icache).
    pub finalize: Duration,
}

/// Counts of one link.
#[derive(Debug, Clone, Copy, Default)]
pub struct LinkCounts {
    /// Objects linked (including archive members).
    pub objects: usize,
    /// Sections placed in memory.
    pub sections: usize,
    /// Relocations applied.
    pub relocations: usize,
    /// GOT entries.
    pub got_entries: usize,
    /// PLT stubs.
    pub plt_stubs: usize,
    /// Bytes of code, constants, data and zero-filled data.
    pub segment_bytes: [u64; 4],
}

/// A linked module: its memory, its exported symbols, what to run at start and end.
#[derive(Debug)]
pub struct LinkedModule {
    /// The memory, finalized.
    pub allocation: FinalizedAllocation,
    /// Global symbols the module defines, sorted by name, with their addresses: exported
    /// ones (default or protected visibility) are what other modules may link against;
    /// the others (hidden, internal) are the module's own (a program's `main` is hidden
    /// in CPython's `python.o`). Names are in one block: a session indexes them without
    /// copying.
    pub exports: crate::SymbolTable,
    /// Initializers in the order to call them (`.preinit_array`, `.init_array` by
    /// priority, `.ctors`).
    pub init: Vec<u64>,
    /// Finalizers in the order to call them (`.fini_array` reversed, `.dtors`).
    pub fini: Vec<u64>,
    /// Address of the module's `.eh_frame` data (terminated), to register with the
    /// unwinder.
    pub eh_frame: Option<u64>,
    /// The Windows x64 unwind table of its COFF objects (their `.pdata`), to register
    /// with `RtlAddFunctionTable`; `None` if no object has one.
    pub function_table: Option<crate::windows_unwind::FunctionTable>,
    /// The address used for `__dso_handle` (for `__cxa_atexit` / `__cxa_finalize`).
    pub dso_handle: u64,
    /// TLS template, if the module has thread-locals.
    pub tls: Option<TlsTemplate>,
    /// Every object linked, the archive members pulled in included, in link order (with
    /// [`LinkOptions::report_sections`](crate::LinkOptions::report_sections); else empty). Members share their archive's bytes.
    pub objects: Vec<ObjectInput>,
    /// Where each section landed (with [`LinkOptions::report_sections`](crate::LinkOptions::report_sections); else empty).
    pub sections: Vec<PlacedSection>,
    /// Every named symbol with an address, local and global, TLS excepted (with
    /// [`LinkOptions::report_sections`](crate::LinkOptions::report_sections); else empty).
    pub symbol_info: Vec<SymbolInfo>,
    /// The code, constants, data and zero-filled segments as written, with their target
    /// addresses (with [`LinkOptions::keep_image`](crate::LinkOptions::keep_image); else empty).
    pub image: Vec<ImageSegment>,
    /// The symbol table of [`LinkedModule::image_elf`], made during the link (with
    /// [`LinkOptions::keep_image`](crate::LinkOptions::keep_image); else `None`, and
    /// `image_elf` makes it from [`LinkedModule::sections`] and
    /// [`LinkedModule::symbol_info`]).
    pub image_symbols: Option<crate::ImageSymbols>,
    /// The instruction set it was linked for.
    pub architecture: Architecture,
    /// Every object linked (archive members included) says its code is built for
    /// branch-target enforcement (AArch64 BTI, in its GNU property note), and so is
    /// Kiln's own (stubs, veneers and resolvers start with `BTI c`): its code may be mapped
    /// guarded (`PROT_BTI`). Always `false` on x86-64.
    pub branch_protected: bool,
    /// Phase times (zero unless [`LinkOptions::times`](crate::LinkOptions::times)).
    pub times: LinkTimes,
    /// Each pass's time, in the order they ran (a client's passes under their names;
    /// empty unless [`LinkOptions::times`](crate::LinkOptions::times)).
    pub pass_times: Vec<(Cow<'static, str>, Duration)>,
    /// Counts.
    pub counts: LinkCounts,
    /// With [`LinkOptions::relocatable`](crate::LinkOptions::relocatable): the module as
    /// an image that can be mapped again ([`crate::relocatable`]), or why it cannot be
    /// one (non-PIC code in low memory, a thread-local initialized with an address, a
    /// client's pass); else `None`. Its segments' bytes are [`LinkedModule::image`].
    pub relocatable: Option<Result<crate::relocatable::RelocatableImage, String>>,
}

impl LinkedModule {
    /// The address of `name` if the module exports it (default or protected visibility).
    pub fn symbol(&self, name: &str) -> Option<u64> {
        let symbol = self.exports.get(self.exports.find(name)?)?;
        symbol.visible.then_some(symbol.address)
    }
}

/// A clock read only when times were asked for.
#[derive(Clone, Copy)]
pub(crate) struct Clock(pub(crate) bool);

impl Clock {
    pub(crate) fn now(self) -> Option<Instant> {
        self.0.then(Instant::now)
    }
    pub(crate) fn since(self, start: Option<Instant>) -> Duration {
        start.map_or(Duration::ZERO, |t| t.elapsed())
    }
}
