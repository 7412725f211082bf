//! A linked module as an image that can be mapped again, anywhere and in another process:
//! its segments as written, and the list of *fixups* — the fields whose values depend on
//! where the image is mapped or on the process (host symbols' addresses, thread-local
//! offsets and module ids) — each kept as a symbolic [`Binding`], never as a baked value.
//!
//! A link records them with [`LinkOptions::relocatable`](crate::LinkOptions::relocatable),
//! into memory laid out as one span ([`kiln_memory::SpanMemoryManager`]): every other
//! relocation (PC-relative between the module's own pieces, its GOT included) has the same
//! value wherever the span is mapped, so code pages stay as written. Calls to host
//! functions go through the module's stubs then (a jump through its GOT, whose entries
//! are fixups), so the code itself needs no fixup: only PIE code's direct references to
//! host data do.
//!
//! [`crate::rebind()`] takes a span mapped from such an image (a cache's file, see kiln-cache) and
//! its [`RelocatableImage`], asks the context for the process's values (symbols, TLS),
//! writes the fixups and gives back the module as a link would have.

use crate::arch::{self, Check, Field, InPlaceOp, Relative};
use crate::{Architecture, LinkError};
use kiln_memory::Permission;
use std::sync::Arc;

/// Where a fixup's value comes from, found again at every load.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Binding {
    /// An address in the image: its offset from the span's start.
    Image(u64),
    /// A symbol the image does not define (a host function or variable, another
    /// module's), by name.
    Symbol(Arc<str>),
    /// An address that is the same everywhere (an absolute symbol, an undefined weak 0).
    Absolute(u64),
    /// A thread-local's offset from the thread pointer: the module's static-TLS block's
    /// offset plus this offset in the block.
    TpOff(u64),
    /// The module's TLS module id.
    DtpMod,
}

/// How a fixup's value is computed and written: the relocation's formula (relative to
/// what), range check and field, in a form that outlives the link.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FixupRow {
    pub(crate) relative: Relative,
    pub(crate) check: Check,
    pub(crate) field: Field,
}

impl FixupRow {
    pub(crate) fn of(row: &arch::Relocation) -> Self {
        FixupRow {
            relative: row.relative,
            check: row.check,
            field: row.field,
        }
    }

    /// A 64-bit absolute word (GOT entries).
    pub(crate) fn word64() -> Self {
        FixupRow {
            relative: Relative::Absolute,
            check: Check::None,
            field: Field::Word(8),
        }
    }

    /// Whether the field is changed in place (its old contents are part of the value):
    /// such a field cannot be written again over an image.
    pub(crate) fn in_place(&self) -> bool {
        matches!(
            self.field,
            Field::InPlace { .. } | Field::Low6 { .. } | Field::Uleb128 { .. }
        )
    }

    fn encode(&self, out: &mut Vec<u8>) {
        let relative = match self.relative {
            Relative::Absolute => 0,
            Relative::Place => 1,
            Relative::Page => 2,
            Relative::GotBase => 3,
        };
        let (check, bits) = match self.check {
            Check::None => (0, 0),
            Check::Signed(b) => (1, b),
            Check::Unsigned(b) => (2, b),
            Check::Either(b) => (3, b),
        };
        let op = |op: InPlaceOp| match op {
            InPlaceOp::Add => 0,
            InPlaceOp::Sub => 1,
            InPlaceOp::Set => 2,
        };
        let field: [u8; 5] = match self.field {
            Field::Word(n) => [0, n, 0, 0, 0],
            Field::Imm {
                lsb,
                width,
                shift,
                aligned,
            } => [1, lsb, width, shift, aligned as u8],
            Field::Adr { shift } => [2, shift, 0, 0, 0],
            Field::Movw { group } => [3, group, 0, 0, 0],
            Field::Lo12 { shift } => [4, shift, 0, 0, 0],
            Field::UType => [5, 0, 0, 0, 0],
            Field::IType => [6, 0, 0, 0, 0],
            Field::SType => [7, 0, 0, 0, 0],
            Field::BType => [8, 0, 0, 0, 0],
            Field::JType => [9, 0, 0, 0, 0],
            Field::CallPair => [10, 0, 0, 0, 0],
            Field::CbType => [11, 0, 0, 0, 0],
            Field::CjType => [12, 0, 0, 0, 0],
            Field::CiLui => [13, 0, 0, 0, 0],
            Field::InPlace { bytes, op: o } => [14, bytes, op(o), 0, 0],
            Field::Low6 { op: o } => [15, op(o), 0, 0, 0],
            Field::Uleb128 { op: o } => [16, op(o), 0, 0, 0],
        };
        out.push(relative);
        out.push(check);
        out.push(bits as u8);
        out.extend_from_slice(&field);
    }

