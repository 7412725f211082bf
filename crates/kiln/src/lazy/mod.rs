//! Call-through stubs: functions compiled on first call, and replaced while they run.
//!
//! [`crate::Jit::add_lazy_functions`] gives each name a stub at once: 32 bytes of code
//! that jump through an 8-byte pointer slot in writable data (`jmp *slot(%rip)` on
//! x86-64, `adrp`/`ldr`/`br` on AArch64, `auipc`/`ld`/`jr` on RISC-V; the code of each
//! architecture is [`kiln_link::call_through`]'s). The stub is what the name resolves to,
//! for lookups and for every link, so callers never need relinking. The slot first points
//! back into the stub's own entry, which puts the stub's id where the executor's lazy
//! entry takes it and enters Kiln on the calling thread (`kiln_runtime::lazy_entry` in
//! this process; an executor process's own, executor-c's included): the first call asks
//! the [`LazyCompiler`] for an object defining the function, links it (resolving its
//! names as the stub's library would; the body is announced to plugins, so gdb and perf
//! see it), stores the body's address in the slot and continues into the body with the
//! caller's arguments. From then on a call costs one indirect jump. Code is never
//! writable: only the slot changes.
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
//! - **Out of process** the session's guards cannot cover the executor's threads: the
//!   executor guards them itself (each request that runs code holds a guard there from
//!   its code's start to its return; `kiln_runtime::code_guards`), answers a slot's
//!   store with the epoch it retired the old body at, and tells the session its oldest
//!   guard ([`crate::executor::Retirement::ExecutorEpoch`]); the body is freed once that guard is
//!   later (at the next replacement or [`crate::Jit::reclaim`]).
//!
//! When the session is dropped, its bodies are freed with it (drop it only when no thread
//! runs its code, as for modules); a stub still held then leads back into Kiln, which
//! finds no function and returns 0.

use crate::jit::Jit;
use crate::library::LibraryId;
use crate::link_job::publish_placed;
use crate::link_request::LinkRequest;
use crate::module::Module;
use crate::Error;
use function::{
    registry, serve_executor_request, Body, FunctionRef, LazyFunction, PendingIds, StubBatch,
    NEXT_ID, PENDING,
};
use kiln_link::call_through::{slots_symbol, StubNames, STUB_SIZE};
use kiln_link::ObjectInput;
use kiln_runtime::lazy_entry;
use parking_lot::{Condvar, Mutex};
use rustc_hash::FxHashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

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

