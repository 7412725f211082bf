//! The disk cache: one file per entry under a versioned directory.
//!
//! - Writes are atomic: a temporary file in the same directory, renamed over the entry,
//!   so a reader sees a whole entry or none, and a writer killed mid-write leaves only a
//!   temporary file (removed by [`DiskCache::prune`] once stale).
//! - Every read verifies the entry's checksum; a corrupt or truncated entry is a miss and
//!   is removed.
//! - Several processes may read and write at once: the last rename of a key wins, and
//!   every version is whole.
//! - Size and count limits with least-recently-used eviction: a hit refreshes the
//!   entry's modification time; after a store, the oldest entries go until both limits
//!   hold.
//! - A store that fails (a full disk, a read-only directory) is counted and reported to
//!   the caller, who goes on without caching.

use crate::{entry, io, CacheError, CacheKey, CacheStats, Counters, ObjectCache};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

/// The layout version: a different one is a different directory.
const VERSION_DIR: &str = "v1";
const SUFFIX: &str = ".kobj";
/// A temporary file older than this belongs to a writer that died.
const STALE_TEMPORARY: Duration = Duration::from_secs(3600);

/// An entry file: last use, size, path.
type EntryFile = (SystemTime, u64, PathBuf);
/// A temporary file: last change, path.
type TemporaryFile = (SystemTime, PathBuf);

/// Limits of a disk cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DiskLimits {
    /// Total bytes of entries.
    pub max_bytes: u64,
    /// Number of entries.
    pub max_entries: u64,
}

impl Default for DiskLimits {
    fn default() -> Self {
        DiskLimits {
            max_bytes: 1 << 30,
            max_entries: 100_000,
        }
    }
}

/// What a disk cache holds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DiskUsage {
    /// Entries.
    pub entries: u64,
    /// Their bytes.
    pub bytes: u64,
    /// Temporary files (writes in progress, or left by a writer that died).
    pub temporaries: u64,
}

/// A cache in a directory.
#[derive(Debug)]
pub struct DiskCache {
    dir: PathBuf,
    limits: DiskLimits,
    counters: Counters,
}

impl DiskCache {
    /// A cache in `root` (entries in `root/v1`), created if missing.
    pub fn open(root: impl AsRef<Path>, limits: DiskLimits) -> Result<Self, CacheError> {
        let dir = root.as_ref().join(VERSION_DIR);
        std::fs::create_dir_all(&dir).map_err(io(format!("creating {}", dir.display())))?;
        Ok(DiskCache {
            dir,
            limits,
            counters: Counters::default(),
        })
    }

    /// The default root: `$KILN_CACHE_DIR`, else `$XDG_CACHE_HOME/kiln`, else
    /// `~/.cache/kiln`.
    pub fn default_root() -> PathBuf {
        if let Some(dir) = std::env::var_os("KILN_CACHE_DIR") {
            return dir.into();
        }
        if let Some(dir) = std::env::var_os("XDG_CACHE_HOME") {
            return Path::new(&dir).join("kiln");
        }
        match std::env::var_os("HOME") {
            Some(home) => Path::new(&home).join(".cache").join("kiln"),
            None => std::env::temp_dir().join("kiln-cache"),
        }
    }

