//! A memory manager made of C callbacks, each optional, each able to call Kiln's default.

use crate::error::kiln_error;
use kiln_memory::{
    AllocationRequest, FinalizedBackend, InFlightAllocation, InFlightBackend, MemoryError,
    MemoryManager, Permission, SegmentRange, SegmentRequest, SlabMemoryManager, WorkingSegment,
};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::ffi::{c_int, c_void};
use std::sync::Arc;

/// A segment's final permission.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum kiln_permission {
    /// Code.
    KILN_PERMISSION_READ_EXECUTE = 0,
    /// Constants.
    KILN_PERMISSION_READ = 1,
    /// Data.
    KILN_PERMISSION_READ_WRITE = 2,
}

impl From<Permission> for kiln_permission {
    fn from(p: Permission) -> Self {
        match p {
            Permission::ReadExecute => kiln_permission::KILN_PERMISSION_READ_EXECUTE,
            Permission::Read => kiln_permission::KILN_PERMISSION_READ,
            Permission::ReadWrite => kiln_permission::KILN_PERMISSION_READ_WRITE,
        }
    }
}

/// One segment of an allocation: what Kiln asks for (`size`, `align`, `permission`,
/// `zero_fill`) and where the allocator put it (`target`, `working`).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct kiln_segment {
    /// In: bytes needed (may be 0).
    pub size: u64,
    /// In: alignment of `target` (a power of two).
    pub align: u64,
    /// In: the permission the segment gets at finalize (a `kiln_permission` value).
    pub permission: u32,
    /// In: whether the segment must start zeroed (`.bss`); Kiln zeroes `working` itself
    /// after `allocate` returns, so an allocator need not.
    pub zero_fill: c_int,
    /// Out: the address the code will run at (in the process that runs it).
    pub target: u64,
    /// Out: where Kiln writes the segment's bytes in this process, `size` bytes writable
    /// until finalize (may be `target` itself, or a second view of the same memory).
    pub working: *mut c_void,
}

/// Kiln's own memory manager, handed to every callback so that it can call the default
/// (`kiln_default_*`).
pub struct kiln_default_memory {
    manager: SlabMemoryManager,
    /// Allocations made by the default, by handle.
    live: Mutex<HashMap<usize, DefaultAllocation>>,
}

enum DefaultAllocation {
    InFlight(InFlightAllocation),
    /// Its finalize failed and its memory is gone; the handle stays reserved until
    /// `kiln_default_free`, so that it is never reused while someone may still free it.
    Failed,
    /// Held for its drop, which frees the memory.
    Finalized(#[allow(dead_code)] kiln_memory::FinalizedAllocation),
}

/// Memory callbacks. Every callback is optional: NULL means Kiln's default. A supplied
/// callback may call the default through the `kiln_default_memory` it is given.
///
/// Contract of each callback (what Kiln relies on, no more):
/// - `allocate(context, dflt, segments, count, &allocation)`: fill every segment's
///   `target` (aligned to its `align`) and `working` (`size` writable bytes, not
///   overlapping another segment's); set `*allocation` to a handle of yours (anything but
///   NULL); return 0, or non-zero to fail the link with `KILN_ERR_MEMORY`. The segments of
///   one allocation are one module's: code and data referring to each other, so for PIE
///   code they must lie within ±2 GiB of each other (and of the process's libraries, for
///   code that calls them directly).
/// - `finalize(context, dflt, allocation, segments, count)`: Kiln has written every
///   segment; make each `target` range readable with its permission (executable for
///   code), the instruction cache coherent, and `working` no longer needed; return 0 or
///   non-zero (the link fails, and `free` is called).
/// - `free(context, dflt, allocation, segments, count)`: the allocation's code will not
///   run again (or it was never finalized): release it.
/// - `destroy(context)`: the session is disposed and every allocation freed; or the
///   session could not be made (`destroy` is called exactly once either way).
///
/// Callbacks may be called from several threads at once (links into different libraries
/// run in parallel). The default guarantees: `kiln_default_allocate` fills the segments
/// as `allocate` must (dual-mapped: `working` differs from `target`, and no page is ever
/// writable and executable at once) and returns a handle that only `kiln_default_finalize`
/// and `kiln_default_free` accept; with `finalize` or `free` NULL, an allocation made by
/// the default is finalized or freed by the default, one made by a supplied `allocate`
/// is an error at finalize (so supply both or neither).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct kiln_memory_callbacks {
    /// Passed to every callback.
    pub context: *mut c_void,
    /// See the struct's documentation.
    pub allocate: Option<
        unsafe extern "C" fn(
            context: *mut c_void,
            dflt: *mut kiln_default_memory,
            segments: *mut kiln_segment,
            count: usize,
            allocation: *mut *mut c_void,
        ) -> c_int,
    >,
    /// See the struct's documentation.
    pub finalize: Option<
        unsafe extern "C" fn(
            context: *mut c_void,
            dflt: *mut kiln_default_memory,
            allocation: *mut c_void,
            segments: *const kiln_segment,
            count: usize,
        ) -> c_int,
    >,
    /// See the struct's documentation.
    pub free: Option<
        unsafe extern "C" fn(
            context: *mut c_void,
            dflt: *mut kiln_default_memory,
            allocation: *mut c_void,
            segments: *const kiln_segment,
            count: usize,
        ),
    >,
    /// See the struct's documentation.
    pub destroy: Option<unsafe extern "C" fn(context: *mut c_void)>,
}

