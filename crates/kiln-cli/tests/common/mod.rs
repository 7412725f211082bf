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
    pub(crate) child: KillOnDrop,
    /// What it listens on (`HOST:PORT` or the socket's path), from its
    /// "listening on" line.
    pub(crate) address: String,
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
    let mut child = KillOnDrop(command.spawn().expect("kiln-executor starts"));
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

/// Where scripts/test_deps.sh puts what it does not install on the machine: `name` of
/// `target/sysroot` (`aarch64`, `native`), or the directory the variable `var` names.
fn private_sysroot(var: &str, name: &str) -> PathBuf {
    match std::env::var_os(var) {
        Some(dir) if !dir.is_empty() => PathBuf::from(dir),
        _ => PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
            .join("../sysroot")
            .join(name),
    }
}

/// Whether the cross-architecture parts are skipped (`KILN_TEST_SKIP_CROSS` set, not
/// `0`); says so on stderr for `test`.
pub(crate) fn skip_cross(test: &str) -> bool {
    let skip = std::env::var("KILN_TEST_SKIP_CROSS").is_ok_and(|v| !v.is_empty() && v != "0");
    if skip {
        // Straight to stderr, past the test harness's capture: the skip shows in the run.
        use std::io::Write;
        let _ = writeln!(
            std::io::stderr(),
            "{test}: skipped: KILN_TEST_SKIP_CROSS is set (no AArch64 cross compiler, qemu \
             or arm64 libraries)"
        );
    }
    skip
}

/// Debian's arm64 libraries and headers, unpacked by scripts/test_deps.sh into
/// `KILN_AARCH64_SYSROOT` (default `target/sysroot/aarch64`): its
/// `usr/lib/aarch64-linux-gnu` holds libz.a, libsqlite3.a and liblua5.4.a.
pub(crate) fn aarch64_sysroot() -> PathBuf {
    let root = private_sysroot("KILN_AARCH64_SYSROOT", "aarch64");
    assert!(
        root.join("usr/lib/aarch64-linux-gnu/libsqlite3.a")
            .is_file(),
        "no arm64 libraries in {}: run scripts/test_deps.sh (or set KILN_AARCH64_SYSROOT, \
         or KILN_TEST_SKIP_CROSS=1 to skip the AArch64 tests)",
        root.display()
    );
    root
}

/// Debian's arm64 libraries directory in [`aarch64_sysroot`].
pub(crate) fn aarch64_lib_dir() -> PathBuf {
    aarch64_sysroot().join("usr/lib/aarch64-linux-gnu")
}

/// `-I` options for arm64 compiles: the sysroot's headers (zlib, SQLite, Lua 5.4, and
/// the multiarch ones Lua's include).
pub(crate) fn aarch64_includes() -> Vec<String> {
    let root = aarch64_sysroot();
    vec![
        format!("-I{}", root.join("usr/include/lua5.4").display()),
        format!("-I{}", root.join("usr/include/aarch64-linux-gnu").display()),
        format!("-I{}", root.join("usr/include").display()),
    ]
}

/// The qemu-aarch64 guest's root: the cross compiler's C library (Debian's
/// libc6-arm64-cross), the one the AArch64 programs are linked against.
pub(crate) const AARCH64_GUEST_ROOT: &str = "/usr/aarch64-linux-gnu";

/// A file of a native Debian package: where the machine has it, else under
/// `KILN_NATIVE_SYSROOT` (default `target/sysroot/native`), where scripts/test_deps.sh
/// unpacks packages apt could not install without upgrading others.
pub(crate) fn host_file(path: &str) -> PathBuf {
    let on_host = PathBuf::from(path);
    if on_host.exists() {
        return on_host;
    }
    let private =
        private_sysroot("KILN_NATIVE_SYSROOT", "native").join(path.trim_start_matches('/'));
    assert!(
        private.exists(),
        "{path} is neither on this machine nor in {}: run scripts/test_deps.sh",
        private.display()
    );
    private
}

/// CPython's configuration directory (python.o, libpython3.11-pic.a), from
/// libpython3.11-dev.
pub(crate) fn python_config_dir() -> PathBuf {
    host_file("/usr/lib/python3.11/config-3.11-x86_64-linux-gnu/libpython3.11-pic.a")
        .parent()
        .unwrap()
        .to_path_buf()
}

/// The environment an interpreter needs to find CPython's test modules
/// (libpython3.11-testsuite): none when they are installed, else `PYTHONPATH` naming the
/// private copy (the machine's `test`, `ctypes`, … packages with the test modules added).
pub(crate) fn python_tests_env() -> Vec<(String, PathBuf)> {
    if Path::new("/usr/lib/python3.11/test/test_json").exists() {
        return Vec::new();
    }
    let private = host_file("/usr/lib/python3.11/test/test_json");
    let lib = private.parent().unwrap().parent().unwrap().to_path_buf();
    vec![("PYTHONPATH".into(), lib)]
}

/// A child process (an executor a test started) killed and reaped when dropped, also when
/// the test panics first: left running, it would hold the test run's output open.
pub(crate) struct KillOnDrop(pub(crate) std::process::Child);

impl std::ops::Deref for KillOnDrop {
    type Target = std::process::Child;
    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

impl std::ops::DerefMut for KillOnDrop {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.0
    }
}

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
