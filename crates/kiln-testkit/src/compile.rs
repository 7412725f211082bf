//! Objects from the system compilers, compiled in a scratch directory of the build.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The build's target directory (`target/`), found from the running test binary
/// (`target/debug/deps/NAME-HASH`).
pub(crate) fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary's path");
    // A test binary lies in target/PROFILE/deps, a benchmark run by its name in
    // target/PROFILE.
    let up = if exe.parent().is_some_and(|d| d.ends_with("deps")) {
        3
    } else {
        2
    };
    exe.ancestors()
        .nth(up)
        .expect("the binary lies in target/PROFILE or target/PROFILE/deps")
        .to_path_buf()
}

/// A scratch directory `target/tmp/NAME` (what `CARGO_TARGET_TMPDIR` names), created.
pub fn scratch_dir(name: &str) -> PathBuf {
    let dir = target_dir().join("tmp").join(name);
    std::fs::create_dir_all(&dir).expect("the scratch directory can be created");
    dir
}

/// Compiles `source` with `compiler -c FLAGS` and returns the object's bytes. The source
/// is `NAME.EXT` (debug information names it so) in a directory of the process and the
/// calling thread: tests run in parallel.
fn object(compiler: &str, extension: &str, name: &str, source: &str, flags: &[&str]) -> Vec<u8> {
    let dir = scratch_dir(&format!(
        "testkit/{}-{:?}",
        std::process::id(),
        std::thread::current().id()
    ));
    let src = dir.join(format!("{name}.{extension}"));
    let out = dir.join(format!("{name}.o"));
    std::fs::write(&src, source).expect("the source can be written");
    let status = Command::new(compiler)
        .args(flags)
        .arg("-c")
        .arg(&src)
        .arg("-o")
        .arg(&out)
        .status()
        .unwrap_or_else(|e| panic!("{compiler} runs: {e}"));
    assert!(status.success(), "{compiler} {flags:?} -c {name} failed");
    std::fs::read(&out).expect("the object can be read")
}

/// `cc -c FLAGS` of the C `source`: the object's bytes.
///
/// ```no_run
/// let object = kiln_testkit::cc_object("answer", "int answer(void) { return 42; }", &["-O1"]);
/// assert!(object.starts_with(b"\x7fELF"));
/// ```
pub fn cc_object(name: &str, source: &str, flags: &[&str]) -> Vec<u8> {
    object("cc", "c", name, source, flags)
}

/// `COMPILER -c FLAGS` of `source` written as `NAME.EXTENSION` (a cross compiler's, a
/// `clang-16 --target=…`'s): the object's bytes. `compiler` may hold arguments of its
/// own (`"clang-16 --target=x86_64-w64-windows-gnu"`).
///
/// ```no_run
/// let object = kiln_testkit::compiled_object(
///     "x86_64-w64-mingw32-gcc", "c", "answer", "int answer(void) { return 42; }", &["-O1"]);
/// assert_eq!(object[..2], [0x64, 0x86]); // IMAGE_FILE_MACHINE_AMD64: a COFF object
/// ```
pub fn compiled_object(
    compiler: &str,
    extension: &str,
    name: &str,
    source: &str,
    flags: &[&str],
) -> Vec<u8> {
    let mut words = compiler.split_whitespace();
    let program = words.next().expect("a compiler");
    let mut all: Vec<&str> = words.collect();
    all.extend_from_slice(flags);
    object(program, extension, name, source, &all)
}

/// `c++ -c FLAGS` of the C++ `source`: the object's bytes.
pub fn cxx_object(name: &str, source: &str, flags: &[&str]) -> Vec<u8> {
    object("c++", "cpp", name, source, flags)
}

/// `cc FLAGS SRC -o OUT`, which must succeed (objects, programs, shared libraries).
pub fn cc(flags: &[&str], src: &Path, out: &Path) {
    let status = Command::new("cc")
        .args(flags)
        .arg(src)
        .arg("-o")
        .arg(out)
        .status()
        .expect("cc runs");
    assert!(status.success(), "cc {flags:?} {}", src.display());
}

/// Runs `cmd` to success and returns what it printed (standard output, then error);
/// panics naming the command, its status and its output otherwise.
pub fn run_ok(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}):\n{text}",
        out.status
    );
    text
}

/// Installs Kiln's C API (library, header, pkg-config file) into `prefix` with
/// scripts/install_capi.sh and `args` (`--features llvm`; the library of this test
/// build's profile unless `--profile` or `--debug` says otherwise); returns what
/// `pkg-config --cflags --libs kiln` then says for it.
pub fn install_capi(prefix: &Path, args: &[&str]) -> String {
    let script = crate::repository().join("scripts/install_capi.sh");
    // This test build's profile (its library and executor), unless the caller names one.
    let profile = crate::cargo_profile();
    let own: &[&str] = if args.iter().any(|a| *a == "--profile" || *a == "--debug") {
        &[]
    } else {
        &["--profile", &profile]
    };
    run_ok(
        crate::without_test_environment(&mut Command::new("bash"))
            .arg(script)
            .arg(prefix)
            .args(own)
            .args(args),
    );
    run_ok(
        Command::new("pkg-config")
            .args(["--cflags", "--libs", "kiln"])
            .env("PKG_CONFIG_PATH", prefix.join("lib/pkgconfig")),
    )
}
