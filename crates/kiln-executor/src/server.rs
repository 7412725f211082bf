//! The executor's side of the protocol: serve one controller connection, doing in this
//! process what it asks, checking every address against the memory it reserved here.
//!
//! A malformed or out-of-range request gets an error reply and the connection goes on;
//! the executor never writes outside its reservations. JIT code that crashes the process
//! is reported to the controller by a signal handler before the process dies.

use kiln_memory::{DualMappedMapper, Mapper, Permission, Placement, Reservation, SegmentRange};
use kiln_runtime::runtime::{self, EhFrameRegistration};
use kiln_wire::channel::{Channel, ChannelError, Sender};
use kiln_wire::protocol::{
    kind_to_wire, message_id, with_id, Hello, Request, Response, WirePlacement, EXECUTOR_REQUEST,
    VERSION,
};
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::ffi::c_void;
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicI32, AtomicPtr, AtomicUsize, Ordering};
use std::time::Duration;

/// What ended a connection.
#[derive(Debug, PartialEq, Eq)]
pub enum Ending {
    /// The controller closed it.
    Closed,
    /// The controller asked the executor to exit.
    Shutdown,
    /// The connection failed.
    Failed(String),
}

struct Library(*mut c_void);

/// Everything a connection created, released when it ends.
struct State {
    mapper: Result<DualMappedMapper, String>,
    reservations: HashMap<u64, Reservation>,
    /// Pages of each reservation not prepared (inaccessible in the target view).
    unprepared: HashMap<u64, kiln_memory::PageRuns>,
    next_handle: u64,
    libraries: HashMap<u64, Library>,
    library_paths: HashMap<String, u64>,
    eh_frames: HashMap<u64, EhFrameRegistration>,
    /// Whether descriptors can be sent to the controller (a Unix socket).
    can_pass_fds: bool,
    /// Objects of exported definitions, by the handle given to the controller.
    exports: HashMap<u64, runtime::Exports>,
    next_export: u64,
    /// Each stub slot `StoreCodePointer` stored, with the epoch of its last store: a
    /// stub's resolution asked before that store and answered after it is older than the
    /// slot, and is not stored (the controller computes an answer from the body current
    /// then; a swap may store a newer body before the answer arrives).
    slot_stores: HashMap<u64, u64>,
}