    fn decode(r: &mut Reader<'_>) -> Result<Self, String> {
        let b = r.bytes(8)?;
        let relative = match b[0] {
            0 => Relative::Absolute,
            1 => Relative::Place,
            2 => Relative::Page,
            3 => Relative::GotBase,
            n => return Err(format!("unknown formula {n}")),
        };
        let bits = u32::from(b[2]);
        let check = match (b[1], bits) {
            (0, _) => Check::None,
            (1, 1..=64) => Check::Signed(bits),
            (2, 1..=64) => Check::Unsigned(bits),
            (3, 1..=64) => Check::Either(bits),
            (n, _) => return Err(format!("unknown range check {n}/{bits}")),
        };
        let field = match (b[3], b[4]) {
            (0, n @ (1 | 2 | 4 | 8)) => Field::Word(n),
            (1, lsb) if b[5] > 0 && u32::from(lsb) + u32::from(b[5]) <= 32 && b[6] < 64 => {
                Field::Imm {
                    lsb,
                    width: b[5],
                    shift: b[6],
                    aligned: b[7] != 0,
                }
            }
            (2, shift) if shift < 64 => Field::Adr { shift },
            (3, group) if group < 4 => Field::Movw { group },
            (4, shift) if shift < 12 => Field::Lo12 { shift },
            (5, _) => Field::UType,
            (6, _) => Field::IType,
            (7, _) => Field::SType,
            (8, _) => Field::BType,
            (9, _) => Field::JType,
            (10, _) => Field::CallPair,
            (11, _) => Field::CbType,
            (12, _) => Field::CjType,
            (13, _) => Field::CiLui,
            (n, _) => return Err(format!("unknown or in-place field {n}")),
        };
        Ok(FixupRow {
            relative,
            check,
            field,
        })
    }
}

/// One field to write at every load.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageFixup {
    /// Offset of the field from the span's start.
    pub at: u64,
    /// Offset of the formula's place P from the span's start (the field's own, but for a
    /// RISC-V low part, whose P is its high part's).
    pub place: u64,
    /// How the value is computed and written.
    pub row: FixupRow,
    /// Where the value comes from.
    pub binding: Binding,
    /// The relocation's addend.
    pub addend: i64,
    /// For a reference to a host function: the offset of its stub, used when the
    /// function itself is out of the field's reach in this process.
    pub stub: Option<u64>,
}

/// What a link records of its fixups, from every core at once.
#[derive(Debug, Default)]
pub(crate) struct Recorder {
    /// The span's start (the first segment's address).
    pub(crate) base: u64,
    pub(crate) fixups: parking_lot::Mutex<Vec<ImageFixup>>,
    /// Why the module cannot be an image, when it cannot (the first reason found).
    pub(crate) refused: parking_lot::Mutex<Option<String>>,
}

impl Recorder {
    pub(crate) fn new(base: u64) -> Self {
        Recorder {
            base,
            ..Recorder::default()
        }
    }

    pub(crate) fn push(&self, fixup: ImageFixup) {
        self.fixups.lock().push(fixup);
    }

    pub(crate) fn refuse(&self, why: impl FnOnce() -> String) {
        let mut refused = self.refused.lock();
        if refused.is_none() {
            *refused = Some(why());
        }
    }

