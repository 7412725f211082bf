//! `kiln-executor`: runs code linked by a Kiln controller in another process.
//!
//! ```text
//! kiln-executor --fd N          serve the Unix socket on descriptor N (started by a controller)
//! kiln-executor --listen ADDR   accept controllers on TCP ADDR (default 127.0.0.1:0, loopback)
//! ```
//! With `--listen`, the bound address is printed on stderr as
//! `kiln-executor: listening on HOST:PORT`, and connections are served one after another
//! until one asks to shut down.

use kiln_executor::server::{serve, Ending};
use kiln_remote::channel::{Channel, Stream};
use std::io::Write;
use std::os::fd::FromRawFd;
use std::os::unix::net::UnixStream;

/// Exits without running exit handlers: JIT code may have registered some (C++ and
/// thread-local destructors) in memory that is unmapped by now.
fn exit(code: i32) -> ! {
    kiln_executor::runtime::flush_stdio();
    // SAFETY: _exit ends the process at once; stdio was flushed above.
    unsafe { libc::_exit(code) }
}

fn usage() -> ! {
    eprintln!("usage: kiln-executor --fd N | --listen [ADDR]");
    std::process::exit(2);
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
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
            let ending = serve(Channel::new(Stream::Unix(stream)));
            exit(if matches!(ending, Ending::Failed(_)) {
                1
            } else {
                0
            });
        }
        Some("--listen") => {
            let address = args.get(1).map_or("127.0.0.1:0", String::as_str);
            let listener = match std::net::TcpListener::bind(address) {
                Ok(l) => l,
                Err(e) => {
                    eprintln!("kiln-executor: cannot listen on {address}: {e}");
                    std::process::exit(1);
                }
            };
            let bound = listener
                .local_addr()
                .map(|a| a.to_string())
                .unwrap_or_default();
            eprintln!("kiln-executor: listening on {bound}");
            let _ = std::io::stderr().flush();
            for stream in listener.incoming() {
                let Ok(stream) = stream else { continue };
                if serve(Channel::new(Stream::Tcp(stream))) == Ending::Shutdown {
                    break;
                }
            }
            exit(0);
        }
        _ => usage(),
    }
}
