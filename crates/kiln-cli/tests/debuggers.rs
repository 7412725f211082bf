//! Debuggers and profilers see JIT code: gdb and lldb through the GDB JIT interface (in
//! process and attached to an out-of-process executor), perf through jitdump and perf
//! maps. Real tools, run in batch mode.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn kiln() -> &'static str {
    env!("CARGO_BIN_EXE_kiln")
}

/// `cc -c` of a tests/programs source into the test's temporary directory.
fn object(src: &str, flags: &[&str]) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("debuggers");
    std::fs::create_dir_all(&dir).unwrap();
    // One file per call: tests run in parallel, and one test compiling the object must
    // not rewrite it while another one's kiln reads it.
    static CALLS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let stem = Path::new(src)
        .file_stem()
        .unwrap()
        .to_string_lossy()
        .into_owned();
    let out = dir.join(format!("{stem}-{n}.o"));
    let mut all = vec!["-c"];
    all.extend_from_slice(flags);
    kiln_testkit::cc(&all, &kiln_testkit::source(src), &out);
    out
}

/// Runs gdb in batch mode with `commands`, on `kiln ARGS`; returns what it printed.
fn gdb_on_kiln(commands: &[&str], args: &[&str]) -> String {
    let mut cmd = Command::new("gdb");
    cmd.args(["-batch", "-nx", "-ex", "set debuginfod enabled off"]);
    for c in commands {
        cmd.args(["-ex", c]);
    }
    cmd.arg("--args").arg(kiln()).args(args);
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .expect("gdb runs (the test command installs it)");
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[test]
fn gdb_breaks_by_name_lists_source_and_backtraces_through_jit_frames() {
    let obj = object("debug_target.c", &["-g", "-O0"]);
    let out = gdb_on_kiln(
        &[
            "set language c",
            "set breakpoint pending on",
            // Before the code is linked: pending, resolved when Kiln registers it.
            "break jit_helper",
            "run",
            "bt",
            "info line",
            "list jit_helper",
            // After it is linked.
            "break jit_later",
            "delete 1",
            "continue",
            "bt 2",
            "next",
            "info line",
            "kill",
        ],
        &["run", "--gdb", obj.to_str().unwrap()],
    );
    // The pending breakpoint hits, with arguments and source position.
    assert!(
        out.contains("Breakpoint 1, jit_helper (x=0) at"),
        "breakpoint before linking:\n{out}"
    );
    // The backtrace walks JIT frames by name (through .eh_frame) into Kiln's own.
    let bt: Vec<&str> = out.lines().filter(|l| l.starts_with('#')).collect();
    assert!(bt.iter().any(|l| l.starts_with("#0  jit_helper")), "{out}");
    assert!(
        bt.iter().any(|l| l.contains("in jit_function (x=5)")),
        "{out}"
    );
    assert!(bt.iter().any(|l| l.contains("in main () at")), "{out}");
    assert!(bt.iter().any(|l| l.contains("call_main")), "{out}");
    // Source lines.
    assert!(
        out.contains("Line 9 of \"") && out.contains("debug_target.c\""),
        "info line:\n{out}"
    );
    assert!(out.contains("int jit_helper(int x)"), "list:\n{out}");
    // A breakpoint set after linking hits too, and `next` steps a source line.
    assert!(
        out.contains("Breakpoint 2, jit_later (x=25) at"),
        "breakpoint after linking:\n{out}"
    );
    assert!(
        out.contains("Line 17 of \""),
        "next stepped to line 17:\n{out}"
    );
}

#[test]
fn gdb_stops_in_sqlite_from_debian_libsqlite3_a() {
    let dir = kiln_testkit::programs_dir("debuggers_programs");
    let obj = dir.join("sqlite_driver.o");
    let out = gdb_on_kiln(
        &[
            "set language c",
            "set breakpoint pending on",
            "break sqlite3_prepare_v2",
            "run",
            "bt 8",
            "kill",
        ],
        &[
            "run",
            "--gdb",
            obj.to_str().unwrap(),
            "/usr/lib/x86_64-linux-gnu/libsqlite3.a",
            "-lm",
        ],
    );
    assert!(
        out.contains("Breakpoint 1, ") && out.contains("sqlite3_prepare_v2"),
        "breakpoint in an archive member:\n{out}"
    );
    let bt: Vec<&str> = out.lines().filter(|l| l.starts_with('#')).collect();
    assert!(bt[0].contains("sqlite3_prepare_v2"), "{out}");
    assert!(
        bt.iter().any(|l| l.contains(" main ()")),
        "the driver's main in the backtrace:\n{out}"
    );
}

#[test]
fn lldb_breaks_by_name_in_jit_code() {
    let obj = object("debug_target.c", &["-g", "-O0"]);
    let out = Command::new("lldb-16")
        .args([
            "-b",
            "-o",
            "settings set plugin.jit-loader.gdb.enable on",
            "-o",
            "breakpoint set -n jit_helper",
            "-o",
            "run",
            "-o",
            "bt 3",
            "-o",
            "kill",
            "--",
            kiln(),
            "run",
            "--gdb",
            obj.to_str().unwrap(),
        ])
        .stdin(Stdio::null())
        .output()
        .expect("lldb-16 runs (the test command installs it)");
    let out = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.contains("stop reason = breakpoint 1.1"), "{out}");
    assert!(
        out.contains("`jit_helper(x=0) at debug_target.c:9"),
        "{out}"
    );
    assert!(
        out.contains("`jit_function(x=5) at debug_target.c"),
        "{out}"
    );
}

