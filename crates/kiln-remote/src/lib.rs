//! # kiln-remote
//!
//! Linking in one process, running in another. The controller (the process that links)
//! starts a `kiln-executor` child connected by a socketpair, or connects to one listening
//! on TCP; they speak a versioned binary [`protocol`]. The executor reserves memory (a
//! memfd it maps read-execute / read-only), looks symbols up in its own address space,
//! registers unwind information, runs initializers, `main` and calls.
//!
//! Code reaches the executor through a [`kiln_memory::Mapper`]: [`SharedMemoryMapper`]
//! (the executor's memfd passed over the Unix socket with `SCM_RIGHTS`, mapped writable
//! here: the linker writes code straight into it, no code byte crosses the socket) or
//! [`CopyMapper`] (bytes copied over the connection, for TCP). The linker and the slab
//! allocator are the same code as in-process.
//!
//! A child executor asked where `puts` is in its process (`no_run`: it needs the
//! `kiln-executor` binary built; the session, `kiln::Executor`, wraps all of this):
//!
//! ```no_run
//! # fn main() -> Result<(), kiln_remote::RemoteError> {
//! use kiln_remote::protocol::{Request, Response};
//! use kiln_remote::{RemoteExecutor, Timeouts};
//!
//! let binary = std::path::Path::new("target/release/kiln-executor");
//! let executor = RemoteExecutor::spawn(binary, Timeouts::default())?;
//! let request = Request::Lookup { library: 0, name: "puts".into() };
//! if let Response::Symbol { address, .. } = executor.request(&request)? {
//!     println!("puts is at {address:#x} in process {}", executor.pid());
//! }
//! executor.shutdown();
//! # Ok(()) }
//! ```

mod child;
mod controller;
pub use kiln_wire::{channel, protocol, secure};
mod mapper;

pub use controller::{
    Batching, ExecutorRequestHandler, RemoteError, RemoteExecutor, RoundTrips, Sandbox,
    StartingExecutor, Timeouts,
};
pub use mapper::{CopyMapper, SharedMemoryMapper};
