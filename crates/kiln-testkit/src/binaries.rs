//! This build's binaries, and executor processes a test starts.

use crate::compile::target_dir;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The binary `name` of this build (`target/PROFILE/NAME`), next to the test binary's
/// `deps` directory.
pub fn binary(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary's path");
    let profile = exe
        .parent()
        .and_then(Path::parent)
        .map(Path::to_path_buf)
        .unwrap_or_else(|| target_dir().join("debug"));
    profile.join(name)
}

/// The cargo profile this test binary was built with (`dev` for `target/debug`, else the
/// name of its directory under the target directory: `release`, the test command's
/// `smoke`).
pub fn cargo_profile() -> String {
    let dir = binary("kiln-executor");
    match dir
        .parent()
        .and_then(Path::file_name)
        .and_then(|n| n.to_str())
    {
        Some("debug") | None => "dev".into(),
        Some(name) => name.into(),
    }
}

/// Set by the test command (scripts/test.sh) to its profile once it has built the
/// binaries of that profile: [`cargo_build`] and scripts/install_capi.sh then build
/// nothing for it. Its tests run in two lanes at once, and a build in one would replace
/// (unlink, then link again) the executor and the C library while the other's tests
/// start them.
pub const BINARIES_BUILT: &str = "KILN_TEST_BINARIES_BUILT";

/// `cargo build --profile PROFILE -p kiln-executor -p kiln-capi`, this test build's
/// profile: what a test needs of other packages (the executor binary, the C library) is
/// built as the test itself was. Always these two packages together (as
/// scripts/install_capi.sh builds them): another selection would unify other features
/// and rebuild, and overwrite, what the last one built. Nothing when the test command
/// built them already ([`BINARIES_BUILT`]).
pub fn cargo_build() {
    if std::env::var(BINARIES_BUILT).is_ok_and(|built| built == cargo_profile()) {
        return;
    }
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut command = Command::new(cargo);
    without_test_environment(&mut command);
    // This build's target directory, absolute: a relative CARGO_TARGET_DIR would be taken
    // from the test's working directory (its package's), another directory.
    command.env("CARGO_TARGET_DIR", target_dir()).args([
        "build",
        "--profile",
        &cargo_profile(),
        "-p",
        "kiln-executor",
        "-p",
        "kiln-capi",
    ]);
    assert!(
        command.status().expect("cargo runs").success(),
        "kiln-executor and kiln-capi build"
    );
}

/// Removes from `command`'s environment what cargo sets for a test process
/// (`CARGO_MANIFEST_DIR`, `CARGO_PKG_*`, ...): a cargo run from a test would see it, and a
/// build script that watches one (ring's watches `CARGO_MANIFEST_DIR`) would run again
/// and rebuild everything after it, the test command's build undone.
pub fn without_test_environment(command: &mut Command) -> &mut Command {
    for (name, _) in std::env::vars_os() {
        let Some(name) = name.to_str() else { continue };
        let set_for_tests = name.starts_with("CARGO_PKG_")
            || name.starts_with("CARGO_BIN_EXE_")
            || matches!(
                name,
                "CARGO_MANIFEST_DIR"
                    | "CARGO_MANIFEST_PATH"
                    | "CARGO_CRATE_NAME"
                    | "CARGO_BIN_NAME"
                    | "CARGO_PRIMARY_PACKAGE"
                    | "CARGO_TARGET_TMPDIR"
                    | "CARGO_RUSTC_CURRENT_DIR"
                    | "OUT_DIR"
            );
        if set_for_tests {
            command.env_remove(name);
        }
    }
    command
}

/// This build's `kiln-executor`, built once per test process (so never a stale one: a
/// test of only one package does not build the others' binaries).
pub fn executor_binary() -> PathBuf {
    static BUILT: std::sync::Once = std::sync::Once::new();
    BUILT.call_once(cargo_build);
    binary("kiln-executor")
}

/// A `kiln-executor` started by a test, killed when dropped.
pub struct ExecutorProcess {
    /// The process.
    pub child: KillOnDrop,
    /// What it listens on (`HOST:PORT` or the socket's path), from its "listening on"
    /// line.
    pub address: String,
}

/// Starts this build's `kiln-executor ARGS` (from `cwd` if given, without `env_remove`'s
/// variables) and waits for its "listening on" line; its stderr is drained after.
pub fn start_executor(args: &[&str], cwd: Option<&Path>, env_remove: &[&str]) -> ExecutorProcess {
    let mut command = Command::new(executor_binary());
    command.args(args);
    if let Some(dir) = cwd {
        command.current_dir(dir);
    }
    for name in env_remove {
        command.env_remove(name);
    }
    start_listening(&mut command)
}

