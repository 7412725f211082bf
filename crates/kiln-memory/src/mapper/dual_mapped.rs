//! The dual-mapped mapper: each reservation is a memfd mapped twice, a read-write working
//! view and a target view whose pages have their final permission. No page is ever
//! writable and executable in one mapping, and adding code next to running code needs no
//! permission change.

use super::{placement, sys, Mapper, Placement, Reservation, SegmentRange};
use crate::{icache, MapperError, Permission};
use std::collections::HashMap;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::Mutex;

/// The default mapper: a memfd mapped twice, a read-write working view and a target view.
///
/// The memfd is created with `MFD_EXEC` where the kernel knows it (Linux 6.3+), so the
/// kernel does not warn about an executable memfd created without saying so, and with
/// `MFD_CLOEXEC`; it has no name in any file system, so no other process can open it.
#[derive(Debug)]
pub struct DualMappedMapper {
    page: u64,
    memfd_flags: libc::c_uint,
    files: Mutex<HashMap<u64, OwnedFd>>,
    populate: bool,
    private_target: bool,
}

fn os(
    operation: &'static str,
    address: u64,
    len: u64,
) -> impl FnOnce(std::io::Error) -> MapperError {
    move |source| MapperError::Os {
        operation,
        address,
        len,
        source,
    }
}

impl DualMappedMapper {
    /// A dual-mapped mapper, after checking that this kernel lets an executable memfd be
    /// mapped read-execute (it may not: `vm.memfd_noexec = 2`, SELinux `execmem`, a
    /// seccomp filter). The error says why it cannot be used.
    pub fn new() -> Result<Self, MapperError> {
        let page = sys::page_size();
        let memfd_flags = Self::probe_flags()?;
        let mapper = DualMappedMapper {
            page,
            memfd_flags,
            files: Mutex::new(HashMap::new()),
            populate: true,
            private_target: false,
        };
        // Probe: a one-page reservation made executable.
        let probe = mapper.reserve(page, &Placement::Anywhere)?;
        // SAFETY: the probe reservation is this mapper's, fresh and unused; it is released
        // once, right after.
        let result = unsafe {
            mapper.prepare(
                &probe,
                probe.target,
                probe.target + page,
                Permission::ReadExecute,
            )
        };
        // SAFETY: as above.
        unsafe { mapper.release(&probe) }?;
        result?;
        Ok(mapper)
    }

    /// Finds memfd flags this kernel accepts for executable memory.
    fn probe_flags() -> Result<libc::c_uint, MapperError> {
        let base = libc::MFD_CLOEXEC;
        match sys::memfd_create(c"kiln-probe", base | sys::MFD_EXEC) {
            Ok(_) => Ok(base | sys::MFD_EXEC),
            // Kernels before 6.3 reject the unknown flag; they do not warn either.
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                sys::memfd_create(c"kiln-probe", base)
                    .map(|_| base)
                    .map_err(os("memfd_create", 0, 0))
            }
            Err(e) => Err(MapperError::Os {
                operation: "memfd_create(MFD_EXEC)",
                address: 0,
                len: 0,
                source: e,
            }),
        }
    }

    /// Whether [`Mapper::populate`] populates the page tables of both views (the default:
    /// one call instead of a page fault per page and view). An executor whose
    /// pages are written by another process through a shared view turns it off.
    pub fn with_populate(mut self, populate: bool) -> Self {
        self.populate = populate;
        self
    }

    /// Whether the target view is a *private* mapping of the memfd (default: shared),
    /// for a process a debugger may write breakpoints into: the kernel refuses a
    /// debugger's write to a shared read-only page, and copies a private one.
    ///
    /// Only code pages stay private: constants and data pages are mapped shared when they
    /// are prepared (the program writes its data through the target view, the linker the
    /// next module's through the working view). A private code page shows what the working
    /// view writes until a debugger writes to it; so a debuggable mapper does not share
    /// code pages among allocations ([`Mapper::shares_pages`] is `false`: nothing is
    /// written next to code that may hold a breakpoint), and freed pages drop the target
    /// view's copies.
    pub fn with_private_target(mut self, private: bool) -> Self {
        self.private_target = private;
        self
    }

    /// A duplicate of the memfd behind `reservation` (close-on-exec), to share its pages
    /// with another process, which maps it at an address of its own.
    pub fn share(&self, reservation: &Reservation) -> Result<OwnedFd, MapperError> {
        self.with_file(reservation, |fd| fd.try_clone())?
            .map_err(os("dup", reservation.target, reservation.len))
    }

    fn with_file<T>(
        &self,
        reservation: &Reservation,
        f: impl FnOnce(&OwnedFd) -> T,
    ) -> Result<T, MapperError> {
        let files = self.files.lock().unwrap_or_else(|p| p.into_inner());
        match files.get(&reservation.handle) {
            Some(fd) => Ok(f(fd)),
            None => Err(MapperError::Refused {
                operation: "dual-mapped lookup",
                reason: format!(
                    "reservation at {:#x} is not this mapper's",
                    reservation.target
                ),
            }),
        }
    }
}

