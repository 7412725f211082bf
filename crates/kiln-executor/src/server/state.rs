//! What a connection created in this process (reservations, libraries, unwind
//! registrations, exports), each address a request names checked against it.

use super::*;

pub(super) struct Library(pub(super) *mut c_void);

/// Everything a connection created, released when it ends.
pub(super) struct State {
    pub(super) mapper: Result<DualMappedMapper, String>,
    pub(super) reservations: HashMap<u64, Reservation>,
    /// Pages of each reservation not prepared (inaccessible in the target view).
    pub(super) unprepared: HashMap<u64, kiln_memory::PageRuns>,
    pub(super) next_handle: u64,
    pub(super) libraries: HashMap<u64, Library>,
    pub(super) library_paths: HashMap<String, u64>,
    pub(super) eh_frames: HashMap<u64, EhFrameRegistration>,
    /// Whether descriptors can be sent to the controller (a Unix socket).
    pub(super) can_pass_fds: bool,
    /// Objects of exported definitions, by the handle given to the controller.
    pub(super) exports: HashMap<u64, runtime::Exports>,
    pub(super) next_export: u64,
    /// Each stub slot `StoreCodePointer` stored, with the epoch of its last store: a
    /// stub's resolution asked before that store and answered after it is older than the
    /// slot, and is not stored (the controller computes an answer from the body current
    /// then; a swap may store a newer body before the answer arrives).
    pub(super) slot_stores: HashMap<u64, u64>,
}

impl State {
    pub(super) fn new() -> Self {
        State {
            mapper: DualMappedMapper::new().map_err(|e| e.to_string()),
            reservations: HashMap::new(),
            unprepared: HashMap::new(),
            next_handle: 1,
            libraries: HashMap::new(),
            library_paths: HashMap::new(),
            eh_frames: HashMap::new(),
            can_pass_fds: false,
            exports: HashMap::new(),
            next_export: 1,
            slot_stores: HashMap::new(),
        }
    }

    pub(super) fn mapper(&self) -> Result<&DualMappedMapper, String> {
        self.mapper
            .as_ref()
            .map_err(|e| format!("this executor cannot make executable shared memory: {e}"))
    }

    pub(super) fn reservation(&self, handle: u64) -> Result<&Reservation, String> {
        self.reservations
            .get(&handle)
            .ok_or_else(|| format!("no reservation with handle {handle}"))
    }

    /// Checks `[address, address + len)` lies inside reservation `handle`.
    pub(super) fn checked(
        &self,
        handle: u64,
        address: u64,
        len: u64,
    ) -> Result<&Reservation, String> {
        let r = self.reservation(handle)?;
        if !r.contains(address, len) {
            return Err(format!(
                "range {address:#x}+{len:#x} is outside reservation {handle} ({:#x}..{:#x})",
                r.target,
                r.target_end()
            ));
        }
        Ok(r)
    }

    /// The `dlopen` handle of library `id` (null, meaning the whole process, for 0).
    pub(super) fn library(&self, id: u64) -> Result<*mut c_void, String> {
        if id == 0 {
            return Ok(std::ptr::null_mut());
        }
        self.libraries
            .get(&id)
            .map(|l| l.0)
            .ok_or_else(|| format!("no library with handle {id}"))
    }

    pub(super) fn unprepared_mut(&mut self, handle: u64) -> &mut kiln_memory::PageRuns {
        let r = self.reservations.get(&handle).copied();
        self.unprepared.entry(handle).or_insert_with(|| match r {
            Some(r) => kiln_memory::PageRuns::new(r.target, r.target_end()),
            None => kiln_memory::PageRuns::default(),
        })
    }

    /// The reservation holding `[address, address + len)` on prepared (accessible) pages.
    pub(super) fn accessible(&self, address: u64, len: u64) -> Result<&Reservation, String> {
        let end = address
            .checked_add(len.max(1))
            .ok_or("address range overflows")?;
        for (&handle, r) in &self.reservations {
            if r.contains(address, len.max(1)) {
                let page = self.mapper()?.page_size();
                let start = address & !(page - 1);
                let stop = end.next_multiple_of(page);
                let prepared = self
                    .unprepared
                    .get(&handle)
                    .is_some_and(|u| u.is_disjoint(start, stop));
                return if prepared {
                    Ok(r)
                } else {
                    Err(format!("address {address:#x} is on pages not prepared"))
                };
            }
        }
        Err(format!(
            "address {address:#x} is not in memory this executor reserved"
        ))
    }

