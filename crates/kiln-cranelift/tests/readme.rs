//! The README's KilnModule example is examples/square.rs, word for word (the crate's
//! doctests run it).

#[test]
fn the_readme_shows_the_example_as_it_is() {
    let readme = include_str!("../../../README.md");
    let example = include_str!("../examples/square.rs");
    assert!(
        readme.contains(example),
        "README.md's KilnModule example differs from crates/kiln-cranelift/examples/square.rs"
    );
}
