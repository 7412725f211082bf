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
//! - Every stored entry carries a keyed MAC (BLAKE3 keyed mode, [`MacKey`]) over its cache
//!   key and bytes, verified on read: an entry this user (or the fleet that shares the
//!   key) did not make, a truncated or corrupt one, or one moved from another key, is a
//!   miss (and removed). The key lives in a file only this user can read (`key` in the
//!   cache root, made on first use, or `$KILN_CACHE_KEY_FILE`).
//! - A disk cache is used only in a directory no other user can write to, nor any
//!   directory above it (root's sticky directories excepted); entries are read only if
//!   they are regular files of bounded size, opened without following links and without
//!   blocking.
//! - When a cache is skipped (down, slow, refused, read-only, full), the backend says why:
//!   [`ObjectCache::take_skips`].
//! - Backends implement [`ObjectCache`]: [`MemoryCache`], [`DiskCache`] (one file per entry,
//!   atomic writes, size and count limits with least-recently-used eviction) and
//!   [`RedisCache`] (a store a fleet already runs; one deadline per operation; a store that
//!   is down or slow is a miss, never a failure nor a hang).
//! - [`Compiler`] turns a source file into a relocatable object; [`SystemCompiler`] drives
//!   `cc` and `c++`. [`compile_cached`] ties it together.
//!
//! Never compile twice: the second compile of the same source is a hit.
//!
//! ```
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use kiln_cache::{compile_cached, MemoryCache, SystemCompiler};
//! let dir = std::env::temp_dir().join(format!("kiln-cache-doc-{}", std::process::id()));
//! std::fs::create_dir_all(&dir)?;
//! let source = dir.join("f.c");
//! std::fs::write(&source, "int f(int x) { return x + 1; }\n")?;
//! let (compiler, cache) = (SystemCompiler::new(), MemoryCache::new());
//! let flags = ["-O2".to_string()];
//! let first = compile_cached(&compiler, Some(&cache), &source, &flags)?;
//! let second = compile_cached(&compiler, Some(&cache), &source, &flags)?;
//! assert!(!first.hit && second.hit);
//! assert_eq!(first.key, second.key);
//! # std::fs::remove_dir_all(&dir)?;
//! # Ok(()) }
//! ```

mod cached_object;
mod compiler;
mod disk;
mod entry;
mod files;
mod image;
mod image_key;
mod memory;
mod note;
#[cfg(feature = "redis")]
mod redis;
mod signature;
mod stamp;
mod trust;

pub use cached_object::CachedObject;
pub use compiler::{
    compile_cached, embed_signature, signature_of, CompileOutcome, Compiler, SystemCompiler,
};
pub use disk::{DiskCache, DiskLimits, DiskUsage};
pub use files::kind_of;
pub use image::{CachedImage, DiskImageCache, ImageCache, ImageToStore};
pub use image_key::{ImageKeyBuilder, RACY};
pub use memory::MemoryCache;
#[cfg(feature = "redis")]
pub use redis::{RedisCache, UNAVAILABLE_FOR};
pub use signature::{CacheKey, Signature};
pub use trust::{MacKey, KEY_FILE_VARIABLE};

/// Makes `dir` (mode 0700) if it is missing and checks that no other user can write to it
/// or to a directory above it, as the caches do; its canonical path. For files of the
/// caches' kind kept beside them (`kiln run`'s launchers).
pub fn private_directory(dir: &std::path::Path) -> Result<std::path::PathBuf, CacheError> {
    trust::private_directory(dir)
}

/// The largest object an entry may hold by default (a bigger file or value is not read).
pub const MAX_ENTRY_BYTES: u64 = 128 << 20;

use std::sync::atomic::{AtomicU64, Ordering};

/// Why a cache or compiler operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
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
    /// A cache directory other users could write to: not used.
    #[error("{path}: not a safe place for an object cache: {why}")]
    Untrusted {
        /// The directory (the cache's own or one above it).
        path: std::path::PathBuf,
        /// What is wrong with it.
        why: String,
    },
    /// A key file that cannot be used.
    #[error("the cache key file {path}: {why}")]
    KeyFile {
        /// The file.
        path: std::path::PathBuf,
        /// What is wrong with it.
        why: String,
    },
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
    /// Hits whose entry was checked whole (its MAC, every block): an entry's first hit, or
    /// the first after its file changed. The other hits of a disk store were stamped (see
    /// [`DiskCache`]) and hashed nothing.
    pub checked_whole: u64,
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

/// Why a cache operation was skipped (the run went on without the cache).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum SkipReason {
    /// The store cannot be reached (connection refused or reset, no such socket).
    Down,
    /// The store did not answer within the operation's deadline.
    Slow,
    /// The store refused the operation (authentication, permissions, an error reply).
    Refused,
    /// The store is read-only (a read-only file system or directory, a Redis replica).
    ReadOnly,
    /// The store is full (no space, no inodes, a quota, Redis out of memory).
    Full,
    /// Anything else.
    Failed,
}

impl std::fmt::Display for SkipReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            SkipReason::Down => "down",
            SkipReason::Slow => "slow",
            SkipReason::Refused => "refused",
            SkipReason::ReadOnly => "read-only",
            SkipReason::Full => "full",
            SkipReason::Failed => "failed",
        })
    }
}

