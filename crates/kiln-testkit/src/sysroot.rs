//! The test programs of `tests/programs`, and what `scripts/test_deps.sh` unpacks into a
//! private sysroot rather than install on the machine (foreign-architecture libraries,
//! packages apt could not install without upgrading others).

use crate::compile::target_dir;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// The repository's root.
pub fn repository() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// A source file of tests/programs.
pub fn source(name: &str) -> PathBuf {
    repository().join("tests/programs").join(name)
}

/// The test programs built natively (objects, binaries, expected outputs) by
/// tests/programs/build_native.sh into `target/tmp/NAME/PID`, once per test process: a
/// directory of its own, as test binaries run at once (the test command's two lanes) and
/// a rebuilt object is a changed input to another's image cache.
pub fn programs_dir(name: &str) -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let out = crate::scratch_dir(&format!("{name}/{}", std::process::id()));
        let status = Command::new("bash")
            .arg(repository().join("tests/programs/build_native.sh"))
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

/// One program of tests/programs/build_native.sh's manifest (in [`programs_dir`]
/// `kiln-programs`): how to link it, its arguments, the native program's output.
#[derive(Debug, Clone)]
pub struct NativeProgram {
    /// `cc` or `c++`.
    pub driver: String,
    /// Its objects, relative to the programs' directory.
    pub objects: Vec<String>,
    /// Its libraries (archives by path, `-lNAME`).
    pub libs: Vec<String>,
    /// The program's arguments.
    pub args: Vec<String>,
    /// What the natively linked program printed.
    pub expected: String,
}

impl NativeProgram {
    /// `kiln run`'s inputs and arguments for it: the objects (absolute), the libraries,
    /// `-lstdc++` for C++, then `--` and its arguments.
    pub fn kiln_run_args(&self) -> Vec<String> {
        let dir = programs_dir("kiln-programs");
        let mut args: Vec<String> = self
            .objects
            .iter()
            .map(|o| dir.join(o).display().to_string())
            .collect();
        args.extend(self.libs.iter().cloned());
        if self.driver == "c++" {
            args.push("-lstdc++".into());
        }
        args.push("--".into());
        args.extend(self.args.iter().cloned());
        args
    }
}

/// The program `name` of the manifest (built once per test process).
pub fn native_program(name: &str) -> NativeProgram {
    let dir = programs_dir("kiln-programs");
    let manifest = std::fs::read_to_string(dir.join("manifest.tsv")).expect("the manifest");
    let line = manifest
        .lines()
        .find(|l| l.split('\t').next() == Some(name))
        .unwrap_or_else(|| panic!("{name} not in the manifest"));
    let f: Vec<&str> = line.split('\t').collect();
    let words = |s: &str| -> Vec<String> {
        s.split_whitespace()
            .map(|w| w.replace("@OUT@", &dir.display().to_string()))
            .collect()
    };
    NativeProgram {
        driver: f[1].to_string(),
        objects: words(f[3]),
        libs: words(f[5]),
        args: words(f[6]),
        expected: std::fs::read_to_string(dir.join(f[7])).expect("the expected output"),
    }
}

/// Where scripts/test_deps.sh puts what it does not install on the machine: `name` of
/// `target/sysroot` (`aarch64`, `native`), or the directory the variable `var` names.
fn private_sysroot(var: &str, name: &str) -> PathBuf {
    match std::env::var_os(var) {
        Some(dir) if !dir.is_empty() => PathBuf::from(dir),
        _ => target_dir().join("sysroot").join(name),
    }
}

/// Whether the cross-architecture parts are skipped (`KILN_TEST_SKIP_CROSS` set, not
/// `0`); says so on stderr for `test`.
pub fn skip_cross(test: &str) -> bool {
    let skip = std::env::var("KILN_TEST_SKIP_CROSS").is_ok_and(|v| !v.is_empty() && v != "0");
    if skip {
        // Straight to stderr, past the test harness's capture: the skip shows in the run.
        use std::io::Write;
        let _ = writeln!(
            std::io::stderr(),
            "{test}: skipped: KILN_TEST_SKIP_CROSS is set (no AArch64 or RISC-V cross compiler, qemu \
             or arm64 libraries)"
        );
    }
    skip
}

