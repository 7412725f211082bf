//! The session: create and dispose, libraries, inputs, resolvers, links, lookups,
//! modules, running `main`, statistics.

use crate::error::{guard, kiln_error, kiln_status};
use crate::memory::{kiln_memory_callbacks, CallbackMemory};
use kiln::Input;
use kiln::{Jit, LibraryId, Module};
use parking_lot::Mutex;
use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::Arc;

/// Where a session's code runs.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum kiln_executor_kind {
    /// This process (the default).
    KILN_EXECUTOR_IN_PROCESS = 0,
    /// A `kiln-executor` child process (`executor_path`, `transport`).
    KILN_EXECUTOR_SPAWN = 1,
    /// A `kiln-executor --listen` at `address` (copy transport; `key_file` or none).
    KILN_EXECUTOR_CONNECT = 2,
    /// This process, with the host's `executor_callbacks` resolving undefined names and
    /// running `main`.
    KILN_EXECUTOR_CALLBACKS = 3,
}

/// How code bytes reach an executor process.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum kiln_transport {
    /// Shared memory (a memfd passed over a Unix socket).
    KILN_TRANSPORT_SHARED_MEMORY = 0,
    /// Bytes copied over the socket.
    KILN_TRANSPORT_COPY = 1,
}

/// Register modules with the GDB JIT interface (gdb, lldb).
pub const KILN_DEBUG_GDB: u32 = 1;
/// Write `/tmp/perf-<pid>.map`.
pub const KILN_DEBUG_PERF_MAP: u32 = 2;
/// Write a jitdump file for `perf inject --jit`.
pub const KILN_DEBUG_JITDUMP: u32 = 4;

/// Options of [`kiln_session_create`]. Fill with [`kiln_session_options_init`] first
/// (`kiln_session_options_init(&o, sizeof o)`), then change what you need. `size` says
/// which version of the struct the caller has: fields a later version adds take their
/// defaults for a caller built against an earlier header.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct kiln_session_options {
    /// `sizeof(kiln_session_options)` as the caller was compiled with (set by
    /// [`kiln_session_options_init`]).
    pub size: usize,
    /// Where the code runs (a `kiln_executor_kind` value).
    pub executor: u32,
    /// The `kiln-executor` binary for [`kiln_executor_kind::KILN_EXECUTOR_SPAWN`] (NULL:
    /// `kiln-executor` next to the running program).
    pub executor_path: *const c_char,
    /// `HOST:PORT` for [`kiln_executor_kind::KILN_EXECUTOR_CONNECT`].
    pub address: *const c_char,
    /// The executor's key file for CONNECT (NULL: plaintext, which only an executor
    /// started with `--no-auth` accepts).
    pub key_file: *const c_char,
    /// Transport for SPAWN (a `kiln_transport` value).
    pub transport: u32,
    /// `KILN_DEBUG_*` bits (default 0).
    pub debug: u32,
    /// Directory of the jitdump file (NULL: `$JITDUMPDIR`, else `~/.debug/jit`).
    pub jitdump_dir: *const c_char,
    /// Make modules' definitions visible to shared libraries loaded later (`-Wl,-E`).
    pub export_to_libraries: c_int,
    /// Run no code: no initializers, no finalizers.
    pub noexec: c_int,
    /// Memory-manager callbacks (NULL: Kiln's memory manager). Copied; the callbacks'
    /// `context` must stay valid until their `destroy` is called.
    pub memory: *const kiln_memory_callbacks,
    /// The object cache directory of [`kiln_add_source`] (NULL: no cache, every source
    /// compiled).
    pub cache_dir: *const c_char,
    /// For SPAWN: non-zero puts the executor in a sandbox before it runs anything (JIT
    /// code cannot `execve`, `ptrace`, `listen` or change the system; it reads files only
    /// beneath system directories and `sandbox_read`, writes only beneath
    /// `sandbox_write`). Default 0.
    pub sandbox: c_int,
    /// With `sandbox`: paths JIT code may also read (`sandbox_read_count` strings, or
    /// NULL).
    pub sandbox_read: *const *const c_char,
    /// How many strings `sandbox_read` holds.
    pub sandbox_read_count: usize,
    /// With `sandbox`: paths JIT code may read and write (`sandbox_write_count` strings,
    /// or NULL).
    pub sandbox_write: *const *const c_char,
    /// How many strings `sandbox_write` holds.
    pub sandbox_write_count: usize,
    /// For [`kiln_executor_kind::KILN_EXECUTOR_CALLBACKS`]: the host's callbacks (NULL
    /// otherwise). Copied; their `context` must stay valid until their `destroy` is
    /// called.
    pub executor_callbacks: *const crate::executor::kiln_executor_callbacks,
    /// The linked-image cache directory of [`kiln_link_cached`] (NULL: none; it then
    /// links as [`kiln_link`]). A directory no other user can write to, as `cache_dir`.
    /// Objects added to a session with an image cache are parsed by the link that needs
    /// them (a module mapped from its image reads none).
    pub image_cache_dir: *const c_char,
}

/// A JIT session: libraries of definitions, objects and archives linked into modules,
/// lookups, code run in this process or an executor.
pub struct kiln_session {
    pub(crate) jit: Jit,
    /// Libraries created and the resolvers of the whole session (added to every library),
    /// under one lock: a library created while a session resolver is added gets it.
    libraries: Mutex<(Vec<LibraryId>, Vec<Arc<CResolver>>)>,
}

/// A linked module. Holding it keeps its code; release it with [`kiln_module_release`].
pub struct kiln_module {
    pub(crate) module: Module,
}

