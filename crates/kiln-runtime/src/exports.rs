//! Definitions of JIT modules made visible to libraries loaded later, as a native
//! executable's `-Wl,-E` makes its own: each module's exports are an `RTLD_GLOBAL` shared
//! object of absolute symbols (see [`crate::shared_object`]), opened with `dlopen`.
//!
//! **On demand.** Building and opening that object costs a program of 20,000 functions
//! about a millisecond and a half at every start, and most programs never load a library.
//! Exports may therefore be *deferred*: kept as a list, and opened — all of them, in the
//! order they were made — the first time JIT code asks the dynamic loader anything that
//! could see them: the session binds the program's `dlopen`, `dlmopen`, `dlsym` and
//! `dlvsym` to the shims below ([`loader_shim`]), which publish what is pending and then
//! call the C library's function. A shared library loaded for the program by the session
//! ([`note_library_loaded`]) publishes them too, and makes later exports immediate: its
//! code reaches the loader without the shims.
//!
//! The shims change nothing else: the C library sees the call come from this executable,
//! as it sees a call from JIT code (which lies in no loaded object), so `RTLD_NEXT` and the
//! caller's namespace resolve as they would.

use crate::loader::{dlopen_bytes, LoadedObject};
use crate::module_symbols::ModuleSymbols;
use crate::shared_object::ExportedSymbol;
use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::ffi::{c_char, c_int, c_long, c_void};
use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Weak;

/// Exported definitions, open or deferred. Withdrawn by [`unexport_symbols`].
#[derive(Debug)]
pub struct Exports {
    serial: u64,
}

enum State {
    /// A module's exported definitions, read from the module when published (a module
    /// gone by then exports nothing): no list is made for a program that never asks.
    DeferredModule {
        module: Weak<dyn ModuleSymbols>,
        code: Range<u64>,
    },
    /// Definitions given as a list (a controller in another process sent them).
    DeferredList(Vec<ExportedSymbol>),
    Open(LoadedObject),
    /// Publishing failed (said once, when it happened).
    Failed,
}

/// Every module's exports, by serial (the order they were made, which is the order the
/// loader searches them), and whether exports are opened when made.
struct Registry {
    states: BTreeMap<u64, State>,
    /// A library new to the process was loaded for the program: exports are opened when
    /// made (read and written under the lock, so a module's export and a library's load
    /// cannot cross).
    immediate: bool,
}

static EXPORTS: Mutex<Registry> = Mutex::new(Registry {
    states: BTreeMap::new(),
    immediate: false,
});
static SERIAL: AtomicU64 = AtomicU64::new(0);
/// Some exports are deferred: the shims' one check without the lock. Cleared only once
/// they are open, so a thread that sees it clear finds them open.
static PENDING: AtomicBool = AtomicBool::new(false);

fn open(serial: u64, symbols: &[ExportedSymbol]) -> Result<LoadedObject, String> {
    let soname = format!("kiln-exports-{}-{serial}.so", std::process::id());
    let object =
        crate::shared_object::build(&soname, crate::shared_object::host_machine(), symbols, None);
    dlopen_bytes(&soname, &object.bytes, true)
}

/// Exports `symbols` to libraries loaded from now on (and to `dlsym(RTLD_DEFAULT, …)`).
pub fn export_symbols(symbols: &[ExportedSymbol]) -> Result<Exports, String> {
    let mut registry = EXPORTS.lock();
    let (result, modules) = open_now(&mut registry, symbols);
    drop(registry);
    drop(modules);
    result
}

/// Opens `symbols` under the lock, after whatever is deferred (the loader searches them
/// in the order they were made); with the modules read, for the caller to let go after
/// the lock.
fn open_now(
    registry: &mut Registry,
    symbols: &[ExportedSymbol],
) -> (Result<Exports, String>, HeldModules) {
    let serial = SERIAL.fetch_add(1, Ordering::Relaxed);
    let (result, modules) = publish_locked(registry);
    if let Err(error) = result {
        tracing::warn!(%error, "deferred exports could not be opened");
    }
    let result = open(serial, symbols).map(|object| {
        registry.states.insert(serial, State::Open(object));
        Exports { serial }
    });
    (result, modules)
}

/// The exports of `module`: its exported definitions, functions where they lie in `code`.
pub fn exports_of(module: &dyn ModuleSymbols, code: &Range<u64>) -> Vec<ExportedSymbol> {
    crate::module_symbols::definitions(module)
        .filter(|&(_, _, exported)| exported)
        .map(|(name, address, _)| ExportedSymbol {
            name: name.into(),
            address,
            size: 0,
            function: code.contains(&address),
        })
        .collect()
}

/// Exports `module`'s exported definitions (functions where they lie in `code`) when JIT
/// code first calls the loader through a shim, or a library is loaded for the program;
/// at once if one was loaded already. The module is read then, not now.
pub fn export_module_on_demand(
    module: Weak<dyn ModuleSymbols>,
    code: Range<u64>,
) -> Result<Exports, String> {
    defer(State::DeferredModule { module, code })
}

