//! Who may have written what the cache reads.
//!
//! - A cache directory is used only if it and every directory on its path are out of
//!   reach of other users: the directory itself owned by this user and writable by no
//!   group and no other user; each directory above it owned by this user or by root, and
//!   not writable by others unless it is root's and sticky (as `/tmp` is: others may add
//!   names there, but not rename or remove ours).
//! - Every entry is authenticated with a keyed MAC ([`MacKey`], BLAKE3 in keyed mode): an
//!   entry is loaded only if it was sealed with this user's key (or the key a fleet shares
//!   for its Redis), under the very cache key it is found at.
//! - The key lives in a file that must be a regular file (not a link), owned by this user,
//!   readable and writable by this user alone (mode 0600 or 0400).

use crate::files::{self, Links, ReadRefusal};
use crate::{io, CacheError};
use std::io::{Read, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};

/// The environment variable naming a key file (a fleet's shared key for a shared Redis,
/// or a user's choice of key for the disk cache).
pub const KEY_FILE_VARIABLE: &str = "KILN_CACHE_KEY_FILE";

/// The effective user id of this process.
pub(crate) fn effective_uid() -> u32 {
    rustix::process::geteuid().as_raw()
}

fn untrusted(path: &Path, why: impl Into<String>) -> CacheError {
    CacheError::Untrusted {
        path: path.to_path_buf(),
        why: why.into(),
    }
}

/// Creates `dir` (and missing parents) mode 0700 if it does not exist, then checks it as
/// [`check_directory`] does. Returns its canonical path (no links), which is what the cache
/// then uses: a link on the way cannot be changed to lead elsewhere afterwards.
pub(crate) fn private_directory(dir: &Path) -> Result<PathBuf, CacheError> {
    if std::fs::symlink_metadata(dir).is_err() {
        // Nothing is made under a directory others could write to: the nearest one that
        // exists is checked first, as a directory above the cache.
        if let Some(existing) = dir.ancestors().skip(1).find(|a| a.exists()) {
            let canonical = std::fs::canonicalize(existing)
                .map_err(io(format!("resolving {}", existing.display())))?;
            check_levels(&canonical, false)?;
        }
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(io(format!("creating {}", dir.display())))?;
    }
    let canonical =
        std::fs::canonicalize(dir).map_err(io(format!("resolving {}", dir.display())))?;
    check_directory(&canonical)?;
    Ok(canonical)
}

/// Checks that `canonical` (an absolute path with no links) and every directory above it
/// are out of other users' reach (see the module's rules).
pub(crate) fn check_directory(canonical: &Path) -> Result<(), CacheError> {
    check_levels(canonical, true)
}

/// Checks every level of `canonical`, the last one as the cache's own directory if
/// `last_is_cache`, else as one above it.
fn check_levels(canonical: &Path, last_is_cache: bool) -> Result<(), CacheError> {
    let me = effective_uid();
    let mut levels: Vec<&Path> = canonical.ancestors().collect();
    levels.reverse();
    let last = levels.len().saturating_sub(1);
    for (depth, level) in levels.into_iter().enumerate() {
        let meta = std::fs::symlink_metadata(level)
            .map_err(io(format!("checking {}", level.display())))?;
        let mode = meta.mode();
        if !meta.file_type().is_dir() {
            return Err(untrusted(
                level,
                format!("{}, not a directory", files::kind_of(mode)),
            ));
        }
        let writable_by_others = mode & 0o022 != 0;
        if depth == last && last_is_cache {
            if meta.uid() != me {
                return Err(untrusted(
                    level,
                    format!("owned by uid {}, not by this user (uid {me})", meta.uid()),
                ));
            }
            if writable_by_others {
                return Err(untrusted(
                    level,
                    format!(
                        "writable by its group or by others (mode {:04o})",
                        mode & 0o7777
                    ),
                ));
            }
        } else {
            if meta.uid() != me && meta.uid() != 0 {
                return Err(untrusted(
                    level,
                    format!(
                        "a directory on the path owned by uid {}, neither this user (uid {me}) nor root",
                        meta.uid()
                    ),
                ));
            }
            let sticky_and_roots = mode & 0o1000 != 0 && meta.uid() == 0;
            if writable_by_others && !sticky_and_roots {
                return Err(untrusted(
                    level,
                    format!(
                        "a directory on the path writable by its group or by others (mode {:04o})",
                        mode & 0o7777
                    ),
                ));
            }
        }
    }
    Ok(())
}

