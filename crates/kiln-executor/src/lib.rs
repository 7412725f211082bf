//! # kiln-executor
//!
//! The `kiln-executor` binary's library: [`server`] serves a controller in another
//! process over the `kiln-remote` protocol, [`listener`] accepts connections (a process
//! each), [`sandbox`] confines the code it runs. What the code itself needs — symbol
//! lookup, unwind registration, thread-locals, exports, crash reports, calling `main` —
//! is `kiln-runtime`'s.

pub mod listener;
pub mod sandbox;
pub mod server;
