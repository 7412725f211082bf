//! Call-through stubs: functions compiled on first call, and replaced while they run.
//!
//! [`crate::Jit::add_lazy_functions`] gives each name a stub at once: 32 bytes of code (each part reached by an indirect branch starts with `endbr64`),
//! `jmp *slot(%rip)`, and an 8-byte pointer slot in writable data. The stub is what the
//! name resolves to, for lookups and for every link, so callers never need relinking.
//! The slot first points back into the stub's own `push $id; jmp common` sequence, which
//! enters Kiln on the calling thread (`kiln_executor::lazy_entry`): the first call asks the
//! [`LazyCompiler`] for an object defining the function, links it (resolving its names as
//! the stub's library would; the body is announced to plugins, so gdb and perf see it),
//! stores the body's address in the slot and continues into the body with the caller's
//! arguments. From then on a call costs one indirect jump. Code is never writable: only the
//! slot changes.
//!
//! Concurrent first calls compile once; the others wait for that compile. A compile that
//! fails (or panics) sends the call to [`LazyCompiler::compile_failed`]'s fallback, and is
//! kept for [`crate::Jit::lazy_failures`].
//!
//! # Replacing a function, and when its old body is freed
//!
//! [`crate::Jit::replace_function`] links a new body and stores its address in the slot:
//! every call that loads the slot after that reaches the new body. The old body may still be
//! running on other threads (or be on their stacks, to be returned into), so it is
//! *retired*, not freed, with an epoch scheme (`crossbeam-epoch`, one collector per
//! session):
//!
//! - **The rule**: a thread calls code of a session that replaces functions only while it
//!   holds a [`CodeGuard`] of that session ([`CodeThread::pin`]). A retired body is freed
//!   once every guard that was held when it was retired has been dropped.
//! - Pinning is cheap (a thread-local store and fence), so pin around a call, or around a
//!   batch of calls; a thread that holds a guard for long only delays frees.
//! - Freed bodies are filled with trap instructions: a call that broke the rule traps
//!   rather than running stale code.
//!
//! When the session is dropped, its bodies are freed with it (drop it only when no thread
//! runs its code, as for modules); a stub still held then leads back into Kiln, which
//! finds no function and returns 0.

use crate::jit::Jit;
use crate::library::LibraryId;
use crate::link_job::LinkRequest;
use crate::module::Module;
use crate::Error;
use kiln_executor::lazy_entry;
use kiln_link::ObjectInput;
use parking_lot::{Condvar, Mutex, RwLock};
use rustc_hash::FxHashMap;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::thread::ThreadId;
use stub_object::{slots_symbol, stub_object, Names, STUB_ENTRY, STUB_SIZE};

/// The name of a module of call-through stubs.
const STUBS_NAME: &str = "(call-through stubs)";

/// Compiles the functions of call-through stubs, on their first call.
///
/// Called on the thread that made the call, with no session lock held (it may call into
/// the session, but must not call the function it is compiling).
pub trait LazyCompiler: Send + Sync {
    /// An ELF relocatable object for the session's architecture that defines `name` (a
    /// global function); its other names resolve as the stub's library resolves them
    /// (other lazy functions through their stubs).
    fn compile(&self, name: &str) -> Result<Vec<u8>, CompileError>;

    /// Where calls to `name` go when its compile or link failed: the address of a
    /// function with the same signature (one that returns an error value, say) in the
    /// process that runs the code, or `None` for Kiln's, which returns 0. Called once, when
    /// the compile fails, with no lock held (a panic here gives Kiln's fallback); the calls
    /// go there until the function is replaced, and the failure is kept for
    /// [`crate::Jit::lazy_failures`].
    fn compile_failed(&self, name: &str, error: &Error) -> Option<u64> {
        let _ = (name, error);
        None
    }
}

/// Why a [`LazyCompiler`] could not compile a function: any error (a string converts:
/// `Err("why".into())`), kept as [`Error::LazyCompile`]'s source.
pub type CompileError = Box<dyn std::error::Error + Send + Sync>;

/// A compile or link of a lazy function that failed.
#[derive(Debug, Clone)]
pub struct LazyFailure {
    /// The function.
    pub function: String,
    /// Why.
    pub error: String,
}

/// The state of a lazy function's body.
enum Body {
    /// Not compiled yet: the slot points at the stub's entry into Kiln.
    Unresolved,
    /// Being compiled by this thread (the others wait).
    Compiling(ThreadId),
    /// Linked: the slot points at it.
    Ready { address: u64, module: Module },
    /// The compile failed: calls go to the fallback.
    Failed { fallback: u64 },
}