fn seed_marker() -> u8 {
    0
}

/// The key entries are authenticated with: BLAKE3 in keyed mode. Whoever holds it can
/// make entries this cache loads; whoever does not, cannot.
#[derive(Clone)]
pub struct MacKey([u8; 32]);

impl std::fmt::Debug for MacKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the key itself: debug output ends up in logs.
        f.write_str("MacKey(..)")
    }
}

impl MacKey {
    /// A key from its 32 bytes.
    pub fn from_bytes(bytes: [u8; 32]) -> Self {
        MacKey(bytes)
    }

    /// A fresh key from the system's random source.
    pub fn random() -> Result<Self, CacheError> {
        let mut bytes = [0u8; 32];
        std::fs::File::open("/dev/urandom")
            .and_then(|mut f| f.read_exact(&mut bytes))
            .map_err(io("reading /dev/urandom"))?;
        Ok(MacKey(bytes))
    }

    /// A key for this process alone (an in-memory cache): random, or, should the random
    /// source fail, derived from the time and this process's id (no other user can write
    /// into this process's memory anyway).
    pub(crate) fn ephemeral() -> Self {
        Self::random().unwrap_or_else(|_| {
            let seed = format!(
                "{:?} {} {:p}",
                std::time::SystemTime::now(),
                std::process::id(),
                &seed_marker()
            );
            MacKey(*blake3::hash(seed.as_bytes()).as_bytes())
        })
    }

    /// The key in `path`: 64 hex digits (a newline may follow). The file must be a regular
    /// file (a link is refused), owned by this user, and neither readable nor writable by
    /// anyone else (mode 0600 or 0400).
    pub fn load(path: &Path) -> Result<Self, CacheError> {
        let refused = |why: String| CacheError::KeyFile {
            path: path.to_path_buf(),
            why,
        };
        let (mut file, meta) = files::open_regular(path, Links::Refuse, 256).map_err(|e| {
            refused(match e {
                ReadRefusal::Missing => "no such file".into(),
                other => other.to_string(),
            })
        })?;
        let me = effective_uid();
        if meta.uid() != me {
            return Err(refused(format!(
                "owned by uid {}, not by this user (uid {me})",
                meta.uid()
            )));
        }
        if meta.mode() & 0o077 != 0 {
            return Err(refused(format!(
                "readable or writable by others (mode {:04o}; make it 0600)",
                meta.mode() & 0o7777
            )));
        }
        let mut text = String::new();
        file.read_to_string(&mut text)
            .map_err(|e| refused(format!("cannot be read as text: {e}")))?;
        Self::parse(text.trim()).ok_or_else(|| refused("not 64 hex digits".into()))
    }

    /// The key in `path`, made (random, mode 0600) if there is none. Two processes making
    /// it at once agree on one key: each writes its own temporary file and links it in
    /// only if no key is there yet.
    pub fn load_or_create(path: &Path) -> Result<Self, CacheError> {
        match Self::load(path) {
            Err(CacheError::KeyFile { .. }) if std::fs::symlink_metadata(path).is_err() => {}
            other => return other,
        }
        let parent = path.parent().unwrap_or(Path::new("."));
        let key = Self::random()?;
        // tempfile creates the file with mode 0600.
        let mut file = tempfile::Builder::new()
            .prefix(".key")
            .tempfile_in(parent)
            .map_err(io(format!("creating a key file in {}", parent.display())))?;
        file.write_all(key.hex().as_bytes())
            .and_then(|()| file.write_all(b"\n"))
            .and_then(|()| file.as_file().sync_all())
            .map_err(io(format!("writing a key file in {}", parent.display())))?;
        match file.persist_noclobber(path) {
            Ok(_) => Ok(key),
            // Another process made it first: its key is the key.
            Err(e) if e.error.kind() == std::io::ErrorKind::AlreadyExists => Self::load(path),
            Err(e) => Err(io(format!("creating {}", path.display()))(e.error)),
        }
    }

    /// The key the configuration names: the file in `$KILN_CACHE_KEY_FILE`, if set.
    pub fn configured() -> Result<Option<Self>, CacheError> {
        match std::env::var_os(KEY_FILE_VARIABLE) {
            Some(path) if !path.is_empty() => Self::load(Path::new(&path)).map(Some),
            _ => Ok(None),
        }
    }

