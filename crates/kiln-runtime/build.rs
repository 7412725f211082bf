//! Builds the GDB JIT interface's weak definitions (csrc/gdb_jit.c) and the frame that
//! calls a program's `main` (csrc/call_main.S); see their comments for why they are C and
//! assembly.
fn main() {
    println!("cargo:rerun-if-changed=csrc/gdb_jit.c");
    println!("cargo:rerun-if-changed=csrc/call_main.S");
    cc::Build::new()
        .file("csrc/gdb_jit.c")
        .file("csrc/call_main.S")
        .compile("kiln_runtime_c");
}