/// The callbacks and the default they may call; freed (and `destroy` called) when the
/// session and every allocation are gone.
struct Shared {
    callbacks: kiln_memory_callbacks,
    default: Box<kiln_default_memory>,
}

// SAFETY: the API's contract: callbacks and their context may be used from any thread.
unsafe impl Send for Shared {}
// SAFETY: as above.
unsafe impl Sync for Shared {}

impl Drop for Shared {
    fn drop(&mut self) {
        if let Some(destroy) = self.callbacks.destroy {
            // SAFETY: the client's destructor, called once, after every allocation.
            unsafe { destroy(self.callbacks.context) };
        }
    }
}

impl Shared {
    fn default_ptr(&self) -> *mut kiln_default_memory {
        &*self.default as *const kiln_default_memory as *mut kiln_default_memory
    }
}

/// A [`MemoryManager`] calling the client's callbacks.
pub(crate) struct CallbackMemory {
    shared: Arc<Shared>,
}

impl CallbackMemory {
    pub(crate) fn new(callbacks: kiln_memory_callbacks) -> Result<Self, kiln_error> {
        let manager = SlabMemoryManager::new().map_err(|e| {
            if let Some(destroy) = callbacks.destroy {
                // SAFETY: the client's destructor: called exactly once, also on failure.
                unsafe { destroy(callbacks.context) };
            }
            kiln_error::new(crate::error::kiln_status::KILN_ERR_MEMORY, e.to_string())
        })?;
        Ok(CallbackMemory {
            shared: Arc::new(Shared {
                callbacks,
                default: Box::new(kiln_default_memory {
                    manager,
                    live: Mutex::new(HashMap::new()),
                }),
            }),
        })
    }
}

fn segments_of(request: &AllocationRequest) -> Vec<kiln_segment> {
    request
        .segments()
        .iter()
        .map(|s| kiln_segment {
            size: s.size,
            align: s.align,
            permission: kiln_permission::from(s.permission) as u32,
            zero_fill: c_int::from(s.zero_fill),
            target: 0,
            working: std::ptr::null_mut(),
        })
        .collect()
}

fn refused(what: String) -> MemoryError {
    MemoryError::InvalidConfiguration(what)
}

