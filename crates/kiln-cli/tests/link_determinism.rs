//! `kiln link` gives the same image bytes for the same inputs (issue 29): Debian's SQLite
//! with its driver, for x86-64 and, with the cross toolchain, for AArch64, linked twice
//! by two processes. A link whose layout followed a hash map's order, an address of this
//! process or the clock would differ.

use std::path::{Path, PathBuf};
use std::process::Command;

fn kiln() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_kiln"))
}

/// Links `inputs` for `target` into `image`; the image's bytes.
fn link(target: &str, inputs: &[PathBuf], image: &Path) -> Vec<u8> {
    let out = Command::new(kiln())
        .args(["link", "--target", target, "--allow-undefined", "-o"])
        .arg(image)
        .args(inputs)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "kiln link failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::read(image).unwrap()
}

/// Links twice and compares; says where the first difference lies.
fn assert_links_alike(label: &str, target: &str, inputs: &[PathBuf], dir: &Path) {
    let first = link(target, inputs, &dir.join(format!("{label}-1.elf")));
    let second = link(target, inputs, &dir.join(format!("{label}-2.elf")));
    assert!(
        first.len() > 100_000,
        "{label}: an image of SQLite ({} bytes)",
        first.len()
    );
    if let Some(at) = first.iter().zip(&second).position(|(a, b)| a != b) {
        panic!("{label}: the two images differ first at byte {at:#x}");
    }
    assert_eq!(first.len(), second.len(), "{label}: lengths");
}

#[test]
fn the_same_inputs_give_the_same_image() {
    let dir = kiln_testkit::scratch_dir("link_determinism");
    let driver = dir.join("sqlite_driver.o");
    kiln_testkit::cc(
        &["-O2", "-fPIC", "-c"],
        &kiln_testkit::source("sqlite_driver.c"),
        &driver,
    );
    let sqlite = kiln_testkit::host_file("/usr/lib/x86_64-linux-gnu/libsqlite3.a");
    assert_links_alike("x86-64", "x86_64", &[driver, sqlite], &dir);

    if kiln_testkit::skip_cross("the_same_inputs_give_the_same_image (AArch64)") {
        return;
    }
    let driver = dir.join("sqlite_driver.aarch64.o");
    let mut compile = Command::new("aarch64-linux-gnu-gcc");
    compile
        .args(["-O2", "-fPIC", "-c"])
        .args(kiln_testkit::aarch64_includes())
        .arg(kiln_testkit::source("sqlite_driver.c"))
        .arg("-o")
        .arg(&driver);
    assert!(compile.status().unwrap().success(), "aarch64-linux-gnu-gcc");
    let sqlite = kiln_testkit::aarch64_lib_dir().join("libsqlite3.a");
    assert_links_alike("aarch64", "aarch64", &[driver, sqlite], &dir);
}
