//! Kiln under LLVM-C (feature `llvm`): examples/shaders.c, compiled against the installed
//! library and LLVM 14, makes 1,000 MCJIT engines with Kiln's memory manager, disposes
//! each engine (and its module and context), calls every shader, then frees them all.
#![cfg(feature = "llvm")]

use kiln_testkit::run_ok as run;
use std::path::{Path, PathBuf};
use std::process::Command;

#[test]
fn a_thousand_mcjit_engines_disposed_with_their_code_kept_in_kiln() {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("capi-llvm");
    std::fs::create_dir_all(&dir).unwrap();
    let prefix = dir.join("prefix");
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let pkg = kiln_testkit::install_capi(&prefix, &["--features", "llvm"]);
    let llvm_prefix =
        std::env::var("LLVM_SYS_140_PREFIX").unwrap_or_else(|_| "/usr/lib/llvm-14".into());
    let cflags = run(Command::new(format!("{llvm_prefix}/bin/llvm-config")).arg("--cflags"));
    let binary = dir.join("shaders");
    run(Command::new("cc")
        .args(["-std=c11", "-O1", "-Wall", "-Werror"])
        .args(cflags.split_whitespace())
        .arg(root.join("examples/shaders.c"))
        .arg("-o")
        .arg(&binary)
        .args(pkg.split_whitespace()));
    let out = run(Command::new(&binary).args(["1000", "kiln"]));
    assert!(
        out.contains("1000 shaders ok (engines disposed, code in Kiln)"),
        "{out}"
    );
    assert!(out.contains("all freed"), "{out}");
}
