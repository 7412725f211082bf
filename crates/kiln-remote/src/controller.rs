//! The controller's side of a connection to an executor: start one as a child (over a
//! socketpair, the default) or connect to one listening on TCP; send requests, read
//! responses, turn a dead, crashed, stalled or confused executor into a typed error.

use crate::channel::{Channel, ChannelError, Stream};
use crate::protocol::{signal_name, DecodeError, Hello, Request, Response, VERSION};
use parking_lot::{Mutex, ReentrantMutex, RwLock};
use std::cell::RefCell;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::Path;
use std::process::{Child, Command};
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

struct Connection {
    channel: Channel,
    /// The id of the last request sent.
    next_id: u32,
    child: Option<Child>,
    broken: Option<String>,
    /// The receive timeout set on the socket now (to set it only when it changes).
    timeout: Option<Option<Duration>>,
}

/// What answers the requests an executor makes of the controller
/// ([`Request::ResolveStub`]); it may make requests of the executor meanwhile.
pub type ExecutorRequestHandler = Arc<dyn Fn(&Request) -> Response + Send + Sync>;

/// A connection to an executor process. Requests are sent one at a time (the connection
/// is locked for a request and its response; the thread that holds it may make more
/// requests while it answers one of the executor's).
pub struct RemoteExecutor {
    conn: ReentrantMutex<RefCell<Connection>>,
    /// What serves the executor's requests, if anything does.
    handler: RwLock<Option<ExecutorRequestHandler>>,
    hello: Hello,
    timeouts: Timeouts,
    /// The pid of a child executor not yet reaped (0 once reaped, or for one reached
    /// over TCP): `kill` never signals a recycled pid.
    child_pid: std::sync::atomic::AtomicI32,
    /// Round trips made, per kind of request, for [`RemoteExecutor::round_trips`].
    round_trips: Mutex<Vec<RoundTrips>>,
    /// Requests a thread deferred in a [`Batching`] scope, not yet sent.
    deferred: Mutex<Option<Deferred>>,
    /// Requests other threads make while one waits for code to run (see [`Beside`]).
    beside: Mutex<Beside>,
    /// Signalled when an answer is routed to a thread waiting beside.
    routed: parking_lot::Condvar,
    /// Sends without the connection's lock (requests made beside a running one).
    sender: kiln_wire::channel::Sender,
}

/// While a thread waits for JIT code to run (`RunMain`, `Call`: the connection's lock
/// held, it reads every frame), other threads' requests go *beside* it: each is sent
/// through the shared sender with an id of its own range and waits until the reading
/// thread routes its answer here. The executor serves them meanwhile (main runs on a
/// thread of its own there), so a hot swap, a lookup or another link need not wait for
/// the program to end.
#[derive(Default)]
struct Beside {
    /// A thread waits for code to run, and reads.
    running: bool,
    /// The last id given to a request beside (ids `BESIDE | n`).
    last: u32,
    /// Answers by request id, routed or awaited.
    answers: std::collections::HashMap<u32, Routed>,
}

/// Where a request made beside stands.
enum Routed {
    Waiting,
    Answered(Response, Option<OwnedFd>),
    Failed(String),
    /// Its thread gave up waiting (timeout): the answer is dropped when it comes.
    Abandoned,
}

/// The ids of requests made beside a running one (bit 30; the lock's requests count below
/// it, the executor's own requests have bit 31).
const BESIDE: u32 = 1 << 30;

/// While alive, the thread that sent a request running code reads for those made beside
/// it; when it stops (answered, or the connection failed), requests still waiting fail
/// and later ones take the lock.
struct ReadingBeside<'a> {
    remote: &'a RemoteExecutor,
    owner: bool,
}

