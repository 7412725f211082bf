//! The disk cache: one file per entry under a versioned directory.
//!
//! - Only in a directory no other user can write to (checked at open, every level of its
//!   path; see `trust.rs`), with entries sealed under this user's key (a `key` file in the
//!   root, 0600, made on first use; or `$KILN_CACHE_KEY_FILE`).
//! - Entries are read only if they are regular files of at most the entry limit, opened
//!   without following links (`O_NOFOLLOW`) and without blocking (`O_NONBLOCK`), checked
//!   with `fstat` on the descriptor; anything else under an entry's name is rejected and
//!   removed (the name, never what a link points to).
//! - Writes are atomic: a temporary file in the same directory, renamed over the entry,
//!   so a reader sees a whole entry or none, and a writer killed mid-write leaves only a
//!   temporary file (removed by [`DiskCache::prune`] once stale).
//! - An entry is mapped, not read. Its MAC is verified at the first hit, and the check
//!   stamped (a MAC of the file's identity beside it, see `stamp.rs`): later hits of the
//!   unchanged file hash nothing; any change of the file is checked whole again. A
//!   corrupt, truncated or foreign entry is a miss and is removed.
//! - Several processes may read and write at once: the last rename of a key wins, and
//!   every version is whole.
//! - Size and count limits with least-recently-used eviction: a hit refreshes its stamp
//!   file's modification time (an entry too recent to be stamped gets a stamp file that
//!   carries only the use; the entry itself is never touched); after a store, the oldest
//!   entries go until both limits hold. Pruning never follows a link: a `v1` that is a
//!   link is refused.
//! - A store that fails (a full disk, a read-only directory) is counted, kept as a
//!   [`CacheSkip`](crate::CacheSkip) and reported to the caller, who goes on without
//!   caching.

use crate::cached_object::EntrySlice;
use crate::files::{self, Links, ReadRefusal};
use crate::{
    entry, io, trust, CacheError, CacheKey, CacheSkip, CacheStats, Counters, MacKey, ObjectCache,
    SkipReason,
};
use crate::{stamp, CachedObject};
use std::ffi::OsString;
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

/// The layout version: a different one is a different directory.
const VERSION_DIR: &str = "v1";
/// The default key file, in the cache root.
const KEY_FILE: &str = "key";
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
    /// Bytes of one entry's object: a bigger file is not read (nor stored).
    pub max_entry_bytes: u64,
}

