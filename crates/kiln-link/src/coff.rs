//! COFF x86-64 objects — what clang (`--target=x86_64-w64-windows-gnu`), mingw-w64 gcc,
//! MSVC and cranelift-object write for Windows — read into the same [`ObjectFile`] an ELF
//! object becomes, so that every pass of the link serves both formats. Parsing uses the
//! `object` crate's low-level COFF API; the translation is Kiln's:
//!
//! - **Sections** (index `k` of the object is section `k`, 1-based as COFF numbers them;
//!   index 0 is an empty section, as ELF's null section): code (`CNT_CODE`, `MEM_EXECUTE`)
//!   becomes `SHF_EXECINSTR`, `MEM_WRITE` `SHF_WRITE`, uninitialized data `SHT_NOBITS`;
//!   `LNK_REMOVE`, `LNK_INFO` (`.drectve`) and discardable sections (debug info) are not
//!   loaded. The C runtime's tables of initializers (`.CRT$XI*`, `.CRT$XC*`) and
//!   terminators (`.CRT$XT*`) become init and fini arrays (`.ctors`/`.dtors`, which mingw
//!   uses, are read as in ELF); `.tls*` is a thread-local section.
//! - **Symbols** (index `i + 1` is COFF symbol `i`; index 0 is ELF's null symbol; an
//!   auxiliary record is an empty local entry, so relocations keep their indices): static
//!   symbols are local, a section's definition is its section symbol, external ones are
//!   global — undefined (section 0, value 0) or common (section 0, value its size). A weak
//!   external is a weak definition where its default symbol is defined (mingw's
//!   `__attribute__((weak))` definitions), else a weak reference.
//! - **Relocations**: COFF keeps a relocation's addend in the field it patches; each one
//!   becomes an ELF `Rela` of a COFF row of the x86-64 table (`IMAGE_REL_AMD64_*`), whose
//!   addend is the field's value (minus the distance from the field's end for `REL32_N`,
//!   as ELF's PC-relative addends carry it). A `REL32` that is a branch's operand, or that
//!   refers to a function, may go through a stub when its target is out of reach; other
//!   PC-relative references must reach theirs. A `REL32` to an undefined `__imp_NAME` (a
//!   `dllimport` reference: the import-address-table slot of NAME) becomes a reference to
//!   NAME's GOT entry: the link's GOT is the JIT module's import table.
//! - **COMDAT**: a COMDAT section with the sections associated with it
//!   (`IMAGE_COMDAT_SELECT_ASSOCIATIVE`: its `.pdata`, `.xdata`) is a group named by its
//!   COMDAT symbol, and the link keeps the first copy, as of an ELF group. `NODUPLICATES`
//!   sections are not grouped, so that a second definition is a duplicate symbol;
//!   `LARGEST` keeps the first copy too (compilers emit it for data of one size).

use crate::object_file::{
    Binding, ObjSection, ObjSym, ObjectFile, Rela, SymSection, MAX_SECTION_ALIGN, SHF_ALLOC,
    SHF_EXECINSTR, SHF_TLS, SHF_WRITE, SHT_FINI_ARRAY, SHT_INIT_ARRAY, SHT_NOBITS,
    SHT_PREINIT_ARRAY,
};
use crate::{Architecture, LinkError};
use object::pe;
use object::read::coff::{CoffHeader, Symbol as _};
use object::{LittleEndian as LE, I64, U64};
use rustc_hash::FxHashMap;
use std::borrow::Cow;

/// Where the COFF x86-64 relocation types start in the x86-64 table (ELF's types end
/// below it): `IMAGE_REL_AMD64_*` type `t` is row `COFF_TYPES + t`.
pub(crate) const COFF_TYPES: u32 = 0x400;
/// The row of a `REL32`…`REL32_5` to an undefined `__imp_NAME`, made a GOT-relative
/// reference to NAME.
pub(crate) const COFF_IMPORT_REL32: u32 = COFF_TYPES + 0x20;
/// The row of a `REL32` that is a branch's operand (`call`, `jmp`, `jcc` rel32) or refers
/// to a function: reached through a stub when the target is out of reach. Other `REL32`s
/// (data operands) must reach their target, as a linker requires.
pub(crate) const COFF_BRANCH_REL32: u32 = COFF_TYPES + 0x21;
/// Where a relocation type COFF does not define goes: no row, an unknown relocation.
const COFF_UNKNOWN: u32 = COFF_TYPES + 0xff;

