//! Compiles the C++ shim (feature `llvm`): a `RTDyldMemoryManager` that forwards to Kiln
//! and maps each section to its run-time address. See shim/kiln_mcjit.cpp for why the C
//! API alone is not enough.

fn main() {
    println!("cargo:rerun-if-changed=shim/kiln_mcjit.cpp");
    println!("cargo:rerun-if-env-changed=LLVM_SYS_140_PREFIX");
    #[cfg(feature = "llvm")]
    build_shim();
}

#[cfg(feature = "llvm")]
fn build_shim() {
    let prefix = std::env::var("LLVM_SYS_140_PREFIX").unwrap_or_else(|_| "/usr/lib/llvm-14".into());
    let config = format!("{prefix}/bin/llvm-config");
    let out = std::process::Command::new(&config)
        .arg("--cxxflags")
        .output()
        .unwrap_or_else(|e| {
            panic!("{config}: {e} (install llvm-14-dev or set LLVM_SYS_140_PREFIX)")
        });
    let flags = String::from_utf8_lossy(&out.stdout).into_owned();
    let mut build = cc::Build::new();
    build.cpp(true).file("shim/kiln_mcjit.cpp").warnings(false);
    for flag in flags.split_whitespace() {
        // llvm-config's flags may ask for exceptions off and a specific standard; keep them.
        build.flag(flag);
    }
    build.compile("kiln_mcjit_shim");
}