/// Debian's arm64 libraries and headers, unpacked by scripts/test_deps.sh into
/// `KILN_AARCH64_SYSROOT` (default `target/sysroot/aarch64`): its
/// `usr/lib/aarch64-linux-gnu` holds libz.a, libsqlite3.a and liblua5.4.a.
pub fn aarch64_sysroot() -> PathBuf {
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
pub fn aarch64_lib_dir() -> PathBuf {
    aarch64_sysroot().join("usr/lib/aarch64-linux-gnu")
}

/// `-I` options for arm64 compiles: the sysroot's headers (zlib, SQLite, Lua 5.4, and
/// the multiarch ones Lua's include).
pub fn aarch64_includes() -> Vec<String> {
    let root = aarch64_sysroot();
    vec![
        format!("-I{}", root.join("usr/include/lua5.4").display()),
        format!("-I{}", root.join("usr/include/aarch64-linux-gnu").display()),
        format!("-I{}", root.join("usr/include").display()),
    ]
}

/// The qemu-aarch64 guest's root: the cross compiler's C library (Debian's
/// libc6-arm64-cross), the one the AArch64 programs are linked against.
pub const AARCH64_GUEST_ROOT: &str = "/usr/aarch64-linux-gnu";

/// A file of a native Debian package: where the machine has it, else under
/// `KILN_NATIVE_SYSROOT` (default `target/sysroot/native`), where scripts/test_deps.sh
/// unpacks packages apt could not install without upgrading others.
pub fn host_file(path: &str) -> PathBuf {
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
pub fn python_config_dir() -> PathBuf {
    host_file("/usr/lib/python3.11/config-3.11-x86_64-linux-gnu/libpython3.11-pic.a")
        .parent()
        .expect("the archive lies in a directory")
        .to_path_buf()
}

/// The environment an interpreter needs to find CPython's test modules
/// (libpython3.11-testsuite): none when they are installed, else `PYTHONPATH` naming the
/// private copy (the machine's `test`, `ctypes`, … packages with the test modules added).
pub fn python_tests_env() -> Vec<(String, PathBuf)> {
    if Path::new("/usr/lib/python3.11/test/test_json").exists() {
        return Vec::new();
    }
    let private = host_file("/usr/lib/python3.11/test/test_json");
    let lib = private
        .ancestors()
        .nth(2)
        .expect("test_json lies in lib/test")
        .to_path_buf();
    vec![("PYTHONPATH".into(), lib)]
}

/// The unpacked source of `package` (`libsqlite3-sys`, `lua-src`, `libz-sys`), one of the
/// crates tests/c-sources/Cargo.toml names for the C they carry: fetched by
/// scripts/test_deps.sh (`cargo fetch`), found here with `cargo metadata --offline`.
pub fn c_sources(package: &str) -> PathBuf {
    find_c_sources(package).unwrap_or_else(|why| panic!("{why}"))
}

/// [`c_sources`], or why it cannot be found (for benchmarks, which skip what is missing).
pub fn find_c_sources(package: &str) -> Result<PathBuf, String> {
    let manifest = repository().join("tests/c-sources/Cargo.toml");
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let out = Command::new(cargo)
        .args([
            "metadata",
            "--format-version",
            "1",
            "--offline",
            "--manifest-path",
        ])
        .arg(&manifest)
        .output()
        .map_err(|e| format!("cargo metadata: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "cargo metadata of {}: {} (run scripts/test_deps.sh, which fetches the C sources)",
            manifest.display(),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    // The package's `"manifest_path":".../PACKAGE-VERSION/Cargo.toml"`, read without a
    // JSON parser: the testkit has no dependencies.
    let text = String::from_utf8_lossy(&out.stdout);
    text.split("\"manifest_path\":\"")
        .skip(1)
        .filter_map(|rest| rest.split('"').next())
        .filter_map(|path| Path::new(path).parent().map(Path::to_path_buf))
        .find(|dir| {
            dir.file_name().and_then(|n| n.to_str()).is_some_and(|n| {
                n.strip_prefix(package)
                    .and_then(|v| v.strip_prefix('-'))
                    .is_some_and(|v| v.starts_with(|c: char| c.is_ascii_digit()))
            })
        })
        .ok_or_else(|| format!("{package} is not among {}'s packages", manifest.display()))
}

/// The C files of `dir` (a library's sources from [`c_sources`]), sorted, without those
/// named in `skip` (a library's programs: `lua.c`, `luac.c`).
pub fn c_files(dir: &Path, skip: &[&str]) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "c"))
        .filter(|p| !skip.iter().any(|s| p.file_name().is_some_and(|n| n == *s)))
        .collect();
    files.sort();
    files
}