/// Whether the 4-byte field at `at` of code `bytes` is the operand of a rel32 branch: `E8`
/// (call), `E9` (jmp) or `0F 80`–`0F 8F` (jcc) just before it. (No RIP-relative ModRM byte
/// is one of these: theirs have mod 00.)
fn is_branch_operand(bytes: &[u8], at: usize) -> bool {
    match at.checked_sub(1).and_then(|i| bytes.get(i)) {
        Some(0xe8 | 0xe9) => true,
        Some(0x80..=0x8f) => at >= 2 && bytes[at - 2] == 0x0f,
        _ => false,
    }
}

/// `IMAGE_FILE_MACHINE_*` values a Windows object may carry, and their names.
fn machine_name(machine: u16) -> Option<&'static str> {
    Some(match machine {
        m if m == pe::IMAGE_FILE_MACHINE_AMD64.0 => "x86-64",
        m if m == pe::IMAGE_FILE_MACHINE_ARM64.0 => "ARM64",
        m if m == pe::IMAGE_FILE_MACHINE_ARM64EC.0 => "ARM64EC",
        m if m == pe::IMAGE_FILE_MACHINE_ARM64X.0 => "ARM64X",
        m if m == pe::IMAGE_FILE_MACHINE_ARMNT.0 => "ARM (Thumb-2)",
        m if m == pe::IMAGE_FILE_MACHINE_I386.0 => "i386",
        _ => return None,
    })
}

/// The `/bigobj` header's class id (`ANON_OBJECT_HEADER_BIGOBJ`).
const BIGOBJ_CLASS_ID: [u8; 16] = [
    0xc7, 0xa1, 0xba, 0xd1, 0xee, 0xba, 0xa9, 0x4b, 0xaf, 0x20, 0xfa, 0xf6, 0x6a, 0xa4, 0xdc, 0xb8,
];

/// The object's machine if `data` starts as a COFF object: a machine Windows runs
/// (x86-64, ARM64, ARM, i386) in a plain header, or a `/bigobj` header.
pub(crate) fn coff_machine(data: &[u8]) -> Option<u16> {
    let u16_at = |at: usize| {
        data.get(at..at + 2)
            .map(|b| u16::from_le_bytes([b[0], b[1]]))
    };
    let first = u16_at(0)?;
    if machine_name(first).is_some() {
        return Some(first);
    }
    // ANON_OBJECT_HEADER_BIGOBJ: Sig1 0, Sig2 0xffff, Version ≥ 2, Machine, …, ClassID.
    if first == 0 && u16_at(2)? == 0xffff && u16_at(4)? >= 2 && data.get(12..28)? == BIGOBJ_CLASS_ID
    {
        return u16_at(6);
    }
    None
}

/// Whether `data` is a COFF object (of any machine Windows runs).
pub(crate) fn is_coff(data: &[u8]) -> bool {
    coff_machine(data).is_some()
}

fn malformed(object: &str, what: impl std::fmt::Display) -> LinkError {
    LinkError::Malformed {
        object: object.to_string(),
        what: what.to_string(),
    }
}

/// Checks that a COFF object is one Kiln links: x86-64, for an x86-64 link.
pub(crate) fn check_machine(name: &str, data: &[u8], arch: Architecture) -> Result<(), LinkError> {
    let machine = coff_machine(data).unwrap_or(0);
    if machine == pe::IMAGE_FILE_MACHINE_AMD64.0 && arch == Architecture::X86_64 {
        return Ok(());
    }
    let what = machine_name(machine).unwrap_or("unknown machine");
    let found = if machine == pe::IMAGE_FILE_MACHINE_AMD64.0 {
        "a COFF x86-64 (Windows) object".to_string()
    } else {
        format!("a COFF {what} object (Kiln links COFF objects for x86-64 only: {what} is not supported)")
    };
    Err(LinkError::WrongArchitecture {
        object: name.to_string(),
        found,
        expected: arch,
    })
}

