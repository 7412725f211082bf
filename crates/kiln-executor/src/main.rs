//! `kiln-executor`: runs code linked by a Kiln controller in another process.
//!
//! ```text
//! kiln-executor --fd N
//!     serve the Unix socket on descriptor N (started by a controller: already private)
//! kiln-executor --listen [ADDR] [--key-file FILE] [--no-auth] [--idle-timeout SECS]
//!     [--max-connections N] [--max-unauthenticated N]
//!     accept controllers on TCP ADDR (default 127.0.0.1:0, loopback)
//! kiln-executor --listen-unix PATH
//!     a pre-started executor: accept controllers on the Unix socket PATH (its owner's
//!     only, and each peer checked to be this user), a forked process each (`kiln run --oop` uses it when
//!     KILN_EXECUTOR_SOCKET names it)
//! ```
//!
//! With `--listen`, every connection must first authenticate with the pre-shared key and
//! is encrypted after (Noise, see `kiln_wire::secure`). The key comes from `--key-file
//! FILE` (read if it exists, which must then be mode 0600; else created with a fresh key,
//! mode 0600), or a fresh key is written to a new file; its path — never the key — is
//! printed on stderr. `--no-auth` serves plaintext, and only on a loopback address.
//! Binding a non-loopback address says so on stderr.
//!
//! Each connection is served by a process of its own (forked when it is accepted), so one
//! client's crash, `exit()`, stall or `Shutdown` touches no other, and the listener lives
//! on. A client silent for longer than the idle timeout (default 300 s) is dropped; the
//! handshake must complete within 10 s. The program's standard output and error go to the
//! client.
//!
//! `main` is a C `main` that skips Rust's runtime set-up (see
//! `kiln_runtime::process_entry`): the executor's start is on the critical path of every
//! `kiln run --oop`.

// (The test harness brings its own `main`.)
#![cfg_attr(not(test), no_main)]

use kiln_executor::listener::{serve_forever, Limits, Notifier};
use kiln_executor::sandbox::SandboxConfig;
use kiln_executor::server::{serve_with, Ending, ServeOptions};
use kiln_wire::channel::{Channel, Stream};
use kiln_wire::secure::{Key, Role};
use std::io::Write;
use std::os::fd::FromRawFd;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// Exits without running exit handlers: JIT code may have registered some (C++ and
/// thread-local destructors) in memory that is unmapped by now.
/// Serves `channel` in this process, which ends with it (see [`ServeOptions::ends_process`]).
fn serve_ending_process(channel: Channel) -> Ending {
    serve_with(
        channel,
        &ServeOptions {
            ends_process: true,
            ..ServeOptions::default()
        },
    )
}

fn exit(code: i32) -> ! {
    kiln_runtime::runtime::flush_stdio();
    // SAFETY: _exit ends the process at once; stdio was flushed above.
    unsafe { libc::_exit(code) }
}

const USAGE: &str = "\
usage: kiln-executor --fd N
       kiln-executor --listen [ADDR] [--key-file FILE] [--no-auth] [--idle-timeout SECS]
                     [--max-connections N] [--max-unauthenticated N]
       kiln-executor --listen-unix PATH

  --fd N                  serve the Unix socket on descriptor N (how kiln run --oop starts it)
  --listen [ADDR]         accept controllers on TCP ADDR (default 127.0.0.1:0); each
                          connection authenticates with the key and is encrypted
  --key-file FILE         the key (read, or created mode 0600 if missing)
  --no-auth               plaintext, loopback addresses only
  --idle-timeout SECS     drop a controller silent this long (default 300)
  --max-connections N     most authenticated connections at once (default 1024)
  --max-unauthenticated N most connections still in their handshake (default 64; the
                          oldest makes room for a new one)
  --listen-unix PATH      a pre-started executor on a Unix socket of this user's
                          (kiln run --oop uses it when KILN_EXECUTOR_SOCKET names it)

