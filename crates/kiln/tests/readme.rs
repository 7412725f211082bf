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
