//! Inputs the fuzzer (fuzz/fuzz_targets/object_loader.rs) found useful, kept as regression
//! tests: each must link or fail with a typed error, never panic.

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
            &LinkOptions {
                memory: &manager,
                low_memory: None,
            },
        );
        // Each of these inputs is damaged: a typed error, with the object's name.
        let err = result.expect_err("a damaged object must not link");
        assert!(err.to_string().contains(&name), "{err}");
        count += 1;
    }
    assert!(count > 0);
}
