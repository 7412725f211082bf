//! Real programs linked and run by `kiln run`, compared with the same objects linked
//! natively by gcc: SQLite, Lua and zlib from Debian's static libraries, C++ with
//! exceptions and static constructors, COMDAT, thread-locals from two threads, and a
//! relocation program in five code models / optimization levels.
//!
//! The objects and the native programs' outputs come from tests/programs/build_native.sh,
//! run once per test process.

use kiln_testkit::executor_binary;
use kiln_testkit::NativeProgram as Program;
use std::path::{Path, PathBuf};
use std::process::Command;

fn program(name: &str) -> Program {
    kiln_testkit::native_program(name)
}

fn kiln_run(p: &Program) -> std::process::Output {
    kiln_run_with(p, &[])
}

fn kiln_run_with(p: &Program, flags: &[&str]) -> std::process::Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_kiln"));
    cmd.arg("run").args(flags).args(p.kiln_run_args());
    cmd.output().expect("kiln runs")
}

fn assert_same_as_native(name: &str) {
    let p = program(name);
    let out = kiln_run(&p);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{name}: status {:?}\nstderr: {stderr}",
        out.status
    );
    assert_eq!(
        stdout, p.expected,
        "{name}: output differs from the native program's\nstderr: {stderr}"
    );
}

#[test]
fn sqlite_from_debian_libsqlite3_a() {
    assert_same_as_native("sqlite_driver");
}

#[test]
fn lua_from_debian_liblua5_4_a() {
    assert_same_as_native("lua_driver");
}

#[test]
fn zlib_from_debian_libz_a() {
    assert_same_as_native("zlib_driver");
}

#[test]
fn cxx_exceptions_across_jit_frames_and_static_constructors() {
    assert_same_as_native("cxx_exceptions");
}

#[test]
fn cxx_comdat_groups_are_kept_once() {
    assert_same_as_native("cxx_comdat");
}

#[test]
fn thread_locals_from_two_threads() {
    assert_same_as_native("tls");
}

#[test]
fn relocations_o0_pie() {
    assert_same_as_native("relocs-O0-pie");
}

#[test]
fn relocations_o2_pie() {
    assert_same_as_native("relocs-O2-pie");
}

#[test]
fn relocations_o3_pic() {
    assert_same_as_native("relocs-O3-pic");
}

#[test]
fn relocations_o2_large_model_pic() {
    assert_same_as_native("relocs-O2-large-pic");
}

#[test]
fn non_pic_code_reaching_libc_data_is_a_clear_error() {
    // relocs.c reads `environ` and `stdout` with PC-relative references; non-PIC code
    // lives in the low 2 GiB and libc far above: a static link would make a copy
    // relocation, which a JIT cannot. Kiln must say so, not crash or truncate.
    let p = program("relocs-O2-nopic");
    let out = kiln_run(&p);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("R_X86_64_PC32 against 'environ'")
            || stderr.contains("R_X86_64_PC32 against 'stdout'")
            || stderr.contains("R_X86_64_PC32 against 'stderr'"),
        "{stderr}"
    );
    assert!(stderr.contains("copy relocation"), "{stderr}");
    assert!(stderr.contains("relocs-O2-nopic.o: section"), "{stderr}");
}

/// `cc -c FLAGS SOURCE -o OUT`.
fn compile(source: &Path, flags: &[&str], out: &Path) {
    let mut all = flags.to_vec();
    all.push("-c");
    kiln_testkit::cc(&all, source, out);
}

#[test]
fn non_pic_code_in_the_low_2gib() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/programs/nopic.c");
    let tmp = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    let obj = tmp.join("nopic.o");
    compile(&src, &["-O2", "-fno-pic", "-mcmodel=small"], &obj);
    let exe = tmp.join("nopic.native");
    assert!(Command::new("cc")
        .arg("-no-pie")
        .arg(&obj)
        .arg("-o")
        .arg(&exe)
        .status()
        .unwrap()
        .success());
    let native = Command::new(&exe).output().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .arg("run")
        .arg(&obj)
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(out.stdout, native.stdout);
    assert!(String::from_utf8_lossy(&out.stdout).contains("table_addr_low=1"));
}

