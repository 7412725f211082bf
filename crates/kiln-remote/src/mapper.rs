//! Mappers that place code in an executor process: through shared memory (the executor's
//! memfd, passed over the Unix socket and mapped writable here, so the linker writes the
//! code straight into it) or by copying bytes over the connection (TCP).

use crate::controller::{RemoteError, RemoteExecutor};
use crate::protocol::{Request, Response, WirePlacement, WireSegment};
use kiln_memory::{Mapper, MapperError, Permission, Placement, Reservation, SegmentRange};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::Arc;

fn refused(operation: &'static str, e: RemoteError) -> MapperError {
    MapperError::Refused {
        operation,
        reason: e.to_string(),
    }
}

fn wire_placement(p: &Placement) -> WirePlacement {
    match *p {
        Placement::Anywhere => WirePlacement::Anywhere,
        Placement::HostLibraries => WirePlacement::HostLibraries,
        Placement::Near { start, end } => WirePlacement::Near(start, end),
        Placement::Low2GiB => WirePlacement::Low2GiB,
    }
}

fn wire_permission(p: Permission) -> u8 {
    p.index() as u8
}

fn expect_ok(operation: &'static str, r: Result<Response, RemoteError>) -> Result<(), MapperError> {
    match r {
        Ok(Response::Ok) => Ok(()),
        Ok(other) => Err(MapperError::Refused {
            operation,
            reason: format!("unexpected answer {other:?}"),
        }),
        Err(e) => Err(refused(operation, e)),
    }
}

/// A local mapping this side owns (the shared view or the shadow).
struct LocalView {
    address: u64,
    len: u64,
    /// The memfd the shared view maps (kept open with it; `None` for a shadow).
    fd: Option<OwnedFd>,
}

impl Drop for LocalView {
    fn drop(&mut self) {
        // SAFETY: a mapping this mapper created for one reservation; it is dropped when the
        // reservation is released, after which nothing uses its working view.
        unsafe { libc::munmap(self.address as *mut libc::c_void, self.len as usize) };
    }
}

fn map_local(len: u64, fd: Option<&OwnedFd>) -> Result<u64, MapperError> {
    let (flags, raw) = match fd {
        Some(fd) => (libc::MAP_SHARED, fd.as_raw_fd()),
        None => (
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
        ),
    };
    // SAFETY: a fresh mapping chosen by the kernel; touches no existing memory.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len as usize,
            libc::PROT_READ | libc::PROT_WRITE,
            flags,
            raw,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(MapperError::last_os_error("mmap (working view)", 0, len));
    }
    Ok(p as u64)
}

/// What both remote mappers share: the connection and this side's views of each
/// reservation (the shared memfd mapped writable, or a private shadow).
struct RemoteViews {
    executor: Arc<RemoteExecutor>,
    views: Mutex<HashMap<u64, LocalView>>,
}

impl RemoteViews {
    /// Copies file bytes straight into a reservation's memfd (`sendfile`: page cache to
    /// shared memory in the kernel, no page of either faulted in here); `Ok(false)` for a
    /// reservation with no memfd (the copy transport's shadow) or a kernel that cannot.
    fn copy_from_file(
        &self,
        r: &Reservation,
        start: u64,
        file: &std::fs::File,
        offset: u64,
        len: u64,
    ) -> Result<bool, MapperError> {
        use std::os::fd::AsRawFd;
        if !r.contains(start, len) {
            return Err(MapperError::Refused {
                operation: "copy from file",
                reason: format!("{len:#x} bytes at {start:#x} are outside the reservation"),
            });
        }
        // Held while the memfd's file position is set and used: the position is its
        // open file description's, one for every copy.
        let views = self.views.lock();
        let Some(memfd) = views.get(&r.handle).and_then(|v| v.fd.as_ref()) else {
            return Ok(false);
        };
        let os = |operation: &'static str| MapperError::last_os_error(operation, start, len);
        let position = (start - r.target) as libc::off_t;
        // SAFETY: repositions the memfd this view holds; no memory is touched.
        if unsafe { libc::lseek(memfd.as_raw_fd(), position, libc::SEEK_SET) } != position {
            return Err(os("lseek (memfd)"));
        }
        let mut from = offset as libc::off_t;
        let mut left = len;
        while left > 0 {
            // SAFETY: copies between two descriptors this process holds, from `from` in
            // `file` to the memfd's position (set above, inside the reservation: checked).
            let n = unsafe {
                libc::sendfile(
                    memfd.as_raw_fd(),
                    file.as_raw_fd(),
                    &mut from,
                    left as usize,
                )
            };
            match n {
                n if n > 0 => left -= n as u64,
                // Nothing copied yet and a kernel or file that cannot: the caller copies.
                n if n < 0 && left == len => {
                    let e = std::io::Error::last_os_error().raw_os_error();
                    if matches!(e, Some(libc::EINVAL | libc::ENOSYS | libc::EOPNOTSUPP)) {
                        return Ok(false);
                    }
                    return Err(os("sendfile (image to memfd)"));
                }
                0 => {
                    return Err(MapperError::Refused {
                        operation: "copy from file",
                        reason: format!("the file ended {left:#x} bytes short"),
                    })
                }
                _ => return Err(os("sendfile (image to memfd)")),
            }
        }
        Ok(true)
    }