    /// Whether a value from `binding` computed `relative` to the place is the same
    /// wherever the span is mapped, in any process.
    pub(crate) fn invariant(binding: &Binding, relative: Relative, field: Field) -> bool {
        match binding {
            // The span keeps its layout, and starts on a page: differences between two of
            // its addresses, and between their pages, do not change; nor does an address's
            // offset in its page (AArch64's `:lo12:`).
            Binding::Image(_) => {
                relative != Relative::Absolute || matches!(field, Field::Lo12 { .. })
            }
            Binding::Absolute(_) => relative == Relative::Absolute,
            Binding::Symbol(_) | Binding::TpOff(_) | Binding::DtpMod => false,
        }
    }
}

/// A global symbol of an image: its name, its address, whether it is exported. Laid out
/// as [`crate::Export`] is (32 bytes), so that a load turns the decoded list into the
/// module's in place: a program of 20,000 functions makes no second list of them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageExport {
    /// Its name.
    pub name: Arc<str>,
    /// Its offset in the span, or its absolute value (`absolute`).
    pub value: u64,
    /// `value` is absolute (the same in every process), not an offset in the span.
    pub absolute: bool,
    /// Exported to other modules, or the module's own.
    pub visible: bool,
}

const _: () = assert!(
    std::mem::size_of::<ImageExport>() == std::mem::size_of::<crate::Export>()
        && std::mem::align_of::<ImageExport>() == std::mem::align_of::<crate::Export>()
);

impl ImageExport {
    /// The export of `name` at `address`.
    pub fn new(name: Arc<str>, address: ImageAddress, visible: bool) -> Self {
        let (value, absolute) = match address {
            ImageAddress::Image(o) => (o, false),
            ImageAddress::Absolute(a) => (a, true),
        };
        ImageExport {
            name,
            value,
            absolute,
            visible,
        }
    }

    /// Its address, as an offset in the span or absolute.
    pub fn address(&self) -> ImageAddress {
        if self.absolute {
            ImageAddress::Absolute(self.value)
        } else {
            ImageAddress::Image(self.value)
        }
    }
}

/// A module's address (in the span, or absolute): exports, initializers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ImageAddress {
    /// Offset from the span's start.
    Image(u64),
    /// The same in every process.
    Absolute(u64),
}

impl ImageAddress {
    pub(crate) fn of(address: u64, base: u64, len: u64) -> Self {
        match address.checked_sub(base) {
            // The end of the span too (a symbol at the end of the last segment).
            Some(offset) if offset <= len => ImageAddress::Image(offset),
            _ => ImageAddress::Absolute(address),
        }
    }

    pub(crate) fn at(self, base: u64) -> u64 {
        match self {
            ImageAddress::Image(offset) => base + offset,
            ImageAddress::Absolute(address) => address,
        }
    }
}

/// The thread-locals of an image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageTls {
    /// The initialized part of the block, relocated (it holds no address: a module whose
    /// thread-locals are initialized with addresses is not made an image).
    pub image: Vec<u8>,
    /// The block's size.
    pub size: u64,
    /// The block's alignment.
    pub align: u64,
    /// Whether the block goes to static TLS (initial-exec, local-exec or TLS-descriptor
    /// code).
    pub static_tls: bool,
}

/// Everything of a linked module but its segments' bytes: what [`crate::rebind()`] needs to make
/// the module again from a mapped image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RelocatableImage {
    /// The instruction set.
    pub architecture: Architecture,
    /// Each segment's length and permission, in span order (code, constants, data,
    /// zero-filled data).
    pub segments: Vec<(u64, Permission)>,
    /// The page size the span was laid out with.
    pub page: u64,
    /// The fields to write at every load.
    pub fixups: Vec<ImageFixup>,
    /// Offsets of 64-bit words that hold an offset in the image, to which a load adds the
    /// span's address (as `R_X86_64_RELATIVE` does): most of a program's fixups (its
    /// tables of pointers), kept as 8 bytes each, applied as one addition.
    pub relative: Vec<u64>,
    /// The module's global symbols (sorted by name), with whether each is exported.
    pub exports: Vec<ImageExport>,
    /// Initializers, in order.
    pub init: Vec<ImageAddress>,
    /// Finalizers, in order.
    pub fini: Vec<ImageAddress>,
    /// The `.eh_frame` data's offset.
    pub eh_frame: Option<u64>,
    /// `__dso_handle`'s offset.
    pub dso_handle: u64,
    /// Thread-locals.
    pub tls: Option<ImageTls>,
    /// See [`crate::LinkedModule::branch_protected`].
    pub branch_protected: bool,
    /// Every named symbol (local ones too) with its address and size, as plugins are told
    /// of a linked module (debuggers, profilers): kept when the link reported them
    /// ([`LinkOptions::report_sections`](crate::LinkOptions::report_sections)), else
    /// `None`.
    pub symbols: Option<Vec<ImageSymbol>>,
}