/// Exports `symbols` when JIT code first calls the loader through a shim, or a library is
/// loaded for the program; at once if one was loaded already (as
/// [`export_module_on_demand`], for a list: what a controller in another process sends).
pub fn export_symbols_on_demand(symbols: Vec<ExportedSymbol>) -> Result<Exports, String> {
    defer(State::DeferredList(symbols))
}

/// `deferred` (a `DeferredModule` or `DeferredList`) kept until the loader's first use, or
/// opened at once when exports are immediate.
fn defer(deferred: State) -> Result<Exports, String> {
    let mut registry = EXPORTS.lock();
    if registry.immediate {
        let list = match deferred {
            State::DeferredModule { module, code } => module
                .upgrade()
                .map(|m| exports_of(&*m, &code))
                .unwrap_or_default(),
            State::DeferredList(symbols) => symbols,
            State::Open(_) | State::Failed => Vec::new(),
        };
        let (result, modules) = open_now(&mut registry, &list);
        drop(registry);
        drop(modules);
        return result;
    }
    let serial = SERIAL.fetch_add(1, Ordering::Relaxed);
    registry.states.insert(serial, deferred);
    PENDING.store(true, Ordering::Release);
    Ok(Exports { serial })
}

/// Opens every deferred export, oldest first. The first failure is returned; the others
/// are still tried.
pub fn publish_exports() -> Result<(), String> {
    let mut registry = EXPORTS.lock();
    let (result, modules) = publish_locked(&mut registry);
    drop(registry);
    drop(modules);
    result
}

/// A module read while publishing: held until the lock is released.
type HeldModules = Vec<std::sync::Arc<dyn ModuleSymbols>>;

/// Opens every deferred export under the lock; the modules it read, for the caller to let
/// go after the lock (a module's last handle withdraws its exports, which takes the lock).
fn publish_locked(registry: &mut Registry) -> (Result<(), String>, HeldModules) {
    let mut first_error = None;
    let mut held = Vec::new();
    for (&serial, state) in registry.states.iter_mut() {
        let opened = match state {
            State::DeferredModule { module, code } => match module.upgrade() {
                Some(module) => {
                    let opened = open(serial, &exports_of(&*module, code));
                    held.push(module);
                    opened
                }
                // Gone: its removal withdraws this entry; nothing to open.
                None => continue,
            },
            State::DeferredList(symbols) => open(serial, symbols),
            State::Open(_) | State::Failed => continue,
        };
        *state = match opened {
            Ok(object) => State::Open(object),
            Err(e) => {
                first_error.get_or_insert(e);
                State::Failed
            }
        };
    }
    // Cleared once they are open: a shim that sees it clear finds them.
    PENDING.store(false, Ordering::Release);
    (first_error.map_or(Ok(()), Err), held)
}

/// A library new to the process is about to be loaded for the program (`already_loaded`:
/// it is in the process already, a dependency of this executable, whose code never looks
/// for the program's names): deferred exports are opened now, before it, as eager ones
/// would have been, and later ones at once.
pub fn note_library_loaded(already_loaded: bool) -> Result<(), String> {
    if already_loaded {
        return Ok(());
    }
    let mut registry = EXPORTS.lock();
    registry.immediate = true;
    let (result, modules) = publish_locked(&mut registry);
    drop(registry);
    drop(modules);
    result
}

/// What loading a library new to the process asks of deferred exports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LibraryNeed {
    /// Nothing: every library it needs is loaded already, it imports no loader function
    /// (so it never looks a name up itself) and none of the names waiting to be exported
    /// (it is bound at once, `RTLD_NOW`: an export made later could not reach it anyway).
    Nothing,
    /// What waits is published before it: it imports one of those names, which the
    /// program's definition must provide, as a native program's would.
    PublishFirst,
    /// Published before it, and every export from now on at once: it may look names up
    /// itself (it imports `dlsym`, …), it loads libraries not yet in the process, or it
    /// could not be read.
    Always,
}

/// The loader's functions: a library that imports one may look up the program's names
/// without the shims.
const LOADER_FUNCTIONS: [&str; 4] = ["dlopen", "dlmopen", "dlsym", "dlvsym"];

