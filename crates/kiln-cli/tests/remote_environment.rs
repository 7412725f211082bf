//! A remote program gets the caller's world: run by a fresh `--oop` executor, a pre-started
//! one (`KILN_EXECUTOR_SOCKET`) or one reached with `--connect`, a program sees `kiln
//! run`'s environment (`getenv`) and working directory (a relative `fopen`), as in
//! process; `--no-env` keeps the executor's own.

use kiln_testkit::{cc, executor_binary};
use std::path::{Path, PathBuf};
use std::process::Command;

const PROBE: &str = r#"#include <stdio.h>
#include <stdlib.h>
int main(void) {
    const char *v = getenv("KILN_ENV_PROBE");
    printf("KILN_ENV_PROBE=%s\n", v ? v : "(unset)");
    FILE *f = fopen("data.txt", "r");
    char line[64] = "NOT FOUND\n";
    if (f) { if (!fgets(line, sizeof line, f)) line[0] = 0; fclose(f); }
    printf("data.txt: %s", line);
    return 0;
}
"#;

/// The probe's object, and a directory holding `data.txt` to run it from.
fn setup(name: &str) -> (PathBuf, PathBuf) {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join("remote-env")
        .join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let src = dir.join("env_probe.c");
    std::fs::write(&src, PROBE).unwrap();
    let obj = dir.join("env_probe.o");
    cc(&["-c"], &src, &obj);
    let work = dir.join("work");
    std::fs::create_dir_all(&work).unwrap();
    std::fs::write(work.join("data.txt"), "the caller's file\n").unwrap();
    (obj, work)
}

fn kiln_run(obj: &Path, work: &Path, flags: &[&str], env: &[(&str, &str)]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .current_dir(work)
        .arg("run")
        .args(flags)
        .arg(obj)
        .env("KILN_ENV_PROBE", "from the caller")
        .envs(env.iter().copied())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{flags:?}: {stderr}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

const CALLERS: &str = "KILN_ENV_PROBE=from the caller\ndata.txt: the caller's file\n";
const EXECUTORS: &str = "KILN_ENV_PROBE=(unset)\ndata.txt: NOT FOUND\n";

/// `kiln-executor ARGS`, started from `/` with no KILN_ENV_PROBE.
fn executor(args: &[&str]) -> kiln_testkit::ExecutorProcess {
    kiln_testkit::start_executor(args, Some(Path::new("/")), &["KILN_ENV_PROBE"])
}

#[test]
fn in_process_and_a_fresh_executor() {
    executor_binary();
    let (obj, work) = setup("fresh");
    assert_eq!(kiln_run(&obj, &work, &[], &[]), CALLERS);
    assert_eq!(kiln_run(&obj, &work, &["--oop"], &[]), CALLERS);
}

#[test]
fn a_pre_started_executor() {
    let (obj, work) = setup("pre-started");
    let socket = work.parent().unwrap().join("executor.sock");
    let _ = std::fs::remove_file(&socket);
    let socket_text = socket.display().to_string();
    let _executor = executor(&["--listen-unix", &socket_text]);
    let env = [("KILN_EXECUTOR_SOCKET", socket_text.as_str())];
    assert_eq!(kiln_run(&obj, &work, &["--oop"], &env), CALLERS);
    assert_eq!(
        kiln_run(&obj, &work, &["--oop", "--no-env"], &env),
        EXECUTORS
    );
    // Each connection adopts its own caller's world: a second caller elsewhere.
    let other = work.parent().unwrap().join("other");
    std::fs::create_dir_all(&other).unwrap();
    std::fs::write(other.join("data.txt"), "another caller's file\n").unwrap();
    assert_eq!(
        kiln_run(&obj, &other, &["--oop"], &env),
        "KILN_ENV_PROBE=from the caller\ndata.txt: another caller's file\n"
    );
}

#[test]
fn an_executor_over_tcp() {
    let (obj, work) = setup("tcp");
    let key = work.parent().unwrap().join("executor.key");
    let _ = std::fs::remove_file(&key);
    let key_text = key.display().to_string();
    let listener = executor(&["--listen", "127.0.0.1:0", "--key-file", &key_text]);
    let connect = [
        "--connect",
        listener.address.as_str(),
        "--key-file",
        key_text.as_str(),
    ];
    assert_eq!(kiln_run(&obj, &work, &connect, &[]), CALLERS);
    let no_env = [&connect[..], &["--no-env"]].concat();
    assert_eq!(kiln_run(&obj, &work, &no_env, &[]), EXECUTORS);
}