In every mode:
  --sandbox               JIT code cannot start programs (execve), trace others, listen
                          for connections (io_uring neither), make namespaces, change
                          the system or any file's mode, owner, times or attributes,
                          or map memory writable and executable at once (seccomp); it
                          holds no capability (no_new_privs); it reads files only
                          beneath system directories and --sandbox-read paths, writes
                          only beneath --sandbox-write paths (Landlock)
  --sandbox-read PATH     also readable (repeatable)
  --sandbox-write PATH    also readable and writable (repeatable)
";

fn usage() -> ! {
    eprint!("{USAGE}");
    std::process::exit(2);
}

/// How long a TCP client has from its connection to its first request (the handshake
/// included): until then it is not authenticated.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

struct ListenOptions {
    address: String,
    key_file: Option<PathBuf>,
    no_auth: bool,
    idle_timeout: Duration,
    limits: Limits,
}

fn parse_listen(args: &[String]) -> ListenOptions {
    let mut options = ListenOptions {
        address: "127.0.0.1:0".into(),
        key_file: None,
        no_auth: false,
        idle_timeout: Duration::from_secs(300),
        limits: Limits::default(),
    };
    let mut i = 0;
    while i < args.len() {
        match args[i].as_str() {
            "--key-file" => {
                i += 1;
                options.key_file = Some(args.get(i).map(PathBuf::from).unwrap_or_else(|| usage()));
            }
            "--no-auth" => options.no_auth = true,
            "--idle-timeout" => {
                i += 1;
                let secs = args
                    .get(i)
                    .and_then(|s| s.parse::<f64>().ok())
                    .filter(|s| *s > 0.0)
                    .unwrap_or_else(|| usage());
                options.idle_timeout = Duration::from_secs_f64(secs);
            }
            "--max-connections" | "--max-unauthenticated" => {
                let n = args
                    .get(i + 1)
                    .and_then(|s| s.parse::<usize>().ok())
                    .filter(|&n| n > 0)
                    .unwrap_or_else(|| usage());
                if args[i] == "--max-connections" {
                    options.limits.max_connections = n;
                } else {
                    options.limits.max_unauthenticated = n;
                }
                i += 1;
            }
            a if !a.starts_with("--") && i == 0 => options.address = a.to_string(),
            _ => usage(),
        }
        i += 1;
    }
    options
}

/// The key: read from the file, or made fresh and written to it (or to a new file).
fn listen_key(options: &ListenOptions, port: u16) -> Key {
    let fail = |e: kiln_wire::secure::KeyError| -> ! {
        eprintln!("kiln-executor: {e}");
        std::process::exit(1);
    };
    if let Some(path) = &options.key_file {
        if path.exists() {
            let key = Key::read_file(path).unwrap_or_else(|e| fail(e));
            eprintln!("kiln-executor: key from {}", path.display());
            return key;
        }
    }
    let key = Key::generate().unwrap_or_else(|e| fail(e));
    let path = options.key_file.clone().unwrap_or_else(|| {
        let dir = std::env::var_os("XDG_RUNTIME_DIR")
            .map(PathBuf::from)
            .filter(|d| d.is_dir())
            .unwrap_or_else(std::env::temp_dir);
        dir.join(format!("kiln-executor-{}-{port}.key", std::process::id()))
    });
    key.write_new_file(&path).unwrap_or_else(|e| fail(e));
    eprintln!(
        "kiln-executor: new key in {} (mode 0600): give it to kiln run --key-file {} or KILN_EXECUTOR_KEY_FILE",
        path.display(),
        path.display()
    );
    key
}