impl MemoryManager for CallbackMemory {
    fn allocate(&self, request: &AllocationRequest) -> Result<InFlightAllocation, MemoryError> {
        let shared = &self.shared;
        let mut segments = segments_of(request);
        let mut handle: *mut c_void = std::ptr::null_mut();
        let rc = match shared.callbacks.allocate {
            // SAFETY: the client's callback with valid arguments.
            Some(allocate) => unsafe {
                allocate(
                    shared.callbacks.context,
                    shared.default_ptr(),
                    segments.as_mut_ptr(),
                    segments.len(),
                    &mut handle,
                )
            },
            // SAFETY: valid arguments.
            None => unsafe {
                kiln_default_allocate(
                    shared.default_ptr(),
                    segments.as_mut_ptr(),
                    segments.len(),
                    &mut handle,
                )
            },
        };
        if rc != 0 || handle.is_null() {
            return Err(refused(format!(
                "the allocate callback failed ({rc}, allocation {handle:?}) for {} segments",
                segments.len()
            )));
        }
        let mut parts = Vec::with_capacity(segments.len());
        for (s, r) in segments.iter().zip(request.segments()) {
            if r.size > 0 && (s.working.is_null() || s.target == 0) {
                let error = refused("the allocate callback left a segment without memory".into());
                self.release(handle, &segments);
                return Err(error);
            }
            if s.target % r.align.max(1) != 0 {
                let error = refused(format!(
                    "the allocate callback placed a segment at {:#x}, not aligned to {}",
                    s.target, r.align
                ));
                self.release(handle, &segments);
                return Err(error);
            }
            if r.zero_fill && r.size > 0 {
                // SAFETY: the allocator's contract: `size` writable bytes.
                unsafe { std::ptr::write_bytes(s.working.cast::<u8>(), 0, r.size as usize) };
            }
            parts.push(WorkingSegment::new(
                s.target,
                r.size,
                r.permission,
                s.working.cast(),
            ));
        }
        let backend = Box::new(CallbackAllocation {
            shared: shared.clone(),
            handle: handle as usize,
            segments,
        });
        // SAFETY: the allocator's contract: each working range valid, writable and
        // exclusive until finalize or free, segments disjoint.
        Ok(unsafe { InFlightAllocation::from_parts(parts, backend) })
    }
}

impl CallbackMemory {
    fn release(&self, handle: *mut c_void, segments: &[kiln_segment]) {
        free_with(&self.shared, handle as usize, segments);
    }
}

/// An allocation made through the callbacks (in flight or finalized).
struct CallbackAllocation {
    shared: Arc<Shared>,
    handle: usize,
    segments: Vec<kiln_segment>,
}

// SAFETY: the handle and working pointers belong to the allocation, which the client lets
// be finalized and freed from any thread (the API's contract).
unsafe impl Send for CallbackAllocation {}
// SAFETY: as above; nothing is mutated through a shared reference.
unsafe impl Sync for CallbackAllocation {}

fn free_with(shared: &Shared, handle: usize, segments: &[kiln_segment]) {
    match shared.callbacks.free {
        // SAFETY: the client's callback with its own handle.
        Some(free) => unsafe {
            free(
                shared.callbacks.context,
                shared.default_ptr(),
                handle as *mut c_void,
                segments.as_ptr(),
                segments.len(),
            )
        },
        // SAFETY: the default checks that the handle is its own.
        None => unsafe { kiln_default_free(shared.default_ptr(), handle as *mut c_void) },
    }
}

impl InFlightBackend for CallbackAllocation {
    fn finalize(
        self: Box<Self>,
        _segments: &[SegmentRange],
    ) -> Result<Box<dyn FinalizedBackend>, MemoryError> {
        let shared = &self.shared;
        let rc = match shared.callbacks.finalize {
            // SAFETY: the client's callback with its own handle.
            Some(finalize) => unsafe {
                finalize(
                    shared.callbacks.context,
                    shared.default_ptr(),
                    self.handle as *mut c_void,
                    self.segments.as_ptr(),
                    self.segments.len(),
                )
            },
            // SAFETY: valid arguments; the default checks the handle is its own.
            None => unsafe {
                kiln_default_finalize(shared.default_ptr(), self.handle as *mut c_void)
            },
        };
        if rc != 0 {
            free_with(shared, self.handle, &self.segments);
            return Err(refused(format!("the finalize callback failed ({rc})")));
        }
        Ok(self)
    }

    fn abandon(self: Box<Self>, _segments: &[SegmentRange]) {
        free_with(&self.shared, self.handle, &self.segments);
    }
}

impl FinalizedBackend for CallbackAllocation {
    fn free(self: Box<Self>, _segments: &[SegmentRange]) -> Result<(), MemoryError> {
        free_with(&self.shared, self.handle, &self.segments);
        Ok(())
    }
}

