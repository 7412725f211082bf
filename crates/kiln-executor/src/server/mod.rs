//! The executor's side of the protocol: serve one controller connection, doing in this
//! process what it asks, checking every address against the memory it reserved here.
//!
//! A malformed or out-of-range request gets an error reply and the connection goes on;
//! the executor never writes outside its reservations. JIT code that crashes the process
//! is reported to the controller by a signal handler before the process dies.
//!
//! Rooms, one job each: this file serves the connection (its loop, one request read and
//! routed); `dispatch` does what a request asks; `state` is what the connection made
//! and the checks of every address against it; `code_jobs` runs the requests that run
//! JIT code on threads of their own; `stubs` resolves call-through stubs through the
//! controller; `streams` forwards the program's standard streams; `reports` tells
//! the controller of a crash or the program's exit.

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

mod code_jobs;
mod dispatch;
mod eh_frame;
mod reports;
mod state;
mod streams;
mod stubs;

use code_jobs::*;
use dispatch::*;
use reports::*;
use state::*;
pub use streams::MAX_QUEUED_INPUT;
use streams::*;
use stubs::*;

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
