//! Reading a body at load without a tree and again at compile with one gives the same
//! results and the same errors as reading it with a tree at once: random programs (with
//! unknown names, wrong arities, scopes, syntax errors) through both ways.

use kiln_lang::check::{check, check_outline, parse_checked};
use kiln_lang::codegen::Callee;
use kiln_lang::syntax::{parse, parse_body, parse_outline, Extern, Item, OutlineItem, Type};
use proptest::prelude::*;
use std::collections::HashMap;

/// Names drawn from a small pool, so that some are known and some are not.
fn name() -> impl Strategy<Value = String> {
    prop::sample::select(vec!["x", "y", "z", "f", "g", "h", "labs", "q"]).prop_map(String::from)
}

fn expr() -> impl Strategy<Value = String> {
    let leaf = prop_oneof![(0i64..100).prop_map(|n| n.to_string()), name()];
    leaf.prop_recursive(4, 24, 4, |inner| {
        prop_oneof![
            (
                inner.clone(),
                prop::sample::select(vec!["+", "-", "*", "/", "<", "==", "&&"]),
                inner.clone()
            )
                .prop_map(|(a, op, b)| format!("{a} {op} {b}")),
            (name(), prop::collection::vec(inner.clone(), 0..3))
                .prop_map(|(f, args)| format!("{f}({})", args.join(", "))),
            (name(), inner.clone()).prop_map(|(n, v)| format!("({n} = {v})")),
            (inner.clone(), inner.clone(), inner.clone())
                .prop_map(|(c, a, b)| format!("(if {c} then {a} else {b})")),
            (inner.clone(), inner.clone()).prop_map(|(c, b)| format!("(while {c} do {b})")),
            (
                prop::collection::vec((name(), inner.clone()), 0..3),
                prop::option::of(inner.clone())
            )
                .prop_map(|(lets, value)| {
                    let mut block = String::from("{ ");
                    for (n, v) in lets {
                        block.push_str(&format!("let {n} = {v}; "));
                    }
                    block.push_str(&value.unwrap_or_default());
                    block.push_str(" }");
                    block
                }),
            inner.prop_map(|e| format!("-({e})")),
        ]
    })
}

/// A program of a few functions (parameters from the pool, some names repeated across
/// lines), and a cut: a byte count to keep of it, or all of it.
fn program() -> impl Strategy<Value = String> {
    prop::collection::vec(
        (
            name(),
            prop::collection::vec(name(), 0..3),
            expr(),
            any::<bool>(),
        ),
        1..4,
    )
    .prop_map(|functions| {
        let mut source = String::from("extern fn labs(v: i64) -> i64;\n");
        for (f, params, body, newline) in functions {
            let sep = if newline { "\n  " } else { " " };
            source.push_str(&format!("fn {f}({}) ={sep}{body};\n", params.join(", ")));
        }
        source
    })
}

fn callees_of(items: &[Item]) -> HashMap<String, Callee> {
    let mut callees = HashMap::new();
    for item in items {
        match item {
            Item::Function(f) => {
                callees.insert(f.name.clone(), Callee::Function(f.params.len()));
            }
            Item::Extern(x) => {
                callees.insert(x.name.clone(), Callee::Extern(x.clone()));
            }
            Item::Expr(_) => {}
        }
    }
    callees
}

fn both_ways(source: &str) {
    let trees = parse(source);
    let outlines = parse_outline(source);
    match (&trees, &outlines) {
        (Err(a), Err(b)) => assert_eq!(a, b, "the same syntax error for {source:?}"),
        (Ok(trees), Ok(outlines)) => {
            assert_eq!(trees.len(), outlines.len());
            let callees = callees_of(trees);
            let (again, names) = parse_checked(source).expect("parses as parse_outline does");
            assert_eq!(&again, outlines);
            let mut body = 0;
            for (tree, outline) in trees.iter().zip(outlines) {
                match (tree, outline) {
                    (Item::Function(f), OutlineItem::Function(o)) => {
                        assert_eq!(
                            (&f.name, &f.params, f.position),
                            (&o.name, &o.params, o.position)
                        );
                        let again = parse_body(source, o).expect("a body read at load reads again");
                        assert_eq!(&again, f, "the same tree for {source:?}");
                        let expected = check(f, &callees);
                        assert_eq!(
                            expected,
                            check_outline(source, o, &callees),
                            "the same check of '{}' in {source:?}",
                            f.name
                        );
                        assert_eq!(
                            expected,
                            names.check(body, source, o, &callees),
                            "the same check of '{}' in one pass over {source:?}",
                            f.name
                        );
                        body += 1;
                    }
                    (Item::Extern(a), OutlineItem::Extern(b)) => assert_eq!(a, b),
                    (Item::Expr(a), OutlineItem::Expr(b)) => assert_eq!(a, b),
                    _ => panic!("different items for {source:?}"),
                }
            }
        }
        _ => panic!("one way parses, the other not: {source:?}: {trees:?} / {outlines:?}"),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn a_body_checked_without_a_tree_is_checked_as_with_one(source in program()) {
        both_ways(&source);
    }

    #[test]
    fn a_cut_or_corrupted_program_fails_the_same_way(
        source in program(),
        cut in any::<prop::sample::Index>(),
        byte in prop::sample::select(vec!["", ")", "(", "{", ";", "=", "let", "?", "é", "#"]),
    ) {
        let at = cut.index(source.len() + 1);
        let at = (0..=at).rev().find(|&i| source.is_char_boundary(i)).unwrap_or(0);
        let changed = format!("{}{byte}{}", &source[..at], &source[at..]);
        both_ways(&changed);
        both_ways(&source[..at]);
    }
}

#[test]
fn an_error_found_late_is_reported_as_a_tree_walk_finds_it_first() {
    // `f` takes one argument: the arity error is at `f(`, before the unknown `nope`.
    let source = "fn f(a) = a;\nfn g(x) =\n  { let y = 1; f(nope, y) + zz };\n";
    both_ways(source);
    let outlines = parse_outline(source).unwrap();
    let OutlineItem::Function(g) = &outlines[1] else {
        panic!()
    };
    let mut callees = HashMap::new();
    callees.insert("f".to_string(), Callee::Function(1));
    let error = check_outline(source, g, &callees).unwrap_err();
    assert_eq!(error.message, "'f' takes 1 argument, given 2");
    assert_eq!((error.position.line, error.position.column), (3, 16));
    let _ = (
        Extern {
            name: String::new(),
            params: vec![],
            result: Type::I64,
        },
        Type::I32,
    );
}