impl State {
    fn new() -> Self {
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

    fn mapper(&self) -> Result<&DualMappedMapper, String> {
        self.mapper
            .as_ref()
            .map_err(|e| format!("this executor cannot make executable shared memory: {e}"))
    }

    fn reservation(&self, handle: u64) -> Result<&Reservation, String> {
        self.reservations
            .get(&handle)
            .ok_or_else(|| format!("no reservation with handle {handle}"))
    }

    /// Checks `[address, address + len)` lies inside reservation `handle`.
    fn checked(&self, handle: u64, address: u64, len: u64) -> Result<&Reservation, String> {
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
    fn library(&self, id: u64) -> Result<*mut c_void, String> {
        if id == 0 {
            return Ok(std::ptr::null_mut());
        }
        self.libraries
            .get(&id)
            .map(|l| l.0)
            .ok_or_else(|| format!("no library with handle {id}"))
    }

    fn unprepared_mut(&mut self, handle: u64) -> &mut kiln_memory::PageRuns {
        let r = self.reservations.get(&handle).copied();
        self.unprepared.entry(handle).or_insert_with(|| match r {
            Some(r) => kiln_memory::PageRuns::new(r.target, r.target_end()),
            None => kiln_memory::PageRuns::default(),
        })
    }

    /// The reservation holding `[address, address + len)` on prepared (accessible) pages.
    fn accessible(&self, address: u64, len: u64) -> Result<&Reservation, String> {
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
    fn code(&self, address: u64) -> Result<(), String> {
        self.accessible(address, 1).map(|_| ())
    }

    /// Checks `.eh_frame` data at `address`: a chain of length-prefixed records on one
    /// reservation's prepared pages, ending in a zero terminator — what
    /// `__register_frame` will walk.
    fn check_eh_frame(&self, address: u64) -> Result<(), String> {
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

    /// Parses every CIE and FDE of `.eh_frame` data (`bytes`, at target `address`) with
    /// gimli before the unwinder sees it: the record structure, the pointer encodings and
    /// the call-frame instructions must parse, and every FDE's code range must be a
    /// forward range on this executor's prepared pages.
    fn check_eh_frame_records(&self, address: u64, bytes: &[u8]) -> Result<(), String> {
        use gimli::{BaseAddresses, CieOrFde, EhFrame, LittleEndian, UnwindSection};
        let eh_frame = EhFrame::new(bytes, LittleEndian);
        let bases = BaseAddresses::default().set_eh_frame(address);
        let mut entries = eh_frame.entries(&bases);
        // Each CIE is parsed once, not again for every FDE that names it.
        let mut cies = HashMap::new();
        // The FDEs' code ranges, checked as one span when they share a reservation's
        // prepared pages (the usual case: one module's code), else one by one.
        let mut ranges = Vec::new();
        loop {
            let entry = entries
                .next()
                .map_err(|e| format!("eh_frame at {address:#x}: malformed record: {e}"))?;
            let Some(entry) = entry else { break };
            match entry {
                CieOrFde::Cie(cie) => {
                    let mut instructions = cie.instructions(&eh_frame, &bases);
                    while instructions
                        .next()
                        .map_err(|e| format!("eh_frame at {address:#x}: CIE instructions: {e}"))?
                        .is_some()
                    {}
                    cies.insert(cie.offset(), cie);
                }
                CieOrFde::Fde(partial) => {
                    let fde = partial
                        .parse(|section, bases, offset| match cies.get(&offset.0) {
                            Some(cie) => Ok(cie.clone()),
                            None => EhFrame::cie_from_offset(section, bases, offset),
                        })
                        .map_err(|e| format!("eh_frame at {address:#x}: malformed FDE: {e}"))?;
                    let start = fde.initial_address();
                    let len = fde.len();
                    if start.checked_add(len).is_none() {
                        return Err(format!(
                            "eh_frame at {address:#x}: FDE range {start:#x} + {len:#x} is reversed (wraps around)"
                        ));
                    }
                    if len > 0 {
                        ranges.push((start, len));
                    }
                    let mut instructions = fde.instructions(&eh_frame, &bases);
                    while instructions
                        .next()
                        .map_err(|e| format!("eh_frame at {address:#x}: FDE instructions: {e}"))?
                        .is_some()
                    {}
                }
            }
        }
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

    fn pages(&self, handle: u64, start: u64, end: u64) -> Result<&Reservation, String> {
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

fn permission(p: u8) -> Permission {
    match p {
        0 => Permission::ReadExecute,
        1 => Permission::Read,
        _ => Permission::ReadWrite,
    }
}

/// Where reports go (the connection's sender), set once per serving process.
static REPORTER: AtomicPtr<Sender> = AtomicPtr::new(std::ptr::null_mut());

/// The executor's pid: a forked child of JIT code must not report for the executor.
static CRASH_PID: AtomicI32 = AtomicI32::new(0);

/// Sends a report built without allocating (a signal handler or an exit handler may be
/// running): the frame `len, tag, u32` as the protocol encodes `Crashed` and `Exited`.
fn report(tag: u8, value: i32) {
    // Length 9: id 0 (a message of the executor's own), the tag, the value.
    let mut frame = [9u8, 0, 0, 0, 0, 0, 0, 0, tag, 0, 0, 0, 0];
    frame[9..13].copy_from_slice(&(value as u32).to_le_bytes());
    send_own(&frame);
}

/// The `Crashed` frame with the faulting address and instruction: `len 25, id 0, tag,
/// signal u32, fault u64, pc u64`, sent without allocating.
fn report_crash(signal: i32, fault: u64, pc: u64) {
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
fn send_own(frame: &[u8]) {
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
unsafe fn faulting_pc(context: *mut c_void) -> u64 {
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

extern "C" fn on_fatal_signal(signal: i32, info: *mut libc::siginfo_t, context: *mut c_void) {
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
extern "C" fn on_program_exit(status: libc::c_int, _: *mut c_void) {
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
fn install_reporters(sender: Sender) {
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

/// Output pumps still running (0 when output is not forwarded).
static PUMPS_RUNNING: AtomicUsize = AtomicUsize::new(0);

/// Where `Input` messages go: a thread that writes them into the program's standard
/// input (a pipe on descriptor 0).
static STDIN_QUEUE: parking_lot::Mutex<Option<std::sync::mpsc::Sender<Vec<u8>>>> =
    parking_lot::const_mutex(None);

/// Takes its bytes off [`STDIN_QUEUED`] when dropped.
struct QueuedBytes(usize);

impl Drop for QueuedBytes {
    fn drop(&mut self) {
        STDIN_QUEUED.fetch_sub(self.0, Ordering::SeqCst);
    }
}

/// Bytes of `Input` queued and not yet written into the program's standard input.
static STDIN_QUEUED: AtomicUsize = AtomicUsize::new(0);

/// Most bytes of `Input` held for a program that does not read them.
pub const MAX_QUEUED_INPUT: usize = 16 << 20;

/// Passes `Input` bytes on to the program's standard input; empty bytes close it. Past
/// [`MAX_QUEUED_INPUT`] unread bytes, input is dropped and the program's standard error
/// (the controller's) says so once: the executor's memory is not the client's to fill.
fn give_input(bytes: Vec<u8>) {
    static WARNED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    if STDIN_QUEUED.load(Ordering::SeqCst) + bytes.len() > MAX_QUEUED_INPUT {
        if !WARNED.swap(true, Ordering::SeqCst) {
            let warning = format!(
                "kiln-executor: the program left {MAX_QUEUED_INPUT} bytes of standard input unread; further input is dropped\n"
            );
            // SAFETY: writes a local buffer to descriptor 2 (the forwarded stderr pipe).
            unsafe { libc::write(2, warning.as_ptr().cast(), warning.len()) };
        }
        return;
    }
    if let Some(queue) = STDIN_QUEUE.lock().as_ref() {
        STDIN_QUEUED.fetch_add(bytes.len(), Ordering::SeqCst);
        let _ = queue.send(bytes);
    }
}

/// Connects the program's standard streams to the controller: descriptors 1 and 2 become
/// pipes that a thread each reads and sends as `Output` messages; descriptor 0 a pipe that
/// `Input` messages fill. For an executor whose terminal is not the user's (`--listen`).
fn forward_output(sender: &Sender) -> std::io::Result<()> {
    let mut ends = [-1; 2];
    // SAFETY: pipe2 writes two descriptors.
    if unsafe { libc::pipe2(ends.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: the read end replaces this process's standard input.
    unsafe {
        libc::dup2(ends[0], 0);
        libc::close(ends[0]);
    }
    let stdin_write = ends[1];
    let (queue, inputs) = std::sync::mpsc::channel::<Vec<u8>>();
    *STDIN_QUEUE.lock() = Some(queue);
    std::thread::spawn(move || {
        for bytes in inputs {
            if bytes.is_empty() {
                break;
            }
            // Counted as written whether or not the pipe takes it all.
            let _queued = QueuedBytes(bytes.len());
            let mut done = 0;
            while done < bytes.len() {
                // SAFETY: writing our buffer to our pipe's write end.
                let n = unsafe {
                    libc::write(
                        stdin_write,
                        bytes[done..].as_ptr().cast(),
                        bytes.len() - done,
                    )
                };
                if n <= 0 {
                    break;
                }
                done += n as usize;
            }
        }
        // SAFETY: our descriptor, closed once: the program reads end of input.
        unsafe { libc::close(stdin_write) };
    });
    for (fd, stream) in [(1, 1u8), (2, 2u8)] {
        let mut ends = [-1; 2];
        // SAFETY: pipe2 writes two descriptors.
        if unsafe { libc::pipe2(ends.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: the write end replaces this process's descriptor `fd` (stdout/stderr).
        unsafe {
            libc::dup2(ends[1], fd);
            libc::close(ends[1]);
        }
        let read_end = ends[0];
        let sender = sender.clone();
        PUMPS_RUNNING.fetch_add(1, Ordering::SeqCst);
        std::thread::spawn(move || {
            let mut buf = vec![0u8; 64 << 10];
            loop {
                // SAFETY: reading into our buffer from our pipe's read end.
                let n = unsafe { libc::read(read_end, buf.as_mut_ptr().cast(), buf.len()) };
                if n < 0
                    && std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted
                {
                    continue;
                }
                if n <= 0 {
                    break;
                }
                let frame = Response::Output {
                    stream,
                    bytes: buf[..n as usize].to_vec(),
                }
                .encode();
                if sender.send(&frame).is_err() {
                    break;
                }
            }
            // SAFETY: our descriptor, closed once.
            unsafe { libc::close(read_end) };
            PUMPS_RUNNING.fetch_sub(1, Ordering::SeqCst);
        });
    }
    Ok(())
}

/// Ends output forwarding: closes this process's write ends (descriptors 1 and 2 become
/// `/dev/null`) and waits up to a second for the pumps to send what is left.
fn finish_output() {
    close_output_and_wait(1000);
}

/// Descriptors 1 and 2 become `/dev/null`, so the output pumps read what is left in the
/// pipes, send it and see the end; waits up to `max_ms` milliseconds for them (a forked
/// child of the program holding the pipes open keeps them reading). Async-signal-safe
/// calls only: the crash handler calls it too, with 200 ms, so that what the program
/// wrote just before it crashed goes out before the report.
fn close_output_and_wait(max_ms: u32) {
    if PUMPS_RUNNING.load(Ordering::SeqCst) == 0 {
        return;
    }
    // SAFETY: open, dup2 and close are async-signal-safe; they act on this process's
    // standard descriptors only.
    unsafe {
        let null = libc::open(c"/dev/null".as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
        if null >= 0 {
            libc::dup2(null, 1);
            libc::dup2(null, 2);
            libc::close(null);
        }
    }
    for _ in 0..max_ms {
        if PUMPS_RUNNING.load(Ordering::SeqCst) == 0 {
            return;
        }
        pause_a_millisecond();
    }
}

/// Sleeps about a millisecond (async-signal-safe: `nanosleep`).
fn pause_a_millisecond() {
    let pause = libc::timespec {
        tv_sec: 0,
        tv_nsec: 1_000_000,
    };
    // SAFETY: nanosleep is async-signal-safe; the pause is on this stack.
    unsafe { libc::nanosleep(&pause, std::ptr::null_mut()) };
}

/// JIT code that forked returns here in the child too. The child must not answer on the
/// controller's connection (the parent does): it ends as a native program's child would,
/// with `exit(status)` (its own exit handlers run, its stdio is flushed).
fn leave_if_forked_child(status: i32) {
    // SAFETY: getpid has no preconditions.
    if unsafe { libc::getpid() } != CRASH_PID.load(Ordering::Relaxed) {
        // SAFETY: ends this (forked) process the way C's exit does.
        unsafe { libc::exit(status) };
    }
}

/// The code a request runs, on a thread other than the serving one; gives its answer.
type CodeJob = Box<dyn FnOnce() -> Response + Send>;

/// The code of the controller's requests (main, calls, initializers, finalizers), run on
/// threads other than the serving one: main's thread when it is idle, else a thread of
/// its own. Each sends its own answer when its code returns (the channel's sender is
/// shared), so an answer waits for no second thread to wake. Meanwhile the serving
/// thread goes on reading the connection: `Input` reaches the program, other requests
/// are served (a hot swap, a link, a lookup, a call from another controller thread), and
/// the stubs any executor thread calls are resolved (the threads queue them through the
/// [`Forwarder`], whose pipe wakes the serving thread). Made at the first such request and
/// kept for the connection.
struct CodeJobs {
    /// Requests whose code has not returned.
    running: std::sync::Mutex<usize>,
    /// Signalled when `running` falls to 0.
    idle: std::sync::Condvar,
    /// One of them is main.
    main: std::sync::atomic::AtomicBool,
    forwarder: std::sync::Arc<Forwarder>,
    /// The read end of the forwarder's wake-up pipe.
    wake_read: libc::c_int,
}

impl CodeJobs {
    /// Its wake-up pipe, and the forwarder that threads calling stubs find.
    fn new() -> Result<std::sync::Arc<Self>, String> {
        let mut wake = [-1; 2];
        // SAFETY: pipe2 writes two descriptors.
        if unsafe { libc::pipe2(wake.as_mut_ptr(), libc::O_CLOEXEC | libc::O_NONBLOCK) } != 0 {
            return Err(format!(
                "cannot run code: {}",
                std::io::Error::last_os_error()
            ));
        }
        let forwarder = std::sync::Arc::new(Forwarder {
            queue: std::sync::Mutex::new(ForwardQueue::default()),
            wake: wake[1],
        });
        if let Ok(mut f) = FORWARDER.lock() {
            *f = Some(forwarder.clone());
        }
        Ok(std::sync::Arc::new(CodeJobs {
            running: std::sync::Mutex::new(0),
            idle: std::sync::Condvar::new(),
            main: std::sync::atomic::AtomicBool::new(false),
            forwarder,
            wake_read: wake[0],
        }))
    }

    /// Whether some request's code runs.
    fn busy(&self) -> bool {
        self.running.lock().is_ok_and(|n| *n > 0)
    }

    /// Starts `code` for request `id`; its answer goes out through `sender`.
    fn submit(
        self: &std::sync::Arc<Self>,
        id: u32,
        main: bool,
        code: CodeJob,
        sender: Sender,
    ) -> Result<(), String> {
        if main && self.main.load(Ordering::SeqCst) {
            return Err("main is running".into());
        }
        let first = {
            let mut running = self.running.lock().map_err(|_| "code jobs poisoned")?;
            *running += 1;
            if *running == 1 {
                // Threads calling stubs are served from now on.
                self.forwarder.open();
            }
            *running == 1
        };
        if main {
            self.main.store(true, Ordering::SeqCst);
        }
        let jobs = self.clone();
        let job: Job = Box::new(move || {
            // Bodies replaced while this code runs are kept until it returns.
            let guard = kiln_runtime::code_guards::pin();
            let response = code();
            drop(guard);
            // Counted out before the answer goes: the controller's next request finds
            // main's thread idle.
            jobs.finished(main);
            let _ = sender.send(&with_id(response.encode(), id));
        });
        CodeRunner::run(job, first).inspect_err(|_| self.finished(main))
    }

    fn finished(&self, main: bool) {
        if main {
            self.main.store(false, Ordering::SeqCst);
        }
        let Ok(mut running) = self.running.lock() else {
            return;
        };
        *running = running.saturating_sub(1);
        if *running == 0 {
            // No request's code runs: threads that call a stub from now on get the
            // fallback, those still waiting get it now.
            self.forwarder.close(false);
            self.idle.notify_all();
        }
    }

    /// Waits until no request's code runs (the connection ended under it: its end
    /// decides what happens next).
    fn wait_until_idle(&self) {
        let Ok(mut running) = self.running.lock() else {
            return;
        };
        while *running > 0 {
            running = match self.idle.wait(running) {
                Ok(r) => r,
                Err(_) => return,
            };
        }
    }

    /// On the serving thread while code runs: waits up to `ms` for the connection or a
    /// thread's stub, and resolves the stubs queued. `Ok(true)` when the connection has
    /// bytes to read, `Err` when it ended.
    fn serve_stubs(&self, serving: &Serving, ms: libc::c_int) -> Result<bool, Ending> {
        let socket = serving.channel.borrow().raw_fd();
        let mut fds = [socket, self.wake_read].map(|fd| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        });
        // SAFETY: two valid pollfd entries.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), 2, ms) };
        if n <= 0 || fds[1].revents == 0 {
            return Ok(n > 0 && fds[0].revents != 0);
        }
        let mut sink = [0u8; 64];
        // SAFETY: reads into a local buffer from our non-blocking pipe.
        while unsafe { libc::read(self.wake_read, sink.as_mut_ptr().cast(), sink.len()) } > 0 {}
        for (stub, forwarded) in self.forwarder.take() {
            forwarded.answer(resolve_through(serving, stub));
        }
        match serving.ended.borrow_mut().take() {
            Some(ending) => Err(ending),
            // What the connection has is read at the next look.
            None => Ok(false),
        }
    }
}

impl Drop for CodeJobs {
    fn drop(&mut self) {
        if let Ok(mut f) = FORWARDER.lock() {
            *f = None;
        }
        self.forwarder.close(true);
        for fd in [self.wake_read, self.forwarder.wake] {
            // SAFETY: our descriptors, closed once; the write end only after the queue
            // ended (under its lock).
            unsafe { libc::close(fd) };
        }
    }
}

/// The code `request` runs, its addresses checked first (the state is not borrowed while
/// it runs: a stub it calls may have requests served meanwhile); `None` for a request
/// that runs no code. `Some((main, code))`.
fn code_of(state: &State, request: &Request) -> Option<Result<(bool, CodeJob), String>> {
    let checked = |addresses: &[u64]| addresses.iter().try_for_each(|&a| state.code(a));
    Some(match request {
        &Request::RunMain { address, ref args } => checked(&[address]).map(|()| {
            let args = args.clone();
            let code: CodeJob = Box::new(move || {
                // SAFETY: main lies in memory this executor reserved (checked above),
                // linked by the controller.
                let status = unsafe { runtime::call_main(address, &args) };
                leave_if_forked_child(status);
                // As a native program's exit would after main: this thread's
                // thread-local destructors first (the thread stays, for the next main),
                // then stdio flushed.
                kiln_runtime::thread_locals::end_thread_locals();
                runtime::flush_stdio();
                Response::Value(status as u32 as u64)
            });
            (true, code)
        }),
        &Request::Call { address, ref args } => checked(&[address]).map(|()| {
            let args = args.clone();
            let code: CodeJob = Box::new(move || {
                let mut a = [0u64; 6];
                a[..args.len()].copy_from_slice(&args);
                // SAFETY: the function lies in memory this executor reserved; extra
                // integer arguments are ignored by a callee with fewer parameters (SysV
                // ABI).
                let f: extern "C" fn(u64, u64, u64, u64, u64, u64) -> u64 =
                    unsafe { std::mem::transmute(address as usize) };
                let v = f(a[0], a[1], a[2], a[3], a[4], a[5]);
                leave_if_forked_child(v as i32);
                runtime::flush_stdio();
                Response::Value(v)
            });
            (false, code)
        }),
        Request::RunInitializers { functions } => checked(functions).map(|()| {
            let functions = functions.clone();
            let code: CodeJob = Box::new(move || {
                // SAFETY: the functions lie in memory this executor reserved and the
                // controller linked and finalized.
                unsafe { runtime::run_initializers(&functions) };
                Response::Ok
            });
            (false, code)
        }),
        &Request::RunFinalizers {
            dso_handle,
            ref functions,
        } => checked(functions).map(|()| {
            let functions = functions.clone();
            let code: CodeJob = Box::new(move || {
                // SAFETY: as for initializers.
                unsafe { runtime::run_finalizers(dso_handle, &functions) };
                Response::Ok
            });
            (false, code)
        }),
        _ => return None,
    })
}

/// Starts request `id`'s code (see [`CodeJobs`]); `Some` when the connection ends.
fn run_code(serving: &Serving, id: u32, main: bool, code: CodeJob) -> Option<Ending> {
    if serving.jobs.get().is_none() {
        match CodeJobs::new() {
            Ok(jobs) => {
                let _ = serving.jobs.set(jobs);
            }
            Err(e) => return serving.answer(id, Response::Error(e)),
        }
    }
    let Some(jobs) = serving.jobs.get() else {
        return serving.answer(id, Response::Error("cannot run code".into()));
    };
    let sender = serving.channel.borrow().sender();
    match jobs.submit(id, main, code, sender) {
        Ok(()) => None,
        Err(e) => serving.answer(id, Response::Error(e)),
    }
}

/// Work for main's thread.
type Job = Box<dyn FnOnce() + Send>;

/// The thread main runs on: made when serving starts (the executor is idle while the
/// controller loads and links), so that running main costs a wake-up rather than a
/// thread's creation (its stack, its malloc arena, its signal stacks: ~0.35 ms of an
/// empty program's `kiln run --oop`). Unnamed: it keeps the process's name (`comm`), as a
/// program's main thread does, for perf reports and the program's own
/// `prctl(PR_GET_NAME)`.
struct CodeRunner;

/// The runner's queue, once started.
static CODE_RUNNER: std::sync::Mutex<Option<std::sync::mpsc::Sender<Job>>> =
    std::sync::Mutex::new(None);

impl CodeRunner {
    /// Starts the thread (once per process; a failure leaves `run` to start one per job).
    fn start() {
        let Ok(mut runner) = CODE_RUNNER.lock() else {
            return;
        };
        if runner.is_some() {
            return;
        }
        let (jobs, queue) = std::sync::mpsc::channel::<Job>();
        let started = std::thread::Builder::new()
            .stack_size(8 << 20)
            .spawn(move || {
                let _stack = AlternateStack::install();
                // The thread's first allocation makes its malloc arena: now, not in main.
                drop(std::hint::black_box(vec![0u8; 256]));
                while let Some(job) = next_job(&queue) {
                    job();
                }
            });
        if started.is_ok() {
            *runner = Some(jobs);
        }
    }

    /// Runs `job` on main's thread when `on_main_thread` (it is idle), else (or where it
    /// could not be made) on a new one.
    fn run(job: Job, on_main_thread: bool) -> Result<(), String> {
        let runner = if on_main_thread {
            CODE_RUNNER.lock().ok().and_then(|r| r.clone())
        } else {
            None
        };
        let job = match runner {
            Some(jobs) => match jobs.send(job) {
                Ok(()) => return Ok(()),
                Err(std::sync::mpsc::SendError(job)) => job,
            },
            None => job,
        };
        std::thread::Builder::new()
            .stack_size(8 << 20)
            .spawn(move || {
                let _stack = AlternateStack::install();
                job();
            })
            .map(|_| ())
            .map_err(|e| e.to_string())
    }
}

/// How long main's thread looks for its next job before it sleeps.
const RUNNER_SPIN: Duration = Duration::from_micros(50);

/// main's thread's next job: looked for without sleeping for [`RUNNER_SPIN`] after the
/// last (a controller calling in a loop sends the next within that), then waited for.
/// A sleeping thread's wake-up is what a call paid: 19 -> 46 µs a round trip on this
/// VM, where waking an idle virtual CPU is slow.
fn next_job(queue: &std::sync::mpsc::Receiver<Job>) -> Option<Job> {
    let start = std::time::Instant::now();
    loop {
        match queue.try_recv() {
            Ok(job) => return Some(job),
            Err(std::sync::mpsc::TryRecvError::Disconnected) => return None,
            Err(std::sync::mpsc::TryRecvError::Empty) if start.elapsed() < RUNNER_SPIN => {
                std::hint::spin_loop()
            }
            Err(std::sync::mpsc::TryRecvError::Empty) => return queue.recv().ok(),
        }
    }
}

/// The calling thread's alternate signal stack, so that a stack overflow in JIT code is
/// reported too; given back (disabled and freed) when dropped.
struct AlternateStack {
    _memory: Box<[u8]>,
}

impl AlternateStack {
    const SIZE: usize = 64 * 1024;

    fn install() -> Self {
        let mut stack = vec![0u8; Self::SIZE].into_boxed_slice();
        let ss = libc::stack_t {
            ss_sp: stack.as_mut_ptr().cast(),
            ss_flags: 0,
            ss_size: Self::SIZE,
        };
        // SAFETY: the stack lives until `drop`, which disables it first.
        unsafe { libc::sigaltstack(&ss, std::ptr::null_mut()) };
        AlternateStack { _memory: stack }
    }
}

impl Drop for AlternateStack {
    fn drop(&mut self) {
        let ss = libc::stack_t {
            ss_sp: std::ptr::null_mut(),
            ss_flags: libc::SS_DISABLE,
            ss_size: 0,
        };
        // SAFETY: disables this thread's alternate stack before its memory is freed.
        unsafe { libc::sigaltstack(&ss, std::ptr::null_mut()) };
    }
}

/// How a connection is served.
#[derive(Clone, Default)]
pub struct ServeOptions {
    /// Longest wait for a request or for the next bytes of one (`None`: forever). A
    /// controller that stays silent longer is dropped.
    pub idle_timeout: Option<Duration>,
    /// Until the first request has arrived: the longest wait for it, instead of the idle
    /// timeout. A connection counts as authenticated only once its first request came (for
    /// a keyed one, once the client's first transport message decrypted: a replayer of a
    /// recorded handshake cannot make one), so it is held no longer than this before.
    pub first_request_timeout: Option<Duration>,
    /// Called once, when the first request has arrived.
    pub on_first_request: Option<std::sync::Arc<dyn Fn() + Send + Sync>>,
    /// Send the program's standard output and error to the controller (for `--listen`:
    /// the executor's terminal is not the user's).
    pub forward_output: bool,
    /// This process ends when the connection does (`kiln-executor`'s own modes): at a
    /// shutdown its standard streams are let go before the answer (the program's last
    /// output is out; whoever reads the controller's pipes sees their end when the
    /// controller exits, not when this process has torn down), and what the connection
    /// reserved is left to the process's exit rather than unmapped piece by piece.
    pub ends_process: bool,
}

impl std::fmt::Debug for ServeOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServeOptions")
            .field("idle_timeout", &self.idle_timeout)
            .field("first_request_timeout", &self.first_request_timeout)
            .field("on_first_request", &self.on_first_request.is_some())
            .field("forward_output", &self.forward_output)
            .field("ends_process", &self.ends_process)
            .finish()
    }
}

/// Serves one connection until it closes or asks to shut down.
pub fn serve(channel: Channel) -> Ending {
    serve_with(channel, &ServeOptions::default())
}

/// What the serving thread serves with. Shared, through [`SERVING`], with the resolver
/// of call-through stubs: JIT code that the serving thread runs (a `Call`, `RunMain`,
/// initializers) may call a stub with no body yet, and the resolver then asks the
/// controller for it and serves the controller's requests (to link the body here) until
/// the answer comes. So nothing holds a borrow of the channel or the state while JIT code
/// runs.
struct Serving {
    channel: RefCell<Channel>,
    state: RefCell<State>,
    /// The last id of a request this executor made of the controller.
    last_request: Cell<u32>,
    /// How the connection ended while JIT code waited for a stub's body.
    ended: RefCell<Option<Ending>>,
    /// What runs the code of requests (made at the first).
    jobs: std::cell::OnceCell<std::sync::Arc<CodeJobs>>,
    /// [`ServeOptions::ends_process`].
    ends_process: bool,
}

impl Serving {
    /// Sends `response` to request `id`; `Some` when the connection is gone.
    fn answer(&self, id: u32, response: Response) -> Option<Ending> {
        self.channel
            .borrow_mut()
            .send(&with_id(response.encode(), id))
            .is_err()
            .then_some(Ending::Closed)
    }
}

thread_local! {
    /// The connection this thread serves, while it serves one (a `*const Serving`).
    static SERVING: Cell<*const ()> = const { Cell::new(std::ptr::null()) };
}

/// Sets [`SERVING`] for the lifetime of the value, restoring the previous one after.
struct CurrentServing(*const ());

impl CurrentServing {
    fn enter(serving: &Serving) -> Self {
        let previous = SERVING.with(|s| s.replace((serving as *const Serving).cast()));
        CurrentServing(previous)
    }
}

impl Drop for CurrentServing {
    fn drop(&mut self) {
        SERVING.with(|s| s.set(self.0));
    }
}

/// Resolves call-through stub `stub` through the controller: on the thread that serves
/// the connection, itself; on any other thread (main's, a call's, and threads JIT code
/// starts) while a request's code runs, through the serving thread
/// ([`forward_to_serving_thread`]). `None` where neither can (no connection, or no
/// request's code running to forward for).
pub(crate) fn resolve_if_serving(stub: u64) -> Option<u64> {
    let pointer = SERVING.with(Cell::get);
    if pointer.is_null() {
        return forward_to_serving_thread(stub);
    }
    // SAFETY: SERVING points at the `Serving` of the `serve_with` frame below us on this
    // thread's stack (set by `CurrentServing`, cleared before that frame returns); it is
    // used only through shared references and `RefCell`s, none borrowed while JIT code
    // runs.
    let serving: &Serving = unsafe { &*pointer.cast::<Serving>() };
    Some(resolve_through(serving, stub))
}

/// On the serving thread: sends [`Request::ResolveStub`], serves the controller's
/// requests until its answer, stores the body's address in the stub's slot (after
/// checking the slot is 8-byte aligned memory this executor reserved and prepared), and
/// returns where the call continues.
fn resolve_through(serving: &Serving, stub: u64) -> u64 {
    let failed = kiln_runtime::lazy_entry::lazy_call_failed_address();
    // JIT code run while a request holds the state (a library's constructor run by
    // `dlopen`) cannot have requests served meanwhile.
    if serving.state.try_borrow_mut().is_err() || serving.channel.try_borrow_mut().is_err() {
        eprintln!(
            "kiln-executor: call-through stub {stub} called while a request is being served; the call returns 0"
        );
        return failed;
    }
    let n = serving.last_request.get() % (EXECUTOR_REQUEST - 1) + 1;
    serving.last_request.set(n);
    let id = EXECUTOR_REQUEST | n;
    let request = with_id(Request::ResolveStub { stub }.encode(), id);
    // A `StoreCodePointer` of the slot served from now on is newer than the answer.
    let asked = kiln_runtime::code_guards::now();
    if serving.channel.borrow_mut().send(&request).is_err() {
        return failed;
    }
    loop {
        let received = serving.channel.borrow_mut().recv();
        let Ok(body) = received else {
            serving.ended.borrow_mut().get_or_insert(Ending::Closed);
            return failed;
        };
        if message_id(&body) != Some(id) {
            // The controller's requests, made to link the body here.
            if let Some(ending) = serve_one(serving, body) {
                serving.ended.borrow_mut().get_or_insert(ending);
                return failed;
            }
            continue;
        }
        return match Response::decode(&body) {
            Ok(Response::StubResolved { target, slot }) => {
                if slot != 0 {
                    let state = serving.state.borrow();
                    let usable = slot % 8 == 0 && state.accessible(slot, 8).is_ok();
                    if !usable {
                        return failed;
                    }
                    // A swap stored a newer body while the answer was on its way: the
                    // slot keeps it (this call still runs the body it was answered,
                    // which the request's guard, taken before, keeps).
                    if state.slot_stores.get(&slot).is_some_and(|&e| e >= asked) {
                        return target;
                    }
                    drop(state);
                    // SAFETY: an aligned slot on prepared pages of memory this executor
                    // reserved: a stub's slot, which only atomic stores and the stub's
                    // loads touch.
                    unsafe { kiln_runtime::lazy_entry::store_code_pointer(slot, target) };
                }
                target
            }
            _ => failed,
        };
    }
}

/// A stub's resolution asked of the serving thread by another thread, and its answer.
#[derive(Default)]
struct Forwarded {
    target: std::sync::Mutex<Option<u64>>,
    ready: std::sync::Condvar,
}

impl Forwarded {
    fn answer(&self, target: u64) {
        if let Ok(mut t) = self.target.lock() {
            *t = Some(target);
        }
        self.ready.notify_all();
    }
}

/// While a request's code runs on another thread, the serving thread resolves stubs for
/// every other thread: they queue the stub and wake it through a pipe.
struct Forwarder {
    queue: std::sync::Mutex<ForwardQueue>,
    /// The write end of the serving thread's wake-up pipe (written under the queue's
    /// lock, and closed only after the queue has ended).
    wake: libc::c_int,
}

/// Resolutions waiting for the serving thread.
#[derive(Default)]
struct ForwardQueue {
    waiting: Vec<(u64, std::sync::Arc<Forwarded>)>,
    /// A request's code runs: the serving thread reads the connection for the threads
    /// that queue. When none does, a thread calling gets the fallback at once.
    open: bool,
    /// The connection's serving has ended: the wake-up pipe may be closed.
    ended: bool,
}

impl Forwarder {
    /// From now on threads may queue: a request's code runs.
    fn open(&self) {
        if let Ok(mut queue) = self.queue.lock() {
            queue.open = true;
        }
    }

    /// Takes what is queued.
    fn take(&self) -> Vec<(u64, std::sync::Arc<Forwarded>)> {
        self.queue
            .lock()
            .map(|mut queue| std::mem::take(&mut queue.waiting))
            .unwrap_or_default()
    }

    /// No thread may queue any more (for good with `end`: the wake-up pipe may then
    /// close); those waiting get the fallback.
    fn close(&self, end: bool) {
        let waiting = match self.queue.lock() {
            Ok(mut queue) => {
                queue.open = false;
                queue.ended |= end;
                std::mem::take(&mut queue.waiting)
            }
            Err(_) => Vec::new(),
        };
        let failed = kiln_runtime::lazy_entry::lazy_call_failed_address();
        for (_, forwarded) in waiting {
            forwarded.answer(failed);
        }
    }
}

/// The forwarder of the code that runs now ([`Running`]), if some does.
static FORWARDER: std::sync::Mutex<Option<std::sync::Arc<Forwarder>>> = std::sync::Mutex::new(None);

/// Asks the serving thread to resolve `stub` and waits for its answer; `None` when no
/// request's code runs (nobody reads the connection for this thread).
fn forward_to_serving_thread(stub: u64) -> Option<u64> {
    let forwarder = FORWARDER.lock().ok()?.clone()?;
    let forwarded = std::sync::Arc::new(Forwarded::default());
    {
        let mut queue = forwarder.queue.lock().ok()?;
        // The code returned while this thread looked: nobody will answer.
        if !queue.open || queue.ended {
            return None;
        }
        queue.waiting.push((stub, forwarded.clone()));
        // SAFETY: one byte to the serving thread's pipe, which stays open until the
        // queue has ended (under this lock, which we hold).
        unsafe { libc::write(forwarder.wake, b"r".as_ptr().cast(), 1) };
    }
    let mut target = forwarded.target.lock().ok()?;
    loop {
        if let Some(t) = *target {
            return Some(t);
        }
        target = forwarded.ready.wait(target).ok()?;
    }
}

/// Serves one connection with `options`.
pub fn serve_with(mut channel: Channel, options: &ServeOptions) -> Ending {
    kiln_runtime::lazy_entry::set_serving_resolver(resolve_if_serving);
    let mut state = State::new();
    state.can_pass_fds = channel.can_pass_fds();
    channel.set_max_frame(kiln_wire::protocol::MAX_FRAME);
    let first_timeout = options.first_request_timeout.or(options.idle_timeout);
    if let Err(e) = channel.set_timeout(first_timeout) {
        return Ending::Failed(e.to_string());
    }
    // The timeouts bound each whole frame, not only each read of it.
    channel.set_frame_deadline(first_timeout.is_some());
    let mut runtime_symbols = kiln_runtime::thread_locals::runtime_symbols();
    if let Some(entry) = kiln_runtime::lazy_entry::lazy_entry_address() {
        runtime_symbols.push(("__kiln_lazy_entry".into(), entry));
        runtime_symbols.push((
            "__kiln_lazy_call_failed".into(),
            kiln_runtime::lazy_entry::lazy_call_failed_address(),
        ));
    }
    // The loader's shims, for exports deferred until JIT code first asks the loader.
    for name in ["dlopen", "dlmopen", "dlsym", "dlvsym"] {
        if let Some(address) = runtime::loader_shim(name) {
            runtime_symbols.push((
                format!("{}{name}", kiln_wire::protocol::LOADER_SHIM_PREFIX),
                address,
            ));
        }
    }
    let hello = Hello {
        version: VERSION,
        page_size: state.mapper.as_ref().map_or(4096, |m| m.page_size()),
        triple: format!("{}-unknown-linux-gnu", std::env::consts::ARCH),
        pid: std::process::id(),
        max_frame: kiln_wire::protocol::MAX_FRAME,
        runtime_symbols,
        features: kiln_wire::protocol::FEATURE_BATCH
            | kiln_wire::protocol::FEATURE_DEFERRED_EXPORTS,
    };
    if let Err(e) = channel.send(&hello.encode()) {
        return Ending::Failed(e.to_string());
    }
    if options.forward_output {
        if let Err(e) = forward_output(&channel.sender()) {
            return Ending::Failed(format!("cannot forward output: {e}"));
        }
    }
    install_reporters(channel.sender());
    // While the controller loads and links, this process is idle: main's thread is made
    // now rather than when main is asked for.
    CodeRunner::start();
    let serving = Serving {
        channel: RefCell::new(channel),
        state: RefCell::new(state),
        last_request: Cell::new(0),
        ended: RefCell::new(None),
        jobs: std::cell::OnceCell::new(),
        ends_process: options.ends_process,
    };
    let current = CurrentServing::enter(&serving);
    let ending = serve_requests(&serving, options);
    // Code still running when the connection ended decides what happens next (its
    // process's exit, a crash report): it runs to its end.
    if let Some(jobs) = serving.jobs.get() {
        jobs.wait_until_idle();
    }
    drop(current);
    if options.ends_process {
        // The exit releases it all at once.
        std::mem::forget(serving);
    }
    ending
}

/// The serving loop.
fn serve_requests(serving: &Serving, options: &ServeOptions) -> Ending {
    let mut first = true;
    loop {
        // While code runs, the threads' stubs are served too (between requests; every
        // 100 ms the code's end is looked for, after which the timeouts apply again).
        if let Some(jobs) = serving.jobs.get().filter(|j| j.busy()) {
            if !serving.channel.borrow().has_buffered() {
                match jobs.serve_stubs(serving, 100) {
                    Err(ending) => return ending,
                    Ok(false) => continue,
                    Ok(true) => {}
                }
            }
        }
        let received = serving.channel.borrow_mut().recv();
        let body = match received {
            Ok(body) if first => {
                first = false;
                let mut channel = serving.channel.borrow_mut();
                if let Err(e) = channel.set_timeout(options.idle_timeout) {
                    return Ending::Failed(e.to_string());
                }
                channel.set_frame_deadline(options.idle_timeout.is_some());
                drop(channel);
                if let Some(notify) = &options.on_first_request {
                    notify();
                }
                body
            }
            Ok(body) => body,
            Err(ChannelError::Closed) => return Ending::Closed,
            Err(ChannelError::TooLarge(n)) => {
                let _ = serving
                    .channel
                    .borrow_mut()
                    .send(&Response::Error(format!("frame of {n} bytes is too large")).encode());
                return Ending::Failed(format!("frame of {n} bytes"));
            }
            Err(e) => return Ending::Failed(e.to_string()),
        };
        if let Some(ending) = serve_one(serving, body) {
            return ending;
        }
        if let Some(ending) = serving.ended.borrow_mut().take() {
            return ending;
        }
    }
}

/// Serves one request; `Some` when the connection ends.
fn serve_one(serving: &Serving, body: Vec<u8>) -> Option<Ending> {
    let send = |frame: &[u8]| serving.channel.borrow_mut().send(frame);
    let id = message_id(&body).unwrap_or(0);
    if id & EXECUTOR_REQUEST != 0 {
        let _ = send(
            &Response::Error(format!(
                "message id {id:#x} is reserved for the executor's own requests"
            ))
            .encode(),
        );
        return Some(Ending::Failed(format!(
            "controller used a reserved id {id:#x}"
        )));
    }
    let request = match Request::decode(&body) {
        Ok(Request::ResolveStub { .. }) => {
            let refused =
                Response::Error("ResolveStub goes from the executor to the controller".into());
            return send(&with_id(refused.encode(), id))
                .is_err()
                .then_some(Ending::Closed);
        }
        Ok(r) => r,
        Err(e) => {
            let reply = Response::Error(format!("malformed request: {e}"));
            return send(&with_id(reply.encode(), id))
                .is_err()
                .then_some(Ending::Closed);
        }
    };
    if let Request::Input { bytes } = request {
        give_input(bytes);
        return None;
    }
    if request == Request::AdoptStdio {
        let mut channel = serving.channel.borrow_mut();
        let reply = match (channel.take_fd(), channel.take_fd(), channel.take_fd()) {
            (Some(input), Some(output), Some(error)) => {
                runtime::flush_stdio();
                for (fd, target) in [(&input, 0), (&output, 1), (&error, 2)] {
                    // SAFETY: dup2 onto this process's standard descriptors, from
                    // descriptors the controller sent us.
                    unsafe { libc::dup2(std::os::fd::AsRawFd::as_raw_fd(fd), target) };
                }
                Response::Ok
            }
            _ => Response::Error("adopt stdio: three descriptors expected".into()),
        };
        return channel
            .send(&with_id(reply.encode(), id))
            .is_err()
            .then_some(Ending::Closed);
    }
    let code = code_of(&serving.state.borrow(), &request);
    if let Some(code) = code {
        return match code {
            Ok((main, code)) => run_code(serving, id, main, code),
            Err(message) => send(&with_id(Response::Error(message).encode(), id))
                .is_err()
                .then_some(Ending::Closed),
        };
    }
    if request == Request::Shutdown {
        if let Some(jobs) = serving.jobs.get().filter(|j| j.busy()) {
            let busy = if jobs.main.load(Ordering::SeqCst) {
                "main is running"
            } else {
                "JIT code is running"
            };
            return send(&with_id(Response::Error(busy.into()).encode(), id))
                .is_err()
                .then_some(Ending::Closed);
        }
        runtime::flush_stdio();
        finish_output();
        if serving.ends_process {
            runtime::release_stdio();
        }
        let _ = send(&with_id(Response::Ok.encode(), id));
        return Some(Ending::Shutdown);
    }
    let outcome = handle(&mut serving.state.borrow_mut(), request);
    let sent = match outcome {
        Ok(Reply::Plain(response)) => send(&with_id(response.encode(), id)),
        Ok(Reply::WithFd(response, fd)) => serving
            .channel
            .borrow_mut()
            .send_with_fd(&with_id(response.encode(), id), fd.as_fd()),
        Err(message) => send(&with_id(Response::Error(message).encode(), id)),
    };
    sent.is_err().then_some(Ending::Closed)
}

enum Reply {
    Plain(Response),
    WithFd(Response, std::os::fd::OwnedFd),
}

/// `dlsym` in this process (or a library opened here): (address or 0, kind: 0 unknown,
/// 1 function, 2 data).
fn lookup(handle: *mut c_void, name: &str) -> (u64, u8) {
    match runtime::dlsym(handle, name) {
        Some(a) => (a, kind_to_wire(runtime::host_symbol_is_function(a))),
        None => (0, 0),
    }
}

/// Maps the pages of freshly initialized data segments into this process's page tables
/// in one call per segment: the controller wrote them through its own view, so they
/// exist but are not mapped here, and each first write would fault once per page (reads
/// of code and constants fault 16 pages at a time, which populating ahead did not beat:
/// Lua --oop within noise, and a 64 MiB code image's finalize went 0.2 -> 7 ms). Best
/// effort (Linux 5.14+; older kernels fault as before).
fn populate_target(segments: &[SegmentRange], page: u64) {
    const MADV_POPULATE_WRITE: libc::c_int = 23;
    for s in segments
        .iter()
        .filter(|s| s.permission == Permission::ReadWrite)
    {
        let start = s.target & !(page - 1);
        let end = (s.target + s.len).next_multiple_of(page);
        // SAFETY: populating changes neither contents nor permissions; the range covers
        // a segment the controller just initialized in one of this connection's
        // reservations (checked by the caller).
        unsafe {
            libc::madvise(
                start as *mut libc::c_void,
                (end - start) as usize,
                MADV_POPULATE_WRITE,
            )
        };
    }
}

/// Definitions a controller exports, each checked to lie in this connection's code.
fn exported(
    state: &State,
    symbols: Vec<kiln_wire::protocol::WireExport>,
) -> Result<Vec<kiln_runtime::shared_object::ExportedSymbol>, String> {
    symbols
        .into_iter()
        .map(|(name, address, size, function)| {
            state.code(address)?;
            Ok(kiln_runtime::shared_object::ExportedSymbol {
                name: name.into(),
                address,
                size,
                function,
            })
        })
        .collect()
}

fn handle(state: &mut State, request: Request) -> Result<Reply, String> {
    let ok = Ok(Reply::Plain(Response::Ok));
    match request {
        Request::Batch(requests) => {
            let mut answers = Vec::with_capacity(requests.len());
            for request in requests {
                let name = request.to_string();
                // The others are served by the connection's loop, not here.
                let answer = if request.batchable() {
                    handle(state, request)
                } else {
                    Err(format!("{name} cannot be batched"))
                };
                match answer {
                    Ok(Reply::Plain(response)) => answers.push(response),
                    Ok(Reply::WithFd(..)) => {
                        answers.push(Response::Error(format!("{name}: cannot be batched")));
                        break;
                    }
                    Err(message) => {
                        answers.push(Response::Error(message));
                        break;
                    }
                }
            }
            Ok(Reply::Plain(Response::Batched(answers)))
        }
        Request::Reserve {
            len,
            placement,
            share,
        } => {
            if share && !state.can_pass_fds {
                return Err(
                    "shared memory needs a Unix socket to pass its descriptor: use the copy transport over TCP"
                        .into(),
                );
            }
            let mapper = state.mapper()?;
            if len == 0 || len % mapper.page_size() != 0 || len > 1 << 40 {
                return Err(format!("cannot reserve {len:#x} bytes"));
            }
            let placement = match placement {
                WirePlacement::Anywhere => Placement::Anywhere,
                WirePlacement::HostLibraries => Placement::HostLibraries,
                WirePlacement::Near(start, end) if start <= end => Placement::Near { start, end },
                WirePlacement::Near(start, end) => {
                    return Err(format!(
                        "placement near {start:#x}..{end:#x}: the range is reversed"
                    ))
                }
                WirePlacement::Low2GiB => Placement::Low2GiB,
            };
            let reservation = mapper.reserve(len, &placement).map_err(|e| e.to_string())?;
            let fd = if share {
                match mapper.share(&reservation) {
                    Ok(fd) => Some(fd),
                    Err(e) => {
                        // SAFETY: just reserved, unused.
                        let _ = unsafe { mapper.release(&reservation) };
                        return Err(e.to_string());
                    }
                }
            } else {
                None
            };
            let handle = state.next_handle;
            state.next_handle += 1;
            let target = reservation.target;
            state.reservations.insert(handle, reservation);
            let response = Response::Reserved { target, handle };
            Ok(match fd {
                Some(fd) => Reply::WithFd(response, fd),
                None => Reply::Plain(response),
            })
        }
        Request::Prepare {
            handle,
            start,
            end,
            permission: p,
        } => {
            let r = *state.pages(handle, start, end)?;
            // SAFETY: checked to be whole pages of a reservation of this connection; the
            // controller's allocator owns their use.
            unsafe { state.mapper()?.prepare(&r, start, end, permission(p)) }
                .map_err(|e| e.to_string())?;
            state.unprepared_mut(handle).remove(start, end);
            ok
        }
        Request::Initialize { handle, segments } => {
            let r = *state.reservation(handle)?;
            let mut ranges = Vec::with_capacity(segments.len());
            for (target, len, p) in segments {
                state.checked(handle, target, len)?;
                ranges.push(SegmentRange {
                    target,
                    len,
                    permission: permission(p),
                });
            }
            // SAFETY: the segments lie in this reservation (checked); the controller has
            // finished writing them.
            unsafe { state.mapper()?.initialize(&r, &ranges) }.map_err(|e| e.to_string())?;
            populate_target(&ranges, state.mapper()?.page_size());
            ok
        }
        Request::Deinitialize { handle, start, end } => {
            let r = *state.pages(handle, start, end)?;
            // Queued perf records copy code from these pages: written first.
            kiln_runtime::debug_outputs::flush();
            // Unwind registrations on these pages go first: their data is discarded.
            state.eh_frames.retain(|&a, _| !(start..end).contains(&a));
            state.unprepared_mut(handle).insert(start, end);
            let p = Permission::ReadExecute;
            // SAFETY: whole pages of this connection's reservation that its allocator freed.
            unsafe { state.mapper()?.deinitialize(&r, start, end, p) }
                .map_err(|e| e.to_string())?;
            ok
        }
        Request::Release { handle } => {
            kiln_runtime::debug_outputs::flush();
            let r = state
                .reservations
                .remove(&handle)
                .ok_or_else(|| format!("no reservation with handle {handle}"))?;
            state.eh_frames.retain(|&addr, _| !r.contains(addr, 1));
            state.unprepared.remove(&handle);
            // SAFETY: removed from the table: released once; its code is the controller's
            // to have stopped using.
            unsafe { state.mapper()?.release(&r) }.map_err(|e| e.to_string())?;
            ok
        }
        Request::Write {
            handle,
            address,
            bytes,
        } => {
            let r = state.checked(handle, address, bytes.len() as u64)?;
            let working = r
                .working_address(address)
                .ok_or("address outside reservation")?;
            // SAFETY: the range lies inside the reservation (checked), whose working view
            // is a read-write mapping this executor owns.
            unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), working, bytes.len()) };
            ok
        }
        Request::Read {
            handle,
            address,
            len,
        } => {
            if len > u64::from(kiln_wire::protocol::MAX_WRITE) {
                return Err(format!("read of {len:#x} bytes is too large"));
            }
            let r = state.checked(handle, address, len)?;
            let working = r
                .working_address(address)
                .ok_or("address outside reservation")?;
            let mut out = vec![0u8; len as usize];
            // SAFETY: as for Write, reading.
            unsafe { std::ptr::copy_nonoverlapping(working, out.as_mut_ptr(), len as usize) };
            Ok(Reply::Plain(Response::Bytes(out)))
        }
        Request::Lookup { library, name } => {
            let (address, kind) = lookup(state.library(library)?, &name);
            Ok(Reply::Plain(Response::Symbol { address, kind }))
        }
        Request::LookupMany { library, names } => {
            let handle = state.library(library)?;
            let list = names.iter().map(|name| lookup(handle, name)).collect();
            Ok(Reply::Plain(Response::Symbols(list)))
        }
        Request::LoadLibrary { path } => {
            if let Some(&id) = state.library_paths.get(&path) {
                return Ok(Reply::Plain(Response::Value(id)));
            }
            // A library new to the process may need the program's names when it loads,
            // or look them up later: deferred exports are published before it where it
            // could see them.
            if let (_, Err(error)) = runtime::note_library_loading(&path) {
                tracing::warn!(%error, library = %path, "the program's exports could not be published");
            }
            let handle = runtime::dlopen(&path)?;
            let id = state.libraries.len() as u64 + 1;
            state.libraries.insert(id, Library(handle));
            state.library_paths.insert(path, id);
            Ok(Reply::Plain(Response::Value(id)))
        }
        Request::StoreCodePointer { slot, target } => {
            if slot % 8 != 0 {
                return Err(format!("slot {slot:#x} is not 8-byte aligned"));
            }
            state.accessible(slot, 8)?;
            state.code(target)?;
            // SAFETY: an aligned slot on prepared pages of memory this executor reserved
            // (checked): a stub's slot, which only atomic stores and the stub's loads
            // touch; the target lies in reserved code (checked).
            unsafe { kiln_runtime::lazy_entry::store_code_pointer(slot, target) };
            let epoch = kiln_runtime::code_guards::advance();
            state.slot_stores.insert(slot, epoch);
            Ok(Reply::Plain(Response::Value(epoch)))
        }
        Request::OldestCodeGuard => Ok(Reply::Plain(Response::Value(
            kiln_runtime::code_guards::oldest(),
        ))),
        Request::RegisterUnwindInfo { .. } | Request::DeregisterUnwindInfo { .. } => {
            Err("Windows unwind data is for Windows executors: this one registers .eh_frame".into())
        }
        Request::RegisterEhFrame { address } => {
            if state.eh_frames.contains_key(&address) {
                return Err(format!("eh_frame at {address:#x} is registered already"));
            }
            state.check_eh_frame(address)?;
            if let Some(reg) = EhFrameRegistration::register(address) {
                state.eh_frames.insert(address, reg);
            }
            ok
        }
        Request::DeregisterEhFrame { address } => {
            state.eh_frames.remove(&address);
            ok
        }
        Request::ReserveTlsModule => Ok(Reply::Plain(Response::Value(
            kiln_runtime::thread_locals::tls_reserve_module(),
        ))),
        Request::InstallTls {
            module_id,
            size,
            align,
            image,
        } => {
            if size > 1 << 30
                || !align.is_power_of_two()
                || align > 1 << 16
                || image.len() as u64 > size
            {
                return Err(format!(
                    "invalid TLS template: size {size}, align {align}, image {}",
                    image.len()
                ));
            }
            if !kiln_runtime::thread_locals::tls_install(kiln_runtime::thread_locals::TlsImage {
                module_id,
                image,
                size,
                align,
            }) {
                return Err(format!("TLS module {module_id:#x} was not reserved here"));
            }
            ok
        }
        Request::RemoveTls { module_id } => {
            kiln_runtime::thread_locals::tls_remove(module_id);
            ok
        }
        Request::PlaceStaticTls {
            module_id,
            size,
            align,
            image,
        } => {
            if size == 0 || !align.is_power_of_two() || align > 1 << 16 || image.len() as u64 > size
            {
                return Err(format!(
                    "invalid TLS block: size {size}, align {align}, image {}",
                    image.len()
                ));
            }
            let offset = kiln_runtime::thread_locals::tls_place_static(
                &kiln_runtime::thread_locals::TlsImage {
                    module_id,
                    image,
                    size,
                    align,
                },
            )?;
            Ok(Reply::Plain(Response::Value(offset as u64)))
        }
        Request::ExportSymbols { symbols } => {
            let list = exported(state, symbols)?;
            let handle = runtime::export_symbols(&list)?;
            let id = state.next_export;
            state.next_export += 1;
            state.exports.insert(id, handle);
            Ok(Reply::Plain(Response::Value(id)))
        }
        Request::DeferExports { handle, symbols } => {
            if handle & kiln_wire::protocol::CONTROLLER_HANDLE == 0 {
                return Err(format!(
                    "defer exports: handle {handle:#x} is not a controller's (bit 63 clear)"
                ));
            }
            if state.exports.contains_key(&handle) {
                return Err(format!("defer exports: handle {handle:#x} is in use"));
            }
            let list = exported(state, symbols)?;
            let exports = runtime::export_symbols_on_demand(list)?;
            state.exports.insert(handle, exports);
            ok
        }
        Request::EnableDebugOutputs(outputs) => {
            kiln_runtime::debug_outputs::enable(&outputs)?;
            if outputs.gdb && state.reservations.is_empty() {
                // Code a debugger can put breakpoints in: private target views (a
                // debugger cannot write to a shared read-only page). Reservations made
                // before stay shared (hardware breakpoints only there).
                if let Ok(mapper) = std::mem::replace(&mut state.mapper, Err(String::new())) {
                    drop(mapper);
                }
                state.mapper = DualMappedMapper::new()
                    .map(|m| m.with_private_target(true))
                    .map_err(|e| e.to_string());
            }
            ok
        }
        Request::RegisterDebug(module) => {
            for f in &module.functions {
                state.accessible(f.address, f.size)?;
            }
            // SAFETY: every function lies in memory this executor reserved (checked).
            let handle = unsafe { kiln_runtime::debug_outputs::register(module) }?;
            Ok(Reply::Plain(Response::Value(handle)))
        }
        Request::UnregisterDebug { handle } => {
            kiln_runtime::debug_outputs::unregister(handle);
            ok
        }
        Request::UnexportSymbols { handle } => match state.exports.remove(&handle) {
            Some(h) => {
                runtime::unexport_symbols(h);
                ok
            }
            None => Err(format!("no exports with handle {handle}")),
        },
        Request::RunMain { .. }
        | Request::Call { .. }
        | Request::RunInitializers { .. }
        | Request::RunFinalizers { .. } => Err("runs code: served by run_code".into()),
        Request::ResolveStub { .. } => {
            Err("ResolveStub goes from the executor to the controller".into())
        }
        Request::Shutdown => ok,
        Request::Input { bytes } => {
            give_input(bytes);
            ok
        }
        Request::AdoptStdio => Err("adopt stdio: handled by the connection".into()),
        Request::SetEnvironment {
            variables,
            directory,
        } => {
            kiln_runtime::runtime::adopt_environment(&variables, &directory)?;
            ok
        }
        Request::GuardBranchTargets { address, len } => {
            let page = state.mapper()?.page_size();
            if address % page != 0 || len % page != 0 || len == 0 {
                return Err(format!(
                    "guard branch targets: {address:#x}+{len:#x} is not whole pages"
                ));
            }
            state.accessible(address, len)?;
            // SAFETY: whole prepared pages of a reservation of ours; the session asks for
            // its modules' code only (replacing its permission by read + execute + guard,
            // never adding write).
            unsafe { kiln_runtime::runtime::guard_branch_targets(address, len)? };
            ok
        }
    }
}
