//! Takes cranelift-jit 0.135's tests and example from cargo's registry and renames its
//! types to kiln-cranelift's (see the crate's documentation).

use std::path::PathBuf;

const PEER: &str = "cranelift-jit-0.135.0";

/// Where cargo unpacked the peer's published crate: `$CARGO_HOME/registry/src/*/PEER`.
fn peer_dir() -> Result<PathBuf, String> {
    let home = std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo")))
        .ok_or("neither CARGO_HOME nor HOME is set")?;
    let registry = home.join("registry").join("src");
    let entries =
        std::fs::read_dir(&registry).map_err(|e| format!("{}: {e}", registry.display()))?;
    entries
        .flatten()
        .map(|e| e.path().join(PEER))
        .find(|p| p.join("tests/basic.rs").is_file())
        .ok_or_else(|| format!("{PEER} is not under {}", registry.display()))
}

fn rename(source: &str) -> String {
    source
        .replace("cranelift_jit", "kiln_cranelift")
        .replace("JITModule", "KilnModule")
        .replace("JITBuilder", "KilnBuilder")
}

fn main() {
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let files = [
        ("tests/basic.rs", "basic.rs"),
        ("examples/jit-minimal.rs", "jit_minimal.rs"),
    ];
    match peer_dir() {
        Ok(dir) => {
            for (from, to) in files {
                let path = dir.join(from);
                println!("cargo::rerun-if-changed={}", path.display());
                let source = std::fs::read_to_string(&path)
                    .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
                std::fs::write(out.join(to), rename(&source)).expect("writing OUT_DIR");
            }
        }
        Err(why) => {
            // Not found (a vendored build): the tests say so and fail, never pass empty.
            let message = format!("cranelift-jit's sources were not found: {why}");
            std::fs::write(
                out.join("basic.rs"),
                format!("#[test]\nfn peer_sources_found() {{ panic!({message:?}); }}\n"),
            )
            .expect("writing OUT_DIR");
            std::fs::write(
                out.join("jit_minimal.rs"),
                format!("fn main() {{ panic!({message:?}); }}\n"),
            )
            .expect("writing OUT_DIR");
        }
    }
}
