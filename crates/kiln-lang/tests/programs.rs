//! The language end to end: the example programs through the `kiln-lang` binary (lazy and
//! eager), the REPL with a hot swap, errors, and gdb and perf seeing lazily compiled code.
#![cfg(target_arch = "x86_64")]

use kiln_lang::{LangError, Options, Outcome, Runtime};
use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

fn example(name: &str) -> String {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("examples")
        .join(name)
        .display()
        .to_string()
}

fn kiln_lang(args: &[&str], stdin: &str) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_kiln-lang"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    child.wait_with_output().unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn examples_run_lazily_and_eagerly_with_the_same_output() {
    for (file, stdout, status) in [
        ("fib.kl", "832040\n", 0),
        ("hello.kl", "hello\n", 0),
        ("primes.kl", "", 25),
    ] {
        let lazy = kiln_lang(&["--stats", &example(file)], "");
        let eager = kiln_lang(&["--stats", "--eager", &example(file)], "");
        assert_eq!(
            lazy.status.code(),
            Some(status),
            "{file}: {}",
            text(&lazy.stderr)
        );
        assert_eq!(
            eager.status.code(),
            Some(status),
            "{file}: {}",
            text(&eager.stderr)
        );
        assert!(
            text(&lazy.stdout).ends_with(stdout),
            "{file}: {}",
            text(&lazy.stdout)
        );
        assert_eq!(lazy.stdout, eager.stdout, "{file}");
    }
    // fib.kl defines 3 functions and calls 2: lazily, `unused` is never compiled.
    let lazy = kiln_lang(&["--stats", &example("fib.kl")], "");
    assert!(
        text(&lazy.stderr).contains("3 functions defined, 2 compiled"),
        "{}",
        text(&lazy.stderr)
    );
    let eager = kiln_lang(&["--stats", "--eager", &example("fib.kl")], "");
    assert!(text(&eager.stderr).contains("3 functions defined, 3 compiled"));
    let primes = kiln_lang(&[&example("primes.kl")], "");
    let listed: Vec<&str> = std::str::from_utf8(&primes.stdout)
        .unwrap()
        .lines()
        .collect();
    assert_eq!(listed.len(), 25);
    assert_eq!(listed[..4], ["2", "3", "5", "7"]);
}

#[test]
fn the_repl_evaluates_redefines_and_reports_errors() {
    let out = kiln_lang(
        &[],
        "fn sq(x) = x * x;\n\
         fn quad(x) = sq(sq(x));\n\
         quad(3);\n\
         fn sq(x) = x + 1;\n\
         quad(3);\n\
         fn sq(x, y) = x;\n\
         fn broken(x) = nothere(x);\n\
         1 +\n 2;\n\
         1 $ 2;\n\
         extern fn labs(x) -> i64;\nlabs(-5);\n\
         nope(1);\n\
         let i = 0;\n",
    );
    let stdout = text(&out.stdout);
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(
        lines,
        [
            "defined sq",
            "defined quad",
            "= 81",
            "replaced sq",
            // quad's compiled code calls sq's stub: the new body, no recompile of quad.
            "= 5",
            "error: 1:1: 'sq' has 1 parameter; a new body must keep them (its callers are compiled)",
            "error: broken: 1:16: unknown function 'nothere'",
            "= 3",
            "error: syntax error at 1:3: unexpected character '$'",
            "declared labs",
            "= 5",
            "error: expression: 1:1: unknown function 'nope'",
            "error: syntax error at 1:1: 'let' belongs in a block: { let x = 1; x + 1 }",
        ],
        "{stdout}"
    );
}

#[test]
fn the_library_api_compiles_only_what_runs() {
    let mut rt = Runtime::new(Options::default()).unwrap();
    let mut source = String::new();
    for i in 0..200 {
        source.push_str(&format!("fn f{i}(x) = x + {i};\n"));
    }
    source.push_str("fn main() = f7(1) + f150(1);\n");
    let outcomes = rt.load(&source).unwrap();
    assert_eq!(outcomes.len(), 201);
    assert_eq!(rt.compiled_functions(), 0);
    assert_eq!(rt.call("main", &[]).unwrap(), 8 + 151);
    assert_eq!(rt.compiled_functions(), 3);
    assert_eq!(rt.load("f199(1);").unwrap(), [Outcome::Value(200)]);
    assert_eq!(rt.compiled_functions(), 4);
    // Errors leave the program as it was.
    assert!(matches!(
        rt.load("fn g(x) = y;"),
        Err(LangError::Compile(_))
    ));
    assert!(!rt.has_function("g"));
    assert!(matches!(rt.call("main", &[1]), Err(LangError::Usage(_))));
    // A name the program never defined: the runtime says so before anything is looked up.
    assert!(
        matches!(rt.call("nothing", &[]), Err(LangError::Usage(m)) if m.contains("no function 'nothing'"))
    );
}