fn listen(args: &[String], sandbox: Option<SandboxConfig>) -> ! {
    let options = parse_listen(args);
    let listener = match std::net::TcpListener::bind(&options.address) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("kiln-executor: cannot listen on {}: {e}", options.address);
            std::process::exit(1);
        }
    };
    // The kernel's largest queue of established connections (std's is 128): a burst of
    // connections completes its TCP handshakes while the listener hands the earlier ones
    // on, instead of having its SYNs dropped and sent again a second later.
    {
        use std::os::fd::AsRawFd;
        // SAFETY: listen(2) on the descriptor `listener` owns, which is bound and listening
        // already: it only changes the length of its queue.
        unsafe { libc::listen(listener.as_raw_fd(), libc::SOMAXCONN) };
    }
    let Ok(bound) = listener.local_addr() else {
        eprintln!("kiln-executor: no local address");
        std::process::exit(1);
    };
    let loopback = bound.ip().is_loopback();
    if options.no_auth && !loopback {
        eprintln!(
            "kiln-executor: refusing to serve {bound} without authentication: anyone who reaches it could run code as this user. Drop --no-auth (connections then need the key), or listen on a loopback address."
        );
        std::process::exit(2);
    }
    let key = (!options.no_auth).then(|| listen_key(&options, bound.port()));
    if !loopback {
        eprintln!(
            "kiln-executor: listening on {bound}, beyond this machine: connections must authenticate with the key and are encrypted"
        );
    } else if key.is_none() {
        eprintln!("kiln-executor: --no-auth: any local process that reaches {bound} can run code as this user");
    }
    eprintln!("kiln-executor: listening on {bound}");
    let _ = std::io::stderr().flush();
    serve_forever(listener, options.limits, |stream, notifier| {
        // Each connection's process enters the sandbox; the listener stays outside it.
        if !enter_sandbox(sandbox.as_ref()) {
            return 1;
        }
        serve_connection(stream, key.as_ref(), options.idle_timeout, notifier)
    })
}

/// A pre-started executor on a Unix socket: what it saves a controller is the start of a
/// process (exec, loading, the memory probe); each connection still gets a process of its
/// own (forked), with shared memory and the controller's standard descriptors.
fn listen_unix(path: &std::path::Path, sandbox: Option<SandboxConfig>) -> ! {
    use std::os::unix::fs::FileTypeExt;
    // A stale socket of an earlier executor is replaced; any other file is left alone.
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        if !meta.file_type().is_socket() {
            eprintln!(
                "kiln-executor: {} exists and is not a socket: not replacing it",
                path.display()
            );
            std::process::exit(1);
        }
        let _ = std::fs::remove_file(path);
    }
    // Created owner-only from the start (no window in which others may connect); each
    // connection's peer must be this user too (SO_PEERCRED).
    // SAFETY: umask only changes this process's file-creation mask, restored below.
    let old_mask = unsafe { libc::umask(0o077) };
    let bound = std::os::unix::net::UnixListener::bind(path);
    // SAFETY: as above.
    unsafe { libc::umask(old_mask) };
    let listener = match bound {
        Ok(l) => l,
        Err(e) => {
            eprintln!("kiln-executor: cannot listen on {}: {e}", path.display());
            std::process::exit(1);
        }
    };
    eprintln!("kiln-executor: listening on {}", path.display());
    let _ = std::io::stderr().flush();
    serve_forever(listener, Limits::default(), |stream, notifier| {
        if !enter_sandbox(sandbox.as_ref()) {
            return 1;
        }
        let channel = Channel::new(Stream::Unix(stream));
        if !channel.peer_is_same_user() {
            eprintln!("kiln-executor: refused a connection from another user");
            return 1;
        }
        // A peer of this user is authenticated by the kernel.
        notifier.authenticated();
        if matches!(serve_ending_process(channel), Ending::Failed(_)) {
            1
        } else {
            0
        }
    })
}

/// Serves one accepted connection (in its own process); the exit code.
fn serve_connection(
    stream: std::net::TcpStream,
    key: Option<&Key>,
    idle: Duration,
    notifier: Notifier,
) -> i32 {
    let accepted = Instant::now();
    let peer = stream
        .peer_addr()
        .map(|a| a.to_string())
        .unwrap_or_default();
    let mut channel = Channel::new(Stream::Tcp(stream));
    let preamble = if key.is_some() {
        kiln_wire::secure::PREAMBLE_NOISE
    } else {
        kiln_wire::secure::PREAMBLE_PLAIN
    };
    if channel.send_raw(&preamble).is_err() {
        return 1;
    }
    if let Some(key) = key {
        if channel.set_timeout(Some(HANDSHAKE_TIMEOUT)).is_err() {
            return 1;
        }
        if let Err(e) = channel.secure(key, Role::Responder) {
            eprintln!("kiln-executor: refused a connection from {peer}: {e}");
            return 1;
        }
    }
    // Until its first request decrypts, the connection is not authenticated: it has what
    // is left of the handshake's deadline, not the idle timeout.
    let left = HANDSHAKE_TIMEOUT.saturating_sub(accepted.elapsed());
    let notifier = std::sync::Mutex::new(Some(notifier));
    let options = ServeOptions {
        idle_timeout: Some(idle),
        first_request_timeout: Some(left.min(idle).max(Duration::from_millis(1))),
        on_first_request: Some(std::sync::Arc::new(move || {
            if let Some(notifier) = notifier.lock().ok().and_then(|mut n| n.take()) {
                notifier.authenticated();
            }
        })),
        forward_output: true,
        ends_process: true,
    };
    match serve_with(channel, &options) {
        Ending::Failed(why) => {
            // Not to the forwarded stderr (closed by now): to the listener's terminal
            // only if it still is ours; the controller sees the connection end.
            let _ = why;
            1
        }
        _ => 0,
    }
}

