//! Helpers the session's tests share: objects from the system compiler, the executor
//! binary of this build.

#![allow(dead_code)] // each test file uses some of them

use std::path::PathBuf;
use std::process::Command;

/// `cc -c FLAGS` of `source` (files named after `name` and the calling thread: tests run
/// in parallel), the object's bytes.
pub(crate) fn cc(name: &str, source: &str, flags: &[&str]) -> Vec<u8> {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("common");
    std::fs::create_dir_all(&dir).unwrap();
    let stem = format!("{name}-{:?}", std::thread::current().id());
    let c = dir.join(format!("{stem}.c"));
    let o = dir.join(format!("{stem}.o"));
    std::fs::write(&c, source).unwrap();
    let status = Command::new("cc")
        .args(flags)
        .arg("-c")
        .arg(&c)
        .arg("-o")
        .arg(&o)
        .status()
        .unwrap();
    assert!(status.success(), "cc {name}");
    std::fs::read(&o).unwrap()
}

/// The kiln-executor binary of this build (built on demand when only this package's
/// tests were built).
pub(crate) fn executor_binary() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().unwrap().parent().unwrap();
    let path = dir.join("kiln-executor");
    if !path.exists() {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let status = Command::new(cargo)
            .args(["build", "-p", "kiln-executor"])
            .status()
            .unwrap();
        assert!(status.success());
    }
    path
}
