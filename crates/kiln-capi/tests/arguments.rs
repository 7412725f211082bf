//! Argument errors of the C API, called as C would call it (through the exported
//! functions): each is `KILN_ERR_INVALID_ARGUMENT` with a message that names the argument,
//! never `KILN_OK`, and the session stays usable.

use kiln_capi::error::{kiln_error, kiln_error_free, kiln_error_message, kiln_status};
use kiln_capi::session::*;
use std::ffi::{c_char, c_int, CStr};
use std::ptr::{null, null_mut};

struct Session(*mut kiln_session);

impl Drop for Session {
    fn drop(&mut self) {
        // SAFETY: a session made by kiln_session_create, disposed once.
        unsafe { kiln_session_dispose(self.0) };
    }
}

fn session() -> Session {
    let mut s = null_mut();
    let mut e = null_mut();
    // SAFETY: default options; valid out-pointers.
    let status = unsafe { kiln_session_create(null(), &mut s, &mut e) };
    assert_eq!(status, kiln_status::KILN_OK);
    Session(s)
}

/// Runs `call` with an error out-pointer; returns its status and message.
fn call(f: impl FnOnce(*mut *mut kiln_error) -> kiln_status) -> (kiln_status, String) {
    let mut e: *mut kiln_error = null_mut();
    let status = f(&mut e);
    // SAFETY: NULL or an error this library made; freed once.
    let message = unsafe {
        let text = CStr::from_ptr(kiln_error_message(e))
            .to_string_lossy()
            .into_owned();
        kiln_error_free(e);
        text
    };
    (status, message)
}

fn invalid(result: (kiln_status, String), says: &str) {
    assert_eq!(
        result.0,
        kiln_status::KILN_ERR_INVALID_ARGUMENT,
        "{}",
        result.1
    );
    assert!(
        result.1.contains(says),
        "{:?} does not say {says:?}",
        result.1
    );
}

#[test]
fn a_negative_argc_is_an_argument_error() {
    let s = session();
    // SAFETY: a live session.
    let lib = unsafe { kiln_main_library(s.0) };
    let args = [c"prog".as_ptr()];
    let mut status: c_int = 12345;
    for argc in [-5, -1, c_int::MIN] {
        invalid(
            call(|e| {
                // SAFETY: a live session; `args` is one valid string; checked before use.
                unsafe { kiln_run_main(s.0, lib, argc, args.as_ptr(), &mut status, e) }
            }),
            &format!("argc is {argc}"),
        );
    }
    assert_eq!(status, 12345, "main never ran");
    // argv NULL with arguments to read.
    invalid(
        call(|e| {
            // SAFETY: a live session; argv NULL is what is checked.
            unsafe { kiln_run_main(s.0, lib, 2, null(), &mut status, e) }
        }),
        "argv is NULL",
    );
}

#[test]
fn a_library_name_twice_is_an_argument_error() {
    let s = session();
    let create = |name: &CStr| {
        let mut id = 0u64;
        let result = call(|e| {
            // SAFETY: a live session, a string, a valid out-pointer.
            unsafe { kiln_create_library(s.0, name.as_ptr(), &mut id, e) }
        });
        (result, id)
    };
    let ((status, message), first) = create(c"shaders");
    assert_eq!(status, kiln_status::KILN_OK, "{message}");
    let (again, id) = create(c"shaders");
    invalid(again, "already has a library named 'shaders'");
    assert_eq!(id, 0, "no id written");
    invalid(create(c"main").0, "named 'main'");
    invalid(create(c"").0, "empty");
    let ((status, _), other) = create(c"shaders2");
    assert_eq!(status, kiln_status::KILN_OK);
    assert_ne!(first, other);
}

#[test]
fn empty_objects_and_names_and_contradictory_options_are_argument_errors() {
    let s = session();
    // SAFETY: a live session.
    let lib = unsafe { kiln_main_library(s.0) };
    let byte = [0x7fu8];
    invalid(
        call(|e| {
            // SAFETY: a live session; zero bytes of a valid pointer.
            unsafe {
                kiln_add_object(
                    s.0,
                    lib,
                    c"empty.o".as_ptr(),
                    byte.as_ptr().cast(),
                    0,
                    None,
                    null_mut(),
                    e,
                )
            }
        }),
        "size is 0",
    );
    invalid(
        call(|e| {
            // SAFETY: as above.
            unsafe { kiln_add_archive(s.0, lib, c"empty.a".as_ptr(), byte.as_ptr().cast(), 0, e) }
        }),
        "size is 0",
    );
    invalid(
        call(|e| {
            // SAFETY: a live session and a string.
            unsafe { kiln_define_symbol(s.0, lib, c"".as_ptr(), 1, e) }
        }),
        "name is empty",
    );
    // Options: unknown debug bits; an address without CONNECT; a path without SPAWN.
    let options = |edit: &dyn Fn(&mut kiln_session_options)| {
        let mut o = std::mem::MaybeUninit::<kiln_session_options>::uninit();
        // SAFETY: the whole struct is written.
        let mut o = unsafe {
            kiln_session_options_init(o.as_mut_ptr(), std::mem::size_of::<kiln_session_options>());
            o.assume_init()
        };
        edit(&mut o);
        let mut made = null_mut();
        let result = call(|e| {
            // SAFETY: initialized options; valid out-pointers.
            unsafe { kiln_session_create(&o, &mut made, e) }
        });
        assert!(made.is_null(), "no session made");
        result
    };
    invalid(options(&|o| o.debug = 0x80), "unknown bits 0x80");
    let address: *const c_char = c"127.0.0.1:1".as_ptr();
    invalid(
        options(&|o| o.address = address),
        "KILN_EXECUTOR_CONNECT only",
    );
    invalid(
        options(&|o| o.key_file = address),
        "KILN_EXECUTOR_CONNECT only",
    );
    invalid(
        options(&|o| o.executor_path = address),
        "KILN_EXECUTOR_SPAWN only",
    );
    invalid(options(&|o| o.executor = 7), "executor kind 7");
    // The session still works.
    let mut id = 0;
    let (status, message) = call(|e| {
        // SAFETY: a live session, a string, a valid out-pointer.
        unsafe { kiln_create_library(s.0, c"after".as_ptr(), &mut id, e) }
    });
    assert_eq!(status, kiln_status::KILN_OK, "{message}");
}
