//! # kiln
//!
//! Kiln's session API: a [`Jit`] holds libraries (namespaces of definitions with a search
//! order); objects and archives are added to a library, linked by `kiln-link` into memory
//! from `kiln-memory`, and run by the in-process executor: `.eh_frame` registered with
//! the system unwinder (C++ exceptions and Rust panics unwind through JIT frames),
//! initializers run after the link and finalizers at removal, thread-locals served by
//! Kiln's own `__tls_get_addr`.
//!
//! Names the link's inputs do not define come from the library's definitions, other
//! modules, the libraries in its search order, and then its [`SymbolGenerator`]s (this
//! process's symbols, shared libraries opened by name, callbacks). What the link's own
//! objects and archives define always wins, as with a static linker.

// Errors wrap link errors, which are large by design (see kiln-link).
#![allow(clippy::result_large_err)]

mod debug_support;
mod error;
mod executor;
mod generator;
mod image_cache;
mod inputs;
mod jit;
pub mod lazy;
mod libraries;
mod library;
mod library_id;
pub mod library_search;
mod link_job;
mod link_lock;
mod link_request;
mod linking;
mod module;
mod plugin;
mod removal;
mod resolve;
mod state;

pub use debug_support::{DebugListener, DebugSupport};
pub use error::{Error, ErrorKind};
pub use executor::{
    default_executor_path, BatchScope, EhRegistration, Executor, ExecutorRequestHandler,
    ExecutorService, ExecutorSymbols, ExportHandle, Retirement, TargetOs, Transport,
};
pub use generator::{FnGenerator, Found, SymbolGenerator};
pub use image_cache::ImageOutcome;
pub use inputs::{map_file, SharedBytes};
pub use jit::{Jit, JitBuilder};
pub use kiln_cache::{
    CacheKey, Compiler, DiskCache, DiskImageCache, DiskLimits, DiskUsage, ImageCache,
    ImageKeyBuilder, ObjectCache, SystemCompiler,
};
pub use kiln_link::{
    Architecture, GraphEdge, GraphSection, GraphView, LinkPass, NewSectionKind, PassError,
    PassPoint, PlacedSection, SectionId, SymbolInfo, SymbolKind,
};
pub use kiln_link::{LinkCounts, LinkError, LinkTimes, TlsTemplate};
// What an `ExecutorService` of the caller's making is handed.
pub use kiln_memory::Mapper;
pub use kiln_memory::{
    FinalizedAllocation, MemoryManager, MemoryStats, Placement, SegmentRange, SlabMemoryManager,
};
pub use kiln_remote::protocol::{DebugModule, DebugOutputs};
pub use kiln_remote::secure::Key;
pub use kiln_remote::{RemoteError, RoundTrips, Sandbox, Timeouts};
pub use kiln_runtime::module_symbols::ModuleSymbols;
pub use kiln_runtime::shared_object::ExportedSymbol;
pub use lazy::{CodeGuard, CodeThread, CompileError, LazyCompiler, LazyFailure, SwappableModule};
pub use library::LibraryId;
pub use link_job::LinkReport;
pub use module::Module;
pub use plugin::{LoadedModule, Plugin, PluginError, PluginFailure, PluginRegistration};
