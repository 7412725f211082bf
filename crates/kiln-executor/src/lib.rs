//! # kiln-executor
//!
//! Where linked code runs. [`runtime`] does it in the calling process: looks host symbols
//! up (`dlsym`, `dlopen`), registers `.eh_frame` with the system unwinder, runs
//! initializers and finalizers, serves thread-locals of JIT modules through its own
//! `__tls_get_addr`, and calls `main`. Every raw call into JIT code or the C runtime is in
//! this crate.
//!
//! [`server`] serves a controller in another process over the `kiln-remote` protocol; the
//! `kiln-executor` binary runs it.

pub mod code_guards;
pub mod crash_report;
pub mod debug_outputs;
mod exports;
pub mod lazy_entry;
pub mod listener;
pub mod loader;
pub mod module_symbols;
pub mod runtime;
pub mod sandbox;
pub mod server;
pub mod shared_object;
mod symbol_kinds;
pub mod thread_locals;
