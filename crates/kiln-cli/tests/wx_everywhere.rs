//! W^X for the whole process, in every mode: a probe program run by `kiln run` scans its
//! own `/proc/self/maps` (from `main` and from a second thread) and reports every mapping
//! that is writable and executable and the stack's permissions. In process and out of
//! process (shared memory, copies, a pre-started executor, TCP with a key), with exports
//! on and off, with static TLS, with the GDB interface, a perf map and a jitdump: no
//! mapping may be writable and executable, and the stack must have the permissions it has
//! in the natively linked program. The executor listener is scanned from outside, and every
//! ELF file Kiln writes must say its stack is not executable.

use kiln_testkit::{cc, executor_binary};
use object::read::elf::{FileHeader, ProgramHeader};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

struct Probe {
    plain: PathBuf,
    static_tls: PathBuf,
    /// The stack's permissions in the natively linked probe (`rw-p`).
    native_stack: String,
}

fn tmp() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("wx-everywhere")
}

fn probe() -> &'static Probe {
    static PROBE: OnceLock<Probe> = OnceLock::new();
    PROBE.get_or_init(|| {
        let dir = tmp();
        std::fs::create_dir_all(&dir).unwrap();
        let src = kiln_testkit::source("wx_probe.c");
        let plain = dir.join("wx_probe.o");
        let static_tls = dir.join("wx_probe_tls.o");
        let native = dir.join("wx_probe");
        cc(&["-O1", "-c"], &src, &plain);
        cc(&["-O1", "-c", "-DSTATIC_TLS"], &src, &static_tls);
        cc(&["-O1", "-pthread"], &src, &native);
        let out = Command::new(&native).output().unwrap();
        let report = String::from_utf8_lossy(&out.stdout).to_string();
        assert!(out.status.success(), "the native probe: {report}");
        let native_stack = stack_of(&report, "main");
        assert_eq!(native_stack, stack_of(&report, "thread"), "{report}");
        Probe {
            plain,
            static_tls,
            native_stack,
        }
    })
}

/// The `stack=` field of the probe's line for `who`.
fn stack_of(report: &str, who: &str) -> String {
    report
        .lines()
        .find(|l| l.starts_with(&format!("{who} stack=")))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|f| f.strip_prefix("stack="))
        .unwrap_or_else(|| panic!("no line for {who} in:\n{report}"))
        .to_string()
}

/// Runs the probe (plain and with static TLS) under `kiln run FLAGS` and checks the report.
fn assert_no_wx(mode: &str, flags: &[&str], env: &[(&str, &str)]) {
    executor_binary();
    let probe = probe();
    for object in [&probe.plain, &probe.static_tls] {
        let out = Command::new(env!("CARGO_BIN_EXE_kiln"))
            .arg("run")
            .args(flags)
            .arg(object)
            .envs(env.iter().copied())
            .output()
            .unwrap();
        let report = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        let what = format!("{mode}, {}:\n{report}\n{stderr}", object.display());
        assert!(
            !report.contains("W+X"),
            "a mapping is writable and executable ({what})"
        );
        for who in ["main", "thread"] {
            assert!(
                report.contains(&format!("{who} stack=")),
                "the probe did not report ({what})"
            );
            assert!(
                report.contains(&format!("{who} stack={} wx=0 maps=1", probe.native_stack)),
                "{who}'s stack differs from the native program's {} ({what})",
                probe.native_stack
            );
        }
        assert_eq!(out.status.code(), Some(0), "{what}");
    }
}

#[test]
fn in_process_with_exports() {
    assert_no_wx("in process", &[], &[]);
}

#[test]
fn in_process_without_exports() {
    assert_no_wx("--no-export-dynamic", &["--no-export-dynamic"], &[]);
}

#[test]
fn in_process_with_debugger_and_profiler_outputs() {
    let jitdump = tmp().join("jitdump-in");
    std::fs::create_dir_all(&jitdump).unwrap();
    let jitdump = format!("--jitdump={}", jitdump.display());
    assert_no_wx("debug outputs", &["--gdb", "--perf-map", &jitdump], &[]);
}

#[test]
fn out_of_process_shared_memory() {
    assert_no_wx("--oop", &["--oop"], &[]);
}

#[test]
fn out_of_process_copies() {
    assert_no_wx("--oop copy", &["--oop", "--transport", "copy"], &[]);
}

