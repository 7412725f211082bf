//! Call-through stubs: functions compiled on first call, and replaced while they run.
//!
//! [`crate::Jit::add_lazy_functions`] gives each name a stub at once: 16 bytes of code,
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

use crate::jit::{Jit, LibraryId, Module};
use crate::Error;
use kiln_executor::lazy_entry;
use kiln_link::ObjectInput;
use parking_lot::{Condvar, Mutex, RwLock};
use rustc_hash::FxHashMap;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::thread::ThreadId;

/// Compiles the functions of call-through stubs, on their first call.
///
/// Called on the thread that made the call, with no session lock held (it may call into
/// the session, but must not call the function it is compiling).
pub trait LazyCompiler: Send + Sync {
    /// An ELF relocatable object for the session's architecture that defines `name` (a
    /// global function); its other names resolve as the stub's library resolves them
    /// (other lazy functions through their stubs).
    fn compile(&self, name: &str) -> Result<Vec<u8>, String>;

    /// Where a call to `name` goes when its compile or link failed: the address of a
    /// function with the same signature (one that returns an error value, say), or `None`
    /// for Kiln's, which returns 0. Called for every call until the function is replaced;
    /// the failure is also kept for [`crate::Jit::lazy_failures`].
    fn compile_failed(&self, name: &str, error: &Error) -> Option<u64> {
        let _ = (name, error);
        None
    }
}

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
    body: Mutex<Body>,
    ready: Condvar,
}

impl Drop for LazyFunction {
    fn drop(&mut self) {
        registry().write().remove(&self.id);
    }
}

/// Stub ids to functions, for the assembly entry (ids are below 2^31: `push imm32`).
fn registry() -> &'static RwLock<FxHashMap<u32, Weak<LazyFunction>>> {
    static REGISTRY: OnceLock<RwLock<FxHashMap<u32, Weak<LazyFunction>>>> = OnceLock::new();
    REGISTRY.get_or_init(|| {
        lazy_entry::set_lazy_resolver(resolve);
        RwLock::new(FxHashMap::default())
    })
}

static NEXT_ID: AtomicU32 = AtomicU32::new(1);

/// A lazy function's library and name.
type LazyKey = (LibraryId, Arc<str>);

/// The session's lazy functions and its epoch collector.
#[derive(Default)]
pub(crate) struct LazyFunctions {
    by_name: Mutex<FxHashMap<LazyKey, Arc<LazyFunction>>>,
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
    let function = u32::try_from(id)
        .ok()
        .and_then(|id| registry().read().get(&id).and_then(Weak::upgrade));
    match function {
        Some(function) => function.resolve(),
        None => lazy_entry::lazy_call_failed_address(),
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
                    return self.fail(Error::LazyCompile {
                        function: self.name.to_string(),
                        reason: "called while it is being compiled, on the compiling thread".into(),
                    });
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
                    reason: "the compiler panicked".into(),
                })
            });
        let mut body = self.body.lock();
        let result = match outcome {
            // Replaced while it compiled: the replacement stands.
            Ok(_) if !matches!(&*body, Body::Compiling(t) if *t == me) => match &*body {
                Body::Ready { address, .. } => *address,
                _ => lazy_entry::lazy_call_failed_address(),
            },
            Ok((address, module)) => {
                // SAFETY: `slot` is this function's stub slot, in the stub module that the
                // library holds (and `module`, which uses it, keeps alive); only atomic
                // stores and the stub's loads touch it.
                unsafe { lazy_entry::store_code_pointer(self.slot, address) };
                *body = Body::Ready { address, module };
                address
            }
            Err(error) => {
                let fallback = self.fallback(&error);
                self.record(&error);
                *body = Body::Failed { fallback };
                fallback
            }
        };
        self.ready.notify_all();
        result
    }

    /// Compiles and links the body: its address and module.
    fn build(&self) -> Result<(u64, Module), Error> {
        let inner = self.session.upgrade().ok_or_else(|| Error::LazyCompile {
            function: self.name.to_string(),
            reason: "its session is gone".into(),
        })?;
        let jit = Jit::from_inner(inner);
        let object = self
            .compiler
            .compile(&self.name)
            .map_err(|reason| Error::LazyCompile {
                function: self.name.to_string(),
                reason,
            })?;
        jit.link_body(self.library, &self.name, object)
    }

    fn fallback(&self, error: &Error) -> u64 {
        self.compiler
            .compile_failed(&self.name, error)
            .unwrap_or_else(lazy_entry::lazy_call_failed_address)
    }

    fn record(&self, error: &Error) {
        tracing::warn!(function = %self.name, %error, "lazy compile failed");
        if let Some(inner) = self.session.upgrade() {
            let mut failures = inner.lazy.failures.lock();
            if failures.len() < 1024 {
                failures.push(LazyFailure {
                    function: self.name.to_string(),
                    error: error.to_string(),
                });
            }
        }
    }

    fn fail(&self, error: Error) -> u64 {
        self.record(&error);
        self.fallback(&error)
    }
}