const SCN_CODE: u32 = pe::IMAGE_SCN_CNT_CODE.0 | pe::IMAGE_SCN_MEM_EXECUTE.0;
const SCN_UNINITIALIZED: u32 = pe::IMAGE_SCN_CNT_UNINITIALIZED_DATA.0;
const SCN_NOT_LOADED: u32 =
    pe::IMAGE_SCN_LNK_REMOVE.0 | pe::IMAGE_SCN_LNK_INFO.0 | pe::IMAGE_SCN_MEM_DISCARDABLE.0;
const SCN_COMDAT: u32 = pe::IMAGE_SCN_LNK_COMDAT.0;
const SELECT_NODUPLICATES: u8 = pe::IMAGE_COMDAT_SELECT_NODUPLICATES.0;
const SELECT_ASSOCIATIVE: u8 = pe::IMAGE_COMDAT_SELECT_ASSOCIATIVE.0;

/// The ELF type and flags a COFF section is linked as.
fn section_kind(name: &[u8], characteristics: u32) -> (u32, u64) {
    if characteristics & SCN_NOT_LOADED != 0 {
        return (object::elf::SHT_PROGBITS.0, 0);
    }
    let mut flags = SHF_ALLOC;
    if characteristics & SCN_CODE != 0 {
        flags |= SHF_EXECINSTR;
    }
    if characteristics & pe::IMAGE_SCN_MEM_WRITE.0 != 0 {
        flags |= SHF_WRITE;
    }
    if name.starts_with(b".tls") {
        flags |= SHF_TLS;
    }
    let sh_type = if characteristics & SCN_UNINITIALIZED != 0 {
        SHT_NOBITS
    } else if name.starts_with(b".CRT$XC") {
        SHT_INIT_ARRAY
    } else if name.starts_with(b".CRT$XI") {
        SHT_PREINIT_ARRAY
    } else if name.starts_with(b".CRT$XT") {
        SHT_FINI_ARRAY
    } else {
        object::elf::SHT_PROGBITS.0
    };
    (sh_type, flags)
}

/// Parses a COFF object (plain or `/bigobj`).
pub(crate) fn parse<'a>(
    name: Cow<'a, str>,
    data: &'a [u8],
    arch: Architecture,
) -> Result<ObjectFile<'a>, LinkError> {
    check_machine(&name, data, arch)?;
    if data.first_chunk::<2>() == Some(&[0, 0]) {
        parse_with::<pe::AnonObjectHeaderBigobj>(name, data)
    } else {
        parse_with::<pe::ImageFileHeader>(name, data)
    }
}

