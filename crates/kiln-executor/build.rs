//! Builds the GDB JIT interface's weak definitions (csrc/gdb_jit.c; see its comment for
//! why they are C).
fn main() {
    println!("cargo:rerun-if-changed=csrc/gdb_jit.c");
    cc::Build::new()
        .file("csrc/gdb_jit.c")
        .compile("kiln_gdb_jit");
}
