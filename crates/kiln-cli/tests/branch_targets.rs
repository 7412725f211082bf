//! Branch-target enforcement on AArch64, for real under qemu (`-cpu max` has BTI):
//! objects whose GNU property note says BTI are linked by `kiln run --connect` into an
//! AArch64 executor-c, which maps their code `PROT_BTI`; an indirect call through a
//! pointer to a landing pad works, one that skips it traps (SIGILL), and the same call in
//! code built without BTI is not guarded. Skipped with KILN_TEST_SKIP_CROSS=1.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The cross compiler's C library, qemu's guest root.
const GUEST_ROOT: &str = "/usr/aarch64-linux-gnu";

fn tmp() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("branch_targets");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// executor-c built for AArch64 and started under qemu with BTI (`-cpu max`), keyed.
fn executor() -> kiln_testkit::ExecutorProcess {
    let binary = kiln_testkit::c_executor_binary("aarch64-linux-gnu-gcc");
    kiln_testkit::start_listening(
        Command::new("qemu-aarch64-static")
            .args(["-cpu", "max", "-L", GUEST_ROOT])
            .arg(&binary)
            .args(["--listen", "127.0.0.1:0", "--key-file"])
            .arg(kiln_testkit::key_file()),
    )
}

fn compile(flags: &[&str], out: &Path) {
    let status = Command::new("aarch64-linux-gnu-gcc")
        .args(["-O2", "-fPIC", "-c"])
        .args(flags)
        .arg(kiln_testkit::source("bti_probe.c"))
        .arg("-o")
        .arg(out)
        .status()
        .unwrap();
    assert!(status.success(), "aarch64-linux-gnu-gcc {flags:?}");
}

fn run(executor: &kiln_testkit::ExecutorProcess, object: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args([
            "run",
            "--no-export-dynamic",
            "--connect",
            &executor.address,
            "--key-file",
        ])
        .arg(kiln_testkit::key_file())
        .arg(object)
        .arg("--")
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn bti_code_is_guarded_and_a_branch_past_a_landing_pad_traps() {
    if kiln_testkit::skip_cross("bti_code_is_guarded_and_a_branch_past_a_landing_pad_traps") {
        return;
    }
    let dir = tmp();
    let bti = dir.join("bti.o");
    let plain = dir.join("plain.o");
    compile(&["-mbranch-protection=bti"], &bti);
    compile(&[], &plain);
    let executor = executor();
    // Through the landing pad: fine, guarded or not.
    for object in [&bti, &plain] {
        let out = run(&executor, object, &[]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{}: {stderr}", object.display());
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            "through the pointer: 42\n"
        );
    }
    // Past it: the guarded code traps.
    let out = run(&executor, &bti, &["skip"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(128 + 4), "{stderr}");
    assert!(stderr.contains("SIGILL"), "{stderr}");
    // Code built without BTI is not guarded: the same branch runs.
    let out = run(&executor, &plain, &["skip"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
}
