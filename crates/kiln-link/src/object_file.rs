//! One parsed relocatable object: its sections, symbols and relocation sections, checked
//! against the file's bounds. Parsing uses the `object` crate's low-level ELF API.

use crate::{Architecture, LinkError};
use object::elf;
use object::read::elf::{FileHeader, SectionHeader, SectionTable, Sym as _};
use object::LittleEndian as LE;

type Header = elf::FileHeader64<LE>;
pub(crate) type Rela = elf::Rela64<LE>;

/// Where a symbol is defined.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SymSection {
    Undefined,
    Absolute,
    Common,
    Section(u32),
}

/// Symbol binding as the linker sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Binding {
    Local,
    Global,
    Weak,
}

/// One symbol of an object.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ObjSym<'a> {
    pub(crate) name: &'a [u8],
    pub(crate) value: u64,
    pub(crate) size: u64,
    pub(crate) section: SymSection,
    pub(crate) binding: Binding,
    pub(crate) kind: u8,
    pub(crate) visibility: u8,
}

impl ObjSym<'_> {
    pub(crate) fn is_tls(&self) -> bool {
        self.kind == elf::STT_TLS.0
    }
    pub(crate) fn is_section(&self) -> bool {
        self.kind == elf::STT_SECTION.0
    }
    pub(crate) fn is_func(&self) -> bool {
        self.kind == elf::STT_FUNC.0 || self.kind == elf::STT_GNU_IFUNC.0
    }
}

/// One section of an object.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ObjSection<'a> {
    pub(crate) name: &'a [u8],
    pub(crate) sh_type: u32,
    pub(crate) flags: u64,
    pub(crate) size: u64,
    pub(crate) align: u64,
    pub(crate) info: u32,
    /// File contents (empty for NOBITS).
    pub(crate) data: &'a [u8],
}

/// Largest section alignment honoured (a page of the largest page size Linux uses on
/// AArch64 is 64 KiB; compilers ask for at most a few KiB).
pub(crate) const MAX_SECTION_ALIGN: u64 = 1 << 24;
pub(crate) const SHF_WRITE: u64 = elf::SHF_WRITE.0;
pub(crate) const SHF_ALLOC: u64 = elf::SHF_ALLOC.0;
pub(crate) const SHF_EXECINSTR: u64 = elf::SHF_EXECINSTR.0;
pub(crate) const SHF_TLS: u64 = elf::SHF_TLS.0;
pub(crate) const SHF_EXCLUDE: u64 = elf::SHF_EXCLUDE.0;
pub(crate) const SHT_NOBITS: u32 = elf::SHT_NOBITS.0;
pub(crate) const SHT_RELA: u32 = elf::SHT_RELA.0;
pub(crate) const SHT_REL: u32 = elf::SHT_REL.0;
pub(crate) const SHT_GROUP: u32 = elf::SHT_GROUP.0;
pub(crate) const SHT_INIT_ARRAY: u32 = elf::SHT_INIT_ARRAY.0;
pub(crate) const SHT_FINI_ARRAY: u32 = elf::SHT_FINI_ARRAY.0;
pub(crate) const SHT_PREINIT_ARRAY: u32 = elf::SHT_PREINIT_ARRAY.0;
pub(crate) const SHT_NOTE: u32 = elf::SHT_NOTE.0;