impl Drop for ReadingBeside<'_> {
    fn drop(&mut self) {
        if !self.owner {
            return;
        }
        let mut beside = self.remote.beside.lock();
        beside.running = false;
        for routed in beside.answers.values_mut() {
            if matches!(routed, Routed::Waiting) {
                *routed =
                    Routed::Failed("the connection ended before the executor answered".into());
            }
        }
        self.remote.routed.notify_all();
    }
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
/// the next step (prepare, initialize, register `.eh_frame`, guard branch targets) are
/// deferred and sent together, as one [`Request::Batch`], with the next request that
/// needs an answer or when [`Batching::finish`] is called: a link's steps after layout
/// cost one round trip instead of one each. A deferred request that fails makes the
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
        | Request::GuardBranchTargets { .. } => true,
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
        let (ours, theirs) = UnixStream::pair().map_err(|e| RemoteError::Start(e.to_string()))?;
        let their_fd = theirs.as_raw_fd();
        let mut command = Command::new(executor);
        command.arg("--fd").arg("3");
        if let Some(sandbox) = sandbox {
            command.args(sandbox.args());
        }
        // SAFETY: between fork and exec only async-signal-safe calls: dup2 moves the socket
        // to descriptor 3 (without close-on-exec), as `--fd 3` tells the executor.
        unsafe {
            command.pre_exec(move || {
                // When the socket already is descriptor 3 dup2 does nothing: clear its
                // close-on-exec flag instead.
                let ok = if their_fd == 3 {
                    libc::fcntl(3, libc::F_SETFD, 0) >= 0
                } else {
                    libc::dup2(their_fd, 3) >= 0
                };
                if !ok {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let mut child = command
            .spawn()
            .map_err(|e| {
                let hint = if e.kind() == std::io::ErrorKind::NotFound {
                    " (build it with `cargo build -p kiln-executor` or install it with `cargo install --path crates/kiln-executor`, then give its path or set KILN_EXECUTOR)"
                } else {
                    ""
                };
                RemoteError::Start(format!("{}: {e}{hint}", executor.display()))
            })?;
        drop(theirs);
        let pid = child.id();
        match Self::handshake(Channel::new(Stream::Unix(ours)), None, timeouts) {
            Ok(mut remote) => {
                remote.conn.get_mut().get_mut().child = Some(child);
                remote.child_pid = std::sync::atomic::AtomicI32::new(pid as i32);
                Ok(remote)
            }
            Err(e) => {
                // A child that did not say hello is not left running or unreaped.
                let _ = child.kill();
                let _ = child.wait();
                Err(e)
            }
        }
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
        let channel = Channel::new(Stream::Unix(stream));
        // Code and this process's terminal go only to an executor of this user.
        if !channel.peer_is_same_user() {
            return Err(RemoteError::Authentication {
                address: path.display().to_string(),
                reason: "the executor behind this socket runs as another user".into(),
            });
        }
        let remote = Self::handshake(channel, None, timeouts)?;
        {
            let guard = remote.conn.lock();
            let mut conn = guard.borrow_mut();
            // SAFETY: descriptors 0, 1 and 2 stay open for the life of this process.
            let stdio = unsafe {
                [
                    std::os::fd::BorrowedFd::borrow_raw(0),
                    std::os::fd::BorrowedFd::borrow_raw(1),
                    std::os::fd::BorrowedFd::borrow_raw(2),
                ]
            };
            conn.channel
                .send_with_fds(&Request::AdoptStdio.encode(), &stdio)
                .map_err(|e| RemoteError::Start(format!("adopt stdio: {e}")))?;
            let body = conn
                .channel
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
        }
        Ok(remote)
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
        Self::handshake(channel, None, timeouts)
    }

    fn handshake(
        mut channel: Channel,
        child: Option<Child>,
        timeouts: Timeouts,
    ) -> Result<Self, RemoteError> {
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
        let child_pid =
            std::sync::atomic::AtomicI32::new(child.as_ref().map_or(0, |c| c.id() as i32));
        let sender = channel.sender();
        Ok(RemoteExecutor {
            conn: ReentrantMutex::new(RefCell::new(Connection {
                channel,
                next_id: 0,
                child,
                broken: None,
                timeout: None,
            })),
            handler: RwLock::new(None),
            hello,
            timeouts,
            child_pid,
            round_trips: Mutex::new(Vec::new()),
            deferred: Mutex::new(None),
            beside: Mutex::new(Beside::default()),
            routed: parking_lot::Condvar::new(),
            sender,
        })
    }

    /// What the executor said when it started.
    pub fn hello(&self) -> &Hello {
        &self.hello
    }

    /// The executor's process id.
    pub fn pid(&self) -> u32 {
        self.hello.pid
    }

    /// Sends this process's standard input to the program the executor runs (an executor
    /// serving `--listen` reads its standard input from these messages), from a thread
    /// that reads it until end of input; for `kiln run --connect`. Call it once.
    pub fn forward_stdin(&self) {
        let sender = self.conn.lock().borrow().channel.sender();
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
        self.conn.lock().borrow().channel.can_pass_fds()
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

    /// Sends one request and waits for its answer, serving the executor's own requests
    /// and forwarding the program's output meanwhile.
    fn send_one(&self, request: &Request) -> Result<(Response, Option<OwnedFd>), RemoteError> {
        // A thread that waits for code to run holds the connection: other threads' requests
        // go beside it (not a second `RunMain`, which the executor refuses while one runs).
        let beside_ok = !matches!(request, Request::RunMain { .. } | Request::Shutdown);
        let guard = loop {
            if let Some(guard) = self.conn.try_lock_for(Duration::from_millis(2)) {
                break guard;
            }
            if beside_ok {
                if let Some(result) = self.send_beside(request) {
                    return result;
                }
            }
        };
        let mut conn = guard.borrow_mut();
        if let Some(why) = &conn.broken {
            return Err(RemoteError::Broken(why.clone()));
        }
        let running = matches!(
            request,
            Request::RunMain { .. }
                | Request::Call { .. }
                | Request::RunInitializers { .. }
                | Request::RunFinalizers { .. }
        );
        let timeout = if running {
            self.timeouts.run
        } else {
            Some(self.timeouts.request)
        };
        if conn.timeout != Some(timeout) {
            conn.channel.set_timeout(timeout).map_err(io_err)?;
            conn.timeout = Some(timeout);
        }
        let name = request.to_string();
        let started = std::time::Instant::now();
        // This thread reads for the requests made beside it while the code runs.
        let owner = running && {
            let mut beside = self.beside.lock();
            !std::mem::replace(&mut beside.running, true)
        };
        let _reading = ReadingBeside {
            remote: self,
            owner,
        };
        conn.next_id = conn.next_id % (BESIDE - 1) + 1;
        let id = conn.next_id;
        if let Err(e) = conn
            .channel
            .send(&crate::protocol::with_id(request.encode(), id))
        {
            let error = self.failure(&mut conn, &name, e);
            conn.broken = Some(error.to_string());
            return Err(error);
        }
        // The program's output may come before the answer, and the executor's own
        // requests (a call-through stub's first call while this request runs code), and
        // the answers to requests made beside this one.
        let mut mine = None;
        let response = loop {
            if let Some(answer) = mine.take() {
                if !owner || self.no_one_waits_beside() {
                    break answer;
                }
                mine = Some(answer);
            }
            let body = match conn.channel.recv() {
                Ok(body) => body,
                Err(e) => {
                    let error = self.failure(&mut conn, &name, e);
                    conn.broken = Some(error.to_string());
                    return Err(error);
                }
            };
            let got = crate::protocol::message_id(&body).unwrap_or(0);
            let handler = self.handler.read().clone();
            if let (true, Some(handler)) = (got & crate::protocol::EXECUTOR_REQUEST != 0, handler) {
                // Served on a thread of its own: the handler makes requests (to link a
                // body) that go beside this one, whose answers this thread reads and
                // routes meanwhile; it never waits on the session's locks itself.
                let sender = self.sender.clone();
                let serve = move || {
                    let answer = match Request::decode(&body) {
                        // A panicking handler still answers: the executor waits for it.
                        Ok(request) => {
                            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                                handler(&request)
                            }))
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
                    let _ = self
                        .sender
                        .send(&crate::protocol::with_id(answer.encode(), got));
                }
                continue;
            }
            match Response::decode(&body) {
                Ok(Response::Output { stream, bytes }) => forward_output(stream, &bytes),
                // The answer to this request.
                Ok(r) if got == id => mine = Some(r),
                // What the executor says on its own (id 0): the end of it.
                Ok(r @ (Response::Crashed { .. } | Response::Exited { .. })) if got == 0 => {
                    break r
                }
                // The answer to a request made beside this one (or to one whose thread
                // gave up waiting).
                Ok(r) if got & BESIDE != 0 && got & crate::protocol::EXECUTOR_REQUEST == 0 => {
                    let fd = conn.channel.take_fd();
                    self.route(got, r, fd);
                }
                Ok(r) => {
                    let why = if got & crate::protocol::EXECUTOR_REQUEST != 0 {
                        format!(
                            "the executor made a request ({got:#x}) this controller does not serve"
                        )
                    } else {
                        format!("answer with id {got} to request {id}: {r:?}")
                    };
                    conn.broken = Some(why.clone());
                    return Err(RemoteError::Unexpected {
                        request: name,
                        response: Response::Error(why),
                    });
                }
                Err(e) => {
                    conn.broken = Some(format!("malformed response: {e}"));
                    return Err(e.into());
                }
            }
        };
        self.count_round_trip(&name, started.elapsed());
        match response {
            Response::Exited { status } => {
                let error = RemoteError::Exited {
                    pid: self.hello.pid,
                    status,
                    request: name,
                };
                conn.broken = Some(error.to_string());
                if let Some(child) = &mut conn.child {
                    let _ = reap(child, &self.child_pid);
                }
                Err(error)
            }
            Response::Error(message) => Err(RemoteError::Refused {
                request: name,
                message,
            }),
            Response::Crashed {
                signal,
                fault_address,
                pc,
                exception,
            } => {
                let error = RemoteError::Crashed {
                    pid: self.hello.pid,
                    signal,
                    name: signal_name(signal),
                    fault_address,
                    pc,
                    exception,
                    request: name,
                };
                conn.broken = Some(error.to_string());
                if let Some(child) = &mut conn.child {
                    let _ = reap(child, &self.child_pid);
                }
                Err(error)
            }
            other => {
                let fd = conn.channel.take_fd();
                Ok((other, fd))
            }
        }
    }

    /// Turns a channel failure into the most useful error: a child's exit signal if it died.
    fn failure(&self, conn: &mut Connection, request: &str, error: ChannelError) -> RemoteError {
        let pid = self.hello.pid;
        match error {
            ChannelError::Timeout(timeout) => RemoteError::Timeout {
                pid,
                request: request.to_string(),
                timeout,
            },
            ChannelError::Closed => {
                let how = match &mut conn.child {
                    Some(child) => match reap(child, &self.child_pid).ok_or("unknown") {
                        Ok(status) => match status.signal() {
                            Some(signal) => {
                                return RemoteError::Crashed {
                                    pid,
                                    signal,
                                    name: signal_name(signal),
                                    fault_address: 0,
                                    pc: 0,
                                    exception: 0,
                                    request: request.to_string(),
                                }
                            }
                            None => match status.code() {
                                Some(code) => {
                                    return RemoteError::Exited {
                                        pid,
                                        status: code,
                                        request: request.to_string(),
                                    }
                                }
                                None => format!("exited with {status}"),
                            },
                        },
                        Err(e) => e.to_string(),
                    },
                    None => "connection closed".into(),
                };
                RemoteError::Died {
                    pid,
                    request: request.to_string(),
                    how,
                }
            }
            ChannelError::Auth(reason) => RemoteError::Authentication {
                address: format!("pid {pid}"),
                reason,
            },
            other => RemoteError::Io(other.to_string()),
        }
    }

    /// Sets what answers the requests the executor makes of this controller (a
    /// call-through stub's first call). Without one, such a request breaks the
    /// connection.
    pub fn set_request_handler(&self, handler: ExecutorRequestHandler) {
        *self.handler.write() = Some(handler);
    }

    /// Sends `request` beside the running one and waits for the reading thread to route
    /// its answer; `None` if no code runs any more (the caller takes the lock instead).
    #[allow(clippy::type_complexity)]
    fn send_beside(
        &self,
        request: &Request,
    ) -> Option<Result<(Response, Option<OwnedFd>), RemoteError>> {
        let id = {
            let mut beside = self.beside.lock();
            if !beside.running {
                return None;
            }
            beside.last = beside.last % (BESIDE - 1) + 1;
            let id = BESIDE | beside.last;
            beside.answers.insert(id, Routed::Waiting);
            id
        };
        let name = request.to_string();
        let started = std::time::Instant::now();
        if let Err(e) = self
            .sender
            .send(&crate::protocol::with_id(request.encode(), id))
        {
            self.beside.lock().answers.remove(&id);
            return Some(Err(io_err(e)));
        }
        let timeout = match request {
            Request::Call { .. }
            | Request::RunInitializers { .. }
            | Request::RunFinalizers { .. } => self.timeouts.run,
            _ => Some(self.timeouts.request),
        };
        let deadline = timeout.map(|t| std::time::Instant::now() + t);
        let mut beside = self.beside.lock();
        loop {
            if !matches!(beside.answers.get(&id), Some(Routed::Waiting)) {
                let routed = beside.answers.remove(&id);
                drop(beside);
                self.count_round_trip(&name, started.elapsed());
                return Some(match routed {
                    Some(Routed::Answered(Response::Error(message), _)) => {
                        Err(RemoteError::Refused {
                            request: name,
                            message,
                        })
                    }
                    Some(Routed::Answered(response, fd)) => Ok((response, fd)),
                    Some(Routed::Failed(why)) => Err(RemoteError::Broken(why)),
                    _ => Err(RemoteError::Broken("the answer was lost".into())),
                });
            }
            let timed_out = match deadline {
                Some(deadline) => self.routed.wait_until(&mut beside, deadline).timed_out(),
                None => {
                    self.routed.wait(&mut beside);
                    false
                }
            };
            if timed_out && matches!(beside.answers.get(&id), Some(Routed::Waiting)) {
                beside.answers.insert(id, Routed::Abandoned);
                return Some(Err(RemoteError::Timeout {
                    pid: self.hello.pid,
                    request: name,
                    timeout: timeout.unwrap_or_default(),
                }));
            }
        }
    }

    /// Hands an answer read by the thread that holds the connection to the thread that
    /// made the request beside it.
    fn route(&self, id: u32, response: Response, fd: Option<OwnedFd>) {
        let mut beside = self.beside.lock();
        match beside.answers.get(&id) {
            Some(Routed::Waiting) => {
                beside.answers.insert(id, Routed::Answered(response, fd));
                self.routed.notify_all();
            }
            // Its thread gave up; an id not (or no longer) awaited is dropped.
            _ => {
                beside.answers.remove(&id);
            }
        }
    }

    /// Whether no request made beside waits for its answer; if none does, this thread
    /// stops reading for others (atomically: a request made after goes by the lock).
    fn no_one_waits_beside(&self) -> bool {
        let mut beside = self.beside.lock();
        let waiting = beside
            .answers
            .values()
            .any(|r| matches!(r, Routed::Waiting));
        if !waiting {
            beside.running = false;
        }
        !waiting
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

    /// Asks the executor to exit, and waits for a child executor.
    pub fn shutdown(&self) {
        let guard = self.conn.lock();
        let mut conn = guard.borrow_mut();
        if conn.broken.is_none() {
            let _ = conn.channel.set_timeout(Some(Duration::from_secs(5)));
            // Request ids are non-zero (docs/PROTOCOL.md); 0 is the executor's own.
            conn.next_id = conn.next_id % (BESIDE - 1) + 1;
            let shutdown = crate::protocol::with_id(Request::Shutdown.encode(), conn.next_id);
            if conn.channel.send(&shutdown).is_ok() {
                // The program's last output may come before the answer.
                while let Ok(body) = conn.channel.recv() {
                    match Response::decode(&body) {
                        Ok(Response::Output { stream, bytes }) => forward_output(stream, &bytes),
                        _ => break,
                    }
                }
            }
            conn.broken = Some("shut down".into());
        } else if let Some(child) = &mut conn.child {
            // A broken connection (a timeout, say) may have left the executor running JIT
            // code forever: do not wait for it.
            let _ = child.kill();
        }
        conn.channel.shutdown();
        if let Some(mut child) = conn.child.take() {
            let _ = reap(&mut child, &self.child_pid);
        }
    }

    /// Kills a child executor (`SIGKILL`), even while a request is waiting for it; the
    /// waiting request then fails with the signal.
    pub fn kill(&self) {
        let pid = self.child_pid.load(std::sync::atomic::Ordering::SeqCst);
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
        let conn = self.conn.get_mut().get_mut();
        if conn.child.is_some() {
            self.shutdown();
        } else {
            conn.channel.shutdown();
        }
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
