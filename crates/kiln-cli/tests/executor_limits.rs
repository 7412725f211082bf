//! A client cannot fill an executor's memory through the program's standard input: a
//! program that never reads it gets 64 MiB sent by `kiln run --connect`, and the
//! connection's process holds at most the executor's limit (16 MiB) of it, saying so once.

use kiln_testkit::{cc, executor_binary};
use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.split_whitespace().next()?.parse().ok())
        })
        .unwrap_or(0)
}

#[test]
fn unread_input_is_bounded_in_the_executor() {
    executor_binary();
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("executor-limits");
    std::fs::create_dir_all(&dir).unwrap();
    let src = dir.join("sleeper.c");
    std::fs::write(
        &src,
        "#include <stdio.h>\n#include <unistd.h>\nint main(void) { puts(\"sleeping\"); fflush(stdout); sleep(4); return 0; }\n",
    )
    .unwrap();
    let obj = dir.join("sleeper.o");
    cc(&["-c"], &src, &obj);
    let listener =
        kiln_testkit::start_executor(&["--listen", "127.0.0.1:0", "--no-auth"], None, &[]);
    let address = listener.address.clone();
    let mut run = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(["run", "--no-export-dynamic", "--connect", &address])
        .arg(&obj)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = run.stdin.take().unwrap();
    let feeder = std::thread::spawn(move || {
        let chunk = vec![b'x'; 1 << 20];
        for _ in 0..64 {
            if stdin.write_all(&chunk).is_err() {
                break;
            }
        }
    });
    // While the program sleeps, the connection's process must not hold the 64 MiB.
    let pid = listener.child.id();
    let start = Instant::now();
    let mut peak = 0;
    while start.elapsed() < Duration::from_secs(3) {
        let children =
            std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).unwrap_or_default();
        for child in children.split_whitespace().filter_map(|c| c.parse().ok()) {
            peak = peak.max(rss_kib(child));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let out = run.wait_with_output().unwrap();
    feeder.join().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "sleeping\n");
    assert!(stderr.contains("further input is dropped"), "{stderr}");
    assert!(
        peak < 48 * 1024,
        "the connection's process reached {peak} KiB with unread input"
    );
}
