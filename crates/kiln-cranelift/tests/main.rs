//! kiln-cranelift's tests, in one binary (one link of the test program, not one per file):
//! `KilnModule` as a Cranelift user drives it, the toy language of cranelift-jit-demo,
//! and the README's example.

mod module;
mod readme;
mod toy_language;
