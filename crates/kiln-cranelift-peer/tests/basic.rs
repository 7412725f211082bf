//! cranelift-jit 0.135's `tests/basic.rs`, with `KilnModule` for `JITModule` (see the
//! crate's documentation).
// The peer's code as published: its own style, not this workspace's lints.
#![allow(
    clippy::all,
    clippy::undocumented_unsafe_blocks,
    missing_docs,
    unreachable_pub
)]
include!(concat!(env!("OUT_DIR"), "/basic.rs"));
