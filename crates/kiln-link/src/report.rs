//! What a link reports beside its memory, for plugins, debuggers and profilers: every
//! object linked (archive members included) and where each section and symbol landed.

use crate::fixup::Resolver;
use crate::object_file::{Binding, SymSection};
use crate::symbols::{lossy, Def, Linker, Origin, Place, SymbolId, SEG_TLS};
use crate::{Architecture, LinkError, ObjectInput, PlacedSection, SymbolInfo, SymbolKind};
use std::borrow::Cow;

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

    /// Shows `sink` every loaded section (but thread-local ones) and every symbol with an
    /// address: each object's sections and symbols (locals, and the definition the link
    /// kept of each global), the stubs (`name@plt`), the TLS-descriptor resolver, the
    /// commons. Names are borrowed from the inputs where they can be.
    pub(crate) fn visit_placed<'s>(
        &'s self,
        resolver: &Resolver<'_, '_>,
        stub_list: &[SymbolId],
        tlsdesc_resolver: u64,
        sink: &mut impl PlacedSink<'s>,
    ) {
        for (oi, obj) in self.objs.iter().enumerate() {
            for (si, sec) in obj.sections.iter().enumerate() {
                let Place::At { seg, offset } = self.places[oi][si] else {
                    continue;
                };
                if seg == SEG_TLS {
                    continue;
                }
                let address = resolver.bases[seg as usize] + offset;
                sink.section(oi, si, &obj.name, sec.name, address, sec.size);
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
                let kind = if sym.is_func() {
                    SymbolKind::Function
                } else if sym.kind == object::elf::STT_OBJECT.0
                    || sym.kind == object::elf::STT_COMMON.0
                {
                    SymbolKind::Data
                } else {
                    SymbolKind::Other
                };
                sink.symbol(Cow::Borrowed(sym.name), address, sym.size, kind, global);
            }
        }
        // The code the link made: a stub per far function (`name@plt`), the
        // TLS-descriptor resolver. On AArch64 a `$x` mapping symbol tells disassemblers
        // that code starts there again (an object's `$d` may precede it).
        let stub_size = self.arch.stub_size();
        let aarch64 = self.arch.architecture() == Architecture::Aarch64;
        let code = |sink: &mut dyn FnMut(Cow<'s, [u8]>, u64, u64, SymbolKind, bool),
                    name: Vec<u8>,
                    address: u64,
                    size: u64| {
            if aarch64 {
                sink(Cow::Borrowed(b"$x"), address, 0, SymbolKind::Other, false);
            }
            sink(Cow::Owned(name), address, size, SymbolKind::Function, false);
        };
        let mut to_sink =
            |name, address, size, kind, global| sink.symbol(name, address, size, kind, global);
        for (n, key) in stub_list.iter().enumerate() {
            let address = resolver.stub_address(n as u64);
            let mut name = resolver.name(*key).to_vec();
            name.extend_from_slice(b"@plt");
            code(&mut to_sink, name, address, stub_size);
        }
        if tlsdesc_resolver != 0 {
            let size = self.arch.tlsdesc_static_resolver().len() as u64;
            let name = b"kiln_tlsdesc_static".to_vec();
            code(&mut to_sink, name, tlsdesc_resolver, size);
        }
        // Commons, placed by the link in the zero-filled segment.
        for (id, g) in self.globals.iter().enumerate() {
            if let Def::Common { size, .. } = g.def {
                let address = resolver.address(SymbolId::Global(id as u32)).0;
                to_sink(Cow::Borrowed(g.name), address, size, SymbolKind::Data, true);
            }
        }
    }
}

/// What [`Linker::visit_placed`] shows.
pub(crate) trait PlacedSink<'s> {
    /// Section `index` of object `object` (named `object_name`) is `name`, at `address`.
    fn section(
        &mut self,
        object: usize,
        index: usize,
        object_name: &'s str,
        name: &'s [u8],
        address: u64,
        size: u64,
    );
    /// A symbol with an address.
    fn symbol(
        &mut self,
        name: Cow<'s, [u8]>,
        address: u64,
        size: u64,
        kind: SymbolKind,
        global: bool,
    );
}

/// The report as owned lists ([`crate::LinkedModule::sections`],
/// [`crate::LinkedModule::symbol_info`]).
#[derive(Default)]
pub(crate) struct Reported {
    pub(crate) sections: Vec<PlacedSection>,
    pub(crate) symbols: Vec<SymbolInfo>,
}

impl<'s> PlacedSink<'s> for Reported {
    fn section(
        &mut self,
        object: usize,
        index: usize,
        _: &'s str,
        name: &'s [u8],
        address: u64,
        size: u64,
    ) {
        self.sections.push(PlacedSection {
            object,
            index,
            name: lossy(name),
            address,
            size,
        });
    }
    fn symbol(
        &mut self,
        name: Cow<'s, [u8]>,
        address: u64,
        size: u64,
        kind: SymbolKind,
        global: bool,
    ) {
        self.symbols.push(SymbolInfo {
            name: lossy(&name),
            address,
            size,
            kind,
            global,
        });
    }
}
