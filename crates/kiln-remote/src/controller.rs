//! The controller's side of a connection to an executor: start one as a child (over a
//! socketpair, the default) or connect to one listening on TCP; send requests, read
//! responses, turn a dead, crashed, stalled or confused executor into a typed error.

use crate::channel::{Channel, ChannelError, Stream};
use crate::child::ExecutorChild as Child;
use crate::protocol::{signal_name, DecodeError, Hello, Request, Response, VERSION};
use parking_lot::{Mutex, RwLock};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

/// Why talking to an executor failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RemoteError {
    /// Starting or reaching the executor failed.
    #[error("cannot start or reach the executor: {0}")]
    Start(String),
    /// The executor speaks another protocol version.
    #[error("executor speaks protocol version {found}, this controller {expected}")]
    Version {
        /// The executor's version.
        found: u32,
        /// Ours.
        expected: u32,
    },
    /// JIT code crashed the executor.
    #[error("executor (pid {pid}) crashed with {name} (signal {signal}) during '{request}'")]
    Crashed {
        /// Executor pid.
        pid: u32,
        /// The signal.
        signal: i32,
        /// Its name.
        name: &'static str,
        /// The address whose access faulted (0: none, or not reported).
        fault_address: u64,
        /// The faulting instruction (0: not reported).
        pc: u64,
        /// A Windows executor's exception code, which the signal stands for (0: none).
        exception: u32,
        /// What it was doing.
        request: String,
    },
    /// The code the executor ran ended the executor process with `exit(status)` (or by
    /// returning from `main` in a way that exits).
    #[error("executor (pid {pid}) exited with status {status} during '{request}'")]
    Exited {
        /// Executor pid.
        pid: u32,
        /// The exit status.
        status: i32,
        /// What was running.
        request: String,
    },
    /// The executor went away.
    #[error("executor (pid {pid}) died during '{request}': {how}")]
    Died {
        /// Executor pid.
        pid: u32,
        /// What was running.
        request: String,
        /// How it ended, if known.
        how: String,
    },
    /// No answer in time.
    #[error("executor (pid {pid}) did not answer '{request}' within {timeout:?}")]
    Timeout {
        /// Executor pid.
        pid: u32,
        /// The request.
        request: String,
        /// The limit.
        timeout: Duration,
    },
    /// The executor refused a request.
    #[error("executor refused '{request}': {message}")]
    Refused {
        /// The request.
        request: String,
        /// Its words.
        message: String,
    },
    /// A malformed message from the executor.
    #[error("malformed message from the executor: {0}")]
    Protocol(#[from] DecodeError),
    /// A response that does not fit the request.
    #[error("unexpected answer to '{request}': {response:?}")]
    Unexpected {
        /// The request.
        request: String,
        /// What came back.
        response: Response,
    },
    /// The executor and this controller could not authenticate each other (a wrong or
    /// missing key), or a message failed its integrity check.
    #[error("executor at {address}: {reason}")]
    Authentication {
        /// Where.
        address: String,
        /// Why.
        reason: String,
    },
    /// The connection is unusable after an earlier failure.
    #[error("executor connection unusable: {0}")]
    Broken(String),
    /// I/O.
    #[error("executor connection: {0}")]
    Io(String),
}

/// The sandbox a spawned executor enters before it serves (`kiln-executor --sandbox`):
/// JIT code cannot `execve`, `ptrace`, `listen` or change the system (seccomp), reads files
/// only beneath the system's directories and [`Sandbox::read`], and writes only beneath
/// [`Sandbox::write`] (Landlock). See `kiln_executor::sandbox` for what it does not
/// protect.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Sandbox {
    /// Paths JIT code may also read.
    pub read: Vec<std::path::PathBuf>,
    /// Paths JIT code may read and write.
    pub write: Vec<std::path::PathBuf>,
}

impl Sandbox {
    /// The executor's arguments for this sandbox.
    fn args(&self) -> Vec<std::ffi::OsString> {
        let mut args = vec!["--sandbox".into()];
        for (flag, paths) in [
            ("--sandbox-read", &self.read),
            ("--sandbox-write", &self.write),
        ] {
            for path in paths {
                args.push(flag.into());
                args.push(path.into());
            }
        }
        args
    }
}

/// Timeouts of a connection.
#[derive(Debug, Clone, Copy)]
pub struct Timeouts {
    /// For memory and symbol requests.
    pub request: Duration,
    /// For running code (main, calls, initializers); `None`: no limit.
    pub run: Option<Duration>,
}

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts {
            request: Duration::from_secs(30),
            run: None,
        }
    }
}

/// What answers the requests an executor makes of the controller
/// ([`Request::ResolveStub`]); it may make requests of the executor meanwhile.
pub type ExecutorRequestHandler = Arc<dyn Fn(&Request) -> Response + Send + Sync>;

/// A connection to an executor process. Any thread sends requests at any time, each with
/// an id of its own in a table of pending requests. One waiting caller at a time reads
/// the connection (the *reader*): it hands each answer to the caller waiting for it,
/// forwards the program's output, and serves the executor's own requests (a call-through
/// stub's first call) on threads of their own; when its own answer has come it stops,
/// and a caller still waiting takes over. The others wait on a condition variable until
/// their answer is handed to them or the reading is theirs. No one polls, and a caller
/// alone reads its own answer (one wake-up per round trip).
pub struct RemoteExecutor {
    shared: Arc<Shared>,
    hello: Hello,
    timeouts: Timeouts,
    /// Whether descriptors (shared memory) can be passed: a Unix socket.
    passes_fds: bool,
    /// Shuts the socket down (a reader blocked in it then returns).
    closer: kiln_wire::channel::Closer,
    /// The receiving side, the current reader's.
    reading: Mutex<Reading>,
    /// Round trips made, per kind of request, for [`RemoteExecutor::round_trips`].
    round_trips: Mutex<Vec<RoundTrips>>,
    /// Requests a thread deferred in a [`Batching`] scope, not yet sent.
    deferred: Mutex<Option<Deferred>>,
    /// Held while a `RunMain` or `Shutdown` waits for its answer: the executor refuses a
    /// second `RunMain` (and `Shutdown`) while main runs, so another thread's waits here
    /// until it has returned.
    main: Mutex<()>,
    /// The executor's process id as this machine names it, when known (see
    /// [`RemoteExecutor::local_pid`]).
    local_pid: Option<u32>,
}

