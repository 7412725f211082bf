//! What JIT code gets from the C runtime rather than from relocations, as a natively
//! linked program gets it: `atexit` handlers, `pthread_atfork`, `fork` (the child has its
//! own copy of JIT data and code), C++ `thread_local` destructors, thread-locals in every
//! TLS model (local-exec, initial-exec, TLS descriptors as well as general dynamic),
//! definitions visible to plugins the program loads — in process and out of process —
//! and `kiln run --noexec`.
//!
//! The programs are in tests/programs; their native builds and expected outputs come from
//! tests/programs/build_native.sh.

use kiln_testkit::{cc, executor_binary, source};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn programs_dir() -> &'static Path {
    kiln_testkit::programs_dir("kiln-runtime-programs")
}

fn kiln(args: &[&str], inputs: &[PathBuf]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kiln"))
        .arg("run")
        .args(args)
        .args(inputs)
        .output()
        .expect("kiln runs")
}

/// `objects` (in the programs directory) linked by Kiln in process, with `--oop` over
/// shared memory and with the copy transport, must print what the native program printed
/// and exit 0.
fn assert_like_native(name: &str, objects: &[&str], libs: &[&str]) {
    executor_binary();
    let dir = programs_dir();
    let expected = std::fs::read_to_string(dir.join(format!("{name}.expected"))).unwrap();
    let mut inputs: Vec<PathBuf> = objects.iter().map(|o| dir.join(o)).collect();
    inputs.extend(libs.iter().map(PathBuf::from));
    for mode in [&[][..], &["--oop"], &["--oop", "--transport", "copy"]] {
        let out = kiln(mode, &inputs);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{name} {mode:?}: {stderr}");
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            expected,
            "{name} {mode:?}: output differs from the native program's\n{stderr}"
        );
    }
}

#[test]
fn atexit_pthread_atfork_and_fork_behave_as_natively() {
    // The child returns from main (its handlers run in the child, on its own copy of the
    // data); the parent's counter is untouched by the child's writes.
    assert_like_native("runtime_exit", &["runtime_exit.o"], &[]);
}

#[test]
fn cxx_thread_local_destructors_run_before_the_code_is_freed() {
    assert_like_native(
        "thread_local_dtors",
        &["thread_local_dtors.o"],
        &["-lstdc++"],
    );
}

#[test]
fn local_exec_and_initial_exec_thread_locals_in_static_tls() {
    assert_like_native(
        "tls_static-pie",
        &["tls_static-pie.o", "tls_static_other-pie.o"],
        &[],
    );
}

#[test]
fn tls_descriptors_gnu2() {
    assert_like_native(
        "tls_static-desc",
        &["tls_static-desc.o", "tls_static_other-desc.o"],
        &[],
    );
}

#[test]
fn one_thread_local_reached_through_general_dynamic_and_local_exec_code() {
    // tls_static.c compiled -fPIE (local-exec for `counter`) and tls_static_other.c
    // compiled -fPIC (general dynamic through __tls_get_addr): both must reach the same
    // copy of `counter` in every thread.
    let tmp = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    let main_obj = tmp.join("tls_mixed_main.o");
    let other_obj = tmp.join("tls_mixed_other.o");
    cc(&["-O2", "-fPIE", "-c"], &source("tls_static.c"), &main_obj);
    cc(
        &["-O2", "-fPIC", "-c"],
        &source("tls_static_other.c"),
        &other_obj,
    );
    let expected = std::fs::read_to_string(programs_dir().join("tls_static-pie.expected")).unwrap();
    let out = kiln(&[], &[main_obj, other_obj]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout), expected);
}

