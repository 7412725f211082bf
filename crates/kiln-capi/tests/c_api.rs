//! The C API from C: scripts/install_capi.sh installs the library, header and pkg-config
//! file into a scratch prefix; C programs (tests/c/) are compiled against it with `cc` and
//! `pkg-config`, and run as they are, under AddressSanitizer (with LeakSanitizer) and
//! under valgrind — each must pass its own checks with no error and no leak.

use kiln_testkit::run_ok as run;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

fn scratch() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("capi")
}

fn source(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/c")
        .join(name)
}

/// Installs the library (debug build) once, and compiles the test objects.
fn prefix() -> &'static Path {
    static PREFIX: OnceLock<PathBuf> = OnceLock::new();
    PREFIX.get_or_init(|| {
        let dir = scratch();
        std::fs::create_dir_all(&dir).unwrap();
        let prefix = dir.join("prefix");
        // The executor binary, installed with the library (for KILN_EXECUTOR_SPAWN); both
        // of this test build's profile.
        kiln_testkit::executor_binary();
        kiln_testkit::install_capi(&prefix, &[]);
        for name in [
            "math",
            "user",
            "archived",
            "main",
            "twice",
            "host_calls",
            "lazy_body_one",
            "lazy_body_two",
            "swap_pair",
            "swap_odd",
        ] {
            run(Command::new("cc")
                .args(["-O1", "-fPIC", "-c"])
                .arg(source(&format!("{name}.c")))
                .arg("-o")
                .arg(dir.join(format!("{name}.o"))));
        }
        std::fs::write(dir.join("source.c"), "int three(void) { return THREE; }\n").unwrap();
        std::fs::write(
            dir.join("broken.c"),
            "int broken(void) { return nothing; }\n",
        )
        .unwrap();
        run(Command::new("ar")
            .arg("rcs")
            .arg(dir.join("archive.a"))
            .arg(dir.join("archived.o")));
        prefix
    })
}

/// `cc FLAGS test.c $(pkg-config --cflags --libs kiln)`; returns the binary.
fn build(test: &str, flags: &[&str], suffix: &str) -> PathBuf {
    let prefix = prefix();
    let pkg = run(Command::new("pkg-config")
        .args(["--cflags", "--libs", "kiln"])
        .env("PKG_CONFIG_PATH", prefix.join("lib/pkgconfig")));
    let binary = scratch().join(format!("{test}{suffix}"));
    run(Command::new("cc")
        .args(["-std=c11", "-g", "-O1", "-Wall", "-Wextra", "-Werror"])
        .args(flags)
        .arg(source(&format!("{test}.c")))
        .arg("-o")
        .arg(&binary)
        .args(pkg.split_whitespace())
        .arg("-lpthread"));
    binary
}

fn check_plain(test: &str) {
    let binary = build(test, &[], "");
    let mut cmd = Command::new(&binary);
    cmd.arg(scratch());
    if test == "api" {
        cmd.arg(prefix().join("bin/kiln-executor"));
    }
    let out = run(&mut cmd);
    assert!(out.contains(&format!("{test}: ok")), "{out}");
}

fn check_asan(test: &str) {
    let binary = build(
        test,
        &["-fsanitize=address", "-fno-omit-frame-pointer"],
        "-asan",
    );
    let out = run(Command::new(&binary).arg(scratch()).env(
        "ASAN_OPTIONS",
        "detect_leaks=1:abort_on_error=0:exitcode=97",
    ));
    assert!(out.contains(&format!("{test}: ok")), "{out}");
}

fn check_valgrind(test: &str) {
    let binary = build(test, &[], "-vg");
    let out = run(Command::new("valgrind")
        .args([
            "--error-exitcode=98",
            "--leak-check=full",
            "--errors-for-leak-kinds=definite",
            "--show-leak-kinds=definite",
            "-q",
        ])
        .arg(&binary)
        .arg(scratch()));
    assert!(out.contains(&format!("{test}: ok")), "{out}");
}

#[test]
fn every_function_from_c() {
    check_plain("api");
}

#[test]
fn every_memory_callback_combination_from_c() {
    check_plain("memory");
}

#[test]
fn an_executor_of_the_hosts_callbacks_from_c() {
    check_plain("executor");
}

#[test]
fn lazy_functions_and_hot_swap_from_c() {
    check_plain("lazy");
    check_asan("lazy");
}

#[test]
fn the_api_under_address_sanitizer() {
    check_asan("api");
    check_asan("memory");
    check_asan("executor");
}

#[test]
fn the_api_under_valgrind() {
    check_valgrind("api");
    check_valgrind("memory");
}

#[test]
fn the_static_library_links_too() {
    let prefix = prefix();
    let binary = scratch().join("api-static");
    run(Command::new("cc")
        .args(["-std=c11", "-O1", "-I"])
        .arg(prefix.join("include"))
        .arg(source("api.c"))
        .arg("-o")
        .arg(&binary)
        .arg(prefix.join("lib/libkiln_capi.a"))
        // What kiln.pc's Libs.private lists (the C++ runtime: the frame that calls a
        // program's main is C++).
        .args(["-lpthread", "-ldl", "-lm", "-lgcc_s", "-lstdc++"]));
    let out = run(Command::new(&binary).arg(scratch()));
    assert!(out.contains("api: ok"), "{out}");
}