/// One lazy function: its stub's slot and its body.
pub(crate) struct LazyFunction {
    id: u32,
    name: Arc<str>,
    library: LibraryId,
    session: Weak<crate::jit::Inner>,
    compiler: Arc<dyn LazyCompiler>,
    /// The address of the stub's pointer slot.
    slot: u64,
    /// What the slot held first: the stub's own entry into Kiln.
    entry: u64,
    /// The module of the stubs, held so that the slot's memory lives as long as this
    /// function.
    _stubs: Module,
    /// The executor process the code runs in (its `RemoteExecutor`'s address), if not
    /// this one: only that executor's requests may resolve the stub.
    executor: Option<usize>,
    /// Where a failed call goes when the compiler gives no fallback: a function that
    /// returns 0, in the process that runs the code.
    default_fallback: u64,
    body: Mutex<Body>,
    ready: Condvar,
}

impl Drop for LazyFunction {
    fn drop(&mut self) {
        registry().write().forget(self.id);
        if self.executor.is_none() {
            // Its session is gone: a call through a stub someone still holds goes back
            // into Kiln, finds no function and returns 0, rather than into the body,
            // which is freed next.
            // SAFETY: the slot lies in `self._stubs`, still alive; only atomic stores and
            // the stub's loads touch it.
            unsafe { lazy_entry::store_code_pointer(self.slot, self.entry) };
        }
    }
}

/// Stub ids to functions, for the assembly entry (ids are below 2^31: `push imm32`),
/// by batch: the stubs of one [`Jit::add_lazy_functions`] have consecutive ids, so a
/// batch of any size is registered with one insertion.
#[derive(Default)]
struct Registry {
    /// Batches by their first id.
    batches: std::collections::BTreeMap<u32, Batch>,
}

/// The functions of one batch, in id order, and how many of them live.
struct Batch {
    functions: Box<[Weak<LazyFunction>]>,
    alive: usize,
}

impl Registry {
    fn add(&mut self, first: u32, functions: Box<[Weak<LazyFunction>]>) {
        let alive = functions.len();
        if alive > 0 {
            self.batches.insert(first, Batch { functions, alive });
        }
    }

    fn get(&self, id: u32) -> Option<Arc<LazyFunction>> {
        let (&first, batch) = self.batches.range(..=id).next_back()?;
        batch.functions.get((id - first) as usize)?.upgrade()
    }

    /// A function of a batch is gone; the batch goes with its last function.
    fn forget(&mut self, id: u32) {
        let Some((&first, batch)) = self.batches.range_mut(..=id).next_back() else {
            return;
        };
        if (id - first) as usize >= batch.functions.len() {
            return;
        }
        batch.alive -= 1;
        if batch.alive == 0 {
            self.batches.remove(&first);
        }
    }
}

fn registry() -> &'static RwLock<Registry> {
    static REGISTRY: OnceLock<RwLock<Registry>> = OnceLock::new();
    REGISTRY.get_or_init(|| {
        lazy_entry::set_lazy_resolver(resolve);
        RwLock::new(Registry::default())
    })
}

static NEXT_ID: AtomicU32 = AtomicU32::new(1);

/// Stub ids linked but not registered yet, as `[first, end)` ranges: a call in that window
/// waits for the registration instead of finding no function.
static PENDING: parking_lot::Mutex<Vec<(u32, u32)>> = parking_lot::Mutex::new(Vec::new());
static REGISTERED: Condvar = Condvar::new();

/// Takes a range of ids out of [`PENDING`] when dropped (registered, or given up).
struct PendingIds(u32, u32);

impl Drop for PendingIds {
    fn drop(&mut self) {
        let mut pending = PENDING.lock();
        pending.retain(|&r| r != (self.0, self.1));
        REGISTERED.notify_all();
    }
}

/// A library's lazy functions by name (looked up by `&str`, no allocation).
type ByName = FxHashMap<Arc<str>, Arc<LazyFunction>>;

/// The session's lazy functions and its epoch collector.
#[derive(Default)]
pub(crate) struct LazyFunctions {
    by_name: Mutex<FxHashMap<LibraryId, ByName>>,
    failures: Mutex<Vec<LazyFailure>>,
    collector: crossbeam_epoch::Collector,
    /// Bodies replaced and not freed yet.
    retired: Arc<AtomicUsize>,
}

