//! A JIT that keeps a runtime module and churns small modules calling it: linking and
//! removing them must not grow the session (no record of a removed module is kept). The
//! heap is measured with a counting allocator in this test binary.

use kiln::Input;
use kiln::Jit;
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, Ordering};

/// The system allocator, counting live bytes.
struct Counting;

static LIVE: AtomicIsize = AtomicIsize::new(0);
/// Allocation calls (alloc and realloc), every thread.
static CALLS: AtomicIsize = AtomicIsize::new(0);

/// The counters are the process's: the tests that read them run one at a time (another
/// test's links counted in a link's allocations made 40.7 of 39, over the bound, when
/// the tests of this binary ran at once).
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// This test's turn (a test that failed while holding it leaves it to the next).
fn alone() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

// SAFETY: forwards to the system allocator, only counting.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        CALLS.fetch_add(1, Ordering::Relaxed);
        LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: the caller's layout, passed on.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: a block this allocator gave out with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        CALLS.fetch_add(1, Ordering::Relaxed);
        LIVE.fetch_add(
            new_size as isize - layout.size() as isize,
            Ordering::Relaxed,
        );
        // SAFETY: as above.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

#[test]
fn churning_modules_that_call_a_runtime_module_keeps_the_heap_flat() {
    let _alone = alone();
    let runtime = kiln_testkit::cc_object(
        "churn_runtime",
        "int runtime_add(int a, int b) { return a + b; }",
        &["-O1", "-fPIC"],
    );
    let user = kiln_testkit::cc_object(
        "churn_user",
        "extern int runtime_add(int, int); int user_fn(void) { return runtime_add(41, 1); }",
        &["-O1", "-fPIC"],
    );
    let jit = Jit::new().unwrap();
    let lib = jit.main_library();
    jit.library(lib)
        .add(Input::object("runtime.o", runtime))
        .unwrap();
    let (_runtime, _) = jit.link_pending(lib).unwrap().expect("the runtime module");
    let round = |n: usize| {
        for _ in 0..n {
            jit.library(lib)
                .add(Input::object("user.o", user.clone()))
                .unwrap();
            let (module, _) = jit.link_pending(lib).unwrap().expect("a user module");
            let address = jit.lookup(lib, "user_fn").unwrap();
            // SAFETY: `int user_fn(void)`, linked just now in this process.
            let f: extern "C" fn() -> i32 = unsafe { std::mem::transmute(address as usize) };
            assert_eq!(f(), 42);
            jit.remove_module(&module).unwrap();
        }
    };
    round(1_000); // warm: the session's tables and the slab reach their size
    let before = LIVE.load(Ordering::Relaxed);
    round(5_000);
    let grown = LIVE.load(Ordering::Relaxed) - before;
    assert!(
        grown < 5_000 * 8,
        "the heap grew by {grown} bytes over 5,000 links and removals ({} per link)",
        grown / 5_000
    );
}

#[test]
fn a_set_of_modules_is_removed_users_first_or_refused_naming_outside_users() {
    let _alone = alone();
    let runtime = kiln_testkit::cc_object(
        "set_runtime",
        "int set_add(int a, int b) { return a + b; }",
        &["-O1", "-fPIC"],
    );
    let user = |n: u32| {
        kiln_testkit::cc_object(
            &format!("set_user{n}"),
            &format!(
                "extern int set_add(int, int); int set_user{n}(void) {{ return set_add({n}, 1); }}"
            ),
            &["-O1", "-fPIC"],
        )
    };
    let jit = Jit::new().unwrap();
    let lib = jit.main_library();
    let link = |name: &str, bytes: Vec<u8>| {
        jit.library(lib).add(Input::object(name, bytes)).unwrap();
        jit.link_pending(lib).unwrap().expect("a module").0
    };
    let rt = link("runtime.o", runtime);
    let one = link("user1.o", user(1));
    let two = link("user2.o", user(2));
    // user2 is outside the set: nothing is removed.
    let error = jit
        .remove_modules(&[rt.clone(), one.clone()])
        .unwrap_err()
        .to_string();
    assert!(error.contains("user2.o"), "{error}");
    assert!(jit.lookup(lib, "set_user1").is_ok());
    assert!(jit.lookup(lib, "set_add").is_ok());
    // The whole set, the runtime first in the list: removed users first.
    jit.remove_modules(&[rt, one, two]).unwrap();
    for name in ["set_add", "set_user1", "set_user2"] {
        assert!(jit.lookup(lib, name).is_err(), "{name} is still defined");
    }
}

