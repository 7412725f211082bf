//! Objects on a Windows host: executor-c's Windows executor (`executor-c/build.sh OUT
//! x86_64-w64-mingw32-gcc`), run under Wine (`wine64`, headless), serving `kiln run
//! --connect`. Programs compiled with `clang-16 --target=x86_64-w64-windows-gnu-elf` (the
//! ELF objects LLVM's MCJIT users on Windows make) and as COFF (the native build's own
//! `x86_64-w64-mingw32-gcc -c` objects, and `clang-16 --target=x86_64-w64-windows-gnu`'s)
//! give the same output and status as the same source built natively with
//! `x86_64-w64-mingw32-gcc` and run under Wine.
//! `KILN_TEST_SKIP_CROSS=1` skips them.

use kiln_testkit::ExecutorProcess;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn kiln() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_kiln"))
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Wine, headless, with a prefix of its own under the target directory.
fn wine() -> Command {
    kiln_testkit::wine(&kiln_testkit::wine_prefix())
}

/// Makes Wine's prefix once per test process, before the tests (which run in parallel)
/// start Wine: two first starts at once would both make it.
fn wine_ready() {
    static READY: std::sync::Once = std::sync::Once::new();
    READY.call_once(|| {
        let status = wine()
            .args(["cmd.exe", "/c", "exit"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
            .expect("wine runs");
        assert!(status.success(), "wine cmd.exe /c exit: {status}");
    });
}

/// The Windows executor, listening on a loopback port under Wine.
fn windows_executor() -> (ExecutorProcess, u16) {
    wine_ready();
    let binary = kiln_testkit::c_executor_binary("x86_64-w64-mingw32-gcc");
    let process = kiln_testkit::start_listening(
        wine()
            .arg(binary)
            .args(["--listen", "127.0.0.1:0", "--key-file"])
            .arg(kiln_testkit::key_file()),
    );
    let port = process
        .address
        .rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("no port in {:?}", process.address));
    (process, port)
}

/// Compiles `source` into an ELF object for Windows (`x86_64-w64-windows-gnu-elf`).
fn windows_elf_object(dir: &Path, source: &Path, flags: &[&str]) -> PathBuf {
    compile_object(
        &["clang-16", "--target=x86_64-w64-windows-gnu-elf"],
        &dir.join(format!(
            "{}.o",
            source.file_stem().unwrap().to_string_lossy()
        )),
        source,
        flags,
    )
}

/// Compiles `source` into a COFF object for Windows with `compiler` (mingw-w64 gcc, or
/// clang for `x86_64-w64-windows-gnu`: what a Windows JIT emits).
fn windows_coff_object(compiler: &[&str], dir: &Path, source: &Path, flags: &[&str]) -> PathBuf {
    compile_object(
        compiler,
        &dir.join(format!(
            "{}.obj",
            source.file_stem().unwrap().to_string_lossy()
        )),
        source,
        flags,
    )
}

/// `compiler FLAGS -c source -o object`, which must succeed.
fn compile_object(compiler: &[&str], object: &Path, source: &Path, flags: &[&str]) -> PathBuf {
    let status = Command::new(compiler[0])
        .args(&compiler[1..])
        .args(flags)
        .arg("-c")
        .arg(source)
        .arg("-o")
        .arg(object)
        .status()
        .unwrap_or_else(|e| panic!("{compiler:?} runs: {e}"));
    assert!(
        status.success(),
        "{compiler:?} {flags:?} {}",
        source.display()
    );
    object.to_path_buf()
}

const MINGW: &[&str] = &["x86_64-w64-mingw32-gcc"];
const CLANG_COFF: &[&str] = &["clang-16", "--target=x86_64-w64-windows-gnu"];

/// `sources` built natively for Windows with mingw-w64 (`flags`, `-O2` unless they hold
/// an optimization level: COFF objects, compiled at once as a build would, then linked)
/// and run under Wine with `args`: its output, and the objects (which `kiln run` of COFF
/// objects runs as well).
fn native_run(
    dir: &Path,
    sources: &[PathBuf],
    flags: &[&str],
    args: &[&str],
) -> (Output, Vec<PathBuf>) {
    wine_ready();
    let jobs: Vec<_> = sources
        .iter()
        .map(|source| {
            let (dir, source) = (dir.to_path_buf(), source.clone());
            let default_opt = (!flags.iter().any(|f| f.starts_with("-O"))).then_some("-O2");
            let flags: Vec<String> = default_opt
                .into_iter()
                .chain(flags.iter().copied())
                .map(String::from)
                .collect();
            std::thread::spawn(move || {
                let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
                windows_coff_object(MINGW, &dir, &source, &flags)
            })
        })
        .collect();
    let objects: Vec<PathBuf> = jobs.into_iter().map(|j| j.join().unwrap()).collect();
    let exe = dir.join("native.exe");
    let status = Command::new(MINGW[0])
        .args(&objects)
        .arg("-o")
        .arg(&exe)
        .status()
        .expect("x86_64-w64-mingw32-gcc runs");
    assert!(status.success(), "mingw-w64 link of {sources:?}");
    let output = wine().arg(&exe).args(args).output().expect("wine runs");
    (output, objects)
}

fn kiln_run(port: u16, objects: &[PathBuf], args: &[&str]) -> Output {
    Command::new(kiln())
        .args(["run", "--key-file"])
        .arg(kiln_testkit::key_file())
        .arg("--connect")
        .arg(format!("127.0.0.1:{port}"))
        .args(objects)
        .arg("--")
        .args(args)
        .output()
        .expect("kiln runs")
}

/// Wine writes `\r\n` for a text-mode stream, as Windows does, in both runs alike.
fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn assert_same(name: &str, native: &Output, kiln: &Output) {
    assert!(
        !native.stdout.is_empty(),
        "{name}: the native program printed nothing"
    );
    assert_eq!(
        text(&kiln.stdout),
        text(&native.stdout),
        "{name}: stdout differs (kiln's stderr: {})",
        text(&kiln.stderr)
    );
    assert_eq!(
        kiln.status.code(),
        native.status.code(),
        "{name}: status differs (kiln's stderr: {})",
        text(&kiln.stderr)
    );
}

fn scratch(name: &str) -> PathBuf {
    kiln_testkit::scratch_dir(&format!("windows/{name}"))
}

#[test]
fn c_programs_run_on_windows_as_natively() {
    if kiln_testkit::skip_cross("c_programs_run_on_windows_as_natively") {
        return;
    }
    let (_executor, port) = windows_executor();
    let source = repo().join("tests/programs/windows_basics.c");
    let (native, native_objects) = native_run(
        &scratch("basics-native"),
        std::slice::from_ref(&source),
        &[],
        &["one"],
    );
    // ELF objects (MCJIT's users' form), and COFF: mingw-w64 gcc's -O2 (the native
    // program's own object) and clang's -O0.
    let clang_dir = scratch("basics-coff-clang");
    let clang_coff = windows_coff_object(CLANG_COFF, &clang_dir, &source, &["-O0"]);
    for (what, object) in [
        (
            "ELF -O0",
            windows_elf_object(&scratch("basics-O0"), &source, &["-O0"]),
        ),
        (
            "ELF -O2",
            windows_elf_object(&scratch("basics-O2"), &source, &["-O2"]),
        ),
        ("COFF mingw-w64 gcc -O2", native_objects[0].clone()),
        ("COFF clang -O0", clang_coff),
    ] {
        let kiln = kiln_run(port, &[object], &["one"]);
        assert_same(&format!("windows_basics {what}"), &native, &kiln);
        assert!(
            text(&kiln.stderr).contains("to stderr"),
            "{}",
            text(&kiln.stderr)
        );
    }
}

#[test]
fn exit_return_and_crash_on_windows() {
    if kiln_testkit::skip_cross("exit_return_and_crash_on_windows") {
        return;
    }
    let (_executor, port) = windows_executor();
    let dir = scratch("exit-and-crash");
    let source = repo().join("tests/programs/exit_and_crash.c");
    let object = windows_elf_object(&dir, &source, &["-O2"]);
    let native_dir = scratch("exit-and-crash-native");
    for how in ["return", "exit"] {
        let (native, coff) = native_run(&native_dir, std::slice::from_ref(&source), &[], &[how]);
        let kiln = kiln_run(port, std::slice::from_ref(&object), &[how]);
        assert_same(&format!("exit_and_crash {how}"), &native, &kiln);
        let kiln = kiln_run(port, &coff, &[how]);
        assert_same(&format!("exit_and_crash {how} (COFF)"), &native, &kiln);
    }
    // A crash: reported as on Linux (SIGSEGV, the address, the JIT function), status
    // 128 + 11; the listener serves the next client.
    let crash = kiln_run(port, std::slice::from_ref(&object), &["crash"]);
    let stderr = text(&crash.stderr);
    assert_eq!(crash.status.code(), Some(139), "{stderr}");
    assert!(
        stderr.contains("SIGSEGV") && stderr.contains("0x10"),
        "{stderr}"
    );
    assert!(
        stderr.contains("Windows exception 0xc0000005, EXCEPTION_ACCESS_VIOLATION"),
        "the exception code is named: {stderr}"
    );
    assert!(
        stderr.contains("main"),
        "the JIT function is named: {stderr}"
    );
    let again = kiln_run(port, std::slice::from_ref(&object), &["return"]);
    assert_eq!(again.status.code(), Some(3), "{}", text(&again.stderr));
    // With unwind tables registered (call frame information in the object), the same.
    let cfi_dir = scratch("exit-and-crash-cfi");
    let with_cfi = windows_elf_object(&cfi_dir, &source, &["-O2", "-fdwarf-exceptions"]);
    let crash = kiln_run(port, &[with_cfi], &["crash"]);
    let stderr = text(&crash.stderr);
    assert_eq!(crash.status.code(), Some(139), "{stderr}");
    assert!(
        stderr.contains("SIGSEGV") && stderr.contains("main"),
        "{stderr}"
    );
    // And a COFF object's (its own unwind table, `.pdata`, registered in place).
    let coff = windows_coff_object(CLANG_COFF, &cfi_dir, &source, &["-O2"]);
    let crash = kiln_run(port, &[coff], &["crash"]);
    let stderr = text(&crash.stderr);
    assert_eq!(crash.status.code(), Some(139), "{stderr}");
    assert!(
        stderr.contains("SIGSEGV") && stderr.contains("main"),
        "{stderr}"
    );
}

#[test]
fn thread_locals_are_refused_by_name_on_windows() {
    if kiln_testkit::skip_cross("thread_locals_are_refused_by_name_on_windows") {
        return;
    }
    let (_executor, port) = windows_executor();
    let dir = scratch("tls");
    let source = dir.join("tls_user.c");
    std::fs::write(
        &source,
        "static __thread int counter;\nint main(void) { return ++counter; }\n",
    )
    .unwrap();
    let object = windows_elf_object(&dir, &source, &["-O2"]);
    let out = kiln_run(port, &[object], &[]);
    let stderr = text(&out.stderr);
    assert_ne!(out.status.code(), Some(0));
    assert!(
        stderr.contains("tls_user.o")
            && stderr.contains("thread-locals")
            && stderr.contains(".tbss"),
        "{stderr}"
    );
}

/// A COFF object's thread-locals, from several threads: emulated ones (mingw-w64 gcc's,
/// `__emutls_get_address` from the executor's runtime) and native ones (clang's:
/// `_tls_index`, `.tls`, `SECREL`, placed in the executor's own static TLS block).
#[test]
fn thread_locals_of_coff_objects_work_from_several_threads() {
    if kiln_testkit::skip_cross("thread_locals_of_coff_objects_work_from_several_threads") {
        return;
    }
    let (_executor, port) = windows_executor();
    let source = repo().join("tests/programs/windows_tls.c");
    let (native, native_objects) = native_run(
        &scratch("tls-native"),
        std::slice::from_ref(&source),
        &[],
        &[],
    );
    assert_eq!(
        text(&native.stdout).trim_end(),
        "main 15 2, threads 603 704 805"
    );
    let dir = scratch("tls-coff-clang");
    for (what, object) in [
        ("mingw-w64 gcc -O2 (emulated)", native_objects[0].clone()),
        (
            "clang -O0 (native)",
            windows_coff_object(CLANG_COFF, &dir, &source, &["-O0"]),
        ),
    ] {
        let kiln = kiln_run(port, &[object], &[]);
        assert_same(&format!("windows_tls {what}"), &native, &kiln);
    }
}

/// C++ exceptions in JIT code on Windows: thrown and caught there (destructors run on the
/// way), and thrown through JIT frames into a catch of the host's (a DLL built natively).
/// The C++ library is mingw-w64's own archive, linked into the module as COFF
/// (`-lstdc++ -lgcc_eh`), as `-static-libstdc++` links it natively.
#[test]
fn cxx_exceptions_are_caught_in_jit_code_and_across_it_by_the_host() {
    if kiln_testkit::skip_cross("cxx_exceptions_are_caught_in_jit_code_and_across_it_by_the_host") {
        return;
    }
    let (_executor, port) = windows_executor();
    let dir = scratch("exceptions");
    let gxx = "x86_64-w64-mingw32-g++";
    let run = |args: &[&str]| {
        let status = Command::new(gxx)
            .current_dir(&dir)
            .args(args)
            .status()
            .expect("x86_64-w64-mingw32-g++ runs");
        assert!(status.success(), "{gxx} {args:?}");
    };
    let host = repo().join("tests/programs/windows_host_catch.cc");
    let program = repo().join("tests/programs/windows_exceptions.cc");
    run(&[
        "-shared",
        "-O2",
        "-static-libstdc++",
        "-static-libgcc",
        host.to_str().unwrap(),
        "-o",
        "host_catch.dll",
    ]);
    run(&[
        "-O2",
        "-c",
        program.to_str().unwrap(),
        "-o",
        "windows_exceptions.obj",
    ]);
    run(&[
        "-static",
        "windows_exceptions.obj",
        "host_catch.dll",
        "-o",
        "native.exe",
    ]);
    let native = wine()
        .arg(dir.join("native.exe"))
        .output()
        .expect("wine runs");
    assert_eq!(native.status.code(), Some(2), "{}", text(&native.stdout));
    assert!(text(&native.stdout).contains("host caught: too big: 5"));
    let libstdcxx = Command::new(gxx)
        .arg("-print-file-name=libstdc++.a")
        .output()
        .unwrap();
    let libdir = Path::new(text(&libstdcxx.stdout).trim())
        .parent()
        .unwrap()
        .to_path_buf();
    // The DLL by its path on Wine's Z: drive (the executor's LoadLibrary).
    let dll = format!("-lZ:{}", dir.join("host_catch.dll").display()).replace('/', "\\");
    let kiln = Command::new(kiln())
        .args(["run", "--key-file"])
        .arg(kiln_testkit::key_file())
        .arg("--connect")
        .arg(format!("127.0.0.1:{port}"))
        .arg(dir.join("windows_exceptions.obj"))
        .arg(format!("-L{}", libdir.display()))
        .args(["-lstdc++", "-lgcc_eh", &dll])
        .output()
        .expect("kiln runs");
    assert_same("windows_exceptions", &native, &kiln);
}

#[test]
fn zlib_sqlite_and_lua_from_source_run_on_windows_as_natively() {
    if kiln_testkit::skip_cross("zlib_sqlite_and_lua_from_source_run_on_windows_as_natively") {
        return;
    }
    let (_executor, port) = windows_executor();
    let zlib = kiln_testkit::c_sources("libz-sys").join("src/zlib");
    let sqlite = kiln_testkit::c_sources("libsqlite3-sys").join("sqlite3");
    let lua = kiln_testkit::c_sources("lua-src").join("lua-5.4.8");
    let script = repo().join("tests/programs/script.lua");
    let script = script.to_str().unwrap();
    let include = |dir: &Path| format!("-I{}", dir.display());
    for (name, mut sources, flags, args) in [
        (
            "zlib",
            kiln_testkit::c_files(&zlib, &[]),
            vec!["-O2".to_string(), include(&zlib)],
            &[][..],
        ),
        // -O0: the amalgamation takes seconds to compile so, tens at -O2.
        (
            "sqlite",
            vec![sqlite.join("sqlite3.c")],
            vec!["-O0".to_string(), include(&sqlite)],
            &[][..],
        ),
        // Lua's errors are longjmps (through the executor's `_setjmp`, which asks for no
        // unwinding: JIT frames have no unwind tables yet).
        (
            "lua",
            kiln_testkit::c_files(&lua, &["lua.c", "luac.c", "onelua.c"]),
            vec!["-O2".to_string(), include(&lua)],
            &[script][..],
        ),
    ] {
        sources.push(repo().join(format!("tests/programs/{name}_driver.c")));
        let dir = scratch(&format!("{name}-from-source"));
        let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
        // Compiled all at once, as a build would.
        let jobs: Vec<_> = sources
            .iter()
            .map(|source| {
                let dir = dir.clone();
                let source = source.clone();
                let flags: Vec<String> = flags.iter().map(|f| f.to_string()).collect();
                std::thread::spawn(move || {
                    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
                    windows_elf_object(&dir, &source, &flags)
                })
            })
            .collect();
        let objects: Vec<PathBuf> = jobs.into_iter().map(|j| j.join().unwrap()).collect();
        let native_dir = scratch(&format!("{name}-from-source-native"));
        // The native build at the same level (SQLite's amalgamation takes tens of seconds
        // to compile at -O2).
        let (native, coff) = native_run(&native_dir, &sources, &flags, args);
        let kiln = kiln_run(port, &objects, args);
        assert_same(&format!("windows {name}"), &native, &kiln);
        // The native build's own objects: COFF from mingw-w64 gcc -O2.
        let kiln = kiln_run(port, &coff, args);
        assert_same(&format!("windows {name} (COFF)"), &native, &kiln);
        if name == "zlib" {
            // One module of both formats: the library's COFF objects, the driver's ELF one.
            let mut mixed = coff[..coff.len() - 1].to_vec();
            mixed.extend(objects.last().cloned());
            let kiln = kiln_run(port, &mixed, args);
            assert_same("windows zlib (COFF and ELF)", &native, &kiln);
        }
    }
}

/// The system's unwinder walks through JIT frames once Kiln registers their unwind data
/// (made from `.eh_frame`: objects compiled with `-fdwarf-exceptions`), as through a
/// native program's; without call frame information it cannot.
#[test]
fn the_unwinder_walks_through_jit_frames_as_through_native_ones() {
    if kiln_testkit::skip_cross("the_unwinder_walks_through_jit_frames_as_through_native_ones") {
        return;
    }
    let (_executor, port) = windows_executor();
    let source = repo().join("tests/programs/windows_backtrace.c");
    let (native, native_objects) = native_run(
        &scratch("backtrace-native"),
        std::slice::from_ref(&source),
        &[],
        &[],
    );
    assert_eq!(
        text(&native.stdout).trim_end(),
        "depth 10: 11 frames in depth(), main reached"
    );
    for opt in ["-O0", "-O2"] {
        let dir = scratch(&format!("backtrace{opt}"));
        let object = windows_elf_object(&dir, &source, &[opt, "-fdwarf-exceptions"]);
        let kiln = kiln_run(port, &[object], &[]);
        assert_same(&format!("windows_backtrace {opt}"), &native, &kiln);
    }
    // COFF objects carry their own table (`.pdata`, `.xdata`), registered in place:
    // mingw-w64 gcc's (the native program's object) and clang's.
    let clang_dir = scratch("backtrace-coff-clang");
    for (what, object) in [
        ("mingw-w64 gcc -O2", native_objects[0].clone()),
        (
            "clang -O2",
            windows_coff_object(CLANG_COFF, &clang_dir, &source, &["-O2"]),
        ),
    ] {
        let kiln = kiln_run(port, &[object], &[]);
        assert_same(&format!("windows_backtrace COFF {what}"), &native, &kiln);
    }
    // The control: the same ELF program without call frame information has no unwind data.
    let dir = scratch("backtrace-no-cfi");
    let object = windows_elf_object(&dir, &source, &["-O2"]);
    let kiln = kiln_run(port, &[object], &[]);
    assert_ne!(
        text(&kiln.stdout),
        text(&native.stdout),
        "{}",
        text(&kiln.stderr)
    );
}

/// `kiln run` compiles sources for this system: for a Windows executor it refuses them,
/// saying how to compile them. What mingw's driver links by default (`-lm`, `-lmingwex`,
/// …) is the executor's process already.
#[test]
fn sources_are_refused_and_mingw_default_libraries_are_the_process() {
    if kiln_testkit::skip_cross("sources_are_refused_and_mingw_default_libraries_are_the_process") {
        return;
    }
    let (_executor, port) = windows_executor();
    let source = repo().join("tests/programs/exit_and_crash.c");
    let out = kiln_run(port, std::slice::from_ref(&source), &[]);
    let stderr = text(&out.stderr);
    assert_ne!(out.status.code(), Some(0));
    assert!(
        stderr.contains("exit_and_crash.c")
            && stderr.contains("--target=x86_64-w64-windows-gnu-elf"),
        "{stderr}"
    );
    let dir = scratch("default-libraries");
    let object = windows_elf_object(&dir, &source, &["-O2"]);
    let out = Command::new(kiln())
        .args(["run", "--key-file"])
        .arg(kiln_testkit::key_file())
        .arg("--connect")
        .arg(format!("127.0.0.1:{port}"))
        .arg(&object)
        .args(["-lm", "-lmingwex", "-lpthread"])
        .args(["--", "return"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3), "{}", text(&out.stderr));
}

/// W^X for the Windows executor's whole process, in both of its modes (keyed, and
/// plaintext with `--no-auth`): tests/programs/windows_wx_walk.c, linked by Kiln and run
/// there, walks the address space with `VirtualQuery` from main and from a second thread
/// and finds no region writable and executable, and its own code executable and not
/// writable. The same program built natively is the control that the walk sees code.
#[test]
fn no_region_of_the_windows_executor_is_writable_and_executable() {
    if kiln_testkit::skip_cross("no_region_of_the_windows_executor_is_writable_and_executable") {
        return;
    }
    let source = repo().join("tests/programs/windows_wx_walk.c");
    let (native, _) = native_run(
        &scratch("wx-native"),
        std::slice::from_ref(&source),
        &[],
        &[],
    );
    assert_eq!(native.status.code(), Some(0), "{}", text(&native.stdout));
    let object = windows_elf_object(&scratch("wx"), &source, &["-O2"]);
    let (keyed, port) = windows_executor();
    let plain = kiln_testkit::start_listening(
        wine()
            .arg(kiln_testkit::c_executor_binary("x86_64-w64-mingw32-gcc"))
            .args(["--listen", "127.0.0.1:0", "--no-auth"]),
    );
    let runs = [
        ("keyed", kiln_run(port, std::slice::from_ref(&object), &[])),
        (
            "--no-auth",
            Command::new(kiln())
                .args(["run", "--connect", &plain.address])
                .arg(&object)
                .output()
                .unwrap(),
        ),
    ];
    for (mode, out) in runs {
        let report = text(&out.stdout);
        let what = format!("{mode}:\n{report}\n{}", text(&out.stderr));
        for who in ["main", "thread"] {
            assert!(
                report.contains(&format!("{who}: "))
                    && report.contains("executable, 0 writable and executable"),
                "{what}"
            );
        }
        assert!(
            report.contains("own code found executable and not writable: main yes, thread yes"),
            "{what}"
        );
        assert!(!report.contains("writable and executable: 0x"), "{what}");
        assert_eq!(out.status.code(), Some(0), "{what}");
    }
    drop(keyed);
}

/// Across machines: the Windows executor listening with its key on this namespace's end
/// of a veth pair (not a loopback address) is reached by `kiln run --connect` run in the
/// other namespace, across the link. (The controller is the one in the namespace the test
/// makes: Wine's sockets are made by its wineserver, which serves the namespace it was
/// started in, shared by every test's Wine.)
#[test]
fn the_windows_executor_on_another_network_is_reached_with_its_key() {
    if kiln_testkit::skip_cross("the_windows_executor_on_another_network_is_reached_with_its_key") {
        return;
    }
    wine_ready();
    let pair = kiln_testkit::VethPair::create();
    let executor = kiln_testkit::start_listening(
        wine()
            .arg(kiln_testkit::c_executor_binary("x86_64-w64-mingw32-gcc"))
            .arg("--listen")
            .arg(format!("{}:0", pair.outside))
            .arg("--key-file")
            .arg(kiln_testkit::key_file()),
    );
    assert!(
        executor.address.starts_with(&pair.outside),
        "{}",
        executor.address
    );
    let dir = scratch("across");
    let source = kiln_testkit::source("across_machines.c");
    let object = windows_elf_object(&dir, &source, &["-O2"]);
    let out = pair
        .command(kiln())
        .args(["run", "--key-file"])
        .arg(kiln_testkit::key_file())
        .args(["--connect", &executor.address])
        .arg(&object)
        .output()
        .unwrap();
    let stderr = text(&out.stderr);
    assert_eq!(text(&out.stdout), "42\r\n", "{stderr}");
    assert_eq!(out.status.code(), Some(3), "{stderr}");
    let out = pair
        .command(kiln())
        .args(["run", "--connect", &executor.address])
        .arg(&object)
        .output()
        .unwrap();
    assert!(
        text(&out.stderr).contains("requires a key"),
        "{}",
        text(&out.stderr)
    );
    drop(executor);
}