/// A thread registered to call code of a session whose functions may be replaced.
/// Not `Send`: each thread registers its own.
pub struct CodeThread {
    handle: crossbeam_epoch::LocalHandle,
}

impl CodeThread {
    /// Pins the thread: until the guard is dropped, no body it can reach is freed.
    pub fn pin(&self) -> CodeGuard {
        CodeGuard {
            _guard: self.handle.pin(),
        }
    }
}

/// While it lives, bodies replaced after it was taken are not freed (see the module
/// documentation's rule).
pub struct CodeGuard {
    _guard: crossbeam_epoch::Guard,
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
fn function_of(id: u64) -> Option<Arc<LazyFunction>> {
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
fn serve_executor_request(
    executor: usize,
    request: &kiln_remote::protocol::Request,
) -> kiln_remote::protocol::Response {
    use kiln_remote::protocol::{Request, Response};
    match request {
        Request::ResolveStub { stub } => match function_of(*stub) {
            // Only stubs whose code this executor runs: an id is no capability to
            // another executor's.
            Some(f) if f.executor == Some(executor) => f.resolve_for_executor(),
            _ => Response::Error(format!("no call-through stub {stub} for this executor")),
        },
        other => Response::Error(format!("the controller does not serve '{other}'")),
    }
}

impl LazyFunction {
    fn resolve(&self) -> u64 {
        let me = std::thread::current().id();
        let mut body = self.body.lock();
        loop {
            match &*body {
                Body::Ready { address, .. } => return *address,
                Body::Failed { fallback } => return *fallback,
                Body::Compiling(thread) if *thread == me => {
                    // The compiler called the function it is compiling.
                    drop(body);
                    let error = Error::LazyCompile {
                        function: self.name.to_string(),
                        source: "called while it is being compiled, on the compiling thread".into(),
                    };
                    self.record(&error);
                    return std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        self.fallback(&error)
                    }))
                    .unwrap_or(self.default_fallback);
                }
                Body::Compiling(_) => self.ready.wait(&mut body),
                Body::Unresolved => break,
            }
        }
        *body = Body::Compiling(me);
        drop(body);
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.build()))
            .unwrap_or_else(|_| {
                Err(Error::LazyCompile {
                    function: self.name.to_string(),
                    source: "the compiler panicked".into(),
                })
            });
        let mut body = self.body.lock();
        let result = match outcome {
            // Replaced while it compiled: the replacement stands.
            _ if !matches!(&*body, Body::Compiling(t) if *t == me) => self.current(&body),
            Ok((address, module)) => {
                if self.executor.is_none() {
                    // SAFETY: `slot` is this function's stub slot, in the stub module that
                    // the library holds (and `module`, which uses it, keeps alive); only
                    // atomic stores and the stub's loads touch it.
                    unsafe { lazy_entry::store_code_pointer(self.slot, address) };
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
                .unwrap_or(self.default_fallback);
                body = self.body.lock();
                if matches!(&*body, Body::Compiling(t) if *t == me) {
                    *body = Body::Failed { fallback };
                    fallback
                } else {
                    self.current(&body)
                }
            }
        };
        self.ready.notify_all();
        result
    }

    /// Where a call goes now that another thread decided the body (a replacement).
    fn current(&self, body: &Body) -> u64 {
        match body {
            Body::Ready { address, .. } => *address,
            Body::Failed { fallback } => *fallback,
            _ => self.default_fallback,
        }
    }

    /// Compiles and links the body: its address and module.
    fn build(&self) -> Result<(u64, Module), Error> {
        let inner = self.session.upgrade().ok_or_else(|| Error::LazyCompile {
            function: self.name.to_string(),
            source: "its session is gone".into(),
        })?;
        let jit = Jit::from_inner(inner);
        let object = self
            .compiler
            .compile(&self.name)
            .map_err(|source| Error::LazyCompile {
                function: self.name.to_string(),
                source,
            })?;
        jit.link_body(self.library, &self.name, object)
    }

    fn fallback(&self, error: &Error) -> u64 {
        self.compiler
            .compile_failed(&self.name, error)
            .unwrap_or(self.default_fallback)
    }

    /// The answer to an executor's [`kiln_remote::protocol::Request::ResolveStub`]: where
    /// the call goes, and the slot to store it in once there is a body.
    fn resolve_for_executor(&self) -> kiln_remote::protocol::Response {
        let target = self.resolve();
        let slot = match &*self.body.lock() {
            Body::Ready { address, .. } if *address == target => self.slot,
            _ => 0,
        };
        kiln_remote::protocol::Response::StubResolved { target, slot }
    }

    fn record(&self, error: &Error) {
        tracing::warn!(function = %self.name, %error, "lazy compile failed");
        if let Some(inner) = self.session.upgrade() {
            let lazy = inner.extensions.get::<LazyFunctions>();
            let mut failures = lazy.failures.lock();
            if failures.len() < 1024 {
                failures.push(LazyFailure {
                    function: self.name.to_string(),
                    error: error.to_string(),
                });
            }
        }
    }
}

