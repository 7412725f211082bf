//! The `layout-sections` pass: each loaded section's segment and offset.

use crate::graph::{place, LinkGraph};
use crate::object_file::SHT_NOBITS;
use crate::symbols::{
    is_eh_frame, is_init_section, lossy, segment_of, Def, Place, SEG_BSS, SEG_RW, SEG_TLS,
};
use crate::{LinkError, LinkOptions};

impl<'a, 'c> LinkGraph<'a, 'c> {
    /// Gives each loaded section its segment and offset; `.eh_frame` waits until the end
    /// of the constants, init arrays are noted.
    pub(crate) fn layout_sections(&mut self, _: &LinkOptions<'_>) -> Result<(), LinkError> {
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
}
