//! The fixups of a relocatable link (see [`crate::relocatable`]): after `fixup`, one
//! pass over what the link wrote — `__dso_handle`, the GOT's entries, every edge — keeps
//! each field whose value depends on where the span is mapped or on the process, or says
//! why the module cannot be an image.

use crate::fixup::{each_got_entry, Resolver};
use crate::graph::{Allocated, LinkGraph};
use crate::passes::fixup::{patched, PARALLEL_RELOCATIONS};
use crate::relocatable::{invariant, Binding, FixupRow, ImageFixup};
use crate::symbols::{Place, SEG_RX, SEG_TLS};

impl<'a, 'c> LinkGraph<'a, 'c> {
    /// The fields to write at every load of the module's image, in address order; or why
    /// it cannot be an image (the first field that cannot be written again: of the
    /// thread-local image's edges first, then in the edges' order).
    pub(crate) fn record_fixups(&self, memory: &Allocated) -> Result<Vec<ImageFixup>, String> {
        let base = memory.bases[0];
        let s = &self.synthesized;
        let word = |at: u64, binding: Binding| ImageFixup {
            at,
            place: at,
            row: FixupRow::word64(),
            binding,
            addend: 0,
            stub: None,
        };
        // `__dso_handle` holds its own address.
        let dso_handle = memory.dso_handle.wrapping_sub(base);
        let mut fixups = vec![word(dso_handle, Binding::Image(dso_handle))];
        let resolver = Resolver::new(&self.linker, memory, &s.stubs).relocatable(true);
        // The GOT's entries that hold a value of the process or an address in the span.
        let tlsdesc_resolver = (self.layout.tlsdesc_offset).map_or(0, |o| memory.bases[SEG_RX] + o);
        let tls = self.tls_place(memory);
        each_got_entry(
            &s.slot_list,
            &resolver,
            tls,
            tlsdesc_resolver,
            Some(base),
            |i, _, binding| {
                let Some(binding) = binding else {
                    return;
                };
                if !invariant(
                    &binding,
                    crate::arch::Relative::Absolute,
                    crate::arch::Field::Word(8),
                ) {
                    fixups.push(word(memory.got_base + i as u64 * 8 - base, binding));
                }
            },
        );
        // Every edge, as `fixup` (and `fixup-tls-image`) applied it: each section's on
        // one thread, on every core when there are many.
        let lists = &self.edges.lists;
        // Each list's section: its names, and where its bytes are (`None`: not placed).
        let sections: Vec<_> = lists
            .iter()
            .map(|list| {
                let patched = patched(&self.linker, s, list.section);
                let Place::At { seg, offset } = patched.place else {
                    return (patched.at, None);
                };
                let addr = match seg == SEG_TLS {
                    true => offset,
                    false => memory.bases[seg as usize] + offset,
                };
                (patched.at, Some((seg == SEG_TLS, addr)))
            })
            .collect();
        let (edges, slots) = (&self.edges, &s.slots);
        let of_list =
            |(list, &(at, place)): (&crate::graph::EdgeList, &(_, Option<(bool, u64)>))| {
                let Some((tls_image, section_addr)) = place else {
                    return Ok(Vec::new());
                };
                let mut resolver = resolver.clone();
                resolver.tls_image = tls_image;
                let mut kept = Vec::new();
                for edge in edges.of(list) {
                    if let Some(fixup) = resolver.image_fixup(at, section_addr, edge, slots, base) {
                        kept.push(fixup?);
                    }
                }
                Ok::<_, String>(kept)
            };
        let per_list: Vec<Result<Vec<ImageFixup>, String>> =
            if crate::link::parallel(lists.len(), edges.all.len(), PARALLEL_RELOCATIONS) {
                use rayon::prelude::*;
                lists.par_iter().zip(&sections).map(of_list).collect()
            } else {
                lists.iter().zip(&sections).map(of_list).collect()
            };
        // The first refusal: the thread-local image's first (as `fixup-tls-image` runs
        // before `fixup`), then in the edges' order.
        let (tls, rest): (Vec<_>, Vec<_>) = per_list
            .into_iter()
            .zip(&sections)
            .partition(|(_, (_, place))| matches!(place, Some((true, _))));
        for (kept, _) in tls.into_iter().chain(rest) {
            fixups.extend(kept?);
        }
        fixups.sort_unstable_by_key(|f| f.at);
        Ok(fixups)
    }
}
