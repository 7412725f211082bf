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
//! Why by hand: `object::write` writes relocatable objects; an `ET_DYN` needs only an ELF
//! header, three program headers and a dynamic section, written here with `object`'s ELF
//! structures. The object has no code and no relocations.

use object::elf;
use object::endian::{LittleEndian as LE, I64, U16, U32, U64};
use object::pod::bytes_of;

/// One exported definition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExportedSymbol {
    /// Its name.
    pub name: String,
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

const EHDR: usize = 64;
const PHDR: usize = 56;
const SYM: usize = 24;

fn pad_to(out: &mut Vec<u8>, align: usize) {
    let len = out.len().next_multiple_of(align.max(1));
    out.resize(len, 0);
}

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
    let phnum = if tls.is_some() { 3 } else { 2 };
    let mut out = vec![0u8; EHDR + PHDR * phnum];

    // .dynstr
    let mut dynstr = vec![0u8];
    let soname_offset = dynstr.len();
    dynstr.extend_from_slice(soname.as_bytes());
    dynstr.push(0);
    let mut name_offsets = Vec::with_capacity(symbols.len());
    for s in symbols {
        name_offsets.push(dynstr.len());
        dynstr.extend_from_slice(s.name.as_bytes());
        dynstr.push(0);
    }

    // .dynsym: the null symbol, then one absolute global per export.
    pad_to(&mut out, 8);
    let dynsym_offset = out.len();
    out.extend_from_slice(&[0u8; SYM]);
    for (s, &name) in symbols.iter().zip(&name_offsets) {
        let kind = if s.function {
            elf::STT_FUNC
        } else {
            elf::STT_OBJECT
        };
        let sym = elf::Sym64::<LE> {
            st_name: U32::new(e, name as u32),
            st_info: elf::SymbolInfo::new(elf::STB_GLOBAL, kind),
            st_other: elf::STV_DEFAULT.into(),
            st_shndx: U16::new(e, elf::SHN_ABS),
            st_value: U64::new(e, s.address),
            st_size: U64::new(e, s.size),
        };
        out.extend_from_slice(bytes_of(&sym));
    }

    // .hash (SysV): nbucket, nchain, buckets, chains.
    let nsyms = symbols.len() + 1;
    let nbucket = (symbols.len() / 2).max(1);
    let mut buckets = vec![0u32; nbucket];
    let mut chains = vec![0u32; nsyms];
    for (i, s) in symbols.iter().enumerate() {
        let index = i as u32 + 1;
        let b = elf::hash(s.name.as_bytes()) as usize % nbucket;
        chains[index as usize] = buckets[b];
        buckets[b] = index;
    }
    pad_to(&mut out, 8);
    let hash_offset = out.len();
    out.extend_from_slice(&(nbucket as u32).to_le_bytes());
    out.extend_from_slice(&(nsyms as u32).to_le_bytes());
    for w in buckets.iter().chain(&chains) {
        out.extend_from_slice(&w.to_le_bytes());
    }

    let dynstr_offset = out.len();
    out.extend_from_slice(&dynstr);

    // The TLS initialization image.
    let tls_layout = tls.map(|t| {
        pad_to(&mut out, t.align.clamp(1, 4096) as usize);
        let offset = out.len();
        out.extend_from_slice(t.image);
        (offset, t)
    });

    // The slot the loader fills with the block's thread-pointer offset, and its relocation.
    let tls_relocation = tls.map(|_| {
        pad_to(&mut out, 8);
        let slot = out.len();
        out.extend_from_slice(&[0u8; 8]);
        let r_type = if machine == elf::EM_AARCH64 {
            elf::R_AARCH64_TLS_TPREL
        } else {
            elf::R_X86_64_TPOFF64
        };
        let rela_offset = out.len();
        let rela = elf::Rela64::<LE> {
            r_offset: U64::new(e, slot as u64),
            r_info: U64::new(e, u64::from(r_type.0)),
            r_addend: object::endian::I64::new(e, 0),
        };
        out.extend_from_slice(bytes_of(&rela));
        (slot, rela_offset)
    });

    // .dynamic
    pad_to(&mut out, 8);
    let dynamic_offset = out.len();
    let mut dynamic: Vec<(elf::DynamicTag, u64)> = vec![
        (elf::DT_SONAME, soname_offset as u64),
        (elf::DT_HASH, hash_offset as u64),
        (elf::DT_STRTAB, dynstr_offset as u64),
        (elf::DT_SYMTAB, dynsym_offset as u64),
        (elf::DT_STRSZ, dynstr.len() as u64),
        (elf::DT_SYMENT, SYM as u64),
    ];
    if let Some((_, rela_offset)) = tls_relocation {
        dynamic.push((elf::DT_FLAGS, elf::DF_STATIC_TLS.0));
        dynamic.push((elf::DT_RELA, rela_offset as u64));
        dynamic.push((elf::DT_RELASZ, 24));
        dynamic.push((elf::DT_RELAENT, 24));
    }
    dynamic.push((elf::DT_NULL, 0));
    for (tag, value) in dynamic {
        let d = elf::Dyn64::<LE> {
            d_tag: I64::new(e, tag),
            d_val: U64::new(e, value),
        };
        out.extend_from_slice(bytes_of(&d));
    }
    let dynamic_size = out.len() - dynamic_offset;
    let total = out.len() as u64;

    // Program headers: one writable load segment holding everything (the loader may
    // adjust the dynamic section in place), the dynamic section, the TLS segment.
    let mut phdrs = vec![
        elf::ProgramHeader64::<LE> {
            p_type: U32::new(e, elf::PT_LOAD),
            p_flags: U32::new(e, elf::PF_R | elf::PF_W),
            p_offset: U64::new(e, 0),
            p_vaddr: U64::new(e, 0),
            p_paddr: U64::new(e, 0),
            p_filesz: U64::new(e, total),
            p_memsz: U64::new(e, total),
            p_align: U64::new(e, 0x1000),
        },
        elf::ProgramHeader64::<LE> {
            p_type: U32::new(e, elf::PT_DYNAMIC),
            p_flags: U32::new(e, elf::PF_R | elf::PF_W),
            p_offset: U64::new(e, dynamic_offset as u64),
            p_vaddr: U64::new(e, dynamic_offset as u64),
            p_paddr: U64::new(e, dynamic_offset as u64),
            p_filesz: U64::new(e, dynamic_size as u64),
            p_memsz: U64::new(e, dynamic_size as u64),
            p_align: U64::new(e, 8),
        },
    ];
    if let Some((offset, t)) = tls_layout {
        phdrs.push(elf::ProgramHeader64::<LE> {
            p_type: U32::new(e, elf::PT_TLS),
            p_flags: U32::new(e, elf::PF_R),
            p_offset: U64::new(e, offset as u64),
            p_vaddr: U64::new(e, offset as u64),
            p_paddr: U64::new(e, offset as u64),
            p_filesz: U64::new(e, t.image.len() as u64),
            p_memsz: U64::new(e, t.size.max(t.image.len() as u64)),
            p_align: U64::new(e, t.align.max(1)),
        });
    }
    let header = elf::FileHeader64::<LE> {
        e_ident: elf::Ident {
            magic: elf::ELFMAG,
            class: elf::ELFCLASS64,
            data: elf::ELFDATA2LSB,
            version: elf::EV_CURRENT,
            os_abi: elf::ELFOSABI_SYSV,
            abi_version: 0,
            padding: [0; 7],
        },
        e_type: U16::new(e, elf::ET_DYN),
        e_machine: U16::new(e, machine),
        e_version: U32::new(e, u32::from(elf::EV_CURRENT.0)),
        e_entry: U64::new(e, 0),
        e_phoff: U64::new(e, EHDR as u64),
        e_shoff: U64::new(e, 0),
        e_flags: U32::new(e, elf::FileFlags(0)),
        e_ehsize: U16::new(e, EHDR as u16),
        e_phentsize: U16::new(e, PHDR as u16),
        e_phnum: U16::new(e, phnum as u16),
        e_shentsize: U16::new(e, 64),
        e_shnum: U16::new(e, 0),
        e_shstrndx: U16::new(e, elf::SHN_UNDEF),
    };
    out[..EHDR].copy_from_slice(bytes_of(&header));
    for (i, ph) in phdrs.iter().enumerate() {
        let at = EHDR + i * PHDR;
        out[at..at + PHDR].copy_from_slice(bytes_of(ph));
    }
    SharedObject {
        bytes: out,
        tp_offset_slot: tls_relocation.map(|(slot, _)| slot as u64),
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
    fn the_loader_finds_exported_symbols_at_their_absolute_addresses() {
        let symbols: Vec<ExportedSymbol> = (0..40)
            .map(|i| ExportedSymbol {
                name: format!("kiln_test_export_{i}"),
                address: 0x1234_0000 + i * 16,
                size: 8,
                function: i % 2 == 0,
            })
            .collect();
        let built = build("libkiln-test-exports.so", host_machine(), &symbols, None);
        let loaded = crate::runtime::dlopen_bytes("libkiln-test-exports.so", &built.bytes, false)
            .expect("the loader accepts the object");
        for s in &symbols {
            assert_eq!(loaded.symbol(&s.name), Some(s.address), "{}", s.name);
        }
        assert_eq!(loaded.symbol("kiln_test_missing"), None);
        loaded.close();
    }
}
