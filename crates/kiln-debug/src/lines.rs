//! Functions and their source lines, from the objects' DWARF line tables.

use crate::{gdb_image, DebugError};
use gimli::{EndianSlice, Reader, RelocateReader, SectionId};
use kiln_wire::protocol::{DebugFunction, DebugModule, LineRow};
use object::read::elf::ElfFile64;
use object::{
    LittleEndian, Object, ObjectSection, ObjectSymbol, RelocationFlags, RelocationTarget,
};
use rustc_hash::FxHashMap;
use std::borrow::Cow;

/// One object of a linked module and where its sections landed.
#[derive(Debug, Clone)]
pub struct ObjectPlacement<'a> {
    /// The object's name, for messages.
    pub name: &'a str,
    /// Its bytes.
    pub data: &'a [u8],
    /// (section index, target address) of every section the link placed.
    pub sections: Vec<(usize, u64)>,
}

/// Builds what debuggers and profilers are told of a module: with `gdb`, one
/// [`gdb_image`] per object that has a placed section; with `lines`, each of `functions`
/// (sorted or not) gets the source lines of its code from the objects' `.debug_line`.
///
/// An object whose image or DWARF cannot be built is reported in the returned errors and
/// left out; the rest of the module is still described.
pub fn debug_module(
    objects: &[ObjectPlacement<'_>],
    mut functions: Vec<DebugFunction>,
    gdb: bool,
    lines: bool,
) -> (DebugModule, Vec<DebugError>) {
    let mut errors = Vec::new();
    let mut module = DebugModule::default();
    if gdb {
        for object in objects.iter().filter(|o| !o.sections.is_empty()) {
            match gdb_image(object.name, object.data, &object.sections) {
                Ok(image) => module.images.push(image),
                Err(e) => errors.push(e),
            }
        }
    }
    functions.sort_unstable_by_key(|f| f.address);
    if lines {
        let mut files: FxHashMap<String, u32> = FxHashMap::default();
        for object in objects.iter().filter(|o| !o.sections.is_empty()) {
            let rows = match line_rows(object) {
                Ok(rows) => rows,
                Err(e) => {
                    errors.push(e);
                    continue;
                }
            };
            for (address, line, file) in rows {
                // The function whose code holds the row.
                let i = functions.partition_point(|f| f.address <= address);
                let Some(function) = i.checked_sub(1).map(|i| &mut functions[i]) else {
                    continue;
                };
                if address >= function.address + function.size.max(1) {
                    continue;
                }
                let next = files.len() as u32;
                let file = *files.entry(file).or_insert(next);
                function.lines.push(LineRow {
                    address,
                    line,
                    file,
                });
            }
        }
        for function in &mut functions {
            function.lines.sort_by_key(|r| r.address);
            function
                .lines
                .dedup_by(|b, a| a.line == b.line && a.file == b.file);
            // perf's `inject --jit` ends each function's line table at its last row, so
            // code after the last row — all of a function written on one line but its
            // first instruction — had no line (`??:0`). A closing row at the function's
            // last byte carries the last line to its end.
            if let Some(&last) = function.lines.last() {
                let end = function.address + function.size.max(1) - 1;
                if last.address < end {
                    function.lines.push(LineRow {
                        address: end,
                        ..last
                    });
                }
            }
        }
        let mut names = vec![String::new(); files.len()];
        for (name, index) in files {
            names[index as usize] = name;
        }
        module.files = names;
    }
    module.functions = functions;
    (module, errors)
}

/// Absolute relocations of one section: offset → symbol + addend, with symbols in placed
/// sections at their target addresses and those in unplaced (debug) sections at their
/// offsets. (`object`'s `RelocationMap` takes a relocatable object's symbol values as
/// addresses without its sections' placement, so Kiln resolves them here.)
#[derive(Debug, Default)]
struct Relocations(FxHashMap<usize, u64>);

impl gimli::Relocate for &Relocations {
    fn relocate_address(&self, offset: usize, value: u64) -> gimli::Result<u64> {
        Ok(self.0.get(&offset).copied().unwrap_or(value))
    }

    fn relocate_offset(&self, offset: usize, value: usize) -> gimli::Result<usize> {
        Ok(self.0.get(&offset).map_or(value, |&v| v as usize))
    }
}

/// Whether an ELF relocation type stores symbol + addend (the only kind DWARF uses).
fn is_absolute(machine: u16, r_type: u32) -> bool {
    match machine {
        m if m == object::elf::EM_X86_64.0 => [
            object::elf::R_X86_64_64,
            object::elf::R_X86_64_32,
            object::elf::R_X86_64_32S,
        ]
        .iter()
        .any(|t| t.0 == r_type),
        m if m == object::elf::EM_AARCH64.0 => {
            [object::elf::R_AARCH64_ABS64, object::elf::R_AARCH64_ABS32]
                .iter()
                .any(|t| t.0 == r_type)
        }
        _ => false,
    }
}

type Section<'a, 'r> = RelocateReader<EndianSlice<'a, gimli::LittleEndian>, &'r Relocations>;

/// The line table rows of an object: (target address, line, file path).
fn line_rows(object: &ObjectPlacement<'_>) -> Result<Vec<(u64, u32, String)>, DebugError> {
    let dwarf_error = |section: &str, what: String| DebugError::Dwarf {
        object: object.name.to_string(),
        section: section.to_string(),
        what,
    };
    let malformed = |e: object::read::Error| DebugError::Malformed {
        object: object.name.to_string(),
        what: e.to_string(),
    };
    // Most objects of a release build have no line table: the section headers say so,
    // without parsing the symbol table.
    {
        use object::read::elf::FileHeader;
        let header =
            object::elf::FileHeader64::<LittleEndian>::parse(object.data).map_err(malformed)?;
        let endian = header.endian().map_err(malformed)?;
        let sections = header.sections(endian, object.data).map_err(malformed)?;
        if sections.section_by_name(endian, b".debug_line").is_none() {
            return Ok(Vec::new());
        }
    }
    let file = ElfFile64::<LittleEndian>::parse(object.data).map_err(malformed)?;
    let machine = file.elf_header().e_machine.get(LittleEndian);
    let placed: FxHashMap<usize, u64> = object.sections.iter().copied().collect();
    // Each DWARF section's bytes and relocations.
    let mut loaded: FxHashMap<SectionId, (Cow<'_, [u8]>, Relocations)> = FxHashMap::default();
    for id in [
        SectionId::DebugAbbrev,
        SectionId::DebugInfo,
        SectionId::DebugLine,
        SectionId::DebugLineStr,
        SectionId::DebugStr,
        SectionId::DebugStrOffsets,
        SectionId::DebugAddr,
        SectionId::DebugRngLists,
        SectionId::DebugRanges,
    ] {
        let Some(section) = file.section_by_name(id.name()) else {
            continue;
        };
        let bytes = section
            .uncompressed_data()
            .map_err(|e| dwarf_error(id.name(), e.to_string()))?;
        let mut relocations = Relocations::default();
        for (offset, relocation) in section.relocations() {
            let RelocationFlags::Elf { r_type } = relocation.flags() else {
                continue;
            };
            if !is_absolute(machine.0, r_type.0) {
                continue;
            }
            let RelocationTarget::Symbol(index) = relocation.target() else {
                continue;
            };
            let symbol = file
                .symbol_by_index(index)
                .map_err(|e| dwarf_error(id.name(), e.to_string()))?;
            let base = symbol
                .section_index()
                .and_then(|s| placed.get(&s.0).copied())
                .unwrap_or(0);
            let value = base
                .wrapping_add(symbol.address())
                .wrapping_add(relocation.addend() as u64);
            relocations.0.insert(offset as usize, value);
        }
        loaded.insert(id, (bytes, relocations));
    }
    let empty = Relocations::default();
    let dwarf = gimli::Dwarf::load(|id| -> Result<Section<'_, '_>, DebugError> {
        Ok(match loaded.get(&id) {
            Some((bytes, relocations)) => {
                RelocateReader::new(EndianSlice::new(bytes, gimli::LittleEndian), relocations)
            }
            None => RelocateReader::new(EndianSlice::new(&[], gimli::LittleEndian), &empty),
        })
    })?;
    let gimli_error = |e: gimli::Error| dwarf_error(".debug_info", e.to_string());
    let mut rows = Vec::new();
    let mut units = dwarf.units();
    while let Some(header) = units.next().map_err(gimli_error)? {
        let unit = dwarf.unit(header).map_err(gimli_error)?;
        let Some(program) = unit.line_program.clone() else {
            continue;
        };
        let comp_dir = unit
            .comp_dir
            .as_ref()
            .and_then(|d| d.to_string_lossy().ok().map(|s| s.into_owned()));
        let mut paths: FxHashMap<u64, String> = FxHashMap::default();
        let mut program_rows = program.rows();
        while let Some((header, row)) = program_rows
            .next_row()
            .map_err(|e| dwarf_error(".debug_line", e.to_string()))?
        {
            if row.end_sequence() {
                continue;
            }
            let Some(line) = row.line() else { continue };
            let path = match paths.get(&row.file_index()) {
                Some(p) => p.clone(),
                None => {
                    let path =
                        file_path(&dwarf, &unit, header, row.file_index(), comp_dir.as_deref());
                    paths.insert(row.file_index(), path.clone());
                    path
                }
            };
            rows.push((row.address(), line.get() as u32, path));
        }
    }
    Ok(rows)
}

/// The path of file `index` of a line program: its directory joined with its name (and
/// the unit's compilation directory when relative).
fn file_path<R: gimli::Reader>(
    dwarf: &gimli::Dwarf<R>,
    unit: &gimli::Unit<R>,
    header: &gimli::LineProgramHeader<R>,
    index: u64,
    comp_dir: Option<&str>,
) -> String {
    let Some(file) = header.file(index) else {
        return "<unknown>".to_string();
    };
    let string = |value: gimli::AttributeValue<R>| -> Option<String> {
        dwarf
            .attr_string(unit, value)
            .ok()
            .and_then(|s| s.to_string_lossy().ok().map(|c| c.into_owned()))
    };
    let name = string(file.path_name()).unwrap_or_else(|| "<unknown>".to_string());
    if name.starts_with('/') {
        return name;
    }
    let mut path = std::path::PathBuf::new();
    if let Some(dir) = comp_dir {
        path.push(dir);
    }
    if let Some(dir) = file.directory(header).and_then(string) {
        path.push(dir);
    }
    path.push(name);
    path.to_string_lossy().into_owned()
}
