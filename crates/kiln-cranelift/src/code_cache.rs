//! The code cache of `KilnModule` ([`crate::KilnBuilder::code_cache`]): a compiled
//! function stored under its caller's key in one of Kiln's object caches, as an ELF
//! relocatable object of its own — its code, its `.eh_frame`, and its relocations
//! against the *names* it refers to — so that a later process (another module, another
//! address space) defines it from the cache without compiling, and the finalize binds
//! those names as it binds a compiled function's.

use crate::relocations::elf_type;
use cranelift_codegen::binemit::Reloc;
use cranelift_codegen::isa::unwind::systemv::UnwindInfo;
use cranelift_codegen::isa::TargetIsa;
use kiln_link::{
    Architecture, BuiltObject, BuiltSection, BuiltSectionKind, BuiltSymbol, BuiltSymbolKind,
    SymbolBinding,
};
use object::read::elf::ElfFile64;
use object::{Object, ObjectSection, ObjectSymbol, RelocationFlags, RelocationTarget};

/// The cache key of a function: the caller's key, the function's name, the target and
/// every code generation flag (another ISA or flag is another key), and this format's
/// version.
pub(crate) fn key(isa: &dyn TargetIsa, name: &str, caller: &[u8]) -> kiln::cache::CacheKey {
    let mut hasher = blake3::Hasher::new();
    let mut part = |bytes: &[u8]| {
        hasher.update(&(bytes.len() as u64).to_le_bytes());
        hasher.update(bytes);
    };
    part(b"kiln-cranelift code cache 1");
    part(env!("CARGO_PKG_VERSION").as_bytes());
    part(isa.triple().to_string().as_bytes());
    part(isa.flags().to_string().as_bytes());
    for flag in isa.isa_flags() {
        part(flag.to_string().as_bytes());
    }
    part(name.as_bytes());
    part(caller);
    kiln::cache::CacheKey(*hasher.finalize().as_bytes())
}

/// What a relocation of a cached function refers to, by name (or its own symbol).
pub(crate) enum Target {
    /// The function itself.
    Itself,
    /// A name: another function or data object of the module, a libcall, a host symbol.
    Name(String),
}

/// A compiled function, as the code cache stores it.
pub(crate) struct CompiledFunction<'a> {
    /// Its name.
    pub(crate) name: &'a str,
    /// Its code.
    pub(crate) code: &'a [u8],
    /// Its alignment.
    pub(crate) align: u64,
    /// Its relocations.
    pub(crate) relocs: &'a [cranelift_module::ModuleReloc],
    /// Its unwind information.
    pub(crate) unwind: Option<&'a UnwindInfo>,
}

/// The object `function` is cached as. `name_of` names each relocation's target (and an
/// addend to add), [`Target::Itself`] for the function itself.
pub(crate) fn function_object(
    isa: &dyn TargetIsa,
    architecture: Architecture,
    function: &CompiledFunction<'_>,
    mut name_of: impl FnMut(&cranelift_module::ModuleRelocTarget) -> Result<(Target, i64), String>,
) -> Result<Vec<u8>, String> {
    let CompiledFunction {
        name,
        code,
        align,
        relocs,
        unwind,
    } = *function;
    let mut object = BuiltObject::new(architecture);
    let text = object.add_section(
        &format!(".text.{name}"),
        BuiltSectionKind::Code,
        align,
        code,
    );
    let function = object.add_symbol(
        name,
        Some((text, 0, code.len() as u64)),
        SymbolBinding::Global,
        BuiltSymbolKind::Function,
    );
    let mut named: Vec<(String, BuiltSymbol)> = Vec::new();
    let mut last_hi20 = None;
    for reloc in relocs {
        let r_type = elf_type(architecture, reloc.kind)
            .ok_or_else(|| format!("relocation {:?} is not linked by Kiln", reloc.kind))?;
        if crate::relocations::opens_pcrel_pair(reloc.kind) {
            last_hi20 = Some(u64::from(reloc.offset));
        }
        if reloc.kind == Reloc::RiscvPCRelLo12I {
            let hi = last_hi20.ok_or("a %pcrel_lo without its %pcrel_hi")?;
            let label = pcrel_label(&mut object, text, hi);
            object.add_relocation(text, u64::from(reloc.offset), r_type, label, 0);
            continue;
        }
        let (target, extra) = name_of(&reloc.name)?;
        let symbol = match target {
            Target::Itself => function,
            Target::Name(n) => match named.iter().find(|(m, _)| *m == n) {
                Some(&(_, s)) => s,
                None => {
                    let s = object.add_symbol(
                        &n,
                        None,
                        SymbolBinding::Global,
                        BuiltSymbolKind::Unknown,
                    );
                    named.push((n, s));
                    s
                }
            },
        };
        object.add_relocation(
            text,
            u64::from(reloc.offset),
            r_type,
            symbol,
            reloc.addend.wrapping_add(extra),
        );
    }
    if let Some(info) = unwind {
        crate::unwind::add_eh_frame(isa, architecture, &mut object, &[(function, info)])?;
    }
    Ok(object.to_elf())
}

