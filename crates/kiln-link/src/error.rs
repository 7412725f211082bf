//! Typed link errors, each naming the object, section, offset and symbol involved.

use kiln_memory::MemoryError;
use std::fmt;

/// One undefined symbol and the object that wanted it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MissingSymbol {
    /// The symbol.
    pub symbol: String,
    /// The first object that referenced it.
    pub wanted_by: String,
}

/// A list of missing symbols, printed one per line like a linker does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MissingSymbols(pub Vec<MissingSymbol>);

impl fmt::Display for MissingSymbols {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, m) in self.0.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(
                f,
                "  undefined symbol: {} (referenced by {})",
                m.symbol, m.wanted_by
            )?;
        }
        Ok(())
    }
}

/// Why a link failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LinkError {
    /// The bytes are not a valid ELF file, or a table in it is out of bounds.
    #[error("{object}: malformed object: {what}")]
    Malformed {
        /// The object.
        object: String,
        /// What is wrong.
        what: String,
    },
    /// An ELF file of the wrong type (an executable or shared object, not `ET_REL`).
    #[error("{object}: not a relocatable object (ELF type {e_type}); Kiln links `cc -c` output and archives of it")]
    NotRelocatable {
        /// The object.
        object: String,
        /// Its `e_type`.
        e_type: u16,
    },
    /// An object for another architecture or class.
    #[error(
        "{object}: wrong architecture: {found}, but this link is for {expected} (the executor's)"
    )]
    WrongArchitecture {
        /// The object.
        object: String,
        /// What it is.
        found: String,
        /// What the link is for.
        expected: crate::Architecture,
    },
    /// A malformed archive.
    #[error("{archive}: malformed archive: {what}")]
    Archive {
        /// The archive.
        archive: String,
        /// What is wrong.
        what: String,
    },
    /// A symbol refers to a section that does not exist.
    #[error("{object}: symbol '{symbol}' refers to section index {index}, but the object has {count} sections")]
    SectionIndexOutOfRange {
        /// The object.
        object: String,
        /// The symbol.
        symbol: String,
        /// Its section index.
        index: u32,
        /// Number of sections.
        count: usize,
    },
    /// A relocation type the linker does not implement.
    #[error("{object}: section {section} offset {offset:#x}: unknown or unsupported relocation type {r_type} ({name}) against '{symbol}'")]
    UnknownRelocation {
        /// The object.
        object: String,
        /// The section being relocated.
        section: String,
        /// Offset in the section.
        offset: u64,
        /// The `r_type`.
        r_type: u32,
        /// Its name if known.
        name: &'static str,
        /// The target symbol.
        symbol: String,
    },
    /// A relocation outside its section, or a relocation symbol index out of range.
    #[error("{object}: section {section}: relocation at offset {offset:#x}: {what}")]
    BadRelocation {
        /// The object.
        object: String,
        /// The section.
        section: String,
        /// Offset.
        offset: u64,
        /// What is wrong.
        what: String,
    },
    /// A relocated value does not fit its field.
    #[error("{object}: section {section} offset {offset:#x}: relocation {kind} against '{symbol}' out of range: value {shown} does not fit {bits} bits{hint}", shown = SignedHex(*.value))]
    Overflow {
        /// The object.
        object: String,
        /// The section.
        section: String,
        /// Offset.
        offset: u64,
        /// The relocation type name.
        kind: &'static str,
        /// The target symbol.
        symbol: String,
        /// The computed value.
        value: i128,
        /// Field width.
        bits: u32,
        /// A hint.
        hint: &'static str,
    },
    /// A relocated value is not a multiple of what the instruction scales it by (an
    /// AArch64 load or store of 2^n bytes addresses multiples of 2^n).
    #[error("{object}: section {section} offset {offset:#x}: relocation {kind} against '{symbol}': value {shown} is not a multiple of {align}, as the instruction needs", shown = SignedHex(*.value))]
    Misaligned {
        /// The object.
        object: String,
        /// The section.
        section: String,
        /// Offset.
        offset: u64,
        /// The relocation type name.
        kind: &'static str,
        /// The target symbol.
        symbol: String,
        /// The computed value.
        value: i128,
        /// The alignment the field needs.
        align: u32,
    },
    /// A pass of the link's client failed.
    #[error("link pass '{pass}' failed: {source}")]
    Pass {
        /// The pass's name.
        pass: String,
        /// What it said.
        #[source]
        source: crate::PassError,
    },
    /// Two strong definitions of one symbol.
    #[error("duplicate symbol '{symbol}': defined in {first} and in {second}")]
    DuplicateSymbol {
        /// The symbol.
        symbol: String,
        /// The first definer.
        first: String,
        /// The second definer.
        second: String,
    },
    /// Symbols nobody defines.
    #[error("{} undefined symbol{}:\n{symbols}", .symbols.0.len(), if .symbols.0.len() == 1 { "" } else { "s" })]
    UndefinedSymbols {
        /// The missing symbols.
        symbols: MissingSymbols,
    },
    /// A thread-local access Kiln cannot support for JIT code.
    #[error("{object}: section {section} offset {offset:#x}: thread-local variable '{symbol}': {model} is not supported")]
    UnsupportedTls {
        /// The object.
        object: String,
        /// The section.
        section: String,
        /// Offset.
        offset: u64,
        /// The symbol.
        symbol: String,
        /// The TLS model.
        model: &'static str,
    },
    /// A module's TLS block could not be placed in static TLS (needed by initial-exec,
    /// local-exec and TLS-descriptor code).
    #[error("{object}: cannot place the {size}-byte TLS block in static TLS: {reason}")]
    StaticTls {
        /// The module's first object.
        object: String,
        /// Bytes of the block.
        size: u64,
        /// Why (the executor's words).
        reason: String,
    },
    /// The memory manager failed.
    #[error("allocating memory for the link: {0}")]
    Memory(#[from] MemoryError),
    /// The environment (executor) failed a request of the linker.
    #[error("the executor failed a request of the linker: {0}")]
    Environment(String),
    /// A symbol lookup by name found nothing.
    #[error("symbol '{0}' not found")]
    SymbolNotFound(String),
    /// The module's symbol names do not fit its table.
    #[error(transparent)]
    NamesTooLarge(#[from] crate::NamesTooLarge),
}

/// A relocated value in hex with its sign (`-0x7f15593e1ff5`, not a 128-bit two's
/// complement).
struct SignedHex(i128);

impl std::fmt::Display for SignedHex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.0 < 0 {
            write!(f, "-{:#x}", self.0.unsigned_abs())
        } else {
            write!(f, "{:#x}", self.0)
        }
    }
}
