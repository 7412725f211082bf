//! `kiln run` as a C programmer uses it: sources compiled through the object cache (cold,
//! then warm), compiler flags passed through, and the options and messages of a linker's
//! command line.

use std::path::PathBuf;
use std::process::{Command, Output};

fn kiln() -> Command {
    Command::new(env!("CARGO_BIN_EXE_kiln"))
}

fn scratch(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join("cli")
        .join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn text(out: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn sources_compile_through_the_cache_cold_then_warm_with_flags() {
    let dir = scratch("sources");
    std::fs::write(
        dir.join("prog.c"),
        "#include <stdio.h>\n#include \"inc/k.h\"\nint twice(int);\n\
         int main(int argc, char **argv) { printf(\"%d %s %d\\n\", K, argc > 1 ? argv[1] : \"-\", twice(VALUE)); return 0; }\n",
    )
    .unwrap();
    std::fs::create_dir_all(dir.join("inc")).unwrap();
    std::fs::write(dir.join("inc/k.h"), "#define K 7\n").unwrap();
    std::fs::write(
        dir.join("util.cpp"),
        "extern \"C\" int twice(int x) { return 2 * x; }\n",
    )
    .unwrap();
    let cache = dir.join("cache");
    let run = || {
        kiln()
            .current_dir(&dir)
            .args(["run", "-v", "-O2", "-DVALUE=21", "-I", "."])
            .arg("--cache-dir")
            .arg(&cache)
            .args(["prog.c", "util.cpp", "--", "arg"])
            .output()
            .unwrap()
    };
    let cold = run();
    let (stdout, stderr) = text(&cold);
    assert!(cold.status.success(), "{stderr}");
    assert_eq!(stdout, "7 arg 42\n");
    assert!(
        stderr.contains("prog.c: compiled") && stderr.contains("util.cpp: compiled"),
        "{stderr}"
    );
    let warm = run();
    let (stdout, stderr) = text(&warm);
    assert_eq!(stdout, "7 arg 42\n");
    assert!(
        stderr.contains("prog.c: from the cache") && stderr.contains("util.cpp: from the cache"),
        "{stderr}"
    );
    // A header changed: compiled again.
    std::fs::write(dir.join("inc/k.h"), "#define K 8\n").unwrap();
    let (stdout, stderr) = text(&run());
    assert_eq!(stdout, "8 arg 42\n");
    assert!(stderr.contains("prog.c: compiled"), "{stderr}");
    // kiln cache stats sees the entries (an object and a manifest per source, the edited
    // one's manifest replaced); clear empties the cache.
    let stats = kiln()
        .args(["cache", "stats", "--cache-dir"])
        .arg(&cache)
        .output()
        .unwrap();
    assert!(text(&stats).0.contains("entries: 5"), "{}", text(&stats).0);
    let clear = kiln()
        .args(["cache", "clear", "--cache-dir"])
        .arg(&cache)
        .output()
        .unwrap();
    assert!(
        text(&clear).0.contains("removed 5 entries"),
        "{}",
        text(&clear).0
    );
    // A compile error is the compiler's message.
    std::fs::write(dir.join("bad.c"), "int main(void) { return nope; }\n").unwrap();
    let bad = kiln()
        .current_dir(&dir)
        .args(["run", "--no-cache", "bad.c"])
        .output()
        .unwrap();
    assert!(!bad.status.success());
    assert!(text(&bad).1.contains("nope"), "{}", text(&bad).1);
}

#[test]
fn linker_options_map_defsym_whole_archive_and_shared_inputs() {
    let dir = scratch("options");
    let src = |name: &str, body: &str| {
        let c = dir.join(format!("{name}.c"));
        std::fs::write(&c, body).unwrap();
        kiln_testkit::cc(&["-c", "-O1", "-fPIC"], &c, &dir.join(format!("{name}.o")));
    };
    src(
        "main",
        "#include <stdio.h>\nextern char magic[];\nint used(void);\n\
         int main(void) { printf(\"%d %p\\n\", used(), (void *)magic); return 0; }\n",
    );
    src("used", "int used(void) { return 5; }\n");
    src("unused", "int unused_fn(void) { return 6; }\n");
    assert!(Command::new("ar")
        .arg("rcs")
        .arg(dir.join("lib.a"))
        .arg(dir.join("used.o"))
        .arg(dir.join("unused.o"))
        .status()
        .unwrap()
        .success());
    let out = kiln()
        .current_dir(&dir)
        .args([
            "run",
            "-v",
            "--map",
            "--defsym",
            "magic=0x1234",
            "main.o",
            "lib.a",
            "-pthread",
        ])
        .output()
        .unwrap();
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stderr}");
    assert!(stdout.ends_with("5 0x1234\n"), "{stdout}");
    assert!(
        stdout.lines().any(|l| l.ends_with(" main")),
        "--map lists main:\n{stdout}"
    );
    assert!(stderr.contains("linked lib.a(used.o)"), "{stderr}");
    assert!(
        !stderr.contains("unused.o"),
        "only needed members: {stderr}"
    );
    // --whole-archive: every member.
    let out = kiln()
        .current_dir(&dir)
        .args([
            "run",
            "-v",
            "--whole-archive",
            "--defsym",
            "magic=0x1234",
            "main.o",
            "lib.a",
        ])
        .output()
        .unwrap();
    assert!(text(&out).1.contains("lib.a(unused.o)"), "{}", text(&out).1);
    // -u: the member defining the name is linked too.
    let out = kiln()
        .current_dir(&dir)
        .args([
            "run",
            "-v",
            "-u",
            "unused_fn",
            "--defsym",
            "magic=0x1234",
            "main.o",
            "lib.a",
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out).1);
    assert!(text(&out).1.contains("lib.a(unused.o)"), "{}", text(&out).1);
    // -l:FILE and a .so given as an input.
    let out = kiln()
        .current_dir(&dir)
        .args([
            "run",
            "--defsym",
            "magic=0x1234",
            "main.o",
            "-L",
            ".",
            "-l:lib.a",
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out).1);
    let so = dir.join("libused.so");
    kiln_testkit::cc(&["-shared", "-fPIC"], &dir.join("used.c"), &so);
    let out = kiln()
        .current_dir(&dir)
        .args(["run", "--defsym", "magic=0x1234", "main.o", "libused.so"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out).1);
    assert!(text(&out).0.starts_with("5 "), "{}", text(&out).0);
}

#[test]
fn messages_say_what_to_do() {
    let dir = scratch("messages");
    let run = |args: &[&str]| {
        let out = kiln()
            .current_dir(&dir)
            .arg("run")
            .args(args)
            .output()
            .unwrap();
        assert!(!out.status.success(), "{args:?} should fail");
        text(&out).1
    };
    // Contradictory flags.
    assert!(run(&["--transport", "copy", "x.o"]).contains("--transport applies to --oop"));
    assert!(run(&["--oop", "--connect", "h:1", "x.o"]).contains("use one"));
    // Program arguments without `--`.
    std::fs::write(dir.join("p.c"), "int main(void) { return 0; }\n").unwrap();
    kiln_testkit::cc(&["-c"], &dir.join("p.c"), &dir.join("p.o"));
    assert!(run(&["p.o", "arg1"]).contains("put it after `--`"));
    // A directory as an input; a misspelt long option.
    std::fs::create_dir_all(dir.join("somedir")).unwrap();
    assert!(run(&["somedir"]).contains("somedir: is a directory"));
    assert!(run(&["--verbos", "p.o"]).contains("'--verbose'"));
    // A C++ object compiled without PIC: what to do, not an option kiln run lacks.
    std::fs::write(
        dir.join("nopic.cpp"),
        "#include <iostream>\nint main() { std::cout << \"hi\" << std::endl; return 0; }\n",
    )
    .unwrap();
    let nopic = Command::new("c++")
        .args(["-c", "-O1", "-fno-pic", "-mcmodel=small"])
        .arg(dir.join("nopic.cpp"))
        .arg("-o")
        .arg(dir.join("nopic.o"))
        .status()
        .unwrap();
    assert!(nopic.success());
    let message = run(&["nopic.o", "-lstdc++"]);
    assert!(
        message.contains("copy relocation")
            && message.contains("-fPIE")
            && !message.contains("give the linker"),
        "{message}"
    );
    // A COFF object (Windows') for this Linux process: said so, before any link.
    if !kiln_testkit::skip_cross("messages_say_what_to_do (COFF)") {
        let coff = Command::new("x86_64-w64-mingw32-gcc")
            .args(["-c", "-O1"])
            .arg(dir.join("p.c"))
            .arg("-o")
            .arg(dir.join("win.obj"))
            .status()
            .unwrap();
        assert!(coff.success());
        for args in [&["win.obj"][..], &["--no-image-cache", "win.obj"]] {
            let message = run(args);
            assert!(
                message.contains("win.obj: a COFF object") && message.contains("runs Linux"),
                "{message}"
            );
        }
    }
    // A linked program as an input.
    kiln_testkit::cc(&[], &dir.join("p.c"), &dir.join("p"));
    assert!(run(&["p"]).contains("a linked program, not an object"));
    // An LTO-only object.
    kiln_testkit::cc(&["-c", "-flto"], &dir.join("p.c"), &dir.join("lto.o"));
    assert!(run(&["lto.o"]).contains("-flto"));
    // Undefined C++ names, demangled. (With the C++ library given, as `c++` links it into
    // every program, a missing name is the program's own.)
    std::fs::write(
        dir.join("cxx.cpp"),
        "#include <string>\nint missing_fn(const std::string &);\nint main() { std::string s(\"x\"); return missing_fn(s); }\n",
    )
    .unwrap();
    Command::new("c++")
        .args(["-c", "-O1", "-fPIC"])
        .arg(dir.join("cxx.cpp"))
        .arg("-o")
        .arg(dir.join("cxx.o"))
        .status()
        .unwrap();
    let message = run(&["--no-export-dynamic", "cxx.o", "-lstdc++"]);
    assert!(
        message.contains("missing_fn(std::") && message.contains("cxx.o"),
        "{message}"
    );
    assert!(
        !message.contains("-lstdc++"),
        "no library hint for the program's own name: {message}"
    );
    // Without the C++ library (kiln itself does not load it), its names are missing and
    // the hint says what to add.
    let message = run(&["--no-export-dynamic", "cxx.o"]);
    assert!(
        message.contains("std::")
            && message.contains("hint: C++ code needs the C++ library: add -lstdc++"),
        "{message}"
    );
    // --help has examples and the exit statuses.
    let help = kiln().arg("--help").output().unwrap();
    let help = text(&help).0;
    assert!(
        help.contains("Examples:") && help.contains("Exit status"),
        "{help}"
    );
}

#[test]
fn two_processes_racing_on_one_cache_key_both_succeed_with_one_whole_entry() {
    let dir = scratch("race");
    let mut body = String::from("#include <stdio.h>\n");
    for i in 0..300 {
        body.push_str(&format!("int r{i}(int x) {{ return x ^ {i}; }}\n"));
    }
    body.push_str("int main(void) { printf(\"%d\\n\", r7(1)); return 0; }\n");
    std::fs::write(dir.join("race.c"), body).unwrap();
    let cache = dir.join("cache");
    let children: Vec<_> = (0..2)
        .map(|_| {
            kiln()
                .current_dir(&dir)
                .args(["run", "--cache-dir"])
                .arg(&cache)
                .arg("race.c")
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    for child in children {
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success(), "{}", text(&out).1);
        assert_eq!(text(&out).0, "6\n");
    }
    let stats = kiln()
        .args(["cache", "stats", "--cache-dir"])
        .arg(&cache)
        .output()
        .unwrap();
    let stats = text(&stats).0;
    assert!(
        stats.contains("entries: 2") && stats.contains("temporary files: 0"),
        "an object and its manifest, whole:\n{stats}"
    );
    let again = kiln()
        .current_dir(&dir)
        .args(["run", "-v", "--cache-dir"])
        .arg(&cache)
        .arg("race.c")
        .output()
        .unwrap();
    assert!(
        text(&again).1.contains("from the cache"),
        "{}",
        text(&again).1
    );
}

#[test]
fn cxx_sources_link_the_cxx_library_as_cxx_would() {
    let dir = scratch("cxx");
    std::fs::write(
        dir.join("util.cpp"),
        "#include <vector>\nextern \"C\" int vsum(int n) { std::vector<int> v; \
         for (int i = 0; i < n; i++) v.push_back(i); int s = 0; for (int x : v) s += x; return s; }\n",
    )
    .unwrap();
    std::fs::write(
        dir.join("main.c"),
        "#include <stdio.h>\nint vsum(int);\nint main(void) { printf(\"%d\\n\", vsum(5)); return 0; }\n",
    )
    .unwrap();
    let out = kiln()
        .current_dir(&dir)
        .args(["run", "--no-cache", "-O2", "main.c", "util.cpp"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out).1);
    assert_eq!(text(&out).0, "10\n");
}

#[test]
fn an_initializer_outside_the_module_is_refused_in_process_as_out_of_process() {
    kiln_testkit::executor_binary();
    let dir = scratch("bad-init");
    let src = dir.join("bad_init.c");
    // An `.init_array` entry that points at a C library function, not at the module's code
    // (what a corrupt or crafted array looks like to the linker).
    std::fs::write(
        &src,
        "#include <stdio.h>\n#include <stdlib.h>\n__attribute__((section(\".init_array\"), used)) static void (*bad)(void) = abort;\nint main(void) { puts(\"main ran\"); return 0; }\n",
    )
    .unwrap();
    let obj = dir.join("bad_init.o");
    kiln_testkit::cc(&["-c"], &src, &obj);
    for flags in [&[][..], &["--oop"][..]] {
        let out = kiln().arg("run").args(flags).arg(&obj).output().unwrap();
        let (stdout, stderr) = text(&out);
        assert_eq!(out.status.code(), Some(1), "{flags:?}: {stderr}");
        assert_eq!(stdout, "", "nothing ran");
        assert!(
            stderr.contains("bad_init.o")
                && stderr.contains(".init_array")
                && stderr.contains("outside the module's code"),
            "{flags:?}: {stderr}"
        );
    }
}

#[test]
fn defsym_reaches_its_address_through_the_got_or_says_why_not() {
    let dir = scratch("defsym-pie");
    let src = dir.join("defsym.c");
    std::fs::write(
        &src,
        "#include <stdio.h>\nextern char mysym[];\nint main(void) { printf(\"%p\\n\", (void *)mysym); return 0; }\n",
    )
    .unwrap();
    let pic = dir.join("pic.o");
    let pie = dir.join("pie.o");
    kiln_testkit::cc(&["-c", "-fPIC"], &src, &pic);
    kiln_testkit::cc(&["-c", "-fPIE"], &src, &pie);
    // -fPIC: the reference goes through a GOT entry holding the absolute address.
    let out = kiln()
        .args(["run", "--defsym", "mysym=0x1000"])
        .arg(&pic)
        .output()
        .unwrap();
    let (stdout, stderr) = text(&out);
    assert_eq!(stdout, "0x1000\n", "{stderr}");
    // -fPIE: a direct PC-relative reference cannot reach it; the error says why and
    // what to do, with the distance as a signed number.
    let out = kiln()
        .args(["run", "--defsym", "mysym=0x1000"])
        .arg(&pie)
        .output()
        .unwrap();
    let (_, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("mysym")
            && stderr.contains("--defsym")
            && stderr.contains("Compile with -fPIC"),
        "{stderr}"
    );
    assert!(stderr.contains("value -0x"), "{stderr}");
    assert!(!stderr.contains("0xffffffffffffffff"), "{stderr}");
    // A name an object defines too: both named, the definition as --defsym.
    let out = kiln()
        .args(["run", "--defsym", "mysym=0x1000", "--defsym", "main=0x1000"])
        .arg(&pic)
        .output()
        .unwrap();
    let (_, stderr) = text(&out);
    assert!(
        stderr.contains("'main' is defined twice")
            && stderr.contains("absolute definition at 0x1000 (--defsym)")
            && stderr.contains("pic.o"),
        "{stderr}"
    );
}

#[test]
fn a_cache_that_is_down_or_untrusted_costs_a_compile_and_says_why_with_v() {
    let dir = scratch("cache-skips");
    std::fs::write(
        dir.join("p.c"),
        "#include <stdio.h>\nint main(void) { puts(\"ran\"); return 0; }\n",
    )
    .unwrap();
    // A Redis that is not there (a port nothing listens on).
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = closed.local_addr().unwrap().port();
    drop(closed);
    let out = kiln()
        .current_dir(&dir)
        .args(["run", "-v", "--cache-redis"])
        .arg(format!("redis://127.0.0.1:{port}/"))
        .arg("p.c")
        .output()
        .unwrap();
    let (stdout, stderr) = text(&out);
    assert_eq!(stdout, "ran\n", "{stderr}");
    assert!(stderr.contains("compiled"), "{stderr}");
    assert!(
        stderr.contains("skipped") && stderr.contains("down"),
        "{stderr}"
    );
    // A cache directory anyone may write to: refused with a warning, and a compile.
    let open = dir.join("open-cache");
    std::fs::create_dir_all(&open).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
    let out = kiln()
        .current_dir(&dir)
        .args(["run", "--cache-dir"])
        .arg(&open)
        .arg("p.c")
        .output()
        .unwrap();
    let (stdout, stderr) = text(&out);
    assert_eq!(stdout, "ran\n", "{stderr}");
    assert!(stderr.contains("warning"), "{stderr}");
    assert_eq!(
        std::fs::read_dir(&open).unwrap().count(),
        0,
        "nothing written there"
    );
}