pub(crate) fn cstr<'a>(p: *const c_char, what: &str) -> Result<&'a str, kiln_error> {
    if p.is_null() {
        return Err(kiln_error::invalid(format!("{what} is NULL")));
    }
    // SAFETY: the caller of the API passes a NUL-terminated string valid for the call.
    unsafe { CStr::from_ptr(p) }
        .to_str()
        .map_err(|_| kiln_error::invalid(format!("{what} is not UTF-8")))
}

fn opt_cstr<'a>(p: *const c_char, what: &str) -> Result<Option<&'a str>, kiln_error> {
    if p.is_null() {
        Ok(None)
    } else {
        cstr(p, what).map(Some)
    }
}

pub(crate) fn session<'a>(s: *const kiln_session) -> Result<&'a kiln_session, kiln_error> {
    // SAFETY: the caller passes NULL or a live session.
    unsafe { s.as_ref() }.ok_or_else(|| kiln_error::invalid("session is NULL"))
}

fn out<'a, T>(p: *mut T, what: &str) -> Result<&'a mut T, kiln_error> {
    // SAFETY: the caller passes NULL or a valid out-pointer.
    unsafe { p.as_mut() }.ok_or_else(|| kiln_error::invalid(format!("{what} is NULL")))
}

fn default_options() -> kiln_session_options {
    kiln_session_options {
        size: std::mem::size_of::<kiln_session_options>(),
        executor: kiln_executor_kind::KILN_EXECUTOR_IN_PROCESS as u32,
        executor_path: std::ptr::null(),
        address: std::ptr::null(),
        key_file: std::ptr::null(),
        transport: kiln_transport::KILN_TRANSPORT_SHARED_MEMORY as u32,
        debug: 0,
        jitdump_dir: std::ptr::null(),
        export_to_libraries: 0,
        noexec: 0,
        memory: std::ptr::null(),
        cache_dir: std::ptr::null(),
        sandbox: 0,
        sandbox_read: std::ptr::null(),
        sandbox_read_count: 0,
        sandbox_write: std::ptr::null(),
        sandbox_write_count: 0,
        executor_callbacks: std::ptr::null(),
        image_cache_dir: std::ptr::null(),
    }
}

/// `count` C strings at `list` as paths (NULL with a count of 0: none).
///
/// # Safety
/// `list` is NULL or points to `count` valid C strings.
unsafe fn paths(
    list: *const *const c_char,
    count: usize,
    what: &str,
) -> Result<Vec<std::path::PathBuf>, kiln_error> {
    if count == 0 {
        return Ok(Vec::new());
    }
    if list.is_null() {
        return Err(kiln_error::invalid(format!(
            "{what} is NULL with a count of {count}"
        )));
    }
    (0..count)
        .map(|i| {
            // SAFETY: the caller's contract: `count` readable pointers.
            let p = unsafe { *list.add(i) };
            cstr(p, what).map(std::path::PathBuf::from)
        })
        .collect()
}

/// Fills the caller's `size` bytes of `options` (`sizeof` of its struct) with the
/// defaults: in process, no debug output, Kiln's memory, no cache. Writes nothing beyond
/// `size` (a caller built against an earlier, smaller struct).
///
/// # Safety
/// `options` points to `size` writable bytes.
#[no_mangle]
pub unsafe extern "C" fn kiln_session_options_init(
    options: *mut kiln_session_options,
    size: usize,
) {
    if options.is_null() {
        return;
    }
    let mut defaults = default_options();
    let n = size.min(std::mem::size_of::<kiln_session_options>());
    defaults.size = n;
    // SAFETY: the caller's `size` writable bytes; at most the struct's.
    unsafe {
        std::ptr::copy_nonoverlapping(
            (&defaults as *const kiln_session_options).cast::<u8>(),
            options.cast::<u8>(),
            n,
        )
    };
}

/// The options a caller gave, its struct's missing tail (an earlier version) defaulted.
fn read_options(options: *const kiln_session_options) -> Result<kiln_session_options, kiln_error> {
    let mut all = default_options();
    if options.is_null() {
        return Ok(all);
    }
    // SAFETY: the caller's contract: at least `size` readable bytes, `size` first.
    let size = unsafe { std::ptr::read_unaligned(options.cast::<usize>()) };
    let full = std::mem::size_of::<kiln_session_options>();
    if size < std::mem::size_of::<usize>() || size > full {
        return Err(kiln_error::invalid(format!(
            "options.size is {size} (this library's kiln_session_options is {full} bytes): \
             initialize options with kiln_session_options_init(&o, sizeof o)"
        )));
    }
    // SAFETY: `size` readable bytes (the caller's contract), at most the struct's.
    unsafe {
        std::ptr::copy_nonoverlapping(
            options.cast::<u8>(),
            (&mut all as *mut kiln_session_options).cast::<u8>(),
            size,
        )
    };
    Ok(all)
}

