//! Thread-local storage of JIT modules, and the destructors of their thread-locals.
//!
//! **Blocks.** A module's TLS block is either *dynamic* — one copy per thread, allocated
//! on the thread's first access through Kiln's `__tls_get_addr` (general- and
//! local-dynamic code) — or *static*: placed by the C runtime's loader at one fixed
//! offset from the thread pointer in every thread (see [`crate::shared_object`]), which
//! initial-exec, local-exec and TLS-descriptor code need. Kiln's `__tls_get_addr` serves
//! both, so a module whose objects mix models sees one copy of each variable.
//!
//! **Destructors.** C++ `thread_local` objects register their destructors with
//! `__cxa_thread_atexit(func, obj, &__dso_handle)`. glibc's own implementation would run
//! them at thread exit (for the main thread, inside `exit()`), long after a JIT module may
//! have been freed. Kiln resolves that name (and `__cxa_thread_atexit_impl`) to
//! [`thread_atexit_address`] instead, and keeps the rule:
//!
//! - a thread's destructors run when it exits, newest first, while their module is still
//!   mapped: each registration holds the module alive (through the keep-alive token the
//!   session gave with [`register_module`]);
//! - removing a module runs the *calling* thread's destructors of that module first
//!   ([`run_thread_destructors`]); those of other threads run when those threads exit, and
//!   the module's memory stays mapped until they have.

use parking_lot::RwLock;
use rustc_hash::FxHashMap;
use std::any::Any;
use std::cell::Cell;
use std::ffi::c_void;
use std::sync::{Arc, Weak};

/// The initialization image of a module's TLS block, as the runtime keeps it.
#[derive(Debug, Clone, Default)]
pub struct TlsImage {
    /// Module id passed to `__tls_get_addr` (from [`tls_reserve_module`]).
    pub module_id: u64,
    /// The initialized part (`.tdata`), relocated.
    pub image: Vec<u8>,
    /// The whole block (`.tdata` + `.tbss`).
    pub size: u64,
    /// Its alignment.
    pub align: u64,
}

/// Module ids handed to JIT modules start here, far from any id glibc would use.
const TLS_MODULE_BASE: u64 = 0x4b49_4c4e_0000_0000;

/// Largest TLS block Kiln gives a module: each thread that touches the module gets a copy.
pub const MAX_TLS_BLOCK: u64 = 1 << 28;

enum TlsEntry {
    /// Reserved, not yet installed.
    Reserved,
    /// One copy per thread, made on first access.
    Dynamic(Arc<TlsImage>),
    /// At `tp + tp_offset` in every thread; `handle` is the loader's handle of the
    /// synthesized object that holds the space.
    Static {
        tp_offset: i64,
        size: u64,
        object: crate::loader::LoadedObject,
    },
    /// Removed.
    Gone,
}

static TLS_ENTRIES: RwLock<Vec<TlsEntry>> = RwLock::new(Vec::new());

/// Keep-alive tokens of live modules, by `__dso_handle` address.
static MODULES: RwLock<Option<FxHashMap<u64, Weak<dyn Any + Send + Sync>>>> = RwLock::new(None);

/// One thread's state: its copies of dynamic TLS blocks and its registered destructors.
struct ThreadState {
    blocks: Vec<Option<TlsBlock>>,
    destructors: Vec<Destructor>,
}

struct Destructor {
    func: extern "C" fn(*mut c_void),
    object: *mut c_void,
    dso: u64,
    /// Holds the module mapped until the destructor has run.
    _keep: Option<Arc<dyn Any + Send + Sync>>,
}

thread_local! {
    // A plain pointer (no destructor of its own): it must stay usable while this thread's
    // destructors run, which is when `thread_exit` below frees it.
    static STATE: Cell<*mut ThreadState> = const { Cell::new(std::ptr::null_mut()) };
}

extern "C" {
    /// glibc's (GLIBC_2.18): runs `func(obj)` when the calling thread exits.
    fn __cxa_thread_atexit_impl(
        func: extern "C" fn(*mut c_void),
        obj: *mut c_void,
        dso_symbol: *mut c_void,
    ) -> libc::c_int;
}

/// An address inside Kiln's own object, for glibc's bookkeeping of who registered.
static KILN_DSO_MARKER: u8 = 0;

/// This thread's state, made (and its exit hook registered with glibc) on first use.
fn state() -> *mut ThreadState {
    STATE.with(|cell| {
        let current = cell.get();
        if !current.is_null() {
            return current;
        }
        let fresh = Box::into_raw(Box::new(ThreadState {
            blocks: Vec::new(),
            destructors: Vec::new(),
        }));
        cell.set(fresh);
        // SAFETY: `thread_exit` is an `extern "C" fn(*mut c_void)` of this program; the
        // marker is a static of Kiln's own object.
        unsafe {
            __cxa_thread_atexit_impl(
                thread_exit,
                std::ptr::null_mut(),
                &KILN_DSO_MARKER as *const u8 as *mut c_void,
            )
        };
        fresh
    })
}

