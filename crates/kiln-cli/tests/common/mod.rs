//! What the CLI's test files share: the native builds of the test programs, the executor
//! binary, the C compiler.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// The test programs built natively (objects, binaries, expected outputs) by
/// tests/programs/build_native.sh into `CARGO_TARGET_TMPDIR/name`, once per test process.
pub(crate) fn programs_dir(name: &str) -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let out = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(name);
        let script =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/programs/build_native.sh");
        let status = Command::new("bash")
            .arg(&script)
            .arg(&out)
            .stdout(std::process::Stdio::null())
            .status()
            .expect("bash runs build_native.sh");
        assert!(
            status.success(),
            "build_native.sh failed: the native programs must build"
        );
        out
    })
}

/// A source file of tests/programs.
pub(crate) fn source(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/programs")
        .join(name)
}

/// The kiln-executor binary next to kiln (built on demand when only this package's tests
/// were built).
pub(crate) fn ensure_executor() {
    let path = Path::new(env!("CARGO_BIN_EXE_kiln")).with_file_name("kiln-executor");
    if !path.exists() {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        assert!(Command::new(cargo)
            .args(["build", "-p", "kiln-executor"])
            .status()
            .unwrap()
            .success());
    }
}

/// `cc FLAGS SRC -o OUT`, which must succeed.
pub(crate) fn cc(flags: &[&str], src: &Path, out: &Path) {
    let status = Command::new("cc")
        .args(flags)
        .arg(src)
        .arg("-o")
        .arg(out)
        .status()
        .expect("cc runs");
    assert!(status.success(), "cc {flags:?} {}", src.display());
}

/// A `kiln-executor` started by a test, killed when dropped.
pub(crate) struct ExecutorProcess {
    /// The process.
    pub(crate) child: std::process::Child,
    /// What it listens on (`HOST:PORT` or the socket's path), from its
    /// "listening on" line.
    pub(crate) address: String,
}

impl Drop for ExecutorProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts this build's `kiln-executor ARGS` (from `cwd` if given, without `env_remove`'s
/// variables) and waits for its "listening on" line; its stderr is drained after.
pub(crate) fn start_executor(
    args: &[&str],
    cwd: Option<&Path>,
    env_remove: &[&str],
) -> ExecutorProcess {
    use std::io::BufRead;
    ensure_executor();
    let exe = Path::new(env!("CARGO_BIN_EXE_kiln")).with_file_name("kiln-executor");
    let mut command = Command::new(exe);
    command
        .args(args)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped());
    if let Some(dir) = cwd {
        command.current_dir(dir);
    }
    for name in env_remove {
        command.env_remove(name);
    }
    let mut child = command.spawn().expect("kiln-executor starts");
    let mut stderr = std::io::BufReader::new(child.stderr.take().expect("stderr"));
    let mut line = String::new();
    while !line.contains("listening on") {
        line.clear();
        assert!(
            stderr.read_line(&mut line).expect("stderr reads") > 0,
            "the executor ended before listening"
        );
    }
    std::thread::spawn(move || std::io::copy(&mut stderr, &mut std::io::sink()));
    let address = line
        .trim()
        .rsplit(' ')
        .next()
        .unwrap_or_default()
        .to_string();
    ExecutorProcess { child, address }
}
