//! Small shared objects made in memory and opened with `dlopen`, so that the C runtime's
//! loader does for JIT modules what it does for libraries it loaded itself:
//!
//! - a **static TLS block**: a `PT_TLS` segment with the module's TLS size, alignment and
//!   initial image, flagged `DF_STATIC_TLS`, and one `TPOFF64` dynamic relocation against
//!   it (what makes glibc allocate static TLS for a loaded object: the flag alone does
//!   not), whose relocated word then holds the block's offset from the thread pointer.
//!   glibc places it in the static TLS surplus
//!   (tunable `glibc.rtld.optional_static_tls`) and copies the image into every thread,
//!   existing and future, at one fixed offset from the thread pointer — which is what
//!   initial-exec and local-exec code (`GOTTPOFF`, `TPOFF32`) and static TLS descriptors
//!   need;
//! - **exported definitions**: dynamic symbols that are absolute (`SHN_ABS`, which glibc
//!   2.28 and later does not relocate) and point at a module's global definitions, opened
//!   `RTLD_GLOBAL`, so that libraries loaded later (a program's plugins, CPython's
//!   extension modules) find them as they would find a native executable's `-Wl,-E`
//!   exports.
//!
//! Written with Kiln's one ELF writer ([`kiln_elf`]), which gives the file a
//! non-executable `PT_GNU_STACK` (without one, glibc makes every thread's stack executable
//! when it loads the object). The object has no code and no relocations but its TLS slot's.

use kiln_elf::{ElfWriter, FileKind, Segment};
use object::elf;
use object::endian::{LittleEndian as LE, I64, U16, U32, U64};
use object::pod::bytes_of;

/// One exported definition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExportedSymbol {
    /// Its name (shared with the session's index: no copy per export).
    pub name: std::sync::Arc<str>,
    /// Its absolute address.
    pub address: u64,
    /// Its size in bytes (0 if unknown).
    pub size: u64,
    /// Whether it is a function (`STT_FUNC`) rather than data (`STT_OBJECT`).
    pub function: bool,
}

/// A static TLS block to reserve.
#[derive(Debug, Clone, Copy)]
pub struct StaticTlsSpec<'a> {
    /// The initialized part (`.tdata`), relocated.
    pub image: &'a [u8],
    /// The whole block (`.tdata` + `.tbss`).
    pub size: u64,
    /// Its alignment (a power of two).
    pub align: u64,
}

const SYM: u64 = kiln_elf::SYM_SIZE as u64;

/// A built shared object.
#[derive(Debug, Clone)]
pub struct SharedObject {
    /// The file's bytes.
    pub bytes: Vec<u8>,
    /// With a static TLS block: where (relative to the load address) the loader writes the
    /// block's offset from the thread pointer.
    pub tp_offset_slot: Option<u64>,
}

