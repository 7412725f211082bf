//! The in-process runtime: where linked code runs in this process. Registers unwind information with the
//! system unwinder, runs initializers and finalizers, calls `main`, looks symbols up in
//! this process and in shared libraries, and provides `__tls_get_addr` for JIT modules'
//! thread-locals. Every raw call into JIT code or the C runtime is here.

use kiln_link::TlsTemplate;
use parking_lot::RwLock;
use std::cell::RefCell;
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::sync::Arc;

/// Looks `name` up with `dlsym(handle, name)`; `handle` null means every object loaded in
/// the process (`RTLD_DEFAULT`).
pub fn dlsym(handle: *mut c_void, name: &str) -> Option<u64> {
    let name = CString::new(name).ok()?;
    let handle = if handle.is_null() {
        libc::RTLD_DEFAULT
    } else {
        handle
    };
    // SAFETY: dlsym reads a NUL-terminated string and a valid handle (RTLD_DEFAULT or one
    // returned by dlopen and never closed: libraries stay open for the life of the process).
    let addr = unsafe { libc::dlsym(handle, name.as_ptr()) };
    (!addr.is_null()).then_some(addr as u64)
}

/// Whether the host symbol at `address` is a function (`STT_FUNC` / `STT_GNU_IFUNC`),
/// from the dynamic symbol table of the object that holds it (`dladdr1`); `None` if the
/// address is not a symbol of a loaded object.
pub fn host_symbol_is_function(address: u64) -> Option<bool> {
    const RTLD_DL_SYMENT: c_int = 1;
    // SAFETY: Dl_info is plain data; zeroed is valid.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    let mut sym: *const libc::Elf64_Sym = std::ptr::null();
    // SAFETY: dladdr1 only reads loader tables and writes the two out-parameters.
    let found = unsafe {
        libc::dladdr1(
            address as *const c_void,
            &mut info,
            (&mut sym as *mut *const libc::Elf64_Sym).cast(),
            RTLD_DL_SYMENT,
        )
    };
    if found == 0 || sym.is_null() {
        return None;
    }
    // SAFETY: dladdr1 points `sym` at an entry of a loaded object's symbol table.
    let st_info = unsafe { (*sym).st_info };
    Some(matches!(st_info & 0xf, 2 | 10))
}

/// Opens a shared library (`dlopen(path, RTLD_NOW | RTLD_GLOBAL)`).
pub fn dlopen(path: &str) -> Result<*mut c_void, String> {
    let c = CString::new(path).map_err(|e| e.to_string())?;
    // SAFETY: dlopen reads a NUL-terminated string; running the library's constructors is
    // what opening it means.
    let handle = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL) };
    if handle.is_null() {
        // SAFETY: dlerror returns a thread-local string or null.
        let err = unsafe { libc::dlerror() };
        let reason = if err.is_null() {
            "unknown error".to_string()
        } else {
            // SAFETY: non-null dlerror results are NUL-terminated strings.
            unsafe { CStr::from_ptr(err) }
                .to_string_lossy()
                .into_owned()
        };
        return Err(reason);
    }
    Ok(handle)
}

type FrameFn = unsafe extern "C" fn(*const c_void);

fn frame_fn(name: &str) -> Option<FrameFn> {
    let addr = dlsym(std::ptr::null_mut(), name)?;
    // SAFETY: libgcc_s's __register_frame / __deregister_frame have this signature.
    Some(unsafe { std::mem::transmute::<usize, FrameFn>(addr as usize) })
}

/// A registration of a module's `.eh_frame` with the unwinder; deregisters on drop.
#[derive(Debug)]
pub struct EhFrameRegistration {
    address: u64,
}

impl EhFrameRegistration {
    /// Registers the terminated `.eh_frame` data at `address` (finalized, readable, and
    /// kept alive by the caller for as long as the registration lives).
    pub fn register(address: u64) -> Option<Self> {
        let register = frame_fn("__register_frame")?;
        // SAFETY: `address` points at eh_frame records followed by a zero terminator, in
        // memory that outlives this registration (the module owns both).
        unsafe { register(address as *const c_void) };
        Some(EhFrameRegistration { address })
    }
}

impl Drop for EhFrameRegistration {
    fn drop(&mut self) {
        if let Some(deregister) = frame_fn("__deregister_frame") {
            // SAFETY: the same pointer registered above, still mapped.
            unsafe { deregister(self.address as *const c_void) };
        }
    }
}

/// Runs initializers the way glibc does: `f(argc, argv, envp)`.
///
/// # Safety
/// Each address must be a finalized function of the C ABI of a live module.
pub unsafe fn run_initializers(functions: &[u64]) {
    extern "C" {
        static environ: *mut *mut c_char;
    }
    for &f in functions {
        // SAFETY: the caller's contract.
        let init: extern "C" fn(c_int, *mut *mut c_char, *mut *mut c_char) =
            unsafe { std::mem::transmute(f as usize) };
        // SAFETY: reading the process's environment pointer.
        init(0, std::ptr::null_mut(), unsafe { environ });
    }
}

/// Runs a module's finalizers: first the destructors it registered with `__cxa_atexit`
/// (through `__cxa_finalize(dso_handle)`), then its `.fini_array`.
///
/// # Safety
/// Each address must be a finalized function of a live module.
pub unsafe fn run_finalizers(dso_handle: u64, functions: &[u64]) {
    if let Some(cxa_finalize) = dlsym(std::ptr::null_mut(), "__cxa_finalize") {
        // SAFETY: glibc's __cxa_finalize(void *dso).
        let f: extern "C" fn(*mut c_void) = unsafe { std::mem::transmute(cxa_finalize as usize) };
        f(dso_handle as *mut c_void);
    }
    for &f in functions {
        // SAFETY: the caller's contract.
        let fini: extern "C" fn() = unsafe { std::mem::transmute(f as usize) };
        fini();
    }
}

