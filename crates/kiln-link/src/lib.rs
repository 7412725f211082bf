//! # kiln-link
//!
//! Kiln's JIT linker for ELF x86-64, AArch64 and RISC-V 64 relocatable objects (`cc -c` output),
//! COFF x86-64 objects (Windows': clang's, mingw-w64 gcc's, cranelift-object's; read into
//! the same model, see [`is_coff`]) and static archives of either. It parses objects with
//! the `object` crate, loads archive members only when
//! they define a needed symbol, resolves symbols with a static linker's rules (strong over
//! weak, duplicate strong definitions are an error, commons merged, COMDAT groups kept
//! once, undefined weak is 0), asks its [`LinkContext`] for what the inputs do not define
//! (other modules, host functions, shared libraries), lays sections out in four segments
//! (code, constants, data, zero-filled data) with a GOT and PLT stubs, allocates them from
//! a [`kiln_memory::MemoryManager`], applies every relocation gcc and clang emit for the
//! target [`Architecture`] (overflow is an error naming object, section, offset and
//! symbol) and finalizes. Everything that differs between instruction sets — the
//! relocation table, stubs, trap bytes, TLS-descriptor resolver, GOT relaxation, the code
//! of lazy functions' call-through stubs ([`call_through`]) — is behind one trait with an
//! implementation per architecture (`src/arch/`).
//!
//! The result, a [`LinkedModule`], owns its memory and lists its exported symbols,
//! initializers, finalizers, `.eh_frame` and TLS template; running those is the
//! executor's job (see the `kiln` crate).
//!
//! What an object defines and needs, read as a link reads it (`cc -c` output):
//!
//! ```
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let dir = std::env::temp_dir().join(format!("kiln-link-doc-{}", std::process::id()));
//! std::fs::create_dir_all(&dir)?;
//! std::fs::write(dir.join("f.c"), "int g(int); int f(int x) { return g(x) + 1; }\n")?;
//! let ok = std::process::Command::new("cc")
//!     .args(["-O2", "-c", "f.c", "-o", "f.o"])
//!     .current_dir(&dir)
//!     .status()?
//!     .success();
//! assert!(ok);
//! let object = std::fs::read(dir.join("f.o"))?;
//! let symbols = kiln_link::scan_symbols("f.o", &object, kiln_link::Architecture::host())?;
//! assert_eq!(symbols.defined.iter().map(|s| &**s).collect::<Vec<_>>(), ["f"]);
//! assert_eq!(symbols.undefined.iter().map(|s| &**s).collect::<Vec<_>>(), ["g"]);
//! // Bytes that are not an object: an error naming the object, never a panic.
//! assert!(kiln_link::scan_symbols("junk.o", b"junk", kiln_link::Architecture::host()).is_err());
//! # std::fs::remove_dir_all(&dir)?;
//! # Ok(()) }
//! ```

// Link errors carry the object, section, offset and symbol as owned strings, so they are
// large; they are returned once per failed link, never on a hot path.
#![allow(clippy::result_large_err)]

mod arch;
pub mod built_object;
pub mod call_through;
mod coff;
mod error;
mod fixup;
mod graph;
mod image_file;
mod in_place;
mod input;
mod link;
mod linked;
mod name;
mod object_file;
mod pass;
mod passes;
mod rebind;
pub mod relocatable;
mod report;
mod symbol_scan;
mod symbol_table;
mod symbols;
pub mod windows_unwind;

pub use arch::Architecture;
pub use built_object::{
    BuiltObject, BuiltSection, BuiltSectionKind, BuiltSymbol, BuiltSymbolKind, SymbolBinding,
};
pub use error::{LinkError, MissingSymbol, MissingSymbols};
pub use image_file::ImageSymbols;
pub use in_place::{RelativeWords, SharedBytes};
pub use input::{ArchiveInput, ObjectBytes, ObjectInput};
pub use link::{check_objects, link, LinkContext, LinkOptions};
pub use linked::{
    ImageSegment, LinkCounts, LinkTimes, LinkedModule, PlacedSection, SymbolInfo, SymbolKind,
    TlsTemplate, MAX_TLS_BLOCK,
};
pub use name::Name;
pub use pass::{
    GraphEdge, GraphSection, GraphView, LinkPass, NewSectionKind, PassError, PassPoint, SectionId,
};
pub use rebind::rebind;
pub use symbol_scan::{scan_symbols, ObjectSymbols};
pub use symbol_table::{NamesTooLarge, Symbol, SymbolTable, SymbolTableBuilder};

/// Whether `data` is a COFF object (Windows': clang's, mingw-w64 gcc's, MSVC's,
/// cranelift-object's), of any machine Windows runs; Kiln links those for x86-64.
///
/// ```
/// assert!(kiln_link::is_coff(&[0x64, 0x86, 1, 0]));
/// assert!(!kiln_link::is_coff(b"\x7fELF"));
/// ```
pub fn is_coff(data: &[u8]) -> bool {
    coff::is_coff(data)
}

/// The name of the first thread-local section of an object (ELF `SHF_TLS`, COFF `.tls*`),
/// if it has one; a malformed object has none (the link reports what is wrong).
pub fn thread_local_section(data: &[u8], architecture: Architecture) -> Option<String> {
    let obj = object_file::ObjectFile::parse("", data, architecture).ok()?;
    obj.sections
        .iter()
        .find(|s| s.flags & object_file::SHF_TLS != 0 && s.flags & object_file::SHF_ALLOC != 0)
        .map(|s| String::from_utf8_lossy(s.name).into_owned())
}

/// Checks that `data` is an ELF relocatable object for `architecture` — every table it
/// has, as the link will read them — without linking it: a session refuses a bad object
/// when it is added, before it can fail a link of good ones.
///
/// [`ObjectInput::check`] does the same and keeps the parse for the link.
pub fn check_object(name: &str, data: &[u8], architecture: Architecture) -> Result<(), LinkError> {
    object_file::ObjectFile::parse(name, data, architecture).map(|_| ())
}
