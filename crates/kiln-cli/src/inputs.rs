//! What `kiln run` makes of its inputs: sources compiled through the object cache,
//! objects, archives (whole or as needed), shared libraries; and the messages for inputs
//! it cannot use.

use kiln_cache::SystemCompiler;
use object::read::archive::ArchiveFile;
use std::path::Path;

/// How an input file is used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum InputKind {
    /// C or C++ source: compiled.
    Source,
    /// A relocatable object.
    Object,
    /// A static archive.
    Archive,
    /// A shared library.
    Shared,
}

/// What `path` is, from its name and first bytes; an error that says what to do instead.
pub(crate) fn classify(path: &Path, bytes: Option<&[u8]>) -> Result<InputKind, String> {
    if SystemCompiler::is_source(path) {
        return Ok(InputKind::Source);
    }
    let Some(bytes) = bytes else {
        let looks_like_input = matches!(
            path.extension().and_then(|e| e.to_str()),
            Some("o" | "a" | "so" | "obj")
        ) || path.to_string_lossy().contains(".so.");
        return Err(if path.is_dir() {
            format!(
                "{}: is a directory, not an input (give the object files, archives, shared libraries or sources in it)",
                path.display()
            )
        } else if path.exists() {
            let why = std::fs::File::open(path)
                .err()
                .map_or_else(|| "it vanished or changed".to_string(), |e| e.to_string());
            format!("{}: cannot be read: {why}", path.display())
        } else if looks_like_input {
            format!("{}: no such file", path.display())
        } else {
            format!(
                "{}: no such file (if it is an argument for the program, put it after `--`: \
                 kiln run prog.o -- ARGS)",
                path.display()
            )
        });
    };
    if bytes.starts_with(b"!<arch>\n") {
        return Ok(InputKind::Archive);
    }
    if kiln_link::is_coff(bytes) {
        return Ok(InputKind::Object);
    }
    if !bytes.starts_with(b"\x7fELF") {
        return Err(format!(
            "{}: not an object, archive, shared library or C/C++ source (.c, .cc, .cpp)",
            path.display()
        ));
    }
    let file = ElfSummary::parse(bytes).map_err(|e| format!("{}: {e}", path.display()))?;
    match file.kind {
        object::ObjectKind::Relocatable => {
            if file.lto_only {
                return Err(format!(
                    "{}: compiled with -flto, it holds GCC's intermediate code and no machine \
                     code; compile it without -flto (or with -ffat-lto-objects)",
                    path.display()
                ));
            }
            Ok(InputKind::Object)
        }
        object::ObjectKind::Dynamic => {
            // A shared library, or a position-independent program (it has an interpreter).
            if file.interpreter {
                Err(format!(
                    "{}: a linked program, not an object: kiln runs relocatable objects \
                     (cc -c) and archives",
                    path.display()
                ))
            } else {
                Ok(InputKind::Shared)
            }
        }
        object::ObjectKind::Executable => Err(format!(
            "{}: a linked program, not an object: kiln runs relocatable objects (cc -c) and archives",
            path.display()
        )),
        _ => Err(format!("{}: an ELF file kiln cannot use", path.display())),
    }
}

/// What [`classify`] reads of an ELF file: its type and section headers (with
/// `object::File::parse` it also found the symbol table and indexed the relocation
/// sections, which a run that maps a stored image never needs).
struct ElfSummary {
    kind: object::ObjectKind,
    /// A relocatable object with no machine code and GCC's LTO sections.
    lto_only: bool,
    /// A shared object with an `.interp` section: a position-independent program.
    interpreter: bool,
}

impl ElfSummary {
    fn parse(bytes: &[u8]) -> object::Result<Self> {
        match object::FileKind::parse(bytes)? {
            object::FileKind::Elf32 => {
                Self::of::<object::elf::FileHeader32<object::Endianness>>(bytes)
            }
            _ => Self::of::<object::elf::FileHeader64<object::Endianness>>(bytes),
        }
    }

