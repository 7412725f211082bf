//! The key of a linked image: everything the link read, cheaply. Files are named by what
//! identifies their contents without reading them — device, inode, size, modification and
//! change times — as build tools do; the host's libraries and every mapped input are
//! found in `/proc/self/maps`.
//!
//! A file is always keyed the same way, by its identity, whenever the key is made: a key
//! never depends on when it is computed. But a file changed within the last [`RACY`] is
//! *unsettled*: the kernel's file times advance in ticks, so a file written twice within
//! one tick keeps its times, and a key made from them could name the first contents while
//! the link read the second. A key with an unsettled file
//! ([`ImageKeyBuilder::unsettled`]) must not be used to store an image (the session links
//! without the image cache then); a lookup under it could not find one stored by an
//! earlier process anyway (an image is stored only once all its files are older than
//! [`RACY`], and a file older than that cannot change without its change time, which no
//! program can set, moving past the key's).

use crate::{io, CacheError, CacheKey};
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::Duration;

/// How recent a change must be for a file to be keyed by its contents.
pub const RACY: Duration = Duration::from_secs(2);

use crate::files::racy;

/// Builds the key of a linked image from labelled parts (in a fixed order: the same parts
/// in the same order give the same key).
///
/// ```
/// let mut key = kiln_cache::ImageKeyBuilder::new("example");
/// key.text("flags", "-O2");
/// let a = key.finish();
/// let mut other = kiln_cache::ImageKeyBuilder::new("example");
/// other.text("flags", "-O0");
/// assert_ne!(a, other.finish());
/// ```
#[derive(Debug, Clone)]
pub struct ImageKeyBuilder {
    hasher: blake3::Hasher,
    /// The first file keyed that changed within [`RACY`] of being keyed.
    unsettled: Option<String>,
}

impl ImageKeyBuilder {
    /// A key for images made by `maker` (a name and version: a different maker is a
    /// different key).
    pub fn new(maker: &str) -> Self {
        let mut hasher = blake3::Hasher::new();
        hasher.update(b"kiln linked image key 1\0");
        let mut builder = ImageKeyBuilder {
            hasher,
            unsettled: None,
        };
        builder.text("maker", maker);
        builder
    }

    /// Adds a labelled text.
    pub fn text(&mut self, label: &str, value: &str) -> &mut Self {
        self.bytes(label, value.as_bytes())
    }

    /// Adds labelled bytes.
    pub fn bytes(&mut self, label: &str, value: &[u8]) -> &mut Self {
        for part in [label.as_bytes(), value] {
            self.hasher.update(&(part.len() as u64).to_le_bytes());
            self.hasher.update(part);
        }
        self
    }

    /// Adds an object cache's key (a compiled source's signature).
    pub fn key(&mut self, label: &str, key: &CacheKey) -> &mut Self {
        self.bytes(label, &key.0)
    }

    /// Adds the file at `path`: its identity (device, inode, size, times). A file changed
    /// within [`RACY`] makes the key [unsettled](ImageKeyBuilder::unsettled).
    pub fn file(&mut self, path: &Path) -> Result<&mut Self, CacheError> {
        let meta = std::fs::metadata(path).map_err(io(format!("{}", path.display())))?;
        self.text("file", &path.to_string_lossy());
        Ok(self.identity(path, &meta))
    }

    /// [`ImageKeyBuilder::file`] of a file whose contents the caller read (or mapped):
    /// keyed by identity as every file is (the contents are not hashed). A file replaced
    /// since it was read has a change time within [`RACY`] of now unless the replacement
    /// is older than that, and so leaves the key unsettled.
    pub fn file_read(&mut self, path: &Path, _contents: &[u8]) -> Result<&mut Self, CacheError> {
        self.file(path)
    }

    /// The first file keyed that changed within [`RACY`] of being keyed (`None`: every
    /// file is settled). An image must not be stored under an unsettled key: the same
    /// key may name other contents written within the same tick of the file's times.
    ///
    /// ```
    /// let dir = std::env::temp_dir().join(format!("kiln-doc-unsettled-{}", std::process::id()));
    /// std::fs::create_dir_all(&dir).unwrap();
    /// let fresh = dir.join("fresh.o");
    /// let written = std::time::Instant::now();
    /// std::fs::write(&fresh, b"just written").unwrap();
    /// let mut key = kiln_cache::ImageKeyBuilder::new("example");
    /// key.file(&fresh).unwrap();
    /// // Keyed within the seconds after its change (unless this machine was too busy to).
    /// if written.elapsed() < kiln_cache::RACY - std::time::Duration::from_millis(100) {
    ///     assert!(key.unsettled().is_some());
    /// }
    /// std::fs::remove_dir_all(&dir).unwrap();
    /// ```
    pub fn unsettled(&self) -> Option<&str> {
        self.unsettled.as_deref()
    }

    fn identity(&mut self, path: &Path, meta: &std::fs::Metadata) -> &mut Self {
        if racy(meta) && self.unsettled.is_none() {
            self.unsettled = Some(path.display().to_string());
        }
        let mut identity = Vec::with_capacity(56);
        for v in crate::files::identity(meta) {
            identity.extend_from_slice(&v.to_le_bytes());
        }
        self.bytes("identity", &identity)
    }

