//! Where a call-through stub goes before its function has a body: an assembly entry that
//! saves the caller's argument registers, asks the session's resolver for the body's
//! address (compiling and linking it on the calling thread), restores the registers and
//! jumps to the body as if the stub had jumped there itself.
//!
//! A stub is `jmp *slot(%rip)`; its slot first holds the address of a per-stub `push
//! $id; jmp common` sequence, whose common tail jumps to [`lazy_entry_address`]. The
//! resolver is the session's ([`set_lazy_resolver`]); it stores the body's address into
//! the slot with [`store_code_pointer`], so later calls go straight to the body.
//!
//! Written by hand because it must be: no crate provides a trampoline that preserves an
//! arbitrary C call's argument registers (System V x86-64: rdi, rsi, rdx, rcx, r8, r9, rax
//! for varargs, r10 as static chain, xmm0–7).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

/// The session's resolver: from a stub's id to the address its call continues at (the
/// body, or a fallback after a failed compile). It must not unwind.
pub type LazyResolver = fn(u64) -> u64;

static RESOLVER: OnceLock<LazyResolver> = OnceLock::new();

/// Sets the process's resolver of call-through stubs (the first call wins; a session
/// registers its own routing by id, so one resolver serves every session).
pub fn set_lazy_resolver(resolver: LazyResolver) {
    let _ = RESOLVER.set(resolver);
}

/// What a call whose stub cannot be resolved runs instead when the client gave no
/// fallback: it returns 0 (in `rax` and `xmm0`'s low bits untouched), whatever the
/// function's signature.
pub extern "C" fn lazy_call_failed() -> u64 {
    0
}

/// The address of [`lazy_call_failed`].
pub fn lazy_call_failed_address() -> u64 {
    lazy_call_failed as *const () as u64
}

/// Called by the assembly entry with the stub's id; returns where to jump.
extern "C" fn kiln_lazy_resolve(id: u64) -> u64 {
    // A panic must not unwind into assembly: the call then goes to the fallback.
    // A thread serving a controller asks it (the stub's session is there); any other
    // thread asks this process's session.
    std::panic::catch_unwind(|| match crate::server::resolve_if_serving(id) {
        Some(target) => target,
        None => match RESOLVER.get() {
            Some(resolve) => resolve(id),
            None => {
                // An executor's thread that does not serve the connection: nobody here
                // can compile the body.
                eprintln!(
                    "kiln: call-through stub {id} called on a thread that cannot reach its session; the call returns 0"
                );
                lazy_call_failed_address()
            }
        },
    })
    .unwrap_or_else(|_| lazy_call_failed_address())
}

#[cfg(target_arch = "x86_64")]
std::arch::global_asm!(
    ".pushsection .text.kiln_lazy_entry,\"ax\",@progbits",
    ".p2align 4",
    // Global (other crates' code refers to it once inlined), hidden (never exported).
    ".globl kiln_lazy_entry",
    ".hidden kiln_lazy_entry",
    ".type kiln_lazy_entry, @function",
    "kiln_lazy_entry:",
    // Reached by the stubs' `jmp *entry(%rip)`: a landing pad under IBT.
    "endbr64",
    // [rsp] = the stub's id (pushed by the stub), [rsp+8] = the caller's return address.
    "push rbp",
    "mov rbp, rsp",
    "push rdi",
    "push rsi",
    "push rdx",
    "push rcx",
    "push r8",
    "push r9",
    "push rax",
    "push r10",
    // 8 xmm registers and 8 bytes to keep rsp 16-byte aligned at the call.
    "sub rsp, 136",
    "movdqu [rsp], xmm0",
    "movdqu [rsp + 16], xmm1",
    "movdqu [rsp + 32], xmm2",
    "movdqu [rsp + 48], xmm3",
    "movdqu [rsp + 64], xmm4",
    "movdqu [rsp + 80], xmm5",
    "movdqu [rsp + 96], xmm6",
    "movdqu [rsp + 112], xmm7",
    "mov rdi, [rbp + 8]",
    "call {resolve}",
    "mov r11, rax",
    "movdqu xmm0, [rsp]",
    "movdqu xmm1, [rsp + 16]",
    "movdqu xmm2, [rsp + 32]",
    "movdqu xmm3, [rsp + 48]",
    "movdqu xmm4, [rsp + 64]",
    "movdqu xmm5, [rsp + 80]",
    "movdqu xmm6, [rsp + 96]",
    "movdqu xmm7, [rsp + 112]",
    "add rsp, 136",
    "pop r10",
    "pop rax",
    "pop r9",
    "pop r8",
    "pop rcx",
    "pop rdx",
    "pop rsi",
    "pop rdi",
    "pop rbp",
    // Drop the id: the stack is the caller's again, its return address on top.
    "add rsp, 8",
    "jmp r11",
    ".size kiln_lazy_entry, . - kiln_lazy_entry",
    ".popsection",
    resolve = sym kiln_lazy_resolve,
);

#[cfg(target_arch = "x86_64")]
extern "C" {
    fn kiln_lazy_entry();
}

/// The address unresolved stubs continue at, where this process has one (x86-64).
pub fn lazy_entry_address() -> Option<u64> {
    #[cfg(target_arch = "x86_64")]
    {
        Some(kiln_lazy_entry as *const () as u64)
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        None
    }
}

/// Stores `value` into the pointer slot at `address`, as one atomic write that calls
/// through the slot see whole (sequentially consistent: a thread that pins after this
/// store and then calls through the slot reaches `value`).
///
/// # Safety
/// `address` must be an 8-byte-aligned, writable `u64` in this process that only atomic
/// writes and the stub's loads touch: a call-through stub's slot in a live module.
pub unsafe fn store_code_pointer(address: u64, value: u64) {
    // SAFETY: the caller's contract: aligned, writable, live, accessed atomically.
    let slot = unsafe { AtomicU64::from_ptr(address as *mut u64) };
    slot.store(value, Ordering::SeqCst);
}
