//! The `read-init-arrays` pass: initializers and finalizers, checked to be code of the module.

use crate::graph::{Allocated, LinkGraph};
use crate::object_file::{SHT_FINI_ARRAY, SHT_INIT_ARRAY, SHT_PREINIT_ARRAY};
use crate::symbols::{priority, Place, SEG_RX};
use crate::{LinkError, LinkOptions};

impl<'a, 'c> LinkGraph<'a, 'c> {
    /// Initializers and finalizers, read back from the relocated arrays, in the order to
    /// call them.
    pub(crate) fn read_init_arrays(
        &mut self,
        memory: &mut Allocated,
        _: &LinkOptions<'_>,
    ) -> Result<(), LinkError> {
        let linker = &self.linker;
        let allocated = memory;
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
}
