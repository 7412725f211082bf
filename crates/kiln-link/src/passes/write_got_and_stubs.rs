//! The `write-got-and-stubs` pass: the contents of the graph's synthesized sections — the
//! GOT entries, the stubs, the TLS-descriptor resolver, and the bytes of a pass's own.

use crate::fixup::{write_got, write_plt, Resolver};
use crate::graph::{Allocated, LinkGraph, SynthesizedKind};
use crate::symbols::{Place, SEG_R, SEG_RX};
use crate::{LinkError, LinkOptions};

impl<'a, 'c> LinkGraph<'a, 'c> {
    /// The GOT's entries, the stubs, the TLS-descriptor resolver.
    pub(crate) fn write_got_and_stubs(
        &mut self,
        memory: &mut Allocated,
        _: &LinkOptions<'_>,
    ) -> Result<(), LinkError> {
        let tls = self.tls_place(memory);
        let linker = &self.linker;
        let l = &self.layout;
        let s = &self.synthesized;
        let allocated = memory;
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
        // The passes' sections' bytes (their edges are applied by `fixup`).
        for section in &s.sections {
            if let (SynthesizedKind::Client(bytes), Place::At { seg, offset }) =
                (&section.kind, section.place)
            {
                let at = offset as usize;
                segs[seg as usize].bytes[at..at + bytes.len()].copy_from_slice(bytes);
            }
        }
        if let Some(at) = l.tlsdesc_offset {
            let code = linker.arch.tlsdesc_static_resolver();
            let at = at as usize;
            segs[SEG_RX].bytes[at..at + code.len()].copy_from_slice(code);
        }
        Ok(())
    }
}