/// A parsed object.
#[derive(Debug, Clone)]
pub(crate) struct ObjectFile<'a> {
    /// Its name, borrowed from the input (an archive member's is made from the archive's).
    pub(crate) name: std::borrow::Cow<'a, str>,
    pub(crate) sections: Vec<ObjSection<'a>>,
    pub(crate) symbols: Vec<ObjSym<'a>>,
    /// (relocated section index, relocations): an ELF object's borrowed from its bytes,
    /// a COFF object's made from its own ([`crate::coff`]).
    pub(crate) relocations: Vec<(u32, std::borrow::Cow<'a, [Rela]>)>,
    /// COMDAT groups: (signature, member section indices).
    pub(crate) groups: Vec<(&'a [u8], Vec<u32>)>,
    /// Its GNU property note says its code is built for branch-target enforcement
    /// (AArch64 BTI: every indirect-branch target is a landing pad).
    pub(crate) branch_protected: bool,
}

/// Whether an object's `.note.gnu.property` marks it BTI-compatible
/// (`GNU_PROPERTY_AARCH64_FEATURE_1_AND` with the BTI bit). A malformed note is read as
/// "no": the code is then mapped without the guard, which is always safe.
fn branch_protected<'d>(data: &'d [u8], table: &SectionTable<'d, Header, &'d [u8]>) -> bool {
    let endian = LE;
    table.iter().any(|sh| {
        let Ok(Some(mut notes)) = sh.notes(endian, data) else {
            return false;
        };
        while let Ok(Some(note)) = notes.next() {
            let Some(properties) = note.gnu_properties(endian) else {
                continue;
            };
            for property in properties.flatten() {
                if property.pr_type() == elf::GNU_PROPERTY_AARCH64_FEATURE_1_AND
                    && property
                        .data_u32(endian)
                        .is_ok_and(|bits| bits & elf::GNU_PROPERTY_AARCH64_FEATURE_1_BTI != 0)
                {
                    return true;
                }
            }
        }
        false
    })
}

fn malformed(object: &str, what: impl std::fmt::Display) -> LinkError {
    LinkError::Malformed {
        object: object.to_string(),
        what: what.to_string(),
    }
}

/// Checks the ELF header: ELF64, little-endian, `arch`, `ET_REL`.
pub(crate) fn check_header(name: &str, data: &[u8], arch: Architecture) -> Result<(), LinkError> {
    if data.len() < 4 || &data[..4] != b"\x7fELF" {
        return Err(malformed(name, "not an ELF file (bad magic)"));
    }
    if data.len() < 20 {
        return Err(malformed(name, "truncated ELF header"));
    }
    let class = data[4];
    let endian = data[5];
    let machine = u16::from_le_bytes([data[18], data[19]]);
    if class != 2 || endian != 1 || machine != arch.elf_machine() {
        let expected = arch;
        let arch = match machine {
            0x28 => "ARM".to_string(),
            0xb7 => "AArch64".to_string(),
            0x3e => "x86-64".to_string(),
            0x03 => "i386".to_string(),
            0xf3 => "RISC-V".to_string(),
            other => format!("machine {other}"),
        };
        return Err(LinkError::WrongArchitecture {
            object: name.to_string(),
            found: format!(
                "{}-bit {}-endian {arch}",
                if class == 2 { 64 } else { 32 },
                if endian == 1 { "little" } else { "big" }
            ),
            expected,
        });
    }
    if arch == Architecture::Riscv64 {
        check_riscv_abi(name, data)?;
    }
    let e_type = u16::from_le_bytes([data[16], data[17]]);
    if e_type != elf::ET_REL.0 {
        return Err(LinkError::NotRelocatable {
            object: name.to_string(),
            e_type,
        });
    }
    Ok(())
}

/// Checks a RISC-V object's ABI (`e_flags`): Kiln links for Linux's LP64D, whose
/// floating-point arguments travel in `f` registers; an LP64 (soft-float), LP64F or RV64E
/// object would pass them elsewhere than the C library expects.
fn check_riscv_abi(name: &str, data: &[u8]) -> Result<(), LinkError> {
    let Some(flags) = data.get(48..52) else {
        return Err(malformed(name, "truncated ELF header"));
    };
    let flags = u32::from_le_bytes([flags[0], flags[1], flags[2], flags[3]]);
    let (float_abi, rve) = (
        flags & elf::EF_RISCV_FLOAT_ABI,
        flags & elf::EF_RISCV_RVE.0 != 0,
    );
    let abi = if rve {
        "the RV64E ABI"
    } else if float_abi == elf::EF_RISCV_FLOAT_ABI_DOUBLE.0 {
        return Ok(());
    } else if float_abi == elf::EF_RISCV_FLOAT_ABI_SOFT.0 {
        "the LP64 (soft-float) ABI"
    } else if float_abi == elf::EF_RISCV_FLOAT_ABI_SINGLE.0 {
        "the LP64F ABI"
    } else {
        "the LP64Q ABI"
    };
    Err(LinkError::WrongArchitecture {
        object: name.to_string(),
        found: format!("64-bit little-endian RISC-V with {abi} (compile with -mabi=lp64d)"),
        expected: Architecture::Riscv64,
    })
}