/// Runs at thread exit (for the main thread: in `exit()`): the JIT destructors, newest
/// first, then frees the thread's TLS blocks.
extern "C" fn thread_exit(_: *mut c_void) {
    loop {
        let state = STATE.with(Cell::get);
        if state.is_null() {
            return;
        }
        // SAFETY: `state` is this thread's, alive until freed below; no other reference to
        // it is live while we pop (JIT code runs after the borrow ends).
        let next = unsafe { (*state).destructors.pop() };
        match next {
            Some(d) => (d.func)(d.object),
            None => {
                STATE.with(|cell| cell.set(std::ptr::null_mut()));
                // SAFETY: made by Box::into_raw in `state()`, and no longer reachable.
                drop(unsafe { Box::from_raw(state) });
                return;
            }
        }
    }
}

/// Runs the calling thread's JIT thread-local destructors (newest first) and frees its TLS
/// blocks, as its exit would: for a thread that stays alive after the work that made them
/// (the executor's thread that ran `main`, which a native program's `exit` would end).
pub fn end_thread_locals() {
    thread_exit(std::ptr::null_mut());
}

/// Kiln's `__cxa_thread_atexit` for JIT code (see the module documentation).
extern "C" fn thread_atexit(
    func: extern "C" fn(*mut c_void),
    object: *mut c_void,
    dso: *mut c_void,
) -> libc::c_int {
    let dso = dso as u64;
    let keep = MODULES
        .read()
        .as_ref()
        .and_then(|m| m.get(&dso))
        .and_then(Weak::upgrade);
    let state = state();
    // SAFETY: this thread's state; the borrow ends before any JIT code runs.
    unsafe {
        (*state).destructors.push(Destructor {
            func,
            object,
            dso,
            _keep: keep,
        })
    };
    0
}

/// Address of Kiln's `__cxa_thread_atexit` (also serving `__cxa_thread_atexit_impl`).
pub fn thread_atexit_address() -> u64 {
    thread_atexit as *const () as u64
}

/// Tells the runtime a module lives with `__dso_handle` at `dso`; `keep_alive` (if any) is
/// upgraded by each thread-local destructor registration of the module, so that its memory
/// outlives the destructor.
pub fn register_module(dso: u64, keep_alive: Option<Weak<dyn Any + Send + Sync>>) {
    if let Some(keep) = keep_alive {
        MODULES
            .write()
            .get_or_insert_with(FxHashMap::default)
            .insert(dso, keep);
    }
}

/// Forgets a module registered with [`register_module`].
pub fn unregister_module(dso: u64) {
    if let Some(m) = MODULES.write().as_mut() {
        m.remove(&dso);
    }
}

/// Runs the calling thread's thread-local destructors of the module whose `__dso_handle`
/// is `dso`, newest first (those registered while they run included).
///
/// # Safety
/// The module's code must still be mapped.
pub unsafe fn run_thread_destructors(dso: u64) {
    loop {
        let state = STATE.with(Cell::get);
        if state.is_null() {
            return;
        }
        // SAFETY: this thread's state; the borrow ends before the destructor runs.
        let next = unsafe {
            let list = &mut (*state).destructors;
            list.iter()
                .rposition(|d| d.dso == dso)
                .map(|i| list.remove(i))
        };
        match next {
            Some(d) => (d.func)(d.object),
            None => return,
        }
    }
}

// --- TLS blocks -------------------------------------------------------------------------

/// One thread's copy of a module's TLS block, aligned as the template asks.
struct TlsBlock {
    memory: *mut u8,
    layout: std::alloc::Layout,
}

impl Drop for TlsBlock {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout.
        unsafe { std::alloc::dealloc(self.memory, self.layout) };
    }
}

impl TlsBlock {
    fn new(template: &TlsImage) -> Option<Self> {
        let size = template.size.max(16) as usize;
        let align = template.align.max(16) as usize;
        let layout = std::alloc::Layout::from_size_align(size, align).ok()?;
        // SAFETY: the layout has a non-zero size.
        let memory = unsafe { std::alloc::alloc_zeroed(layout) };
        if memory.is_null() {
            return None;
        }
        let n = template.image.len().min(size);
        // SAFETY: `memory` has `size >= n` bytes; the image is a separate allocation.
        unsafe { std::ptr::copy_nonoverlapping(template.image.as_ptr(), memory, n) };
        Some(TlsBlock { memory, layout })
    }
}

