//! # kiln-runtime
//!
//! What code running under Kiln needs, in whichever process it runs: [`runtime`] looks
//! host symbols up (`dlsym`, `dlopen`), registers `.eh_frame` with the system unwinder,
//! runs initializers and finalizers, serves thread-locals of JIT modules through its own
//! `__tls_get_addr` ([`thread_locals`]), exports a program's definitions to the libraries
//! it loads (on demand), and calls `main`; [`crash_report`] turns a fatal signal in JIT
//! code into a report, [`code_guards`] tells when replaced code can no longer be running,
//! [`lazy_entry`] is where call-through stubs without a body go, and [`debug_outputs`]
//! tells gdb and perf of JIT code. Every raw call into JIT code or the C runtime is in
//! this crate.
//!
//! The session (`kiln`) uses it for code in its own process; the `kiln-executor` binary
//! (crate `kiln-executor`: listener, sandbox, connection serving) uses it for a
//! controller in another process. Neither the sandbox's seccomp and Landlock nor the
//! protocol's server are here: a program that runs JIT code in process compiles neither.
//!
//! A host symbol as JIT code gets it, and the runtime's own stand-in for the C runtime's:
//!
//! ```
//! let puts = kiln_runtime::loader::dlsym(std::ptr::null_mut(), "puts");
//! assert!(puts.is_some());
//! // What Kiln offers JIT code in place of the C runtime's (thread-locals, say).
//! let offered = kiln_runtime::thread_locals::runtime_symbols();
//! assert!(offered.iter().any(|(name, _)| name == "__tls_get_addr"));
//! ```

pub mod code_guards;
pub mod crash_report;
pub mod debug_outputs;
mod exports;
pub mod lazy_entry;
pub mod loader;
pub mod module_symbols;
pub mod process_entry;
pub mod runtime;
pub mod shared_object;
mod symbol_kinds;
pub mod thread_locals;
