//! The README's Rust example is the `kiln` crate's front-page example, which `cargo test`
//! compiles and runs as a doc test: this checks that the two are the same program, so the
//! README's cannot stop working unnoticed.

#[test]
fn the_readme_rust_example_is_the_crate_doc_test() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let readme = std::fs::read_to_string(root.join("README.md")).expect("README.md");
    let section = readme
        .split("## From Rust")
        .nth(1)
        .expect("the README has a section \"From Rust\"");
    let readme_example: Vec<&str> = section
        .split("```rust\n")
        .nth(1)
        .and_then(|b| b.split("```").next())
        .expect("a rust block in it")
        .lines()
        .collect();
    let lib = std::fs::read_to_string(root.join("crates/kiln/src/lib.rs")).expect("lib.rs");
    let doc: Vec<&str> = lib
        .lines()
        .take_while(|l| l.starts_with("//!"))
        .map(|l| {
            l.strip_prefix("//! ")
                .unwrap_or(l.trim_start_matches("//!"))
        })
        .collect();
    let fence = doc
        .iter()
        .position(|l| *l == "```")
        .expect("a code block in the crate doc");
    let doc_example: Vec<&str> = doc[fence + 1..]
        .iter()
        .take_while(|l| **l != "```")
        .copied()
        .collect();
    assert_eq!(readme_example, doc_example);
}

/// Every page of docs/ with a Rust example is compiled by a doc test: included in
/// `kiln::docs_examples` (src/lib.rs), or — docs/CRANELIFT.md — by kiln-cranelift's tests.
/// A new page with an example and no test fails here.
#[test]
fn every_docs_page_with_a_rust_example_is_compiled() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let lib = std::fs::read_to_string(root.join("crates/kiln/src/lib.rs")).expect("lib.rs");
    let cranelift = std::fs::read_to_string(root.join("crates/kiln-cranelift/tests/readme.rs"))
        .expect("kiln-cranelift's tests/readme.rs");
    let mut unchecked = Vec::new();
    for entry in std::fs::read_dir(root.join("docs")).expect("docs/") {
        let path = entry.expect("a docs entry").path();
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        if !text.contains("```rust") {
            continue;
        }
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .expect("a file name");
        let included = lib.contains(&format!("include_str!(\"../../../docs/{name}\")"));
        if !included && !cranelift.contains(&format!("docs/{name}")) {
            unchecked.push(name.to_string());
        }
    }
    assert!(
        unchecked.is_empty(),
        "Rust examples no test compiles: {unchecked:?}"
    );
}