/// Builds an x86-64 or AArch64 `ET_DYN` named `soname` with `symbols` (absolute) and, if
/// given, a static TLS block. `machine` is `EM_X86_64` or `EM_AARCH64`.
pub fn build(
    soname: &str,
    machine: elf::Machine,
    symbols: &[ExportedSymbol],
    tls: Option<StaticTlsSpec<'_>>,
) -> SharedObject {
    let e = LE;
    let segments = if tls.is_some() { 3 } else { 2 };
    // Everything is written once, straight into a file of its final size: for a program
    // of 20,000 exports (740 KB) a table built aside and copied in, and a buffer grown by
    // doubling, cost twice the fresh pages (and their faults) of the file itself.
    let nsyms = symbols.len() + 1;
    let nbucket = (symbols.len() / 2).max(1);
    let name_bytes = soname.len() + 1 + symbols.iter().map(|s| s.name.len() + 1).sum::<usize>();
    let tls_bytes = tls.map_or(0, |t| t.image.len() + t.align.clamp(1, 4096) as usize + 32);
    let contents =
        nsyms * SYM as usize + 4 * (2 + nbucket + nsyms) + 1 + name_bytes + tls_bytes + 256;
    let mut w = ElfWriter::with_capacity(FileKind::Shared, machine, segments, contents);

    // .dynstr's layout: the empty name, the soname, then each export's name in order.
    let soname_offset = 1u32;
    let mut st_name = soname_offset + soname.len() as u32 + 1;

    // .dynsym: the null symbol, then one absolute global per export.
    let dynsym_offset = w.append(&[0u8; kiln_elf::SYM_SIZE], 8);
    for s in symbols {
        let kind = if s.function {
            elf::STT_FUNC
        } else {
            elf::STT_OBJECT
        };
        let sym = elf::Sym64::<LE> {
            st_name: U32::new(e, st_name),
            st_info: elf::SymbolInfo::new(elf::STB_GLOBAL, kind),
            st_other: elf::STV_DEFAULT.into(),
            st_shndx: U16::new(e, elf::SHN_ABS),
            st_value: U64::new(e, s.address),
            st_size: U64::new(e, s.size),
        };
        w.append(bytes_of(&sym), 1);
        st_name += s.name.len() as u32 + 1;
    }

    // .hash (SysV): nbucket, nchain, buckets, chains.
    let mut table = vec![0u32; 2 + nbucket + nsyms];
    table[0] = nbucket as u32;
    table[1] = nsyms as u32;
    let (buckets, chains) = table[2..].split_at_mut(nbucket);
    for (i, s) in symbols.iter().enumerate() {
        let index = i as u32 + 1;
        let b = elf::hash(s.name.as_bytes()) as usize % nbucket;
        chains[index as usize] = buckets[b];
        buckets[b] = index;
    }
    let hash_offset = w.pad_to(8);
    for word in &table {
        w.append(&word.to_le_bytes(), 1);
    }
    drop(table);

    // .dynstr
    let dynstr_offset = w.append(&[0], 1);
    w.append(soname.as_bytes(), 1);
    w.append(&[0], 1);
    for s in symbols {
        w.append(s.name.as_bytes(), 1);
        w.append(&[0], 1);
    }
    let dynstr_size = w.offset() - dynstr_offset;
    debug_assert_eq!(dynstr_size, 1 + name_bytes as u64);

    // The TLS initialization image.
    let tls_layout = tls.map(|t| (w.append(t.image, t.align.clamp(1, 4096)), t));

    // The slot the loader fills with the block's thread-pointer offset, and its relocation.
    let tls_relocation = tls.map(|_| {
        let slot = w.append(&[0u8; 8], 8);
        let r_type = if machine == elf::EM_AARCH64 {
            elf::R_AARCH64_TLS_TPREL
        } else {
            elf::R_X86_64_TPOFF64
        };
        let rela = elf::Rela64::<LE> {
            r_offset: U64::new(e, slot),
            r_info: U64::new(e, u64::from(r_type.0)),
            r_addend: I64::new(e, 0),
        };
        let rela_offset = w.append(bytes_of(&rela), 8);
        (slot, rela_offset)
    });

    // .dynamic
    let mut dynamic: Vec<(elf::DynamicTag, u64)> = vec![
        (elf::DT_SONAME, u64::from(soname_offset)),
        (elf::DT_HASH, hash_offset),
        (elf::DT_STRTAB, dynstr_offset),
        (elf::DT_SYMTAB, dynsym_offset),
        (elf::DT_STRSZ, dynstr_size),
        (elf::DT_SYMENT, SYM),
    ];
    if let Some((_, rela_offset)) = tls_relocation {
        dynamic.push((elf::DT_FLAGS, elf::DF_STATIC_TLS.0));
        dynamic.push((elf::DT_RELA, rela_offset));
        dynamic.push((elf::DT_RELASZ, 24));
        dynamic.push((elf::DT_RELAENT, 24));
    }
    dynamic.push((elf::DT_NULL, 0));
    let dynamic_offset = w.pad_to(8);
    for (tag, value) in dynamic {
        let d = elf::Dyn64::<LE> {
            d_tag: I64::new(e, tag),
            d_val: U64::new(e, value),
        };
        w.append(bytes_of(&d), 8);
    }
    let dynamic_size = w.offset() - dynamic_offset;
    let total = w.offset();

    // Program headers: one writable load segment holding everything (the loader may
    // adjust the dynamic section in place), the dynamic section, the TLS segment (and the
    // writer's PT_GNU_STACK).
    w.segment(Segment::load(elf::PF_R | elf::PF_W, 0, 0, total, total));
    w.segment(Segment {
        kind: elf::PT_DYNAMIC,
        flags: elf::PF_R | elf::PF_W,
        offset: dynamic_offset,
        address: dynamic_offset,
        file_size: dynamic_size,
        memory_size: dynamic_size,
        align: 8,
    });
    if let Some((offset, t)) = tls_layout {
        w.segment(Segment {
            kind: elf::PT_TLS,
            flags: elf::PF_R,
            offset,
            address: offset,
            file_size: t.image.len() as u64,
            memory_size: t.size.max(t.image.len() as u64),
            align: t.align.max(1),
        });
    }
    SharedObject {
        bytes: w.finish(0),
        tp_offset_slot: tls_relocation.map(|(slot, _)| slot),
    }
}