#[test]
fn gdb_breaks_in_a_lazily_compiled_function() {
    let out = Command::new("gdb")
        .args(["-batch", "-nx", "-ex", "set debuginfod enabled off"])
        .args([
            "-ex",
            "set breakpoint pending on",
            "-ex",
            "break fib",
            "-ex",
            "run",
        ])
        .args(["-ex", "x/i $pc", "-ex", "bt 3", "-ex", "continue"])
        .arg("--args")
        .arg(env!("CARGO_BIN_EXE_kiln-lang"))
        .args(["--gdb", &example("fib.kl")])
        .stdin(Stdio::null())
        .output()
        .expect("gdb runs (the test command installs it)");
    let all = format!("{}{}", text(&out.stdout), text(&out.stderr));
    // Pending before the first call; hit once the stub's first call linked fib.
    assert!(
        all.contains("Breakpoint 1, ") && all.contains(" in fib ()"),
        "{all}"
    );
    // In the body, not in its call-through stub (named `fib.stub` for debuggers).
    assert!(
        all.lines()
            .any(|l| l.starts_with("=> ") && l.contains("<fib+")),
        "{all}"
    );
    let frames: Vec<&str> = all.lines().filter(|l| l.starts_with('#')).collect();
    assert!(frames.first().is_some_and(|f| f.contains("fib")), "{all}");
    assert!(frames.iter().any(|f| f.contains("main")), "{all}");
}

#[test]
fn perf_map_names_lazily_compiled_functions() {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("kiln-lang");
    std::fs::create_dir_all(&dir).unwrap();
    let source = dir.join("perf_map.kl");
    std::fs::write(
        &source,
        "fn lazily_mapped(x) = x * 3; fn never_mapped(x) = x; fn main() = lazily_mapped(5);",
    )
    .unwrap();
    // Started with its pid's perf map name freed (a pid is reused; a name an earlier
    // process left taken is rightly refused).
    let mut command = Command::new(env!("CARGO_BIN_EXE_kiln-lang"));
    command.args(["--perf-map", source.to_str().unwrap()]);
    let (pid, out) = kiln_testkit::output_with_free_perf_map(&command);
    assert_eq!(out.status.code(), Some(15));
    let path = format!("/tmp/perf-{pid}.map");
    let map = std::fs::read_to_string(&path).unwrap();
    let _ = std::fs::remove_file(&path);
    // The stubs are mapped when defined, a body when compiled.
    assert!(map.lines().any(|l| l.ends_with(" lazily_mapped")), "{map}");
    assert!(
        map.lines().any(|l| l.ends_with(" lazily_mapped.stub")),
        "{map}"
    );
    assert!(
        map.lines().any(|l| l.ends_with(" never_mapped.stub")),
        "{map}"
    );
    assert!(!map.lines().any(|l| l.ends_with(" never_mapped")), "{map}");
}

#[test]
fn division_never_traps() {
    let mut rt = Runtime::new(Options::default()).unwrap();
    let values: Vec<Outcome> = rt
        .load("7 / 0; 7 % 0; (0 - 9223372036854775807 - 1) / (0 - 1); (0 - 9223372036854775807 - 1) % (0 - 1); 7 / 2; 0 - 7 / 2; (0 - 7) % 3; 7 % 3;")
        .unwrap();
    assert_eq!(
        values,
        [0, 0, i64::MIN, 0, 3, -3, -1, 1]
            .map(Outcome::Value)
            .to_vec()
    );
}

/// W^X for the whole process, seen from outside: the REPL after lazily compiled functions,
/// their first calls and a hot swap has no mapping writable and executable, and its stack
/// is `rw-p`.
#[test]
fn the_repl_after_stubs_and_a_hot_swap_has_no_writable_executable_mapping() {
    use std::io::{BufRead, BufReader};
    let mut child = Command::new(env!("CARGO_BIN_EXE_kiln-lang"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    stdin
        .write_all(
            b"fn sq(x) = x * x;\nfn quad(x) = sq(sq(x));\nquad(3);\nfn sq(x) = x + 1;\nquad(3);\n",
        )
        .unwrap();
    stdin.flush().unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut seen = Vec::new();
    while seen.len() < 5 {
        let mut line = String::new();
        assert!(
            stdout.read_line(&mut line).unwrap() > 0,
            "the REPL ended: {seen:?}"
        );
        seen.push(line.trim().to_string());
    }
    assert_eq!(seen[2], "= 81");
    assert_eq!(seen[4], "= 5", "the swapped body runs");
    // The REPL is waiting for input: read its mappings now.
    let maps = std::fs::read_to_string(format!("/proc/{}/maps", child.id())).unwrap();
    let wx: Vec<&str> = maps
        .lines()
        .filter(|l| l.split_whitespace().nth(1).and_then(|p| p.get(1..3)) == Some("wx"))
        .collect();
    assert_eq!(wx, Vec::<&str>::new());
    let stack = maps
        .lines()
        .find(|l| l.ends_with("[stack]"))
        .and_then(|l| l.split_whitespace().nth(1));
    assert_eq!(stack, Some("rw-p"));
    drop(stdin);
    assert!(child.wait().unwrap().success());
}

/// On a terminal the REPL edits lines: the up arrow brings back the last line (run on a
/// pseudo-terminal made by `script`, with the keys typed a line at a time).
#[test]
fn on_a_terminal_the_up_arrow_recalls_the_last_line() {
    use std::io::Read;
    let command = format!("{} ", env!("CARGO_BIN_EXE_kiln-lang"));
    let mut child = Command::new("script")
        .args(["-qec", command.trim(), "/dev/null"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("script (util-linux) runs");
    let mut stdin = child.stdin.take().unwrap();
    for keys in ["fn f(x) = x + 1;\n", "f(1);\n", "\x1b[A\n", "\x04"] {
        stdin.write_all(keys.as_bytes()).unwrap();
        stdin.flush().unwrap();
        std::thread::sleep(std::time::Duration::from_millis(400));
    }
    drop(stdin);
    let mut out = String::new();
    child
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut out)
        .unwrap();
    child.wait().unwrap();
    assert_eq!(out.matches("= 2").count(), 2, "{out:?}");
    assert!(!out.contains("error"), "{out:?}");
}