/// A symbol of an image, for plugins (see [`crate::SymbolInfo`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageSymbol {
    /// Its name.
    pub name: String,
    /// Where it is.
    pub address: ImageAddress,
    /// Its size.
    pub size: u64,
    /// What it names.
    pub kind: crate::SymbolKind,
    /// Global, or local to its object.
    pub global: bool,
}

/// The version of [`RelocatableImage::encode`]'s format.
const FORMAT: u32 = 1;

impl RelocatableImage {
    /// The span layout the image is mapped with.
    pub fn layout(&self) -> Result<kiln_memory::SpanLayout, LinkError> {
        kiln_memory::SpanLayout::new(&self.segments, self.page).map_err(LinkError::from)
    }

    /// The image's description as bytes (a private format, versioned: a cache seals and
    /// checks them; [`RelocatableImage::decode`] reads them back).
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Vec::with_capacity(64 + self.fixups.len() * 40 + self.exports.len() * 32);
        put_u32(&mut w, FORMAT);
        w.push(self.architecture as u8);
        put_u64(&mut w, self.page);
        put_u32(&mut w, self.segments.len() as u32);
        for &(len, permission) in &self.segments {
            put_u64(&mut w, len);
            w.push(permission.index() as u8);
        }
        put_u32(&mut w, self.fixups.len() as u32);
        for f in &self.fixups {
            put_u64(&mut w, f.at);
            put_u64(&mut w, f.place);
            f.row.encode(&mut w);
            match &f.binding {
                Binding::Image(o) => {
                    w.push(0);
                    put_u64(&mut w, *o)
                }
                Binding::Symbol(name) => {
                    w.push(1);
                    put_str(&mut w, name)
                }
                Binding::Absolute(a) => {
                    w.push(2);
                    put_u64(&mut w, *a)
                }
                Binding::TpOff(o) => {
                    w.push(3);
                    put_u64(&mut w, *o)
                }
                Binding::DtpMod => w.push(4),
            }
            put_u64(&mut w, f.addend as u64);
            put_u64(&mut w, f.stub.map_or(u64::MAX, |s| s));
        }
        put_u32(&mut w, self.relative.len() as u32);
        for at in &self.relative {
            put_u64(&mut w, *at);
        }
        put_u32(&mut w, self.exports.len() as u32);
        for e in &self.exports {
            put_str(&mut w, &e.name);
            put_address(&mut w, e.address());
            w.push(e.visible as u8);
        }
        for list in [&self.init, &self.fini] {
            put_u32(&mut w, list.len() as u32);
            for a in list {
                put_address(&mut w, *a);
            }
        }
        put_u64(&mut w, self.eh_frame.unwrap_or(u64::MAX));
        put_u64(&mut w, self.dso_handle);
        match &self.tls {
            Some(t) => {
                w.push(1);
                put_u32(&mut w, t.image.len() as u32);
                w.extend_from_slice(&t.image);
                put_u64(&mut w, t.size);
                put_u64(&mut w, t.align);
                w.push(t.static_tls as u8);
            }
            None => w.push(0),
        }
        w.push(self.branch_protected as u8);
        match &self.symbols {
            Some(symbols) => {
                w.push(1);
                put_u32(&mut w, symbols.len() as u32);
                for s in symbols {
                    put_str(&mut w, &s.name);
                    put_address(&mut w, s.address);
                    put_u64(&mut w, s.size);
                    w.push(match s.kind {
                        crate::SymbolKind::Function => 0,
                        crate::SymbolKind::Data => 1,
                        crate::SymbolKind::Other => 2,
                    });
                    w.push(s.global as u8);
                }
            }
            None => w.push(0),
        }
        w
    }

    /// Reads what [`RelocatableImage::encode`] wrote; a description that is truncated,
    /// of another format version, or inconsistent is an error saying what is wrong.
    pub fn decode(bytes: &[u8]) -> Result<Self, String> {
        Self::decode_with(bytes, true)
    }

    /// [`RelocatableImage::decode`], reading the symbols only if `symbols` (they are for
    /// plugins, and the longest part of a large program's description): without,
    /// [`RelocatableImage::symbols`] is `Some` and empty if the image has them.
    pub fn decode_with(bytes: &[u8], symbols: bool) -> Result<Self, String> {
        let want_symbols = symbols;
        let mut r = Reader { bytes, at: 0 };
        let format = r.u32()?;
        if format != FORMAT {
            return Err(format!("format {format}, not {FORMAT}"));
        }
        let architecture = match r.u8()? {
            0 => Architecture::X86_64,
            1 => Architecture::Aarch64,
            2 => Architecture::Riscv64,
            n => return Err(format!("unknown architecture {n}")),
        };
        let page = r.u64()?;
        if !page.is_power_of_two() || !(4096..=1 << 16).contains(&page) {
            return Err(format!("page size {page}"));
        }
        let n = r.count(9)?;
        let mut segments = Vec::with_capacity(n);
        for _ in 0..n {
            let len = r.u64()?;
            let permission = match r.u8()? {
                0 => Permission::ReadExecute,
                1 => Permission::Read,
                2 => Permission::ReadWrite,
                p => return Err(format!("unknown permission {p}")),
            };
            segments.push((len, permission));
        }
        let layout = kiln_memory::SpanLayout::new(&segments, page).map_err(|e| e.to_string())?;
        // Every offset in the image lies in the span (its end included: a symbol may end
        // the last segment).
        let in_span = |o: u64, what: &str| -> Result<u64, String> {
            if o <= layout.len {
                Ok(o)
            } else {
                Err(format!(
                    "{what} at {o:#x} is outside the image ({:#x} bytes)",
                    layout.len
                ))
            }
        };
        let address_in_span = |a: ImageAddress, what: &str| -> Result<ImageAddress, String> {
            if let ImageAddress::Image(o) = a {
                in_span(o, what)?;
            }
            Ok(a)
        };
        let n = r.count(41)?;
        let mut fixups = Vec::with_capacity(n);
        for _ in 0..n {
            let at = r.u64()?;
            let place = r.u64()?;
            let row = FixupRow::decode(&mut r)?;
            let binding = match r.u8()? {
                0 => Binding::Image(in_span(r.u64()?, "a fixup's target")?),
                1 => Binding::Symbol(r.str()?.into()),
                2 => Binding::Absolute(r.u64()?),
                3 => Binding::TpOff(r.u64()?),
                4 => Binding::DtpMod,
                b => return Err(format!("unknown binding {b}")),
            };
            let addend = r.u64()? as i64;
            let stub = Some(r.u64()?).filter(|&s| s != u64::MAX);
            in_span(place, "a fixup's place")?;
            if let Some(stub) = stub {
                in_span(stub, "a stub")?;
            }
            // Every field inside a segment with bytes (never past the span's end).
            let inside = layout.segments.iter().any(|&(offset, len, _)| {
                at >= offset
                    && at
                        .checked_add(row.field.len())
                        .is_some_and(|end| end <= offset + len)
            });
            if !inside {
                return Err(format!("fixup at {at:#x} is outside the image's segments"));
            }
            fixups.push(ImageFixup {
                at,
                place,
                row,
                binding,
                addend,
                stub,
            });
        }
        let n = r.count(8)?;
        let mut relative = Vec::with_capacity(n);
        for _ in 0..n {
            let at = r.u64()?;
            let inside = layout.segments.iter().any(|&(offset, len, _)| {
                at >= offset && at.checked_add(8).is_some_and(|end| end <= offset + len)
            });
            if !inside {
                return Err(format!(
                    "relative word at {at:#x} is outside the image's segments"
                ));
            }
            relative.push(at);
        }
        let n = r.count(10)?;
        let mut exports = Vec::with_capacity(n);
        for _ in 0..n {
            let name: Arc<str> = r.str()?.into();
            let address = address_in_span(r.address()?, "an export")?;
            let visible = r.u8()? != 0;
            exports.push(ImageExport::new(name, address, visible));
        }
        let mut lists = [Vec::new(), Vec::new()];
        for list in &mut lists {
            let n = r.count(9)?;
            for _ in 0..n {
                // Initializers and finalizers are code of the module (or absolute).
                let address = r.address()?;
                if let ImageAddress::Image(o) = address {
                    let code = layout
                        .segments
                        .first()
                        .map_or(0..0, |&(at, len, _)| at..at + len);
                    if !code.contains(&o) {
                        return Err(format!(
                            "an initializer at {o:#x} is not in the image's code"
                        ));
                    }
                }
                list.push(address);
            }
        }
        let [init, fini] = lists;
        let eh_frame = Some(r.u64()?).filter(|&e| e != u64::MAX);
        let dso_handle = r.u64()?;
        let tls = match r.u8()? {
            0 => None,
            _ => {
                let n = r.count(1)?;
                let image = r.bytes(n)?.to_vec();
                let size = r.u64()?;
                let align = r.u64()?;
                let static_tls = r.u8()? != 0;
                if (image.len() as u64) > size || !align.is_power_of_two() {
                    return Err("thread-local block inconsistent".into());
                }
                Some(ImageTls {
                    image,
                    size,
                    align,
                    static_tls,
                })
            }
        };
        let branch_protected = r.u8()? != 0;
        let symbols = match r.u8()? {
            0 => None,
            _ if !want_symbols => {
                // Not read: what follows is only the symbols.
                r.at = bytes.len();
                Some(Vec::new())
            }
            _ => {
                let n = r.count(23)?;
                let mut symbols = Vec::with_capacity(n);
                for _ in 0..n {
                    let name = r.str()?.to_string();
                    let address = address_in_span(r.address()?, "a symbol")?;
                    let size = r.u64()?;
                    let kind = match r.u8()? {
                        0 => crate::SymbolKind::Function,
                        1 => crate::SymbolKind::Data,
                        _ => crate::SymbolKind::Other,
                    };
                    let global = r.u8()? != 0;
                    symbols.push(ImageSymbol {
                        name,
                        address,
                        size,
                        kind,
                        global,
                    });
                }
                Some(symbols)
            }
        };
        if r.at != bytes.len() {
            return Err(format!("{} bytes after the end", bytes.len() - r.at));
        }
        for offset in eh_frame.iter().chain(Some(&dso_handle)) {
            if *offset >= layout.len {
                return Err(format!("offset {offset:#x} outside the image"));
            }
        }
        Ok(RelocatableImage {
            architecture,
            segments,
            page,
            fixups,
            relative,
            exports,
            init,
            fini,
            eh_frame,
            dso_handle,
            tls,
            branch_protected,
            symbols,
        })
    }
}