    fn parse(hex: &str) -> Option<Self> {
        if hex.len() != 64 || !hex.is_ascii() {
            return None;
        }
        let mut bytes = [0u8; 32];
        for (i, byte) in bytes.iter_mut().enumerate() {
            *byte = u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok()?;
        }
        Some(MacKey(bytes))
    }

    fn hex(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// A keyed hasher over this key.
    pub(crate) fn hasher(&self) -> blake3::Hasher {
        blake3::Hasher::new_keyed(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn a_key_file_is_made_once_and_checked_every_time() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("key");
        let made = MacKey::load_or_create(&path).unwrap();
        let meta = std::fs::symlink_metadata(&path).unwrap();
        assert_eq!(meta.mode() & 0o7777, 0o600);
        assert_eq!(MacKey::load_or_create(&path).unwrap().0, made.0, "kept");
        assert_eq!(MacKey::load(&path).unwrap().0, made.0);
        // Readable by others: refused.
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let error = MacKey::load(&path).unwrap_err().to_string();
        assert!(error.contains("mode 0644"), "{error}");
        assert!(
            MacKey::load_or_create(&path).is_err(),
            "a bad key file is not replaced"
        );
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        // Owned by someone else: refused.
        std::os::unix::fs::chown(&path, Some(65534), None).unwrap();
        if effective_uid() != 65534 {
            let error = MacKey::load(&path).unwrap_err().to_string();
            assert!(error.contains("owned by uid 65534"), "{error}");
        }
        // A link to a good key: refused.
        let link = dir.path().join("link");
        let good = dir.path().join("good");
        MacKey::load_or_create(&good).unwrap();
        std::os::unix::fs::symlink(&good, &link).unwrap();
        let error = MacKey::load(&link).unwrap_err().to_string();
        assert!(error.contains("symbolic link"), "{error}");
        // Not a key.
        let junk = dir.path().join("junk");
        std::fs::write(&junk, "not a key\n").unwrap();
        std::fs::set_permissions(&junk, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert!(MacKey::load(&junk)
            .unwrap_err()
            .to_string()
            .contains("64 hex digits"));
    }

    #[test]
    fn directories_writable_by_others_or_owned_by_them_are_refused() {
        let base = tempfile::tempdir().unwrap();
        let base = std::fs::canonicalize(base.path()).unwrap();
        let mine = base.join("mine");
        let checked = private_directory(&mine).unwrap();
        assert_eq!(checked, mine);
        let mode = std::fs::metadata(&mine).unwrap().mode();
        assert_eq!(mode & 0o777, 0o700, "created private");
        // World-writable.
        std::fs::set_permissions(&mine, std::fs::Permissions::from_mode(0o777)).unwrap();
        let error = private_directory(&mine).unwrap_err().to_string();
        assert!(error.contains("mode 0777"), "{error}");
        // Group-writable parent.
        std::fs::set_permissions(&mine, std::fs::Permissions::from_mode(0o700)).unwrap();
        let inner = mine.join("inner");
        std::fs::create_dir(&inner).unwrap();
        std::fs::set_permissions(&mine, std::fs::Permissions::from_mode(0o770)).unwrap();
        let error = private_directory(&inner).unwrap_err().to_string();
        assert!(error.contains("on the path writable"), "{error}");
        std::fs::set_permissions(&mine, std::fs::Permissions::from_mode(0o700)).unwrap();
        // Owned by another user.
        if effective_uid() != 65534 {
            std::os::unix::fs::chown(&inner, Some(65534), None).unwrap();
            let error = private_directory(&inner).unwrap_err().to_string();
            assert!(error.contains("owned by uid 65534"), "{error}");
        }
        // Nothing is made under a directory others can write to.
        let open = base.join("open");
        std::fs::create_dir(&open).unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
        let error = private_directory(&open.join("cache"))
            .unwrap_err()
            .to_string();
        assert!(error.contains("on the path writable"), "{error}");
        assert!(!open.join("cache").exists(), "not made");
        // Through a link: the target is what is checked and used.
        let link = base.join("link");
        std::os::unix::fs::symlink(&mine, &link).unwrap();
        assert_eq!(private_directory(&link).unwrap(), mine);
    }
}
