//! Lazy functions and hot swap: stubs compiled on first call, bodies replaced while the
//! code runs, and the threads that call such code (Kiln's `Jit::add_lazy_functions`,
//! `Jit::replace_function`, `Jit::register_thread`, `Jit::reclaim`).

use crate::error::kiln_status;
use crate::error::{guard, kiln_error};
use crate::session::{cstr, kiln_module, kiln_release_fn, kiln_session, session};
use kiln::{
    lazy::{CodeGuard, CodeThread, CompileError, LazyCompiler},
    LibraryId,
};
use std::ffi::{c_char, c_int, c_void};
use std::sync::Arc;

/// What a [`kiln_compile_fn`] hands back. On success `bytes` and `size` are the ELF
/// relocatable object that defines the function; on failure `error` may say why (NULL:
/// "the compiler failed"). Kiln copies what it needs from it, then calls
/// `release(release_context)` if `release` is not NULL (from the same thread, before the
/// call that asked returns).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct kiln_compiled {
    /// The object's bytes (success).
    pub bytes: *const c_void,
    /// Their size.
    pub size: usize,
    /// Why the compile failed (failure; a string, or NULL).
    pub error: *const c_char,
    /// Called once Kiln copied `bytes` or `error` (NULL: nothing to release).
    pub release: kiln_release_fn,
    /// Passed to `release`.
    pub release_context: *mut c_void,
}

/// Compiles the lazy function `name`: fills `*compiled` and returns 1, or returns 0 on
/// failure. Called on the function's first call, from the calling thread, with no Kiln
/// lock held (it may link into other libraries of the session); calls meanwhile from
/// other threads wait for it. A failure sends the function's calls to a fallback that
/// returns 0 until [`kiln_replace_function`] gives it a body.
pub type kiln_compile_fn = Option<
    unsafe extern "C" fn(
        context: *mut c_void,
        name: *const c_char,
        compiled: *mut kiln_compiled,
    ) -> c_int,
>;

/// A lazy-function compiler: the callback, its context, and what frees the context.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct kiln_lazy_compiler {
    /// Passed to `compile` and `destroy`.
    pub context: *mut c_void,
    /// The callback (required).
    pub compile: kiln_compile_fn,
    /// Called exactly once when Kiln no longer needs the compiler, or before the call that
    /// was given it returns if that call fails (NULL: nothing to free).
    pub destroy: Option<unsafe extern "C" fn(context: *mut c_void)>,
}

struct CCompiler(kiln_lazy_compiler);

// SAFETY: the API's contract: a compiler may be called from any thread.
unsafe impl Send for CCompiler {}
// SAFETY: as above.
unsafe impl Sync for CCompiler {}

impl Drop for CCompiler {
    fn drop(&mut self) {
        if let Some(destroy) = self.0.destroy {
            // SAFETY: the compiler's own destructor, called once.
            unsafe { destroy(self.0.context) };
        }
    }
}

impl LazyCompiler for CCompiler {
    fn compile(&self, name: &str) -> Result<Vec<u8>, CompileError> {
        let compile = self
            .0
            .compile
            .ok_or("the compiler has no compile callback")?;
        let c_name = std::ffi::CString::new(name)?;
        let mut out = kiln_compiled {
            bytes: std::ptr::null(),
            size: 0,
            error: std::ptr::null(),
            release: None,
            release_context: std::ptr::null_mut(),
        };
        // SAFETY: the compiler's contract; a valid name and out-pointer.
        let ok = unsafe { compile(self.0.context, c_name.as_ptr(), &mut out) } != 0;
        let result = if !ok {
            let why = if out.error.is_null() {
                "the compiler failed".to_string()
            } else {
                // SAFETY: the compiler's contract: a NUL-terminated string until released.
                unsafe { std::ffi::CStr::from_ptr(out.error) }
                    .to_string_lossy()
                    .into_owned()
            };
            Err(why.into())
        } else if out.bytes.is_null() || out.size == 0 {
            Err(format!("the compiler returned no object for {name}").into())
        } else {
            // SAFETY: the compiler's contract: `size` valid bytes until released.
            Ok(unsafe { std::slice::from_raw_parts(out.bytes.cast::<u8>(), out.size) }.to_vec())
        };
        if let Some(release) = out.release {
            // SAFETY: the compiler's release callback, called once.
            unsafe { release(out.release_context) };
        }
        result
    }
}

