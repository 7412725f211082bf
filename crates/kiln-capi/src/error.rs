//! Errors: a status code for every fallible call, and an error object with its message.

use std::ffi::{c_char, CString};

/// What a fallible call returns.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum kiln_status {
    /// Success.
    KILN_OK = 0,
    /// A NULL pointer, a string that is not UTF-8, an unknown library id, a contradictory
    /// option.
    KILN_ERR_INVALID_ARGUMENT = 1,
    /// A file could not be read.
    KILN_ERR_IO = 2,
    /// A malformed or unsupported object or archive, or a link that failed.
    KILN_ERR_LINK = 3,
    /// A symbol nobody defines (in a link or a lookup).
    KILN_ERR_UNDEFINED_SYMBOL = 4,
    /// A name defined twice in one library.
    KILN_ERR_REDEFINITION = 5,
    /// A module other live modules still use.
    KILN_ERR_MODULE_IN_USE = 6,
    /// Memory could not be allocated (including a memory callback's failure).
    KILN_ERR_MEMORY = 7,
    /// The executor (this process's runtime or a remote one) failed.
    KILN_ERR_EXECUTOR = 8,
    /// A library (`-l`) was not found or could not be loaded.
    KILN_ERR_LIBRARY = 9,
    /// A panic inside Kiln, contained.
    KILN_ERR_PANIC = 10,
    /// A source did not compile (the compiler's message).
    KILN_ERR_COMPILE = 11,
}

/// An error: its status and message. Free it with [`kiln_error_free`].
#[derive(Debug)]
pub struct kiln_error {
    pub(crate) status: kiln_status,
    pub(crate) message: CString,
}

impl kiln_error {
    pub(crate) fn new(status: kiln_status, message: impl Into<String>) -> Self {
        let message = message.into().replace('\0', " ");
        kiln_error {
            status,
            message: CString::new(message).unwrap_or_default(),
        }
    }

    pub(crate) fn invalid(message: impl Into<String>) -> Self {
        Self::new(kiln_status::KILN_ERR_INVALID_ARGUMENT, message)
    }
}

impl From<kiln::Error> for kiln_error {
    fn from(error: kiln::Error) -> Self {
        // Matched on the kind, exhaustively: a new kind of error needs a status here.
        use kiln::ErrorKind as K;
        let status = match error.kind() {
            K::UndefinedSymbol => kiln_status::KILN_ERR_UNDEFINED_SYMBOL,
            K::Memory => kiln_status::KILN_ERR_MEMORY,
            K::Link => kiln_status::KILN_ERR_LINK,
            K::Io => kiln_status::KILN_ERR_IO,
            K::Library => kiln_status::KILN_ERR_LIBRARY,
            K::Executor | K::Unsupported => kiln_status::KILN_ERR_EXECUTOR,
            K::InvalidArgument => kiln_status::KILN_ERR_INVALID_ARGUMENT,
            K::Redefinition => kiln_status::KILN_ERR_REDEFINITION,
            K::Compile => kiln_status::KILN_ERR_COMPILE,
            K::ModuleInUse => kiln_status::KILN_ERR_MODULE_IN_USE,
        };
        kiln_error::new(status, error.to_string())
    }
}

/// The error's status.
///
/// # Safety
/// `error` is NULL or an error from this library not yet freed.
#[no_mangle]
pub unsafe extern "C" fn kiln_error_status(error: *const kiln_error) -> kiln_status {
    // SAFETY: the caller's contract.
    match unsafe { error.as_ref() } {
        Some(e) => e.status,
        None => kiln_status::KILN_OK,
    }
}

/// The error's message: valid until the error is freed ("" for NULL).
///
/// # Safety
/// `error` is NULL or an error from this library not yet freed.
#[no_mangle]
pub unsafe extern "C" fn kiln_error_message(error: *const kiln_error) -> *const c_char {
    // SAFETY: the caller's contract.
    match unsafe { error.as_ref() } {
        Some(e) => e.message.as_ptr(),
        None => c"".as_ptr(),
    }
}

/// Frees an error (NULL is ignored).
///
/// # Safety
/// `error` is NULL or an error from this library, freed once.
#[no_mangle]
pub unsafe extern "C" fn kiln_error_free(error: *mut kiln_error) {
    if !error.is_null() {
        // SAFETY: the caller's contract: made by Box::into_raw in `fail`, freed once.
        drop(unsafe { Box::from_raw(error) });
    }
}

/// Runs `f`, containing panics; on failure stores the error in `*out` (if not NULL) and
/// returns its status.
pub(crate) fn guard(
    out: *mut *mut kiln_error,
    f: impl FnOnce() -> Result<(), kiln_error>,
) -> kiln_status {
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or_else(|p| {
        let message = p
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| p.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "panic".into());
        Err(kiln_error::new(
            kiln_status::KILN_ERR_PANIC,
            format!("a panic inside Kiln: {message}"),
        ))
    });
    match result {
        Ok(()) => kiln_status::KILN_OK,
        Err(error) => {
            let status = error.status;
            if !out.is_null() {
                // SAFETY: the caller passes NULL or a valid `kiln_error **`.
                unsafe { *out = Box::into_raw(Box::new(error)) };
            }
            status
        }
    }
}