/// Creates a session (`options` NULL: the defaults). On success `*session` is the new
/// session, to be disposed with [`kiln_session_dispose`].
///
/// # Safety
/// `options` is NULL or initialized by [`kiln_session_options_init`]; `session` is a valid
/// out-pointer; `error` is NULL or a valid out-pointer.
#[no_mangle]
pub unsafe extern "C" fn kiln_session_create(
    options: *const kiln_session_options,
    session: *mut *mut kiln_session,
    error: *mut *mut kiln_error,
) -> kiln_status {
    guard(error, || {
        let options = read_options(options)?;
        // The memory callbacks are taken first: from here on their `destroy` is called
        // exactly once, whether the session is made or not.
        // SAFETY: the caller's contract: NULL or valid callbacks.
        let memory = match unsafe { options.memory.as_ref() } {
            Some(callbacks) => Some(CallbackMemory::new(*callbacks)?),
            None => None,
        };
        // So are the executor callbacks.
        // SAFETY: the caller's contract: NULL or valid callbacks.
        let executor_callbacks = unsafe { options.executor_callbacks.as_ref() }
            .map(|callbacks| crate::executor::CallbackExecutor::new(*callbacks));
        let out = out(session, "session")?;
        check_options(&options)?;
        let timeouts = kiln::executor::Timeouts::default();
        let executor = match options.executor {
            0 => kiln::Executor::in_process(),
            1 => {
                let path = opt_cstr(options.executor_path, "executor_path")?
                    .map(std::path::PathBuf::from)
                    .unwrap_or_else(kiln::executor::default_executor_path);
                let transport = match options.transport {
                    0 => kiln::executor::Transport::SharedMemory,
                    1 => kiln::executor::Transport::Copy,
                    other => return Err(kiln_error::invalid(format!("transport {other}"))),
                };
                let sandbox = if options.sandbox != 0 {
                    Some(kiln::executor::Sandbox {
                        // SAFETY: the caller's contract for the options' string lists.
                        read: unsafe {
                            paths(
                                options.sandbox_read,
                                options.sandbox_read_count,
                                "sandbox_read",
                            )
                        }?,
                        // SAFETY: as above.
                        write: unsafe {
                            paths(
                                options.sandbox_write,
                                options.sandbox_write_count,
                                "sandbox_write",
                            )
                        }?,
                    })
                } else {
                    None
                };
                kiln::Executor::spawn_with(&path, transport, sandbox.as_ref(), timeouts)?
            }
            2 => {
                let address = cstr(options.address, "address")?;
                let key = match opt_cstr(options.key_file, "key_file")? {
                    Some(path) => Some(
                        kiln::executor::Key::read_file(std::path::Path::new(path))
                            .map_err(|e| kiln_error::invalid(e.to_string()))?,
                    ),
                    None => None,
                };
                kiln::Executor::connect_with_key(address, key.as_ref(), timeouts)?
            }
            3 => match executor_callbacks {
                Some(callbacks) => kiln::Executor::from_service(callbacks),
                None => {
                    return Err(kiln_error::invalid(
                        "KILN_EXECUTOR_CALLBACKS needs options.executor_callbacks",
                    ))
                }
            },
            other => return Err(kiln_error::invalid(format!("executor kind {other}"))),
        };
        let mut builder = Jit::builder()
            .executor(executor)
            .export_to_libraries(options.export_to_libraries != 0)
            .noexec(options.noexec != 0)
            .debug_support(kiln::debug::DebugSupport {
                gdb: options.debug & KILN_DEBUG_GDB != 0,
                perf_map: options.debug & KILN_DEBUG_PERF_MAP != 0,
                jitdump: options.debug & KILN_DEBUG_JITDUMP != 0,
                jitdump_dir: opt_cstr(options.jitdump_dir, "jitdump_dir")?.map(Into::into),
            });
        if let Some(memory) = memory {
            builder = builder.memory(memory);
        }
        if let Some(dir) = opt_cstr(options.image_cache_dir, "image_cache_dir")? {
            let images = kiln_cache::DiskImageCache::open(dir, kiln_cache::DiskLimits::default())
                .map_err(|e| kiln_error::new(kiln_status::KILN_ERR_IO, e.to_string()))?;
            builder = builder.image_cache(Arc::new(images));
        }
        if let Some(dir) = opt_cstr(options.cache_dir, "cache_dir")? {
            let disk = kiln_cache_disk(dir)?;
            builder = builder.object_cache(disk);
        }
        let jit = builder.build()?;
        let main = jit.main_library();
        let session = Box::new(kiln_session {
            jit,
            libraries: Mutex::new((vec![main], Vec::new())),
        });
        *out = Box::into_raw(session);
        Ok(())
    })
}

/// Options that contradict each other or that this library does not know are argument
/// errors, not ignored.
fn check_options(options: &kiln_session_options) -> Result<(), kiln_error> {
    let known = KILN_DEBUG_GDB | KILN_DEBUG_PERF_MAP | KILN_DEBUG_JITDUMP;
    if options.debug & !known != 0 {
        return Err(kiln_error::invalid(format!(
            "options.debug has unknown bits {:#x} (KILN_DEBUG_* are {known:#x})",
            options.debug & !known
        )));
    }
    let spawn = kiln_executor_kind::KILN_EXECUTOR_SPAWN as u32;
    let connect = kiln_executor_kind::KILN_EXECUTOR_CONNECT as u32;
    if !options.executor_path.is_null() && options.executor != spawn {
        return Err(kiln_error::invalid(
            "options.executor_path applies to KILN_EXECUTOR_SPAWN only",
        ));
    }
    let sandbox_paths = options.sandbox_read_count != 0 || options.sandbox_write_count != 0;
    if (options.sandbox != 0 || sandbox_paths) && options.executor != spawn {
        return Err(kiln_error::invalid(
            "options.sandbox applies to KILN_EXECUTOR_SPAWN only (start kiln-executor --listen --sandbox for CONNECT)",
        ));
    }
    if sandbox_paths && options.sandbox == 0 {
        return Err(kiln_error::invalid(
            "options.sandbox_read and sandbox_write need options.sandbox",
        ));
    }
    let callbacks = kiln_executor_kind::KILN_EXECUTOR_CALLBACKS as u32;
    if !options.executor_callbacks.is_null() && options.executor != callbacks {
        return Err(kiln_error::invalid(
            "options.executor_callbacks applies to KILN_EXECUTOR_CALLBACKS only",
        ));
    }
    if options.executor != connect && (!options.address.is_null() || !options.key_file.is_null()) {
        return Err(kiln_error::invalid(
            "options.address and options.key_file apply to KILN_EXECUTOR_CONNECT only",
        ));
    }
    Ok(())
}