    /// Checks a code address lies in some reservation, on prepared pages.
    pub(super) fn code(&self, address: u64) -> Result<(), String> {
        self.accessible(address, 1).map(|_| ())
    }

    /// Checks `.eh_frame` data at `address`: a chain of length-prefixed records on one
    /// reservation's prepared pages, ending in a zero terminator — what
    /// `__register_frame` will walk.
    pub(super) fn check_eh_frame(&self, address: u64) -> Result<(), String> {
        let r = self.accessible(address, 4)?;
        let mut at = address;
        for _ in 0..(1 << 22) {
            if !r.contains(at, 4) {
                return Err(format!(
                    "eh_frame at {address:#x} runs past its reservation"
                ));
            }
            let word = r
                .working_address(at)
                .ok_or("eh_frame outside its reservation")?;
            // SAFETY: 4 bytes inside the reservation (checked), read through the working
            // view this executor maps read-write over the whole reservation.
            let len = unsafe { std::ptr::read_unaligned(word.cast::<u32>()) };
            if len == 0 {
                // The unwinder will read everything up to the terminator: all of it must
                // be on prepared pages.
                self.accessible(address, at + 4 - address)?;
                let start = r
                    .working_address(address)
                    .ok_or("eh_frame outside its reservation")?;
                // SAFETY: `[address, at)` lies on prepared pages of this reservation
                // (checked above), read through the working view, which this executor maps
                // read-write for the reservation's life; nothing writes it during the check.
                let bytes = unsafe { std::slice::from_raw_parts(start, (at - address) as usize) };
                return self.check_eh_frame_records(address, bytes);
            }
            if len == u32::MAX {
                return Err("64-bit eh_frame records are not accepted".into());
            }
            at = at
                .checked_add(4 + u64::from(len))
                .ok_or("eh_frame record overflows")?;
        }
        Err("eh_frame has too many records".into())
    }

    /// Parses every CIE and FDE of `.eh_frame` data (`bytes`, at target `address`)
    /// before the unwinder sees it (the record structure, the pointer encodings and the
    /// call-frame instructions must parse: [`super::eh_frame::check_records`]), and every
    /// FDE's code range must be a forward range on this executor's prepared pages.
    pub(super) fn check_eh_frame_records(&self, address: u64, bytes: &[u8]) -> Result<(), String> {
        // The FDEs' code ranges, checked as one span when they share a reservation's
        // prepared pages (the usual case: one module's code), else one by one.
        let ranges = super::eh_frame::check_records(address, bytes)?;
        let low = ranges.iter().map(|&(s, _)| s).min();
        let high = ranges.iter().map(|&(s, l)| s + l).max();
        if let (Some(low), Some(high)) = (low, high) {
            if self.accessible(low, high - low).is_ok() {
                return Ok(());
            }
        }
        for (start, len) in ranges {
            self.accessible(start, len).map_err(|e| {
                format!(
                    "eh_frame at {address:#x}: FDE range {start:#x}..{:#x}: {e}",
                    start + len
                )
            })?;
        }
        Ok(())
    }

    pub(super) fn pages(&self, handle: u64, start: u64, end: u64) -> Result<&Reservation, String> {
        let page = self.mapper()?.page_size();
        if start >= end || start % page != 0 || end % page != 0 {
            return Err(format!(
                "page range {start:#x}..{end:#x} is empty or not page aligned"
            ));
        }
        self.checked(handle, start, end - start)
    }
}

impl Drop for State {
    fn drop(&mut self) {
        // Perf records copy code from the reservations: written before they go.
        kiln_runtime::debug_outputs::flush();
        self.eh_frames.clear();
        if let Ok(mapper) = &self.mapper {
            for (_, r) in self.reservations.drain() {
                // SAFETY: the connection that used the reservation is gone, and with it
                // every request that could run code in it; released once.
                let _ = unsafe { mapper.release(&r) };
            }
        }
    }
}

pub(super) fn permission(p: u8) -> Permission {
    match p {
        0 => Permission::ReadExecute,
        1 => Permission::Read,
        _ => Permission::ReadWrite,
    }
}
