//! Requests that run JIT code (main, calls, initializers, finalizers), each on a thread
//! other than the serving one, while the serving thread answers beside them.

use super::*;

/// The code a request runs, on a thread other than the serving one; gives its answer.
pub(super) type CodeJob = Box<dyn FnOnce() -> Response + Send>;

/// The code of the controller's requests (main, calls, initializers, finalizers), run on
/// threads other than the serving one: main's thread when it is idle, else a thread of
/// its own. Each sends its own answer when its code returns (the channel's sender is
/// shared), so an answer waits for no second thread to wake. Meanwhile the serving
/// thread goes on reading the connection: `Input` reaches the program, other requests
/// are served (a hot swap, a link, a lookup, a call from another controller thread), and
/// the stubs any executor thread calls are resolved (the threads queue them through the
/// [`Forwarder`], whose pipe wakes the serving thread). Made at the first such request and
/// kept for the connection.
pub(super) struct CodeJobs {
    /// Requests whose code has not returned.
    pub(super) running: std::sync::Mutex<usize>,
    /// Signalled when `running` falls to 0.
    pub(super) idle: std::sync::Condvar,
    /// One of them is main.
    pub(super) main: std::sync::atomic::AtomicBool,
    pub(super) forwarder: std::sync::Arc<Forwarder>,
    /// The read end of the forwarder's wake-up pipe.
    pub(super) wake_read: libc::c_int,
}

impl CodeJobs {
    /// Its wake-up pipe, and the forwarder that threads calling stubs find.
    pub(super) fn new() -> Result<std::sync::Arc<Self>, String> {
        let mut wake = [-1; 2];
        // SAFETY: pipe2 writes two descriptors.
        if unsafe { libc::pipe2(wake.as_mut_ptr(), libc::O_CLOEXEC | libc::O_NONBLOCK) } != 0 {
            return Err(format!(
                "cannot run code: {}",
                std::io::Error::last_os_error()
            ));
        }
        let forwarder = std::sync::Arc::new(Forwarder {
            queue: std::sync::Mutex::new(ForwardQueue::default()),
            wake: wake[1],
        });
        if let Ok(mut f) = FORWARDER.lock() {
            *f = Some(forwarder.clone());
        }
        Ok(std::sync::Arc::new(CodeJobs {
            running: std::sync::Mutex::new(0),
            idle: std::sync::Condvar::new(),
            main: std::sync::atomic::AtomicBool::new(false),
            forwarder,
            wake_read: wake[0],
        }))
    }

    /// Whether some request's code runs.
    pub(super) fn busy(&self) -> bool {
        self.running.lock().is_ok_and(|n| *n > 0)
    }

    /// Starts `code` for request `id`; its answer goes out through `sender`.
    pub(super) fn submit(
        self: &std::sync::Arc<Self>,
        id: u32,
        main: bool,
        code: CodeJob,
        sender: Sender,
    ) -> Result<(), String> {
        if main && self.main.load(Ordering::SeqCst) {
            return Err("main is running".into());
        }
        let first = {
            let mut running = self.running.lock().map_err(|_| "code jobs poisoned")?;
            *running += 1;
            if *running == 1 {
                // Threads calling stubs are served from now on.
                self.forwarder.open();
            }
            *running == 1
        };
        if main {
            self.main.store(true, Ordering::SeqCst);
        }
        let jobs = self.clone();
        let job: Job = Box::new(move || {
            // Bodies replaced while this code runs are kept until it returns.
            let guard = kiln_runtime::code_guards::pin();
            let response = code();
            drop(guard);
            // Counted out before the answer goes: the controller's next request finds
            // main's thread idle.
            jobs.finished(main);
            let _ = sender.send(&with_id(response.encode(), id));
        });
        CodeRunner::run(job, first).inspect_err(|_| self.finished(main))
    }

    pub(super) fn finished(&self, main: bool) {
        if main {
            self.main.store(false, Ordering::SeqCst);
        }
        let Ok(mut running) = self.running.lock() else {
            return;
        };
        *running = running.saturating_sub(1);
        if *running == 0 {
            // No request's code runs: threads that call a stub from now on get the
            // fallback, those still waiting get it now.
            self.forwarder.close(false);
            self.idle.notify_all();
        }
    }

    /// Waits until no request's code runs (the connection ended under it: its end
    /// decides what happens next).
    pub(super) fn wait_until_idle(&self) {
        let Ok(mut running) = self.running.lock() else {
            return;
        };
        while *running > 0 {
            running = match self.idle.wait(running) {
                Ok(r) => r,
                Err(_) => return,
            };
        }
    }