/// Takes `--sandbox`, `--sandbox-read PATH` and `--sandbox-write PATH` (any mode) out of
/// `args`; `Some` with `--sandbox` (the others alone are a usage error).
fn take_sandbox(args: &mut Vec<String>) -> Option<SandboxConfig> {
    let mut config = SandboxConfig::default();
    let mut on = false;
    let mut i = 0;
    while i < args.len() {
        match args[i].as_str() {
            "--sandbox" => {
                on = true;
                args.remove(i);
            }
            flag @ ("--sandbox-read" | "--sandbox-write") => {
                let write = flag == "--sandbox-write";
                args.remove(i);
                if i >= args.len() {
                    usage();
                }
                let path = PathBuf::from(args.remove(i));
                if write {
                    config.write.push(path);
                } else {
                    config.read.push(path);
                }
            }
            _ => i += 1,
        }
    }
    if !on && config != SandboxConfig::default() {
        eprintln!("kiln-executor: --sandbox-read and --sandbox-write need --sandbox");
        std::process::exit(2);
    }
    on.then_some(config)
}

/// Enters the sandbox, if asked for; a process that cannot must not serve.
fn enter_sandbox(config: Option<&SandboxConfig>) -> bool {
    let Some(config) = config else { return true };
    match kiln_executor::sandbox::enter(config) {
        Ok(report) => {
            if !report.files_restricted {
                eprintln!(
                    "kiln-executor: --sandbox: this kernel has no Landlock: system calls are restricted, files are not"
                );
            }
            if !report.capabilities_dropped {
                eprintln!(
                    "kiln-executor: --sandbox: the capability bounding set could not be emptied (no CAP_SETPCAP): no capability is held, and none can be gained (no_new_privs, execve refused)"
                );
            }
            true
        }
        Err(e) => {
            eprintln!("kiln-executor: {e}");
            false
        }
    }
}

kiln_runtime::process_main!(|| {
    executor_main();
    0
});

fn executor_main() {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let sandbox = take_sandbox(&mut args);
    match args.first().map(String::as_str) {
        Some("--fd") => {
            let Some(fd) = args
                .get(1)
                .and_then(|a| a.parse::<i32>().ok())
                .filter(|&fd| fd > 2)
            else {
                usage()
            };
            // Programs the JIT code starts must not inherit the protocol socket.
            // SAFETY: fcntl on a descriptor number; harmless if it is not open.
            unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) };
            // SAFETY: the controller handed us this descriptor (a Unix socket) and nothing
            // else in this process owns it.
            let stream = unsafe { UnixStream::from_raw_fd(fd) };
            if !enter_sandbox(sandbox.as_ref()) {
                exit(1);
            }
            let ending = serve_ending_process(Channel::new(Stream::Unix(stream)));
            exit(if matches!(ending, Ending::Failed(_)) {
                1
            } else {
                0
            });
        }
        Some("--help" | "-h") => {
            print!("{USAGE}");
            std::process::exit(0);
        }
        Some("--listen") => listen(&args[1..], sandbox),
        Some("--listen-unix") => match args.get(1) {
            Some(path) => listen_unix(std::path::Path::new(path), sandbox),
            None => usage(),
        },
        _ => usage(),
    }
}
