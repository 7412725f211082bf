//! Verified once, trusted while unchanged: an entry's *stamp* records that its bytes were
//! checked (its MAC, every block) while the file had this identity — device, inode, size,
//! modification and change times. A hit whose entry still has that identity skips the
//! checks: it hashes nothing, and the entry is mapped, not read.
//!
//! Why this keeps the guarantees:
//! - The stamp is a MAC under the cache's key (the one entries are sealed with) over the
//!   cache key and the identity: no one without the key can make one, and one made for
//!   another entry, or for this entry before it changed, does not match.
//! - No program can change a file's bytes without its change time moving (the change time
//!   cannot be set; only root changing the clock could). A write, a truncation, a file
//!   renamed over the entry (another inode) all end the stamp's match, and the next hit
//!   checks the entry whole again.
//! - The kernel's file times advance in ticks: a file written twice within one tick keeps
//!   its times. So a stamp is made only for a file whose change time is at least
//!   [`RACY`](crate::RACY) old: any later change has a later time.
//!
//! What it does not see: bytes that change under the file system (a failing disk), as
//! with any cache that trusts the file system for what it has checked once.
//!
//! The stamp is a file beside its entry (`NAME.ok`, 32 bytes), written to a temporary name
//! and renamed; its modification time is the entry's last use (a hit touches the stamp,
//! never the entry, whose times the stamp is bound to).

use crate::files::{self, Links};
use crate::{CacheKey, MacKey};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::SystemTime;

/// What a stamp's name adds to its entry's.
pub(crate) const SUFFIX: &str = ".ok";
/// What the MAC covers first: the format, so that no other use of the key collides.
const DOMAIN: &[u8] = b"kiln-cache stamp 1\0";

/// The stamp file of the entry at `entry`.
pub(crate) fn path_of(entry: &Path) -> PathBuf {
    let mut name = entry.as_os_str().to_owned();
    name.push(SUFFIX);
    PathBuf::from(name)
}

fn tag(mac_key: &MacKey, key: &CacheKey, meta: &std::fs::Metadata) -> blake3::Hash {
    let mut hasher = mac_key.hasher();
    hasher.update(DOMAIN);
    hasher.update(&key.0);
    for v in files::identity(meta) {
        hasher.update(&v.to_le_bytes());
    }
    hasher.finalize()
}

/// Whether the entry at `entry`, stored under `key` and now of identity `meta`, has a
/// stamp for that identity. If it has, its last use is now (the stamp is touched).
fn valid(mac_key: &MacKey, key: &CacheKey, entry: &Path, meta: &std::fs::Metadata) -> bool {
    let Ok((mut file, stamp_meta)) = files::open_regular(&path_of(entry), Links::Refuse, 32) else {
        return false;
    };
    if stamp_meta.len() != 32 {
        return false;
    }
    let mut found = [0u8; 32];
    if file.read_exact(&mut found).is_err() {
        return false;
    }
    // blake3::Hash compares in constant time.
    let ok = tag(mac_key, key, meta) == blake3::Hash::from_bytes(found);
    if ok {
        // Least recently used: a hit is a use (best effort on a read-only cache).
        let _ = file.set_modified(SystemTime::now());
    }
    ok
}

/// Whether the stamp of the entry at `entry` (under `key`, open as `file`, of identity
/// `meta` when opened, `len` bytes mapped or read from it) still holds: it is valid for
/// that identity, the bytes are the whole file, and the identity is the same after they
/// were mapped or read (a change in between is checked whole).
pub(crate) fn holds(
    mac_key: &MacKey,
    key: &CacheKey,
    entry: &Path,
    file: &std::fs::File,
    meta: &std::fs::Metadata,
    len: usize,
) -> bool {
    len as u64 == meta.len()
        && valid(mac_key, key, entry, meta)
        && file
            .metadata()
            .is_ok_and(|again| files::unchanged(meta, &again))
}

/// Writes `contents` as the stamp file of the entry at `entry`: a temporary file renamed.
fn write(entry: &Path, contents: &[u8; 32]) -> std::io::Result<()> {
    let dir = entry
        .parent()
        .ok_or_else(|| std::io::Error::other("an entry with no directory"))?;
    let mut file = tempfile::Builder::new().prefix(".tmp").tempfile_in(dir)?;
    file.write_all(contents)?;
    file.persist(path_of(entry)).map_err(|e| e.error)?;
    Ok(())
}

/// Records that the entry at `entry` (under `key`, of identity `meta`) was checked whole
/// just now; nothing if it changed too recently for its times to tell a later change
/// apart, or if the stamp cannot be written (the next hit checks again). Whether a stamp
/// was written.
pub(crate) fn record(
    mac_key: &MacKey,
    key: &CacheKey,
    entry: &Path,
    meta: &std::fs::Metadata,
) -> bool {
    if files::racy(meta) {
        return false;
    }
    let written = write(entry, tag(mac_key, key, meta).as_bytes());
    if let Err(error) = &written {
        tracing::debug!(entry = %entry.display(), %error, "no stamp written");
    }
    written.is_ok()
}

/// Records a use of the entry at `entry` that could not be stamped (it changed too
/// recently): its stamp file, made if missing with no valid stamp in it (32 zero bytes,
/// which no MAC equals), carries the entry's last use. The entry itself is not touched:
/// that would move its change time on, and an entry used that often would never be
/// stamped.
pub(crate) fn record_use(entry: &Path) {
    if let Ok((file, _)) = files::open_regular(&path_of(entry), Links::Refuse, 32) {
        let _ = file.set_modified(SystemTime::now());
        return;
    }
    let _ = write(entry, &[0u8; 32]);
}

/// Removes the stamp of the entry at `entry`, if any.
pub(crate) fn remove(entry: &Path) {
    let _ = std::fs::remove_file(path_of(entry));
}