impl<'a> ObjectFile<'a> {
    /// Parses and checks an object.
    pub(crate) fn parse(
        name: impl Into<std::borrow::Cow<'a, str>>,
        data: &'a [u8],
        arch: Architecture,
    ) -> Result<Self, LinkError> {
        let name = name.into();
        if crate::coff::is_coff(data) {
            return crate::coff::parse(name, data, arch);
        }
        check_header(&name, data, arch)?;
        let header = Header::parse(data).map_err(|e| malformed(&name, e))?;
        let endian = header.endian().map_err(|e| malformed(&name, e))?;
        let table = header
            .sections(endian, data)
            .map_err(|e| malformed(&name, e))?;
        let mut sections = Vec::with_capacity(table.len());
        let mut relocations = Vec::new();
        let mut groups = Vec::new();
        let mut symtab_index = None;
        for (index, sh) in table.iter().enumerate() {
            let sh_type = sh.sh_type(endian).0;
            let sec_name = table.section_name(endian, sh).unwrap_or(b"");
            let contents = if sh_type == SHT_NOBITS {
                &[][..]
            } else {
                sh.data(endian, data).map_err(|_| {
                    malformed(
                        &name,
                        format!(
                            "section {} ({index}) lies outside the file",
                            String::from_utf8_lossy(sec_name)
                        ),
                    )
                })?
            };
            let align = sh.sh_addralign(endian).max(1);
            if align > MAX_SECTION_ALIGN && sh.sh_flags(endian).0 & SHF_ALLOC != 0 {
                return Err(malformed(
                    &name,
                    format!(
                        "section {} asks for alignment {align:#x}; Kiln places sections aligned to at most {MAX_SECTION_ALIGN:#x}",
                        String::from_utf8_lossy(sec_name)
                    ),
                ));
            }
            if !align.is_power_of_two() {
                return Err(malformed(
                    &name,
                    format!(
                        "section {} has alignment {align}, not a power of two",
                        String::from_utf8_lossy(sec_name)
                    ),
                ));
            }
            sections.push(ObjSection {
                name: sec_name,
                sh_type,
                flags: sh.sh_flags(endian).0,
                size: sh.sh_size(endian),
                align,
                info: sh.sh_info(endian),
                data: contents,
            });
            if sh_type == elf::SHT_SYMTAB.0 {
                symtab_index = Some(index);
            }
        }
        let count = sections.len();
        for (index, sh) in table.iter().enumerate() {
            let s = sections[index];
            if s.sh_type == SHT_RELA {
                let Some((relas, _)) = sh.rela(endian, data).map_err(|e| malformed(&name, e))?
                else {
                    continue;
                };
                if s.info as usize >= count {
                    return Err(malformed(
                        &name,
                        format!(
                            "relocation section {} applies to section {} of {count}",
                            String::from_utf8_lossy(s.name),
                            s.info
                        ),
                    ));
                }
                relocations.push((s.info, std::borrow::Cow::Borrowed(relas)));
            } else if s.sh_type == SHT_REL {
                return Err(malformed(
                    &name,
                    format!("SHT_REL relocations (without addends) are not used on {arch}"),
                ));
            }
        }
        let mut symbols = Vec::new();
        if let Some(symtab_index) = symtab_index {
            let symtab = table
                .symbols(endian, data, elf::SHT_SYMTAB)
                .map_err(|e| malformed(&name, e))?;
            let _ = symtab_index;
            symbols.reserve(symtab.len());
            for sym in symtab.iter() {
                let sym_name = symtab
                    .symbol_name(endian, sym)
                    .map_err(|e| malformed(&name, e))?;
                let shndx = sym.st_shndx(endian);
                let section = if shndx == elf::SHN_UNDEF {
                    SymSection::Undefined
                } else if shndx == elf::SHN_ABS {
                    SymSection::Absolute
                } else if shndx == elf::SHN_COMMON {
                    SymSection::Common
                } else if shndx == elf::SHN_XINDEX {
                    let index = symtab
                        .symbol_section(endian, sym, object::SymbolIndex(symbols.len()))
                        .map_err(|e| malformed(&name, e))?;
                    match index {
                        Some(i) => SymSection::Section(i.0 as u32),
                        None => SymSection::Undefined,
                    }
                } else if shndx.is_reserved() {
                    SymSection::Absolute
                } else {
                    SymSection::Section(u32::from(shndx.0))
                };
                if let SymSection::Section(i) = section {
                    if i as usize >= count {
                        return Err(LinkError::SectionIndexOutOfRange {
                            object: name.to_string(),
                            symbol: String::from_utf8_lossy(sym_name).into_owned(),
                            index: i,
                            count,
                        });
                    }
                }
                let binding = match sym.st_bind().0 {
                    b if b == elf::STB_LOCAL.0 => Binding::Local,
                    b if b == elf::STB_WEAK.0 => Binding::Weak,
                    _ => Binding::Global,
                };
                symbols.push(ObjSym {
                    name: sym_name,
                    value: sym.st_value(endian),
                    size: sym.st_size(endian),
                    section,
                    binding,
                    kind: sym.st_type().0,
                    visibility: sym.st_visibility().0,
                });
            }
        }
        // Every relocation must name a symbol of the table (index 0 is the table's null
        // symbol; an object without a table can have no relocations).
        for (target, relas) in &relocations {
            let target = *target;
            for rela in relas.iter() {
                let sym = rela.r_sym(endian, false) as usize;
                if sym >= symbols.len() {
                    return Err(LinkError::BadRelocation {
                        object: name.to_string(),
                        section: String::from_utf8_lossy(sections[target as usize].name)
                            .into_owned(),
                        offset: rela.r_offset.get(endian),
                        what: format!("symbol index {sym} of {}", symbols.len()),
                    });
                }
            }
        }
        for (index, s) in sections.iter().enumerate() {
            if s.sh_type != SHT_GROUP {
                continue;
            }
            let words: Vec<u32> = s
                .data
                .chunks_exact(4)
                .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect();
            if words.first().is_none_or(|w| w & elf::GRP_COMDAT.0 == 0) {
                continue;
            }
            let signature = symbols
                .get(s.info as usize)
                .map(|sym| {
                    if sym.is_section() {
                        // A group named by a section symbol uses the section's name.
                        match sym.section {
                            SymSection::Section(i) => sections[i as usize].name,
                            _ => sym.name,
                        }
                    } else {
                        sym.name
                    }
                })
                .ok_or_else(|| {
                    malformed(
                        &name,
                        format!(
                            "group section {index} names symbol {} of {}",
                            s.info,
                            symbols.len()
                        ),
                    )
                })?;
            let members: Vec<u32> = words[1..].to_vec();
            if let Some(&bad) = members.iter().find(|&&m| m as usize >= count) {
                return Err(malformed(
                    &name,
                    format!("group section {index} lists section {bad} of {count}"),
                ));
            }
            groups.push((signature, members));
        }
        Ok(ObjectFile {
            name,
            sections,
            symbols,
            relocations,
            groups,
            branch_protected: arch == Architecture::Aarch64 && branch_protected(data, &table),
        })
    }
}

/// Names of the global symbols an object defines (for archives without a symbol index).
/// Malformed members define nothing.
pub(crate) fn defined_globals(data: &[u8]) -> Vec<Vec<u8>> {
    // COFF objects are x86-64's; an ELF one says its machine.
    let machine = data
        .get(18..20)
        .filter(|_| !crate::coff::is_coff(data))
        .map_or(0, |m| u16::from_le_bytes([m[0], m[1]]));
    let arch = [Architecture::Aarch64, Architecture::Riscv64]
        .into_iter()
        .find(|a| a.elf_machine() == machine)
        .unwrap_or(Architecture::X86_64);
    match ObjectFile::parse("", data, arch) {
        Ok(obj) => obj
            .symbols
            .iter()
            .filter(|s| s.binding != Binding::Local && s.section != SymSection::Undefined)
            .map(|s| s.name.to_vec())
            .collect(),
        Err(_) => Vec::new(),
    }
}
