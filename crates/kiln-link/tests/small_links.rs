//! A small module's link stays on the calling thread and never starts the thread pool
//! (issue 29): the pool's threads cost a JIT that links one function at a time. Alone in
//! its test binary, so no other test's link starts the pool first.

// LinkError is large by design: see kiln-link/src/lib.rs.
#![allow(clippy::result_large_err)]

use kiln_link::{link, LinkContext, LinkOptions, ObjectInput};
use kiln_memory::{MemoryManager, SlabMemoryManager};

/// Nothing outside the link: every name is the inputs' own.
struct Alone;

impl LinkContext for Alone {
    fn resolve(&mut self, _: &str) -> Option<u64> {
        None
    }
    fn tls_module_id(&mut self) -> Result<u64, String> {
        Ok(1)
    }
}

/// The threads of this process.
fn threads() -> usize {
    std::fs::read_dir("/proc/self/task")
        .expect("/proc/self/task")
        .count()
}

#[test]
fn a_small_link_starts_no_thread() {
    // Several objects, so the link would spread them if it judged by their number alone.
    let objects: Vec<ObjectInput> = (0..4)
        .map(|i| {
            let c = format!(
                "static volatile int v{i} = {i};\n\
                 int f{i}(int x) {{ return x + v{i}; }}\n"
            );
            let bytes = kiln_testkit::cc_object(&format!("small_links_{i}"), &c, &["-O1"]);
            ObjectInput::new(format!("small{i}.o"), bytes)
        })
        .collect();
    let memory = SlabMemoryManager::new().unwrap();
    let options = LinkOptions::new(&memory as &dyn MemoryManager);
    let before = threads();
    let linked = link(&objects, &[], &mut Alone, &options).expect("links");
    assert!(linked.symbol("f3").is_some(), "f3 is exported");
    assert_eq!(
        threads(),
        before,
        "a link of four small objects started threads (rayon's pool)"
    );
}