fn kiln_cache_disk(dir: &str) -> Result<Arc<dyn kiln::cache::ObjectCache>, kiln_error> {
    kiln_cache::DiskCache::open(dir, kiln_cache::DiskLimits::default())
        .map(|c| Arc::new(c) as Arc<dyn kiln::cache::ObjectCache>)
        .map_err(|e| kiln_error::new(kiln_status::KILN_ERR_IO, e.to_string()))
}

/// Compiles a C or C++ source with the system compiler and `flags` (`count` of them),
/// through the session's object cache (`options.cache_dir`), and adds the object to
/// `library`. `*from_cache` (if not NULL) is set to 1 when the object came from the cache.
/// A source that does not compile is `KILN_ERR_COMPILE` with the compiler's message.
///
/// # Safety
/// `session` live; `path` a string; `flags` points to `count` strings.
#[no_mangle]
pub unsafe extern "C" fn kiln_add_source(
    session: *const kiln_session,
    library: u64,
    path: *const c_char,
    flags: *const *const c_char,
    count: usize,
    from_cache: *mut c_int,
    error: *mut *mut kiln_error,
) -> kiln_status {
    guard(error, || {
        let s = self::session(session)?;
        let path = cstr(path, "path")?;
        let flags: Vec<String> = slice(flags, count, "flags")?
            .iter()
            .map(|&f| cstr(f, "flag").map(str::to_string))
            .collect::<Result<_, _>>()?;
        let hit = s
            .jit
            .library(LibraryId::from_raw(library))
            .compile(path, &flags)
            .map(|c| c.from_cache)?;
        if !from_cache.is_null() {
            // SAFETY: a valid out-pointer (checked not NULL).
            unsafe { *from_cache = c_int::from(hit) };
        }
        Ok(())
    })
}

/// Disposes a session (NULL is ignored). Modules whose handles are still held stay
/// alive (and runnable) until released; the rest are freed, their finalizers run.
///
/// # Safety
/// `session` is NULL or a session from [`kiln_session_create`], disposed once, with no
/// other call on it running or to come.
#[no_mangle]
pub unsafe extern "C" fn kiln_session_dispose(session: *mut kiln_session) {
    if session.is_null() {
        return;
    }
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        // SAFETY: the caller's contract: made by Box::into_raw, disposed once.
        drop(unsafe { Box::from_raw(session) });
    }));
}

/// The library every session starts with.
///
/// # Safety
/// `session` is a live session.
#[no_mangle]
pub unsafe extern "C" fn kiln_main_library(session: *const kiln_session) -> u64 {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        // SAFETY: the caller's contract.
        match unsafe { session.as_ref() } {
            Some(s) => s.jit.main_library().to_raw(),
            None => 0,
        }
    }))
    .unwrap_or(0)
}

/// Creates a library named `name`; `*library` receives its id. An empty name, or the name
/// of a library the session has (`main` included), is `KILN_ERR_INVALID_ARGUMENT`.
///
/// # Safety
/// `session` live; `name` a string; `library` a valid out-pointer.
#[no_mangle]
pub unsafe extern "C" fn kiln_create_library(
    session: *const kiln_session,
    name: *const c_char,
    library: *mut u64,
    error: *mut *mut kiln_error,
) -> kiln_status {
    guard(error, || {
        let s = self::session(session)?;
        let name = cstr(name, "name")?;
        let out = out(library, "library")?;
        if name.is_empty() {
            return Err(kiln_error::invalid("the library's name is empty"));
        }
        let mut libraries = s.libraries.lock();
        // Under the lock: two threads creating one name cannot both succeed.
        for &existing in libraries.0.iter() {
            if s.jit.library(existing).name()? == name {
                return Err(kiln_error::invalid(format!(
                    "the session already has a library named '{name}'"
                )));
            }
        }
        let id = s.jit.create_library(name);
        libraries.0.push(id);
        for resolver in libraries.1.iter() {
            s.jit
                .library(id)
                .add(Input::Generator(Box::new(ResolverGenerator(
                    resolver.clone(),
                ))))?;
        }
        *out = id.to_raw();
        Ok(())
    })
}

/// Sets the libraries searched, in order, for what `library` does not define.
///
/// # Safety
/// `session` live; `order` points to `count` ids (may be NULL when `count` is 0).
#[no_mangle]
pub unsafe extern "C" fn kiln_set_search_order(
    session: *const kiln_session,
    library: u64,
    order: *const u64,
    count: usize,
    error: *mut *mut kiln_error,
) -> kiln_status {
    guard(error, || {
        let s = self::session(session)?;
        let order = slice(order, count, "order")?;
        let ids: Vec<LibraryId> = order.iter().map(|&r| LibraryId::from_raw(r)).collect();
        s.jit
            .library(LibraryId::from_raw(library))
            .set_search_order(&ids)?;
        Ok(())
    })
}

fn slice<'a, T>(p: *const T, n: usize, what: &str) -> Result<&'a [T], kiln_error> {
    if n == 0 {
        return Ok(&[]);
    }
    if p.is_null() {
        return Err(kiln_error::invalid(format!("{what} is NULL")));
    }
    // SAFETY: the caller passes `n` valid elements.
    Ok(unsafe { std::slice::from_raw_parts(p, n) })
}