    /// On the serving thread while code runs: waits up to `ms` for the connection or a
    /// thread's stub, and resolves the stubs queued. `Ok(true)` when the connection has
    /// bytes to read, `Err` when it ended.
    pub(super) fn serve_stubs(&self, serving: &Serving, ms: libc::c_int) -> Result<bool, Ending> {
        let socket = serving.channel.borrow().raw_fd();
        let mut fds = [socket, self.wake_read].map(|fd| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        });
        // SAFETY: two valid pollfd entries.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), 2, ms) };
        if n <= 0 || fds[1].revents == 0 {
            return Ok(n > 0 && fds[0].revents != 0);
        }
        let mut sink = [0u8; 64];
        // SAFETY: reads into a local buffer from our non-blocking pipe.
        while unsafe { libc::read(self.wake_read, sink.as_mut_ptr().cast(), sink.len()) } > 0 {}
        for (stub, forwarded) in self.forwarder.take() {
            forwarded.answer(resolve_through(serving, stub));
        }
        match serving.ended.borrow_mut().take() {
            Some(ending) => Err(ending),
            // What the connection has is read at the next look.
            None => Ok(false),
        }
    }
}

impl Drop for CodeJobs {
    fn drop(&mut self) {
        if let Ok(mut f) = FORWARDER.lock() {
            *f = None;
        }
        self.forwarder.close(true);
        for fd in [self.wake_read, self.forwarder.wake] {
            // SAFETY: our descriptors, closed once; the write end only after the queue
            // ended (under its lock).
            unsafe { libc::close(fd) };
        }
    }
}

/// The code `request` runs, its addresses checked first (the state is not borrowed while
/// it runs: a stub it calls may have requests served meanwhile); `None` for a request
/// that runs no code. `Some((main, code))`.
pub(super) fn code_of(state: &State, request: &Request) -> Option<Result<(bool, CodeJob), String>> {
    let checked = |addresses: &[u64]| addresses.iter().try_for_each(|&a| state.code(a));
    Some(match request {
        &Request::RunMain { address, ref args } => checked(&[address]).map(|()| {
            let args = args.clone();
            let code: CodeJob = Box::new(move || {
                // SAFETY: main lies in memory this executor reserved (checked above),
                // linked by the controller.
                let status = unsafe { runtime::call_main(address, &args) };
                leave_if_forked_child(status);
                // As a native program's exit would after main: this thread's
                // thread-local destructors first (the thread stays, for the next main),
                // then stdio flushed.
                kiln_runtime::thread_locals::end_thread_locals();
                runtime::flush_stdio();
                Response::Value(status as u32 as u64)
            });
            (true, code)
        }),
        &Request::Call { address, ref args } => checked(&[address]).map(|()| {
            let args = args.clone();
            let code: CodeJob = Box::new(move || {
                let mut a = [0u64; 6];
                a[..args.len()].copy_from_slice(&args);
                // SAFETY: the function lies in memory this executor reserved; extra
                // integer arguments are ignored by a callee with fewer parameters (SysV
                // ABI).
                let f: extern "C" fn(u64, u64, u64, u64, u64, u64) -> u64 =
                    unsafe { std::mem::transmute(address as usize) };
                let v = f(a[0], a[1], a[2], a[3], a[4], a[5]);
                leave_if_forked_child(v as i32);
                runtime::flush_stdio();
                Response::Value(v)
            });
            (false, code)
        }),
        Request::RunInitializers { functions } => checked(functions).map(|()| {
            let functions = functions.clone();
            let code: CodeJob = Box::new(move || {
                // SAFETY: the functions lie in memory this executor reserved and the
                // controller linked and finalized.
                unsafe { runtime::run_initializers(&functions) };
                Response::Ok
            });
            (false, code)
        }),
        &Request::RunFinalizers {
            dso_handle,
            ref functions,
        } => checked(functions).map(|()| {
            let functions = functions.clone();
            let code: CodeJob = Box::new(move || {
                // SAFETY: as for initializers.
                unsafe { runtime::run_finalizers(dso_handle, &functions) };
                Response::Ok
            });
            (false, code)
        }),
        _ => return None,
    })
}

/// Starts request `id`'s code (see [`CodeJobs`]); `Some` when the connection ends.
pub(super) fn run_code(serving: &Serving, id: u32, main: bool, code: CodeJob) -> Option<Ending> {
    if serving.jobs.get().is_none() {
        match CodeJobs::new() {
            Ok(jobs) => {
                let _ = serving.jobs.set(jobs);
            }
            Err(e) => return serving.answer(id, Response::Error(e)),
        }
    }
    let Some(jobs) = serving.jobs.get() else {
        return serving.answer(id, Response::Error("cannot run code".into()));
    };
    let sender = serving.channel.borrow().sender();
    match jobs.submit(id, main, code, sender) {
        Ok(()) => None,
        Err(e) => serving.answer(id, Response::Error(e)),
    }
}