impl Default for DiskLimits {
    fn default() -> Self {
        DiskLimits {
            max_bytes: 1 << 30,
            max_entries: 100_000,
            max_entry_bytes: crate::MAX_ENTRY_BYTES,
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
    /// Names of entries that are not regular files (links, FIFOs, devices), and stamps
    /// whose entry is gone, which [`DiskCache::prune`] removes.
    pub strays: u64,
}

/// A cache in a directory.
#[derive(Debug)]
pub struct DiskCache {
    root: PathBuf,
    dir: PathBuf,
    pub(crate) limits: DiskLimits,
    pub(crate) mac_key: MacKey,
    pub(crate) counters: Counters,
    /// What entries' names end with (objects `.kobj`, linked images `.kimg`).
    suffix: &'static str,
}

/// Where one kind of entry lives in a cache root.
#[derive(Debug, Clone, Copy)]
pub(crate) struct EntryKind {
    /// The directory in the root (its layout version).
    pub(crate) dir: &'static str,
    /// What names end with.
    pub(crate) suffix: &'static str,
}

/// The object cache's entries.
const OBJECTS: EntryKind = EntryKind {
    dir: VERSION_DIR,
    suffix: SUFFIX,
};

impl DiskCache {
    /// A cache in `root` (entries in `root/v1`), created (mode 0700) if missing, with the
    /// key in `$KILN_CACHE_KEY_FILE` if that is set, else in `root/key` (made on first
    /// use). Fails with [`CacheError::Untrusted`] if another user could write to `root` or
    /// to a directory above it, and with [`CacheError::KeyFile`] if the key file is not
    /// this user's alone.
    pub fn open(root: impl AsRef<Path>, limits: DiskLimits) -> Result<Self, CacheError> {
        Self::open_inner(root.as_ref(), limits, None, OBJECTS)
    }

    /// The store of another kind of entry in the same root (its own directory, the same
    /// key and trust checks).
    pub(crate) fn open_kind(
        root: &Path,
        limits: DiskLimits,
        mac_key: Option<MacKey>,
        kind: EntryKind,
    ) -> Result<Self, CacheError> {
        Self::open_inner(root, limits, mac_key, kind)
    }

    /// A cache in `root` whose entries are sealed with `mac_key` (a key a fleet shares).
    pub fn open_with_key(
        root: impl AsRef<Path>,
        limits: DiskLimits,
        mac_key: MacKey,
    ) -> Result<Self, CacheError> {
        Self::open_inner(root.as_ref(), limits, Some(mac_key), OBJECTS)
    }

    fn open_inner(
        root: &Path,
        limits: DiskLimits,
        mac_key: Option<MacKey>,
        kind: EntryKind,
    ) -> Result<Self, CacheError> {
        let root = trust::private_directory(root)?;
        let mac_key = match mac_key {
            Some(key) => key,
            None => match MacKey::configured()? {
                Some(key) => key,
                None => MacKey::load_or_create(&root.join(KEY_FILE))?,
            },
        };
        let dir = root.join(kind.dir);
        if std::fs::symlink_metadata(&dir).is_err() {
            match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(io(format!("creating {}", dir.display()))(e)),
            }
        }
        let cache = DiskCache {
            root,
            dir,
            limits,
            mac_key,
            counters: Counters::default(),
            suffix: kind.suffix,
        };
        cache.check_entry_directory()?;
        Ok(cache)
    }

    /// The default root: `$KILN_CACHE_DIR`, else `$XDG_CACHE_HOME/kiln`, else
    /// `$HOME/.cache/kiln`, else `$XDG_RUNTIME_DIR/kiln` (a per-user directory the system
    /// makes 0700); with none of them (cron, services, `env -i`), no cache at all: never a
    /// directory in `/tmp` that another user could have made first. Empty values, and
    /// relative ones other than `$KILN_CACHE_DIR`, count as unset.
    pub fn default_root() -> Option<PathBuf> {
        default_root_from(|name| std::env::var_os(name))
    }

    /// The root: the checked, canonical path of the directory given at open.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The directory entries are in.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Checks that the entry directory is still a directory of this user's, not a link
    /// (to be followed nowhere, pruned nowhere else).
    fn check_entry_directory(&self) -> Result<(), CacheError> {
        let meta = std::fs::symlink_metadata(&self.dir)
            .map_err(io(format!("checking {}", self.dir.display())))?;
        let why = if meta.file_type().is_symlink() {
            Some("a symbolic link (not followed)".to_string())
        } else if !meta.file_type().is_dir() {
            Some(format!("{}, not a directory", files::kind_of(meta.mode())))
        } else if meta.uid() != trust::effective_uid() {
            Some(format!("owned by uid {}, not by this user", meta.uid()))
        } else if meta.mode() & 0o022 != 0 {
            Some(format!(
                "writable by its group or by others (mode {:04o})",
                meta.mode() & 0o7777
            ))
        } else {
            None
        };
        match why {
            Some(why) => Err(CacheError::Untrusted {
                path: self.dir.clone(),
                why,
            }),
            None => Ok(()),
        }
    }

    /// After a hit that checked the entry at `path` whole: a stamp of the check, which is
    /// also the entry's last use; or, for an entry changed too recently to be stamped, a
    /// stamp file that only carries the use (least recently used; best effort on a
    /// read-only cache).
    pub(crate) fn checked_whole(&self, key: &CacheKey, path: &Path, meta: &std::fs::Metadata) {
        self.counters.checked_whole();
        if !stamp::record(&self.mac_key, key, path, meta) {
            stamp::record_use(path);
        }
    }

    /// Removes an entry and its stamp.
    pub(crate) fn remove_entry(&self, path: &Path) {
        let _ = std::fs::remove_file(path);
        stamp::remove(path);
    }

    pub(crate) fn path(&self, key: &CacheKey) -> PathBuf {
        self.dir.join(format!("{}{}", key.hex(), self.suffix))
    }

    /// Entries with their sizes and last use, oldest first; the temporary files; and the
    /// names of ours that are not regular files. Nothing is followed: the entry directory
    /// must not be a link, and each name is looked at with `lstat`.
    fn scan(&self) -> Result<Scan, CacheError> {
        self.check_entry_directory()?;
        let mut scan = Scan::default();
        let listing =
            std::fs::read_dir(&self.dir).map_err(io(format!("reading {}", self.dir.display())))?;
        let stamp_suffix = format!("{}{}", self.suffix, stamp::SUFFIX);
        // Stamps by their entry's path, with their last change (the entry's last use).
        let mut stamps: std::collections::HashMap<PathBuf, SystemTime> = Default::default();
        for item in listing.flatten() {
            let path = item.path();
            // DirEntry::metadata does not follow links.
            let Ok(meta) = item.metadata() else { continue };
            let modified = meta.modified().unwrap_or(SystemTime::UNIX_EPOCH);
            let name = item.file_name();
            let name = name.to_string_lossy();
            let ours = name.ends_with(self.suffix)
                || name.ends_with(&stamp_suffix)
                || name.starts_with(".tmp");
            if ours && !meta.file_type().is_file() {
                scan.strays.push(path);
            } else if name.ends_with(self.suffix) {
                scan.entries.push((modified, meta.len(), path));
            } else if name.ends_with(&stamp_suffix) {
                let entry = path.with_file_name(&name[..name.len() - stamp::SUFFIX.len()]);
                stamps.insert(entry, modified);
            } else if name.starts_with(".tmp") {
                scan.temporaries.push((modified, path));
            }
        }
        for (used, _, path) in &mut scan.entries {
            if let Some(stamp_used) = stamps.remove(path) {
                *used = (*used).max(stamp_used);
            }
        }
        // A stamp whose entry is gone (removed by another process between the two).
        scan.strays
            .extend(stamps.into_keys().map(|entry| stamp::path_of(&entry)));
        scan.entries.sort();
        Ok(scan)
    }

    /// What the cache holds now.
    pub fn usage(&self) -> Result<DiskUsage, CacheError> {
        let scan = self.scan()?;
        Ok(DiskUsage {
            entries: scan.entries.len() as u64,
            bytes: scan.entries.iter().map(|e| e.1).sum(),
            temporaries: scan.temporaries.len() as u64,
            strays: scan.strays.len() as u64,
        })
    }

    /// Evicts least-recently-used entries until the limits hold, and removes temporary
    /// files left by writers that died and names of entries that are not regular files
    /// (a link is removed, never what it points to). Returns how many entries went.
    /// Fails, removing nothing, if the entry directory has become a link.
    pub fn prune(&self) -> Result<u64, CacheError> {
        let Scan {
            entries,
            temporaries,
            strays,
        } = self.scan()?;
        for path in strays {
            let _ = std::fs::remove_file(path);
        }
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
            stamp::remove(&path);
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
        let Scan {
            entries,
            temporaries,
            strays,
        } = self.scan()?;
        for path in strays
            .into_iter()
            .chain(temporaries.into_iter().map(|t| t.1))
        {
            let _ = std::fs::remove_file(path);
        }
        let mut removed = 0;
        for (_, _, path) in entries {
            stamp::remove(&path);
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

    fn get(&self, key: &CacheKey) -> Result<Option<crate::CachedObject>, CacheError> {
        let path = self.path(key);
        let limit = self
            .limits
            .max_entry_bytes
            .saturating_add(entry::HEADER as u64);
        let (file, meta) = match files::open_regular(&path, Links::Refuse, limit) {
            Ok(read) => read,
            Err(ReadRefusal::Missing) => {
                self.counters.miss();
                return Ok(None);
            }
            Err(ReadRefusal::Io(e)) => {
                self.counters
                    .skip(self.name(), "lookup", SkipReason::of_read(&e), &e);
                self.counters.miss();
                return Err(io(format!("reading {}", path.display()))(e));
            }
            Err(refusal) => {
                // A link, a FIFO, a device, a giant: never read; the name is removed (a
                // link's target is untouched).
                tracing::warn!(entry = %path.display(), %refusal, "a cache entry that is no entry: removed");
                self.remove_entry(&path);
                self.counters.reject();
                self.counters.miss();
                return Ok(None);
            }
        };
        let bytes: std::sync::Arc<dyn AsRef<[u8]> + Send + Sync> =
            if meta.len() < entry::HEADER as u64 {
                std::sync::Arc::new(Vec::new()) // refused below
            } else if files::on_network_filesystem(&file) {
                match files::read_checked(&file, &meta, limit) {
                    Ok(bytes) => std::sync::Arc::new(bytes),
                    Err(e) => {
                        self.counters.miss();
                        return Err(io(format!("reading {}", path.display()))(
                            std::io::Error::other(e.to_string()),
                        ));
                    }
                }
            } else {
                // Mapped, not read: the link reads the object where the page cache holds it.
                // SAFETY: an entry is written whole under another name and renamed into
                // place, never changed in place; its directory is this user's alone
                // (checked at open) and on a local file system (checked above), so no
                // other writer can truncate it under the mapping.
                match unsafe { memmap2::Mmap::map(&file) } {
                    Ok(map) => std::sync::Arc::new(map),
                    // No mapping to be had (too many, no memory): a miss; the entry stays.
                    Err(e) => {
                        self.counters
                            .skip(self.name(), "lookup", SkipReason::of_read(&e), &e);
                        self.counters.miss();
                        return Ok(None);
                    }
                }
            };
        let stored: &[u8] = (*bytes).as_ref();
        // Checked whole once; while the file keeps that identity, its stamp says so. The
        // identity is read again after the bytes were mapped or read: a change in between
        // is checked whole.
        let stamped = stamp::holds(&self.mac_key, key, &path, &file, &meta, stored.len());
        let object = if stamped {
            entry::payload_range(stored)
        } else {
            entry::open_range(&self.mac_key, key, stored)
        };
        match object {
            Some(object) => {
                self.counters.hit();
                if !stamped {
                    self.checked_whole(key, &path, &meta);
                }
                Ok(Some(CachedObject::new(std::sync::Arc::new(EntrySlice {
                    bytes,
                    object,
                }))))
            }
            None => {
                tracing::warn!(entry = %path.display(), "a cache entry not sealed with this cache's key, or corrupt: removed");
                self.remove_entry(&path);
                self.counters.reject();
                self.counters.miss();
                Ok(None)
            }
        }
    }

    fn put(&self, key: &CacheKey, object: &[u8]) -> Result<(), CacheError> {
        if object.len() as u64 > self.limits.max_entry_bytes {
            return Err(CacheError::Store {
                store: self.name(),
                what: format!(
                    "an object of {} bytes, more than the entry limit of {}",
                    object.len(),
                    self.limits.max_entry_bytes
                ),
            });
        }
        let result = (|| {
            let mut file = tempfile::Builder::new()
                .prefix(".tmp")
                .tempfile_in(&self.dir)
                .map_err(|e| (e, "creating a file in"))?;
            file.write_all(&entry::seal(&self.mac_key, key, object))
                .map_err(|e| (e, "writing in"))?;
            file.persist(self.path(key))
                .map_err(|e| (e.error, "renaming into"))?;
            Ok(())
        })();
        match result {
            Ok(()) => {
                self.counters.put();
                self.prune()?;
                Ok(())
            }
            Err((e, what)) => {
                self.counters
                    .skip(self.name(), "store", SkipReason::of_io(&e), &e);
                Err(io(format!("{what} {}", self.dir.display()))(e))
            }
        }
    }

    fn remove(&self, key: &CacheKey) -> Result<(), CacheError> {
        let path = self.path(key);
        stamp::remove(&path);
        match std::fs::remove_file(path) {
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

    fn take_skips(&self) -> Vec<CacheSkip> {
        self.counters.take_skips()
    }
}

/// What [`DiskCache::scan`] finds.
#[derive(Default)]
struct Scan {
    entries: Vec<EntryFile>,
    temporaries: Vec<TemporaryFile>,
    strays: Vec<PathBuf>,
}

/// [`DiskCache::default_root`] with the environment given by `var`.
fn default_root_from(var: impl Fn(&str) -> Option<OsString>) -> Option<PathBuf> {
    let set = |name: &str| var(name).filter(|v| !v.is_empty()).map(PathBuf::from);
    let absolute = |name: &str| set(name).filter(|p| p.is_absolute());
    if let Some(dir) = set("KILN_CACHE_DIR") {
        return Some(dir);
    }
    if let Some(dir) = absolute("XDG_CACHE_HOME") {
        return Some(dir.join("kiln"));
    }
    if let Some(home) = absolute("HOME") {
        return Some(home.join(".cache").join("kiln"));
    }
    absolute("XDG_RUNTIME_DIR").map(|dir| dir.join("kiln"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_a_home_the_cache_is_the_runtime_directory_or_none_never_tmp() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |name: &str| {
                pairs
                    .iter()
                    .find(|(n, _)| *n == name)
                    .map(|(_, v)| OsString::from(v))
            }
        };
        assert_eq!(default_root_from(env(&[])), None);
        assert_eq!(
            default_root_from(env(&[("HOME", ""), ("XDG_CACHE_HOME", "relative")])),
            None
        );
        assert_eq!(
            default_root_from(env(&[("XDG_RUNTIME_DIR", "/run/user/1000")])),
            Some(PathBuf::from("/run/user/1000/kiln"))
        );
        assert_eq!(
            default_root_from(env(&[("HOME", "/home/u"), ("XDG_RUNTIME_DIR", "/run/u")])),
            Some(PathBuf::from("/home/u/.cache/kiln"))
        );
        assert_eq!(
            default_root_from(env(&[("HOME", "/home/u"), ("XDG_CACHE_HOME", "/c")])),
            Some(PathBuf::from("/c/kiln"))
        );
        assert_eq!(
            default_root_from(env(&[("KILN_CACHE_DIR", "here"), ("HOME", "/home/u")])),
            Some(PathBuf::from("here"))
        );
    }
}
