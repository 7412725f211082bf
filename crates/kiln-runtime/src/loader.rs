//! The dynamic loader, as the runtime uses it: symbols looked up (`dlsym`, their kinds),
//! libraries opened (`dlopen`), and shared objects opened from bytes (Kiln's export and
//! thread-local objects).

use std::ffi::{c_int, c_void, CStr, CString};

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

pub use crate::symbol_kinds::host_symbol_is_function;

/// Opens a shared library (`dlopen(path, RTLD_NOW | RTLD_GLOBAL)`).
pub fn dlopen(path: &str) -> Result<*mut c_void, String> {
    dlopen_with(path, libc::RTLD_NOW | libc::RTLD_GLOBAL)
}

/// Whether the shared library at `path` is loaded in this process already (`dlopen` with
/// `RTLD_NOLOAD`, which loads nothing).
pub fn is_loaded(path: &str) -> bool {
    let Ok(c) = CString::new(path) else {
        return false;
    };
    // SAFETY: dlopen reads a NUL-terminated string; RTLD_NOLOAD only looks.
    let handle = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_LAZY | libc::RTLD_NOLOAD) };
    if handle.is_null() {
        return false;
    }
    // SAFETY: the reference the lookup just took.
    unsafe { libc::dlclose(handle) };
    true
}

/// `f` of the contents of the regular file at `path`, mapped read-only for the call (a
/// shared library is read only where its headers and tables lie); `None` if it cannot be
/// opened or mapped.
pub fn with_mapped_file<T>(path: &str, f: impl FnOnce(&[u8]) -> T) -> Option<T> {
    use std::os::fd::AsRawFd;
    let file = std::fs::File::open(path).ok()?;
    let meta = file.metadata().ok()?;
    let len = usize::try_from(meta.len()).ok()?;
    if !meta.is_file() || len == 0 {
        return None;
    }
    // SAFETY: a private read-only mapping of a file we opened, at an address the kernel
    // picks; nothing else is touched.
    let base = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ,
            libc::MAP_PRIVATE,
            file.as_raw_fd(),
            0,
        )
    };
    if base == libc::MAP_FAILED {
        return None;
    }
    // SAFETY: `len` readable bytes at `base`, mapped above and unmapped only below, after
    // `f` (which cannot keep the slice) returned. A file changed meanwhile changes what f
    // reads, not whether the memory is there (the library loader reads it the same way).
    let result = f(unsafe { std::slice::from_raw_parts(base as *const u8, len) });
    // SAFETY: the mapping made above, no longer borrowed.
    unsafe { libc::munmap(base, len) };
    Some(result)
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
