//! LLVM-C → Kiln from C (issue "Where MCJIT's users go next"): examples/llvm_queries.c,
//! compiled against the installed library and LLVM 16's C API (Debian's llvm-16-dev),
//! builds each query as a module of its own, emits it to an ELF object in memory with
//! LLVM's target machine (context and module disposed at once), and links, looks up and
//! calls it with Kiln, lending LLVM's buffer to `kiln_add_object` (the release callback
//! disposes it); then links, calls and removes modules in turn. The same program drives
//! LLVM's own LLJIT through LLVM-C, the comparison `capi_overhead` measures.

use kiln_testkit::run_ok as run;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The program's `RESULT` line as (key, value) pairs.
fn result(out: &str) -> Vec<(String, String)> {
    let line = out
        .lines()
        .find_map(|l| l.strip_prefix("RESULT "))
        .unwrap_or_else(|| panic!("no RESULT line in:\n{out}"));
    line.split_whitespace()
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn number(result: &[(String, String)], key: &str) -> f64 {
    result
        .iter()
        .find(|(k, _)| k == key)
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or_else(|| panic!("no {key} in {result:?}"))
}

#[test]
fn llvm_c_objects_emitted_to_memory_are_linked_called_and_removed_by_kiln() {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("capi-llvm16");
    std::fs::create_dir_all(&dir).unwrap();
    let prefix = dir.join("prefix");
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let pkg = kiln_testkit::install_capi(&prefix, &[]);
    let llvm_config = "/usr/lib/llvm-16/bin/llvm-config";
    let cflags = run(Command::new(llvm_config).arg("--cflags"));
    let ldflags = run(Command::new(llvm_config).arg("--ldflags"));
    let binary = dir.join("llvm_queries");
    run(Command::new("cc")
        .args(["-std=c11", "-O1", "-Wall", "-Werror"])
        .args(cflags.split_whitespace())
        .arg(root.join("examples/llvm_queries.c"))
        .arg("-o")
        .arg(&binary)
        .args(pkg.split_whitespace())
        .args(ldflags.split_whitespace())
        .arg("-lLLVM-16"));
    // Kiln: 300 queries kept (each called and checked by the program), 300 more linked,
    // called and removed in turn; then every kept module removed and the session gone.
    let out = run(Command::new(&binary).args(["kiln", "300"]));
    assert!(
        out.contains("queries ok: 300 modules linked by Kiln"),
        "{out}"
    );
    let kiln = result(&out);
    // The cycle leaves nothing behind: what 270 removed modules could leave is far
    // below what 270 kept ones take (code, eh_frame, symbols: a page each at worst).
    let growth = number(&kiln, "cycle_growth_kb");
    assert!(
        growth < 270.0 * 4.096 / 4.0,
        "{growth} KB left by 270 removed modules"
    );
    // The same program with LLVM's LLJIT links and calls the same objects.
    let out = run(Command::new(&binary).args(["lljit", "100"]));
    assert!(
        out.contains("queries ok: 100 modules linked by LLJIT"),
        "{out}"
    );
    // Bad use is refused with a usage line, not a crash.
    let bad = Command::new(&binary).arg("kiln").output().unwrap();
    assert_eq!(bad.status.code(), Some(2));
}
