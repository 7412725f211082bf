//! Helpers shared by the integration tests: tiny functions in machine code, a W^X check of
//! /proc/self/maps, and a fault-injecting mapper.
#![allow(dead_code, unreachable_pub, missing_docs)]

use kiln_memory::{Mapper, MapperError, Permission, Placement, Reservation, SegmentRange};
use std::collections::HashSet;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// Machine code of `extern "C" fn() -> u32 { value }`.
pub fn return_const(value: u32) -> Vec<u8> {
    #[cfg(target_arch = "x86_64")]
    {
        let mut code = vec![0xb8]; // mov eax, imm32
        code.extend_from_slice(&value.to_le_bytes());
        code.push(0xc3); // ret
        code
    }
    #[cfg(target_arch = "aarch64")]
    {
        let lo = 0x5280_0000u32 | ((value & 0xffff) << 5); // movz w0, #lo
        let hi = 0x72a0_0000u32 | ((value >> 16) << 5); // movk w0, #hi, lsl 16
        let ret = 0xd65f_03c0u32;
        [lo, hi, ret].iter().flat_map(|w| w.to_le_bytes()).collect()
    }
}

/// Machine code of `extern "C" fn(x: u64) -> u64 { x + *(data as *const u64) }` reading a
/// constant through an absolute address.
#[cfg(target_arch = "x86_64")]
pub fn add_constant_at(data: u64) -> Vec<u8> {
    let mut code = vec![0x48, 0xb8]; // movabs rax, imm64
    code.extend_from_slice(&data.to_le_bytes());
    code.extend_from_slice(&[0x48, 0x8b, 0x00]); // mov rax, [rax]
    code.extend_from_slice(&[0x48, 0x01, 0xf8]); // add rax, rdi
    code.push(0xc3);
    code
}

/// Calls a function at `addr` returning `u32`.
///
/// # Safety
/// `addr` must hold a finalized function with the C ABI and no arguments.
pub unsafe fn call(addr: u64) -> u32 {
    // SAFETY: the caller's contract.
    let f: extern "C" fn() -> u32 = unsafe { std::mem::transmute(addr as usize) };
    f()
}

/// Lines of /proc/self/maps that are both writable and executable.
pub fn wx_mappings() -> Vec<String> {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    maps.lines()
        .filter(|line| {
            let perms = line.split_whitespace().nth(1).unwrap_or("");
            perms.as_bytes().get(1) == Some(&b'w') && perms.as_bytes().get(2) == Some(&b'x')
        })
        .map(str::to_string)
        .collect()
}

/// Number of lines in /proc/self/maps.
pub fn mapping_count() -> usize {
    std::fs::read_to_string("/proc/self/maps")
        .unwrap()
        .lines()
        .count()
}

/// Which mapper operation to fail.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Reserve,
    Prepare,
    Initialize,
    Deinitialize,
    Release,
}

/// A client mapper that wraps a real one, counts what it does, and fails the n-th call of
/// one operation on demand.
#[derive(Debug)]
pub struct FaultyMapper {
    inner: Arc<dyn Mapper>,
    fail: Mutex<Vec<(Op, u64)>>,
    calls: [AtomicU64; 5],
    /// Live reservations (by target address).
    pub live: Mutex<HashSet<u64>>,
    /// Bytes prepared and not deinitialized.
    pub prepared: AtomicI64,
}

impl FaultyMapper {
    pub fn new(inner: Arc<dyn Mapper>) -> Self {
        FaultyMapper {
            inner,
            fail: Mutex::new(Vec::new()),
            calls: Default::default(),
            live: Mutex::new(HashSet::new()),
            prepared: AtomicI64::new(0),
        }
    }

    /// Fails the `nth` (0-based, counted from now) call of `op`.
    pub fn fail(&self, op: Op, nth: u64) {
        let base = self.calls[op as usize].load(Ordering::SeqCst);
        self.fail.lock().unwrap().push((op, base + nth));
    }

    pub fn calls(&self, op: Op) -> u64 {
        self.calls[op as usize].load(Ordering::SeqCst)
    }

    pub fn live_reservations(&self) -> usize {
        self.live.lock().unwrap().len()
    }

    fn enter(&self, op: Op) -> Result<(), MapperError> {
        let n = self.calls[op as usize].fetch_add(1, Ordering::SeqCst);
        let mut fail = self.fail.lock().unwrap();
        if let Some(i) = fail.iter().position(|&f| f == (op, n)) {
            fail.swap_remove(i);
            return Err(MapperError::Refused {
                operation: match op {
                    Op::Reserve => "reserve",
                    Op::Prepare => "prepare",
                    Op::Initialize => "initialize",
                    Op::Deinitialize => "deinitialize",
                    Op::Release => "release",
                },
                reason: "injected fault".into(),
            });
        }
        Ok(())
    }
}

// SAFETY: delegates every operation to a sound mapper; failing an operation only withholds
// access, never grants more.
unsafe impl Mapper for FaultyMapper {
    fn name(&self) -> &'static str {
        "faulty"
    }
    fn page_size(&self) -> u64 {
        self.inner.page_size()
    }
    fn shares_pages(&self) -> bool {
        self.inner.shares_pages()
    }
    fn reserve(&self, len: u64, placement: &Placement) -> Result<Reservation, MapperError> {
        self.enter(Op::Reserve)?;
        let r = self.inner.reserve(len, placement)?;
        self.live.lock().unwrap().insert(r.target);
        Ok(r)
    }
    unsafe fn prepare(
        &self,
        r: &Reservation,
        start: u64,
        end: u64,
        p: Permission,
    ) -> Result<(), MapperError> {
        self.enter(Op::Prepare)?;
        // SAFETY: forwarding our caller's contract.
        unsafe { self.inner.prepare(r, start, end, p) }?;
        self.prepared
            .fetch_add((end - start) as i64, Ordering::SeqCst);
        Ok(())
    }
    unsafe fn initialize(
        &self,
        r: &Reservation,
        segments: &[SegmentRange],
    ) -> Result<(), MapperError> {
        self.enter(Op::Initialize)?;
        // SAFETY: forwarding our caller's contract.
        unsafe { self.inner.initialize(r, segments) }
    }
    unsafe fn deinitialize(
        &self,
        r: &Reservation,
        start: u64,
        end: u64,
        p: Permission,
    ) -> Result<(), MapperError> {
        self.enter(Op::Deinitialize)?;
        // SAFETY: forwarding our caller's contract.
        unsafe { self.inner.deinitialize(r, start, end, p) }?;
        self.prepared
            .fetch_sub((end - start) as i64, Ordering::SeqCst);
        Ok(())
    }
    unsafe fn release(&self, r: &Reservation) -> Result<(), MapperError> {
        self.enter(Op::Release)?;
        // SAFETY: forwarding our caller's contract.
        unsafe { self.inner.release(r) }?;
        self.live.lock().unwrap().remove(&r.target);
        Ok(())
    }
    fn resident_bytes(&self, r: &Reservation) -> Option<u64> {
        self.inner.resident_bytes(r)
    }
}
