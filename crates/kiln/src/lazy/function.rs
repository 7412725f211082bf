//! A lazy function's life: its batch (the functions of one
//! [`crate::Jit::add_lazy_functions`]), the registry the stubs' assembly entry finds it
//! in by id, and its first call — compiled once whatever the threads, a failure sent to
//! the fallback, an executor's request answered.

use super::{LazyCompiler, LazyFailure, LazyFunctions};
use crate::jit::Jit;
use crate::library::LibraryId;
use crate::module::Module;
use crate::Error;
use kiln_link::call_through::{STUB_ENTRY, STUB_SIZE};
use kiln_runtime::lazy_entry;
use parking_lot::{Condvar, Mutex, RwLock};
use std::sync::atomic::AtomicU32;
use std::sync::{Arc, OnceLock, Weak};
use std::thread::ThreadId;

/// The state of a lazy function's body.
pub(super) enum Body {
    /// Not compiled yet: the slot points at the stub's entry into Kiln.
    Unresolved,
    /// Being compiled by this thread (the others wait).
    Compiling(ThreadId),
    /// Linked: the slot points at it.
    Ready { address: u64, module: Module },
    /// The compile failed: calls go to the fallback.
    Failed { fallback: u64 },
}

/// The lazy functions of one [`Jit::add_lazy_functions`]: what they share, and each
/// one's own state, in one allocation (10,000 functions are one allocation, not 10,000).
/// Function `i` has id `first + i`, its stub at `stubs + STUB_SIZE * i` and its slot at
/// `slots + 8 * i`.
pub(crate) struct StubBatch {
    pub(super) first: u32,
    pub(super) library: LibraryId,
    pub(super) session: Weak<crate::state::Inner>,
    pub(super) compiler: Arc<dyn LazyCompiler>,
    pub(super) stubs: u64,
    pub(super) slots: u64,
    /// The module of the stubs, held so that the slots' memory lives as long as the
    /// functions.
    pub(super) _module: Module,
    /// The executor process the code runs in (its `RemoteExecutor`'s address), if not
    /// this one: only that executor's requests may resolve the stubs.
    pub(super) executor: Option<usize>,
    /// Where a failed call goes when the compiler gives no fallback: a function that
    /// returns 0, in the process that runs the code.
    pub(super) default_fallback: u64,
    pub(super) functions: Box<[LazyFunction]>,
}

/// One lazy function's own state: its name and its body.
pub(super) struct LazyFunction {
    pub(super) name: kiln_link::Name,
    pub(super) body: Mutex<Body>,
    pub(super) ready: Condvar,
}

impl Drop for StubBatch {
    fn drop(&mut self) {
        registry().write().forget(self.first, self);
        if self.executor.is_none() {
            // Its session is gone: a call through a stub someone still holds goes back
            // into Kiln, finds no function and returns 0, rather than into the body,
            // which is freed next.
            for i in 0..self.functions.len() {
                let (slot, entry) = (self.slot(i), self.entry(i));
                // SAFETY: the slot lies in `self._module`, still alive; only atomic
                // stores and the stub's loads touch it.
                unsafe { lazy_entry::store_code_pointer(slot, entry) };
            }
        }
    }
}

impl StubBatch {
    /// The address of function `i`'s slot.
    fn slot(&self, i: usize) -> u64 {
        self.slots + 8 * i as u64
    }

    /// What function `i`'s slot held first: its stub's own entry into Kiln.
    fn entry(&self, i: usize) -> u64 {
        self.stubs + STUB_SIZE * i as u64 + STUB_ENTRY
    }
}

/// A lazy function: its batch and its place in it.
#[derive(Clone)]
pub(crate) struct FunctionRef {
    pub(super) batch: Arc<StubBatch>,
    pub(super) index: u32,
}

/// Stub ids to functions, for the assembly entry (ids are below 2^31: `push imm32`),
/// by batch: the stubs of one [`Jit::add_lazy_functions`] have consecutive ids, so a
/// batch of any size is registered with one insertion.
#[derive(Default)]
pub(super) struct Registry {
    /// Batches by their first id, with their number of functions (checked before a
    /// batch is upgraded: a batch is never dropped under the registry's lock).
    batches: std::collections::BTreeMap<u32, (u32, Weak<StubBatch>)>,
}

