//! include/kiln.h is what cbindgen makes of the crate today: a stale header fails here.
//! `KILN_WRITE_HEADER=1 cargo test -p kiln-capi --test header` rewrites it.

#[test]
fn the_checked_in_header_is_current() {
    let dir = env!("CARGO_MANIFEST_DIR");
    let config =
        cbindgen::Config::from_file(format!("{dir}/cbindgen.toml")).expect("cbindgen.toml");
    let bindings = cbindgen::Builder::new()
        .with_crate(dir)
        .with_config(config)
        .generate()
        .expect("cbindgen generates the header");
    let mut generated = Vec::new();
    bindings.write(&mut generated);
    let path = format!("{dir}/include/kiln.h");
    if std::env::var_os("KILN_WRITE_HEADER").is_some() {
        std::fs::write(&path, &generated).unwrap();
    }
    let checked_in = std::fs::read(&path).unwrap_or_default();
    assert!(
        checked_in == generated,
        "include/kiln.h is stale: run KILN_WRITE_HEADER=1 cargo test -p kiln-capi --test header"
    );
}
