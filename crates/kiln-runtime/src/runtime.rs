//! The in-process runtime: where linked code runs in this process. Registers unwind information with the
//! system unwinder, runs initializers and finalizers, calls `main`, looks symbols up in
//! this process and in shared libraries, and provides `__tls_get_addr` for JIT modules'
//! thread-locals. Every raw call into JIT code or the C runtime is here.

use std::ffi::{c_char, c_int, c_void, CString};

pub use crate::loader::{
    dlopen, dlopen_bytes, dlsym, host_symbol_is_function, is_loaded, LoadedObject,
};

type FrameFn = unsafe extern "C" fn(*const c_void);

/// A host function's address, looked up once (`dlsym` takes the loader's lock: not
/// something to do once per module).
fn cached(cell: &'static std::sync::OnceLock<Option<u64>>, name: &str) -> Option<u64> {
    *cell.get_or_init(|| dlsym(std::ptr::null_mut(), name))
}

fn frame_fn(name: &str) -> Option<FrameFn> {
    static REGISTER: std::sync::OnceLock<Option<u64>> = std::sync::OnceLock::new();
    static DEREGISTER: std::sync::OnceLock<Option<u64>> = std::sync::OnceLock::new();
    let addr = match name {
        "__register_frame" => cached(&REGISTER, name),
        _ => cached(&DEREGISTER, name),
    }?;
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

/// Runs a module's finalizers, in the order of a `dlclose`: the calling thread's
/// destructors of the module's `thread_local` objects, the handlers it registered with
/// `atexit` / `__cxa_atexit` (through `__cxa_finalize(dso_handle)`, which also forgets its
/// `pthread_atfork` handlers), then its `.fini_array`.
///
/// # Safety
/// Each address must be a finalized function of a live module.
pub unsafe fn run_finalizers(dso_handle: u64, functions: &[u64]) {
    // SAFETY: the caller's contract: the module is still mapped.
    unsafe { crate::thread_locals::run_thread_destructors(dso_handle) };
    static CXA_FINALIZE: std::sync::OnceLock<Option<u64>> = std::sync::OnceLock::new();
    if let Some(cxa_finalize) = cached(&CXA_FINALIZE, "__cxa_finalize") {
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

/// Calls `main(argc, argv, envp)` at `address` with `args` (`argv[0]` included).
///
/// # Safety
/// `address` must be a finalized `int main(int, char**, char**)` of a live module.
pub unsafe fn call_main(address: u64, args: &[Vec<u8>]) -> i32 {
    extern "C" {
        static environ: *mut *mut c_char;
    }
    let c_args: Vec<CString> = args
        .iter()
        .map(|a| CString::new(a.as_slice()).unwrap_or_default())
        .collect();
    let mut argv: Vec<*mut c_char> = c_args.iter().map(|a| a.as_ptr() as *mut c_char).collect();
    argv.push(std::ptr::null_mut());
    type Main = extern "C" fn(c_int, *mut *mut c_char, *mut *mut c_char) -> c_int;
    extern "C" {
        /// csrc/call_main.S: calls `entry` in a frame that ends an exception `main` lets
        /// escape in `std::terminate`, as natively (once `kiln_cxx_personality` is set).
        fn kiln_call_main(
            entry: Main,
            argc: c_int,
            argv: *mut *mut c_char,
            envp: *mut *mut c_char,
        ) -> c_int;
        /// csrc/call_main.S: the frame's personality routine, 0 while no C++ library is
        /// loaded.
        static kiln_cxx_personality: std::sync::atomic::AtomicUsize;
    }
    // The C++ personality, if a C++ library is loaded (a C++ program loads one; a C
    // program does not, and then no C++ exception can be thrown).
    static PERSONALITY: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    let personality = match PERSONALITY.get() {
        Some(&p) => Some(p),
        None => dlsym(std::ptr::null_mut(), "__gxx_personality_v0")
            .map(|p| *PERSONALITY.get_or_init(|| p)),
    };
    if let Some(personality) = personality {
        // SAFETY: a word of csrc/call_main.S's data, only ever read by the unwinder;
        // AtomicUsize has usize's layout.
        unsafe { &kiln_cxx_personality }
            .store(personality as usize, std::sync::atomic::Ordering::Relaxed);
    }
    // SAFETY: the caller's contract.
    let main: Main = unsafe { std::mem::transmute(address as usize) };
    // SAFETY: `main` is the program's entry (the caller's contract); the arguments live
    // until it returns; reading the process's environment pointer.
    unsafe { kiln_call_main(main, c_args.len() as c_int, argv.as_mut_ptr(), environ) }
}

/// Flushes every C stdio stream (what `exit` would do for the JIT program).
pub fn flush_stdio() {
    // SAFETY: fflush(NULL) flushes all open output streams.
    unsafe { libc::fflush(std::ptr::null_mut()) };
}

/// Points standard input, output and error at `/dev/null` (their buffers flushed first):
/// a process done with its program lets go of the streams it shares with others, so that
/// a reader of its output sees the end without waiting for this process to exit.
pub fn release_stdio() {
    flush_stdio();
    // SAFETY: open of a NUL-terminated path; dup2 onto this process's own standard
    // descriptors; close of the descriptor open just returned.
    unsafe {
        let null = libc::open(c"/dev/null".as_ptr(), libc::O_RDWR | libc::O_CLOEXEC);
        if null >= 0 {
            for fd in 0..3 {
                libc::dup2(null, fd);
            }
            libc::close(null);
        }
    }
}

pub use crate::exports::{
    export_module_on_demand, export_symbols, export_symbols_on_demand, exports_of, loader_shim,
    note_library_loaded, note_library_loading, publish_exports, unexport_symbols, Exports,
    LibraryNeed,
};

/// Makes `variables` (`NAME=VALUE` each) this process's whole environment and enters
/// `directory` (unless empty): how an executor's program gets its controller's world.
/// Everything is checked before anything changes: a variable without `=` or a name, or any
/// NUL byte, is an error and the environment stays as it was.
///
/// Call it before the program runs: the environment is the C library's, not thread-safe
/// against `getenv` in other threads (an executor's own threads do not read it).
pub fn adopt_environment(variables: &[Vec<u8>], directory: &[u8]) -> Result<(), String> {
    use std::ffi::CString;
    let mut parsed = Vec::with_capacity(variables.len());
    for v in variables {
        let shown = String::from_utf8_lossy(v);
        let eq = v
            .iter()
            .position(|&b| b == b'=')
            .filter(|&i| i > 0)
            .ok_or_else(|| format!("environment entry '{shown}' is not NAME=VALUE"))?;
        let name = CString::new(&v[..eq])
            .map_err(|_| format!("environment entry '{shown}' holds a NUL byte"))?;
        let value = CString::new(&v[eq + 1..])
            .map_err(|_| format!("environment entry '{shown}' holds a NUL byte"))?;
        parsed.push((name, value));
    }
    let directory = (!directory.is_empty())
        .then(|| {
            CString::new(directory)
                .map_err(|_| "the working directory holds a NUL byte".to_string())
        })
        .transpose()?;
    if let Some(dir) = &directory {
        // SAFETY: chdir with a NUL-terminated path.
        if unsafe { libc::chdir(dir.as_ptr()) } != 0 {
            return Err(format!(
                "cannot enter the working directory {}: {}",
                dir.to_string_lossy(),
                std::io::Error::last_os_error()
            ));
        }
    }
    // SAFETY: clearenv and setenv change the C library's environment; the caller runs this
    // before the program and no other thread of the executor reads the environment.
    unsafe {
        libc::clearenv();
        for (name, value) in &parsed {
            if libc::setenv(name.as_ptr(), value.as_ptr(), 1) != 0 {
                return Err(format!(
                    "cannot set {}: {}",
                    name.to_string_lossy(),
                    std::io::Error::last_os_error()
                ));
            }
        }
    }
    Ok(())
}

/// Maps the read-execute pages `[address, address + len)` with branch-target enforcement
/// (AArch64 `PROT_BTI`): an indirect branch to anything but a landing pad (`BTI c`/`j`,
/// `PACIASP`) then traps with `SIGILL`. Elsewhere there is no such guard: `Ok`.
///
/// # Safety
/// The range must be whole pages of code this process mapped read-execute and owns (the
/// permission is replaced by read + execute + guard).
pub unsafe fn guard_branch_targets(address: u64, len: u64) -> Result<(), String> {
    #[cfg(target_arch = "aarch64")]
    {
        const PROT_BTI: libc::c_int = 0x10;
        // SAFETY: the caller's contract: whole pages of our own code.
        let rc = unsafe {
            libc::mprotect(
                address as *mut libc::c_void,
                len as usize,
                libc::PROT_READ | libc::PROT_EXEC | PROT_BTI,
            )
        };
        if rc != 0 {
            return Err(format!(
                "cannot guard branch targets in {address:#x}..{:#x}: {}",
                address + len,
                std::io::Error::last_os_error()
            ));
        }
    }
    #[cfg(not(target_arch = "aarch64"))]
    let _ = (address, len);
    Ok(())
}