/// Adds lazy functions `names[0..count]` to `library`: each name is defined at once by a
/// stub, and its first call asks `compiler` for an object defining it, links that object
/// into the library and continues into the body (later calls go straight there). Other
/// names of the objects resolve as the library resolves names. `*stubs` receives the
/// stubs' module (NULL: keep none); `compiler` is copied, its `destroy` called when the
/// stubs are gone, or before returning on failure.
///
/// # Safety
/// `session` live; `names` valid for `count` strings; `compiler` valid; `stubs` NULL or a
/// valid out-pointer.
#[no_mangle]
pub unsafe extern "C" fn kiln_add_lazy_functions(
    session: *const kiln_session,
    library: u64,
    names: *const *const c_char,
    count: usize,
    compiler: *const kiln_lazy_compiler,
    stubs: *mut *mut kiln_module,
    error: *mut *mut kiln_error,
) -> kiln_status {
    guard(error, || {
        // SAFETY: the caller passes NULL or a valid compiler.
        let c =
            unsafe { compiler.as_ref() }.ok_or_else(|| kiln_error::invalid("compiler is NULL"))?;
        // From here `destroy` is called exactly once, also on failure (CCompiler's drop).
        let compiler = Arc::new(CCompiler(*c));
        if c.compile.is_none() {
            return Err(kiln_error::invalid("compiler.compile is NULL"));
        }
        let s = self::session(session)?;
        if names.is_null() || count == 0 {
            return Err(kiln_error::invalid(
                "no names (names is NULL or count is 0)",
            ));
        }
        // SAFETY: the caller's contract: `count` valid pointers.
        let pointers = unsafe { std::slice::from_raw_parts(names, count) };
        let names: Vec<&str> = pointers
            .iter()
            .enumerate()
            .map(|(i, &p)| cstr(p, &format!("names[{i}]")))
            .collect::<Result<_, _>>()?;
        let module = s
            .jit
            .add_lazy_functions(LibraryId::from_raw(library), &names, compiler)?;
        if !stubs.is_null() {
            // SAFETY: the caller passes NULL or a valid out-pointer.
            unsafe { *stubs = Box::into_raw(Box::new(kiln_module { module })) };
        }
        Ok(())
    })
}

/// Gives the lazy function `name` of `library` a new body, linked from the object
/// `bytes[0..size]` (copied), which must define `name`: calls that reach the stub after
/// this returns run it. The old body is freed once no thread pinned before this call
/// ([`kiln_code_thread_pin`]) is still pinned — threads that may be running the old body
/// must be pinned while they do. `*address` receives the new body's address (NULL: not
/// wanted). On failure the old body stays.
///
/// # Safety
/// `session` live; `name` a string; `bytes` valid for `size` bytes; `address` NULL or a
/// valid out-pointer.
#[no_mangle]
pub unsafe extern "C" fn kiln_replace_function(
    session: *const kiln_session,
    library: u64,
    name: *const c_char,
    bytes: *const c_void,
    size: usize,
    address: *mut u64,
    error: *mut *mut kiln_error,
) -> kiln_status {
    guard(error, || {
        let s = self::session(session)?;
        let name = cstr(name, "name")?;
        // SAFETY: the caller's contract: `size` valid bytes for the call.
        let object = unsafe { object(bytes, size) }?;
        let body = s
            .jit
            .replace_function(LibraryId::from_raw(library), name, object.to_vec())?;
        if !address.is_null() {
            // SAFETY: the caller passes NULL or a valid out-pointer.
            unsafe { *address = body };
        }
        Ok(())
    })
}

/// Links the object `bytes[0..size]` (copied) into `library` at once, with every function
/// it defines (default or protected visibility) reached through a call-through stub — by
/// the object's own calls too — so that [`kiln_replace_function`] can give any of them a
/// new body later (a plainly linked function is called straight and cannot be replaced).
/// `*stubs` and `*module` receive the stubs' module and the object's module (NULL: keep
/// none); remove the stubs first, then the module. On failure nothing is published.
///
/// # Safety
/// `session` live; `name` a string; `bytes` valid for `size` bytes; `stubs` and `module`
/// NULL or valid out-pointers.
#[no_mangle]
pub unsafe extern "C" fn kiln_link_swappable(
    session: *const kiln_session,
    library: u64,
    name: *const c_char,
    bytes: *const c_void,
    size: usize,
    stubs: *mut *mut kiln_module,
    module: *mut *mut kiln_module,
    error: *mut *mut kiln_error,
) -> kiln_status {
    guard(error, || {
        let s = self::session(session)?;
        let name = cstr(name, "name")?;
        // SAFETY: the caller's contract: `size` valid bytes for the call.
        let object = unsafe { object(bytes, size) }?;
        let linked = s
            .jit
            .link_swappable(LibraryId::from_raw(library), name, object.to_vec())?;
        for (out, handle) in [(stubs, linked.stubs), (module, linked.module)] {
            if !out.is_null() {
                // SAFETY: the caller passes NULL or a valid out-pointer.
                unsafe { *out = Box::into_raw(Box::new(kiln_module { module: handle })) };
            }
        }
        Ok(())
    })
}