/// Called when Kiln no longer needs bytes it was lent (from any thread, once).
pub type kiln_release_fn = Option<unsafe extern "C" fn(context: *mut c_void)>;

/// Bytes lent by the caller: valid and unchanged until `release` is called.
struct Lent {
    bytes: *const u8,
    len: usize,
    release: unsafe extern "C" fn(*mut c_void),
    context: *mut c_void,
}

// SAFETY: the API's contract: lent bytes are immutable until released, and `release` may
// be called from any thread.
unsafe impl Send for Lent {}
// SAFETY: as above; the bytes are only read.
unsafe impl Sync for Lent {}

impl AsRef<[u8]> for Lent {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: the lender's contract: `len` valid bytes until release.
        unsafe { std::slice::from_raw_parts(self.bytes, self.len) }
    }
}

impl Drop for Lent {
    fn drop(&mut self) {
        // SAFETY: the lender's callback, called once.
        unsafe { (self.release)(self.context) };
    }
}

/// Adds an object file's bytes to `library` (linked by the next link of the library).
/// With `release` NULL the bytes are copied; otherwise they are lent: Kiln reads them in
/// place until it calls `release(release_context)`: exactly once, from any thread, when
/// no link and no module needs them, or before returning if the call fails (the caller
/// must not change them before).
///
/// # Safety
/// `session` live; `name` a string; `bytes` valid for `size` bytes (for the call, or
/// until `release` when lent).
#[no_mangle]
pub unsafe extern "C" fn kiln_add_object(
    session: *const kiln_session,
    library: u64,
    name: *const c_char,
    bytes: *const c_void,
    size: usize,
    release: kiln_release_fn,
    release_context: *mut c_void,
    error: *mut *mut kiln_error,
) -> kiln_status {
    guard(error, || {
        let s = self::session(session)?;
        let name = cstr(name, "name")?;
        let lib = LibraryId::from_raw(library);
        if bytes.is_null() || size == 0 {
            if let Some(release) = release {
                // SAFETY: the lender's callback: called exactly once, also on failure.
                unsafe { release(release_context) };
            }
            return Err(kiln_error::invalid(if bytes.is_null() {
                "bytes is NULL"
            } else {
                "size is 0: no object"
            }));
        }
        match release {
            None => {
                let data = slice(bytes.cast::<u8>(), size, "bytes")?;
                s.jit.library(lib).add(Input::object(name, data.to_vec()))?;
            }
            Some(release) => {
                let lent = Lent {
                    bytes: bytes.cast(),
                    len: size,
                    release,
                    context: release_context,
                };
                s.jit
                    .library(lib)
                    .add(Input::object_shared(name, Arc::new(lent)))?;
            }
        }
        Ok(())
    })
}

/// Adds an object file (read now) to `library`.
///
/// # Safety
/// `session` live; `path` a string.
#[no_mangle]
pub unsafe extern "C" fn kiln_add_object_file(
    session: *const kiln_session,
    library: u64,
    path: *const c_char,
    error: *mut *mut kiln_error,
) -> kiln_status {
    guard(error, || {
        let s = self::session(session)?;
        let path = cstr(path, "path")?;
        s.jit
            .library(LibraryId::from_raw(library))
            .add(Input::object_file(path))?;
        Ok(())
    })
}

/// Adds a static archive's bytes (copied) to `library`: its members are linked when a
/// link needs what they define.
///
/// # Safety
/// `session` live; `name` a string; `bytes` valid for `size` bytes.
#[no_mangle]
pub unsafe extern "C" fn kiln_add_archive(
    session: *const kiln_session,
    library: u64,
    name: *const c_char,
    bytes: *const c_void,
    size: usize,
    error: *mut *mut kiln_error,
) -> kiln_status {
    guard(error, || {
        let s = self::session(session)?;
        let name = cstr(name, "name")?;
        if bytes.is_null() {
            return Err(kiln_error::invalid("bytes is NULL"));
        }
        if size == 0 {
            return Err(kiln_error::invalid("size is 0: no archive"));
        }
        let data = slice(bytes.cast::<u8>(), size, "bytes")?;
        s.jit
            .library(LibraryId::from_raw(library))
            .add(Input::archive(name, data.to_vec()))?;
        Ok(())
    })
}

/// Adds a static archive file (read now) to `library`.
///
/// # Safety
/// `session` live; `path` a string.
#[no_mangle]
pub unsafe extern "C" fn kiln_add_archive_file(
    session: *const kiln_session,
    library: u64,
    path: *const c_char,
    error: *mut *mut kiln_error,
) -> kiln_status {
    guard(error, || {
        let s = self::session(session)?;
        let path = cstr(path, "path")?;
        s.jit
            .library(LibraryId::from_raw(library))
            .add(Input::archive_file(path))?;
        Ok(())
    })
}

/// `-l name`: finds `libNAME.so` (following GNU ld scripts) or `libNAME.a` in `dirs`
/// (`count` of them, searched first) and the system's directories, as `ld` would.
///
/// # Safety
/// `session` live; `name` a string; `dirs` points to `count` strings.
#[no_mangle]
pub unsafe extern "C" fn kiln_add_library_by_name(
    session: *const kiln_session,
    library: u64,
    name: *const c_char,
    dirs: *const *const c_char,
    count: usize,
    error: *mut *mut kiln_error,
) -> kiln_status {
    guard(error, || {
        let s = self::session(session)?;
        let name = cstr(name, "name")?;
        let dirs: Vec<std::path::PathBuf> = slice(dirs, count, "dirs")?
            .iter()
            .map(|&d| cstr(d, "dir").map(std::path::PathBuf::from))
            .collect::<Result<_, _>>()?;
        s.jit
            .library(LibraryId::from_raw(library))
            .add(Input::library_by_name(name, &dirs))?;
        Ok(())
    })
}

