//! cranelift-jit 0.135's own tests (`tests/basic.rs`) and example
//! (`examples/jit-minimal.rs`), run against `kiln_cranelift::KilnModule`.
//!
//! Nothing of the peer is in this repository: `build.rs` reads its published sources from
//! cargo's registry (where cargo put them for this crate's build dependency on
//! `cranelift-jit`), renames `cranelift_jit` to `kiln_cranelift`, `JITModule` to
//! `KilnModule` and `JITBuilder` to `KilnBuilder`, and writes them to `OUT_DIR`, which the
//! test targets include. `cargo test -p kiln-cranelift-peer` runs them.
