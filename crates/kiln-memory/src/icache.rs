//! Instruction-cache coherence after code is written.
//!
//! x86-64 keeps instruction fetch coherent with stores in hardware; nothing is needed
//! beyond a compiler fence. AArch64 needs the data cache cleaned and the instruction cache
//! invalidated to the point of unification for the written range, and every other core's
//! pipeline flushed before it may run the new code: `membarrier(SYNC_CORE)` does the
//! latter for all threads of the process.

use std::sync::atomic::{compiler_fence, Ordering};

/// Makes `[addr, addr + len)` (target addresses of this process) coherent between data and
/// instruction caches on this core.
pub fn make_coherent(addr: u64, len: u64) {
    compiler_fence(Ordering::SeqCst);
    #[cfg(target_arch = "aarch64")]
    {
        extern "C" {
            // libgcc / compiler-rt: cleans D-cache and invalidates I-cache by VA, line by
            // line, with the line sizes from CTR_EL0, followed by the required barriers.
            fn __clear_cache(start: *mut libc::c_char, end: *mut libc::c_char);
        }
        // SAFETY: cache maintenance by virtual address reads no memory contents; the range
        // is mapped and readable in this process (the target view).
        unsafe { __clear_cache(addr as *mut libc::c_char, (addr + len) as *mut libc::c_char) };
    }
    #[cfg(not(target_arch = "aarch64"))]
    {
        let _ = (addr, len);
    }
}

/// Makes sure every thread of the process sees the code made coherent so far, by a
/// context-synchronizing event on every core that runs one of its threads.
///
/// On AArch64 this is `membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED_SYNC_CORE)`, registered
/// once per process; nothing is needed on x86-64.
pub fn synchronize_cores() {
    #[cfg(target_arch = "aarch64")]
    {
        use std::sync::OnceLock;
        const REGISTER_SYNC_CORE: libc::c_int = 1 << 6;
        const SYNC_CORE: libc::c_int = 1 << 5;
        static REGISTERED: OnceLock<bool> = OnceLock::new();
        let registered = *REGISTERED.get_or_init(|| {
            // SAFETY: membarrier has no memory-safety preconditions.
            unsafe { libc::syscall(libc::SYS_membarrier, REGISTER_SYNC_CORE, 0, 0) == 0 }
        });
        if registered {
            // SAFETY: as above.
            unsafe { libc::syscall(libc::SYS_membarrier, SYNC_CORE, 0, 0) };
        } else {
            tracing::debug!("membarrier(SYNC_CORE) unavailable; relying on dsb/isb only");
        }
    }
    compiler_fence(Ordering::SeqCst);
}
