//! # kiln-executor
//!
//! The `kiln-executor` binary's library: [`server`] serves a controller in another
//! process over the `kiln-remote` protocol, [`listener`] accepts connections (a process
//! each), [`sandbox`] confines the code it runs. What the code itself needs — symbol
//! lookup, unwind registration, thread-locals, exports, crash reports, calling `main` —
//! is `kiln-runtime`'s. A controller (`kiln-remote`, or any program speaking
//! docs/PROTOCOL.md) starts the `kiln-executor` binary with one end of a socket pair, or
//! reaches `kiln-executor --listen` over TCP with a key.
//!
//! One connection served on a thread of this process, spoken to by hand:
//!
//! ```
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use kiln_wire::channel::{Channel, Stream};
//! use kiln_wire::protocol::{Hello, Request, Response};
//!
//! let (ours, theirs) = std::os::unix::net::UnixStream::pair()?;
//! let server = std::thread::spawn(move || {
//!     kiln_executor::server::serve(Channel::new(Stream::Unix(theirs)))
//! });
//! let mut channel = Channel::new(Stream::Unix(ours));
//! let hello = Hello::decode(&channel.recv()?)?;
//! assert_eq!(hello.pid, std::process::id());
//! channel.send(&Request::Lookup { library: 0, name: "puts".into() }.encode())?;
//! match Response::decode(&channel.recv()?)? {
//!     Response::Symbol { address, .. } => assert_ne!(address, 0),
//!     other => panic!("{other:?}"),
//! }
//! channel.send(&Request::Shutdown.encode())?;
//! assert!(matches!(Response::decode(&channel.recv()?)?, Response::Ok));
//! assert_eq!(server.join().unwrap(), kiln_executor::server::Ending::Shutdown);
//! # Ok(()) }
//! ```

pub mod listener;
pub mod sandbox;
pub mod server;
