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
use kiln_codec::{self as codec, DecodeError, Field as _, Reader, Writer};
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

/// Whether a value from `binding` computed `relative` to the place is the same wherever
/// the span is mapped, in any process (then the field needs no fixup).
pub(crate) fn invariant(binding: &Binding, relative: Relative, field: Field) -> bool {
    match binding {
        // The span keeps its layout, and starts on a page: differences between two of its
        // addresses, and between their pages, do not change; nor does an address's offset
        // in its page (AArch64's `:lo12:`).
        Binding::Image(_) => relative != Relative::Absolute || matches!(field, Field::Lo12 { .. }),
        Binding::Absolute(_) => relative == Relative::Absolute,
        Binding::Symbol(_) | Binding::TpOff(_) | Binding::DtpMod => false,
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
    /// An image table's symbol's address ([`RelocatableImage::exports`]).
    pub fn of_symbol(symbol: &crate::Symbol<'_>) -> Self {
        if symbol.absolute {
            ImageAddress::Absolute(symbol.address)
        } else {
            ImageAddress::Image(symbol.address)
        }
    }

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
    pub relative: crate::RelativeWords,
    /// The module's global symbols (sorted by name), with whether each is exported: an
    /// address is an offset in the span unless the symbol says it is absolute.
    pub exports: crate::SymbolTable,
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

/// The version of [`RelocatableImage::encode`]'s format (2: on kiln-codec, options for
/// what may be absent).
const FORMAT: u32 = 3;

/// Why an image's description cannot be used: damaged bytes, another format, or fields
/// that do not hold together (an offset outside the image, a fixup outside its segments).
/// A cache takes any of them as a miss.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ImageError {
    /// The bytes do not decode (truncated, an unknown kind, bytes left over).
    #[error("the description does not decode: {0}")]
    Decode(#[from] DecodeError),
    /// Written by another version of the format.
    #[error("format {found}, not {expected}")]
    Format {
        /// The description's.
        found: u32,
        /// This build's.
        expected: u32,
    },
    /// A page size no system uses.
    #[error("page size {0}")]
    PageSize(u64),
    /// Segments that make no span.
    #[error("segments: {0}")]
    Layout(String),
    /// An offset past the image's end.
    #[error("{what} at {offset:#x} is outside the image ({len:#x} bytes)")]
    OutsideImage {
        /// What the offset is of.
        what: &'static str,
        /// The offset.
        offset: u64,
        /// The image's length.
        len: u64,
    },
    /// A field to write that is not inside a segment with bytes.
    #[error("{what} at {at:#x} is outside the image's segments")]
    OutsideSegments {
        /// What the field is.
        what: &'static str,
        /// Its offset.
        at: u64,
    },
    /// An initializer or finalizer that is not the image's code.
    #[error("an initializer at {0:#x} is not in the image's code")]
    InitializerNotInCode(u64),
    /// A thread-local block larger than its size says, or a bad alignment.
    #[error("thread-local block inconsistent ({image} initialized bytes, size {size}, alignment {align})")]
    ThreadLocals {
        /// Initialized bytes.
        image: u64,
        /// The block's size.
        size: u64,
        /// Its alignment.
        align: u64,
    },
}

impl RelocatableImage {
    /// The span layout the image is mapped with.
    pub fn layout(&self) -> Result<kiln_memory::SpanLayout, LinkError> {
        kiln_memory::SpanLayout::new(&self.segments, self.page).map_err(LinkError::from)
    }

    /// The image's description as bytes (a private format, versioned: a cache seals and
    /// checks them; [`RelocatableImage::decode`] reads them back). The fields in order,
    /// each in its kiln-codec encoding.
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::with_capacity(64 + self.fixups.len() * 40 + self.exports.len() * 32);
        FORMAT.put(&mut w);
        self.architecture.put(&mut w);
        self.page.put(&mut w);
        let segments: Vec<(u64, u8)> = self
            .segments
            .iter()
            .map(|&(len, permission)| (len, permission.index() as u8))
            .collect();
        segments.put(&mut w);
        self.fixups.put(&mut w);
        w.u32(self.relative.len() as u32);
        for at in self.relative.iter() {
            w.u64(at);
        }
        self.exports.put(&mut w);
        self.init.put(&mut w);
        self.fini.put(&mut w);
        self.eh_frame.put(&mut w);
        self.dso_handle.put(&mut w);
        self.tls.put(&mut w);
        self.branch_protected.put(&mut w);
        // Last: a load that tells no plugin skips them (see `decode_with`).
        self.symbols.put(&mut w);
        w.into_bytes()
    }

    /// Reads what [`RelocatableImage::encode`] wrote; a description that is truncated,
    /// of another format version, or inconsistent is an error saying what is wrong.
    pub fn decode(bytes: &[u8]) -> Result<Self, ImageError> {
        Self::decode_with(bytes, true)
    }

    /// [`RelocatableImage::decode`], reading the symbols only if `symbols` (they are for
    /// plugins, and the longest part of a large program's description): without,
    /// [`RelocatableImage::symbols`] is `Some` and empty if the image has them.
    ///
    /// The image reads its exports and relative words in place, so `bytes` are copied
    /// once into a buffer of its own: [`RelocatableImage::decode_in_place`] reads a
    /// mapped file without the copy.
    pub fn decode_with(bytes: &[u8], symbols: bool) -> Result<Self, ImageError> {
        let len = bytes.len();
        Self::decode_in_place(Arc::new(bytes.to_vec()), 0..len, symbols)
    }

    /// [`RelocatableImage::decode_with`] of `description` (a range of `owner`: a mapped
    /// image file), reading the exports and the relative words where they lie: the image
    /// keeps `owner` (the exports' table as long as the module mapped from it lives).
    pub fn decode_in_place(
        owner: crate::SharedBytes,
        description: std::ops::Range<usize>,
        symbols: bool,
    ) -> Result<Self, ImageError> {
        let whole = (*owner).as_ref();
        let bytes = whole
            .get(description.clone())
            .ok_or(DecodeError::Truncated("the description"))?;
        // A range of the next `len` bytes of `r`, in `owner`.
        let in_place = |r: &mut Reader<'_>, len: usize, what: &'static str| {
            let at = description.start + (bytes.len() - r.remaining());
            r.take(len, what)?;
            crate::in_place::InPlace::new(owner.clone(), at..at + len)
                .ok_or(DecodeError::Truncated(what))
        };
        let mut r = Reader::new(bytes);
        let format = u32::get(&mut r, "format")?;
        if format != FORMAT {
            return Err(ImageError::Format {
                found: format,
                expected: FORMAT,
            });
        }
        let architecture = Architecture::get(&mut r, "architecture")?;
        let page = u64::get(&mut r, "page size")?;
        let segments = Vec::<(u64, u8)>::get(&mut r, "segments")?
            .into_iter()
            .map(|(len, p)| match p {
                0 => Ok((len, Permission::ReadExecute)),
                1 => Ok((len, Permission::Read)),
                2 => Ok((len, Permission::ReadWrite)),
                p => Err(DecodeError::Invalid {
                    what: "permission",
                    value: u64::from(p),
                }),
            })
            .collect::<Result<Vec<_>, _>>()?;
        let image = RelocatableImage {
            architecture,
            page,
            segments,
            fixups: Vec::get(&mut r, "fixups")?,
            relative: {
                let n = r.count("relative words", 8)?;
                crate::RelativeWords::in_place(in_place(&mut r, n * 8, "relative words")?)
            },
            exports: {
                const ENTRY: usize = crate::symbol_table::ENTRY_BYTES;
                let n = r.count("exports", ENTRY)?;
                let text = r.u32("exports' names")? as usize;
                let entries = in_place(&mut r, n * ENTRY, "exports")?;
                let names = in_place(&mut r, text, "exports' names")?;
                crate::SymbolTable::in_place(entries, names).map_err(|what| {
                    DecodeError::Invalid {
                        what,
                        value: n as u64,
                    }
                })?
            },
            init: Vec::get(&mut r, "initializers")?,
            fini: Vec::get(&mut r, "finalizers")?,
            eh_frame: Option::get(&mut r, ".eh_frame")?,
            dso_handle: u64::get(&mut r, "__dso_handle")?,
            tls: Option::get(&mut r, "thread-locals")?,
            branch_protected: bool::get(&mut r, "branch protection")?,
            symbols: match r.u8("symbols")? {
                0 => None,
                1 if !symbols => {
                    // Not read: they are all that follows.
                    r.skip_rest();
                    Some(Vec::new())
                }
                1 => Some(Vec::get(&mut r, "symbols")?),
                other => {
                    return Err(DecodeError::Invalid {
                        what: "symbols",
                        value: u64::from(other),
                    }
                    .into())
                }
            },
        };
        r.end()?;
        image.check()?;
        Ok(image)
    }

    /// Whether the decoded fields hold together: every offset in the image (its end
    /// included: a symbol may end the last segment), every field to write inside a
    /// segment with bytes, initializers in the code.
    fn check(&self) -> Result<(), ImageError> {
        if !self.page.is_power_of_two() || !(4096..=1 << 16).contains(&self.page) {
            return Err(ImageError::PageSize(self.page));
        }
        let layout = kiln_memory::SpanLayout::new(&self.segments, self.page)
            .map_err(|e| ImageError::Layout(e.to_string()))?;
        let in_span = |offset: u64, what: &'static str| {
            if offset <= layout.len {
                Ok(())
            } else {
                Err(ImageError::OutsideImage {
                    what,
                    offset,
                    len: layout.len,
                })
            }
        };
        let address_in_span = |a: ImageAddress, what: &'static str| match a {
            ImageAddress::Image(o) => in_span(o, what),
            ImageAddress::Absolute(_) => Ok(()),
        };
        let in_segments = |at: u64, len: u64, what: &'static str| {
            let inside = layout.segments.iter().any(|&(offset, size, _)| {
                at >= offset && at.checked_add(len).is_some_and(|end| end <= offset + size)
            });
            if inside {
                Ok(())
            } else {
                Err(ImageError::OutsideSegments { what, at })
            }
        };
        for f in &self.fixups {
            if let Binding::Image(target) = f.binding {
                in_span(target, "a fixup's target")?;
            }
            in_span(f.place, "a fixup's place")?;
            if let Some(stub) = f.stub {
                in_span(stub, "a stub")?;
            }
            in_segments(f.at, f.row.field.len(), "a fixup")?;
        }
        for at in self.relative.iter() {
            in_segments(at, 8, "a relative word")?;
        }
        for (address, absolute) in self.exports.addresses() {
            let address = if absolute {
                ImageAddress::Absolute(address)
            } else {
                ImageAddress::Image(address)
            };
            address_in_span(address, "an export")?;
        }
        let code = layout
            .segments
            .first()
            .map_or(0..0, |&(at, len, _)| at..at + len);
        for a in self.init.iter().chain(&self.fini) {
            if let ImageAddress::Image(o) = *a {
                if !code.contains(&o) {
                    return Err(ImageError::InitializerNotInCode(o));
                }
            }
        }
        for (offset, what) in self
            .eh_frame
            .map(|o| (o, ".eh_frame"))
            .into_iter()
            .chain([(self.dso_handle, "__dso_handle")])
        {
            if offset >= layout.len {
                return Err(ImageError::OutsideImage {
                    what,
                    offset,
                    len: layout.len,
                });
            }
        }
        if let Some(t) = &self.tls {
            if (t.image.len() as u64) > t.size || !t.align.is_power_of_two() {
                return Err(ImageError::ThreadLocals {
                    image: t.image.len() as u64,
                    size: t.size,
                    align: t.align,
                });
            }
        }
        for s in self.symbols.iter().flatten() {
            address_in_span(s.address, "a symbol")?;
        }
        Ok(())
    }
}

