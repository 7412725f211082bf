//! The listening executor's supervisor: a process per connection, and no way for clients
//! without the key to hold those processes.
//!
//! Each accepted connection is served by a forked process of its own (one client's crash,
//! `exit()` or stall touches no other). Until the connection is *authenticated* — its first
//! request has arrived, which for a keyed connection means the client's first transport
//! message decrypted, something a replayer of a recorded handshake cannot make — its
//! process is one of at most `max_unauthenticated`; when a new connection arrives and all
//! those places are taken, the oldest unauthenticated process is killed. A flood of silent
//! connections, of slow handshakes or of replayed first handshake messages therefore holds
//! a bounded number of processes, and a client with the key still gets in. The serving
//! process tells the supervisor it is authenticated through a pipe ([`Notifier`]).
//!
//! Finished processes are reaped at once: `SIGCHLD` writes to the same pipe (the
//! self-pipe trick), which wakes the supervisor's `poll`.

use std::collections::HashMap;
use std::os::fd::{AsRawFd, RawFd};
use std::time::Instant;

/// Limits of the supervisor.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Most authenticated connections served at once; more are closed at once.
    pub max_connections: usize,
    /// Most connections in their handshake at once; the oldest makes room for a new one.
    pub max_unauthenticated: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_connections: 1024,
            max_unauthenticated: 64,
        }
    }
}

/// The write end of the supervisor's pipe, for the serving process.
#[derive(Debug, Clone, Copy)]
pub struct Notifier(RawFd);

/// A record on the pipe: `A` and a pid (a process is authenticated), or `C` (a child
/// ended). Each is written whole (fewer than `PIPE_BUF` bytes: atomic).
const AUTHENTICATED: u8 = b'A';
const CHILD_ENDED: u8 = b'C';

/// The write end, for the `SIGCHLD` handler (set once, before the handler is installed).
static SIGNAL_FD: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(-1);

extern "C" fn on_child_ended(_: libc::c_int) {
    let fd = SIGNAL_FD.load(std::sync::atomic::Ordering::Relaxed);
    if fd >= 0 {
        let errno = std::io::Error::last_os_error().raw_os_error();
        // SAFETY: write(2) is async-signal-safe; one byte from a static. A full pipe
        // (EAGAIN) is fine: the supervisor will read and reap anyway.
        unsafe { libc::write(fd, [CHILD_ENDED].as_ptr().cast(), 1) };
        if let Some(errno) = errno {
            // SAFETY: restores errno for the interrupted code.
            unsafe { *libc::__errno_location() = errno };
        }
    }
}

impl Notifier {
    /// Tells the supervisor this process's connection is authenticated, then closes the
    /// pipe (it is told once).
    pub fn authenticated(self) {
        let mut record = [0u8; 5];
        record[0] = AUTHENTICATED;
        record[1..].copy_from_slice(&std::process::id().to_le_bytes());
        // SAFETY: writes 5 bytes from a local buffer to our copy of the pipe; the
        // supervisor drains it. Nothing else in this process uses the descriptor.
        unsafe {
            libc::write(self.0, record.as_ptr().cast(), record.len());
            libc::close(self.0);
        }
    }
}

struct Child {
    started: Instant,
    authenticated: bool,
}

