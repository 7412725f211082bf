//! `--sandbox`: JIT code run by a sandboxed executor tries what the sandbox forbids —
//! starting a program, tracing, listening, writing or reading outside the configured
//! paths, changing file metadata, making namespaces, io_uring, writable and executable
//! memory, keeping capabilities — and gets `EPERM`, `EACCES` or `ENOSYS`, while what it
//! allows (threads, the configured files) still works, as root and as an unprivileged
//! user; a sandboxed listener serves connection after connection.

use kiln_testkit::{cc, executor_binary};
use std::path::PathBuf;
use std::process::Command;

struct Setup {
    object: PathBuf,
    allowed: PathBuf,
    elsewhere: PathBuf,
}

fn setup(name: &str) -> Setup {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join("sandbox")
        .join(name);
    let _ = std::fs::remove_dir_all(&dir);
    let allowed = dir.join("allowed");
    let elsewhere = dir.join("elsewhere");
    std::fs::create_dir_all(&allowed).unwrap();
    std::fs::create_dir_all(&elsewhere).unwrap();
    std::fs::write(elsewhere.join("secret"), "not for JIT code\n").unwrap();
    let object = dir.join("sandbox_probe.o");
    cc(
        &["-c", "-O1"],
        &kiln_testkit::source("sandbox_probe.c"),
        &object,
    );
    Setup {
        object,
        allowed,
        elsewhere,
    }
}

const REFUSED: &str = "execve: EPERM\nptrace: EPERM\nlisten: EPERM\nread /etc: ok\nwrite allowed: ok\nwrite elsewhere: EACCES\nread elsewhere: EACCES\n\
chmod: EPERM\nchown: EPERM\nutimensat: EPERM\nsetxattr: EPERM\nfchmod: EPERM\n\
clone newuser: EPERM\nclone newnet: EPERM\nclone3: ENOSYS\nio_uring: EPERM\n\
mprotect wx: EPERM\nmmap wx: EPERM\ncapabilities: none\nthread: ok\n";

fn probe_args(s: &Setup) -> Vec<String> {
    vec![
        s.allowed.join("out.txt").display().to_string(),
        s.elsewhere.join("planted.txt").display().to_string(),
        s.elsewhere.join("secret").display().to_string(),
    ]
}

#[test]
fn a_sandboxed_child_executor_refuses_each_forbidden_thing() {
    executor_binary();
    let s = setup("child");
    let out = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(["run", "--oop", "--sandbox", "--sandbox-write"])
        .arg(&s.allowed)
        .arg(&s.object)
        .arg("--")
        .args(probe_args(&s))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(String::from_utf8_lossy(&out.stdout), REFUSED, "{stderr}");
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert_eq!(
        std::fs::read_to_string(s.allowed.join("out.txt")).unwrap(),
        "x\n"
    );
    assert!(!s.elsewhere.join("planted.txt").exists());
}

#[test]
fn sandbox_flags_need_oop_and_each_other() {
    let s = setup("flags");
    for (flags, says) in [
        (&["--sandbox"][..], "--sandbox applies to --oop"),
        (&["--oop", "--sandbox-write", "/tmp"][..], "need --sandbox"),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_kiln"))
            .arg("run")
            .args(flags)
            .arg(&s.object)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{flags:?}: {stderr}");
        assert!(stderr.contains(says), "{flags:?}: {stderr}");
    }
}

#[test]
fn a_sandboxed_listener_serves_connection_after_connection() {
    executor_binary();
    let s = setup("listener");
    let allowed = s.allowed.display().to_string();
    let listener = kiln_testkit::start_executor(
        &[
            "--listen",
            "127.0.0.1:0",
            "--no-auth",
            "--sandbox",
            "--sandbox-write",
            &allowed,
        ],
        None,
        &[],
    );
    let address = listener.address.clone();
    for round in 0..3 {
        let out = Command::new(env!("CARGO_BIN_EXE_kiln"))
            .args(["run", "--no-export-dynamic", "--connect", &address])
            .arg(&s.object)
            .arg("--")
            .args(probe_args(&s))
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            REFUSED,
            "round {round}: {err}"
        );
    }
    // The listener itself is not sandboxed and lives on.
    let mut listener = listener;
    assert!(listener.child.try_wait().unwrap().is_none());
}

/// `setpriv`'s way to run a command as nobody (uid and gid 65534), if there is one.
fn as_nobody() -> Option<Command> {
    let found = Command::new("setpriv").arg("--version").output().is_ok();
    if !found {
        eprintln!("as_an_unprivileged_user: skipped: no setpriv (util-linux)");
        return None;
    }
    let mut command = Command::new("setpriv");
    command.args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"]);
    Some(command)
}

#[test]
fn a_sandboxed_child_executor_refuses_each_forbidden_thing_as_an_unprivileged_user() {
    executor_binary();
    // Root (uid 0 owns /proc/self): only root can become nobody.
    let root = std::fs::metadata("/proc/self")
        .map(|m| std::os::unix::fs::MetadataExt::uid(&m) == 0)
        .unwrap_or(false);
    if !root {
        eprintln!("as nobody: skipped: the tests do not run as root (they are a user already)");
        return;
    }
    let Some(mut command) = as_nobody() else {
        return;
    };
    let s = setup("nobody");
    // nobody reaches the scratch files, and has a cache directory of its own.
    let cache = s.allowed.parent().unwrap().join("cache");
    std::fs::create_dir_all(&cache).unwrap();
    for dir in [
        s.allowed.parent().unwrap(),
        &s.allowed,
        &s.elsewhere,
        &cache,
    ] {
        std::fs::set_permissions(dir, std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
    }
    for file in [&s.object, &s.elsewhere.join("secret")] {
        std::fs::set_permissions(file, std::os::unix::fs::PermissionsExt::from_mode(0o644))
            .unwrap();
    }
    let out = command
        .arg(env!("CARGO_BIN_EXE_kiln"))
        .args(["run", "--oop", "--sandbox", "--sandbox-write"])
        .arg(&s.allowed)
        .arg(&s.object)
        .arg("--")
        .args(probe_args(&s))
        .env("KILN_CACHE_DIR", &cache)
        .env("HOME", &cache)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(String::from_utf8_lossy(&out.stdout), REFUSED, "{stderr}");
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(!s.elsewhere.join("planted.txt").exists());
}