/// The x86-64 stub object for `names`: each stub `jmp *slot(%rip)` (6 bytes) followed by
/// its entry `push $id; jmp common` (10 bytes); `common` is `jmp *entry(%rip)`; `.data`
/// holds the slots, then the entry's address.
///
/// For debuggers (`shown`), the same object without the functions' names: only the local
/// `NAME.stub` symbols, so that `break NAME` finds the body, not the stub.
fn stub_object(names: &[&str], ids: &[u32], entry: u64, shown: bool) -> Result<Vec<u8>, Error> {
    use object::write::{Object, Relocation, StandardSection, Symbol, SymbolSection};
    use object::{elf, RelocationFlags, SymbolFlags, SymbolKind, SymbolScope};
    let mut obj = Object::new(
        object::BinaryFormat::Elf,
        object::Architecture::X86_64,
        object::Endianness::Little,
    );
    let text = obj.section_id(StandardSection::Text);
    let data = obj.section_id(StandardSection::Data);
    let n = names.len();
    let common = 16 * n as i64;
    let mut code = Vec::with_capacity(16 * n + 8);
    for (i, &id) in ids.iter().enumerate() {
        code.extend_from_slice(&[0xff, 0x25, 0, 0, 0, 0]); // jmp *slot(%rip)
        code.push(0x68); // push $id
        code.extend_from_slice(&id.to_le_bytes());
        let next = 16 * (i as i64 + 1);
        code.push(0xe9); // jmp common
        code.extend_from_slice(&((common - next) as i32).to_le_bytes());
    }
    code.extend_from_slice(&[0xff, 0x25, 0, 0, 0, 0, 0xcc, 0xcc]); // jmp *entry(%rip)
    let text_offset = obj.append_section_data(text, &code, 16);
    let mut slots = vec![0u8; 8 * (n + 1)];
    slots[8 * n..].copy_from_slice(&entry.to_le_bytes());
    let data_offset = obj.append_section_data(data, &slots, 8);
    obj.add_symbol(Symbol {
        name: slots_symbol(ids.first().copied().unwrap_or(0)).into_bytes(),
        value: data_offset,
        size: 8 * n as u64,
        kind: SymbolKind::Data,
        scope: SymbolScope::Linkage, // hidden: the module's, not the library's
        weak: false,
        section: SymbolSection::Section(data),
        flags: SymbolFlags::None,
    });
    let text_symbol = obj.section_symbol(text);
    let data_symbol = obj.section_symbol(data);
    let reloc = |r_type| RelocationFlags::Elf { r_type };
    for (i, name) in names.iter().enumerate() {
        let stub = text_offset + 16 * i as u64;
        let slot = data_offset + 8 * i as u64;
        // The name resolves to the stub, but has no size: profilers and debuggers name
        // the stub's 16 bytes `NAME.stub`, and the body `NAME`.
        if !shown {
            obj.add_symbol(Symbol {
                name: name.as_bytes().to_vec(),
                value: stub,
                size: 0,
                kind: SymbolKind::Text,
                scope: SymbolScope::Dynamic,
                weak: false,
                section: SymbolSection::Section(text),
                flags: SymbolFlags::None,
            });
        }
        obj.add_symbol(Symbol {
            name: format!("{name}.stub").into_bytes(),
            value: stub,
            size: 16,
            kind: SymbolKind::Text,
            scope: SymbolScope::Compilation,
            weak: false,
            section: SymbolSection::Section(text),
            flags: SymbolFlags::None,
        });
        obj.add_relocation(
            text,
            Relocation {
                offset: stub + 2,
                symbol: data_symbol,
                addend: slot as i64 - 4,
                flags: reloc(elf::R_X86_64_PC32),
            },
        )
        .map_err(stub_error)?;
        obj.add_relocation(
            data,
            Relocation {
                offset: slot,
                symbol: text_symbol,
                addend: stub as i64 + 6,
                flags: reloc(elf::R_X86_64_64),
            },
        )
        .map_err(stub_error)?;
    }
    obj.add_relocation(
        text,
        Relocation {
            offset: text_offset + common as u64 + 2,
            symbol: data_symbol,
            addend: (data_offset + 8 * n as u64) as i64 - 4,
            flags: reloc(elf::R_X86_64_PC32),
        },
    )
    .map_err(stub_error)?;
    obj.write().map_err(stub_error)
}