/// Serves each connection of `listener` in a forked process: `serve(connection, notifier)`
/// returns its exit code, after calling `notifier.authenticated()` once its first request
/// came (or never). Never returns.
pub fn serve_forever<L: Listener>(
    listener: L,
    limits: Limits,
    serve: impl Fn(L::Connection, Notifier) -> i32,
) -> ! {
    let mut fds = [0 as RawFd; 2];
    // SAFETY: pipe2 fills the two-element array with new descriptors.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC | libc::O_NONBLOCK) } != 0 {
        eprintln!(
            "kiln-executor: cannot make a pipe: {}",
            std::io::Error::last_os_error()
        );
        std::process::exit(1);
    }
    let [read_end, write_end] = fds;
    SIGNAL_FD.store(write_end, std::sync::atomic::Ordering::Relaxed);
    // SAFETY: installs an async-signal-safe handler for SIGCHLD (it only writes a byte);
    // SA_RESTART so that blocking calls are resumed, SA_NOCLDSTOP: only ended children.
    unsafe {
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = on_child_ended as *const () as usize;
        action.sa_flags = libc::SA_RESTART | libc::SA_NOCLDSTOP;
        libc::sigemptyset(&mut action.sa_mask);
        libc::sigaction(libc::SIGCHLD, &action, std::ptr::null_mut());
    }
    if let Err(e) = listener.set_nonblocking() {
        eprintln!("kiln-executor: cannot make the listener non-blocking: {e}");
        std::process::exit(1);
    }
    let mut children: HashMap<libc::pid_t, Child> = HashMap::new();
    let mut pending = Vec::new();
    loop {
        let mut polled = [
            libc::pollfd {
                fd: listener.raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: read_end,
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        // SAFETY: polls two descriptors of ours, the array outlives the call.
        unsafe { libc::poll(polled.as_mut_ptr(), 2, 1000) };
        drain(read_end, &mut pending, &mut children);
        reap(&mut children);
        if polled[0].revents & libc::POLLIN == 0 {
            continue;
        }
        // Accept everything that is waiting.
        while let Some(connection) = listener.accept() {
            reap(&mut children);
            let authenticated = children.values().filter(|c| c.authenticated).count();
            if authenticated >= limits.max_connections {
                drop(connection); // refused: the client sees the connection close
                continue;
            }
            evict_for_one_more(&mut children, limits.max_unauthenticated);
            // SAFETY: the supervisor is single-threaded; the child serves one connection
            // and ends with _exit; the parent only records the child.
            match unsafe { libc::fork() } {
                0 => {
                    // SAFETY: the child's copies of the listening socket and the read end,
                    // not used in the child; the signal handler is the parent's business.
                    unsafe {
                        libc::close(listener.raw_fd());
                        libc::close(read_end);
                        libc::signal(libc::SIGCHLD, libc::SIG_DFL);
                    }
                    SIGNAL_FD.store(-1, std::sync::atomic::Ordering::Relaxed);
                    let code = serve(connection, Notifier(write_end));
                    kiln_runtime::runtime::flush_stdio();
                    // SAFETY: ends the child without the exit handlers JIT code registered.
                    unsafe { libc::_exit(code) }
                }
                pid if pid > 0 => {
                    children.insert(
                        pid,
                        Child {
                            started: Instant::now(),
                            authenticated: false,
                        },
                    );
                }
                _ => eprintln!(
                    "kiln-executor: cannot fork for a connection: {}",
                    std::io::Error::last_os_error()
                ),
            }
        }
    }
}

/// Kills the oldest unauthenticated processes until one more fits under `max`.
fn evict_for_one_more(children: &mut HashMap<libc::pid_t, Child>, max: usize) {
    loop {
        let waiting = children.values().filter(|c| !c.authenticated).count();
        if waiting < max.max(1) {
            return;
        }
        let Some((&oldest, _)) = children
            .iter()
            .filter(|(_, c)| !c.authenticated)
            .min_by_key(|(_, c)| c.started)
        else {
            return;
        };
        // SAFETY: kills and waits for a child of ours that has not been reaped (its pid
        // cannot have been reused).
        unsafe {
            libc::kill(oldest, libc::SIGKILL);
            libc::waitpid(oldest, std::ptr::null_mut(), 0);
        }
        children.remove(&oldest);
    }
}

/// Reads the pipe: marks authenticated processes (a record may be split by the reads).
fn drain(read_end: RawFd, pending: &mut Vec<u8>, children: &mut HashMap<libc::pid_t, Child>) {
    let mut buf = [0u8; 4096];
    loop {
        // SAFETY: reads into a local buffer from our non-blocking pipe.
        let n = unsafe { libc::read(read_end, buf.as_mut_ptr().cast(), buf.len()) };
        if n <= 0 {
            break;
        }
        pending.extend_from_slice(&buf[..n as usize]);
    }
    let mut at = 0;
    while at < pending.len() {
        match pending[at] {
            AUTHENTICATED if pending.len() - at >= 5 => {
                let mut pid = [0u8; 4];
                pid.copy_from_slice(&pending[at + 1..at + 5]);
                let pid = u32::from_le_bytes(pid) as libc::pid_t;
                if let Some(child) = children.get_mut(&pid) {
                    child.authenticated = true;
                }
                at += 5;
            }
            AUTHENTICATED => break, // the rest of the record comes with the next read
            _ => at += 1,
        }
    }
    pending.drain(..at);
}

/// Reaps every ended child.
fn reap(children: &mut HashMap<libc::pid_t, Child>) {
    loop {
        let mut status = 0;
        // SAFETY: waits for any child of ours without blocking.
        let pid = unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG) };
        if pid <= 0 {
            break;
        }
        children.remove(&pid);
    }
}

/// No connection: none waiting, or (out of descriptors, say) a pause so that the
/// supervisor's loop does not spin while the listener stays readable.
fn accept_failed<T>(error: std::io::Error) -> Option<T> {
    if error.kind() != std::io::ErrorKind::WouldBlock {
        eprintln!("kiln-executor: accept: {error}");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    None
}

/// A listening socket the supervisor accepts from.
pub trait Listener {
    /// An accepted connection.
    type Connection;
    /// Makes `accept` return `None` instead of blocking.
    fn set_nonblocking(&self) -> std::io::Result<()>;
    /// The next waiting connection (made blocking), or `None`.
    fn accept(&self) -> Option<Self::Connection>;
    /// The socket's descriptor.
    fn raw_fd(&self) -> RawFd;
}

/// The same [`Listener`] for each of std's listening sockets.
macro_rules! listener_for {
    ($listener:ty, $stream:ty) => {
        impl Listener for $listener {
            type Connection = $stream;
            fn set_nonblocking(&self) -> std::io::Result<()> {
                <$listener>::set_nonblocking(self, true)
            }
            fn accept(&self) -> Option<Self::Connection> {
                loop {
                    match <$listener>::accept(self) {
                        Ok((stream, _)) => {
                            if stream.set_nonblocking(false).is_ok() {
                                return Some(stream);
                            }
                        }
                        Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                        Err(e) => return accept_failed(e),
                    }
                }
            }
            fn raw_fd(&self) -> RawFd {
                self.as_raw_fd()
            }
        }
    };
}

listener_for!(std::net::TcpListener, std::net::TcpStream);
listener_for!(
    std::os::unix::net::UnixListener,
    std::os::unix::net::UnixStream
);
