//! What a link reports beside its memory, for plugins, debuggers and profilers: every
//! object linked (archive members included) and where each section and symbol landed.

use crate::fixup::Resolver;
use crate::object_file::{Binding, SymSection};
use crate::symbols::{lossy, Def, Linker, Origin, Place, SymbolId, SEG_TLS};
use crate::{Architecture, LinkError, ObjectInput, PlacedSection, SymbolInfo, SymbolKind};

impl Linker<'_, '_> {
    /// Every object linked, members included (for [`LinkOptions::report_sections`]).
    pub(crate) fn linked_objects(
        &self,
        inputs: &[ObjectInput],
    ) -> Result<Vec<ObjectInput>, LinkError> {
        self.origins
            .iter()
            .map(|origin| match *origin {
                Origin::Input(i) => Ok(inputs[i].clone()),
                Origin::Member(archive, offset) => self.archives[archive].member_input(offset),
            })
            .collect()
    }

    /// Where every loaded section landed and every symbol with an address (for
    /// [`LinkOptions::report_sections`]).
    pub(crate) fn report(
        &self,
        resolver: &Resolver<'_, '_, '_>,
        stub_list: &[SymbolId],
        tlsdesc_resolver: u64,
    ) -> (Vec<PlacedSection>, Vec<SymbolInfo>) {
        let mut sections = Vec::new();
        let mut symbols = Vec::new();
        for (oi, obj) in self.objs.iter().enumerate() {
            for (si, sec) in obj.sections.iter().enumerate() {
                let Place::At { seg, offset } = self.places[oi][si] else {
                    continue;
                };
                if seg == SEG_TLS {
                    continue;
                }
                sections.push(PlacedSection {
                    object: oi,
                    index: si,
                    name: lossy(sec.name),
                    address: resolver.bases[seg as usize] + offset,
                    size: sec.size,
                });
            }
            for (si, sym) in obj.symbols.iter().enumerate().skip(1) {
                if sym.name.is_empty()
                    || sym.is_section()
                    || sym.is_tls()
                    || sym.kind == object::elf::STT_FILE.0
                    || !matches!(sym.section, SymSection::Section(_))
                {
                    continue;
                }
                let global = sym.binding != Binding::Local;
                if global {
                    // Only the definition the link kept.
                    let kept = matches!(
                        self.key(oi as u32, si as u32),
                        SymbolId::Global(g) if matches!(self.globals[g as usize].def,
                            Def::Defined { obj, sym, .. } if obj == oi as u32 && sym == si as u32)
                    );
                    if !kept {
                        continue;
                    }
                }
                let (address, discarded) = resolver.sym_address(oi as u32, sym);
                if discarded {
                    continue;
                }
                symbols.push(SymbolInfo {
                    name: lossy(sym.name),
                    address,
                    size: sym.size,
                    kind: if sym.is_func() {
                        SymbolKind::Function
                    } else if sym.kind == object::elf::STT_OBJECT.0
                        || sym.kind == object::elf::STT_COMMON.0
                    {
                        SymbolKind::Data
                    } else {
                        SymbolKind::Other
                    },
                    global,
                });
            }
        }
        // The code the link made: a stub per far function (`name@plt`), the
        // TLS-descriptor resolver. On AArch64 a `$x` mapping symbol tells disassemblers
        // that code starts there again (an object's `$d` may precede it).
        let stub_size = self.arch.stub_size();
        let mut code = |name: String, address: u64, size: u64| {
            if self.arch.architecture() == Architecture::Aarch64 {
                symbols.push(SymbolInfo {
                    name: "$x".into(),
                    address,
                    size: 0,
                    kind: SymbolKind::Other,
                    global: false,
                });
            }
            symbols.push(SymbolInfo {
                name,
                address,
                size,
                kind: SymbolKind::Function,
                global: false,
            });
        };
        for (n, key) in stub_list.iter().enumerate() {
            let address = resolver.stub_address(n as u64);
            code(
                format!("{}@plt", lossy(resolver.name(*key))),
                address,
                stub_size,
            );
        }
        if tlsdesc_resolver != 0 {
            let size = self.arch.tlsdesc_static_resolver().len() as u64;
            code("kiln_tlsdesc_static".into(), tlsdesc_resolver, size);
        }
        // Commons, placed by the link in the zero-filled segment.
        for (id, g) in self.globals.iter().enumerate() {
            if let Def::Common { size, .. } = g.def {
                symbols.push(SymbolInfo {
                    name: lossy(g.name),
                    address: resolver.address(SymbolId::Global(id as u32)).0,
                    size,
                    kind: SymbolKind::Data,
                    global: true,
                });
            }
        }
        (sections, symbols)
    }
}