/// The hidden symbol at the slots of the stubs whose first id is `first`.
fn slots_symbol(first: u32) -> String {
    format!("__kiln_stub_slots.{first}")
}

fn stub_error(error: object::write::Error) -> Error {
    Error::LazyCompile {
        function: "(stubs)".into(),
        reason: format!("writing the stub object: {error}"),
    }
}

impl Jit {
    /// Defines each of `names` in `lib` as a call-through stub whose body `compiler`
    /// compiles on the function's first call (see [`crate::lazy`]'s contract). The names
    /// resolve at once, for lookups and links, to their stubs; the returned module holds
    /// the stubs (one link for all of them).
    ///
    /// In process, on x86-64; an error elsewhere (an executor in another process would
    /// have to call the controller on a stub's first call, which the protocol reserves
    /// ids for but no executor implements yet).
    ///
    /// ```
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # if !cfg!(target_arch = "x86_64") { return Ok(()); }
    /// use std::sync::Arc;
    /// struct Answer;
    /// impl kiln::LazyCompiler for Answer {
    ///     fn compile(&self, name: &str) -> Result<Vec<u8>, String> {
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
        let entry = match (self.executor().remote(), lazy_entry::lazy_entry_address()) {
            (None, Some(entry)) if self.architecture() == kiln_link::Architecture::X86_64 => entry,
            _ => {
                return Err(Error::Unsupported(
                    "call-through stubs need the in-process executor on x86-64".into(),
                ))
            }
        };
        let registry = registry();
        let ids: Vec<u32> = names
            .iter()
            .map(|_| NEXT_ID.fetch_add(1, Ordering::Relaxed))
            .collect();
        if ids.last().is_some_and(|&id| id >= 1 << 31) {
            return Err(Error::Unsupported(
                "more than 2^31 call-through stubs".into(),
            ));
        }
        const NAME: &str = "(call-through stubs)";
        let object = ObjectInput::new(NAME, stub_object(names, &ids, entry, false)?);
        let shown = ObjectInput::new(NAME, stub_object(names, &ids, entry, true)?);
        let (stubs, _) = self
            .link(
                lib,
                Some(object),
                Some(shown),
                &[],
                crate::jit::Publish::Yes,
            )?
            .ok_or_else(|| Error::Unsupported("the stub object linked nothing".into()))?;
        let slots_name = slots_symbol(ids.first().copied().unwrap_or(0));
        let slots = stubs
            .symbol(&slots_name)
            .ok_or_else(|| Error::SymbolNotFound(slots_name.clone()))?;
        let mut functions = Vec::with_capacity(names.len());
        for (&name, &id) in names.iter().zip(&ids) {
            let stub = stubs
                .symbol(name)
                .ok_or_else(|| Error::SymbolNotFound(name.into()))?;
            // The slots are in the stubs' order, after the hidden `slots` symbol.
            let _ = stub;
            let slot = slots + 8 * functions.len() as u64;
            functions.push(Arc::new(LazyFunction {
                id,
                name: name.into(),
                library: lib,
                session: Arc::downgrade(self.inner()),
                compiler: compiler.clone(),
                slot,
                body: Mutex::new(Body::Unresolved),
                ready: Condvar::new(),
            }));
        }
        {
            let mut registry = registry.write();
            for f in &functions {
                registry.insert(f.id, Arc::downgrade(f));
            }
        }
        let mut by_name = self.inner().lazy.by_name.lock();
        for f in functions {
            by_name.insert((lib, f.name.clone()), f);
        }
        Ok(stubs)
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
        let function = self
            .inner()
            .lazy
            .by_name
            .lock()
            .get(&(lib, Arc::from(name)))
            .cloned()
            .ok_or_else(|| Error::NotLazy(name.to_string()))?;
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
            let lazy = &self.inner().lazy;
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
            handle: self.inner().lazy.collector.register(),
        }
    }

    /// Frees the retired bodies that no guard can reach any more (replacements do this
    /// too, as they go); returns how many are still retired.
    pub fn reclaim(&self) -> usize {
        let handle = self.inner().lazy.collector.register();
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
        self.inner().lazy.retired.load(Ordering::SeqCst)
    }

    /// The lazy compiles that failed since the last call, oldest first (at most 1,024).
    pub fn lazy_failures(&self) -> Vec<LazyFailure> {
        std::mem::take(&mut *self.inner().lazy.failures.lock())
    }

    /// Whether the lazy function `name` of `lib` has a body yet.
    pub fn is_compiled(&self, lib: LibraryId, name: &str) -> Result<bool, Error> {
        let by_name = self.inner().lazy.by_name.lock();
        let function = by_name
            .get(&(lib, Arc::from(name)))
            .ok_or_else(|| Error::NotLazy(name.to_string()))?;
        let compiled = matches!(&*function.body.lock(), Body::Ready { .. });
        Ok(compiled)
    }
}