/// The receiving side of a connection and the read timeout set on its socket now (set
/// again only when a reader's request has another: one system call fewer per round trip).
struct Reading {
    channel: Channel,
    timeout: Option<Option<Duration>>,
}

/// What the callers and the connection's reader share.
struct Shared {
    state: Mutex<State>,
    /// Signalled when an answer is routed or the connection ends.
    answered: parking_lot::Condvar,
    /// Sends frames (any thread; one lock, so frames never interleave).
    sender: kiln_wire::channel::Sender,
    /// What serves the executor's requests, if anything does.
    handler: RwLock<Option<ExecutorRequestHandler>>,
    /// A child executor, until it is reaped.
    child: Mutex<Option<Child>>,
    /// Its exit status, once reaped.
    status: Mutex<Option<std::process::ExitStatus>>,
    /// The pid of a child executor not yet reaped (0 once reaped, or for one reached
    /// over TCP): `kill` never signals a recycled pid.
    child_pid: std::sync::atomic::AtomicI32,
    /// The executor's pid, for messages.
    pid: u32,
}

/// The pending requests and whether the connection still serves.
#[derive(Default)]
struct State {
    /// Requests by id: sent and awaited, answered, or given up.
    pending: std::collections::HashMap<u32, Routed>,
    /// The last id given to a request (ids are below [`crate::protocol::EXECUTOR_REQUEST`]
    /// and never 0, which is the executor's own).
    last_id: u32,
    /// Whether a caller reads the connection now.
    reading: bool,
    /// Why the connection serves no more; every waiting and later request fails with it.
    ended: Option<Ended>,
}

/// Where a request stands.
enum Routed {
    Waiting,
    Answered(Response, Option<OwnedFd>),
    /// Its caller gave up waiting: the answer is dropped when it comes.
    Abandoned,
}

/// Why a connection ended.
#[derive(Clone)]
enum Ended {
    /// The executor said so: JIT code crashed it or ended it (`Crashed`, `Exited`).
    Said(Response),
    /// The connection closed (the executor died: its exit status says how, if it was a
    /// child of ours).
    Closed,
    /// It failed otherwise (authentication, I/O, a malformed frame).
    Failed(RemoteErrorKind),
    /// This controller ended it (a request timed out, shut down, a frame it cannot
    /// serve): why.
    Broken(String),
}

/// A channel failure kept to be reported to each request it ends.
#[derive(Clone)]
enum RemoteErrorKind {
    Auth(String),
    Io(String),
}

/// What one thread's [`Batching`] scope deferred.
struct Deferred {
    thread: std::thread::ThreadId,
    requests: Vec<Request>,
    /// Bytes of code the deferred writes carry.
    bytes: usize,
}

/// Most bytes of code a batch carries (the copy transport's writes); a write that would
/// take a batch past it goes alone, after what was deferred before it.
const BATCH_BYTES: usize = 1 << 20;

/// A scope in which the calling thread's requests that need no answer but `Ok` before
/// the next step (prepare, initialize, register `.eh_frame`, guard branch targets, defer
/// exports) are deferred and sent together, as one [`Request::Batch`], with the next
/// request that needs an answer or when [`Batching::finish`] is called: a link's steps
/// after layout cost one round trip instead of one each. A deferred request that fails makes the
/// request that sent it (or `finish`) fail, naming it; the executor serves nothing
/// after it. Dropping the scope sends what is left and ignores a failure (an error path
/// that frees what the link made). Without the executor's [`FEATURE_BATCH`] (executor-c)
/// nothing is deferred.
///
/// [`FEATURE_BATCH`]: crate::protocol::FEATURE_BATCH
pub struct Batching<'a> {
    remote: Option<&'a RemoteExecutor>,
}

impl Batching<'_> {
    /// Sends what is deferred; the first failure among it, if any.
    pub fn finish(mut self) -> Result<(), RemoteError> {
        match self.remote.take() {
            Some(remote) => remote.flush_deferred(),
            None => Ok(()),
        }
    }
}

impl Drop for Batching<'_> {
    fn drop(&mut self) {
        if let Some(remote) = self.remote.take() {
            let _ = remote.flush_deferred();
        }
    }
}

/// Requests whose answer is `Ok` and that the next steps of a link do not read: what a
/// [`Batching`] scope defers (a write of code while the batch stays under
/// [`BATCH_BYTES`]).
fn deferrable(request: &Request, deferred_bytes: usize) -> bool {
    match request {
        Request::Write { bytes, .. } => deferred_bytes + bytes.len() <= BATCH_BYTES,
        Request::Prepare { .. }
        | Request::Initialize { .. }
        | Request::RegisterEhFrame { .. }
        | Request::GuardBranchTargets { .. }
        | Request::DeferExports { .. } => true,
        _ => false,
    }
}

/// The round trips a connection made for one kind of request: how many, and how long this
/// process waited for their answers in all (the executor's work included).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoundTrips {
    /// The request's name (`reserve`, `lookup many`, ...).
    pub request: String,
    /// How many were made.
    pub count: u32,
    /// From sending each to its answer, summed.
    pub waited: Duration,
}

/// Waits for a child executor to exit, killing it if it has not after a few seconds (a
/// child that closed its socket but runs on, JIT exit handlers that hang).
fn reap(child: &mut Child, pid: &std::sync::atomic::AtomicI32) -> Option<std::process::ExitStatus> {
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    let exit = ExitWatch::open(child.id());
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break Some(status),
            Ok(None) if std::time::Instant::now() < deadline => {
                exit.wait(deadline.saturating_duration_since(std::time::Instant::now()))
            }
            Ok(None) => {
                let _ = child.kill();
                break child.wait().ok();
            }
            Err(_) => break None,
        }
    };
    pid.store(0, std::sync::atomic::Ordering::SeqCst);
    status
}

