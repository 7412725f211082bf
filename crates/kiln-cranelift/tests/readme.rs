//! The README's KilnModule example is examples/square.rs, word for word, and it runs.

#[test]
fn the_readme_shows_the_example_as_it_is() {
    let readme = include_str!("../../../README.md");
    let example = include_str!("../examples/square.rs");
    assert!(
        readme.contains(example),
        "README.md's KilnModule example differs from crates/kiln-cranelift/examples/square.rs"
    );
}

#[test]
fn the_example_runs_as_the_readme_says() {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let status = std::process::Command::new(cargo)
        .args(["build", "-q", "-p", "kiln-cranelift", "--example", "square"])
        .status()
        .unwrap();
    assert!(status.success());
    let out = std::process::Command::new(kiln_testkit::binary("examples/square"))
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "square(12) = 144\n");
    assert!(out.status.success());
}
