//! kiln-cranelift's tests, in one binary (one link of the test program, not one per file):
//! `KilnModule` as a Cranelift user drives it, the toy language of cranelift-jit-demo,
//! the README's example, and cranelift-object's COFF objects for Windows linked by Kiln.

mod module;
mod readme;
mod toy_language;
mod windows_object;