/// The ELF machine of the process this code runs in.
pub fn host_machine() -> elf::Machine {
    if cfg!(target_arch = "aarch64") {
        elf::EM_AARCH64
    } else {
        elf::EM_X86_64
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use object::read::elf::{ElfFile64, ProgramHeader};

    #[test]
    fn the_tls_segment_carries_size_alignment_and_image() {
        let image = [1u8, 2, 3, 4];
        let built = build(
            "libtest.so",
            elf::EM_X86_64,
            &[],
            Some(StaticTlsSpec {
                image: &image,
                size: 64,
                align: 16,
            }),
        );
        assert!(built.tp_offset_slot.is_some());
        let bytes = built.bytes;
        let file = ElfFile64::<LE>::parse(&*bytes).unwrap();
        let tls = file
            .elf_program_headers()
            .iter()
            .find(|p| p.p_type(LE) == elf::PT_TLS)
            .unwrap();
        assert_eq!(tls.p_memsz(LE), 64);
        assert_eq!(tls.p_align(LE), 16);
        assert_eq!(tls.data(LE, &*bytes).unwrap(), &image);
    }

    #[test]
    fn every_shared_object_says_its_stack_is_not_executable() {
        for tls in [
            None,
            Some(StaticTlsSpec {
                image: &[7u8; 8],
                size: 8,
                align: 8,
            }),
        ] {
            let bytes = build("libstack.so", host_machine(), &[], tls).bytes;
            let file = ElfFile64::<LE>::parse(&*bytes).unwrap();
            let stacks: Vec<elf::ProgramFlags> = file
                .elf_program_headers()
                .iter()
                .filter(|p| p.p_type(LE) == elf::PT_GNU_STACK)
                .map(|p| p.p_flags(LE))
                .collect();
            assert_eq!(stacks, [elf::PF_R | elf::PF_W], "tls: {}", tls.is_some());
        }
    }

    #[test]
    fn the_loader_finds_exported_symbols_at_their_absolute_addresses() {
        let symbols: Vec<ExportedSymbol> = (0..40)
            .map(|i| ExportedSymbol {
                name: format!("kiln_test_export_{i}").into(),
                address: 0x1234_0000 + i * 16,
                size: 8,
                function: i % 2 == 0,
            })
            .collect();
        let built = build("libkiln-test-exports.so", host_machine(), &symbols, None);
        let loaded = crate::loader::dlopen_bytes("libkiln-test-exports.so", &built.bytes, false)
            .expect("the loader accepts the object");
        for s in &symbols {
            assert_eq!(loaded.symbol(&s.name), Some(s.address), "{}", s.name);
        }
        assert_eq!(loaded.symbol("kiln_test_missing"), None);
        loaded.close();
    }
}
