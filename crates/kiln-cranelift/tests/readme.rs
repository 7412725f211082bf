//! The KilnModule example of docs/CRANELIFT.md (the README's "a Cranelift JIT" link) is
//! examples/square.rs, word for word (the crate's doctests run it).

#[test]
fn the_docs_show_the_example_as_it_is() {
    let docs = include_str!("../../../docs/CRANELIFT.md");
    let example = include_str!("../examples/square.rs");
    assert!(
        docs.contains(example),
        "docs/CRANELIFT.md's KilnModule example differs from crates/kiln-cranelift/examples/square.rs"
    );
}
