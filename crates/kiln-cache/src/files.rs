//! Reading files another user may have planted: never through a link where one is not
//! expected, never blocking on a FIFO, never more than a limit.
//!
//! Every open is non-blocking (`O_NONBLOCK`: a FIFO with no writer would otherwise block
//! the open, or the read, for good), then `fstat`ed on the descriptor (not the path, which
//! may have changed since): only a regular file of at most the limit is read, and at most
//! its `fstat` size is read even if it grows meanwhile.

use std::fs::File;
use std::io::Read;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::Path;

/// Why a file was not read.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ReadRefusal {
    /// There is no such file.
    #[error("no such file")]
    Missing,
    /// A symbolic link where none is allowed.
    #[error("a symbolic link (not followed)")]
    Link,
    /// Not a regular file: a FIFO, a device, a directory, a socket.
    #[error("not a regular file ({0})")]
    NotRegular(&'static str),
    /// A regular file bigger than the limit.
    #[error("{size} bytes, more than the limit of {limit}")]
    TooBig {
        /// Its size.
        size: u64,
        /// The limit.
        limit: u64,
    },
    /// The open or the read failed.
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

/// How a file may be reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Links {
    /// The last component must not be a symbolic link (`O_NOFOLLOW`): cache entries, key
    /// files.
    Refuse,
    /// Links are followed (headers a compiler read through a link), but what they lead to
    /// is checked as any file is.
    Follow,
}

/// What kind of file `mode` (`st_mode`) describes, for messages: "a FIFO", "a character
/// device", "a regular file", ...
pub fn kind_of(mode: u32) -> &'static str {
    match mode & libc::S_IFMT {
        libc::S_IFIFO => "a FIFO",
        libc::S_IFCHR => "a character device",
        libc::S_IFBLK => "a block device",
        libc::S_IFDIR => "a directory",
        libc::S_IFSOCK => "a socket",
        libc::S_IFLNK => "a symbolic link",
        libc::S_IFREG => "a regular file",
        _ => "an unknown kind of file",
    }
}

/// Opens `path` for reading without blocking and checks, on the descriptor, that it is a
/// regular file of at most `limit` bytes. Returns the file and its size.
pub(crate) fn open_regular(
    path: &Path,
    links: Links,
    limit: u64,
) -> Result<(File, std::fs::Metadata), ReadRefusal> {
    let mut flags = libc::O_NONBLOCK;
    if links == Links::Refuse {
        flags |= libc::O_NOFOLLOW;
    }
    let file = match File::options().read(true).custom_flags(flags).open(path) {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(ReadRefusal::Missing),
        // O_NOFOLLOW on a link fails with ELOOP.
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) && links == Links::Refuse => {
            return Err(ReadRefusal::Link)
        }
        Err(e) => return Err(ReadRefusal::Io(e)),
    };
    let meta = file.metadata()?;
    if !meta.file_type().is_file() {
        return Err(ReadRefusal::NotRegular(kind_of(meta.mode())));
    }
    if meta.len() > limit {
        return Err(ReadRefusal::TooBig {
            size: meta.len(),
            limit,
        });
    }
    Ok((file, meta))
}

/// Whether `file` is on a network or user-space file system (NFS, SMB/CIFS, FUSE, Ceph,
/// AFS, 9P), where another host may remove or truncate it: such an entry is read, not
/// mapped (a page the server no longer has would be a SIGBUS in the reader).
pub(crate) fn on_network_filesystem(file: &File) -> bool {
    use std::os::fd::AsRawFd;
    // SAFETY: statfs is plain data (zeroed is valid); fstatfs fills it for an open
    // descriptor.
    let mut fs: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    if unsafe { libc::fstatfs(file.as_raw_fd(), &mut fs) } != 0 {
        return true; // unknown: read, the safe way
    }
    const NETWORK: [i64; 9] = [
        0x6969,      // NFS
        0x517b,      // SMB
        0xfe53_4d42, // SMB2
        0xff53_4d42, // CIFS
        0x6573_5546, // FUSE
        0x00c3_6400, // Ceph
        0x5346_414f, // AFS
        0x0102_1997, // 9P
        0x0bd0_0bd0, // Lustre
    ];
    NETWORK.contains(&(fs.f_type as i64))
}