/// The session's lazy functions and its epoch collector.
#[derive(Default)]
pub(crate) struct LazyFunctions {
    /// The batches of stubs, by the id of their module. A lazy function is found by name
    /// through its library's index (its stub is the name's definition): no second map of
    /// names.
    batches: Mutex<FxHashMap<u64, Arc<StubBatch>>>,
    failures: Mutex<Vec<LazyFailure>>,
    collector: crossbeam_epoch::Collector,
    /// Bodies replaced and not freed yet.
    retired: Arc<AtomicUsize>,
    /// Bodies replaced in an executor that guards its own threads, with the executor's
    /// epoch they were retired at ([`crate::executor::Retirement::ExecutorEpoch`]).
    retired_in_executor: Mutex<Vec<(u64, Module)>>,
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
    /// For any executor that has an entry for stubs: this process on x86-64, Kiln's
    /// executor, and executor-c on x86-64, AArch64 and RISC-V ([`Error::Unsupported`]
    /// for one whose hello names no `__kiln_lazy_entry`). In process, the first call
    /// compiles on the calling thread. Out of process, any executor thread whose call
    /// reaches a stub while a request's code runs there (`Executor::call`, `run_main`,
    /// initializers, and the threads they start) has the executor ask this controller,
    /// which compiles and links the body into the executor while the call waits
    /// (docs/PROTOCOL.md, `ResolveStub`).
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
    /// impl kiln::lazy::LazyCompiler for Answer {
    ///     fn compile(&self, name: &str) -> Result<Vec<u8>, kiln::lazy::CompileError> {
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
        let Some((entry, default_fallback)) = self.executor().stub_entries() else {
            return Err(Error::Unsupported(
                "this executor has no entry for call-through stubs (its hello names no __kiln_lazy_entry)".into(),
            ));
        };
        let executor = self.executor().identity();
        if let Some(executor) = executor {
            // Any session's stubs whose code runs in this executor (sessions may share
            // one), found through the registry.
            self.executor().serve_requests(Arc::new(move |request| {
                serve_executor_request(executor, request)
            }));
        }
        // The names in order: duplicates are neighbours (no set of 10,000 names built),
        // and a module's symbols are kept in this order.
        let order = stub_memory::name_order(names);
        // A name the library defines already is refused when the stubs are published.
        let mut previous: Option<&str> = None;
        for &i in &order {
            let name = names[i as usize];
            if name.is_empty() || name.contains('\0') {
                return Err(Error::Unsupported(format!(
                    "{name:?} is not a function name"
                )));
            }
            if previous == Some(name) {
                return Err(Error::Redefinition {
                    symbol: name.to_string(),
                    library: self.library_name(lib)?,
                    previous: "a lazy function".into(),
                    new: "add_lazy_functions".into(),
                });
            }
            previous = Some(name);
        }
        // One range of consecutive ids for the batch.
        let count = u32::try_from(names.len()).unwrap_or(u32::MAX);
        // A stub's entry branches to the batch's common tail: AArch64's `B` reaches
        // 128 MiB, 4 Mi stubs; a batch stays well inside every architecture's reach.
        if count > 1 << 21 {
            return Err(Error::Unsupported(format!(
                "{count} call-through stubs in one batch: at most {} (call add_lazy_functions again for more)",
                1 << 21
            )));
        }
        let first = NEXT_ID.fetch_add(count, Ordering::Relaxed);
        if u64::from(first) + u64::from(count) >= 1 << 31 {
            return Err(Error::Unsupported(
                "more than 2^31 call-through stubs".into(),
            ));
        }
        let ids = first..first + count;
        PENDING.lock().push((first, ids.end));
        let _pending = PendingIds(first, ids.end);
        // The resolver is installed before any stub can be called.
        let registry = registry();
        // The stubs are an object, linked, when plugins (debuggers, profilers) are to be
        // shown them under their own names, or when objects are pending in the library
        // (linked with the stubs, their definitions checked against the stubs' names);
        // else they are written straight into code memory.
        let pending = !self.library_data(lib)?.state.read().pending.is_empty();
        let as_object = pending || !self.inner().plugins.snapshot().is_empty();
        let function = |name: kiln_link::Name| LazyFunction {
            name,
            body: Mutex::new(Body::Unresolved),
            ready: Condvar::new(),
        };
        let (module, functions, stubs, slots): (_, Box<[LazyFunction]>, _, _) = if as_object {
            let (module, shared, stubs, slots) = self.link_stub_object(lib, names, ids, entry)?;
            (
                module,
                shared.into_iter().map(function).collect(),
                stubs,
                slots,
            )
        } else {
            let memory = &*self.inner().memory;
            let architecture = self.architecture();
            let placed = stub_memory::place_stubs(memory, architecture, names, &order, ids, entry)?;
            // Each function's name shared with the stubs' table (one block of names for
            // the batch): the table holds them in name order, its entry `j` the stub of
            // function `order[j]`.
            let table = &placed.linked.exports;
            let mut in_table = vec![0u32; names.len()];
            for (j, &i) in order.iter().enumerate() {
                in_table[i as usize] = j as u32;
            }
            let functions: Box<[LazyFunction]> = names
                .iter()
                .zip(&in_table)
                .map(|(&name, &j)| {
                    function(table.shared_name(j as usize).unwrap_or_else(|| name.into()))
                })
                .collect();
            let module = publish_placed(self, lib, STUBS_NAME, placed.linked)?;
            (module, functions, placed.stubs, placed.slots)
        };
        let batch = Arc::new(StubBatch {
            first,
            library: lib,
            session: Arc::downgrade(self.inner()),
            compiler,
            stubs,
            slots,
            _module: module.clone(),
            executor,
            default_fallback,
            functions,
        });
        registry.write().add(&batch);
        let lazy = self.lazy_functions();
        lazy.batches.lock().insert(module.inner.id, batch);
        Ok(module)
    }

    /// The lazy function `name` of `lib`: the name's definition in the library's index is
    /// its stub, in the module of its batch.
    fn lazy_function(&self, lib: LibraryId, name: &str) -> Result<FunctionRef, Error> {
        let not_lazy = || Error::NotLazy(name.to_string());
        let library = self.library_data(lib)?;
        let definition = library.state.read().exported(name);
        let definition = definition.ok_or_else(not_lazy)?;
        let module = definition.module_id().ok_or_else(not_lazy)?;
        let batch = self.lazy_functions().batches.lock().get(&module).cloned();
        let batch = batch.ok_or_else(not_lazy)?;
        let offset = definition
            .address
            .checked_sub(batch.stubs)
            .ok_or_else(not_lazy)?;
        let index = offset / STUB_SIZE;
        let found = batch
            .functions
            .get(index as usize)
            .is_some_and(|f| offset % STUB_SIZE == 0 && &*f.name == name);
        if !found {
            return Err(not_lazy());
        }
        Ok(FunctionRef {
            batch,
            index: index as u32,
        })
    }

    /// The stubs as an object (with their `NAME.stub` symbols shown to plugins), linked
    /// into `lib`: the module, the functions' names (shared with the module), and where
    /// the first stub and the first slot are (the others follow them, the object's
    /// `.text` and `.data` each placed whole).
    #[allow(clippy::type_complexity)]
    fn link_stub_object(
        &self,
        lib: LibraryId,
        names: &[&str],
        ids: std::ops::Range<u32>,
        entry: u64,
    ) -> Result<(Module, Vec<kiln_link::Name>, u64, u64), Error> {
        let stub_code = self.architecture().call_through();
        let linked = StubNames {
            functions: true,
            stubs: true,
        };
        // Lent, not copied: the object of 10,000 stubs is a megabyte.
        let object = stub_code.object(names, ids.clone(), entry, linked);
        let object = ObjectInput::shared(STUBS_NAME, Arc::new(object));
        let naming = StubNames {
            functions: false,
            stubs: true,
        };
        let shown = stub_code.object(names, ids.clone(), entry, naming);
        let shown = ObjectInput::shared(STUBS_NAME, Arc::new(shown));
        let (module, _) = self
            .link(
                lib,
                LinkRequest {
                    shown: Some(shown),
                    ..LinkRequest::module().with(object)
                },
            )?
            .ok_or_else(|| Error::Unsupported("the stub object linked nothing".into()))?;
        let slots_name = slots_symbol(ids.start);
        // Each function's name, shared with the module (no copy), where the object put
        // its stub.
        let placed = module.symbol(&slots_name).and_then(|slots| {
            let shared = names
                .iter()
                .enumerate()
                .map(|(i, name)| {
                    let (shared, stub) = module.inner.symbol_entry(name)?;
                    Some((shared, stub.checked_sub(STUB_SIZE * i as u64)?))
                })
                .collect::<Option<Vec<_>>>()?;
            // One `.text`, placed whole: stub `i` is `STUB_SIZE * i` after the first.
            let first = shared.first().map_or(0, |(_, first)| *first);
            if shared.iter().any(|(_, f)| *f != first) {
                return None;
            }
            Some((
                slots,
                first,
                shared.into_iter().map(|(name, _)| name).collect(),
            ))
        });
        let Some((slots, first, shared)) = placed else {
            // Cannot happen with the object written above; leave nothing behind.
            let _ = self.remove_module(&module);
            return Err(Error::SymbolNotFound(slots_name));
        };
        Ok((module, shared, first, slots))
    }

    /// Gives the lazy function `name` of `lib` a new body, linked from `object`, which must
    /// define `name`: calls that load the stub's slot after this returns reach it. The old
    /// body is retired and freed once no [`CodeGuard`] taken before now is held; out of
    /// process, once no request that was running code in the executor when the slot was
    /// stored is still running it (the executor guards its own threads: see
    /// [`crate::executor::Retirement`]). On an error the old body stays.
    pub fn replace_function(
        &self,
        lib: LibraryId,
        name: &str,
        object: impl Into<Arc<[u8]>>,
    ) -> Result<u64, Error> {
        let function = self.lazy_function(lib, name)?;
        let (address, module) = self.link_body(lib, name, object.into().to_vec())?;
        self.set_body(&function, address, Body::Ready { address, module })
    }

    /// Makes `address`, a function in `owner` (a module linked before, private or not),
    /// the body of the lazy function `name` of `lib`: calls that load its slot after this
    /// returns reach it, and the old body (if any) is retired as
    /// [`Jit::replace_function`] retires it. `owner` is kept while the body is current.
    /// For a front end that links bodies itself (`kiln-cranelift` links a batch of them at
    /// once, then points each stub at its body).
    pub fn set_function_body(
        &self,
        lib: LibraryId,
        name: &str,
        address: u64,
        owner: &Module,
    ) -> Result<u64, Error> {
        let function = self.lazy_function(lib, name)?;
        self.set_body(
            &function,
            address,
            Body::Ready {
                address,
                module: owner.clone(),
            },
        )
    }

    /// Takes the lazy function `name` of `lib` out of service: its slot is pointed at
    /// `stale_calls_to` (the address of a function that traps, say: a stale call then
    /// traps instead of running freed code), and its body is retired as a replaced one is
    /// (freed once no [`CodeGuard`] taken before now is held). Its stub stays, published
    /// under the name (replace it again to bring it back).
    pub fn retire_function(
        &self,
        lib: LibraryId,
        name: &str,
        stale_calls_to: u64,
    ) -> Result<(), Error> {
        let function = self.lazy_function(lib, name)?;
        self.set_body(
            &function,
            stale_calls_to,
            Body::Failed {
                fallback: stale_calls_to,
            },
        )
        .map(|_| ())
    }

    /// Makes `new` the body of `function` (its slot at `address`), retiring the old body.
    fn set_body(&self, function: &FunctionRef, address: u64, new: Body) -> Result<u64, Error> {
        let remote = function.batch.executor.is_some();
        let old = {
            let mut body = function.function().body.lock();
            if !remote {
                // SAFETY: the function's stub slot, in the stub module its library holds;
                // only atomic stores and the stub's loads touch it.
                unsafe { lazy_entry::store_code_pointer(function.slot(), address) };
            }
            let old = std::mem::replace(&mut *body, new);
            function.function().ready.notify_all();
            old
        };
        // After the body is recorded and with no lock held: a first call that the executor
        // resolves meanwhile (through a thread waiting on this connection) gets the new
        // body too, and takes the body's lock without waiting on us.
        let stored = if remote {
            // SAFETY: the stub slot and the body just linked, both in the executor, which
            // checks they lie in its memory before its one atomic store.
            unsafe {
                self.inner()
                    .executor
                    .store_code_pointer(function.slot(), address)
            }
        } else {
            Ok(crate::executor::Retirement::SessionGuards)
        };
        if let Body::Ready { module, .. } = old {
            let lazy = self.lazy_functions();
            lazy.retired.fetch_add(1, Ordering::SeqCst);
            match stored {
                Ok(crate::executor::Retirement::SessionGuards) => {
                    let retired = lazy.retired.clone();
                    let handle = lazy.collector.register();
                    let guard = handle.pin();
                    guard.defer(move || {
                        drop(module);
                        retired.fetch_sub(1, Ordering::SeqCst);
                    });
                    guard.flush();
                }
                Ok(crate::executor::Retirement::ExecutorEpoch(epoch)) => {
                    lazy.retired_in_executor.lock().push((epoch, module));
                    self.reclaim_in_executor(&lazy);
                }
                // The slot may still lead to the old body (the store's answer was lost):
                // it is kept until the session ends.
                Err(_) => lazy.retired_in_executor.lock().push((u64::MAX, module)),
            }
        }
        // A failed store leaves the slot on the old body, which is kept above.
        stored.map(|_| address)
    }

    /// Frees the bodies retired in an executor that no guard of its threads can reach
    /// (one round trip, when there are some).
    fn reclaim_in_executor(&self, lazy: &LazyFunctions) {
        if lazy.retired_in_executor.lock().is_empty() {
            return;
        }
        let Ok(oldest) = self.inner().executor.oldest_code_guard() else {
            return;
        };
        let freed: Vec<Module> = {
            let mut retired = lazy.retired_in_executor.lock();
            let (free, keep) = std::mem::take(&mut *retired)
                .into_iter()
                .partition(|&(epoch, _)| epoch < oldest);
            *retired = keep;
            free.into_iter().map(|(_, module)| module).collect()
        };
        // With no lock held: freeing a module makes requests of the executor.
        for module in freed {
            drop(module);
            lazy.retired.fetch_sub(1, Ordering::SeqCst);
        }
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
        self.reclaim_in_executor(&self.lazy_functions());
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

    /// The current bodies of `lib`'s lazy functions (each body's module once), oldest
    /// first: what [`Library::modules`](crate::Library::modules) lists beside the library's modules.
    pub(crate) fn lazy_bodies(&self, lib: LibraryId) -> Vec<Module> {
        let batches: Vec<Arc<StubBatch>> = self
            .lazy_functions()
            .batches
            .lock()
            .values()
            .filter(|b| b.library == lib)
            .cloned()
            .collect();
        let mut bodies: Vec<Module> = Vec::new();
        for batch in batches {
            for function in batch.functions.iter() {
                if let Body::Ready { module, .. } = &*function.body.lock() {
                    if !bodies.iter().any(|m| m.same(module)) {
                        bodies.push(module.clone());
                    }
                }
            }
        }
        bodies.sort_by_key(|m| m.inner.id);
        bodies
    }

    /// If `module` holds call-through stubs: its functions' current bodies' modules (by
    /// identity); else none.
    pub(crate) fn stub_bodies(&self, module: &Module) -> Vec<*const crate::module::ModuleInner> {
        let batch = self
            .lazy_functions()
            .batches
            .lock()
            .get(&module.inner.id)
            .cloned();
        let Some(batch) = batch else {
            return Vec::new();
        };
        batch
            .functions
            .iter()
            .filter_map(|f| match &*f.body.lock() {
                Body::Ready { module, .. } => Some(Arc::as_ptr(&module.inner)),
                _ => None,
            })
            .collect()
    }

    /// If `module` holds call-through stubs: retires every body of its functions (their
    /// slots lead to the batch's fallback), frees what no code guard can reach, and forgets
    /// the batch; a removal of the stubs then finds only the bodies still running (or on
    /// a guarded thread's stack) among their users.
    pub(crate) fn retire_stub_bodies(&self, module: &Module) -> Result<(), Error> {
        let Some(batch) = self
            .lazy_functions()
            .batches
            .lock()
            .get(&module.inner.id)
            .cloned()
        else {
            return Ok(());
        };
        for index in 0..batch.functions.len() {
            let function = FunctionRef {
                batch: batch.clone(),
                index: index as u32,
            };
            if matches!(&*function.function().body.lock(), Body::Ready { .. }) {
                let fallback = batch.default_fallback;
                self.set_body(&function, fallback, Body::Failed { fallback })?;
            }
        }
        self.reclaim();
        self.lazy_functions()
            .batches
            .lock()
            .remove(&module.inner.id);
        Ok(())
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
        let function = self.lazy_function(lib, name)?;
        let address = match &*function.function().body.lock() {
            Body::Ready { address, .. } => Some(*address),
            _ => None,
        };
        Ok(address)
    }
}

mod function;
mod stub_memory;
mod swappable;
pub use swappable::SwappableModule;
pub mod testing;