/// Work for main's thread.
pub(super) type Job = Box<dyn FnOnce() + Send>;

/// The thread main runs on: made when serving starts (the executor is idle while the
/// controller loads and links), so that running main costs a wake-up rather than a
/// thread's creation (its stack, its malloc arena, its signal stacks: ~0.35 ms of an
/// empty program's `kiln run --oop`). Unnamed: it keeps the process's name (`comm`), as a
/// program's main thread does, for perf reports and the program's own
/// `prctl(PR_GET_NAME)`.
pub(super) struct CodeRunner;

/// The runner's queue, once started.
pub(super) static CODE_RUNNER: std::sync::Mutex<Option<std::sync::mpsc::Sender<Job>>> =
    std::sync::Mutex::new(None);

impl CodeRunner {
    /// Starts the thread (once per process; a failure leaves `run` to start one per job).
    pub(super) fn start() {
        let Ok(mut runner) = CODE_RUNNER.lock() else {
            return;
        };
        if runner.is_some() {
            return;
        }
        let (jobs, queue) = std::sync::mpsc::channel::<Job>();
        let started = std::thread::Builder::new()
            .stack_size(8 << 20)
            .spawn(move || {
                let _stack = AlternateStack::install();
                // The thread's first allocation makes its malloc arena: now, not in main.
                drop(std::hint::black_box(vec![0u8; 256]));
                while let Some(job) = next_job(&queue) {
                    job();
                }
            });
        if started.is_ok() {
            *runner = Some(jobs);
        }
    }

    /// Runs `job` on main's thread when `on_main_thread` (it is idle), else (or where it
    /// could not be made) on a new one.
    pub(super) fn run(job: Job, on_main_thread: bool) -> Result<(), String> {
        let runner = if on_main_thread {
            CODE_RUNNER.lock().ok().and_then(|r| r.clone())
        } else {
            None
        };
        let job = match runner {
            Some(jobs) => match jobs.send(job) {
                Ok(()) => return Ok(()),
                Err(std::sync::mpsc::SendError(job)) => job,
            },
            None => job,
        };
        std::thread::Builder::new()
            .stack_size(8 << 20)
            .spawn(move || {
                let _stack = AlternateStack::install();
                job();
            })
            .map(|_| ())
            .map_err(|e| e.to_string())
    }
}

/// How long main's thread looks for its next job before it sleeps.
pub(super) const RUNNER_SPIN: Duration = Duration::from_micros(50);

/// main's thread's next job: looked for without sleeping for [`RUNNER_SPIN`] after the
/// last (a controller calling in a loop sends the next within that), then waited for.
/// A sleeping thread's wake-up is what a call paid: 19 -> 46 µs a round trip on this
/// VM, where waking an idle virtual CPU is slow.
pub(super) fn next_job(queue: &std::sync::mpsc::Receiver<Job>) -> Option<Job> {
    let start = std::time::Instant::now();
    loop {
        match queue.try_recv() {
            Ok(job) => return Some(job),
            Err(std::sync::mpsc::TryRecvError::Disconnected) => return None,
            Err(std::sync::mpsc::TryRecvError::Empty) if start.elapsed() < RUNNER_SPIN => {
                std::hint::spin_loop()
            }
            Err(std::sync::mpsc::TryRecvError::Empty) => return queue.recv().ok(),
        }
    }
}

/// The calling thread's alternate signal stack, so that a stack overflow in JIT code is
/// reported too; given back (disabled and freed) when dropped.
pub(super) struct AlternateStack {
    pub(super) _memory: Box<[u8]>,
}

impl AlternateStack {
    const SIZE: usize = 64 * 1024;

    pub(super) fn install() -> Self {
        let mut stack = vec![0u8; Self::SIZE].into_boxed_slice();
        let ss = libc::stack_t {
            ss_sp: stack.as_mut_ptr().cast(),
            ss_flags: 0,
            ss_size: Self::SIZE,
        };
        // SAFETY: the stack lives until `drop`, which disables it first.
        unsafe { libc::sigaltstack(&ss, std::ptr::null_mut()) };
        AlternateStack { _memory: stack }
    }
}

impl Drop for AlternateStack {
    fn drop(&mut self) {
        let ss = libc::stack_t {
            ss_sp: std::ptr::null_mut(),
            ss_flags: libc::SS_DISABLE,
            ss_size: 0,
        };
        // SAFETY: disables this thread's alternate stack before its memory is freed.
        unsafe { libc::sigaltstack(&ss, std::ptr::null_mut()) };
    }
}