/// What the shared library at `path` (about to be loaded, not yet in the process) asks
/// of the exports waiting in `registry`, read from its dynamic section and symbols.
fn library_need(path: &str, registry: &Registry) -> LibraryNeed {
    use object::read::elf::{ElfFile64, FileHeader};
    use object::{Object, ObjectSymbol};
    let imports = crate::loader::with_mapped_file(path, |data| {
        let file = ElfFile64::<object::Endianness>::parse(data).ok()?;
        let endian = file.endian();
        let table = file
            .elf_header()
            .sections(endian, data)
            .ok()?
            .dynamic_table(endian, data)
            .ok()?;
        for d in table.iter() {
            if d.tag == object::elf::DT_NEEDED {
                let needed = table.string(d).ok()?;
                if !crate::loader::is_loaded(std::str::from_utf8(needed).ok()?) {
                    return None;
                }
            }
        }
        let mut names = rustc_hash::FxHashSet::default();
        for symbol in file.dynamic_symbols() {
            if symbol.is_undefined() {
                names.insert(symbol.name().ok()?.to_string());
            }
        }
        Some(names)
    })
    .flatten();
    let Some(imports) = imports else {
        return LibraryNeed::Always;
    };
    if LOADER_FUNCTIONS.iter().any(|f| imports.contains(*f)) {
        return LibraryNeed::Always;
    }
    let waiting = registry.states.values().any(|state| match state {
        State::DeferredList(symbols) => symbols.iter().any(|s| imports.contains(&*s.name)),
        State::DeferredModule { module, .. } => module.upgrade().is_some_and(|m| {
            crate::module_symbols::definitions(&*m)
                .any(|(name, _, exported)| exported && imports.contains(name))
        }),
        State::Open(_) | State::Failed => false,
    });
    if waiting {
        LibraryNeed::PublishFirst
    } else {
        LibraryNeed::Nothing
    }
}

/// A shared library at `path` is about to be loaded for the program: exports waiting for
/// the loader are published first where it could see them (see [`LibraryNeed`]), and
/// from then on at once where it could look them up itself. A library in the process
/// already asks nothing. Answers what was decided (for the tests and traces).
pub fn note_library_loading(path: &str) -> (LibraryNeed, Result<(), String>) {
    if crate::loader::is_loaded(path) {
        return (LibraryNeed::Nothing, Ok(()));
    }
    let mut registry = EXPORTS.lock();
    if registry.immediate {
        return (LibraryNeed::Always, Ok(()));
    }
    let need = library_need(path, &registry);
    if need == LibraryNeed::Nothing {
        return (need, Ok(()));
    }
    registry.immediate = need == LibraryNeed::Always;
    let (result, modules) = publish_locked(&mut registry);
    drop(registry);
    drop(modules);
    (need, result)
}

/// Withdraws exported definitions (never opened, if they were still deferred).
pub fn unexport_symbols(exports: Exports) {
    let state = EXPORTS.lock().states.remove(&exports.serial);
    if let Some(State::Open(object)) = state {
        object.close();
    }
}

fn publish_pending() {
    if PENDING.load(Ordering::Acquire) {
        if let Err(error) = publish_exports() {
            tracing::warn!(%error, "the program's definitions could not be exported to the library it loads");
        }
    }
}

unsafe extern "C" {
    // Not in the `libc` crate for every target; glibc has both since 2.3.
    fn dlmopen(namespace: c_long, file: *const c_char, mode: c_int) -> *mut c_void;
    fn dlvsym(handle: *mut c_void, symbol: *const c_char, version: *const c_char) -> *mut c_void;
}

/// `dlopen`, for JIT code: deferred exports first.
unsafe extern "C" fn dlopen_shim(file: *const c_char, mode: c_int) -> *mut c_void {
    publish_pending();
    // SAFETY: the caller's arguments, passed on as given.
    unsafe { libc::dlopen(file, mode) }
}

/// `dlmopen`, for JIT code: deferred exports first.
unsafe extern "C" fn dlmopen_shim(
    namespace: c_long,
    file: *const c_char,
    mode: c_int,
) -> *mut c_void {
    publish_pending();
    // SAFETY: the caller's arguments, passed on as given.
    unsafe { dlmopen(namespace, file, mode) }
}

/// `dlsym`, for JIT code: deferred exports first.
unsafe extern "C" fn dlsym_shim(handle: *mut c_void, symbol: *const c_char) -> *mut c_void {
    publish_pending();
    // SAFETY: the caller's arguments, passed on as given.
    unsafe { libc::dlsym(handle, symbol) }
}

/// `dlvsym`, for JIT code: deferred exports first.
unsafe extern "C" fn dlvsym_shim(
    handle: *mut c_void,
    symbol: *const c_char,
    version: *const c_char,
) -> *mut c_void {
    publish_pending();
    // SAFETY: the caller's arguments, passed on as given.
    unsafe { dlvsym(handle, symbol, version) }
}

/// The shim JIT code calls for loader function `name` (`dlopen`, `dlmopen`, `dlsym`,
/// `dlvsym`): its address in this process; `None` for any other name.
pub fn loader_shim(name: &str) -> Option<u64> {
    let address = match name {
        "dlopen" => dlopen_shim as *const () as usize,
        "dlmopen" => dlmopen_shim as *const () as usize,
        "dlsym" => dlsym_shim as *const () as usize,
        "dlvsym" => dlvsym_shim as *const () as usize,
        _ => return None,
    };
    Some(address as u64)
}
