//! The entry of Kiln's own binaries (`kiln`, `kiln-executor`): `main` without Rust's
//! runtime set-up.
//!
//! Rust's `main` runs `std::rt::init` first. Of what it does, a process that runs JIT code
//! needs two things — standard descriptors that are open and `SIGPIPE` ignored — and
//! pays for one it does not use: finding the main thread's stack (glibc's
//! `pthread_getattr_np` reads and scans `/proc/self/maps`) to install a handler that
//! names a stack overflow, with its own alternate signal stack. Kiln installs its own
//! handlers for the signals of JIT code (the crash reporter), replacing that one as soon
//! as code runs. Measured on `kiln --version` (`perf stat -r 100`, the two builds copied
//! side by side): 0.50–0.52 → 0.44–0.47 ms of CPU (page faults 145–149 → 138–141).
//!
//! A binary declares `#![no_main]` and a C `main` that calls [`run`]:
//!
//! ```
//! #![no_main]
//!
//! #[unsafe(no_mangle)]
//! extern "C" fn main(_argc: std::ffi::c_int, _argv: *const *const std::ffi::c_char) -> std::ffi::c_int {
//!     kiln_runtime::process_entry::run(|| 0)
//! }
//! ```
//!
//! [`process_main!`](crate::process_main) writes that `main` (and, for the binary's own
//! unit tests, whose harness brings its own entry, an ordinary one); the binary still
//! declares `#![cfg_attr(not(test), no_main)]`.
//!
//! `std::env::args` works as before (glibc hands the arguments to the standard library's
//! initializer); what is lost is only the stack-overflow message (a Kiln binary that
//! overflows its own stack ends with `SIGSEGV`, as a C program does) and the main
//! thread's name in a panic's message.

use std::ffi::c_int;

/// The entry of a binary that declares `#![cfg_attr(not(test), no_main)]`: a C `main`
/// that runs `$main` (an `FnOnce() -> c_int`, its status the process's) through [`run`],
/// and under the test harness an ordinary `main` that calls it. `kiln` and
/// `kiln-executor` begin so.
#[macro_export]
macro_rules! process_main {
    ($main:expr) => {
        /// The process's entry: the binary's main without Rust's runtime set-up.
        #[cfg(not(test))]
        #[unsafe(no_mangle)]
        extern "C" fn main(
            _argc: ::std::ffi::c_int,
            _argv: *const *const ::std::ffi::c_char,
        ) -> ::std::ffi::c_int {
            $crate::process_entry::run($main)
        }

        /// Under the test harness (which brings its own entry), an ordinary `main`.
        #[cfg(test)]
        fn main() {
            let _status: ::std::ffi::c_int = ($main)();
        }
    };
}

/// Sets up what Rust's runtime would (standard descriptors, `SIGPIPE`), runs `main`, and
/// ends the process with its status: standard output flushed, `101` if `main` panicked
/// (as Rust's runtime ends a program whose `main` panics). Never returns.
pub fn run(main: impl FnOnce() -> c_int + std::panic::UnwindSafe) -> ! {
    standard_descriptors_open();
    // SAFETY: setting a signal's disposition to "ignore" has no memory effects; this is
    // what Rust's runtime does before `main` (writes to a closed pipe or socket are
    // errors, not the end of the process), kept so that programs run as before.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_IGN) };
    let status = std::panic::catch_unwind(main).unwrap_or(101);
    // `exit` flushes standard output and runs the C runtime's `atexit` handlers.
    std::process::exit(status)
}

/// Opens `/dev/null` on any of descriptors 0, 1 and 2 that is closed, as Rust's runtime
/// does: otherwise the first file `kiln` opens would become the program's standard input
/// or output. Asked of all three by one `poll` (each by `fcntl` if `poll` cannot); a
/// `/dev/null` that cannot be opened ends the process, as in Rust's runtime.
fn standard_descriptors_open() {
    let mut fds = [0, 1, 2].map(|fd| libc::pollfd {
        fd,
        events: 0,
        revents: 0,
    });
    // SAFETY: `fds` is three valid `pollfd`s; a zero timeout never blocks.
    let closed: [bool; 3] = if unsafe { libc::poll(fds.as_mut_ptr(), 3, 0) } >= 0 {
        fds.map(|pfd| pfd.revents & libc::POLLNVAL != 0)
    } else {
        // SAFETY: F_GETFD on a descriptor number reads its flags and nothing else.
        [0, 1, 2].map(|fd| unsafe { libc::fcntl(fd, libc::F_GETFD) } == -1)
    };
    for (fd, closed) in closed.into_iter().enumerate() {
        if !closed {
            continue;
        }
        // SAFETY: opening a constant path; the descriptor, the lowest free one, is the
        // closed standard one, kept open for the process's life.
        let opened = unsafe { libc::open(c"/dev/null".as_ptr(), libc::O_RDWR) };
        if opened != fd as libc::c_int {
            // SAFETY: abort(3) ends the process; nothing runs after it.
            unsafe { libc::abort() };
        }
    }
}
