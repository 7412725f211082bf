//! Fuzzes the object loader: parse an arbitrary byte string as a relocatable object and
//! link it (resolving every external name to one address, running nothing). Any outcome
//! but a panic or a crash is fine.
#![no_main]

use kiln_link::{link, LinkContext, LinkOptions, ObjectInput};
use kiln_memory::SlabMemoryManager;
use libfuzzer_sys::fuzz_target;
use std::sync::OnceLock;

struct Ctx;

impl LinkContext for Ctx {
    fn resolve(&mut self, _name: &str) -> Option<u64> {
        Some(Ctx::resolve as *const () as u64)
    }
    fn tls_module_id(&mut self) -> Result<u64, String> {
        Ok(1)
    }
}

fn manager() -> &'static SlabMemoryManager {
    static M: OnceLock<SlabMemoryManager> = OnceLock::new();
    M.get_or_init(|| SlabMemoryManager::new().expect("memory manager"))
}

fuzz_target!(|data: &[u8]| {
    let objects = [ObjectInput::new("fuzz.o", data.to_vec())];
    // LinkOptions::new: the defaults, whatever fields the options gain.
    let _ = link(&objects, &[], &mut Ctx, &LinkOptions::new(manager()));
});
