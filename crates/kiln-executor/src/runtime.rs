//! The in-process runtime: where linked code runs in this process. Registers unwind information with the
//! system unwinder, runs initializers and finalizers, calls `main`, looks symbols up in
//! this process and in shared libraries, and provides `__tls_get_addr` for JIT modules'
//! thread-locals. Every raw call into JIT code or the C runtime is here.

use std::ffi::{c_char, c_int, c_void, CStr, CString};

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
    dlopen_with(path, libc::RTLD_NOW | libc::RTLD_GLOBAL)
}

fn dlopen_with(path: &str, flags: c_int) -> Result<*mut c_void, String> {
    let c = CString::new(path).map_err(|e| e.to_string())?;
    // SAFETY: dlopen reads a NUL-terminated string; running the library's constructors is
    // what opening it means.
    let handle = unsafe { libc::dlopen(c.as_ptr(), flags) };
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

/// Opens a shared object given as bytes (made by [`crate::shared_object::build`]): from a
/// memfd, or from an unlinked temporary file where memfds are refused. `global` makes its
/// symbols visible to libraries loaded later (`RTLD_GLOBAL`).
pub fn dlopen_bytes(name: &str, bytes: &[u8], global: bool) -> Result<LoadedObject, String> {
    use std::io::Write;
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    let flags = libc::RTLD_NOW
        | if global {
            libc::RTLD_GLOBAL
        } else {
            libc::RTLD_LOCAL
        };
    let cname = CString::new(name).map_err(|e| e.to_string())?;
    // SAFETY: memfd_create reads a NUL-terminated name.
    let fd = unsafe { libc::memfd_create(cname.as_ptr(), libc::MFD_CLOEXEC) };
    if fd >= 0 {
        // SAFETY: the kernel just returned this descriptor; nothing else owns it.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let mut file = std::fs::File::from(fd);
        file.write_all(bytes).map_err(|e| format!("{name}: {e}"))?;
        // The path names this process, not `self`: a debugger reads the loaded objects'
        // names from the link map, and `/proc/self/fd/N` in *its* process is another file
        // (gdb once blocked reading its own pipe). The memfd stays open while the object
        // is loaded, so the name stays valid.
        let path = format!("/proc/{}/fd/{}", std::process::id(), file.as_raw_fd());
        return dlopen_with(&path, flags).map(|handle| LoadedObject {
            handle,
            _file: Some(file),
        });
    }
    // Where memfds are refused: a file of our own, created new (never following or
    // reusing what another user may have put at the name), removed after loading.
    use std::os::unix::fs::OpenOptionsExt;
    static SERIAL: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let serial = SERIAL.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let path = std::env::temp_dir().join(format!("kiln-{}-{serial}-{name}", std::process::id()));
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(&path)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    file.write_all(bytes)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    drop(file);
    let result = dlopen_with(&path.display().to_string(), flags);
    let _ = std::fs::remove_file(&path);
    result.map(|handle| LoadedObject {
        handle,
        _file: None,
    })
}

/// An object opened by [`dlopen_bytes`]; closed by [`LoadedObject::close`] (dropping it
/// keeps the object loaded).
#[derive(Debug)]
pub struct LoadedObject {
    handle: *mut c_void,
    /// The memfd it was loaded from (closed after `dlclose`).
    _file: Option<std::fs::File>,
}

// SAFETY: a dlopen handle may be used and closed from any thread.
unsafe impl Send for LoadedObject {}
// SAFETY: as above; the handle is only read.
unsafe impl Sync for LoadedObject {}

impl LoadedObject {
    /// The load address (`dlinfo(RTLD_DI_LINKMAP)`'s `l_addr`).
    pub fn load_address(&self) -> Option<u64> {
        const RTLD_DI_LINKMAP: c_int = 2;
        let mut map: *const u64 = std::ptr::null();
        // SAFETY: `handle` came from dlopen and is open; the request writes one pointer.
        let rc = unsafe {
            libc::dlinfo(
                self.handle,
                RTLD_DI_LINKMAP,
                (&mut map as *mut *const u64).cast(),
            )
        };
        if rc != 0 || map.is_null() {
            return None;
        }
        // SAFETY: `struct link_map` begins with `ElfW(Addr) l_addr` (<link.h>, public ABI).
        Some(unsafe { *map })
    }

    /// The address of `name` in this object (`dlsym`).
    pub fn symbol(&self, name: &str) -> Option<u64> {
        dlsym(self.handle, name)
    }

    /// Closes the object.
    pub fn close(self) {
        // SAFETY: the handle came from dlopen and is closed once (this consumes it).
        unsafe { libc::dlclose(self.handle) };
    }
}

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
    type Main = extern "C" fn(c_int, *mut *mut c_char, *mut *mut c_char) -> c_int;
    extern "C" {
        /// csrc/call_main.cc: calls `entry` in a `noexcept` frame, so that an exception
        /// `main` lets escape ends in `std::terminate`, as natively.
        fn kiln_call_main(
            entry: Main,
            argc: c_int,
            argv: *mut *mut c_char,
            envp: *mut *mut c_char,
        ) -> c_int;
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

/// Definitions made visible to libraries loaded later: an `RTLD_GLOBAL` object of absolute
/// symbols (see [`crate::shared_object`]). Closed by [`unexport_symbols`].
#[derive(Debug)]
pub struct Exports {
    object: LoadedObject,
}

static EXPORT_SERIAL: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Exports `symbols` to libraries loaded from now on (and to `dlsym(RTLD_DEFAULT, …)`).
pub fn export_symbols(symbols: &[crate::shared_object::ExportedSymbol]) -> Result<Exports, String> {
    let serial = EXPORT_SERIAL.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let soname = format!("kiln-exports-{}-{serial}.so", std::process::id());
    let object =
        crate::shared_object::build(&soname, crate::shared_object::host_machine(), symbols, None);
    dlopen_bytes(&soname, &object.bytes, true).map(|object| Exports { object })
}

/// Withdraws exported definitions.
pub fn unexport_symbols(exports: Exports) {
    exports.object.close();
}

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
