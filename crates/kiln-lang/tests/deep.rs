//! Deep programs (issue 23's corpus): each used to overflow the parser's or the checker's
//! stack (SIGABRT) though none recurses. Here they run on the test harness's threads (2
//! MiB stacks): every one too deep is a "too deeply nested" error with a position; the
//! deepest programs the limit allows, and flat chains of any length (`1+1+…`, which are
//! long, not deep), compile, link and give the right value.

use kiln_lang::syntax::MAX_NESTING;
use kiln_lang::{LangError, Options, Outcome, Runtime};

/// Programs past the limit, named.
fn too_deep() -> Vec<(&'static str, String)> {
    vec![
        (
            "5,000 nested parentheses",
            format!("{}1{};", "(".repeat(5_000), ")".repeat(5_000)),
        ),
        (
            "20,000 nested right operands",
            format!("1{}{};", "+(1".repeat(20_000), ")".repeat(20_000)),
        ),
        ("100,000 unary minus", format!("{}1;", "-".repeat(100_000))),
        (
            "20,000 nested blocks",
            format!("{}1{};", "{".repeat(20_000), "}".repeat(20_000)),
        ),
        (
            "20,000 nested ifs",
            format!(
                "{}1{};",
                "if 1 then ".repeat(20_000),
                " else 0".repeat(20_000)
            ),
        ),
        (
            "20,000 nested calls",
            format!("fn f(x) = {}1{};", "f(".repeat(20_000), ")".repeat(20_000)),
        ),
        (
            "20,000 nested whiles",
            format!("fn g(x) = {}x;", "while 0 do ".repeat(20_000)),
        ),
        (
            "20,000 nested assignments",
            format!("fn g(x) = {}1;", "x = ".repeat(20_000)),
        ),
    ]
}

#[test]
fn programs_too_deep_are_errors_with_a_position() {
    let mut rt = Runtime::new(Options::default()).unwrap();
    for (what, program) in too_deep() {
        match rt.load(&program) {
            Err(LangError::Syntax(e)) => {
                assert!(e.message.contains("too deeply nested"), "{what}: {e}");
                assert_eq!(e.position.line, 1, "{what}: {e}");
                let message = LangError::Syntax(e).to_string();
                assert!(
                    message.starts_with("syntax error at 1:"),
                    "{what}: {message}"
                );
            }
            other => panic!("{what}: {other:?}"),
        }
    }
    // Nothing was defined by the failed loads; the runtime still works.
    assert_eq!(rt.load("1 + 2;").unwrap(), [Outcome::Value(3)]);
}

#[test]
fn the_deepest_programs_allowed_compile_and_run() {
    let n = MAX_NESTING as usize - 2;
    assert!(n >= 120, "a limit that still lets people write programs");
    let mut rt = Runtime::new(Options {
        eager: true,
        ..Options::default()
    })
    .unwrap();
    let cases = [
        (format!("{}41{} + 1;", "(".repeat(n), ")".repeat(n)), 42),
        (format!("0{};", "+1".repeat(n)), n as i64),
        (format!("{}5;", "-".repeat(n)), 5),
        (format!("{}7{};", "{".repeat(n), "}".repeat(n)), 7),
        (
            format!(
                "{}3{};",
                "if 1 then ".repeat(n / 2),
                " else 0".repeat(n / 2)
            ),
            3,
        ),
        // Right operands nested as deep as the limit allows.
        // (each counts twice: a right operand, and parentheses)
        (
            format!("0{}{};", "+(1".repeat(n / 2), ")".repeat(n / 2)),
            (n / 2) as i64,
        ),
        // Flat chains of 20,000 terms: long, not deep.
        (format!("1{};", "+1".repeat(19_999)), 20_000),
        (format!("100{};", "-1".repeat(19_999)), 100 - 19_999),
        (
            format!(
                "{}1{} + 1;",
                "(".repeat(n),
                "+1".repeat(19_999) + &")".repeat(n)
            ),
            20_001,
        ),
    ];
    for (program, value) in cases {
        assert_eq!(
            rt.load(&program).unwrap(),
            [Outcome::Value(value)],
            "{}",
            &program[..program.len().min(60)]
        );
    }
    // As function bodies, compiled on first call, with a parameter in the deepest place.
    rt.load(&format!(
        "fn deep(x) = {}x{} * 2;",
        "(".repeat(n),
        ")".repeat(n)
    ))
    .unwrap();
    assert_eq!(rt.call("deep", &[21]).unwrap(), 42);
    let product = format!("fn product(x) = x{};", "*x".repeat(19_999));
    let mut lazy = Runtime::new(Options::default()).unwrap();
    lazy.load(&product).unwrap();
    assert_eq!(lazy.call("product", &[1]).unwrap(), 1);
    assert_eq!(
        lazy.call("product", &[-1]).unwrap(),
        1,
        "an even number of factors"
    );
}