#[test]
fn twenty_thousand_sections() {
    // 20,000 functions, each in its own section (-ffunction-sections), called through a
    // table, plus their .eh_frame entries.
    let tmp = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("many");
    std::fs::create_dir_all(&tmp).unwrap();
    let n = 20_000;
    let mut src = String::from("#include <stdio.h>\n");
    for i in 0..n {
        src.push_str(&format!(
            "int f{i}(int x) {{ return x * {} + {i}; }}\n",
            i % 7 + 1
        ));
    }
    src.push_str("typedef int (*fn)(int);\nstatic fn table[] = {");
    for i in 0..n {
        src.push_str(&format!("f{i},"));
    }
    src.push_str("};\nint main(void) { long s = 0; for (int i = 0; i < sizeof table / sizeof *table; i++) s += table[i](i); printf(\"%ld\\n\", s); return 0; }\n");
    let c = tmp.join("many.c");
    std::fs::write(&c, src).unwrap();
    let obj = tmp.join("many.o");
    compile(&c, &["-O1", "-ffunction-sections"], &obj);
    let exe = tmp.join("many.native");
    assert!(Command::new("cc")
        .arg(&obj)
        .arg("-o")
        .arg(&exe)
        .status()
        .unwrap()
        .success());
    let native = Command::new(&exe).output().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(["run", "--show-times"])
        .arg(&obj)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert_eq!(out.stdout, native.stdout);
    let sections: usize = stderr
        .lines()
        .find_map(|l| {
            l.split(" sections")
                .next()?
                .rsplit(' ')
                .next()?
                .parse()
                .ok()
        })
        .unwrap_or(0);
    assert!(
        sections >= 20_000,
        "only {sections} sections linked: {stderr}"
    );
}

#[test]
fn main_exit_status_is_kilns() {
    let tmp = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    let c = tmp.join("status.c");
    std::fs::write(&c, "#include <stdio.h>\nint main(int argc, char **argv) { printf(\"%d %s\\n\", argc, argv[1]); return 42; }\n").unwrap();
    let obj = tmp.join("status.o");
    compile(&c, &["-O2"], &obj);
    let out = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .arg("run")
        .arg(&obj)
        .args(["--", "hello"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(42));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "2 hello\n");
}

#[test]
fn cpython_from_debian_libpython3_11_pic_a() {
    // Debian's python.o (LTO-built: fat-LTO sections, a hidden `main`) and
    // libpython3.11-pic.a, with libm, libz and libexpat from the system.
    let config = kiln_testkit::python_config_dir();
    let out = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .arg("run")
        .arg(config.join("python.o"))
        .arg(config.join("libpython3.11-pic.a"))
        .args(["-lm", "-lz", "-lexpat", "--", "-S", "-c"])
        .arg("import json, math; print(json.dumps({'sum': sum(range(1000)), 'pi': round(math.pi, 5)}))")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "{\"sum\": 499500, \"pi\": 3.14159}\n"
    );
}

#[test]
fn objects_as_distributions_ship_them_debug_info_and_fat_lto() {
    // -g (debug sections with relocations against code), fat LTO (.gnu.lto_* sections),
    // SystemTap-style notes are not loaded: their relocations are skipped.
    let tmp = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/programs/zlib_driver.c");
    let obj = tmp.join("zlib_driver_lto.o");
    compile(&src, &["-O2", "-g", "-flto", "-ffat-lto-objects"], &obj);
    let exe = tmp.join("zlib_driver_lto.native");
    assert!(Command::new("cc")
        .arg(&obj)
        .arg("/usr/lib/x86_64-linux-gnu/libz.a")
        .arg("-o")
        .arg(&exe)
        .status()
        .unwrap()
        .success());
    let native = Command::new(&exe).output().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .arg("run")
        .arg(&obj)
        .arg("/usr/lib/x86_64-linux-gnu/libz.a")
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(out.stdout, native.stdout);
}

/// The same program run out of process, with each transport, must print what the native
/// program prints.
fn assert_same_out_of_process(name: &str) {
    executor_binary();
    let p = program(name);
    for transport in ["shm", "copy"] {
        let out = kiln_run_with(&p, &["--oop", "--transport", transport]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(
            out.status.code(),
            Some(0),
            "{name} --transport {transport}: {stderr}"
        );
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            p.expected,
            "{name} --transport {transport}: {stderr}"
        );
    }
}

#[test]
fn out_of_process_sqlite() {
    assert_same_out_of_process("sqlite_driver");
}

#[test]
fn out_of_process_lua() {
    assert_same_out_of_process("lua_driver");
}

#[test]
fn out_of_process_zlib() {
    assert_same_out_of_process("zlib_driver");
}

#[test]
fn out_of_process_cxx_exceptions_and_thread_locals() {
    assert_same_out_of_process("cxx_exceptions");
    assert_same_out_of_process("tls");
}