#[test]
fn gdb_attached_to_the_executor_breaks_in_the_code_it_runs() {
    for transport in ["shm", "copy"] {
        gdb_attached_to_the_executor(transport);
    }
}

fn gdb_attached_to_the_executor(transport: &str) {
    kiln_testkit::executor_binary();
    let obj = object("wait_then_work.c", &["-g", "-O0"]);
    let mut child = Command::new(kiln())
        .args(["run", "--oop", "--transport", transport, "--gdb"])
        .arg(&obj)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The program says "ready" once it runs in the executor.
    let mut stderr = BufReader::new(child.stderr.take().unwrap());
    let mut line = String::new();
    stderr.read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "ready");
    let executor = children_of(child.id())
        .into_iter()
        .next()
        .expect("kiln run --oop has an executor child");
    // gdb attaches, sets a breakpoint, then lets the program go on (by writing its input
    // from gdb's shell once the breakpoint is in).
    let go = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("go-{executor}"));
    let _ = std::fs::remove_file(&go);
    let gdb = Command::new("gdb")
        .args([
            "-batch",
            "-nx",
            "-p",
            &executor.to_string(),
            "-ex",
            "set language c",
            // A software breakpoint: with gdb support the executor maps code privately.
            "-ex",
            "break jit_work",
            "-ex",
            &format!("shell touch {}", go.display()),
            "-ex",
            "continue",
            "-ex",
            "bt 3",
            "-ex",
            "info line",
            "-ex",
            "detach",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("gdb runs");
    let deadline = Instant::now() + Duration::from_secs(60);
    while !go.exists() {
        assert!(Instant::now() < deadline, "gdb never set its breakpoint");
        std::thread::sleep(Duration::from_millis(50));
    }
    child.stdin.as_mut().unwrap().write_all(b"go\n").unwrap();
    let out = gdb.wait_with_output().unwrap();
    let out = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let status = child.wait_with_output().unwrap();
    assert!(
        out.contains("Breakpoint 1, jit_work (n=10) at"),
        "{transport}: {out}"
    );
    assert!(out.contains("in main () at"), "{out}");
    assert!(out.contains("wait_then_work.c\""), "{out}");
    assert_eq!(String::from_utf8_lossy(&status.stdout), "work 45\n");
}

/// The pids of `pid`'s children.
fn children_of(pid: u32) -> Vec<u32> {
    let mut all = Vec::new();
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap() {
        let path = task.unwrap().path().join("children");
        if let Ok(text) = std::fs::read_to_string(path) {
            all.extend(
                text.split_whitespace()
                    .filter_map(|p| p.parse::<u32>().ok()),
            );
        }
    }
    all
}

/// `perf record -k 1 -e cpu-clock` of `kiln run FLAGS perf_hot.o`, into `data`.
fn perf_record(data: &Path, flags: &[&str]) {
    perf_record_of("perf_hot.c", data, flags)
}

/// As [`perf_record`], of the program `source`.
fn perf_record_of(source: &str, data: &Path, flags: &[&str]) {
    let obj = object(source, &["-g", "-O1"]);
    let mut args: Vec<std::ffi::OsString> = vec!["run".into()];
    args.extend(flags.iter().map(Into::into));
    args.push(obj.into());
    // Kiln started with its pid's perf map name freed: a pid is reused, and a name an
    // earlier process left taken is rightly refused (perf would show no names).
    let command = kiln_testkit::with_free_perf_map(kiln(), &args);
    for _ in 0..20 {
        let out = Command::new("perf")
            .args(["record", "-q", "-k", "1", "-e", "cpu-clock", "-o"])
            .arg(data)
            .arg("--")
            .args(&command)
            .output()
            .expect("perf runs (the test command installs linux-perf)");
        if kiln_testkit::perf_map_was_taken(&out) {
            continue;
        }
        assert!(
            out.status.success(),
            "perf record: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        return;
    }
    panic!("20 pids in a row had their perf map name taken by another user's file");
}

/// The first sample line of `perf report --stdio` (the symbol with most samples).
fn top_of_report(data: &Path, sort: &str) -> String {
    let out = Command::new("perf")
        .args(["report", "--stdio", "-s", sort, "-i"])
        .arg(data)
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find(|l| !l.starts_with('#') && !l.trim().is_empty())
        .unwrap_or("")
        .to_string()
}

#[test]
fn perf_inject_jit_names_the_hot_jit_function_and_its_lines() {
    perf_inject_jit("in-process", &[]);
}

#[test]
fn perf_inject_jit_names_the_hot_function_run_by_the_executor() {
    kiln_testkit::executor_binary();
    perf_inject_jit("out-of-process", &["--oop"]);
}

/// `perf record` of `kiln run --jitdump=DIR FLAGS SOURCE's object`, then `perf inject
/// --jit`: the injected data's path.
fn perf_inject(name: &str, source: &str, flags: &[&str]) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("jitdump-{name}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let data = dir.join("perf.data");
    let jitdump = format!("--jitdump={}", dir.display());
    let mut all = flags.to_vec();
    all.push(&jitdump);
    perf_record_of(source, &data, &all);
    let injected = dir.join("perf.jit.data");
    let out = Command::new("perf")
        .args(["inject", "--jit", "-i"])
        .arg(&data)
        .arg("-o")
        .arg(&injected)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    injected
}

fn perf_inject_jit(name: &str, flags: &[&str]) {
    let injected = perf_inject(name, "perf_hot.c", flags);
    // The process that ran the code (kiln, or its executor) wrote the dump.
    let comm = if flags.contains(&"--oop") {
        "kiln-executor"
    } else {
        "kiln"
    };
    let top = top_of_report(&injected, "comm,dso,sym");
    assert!(
        top.split_whitespace().nth(1) == Some(comm)
            && top.contains("jitted-")
            && top.contains("jit_hot_loop"),
        "{name}: top of the report: {top}"
    );
    // With -g, the lines: the loop's body is where the samples are.
    let top = top_of_report(&injected, "sym,srcline");
    assert!(
        top.contains("jit_hot_loop") && top.contains("perf_hot.c:1"),
        "{name}: top by source line: {top}"
    );
}

#[test]
fn perf_report_names_jit_functions_from_the_perf_map() {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("perfmap-test");
    std::fs::create_dir_all(&dir).unwrap();
    let data = dir.join("perf.data");
    perf_record(&data, &["--perf-map"]);
    let top = top_of_report(&data, "sym");
    assert!(top.contains("jit_hot_loop"), "top of the report: {top}");
}

#[test]
fn a_function_written_on_one_line_gets_its_line_in_perf() {
    let injected = perf_inject("one-line", "perf_one_line.c", &[]);
    let top = top_of_report(&injected, "sym,srcline");
    assert!(
        top.contains("jit_one_line") && top.contains("perf_one_line.c:5"),
        "top by source line: {top}"
    );
}
