//! Call-through stubs without a body: resolved through the controller, from the serving
//! thread or forwarded to it from the thread the stub was called on.

use super::*;

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
pub(super) fn resolve_through(serving: &Serving, stub: u64) -> u64 {
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
pub(super) struct Forwarded {
    pub(super) target: std::sync::Mutex<Option<u64>>,
    pub(super) ready: std::sync::Condvar,
}

impl Forwarded {
    pub(super) fn answer(&self, target: u64) {
        if let Ok(mut t) = self.target.lock() {
            *t = Some(target);
        }
        self.ready.notify_all();
    }
}

/// While a request's code runs on another thread, the serving thread resolves stubs for
/// every other thread: they queue the stub and wake it through a pipe.
pub(super) struct Forwarder {
    pub(super) queue: std::sync::Mutex<ForwardQueue>,
    /// The write end of the serving thread's wake-up pipe (written under the queue's
    /// lock, and closed only after the queue has ended).
    pub(super) wake: libc::c_int,
}

/// Resolutions waiting for the serving thread.
#[derive(Default)]
pub(super) struct ForwardQueue {
    pub(super) waiting: Vec<(u64, std::sync::Arc<Forwarded>)>,
    /// A request's code runs: the serving thread reads the connection for the threads
    /// that queue. When none does, a thread calling gets the fallback at once.
    pub(super) open: bool,
    /// The connection's serving has ended: the wake-up pipe may be closed.
    pub(super) ended: bool,
}

impl Forwarder {
    /// From now on threads may queue: a request's code runs.
    pub(super) fn open(&self) {
        if let Ok(mut queue) = self.queue.lock() {
            queue.open = true;
        }
    }

    /// Takes what is queued.
    pub(super) fn take(&self) -> Vec<(u64, std::sync::Arc<Forwarded>)> {
        self.queue
            .lock()
            .map(|mut queue| std::mem::take(&mut queue.waiting))
            .unwrap_or_default()
    }

    /// No thread may queue any more (for good with `end`: the wake-up pipe may then
    /// close); those waiting get the fallback.
    pub(super) fn close(&self, end: bool) {
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
pub(super) static FORWARDER: std::sync::Mutex<Option<std::sync::Arc<Forwarder>>> =
    std::sync::Mutex::new(None);

/// Asks the serving thread to resolve `stub` and waits for its answer; `None` when no
/// request's code runs (nobody reads the connection for this thread).
pub(super) fn forward_to_serving_thread(stub: u64) -> Option<u64> {
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