impl SkipReason {
    /// The reason a failed read stands for: as [`SkipReason::of_io`], but a read this
    /// user may not make is refused, not read-only.
    pub fn of_read(error: &std::io::Error) -> Self {
        match Self::of_io(error) {
            SkipReason::ReadOnly if error.kind() == std::io::ErrorKind::PermissionDenied => {
                SkipReason::Refused
            }
            reason => reason,
        }
    }

    /// The reason an I/O error stands for.
    pub fn of_io(error: &std::io::Error) -> Self {
        use std::io::ErrorKind;
        match error.raw_os_error() {
            Some(libc::EROFS) => return SkipReason::ReadOnly,
            Some(libc::ENOSPC | libc::EDQUOT) => return SkipReason::Full,
            _ => {}
        }
        match error.kind() {
            ErrorKind::TimedOut | ErrorKind::WouldBlock => SkipReason::Slow,
            ErrorKind::ConnectionRefused
            | ErrorKind::ConnectionReset
            | ErrorKind::ConnectionAborted
            | ErrorKind::NotConnected
            | ErrorKind::BrokenPipe
            | ErrorKind::UnexpectedEof
            | ErrorKind::AddrNotAvailable => SkipReason::Down,
            // A directory this user may not write to (mode 0500) reads as read-only.
            ErrorKind::PermissionDenied | ErrorKind::ReadOnlyFilesystem => SkipReason::ReadOnly,
            ErrorKind::StorageFull | ErrorKind::QuotaExceeded => SkipReason::Full,
            _ => SkipReason::Failed,
        }
    }
}

/// A cache operation that was skipped, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CacheSkip {
    /// The cache (as [`ObjectCache::name`] says).
    pub cache: String,
    /// What was being done: `lookup`, `store`, `remove`.
    pub operation: &'static str,
    /// Why, in one word.
    pub reason: SkipReason,
    /// The error, in full.
    pub detail: String,
}

impl std::fmt::Display for CacheSkip {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "cache {} skipped ({}): {}: {}",
            self.operation, self.reason, self.cache, self.detail
        )
    }
}

/// How the detail of an operation skipped without trying begins.
pub(crate) const NOT_TRIED: &str = "not tried";

/// How many skips a cache keeps until they are taken.
const KEPT_SKIPS: usize = 32;

/// Counters a backend keeps.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    hits: AtomicU64,
    checked_whole: AtomicU64,
    misses: AtomicU64,
    puts: AtomicU64,
    rejected: AtomicU64,
    errors: AtomicU64,
    skips: parking_lot::Mutex<Vec<CacheSkip>>,
}

impl Counters {
    pub(crate) fn hit(&self) {
        self.hits.fetch_add(1, Ordering::Relaxed);
    }
    pub(crate) fn checked_whole(&self) {
        self.checked_whole.fetch_add(1, Ordering::Relaxed);
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
    /// Counts an error and keeps why the operation was skipped.
    pub(crate) fn skip(
        &self,
        cache: String,
        operation: &'static str,
        reason: SkipReason,
        detail: impl std::fmt::Display,
    ) {
        self.error();
        tracing::warn!(%cache, operation, %reason, %detail, "object cache skipped");
        let mut skips = self.skips.lock();
        let detail = detail.to_string();
        // An operation not tried because the last one failed says nothing new.
        let repeated = detail.starts_with(NOT_TRIED)
            && skips
                .last()
                .is_some_and(|last| last.cache == cache && last.reason == reason);
        if skips.len() < KEPT_SKIPS && !repeated {
            skips.push(CacheSkip {
                cache,
                operation,
                reason,
                detail,
            });
        }
    }
    pub(crate) fn take_skips(&self) -> Vec<CacheSkip> {
        std::mem::take(&mut *self.skips.lock())
    }
    pub(crate) fn snapshot(&self) -> CacheStats {
        CacheStats {
            hits: self.hits.load(Ordering::Relaxed),
            checked_whole: self.checked_whole.load(Ordering::Relaxed),
            misses: self.misses.load(Ordering::Relaxed),
            puts: self.puts.load(Ordering::Relaxed),
            rejected: self.rejected.load(Ordering::Relaxed),
            errors: self.errors.load(Ordering::Relaxed),
        }
    }
}

/// A store of objects by key. Implementations verify each entry's MAC on `get` (an entry
/// they did not seal, or a corrupt one, is `Ok(None)` and counted as rejected) and never
/// fail a run for being unavailable: `get` of a store that is down is `Ok(None)` with an
/// error counted and a [`CacheSkip`] kept.
pub trait ObjectCache: Send + Sync {
    /// A short name for messages (`disk:/path`, `redis://host:port`).
    fn name(&self) -> String;
    /// The entry stored for `key`, checked (its MAC, or a stamp of that check for a file
    /// unchanged since: see the disk cache).
    fn get(&self, key: &CacheKey) -> Result<Option<CachedObject>, CacheError>;
    /// Stores `object` for `key` (replacing any entry).
    fn put(&self, key: &CacheKey, object: &[u8]) -> Result<(), CacheError>;
    /// Removes the entry for `key`, if any (one whose signature did not match).
    fn remove(&self, key: &CacheKey) -> Result<(), CacheError>;
    /// Counters since the cache was opened.
    fn stats(&self) -> CacheStats;
    /// Counts a rejected entry (a foreign signature found by [`compile_cached`]).
    fn count_rejected(&self);
    /// The operations skipped since the last call, and why (a store down, slow,
    /// read-only, full): what `kiln run -v` prints. A backend that never skips keeps none.
    fn take_skips(&self) -> Vec<CacheSkip> {
        Vec::new()
    }
}
