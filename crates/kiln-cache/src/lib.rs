//! # kiln-cache
//!
//! An object cache for a JIT that compiles C and C++ with the system compiler, as MCJIT's
//! RFC described it: before compiling, ask the cache for an object by the *signature* of
//! what would make it; after compiling, offer the object to the cache.
//!
//! - [`Signature`]: the preprocessed source's BLAKE3, the compiler's identity and
//!   version, the target triple (and the CPU's features when the flags ask for the host
//!   CPU), the flags, and the environment variables the client declares relevant. Its
//!   BLAKE3 is the [`CacheKey`].
//! - The signature is also written into the cached object (a `.note.kiln.signature`
//!   section, which linkers ignore) and checked when the object is loaded: an entry whose
//!   signature does not match is a miss, never loaded, whoever wrote it.
//! - Every stored entry carries a BLAKE3 checksum of its bytes, verified on read: a
//!   truncated or corrupt entry is a miss (and removed).
//! - Backends implement [`ObjectCache`]: [`MemoryCache`], [`DiskCache`] (one file per entry,
//!   atomic writes, size and count limits with least-recently-used eviction) and
//!   [`RedisCache`] (a store a fleet already runs; timeouts; a store that is down is a
//!   miss, never a failure).
//! - [`Compiler`] turns a source file into a relocatable object; [`SystemCompiler`] drives
//!   `cc` and `c++`. [`compile_cached`] ties it together.

mod compiler;
mod disk;
mod entry;
mod memory;
mod note;
mod redis;
mod signature;

pub use compiler::{compile_cached, signature_of, CompileOutcome, Compiler, SystemCompiler};
pub use disk::{DiskCache, DiskLimits, DiskUsage};
pub use memory::MemoryCache;
pub use redis::RedisCache;
pub use signature::{CacheKey, Signature};

use std::sync::atomic::{AtomicU64, Ordering};

/// Why a cache or compiler operation failed.
#[derive(Debug, thiserror::Error)]
pub enum CacheError {
    /// A file or socket operation.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// The compiler failed (its output is in the message).
    #[error("{compiler} failed on {source_file}:\n{output}")]
    Compile {
        /// The compiler.
        compiler: String,
        /// The source file.
        source_file: String,
        /// What it printed.
        output: String,
    },
    /// A store answered something unexpected.
    #[error("{store}: {what}")]
    Store {
        /// The store.
        store: String,
        /// What went wrong.
        what: String,
    },
    /// An object could not be given its signature note.
    #[error("{0}")]
    Object(String),
}

pub(crate) fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> CacheError {
    let what = what.into();
    move |source| CacheError::Io { what, source }
}

/// A cache's counters since it was opened.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Lookups that found a valid entry.
    pub hits: u64,
    /// Lookups that found none.
    pub misses: u64,
    /// Entries stored.
    pub puts: u64,
    /// Entries found corrupt, truncated or with a foreign signature (each also a miss),
    /// and removed where the store allows it.
    pub rejected: u64,
    /// Operations that failed (a full disk, a store that is down); the run went on.
    pub errors: u64,
}

/// Counters a backend keeps.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    hits: AtomicU64,
    misses: AtomicU64,
    puts: AtomicU64,
    rejected: AtomicU64,
    errors: AtomicU64,
}

impl Counters {
    pub(crate) fn hit(&self) {
        self.hits.fetch_add(1, Ordering::Relaxed);
    }
    pub(crate) fn miss(&self) {
        self.misses.fetch_add(1, Ordering::Relaxed);
    }
    pub(crate) fn put(&self) {
        self.puts.fetch_add(1, Ordering::Relaxed);
    }
    pub(crate) fn reject(&self) {
        self.rejected.fetch_add(1, Ordering::Relaxed);
    }
    pub(crate) fn error(&self) {
        self.errors.fetch_add(1, Ordering::Relaxed);
    }
    pub(crate) fn snapshot(&self) -> CacheStats {
        CacheStats {
            hits: self.hits.load(Ordering::Relaxed),
            misses: self.misses.load(Ordering::Relaxed),
            puts: self.puts.load(Ordering::Relaxed),
            rejected: self.rejected.load(Ordering::Relaxed),
            errors: self.errors.load(Ordering::Relaxed),
        }
    }
}

/// A store of objects by key. Implementations verify each entry's checksum on `get` (a
/// corrupt entry is `Ok(None)` and counted as rejected) and never fail a run for being
/// unavailable: `get` of a store that is down is `Ok(None)` with an error counted.
pub trait ObjectCache: Send + Sync {
    /// A short name for messages (`disk:/path`, `redis://host:port`).
    fn name(&self) -> String;
    /// The entry stored for `key`, checksum verified.
    fn get(&self, key: &CacheKey) -> Result<Option<Vec<u8>>, CacheError>;
    /// Stores `object` for `key` (replacing any entry).
    fn put(&self, key: &CacheKey, object: &[u8]) -> Result<(), CacheError>;
    /// Removes the entry for `key`, if any (one whose signature did not match).
    fn remove(&self, key: &CacheKey) -> Result<(), CacheError>;
    /// Counters since the cache was opened.
    fn stats(&self) -> CacheStats;
    /// Counts a rejected entry (a foreign signature found by [`compile_cached`]).
    fn count_rejected(&self);
}