impl Jit {
    /// The session's lazy functions (made on first use).
    fn lazy_functions(&self) -> Arc<LazyFunctions> {
        self.inner().extensions.get::<LazyFunctions>()
    }
}

impl Jit {
    /// Defines each of `names` in `lib` as a call-through stub whose body `compiler`
    /// compiles on the function's first call (see [`crate::lazy`]'s contract). The names
    /// resolve at once, for lookups and links, to their stubs; the returned module holds
    /// the stubs (one link for all of them).
    ///
    /// For x86-64 executors ([`Error::Unsupported`] on others). In process, the first
    /// call compiles on the calling thread. Out of process, Kiln's executor asks this
    /// controller on the thread that serves the connection (`Executor::call`,
    /// `run_main` without output forwarding, initializers); its other threads get the
    /// fallback (docs/PROTOCOL.md, `ResolveStub`).
    ///
    /// The body must have the signature its callers use (Kiln cannot check it), and
    /// [`LazyCompiler::compile`] must not call the function it compiles. Names are checked
    /// first: an empty name, a name given twice, or one that is already a lazy function
    /// of `lib` is an error and defines nothing.
    ///
    /// ```
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # if !cfg!(target_arch = "x86_64") { return Ok(()); }
    /// use std::sync::Arc;
    /// struct Answer;
    /// impl kiln::LazyCompiler for Answer {
    ///     fn compile(&self, name: &str) -> Result<Vec<u8>, kiln::CompileError> {
    ///         // A real client runs its compiler here (Cranelift, LLVM, cc -c …).
    ///         Ok(kiln::lazy::testing::constant_function(name, 42))
    ///     }
    /// }
    /// let jit = kiln::Jit::new()?;
    /// let lib = jit.main_library();
    /// jit.add_lazy_functions(lib, &["answer"], Arc::new(Answer))?;
    /// // SAFETY: `answer` is `long answer(void)`, in this process.
    /// let answer = unsafe { jit.lookup_fn::<extern "C" fn() -> i64>(lib, "answer")? };
    /// assert_eq!(answer(), 42); // compiled now
    /// # Ok(()) }
    /// ```
    pub fn add_lazy_functions(
        &self,
        lib: LibraryId,
        names: &[&str],
        compiler: Arc<dyn LazyCompiler>,
    ) -> Result<Module, Error> {
        if self.architecture() != kiln_link::Architecture::X86_64 {
            return Err(Error::Unsupported(
                "call-through stubs are written for x86-64 executors only".into(),
            ));
        }
        let remote = self.executor().remote().cloned();
        let (entry, default_fallback) = match &remote {
            None => (
                lazy_entry::lazy_entry_address(),
                lazy_entry::lazy_call_failed_address(),
            ),
            Some(r) => (
                r.hello().runtime_symbol("__kiln_lazy_entry"),
                r.hello()
                    .runtime_symbol("__kiln_lazy_call_failed")
                    .unwrap_or(0),
            ),
        };
        let Some(entry) = entry else {
            return Err(Error::Unsupported(
                "this executor has no entry for call-through stubs (its hello names no __kiln_lazy_entry)".into(),
            ));
        };
        let executor = remote.as_ref().map(|r| Arc::as_ptr(r) as usize);
        if let (Some(r), Some(executor)) = (&remote, executor) {
            // Any session's stubs whose code runs in this executor (sessions may share
            // one), found through the registry.
            r.set_request_handler(Arc::new(move |request| {
                serve_executor_request(executor, request)
            }));
        }
        let mut seen = rustc_hash::FxHashSet::default();
        seen.reserve(names.len());
        {
            let lazy = self.lazy_functions();
            let by_name = lazy.by_name.lock();
            let defined = by_name.get(&lib);
            for &name in names {
                if name.is_empty() || name.contains('\0') {
                    return Err(Error::Unsupported(format!(
                        "{name:?} is not a function name"
                    )));
                }
                if !seen.insert(name) || defined.is_some_and(|d| d.contains_key(name)) {
                    return Err(Error::Redefinition {
                        symbol: name.to_string(),
                        library: self.library_name(lib)?,
                        previous: "a lazy function".into(),
                        new: "add_lazy_functions".into(),
                    });
                }
            }
        }
        let registry = registry();
        // One range of consecutive ids for the batch.
        let count = u32::try_from(names.len()).unwrap_or(u32::MAX);
        let first = NEXT_ID.fetch_add(count, Ordering::Relaxed);
        if u64::from(first) + u64::from(count) >= 1 << 31 {
            return Err(Error::Unsupported(
                "more than 2^31 call-through stubs".into(),
            ));
        }
        let ids: Vec<u32> = (first..first + count).collect();
        PENDING.lock().push((first, first + ids.len() as u32));
        let _pending = PendingIds(first, first + ids.len() as u32);
        // Only plugins (debuggers, profilers) are shown the stubs under their own names:
        // then the stubs are an object, linked; else they are written straight into code
        // memory.
        let told = !self.inner().plugins.snapshot().is_empty();
        let (stubs, placed) = if told {
            self.link_stub_object(lib, names, &ids, entry)?
        } else {
            let shared: Vec<Arc<str>> = names.iter().map(|&name| Arc::from(name)).collect();
            let memory = &*self.inner().memory;
            let placed = stub_memory::place_stubs(memory, &shared, &ids, entry)?;
            let stubs = self.publish_placed(lib, STUBS_NAME, placed.linked)?;
            let at = |i: usize| {
                (
                    placed.stubs + STUB_SIZE * i as u64,
                    placed.slots + 8 * i as u64,
                )
            };
            let placed = shared
                .into_iter()
                .enumerate()
                .map(|(i, name)| (name, at(i).0, at(i).1))
                .collect();
            (stubs, placed)
        };
        let mut functions = Vec::with_capacity(names.len());
        for (&id, (name, stub, slot)) in ids.iter().zip(placed) {
            functions.push(Arc::new(LazyFunction {
                id,
                name,
                library: lib,
                session: Arc::downgrade(self.inner()),
                compiler: compiler.clone(),
                slot,
                entry: stub + STUB_ENTRY,
                _stubs: stubs.clone(),
                executor,
                default_fallback,
                body: Mutex::new(Body::Unresolved),
                ready: Condvar::new(),
            }));
        }
        registry
            .write()
            .add(first, functions.iter().map(Arc::downgrade).collect());
        let lazy = self.lazy_functions();
        let mut by_name = lazy.by_name.lock();
        let defined = by_name.entry(lib).or_default();
        defined.reserve(functions.len());
        for f in functions {
            defined.insert(f.name.clone(), f);
        }
        Ok(stubs)
    }