/// Wakes the moment a child exits: a pidfd polled with a timeout (Linux 5.3+), or, where
/// there is none, 1 ms sleeps. Sleeping 5 ms between `try_wait`s cost every `kiln run
/// --oop` about 4 ms after its program had ended.
struct ExitWatch(Option<std::os::fd::OwnedFd>);

impl ExitWatch {
    fn open(pid: u32) -> Self {
        use std::os::fd::FromRawFd;
        // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
        // SAFETY: a non-negative result is a descriptor this process now owns.
        ExitWatch((fd >= 0).then(|| unsafe { std::os::fd::OwnedFd::from_raw_fd(fd as i32) }))
    }

    /// Returns when the child has exited or after `timeout` (or sooner: the caller checks).
    fn wait(&self, timeout: Duration) {
        use std::os::fd::AsRawFd;
        match &self.0 {
            Some(fd) => {
                let mut poll = libc::pollfd {
                    fd: fd.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                };
                let ms = timeout.as_millis().clamp(1, i32::MAX as u128) as i32;
                // SAFETY: one valid pollfd, owned for the call.
                unsafe { libc::poll(&mut poll, 1, ms) };
            }
            None => std::thread::sleep(Duration::from_millis(1)),
        }
    }
}

impl std::fmt::Debug for RemoteExecutor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteExecutor")
            .field("pid", &self.hello.pid)
            .field("triple", &self.hello.triple)
            .finish()
    }
}

fn io_err(e: impl std::fmt::Display) -> RemoteError {
    RemoteError::Io(e.to_string())
}

/// How long [`connect_retrying`] keeps trying an address that refuses connections: an
/// executor just started (Wine's first start takes 10–20 s) is not listening yet.
const CONNECT_RETRY: Duration = Duration::from_secs(30);

/// A TCP connection to `address`; refused connections are tried again every 100 ms for
/// [`CONNECT_RETRY`] (an executor starting up), other failures are errors at once.
fn connect_retrying(address: &str) -> Result<std::net::TcpStream, RemoteError> {
    let start = std::time::Instant::now();
    loop {
        match std::net::TcpStream::connect(address) {
            Ok(stream) => return Ok(stream),
            Err(e)
                if e.kind() == std::io::ErrorKind::ConnectionRefused
                    && start.elapsed() < CONNECT_RETRY =>
            {
                std::thread::sleep(Duration::from_millis(100));
            }
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
                return Err(RemoteError::Start(format!(
                    "{address}: {e} (for {} s: is an executor listening there?)",
                    CONNECT_RETRY.as_secs()
                )))
            }
            Err(e) => return Err(RemoteError::Start(format!("{address}: {e}"))),
        }
    }
}

/// A child executor started by [`RemoteExecutor::start_child`] whose hello has not been
/// read yet. Dropped unfinished, the child is killed and reaped.
pub struct StartingExecutor {
    channel: Option<Channel>,
    child: Option<Child>,
    timeouts: Timeouts,
}

impl StartingExecutor {
    /// The executor's process id.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, Child::id)
    }

    /// Reads the executor's hello (within the request timeout) and serves the connection;
    /// a child that does not say hello is killed and reaped, and this is the error.
    pub fn finish(mut self) -> Result<RemoteExecutor, RemoteError> {
        let (Some(mut channel), Some(mut child)) = (self.channel.take(), self.child.take()) else {
            return Err(RemoteError::Start(
                "the executor was started once already".into(),
            ));
        };
        match RemoteExecutor::read_hello(&mut channel, self.timeouts) {
            Ok(hello) => RemoteExecutor::start(channel, hello, Some(child), self.timeouts),
            Err(e) => {
                // A child that did not say hello is not left running or unreaped.
                let _ = child.kill();
                let _ = child.wait();
                Err(e)
            }
        }
    }
}

impl Drop for StartingExecutor {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl std::fmt::Debug for StartingExecutor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StartingExecutor")
            .field("pid", &self.pid())
            .finish()
    }
}

impl RemoteExecutor {
    /// Starts `executor` (the `kiln-executor` binary) as a child connected by a
    /// socketpair; its stdout and stderr are this process's.
    pub fn spawn(executor: &Path, timeouts: Timeouts) -> Result<Self, RemoteError> {
        Self::spawn_with(executor, None, timeouts)
    }

    /// As [`RemoteExecutor::spawn`], the executor in `sandbox` (if given) before it
    /// serves.
    pub fn spawn_with(
        executor: &Path,
        sandbox: Option<&Sandbox>,
        timeouts: Timeouts,
    ) -> Result<Self, RemoteError> {
        Self::start_child(executor, sandbox, timeouts)?.finish()
    }

    /// Starts `executor` as [`RemoteExecutor::spawn_with`] does, and returns at once: its
    /// hello is read by [`StartingExecutor::finish`], so the caller works (loads its
    /// inputs, say) while the executor process starts. Only a failure to start the
    /// process is an error here.
    pub fn start_child(
        executor: &Path,
        sandbox: Option<&Sandbox>,
        timeouts: Timeouts,
    ) -> Result<StartingExecutor, RemoteError> {
        let (ours, theirs) = UnixStream::pair().map_err(|e| RemoteError::Start(e.to_string()))?;
        let mut args: Vec<std::ffi::OsString> = vec!["--fd".into(), "3".into()];
        if let Some(sandbox) = sandbox {
            args.extend(sandbox.args());
        }
        let child = Child::spawn(executor, &args, theirs.as_raw_fd())
            .map_err(|e| {
                let hint = if e.kind() == std::io::ErrorKind::NotFound {
                    " (build it with `cargo build -p kiln-executor` or install it with `cargo install --path crates/kiln-executor`, then give its path or set KILN_EXECUTOR)"
                } else {
                    ""
                };
                RemoteError::Start(format!("{}: {e}{hint}", executor.display()))
            })?;
        drop(theirs);
        Ok(StartingExecutor {
            channel: Some(Channel::new(Stream::Unix(ours))),
            child: Some(child),
            timeouts,
        })
    }

