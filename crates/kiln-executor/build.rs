//! Builds the GDB JIT interface's weak definitions (csrc/gdb_jit.c) and the frame that
//! calls a program's `main` (csrc/call_main.cc); see their comments for why they are C and
//! C++.
fn main() {
    println!("cargo:rerun-if-changed=csrc/gdb_jit.c");
    println!("cargo:rerun-if-changed=csrc/call_main.cc");
    cc::Build::new()
        .file("csrc/gdb_jit.c")
        .compile("kiln_gdb_jit");
    // C++ (links the C++ runtime, which a C++ program run by Kiln loads anyway).
    cc::Build::new()
        .cpp(true)
        .file("csrc/call_main.cc")
        .compile("kiln_call_main");
}