/// Resolves what `library` does not define from the executor's process (this process's
/// symbols for the in-process executor).
///
/// # Safety
/// `session` live.
#[no_mangle]
pub unsafe extern "C" fn kiln_add_process_symbols(
    session: *const kiln_session,
    library: u64,
    error: *mut *mut kiln_error,
) -> kiln_status {
    guard(error, || {
        let s = self::session(session)?;
        s.jit
            .library(LibraryId::from_raw(library))
            .add(Input::ProcessSymbols)?;
        Ok(())
    })
}

/// Defines `name` at an absolute `address` in `library` (an error if it is defined; an
/// empty name is `KILN_ERR_INVALID_ARGUMENT`).
///
/// # Safety
/// `session` live; `name` a string.
#[no_mangle]
pub unsafe extern "C" fn kiln_define_symbol(
    session: *const kiln_session,
    library: u64,
    name: *const c_char,
    address: u64,
    error: *mut *mut kiln_error,
) -> kiln_status {
    guard(error, || {
        let s = self::session(session)?;
        let name = cstr(name, "name")?;
        if name.is_empty() {
            return Err(kiln_error::invalid("the symbol's name is empty"));
        }
        s.jit
            .library(LibraryId::from_raw(library))
            .define_symbol(name, address)?;
        Ok(())
    })
}

/// A symbol-resolution callback: stores the address of `name` in `*address` and returns
/// 1, or returns 0 if it does not know `name`. Called while a link resolves names, from
/// the linking thread (several threads at once for links into different libraries), with
/// the library's resolver lock held: it must not add to, link into or look up in the
/// library it resolves for. A name it resolved is not asked again.
pub type kiln_resolve_fn = Option<
    unsafe extern "C" fn(context: *mut c_void, name: *const c_char, address: *mut u64) -> c_int,
>;

/// A symbol resolver: the callback, its context, and what frees the context.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct kiln_resolver {
    /// Passed to `resolve` and `destroy`.
    pub context: *mut c_void,
    /// The callback (required).
    pub resolve: kiln_resolve_fn,
    /// Called exactly once when Kiln no longer needs the resolver, or before the call that
    /// was given it returns if that call fails (NULL: nothing to free).
    pub destroy: Option<unsafe extern "C" fn(context: *mut c_void)>,
}

struct CResolver(kiln_resolver);

// SAFETY: the API's contract: resolvers may be called from any thread.
unsafe impl Send for CResolver {}
// SAFETY: as above.
unsafe impl Sync for CResolver {}

impl Drop for CResolver {
    fn drop(&mut self) {
        if let Some(destroy) = self.0.destroy {
            // SAFETY: the resolver's own destructor, called once.
            unsafe { destroy(self.0.context) };
        }
    }
}

struct ResolverGenerator(Arc<CResolver>);

impl kiln::SymbolGenerator for ResolverGenerator {
    fn name(&self) -> String {
        "C resolver".into()
    }
    fn generate(&mut self, symbol: &str) -> Option<u64> {
        let resolve = self.0 .0.resolve?;
        let name = std::ffi::CString::new(symbol).ok()?;
        let mut address = 0u64;
        // SAFETY: the resolver's contract; valid name and out-pointer.
        let found = unsafe { resolve(self.0 .0.context, name.as_ptr(), &mut address) };
        (found != 0).then_some(address)
    }
}

fn checked_resolver(resolver: *const kiln_resolver) -> Result<Arc<CResolver>, kiln_error> {
    // SAFETY: the caller passes NULL or a valid resolver.
    let r = unsafe { resolver.as_ref() }.ok_or_else(|| kiln_error::invalid("resolver is NULL"))?;
    // From here its `destroy` is called exactly once, also on failure (CResolver's drop).
    let resolver = Arc::new(CResolver(*r));
    if r.resolve.is_none() {
        return Err(kiln_error::invalid("resolver.resolve is NULL"));
    }
    Ok(resolver)
}

/// Adds a resolver to `library`: asked, after the library's own definitions, the
/// libraries of its search order and its archives, for names nobody defines; resolvers
/// (and process symbols, `-l` libraries) are asked in the order they were added.
///
/// # Safety
/// `session` live; `resolver` valid (copied).
#[no_mangle]
pub unsafe extern "C" fn kiln_add_resolver(
    session: *const kiln_session,
    library: u64,
    resolver: *const kiln_resolver,
    error: *mut *mut kiln_error,
) -> kiln_status {
    guard(error, || {
        let s = self::session(session)?;
        let r = checked_resolver(resolver)?;
        s.jit
            .library(LibraryId::from_raw(library))
            .add(Input::Generator(Box::new(ResolverGenerator(r))))?;
        Ok(())
    })
}

/// Adds a resolver to every library of the session, those created later included (in
/// each, after what was added to it before).
///
/// # Safety
/// `session` live; `resolver` valid (copied).
#[no_mangle]
pub unsafe extern "C" fn kiln_add_session_resolver(
    session: *const kiln_session,
    resolver: *const kiln_resolver,
    error: *mut *mut kiln_error,
) -> kiln_status {
    guard(error, || {
        let s = self::session(session)?;
        let r = checked_resolver(resolver)?;
        let mut libraries = s.libraries.lock();
        for &lib in libraries.0.iter() {
            s.jit
                .library(lib)
                .add(Input::Generator(Box::new(ResolverGenerator(r.clone()))))?;
        }
        libraries.1.push(r);
        Ok(())
    })
}

