//! A linked module to and from its image ([`crate::relocatable`]): the image a
//! relocatable link makes of its module, and the module [`rebind`] makes again from an
//! image mapped in another process.

use crate::arch::{self, Field, Relative};
use crate::linked::{LinkedModule, TlsTemplate};
use crate::relocatable::{
    Binding, FixupRow, ImageAddress, ImageFixup, ImageSymbol, ImageTls, RelocatableImage,
};
use crate::{LinkContext, LinkError};
use kiln_memory::{InFlightAllocation, Permission};

impl RelocatableImage {
    /// Made by a link with [`LinkOptions::relocatable`](crate::LinkOptions::relocatable).
    ///
    /// The image's bytes ([`LinkedModule::image`]) are made the stored form: a relative
    /// word holds its offset, every other data word a fixup writes holds 0 — nothing of
    /// the process that linked it (no host address, no thread-pointer offset), and a load
    /// that missed a fixup reads 0, not a stale address that happens to work.
    /// (Instruction fields keep their opcode bits; a load writes their immediates whole.)
    pub(crate) fn of(
        linked: &mut LinkedModule,
        base: u64,
        page: u64,
        fixups: Vec<ImageFixup>,
    ) -> Result<Self, String> {
        let segments: Vec<(u64, Permission)> = linked
            .allocation
            .segments()
            .iter()
            .map(|s| (s.len, s.permission))
            .collect();
        let layout = kiln_memory::SpanLayout::new(&segments, page).map_err(|e| e.to_string())?;
        for (s, &(offset, _, _)) in linked.allocation.segments().iter().zip(&layout.segments) {
            if s.target != base + offset {
                return Err("the module's memory is not one span".into());
            }
        }
        let len = layout.len;
        let word64 = FixupRow::word64();
        let mut relative = Vec::new();
        let mut symbolic = Vec::with_capacity(fixups.len());
        for f in fixups {
            match (&f.binding, f.stub) {
                (Binding::Image(o), None) if f.row == word64 => {
                    let word = bytes_at(&mut linked.image, &layout, f.at, 8)
                        .ok_or("a fixup outside the image's bytes")?;
                    word.copy_from_slice(&o.wrapping_add(f.addend as u64).to_le_bytes());
                    relative.push(f.at);
                }
                _ => {
                    if let Field::Word(n) = f.row.field {
                        if let Some(word) = bytes_at(&mut linked.image, &layout, f.at, u64::from(n))
                        {
                            word.fill(0);
                        }
                    }
                    symbolic.push(f);
                }
            }
        }
        let fixups = symbolic;
        let here = |a: u64| ImageAddress::of(a, base, len);
        let tls = linked.tls.as_ref().map(|t| ImageTls {
            image: t.image.clone(),
            size: t.size,
            align: t.align,
            static_tls: t.tp_offset.is_some(),
        });
        Ok(RelocatableImage {
            architecture: linked.architecture,
            segments,
            page,
            fixups,
            relative: relative.into(),
            exports: linked
                .exports
                .with_addresses(|address| match here(address) {
                    ImageAddress::Image(o) => (o, false),
                    ImageAddress::Absolute(a) => (a, true),
                }),
            init: linked.init.iter().map(|&a| here(a)).collect(),
            fini: linked.fini.iter().map(|&a| here(a)).collect(),
            eh_frame: linked.eh_frame.map(|a| a - base),
            dso_handle: linked.dso_handle - base,
            tls,
            branch_protected: linked.branch_protected,
            symbols: (!linked.symbol_info.is_empty()).then(|| {
                linked
                    .symbol_info
                    .iter()
                    .map(|s| ImageSymbol {
                        name: s.name.clone(),
                        address: here(s.address),
                        size: s.size,
                        kind: s.kind,
                        global: s.global,
                    })
                    .collect()
            }),
        })
    }
}

/// The bytes of the kept image (`image`, laid out as `layout`) at image offset `at`, `n`
/// long; `None` where there are none (zero-filled data).
fn bytes_at<'i>(
    image: &'i mut [crate::ImageSegment],
    layout: &kiln_memory::SpanLayout,
    at: u64,
    n: u64,
) -> Option<&'i mut [u8]> {
    let (i, &(offset, len, _)) = layout
        .segments
        .iter()
        .enumerate()
        .find(|(_, &(o, l, _))| at >= o && at + n <= o + l)?;
    let bytes = &mut image.get_mut(i)?.bytes;
    let start = (at - offset) as usize;
    (len as usize <= bytes.len()).then(|| &mut bytes[start..start + n as usize])
}