fn put_u32(w: &mut Vec<u8>, v: u32) {
    w.extend_from_slice(&v.to_le_bytes());
}

fn put_u64(w: &mut Vec<u8>, v: u64) {
    w.extend_from_slice(&v.to_le_bytes());
}

fn put_str(w: &mut Vec<u8>, s: &str) {
    put_u32(w, s.len() as u32);
    w.extend_from_slice(s.as_bytes());
}

fn put_address(w: &mut Vec<u8>, a: ImageAddress) {
    match a {
        ImageAddress::Image(o) => {
            w.push(0);
            put_u64(w, o)
        }
        ImageAddress::Absolute(v) => {
            w.push(1);
            put_u64(w, v)
        }
    }
}

/// Reads the description's fields, every length checked against what is left.
/// (Written by hand: one small private format, read once per load; a serialization
/// framework would add a dependency and a derive to types of the link.)
struct Reader<'b> {
    bytes: &'b [u8],
    at: usize,
}

impl<'b> Reader<'b> {
    fn bytes(&mut self, n: usize) -> Result<&'b [u8], String> {
        let end = self
            .at
            .checked_add(n)
            .filter(|&e| e <= self.bytes.len())
            .ok_or_else(|| format!("truncated at byte {}", self.at))?;
        let b = &self.bytes[self.at..end];
        self.at = end;
        Ok(b)
    }
    fn u8(&mut self) -> Result<u8, String> {
        Ok(self.bytes(1)?[0])
    }
    fn u32(&mut self) -> Result<u32, String> {
        let b = self.bytes(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
    fn u64(&mut self) -> Result<u64, String> {
        let mut v = [0u8; 8];
        v.copy_from_slice(self.bytes(8)?);
        Ok(u64::from_le_bytes(v))
    }
    /// A count of items of at least `min` bytes each: no more than what is left could
    /// hold (a corrupt count allocates nothing huge).
    fn count(&mut self, min: usize) -> Result<usize, String> {
        let n = self.u32()? as usize;
        if n.saturating_mul(min) > self.bytes.len() - self.at {
            return Err(format!(
                "count {n} at byte {} exceeds the data",
                self.at - 4
            ));
        }
        Ok(n)
    }
    fn str(&mut self) -> Result<&'b str, String> {
        let n = self.count(1)?;
        std::str::from_utf8(self.bytes(n)?).map_err(|_| "a name is not UTF-8".to_string())
    }
    fn address(&mut self) -> Result<ImageAddress, String> {
        Ok(match self.u8()? {
            0 => ImageAddress::Image(self.u64()?),
            1 => ImageAddress::Absolute(self.u64()?),
            n => return Err(format!("unknown address kind {n}")),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn image() -> RelocatableImage {
        RelocatableImage {
            architecture: Architecture::X86_64,
            segments: vec![
                (100, Permission::ReadExecute),
                (16, Permission::Read),
                (24, Permission::ReadWrite),
                (8, Permission::ReadWrite),
            ],
            page: 4096,
            fixups: vec![
                ImageFixup {
                    at: 4096,
                    place: 4096,
                    row: FixupRow::word64(),
                    binding: Binding::Symbol("puts".into()),
                    addend: 0,
                    stub: None,
                },
                ImageFixup {
                    at: 10,
                    place: 10,
                    row: FixupRow::of(&arch::Relocation::new(
                        2,
                        "R_X86_64_PC32",
                        arch::Target::Symbol,
                        Relative::Place,
                        Check::Signed(32),
                        Field::Word(4),
                    )),
                    binding: Binding::TpOff(8),
                    addend: -4,
                    stub: Some(96),
                },
            ],
            relative: vec![8192, 8200],
            exports: vec![ImageExport::new(
                "main".into(),
                ImageAddress::Image(0),
                true,
            )],
            init: vec![ImageAddress::Image(16)],
            fini: vec![ImageAddress::Absolute(0x1000)],
            eh_frame: Some(4100),
            dso_handle: 8208,
            tls: Some(ImageTls {
                image: vec![1, 2, 3],
                size: 16,
                align: 8,
                static_tls: true,
            }),
            branch_protected: false,
            symbols: Some(vec![ImageSymbol {
                name: "helper".into(),
                address: ImageAddress::Image(40),
                size: 12,
                kind: crate::SymbolKind::Function,
                global: false,
            }]),
        }
    }

    #[test]
    fn a_description_reads_back_as_written() {
        let image = image();
        assert_eq!(RelocatableImage::decode(&image.encode()), Ok(image));
    }

    #[test]
    fn a_damaged_description_is_an_error_never_a_panic() {
        let bytes = image().encode();
        for len in 0..bytes.len() {
            assert!(
                RelocatableImage::decode(&bytes[..len]).is_err(),
                "cut at {len}"
            );
        }
        // Every byte changed in turn: an error, or a description that still holds
        // together (a changed addend); never a panic or a huge allocation.
        for i in 0..bytes.len() {
            for flip in [0x01u8, 0x80, 0xff] {
                let mut damaged = bytes.clone();
                damaged[i] ^= flip;
                let _ = RelocatableImage::decode(&damaged);
            }
        }
        // A fixup outside the segments is refused.
        let mut outside = image();
        outside.fixups[0].at = 4096 * 5;
        assert!(RelocatableImage::decode(&outside.encode()).is_err());
        let mut outside = image();
        outside.relative[1] = 8192 + 20;
        assert!(RelocatableImage::decode(&outside.encode()).is_err());
    }
}
