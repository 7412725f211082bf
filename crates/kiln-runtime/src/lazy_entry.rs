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
//! for varargs, r10 as static chain, and the vector registers whole: xmm0–7 and their
//! ymm/zmm upper halves, saved with `xsave`).

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

/// How an executor resolves a stub through its controller: on the thread that serves the
/// connection, or for any other thread through it while main runs (`None` where neither
/// can); set by the server when it starts serving ([`set_serving_resolver`]).
static SERVING_RESOLVER: OnceLock<fn(u64) -> Option<u64>> = OnceLock::new();

/// Sets how a thread serving a controller resolves stubs (the server's; once per process,
/// later calls change nothing).
pub fn set_serving_resolver(resolve: fn(u64) -> Option<u64>) {
    let _ = SERVING_RESOLVER.set(resolve);
}

/// Called by the assembly entry with the stub's id; returns where to jump.
extern "C" fn kiln_lazy_resolve(id: u64) -> u64 {
    // A panic must not unwind into assembly: the call then goes to the fallback.
    // A thread serving a controller asks it (the stub's session is there); any other
    // thread asks this process's session.
    std::panic::catch_unwind(|| match SERVING_RESOLVER.get().and_then(|serving| serving(id)) {
        Some(target) => target,
        None => match RESOLVER.get() {
            Some(resolve) => resolve(id),
            None => {
                // No session here, and no connection being served for this thread (an
                // executor's serving thread resolves for every thread while main runs;
                // a thread still calling after main returned cannot reach it).
                eprintln!(
                    "kiln: call-through stub {id} called on a thread that cannot reach its session; the call returns 0"
                );
                lazy_call_failed_address()
            }
        },
    })
    .unwrap_or_else(|_| lazy_call_failed_address())
}

/// The bytes `xsave` needs for every state component the OS enabled (CPUID leaf 0xD),
/// or 0 where the CPU or the OS has no XSAVE: the entry then saves with `fxsave`
/// (x87 and SSE: xmm0-15). Set before the first stub can exist
/// ([`lazy_entry_address`]); read by the assembly entry.
static VECTOR_STATE_SIZE: AtomicU64 = AtomicU64::new(0);

/// Works out [`VECTOR_STATE_SIZE`] (once; later calls change nothing).
#[cfg(target_arch = "x86_64")]
fn measure_vector_state() {
    static MEASURED: OnceLock<()> = OnceLock::new();
    MEASURED.get_or_init(|| {
        if std::arch::is_x86_feature_detected!("xsave") {
            // CPUID leaf 0xD exists wherever XSAVE does (checked above).
            let leaf = std::arch::x86_64::__cpuid_count(0xd, 0);
            // EBX: the size of the XSAVE area for the components XCR0 enables now.
            VECTOR_STATE_SIZE.store(u64::from(leaf.ebx), Ordering::SeqCst);
        }
    });
}

// The caller's whole vector state is saved and restored around the resolver, not only
// xmm0-7: a function may take `__m256` or `__m512` arguments (ymm0-7, zmm0-7), whose
// upper halves a compile on the calling thread would otherwise overwrite. `xsave` with
// every component requested saves what the OS enabled (AVX, AVX-512, ...) in an area
// of the size CPUID gives, 64-byte aligned on the stack, its header zeroed first (as
// `xrstor` requires); without XSAVE, `fxsave` saves xmm0-15.
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
    "mov r11, [rip + {size}]",
    "test r11, r11",
    "jz 2f",
    // XSAVE: the area below, 64-byte aligned (so rsp is 16-byte aligned at the call).
    "sub rsp, r11",
    "and rsp, -64",
    "xor eax, eax",
    "mov [rsp + 512], rax",
    "mov [rsp + 520], rax",
    "mov [rsp + 528], rax",
    "mov [rsp + 536], rax",
    "mov [rsp + 544], rax",
    "mov [rsp + 552], rax",
    "mov [rsp + 560], rax",
    "mov [rsp + 568], rax",
    "mov eax, -1",
    "mov edx, -1",
    "xsave64 [rsp]",
    "mov rdi, [rbp + 8]",
    "call {resolve}",
    "mov r11, rax",
    "mov eax, -1",
    "mov edx, -1",
    "xrstor64 [rsp]",
    "jmp 3f",
    // FXSAVE: 512 bytes, 16-byte aligned.
    "2:",
    "sub rsp, 512",
    "and rsp, -16",
    "fxsave64 [rsp]",
    "mov rdi, [rbp + 8]",
    "call {resolve}",
    "mov r11, rax",
    "fxrstor64 [rsp]",
    "3:",
    "lea rsp, [rbp - 64]",
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
    size = sym VECTOR_STATE_SIZE,
);

#[cfg(target_arch = "x86_64")]
extern "C" {
    fn kiln_lazy_entry();
}

/// The address unresolved stubs continue at, where this process has one (x86-64).
pub fn lazy_entry_address() -> Option<u64> {
    #[cfg(target_arch = "x86_64")]
    {
        measure_vector_state();
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