/// W^X for the whole process through the C API: the probe program (and the host itself)
/// finds no mapping writable and executable, in process with and without exports, with
/// static TLS, and in a spawned executor.
#[test]
fn no_mapping_is_writable_and_executable_from_c() {
    let dir = scratch();
    let probe = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/programs/wx_probe.c");
    let objects = [("wx_probe.o", ""), ("wx_probe_tls.o", "-DSTATIC_TLS")];
    for (name, define) in objects {
        let mut cc = Command::new("cc");
        cc.args(["-O1", "-c"]);
        if !define.is_empty() {
            cc.arg(define);
        }
        run(cc.arg(&probe).arg("-o").arg(dir.join(name)));
    }
    let binary = build("wx", &[], "");
    let out = run(Command::new(&binary)
        .arg(&dir)
        .arg(prefix().join("bin/kiln-executor"))
        .arg(dir.join("wx_probe.o"))
        .arg(dir.join("wx_probe_tls.o")));
    assert!(out.contains("wx: ok"), "{out}");
    assert!(!out.contains("W+X"), "{out}");
}

/// A sandboxed executor from C (`options.sandbox`, `sandbox_write`): JIT code's forbidden
/// attempts fail, what the options allow works.
#[test]
fn a_sandboxed_executor_from_c() {
    let dir = scratch().join("sandbox-files");
    let (allowed, elsewhere) = (dir.join("allowed"), dir.join("elsewhere"));
    std::fs::create_dir_all(&allowed).unwrap();
    std::fs::create_dir_all(&elsewhere).unwrap();
    std::fs::write(elsewhere.join("secret"), "not for JIT code\n").unwrap();
    let probe = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/programs/sandbox_probe.c");
    let object = dir.join("sandbox_probe.o");
    run(Command::new("cc")
        .args(["-O1", "-c"])
        .arg(&probe)
        .arg("-o")
        .arg(&object));
    let binary = build("sandbox", &[], "");
    let out = run(Command::new(&binary)
        .arg(scratch())
        .arg(prefix().join("bin/kiln-executor"))
        .arg(&object)
        .arg(&allowed)
        .arg(&elsewhere));
    for line in [
        "execve: EPERM",
        "ptrace: EPERM",
        "listen: EPERM",
        "read /etc: ok",
        "write allowed: ok",
        "write elsewhere: EACCES",
        "read elsewhere: EACCES",
        "chmod: EPERM",
        "fchmod allowed: EPERM",
        "file attributes: EPERM",
        "pidfd_getfd: EPERM",
        "clone newuser: EPERM",
        "clone3: ENOSYS",
        "io_uring: EPERM",
        "mprotect wx: EPERM",
        "shmat exec: EPERM",
        "personality: EPERM",
        "capabilities: none",
        "thread: ok",
        "sandbox: ok",
    ] {
        assert!(out.contains(line), "{line} missing in:\n{out}");
    }
    assert!(!elsewhere.join("planted.txt").exists());
}

/// The C blocks of a Markdown file, in order.
fn c_blocks(relative: &str) -> Vec<String> {
    let text = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(relative))
        .unwrap_or_else(|e| panic!("{relative}: {e}"));
    text.split("```c\n")
        .skip(1)
        .filter_map(|b| b.split("```").next())
        .map(str::to_string)
        .collect()
}

/// Every complete C program of the README and docs/C_API.md (a block with a `main`),
/// taken as it is, is compiled as the README says (`cc prog.c $(pkg-config --cflags
/// --libs kiln)`) against the installed library and run beside a `shader.o` that defines
/// `shade`; the README has one in its section "From C".
#[test]
fn the_readme_and_docs_c_examples_run() {
    let readme =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../README.md"))
            .expect("README.md");
    assert!(
        readme
            .split("## From C")
            .nth(1)
            .is_some_and(|s| s.contains("```c\n")),
        "a C block in the README's section \"From C\""
    );
    let mut programs: Vec<(String, String)> = Vec::new();
    for file in ["../../README.md", "../../docs/C_API.md"] {
        for (i, block) in c_blocks(file).into_iter().enumerate() {
            if block.contains("int main(") {
                programs.push((format!("{file} block {i}"), block));
            }
        }
    }
    assert!(
        programs.len() >= 2,
        "the README's and docs/C_API.md's programs: {programs:?}"
    );
    let prefix = prefix();
    let dir = scratch().join("readme");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("shader.c"), "int shade(int x) { return x * x; }\n").unwrap();
    run(Command::new("cc")
        .args(["-O2", "-c", "shader.c", "-o", "shader.o"])
        .current_dir(&dir));
    let pkg = run(Command::new("pkg-config")
        .args(["--cflags", "--libs", "kiln"])
        .env("PKG_CONFIG_PATH", prefix.join("lib/pkgconfig")));
    for (name, example) in programs {
        std::fs::write(dir.join("prog.c"), example).unwrap();
        run(Command::new("cc")
            .arg("prog.c")
            .args(pkg.split_whitespace())
            .args(["-o", "prog"])
            .current_dir(&dir));
        let out = run(Command::new(dir.join("prog")).current_dir(&dir));
        assert_eq!(out, "shade(5) = 25\n", "{name}");
    }
}

/// The C excerpts of docs/C_API.md (blocks without a `main`, from programs the tests run)
/// name only functions, types and constants `kiln.h` declares: a renamed or removed one
/// fails here.
#[test]
fn the_docs_c_excerpts_name_what_kiln_h_declares() {
    let header =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("include/kiln.h"))
            .expect("include/kiln.h");
    let mut missing = Vec::new();
    for block in c_blocks("../../docs/C_API.md") {
        for word in block.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')) {
            let ours = word.starts_with("kiln_") || word.starts_with("KILN_");
            if ours && !header.contains(word) && !missing.contains(&word.to_string()) {
                missing.push(word.to_string());
            }
        }
    }
    assert!(missing.is_empty(), "not in kiln.h: {missing:?}");
}
