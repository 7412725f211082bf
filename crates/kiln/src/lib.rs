//! # kiln
//!
//! A JIT linker and executable-memory manager: hand it relocatable objects made by the
//! system C compiler, Cranelift or LLVM, and it loads them into executable memory,
//! resolves their symbols, applies relocations, sets permissions (never writable and
//! executable at once), keeps the instruction cache coherent and gives back callable
//! addresses — in this process or in a separate executor process.
//!
//! This crate is the session API, the one most programs use: a [`Jit`] holds libraries
//! (namespaces of definitions with a search order); objects and archives are added to a
//! library, linked by `kiln-link` into memory from `kiln-memory`, and run by an
//! [`Executor`]: this process (the runtime of `kiln-runtime`: `.eh_frame` registered with
//! the system unwinder, so C++ exceptions and Rust panics unwind through JIT frames;
//! initializers after the link, finalizers at removal; thread-locals through Kiln's own
//! `__tls_get_addr`), or a `kiln-executor` process reached over a socket
//! ([`Executor::start`], [`Executor::connect_with_key`]). Call-through stubs, lazy
//! functions and hot swap are in [`lazy`]; the linked-image and object caches come from
//! `kiln-cache`. `kiln-cranelift` puts Cranelift's `Module` trait on top; `kiln-capi` is
//! the C API and the Python package's base.
//!
//! Names the link's inputs do not define come from the library's definitions, other
//! modules, the libraries in its search order, and then its [`SymbolGenerator`]s (this
//! process's symbols, shared libraries opened by name, callbacks). What the link's own
//! objects and archives define always wins, as with a static linker.
//!
//! The README's first example (a test checks they stay the same):
//!
//! ```
//! fn main() -> Result<(), Box<dyn std::error::Error>> {
//!     let dir = std::env::temp_dir().join(format!("kiln-doc-{}", std::process::id()));
//!     std::fs::create_dir_all(&dir)?;
//!     std::fs::write(dir.join("add.c"), "long add(long a, long b) { return a + b; }\n")?;
//!     let status = std::process::Command::new("cc")
//!         .args(["-O2", "-c", "add.c", "-o", "add.o"])
//!         .current_dir(&dir)
//!         .status()?;
//!     assert!(status.success());
//!     let jit = kiln::Jit::new()?;
//!     let lib = jit.main_library();
//!     jit.library(lib).add(kiln::Input::object("add.o", std::fs::read(dir.join("add.o"))?))?;
//!     // SAFETY: `add` is `long add(long, long)`; the module stays in `jit`.
//!     let add = unsafe { jit.lookup_fn::<extern "C" fn(i64, i64) -> i64>(lib, "add")? };
//!     assert_eq!(add(2, 40), 42);
//!     std::fs::remove_dir_all(&dir)?;
//!     Ok(())
//! }
//! ```

// Errors wrap link errors, which are large by design (see kiln-link).
#![allow(clippy::result_large_err)]

mod debug_support;
mod error;
pub mod executor;
mod generator;
mod image_cache;
mod inputs;
mod jit;
pub mod lazy;
mod libraries;
mod library;
mod library_handle;
mod library_id;
pub mod library_search;
mod link_job;
mod link_lock;
mod link_request;
mod linking;
mod module;
pub mod plugin;
mod removal;
mod resolve;
mod state;

// What a first program needs; the rest is in the modules below, by subject.
pub use error::{Error, ErrorKind};
pub use executor::Executor;
pub use generator::{FnGenerator, Found, SymbolGenerator};
pub use inputs::{map_file, SharedBytes};
pub use jit::{Jit, JitBuilder};
pub use kiln_link::Architecture;
pub use library::LibraryId;
pub use library_handle::{Compiled, Input, Library};
pub use module::Module;

/// The object and linked-image caches a session may be given
/// ([`JitBuilder::object_cache`](crate::JitBuilder::object_cache),
/// [`JitBuilder::image_cache`](crate::JitBuilder::image_cache)), and the compiler
/// behind [`Library::compile`](crate::Library::compile); from `kiln-cache`, whose
/// documentation says how entries are keyed, verified and evicted.
pub mod cache {
    pub use crate::image_cache::ImageOutcome;
    pub use kiln_cache::{
        CacheKey, Compiler, DiskCache, DiskImageCache, DiskLimits, DiskUsage, ImageCache,
        ImageKeyBuilder, ObjectCache, SystemCompiler,
    };
}

/// What a link reports and the errors it gives: its phase times and counts
/// ([`LinkReport`](crate::link::LinkReport)), the link's own error, and a library's thread-local template.
pub mod link {
    pub use crate::link_job::LinkReport;
    pub use kiln_link::{LinkCounts, LinkError, LinkTimes, TlsTemplate};
}

/// The memory layer underneath a session ([`JitBuilder::memory`](crate::JitBuilder::memory)
/// takes any [`MemoryManager`](crate::memory::MemoryManager)); from `kiln-memory`.
pub mod memory {
    pub use kiln_memory::{
        FinalizedAllocation, Mapper, MemoryManager, MemoryStats, Placement, SegmentRange,
        SlabMemoryManager,
    };
}

/// Debugger and profiler support: GDB's JIT interface, perf maps and jitdump files
/// ([`DebugSupport`](crate::debug::DebugSupport)), and what an executor reports of a module's symbols.
pub mod debug {
    pub use crate::debug_support::{DebugListener, DebugSupport};
    pub use kiln_remote::protocol::{DebugModule, DebugOutputs};
    pub use kiln_runtime::module_symbols::ModuleSymbols;
    pub use kiln_runtime::shared_object::ExportedSymbol;
}

/// The Rust examples of docs/: compiled by `cargo test --doc` (and run, those that need
/// no file of their own), so that a page whose example no longer builds fails the test
/// command. Only rustdoc's test pass sees these.
#[cfg(doctest)]
pub mod docs_examples {
    #[doc = include_str!("../../../docs/API_TOUR.md")]
    pub struct ApiTour;
    #[doc = include_str!("../../../docs/LAZY.md")]
    pub struct Lazy;
    #[doc = include_str!("../../../docs/MEMORY.md")]
    pub struct Memory;
    #[doc = include_str!("../../../docs/DEBUGGING.md")]
    pub struct Debugging;
}
