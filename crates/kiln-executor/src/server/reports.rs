//! Crash and exit reports: a fatal signal in JIT code, or the program's exit, told to
//! the controller before the process ends.

use super::*;

/// Where reports go (the connection's sender), set once per serving process.
pub(super) static REPORTER: AtomicPtr<Sender> = AtomicPtr::new(std::ptr::null_mut());

/// The executor's pid: a forked child of JIT code must not report for the executor.
pub(super) static CRASH_PID: AtomicI32 = AtomicI32::new(0);

/// Sends a report built without allocating (a signal handler or an exit handler may be
/// running): the frame `len, tag, u32` as the protocol encodes `Crashed` and `Exited`.
pub(super) fn report(tag: u8, value: i32) {
    // Length 9: id 0 (a message of the executor's own), the tag, the value.
    let mut frame = [9u8, 0, 0, 0, 0, 0, 0, 0, tag, 0, 0, 0, 0];
    frame[9..13].copy_from_slice(&(value as u32).to_le_bytes());
    send_own(&frame);
}

/// The `Crashed` frame with the faulting address and instruction: `len 25, id 0, tag,
/// signal u32, fault u64, pc u64`, sent without allocating.
pub(super) fn report_crash(signal: i32, fault: u64, pc: u64) {
    let mut frame = [0u8; 29];
    frame[0] = 25;
    frame[8] = kiln_wire::protocol::tag::CRASHED;
    frame[9..13].copy_from_slice(&(signal as u32).to_le_bytes());
    frame[13..21].copy_from_slice(&fault.to_le_bytes());
    frame[21..29].copy_from_slice(&pc.to_le_bytes());
    send_own(&frame);
}

/// Sends a frame of the executor's own through the reporter, from the executor process only
/// (not from a forked child of the program); allocates nothing (a signal handler calls it).
pub(super) fn send_own(frame: &[u8]) {
    // SAFETY: getpid is async-signal-safe.
    let me = unsafe { libc::getpid() };
    let reporter = REPORTER.load(Ordering::Acquire);
    if reporter.is_null() || me != CRASH_PID.load(Ordering::Relaxed) {
        return;
    }
    // SAFETY: the sender was leaked for the life of the process when serving began.
    let sender = unsafe { &*reporter };
    // Another thread may hold the sender: an output pump forwarding what the program
    // printed just before it crashed or exited (a lost report made a crash over TCP look
    // like a dropped connection, exit 1 rather than 139). It lets go within a frame's
    // send: try again for up to 200 ms. If the interrupted thread itself holds it (a
    // crash in the middle of a send), nothing can be sent and the connection's end says
    // the executor died.
    for _ in 0..200 {
        if sender.try_send_now(frame) {
            return;
        }
        pause_a_millisecond();
    }
}

/// The faulting instruction's address from a signal's context.
///
/// # Safety
/// `context` is the `ucontext_t` the kernel passed to an `SA_SIGINFO` handler (or null).
pub(super) unsafe fn faulting_pc(context: *mut c_void) -> u64 {
    if context.is_null() {
        return 0;
    }
    let context = context.cast::<libc::ucontext_t>();
    #[cfg(target_arch = "x86_64")]
    // SAFETY: the kernel's context for this signal (the caller's contract).
    return unsafe { (*context).uc_mcontext.gregs[libc::REG_RIP as usize] as u64 };
    #[cfg(target_arch = "aarch64")]
    // SAFETY: as above.
    return unsafe { (*context).uc_mcontext.pc };
    #[allow(unreachable_code)]
    0
}

pub(super) extern "C" fn on_fatal_signal(
    signal: i32,
    info: *mut libc::siginfo_t,
    context: *mut c_void,
) {
    // SAFETY: the kernel passes a valid siginfo and context to an SA_SIGINFO handler; the
    // fault address is meaningful for SIGSEGV, SIGBUS, SIGILL and SIGFPE only.
    let (fault, pc) = unsafe {
        let fault = match signal {
            libc::SIGSEGV | libc::SIGBUS | libc::SIGILL | libc::SIGFPE if !info.is_null() => {
                (*info).si_addr() as u64
            }
            _ => 0,
        };
        (fault, faulting_pc(context))
    };
    // What the program wrote just before it crashed goes out before the report, as a
    // native program's output reaches its terminal before the shell says it died.
    close_output_and_wait(200);
    report_crash(signal, fault, pc);
    // SA_RESETHAND restored the default action; raising again makes sure the process
    // dies with this signal even when returning would not re-fault (int3, raise, kill):
    // the signal is blocked in the handler and delivered as it returns.
    // SAFETY: raise is async-signal-safe.
    unsafe { libc::raise(signal) };
}

extern "C" {
    /// glibc's `on_exit`: like `atexit`, with the exit status.
    fn on_exit(function: extern "C" fn(libc::c_int, *mut c_void), arg: *mut c_void) -> libc::c_int;
}

/// JIT code called `exit(status)` (this runs after the program's own exit handlers, which
/// were registered later): its last output goes out, then the status.
pub(super) extern "C" fn on_program_exit(status: libc::c_int, _: *mut c_void) {
    // SAFETY: getpid has no preconditions.
    if unsafe { libc::getpid() } != CRASH_PID.load(Ordering::Relaxed) {
        return; // a forked child of the program: not the executor
    }
    runtime::flush_stdio();
    finish_output();
    report(kiln_wire::protocol::tag::EXITED, status);
}

/// Installs the crash reporter (on an alternate stack, so a stack overflow reports too)
/// and the exit reporter, for the connection whose sender is `sender`.
pub(super) fn install_reporters(sender: Sender) {
    // SAFETY: getpid has no preconditions.
    CRASH_PID.store(unsafe { libc::getpid() }, Ordering::Relaxed);
    let previous = REPORTER.swap(Box::into_raw(Box::new(sender)), Ordering::AcqRel);
    if !previous.is_null() {
        // A second connection in one process (tests): the first one's sender stays
        // allocated (a signal handler may still hold it); it is small.
        return;
    }
    // The serving thread's, for the life of the process.
    std::mem::forget(AlternateStack::install());
    for signal in [
        libc::SIGSEGV,
        libc::SIGBUS,
        libc::SIGILL,
        libc::SIGFPE,
        libc::SIGABRT,
        libc::SIGTRAP,
    ] {
        // SAFETY: sigaction is plain data; zeroed is valid before the fields are set.
        let mut action: libc::sigaction = unsafe { std::mem::zeroed() };
        action.sa_sigaction = on_fatal_signal as *const () as usize;
        action.sa_flags = libc::SA_RESETHAND | libc::SA_ONSTACK | libc::SA_SIGINFO;
        // SAFETY: installing a handler that only calls async-signal-safe functions.
        unsafe { libc::sigaction(signal, &action, std::ptr::null_mut()) };
    }
    // SAFETY: registering a function of this program, for the life of the process.
    unsafe { on_exit(on_program_exit, std::ptr::null_mut()) };
}

/// JIT code that forked returns here in the child too. The child must not answer on the
/// controller's connection (the parent does): it ends as a native program's child would,
/// with `exit(status)` (its own exit handlers run, its stdio is flushed).
pub(super) fn leave_if_forked_child(status: i32) {
    // SAFETY: getpid has no preconditions.
    if unsafe { libc::getpid() } != CRASH_PID.load(Ordering::Relaxed) {
        // SAFETY: ends this (forked) process the way C's exit does.
        unsafe { libc::exit(status) };
    }
}