/// A label at `offset` of `section`: what an ELF `%pcrel_lo` relocation names (the
/// instruction of its `%pcrel_hi`).
pub(crate) fn pcrel_label(
    object: &mut BuiltObject,
    section: BuiltSection,
    offset: u64,
) -> BuiltSymbol {
    let label = format!(".Lpcrel_hi{}", object.symbol_count() + 1);
    object.add_symbol(
        &label,
        Some((section, offset, 0)),
        SymbolBinding::Local,
        BuiltSymbolKind::Unknown,
    )
}

/// A cached function, read back: its sections and relocations, to be added to the
/// object being built.
pub(crate) struct CachedFunction {
    /// (name, kind, alignment, bytes); the first is the code.
    pub(crate) sections: Vec<(String, BuiltSectionKind, u64, Vec<u8>)>,
    /// The function's size (its symbol's).
    pub(crate) size: u64,
    /// (section index in `sections`, offset, ELF type, target, addend).
    pub(crate) relocs: Vec<(usize, u64, u32, CachedTarget, i64)>,
}

/// A relocation target of a cached function.
pub(crate) enum CachedTarget {
    /// The function.
    Itself,
    /// A name it refers to.
    Name(String),
    /// A label in one of its sections: (section index in `sections`, offset).
    Label(usize, u64),
}

/// Reads a cached object of `name` for `architecture`; an error for anything else (a
/// damaged entry is a miss to its caller, not a crash).
pub(crate) fn read(
    bytes: &[u8],
    name: &str,
    architecture: Architecture,
) -> Result<CachedFunction, String> {
    kiln_link::check_object(name, bytes, architecture).map_err(|e| e.to_string())?;
    let file = ElfFile64::<object::LittleEndian>::parse(bytes).map_err(|e| e.to_string())?;
    let mut sections = Vec::new();
    let mut index_of = Vec::new(); // (file section index, index in `sections`)
    for section in file.sections() {
        let section_name = section.name().map_err(|e| e.to_string())?;
        let kind = match section.kind() {
            object::SectionKind::Text => BuiltSectionKind::Code,
            _ if section_name == ".eh_frame" => BuiltSectionKind::ReadOnly,
            _ => continue,
        };
        let data = section.data().map_err(|e| e.to_string())?;
        index_of.push((section.index(), sections.len()));
        sections.push((
            section_name.to_string(),
            kind,
            section.align(),
            data.to_vec(),
        ));
    }
    if sections
        .first()
        .is_none_or(|(_, k, _, _)| *k != BuiltSectionKind::Code)
    {
        return Err("no code".into());
    }
    let mapped = |i: object::SectionIndex| index_of.iter().find(|(f, _)| *f == i).map(|(_, s)| *s);
    let function = file
        .symbols()
        .find(|s| s.name() == Ok(name) && s.is_definition())
        .ok_or_else(|| format!("it does not define {name}"))?;
    if function.section_index().and_then(mapped) != Some(0) || function.address() != 0 {
        return Err(format!("{name} is not at the start of its code"));
    }
    let mut relocs = Vec::new();
    for section in file.sections() {
        let Some(at) = mapped(section.index()) else {
            continue;
        };
        for (offset, reloc) in section.relocations() {
            let RelocationFlags::Elf { r_type } = reloc.flags() else {
                return Err("a relocation that is not ELF's".into());
            };
            let RelocationTarget::Symbol(index) = reloc.target() else {
                return Err("a relocation without a symbol".into());
            };
            let symbol = file.symbol_by_index(index).map_err(|e| e.to_string())?;
            let target = if symbol.index() == function.index() {
                CachedTarget::Itself
            } else if symbol.is_undefined() {
                CachedTarget::Name(symbol.name().map_err(|e| e.to_string())?.to_string())
            } else {
                let section = symbol
                    .section_index()
                    .and_then(mapped)
                    .ok_or("a label outside the cached sections")?;
                CachedTarget::Label(section, symbol.address())
            };
            relocs.push((at, offset, r_type.0, target, reloc.addend()));
        }
    }
    Ok(CachedFunction {
        sections,
        size: function.size(),
        relocs,
    })
}