    /// The stubs as an object (with their `NAME.stub` symbols shown to plugins), linked
    /// into `lib`: the module, and each function's name (shared with the module), stub
    /// and slot.
    #[allow(clippy::type_complexity)]
    fn link_stub_object(
        &self,
        lib: LibraryId,
        names: &[&str],
        ids: &[u32],
        entry: u64,
    ) -> Result<(Module, Vec<(Arc<str>, u64, u64)>), Error> {
        let linked = Names {
            functions: true,
            stubs: true,
        };
        // Lent, not copied: the object of 10,000 stubs is a megabyte.
        let object =
            ObjectInput::shared(STUBS_NAME, Arc::new(stub_object(names, ids, entry, linked)));
        let naming = Names {
            functions: false,
            stubs: true,
        };
        let shown =
            ObjectInput::shared(STUBS_NAME, Arc::new(stub_object(names, ids, entry, naming)));
        let (stubs, _) = self
            .link(
                lib,
                LinkRequest {
                    shown: Some(shown),
                    ..LinkRequest::module().with(object)
                },
            )?
            .ok_or_else(|| Error::Unsupported("the stub object linked nothing".into()))?;
        let slots_name = slots_symbol(ids.first().copied().unwrap_or(0));
        // Each stub's address and its name, shared with the module (no copy); the slots
        // are in the stubs' order, at the hidden `slots` symbol.
        let placed: Option<Vec<(Arc<str>, u64, u64)>> =
            stubs.symbol(&slots_name).and_then(|slots| {
                names
                    .iter()
                    .enumerate()
                    .map(|(i, name)| {
                        let (shared, stub) = stubs.inner.symbol_entry(name)?;
                        Some((shared, stub, slots + 8 * i as u64))
                    })
                    .collect()
            });
        let Some(placed) = placed else {
            // Cannot happen with the object written above; leave nothing behind.
            let _ = self.remove_module(&stubs);
            return Err(Error::SymbolNotFound(slots_name));
        };
        Ok((stubs, placed))
    }