impl Registry {
    pub(super) fn add(&mut self, batch: &Arc<StubBatch>) {
        if !batch.functions.is_empty() {
            let len = batch.functions.len() as u32;
            self.batches
                .insert(batch.first, (len, Arc::downgrade(batch)));
        }
    }

    fn get(&self, id: u32) -> Option<FunctionRef> {
        let (&first, (len, batch)) = self.batches.range(..=id).next_back()?;
        let index = id - first;
        if index >= *len {
            return None;
        }
        let batch = batch.upgrade()?;
        Some(FunctionRef { batch, index })
    }

    /// Batch `me`, registered under `first`, is gone (an empty batch shares its first id
    /// with the next batch and was never registered: only `me`'s entry goes).
    fn forget(&mut self, first: u32, me: *const StubBatch) {
        if self
            .batches
            .get(&first)
            .is_some_and(|(_, batch)| std::ptr::eq(batch.as_ptr(), me))
        {
            self.batches.remove(&first);
        }
    }
}

pub(super) fn registry() -> &'static RwLock<Registry> {
    static REGISTRY: OnceLock<RwLock<Registry>> = OnceLock::new();
    REGISTRY.get_or_init(|| {
        lazy_entry::set_lazy_resolver(resolve);
        RwLock::new(Registry::default())
    })
}

pub(super) static NEXT_ID: AtomicU32 = AtomicU32::new(1);

/// Stub ids linked but not registered yet, as `[first, end)` ranges: a call in that window
/// waits for the registration instead of finding no function.
pub(super) static PENDING: parking_lot::Mutex<Vec<(u32, u32)>> =
    parking_lot::Mutex::new(Vec::new());
static REGISTERED: Condvar = Condvar::new();

/// Takes a range of ids out of [`PENDING`] when dropped (registered, or given up).
pub(super) struct PendingIds(pub(super) u32, pub(super) u32);

impl Drop for PendingIds {
    fn drop(&mut self) {
        let mut pending = PENDING.lock();
        pending.retain(|&r| r != (self.0, self.1));
        REGISTERED.notify_all();
    }
}

/// The resolver the assembly entry calls: the body's address, compiled on first call.
fn resolve(id: u64) -> u64 {
    match function_of(id) {
        Some(function) => function.resolve(),
        None => lazy_entry::lazy_call_failed_address(),
    }
}

/// The lazy function of stub `id`, if it lives (waiting while its stubs are being
/// registered).
fn function_of(id: u64) -> Option<FunctionRef> {
    let id = u32::try_from(id).ok()?;
    let find = || registry().read().get(id);
    if let Some(f) = find() {
        return Some(f);
    }
    let mut pending = PENDING.lock();
    while pending
        .iter()
        .any(|&(first, end)| (first..end).contains(&id))
    {
        REGISTERED.wait(&mut pending);
    }
    drop(pending);
    find()
}

/// Answers an executor's requests of the controller for a session's stubs.
pub(super) fn serve_executor_request(
    executor: usize,
    request: &kiln_remote::protocol::Request,
) -> kiln_remote::protocol::Response {
    use kiln_remote::protocol::{Request, Response};
    match request {
        Request::ResolveStub { stub } => match function_of(*stub) {
            // Only stubs whose code this executor runs: an id is no capability to
            // another executor's.
            Some(f) if f.batch.executor == Some(executor) => f.resolve_for_executor(),
            _ => Response::Error(format!("no call-through stub {stub} for this executor")),
        },
        other => Response::Error(format!("the controller does not serve '{other}'")),
    }
}

impl FunctionRef {
    pub(super) fn function(&self) -> &LazyFunction {
        &self.batch.functions[self.index as usize]
    }

    fn name(&self) -> &kiln_link::Name {
        &self.function().name
    }

    pub(super) fn slot(&self) -> u64 {
        self.batch.slot(self.index as usize)
    }