/// Links what was added to `library` since its last link into a module, registers its
/// unwind information and runs its initializers. `*module` receives the module's handle
/// (NULL if there was nothing to link); pass `module` NULL to keep none (the module then
/// lives in the library until removed with the session). On failure the library is as
/// before: the objects of the failed link are dropped.
///
/// # Safety
/// `session` live; `module` NULL or a valid out-pointer.
#[no_mangle]
pub unsafe extern "C" fn kiln_link(
    session: *const kiln_session,
    library: u64,
    module: *mut *mut kiln_module,
    error: *mut *mut kiln_error,
) -> kiln_status {
    guard(error, || {
        let s = self::session(session)?;
        let linked = s.jit.link_pending(LibraryId::from_raw(library))?;
        if !module.is_null() {
            let handle = linked.map_or(std::ptr::null_mut(), |(m, _)| {
                Box::into_raw(Box::new(kiln_module { module: m }))
            });
            // SAFETY: a valid out-pointer (checked not NULL).
            unsafe { *module = handle };
        }
        Ok(())
    })
}

/// [`kiln_link`] through the session's image cache (`options.image_cache_dir`): if the
/// cache holds an image under this key, the module is mapped from it — no link, its code
/// pages shared with every process that maps the same image (copied into an executor
/// process's memory, out of process), only the fields that depend on the process
/// written — and published as a link would; else what is pending is linked and its image
/// stored. A session whose executor is reached over TCP links as [`kiln_link`] does (its
/// executor's mapped files cannot be keyed). `*mapped` (if not NULL) is set to 1 when the module was
/// mapped, 0 when it was linked.
///
/// `key` (`key_len` bytes) must name everything the link reads that can change: the
/// objects' contents (or the source and compiler that made them), the options, the
/// modules linked earlier in the session whose definitions this link uses. Kiln adds its
/// own version, the target, every file the session read an input from, every file
/// mapped in this process (the linker's libraries, inputs mapped by the caller), and for
/// an executor process every file mapped there (the shared libraries host symbols come
/// from). A key that
/// leaves an input out maps a stale image. While one of those files changed within the
/// last two seconds (a just-built program, a just-written object), no image is stored:
/// its times may not tell a second change within the same clock tick.
///
/// # Safety
/// `session` live; `key` points to `key_len` readable bytes; `module` and `mapped` NULL
/// or valid out-pointers.
#[no_mangle]
pub unsafe extern "C" fn kiln_link_cached(
    session: *const kiln_session,
    library: u64,
    key: *const u8,
    key_len: usize,
    module: *mut *mut kiln_module,
    mapped: *mut c_int,
    error: *mut *mut kiln_error,
) -> kiln_status {
    guard(error, || {
        let s = self::session(session)?;
        let bytes = slice(key, key_len, "key")?;
        let mut builder =
            kiln::cache::ImageKeyBuilder::new(concat!("kiln C API ", env!("CARGO_PKG_VERSION")));
        builder.bytes("client key", bytes);
        // A link that cannot be keyed (an executor reached over TCP: its mapped files
        // cannot be read) runs as kiln_link's, as does one whose key is unsettled (a file
        // changed within the last seconds): a cache that cannot be used fails no link.
        let keyed =
            s.jit.add_image_key_inputs(&mut builder).is_ok() && builder.unsettled().is_none();
        let library = LibraryId::from_raw(library);
        let linked = if keyed {
            s.jit.link_pending_cached(library, &builder.finish())?
        } else {
            s.jit.link_pending(library)?
        };
        if !mapped.is_null() {
            let was_mapped = linked.as_ref().is_some_and(|(_, report)| {
                matches!(report.image, Some(kiln::cache::ImageOutcome::Mapped { .. }))
            });
            // SAFETY: a valid out-pointer (checked not NULL).
            unsafe { *mapped = c_int::from(was_mapped) };
        }
        if !module.is_null() {
            let handle = linked.map_or(std::ptr::null_mut(), |(m, _)| {
                Box::into_raw(Box::new(kiln_module { module: m }))
            });
            // SAFETY: a valid out-pointer (checked not NULL).
            unsafe { *module = handle };
        }
        Ok(())
    })
}

/// The address of `name` as `library` sees it (linking what is pending first if the
/// name is not yet defined).
///
/// # Safety
/// `session` live; `name` a string; `address` a valid out-pointer.
#[no_mangle]
pub unsafe extern "C" fn kiln_lookup(
    session: *const kiln_session,
    library: u64,
    name: *const c_char,
    address: *mut u64,
    error: *mut *mut kiln_error,
) -> kiln_status {
    guard(error, || {
        let s = self::session(session)?;
        let name = cstr(name, "name")?;
        let out = out(address, "address")?;
        *out = s.jit.lookup(LibraryId::from_raw(library), name)?;
        Ok(())
    })
}

/// [`kiln_lookup`] of `count` names at once into `addresses`; an error names the first
/// name not found (and `addresses` is then unspecified).
///
/// # Safety
/// `session` live; `names` points to `count` strings, `addresses` to `count` slots.
#[no_mangle]
pub unsafe extern "C" fn kiln_lookup_many(
    session: *const kiln_session,
    library: u64,
    names: *const *const c_char,
    count: usize,
    addresses: *mut u64,
    error: *mut *mut kiln_error,
) -> kiln_status {
    guard(error, || {
        let s = self::session(session)?;
        let names: Vec<&str> = slice(names, count, "names")?
            .iter()
            .map(|&n| cstr(n, "name"))
            .collect::<Result<_, _>>()?;
        if count > 0 && addresses.is_null() {
            return Err(kiln_error::invalid("addresses is NULL"));
        }
        let found = s.jit.lookup_many(LibraryId::from_raw(library), &names)?;
        for (i, a) in found.into_iter().enumerate() {
            // SAFETY: the caller's contract: `count` slots.
            unsafe { *addresses.add(i) = a };
        }
        Ok(())
    })
}