/// Makes the module of `image` from its span, mapped (`memory`, in flight: its segments
/// hold the image's bytes): the process's values found through `ctx` (symbols by name, a
/// TLS module id, the block's static-TLS offset), the fixups written, the memory
/// finalized. An error (a symbol no longer defined, a value out of a field's reach in this
/// process) leaves nothing behind: the memory is freed; the caller links instead.
pub fn rebind(
    image: RelocatableImage,
    mut memory: InFlightAllocation,
    ctx: &mut dyn LinkContext,
) -> Result<LinkedModule, LinkError> {
    let base = memory.target(0).unwrap_or(0);
    let layout = image.layout()?;
    if memory.segments().len() != layout.segments.len()
        || memory
            .segments()
            .iter()
            .zip(&layout.segments)
            .any(|(s, &(offset, len, _))| s.target != base + offset || s.len != len)
    {
        return Err(LinkError::Environment(
            "the image's memory is not laid out as the image".into(),
        ));
    }
    let failed = |what: String| LinkError::Environment(format!("image: {what}"));
    let mut names: Vec<&str> = image
        .fixups
        .iter()
        .filter_map(|f| match &f.binding {
            Binding::Symbol(name) => Some(&**name),
            _ => None,
        })
        .collect();
    names.sort_unstable();
    names.dedup();
    let found = ctx.resolve_many(&names);
    let missing: Vec<&str> = names
        .iter()
        .zip(&found)
        .filter(|(_, a)| a.is_none())
        .map(|(n, _)| *n)
        .collect();
    if !missing.is_empty() {
        return Err(failed(format!(
            "{} symbol(s) no longer defined: {}",
            missing.len(),
            missing.join(", ")
        )));
    }
    let address_of = |name: &str| -> u64 {
        names
            .binary_search(&name)
            .ok()
            .and_then(|i| found[i])
            .unwrap_or(0)
    };
    if image
        .fixups
        .iter()
        .any(|f| matches!(f.row.relative, Relative::GotBase | Relative::ImageBase))
    {
        return Err(failed("a GOT- or image-relative fixup".into()));
    }
    let arch = image.architecture.arch();
    let mut segs = memory.segments_mut();
    // Where each fixup's field is: its segment and offset in it.
    let mut fields = Vec::with_capacity(image.fixups.len());
    for f in &image.fixups {
        let Some(seg) = segs.iter().position(|s| {
            f.at >= s.target - base
                && f.at + f.row.field.len() <= s.target - base + s.bytes.len() as u64
        }) else {
            return Err(failed(format!("fixup at {:#x} outside the segments", f.at)));
        };
        fields.push((seg, (f.at - (segs[seg].target - base)) as usize));
    }
    // The value of a fixup whose binding needs no thread-local of this process, as the link
    // computes it (a host function out of the field's reach through its stub, as the
    // architecture decides reach).
    let value_of = |f: &ImageFixup, tls: Option<(u64, Option<i64>)>| -> Result<i128, LinkError> {
        let p = base.wrapping_add(f.place) as i128;
        let a = f.addend as i128;
        let (module_id, tp_offset) = tls.unwrap_or((0, None));
        let t: i128 = match &f.binding {
            Binding::DtpMod => return Ok(i128::from(module_id)),
            Binding::Image(o) => (base + o) as i128,
            Binding::Symbol(name) => address_of(name) as i128,
            Binding::Absolute(v) => *v as i128,
            Binding::TpOff(o) => match tp_offset {
                Some(tp) => i128::from(tp) + *o as i128,
                None => return Err(failed("a thread-pointer offset without static TLS".into())),
            },
        };
        let relative = |t: i128| match f.row.relative {
            Relative::Absolute | Relative::GotBase | Relative::ImageBase => t + a,
            Relative::Place => t + a - p,
            Relative::Page => ((t + a) & !0xfff) - (p & !0xfff),
        };
        let direct = relative(t);
        Ok(match f.stub {
            Some(stub) => {
                let row = arch::Relocation::new(
                    0,
                    "image fixup",
                    arch::Target::Symbol,
                    f.row.relative,
                    f.row.check,
                    f.row.field,
                );
                if arch.reaches(&row, direct, t as u64, f.addend, p as u64) {
                    direct
                } else {
                    relative((base + stub) as i128)
                }
            }
            None => direct,
        })
    };
    let needs_tls = |f: &ImageFixup| matches!(f.binding, Binding::TpOff(_) | Binding::DtpMod);
    let does_not_fit = |f: &ImageFixup, e: arch::EncodeError| {
        failed(format!(
            "the value of the fixup at {:#x} ({:?}) does not fit in this process ({e:?})",
            f.at, f.binding
        ))
    };
    // Pass 1, before anything of the process is taken (a TLS module id, static TLS): every
    // value that needs no thread-local, checked as it will be written (into a copy of its
    // field), so that a value out of reach here fails the load with nothing to give back.
    let mut values = Vec::with_capacity(image.fixups.len());
    for (f, &(seg, at)) in image.fixups.iter().zip(&fields) {
        if needs_tls(f) {
            values.push(0);
            continue;
        }
        let value = value_of(f, None)?;
        let len = f.row.field.len() as usize;
        let mut copy = [0u8; 8];
        copy[..len].copy_from_slice(&segs[seg].bytes[at..at + len]);
        arch::encode(f.row.field, f.row.check, value, &mut copy[..len])
            .map_err(|e| does_not_fit(f, e))?;
        values.push(value);
    }
    // The relative words: the image's offset they hold, plus the span's address. The
    // words of one segment are in order: one pass per segment.
    let mut words = image.relative.iter().peekable();
    for seg in segs.iter_mut() {
        let start = seg.target - base;
        let end = start + seg.bytes.len() as u64;
        while let Some(at) = words.next_if(|&at| at + 8 <= end && at >= start) {
            let i = (at - start) as usize;
            let word = &mut seg.bytes[i..i + 8];
            let value = u64::from_le_bytes(word.try_into().unwrap_or([0; 8]));
            word.copy_from_slice(&value.wrapping_add(base).to_le_bytes());
        }
    }
    if let Some(at) = words.next() {
        return Err(failed(format!(
            "relative word at {at:#x} outside the segments or out of order"
        )));
    }
    // The process's thread-local values.
    let (module_id, tp_offset) = match &image.tls {
        Some(t) => {
            let id = ctx.tls_module_id().map_err(LinkError::Environment)?;
            let tp = if t.static_tls {
                Some(
                    ctx.place_static_tls(id, &t.image, t.size, t.align)
                        .map_err(LinkError::Environment)?,
                )
            } else {
                None
            };
            (id, tp)
        }
        None => (0, None),
    };
    // Pass 2: the thread-local values, then every field written.
    for ((f, &(seg, at)), value) in image.fixups.iter().zip(&fields).zip(values) {
        let value = if needs_tls(f) {
            value_of(f, Some((module_id, tp_offset)))?
        } else {
            value
        };
        arch::encode(f.row.field, f.row.check, value, &mut segs[seg].bytes[at..])
            .map_err(|e| does_not_fit(f, e))?;
    }
    drop(segs);
    let allocation = memory.finalize()?;
    let relocations = image.fixups.len() + image.relative.len();
    let segment_bytes = std::array::from_fn(|i| image.segments.get(i).map_or(0, |s| s.0));
    // The image's table made the module's in place: its offsets moved by the base.
    let exports = image.exports.rebased(base);
    Ok(LinkedModule {
        allocation,
        exports,
        init: image.init.iter().map(|a| a.at(base)).collect(),
        fini: image.fini.iter().map(|a| a.at(base)).collect(),
        eh_frame: image.eh_frame.map(|o| base + o),
        // Images are of this process's system (ELF): no COFF unwind table.
        function_table: None,
        dso_handle: base + image.dso_handle,
        tls: image.tls.map(|t| TlsTemplate {
            module_id,
            image: t.image,
            size: t.size,
            align: t.align,
            tp_offset,
        }),
        objects: Vec::new(),
        sections: Vec::new(),
        symbol_info: image
            .symbols
            .unwrap_or_default()
            .into_iter()
            .map(|s| crate::SymbolInfo {
                name: s.name,
                address: s.address.at(base),
                size: s.size,
                kind: s.kind,
                global: s.global,
            })
            .collect(),
        image: Vec::new(),
        image_symbols: None,
        architecture: image.architecture,
        branch_protected: image.branch_protected,
        times: Default::default(),
        pass_times: Vec::new(),
        counts: crate::LinkCounts {
            relocations,
            segment_bytes,
            ..Default::default()
        },
        relocatable: None,
    })
}
