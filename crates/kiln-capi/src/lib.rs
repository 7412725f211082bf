//! # kiln-capi
//!
//! Kiln's C API: `include/kiln.h` (generated from this crate by cbindgen), a shared
//! library (`libkiln_capi.so`) and a static one (`libkiln_capi.a`). See the header's
//! opening comment for the conventions every function follows (status codes, error
//! objects, no panics across the boundary, borrowed strings), and `scripts/install_capi.sh`
//! for installing it with a pkg-config file.
//!
//! ```c
//! kiln_session *s;
//! kiln_error *e = NULL;
//! if (kiln_session_create(NULL, &s, &e) != KILN_OK) { puts(kiln_error_message(e)); kiln_error_free(e); return 1; }
//! uint64_t lib = kiln_main_library(s);
//! kiln_add_object_file(s, lib, "prog.o", &e);
//! kiln_add_process_symbols(s, lib, &e);
//! uint64_t f;
//! kiln_lookup(s, lib, "f", &f, &e);
//! int (*fp)(int) = (int (*)(int))(uintptr_t)f;
//! kiln_session_dispose(s);
//! ```

#![allow(non_camel_case_types)]
// Errors wrap link errors, which are large by design (see kiln-link).
#![allow(clippy::result_large_err)]

pub mod error;
pub mod executor;
pub mod lazy;
pub mod listener;
#[cfg(feature = "llvm")]
pub mod llvm;
pub mod memory;
pub mod session;

use std::ffi::c_char;

/// Kiln's version, as a static string ("0.1.0").
#[no_mangle]
pub extern "C" fn kiln_version() -> *const c_char {
    concat!(env!("CARGO_PKG_VERSION"), "\0").as_ptr().cast()
}