    /// Connects to an executor listening at `address` (`host:port`).
    pub fn connect(address: &str, timeouts: Timeouts) -> Result<Self, RemoteError> {
        Self::connect_with_key(address, None, timeouts)
    }

    /// Connects to a pre-started `kiln-executor --listen-unix PATH` (a process of its own
    /// is forked for this connection) and hands it this process's standard input, output
    /// and error, so that the program reads and writes where a child executor's would.
    pub fn connect_unix(path: &Path, timeouts: Timeouts) -> Result<Self, RemoteError> {
        let stream = UnixStream::connect(path)
            .map_err(|e| RemoteError::Start(format!("{}: {e}", path.display())))?;
        let mut channel = Channel::new(Stream::Unix(stream));
        // Code and this process's terminal go only to an executor of this user.
        if !channel.peer_is_same_user() {
            return Err(RemoteError::Authentication {
                address: path.display().to_string(),
                reason: "the executor behind this socket runs as another user".into(),
            });
        }
        let hello = Self::read_hello(&mut channel, timeouts)?;
        // SAFETY: descriptors 0, 1 and 2 stay open for the life of this process.
        let stdio = unsafe {
            [
                std::os::fd::BorrowedFd::borrow_raw(0),
                std::os::fd::BorrowedFd::borrow_raw(1),
                std::os::fd::BorrowedFd::borrow_raw(2),
            ]
        };
        channel
            .send_with_fds(&Request::AdoptStdio.encode(), &stdio)
            .map_err(|e| RemoteError::Start(format!("adopt stdio: {e}")))?;
        let body = channel
            .recv()
            .map_err(|e| RemoteError::Start(format!("adopt stdio: {e}")))?;
        match Response::decode(&body)? {
            Response::Ok => {}
            other => {
                return Err(RemoteError::Unexpected {
                    request: "adopt stdio".into(),
                    response: other,
                })
            }
        }
        Self::start(channel, hello, None, timeouts)
    }

    /// Connects to `kiln-executor --listen` at `address`, authenticating with `key` and
    /// encrypting everything after (see [`crate::secure`]); without a key, the executor
    /// must have been started with `--no-auth`.
    pub fn connect_with_key(
        address: &str,
        key: Option<&crate::secure::Key>,
        timeouts: Timeouts,
    ) -> Result<Self, RemoteError> {
        let stream = connect_retrying(address)?;
        let mut channel = Channel::new(Stream::Tcp(stream));
        channel
            .set_timeout(Some(timeouts.request))
            .map_err(io_err)?;
        let preamble = channel
            .recv_raw(crate::secure::PREAMBLE_NOISE.len())
            .map_err(|e| RemoteError::Start(format!("{address}: no greeting: {e}")))?;
        let refuse = |reason: &str| RemoteError::Authentication {
            address: address.to_string(),
            reason: reason.to_string(),
        };
        match (key, preamble.as_slice()) {
            (Some(_), p) if p == crate::secure::PREAMBLE_NOISE => {}
            (Some(_), p) if p == crate::secure::PREAMBLE_PLAIN => {
                return Err(refuse(
                    "the executor does not authenticate (started with --no-auth); refusing to send code to it in plaintext with a key given",
                ))
            }
            (None, p) if p == crate::secure::PREAMBLE_NOISE => {
                return Err(refuse(
                    "the executor requires a key: give its key file with --key-file or KILN_EXECUTOR_KEY_FILE",
                ))
            }
            (None, p) if p == crate::secure::PREAMBLE_PLAIN => {}
            _ => return Err(RemoteError::Start(format!("{address}: not a Kiln executor"))),
        }
        if let Some(key) = key {
            channel
                .secure(key, crate::secure::Role::Initiator)
                .map_err(|e| match e {
                    crate::channel::ChannelError::Auth(reason) => RemoteError::Authentication {
                        address: address.to_string(),
                        reason,
                    },
                    crate::channel::ChannelError::Closed => RemoteError::Authentication {
                        address: address.to_string(),
                        reason:
                            "the executor closed the connection during the handshake (a wrong key?)"
                                .into(),
                    },
                    other => RemoteError::Start(format!("{address}: {other}")),
                })?;
        }
        let hello = Self::read_hello(&mut channel, timeouts)?;
        Self::start(channel, hello, None, timeouts)
    }

    /// Reads the executor's hello (within the request timeout) and checks it.
    fn read_hello(channel: &mut Channel, timeouts: Timeouts) -> Result<Hello, RemoteError> {
        channel
            .set_timeout(Some(timeouts.request))
            .map_err(io_err)?;
        let body = channel
            .recv()
            .map_err(|e| RemoteError::Start(format!("no hello from the executor: {e}")))?;
        let hello = Hello::decode(&body)?;
        if !hello.page_size.is_power_of_two() || !(4096..=65536).contains(&hello.page_size) {
            return Err(RemoteError::Start(format!(
                "executor reports a page size of {}",
                hello.page_size
            )));
        }
        if hello.version != VERSION {
            return Err(RemoteError::Version {
                found: hello.version,
                expected: VERSION,
            });
        }
        Ok(hello)
    }

