//! Fork safety of shared mappings.
//!
//! A dual-mapped reservation is a memfd mapped `MAP_SHARED` twice. `fork()` keeps shared
//! mappings shared: without care, a child process writes the parent's JIT data (a forked
//! CPython's child overwrote the parent's interpreter state), and a child that frees or
//! links a module poisons or overwrites code the parent is running. A native program's
//! data and code are private copies in the child; Kiln's must be too.
//!
//! So every live dual-mapped reservation is recorded here, and a `pthread_atfork` child
//! handler gives the child its own copy of each: a fresh memfd holding the same bytes
//! (copied extent by extent, holes stay holes), mapped over both views at the same
//! addresses with the same protections, under the old descriptor number. Addresses,
//! handles and the allocator's state stay valid; only the sharing with the parent ends.
//! The copy costs one pass over the populated pages, in the child only.
//!
//! The copy must be what the memory held at the moment of `fork()`, so the parent waits
//! (in its own `pthread_atfork` handler, before any other code of its runs) until the child
//! has taken it: a pipe made in the prepare handler carries one byte from the child when
//! its copy is done, or end-of-file if the child died first. Without the wait the parent
//! went on writing (a forked CPython's parent releases its GIL and clears its thread
//! state right away) and the child copied the parent's later state.
//!
//! Only the forking thread waits: in a parent whose *other* threads write JIT data while
//! it forks, the child's copy may catch their writes half done — as a child may see a
//! half-done write to any shared memory. The wait is bounded (10 s): a child stuck in an
//! earlier fork handler does not hang the parent.

use super::sys;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::Once;

/// A dual-mapped reservation, as the child handler needs it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SharedReservation {
    pub(crate) target: u64,
    pub(crate) working: u64,
    pub(crate) len: u64,
    pub(crate) fd: RawFd,
    pub(crate) memfd_flags: libc::c_uint,
}

/// The live reservations. Locked by the prepare handler across `fork()`, so that the
/// child never sees it half-updated.
static LIVE: parking_lot::Mutex<Vec<SharedReservation>> = parking_lot::const_mutex(Vec::new());

static HANDLERS: Once = Once::new();

/// The pipe of one fork (read end, write end), -1 when there is nothing to copy.
static COPIED_READ: AtomicI32 = AtomicI32::new(-1);
static COPIED_WRITE: AtomicI32 = AtomicI32::new(-1);

extern "C" fn prepare() {
    // Held across fork; released in both processes by the handlers below.
    let live = LIVE.lock();
    let mut fds = [-1; 2];
    // SAFETY: pipe2 writes two descriptors into `fds`.
    if !live.is_empty() && unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } == 0 {
        COPIED_READ.store(fds[0], Ordering::Relaxed);
        COPIED_WRITE.store(fds[1], Ordering::Relaxed);
    }
    std::mem::forget(live);
}

extern "C" fn parent() {
    let (read, write) = (
        COPIED_READ.swap(-1, Ordering::Relaxed),
        COPIED_WRITE.swap(-1, Ordering::Relaxed),
    );
    if read >= 0 {
        // SAFETY: our descriptors from `prepare`; the child holds its own write end, so
        // the pipe becomes readable with its byte, or at end-of-file when it exits (or fork
        // failed and no child holds it); at most 10 s.
        unsafe {
            libc::close(write);
            let mut fds = libc::pollfd {
                fd: read,
                events: libc::POLLIN,
                revents: 0,
            };
            while libc::poll(&mut fds, 1, 10_000) < 0
                && std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted
            {
            }
            libc::close(read);
        }
    }
    // SAFETY: `prepare` locked it in this thread and forgot the guard.
    unsafe { LIVE.force_unlock() };
}