/// The invalid-value error of a kind byte.
fn invalid(what: &'static str, value: u8) -> DecodeError {
    DecodeError::Invalid {
        what,
        value: u64::from(value),
    }
}

/// One byte: 0 x86-64, 1 AArch64, 2 RISC-V 64.
impl codec::Field for Architecture {
    const MIN: usize = 1;
    fn put(&self, w: &mut Writer) {
        w.u8(*self as u8);
    }
    fn get(r: &mut Reader<'_>, what: &'static str) -> Result<Self, DecodeError> {
        match r.u8(what)? {
            0 => Ok(Architecture::X86_64),
            1 => Ok(Architecture::Aarch64),
            2 => Ok(Architecture::Riscv64),
            n => Err(invalid("architecture", n)),
        }
    }
}

/// A kind byte (0 in the image, 1 absolute), then the offset or the address.
impl codec::Field for ImageAddress {
    const MIN: usize = 9;
    fn put(&self, w: &mut Writer) {
        match *self {
            ImageAddress::Image(o) => w.u8(0).u64(o),
            ImageAddress::Absolute(a) => w.u8(1).u64(a),
        };
    }
    fn get(r: &mut Reader<'_>, what: &'static str) -> Result<Self, DecodeError> {
        match r.u8(what)? {
            0 => Ok(ImageAddress::Image(r.u64(what)?)),
            1 => Ok(ImageAddress::Absolute(r.u64(what)?)),
            n => Err(invalid("address kind", n)),
        }
    }
}
impl codec::ListItem for ImageAddress {}