    /// Adds every file mapped in this process (`/proc/self/maps`): the executable, the
    /// shared libraries loaded (the host symbols' definitions), and inputs mapped from
    /// files (objects, archives). A file replaced or removed since it was mapped is named
    /// by the mapped inode and a mark that matches no later run. Memory files and devices
    /// are left out.
    pub fn mapped_files(&mut self) -> Result<&mut Self, CacheError> {
        self.mapped_files_of_maps("/proc/self/maps")
    }

    /// [`ImageKeyBuilder::mapped_files`] of process `pid` of this machine (an executor
    /// process, whose libraries define the host symbols of its links): an error if its
    /// `/proc/PID/maps` cannot be read (another user's, or gone).
    pub fn mapped_files_of(&mut self, pid: u32) -> Result<&mut Self, CacheError> {
        self.mapped_files_of_maps(&format!("/proc/{pid}/maps"))
    }

    fn mapped_files_of_maps(&mut self, maps_path: &str) -> Result<&mut Self, CacheError> {
        let maps = std::fs::read_to_string(maps_path).map_err(io("reading a process's maps"))?;
        let mut files: Vec<(&str, &str, u64)> = Vec::new();
        for line in maps.lines() {
            // address perms offset dev inode path: the path is the rest of the line after
            // five fields (it may hold spaces of its own).
            let mut rest = line;
            let mut fields = [""; 5];
            for field in &mut fields {
                let trimmed = rest.trim_start();
                let end = trimmed.find(char::is_whitespace).unwrap_or(trimmed.len());
                *field = &trimmed[..end];
                rest = &trimmed[end..];
            }
            let path = rest.trim_start();
            let (dev, Ok(inode)) = (fields[3], fields[4].parse::<u64>()) else {
                continue;
            };
            if inode == 0
                || !path.starts_with('/')
                || path.starts_with("/dev/")
                || path.starts_with("/memfd:")
            {
                continue;
            }
            files.push((path, dev, inode));
        }
        files.sort_unstable();
        files.dedup();
        for (path, dev, inode) in files {
            self.text("mapped", path);
            self.text("mapped device", dev);
            self.bytes("mapped inode", &inode.to_le_bytes());
            // A file removed or replaced since it was mapped (its name says "(deleted)"):
            // what this process holds is no file anyone can name again, and the key says
            // so (it matches no later run).
            if path.ends_with(" (deleted)") {
                self.text("deleted", "");
                continue;
            }
            match std::fs::metadata(path) {
                Ok(meta) if meta.ino() == inode => {
                    self.identity(Path::new(path), &meta);
                }
                _ => {
                    self.text("replaced", "");
                }
            }
        }
        Ok(self)
    }

    /// The key.
    pub fn finish(&self) -> CacheKey {
        CacheKey(*self.hasher.finalize().as_bytes())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whether less than [`RACY`] (with a margin for the kernel's coarse file clock) has
    /// passed since `written`, taken before a file was written: a key made now saw the
    /// file changed within the window.
    fn within_racy(written: std::time::Instant) -> bool {
        written.elapsed() < RACY - Duration::from_millis(100)
    }

    #[test]
    fn a_file_changed_within_one_tick_leaves_the_key_unsettled() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.o");
        let written = std::time::Instant::now();
        std::fs::write(&path, b"first").unwrap();
        let key = |p: &Path| {
            let mut k = ImageKeyBuilder::new("test");
            k.file(p).unwrap();
            (k.finish(), k.unsettled().map(str::to_string))
        };
        let (first, unsettled) = key(&path);
        // Same size, same tick: the times may not move, the contents do. Such a key is
        // never used to store an image. (Checked when the key was made within the seconds
        // after the write: a machine too busy to do that in time proves nothing here.)
        if within_racy(written) {
            assert_eq!(unsettled.as_deref(), Some(path.to_str().unwrap()));
        }
        assert_eq!(
            first,
            key(&path).0,
            "the key does not depend on when it is made"
        );
        // A file changed long ago is settled, and its key is the same whenever it is made.
        let (old, unsettled) = key(Path::new("/bin/sh"));
        assert_eq!(unsettled, None);
        assert_eq!(old, key(Path::new("/bin/sh")).0);
    }

    #[test]
    fn a_key_made_inside_and_after_the_racy_window_is_the_same() {
        // The flake this replaces: a file keyed by contents while racy and by identity
        // after. Make a file, key it, let the window pass, key it again.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("b.o");
        let written = std::time::Instant::now();
        std::fs::write(&path, b"contents").unwrap();
        let mut early = ImageKeyBuilder::new("test");
        early.file(&path).unwrap();
        if within_racy(written) {
            assert!(early.unsettled().is_some());
        }
        std::thread::sleep(RACY + Duration::from_millis(100));
        let mut late = ImageKeyBuilder::new("test");
        late.file(&path).unwrap();
        assert_eq!(late.unsettled(), None);
        assert_eq!(early.finish(), late.finish());
    }

    #[test]
    fn the_process_maps_name_the_c_library() {
        let mut k = ImageKeyBuilder::new("test");
        k.mapped_files().unwrap();
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        assert!(maps.contains("libc.so"));
        assert_eq!(k.finish(), {
            let mut again = ImageKeyBuilder::new("test");
            again.mapped_files().unwrap();
            again.finish()
        });
    }
}
