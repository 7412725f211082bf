//! `/tmp/perf-<pid>.map` for tests: a name shared by every process that ever had the pid.
//!
//! Pids are reused (`kernel.pid_max` is 32,768 on many machines, and a test run starts tens
//! of thousands of processes), and Kiln rightly refuses to write a perf map whose name is
//! taken by something not its own (a link, another user's file: see
//! `kiln_runtime::debug_outputs::create_own_file`). A file left there by an earlier
//! process, e.g. by a test that plants one and failed before removing it, then silently
//! empties the perf map of whichever later process gets the pid. So a test that reads a
//! perf map first frees its name, and runs a program whose pid it cannot choose through a
//! shell that frees the name of its own pid and then becomes the program (`exec` keeps the
//! pid).

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

/// The perf map's name for process `pid`.
pub fn perf_map_path(pid: u32) -> PathBuf {
    PathBuf::from(format!("/tmp/perf-{pid}.map"))
}

/// Frees process `pid`'s perf map name of what Kiln would refuse to write (a link, a
/// FIFO, another user's file, a file with other links); a regular file of this user's is
/// left (Kiln empties and reuses it, and in a test process it may be this process's own
/// open map). Panics, saying what is there, if it cannot be removed (another user's file
/// in `/tmp` when the test does not run as root).
pub fn free_perf_map(pid: u32) {
    use std::os::unix::fs::MetadataExt;
    let path = perf_map_path(pid);
    let Ok(meta) = std::fs::symlink_metadata(&path) else {
        return;
    };
    let mine = std::fs::metadata("/proc/self").map(|m| m.uid()).ok();
    if meta.file_type().is_file() && Some(meta.uid()) == mine && meta.nlink() == 1 {
        return;
    }
    if let Err(e) = std::fs::remove_file(&path) {
        panic!(
            "{} is taken ({:?}, uid {}) and cannot be removed ({e}): remove it, then run the test again",
            path.display(),
            meta.file_type(),
            meta.uid()
        );
    }
}

/// What the wrapping shell prints (and exits with) when its own pid's perf map name is
/// taken and cannot be freed: the command is then started again (a new pid).
const TAKEN: &str = "kiln-testkit: perf map name taken";
const TAKEN_STATUS: i32 = 97;

/// `program args…` as the arguments of a shell that frees `/tmp/perf-$$.map` and then
/// `exec`s the program in its own process (same pid): for a command line another tool
/// starts (`perf record -- …`).
pub fn with_free_perf_map(program: impl Into<OsString>, args: &[OsString]) -> Vec<OsString> {
    let script = format!(
        "map=/tmp/perf-$$.map; rm -f \"$map\" 2>/dev/null; \
         if [ -e \"$map\" ] || [ -L \"$map\" ]; then echo '{TAKEN}' >&2; exit {TAKEN_STATUS}; fi; \
         exec \"$@\""
    );
    let mut argv: Vec<OsString> = vec!["sh".into(), "-c".into(), script.into(), "sh".into()];
    argv.push(program.into());
    argv.extend(args.iter().cloned());
    argv
}

/// Whether `output` (of the wrapping shell, or of a tool that ran it) is the shell's "name
/// taken" answer: start it again.
pub fn perf_map_was_taken(output: &Output) -> bool {
    String::from_utf8_lossy(&output.stderr).contains(TAKEN)
}

/// Runs `command` (its program, arguments, environment and directory) as a process whose
/// perf map name was free when it started; answers its pid and output. Started again, a
/// few times at most, while its pid's name is another user's.
pub fn output_with_free_perf_map(command: &Command) -> (u32, Output) {
    for _ in 0..20 {
        let args: Vec<OsString> = command.get_args().map(OsString::from).collect();
        let argv = with_free_perf_map(command.get_program(), &args);
        let mut wrapped = Command::new(&argv[0]);
        wrapped.args(&argv[1..]);
        for (key, value) in command.get_envs() {
            match value {
                Some(value) => wrapped.env(key, value),
                None => wrapped.env_remove(key),
            };
        }
        if let Some(dir) = command.get_current_dir() {
            wrapped.current_dir(dir);
        }
        let child = wrapped
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("starting {:?}: {e}", command.get_program()));
        let pid = child.id();
        let output = child
            .wait_with_output()
            .unwrap_or_else(|e| panic!("waiting for {:?}: {e}", command.get_program()));
        if !perf_map_was_taken(&output) {
            return (pid, output);
        }
    }
    panic!("20 pids in a row had their perf map name taken by another user's file in /tmp")
}
