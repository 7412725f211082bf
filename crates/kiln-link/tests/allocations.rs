//! The link's heap allocations do not grow with its symbols, sections and relocations:
//! names are borrowed from the input bytes, every edge goes into one array sized from the
//! relocation counts, and a checked object ([`ObjectInput::check`]) is not parsed again.
//! Counted with a counting global allocator, for the system compiler's objects of 200 and
//! of 2,000 functions (each in a section of its own, each calling two others and reading
//! a variable).

// LinkError is large by design: see kiln-link/src/lib.rs.
#![allow(clippy::result_large_err)]

use kiln_link::{link, Architecture, LinkContext, LinkOptions, ObjectInput};
use kiln_memory::{MemoryManager, SlabMemoryManager};
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

/// Counts heap allocations per thread (the tests run in parallel).
struct Counting;

thread_local! {
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
}

fn allocations() -> u64 {
    ALLOCATIONS.with(Cell::get)
}

fn count() {
    // `try_with`: a thread's last frees may come after its locals are gone.
    let _ = ALLOCATIONS.try_with(|n| n.set(n.get() + 1));
}

// SAFETY: forwards to the system allocator, only counting.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count();
        // SAFETY: the caller's contract, passed on.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract, passed on.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count();
        // SAFETY: the caller's contract, passed on.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

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

/// `functions` static functions, each in its own section, each calling the next two and
/// reading a variable of its own; one exported entry that calls the first.
fn program(functions: usize) -> Vec<u8> {
    let mut c = String::new();
    for i in 0..functions {
        c.push_str(&format!(
            "static int f{i}(int);\nstatic volatile int v{i} = {i};\n"
        ));
    }
    for i in 0..functions {
        let (a, b) = ((i + 1) % functions, (i + 2) % functions);
        c.push_str(&format!(
            "__attribute__((noinline, used)) static int f{i}(int x) {{ \
             return x <= 0 ? v{i} : f{a}(x - 1) + f{b}(x - 2); }}\n"
        ));
    }
    c.push_str("int entry(int x) { return f0(x); }\n");
    kiln_testkit::cc_object(
        &format!("allocations_{functions}"),
        &c,
        &["-O1", "-ffunction-sections", "-fdata-sections"],
    )
}

/// What one link of `object` allocates, and its symbol and relocation counts.
struct Figures {
    allocations: u64,
    relocations: usize,
    sections: usize,
}

fn measure(object: &ObjectInput, memory: &SlabMemoryManager) -> Figures {
    let options = LinkOptions::new(memory as &dyn MemoryManager);
    let inputs = std::slice::from_ref(object);
    let before = allocations();
    let linked = link(inputs, &[], &mut Alone, &options).expect("links");
    let allocations = allocations() - before;
    let figures = Figures {
        allocations,
        relocations: linked.counts.relocations,
        sections: linked.counts.sections,
    };
    drop(linked);
    figures
}

#[test]
fn allocations_do_not_grow_with_symbols_sections_or_relocations() {
    let memory = SlabMemoryManager::new().unwrap();
    let arch = Architecture::host();
    let mut rows = Vec::new();
    for functions in [200, 2000] {
        let bytes = program(functions);
        // Unchecked: the link parses; checked: the link uses the check's parse.
        let unchecked = ObjectInput::new(format!("p{functions}.o"), bytes.clone());
        let mut checked = ObjectInput::new(format!("p{functions}.o"), bytes);
        checked.check(arch).unwrap();
        // A first link warms what is made once per process (the allocator's arenas).
        measure(&unchecked, &memory);
        let u = measure(&unchecked, &memory);
        let c = measure(&checked, &memory);
        println!(
            "{functions} functions: {} sections, {} relocations; allocations: {} unchecked, {} checked",
            u.sections, u.relocations, u.allocations, c.allocations
        );
        assert!(
            c.allocations < u.allocations,
            "a checked object is not parsed again: {} allocations checked, {} unchecked",
            c.allocations,
            u.allocations
        );
        rows.push((functions, u, c));
    }
    let (small, large) = (&rows[0], &rows[1]);
    let more_relocations = (large.1.relocations - small.1.relocations) as f64;
    let more_sections = (large.1.sections - small.1.sections) as f64;
    assert!(more_relocations >= 3000.0 && more_sections >= 1800.0);
    for (what, s, l) in [
        ("unchecked", &small.1, &large.1),
        ("checked", &small.2, &large.2),
    ] {
        let more = l.allocations.saturating_sub(s.allocations) as f64;
        // Growing arrays double: a few more allocations for ten times the input, never
        // one per symbol, section or relocation.
        println!(
            "{what}: {more} more allocations for {more_sections} more sections and {more_relocations} more relocations ({:.4} per relocation)",
            more / more_relocations
        );
        assert!(
            more <= 40.0,
            "{what}: {} allocations for {} functions, {} for {}: {:.3} per section, {:.3} per relocation",
            s.allocations,
            small.0,
            l.allocations,
            large.0,
            more / more_sections,
            more / more_relocations
        );
    }
}