/// Helpers for examples and tests: tiny x86-64 objects without a compiler.
pub mod testing {
    /// An x86-64 ELF object defining `long name(void) { return value; }`.
    pub fn constant_function(name: &str, value: i32) -> Vec<u8> {
        let mut code = vec![0xb8]; // mov $value, %eax (sign-extended below)
        code.extend_from_slice(&value.to_le_bytes());
        code.extend_from_slice(&[0x48, 0x63, 0xc0, 0xc3]); // movslq %eax, %rax; ret
        function_object(name, &code)
    }

    /// An x86-64 ELF object defining `name` as the global function `code`.
    pub fn function_object(name: &str, code: &[u8]) -> Vec<u8> {
        use object::write::{Object, StandardSection, Symbol, SymbolSection};
        use object::{SymbolFlags, SymbolKind, SymbolScope};
        let mut obj = Object::new(
            object::BinaryFormat::Elf,
            object::Architecture::X86_64,
            object::Endianness::Little,
        );
        let text = obj.section_id(StandardSection::Text);
        let offset = obj.append_section_data(text, code, 16);
        obj.add_symbol(Symbol {
            name: name.as_bytes().to_vec(),
            value: offset,
            size: code.len() as u64,
            kind: SymbolKind::Text,
            scope: SymbolScope::Dynamic,
            weak: false,
            section: SymbolSection::Section(text),
            flags: SymbolFlags::None,
        });
        // Writing an object of one section and one symbol cannot fail.
        obj.write().unwrap_or_default()
    }
}