#[test]
fn out_of_process_twenty_thousand_functions() {
    executor_binary();
    let tmp = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("many-oop");
    std::fs::create_dir_all(&tmp).unwrap();
    let mut src = String::from("#include <stdio.h>\n");
    for i in 0..20_000 {
        src.push_str(&format!("int f{i}(int x) {{ return x + {i}; }}\n"));
    }
    src.push_str("typedef int (*fn)(int);\nstatic fn table[] = {");
    for i in 0..20_000 {
        src.push_str(&format!("f{i},"));
    }
    src.push_str("};\nint main(void) { long s = 0; for (unsigned i = 0; i < sizeof table / sizeof *table; i++) s += table[i](1); printf(\"%ld\\n\", s); return 0; }\n");
    let c = tmp.join("many.c");
    std::fs::write(&c, src).unwrap();
    let obj = tmp.join("many.o");
    compile(&c, &["-O1", "-ffunction-sections"], &obj);
    let expected = format!("{}\n", 20_000 + (0..20_000i64).sum::<i64>());
    for transport in ["shm", "copy"] {
        let out = Command::new(env!("CARGO_BIN_EXE_kiln"))
            .args(["run", "--oop", "--transport", transport])
            .arg(&obj)
            .output()
            .unwrap();
        assert_eq!(
            out.status.code(),
            Some(0),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(String::from_utf8_lossy(&out.stdout), expected);
    }
}

#[test]
fn out_of_process_over_tcp() {
    executor_binary();
    use std::io::{BufRead, Read};
    let executor = Path::new(env!("CARGO_BIN_EXE_kiln")).with_file_name("kiln-executor");
    let key = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("tcp-test-{}.key", std::process::id()));
    let _ = std::fs::remove_file(&key);
    let mut child = kiln_testkit::KillOnDrop(
        Command::new(&executor)
            .args(["--listen", "127.0.0.1:0", "--key-file"])
            .arg(&key)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let mut stderr = std::io::BufReader::new(child.stderr.take().unwrap());
    let mut line = String::new();
    while !line.contains("listening on") {
        line.clear();
        stderr.read_line(&mut line).unwrap();
    }
    let address = line.trim().rsplit(' ').next().unwrap().to_string();
    let p = program("zlib_driver");
    let key_arg = key.display().to_string();
    for _ in 0..2 {
        let out = kiln_run_with(&p, &["--connect", &address, "--key-file", &key_arg]);
        assert_eq!(
            out.status.code(),
            Some(0),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        // The program ran in the executor; its output comes back to kiln run.
        assert_eq!(String::from_utf8_lossy(&out.stdout), p.expected);
    }
    child.kill().unwrap();
    let mut stdout = String::new();
    child
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut stdout)
        .unwrap();
    assert_eq!(stdout, "");
    let _ = std::fs::remove_file(&key);
}

#[test]
fn out_of_process_crash_is_reported_and_kiln_survives() {
    executor_binary();
    let tmp = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    let c = tmp.join("segv.c");
    std::fs::write(&c, "#include <stdio.h>\nint main(void) { puts(\"about to crash\"); fflush(stdout); *(volatile int *)16 = 1; return 0; }\n").unwrap();
    let obj = tmp.join("segv.o");
    compile(&c, &["-O1"], &obj);
    let out = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(["run", "--oop"])
        .arg(&obj)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    // 128 + SIGSEGV, as a shell reports a program the signal killed (the same in process).
    assert_eq!(out.status.code(), Some(128 + 11), "{stderr}");
    assert!(stderr.contains("crashed with SIGSEGV"), "{stderr}");
    // The faulting address and the JIT function, as in process.
    assert!(
        stderr.contains("accessing 0x10 at 0x") && stderr.contains(" in main+0x"),
        "{stderr}"
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout), "about to crash\n");
}

#[test]
fn an_uncaught_cxx_exception_terminates_as_natively() {
    executor_binary();
    let tmp = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("uncaught");
    std::fs::create_dir_all(&tmp).unwrap();
    let src = tmp.join("uncaught.cpp");
    std::fs::write(
        &src,
        "#include <cstdio>\n#include <stdexcept>\nint main() { std::puts(\"before\"); std::fflush(stdout); throw std::runtime_error(\"uncaught\"); }\n",
    )
    .unwrap();
    let obj = tmp.join("uncaught.o");
    let status = Command::new("c++")
        .args(["-c", "-O1"])
        .arg(&src)
        .arg("-o")
        .arg(&obj)
        .status()
        .unwrap();
    assert!(status.success());
    for flags in [&[][..], &["--oop"][..]] {
        let out = Command::new(env!("CARGO_BIN_EXE_kiln"))
            .arg("run")
            .args(flags)
            .arg(&obj)
            .arg("-lstdc++")
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        // std::terminate's handler, as a natively linked program prints it, then SIGABRT.
        assert!(
            stderr.contains("terminate called after throwing an instance of 'std::runtime_error'")
                && stderr.contains("what():  uncaught"),
            "{flags:?}: {stderr}"
        );
        assert!(!stderr.contains("Rust cannot catch"), "{flags:?}: {stderr}");
        assert_eq!(out.status.code(), Some(128 + 6), "{flags:?}: {stderr}");
        assert_eq!(String::from_utf8_lossy(&out.stdout), "before\n");
    }
}