    fn new(executor: Arc<RemoteExecutor>) -> Self {
        RemoteViews {
            executor,
            views: Mutex::new(HashMap::new()),
        }
    }

    /// Reserves in the executor; with `share`, maps the memfd it sends, else a shadow.
    fn reserve(
        &self,
        len: u64,
        placement: &Placement,
        share: bool,
    ) -> Result<Reservation, MapperError> {
        let request = Request::Reserve {
            len,
            placement: wire_placement(placement),
            share,
        };
        let (response, fd) = self
            .executor
            .request_with_fd(&request)
            .map_err(|e| refused("reserve", e))?;
        let Response::Reserved { target, handle } = response else {
            return Err(MapperError::Refused {
                operation: "reserve",
                reason: format!("unexpected answer {response:?}"),
            });
        };
        let release = |why: String| {
            let _ = self.executor.request(&Request::Release { handle });
            MapperError::Refused {
                operation: "reserve",
                reason: why,
            }
        };
        let fd = match (share, fd) {
            (true, None) => return Err(release("the executor sent no memory descriptor".into())),
            (true, fd) => fd,
            (false, _) => None,
        };
        let working = map_local(len, fd.as_ref()).map_err(|e| release(e.to_string()))?;
        self.views.lock().insert(
            handle,
            LocalView {
                address: working,
                len,
                fd,
            },
        );
        Ok(Reservation {
            target,
            len,
            working: working as *mut u8,
            handle,
        })
    }

    fn prepare(
        &self,
        r: &Reservation,
        start: u64,
        end: u64,
        permission: Permission,
    ) -> Result<(), MapperError> {
        expect_ok(
            "prepare",
            self.executor.request(&Request::Prepare {
                handle: r.handle,
                start,
                end,
                permission: wire_permission(permission),
            }),
        )
    }

    fn initialize(&self, r: &Reservation, segments: &[SegmentRange]) -> Result<(), MapperError> {
        let segments: Vec<WireSegment> = segments
            .iter()
            .map(|s| (s.target, s.len, wire_permission(s.permission)))
            .collect();
        expect_ok(
            "initialize",
            self.executor.request(&Request::Initialize {
                handle: r.handle,
                segments,
            }),
        )
    }

    fn deinitialize(&self, r: &Reservation, start: u64, end: u64) -> Result<(), MapperError> {
        expect_ok(
            "deinitialize",
            self.executor.request(&Request::Deinitialize {
                handle: r.handle,
                start,
                end,
            }),
        )
    }

    fn release(&self, r: &Reservation) -> Result<(), MapperError> {
        self.views.lock().remove(&r.handle);
        expect_ok(
            "release",
            self.executor
                .request(&Request::Release { handle: r.handle }),
        )
    }
}

/// The shared-memory mapper: the executor maps its memfd read-execute / read-only at the
/// addresses it reserved; this process maps the same pages writable. No code byte crosses
/// the socket.
pub struct SharedMemoryMapper {
    remote: RemoteViews,
    shares_pages: bool,
}

impl std::fmt::Debug for SharedMemoryMapper {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedMemoryMapper")
            .field("executor", &self.remote.executor)
            .finish()
    }
}

impl SharedMemoryMapper {
    /// A mapper for `executor` (connected by a Unix socket).
    pub fn new(executor: Arc<RemoteExecutor>) -> Result<Self, RemoteError> {
        if !executor.can_share_memory() {
            return Err(RemoteError::Start(
                "shared memory needs a Unix socket to the executor; use the copy transport over TCP".into(),
            ));
        }
        Ok(SharedMemoryMapper {
            remote: RemoteViews::new(executor),
            shares_pages: true,
        })
    }

    /// As [`CopyMapper::with_shared_pages`].
    pub fn with_shared_pages(mut self, shares: bool) -> Self {
        self.shares_pages = shares;
        self
    }
}