    /// Gives the lazy function `name` of `lib` a new body, linked from `object`, which must
    /// define `name`: calls that load the stub's slot after this returns reach it. The old
    /// body is retired and freed once no [`CodeGuard`] taken before now is held. On an
    /// error the old body stays.
    pub fn replace_function(
        &self,
        lib: LibraryId,
        name: &str,
        object: impl Into<Arc<[u8]>>,
    ) -> Result<u64, Error> {
        let lazy = self.lazy_functions();
        let function = lazy
            .by_name
            .lock()
            .get(&lib)
            .and_then(|d| d.get(name))
            .cloned()
            .ok_or_else(|| Error::NotLazy(name.to_string()))?;
        if function.executor.is_some() {
            return Err(Error::Unsupported(
                "replacing a function whose code runs in another process".into(),
            ));
        }
        let (address, module) = self.link_body(lib, name, object.into().to_vec())?;
        let old = {
            let mut body = function.body.lock();
            // SAFETY: the function's stub slot, in the stub module its library holds; only
            // atomic stores and the stub's loads touch it.
            unsafe { lazy_entry::store_code_pointer(function.slot, address) };
            let old = std::mem::replace(&mut *body, Body::Ready { address, module });
            function.ready.notify_all();
            old
        };
        if let Body::Ready { module, .. } = old {
            let lazy = self.lazy_functions();
            lazy.retired.fetch_add(1, Ordering::SeqCst);
            let retired = lazy.retired.clone();
            let handle = lazy.collector.register();
            let guard = handle.pin();
            guard.defer(move || {
                drop(module);
                retired.fetch_sub(1, Ordering::SeqCst);
            });
            guard.flush();
        }
        Ok(address)
    }

    /// Registers the calling thread to call code whose functions may be replaced; pin it
    /// ([`CodeThread::pin`]) around calls.
    pub fn register_thread(&self) -> CodeThread {
        CodeThread {
            handle: self.lazy_functions().collector.register(),
        }
    }

    /// Frees the retired bodies that no guard can reach any more (replacements do this
    /// too, as they go); returns how many are still retired.
    pub fn reclaim(&self) -> usize {
        let handle = self.lazy_functions().collector.register();
        // Each flush may advance the epoch once (a body is freed two epochs after it was
        // retired) and frees a bounded number of retired batches: flush until nothing
        // more comes free.
        let mut left = self.retired_bodies();
        let mut idle = 0;
        while left > 0 && idle < 4 {
            handle.pin().flush();
            let now = self.retired_bodies();
            idle = if now < left { 0 } else { idle + 1 };
            left = now;
        }
        left
    }

    /// Replaced bodies not freed yet (a guard taken before their replacement is held).
    pub fn retired_bodies(&self) -> usize {
        self.lazy_functions().retired.load(Ordering::SeqCst)
    }

    /// The lazy compiles that failed since the last call, oldest first (at most 1,024).
    pub fn lazy_failures(&self) -> Vec<LazyFailure> {
        let lazy = self.lazy_functions();
        let failures = std::mem::take(&mut *lazy.failures.lock());
        failures
    }

    /// Whether the lazy function `name` of `lib` has a body yet.
    pub fn is_compiled(&self, lib: LibraryId, name: &str) -> Result<bool, Error> {
        Ok(self.body_address(lib, name)?.is_some())
    }

    /// The address of the current body of the lazy function `name` of `lib`, once it has
    /// one (its stub is what [`Jit::lookup`] gives). Valid while the body is current, or
    /// while a [`CodeGuard`] taken before its replacement is held.
    pub fn body_address(&self, lib: LibraryId, name: &str) -> Result<Option<u64>, Error> {
        let lazy = self.lazy_functions();
        let by_name = lazy.by_name.lock();
        let function = by_name
            .get(&lib)
            .and_then(|d| d.get(name))
            .ok_or_else(|| Error::NotLazy(name.to_string()))?;
        let address = match &*function.body.lock() {
            Body::Ready { address, .. } => Some(*address),
            _ => None,
        };
        Ok(address)
    }
}

mod stub_memory;
mod stub_object;
pub mod testing;