/// The object `bytes[0..size]` a call was given; an error if there is none.
///
/// # Safety
/// `bytes` NULL or valid for `size` bytes for as long as the answer is used.
unsafe fn object<'a>(bytes: *const c_void, size: usize) -> Result<&'a [u8], kiln_error> {
    if bytes.is_null() || size == 0 {
        return Err(kiln_error::invalid(
            "no object (bytes is NULL or size is 0)",
        ));
    }
    // SAFETY: the caller's contract: `size` valid bytes.
    Ok(unsafe { std::slice::from_raw_parts(bytes.cast::<u8>(), size) })
}

/// Frees the replaced bodies no pinned thread can reach any more (replacements do this as
/// they go); `*retired` receives how many are still kept (NULL: not wanted).
///
/// # Safety
/// `session` live; `retired` NULL or a valid out-pointer.
#[no_mangle]
pub unsafe extern "C" fn kiln_reclaim(
    session: *const kiln_session,
    retired: *mut usize,
    error: *mut *mut kiln_error,
) -> kiln_status {
    guard(error, || {
        let s = self::session(session)?;
        let left = s.jit.reclaim();
        if !retired.is_null() {
            // SAFETY: the caller passes NULL or a valid out-pointer.
            unsafe { *retired = left };
        }
        Ok(())
    })
}

/// A thread registered to call code whose bodies may be replaced. Used only by the thread
/// that registered it; release it with [`kiln_code_thread_release`] (after its pins).
pub struct kiln_code_thread {
    thread: CodeThread,
}

/// A pin of a [`kiln_code_thread`]: while it is held, no body that thread can reach is
/// freed. Release it with [`kiln_code_thread_unpin`], on the same thread.
pub struct kiln_code_pin {
    _guard: CodeGuard,
}

/// Registers the calling thread with the session's code reclamation: `*thread` receives
/// its handle.
///
/// # Safety
/// `session` live; `thread` a valid out-pointer.
#[no_mangle]
pub unsafe extern "C" fn kiln_code_thread_register(
    session: *const kiln_session,
    thread: *mut *mut kiln_code_thread,
    error: *mut *mut kiln_error,
) -> kiln_status {
    guard(error, || {
        let s = self::session(session)?;
        if thread.is_null() {
            return Err(kiln_error::invalid("thread is NULL"));
        }
        let handle = Box::new(kiln_code_thread {
            thread: s.jit.register_thread(),
        });
        // SAFETY: checked not NULL; the caller passes a valid out-pointer.
        unsafe { *thread = Box::into_raw(handle) };
        Ok(())
    })
}

/// Pins `thread` (call on the thread that registered it) around calls into code whose
/// bodies may be replaced; returns the pin (NULL if `thread` is NULL).
///
/// # Safety
/// `thread` NULL or a live handle of the calling thread.
#[no_mangle]
pub unsafe extern "C" fn kiln_code_thread_pin(
    thread: *const kiln_code_thread,
) -> *mut kiln_code_pin {
    // SAFETY: the caller passes NULL or a live handle.
    let Some(thread) = (unsafe { thread.as_ref() }) else {
        return std::ptr::null_mut();
    };
    Box::into_raw(Box::new(kiln_code_pin {
        _guard: thread.thread.pin(),
    }))
}

/// Releases a pin (NULL: nothing), on the thread that took it.
///
/// # Safety
/// `pin` NULL or a live pin of the calling thread, not used after.
#[no_mangle]
pub unsafe extern "C" fn kiln_code_thread_unpin(pin: *mut kiln_code_pin) {
    if !pin.is_null() {
        // SAFETY: made by Box::into_raw in kiln_code_thread_pin, freed once.
        drop(unsafe { Box::from_raw(pin) });
    }
}

/// Unregisters a thread (NULL: nothing), on the thread that registered it, once its pins
/// are released.
///
/// # Safety
/// `thread` NULL or a live handle of the calling thread with no pin held, not used after.
#[no_mangle]
pub unsafe extern "C" fn kiln_code_thread_release(thread: *mut kiln_code_thread) {
    if !thread.is_null() {
        // SAFETY: made by Box::into_raw in kiln_code_thread_register, freed once.
        drop(unsafe { Box::from_raw(thread) });
    }
}