/// Starts `command` (an executor: Kiln's, executor-c, either under qemu) and waits for
/// its "listening on ADDRESS" line on standard error; what it writes there later is
/// drained (a log must never meet a closed pipe).
pub fn start_listening(command: &mut Command) -> ExecutorProcess {
    use std::io::BufRead;
    command
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped());
    let mut child = KillOnDrop(command.spawn().expect("the executor starts"));
    let mut stderr = std::io::BufReader::new(child.stderr.take().expect("stderr"));
    let mut line = String::new();
    while !line.contains("listening on") {
        line.clear();
        assert!(
            stderr.read_line(&mut line).expect("stderr reads") > 0,
            "the executor ended before listening"
        );
    }
    // What the executor says from now on goes to the test's output (shown if it fails).
    std::thread::spawn(move || {
        let mut line = String::new();
        while stderr.read_line(&mut line).is_ok_and(|n| n > 0) {
            eprint!("[executor] {line}");
            line.clear();
        }
    });
    let address = line
        .split("listening on ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap_or_default()
        .to_string();
    ExecutorProcess { child, address }
}

/// A key file (64 hex digits, mode 0600) made once per test process, for executors started
/// with `--key-file` and the clients that reach them (`kiln run --key-file`,
/// `Key::read_file`). Its 32 bytes come from the kernel's random source.
pub fn key_file() -> PathBuf {
    static MADE: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    MADE.get_or_init(|| {
        use std::io::{Read, Write};
        use std::os::unix::fs::OpenOptionsExt;
        let mut bytes = [0u8; 32];
        std::fs::File::open("/dev/urandom")
            .and_then(|mut f| f.read_exact(&mut bytes))
            .expect("random bytes for a key");
        let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        let path = crate::scratch_dir("keys").join(format!("test-{}.key", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
            .expect("the key file is created");
        writeln!(file, "{hex}").expect("the key file is written");
        path
    })
    .clone()
}

/// executor-c (`executor-c/build.sh`) built with `compiler` (`cc`, or a cross compiler
/// such as `aarch64-linux-gnu-gcc`; with `x86_64-w64-mingw32-gcc` the Windows executor,
/// whose path ends in `.exe`), once per test process and compiler.
pub fn c_executor_binary(compiler: &str) -> PathBuf {
    static BUILT: std::sync::Mutex<Vec<(String, PathBuf)>> = std::sync::Mutex::new(Vec::new());
    let mut built = BUILT.lock().unwrap_or_else(|p| p.into_inner());
    if let Some((_, binary)) = built.iter().find(|(c, _)| c == compiler) {
        return binary.clone();
    }
    // One per process: test binaries that run at once (the test command's two lanes)
    // must not write a file another one is starting.
    let binary = crate::scratch_dir("c-executor")
        .join(format!("kiln-executor-c-{compiler}-{}", std::process::id()));
    let status = Command::new("bash")
        .arg(crate::repository().join("executor-c/build.sh"))
        .arg(&binary)
        .arg(compiler)
        .status()
        .expect("bash runs executor-c/build.sh");
    assert!(
        status.success(),
        "executor-c/build.sh with {compiler} failed"
    );
    let exe = binary.with_extension("exe");
    let binary = if compiler.contains("mingw32") {
        exe
    } else {
        binary
    };
    built.push((compiler.to_string(), binary.clone()));
    binary
}

/// A child process (an executor a test started) killed and reaped when dropped, also when
/// the test panics first: left running, it would hold the test run's output open.
pub struct KillOnDrop(pub std::process::Child);

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

/// The tests' Wine prefix (`target/tmp/wine-prefix`, never the user's `~/.wine`), made
/// once: test binaries running at once (the test command's two lanes) share it, and the
/// first makes it (`wineboot --init`) holding a lock the others wait for (`flock(1)`, of
/// util-linux). Programs of one prefix running together is Wine's usual case: one
/// wineserver serves them.
pub fn wine_prefix() -> PathBuf {
    static MADE: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    MADE.get_or_init(|| {
        let prefix = crate::scratch_dir("wine-prefix");
        // A failure shows in the test's own Wine run, which says why.
        let _ = Command::new("flock")
            .arg(prefix.with_extension("lock"))
            .args([
                "sh",
                "-c",
                r#"[ -e "$1/system.reg" ] || WINEPREFIX="$1" WINEDEBUG=-all "$2" wineboot --init"#,
                "sh",
            ])
            .arg(&prefix)
            .arg(wine_binary())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status();
        prefix
    })
    .clone()
}

/// Debian's Wine launcher for 64-bit programs.
fn wine_binary() -> &'static str {
    ["/usr/lib/wine/wine64", "/usr/bin/wine64", "/usr/bin/wine"]
        .into_iter()
        .find(|p| Path::new(p).exists())
        .unwrap_or("wine64")
}

/// Wine (Debian's `wine64`), headless (`WINEDEBUG=-all`), with its prefix at `prefix`
/// (the tests': [`wine_prefix`]): what runs the Windows executor and mingw-built programs.
pub fn wine(prefix: &Path) -> Command {
    let mut command = Command::new(wine_binary());
    command.env("WINEPREFIX", prefix).env("WINEDEBUG", "-all");
    command
}