/// Calls `main(argc, argv, envp)` at `address` with `args` (argv[0] included).
///
/// # Safety
/// `address` must be a finalized `int main(int, char**, char**)` of a live module.
pub unsafe fn call_main(address: u64, args: &[String]) -> i32 {
    extern "C" {
        static environ: *mut *mut c_char;
    }
    let c_args: Vec<CString> = args
        .iter()
        .map(|a| CString::new(a.as_str()).unwrap_or_default())
        .collect();
    let mut argv: Vec<*mut c_char> = c_args.iter().map(|a| a.as_ptr() as *mut c_char).collect();
    argv.push(std::ptr::null_mut());
    // SAFETY: the caller's contract.
    let main: extern "C" fn(c_int, *mut *mut c_char, *mut *mut c_char) -> c_int =
        unsafe { std::mem::transmute(address as usize) };
    // SAFETY: reading the process's environment pointer.
    main(c_args.len() as c_int, argv.as_mut_ptr(), unsafe { environ })
}

/// Flushes every C stdio stream (what `exit` would do for the JIT program).
pub fn flush_stdio() {
    // SAFETY: fflush(NULL) flushes all open output streams.
    unsafe { libc::fflush(std::ptr::null_mut()) };
}

// --- thread-local storage for JIT modules ---------------------------------------------

/// Module ids handed to JIT modules start here, far from any id glibc would use.
const TLS_MODULE_BASE: u64 = 0x4b49_4c4e_0000_0000;

static TLS_TEMPLATES: RwLock<Vec<Option<Arc<TlsTemplate>>>> = RwLock::new(Vec::new());

thread_local! {
    static TLS_BLOCKS: RefCell<Vec<Option<TlsBlock>>> = const { RefCell::new(Vec::new()) };
}

/// One thread's copy of a module's TLS block, aligned as the template asks.
struct TlsBlock {
    memory: *mut u8,
    layout: std::alloc::Layout,
}

impl Drop for TlsBlock {
    fn drop(&mut self) {
        // SAFETY: allocated below with this layout.
        unsafe { std::alloc::dealloc(self.memory, self.layout) };
    }
}

impl TlsBlock {
    fn new(template: Option<&TlsTemplate>) -> Option<Self> {
        let size = template.map_or(16, |t| t.size.max(16)) as usize;
        let align = template.map_or(16, |t| t.align.max(16)) as usize;
        let layout = std::alloc::Layout::from_size_align(size, align).ok()?;
        // SAFETY: the layout has a non-zero size.
        let memory = unsafe { std::alloc::alloc_zeroed(layout) };
        if memory.is_null() {
            return None;
        }
        if let Some(t) = template {
            let n = t.image.len().min(size);
            // SAFETY: `memory` has `size >= n` bytes; the image is a separate allocation.
            unsafe { std::ptr::copy_nonoverlapping(t.image.as_ptr(), memory, n) };
        }
        Some(TlsBlock { memory, layout })
    }
}

/// Reserves a TLS module id.
pub fn tls_reserve_module() -> u64 {
    let mut templates = TLS_TEMPLATES.write();
    templates.push(None);
    TLS_MODULE_BASE + templates.len() as u64 - 1
}

/// Installs the template for a reserved id.
/// Installs the template for a reserved id; `false` if the id was not reserved here.
pub fn tls_install(template: TlsTemplate) -> bool {
    let Some(index) = template.module_id.checked_sub(TLS_MODULE_BASE) else {
        return false;
    };
    let mut templates = TLS_TEMPLATES.write();
    match templates.get_mut(index as usize) {
        Some(slot) => {
            *slot = Some(Arc::new(template));
            true
        }
        None => false,
    }
}

/// Forgets a module's template. Threads that touched the module keep their blocks until
/// they exit.
pub fn tls_remove(module_id: u64) {
    let Some(index) = module_id.checked_sub(TLS_MODULE_BASE) else {
        return;
    };
    if let Some(slot) = TLS_TEMPLATES.write().get_mut(index as usize) {
        *slot = None;
    }
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
    let templates_len = TLS_TEMPLATES.read().len();
    let Some(slot) = module
        .checked_sub(TLS_MODULE_BASE)
        .map(|s| s as usize)
        .filter(|&s| s < templates_len)
    else {
        tls_fatal("unknown TLS module", module, offset)
    };
    let result = TLS_BLOCKS.try_with(|blocks| {
        let mut blocks = blocks.borrow_mut();
        if blocks.len() <= slot {
            blocks.resize_with(slot + 1, || None);
        }
        if blocks[slot].is_none() {
            let Some(template) = TLS_TEMPLATES.read().get(slot).cloned().flatten() else {
                tls_fatal("TLS module not installed or removed", module, offset)
            };
            blocks[slot] = TlsBlock::new(Some(&template));
        }
        match &blocks[slot] {
            Some(block) if offset < block.layout.size() as u64 => {
                // SAFETY: `offset` lies inside the block (checked).
                unsafe { block.memory.add(offset as usize) }
            }
            Some(_) => tls_fatal("offset past the module's TLS block", module, offset),
            None => tls_fatal("out of memory for a TLS block", module, offset),
        }
    });
    match result {
        Ok(address) => address,
        Err(_) => tls_fatal("called while the thread is exiting", module, offset),
    }
}

// `__tls_get_addr` for JIT code. gcc does not guarantee a 16-byte aligned stack at the
// call in the general-dynamic sequence (glibc realigns in its own __tls_get_addr for the
// same reason), so this entry realigns before calling the Rust implementation, and keeps
// every register the caller might not expect to be clobbered beyond the C ABI's.
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
