//! Inputs the fuzzer (fuzz/fuzz_targets/object_loader.rs) found useful, kept as regression
//! tests: the inputs that crashed earlier versions (named for what they exposed) and the
//! smallest seeds of the minimized corpus (`seed-*`). None may panic.

// LinkError is large by design: see kiln-link/src/lib.rs.
#![allow(clippy::result_large_err)]

use kiln_link::{link, LinkContext, LinkOptions, ObjectInput};
use kiln_memory::SlabMemoryManager;

struct Ctx;

impl LinkContext for Ctx {
    fn resolve(&mut self, _name: &str) -> Option<u64> {
        Some(Ctx::resolve as *const () as u64)
    }
    fn tls_module_id(&mut self) -> Result<u64, String> {
        Ok(1)
    }
}

#[test]
fn fuzz_regressions_never_panic() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fuzz_regressions");
    let manager = SlabMemoryManager::new().unwrap();
    let mut count = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let data = std::fs::read(&path).unwrap();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        let result = link(
            &[ObjectInput::new(name.clone(), data)],
            &[],
            &mut Ctx,
            &LinkOptions::new(&manager),
        );
        if name.starts_with("seed-") {
            // Corpus seeds (the smallest inputs of the minimized corpus, each adding
            // coverage): any outcome but a panic; an error names the object.
            if let Err(err) = result {
                assert!(err.to_string().contains(&name), "{err}");
            }
        } else {
            // Inputs that crashed an earlier version: damaged objects, a typed error with
            // the object's name.
            let err = result.expect_err("a damaged object must not link");
            assert!(err.to_string().contains(&name), "{err}");
        }
        count += 1;
    }
    assert!(count > 0);
}