/// Reserves a TLS module id.
pub fn tls_reserve_module() -> u64 {
    let mut entries = TLS_ENTRIES.write();
    entries.push(TlsEntry::Reserved);
    TLS_MODULE_BASE + entries.len() as u64 - 1
}

fn slot_of(module_id: u64) -> Option<usize> {
    module_id
        .checked_sub(TLS_MODULE_BASE)
        .and_then(|s| usize::try_from(s).ok())
}

/// Installs a dynamic block for a reserved id; `false` if the id was not reserved here.
pub fn tls_install(image: TlsImage) -> bool {
    let Some(slot) = slot_of(image.module_id) else {
        return false;
    };
    let mut entries = TLS_ENTRIES.write();
    match entries.get_mut(slot) {
        Some(entry @ TlsEntry::Reserved) => {
            *entry = TlsEntry::Dynamic(Arc::new(image));
            true
        }
        _ => false,
    }
}

/// Places a reserved module's block in static TLS: every thread, existing and future, gets
/// it at the returned offset from its thread pointer, initialized from `image`.
///
/// The space comes from the C runtime's static TLS surplus; when it is exhausted, the error
/// names the bytes needed and the glibc tunable that enlarges it (it must be set when the
/// process starts).
pub fn tls_place_static(image: &TlsImage) -> Result<i64, String> {
    let slot = slot_of(image.module_id)
        .filter(|&s| matches!(TLS_ENTRIES.read().get(s), Some(TlsEntry::Reserved)))
        .ok_or_else(|| format!("TLS module id {:#x} not reserved", image.module_id))?;
    if image.size == 0
        || !image.align.max(1).is_power_of_two()
        || image.image.len() as u64 > image.size
    {
        return Err(format!(
            "invalid static TLS block: size {}, alignment {}, initial image {} bytes (a block has a size, a power-of-two alignment and an image no larger than itself)",
            image.size,
            image.align,
            image.image.len()
        ));
    }
    if image.size > MAX_TLS_BLOCK {
        return Err(format!(
            "a TLS block of {} bytes is more than Kiln gives one module ({MAX_TLS_BLOCK})",
            image.size
        ));
    }
    let soname = format!("kiln-static-tls-{:x}.so", image.module_id);
    let object = crate::shared_object::build(
        &soname,
        crate::shared_object::host_machine(),
        &[],
        Some(crate::shared_object::StaticTlsSpec {
            image: &image.image,
            size: image.size,
            align: image.align.max(1),
        }),
    );
    let loaded = crate::loader::dlopen_bytes(&soname, &object.bytes, false).map_err(|reason| {
        if reason.contains("static TLS") {
            format!(
                "no room for {} bytes (aligned to {}) of static TLS: the C library's surplus is used up ({reason}); start the process with GLIBC_TUNABLES=glibc.rtld.optional_static_tls=<bytes> to enlarge it",
                image.size, image.align
            )
        } else {
            reason
        }
    })?;
    let slot_address = loaded
        .load_address()
        .zip(object.tp_offset_slot)
        .map(|(base, slot)| base.wrapping_add(slot));
    let Some(slot_address) = slot_address else {
        loaded.close();
        return Err("the loader placed no static TLS block".into());
    };
    // SAFETY: the loader mapped the object (writable, 8-aligned slot) and relocated the
    // slot to the block's offset from the thread pointer.
    let tp_offset = unsafe { std::ptr::read(slot_address as *const i64) };
    TLS_ENTRIES.write()[slot] = TlsEntry::Static {
        tp_offset,
        size: image.size,
        object: loaded,
    };
    Ok(tp_offset)
}

/// Forgets a module's block. Threads that touched a dynamic block keep their copy until
/// they exit; a static block's loader object is closed (glibc does not reuse the space).
pub fn tls_remove(module_id: u64) {
    let Some(slot) = slot_of(module_id) else {
        return;
    };
    let old = match TLS_ENTRIES.write().get_mut(slot) {
        Some(entry) => std::mem::replace(entry, TlsEntry::Gone),
        None => return,
    };
    if let TlsEntry::Static { object, .. } = old {
        object.close();
    }
}

/// The thread pointer (`%fs:0` on x86-64, `TPIDR_EL0` on AArch64): on x86-64 the TLS
/// variant II blocks lie below it.
fn thread_pointer() -> u64 {
    let tp: u64;
    #[cfg(target_arch = "x86_64")]
    // SAFETY: reads the TCB's self pointer, which glibc keeps at %fs:0.
    unsafe {
        std::arch::asm!("mov {}, fs:0", out(reg) tp, options(nostack, readonly, preserves_flags))
    };
    #[cfg(target_arch = "aarch64")]
    // SAFETY: reads the thread register.
    unsafe {
        std::arch::asm!("mrs {}, tpidr_el0", out(reg) tp, options(nostack, nomem, preserves_flags))
    };
    tp
}