    /// Serves a connection whose hello was read.
    fn start(
        mut channel: Channel,
        hello: Hello,
        child: Option<Child>,
        timeouts: Timeouts,
    ) -> Result<Self, RemoteError> {
        // Each read is bounded by its reader's deadline.
        channel.set_timeout(None).map_err(io_err)?;
        let closer = channel.closer().map_err(io_err)?;
        let local_pid = match &child {
            Some(c) => Some(c.id()),
            None => channel.peer_pid(),
        };
        let shared = Arc::new(Shared {
            state: Mutex::new(State::default()),
            answered: parking_lot::Condvar::new(),
            sender: channel.sender(),
            handler: RwLock::new(None),
            child_pid: std::sync::atomic::AtomicI32::new(
                child.as_ref().map_or(0, |c| c.id() as i32),
            ),
            child: Mutex::new(child),
            status: Mutex::new(None),
            pid: hello.pid,
        });
        let passes_fds = channel.can_pass_fds();
        Ok(RemoteExecutor {
            shared,
            hello,
            timeouts,
            passes_fds,
            closer,
            reading: Mutex::new(Reading {
                channel,
                timeout: Some(None),
            }),
            round_trips: Mutex::new(Vec::new()),
            deferred: Mutex::new(None),
            main: Mutex::new(()),
            local_pid,
        })
    }

    /// What the executor said when it started.
    pub fn hello(&self) -> &Hello {
        &self.hello
    }

    /// The executor's process id, as its hello says (its own PID namespace's).
    pub fn pid(&self) -> u32 {
        self.hello.pid
    }

    /// The executor's process id as this machine names it — a child's this controller
    /// started, or the process at the other end of a Unix socket (`SO_PEERCRED`) —
    /// so that its `/proc/PID` files may be read; `None` over TCP (the process may be
    /// on another machine, and a pid there names nothing here).
    pub fn local_pid(&self) -> Option<u32> {
        self.local_pid
    }

    /// Sends this process's standard input to the program the executor runs (an executor
    /// serving `--listen` reads its standard input from these messages), from a thread
    /// that reads it until end of input; for `kiln run --connect`. Call it once.
    pub fn forward_stdin(&self) {
        let sender = self.shared.sender.clone();
        std::thread::spawn(move || {
            use std::io::Read;
            let mut stdin = std::io::stdin().lock();
            let mut buf = vec![0u8; 64 << 10];
            loop {
                let n = match stdin.read(&mut buf) {
                    Ok(n) => n,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                    Err(_) => 0,
                };
                let frame = Request::Input {
                    bytes: buf[..n].to_vec(),
                }
                .encode();
                if sender.send(&frame).is_err() || n == 0 {
                    break;
                }
            }
        });
    }

    /// Gives the executor this process's environment and working directory, so that a
    /// pre-started or remote executor's program sees `getenv` and relative paths as a
    /// local one would (a child executor inherits them anyway). The executor answers an
    /// error if it cannot enter the directory (another machine may not have it).
    pub fn adopt_environment(&self) -> Result<(), RemoteError> {
        use std::os::unix::ffi::OsStrExt;
        let variables = std::env::vars_os()
            .map(|(name, value)| {
                let mut v = name.as_bytes().to_vec();
                v.push(b'=');
                v.extend_from_slice(value.as_bytes());
                v
            })
            .collect();
        let directory = std::env::current_dir()
            .map(|d| d.as_os_str().as_bytes().to_vec())
            .unwrap_or_default();
        match self.request(&Request::SetEnvironment {
            variables,
            directory,
        })? {
            Response::Ok => Ok(()),
            other => Err(RemoteError::Unexpected {
                request: "set environment".into(),
                response: other,
            }),
        }
    }

    /// Whether descriptors (shared memory) can be passed: a Unix socket.
    pub fn can_share_memory(&self) -> bool {
        self.passes_fds
    }

    /// Sends `request`, returns the response (an error response, a crash, a death or a
    /// timeout become [`RemoteError`]s).
    pub fn request(&self, request: &Request) -> Result<Response, RemoteError> {
        self.request_with_fd(request).map(|(r, _)| r)
    }

    /// As [`RemoteExecutor::request`], also returning a descriptor sent with the response.
    pub fn request_with_fd(
        &self,
        request: &Request,
    ) -> Result<(Response, Option<OwnedFd>), RemoteError> {
        let this_thread = std::thread::current().id();
        let mut deferred = self.deferred.lock();
        match deferred.as_mut() {
            Some(d) if d.thread == this_thread && deferrable(request, d.bytes) => {
                if let Request::Write { bytes, .. } = request {
                    d.bytes += bytes.len();
                }
                d.requests.push(request.clone());
                return Ok((Response::Ok, None));
            }
            Some(d) if d.thread == this_thread && !d.requests.is_empty() => {
                d.bytes = 0;
                let mut requests = std::mem::take(&mut d.requests);
                drop(deferred);
                if !request.batchable() || matches!(request, Request::Write { .. }) {
                    self.send_batch(requests)?;
                    return self.send_one(request);
                }
                requests.push(request.clone());
                let last = requests.len();
                let mut answers = self.send_batch(requests)?;
                // An `Error` among the answers is already the batch's error.
                return match (answers.len() == last, answers.pop()) {
                    (true, Some(answer)) => Ok((answer, None)),
                    _ => Err(RemoteError::Unexpected {
                        request: request.to_string(),
                        response: Response::Error("the batch ended early".into()),
                    }),
                };
            }
            _ => {}
        }
        drop(deferred);
        self.send_one(request)
    }