    fn of<H: object::read::elf::FileHeader<Endian = object::Endianness>>(
        bytes: &[u8],
    ) -> object::Result<Self> {
        use object::read::elf::SectionHeader;
        let header = H::parse(bytes)?;
        let endian = header.endian()?;
        let sections = header.sections(endian, bytes)?;
        let named = |wanted: &dyn Fn(&[u8]) -> bool| {
            sections
                .iter()
                .any(|s| sections.section_name(endian, s).is_ok_and(wanted))
        };
        let kind = match header.e_type(endian) {
            object::elf::ET_REL => object::ObjectKind::Relocatable,
            object::elf::ET_DYN => object::ObjectKind::Dynamic,
            object::elf::ET_EXEC => object::ObjectKind::Executable,
            _ => object::ObjectKind::Unknown,
        };
        // Code first: most objects have some, found at once, and then their (perhaps
        // thousands of) section names need not be read for LTO's.
        let lto_only = kind == object::ObjectKind::Relocatable
            && !sections.iter().any(|s| {
                s.sh_flags(endian).contains(object::elf::SHF_EXECINSTR)
                    && s.sh_flags(endian).contains(object::elf::SHF_ALLOC)
                    && s.sh_type(endian) == object::elf::SHT_PROGBITS
                    && s.sh_size(endian).into() > 0
            })
            && named(&|n| n.starts_with(b".gnu.lto_"));
        let interpreter = kind == object::ObjectKind::Dynamic && named(&|n| n == b".interp");
        Ok(ElfSummary {
            kind,
            lto_only,
            interpreter,
        })
    }
}

/// Every member of an archive, as (name, bytes) (`--whole-archive`).
pub(crate) fn archive_members(path: &Path, bytes: &[u8]) -> Result<Vec<(String, Vec<u8>)>, String> {
    let archive = ArchiveFile::parse(bytes).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut members = Vec::new();
    for member in archive.members() {
        let member = member.map_err(|e| format!("{}: {e}", path.display()))?;
        let name = String::from_utf8_lossy(member.name()).into_owned();
        let data = member
            .data(bytes)
            .map_err(|e| format!("{}({name}): {e}", path.display()))?;
        if data.starts_with(b"\x7fELF") || kiln_link::is_coff(data) {
            members.push((format!("{}({name})", path.display()), data.to_vec()));
        }
    }
    Ok(members)
}

/// A C++ name as a reader knows it (`_ZNSt6vectorIiSaIiEE9push_backERKi` →
/// `std::vector<int, ...>::push_back(int const&)`), else the name itself.
pub(crate) fn demangle(name: &str) -> String {
    cpp_demangle::Symbol::new(name)
        .ok()
        .map(|s| s.to_string())
        .unwrap_or_else(|| name.to_string())
}

/// An object that refers to each of `symbols` (an absolute pointer to each, in data), so
/// that the link must define them: what `ld -u SYM` does, pulling archive members.
pub(crate) fn undefined_references(
    symbols: &[String],
    target: kiln::Architecture,
) -> Result<Vec<u8>, String> {
    use object::write::{Object, Relocation, Symbol, SymbolSection};
    use object::{
        RelocationEncoding, RelocationFlags, RelocationKind, SymbolFlags, SymbolKind, SymbolScope,
    };
    let architecture = match target {
        kiln::Architecture::Aarch64 => object::Architecture::Aarch64,
        kiln::Architecture::Riscv64 => object::Architecture::Riscv64,
        kiln::Architecture::X86_64 => object::Architecture::X86_64,
    };
    let mut obj = Object::new(
        object::BinaryFormat::Elf,
        architecture,
        object::Endianness::Little,
    );
    let data = obj.section_id(object::write::StandardSection::Data);
    let offset = obj.append_section_data(data, &vec![0u8; 8 * symbols.len()], 8);
    for (i, name) in symbols.iter().enumerate() {
        let symbol = obj.add_symbol(Symbol {
            name: name.as_bytes().to_vec(),
            value: 0,
            size: 0,
            kind: SymbolKind::Unknown,
            scope: SymbolScope::Unknown,
            weak: false,
            section: SymbolSection::Undefined,
            flags: SymbolFlags::None,
        });
        obj.add_relocation(
            data,
            Relocation {
                offset: offset + 8 * i as u64,
                symbol,
                addend: 0,
                flags: RelocationFlags::Generic {
                    kind: RelocationKind::Absolute,
                    encoding: RelocationEncoding::Generic,
                    size: 64,
                },
            },
        )
        .map_err(|e| format!("-u {name}: {e}"))?;
    }
    obj.write().map_err(|e| format!("-u: {e}"))
}