    fn resolve(&self) -> u64 {
        let me = std::thread::current().id();
        let mut body = self.function().body.lock();
        loop {
            match &*body {
                Body::Ready { address, .. } => return *address,
                Body::Failed { fallback } => return *fallback,
                Body::Compiling(thread) if *thread == me => {
                    // The compiler called the function it is compiling.
                    drop(body);
                    let error = Error::LazyCompile {
                        function: self.name().to_string(),
                        source: "called while it is being compiled, on the compiling thread".into(),
                    };
                    self.record(&error);
                    return std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        self.fallback(&error)
                    }))
                    .unwrap_or(self.batch.default_fallback);
                }
                Body::Compiling(_) => self.function().ready.wait(&mut body),
                Body::Unresolved => break,
            }
        }
        *body = Body::Compiling(me);
        drop(body);
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.build()))
            .unwrap_or_else(|_| {
                Err(Error::LazyCompile {
                    function: self.name().to_string(),
                    source: "the compiler panicked".into(),
                })
            });
        let mut body = self.function().body.lock();
        let result = match outcome {
            // Replaced while it compiled: the replacement stands.
            _ if !matches!(&*body, Body::Compiling(t) if *t == me) => self.current(&body),
            Ok((address, module)) => {
                if self.batch.executor.is_none() {
                    // SAFETY: `slot` is this function's stub slot, in the stub module that
                    // the library holds (and `module`, which uses it, keeps alive); only
                    // atomic stores and the stub's loads touch it.
                    unsafe { lazy_entry::store_code_pointer(self.slot(), address) };
                }
                *body = Body::Ready { address, module };
                address
            }
            Err(error) => {
                // The client's hook runs with no lock held (it may call into the
                // session); a panic in it gives Kiln's fallback.
                drop(body);
                self.record(&error);
                let fallback = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    self.fallback(&error)
                }))
                .unwrap_or(self.batch.default_fallback);
                body = self.function().body.lock();
                if matches!(&*body, Body::Compiling(t) if *t == me) {
                    *body = Body::Failed { fallback };
                    fallback
                } else {
                    self.current(&body)
                }
            }
        };
        self.function().ready.notify_all();
        result
    }

    /// Where a call goes now that another thread decided the body (a replacement).
    fn current(&self, body: &Body) -> u64 {
        match body {
            Body::Ready { address, .. } => *address,
            Body::Failed { fallback } => *fallback,
            _ => self.batch.default_fallback,
        }
    }

    /// Compiles and links the body: its address and module.
    fn build(&self) -> Result<(u64, Module), Error> {
        let inner = self
            .batch
            .session
            .upgrade()
            .ok_or_else(|| Error::LazyCompile {
                function: self.name().to_string(),
                source: "its session is gone".into(),
            })?;
        let jit = Jit::from_inner(inner);
        let object =
            self.batch
                .compiler
                .compile(self.name())
                .map_err(|source| Error::LazyCompile {
                    function: self.name().to_string(),
                    source,
                })?;
        jit.link_body(self.batch.library, self.name(), object)
    }

    fn fallback(&self, error: &Error) -> u64 {
        self.batch
            .compiler
            .compile_failed(self.name(), error)
            .unwrap_or(self.batch.default_fallback)
    }

    /// The answer to an executor's [`kiln_remote::protocol::Request::ResolveStub`]: where
    /// the call goes, and the slot to store it in once there is a body.
    fn resolve_for_executor(&self) -> kiln_remote::protocol::Response {
        let target = self.resolve();
        let slot = match &*self.function().body.lock() {
            Body::Ready { address, .. } if *address == target => self.slot(),
            _ => 0,
        };
        kiln_remote::protocol::Response::StubResolved { target, slot }
    }

    fn record(&self, error: &Error) {
        tracing::warn!(function = %self.name(), %error, "lazy compile failed");
        if let Some(inner) = self.batch.session.upgrade() {
            let lazy = inner.extensions.get::<LazyFunctions>();
            let mut failures = lazy.failures.lock();
            if failures.len() < 1024 {
                failures.push(LazyFailure {
                    function: self.name().to_string(),
                    error: error.to_string(),
                });
            }
        }
    }
}
