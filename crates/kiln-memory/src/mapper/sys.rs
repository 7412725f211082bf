//! Thin wrappers over the system calls the mappers use. Every raw call of the memory
//! layer is here, so that the mappers read as policy.

use std::ffi::CStr;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// `MFD_EXEC` (Linux 6.3), defined here for libc versions that lack it. Kiln's memfds hold
/// code, so they are created executable on purpose (never `MFD_NOEXEC_SEAL`).
pub(crate) const MFD_EXEC: libc::c_uint = 0x0010;

/// The page size of this machine.
pub(crate) fn page_size() -> u64 {
    // SAFETY: sysconf has no memory-safety preconditions.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    u64::try_from(size).ok().filter(|&s| s > 0).unwrap_or(4096)
}

fn check(ret: libc::c_int) -> io::Result<()> {
    if ret == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Maps `len` bytes. With `fixed`, the mapping must land exactly at that address and must
/// not replace an existing one (`MAP_FIXED_NOREPLACE`; on kernels that ignore the flag a
/// mapping elsewhere is undone and reported as `EEXIST`).
pub(crate) fn mmap(
    fixed: Option<u64>,
    hint: Option<u64>,
    len: u64,
    prot: libc::c_int,
    flags: libc::c_int,
    fd: Option<&OwnedFd>,
) -> io::Result<u64> {
    let len_usize = usize::try_from(len).map_err(|_| io::Error::from_raw_os_error(libc::ENOMEM))?;
    let (addr, flags) = match fixed {
        Some(addr) => (addr as *mut libc::c_void, flags | libc::MAP_FIXED_NOREPLACE),
        None => (hint.unwrap_or(0) as *mut libc::c_void, flags),
    };
    let raw_fd = fd.map_or(-1, |fd| fd.as_raw_fd());
    // SAFETY: without MAP_FIXED the kernel picks an unused range (a hint only guides it); with
    // MAP_FIXED_NOREPLACE it refuses to replace an existing mapping. Either way no memory
    // that Rust code owns is touched.
    let ptr = unsafe { libc::mmap(addr, len_usize, prot, flags, raw_fd, 0) };
    if ptr == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    let got = ptr as u64;
    if let Some(want) = fixed {
        if got != want {
            // SAFETY: the kernel just created this mapping for us; nobody else knows it.
            unsafe { libc::munmap(ptr, len_usize) };
            return Err(io::Error::from_raw_os_error(libc::EEXIST));
        }
    }
    Ok(got)
}

/// Unmaps `[addr, addr + len)`.
///
/// # Safety
/// No live Rust reference may point into the range, and the caller must own it.
pub(crate) unsafe fn munmap(addr: u64, len: u64) -> io::Result<()> {
    // SAFETY: the caller owns the range and no reference points into it.
    check(unsafe { libc::munmap(addr as *mut libc::c_void, len as usize) })
}

/// Changes the protection of `[addr, addr + len)`.
///
/// # Safety
/// The caller must own the range; removing access must not break live references.
pub(crate) unsafe fn mprotect(addr: u64, len: u64, prot: libc::c_int) -> io::Result<()> {
    // SAFETY: the caller owns the range and vouches for the references into it.
    check(unsafe { libc::mprotect(addr as *mut libc::c_void, len as usize, prot) })
}

/// Discards the contents of `[addr, addr + len)` of a private anonymous mapping.
///
/// # Safety
/// The caller must own the range and hold no reference into it.
pub(crate) unsafe fn madvise_dontneed(addr: u64, len: u64) -> io::Result<()> {
    // SAFETY: the caller owns the range and holds no reference into it.
    check(unsafe { libc::madvise(addr as *mut libc::c_void, len as usize, libc::MADV_DONTNEED) })
}

/// Creates an anonymous memory file.
pub(crate) fn memfd_create(name: &CStr, flags: libc::c_uint) -> io::Result<OwnedFd> {
    // SAFETY: `name` is a valid NUL-terminated string.
    let fd = unsafe { libc::memfd_create(name.as_ptr(), flags) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel just returned this descriptor; nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Sets the size of a file.
pub(crate) fn ftruncate(fd: &OwnedFd, len: u64) -> io::Result<()> {
    let len = libc::off_t::try_from(len).map_err(|_| io::Error::from_raw_os_error(libc::EFBIG))?;
    // SAFETY: plain syscall on a descriptor we own.
    check(unsafe { libc::ftruncate(fd.as_raw_fd(), len) })
}

/// Frees the pages backing `[offset, offset + len)` of a file, which then reads as zeros.
pub(crate) fn punch_hole(fd: &OwnedFd, offset: u64, len: u64) -> io::Result<()> {
    // SAFETY: plain syscall on a descriptor we own; the caller holds no reference into
    // the mappings of this range (it only writes them through raw pointers it owns).
    check(unsafe {
        libc::fallocate(
            fd.as_raw_fd(),
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            offset as libc::off_t,
            len as libc::off_t,
        )
    })
}

/// Bytes of a file's backing store that are allocated.
pub(crate) fn allocated_bytes(fd: &OwnedFd) -> io::Result<u64> {
    // SAFETY: `stat` is plain data; zeroed is a valid value.
    let mut stat: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `stat` is a valid out-pointer for fstat.
    check(unsafe { libc::fstat(fd.as_raw_fd(), &mut stat) })?;
    Ok(u64::try_from(stat.st_blocks).unwrap_or(0) * 512)
}

/// Bytes of `[addr, addr + len)` that are resident, by `mincore`.
pub(crate) fn resident_in(addr: u64, len: u64, page: u64) -> io::Result<u64> {
    let pages = len.div_ceil(page) as usize;
    let mut vec = vec![0u8; pages];
    // SAFETY: `vec` has one byte per page of the range, as mincore requires; mincore only
    // reads page-table state.
    check(unsafe { libc::mincore(addr as *mut libc::c_void, len as usize, vec.as_mut_ptr()) })?;
    Ok(vec.iter().filter(|&&b| b & 1 != 0).count() as u64 * page)
}

/// `mmap` protection bits for a final permission.
pub(crate) fn prot_of(permission: crate::Permission) -> libc::c_int {
    match permission {
        crate::Permission::ReadExecute => libc::PROT_READ | libc::PROT_EXEC,
        crate::Permission::Read => libc::PROT_READ,
        crate::Permission::ReadWrite => libc::PROT_READ | libc::PROT_WRITE,
    }
}

/// Populates the page tables of `[addr, addr + len)` (`MADV_POPULATE_WRITE` or `_READ`),
/// backing the pages. Best effort: kernels before 5.14 refuse, and then the pages are
/// faulted in on first touch as usual.
pub(crate) fn populate(addr: u64, len: u64, write: bool) {
    const MADV_POPULATE_READ: libc::c_int = 22;
    const MADV_POPULATE_WRITE: libc::c_int = 23;
    let advice = if write {
        MADV_POPULATE_WRITE
    } else {
        MADV_POPULATE_READ
    };
    // SAFETY: populating changes no contents and no permissions of the range, which the
    // caller owns.
    unsafe { libc::madvise(addr as *mut libc::c_void, len as usize, advice) };
}

/// The next data extent `[data, hole)` of the file `fd` at or after `offset`, below `end`
/// (`lseek(SEEK_DATA)` then `SEEK_HOLE`); `None` past the last one.
pub(crate) fn next_data_extent(fd: RawFd, offset: u64, end: u64) -> io::Result<Option<(u64, u64)>> {
    // SAFETY: plain syscall on a descriptor the caller owns.
    let data = unsafe { libc::lseek(fd, offset as libc::off_t, libc::SEEK_DATA) };
    if data < 0 {
        let e = io::Error::last_os_error();
        return if e.raw_os_error() == Some(libc::ENXIO) {
            Ok(None)
        } else {
            Err(e)
        };
    }
    // SAFETY: as above.
    let hole = unsafe { libc::lseek(fd, data, libc::SEEK_HOLE) };
    if hole < 0 {
        return Err(io::Error::last_os_error());
    }
    let (data, hole) = (data as u64, (hole as u64).min(end));
    Ok((data < hole).then_some((data, hole)))
}

/// Writes all of `bytes` at `offset` of a file.
pub(crate) fn pwrite_all(fd: &OwnedFd, mut bytes: &[u8], mut offset: u64) -> io::Result<()> {
    while !bytes.is_empty() {
        // SAFETY: `bytes` is a valid readable buffer of its length.
        let n = unsafe {
            libc::pwrite(
                fd.as_raw_fd(),
                bytes.as_ptr().cast(),
                bytes.len(),
                offset as libc::off_t,
            )
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if n == 0 {
            return Err(io::Error::from(io::ErrorKind::WriteZero));
        }
        bytes = &bytes[n as usize..];
        offset += n as u64;
    }
    Ok(())
}

/// Maps `len` bytes of `fd` at `offset` exactly at `addr`, replacing what is there
/// (`MAP_FIXED`).
///
/// # Safety
/// The caller must own `[addr, addr + len)` and hold no reference into it that the new
/// contents would invalidate.
pub(crate) unsafe fn mmap_replace(
    addr: u64,
    len: u64,
    prot: libc::c_int,
    flags: libc::c_int,
    fd: &impl AsRawFd,
    offset: u64,
) -> io::Result<()> {
    // SAFETY: the caller owns the range; MAP_FIXED replaces only it.
    let ptr = unsafe {
        libc::mmap(
            addr as *mut libc::c_void,
            len as usize,
            prot,
            flags | libc::MAP_FIXED,
            fd.as_raw_fd(),
            offset as libc::off_t,
        )
    };
    if ptr == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Makes descriptor number `old` refer to what `fresh` refers to (close-on-exec).
pub(crate) fn replace_fd(fresh: &OwnedFd, old: RawFd) -> io::Result<()> {
    // SAFETY: `old` is a descriptor the caller owns; dup3 atomically replaces it.
    let rc = unsafe { libc::dup3(fresh.as_raw_fd(), old, libc::O_CLOEXEC) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}