#[test]
fn a_plugin_loaded_by_the_program_calls_back_into_it() {
    executor_binary();
    let tmp = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    let host = tmp.join("plugin_host.o");
    let plugin = tmp.join("plugin.so");
    cc(&["-O2", "-fPIE", "-c"], &source("plugin_host.c"), &host);
    cc(&["-O2", "-fPIC", "-shared"], &source("plugin.c"), &plugin);
    let plugin_arg = plugin.display().to_string();
    let expected = "dlsym(host_log): found\nhost_log: plugin says hello\nplugin_run(5) = 210, host_calls = 1\n";
    for mode in [&[][..], &["--oop"]] {
        let out = Command::new(env!("CARGO_BIN_EXE_kiln"))
            .arg("run")
            .args(mode)
            .arg(&host)
            .args(["--", &plugin_arg])
            .output()
            .unwrap();
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            expected,
            "{mode:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(out.status.code(), Some(0));
    }
    // Without the exports the plugin cannot load, as with a native program linked
    // without -Wl,-E.
    let out = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(["run", "--no-export-dynamic"])
        .arg(&host)
        .args(["--", &plugin_arg])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("dlsym(host_log): missing")
            && stdout.contains("dlopen failed")
            && stdout.contains("undefined symbol"),
        "{stdout}"
    );
    assert_eq!(out.status.code(), Some(3));
}