extern "C" fn child() {
    // SAFETY: `prepare` locked the mutex before fork; the child is single-threaded now, so
    // this thread is its only user.
    let live = unsafe { &*LIVE.data_ptr() };
    let (read, write) = (
        COPIED_READ.swap(-1, Ordering::Relaxed),
        COPIED_WRITE.swap(-1, Ordering::Relaxed),
    );
    if read >= 0 {
        // SAFETY: the child's copy of the read end, unused here.
        unsafe { libc::close(read) };
    }
    for reservation in live {
        if let Err(error) = privatize(reservation) {
            // Nothing sensible can run on with JIT memory shared with the parent: say why
            // and stop the child (it has not run any JIT code of its own yet).
            eprintln!(
                "kiln: fork: cannot give the child its own copy of JIT memory at {:#x} ({} bytes): {error}",
                reservation.target, reservation.len
            );
            // SAFETY: _exit ends the child without running the parent's exit handlers.
            unsafe { libc::_exit(127) };
        }
    }
    if write >= 0 {
        // SAFETY: our descriptor; one byte tells the parent the copy is taken.
        unsafe {
            libc::write(write, b"k".as_ptr().cast(), 1);
            libc::close(write);
        }
    }
    // SAFETY: as in `parent`.
    unsafe { LIVE.force_unlock() };
}

/// Records a reservation (and installs the fork handlers on first use).
pub(crate) fn register(reservation: SharedReservation) {
    HANDLERS.call_once(|| {
        // SAFETY: the three handlers are `extern "C" fn()` that live for the whole process.
        let rc = unsafe { libc::pthread_atfork(Some(prepare), Some(parent), Some(child)) };
        if rc != 0 {
            tracing::warn!(
                rc,
                "pthread_atfork failed: a forked child would share JIT memory"
            );
        }
    });
    LIVE.lock().push(reservation);
}

/// Forgets a reservation (before it is unmapped).
pub(crate) fn unregister(target: u64) {
    LIVE.lock().retain(|r| r.target != target);
}

/// Protections of the mappings of `[start, end)`, from `/proc/self/maps`.
fn protections(start: u64, end: u64) -> std::io::Result<Vec<(u64, u64, libc::c_int)>> {
    let maps = std::fs::read_to_string("/proc/self/maps")?;
    let mut out = Vec::new();
    for line in maps.lines() {
        let mut fields = line.split_whitespace();
        let (Some(range), Some(perms)) = (fields.next(), fields.next()) else {
            continue;
        };
        let Some((a, b)) = range.split_once('-') else {
            continue;
        };
        let (Ok(a), Ok(b)) = (u64::from_str_radix(a, 16), u64::from_str_radix(b, 16)) else {
            continue;
        };
        let (a, b) = (a.max(start), b.min(end));
        if a >= b {
            continue;
        }
        let p = perms.as_bytes();
        let mut prot = libc::PROT_NONE;
        if p.first() == Some(&b'r') {
            prot |= libc::PROT_READ;
        }
        if p.get(1) == Some(&b'w') {
            prot |= libc::PROT_WRITE;
        }
        if p.get(2) == Some(&b'x') {
            prot |= libc::PROT_EXEC;
        }
        out.push((a, b, prot));
    }
    Ok(out)
}

/// Gives this process its own copy of `r` (see the module documentation).
fn privatize(r: &SharedReservation) -> std::io::Result<()> {
    let fresh = sys::memfd_create(c"kiln-code", r.memfd_flags)?;
    sys::ftruncate(&fresh, r.len)?;
    // Copy the data extents through the (still shared) working view.
    let mut offset = 0u64;
    while offset < r.len {
        let Some((data, hole)) = sys::next_data_extent(r.fd, offset, r.len)? else {
            break;
        };
        // SAFETY: `[working + data, working + hole)` lies inside the working view, which is
        // mapped readable for the reservation's whole life.
        let bytes = unsafe {
            std::slice::from_raw_parts((r.working + data) as *const u8, (hole - data) as usize)
        };
        sys::pwrite_all(&fresh, bytes, data)?;
        offset = hole;
    }
    let target_views = protections(r.target, r.target + r.len)?;
    let flags = libc::MAP_SHARED | libc::MAP_NORESERVE;
    // SAFETY: the working view is this reservation's and is replaced by a mapping of the
    // same bytes at the same address; no other thread runs in the child.
    unsafe {
        sys::mmap_replace(
            r.working,
            r.len,
            libc::PROT_READ | libc::PROT_WRITE,
            flags,
            &fresh,
            0,
        )
    }?;
    for (a, b, prot) in target_views {
        // SAFETY: as above, for each piece of the target view, with its protection.
        unsafe { sys::mmap_replace(a, b - a, prot, flags, &fresh, a - r.target) }?;
    }
    // The old descriptor number now names the child's own memfd.
    sys::replace_fd(&fresh, r.fd)
}
