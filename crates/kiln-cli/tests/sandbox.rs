//! `--sandbox`: JIT code run by a sandboxed executor tries what the sandbox forbids —
//! starting a program, tracing, reaching into a process through a pidfd, listening,
//! writing or reading outside the configured paths, changing file metadata (mode, owner,
//! times, extended attributes, file attributes; outside and inside the writable
//! directory), making namespaces, io_uring, writable and executable memory (by `mmap`,
//! `mprotect`, `shmat`, `personality`), keeping capabilities — and gets `EPERM`, `EACCES`
//! or `ENOSYS`, while what it allows (threads, the configured files) still works, as root
//! and as an unprivileged user, in every executor that takes `--sandbox`: the child of
//! `kiln run --oop`, a TCP listener and a Unix-socket listener (each serving connection
//! after connection, and living on).
//!
//! Each expected refusal is one the machine would otherwise grant: run unsandboxed, as
//! root and as nobody, the probe's attacks succeed (nobody's metadata cases touch files it
//! owns), except `clone newnet`, `fchmod` (of `/etc/hostname`) and `capabilities`, which
//! only root's run proves.

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
fchmod allowed: EPERM\nfile attributes: EPERM\npidfd_getfd: EPERM\n\
clone newuser: EPERM\nclone newnet: EPERM\nclone3: ENOSYS\nio_uring: EPERM\n\
mprotect wx: EPERM\nmmap wx: EPERM\nshmat exec: EPERM\npersonality: EPERM\n\
capabilities: none\nthread: ok\n";

fn probe_args(s: &Setup) -> Vec<String> {
    vec![
        s.allowed.join("out.txt").display().to_string(),
        s.elsewhere.join("planted.txt").display().to_string(),
        s.elsewhere.join("secret").display().to_string(),
    ]
}

/// `kiln run --connect address` three times: each connection's process refuses every
/// forbidden thing.
fn refused_three_times_over_tcp(s: &Setup, address: &str) {
    for round in 0..3 {
        let out = Command::new(env!("CARGO_BIN_EXE_kiln"))
            .args(["run", "--no-export-dynamic", "--connect", address])
            .arg(&s.object)
            .arg("--")
            .args(probe_args(s))
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            REFUSED,
            "TCP, round {round}: {err}"
        );
    }
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
    refused_three_times_over_tcp(&s, &address);
    // The listener itself is not sandboxed and lives on.
    let mut listener = listener;
    assert!(listener.child.try_wait().unwrap().is_none());
}

/// `setpriv`'s way to run a command as nobody (uid and gid 65534), if there is one.
fn as_nobody() -> Option<Command> {
    let found = Command::new("setpriv").arg("--version").output().is_ok();
    if !found {
        eprintln!("as an unprivileged user: skipped: no setpriv (util-linux)");
        return None;
    }
    let mut command = Command::new("setpriv");
    command.args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"]);
    Some(command)
}

/// A scratch setup nobody reaches (and whose secret it owns, so that changing its
/// metadata is refused by nothing but the sandbox), with a cache directory of its own;
/// `None` (skipped, said on stderr) unless the tests run as root and have `setpriv`.
fn nobody_setup(name: &str) -> Option<(Setup, PathBuf)> {
    use std::os::unix::fs::PermissionsExt;
    // Root (uid 0 owns /proc/self): only root can become nobody.
    let root = std::fs::metadata("/proc/self")
        .map(|m| std::os::unix::fs::MetadataExt::uid(&m) == 0)
        .unwrap_or(false);
    if !root {
        eprintln!("as nobody: skipped: the tests do not run as root (they are a user already)");
        return None;
    }
    as_nobody()?;
    let s = setup(name);
    let cache = s.allowed.parent().unwrap().join("cache");
    std::fs::create_dir_all(&cache).unwrap();
    for dir in [
        s.allowed.parent().unwrap(),
        &s.allowed,
        &s.elsewhere,
        &cache,
    ] {
        std::fs::set_permissions(dir, PermissionsExt::from_mode(0o777)).unwrap();
    }
    for file in [&s.object, &s.elsewhere.join("secret")] {
        std::fs::set_permissions(file, PermissionsExt::from_mode(0o644)).unwrap();
    }
    std::os::unix::fs::chown(s.elsewhere.join("secret"), Some(65534), Some(65534)).unwrap();
    Some((s, cache))
}

#[test]
fn a_sandboxed_child_executor_refuses_each_forbidden_thing_as_an_unprivileged_user() {
    executor_binary();
    let Some((s, cache)) = nobody_setup("nobody") else {
        return;
    };
    let out = as_nobody()
        .unwrap()
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

/// `kiln run --oop` through a sandboxed `kiln-executor --listen-unix` (as the user that
/// `nobody` names: root, or nobody with that cache directory), three times: each connection's process refuses every
/// forbidden thing, and the listener lives on.
fn through_a_unix_listener(s: &Setup, nobody: Option<&PathBuf>) {
    let socket = s.allowed.parent().unwrap().join("executor.sock");
    let _ = std::fs::remove_file(&socket);
    let mut command = match nobody {
        Some(_) => {
            let mut c = as_nobody().unwrap();
            c.arg(executor_binary());
            c
        }
        None => Command::new(executor_binary()),
    };
    command
        .arg("--sandbox")
        .arg("--sandbox-write")
        .arg(&s.allowed)
        .arg("--listen-unix")
        .arg(&socket);
    if let Some(cache) = nobody {
        command.env("HOME", cache);
    }
    let mut listener = kiln_testkit::start_listening(&mut command);
    for round in 0..3 {
        let mut run = match nobody {
            Some(cache) => {
                let mut c = as_nobody().unwrap();
                c.arg(env!("CARGO_BIN_EXE_kiln"))
                    .env("KILN_CACHE_DIR", cache)
                    .env("HOME", cache);
                c
            }
            None => Command::new(env!("CARGO_BIN_EXE_kiln")),
        };
        let out = run
            .env("KILN_EXECUTOR_SOCKET", &socket)
            .args(["run", "--oop"])
            .arg(&s.object)
            .arg("--")
            .args(probe_args(s))
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            REFUSED,
            "round {round}: {err}"
        );
        assert_eq!(out.status.code(), Some(0), "round {round}: {err}");
    }
    assert!(listener.child.try_wait().unwrap().is_none());
    assert!(!s.elsewhere.join("planted.txt").exists());
}

#[test]
fn a_sandboxed_unix_listener_serves_connection_after_connection() {
    executor_binary();
    let s = setup("unix");
    through_a_unix_listener(&s, None);
}

#[test]
fn sandboxed_listeners_refuse_each_forbidden_thing_as_an_unprivileged_user() {
    executor_binary();
    let Some((s, cache)) = nobody_setup("nobody-listeners") else {
        return;
    };
    // Over TCP: the listener runs as nobody, the controller as root.
    let allowed = s.allowed.display().to_string();
    let mut command = as_nobody().unwrap();
    command
        .arg(executor_binary())
        .args(["--listen", "127.0.0.1:0", "--no-auth", "--sandbox"])
        .args(["--sandbox-write", &allowed])
        .env("HOME", &cache);
    let mut listener = kiln_testkit::start_listening(&mut command);
    refused_three_times_over_tcp(&s, &listener.address);
    assert!(listener.child.try_wait().unwrap().is_none());
    // On a Unix socket: listener and controller both nobody's.
    through_a_unix_listener(&s, Some(&cache));
}