    /// Starts deferring this thread's deferrable requests (see [`Batching`]); nothing is
    /// deferred when the executor cannot serve batches or this thread already batches.
    pub fn batch(&self) -> Batching<'_> {
        if self.hello.features & crate::protocol::FEATURE_BATCH == 0 {
            return Batching { remote: None };
        }
        let mut deferred = self.deferred.lock();
        if deferred.is_some() {
            // Another scope (this thread's, or another thread's) batches: this one sends
            // its requests one by one.
            return Batching { remote: None };
        }
        *deferred = Some(Deferred {
            thread: std::thread::current().id(),
            requests: Vec::new(),
            bytes: 0,
        });
        Batching { remote: Some(self) }
    }

    /// [`RemoteExecutor::batch`] without a scope object: the calling thread's deferrable
    /// requests are deferred until it calls [`RemoteExecutor::end_batch`]. Whether they
    /// are (false where `batch` would defer nothing).
    pub fn begin_batch(&self) -> bool {
        let mut scope = self.batch();
        // The scope ends with `end_batch`, not with this value.
        scope.remote.take().is_some()
    }

    /// Ends the calling thread's batch begun by [`RemoteExecutor::begin_batch`]: sends
    /// what it deferred; the first failure among it. Nothing to do if this thread
    /// batches nothing.
    pub fn end_batch(&self) -> Result<(), RemoteError> {
        let this_thread = std::thread::current().id();
        let requests = {
            let mut deferred = self.deferred.lock();
            match deferred.as_ref() {
                Some(d) if d.thread == this_thread => deferred.take().map(|d| d.requests),
                _ => return Ok(()),
            }
        };
        self.send_deferred(requests.unwrap_or_default())
    }

    /// Sends what this thread's [`Batching`] scope deferred so far, the scope staying
    /// open; the first failure among it. Nothing to do outside a scope.
    pub fn flush(&self) -> Result<(), RemoteError> {
        let this_thread = std::thread::current().id();
        let requests = match self.deferred.lock().as_mut() {
            Some(d) if d.thread == this_thread => {
                d.bytes = 0;
                std::mem::take(&mut d.requests)
            }
            _ => return Ok(()),
        };
        self.send_deferred(requests)
    }

    /// Ends the batching scope: sends what it deferred.
    fn flush_deferred(&self) -> Result<(), RemoteError> {
        let requests = self.deferred.lock().take().map(|d| d.requests);
        self.send_deferred(requests.unwrap_or_default())
    }

    /// Sends deferred requests as one batch (nothing when there are none).
    fn send_deferred(&self, requests: Vec<Request>) -> Result<(), RemoteError> {
        if requests.is_empty() {
            return Ok(());
        }
        self.send_batch(requests).map(|_| ())
    }

    /// Sends `requests` as one batch; their answers, or the error of the one that failed
    /// (named, "batched"), the requests after it not served.
    fn send_batch(&self, requests: Vec<Request>) -> Result<Vec<Response>, RemoteError> {
        let names: Vec<String> = requests.iter().map(|r| r.to_string()).collect();
        let (answer, _) = self.send_one(&Request::Batch(requests))?;
        let Response::Batched(answers) = answer else {
            return Err(RemoteError::Unexpected {
                request: "batch".into(),
                response: answer,
            });
        };
        let failed = answers.iter().enumerate().find_map(|(i, a)| match a {
            Response::Error(message) => Some((i, message.clone())),
            _ => None,
        });
        if let Some((i, message)) = failed {
            return Err(RemoteError::Refused {
                request: format!("{} (batched)", names.get(i).map_or("?", |n| n.as_str())),
                message,
            });
        }
        // All but the last must be `Ok` (deferred requests are answered so).
        if let Some((i, a)) = answers
            .iter()
            .enumerate()
            .take(answers.len().saturating_sub(1))
            .find(|(_, a)| **a != Response::Ok)
        {
            return Err(RemoteError::Unexpected {
                request: format!("{} (batched)", names.get(i).map_or("?", |n| n.as_str())),
                response: a.clone(),
            });
        }
        Ok(answers)
    }

    /// Sends one request and waits for its answer (read by this caller, or handed over by
    /// the caller reading the connection meanwhile),
    /// within the connection's timeout for its kind.
    fn send_one(&self, request: &Request) -> Result<(Response, Option<OwnedFd>), RemoteError> {
        let _main = matches!(request, Request::RunMain { .. } | Request::Shutdown)
            .then(|| self.main.lock());
        let timeout = match request {
            Request::RunMain { .. }
            | Request::Call { .. }
            | Request::RunInitializers { .. }
            | Request::RunFinalizers { .. } => self.timeouts.run,
            _ => Some(self.timeouts.request),
        };
        self.send_within(request, timeout)
    }

    /// Sends one request and waits for its answer for at most `timeout`.
    fn send_within(
        &self,
        request: &Request,
        timeout: Option<Duration>,
    ) -> Result<(Response, Option<OwnedFd>), RemoteError> {
        let name = request.to_string();
        let shared = &*self.shared;
        let id = {
            let mut state = shared.state.lock();
            if let Some(ended) = &state.ended {
                return Err(shared.error(ended, &name));
            }
            // The next id not in use (ids wrap after 2^31 - 1 requests).
            loop {
                state.last_id = state.last_id % (crate::protocol::EXECUTOR_REQUEST - 1) + 1;
                if !state.pending.contains_key(&state.last_id) {
                    break;
                }
            }
            let id = state.last_id;
            state.pending.insert(id, Routed::Waiting);
            id
        };
        let started = std::time::Instant::now();
        let deadline = timeout.map(|t| started + t);
        // A send that fails finds the connection closed: the read below says how (the
        // executor's exit status).
        let _ = shared
            .sender
            .send(&crate::protocol::with_id(request.encode(), id));
        let mut state = shared.state.lock();
        let (response, fd) = loop {
            if matches!(state.pending.get(&id), Some(Routed::Answered(..))) {
                match state.pending.remove(&id) {
                    Some(Routed::Answered(response, fd)) => break (response, fd),
                    _ => unreachable!("checked just above"),
                }
            }
            if let Some(ended) = state.ended.clone() {
                state.pending.remove(&id);
                return Err(shared.error(&ended, &name));
            }
            let timed_out = if !state.reading {
                // No one reads: this caller does, until its answer comes.
                state.reading = true;
                drop(state);
                let timed_out = self.read_until_answered(id, timeout);
                state = shared.state.lock();
                state.reading = false;
                // A caller still waiting reads next.
                shared.answered.notify_all();
                timed_out
            } else {
                match deadline {
                    Some(deadline) => shared.answered.wait_until(&mut state, deadline).timed_out(),
                    None => {
                        shared.answered.wait(&mut state);
                        false
                    }
                }
            };
            if timed_out && matches!(state.pending.get(&id), Some(Routed::Waiting)) {
                // An executor that does not answer in time serves no more (it may run
                // JIT code forever): later requests fail at once.
                state.pending.insert(id, Routed::Abandoned);
                let error = RemoteError::Timeout {
                    pid: shared.pid,
                    request: name,
                    timeout: timeout.unwrap_or_default(),
                };
                shared.end(&mut state, Ended::Broken(error.to_string()));
                drop(state);
                self.closer.shutdown();
                return Err(error);
            }
        };
        drop(state);
        self.count_round_trip(&name, started.elapsed());
        match response {
            Response::Error(message) => Err(RemoteError::Refused {
                request: name,
                message,
            }),
            // The executor's end, as the answer to the request that ran the code.
            ended @ (Response::Exited { .. } | Response::Crashed { .. }) => {
                let ended = Ended::Said(ended);
                shared.end(&mut shared.state.lock(), ended.clone());
                shared.reap();
                Err(shared.error(&ended, &name))
            }
            other => Ok((other, fd)),
        }
    }

    /// Sets what answers the requests the executor makes of this controller (a
    /// call-through stub's first call). Without one, such a request ends the connection.
    pub fn set_request_handler(&self, handler: ExecutorRequestHandler) {
        *self.shared.handler.write() = Some(handler);
    }

    fn count_round_trip(&self, name: &str, waited: Duration) {
        let mut all = self.round_trips.lock();
        match all.iter_mut().find(|r| r.request == name) {
            Some(r) => {
                r.count += 1;
                r.waited += waited;
            }
            None => all.push(RoundTrips {
                request: name.to_string(),
                count: 1,
                waited,
            }),
        }
    }

    /// The round trips this connection made so far, per kind of request, in the order
    /// of each kind's first (`kiln run --show-times` prints them).
    pub fn round_trips(&self) -> Vec<RoundTrips> {
        self.round_trips.lock().clone()
    }

    /// As [`RemoteExecutor::shutdown`], for a controller about to exit: a child executor
    /// is not waited for. Its answer came after the program's last output and after it let
    /// go of its standard streams, so nothing of the program is lost; its own exit (the
    /// kernel tearing down its memory) goes on beside this process's, and the system
    /// reaps it once this process has exited. A child that does not answer is killed.
    pub fn shutdown_for_exit(&self) {
        let child = self.shared.child.lock().take();
        let Some(child) = child else {
            return self.shutdown();
        };
        self.shared
            .child_pid
            .store(0, std::sync::atomic::Ordering::SeqCst);
        let answered = self.say_shutdown() == Some(true);
        self.closer.shutdown();
        // Answered: not reaped here (see above; an `ExecutorChild` going out of scope
        // neither waits nor kills). Busy, broken or silent: it may run JIT code forever.
        if !answered {
            let mut child = child;
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Sends `Shutdown` on a connection still serving and ends the connection: whether the
    /// executor answered `Ok` (its answer comes after the program's last output, which the
    /// connection's reader forwards; one that does not answer within 5 s is not waited
    /// for), `None` if the connection had ended already.
    fn say_shutdown(&self) -> Option<bool> {
        if self.shared.state.lock().ended.is_some() {
            return None;
        }
        let _main = self.main.lock();
        let answered = matches!(
            self.send_within(&Request::Shutdown, Some(Duration::from_secs(5))),
            Ok((Response::Ok, _))
        );
        let mut state = self.shared.state.lock();
        if state.ended.is_none() {
            self.shared
                .end(&mut state, Ended::Broken("shut down".into()));
        }
        Some(answered)
    }

    /// Asks the executor to exit, and waits for a child executor.
    pub fn shutdown(&self) {
        if self.say_shutdown().is_none() {
            if let Some(child) = &mut *self.shared.child.lock() {
                // A connection that ended otherwise (a timeout, say) may have left the
                // executor running JIT code forever: do not wait for it.
                let _ = child.kill();
            }
        }
        self.closer.shutdown();
        self.shared.reap();
    }

    /// Kills a child executor (`SIGKILL`), even while a request is waiting for it; the
    /// waiting request then fails with the signal.
    pub fn kill(&self) {
        let pid = self
            .shared
            .child_pid
            .load(std::sync::atomic::Ordering::SeqCst);
        if pid != 0 {
            // SAFETY: signalling our own child; the pid is cleared when it is reaped, so
            // it cannot have been recycled.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    }
}

impl Drop for RemoteExecutor {
    fn drop(&mut self) {
        // A child executor is ours: ask it to exit and reap it. An executor reached over
        // TCP serves others after us: just close the connection (it releases what this
        // connection reserved).
        if self.shared.child.lock().is_some() {
            self.shutdown();
        } else {
            self.closer.shutdown();
        }
    }
}

impl Shared {
    /// Ends the connection for `why` (the first reason stays) and wakes every caller.
    fn end(&self, state: &mut State, why: Ended) {
        if state.ended.is_none() {
            state.ended = Some(why);
        }
        self.answered.notify_all();
    }

    /// Hands `response` to the caller waiting for request `id`; `false` if no request
    /// has that id (a confused executor).
    fn route(&self, id: u32, response: Response, fd: Option<OwnedFd>) -> bool {
        let mut state = self.state.lock();
        match state.pending.get(&id) {
            Some(Routed::Waiting) => {
                state.pending.insert(id, Routed::Answered(response, fd));
                self.answered.notify_all();
                true
            }
            // Its caller gave up: dropped.
            Some(Routed::Abandoned) => {
                state.pending.remove(&id);
                true
            }
            Some(Routed::Answered(..)) | None => false,
        }
    }

    /// Waits for a child executor to exit (killing it after a few seconds), once.
    fn reap(&self) {
        let Some(mut child) = self.child.lock().take() else {
            return;
        };
        let status = reap(&mut child, &self.child_pid);
        *self.status.lock() = status;
    }

    /// The error a request named `request` gets from a connection that `ended`.
    fn error(&self, ended: &Ended, request: &str) -> RemoteError {
        let pid = self.pid;
        let request = request.to_string();
        match ended {
            Ended::Said(Response::Crashed {
                signal,
                fault_address,
                pc,
                exception,
            }) => RemoteError::Crashed {
                pid,
                signal: *signal,
                name: signal_name(*signal),
                fault_address: *fault_address,
                pc: *pc,
                exception: *exception,
                request,
            },
            Ended::Said(Response::Exited { status }) => RemoteError::Exited {
                pid,
                status: *status,
                request,
            },
            Ended::Said(other) => RemoteError::Unexpected {
                request,
                response: other.clone(),
            },
            Ended::Closed => {
                let status = *self.status.lock();
                match status {
                    Some(status) => match (status.signal(), status.code()) {
                        (Some(signal), _) => RemoteError::Crashed {
                            pid,
                            signal,
                            name: signal_name(signal),
                            fault_address: 0,
                            pc: 0,
                            exception: 0,
                            request,
                        },
                        (None, Some(code)) => RemoteError::Exited {
                            pid,
                            status: code,
                            request,
                        },
                        (None, None) => RemoteError::Died {
                            pid,
                            request,
                            how: format!("exited with {status}"),
                        },
                    },
                    None => RemoteError::Died {
                        pid,
                        request,
                        how: "connection closed".into(),
                    },
                }
            }
            Ended::Failed(RemoteErrorKind::Auth(reason)) => RemoteError::Authentication {
                address: format!("pid {pid}"),
                reason: reason.clone(),
            },
            Ended::Failed(RemoteErrorKind::Io(why)) => RemoteError::Io(why.clone()),
            Ended::Broken(why) => RemoteError::Broken(why.clone()),
        }
    }
}

impl RemoteExecutor {
    /// As the connection's reader: reads frames (each read waits at most `timeout`) and
    /// takes each as [`RemoteExecutor::take_frame`] does, until request `id` is answered
    /// or the connection ends; whether a read timed out.
    fn read_until_answered(&self, id: u32, timeout: Option<Duration>) -> bool {
        let shared = &*self.shared;
        let mut reading = self.reading.lock();
        let Reading {
            channel,
            timeout: set,
        } = &mut *reading;
        if *set != Some(timeout) {
            if channel.set_timeout(timeout).is_err() {
                shared.end(
                    &mut shared.state.lock(),
                    Ended::Failed(RemoteErrorKind::Io("setting the read timeout".into())),
                );
                return false;
            }
            *set = Some(timeout);
        }
        loop {
            {
                let state = shared.state.lock();
                if state.ended.is_some() || !matches!(state.pending.get(&id), Some(Routed::Waiting))
                {
                    return false;
                }
            }
            let body = match channel.recv() {
                Ok(body) => body,
                Err(ChannelError::Timeout(_)) => return true,
                Err(error) => {
                    let ended = match error {
                        ChannelError::Closed => Ended::Closed,
                        ChannelError::Auth(reason) => Ended::Failed(RemoteErrorKind::Auth(reason)),
                        other => Ended::Failed(RemoteErrorKind::Io(other.to_string())),
                    };
                    // A child that closed the connection is exiting: its status says how
                    // (unless the connection had ended already: it may be stopped).
                    if shared.state.lock().ended.is_none() {
                        shared.reap();
                    }
                    shared.end(&mut shared.state.lock(), ended);
                    return false;
                }
            };
            if let Err(why) = self.take_frame(channel, body) {
                shared.end(&mut shared.state.lock(), Ended::Broken(why));
                channel.shutdown();
                return false;
            }
        }
    }

    /// One frame from the executor: an answer to its caller, output where this process's
    /// goes, the executor's end (id 0), or a request of the executor's, served on a
    /// thread of its own (the handler makes requests whose answers a reader takes
    /// meanwhile). `Err`: a frame that ends the connection, and why.
    fn take_frame(&self, channel: &mut Channel, body: Vec<u8>) -> Result<(), String> {
        let shared = &*self.shared;
        let got = crate::protocol::message_id(&body).unwrap_or(0);
        if got & crate::protocol::EXECUTOR_REQUEST != 0 {
            let handler = shared.handler.read().clone();
            let Some(handler) = handler else {
                return Err(format!(
                    "the executor made a request ({got:#x}) this controller does not serve"
                ));
            };
            let sender = shared.sender.clone();
            let serve = move || {
                let answer = match Request::decode(&body) {
                    // A panicking handler still answers: the executor waits for it.
                    Ok(request) => {
                        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| handler(&request)))
                            .unwrap_or_else(|_| {
                                Response::Error("the controller's handler panicked".into())
                            })
                    }
                    Err(e) => Response::Error(format!("malformed request: {e}")),
                };
                let _ = sender.send(&crate::protocol::with_id(answer.encode(), got));
            };
            if let Err(e) = std::thread::Builder::new()
                .name("kiln-resolve".into())
                .spawn(serve)
            {
                let answer = Response::Error(format!("cannot serve the request: {e}"));
                let _ = shared
                    .sender
                    .send(&crate::protocol::with_id(answer.encode(), got));
            }
            return Ok(());
        }
        match Response::decode(&body) {
            Ok(Response::Output { stream, bytes }) => forward_output(stream, &bytes),
            // What the executor says on its own (id 0): the end of it.
            Ok(r @ (Response::Crashed { .. } | Response::Exited { .. })) if got == 0 => {
                shared.reap();
                shared.end(&mut shared.state.lock(), Ended::Said(r));
            }
            Ok(r) if got != 0 => {
                let fd = channel.take_fd();
                if !shared.route(got, r, fd) {
                    return Err(format!("an answer with id {got}, which no request has"));
                }
            }
            Ok(r) => return Err(format!("an answer with id 0: {r:?}")),
            Err(e) => return Err(format!("malformed response: {e}")),
        }
        Ok(())
    }
}

/// Writes the remote program's output where this process's goes.
fn forward_output(stream: u8, bytes: &[u8]) {
    use std::io::Write;
    let _ = if stream == 2 {
        let mut e = std::io::stderr().lock();
        e.write_all(bytes).and_then(|()| e.flush())
    } else {
        let mut o = std::io::stdout().lock();
        o.write_all(bytes).and_then(|()| o.flush())
    };
}