#[test]
fn a_chain_of_modules_is_removed_in_one_call_whatever_the_order_given() {
    let _alone = alone();
    // Module k calls module k - 1: each is used by the next. Given oldest first, with a
    // repeat, the call still removes users first.
    let jit = Jit::new().unwrap();
    let lib = jit.main_library();
    let mut modules = Vec::new();
    for k in 0..60u32 {
        let source = if k == 0 {
            "int chain0(void) { return 1; }".to_string()
        } else {
            format!(
                "extern int chain{}(void); int chain{k}(void) {{ return chain{}() + 1; }}",
                k - 1,
                k - 1
            )
        };
        let object = kiln_testkit::cc_object(&format!("chain{k}"), &source, &["-O1", "-fPIC"]);
        modules.push(
            jit.link_object(lib, &format!("chain{k}.o"), object)
                .unwrap(),
        );
    }
    let address = jit.lookup(lib, "chain59").unwrap();
    // SAFETY: `int chain59(void)`, linked above in this process.
    let f: extern "C" fn() -> i32 = unsafe { std::mem::transmute(address as usize) };
    assert_eq!(f(), 60);
    // Without the newest, the set is refused and nothing is removed.
    let error = jit.remove_modules(&modules[..59]).unwrap_err().to_string();
    assert!(error.contains("chain59.o"), "{error}");
    assert_eq!(jit.library(lib).modules().unwrap().len(), 60);
    let mut set = modules.clone();
    set.push(modules[7].clone());
    jit.remove_modules(&set).unwrap();
    assert!(jit.library(lib).modules().unwrap().is_empty());
    assert!(jit.lookup(lib, "chain0").is_err());
}

/// A regression bound, not the goal (issue 30 asks for at most 5): heap allocations per
/// `link_object` of a one-function module that calls a runtime module and libc (42 when
/// the bound was first set, 35 when it was lowered; `.eh_frame` registration included).
#[test]
fn a_small_link_makes_a_bounded_number_of_heap_allocations() {
    let _alone = alone();
    let runtime = kiln_testkit::cc_object(
        "alloc_runtime",
        "int alloc_runtime_add(int a, int b) { return a + b; }",
        &["-O1", "-fPIC"],
    );
    let user = kiln_testkit::cc_object(
        "alloc_user",
        "#include <stdlib.h>\nextern int alloc_runtime_add(int, int);\nint alloc_user(int x) { return alloc_runtime_add(abs(x), 1); }",
        &["-O1", "-fPIC"],
    );
    let jit = Jit::new().unwrap();
    let lib = jit.main_library();
    jit.library(lib).add(Input::ProcessSymbols).unwrap();
    let _runtime = jit.link_object(lib, "runtime.o", runtime).unwrap();
    let inputs: Vec<Vec<u8>> = (0..1_100).map(|_| user.clone()).collect();
    let mut modules = Vec::with_capacity(inputs.len());
    let mut calls = 0;
    for (i, bytes) in inputs.into_iter().enumerate() {
        let before = CALLS.load(Ordering::Relaxed);
        let module = jit.link_object(lib, "user.o", bytes).unwrap();
        if i >= 100 {
            calls += CALLS.load(Ordering::Relaxed) - before;
        }
        jit.remove_module(&module).unwrap();
        modules.push(module);
    }
    let per_link = calls as f64 / 1_000.0;
    assert!(
        per_link <= 40.0,
        "{per_link:.1} heap allocations per link (35 when this bound was set; the target is 5)"
    );
}