    /// The directory entries are in.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn path(&self, key: &CacheKey) -> PathBuf {
        self.dir.join(format!("{}{SUFFIX}", key.hex()))
    }

    /// Entries with their sizes and last use, oldest first; and the temporary files.
    fn scan(&self) -> Result<(Vec<EntryFile>, Vec<TemporaryFile>), CacheError> {
        let mut entries = Vec::new();
        let mut temporaries = Vec::new();
        let listing =
            std::fs::read_dir(&self.dir).map_err(io(format!("reading {}", self.dir.display())))?;
        for item in listing.flatten() {
            let path = item.path();
            let Ok(meta) = item.metadata() else { continue };
            let modified = meta.modified().unwrap_or(SystemTime::UNIX_EPOCH);
            let name = item.file_name();
            let name = name.to_string_lossy();
            if name.ends_with(SUFFIX) {
                entries.push((modified, meta.len(), path));
            } else if name.starts_with(".tmp") {
                temporaries.push((modified, path));
            }
        }
        entries.sort();
        Ok((entries, temporaries))
    }

    /// What the cache holds now.
    pub fn usage(&self) -> Result<DiskUsage, CacheError> {
        let (entries, temporaries) = self.scan()?;
        Ok(DiskUsage {
            entries: entries.len() as u64,
            bytes: entries.iter().map(|e| e.1).sum(),
            temporaries: temporaries.len() as u64,
        })
    }

    /// Evicts least-recently-used entries until the limits hold, and removes temporary
    /// files left by writers that died. Returns how many entries went.
    pub fn prune(&self) -> Result<u64, CacheError> {
        let (entries, temporaries) = self.scan()?;
        let now = SystemTime::now();
        for (modified, path) in temporaries {
            if now.duration_since(modified).unwrap_or_default() > STALE_TEMPORARY {
                let _ = std::fs::remove_file(path);
            }
        }
        let mut bytes: u64 = entries.iter().map(|e| e.1).sum();
        let mut count = entries.len() as u64;
        let mut evicted = 0;
        for (_, len, path) in entries {
            if bytes <= self.limits.max_bytes && count <= self.limits.max_entries {
                break;
            }
            if std::fs::remove_file(&path).is_ok() {
                bytes -= len;
                count -= 1;
                evicted += 1;
            }
        }
        Ok(evicted)
    }

    /// Removes every entry and temporary file. Returns how many entries went.
    pub fn clear(&self) -> Result<u64, CacheError> {
        let (entries, temporaries) = self.scan()?;
        for (_, path) in temporaries {
            let _ = std::fs::remove_file(path);
        }
        let mut removed = 0;
        for (_, _, path) in entries {
            if std::fs::remove_file(path).is_ok() {
                removed += 1;
            }
        }
        Ok(removed)
    }
}

impl ObjectCache for DiskCache {
    fn name(&self) -> String {
        format!("disk:{}", self.dir.display())
    }

    fn get(&self, key: &CacheKey) -> Result<Option<Vec<u8>>, CacheError> {
        let path = self.path(key);
        let stored = match std::fs::read(&path) {
            Ok(stored) => stored,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                self.counters.miss();
                return Ok(None);
            }
            Err(e) => {
                self.counters.error();
                self.counters.miss();
                return Err(io(format!("reading {}", path.display()))(e));
            }
        };
        match entry::open(&stored) {
            Some(object) => {
                self.counters.hit();
                // Least recently used: a hit is a use (best effort on a read-only cache).
                if let Ok(file) = std::fs::File::options().append(true).open(&path) {
                    let _ = file.set_modified(SystemTime::now());
                }
                Ok(Some(object.to_vec()))
            }
            None => {
                tracing::warn!(entry = %path.display(), "a corrupt cache entry: removed");
                let _ = std::fs::remove_file(&path);
                self.counters.reject();
                self.counters.miss();
                Ok(None)
            }
        }
    }

    fn put(&self, key: &CacheKey, object: &[u8]) -> Result<(), CacheError> {
        let result = (|| {
            let mut file = tempfile::Builder::new()
                .prefix(".tmp")
                .tempfile_in(&self.dir)
                .map_err(io(format!("creating a file in {}", self.dir.display())))?;
            file.write_all(&entry::seal(object))
                .map_err(io(format!("writing in {}", self.dir.display())))?;
            file.persist(self.path(key))
                .map_err(|e| io(format!("renaming into {}", self.dir.display()))(e.error))?;
            Ok(())
        })();
        match result {
            Ok(()) => {
                self.counters.put();
                self.prune()?;
                Ok(())
            }
            Err(e) => {
                self.counters.error();
                Err(e)
            }
        }
    }

    fn remove(&self, key: &CacheKey) -> Result<(), CacheError> {
        match std::fs::remove_file(self.path(key)) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(io("removing a cache entry")(e)),
        }
    }

    fn stats(&self) -> CacheStats {
        self.counters.snapshot()
    }

    fn count_rejected(&self) {
        self.counters.reject();
    }
}
