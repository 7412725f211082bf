//! Errors of the session API.

use kiln_link::LinkError;
use kiln_memory::MemoryError;
use std::path::PathBuf;

/// Why a session operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Linking failed.
    #[error(transparent)]
    Link(#[from] LinkError),
    /// The memory manager failed.
    #[error(transparent)]
    Memory(#[from] MemoryError),
    /// A source could not be compiled (the compiler's message), or the cache failed in a
    /// way that stops the compile.
    #[error("{0}")]
    Compile(String),
    /// A file could not be read.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// `-l NAME` found nothing.
    #[error("cannot find library -l{name} (searched: {searched})")]
    LibraryNotFound {
        /// The name.
        name: String,
        /// The directories searched.
        searched: String,
    },
    /// A shared library could not be opened.
    #[error("cannot open shared library {name}: {reason}")]
    SharedLibrary {
        /// The library.
        name: String,
        /// `dlerror()`'s words.
        reason: String,
    },
    /// A GNU ld script could not be understood.
    #[error("{path}: unsupported linker script: {what}")]
    LinkerScript {
        /// The script.
        path: PathBuf,
        /// What is wrong.
        what: String,
    },
    /// Talking to the executor process failed (it crashed, died, stalled or refused).
    #[error(transparent)]
    Remote(#[from] kiln_remote::RemoteError),
    /// The executor answered something unexpected.
    #[error("executor: {0}")]
    Executor(String),
    /// A lookup found nothing.
    #[error("symbol '{0}' not found")]
    SymbolNotFound(String),
    /// A library id of another session, or none of this one.
    #[error("unknown library: {0}")]
    UnknownLibrary(String),
    /// A name defined twice in one library.
    #[error("'{symbol}' is defined twice in library {library}: by {previous} and by {new} (names are defined once per library; give one of them internal linkage or put it in another library)")]
    Redefinition {
        /// The name.
        symbol: String,
        /// The library.
        library: String,
        /// Who defined it first.
        previous: String,
        /// Who tried again.
        new: String,
    },
    /// A module that live modules still refer to.
    #[error("module {module} is still used by {}: remove them first", users.join(", "))]
    ModuleInUse {
        /// The module.
        module: String,
        /// The modules whose code refers to it.
        users: Vec<String>,
    },
    /// A module the link used was removed while the link ran: the new module is dropped
    /// unrun.
    #[error("module {used}, which {module} calls, was removed while {module} was being linked")]
    RemovedDuringLink {
        /// The new module.
        module: String,
        /// The module it calls.
        used: String,
    },
    /// A lazy function's compile or link failed.
    #[error("lazy function {function}: {source}")]
    LazyCompile {
        /// The function.
        function: String,
        /// Why: the compiler's error, or Kiln's words.
        #[source]
        source: crate::lazy::CompileError,
    },
    /// A name that is not a lazy function of the library (nor a function of an object
    /// linked with [`crate::Jit::link_swappable`]).
    #[error("'{0}' is not a lazy function of this library (to replace a function linked at once, link its object with Jit::link_swappable)")]
    NotLazy(String),
    /// Something this session or executor cannot do.
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// A file is neither an ELF object nor an archive.
    #[error("{path}: not an ELF object or archive")]
    UnknownInput {
        /// The file.
        path: PathBuf,
    },
}

/// What kind of failure an [`Error`] is: a classification that callers mapping errors to
/// their own codes (the C API's statuses) match exhaustively, while [`Error`] itself may
/// grow variants.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// A name nobody defines (in a link or a lookup).
    UndefinedSymbol,
    /// Memory could not be reserved, mapped or protected.
    Memory,
    /// A malformed or unsupported input, or a link that failed.
    Link,
    /// A file could not be read.
    Io,
    /// A library (`-l`, a shared library, a linker script) was not found or not usable.
    Library,
    /// The executor failed or answered something unexpected.
    Executor,
    /// An argument that cannot be right (another session's library, a name that is not
    /// a lazy function).
    InvalidArgument,
    /// A name defined twice in one library.
    Redefinition,
    /// A source or a lazy function did not compile.
    Compile,
    /// A module that live modules use.
    ModuleInUse,
    /// Something this session or executor cannot do.
    Unsupported,
}

impl Error {
    /// The error's kind.
    ///
    /// ```
    /// let error = kiln::Error::SymbolNotFound("nowhere".into());
    /// assert_eq!(error.kind(), kiln::ErrorKind::UndefinedSymbol);
    /// ```
    pub fn kind(&self) -> ErrorKind {
        use ErrorKind as K;
        match self {
            Error::Link(LinkError::UndefinedSymbols { .. }) | Error::SymbolNotFound(_) => {
                K::UndefinedSymbol
            }
            Error::Link(LinkError::Memory(_)) | Error::Memory(_) => K::Memory,
            Error::Link(_) | Error::UnknownInput { .. } => K::Link,
            Error::Io { .. } => K::Io,
            Error::LibraryNotFound { .. }
            | Error::SharedLibrary { .. }
            | Error::LinkerScript { .. } => K::Library,
            Error::Remote(_) | Error::Executor(_) => K::Executor,
            Error::UnknownLibrary(_) | Error::NotLazy(_) => K::InvalidArgument,
            Error::Redefinition { .. } => K::Redefinition,
            Error::Compile(_) | Error::LazyCompile { .. } => K::Compile,
            Error::ModuleInUse { .. } | Error::RemovedDuringLink { .. } => K::ModuleInUse,
            Error::Unsupported(_) => K::Unsupported,
        }
    }
}