/// What identifies a file's contents without reading them, as build tools use it:
/// device, inode, size, modification and change times (seconds, nanoseconds).
pub(crate) fn identity(meta: &std::fs::Metadata) -> [u64; 7] {
    [
        meta.dev(),
        meta.ino(),
        meta.size(),
        meta.mtime() as u64,
        meta.mtime_nsec() as u64,
        meta.ctime() as u64,
        meta.ctime_nsec() as u64,
    ]
}

/// Whether `meta` and `again` (the same descriptor's, later) have the same
/// [`identity`].
pub(crate) fn unchanged(meta: &std::fs::Metadata, again: &std::fs::Metadata) -> bool {
    identity(meta) == identity(again)
}

/// Whether `meta`'s file changed within [`crate::RACY`] (or in the future: a clock set
/// back). The kernel's file times advance in ticks: within them, a second change of the
/// file may keep its times.
pub(crate) fn racy(meta: &std::fs::Metadata) -> bool {
    let changed = std::time::SystemTime::UNIX_EPOCH
        + std::time::Duration::new(
            meta.ctime().max(0) as u64,
            meta.ctime_nsec().clamp(0, 999_999_999) as u32,
        );
    std::time::SystemTime::now()
        .duration_since(changed)
        .map_or(true, |age| age < crate::RACY)
}

/// The contents of `path`, read as [`open_regular`] allows.
pub(crate) fn read_regular(path: &Path, links: Links, limit: u64) -> Result<Vec<u8>, ReadRefusal> {
    let (file, meta) = open_regular(path, links, limit)?;
    read_checked(&file, &meta, limit)
}

/// The contents of a file [`open_regular`] opened and `fstat`ed as `meta`.
pub(crate) fn read_checked(
    file: &File,
    meta: &std::fs::Metadata,
    limit: u64,
) -> Result<Vec<u8>, ReadRefusal> {
    let size = meta.len();
    // `size <= limit`, and the limit is far below `usize::MAX` on 64-bit hosts; on others a
    // failed conversion only costs the initial capacity.
    let mut bytes = Vec::with_capacity(usize::try_from(size).unwrap_or(0));
    // At most the size fstat gave (plus one byte, to see a file that grew): a file that
    // grows while it is read is not followed past the limit.
    file.take(size.saturating_add(1).min(limit.saturating_add(1)))
        .read_to_end(&mut bytes)?;
    if bytes.len() as u64 > limit {
        return Err(ReadRefusal::TooBig {
            size: bytes.len() as u64,
            limit,
        });
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fifos_devices_links_and_giants_are_refused_without_blocking() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("fifo");
        let status = std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap();
        assert!(status.success());
        assert!(matches!(
            read_regular(&fifo, Links::Refuse, 1 << 20),
            Err(ReadRefusal::NotRegular("a FIFO"))
        ));
        assert!(matches!(
            read_regular(&fifo, Links::Follow, 1 << 20),
            Err(ReadRefusal::NotRegular("a FIFO"))
        ));
        let zero = dir.path().join("zero");
        std::os::unix::fs::symlink("/dev/zero", &zero).unwrap();
        assert!(matches!(
            read_regular(&zero, Links::Refuse, 1 << 20),
            Err(ReadRefusal::Link)
        ));
        assert!(matches!(
            read_regular(&zero, Links::Follow, 1 << 20),
            Err(ReadRefusal::NotRegular("a character device"))
        ));
        let giant = dir.path().join("giant");
        File::create(&giant).unwrap().set_len(3 << 30).unwrap();
        assert!(matches!(
            read_regular(&giant, Links::Refuse, 1 << 20),
            Err(ReadRefusal::TooBig { size, .. }) if size == 3 << 30
        ));
        assert!(matches!(
            read_regular(&dir.path().join("none"), Links::Refuse, 1),
            Err(ReadRefusal::Missing)
        ));
        let small = dir.path().join("small");
        std::fs::write(&small, b"abc").unwrap();
        assert_eq!(read_regular(&small, Links::Refuse, 3).unwrap(), b"abc");
        assert!(matches!(
            read_regular(&small, Links::Refuse, 2),
            Err(ReadRefusal::TooBig { size: 3, limit: 2 })
        ));
    }
}