/// Calls `int main(int, char **, char **)` of `library` with `argv` (`argc` strings);
/// `*status` receives main's status. A program's `exit(n)` ends this process (in
/// process) or the executor (out of process, reported as an error). A negative `argc`,
/// or `argv` NULL with `argc` above 0, is `KILN_ERR_INVALID_ARGUMENT`.
///
/// # Safety
/// `session` live; `argv` points to `argc` strings; `main` of `library` must be a C
/// `main` (calling JIT code is only as safe as that code).
#[no_mangle]
pub unsafe extern "C" fn kiln_run_main(
    session: *const kiln_session,
    library: u64,
    argc: c_int,
    argv: *const *const c_char,
    status: *mut c_int,
    error: *mut *mut kiln_error,
) -> kiln_status {
    guard(error, || {
        let s = self::session(session)?;
        let out = out(status, "status")?;
        let argc = usize::try_from(argc)
            .map_err(|_| kiln_error::invalid(format!("argc is {argc}: negative")))?;
        // The arguments' bytes as they are (not necessarily UTF-8).
        let args: Vec<std::ffi::OsString> = slice(argv, argc, "argv")?
            .iter()
            .map(|&a| {
                if a.is_null() {
                    return Err(kiln_error::invalid("argv[i] is NULL".to_string()));
                }
                // SAFETY: a NUL-terminated string (the caller's contract for argv).
                let bytes = unsafe { std::ffi::CStr::from_ptr(a) }.to_bytes();
                Ok(
                    <std::ffi::OsStr as std::os::unix::ffi::OsStrExt>::from_bytes(bytes)
                        .to_os_string(),
                )
            })
            .collect::<Result<_, _>>()?;
        // SAFETY: the caller's contract: `main` is a C main.
        *out = unsafe { s.jit.run_main(LibraryId::from_raw(library), &args) }?;
        Ok(())
    })
}

/// Removes a module from its library: its definitions leave the library, its finalizers
/// run; its memory goes when its last handle is released. Refused
/// (`KILN_ERR_MODULE_IN_USE`, naming them) while other live modules use it. `module`
/// stays a valid handle: release it with [`kiln_module_release`].
///
/// # Safety
/// `session` live; `module` a live handle.
#[no_mangle]
pub unsafe extern "C" fn kiln_remove_module(
    session: *const kiln_session,
    module: *const kiln_module,
    error: *mut *mut kiln_error,
) -> kiln_status {
    guard(error, || {
        let s = self::session(session)?;
        // SAFETY: the caller's contract.
        let m = unsafe { module.as_ref() }.ok_or_else(|| kiln_error::invalid("module is NULL"))?;
        s.jit.remove_module(&m.module)?;
        Ok(())
    })
}

/// Releases a module handle (NULL is ignored). The module lives on in its library until
/// removed.
///
/// # Safety
/// `module` is NULL or a handle from this library, released once.
#[no_mangle]
pub unsafe extern "C" fn kiln_module_release(module: *mut kiln_module) {
    if !module.is_null() {
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            // SAFETY: the caller's contract: made by Box::into_raw, released once.
            drop(unsafe { Box::from_raw(module) });
        }));
    }
}

/// The address of a global symbol the module defines, or 0.
///
/// # Safety
/// `module` a live handle; `name` a string.
#[no_mangle]
pub unsafe extern "C" fn kiln_module_symbol(
    module: *const kiln_module,
    name: *const c_char,
) -> u64 {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        // SAFETY: the caller's contract.
        let Some(m) = (unsafe { module.as_ref() }) else {
            return 0;
        };
        let Ok(name) = cstr(name, "name") else {
            return 0;
        };
        m.module.symbol(name).unwrap_or(0)
    }))
    .unwrap_or(0)
}

/// Memory figures of a session.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct kiln_memory_stats {
    /// Live allocations.
    pub live_allocations: u64,
    /// Bytes the live allocations asked for.
    pub bytes_requested: u64,
    /// Bytes they occupy.
    pub bytes_allocated: u64,
    /// Address space reserved.
    pub bytes_reserved: u64,
    /// Bytes of pages mapped and accessible.
    pub bytes_mapped: u64,
    /// Bytes resident, or `UINT64_MAX` if unknown.
    pub bytes_resident: u64,
    /// Number of slabs (reservations).
    pub slabs: u64,
}

/// Fills `*stats` with the session's memory figures.
///
/// # Safety
/// `session` live; `stats` a valid out-pointer.
#[no_mangle]
pub unsafe extern "C" fn kiln_session_memory_stats(
    session: *const kiln_session,
    stats: *mut kiln_memory_stats,
    error: *mut *mut kiln_error,
) -> kiln_status {
    guard(error, || {
        let s = self::session(session)?;
        let out = out(stats, "stats")?;
        let m = s.jit.memory_stats();
        *out = kiln_memory_stats {
            live_allocations: m.live_allocations,
            bytes_requested: m.bytes_requested,
            bytes_allocated: m.bytes_allocated,
            bytes_reserved: m.bytes_reserved,
            bytes_mapped: m.bytes_mapped,
            bytes_resident: m.bytes_resident.unwrap_or(u64::MAX),
            slabs: m.slabs,
        };
        Ok(())
    })
}