/// A kind byte (0 image, 1 symbol, 2 absolute, 3 thread-pointer offset, 4 module id),
/// then the offset, the name or the address.
impl codec::Field for Binding {
    const MIN: usize = 1;
    fn put(&self, w: &mut Writer) {
        match self {
            Binding::Image(o) => {
                w.u8(0).u64(*o);
            }
            Binding::Symbol(name) => {
                w.u8(1);
                name.put(w);
            }
            Binding::Absolute(a) => {
                w.u8(2).u64(*a);
            }
            Binding::TpOff(o) => {
                w.u8(3).u64(*o);
            }
            Binding::DtpMod => {
                w.u8(4);
            }
        }
    }
    fn get(r: &mut Reader<'_>, what: &'static str) -> Result<Self, DecodeError> {
        Ok(match r.u8(what)? {
            0 => Binding::Image(r.u64("a fixup's target")?),
            1 => Binding::Symbol(Arc::<str>::get(r, "a fixup's symbol")?),
            2 => Binding::Absolute(r.u64("a fixup's address")?),
            3 => Binding::TpOff(r.u64("a fixup's thread-local offset")?),
            4 => Binding::DtpMod,
            n => return Err(invalid("binding", n)),
        })
    }
}

/// Eight bytes: the formula, the range check and its bits, the field's kind and its four
/// parameters. A field changed in place is no fixup (never written).
impl codec::Field for FixupRow {
    const MIN: usize = 8;
    fn put(&self, w: &mut Writer) {
        let relative = match self.relative {
            Relative::Absolute => 0,
            Relative::Place => 1,
            Relative::Page => 2,
            Relative::GotBase => 3,
            Relative::ImageBase => 4,
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
        w.u8(relative).u8(check).u8(bits as u8).raw(&field);
    }
    fn get(r: &mut Reader<'_>, what: &'static str) -> Result<Self, DecodeError> {
        let b = r.take(8, what)?;
        let relative = match b[0] {
            0 => Relative::Absolute,
            1 => Relative::Place,
            2 => Relative::Page,
            3 => Relative::GotBase,
            4 => Relative::ImageBase,
            n => return Err(invalid("formula", n)),
        };
        let bits = u32::from(b[2]);
        let check = match (b[1], bits) {
            (0, _) => Check::None,
            (1, 1..=64) => Check::Signed(bits),
            (2, 1..=64) => Check::Unsigned(bits),
            (3, 1..=64) => Check::Either(bits),
            (n, _) => return Err(invalid("range check", n)),
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
            (n, _) => return Err(invalid("field kind (or a field changed in place)", n)),
        };
        Ok(FixupRow {
            relative,
            check,
            field,
        })
    }
}

codec::record!(ImageFixup {
    at: u64 as "a fixup's offset",
    place: u64 as "a fixup's place",
    row: FixupRow as "a fixup's formula",
    binding: Binding as "a fixup's binding",
    addend: i64 as "a fixup's addend",
    stub: Option<u64> as "a fixup's stub",
});

codec::record!(ImageTls {
    image: Vec<u8> as "the thread-local image",
    size: u64 as "the thread-local block's size",
    align: u64 as "the thread-local block's alignment",
    static_tls: bool as "static TLS",
});

/// One byte: 0 function, 1 data, 2 other.
impl codec::Field for crate::SymbolKind {
    const MIN: usize = 1;
    fn put(&self, w: &mut Writer) {
        w.u8(match self {
            crate::SymbolKind::Function => 0,
            crate::SymbolKind::Data => 1,
            crate::SymbolKind::Other => 2,
        });
    }
    fn get(r: &mut Reader<'_>, what: &'static str) -> Result<Self, DecodeError> {
        match r.u8(what)? {
            0 => Ok(crate::SymbolKind::Function),
            1 => Ok(crate::SymbolKind::Data),
            2 => Ok(crate::SymbolKind::Other),
            n => Err(invalid("symbol kind", n)),
        }
    }
}

codec::record!(ImageSymbol {
    name: String as "a symbol's name",
    address: ImageAddress as "a symbol's address",
    size: u64 as "a symbol's size",
    kind: crate::SymbolKind as "a symbol's kind",
    global: bool as "a symbol's binding",
});

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
            relative: vec![8192, 8200].into(),
            exports: {
                let mut table = crate::SymbolTable::builder(1, 4);
                table.push("main", 0, true, false).expect("a short name");
                table.finish()
            },
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
        outside.relative = vec![8192, 8192 + 20].into();
        assert!(RelocatableImage::decode(&outside.encode()).is_err());
        // Exports out of order, or a name twice: the table's lookups by halves would
        // miss names, so the description is refused.
        for names in [["b", "a"], ["a", "a"]] {
            let mut unordered = image();
            let mut table = crate::SymbolTable::builder(2, 2);
            for name in names {
                table.push(name, 0, true, false).expect("a short name");
            }
            unordered.exports = table.finish();
            assert!(
                RelocatableImage::decode(&unordered.encode()).is_err(),
                "{names:?}"
            );
        }
    }
}
