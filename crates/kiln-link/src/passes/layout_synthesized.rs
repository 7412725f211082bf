//! The `layout-synthesized` pass: where the graph's synthesized sections (a pass's, the
//! stubs, the GOT) and `.eh_frame` go.

use crate::graph::{place, LinkGraph, SynthesizedKind};
use crate::symbols::{Place, SEG_R};
use crate::{LinkError, LinkOptions, MAX_TLS_BLOCK};

impl<'a, 'c> LinkGraph<'a, 'c> {
    /// Places the synthesized sections (a pass's, the stubs, the TLS-descriptor resolver,
    /// the GOT) and `.eh_frame`, and checks the sizes.
    pub(crate) fn layout_synthesized(&mut self, _: &LinkOptions<'_>) -> Result<(), LinkError> {
        let l = &mut self.layout;
        let s = &mut self.synthesized;
        // The passes' sections, then the stubs, the TLS-descriptor resolver and the GOT,
        // each after the objects' sections of its segment.
        for section in &mut s.sections {
            let seg = section.segment;
            let offset = place(
                &mut l.seg_size[seg],
                &mut l.seg_align[seg],
                section.size,
                section.align,
            );
            section.place = Place::At {
                seg: seg as u8,
                offset,
            };
            let at = Some(offset);
            match section.kind {
                SynthesizedKind::Stubs => l.plt_offset = offset,
                SynthesizedKind::TlsDescResolver => l.tlsdesc_offset = at,
                SynthesizedKind::Got => l.got_offset = offset,
                SynthesizedKind::Client(_) => {}
            }
        }
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
}