/// Kiln's default allocation of `count` segments (see [`kiln_memory_callbacks`]): fills
/// each segment's `target` and `working` and `*allocation`; returns 0, or non-zero if the
/// memory could not be had.
///
/// # Safety
/// `dflt` is the one a callback was given; `segments` points to `count` segments with
/// their inputs filled; `allocation` is a valid out-pointer.
#[no_mangle]
pub unsafe extern "C" fn kiln_default_allocate(
    dflt: *mut kiln_default_memory,
    segments: *mut kiln_segment,
    count: usize,
    allocation: *mut *mut c_void,
) -> c_int {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        // SAFETY: the caller's contract.
        let (Some(dflt), false, false) = (
            unsafe { dflt.as_ref() },
            segments.is_null(),
            allocation.is_null(),
        ) else {
            return 1;
        };
        // SAFETY: the caller's contract: `count` segments.
        let segments = unsafe { std::slice::from_raw_parts_mut(segments, count) };
        let mut request = AllocationRequest::new();
        for s in segments.iter() {
            let permission = match s.permission {
                0 => Permission::ReadExecute,
                1 => Permission::Read,
                2 => Permission::ReadWrite,
                _ => return 4,
            };
            let mut r = SegmentRequest::new(permission, s.size, s.align.max(1));
            if s.zero_fill != 0 {
                r = r.zero_filled();
            }
            request = request.segment(r);
        }
        let Ok(mut in_flight) = dflt.manager.allocate(&request) else {
            return 2;
        };
        for (i, s) in segments.iter_mut().enumerate() {
            s.target = in_flight.target(i).unwrap_or(0);
            s.working = in_flight
                .working_memory(i)
                .map_or(std::ptr::null_mut(), |w| w.as_mut_ptr().cast());
        }
        let boxed = Box::new(0u8); // a unique, non-NULL handle
        let handle = Box::into_raw(boxed) as usize;
        dflt.live
            .lock()
            .insert(handle, DefaultAllocation::InFlight(in_flight));
        // SAFETY: the caller's contract.
        unsafe { *allocation = handle as *mut c_void };
        0
    }))
    .unwrap_or(3)
}

/// Finalizes an allocation made by [`kiln_default_allocate`]: final permissions, the
/// instruction cache coherent. Returns 0, or non-zero (an allocation not the default's,
/// or already finalized, or a failure).
///
/// # Safety
/// `dflt` is the one a callback was given.
#[no_mangle]
pub unsafe extern "C" fn kiln_default_finalize(
    dflt: *mut kiln_default_memory,
    allocation: *mut c_void,
) -> c_int {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        // SAFETY: the caller's contract.
        let Some(dflt) = (unsafe { dflt.as_ref() }) else {
            return 1;
        };
        let mut live = dflt.live.lock();
        match live.remove(&(allocation as usize)) {
            Some(DefaultAllocation::InFlight(in_flight)) => match in_flight.finalize() {
                Ok(done) => {
                    live.insert(allocation as usize, DefaultAllocation::Finalized(done));
                    0
                }
                Err(_) => {
                    live.insert(allocation as usize, DefaultAllocation::Failed);
                    2
                }
            },
            Some(finalized) => {
                live.insert(allocation as usize, finalized);
                3
            }
            None => 4,
        }
    }))
    .unwrap_or(5)
}

/// Frees an allocation made by [`kiln_default_allocate`] (in flight or finalized);
/// anything else is ignored.
///
/// # Safety
/// `dflt` is the one a callback was given; the allocation's code will not run again.
#[no_mangle]
pub unsafe extern "C" fn kiln_default_free(
    dflt: *mut kiln_default_memory,
    allocation: *mut c_void,
) {
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        // SAFETY: the caller's contract.
        let Some(dflt) = (unsafe { dflt.as_ref() }) else {
            return;
        };
        let removed = dflt.live.lock().remove(&(allocation as usize));
        if removed.is_some() {
            drop(removed);
            // SAFETY: made by Box::into_raw in kiln_default_allocate, freed once (it was
            // in `live`).
            drop(unsafe { Box::from_raw(allocation.cast::<u8>()) });
        }
    }));
}
