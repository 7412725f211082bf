//! The `synthesize-got-and-stubs` pass: the GOT entries and stubs the edges need.

use crate::arch::{Check, Target};
use crate::graph::{LinkGraph, SynthesizedKind, SynthesizedSection};
use crate::symbols::{lossy, Def, Place, Slot, SymbolId, SEG_R, SEG_RX};
use crate::{LinkError, LinkOptions};

impl<'a, 'c> LinkGraph<'a, 'c> {
    /// GOT entries and stubs for the edges that need them.
    pub(crate) fn synthesize(&mut self, _: &LinkOptions<'_>) -> Result<(), LinkError> {
        // A host symbol whose address a checked non-call reference takes gets a stub if it
        // is a function: the context says which (asked once per symbol).
        let mut ask = Vec::new();
        for edge in &self.edges.all {
            if let (Target::Symbol, SymbolId::Global(g)) = (edge.row.target, edge.key) {
                let global = &self.linker.globals[g as usize];
                if edge.row.check != Check::None
                    && matches!(global.def, Def::External(_))
                    && global.external_function.is_none()
                    && !ask.contains(&g)
                {
                    ask.push(g);
                }
            }
        }
        // Asked once, together: an unknown answer (`Other`) is remembered as "not a
        // function".
        let asked: Vec<(u32, String, u64)> = ask
            .into_iter()
            .filter_map(|g| match self.linker.globals[g as usize].def {
                Def::External(address) => {
                    Some((g, lossy(self.linker.globals[g as usize].name), address))
                }
                _ => None,
            })
            .collect();
        if !asked.is_empty() {
            let symbols: Vec<(&str, u64)> =
                asked.iter().map(|(_, n, a)| (n.as_str(), *a)).collect();
            let kinds = self.linker.ctx.symbol_kinds(&symbols);
            for ((g, _, _), kind) in asked.iter().zip(kinds) {
                self.linker.globals[*g as usize].external_function = Some(kind);
            }
        }
        let linker = &self.linker;
        let s = &mut self.synthesized;
        // Stubs and the TLS resolver come after the code: a margin for them (a module
        // whose code alone nears a call's reach calls its own functions through stubs).
        let code_beyond_reach =
            self.layout.seg_size[SEG_RX].saturating_add(16 << 20) >= linker.arch.call_reach();
        for edge in &self.edges.all {
            let (row, key) = (edge.row, edge.key);
            let mut add_slot = |slot: Slot| {
                if let std::collections::hash_map::Entry::Vacant(e) = s.slots.entry(slot) {
                    let words = if matches!(slot, Slot::Address(_) | Slot::TpOff(_)) {
                        1
                    } else {
                        2
                    };
                    e.insert(s.slot_list.len() as u64);
                    for _ in 0..words {
                        s.slot_list.push(slot);
                    }
                }
            };
            match row.target {
                Target::GotEntry => add_slot(Slot::Address(key)),
                Target::TlsGdEntry => add_slot(Slot::TlsGd(key)),
                Target::TlsLdEntry => add_slot(Slot::TlsLd),
                Target::TpOffEntry => {
                    s.needs_static_tls = true;
                    add_slot(Slot::TpOff(key));
                }
                Target::TpOff => s.needs_static_tls = true,
                Target::TlsDescEntry => {
                    s.needs_static_tls = true;
                    add_slot(Slot::TlsDesc(key));
                }
                Target::Call | Target::Plt | Target::Symbol
                    if row.target != Target::Symbol || row.check != Check::None =>
                {
                    if row.needs_low_memory() {
                        s.needs_low = true;
                    }
                    // Calls to (and, in non-PIC code, addresses of) functions that may
                    // be out of reach go through a stub next to the code; an undefined
                    // weak function gets one too, jumping to 0 as a static link's
                    // would. Code larger than a call reaches calls its own functions
                    // through stubs too (range-extension veneers).
                    let call = row.target != Target::Symbol;
                    let far = match key {
                        SymbolId::Global(g) => {
                            let global = &linker.globals[g as usize];
                            // Data is never reached through a stub: a call is assumed
                            // to target a function, other references must know.
                            let function = call
                                || global.external_function == Some(crate::SymbolKind::Function);
                            function
                                && (matches!(global.def, Def::External(_))
                                    || (global.def == Def::Zero && call))
                        }
                        SymbolId::Local(..) => false,
                    } || (call && code_beyond_reach);
                    if far && !s.stubs.contains_key(&key) {
                        add_slot(Slot::Address(key));
                        s.stubs.insert(key, s.stub_list.len() as u64);
                        s.stub_list.push(key);
                    }
                }
                _ => {}
            }
        }
        self.add_builtin_sections();
        Ok(())
    }

    /// The stubs, the TLS-descriptor resolver and the GOT, as sections of the graph
    /// (after any a pass added), sized for what the edges need.
    fn add_builtin_sections(&mut self) {
        let arch = self.linker.arch;
        let s = &mut self.synthesized;
        let stubs = s.stub_list.len() as u64 * arch.stub_size();
        let tlsdesc = s
            .slot_list
            .iter()
            .any(|s| matches!(s, Slot::TlsDesc(_)))
            .then(|| arch.tlsdesc_static_resolver().len() as u64);
        // The GOT is never empty: its base is an address code may take (GotBase).
        let got = (s.slot_list.len() as u64).max(1) * 8;
        let mut add = |name: &'static str, kind, segment, size, align| {
            s.sections.push(SynthesizedSection {
                name: name.into(),
                kind,
                segment,
                size,
                align,
                place: Place::Unplaced,
            });
        };
        add(".kiln.stubs", SynthesizedKind::Stubs, SEG_RX, stubs, 16);
        if let Some(size) = tlsdesc {
            add(
                ".kiln.tlsdesc",
                SynthesizedKind::TlsDescResolver,
                SEG_RX,
                size,
                16,
            );
        }
        add(".kiln.got", SynthesizedKind::Got, SEG_R, got, 8);
    }
}