// SAFETY: the working view is a shared mapping of the executor's memfd made here in
// `reserve` and unmapped only in `release`; the memfd is never truncated, so the pages stay
// valid; only the allocator's owner of a range writes it.
unsafe impl Mapper for SharedMemoryMapper {
    fn name(&self) -> &'static str {
        "shared-memory"
    }

    fn page_size(&self) -> u64 {
        self.remote.executor.hello().page_size
    }

    fn shares_pages(&self) -> bool {
        self.shares_pages
    }

    fn reserve(&self, len: u64, placement: &Placement) -> Result<Reservation, MapperError> {
        self.remote.reserve(len, placement, true)
    }

    unsafe fn prepare(
        &self,
        r: &Reservation,
        start: u64,
        end: u64,
        permission: Permission,
    ) -> Result<(), MapperError> {
        self.remote.prepare(r, start, end, permission)
    }

    unsafe fn copy_from_file(
        &self,
        r: &Reservation,
        start: u64,
        file: &std::fs::File,
        offset: u64,
        len: u64,
    ) -> Result<bool, MapperError> {
        self.remote.copy_from_file(r, start, file, offset, len)
    }

    fn populate(&self, r: &Reservation, start: u64, end: u64) {
        // This side writes the pages: back them and map them here in one call rather
        // than a page fault per page (Linux 5.14+; older kernels just fault).
        if let Some(working) = r
            .working_address(start)
            .filter(|_| r.contains(start, end.saturating_sub(start)))
        {
            const MADV_POPULATE_WRITE: libc::c_int = 23;
            // SAFETY: populating changes no contents or permissions; the range lies in
            // this reservation's working view (checked).
            unsafe { libc::madvise(working.cast(), (end - start) as usize, MADV_POPULATE_WRITE) };
        }
    }

    unsafe fn initialize(
        &self,
        r: &Reservation,
        segments: &[SegmentRange],
    ) -> Result<(), MapperError> {
        self.remote.initialize(r, segments)
    }

    unsafe fn deinitialize(
        &self,
        r: &Reservation,
        start: u64,
        end: u64,
        _p: Permission,
    ) -> Result<(), MapperError> {
        self.remote.deinitialize(r, start, end)
    }

    unsafe fn release(&self, r: &Reservation) -> Result<(), MapperError> {
        self.remote.release(r)
    }

    fn resident_bytes(&self, _r: &Reservation) -> Option<u64> {
        None
    }

    /// The code runs in the executor, which keeps its instruction cache coherent.
    fn target_is_local(&self) -> bool {
        false
    }
}

/// The copy mapper: the linker writes into a local shadow; at initialize the segments'
/// bytes travel over the connection and the executor writes them (through its own
/// writable view) before making them runnable. Works over TCP, across machines.
pub struct CopyMapper {
    remote: RemoteViews,
    shares_pages: bool,
}

impl std::fmt::Debug for CopyMapper {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CopyMapper")
            .field("executor", &self.remote.executor)
            .finish()
    }
}

impl CopyMapper {
    /// A mapper for `executor`.
    pub fn new(executor: Arc<RemoteExecutor>) -> Self {
        CopyMapper {
            remote: RemoteViews::new(executor),
            shares_pages: true,
        }
    }

    /// Whether code and constants of several allocations may share pages (default: yes).
    /// Off for an executor whose code a debugger may put breakpoints in (its code pages
    /// are private copies once written to: nothing may be added next to such code).
    pub fn with_shared_pages(mut self, shares: bool) -> Self {
        self.shares_pages = shares;
        self
    }
}

// SAFETY: the working view is a private anonymous shadow mapped here in `reserve` and
// unmapped only in `release`; only the allocator's owner of a range writes it.
unsafe impl Mapper for CopyMapper {
    fn name(&self) -> &'static str {
        "copy"
    }

    fn page_size(&self) -> u64 {
        self.remote.executor.hello().page_size
    }

    fn shares_pages(&self) -> bool {
        self.shares_pages
    }

    fn reserve(&self, len: u64, placement: &Placement) -> Result<Reservation, MapperError> {
        self.remote.reserve(len, placement, false)
    }

    unsafe fn prepare(
        &self,
        r: &Reservation,
        start: u64,
        end: u64,
        permission: Permission,
    ) -> Result<(), MapperError> {
        self.remote.prepare(r, start, end, permission)
    }

    unsafe fn initialize(
        &self,
        r: &Reservation,
        segments: &[SegmentRange],
    ) -> Result<(), MapperError> {
        for s in segments {
            let Some(working) = r.working_address(s.target) else {
                return Err(MapperError::Refused {
                    operation: "initialize",
                    reason: format!("segment at {:#x} outside the reservation", s.target),
                });
            };
            // SAFETY: the caller's contract: the segment lies in this reservation's
            // prepared pages, whose shadow is ours and readable.
            let all = unsafe { std::slice::from_raw_parts(working, s.len as usize) };
            // In pieces well under the protocol's frame limit.
            const PIECE: usize = crate::protocol::MAX_WRITE as usize;
            for (i, piece) in all.chunks(PIECE).enumerate() {
                expect_ok(
                    "write",
                    self.remote.executor.request(&Request::Write {
                        handle: r.handle,
                        address: s.target + (i * PIECE) as u64,
                        bytes: piece.to_vec(),
                    }),
                )?;
            }
        }
        self.remote.initialize(r, segments)
    }

    unsafe fn deinitialize(
        &self,
        r: &Reservation,
        start: u64,
        end: u64,
        _p: Permission,
    ) -> Result<(), MapperError> {
        if let Some(shadow) = r.working_address(start) {
            // SAFETY: the caller's contract: no allocation lives in these shadow pages.
            unsafe { libc::madvise(shadow.cast(), (end - start) as usize, libc::MADV_DONTNEED) };
        }
        self.remote.deinitialize(r, start, end)
    }

    unsafe fn release(&self, r: &Reservation) -> Result<(), MapperError> {
        self.remote.release(r)
    }

    fn resident_bytes(&self, _r: &Reservation) -> Option<u64> {
        None
    }

    /// The code runs in the executor, which keeps its instruction cache coherent.
    fn target_is_local(&self) -> bool {
        false
    }
}