/// JIT code asked for a thread-local Kiln does not know: nothing sensible can be returned
/// to it, so say why and abort (the executor reports the signal).
fn tls_fatal(what: &str, module: u64, offset: u64) -> ! {
    eprintln!("kiln: __tls_get_addr: {what} (module {module:#x}, offset {offset:#x})");
    std::process::abort()
}

#[repr(C)]
struct TlsIndex {
    module: u64,
    offset: u64,
}

/// Address of the thread's copy of `offset` in TLS module `module`.
extern "C" fn tls_get_addr_impl(index: *const TlsIndex) -> *mut u8 {
    // SAFETY: JIT code passes a pointer to its GOT pair {module, offset}, written by the
    // linker.
    let TlsIndex { module, offset } = unsafe { std::ptr::read(index) };
    let Some(slot) = slot_of(module) else {
        tls_fatal("unknown TLS module", module, offset)
    };
    let state = state();
    // SAFETY: this thread's state; no JIT code runs while the borrow lives.
    let blocks = unsafe { &mut (*state).blocks };
    if let Some(Some(block)) = blocks.get(slot) {
        if offset < block.layout.size() as u64 {
            // SAFETY: `offset` lies inside the block (checked).
            return unsafe { block.memory.add(offset as usize) };
        }
        tls_fatal("offset past the module's TLS block", module, offset)
    }
    let image = match TLS_ENTRIES.read().get(slot) {
        Some(TlsEntry::Dynamic(image)) => image.clone(),
        Some(TlsEntry::Static {
            tp_offset, size, ..
        }) => {
            if offset >= *size {
                tls_fatal("offset past the module's TLS block", module, offset)
            }
            return (thread_pointer() as i64)
                .wrapping_add(*tp_offset)
                .wrapping_add(offset as i64) as *mut u8;
        }
        Some(TlsEntry::Reserved) | Some(TlsEntry::Gone) => {
            tls_fatal("TLS module not installed or removed", module, offset)
        }
        None => tls_fatal("unknown TLS module", module, offset),
    };
    if blocks.len() <= slot {
        blocks.resize_with(slot + 1, || None);
    }
    let Some(block) = TlsBlock::new(&image) else {
        tls_fatal("out of memory for a TLS block", module, offset)
    };
    if offset >= block.layout.size() as u64 {
        tls_fatal("offset past the module's TLS block", module, offset)
    }
    // SAFETY: `offset` lies inside the block (checked).
    let address = unsafe { block.memory.add(offset as usize) };
    blocks[slot] = Some(block);
    address
}

// `__tls_get_addr` for JIT code. gcc does not guarantee a 16-byte aligned stack at the
// call in the general-dynamic sequence (glibc realigns in its own __tls_get_addr for the
// same reason), so this entry realigns before calling the Rust implementation.
#[cfg(target_arch = "x86_64")]
std::arch::global_asm!(
    ".globl kiln_tls_get_addr",
    ".type kiln_tls_get_addr,@function",
    "kiln_tls_get_addr:",
    "push rbp",
    "mov rbp, rsp",
    "and rsp, -16",
    "call {imp}",
    "mov rsp, rbp",
    "pop rbp",
    "ret",
    ".size kiln_tls_get_addr, . - kiln_tls_get_addr",
    imp = sym tls_get_addr_impl,
);

/// Address of Kiln's `__tls_get_addr`.
pub fn tls_get_addr_address() -> u64 {
    extern "C" {
        fn kiln_tls_get_addr();
    }
    kiln_tls_get_addr as *const () as u64
}

/// The names Kiln's runtime provides to JIT code in place of the C runtime's.
pub const RUNTIME_SYMBOL_NAMES: [&str; 3] = [
    "__tls_get_addr",
    "__cxa_thread_atexit",
    "__cxa_thread_atexit_impl",
];

/// The address in this process of runtime symbol `name` (one of
/// [`RUNTIME_SYMBOL_NAMES`]), `None` for any other name.
pub fn runtime_symbol(name: &str) -> Option<u64> {
    match name {
        "__tls_get_addr" => Some(tls_get_addr_address()),
        "__cxa_thread_atexit" | "__cxa_thread_atexit_impl" => Some(thread_atexit_address()),
        _ => None,
    }
}

/// Every runtime symbol with its address in this process (for the executor's hello).
pub fn runtime_symbols() -> Vec<(String, u64)> {
    RUNTIME_SYMBOL_NAMES
        .iter()
        .filter_map(|&n| runtime_symbol(n).map(|a| (n.to_string(), a)))
        .collect()
}