/// `kiln run` publishes a program's exports when the program first calls the loader; a
/// shared library given to `kiln run` reaches the loader without the program, so with one
/// the exports are published at once: its own `dlsym(RTLD_DEFAULT, …)` finds the
/// program's function, in and out of process, mapped from the image cache or linked.
#[test]
fn a_library_given_to_kiln_run_finds_the_programs_definitions_itself() {
    executor_binary();
    let tmp = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("library_lookup");
    std::fs::create_dir_all(&tmp).unwrap();
    let lib_c = tmp.join("lookup.c");
    std::fs::write(
        &lib_c,
        "#include <dlfcn.h>\n\
         int call_program(const char *name, int x) {\n\
           int (*f)(int) = (int (*)(int))dlsym(RTLD_DEFAULT, name);\n\
           return f ? f(x) : -1;\n}\n",
    )
    .unwrap();
    let main_c = tmp.join("main.c");
    std::fs::write(
        &main_c,
        "#include <stdio.h>\n\
         int call_program(const char *name, int x);\n\
         int twice(int x) { return 2 * x; }\n\
         int main(void) { printf(\"%d\\n\", call_program(\"twice\", 21)); return 0; }\n",
    )
    .unwrap();
    let lib = tmp.join("liblookup.so");
    let obj = tmp.join("main.o");
    cc(&["-O2", "-fPIC", "-shared"], &lib_c, &lib);
    cc(&["-O2", "-fPIE", "-c"], &main_c, &obj);
    let cache = tmp.join("cache");
    for (round, mode) in [&[][..], &[], &["--oop"]].iter().enumerate() {
        let out = Command::new(env!("CARGO_BIN_EXE_kiln"))
            .env("KILN_CACHE_DIR", &cache)
            .arg("run")
            .args(*mode)
            .arg(&obj)
            .arg(&lib)
            .output()
            .unwrap();
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            "42\n",
            "round {round} {mode:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// A program's exports cost nothing until it asks the loader: no exports object is mapped
/// before its first `dlsym`, and that `dlsym` finds its function — in process, out of
/// process over shared memory and by copy (the controller sends the list in the link's
/// batch; the executor opens it at the program's first call of a loader shim), from the
/// image cache too; also with a library new to the process that cannot see them (libm).
#[test]
fn exports_wait_for_the_programs_first_loader_call() {
    executor_binary();
    let tmp = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("exports_on_demand");
    std::fs::create_dir_all(&tmp).unwrap();
    let main_c = tmp.join("main.c");
    std::fs::write(
        &main_c,
        "#include <dlfcn.h>\n\
         #include <stdio.h>\n\
         #include <string.h>\n\
         int twice(int x) { return 2 * x; }\n\
         static int exports_mapped(void) {\n\
           FILE *f = fopen(\"/proc/self/maps\", \"r\");\n\
           char line[4096];\n\
           int found = 0;\n\
           while (f && fgets(line, sizeof line, f)) found |= strstr(line, \"kiln-exports-\") != 0;\n\
           if (f) fclose(f);\n\
           return found;\n\
         }\n\
         int main(void) {\n\
           printf(\"before: %d\\n\", exports_mapped());\n\
           int (*f)(int) = (int (*)(int))dlsym(RTLD_DEFAULT, \"twice\");\n\
           printf(\"dlsym: %d\\n\", f ? f(21) : -1);\n\
           printf(\"after: %d\\n\", exports_mapped());\n\
           return 0;\n\
         }\n",
    )
    .unwrap();
    let obj = tmp.join("main.o");
    cc(&["-O2", "-fPIE", "-c"], &main_c, &obj);
    let cache = tmp.join("cache");
    let modes: [&[&str]; 4] = [&[], &[], &["--oop"], &["--oop", "--transport", "copy"]];
    // Alone, and with -lm: a library new to the process that imports none of the
    // program's names nor the loader's (libm.so.6): the exports still wait.
    for flags in [&[][..], &["-lm"]] {
        for (round, mode) in modes.iter().enumerate() {
            let out = Command::new(env!("CARGO_BIN_EXE_kiln"))
                .env("KILN_CACHE_DIR", &cache)
                .arg("run")
                .args(*mode)
                .arg(&obj)
                .args(flags)
                .output()
                .unwrap();
            assert_eq!(
                String::from_utf8_lossy(&out.stdout),
                "before: 0\ndlsym: 42\nafter: 1\n",
                "round {round} {mode:?} {flags:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            assert_eq!(out.status.code(), Some(0));
        }
    }
}

#[test]
fn noexec_runs_no_code_at_all() {
    // A constructor and a destructor that would write files: --noexec must run neither.
    let tmp = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    let marker = tmp.join(format!("noexec-marker-{}", std::process::id()));
    let src = tmp.join("noexec.c");
    std::fs::write(
        &src,
        format!(
            "#include <stdio.h>\n\
             static void touch(const char *what) {{ FILE *f = fopen(\"{m}\", \"a\"); if (f) {{ fputs(what, f); fclose(f); }} }}\n\
             __attribute__((constructor)) static void init(void) {{ touch(\"init\\n\"); }}\n\
             __attribute__((destructor)) static void fini(void) {{ touch(\"fini\\n\"); }}\n\
             int main(void) {{ touch(\"main\\n\"); return 0; }}\n",
            m = marker.display()
        ),
    )
    .unwrap();
    let obj = tmp.join("noexec.o");
    cc(&["-O2", "-fPIE", "-c"], &src, &obj);
    let _ = std::fs::remove_file(&marker);
    let out = kiln(&["--noexec"], std::slice::from_ref(&obj));
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        !marker.exists(),
        "--noexec ran code: {}",
        std::fs::read_to_string(&marker).unwrap_or_default()
    );
    // And without it, all three run (the check above can fail).
    let out = kiln(&[], &[obj]);
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(
        std::fs::read_to_string(&marker).unwrap(),
        "init\nmain\nfini\n"
    );
    let _ = std::fs::remove_file(&marker);
}

#[test]
fn exit_status_and_fatal_signals_are_the_same_in_and_out_of_process() {
    executor_binary();
    let tmp = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    let src = tmp.join("exits.c");
    std::fs::write(
        &src,
        "#include <stdio.h>\n#include <stdlib.h>\n\
         int *volatile nowhere = 0;\n\
         __attribute__((noinline)) int crash_here(int x) { return *nowhere + x; }\n\
         int main(int argc, char **argv) {\n\
           if (argc < 2) return 5;\n\
           switch (argv[1][0]) {\n\
           case 'e': printf(\"exiting\\n\"); exit(3);\n\
           case 'z': exit(0);\n\
           case 'a': abort();\n\
           default: return crash_here(argc);\n\
           }\n}\n",
    )
    .unwrap();
    let obj = tmp.join("exits.o");
    cc(&["-O2", "-fPIE", "-c"], &src, &obj);
    let obj_arg = obj.display().to_string();
    for mode in [&[][..], &["--oop"], &["--oop", "--transport", "copy"]] {
        let run = |arg: Option<&str>| {
            let mut cmd = Command::new(env!("CARGO_BIN_EXE_kiln"));
            cmd.arg("run").args(mode).arg(&obj_arg);
            if let Some(a) = arg {
                cmd.args(["--", a]);
            }
            cmd.output().unwrap()
        };
        assert_eq!(run(None).status.code(), Some(5), "{mode:?}: main's status");
        let exited = run(Some("e"));
        assert_eq!(exited.status.code(), Some(3), "{mode:?}: exit(3)");
        assert_eq!(String::from_utf8_lossy(&exited.stdout), "exiting\n");
        assert_eq!(run(Some("z")).status.code(), Some(0), "{mode:?}: exit(0)");
        assert_eq!(
            run(Some("a")).status.code(),
            Some(128 + 6),
            "{mode:?}: abort()"
        );
        let crashed = run(Some("s"));
        let stderr = String::from_utf8_lossy(&crashed.stderr);
        assert_eq!(crashed.status.code(), Some(128 + 11), "{mode:?}: {stderr}");
        assert!(stderr.contains("SIGSEGV"), "{mode:?}: {stderr}");
        if mode.is_empty() {
            // In process, the report names the faulting address and the JIT function.
            assert!(
                stderr.contains("accessing 0x0") && stderr.contains("in crash_here+0x"),
                "{stderr}"
            );
        }
    }
}

/// What a program inherits from `kiln` before its `main` (Kiln's binaries skip Rust's
/// runtime set-up and do its part themselves, `kiln_runtime::process_entry`): a closed
/// standard input is `/dev/null` (not whichever file `kiln` opened first), and `SIGPIPE`
/// is ignored, in and out of process. (Out of process, the executor inherits the
/// `/dev/null` `kiln` opened: what is checked there is the executor's `SIGPIPE`, which
/// its spawn resets to the default.)
#[test]
fn a_closed_standard_input_and_sigpipe_reach_the_program_as_before() {
    executor_binary();
    let tmp = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    let src = tmp.join("inherits.c");
    std::fs::write(
        &src,
        "#include <signal.h>\n#include <unistd.h>\n\
         int main(void) {\n\
           char c;\n\
           if (read(0, &c, 1) != 0) return 7;\n\
           if (signal(SIGPIPE, SIG_DFL) != SIG_IGN) return 9;\n\
           return 0;\n}\n",
    )
    .unwrap();
    let obj = tmp.join("inherits.o");
    cc(&["-O2", "-fPIE", "-c"], &src, &obj);
    for mode in ["", "--oop"] {
        // `exec <&-`: kiln starts with descriptor 0 closed.
        let out = Command::new("sh")
            .arg("-c")
            .arg(format!(
                "exec {} run {mode} {} <&-",
                env!("CARGO_BIN_EXE_kiln"),
                obj.display()
            ))
            .output()
            .unwrap();
        assert_eq!(
            out.status.code(),
            Some(0),
            "{mode}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

fn kiln_python(args: &[&str]) -> Output {
    let config = kiln_testkit::python_config_dir();
    Command::new(env!("CARGO_BIN_EXE_kiln"))
        .arg("run")
        .arg(config.join("python.o"))
        .arg(config.join("libpython3.11-pic.a"))
        .args(["-lm", "-lz", "-lexpat", "--"])
        .args(args)
        .envs(kiln_testkit::python_tests_env())
        .output()
        .unwrap()
}

#[test]
fn cpython_forks_like_the_native_interpreter() {
    // The child used to abort (its copy of the interpreter state was the parent's, taken
    // after the parent had moved on).
    let script = "import os, sys\n\
                  pid = os.fork()\n\
                  if pid == 0:\n    print('child', os.getpid() != os.getppid(), flush=True)\n    sys.exit(4)\n\
                  _, status = os.waitpid(pid, 0)\n\
                  print('parent', os.waitstatus_to_exitcode(status))\n";
    let out = kiln_python(&["-c", script]);
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "child True\nparent 4\n",
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(out.status.code(), Some(0));
}

#[test]
fn cpython_runs_itself_again_through_sys_executable() {
    // argv[0] is a launcher that runs the same program again (mapped from the image cache):
    // sys.executable starts this interpreter, not whatever python is on PATH.
    let script = "import sys, subprocess\n\
                  r = subprocess.run([sys.executable, '-c', 'import sys; print(6 * 7, sys.executable)'],\n\
                                     capture_output=True, text=True)\n\
                  print(r.returncode, r.stdout.split()[0], r.stdout.split()[1] == sys.executable)\n\
                  print('launcher' if 'launchers-v1' in sys.executable else sys.executable)\n";
    let out = kiln_python(&["-c", script]);
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "0 42 True\nlauncher\n",
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // CPython's own tests that start sys.executable (they failed when argv[0] was
    // `python`, found on PATH: another interpreter).
    let out = kiln_python(&["-m", "test", "test_compile"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("Tests result: SUCCESS"),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn cpython_extension_modules_pass_their_own_test_suites() {
    // lib-dynload's extension modules (_json, _decimal, _ctypes, …) find the interpreter's
    // definitions in the exports Kiln makes, as a native python's `-Wl,-E` exports;
    // test_fork1 forks from threads. The same test modules, one process, no -j, as with
    // Debian's natively linked interpreter.
    let tests = ["test_json", "test_decimal", "test_ctypes", "test_fork1"];
    let mut args = vec!["-m", "test"];
    args.extend(tests);
    let native = Command::new("/usr/bin/python3.11")
        .args(&args)
        .envs(kiln_testkit::python_tests_env())
        .output()
        .unwrap();
    let out = kiln_python(&args);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let summary = format!("All {} tests OK.", tests.len());
    assert!(
        String::from_utf8_lossy(&native.stdout).contains(&summary),
        "the native interpreter itself fails: {}",
        String::from_utf8_lossy(&native.stdout)
    );
    assert!(
        stdout.contains(&summary),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(out.status.code(), native.status.code());
}

#[test]
fn static_tls_exhausted_is_an_error_naming_the_bytes_and_the_tunable() {
    let tmp = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    let src = tmp.join("big_static_tls.c");
    std::fs::write(
        &src,
        "#include <stdio.h>\n\
         static __thread char big[65536];\n\
         __attribute__((noinline)) char *slot(int i) { return &big[i]; }\n\
         int main(int argc, char **argv) { (void)argv; *slot(65535) = (char)argc; printf(\"%d\\n\", *slot(65535)); return 0; }\n",
    )
    .unwrap();
    let obj = tmp.join("big_static_tls.o");
    cc(&["-O2", "-fPIE", "-c"], &src, &obj);
    // glibc's default surplus (a few KiB) cannot hold 64 KiB.
    let out = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .arg("run")
        .arg(&obj)
        .env_remove("GLIBC_TUNABLES")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("65536") && stderr.contains("glibc.rtld.optional_static_tls"),
        "{stderr}"
    );
    assert!(stderr.contains("big_static_tls.o"), "{stderr}");
    // With the surplus enlarged as the message says, the same program runs.
    let out = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .arg("run")
        .arg(&obj)
        .env("GLIBC_TUNABLES", "glibc.rtld.optional_static_tls=200000")
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "1\n",
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn a_remote_program_behaves_like_a_local_one() {
    // kiln run --connect: stdin goes to the program, its stdout and stderr come back, and
    // its exit status (main's, exit(n), a signal's) is kiln's.
    use std::io::{BufRead, Write};
    executor_binary();
    let tmp = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    let src = tmp.join("remote_stdio.c");
    std::fs::write(
        &src,
        "#include <stdio.h>\n#include <stdlib.h>\n#include <string.h>\n\
         int main(int argc, char **argv) {\n\
           char line[256]; int n = 0;\n\
           while (fgets(line, sizeof line, stdin)) { n++; printf(\"got: %s\", line); }\n\
           fprintf(stderr, \"lines=%d\\n\", n);\n\
           if (argc > 1 && strcmp(argv[1], \"exit\") == 0) exit(7);\n\
           if (argc > 1 && strcmp(argv[1], \"crash\") == 0) *(volatile int *)8 = 1;\n\
           return n;\n}\n",
    )
    .unwrap();
    let obj = tmp.join("remote_stdio.o");
    cc(&["-O2", "-fPIE", "-c"], &src, &obj);
    let key = tmp.join(format!("stdio-{}.key", std::process::id()));
    let _ = std::fs::remove_file(&key);
    let executor = Path::new(env!("CARGO_BIN_EXE_kiln")).with_file_name("kiln-executor");
    let mut listener = kiln_testkit::KillOnDrop(
        Command::new(&executor)
            .args(["--listen", "127.0.0.1:0", "--key-file"])
            .arg(&key)
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let mut stderr = std::io::BufReader::new(listener.stderr.take().unwrap());
    let mut line = String::new();
    while !line.starts_with("kiln-executor: listening on") {
        line.clear();
        stderr.read_line(&mut line).unwrap();
    }
    let address = line.trim().rsplit(' ').next().unwrap().to_string();
    let run = |arg: &str| {
        let mut child = Command::new(env!("CARGO_BIN_EXE_kiln"))
            .args(["run", "--connect", &address, "--key-file"])
            .arg(&key)
            .arg(&obj)
            .args(["--", arg])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(b"alpha\nbeta\n")
            .unwrap();
        child.wait_with_output().unwrap()
    };
    let out = run("return");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "got: alpha\ngot: beta\n"
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("lines=2"));
    assert_eq!(out.status.code(), Some(2));
    let out = run("exit");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "got: alpha\ngot: beta\n"
    );
    assert_eq!(out.status.code(), Some(7));
    // A crash report is never lost (issue 25): the executor dies with the program's
    // stderr just sent, a hundred times over, and kiln reports the signal every time.
    for attempt in 0..100 {
        let out = run("crash");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(
            out.status.code(),
            Some(128 + 11),
            "attempt {attempt}: {stderr}"
        );
        assert!(stderr.contains("SIGSEGV"), "attempt {attempt}: {stderr}");
        assert!(stderr.contains("lines=2"), "attempt {attempt}: {stderr}");
    }
    drop(listener);
    let _ = std::fs::remove_file(&key);
}

#[test]
fn a_pre_started_executor_serves_kiln_run_oop() {
    // kiln-executor --listen-unix PATH: a process forked per session, the socket only
    // this user's (and the peer checked), the program on kiln run's own stdin/stdout/stderr.
    use std::io::Write;
    use std::os::unix::fs::PermissionsExt;
    executor_binary();
    let dir = programs_dir();
    let expected = std::fs::read_to_string(dir.join("runtime_exit.expected")).unwrap();
    let socket = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("executor-{}.sock", std::process::id()));
    let executor = Path::new(env!("CARGO_BIN_EXE_kiln")).with_file_name("kiln-executor");
    let daemon = kiln_testkit::KillOnDrop(
        Command::new(&executor)
            .arg("--listen-unix")
            .arg(&socket)
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );
    for _ in 0..200 {
        if socket.exists() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    // Nobody but its owner may connect.
    assert_eq!(
        std::fs::metadata(&socket).unwrap().permissions().mode() & 0o077,
        0,
        "the socket is accessible to others"
    );
    for _ in 0..2 {
        let out = Command::new(env!("CARGO_BIN_EXE_kiln"))
            .env("KILN_EXECUTOR_SOCKET", &socket)
            .args(["run", "--oop"])
            .arg(dir.join("runtime_exit.o"))
            .output()
            .unwrap();
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            expected,
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(out.status.code(), Some(0));
    }
    // stdin reaches the program too, and exit(n) is kiln's status.
    let src = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("prestarted_stdin.c");
    std::fs::write(
        &src,
        "#include <stdio.h>\n#include <stdlib.h>\nint main(void) { int n = 0, c; while ((c = getchar()) != EOF) n += c == '\\n'; printf(\"%d lines\\n\", n); exit(n); }\n",
    )
    .unwrap();
    let obj = src.with_extension("o");
    cc(&["-O2", "-fPIE", "-c"], &src, &obj);
    let mut child = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .env("KILN_EXECUTOR_SOCKET", &socket)
        .args(["run", "--oop"])
        .arg(&obj)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(b"1\n2\n3\n").unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "3 lines\n");
    assert_eq!(out.status.code(), Some(3));
    drop(daemon);
    let _ = std::fs::remove_file(&socket);
}