fn parse_with<'a, Coff: CoffHeader>(
    name: Cow<'a, str>,
    data: &'a [u8],
) -> Result<ObjectFile<'a>, LinkError> {
    let mut offset = 0;
    let header = Coff::parse(data, &mut offset).map_err(|e| malformed(&name, e))?;
    let table = header
        .sections(data, offset)
        .map_err(|e| malformed(&name, e))?;
    let symtab = header.symbols(data).map_err(|e| malformed(&name, e))?;
    let strings = symtab.strings();
    let count = table.len() + 1;

    // Sections: index 0 empty, then COFF's 1-based ones.
    let mut sections = Vec::with_capacity(count);
    sections.push(ObjSection {
        name: b"",
        sh_type: object::elf::SHT_NULL.0,
        flags: 0,
        size: 0,
        align: 1,
        info: 0,
        data: &[],
    });
    for (index, sh) in table.iter().enumerate() {
        let sec_name = sh
            .name(strings)
            .map_err(|e| malformed(&name, format!("section {}: name: {e}", index + 1)))?;
        let characteristics = sh.characteristics.get(LE).0;
        let (sh_type, flags) = section_kind(sec_name, characteristics);
        let size = u64::from(sh.size_of_raw_data.get(LE));
        let contents = if sh_type == SHT_NOBITS {
            &[][..]
        } else {
            sh.coff_data(data).map_err(|()| {
                malformed(
                    &name,
                    format!(
                        "section {} ({}) lies outside the file",
                        String::from_utf8_lossy(sec_name),
                        index + 1
                    ),
                )
            })?
        };
        // At most 8 KiB (the field's largest), far below what Kiln places.
        let align = sh.coff_alignment();
        debug_assert!(align <= MAX_SECTION_ALIGN);
        sections.push(ObjSection {
            name: sec_name,
            sh_type,
            flags,
            size,
            align,
            info: 0,
            data: contents,
        });
    }

    // Symbols: index 0 ELF's null symbol, COFF symbol i at i + 1.
    let null = ObjSym {
        name: b"",
        value: 0,
        size: 0,
        section: SymSection::Undefined,
        binding: Binding::Local,
        kind: object::elf::STT_NOTYPE.0,
        visibility: 0,
    };
    let aux = ObjSym {
        section: SymSection::Absolute,
        ..null
    };
    let mut symbols = Vec::with_capacity(symtab.len() + 1);
    symbols.push(null);
    // For each section: its COMDAT selection, its associated section, and the index of
    // its COMDAT symbol (the first symbol defined in it after its definition).
    let mut selection = vec![0u8; count];
    let mut associated = vec![0u32; count];
    let mut comdat_symbol = vec![None::<usize>; count];
    // Weak externals, resolved once every symbol is read: (index, default's COFF index).
    let mut weak_externals = Vec::new();
    let mut index = 0;
    while index < symtab.len() {
        let sym = symtab
            .symbol(object::SymbolIndex(index))
            .map_err(|e| malformed(&name, format!("symbol {index}: {e}")))?;
        let sym_name = sym
            .name(strings)
            .map_err(|e| malformed(&name, format!("symbol {index}: name: {e}")))?;
        let number = sym.section_number().0;
        let class = sym.storage_class();
        let section = if number == pe::IMAGE_SYM_UNDEFINED.0 {
            if sym.value() == 0 {
                SymSection::Undefined
            } else {
                SymSection::Common
            }
        } else if number > 0 {
            let s = number as u32;
            if s as usize >= count {
                return Err(LinkError::SectionIndexOutOfRange {
                    object: name.to_string(),
                    symbol: String::from_utf8_lossy(sym_name).into_owned(),
                    index: s,
                    count,
                });
            }
            SymSection::Section(s)
        } else {
            SymSection::Absolute
        };
        let is_section_definition = sym.has_aux_section();
        let binding = match class {
            pe::IMAGE_SYM_CLASS_EXTERNAL => Binding::Global,
            pe::IMAGE_SYM_CLASS_WEAK_EXTERNAL => Binding::Weak,
            _ => Binding::Local,
        };
        let in_tls =
            matches!(section, SymSection::Section(s) if sections[s as usize].flags & SHF_TLS != 0);
        let kind = if is_section_definition {
            object::elf::STT_SECTION.0
        } else if in_tls {
            object::elf::STT_TLS.0
        } else if sym.derived_type() == pe::IMAGE_SYM_DTYPE_FUNCTION {
            object::elf::STT_FUNC.0
        } else if section == SymSection::Undefined {
            object::elf::STT_NOTYPE.0
        } else {
            object::elf::STT_OBJECT.0
        };
        let (value, size) = match section {
            // A common symbol's value is its size; align it as its size, up to 32 bytes
            // (as Microsoft's and LLVM's linkers do).
            SymSection::Common => {
                let size = u64::from(sym.value());
                (size.next_power_of_two().min(32), size)
            }
            _ => (u64::from(sym.value()), 0),
        };
        let this = symbols.len();
        symbols.push(ObjSym {
            name: sym_name,
            value,
            size,
            section,
            binding,
            kind,
            visibility: 0,
        });
        if is_section_definition {
            if let SymSection::Section(s) = section {
                let s = s as usize;
                let aux_section = symtab
                    .aux_section(object::SymbolIndex(index))
                    .map_err(|e| malformed(&name, format!("symbol {index}: {e}")))?;
                if table
                    .section(object::SectionIndex(s))
                    .is_ok_and(|h| h.characteristics.get(LE).0 & SCN_COMDAT != 0)
                {
                    selection[s] = aux_section.selection.0;
                    associated[s] = u32::from(aux_section.number.get(LE))
                        | u32::from(aux_section.high_number.get(LE)) << 16;
                }
            }
        } else if let SymSection::Section(s) = section {
            let s = s as usize;
            if selection[s] != 0 && comdat_symbol[s].is_none() {
                comdat_symbol[s] = Some(this);
            }
        }
        if sym.has_aux_weak_external() {
            let weak = symtab
                .aux_weak_external(object::SymbolIndex(index))
                .map_err(|e| malformed(&name, format!("symbol {index}: {e}")))?;
            weak_externals.push((this, weak.default_symbol().0));
        }
        let aux_count = usize::from(sym.number_of_aux_symbols());
        symbols.extend(std::iter::repeat_n(aux, aux_count));
        index += 1 + aux_count;
    }
    if symbols.len() > symtab.len() + 1 {
        return Err(malformed(
            &name,
            "the last symbol's auxiliary records run past the table",
        ));
    }
    // A weak external takes its default's place where that is defined.
    for (at, default) in weak_externals {
        let Some(&target) = symbols.get(default + 1) else {
            return Err(malformed(
                &name,
                format!(
                    "weak external '{}' names default symbol {default} of {}",
                    String::from_utf8_lossy(symbols[at].name),
                    symtab.len()
                ),
            ));
        };
        // (An undefined weak reference's default is an absolute 0 the compiler makes up:
        // the name stays undefined, for another module or the host to define.)
        let defines = match target.section {
            SymSection::Section(_) => true,
            SymSection::Absolute => target.value != 0,
            _ => false,
        };
        if defines {
            let weak = &mut symbols[at];
            weak.section = target.section;
            weak.value = target.value;
            if target.kind == object::elf::STT_FUNC.0 {
                weak.kind = target.kind;
            }
        }
    }

    // COMDAT groups: each selected section with the sections associated with it,
    // transitively (each section's associates listed once, then walked).
    let mut associates: Vec<Vec<u32>> = vec![Vec::new(); count];
    for t in 1..count {
        let leader = associated[t] as usize;
        if selection[t] == SELECT_ASSOCIATIVE && leader < count && leader != t {
            associates[leader].push(t as u32);
        }
    }
    let mut groups: Vec<(&'a [u8], Vec<u32>)> = Vec::new();
    let mut in_group = vec![false; count];
    for s in 1..count {
        let sel = selection[s];
        if sel == 0 || sel == SELECT_ASSOCIATIVE || sel == SELECT_NODUPLICATES {
            continue;
        }
        let signature = comdat_symbol[s].map_or(sections[s].name, |i| symbols[i].name);
        let mut members = vec![s as u32];
        in_group[s] = true;
        let mut next = 0;
        while next < members.len() {
            for &t in &associates[members[next] as usize] {
                if !in_group[t as usize] {
                    in_group[t as usize] = true;
                    members.push(t);
                }
            }
            next += 1;
        }
        groups.push((signature, members));
    }

    // Relocations.
    let mut relocations = Vec::new();
    // The names `__imp_` references import, as symbols after the table's.
    let mut extra = Vec::new();
    let mut imports: FxHashMap<&'a [u8], usize> = FxHashMap::default();
    // Symbols referred to other than by a rewritten `__imp_` reference.
    let mut referenced = vec![false; symbols.len()];
    for (i, sh) in table.iter().enumerate() {
        let s = i + 1;
        let relocs = sh.coff_relocations(data).map_err(|e| {
            malformed(
                &name,
                format!(
                    "section {}: relocations: {e}",
                    String::from_utf8_lossy(sections[s].name)
                ),
            )
        })?;
        if relocs.is_empty() {
            continue;
        }
        let sec = sections[s];
        let mut relas = Vec::with_capacity(relocs.len());
        for r in relocs {
            let offset = u64::from(r.virtual_address.get(LE));
            let typ = r.typ.get(LE).0;
            let coff_index = r.symbol_table_index.get(LE) as usize;
            let bad = |what: String| LinkError::BadRelocation {
                object: name.to_string(),
                section: String::from_utf8_lossy(sec.name).into_owned(),
                offset,
                what,
            };
            let mut sym = coff_index + 1;
            let Some(target) = symbols.get(sym).copied() else {
                return Err(bad(format!(
                    "symbol index {coff_index} of {}",
                    symtab.len()
                )));
            };
            let width = match typ {
                t if t == pe::IMAGE_REL_AMD64_ADDR64.0 => 8,
                t if t == pe::IMAGE_REL_AMD64_SECTION.0 => 2,
                t if t == pe::IMAGE_REL_AMD64_ABSOLUTE.0 => 0,
                t if t == pe::IMAGE_REL_AMD64_SECREL7.0 => 1,
                _ => 4,
            };
            // The implicit addend: the field's value.
            if sec.sh_type == SHT_NOBITS && width > 0 {
                return Err(bad("a relocation in uninitialized data".into()));
            }
            let at = usize::try_from(offset).unwrap_or(usize::MAX);
            let Some(field) = sec.data.get(at..at.saturating_add(width)) else {
                return Err(bad(format!(
                    "a {width}-byte field past the section's end ({:#x} bytes)",
                    sec.data.len()
                )));
            };
            let implicit: i64 = match width {
                8 => i64::from_le_bytes(field.try_into().unwrap_or([0; 8])),
                4 => i64::from(i32::from_le_bytes(field.try_into().unwrap_or([0; 4]))),
                2 => i64::from(i16::from_le_bytes(field.try_into().unwrap_or([0; 2]))),
                1 => i64::from(field[0] as i8),
                _ => 0,
            };
            // A type past the table's (0x10, SSPAN32) has no row: an unknown relocation,
            // never one of the rows Kiln adds after them.
            let mut r_type = if typ <= 0x10 {
                COFF_TYPES + u32::from(typ)
            } else {
                COFF_UNKNOWN
            };
            let mut addend = implicit;
            let rel32 = pe::IMAGE_REL_AMD64_REL32.0;
            if (rel32..=pe::IMAGE_REL_AMD64_REL32_5.0).contains(&typ) {
                // ELF's PC-relative addend: from the field's end, and the bytes after it.
                addend -= 4 + i64::from(typ - rel32);
                if let Some(imported) = target
                    .name
                    .strip_prefix(b"__imp_")
                    .filter(|_| target.section == SymSection::Undefined)
                {
                    // The import-address-table slot of `imported`: its GOT entry.
                    let next = symbols.len() + extra.len();
                    sym = *imports.entry(imported).or_insert_with(|| {
                        extra.push(ObjSym {
                            name: imported,
                            binding: Binding::Global,
                            ..null
                        });
                        next
                    });
                    r_type = COFF_IMPORT_REL32;
                } else if typ == rel32
                    && (target.is_func()
                        || (sec.flags & SHF_EXECINSTR != 0 && is_branch_operand(sec.data, at)))
                {
                    r_type = COFF_BRANCH_REL32;
                }
            }
            if r_type != COFF_IMPORT_REL32 {
                referenced[coff_index + 1] = true;
            }
            relas.push(Rela {
                r_offset: U64::new(LE, offset),
                r_info: U64::new(LE, (sym as u64) << 32 | u64::from(r_type)),
                r_addend: I64::new(LE, addend),
            });
        }
        relocations.push((s as u32, Cow::Owned(relas)));
    }
    // An undefined `__imp_NAME` every reference of which became NAME's GOT entry is no
    // name the link must find.
    for (sym, used) in symbols.iter_mut().zip(referenced) {
        if !used && sym.section == SymSection::Undefined && sym.name.starts_with(b"__imp_") {
            sym.binding = Binding::Local;
        }
    }
    symbols.extend(extra);
    Ok(ObjectFile {
        name,
        sections,
        symbols,
        relocations,
        groups,
        branch_protected: false,
    })
}