#[test]
fn out_of_process_with_debugger_and_profiler_outputs() {
    let jitdump = tmp().join("jitdump-oop");
    std::fs::create_dir_all(&jitdump).unwrap();
    let jitdump = format!("--jitdump={}", jitdump.display());
    let flags = ["--oop", "--gdb", "--perf-map", &jitdump];
    assert_no_wx("--oop debug outputs", &flags, &[]);
}

/// The writable-and-executable mappings of process `pid`, read from outside.
fn wx_mappings_of(pid: u32) -> Vec<String> {
    std::fs::read_to_string(format!("/proc/{pid}/maps"))
        .unwrap()
        .lines()
        .filter(|l| {
            let perms = l.split_whitespace().nth(1).unwrap_or("");
            perms.get(1..3) == Some("wx")
        })
        .map(str::to_string)
        .collect()
}

#[test]
fn pre_started_executor() {
    let socket = tmp().join(format!("executor-{}.sock", std::process::id()));
    let _ = std::fs::remove_file(&socket);
    let socket_text = socket.display().to_string();
    let executor = kiln_testkit::start_executor(&["--listen-unix", &socket_text], None, &[]);
    assert_no_wx(
        "pre-started",
        &["--oop"],
        &[("KILN_EXECUTOR_SOCKET", &socket_text)],
    );
    assert_eq!(wx_mappings_of(executor.child.id()), Vec::<String>::new());
}

#[test]
fn over_tcp_with_a_key() {
    let key = tmp().join(format!("wx-{}.key", std::process::id()));
    let _ = std::fs::remove_file(&key);
    let key_text = key.display().to_string();
    let executor = kiln_testkit::start_executor(
        &["--listen", "127.0.0.1:0", "--key-file", &key_text],
        None,
        &[],
    );
    let flags = ["--connect", &executor.address, "--key-file", &key_text];
    assert_no_wx("--connect", &flags, &[]);
    // The listener itself, from outside.
    assert_eq!(wx_mappings_of(executor.child.id()), Vec::<String>::new());
}

/// The program headers' `PT_GNU_STACK` flags of an ELF file.
fn gnu_stack_flags(file: &[u8]) -> Vec<object::elf::ProgramFlags> {
    use object::{elf, LittleEndian as LE};
    let header = elf::FileHeader64::<LE>::parse(file).unwrap();
    header
        .program_headers(LE, file)
        .unwrap()
        .iter()
        .filter(|p| p.p_type(LE) == elf::PT_GNU_STACK)
        .map(|p| p.p_flags(LE))
        .collect()
}

#[test]
fn kiln_link_images_say_the_stack_is_not_executable() {
    let probe = probe();
    let image = tmp().join("wx_probe.image");
    let out = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(["link", "--allow-undefined", "-o"])
        .arg(&image)
        .arg(&probe.plain)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let bytes = std::fs::read(&image).unwrap();
    use object::elf::{PF_R, PF_W};
    assert_eq!(gnu_stack_flags(&bytes), [PF_R | PF_W]);
}

/// `kiln run --perf-map` in a new pid namespace, where it is pid 1 and writes
/// `/tmp/perf-1.map`: planted there as a symbolic link to another file, it is refused with a
/// warning that says what is there and whose it is, the program runs all the same, and the
/// other file is untouched.
#[test]
fn a_planted_perf_map_symlink_is_refused() {
    let probe = probe();
    // Only as root (a new pid namespace needs it), and only where nothing else of ours
    // runs as pid 1 in a namespace of its own at the same time.
    let root = std::fs::read_to_string("/proc/self/status")
        .unwrap()
        .lines()
        .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(2) == Some("0"));
    if !root {
        eprintln!("skipped: needs root for a pid namespace");
        return;
    }
    let victim = tmp().join("perf-victim.txt");
    std::fs::write(&victim, "another user's file\n").unwrap();
    let planted = Path::new("/tmp/perf-1.map");
    let _ = std::fs::remove_file(planted);
    std::os::unix::fs::symlink(&victim, planted).unwrap();
    let out = Command::new("unshare")
        .args(["--pid", "--fork"])
        .arg(env!("CARGO_BIN_EXE_kiln"))
        .args(["run", "--perf-map"])
        .arg(&probe.plain)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let _ = std::fs::remove_file(planted);
    assert_eq!(
        std::fs::read_to_string(&victim).unwrap(),
        "another user's file\n"
    );
    // The program ran (a planted map does not stop it).
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(
        stderr.contains("warning: no perf map")
            && stderr.contains("/tmp/perf-1.map")
            && stderr.contains("symbolic link owned by uid 0"),
        "{stderr}"
    );
}