// SAFETY: the working view is a read-write shared mapping of the reservation's memfd,
// created in reserve and unmapped only in release; nothing but the allocator's owner of a
// range writes through it.
unsafe impl Mapper for DualMappedMapper {
    fn name(&self) -> &'static str {
        "dual-mapped"
    }

    fn page_size(&self) -> u64 {
        self.page
    }

    fn shares_pages(&self) -> bool {
        !self.private_target
    }

    fn reserve(&self, len: u64, placement: &Placement) -> Result<Reservation, MapperError> {
        let fd = sys::memfd_create(c"kiln-code", self.memfd_flags).map_err(os(
            "memfd_create",
            0,
            len,
        ))?;
        sys::ftruncate(&fd, len).map_err(os("ftruncate", 0, len))?;
        let flags = libc::MAP_SHARED | libc::MAP_NORESERVE;
        let target_flags = if self.private_target {
            libc::MAP_PRIVATE | libc::MAP_NORESERVE
        } else {
            flags
        };
        let target = placement::reserve_placed(
            len,
            self.page,
            placement,
            |fixed| sys::mmap(fixed, None, len, libc::PROT_NONE, target_flags, Some(&fd)),
            // SAFETY: a mapping reserve_placed just made and nobody else knows.
            |misplaced| drop(unsafe { sys::munmap(misplaced, len) }),
        )?;
        // The working view goes far (64 GiB) below the target view, so that it does not use
        // up the address space near the host's libraries that the placement needs.
        let hint = target.saturating_sub(1 << 36) & !(self.page - 1);
        let rw = libc::PROT_READ | libc::PROT_WRITE;
        let working = match sys::mmap(None, Some(hint), len, rw, flags, Some(&fd)) {
            Ok(addr) => addr,
            Err(source) => {
                // SAFETY: we just mapped the target view; nobody else knows it.
                let _ = unsafe { sys::munmap(target, len) };
                return Err(MapperError::Os {
                    operation: "mmap (working view)",
                    address: 0,
                    len,
                    source,
                });
            }
        };
        let handle = fd.as_raw_fd() as u64;
        super::fork::register(super::fork::SharedReservation {
            target,
            working,
            len,
            fd: fd.as_raw_fd(),
            memfd_flags: self.memfd_flags,
        });
        self.files
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(handle, fd);
        Ok(Reservation {
            target,
            len,
            working: working as *mut u8,
            handle,
        })
    }

    unsafe fn prepare(
        &self,
        reservation: &Reservation,
        start: u64,
        end: u64,
        permission: Permission,
    ) -> Result<(), MapperError> {
        debug_assert!(reservation.contains(start, end - start));
        if self.private_target && permission != Permission::ReadExecute {
            // Only code is private (for a debugger's breakpoints): constants and data are
            // mapped shared again, so that what the program writes and what is written
            // later through the working view (the next module's data, its GOT) meet in
            // the same pages.
            let offset = start - reservation.target;
            let flags = libc::MAP_SHARED | libc::MAP_NORESERVE;
            self.with_file(reservation, |fd| {
                // SAFETY: the pages are inside our reservation and unused (the caller's
                // contract); MAP_FIXED replaces only them.
                unsafe {
                    sys::mmap_replace(
                        start,
                        end - start,
                        sys::prot_of(permission),
                        flags,
                        fd,
                        offset,
                    )
                }
            })?
            .map_err(os("mmap (shared data pages)", start, end - start))?;
            return Ok(());
        }
        // SAFETY: the pages are inside our reservation and unused; giving the target view
        // its final permission affects no live code.
        unsafe { sys::mprotect(start, end - start, sys::prot_of(permission)) }.map_err(os(
            "mprotect",
            start,
            end - start,
        ))?;
        // Back the pages and map them in both views now, in two calls, rather than in one
        // page fault per page per view later (Linux 5.14+; older kernels just fault).
        Ok(())
    }

    fn populate(&self, reservation: &Reservation, start: u64, end: u64) {
        if self.populate && reservation.contains(start, end.saturating_sub(start)) {
            // The working view only: writing is what allocates the pages (the target
            // view then maps them on its first, cheap, read faults).
            let working = reservation.working as u64 + (start - reservation.target);
            sys::populate(working, end - start, true);
        }
    }

    unsafe fn initialize(
        &self,
        reservation: &Reservation,
        segments: &[SegmentRange],
    ) -> Result<(), MapperError> {
        let mut executable = false;
        for segment in segments.iter().filter(|s| s.permission.is_executable()) {
            debug_assert!(reservation.contains(segment.target, segment.len));
            icache::make_coherent(segment.target, segment.len);
            executable = true;
        }
        if executable {
            icache::synchronize_cores();
        }
        Ok(())
    }

    unsafe fn deinitialize(
        &self,
        reservation: &Reservation,
        start: u64,
        end: u64,
        _permission: Permission,
    ) -> Result<(), MapperError> {
        let len = end - start;
        let offset = start - reservation.target;
        // SAFETY: the allocator hands us only pages no allocation owns; making them
        // inaccessible makes a stale call fault instead of running zeros.
        unsafe { sys::mprotect(start, len, libc::PROT_NONE) }
            .map_err(os("mprotect", start, len))?;
        if self.private_target {
            // Pages a debugger wrote to are private copies: drop them, so that the view
            // shows the file's pages (what the working view writes) again.
            // SAFETY: as above; the pages are inaccessible and unused.
            unsafe { sys::madvise_dontneed(start, len) }.map_err(os("madvise", start, len))?;
        }
        self.with_file(reservation, |fd| sys::punch_hole(fd, offset, len))?
            .map_err(os("fallocate(PUNCH_HOLE)", start, len))
    }

    unsafe fn release(&self, reservation: &Reservation) -> Result<(), MapperError> {
        let fd = self
            .files
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&reservation.handle);
        super::fork::unregister(reservation.target);
        // SAFETY: the caller gives the whole reservation back; no allocation lives in it.
        let target = unsafe { sys::munmap(reservation.target, reservation.len) };
        // SAFETY: as above, for the working view.
        let working = unsafe { sys::munmap(reservation.working as u64, reservation.len) };
        drop(fd);
        target.map_err(os("munmap", reservation.target, reservation.len))?;
        working.map_err(os(
            "munmap (working view)",
            reservation.working as u64,
            reservation.len,
        ))
    }

    fn resident_bytes(&self, reservation: &Reservation) -> Option<u64> {
        self.with_file(reservation, sys::allocated_bytes).ok()?.ok()
    }
}
