//! Inputs that are not regular files — a character device, a FIFO, a /proc file — are
//! refused at once, unread, with the path and its kind (`/dev/zero` was read for 4 GiB,
//! a FIFO blocked the run for good).

use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

fn scratch(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join("special-inputs")
        .join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// `kiln run --noexec PATH`, killed if it has not finished within two minutes (a guard
/// against a hang, far beyond what a busy machine needs: a run that blocks on a FIFO is
/// killed and fails the status check; one that reads `/dev/zero` ends with another error).
fn noexec(path: &std::path::Path) -> Output {
    let started = Instant::now();
    let mut child = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(["run", "--noexec"])
        .arg(path)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    while child.try_wait().unwrap().is_none() {
        if started.elapsed() > Duration::from_secs(120) {
            child.kill().unwrap();
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

fn refused_at_once(path: &std::path::Path, kind: &str) {
    let out = noexec(path);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{}: {stderr}", path.display());
    assert!(
        stderr.contains(&format!("{}: not a regular file ({kind})", path.display())),
        "{stderr}"
    );
}

#[test]
fn a_character_device_is_refused_unread() {
    refused_at_once(std::path::Path::new("/dev/zero"), "a character device");
}

#[test]
fn a_fifo_is_refused_without_blocking() {
    let dir = scratch("fifo");
    let fifo = dir.join("input.o");
    let c_path = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a NUL-terminated path.
    assert_eq!(unsafe { libc_mkfifo(c_path.as_ptr(), 0o600) }, 0);
    // No writer ever opens it: an open that blocked would hang the run.
    refused_at_once(&fifo, "a FIFO");
}

#[test]
fn a_proc_file_is_refused() {
    // A regular file by its mode whose size says 0: not an input.
    refused_at_once(std::path::Path::new("/proc/self/status"), "a /proc file");
}

#[test]
fn a_directory_and_a_missing_file_keep_their_messages() {
    let dir = scratch("dir");
    let out = noexec(&dir);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("is a directory, not an input"), "{stderr}");
    let out = noexec(&dir.join("missing.o"));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("missing.o: no such file"), "{stderr}");
}

extern "C" {
    #[link_name = "mkfifo"]
    fn libc_mkfifo(path: *const std::ffi::c_char, mode: u32) -> i32;
}
