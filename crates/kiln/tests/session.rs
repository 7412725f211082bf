//! The session API: libraries and search order, host symbols and generators, module
//! handles that outlive the session, removal running finalizers, a failed link leaving
//! earlier modules alone, archives winning over host symbols, and unwinding (a Rust panic)
//! through JIT frames.

use kiln::Input;
use kiln::{FnGenerator, Jit};
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

fn compile(name: &str, source: &str) -> Vec<u8> {
    kiln_testkit::cc_object(name, source, &["-O1"])
}

fn call0(addr: u64) -> i32 {
    // SAFETY: the tests look up functions `int f(void)` they compiled.
    let f: extern "C" fn() -> i32 = unsafe { std::mem::transmute(addr as usize) };
    f()
}

#[test]
fn module_outlives_the_session_and_host_symbols_resolve() {
    extern "C" fn host_seven() -> i32 {
        7
    }
    let jit = Jit::new().unwrap();
    let lib = jit.main_library();
    jit.library(lib)
        .define_symbol("host_seven", host_seven as *const () as u64)
        .unwrap();
    jit.library(lib)
        .add(Input::object(
            "a.o",
            compile(
                "a",
                "int host_seven(void); int f(void) { return host_seven() * 6; }",
            ),
        ))
        .unwrap();
    let (module, _) = jit.link_pending(lib).unwrap().unwrap();
    drop(jit);
    assert_eq!(call0(module.symbol("f").unwrap()), 42);
}

#[test]
fn a_failed_link_leaves_the_library_exactly_as_before() {
    let jit = Jit::new().unwrap();
    let lib = jit.main_library();
    jit.library(lib)
        .add(Input::object(
            "ok.o",
            compile("ok", "int ok(void) { return 5; }"),
        ))
        .unwrap();
    assert_eq!(call0(jit.lookup(lib, "ok").unwrap()), 5);
    let live = jit.memory_stats().live_allocations;
    let bad = compile(
        "bad",
        "int nowhere(void); int bad(void) { return nowhere(); }",
    );
    jit.library(lib)
        .add(Input::object("bad.o", bad.clone()))
        .unwrap();
    let err = jit.lookup(lib, "bad").unwrap_err();
    assert!(
        err.to_string().contains("nowhere (referenced by bad.o)"),
        "{err}"
    );
    // The library is as it was: the earlier module works, the failed objects are gone
    // (not retried by every later lookup), nothing of theirs is allocated or published.
    assert_eq!(call0(jit.lookup(lib, "ok").unwrap()), 5);
    assert_eq!(jit.memory_stats().live_allocations, live);
    assert!(matches!(
        jit.lookup(lib, "bad"),
        Err(kiln::Error::SymbolNotFound(_))
    ));
    assert_eq!(jit.library(lib).modules().unwrap().len(), 1);
    // With the missing symbol supplied, the object links when added again.
    jit.library(lib)
        .add(Input::Generator(Box::new(FnGenerator(|name: &str| {
            (name == "nowhere").then_some(ok_address())
        }))))
        .unwrap();
    jit.library(lib).add(Input::object("bad.o", bad)).unwrap();
    assert_eq!(call0(jit.lookup(lib, "bad").unwrap()), 9);
}

extern "C" fn nine() -> i32 {
    9
}
fn ok_address() -> u64 {
    nine as *const () as u64
}

static EVENTS: AtomicU32 = AtomicU32::new(0);
extern "C" fn record(x: u32) {
    EVENTS.fetch_add(x, Ordering::SeqCst);
}

#[test]
fn initializers_run_after_link_and_finalizers_at_removal() {
    let jit = Jit::new().unwrap();
    let lib = jit.main_library();
    jit.library(lib)
        .define_symbol("record", record as *const () as u64)
        .unwrap();
    jit.library(lib).add(Input::object("ctor.o", compile(
            "ctor",
            "void record(unsigned);\n__attribute__((constructor)) static void hello(void) { record(1); }\n__attribute__((destructor)) static void bye(void) { record(100); }\nint alive(void) { return 1; }\n",
        )))
    .unwrap();
    let (module, _) = jit.link_pending(lib).unwrap().unwrap();
    assert_eq!(EVENTS.load(Ordering::SeqCst), 1);
    jit.remove_module(&module).unwrap();
    assert_eq!(EVENTS.load(Ordering::SeqCst), 101);
    drop(module);
    assert_eq!(EVENTS.load(Ordering::SeqCst), 101, "finalizers run once");
}

#[test]
fn search_order_across_libraries() {
    let jit = Jit::new().unwrap();
    let base = jit.create_library("base");
    let app = jit.create_library("app");
    jit.library(base)
        .add(Input::object(
            "base.o",
            compile("base", "int base_value(void) { return 11; }"),
        ))
        .unwrap();
    jit.link_pending(base).unwrap();
    jit.library(app).set_search_order(&[base]).unwrap();
    jit.library(app)
        .add(Input::object(
            "app.o",
            compile(
                "app",
                "int base_value(void); int app_value(void) { return base_value() + 1; }",
            ),
        ))
        .unwrap();
    assert_eq!(call0(jit.lookup(app, "app_value").unwrap()), 12);
    assert!(jit.lookup(base, "app_value").is_err());
}

#[test]
fn the_links_own_archive_wins_over_the_host() {
    let dir = kiln_testkit::scratch_dir("archive-wins");
    let member = dir.join("myabs.o");
    std::fs::write(&member, compile("myabs", "int rand(void) { return 4242; }")).unwrap();
    let archive = dir.join("libmyabs.a");
    let _ = std::fs::remove_file(&archive);
    assert!(Command::new("ar")
        .arg("rcs")
        .arg(&archive)
        .arg(&member)
        .status()
        .unwrap()
        .success());
    let jit = Jit::new().unwrap();
    let lib = jit.main_library();
    jit.library(lib)
        .add(Input::object(
            "use.o",
            compile(
                "use",
                "#include <stdlib.h>\nint use(int x) { return rand() + x; }",
            ),
        ))
        .unwrap();
    jit.library(lib).add(Input::archive_file(&archive)).unwrap();
    jit.library(lib).add(Input::ProcessSymbols).unwrap();
    let f: extern "C" fn(i32) -> i32 =
        // SAFETY: `use` is `int use(int)`.
        unsafe { std::mem::transmute(jit.lookup(lib, "use").unwrap() as usize) };
    assert_eq!(f(-3), 4239, "libmyabs.a's rand, not libc's");
}

extern "C-unwind" fn host_panics(x: i32) -> i32 {
    if x > 0 {
        panic!("thrown from the host through JIT frames");
    }
    x
}

#[test]
fn a_rust_panic_unwinds_through_jit_frames() {
    let jit = Jit::new().unwrap();
    let lib = jit.main_library();
    jit.library(lib)
        .define_symbol("host_panics", host_panics as *const () as u64)
        .unwrap();
    // Two JIT frames between the catch and the panic; -fexceptions gives them full
    // unwind tables (x86-64 emits .eh_frame for C anyway).
    let obj = {
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("session");
        std::fs::create_dir_all(&dir).unwrap();
        let c = dir.join("unwind.c");
        std::fs::write(&c, "int host_panics(int);\n__attribute__((noinline)) int inner(int x) { return host_panics(x) + 1; }\nint outer(int x) { return inner(x) * 2; }\n").unwrap();
        let o = dir.join("unwind.o");
        assert!(Command::new("cc")
            .args(["-O1", "-fexceptions", "-c"])
            .arg(&c)
            .arg("-o")
            .arg(&o)
            .status()
            .unwrap()
            .success());
        std::fs::read(&o).unwrap()
    };
    jit.library(lib)
        .add(Input::object("unwind.o", obj))
        .unwrap();
    let outer: extern "C-unwind" fn(i32) -> i32 =
        // SAFETY: `outer` is `int outer(int)`, compiled with unwind tables.
        unsafe { std::mem::transmute(jit.lookup(lib, "outer").unwrap() as usize) };
    assert_eq!(outer(0), 2);
    let caught = std::panic::catch_unwind(|| outer(1));
    let message = caught.unwrap_err();
    assert_eq!(
        message.downcast_ref::<&str>(),
        Some(&"thrown from the host through JIT frames")
    );
}

fn compile_cxx(name: &str, source: &str) -> Vec<u8> {
    kiln_testkit::cxx_object(name, source, &["-O1", "-fPIC", "-fno-exceptions"])
}

static RECORDED: parking_lot::Mutex<Vec<i32>> = parking_lot::Mutex::new(Vec::new());

extern "C" fn host_record(v: i32) {
    RECORDED.lock().push(v);
}

#[test]
fn a_removed_module_stays_mapped_until_other_threads_thread_local_destructors_ran() {
    let jit = Jit::new().unwrap();
    let lib = jit.main_library();
    jit.library(lib)
        .define_symbol("host_record", host_record as *const () as u64)
        .unwrap();
    jit.library(lib)
        .add(Input::object(
            "tl.o",
            compile_cxx(
                "thread_local_keepalive",
                "extern \"C\" void host_record(int);\n\
             struct Tracked { int v = 0; ~Tracked() { host_record(v); } };\n\
             thread_local Tracked tracked;\n\
             extern \"C\" int touch(int v) { tracked.v = v; return tracked.v; }\n",
            ),
        ))
        .unwrap();
    let (module, _) = jit.link_pending(lib).unwrap().unwrap();
    let touch_address = module.symbol("touch").unwrap();
    // SAFETY: `touch` is `int touch(int)` of the module just linked.
    let touch: extern "C" fn(i32) -> i32 = unsafe { std::mem::transmute(touch_address as usize) };

    let (go, wait) = std::sync::mpsc::channel::<()>();
    let worker = std::thread::spawn(move || {
        assert_eq!(touch(7), 7);
        wait.recv().unwrap();
        // The thread exits here: its destructor of `tracked` runs now.
    });
    assert_eq!(touch(3), 3);
    std::thread::sleep(std::time::Duration::from_millis(50));

    // Removing the module runs this thread's destructor at once…
    jit.remove_module(&module).unwrap();
    drop(module);
    assert_eq!(*RECORDED.lock(), vec![3]);
    // …and the module's memory stays allocated for the worker's destructor.
    assert_eq!(jit.memory_stats().live_allocations, 1);

    go.send(()).unwrap();
    worker.join().unwrap();
    assert_eq!(*RECORDED.lock(), vec![3, 7]);
    // The worker's destructor has run: nothing holds the module any more.
    assert_eq!(jit.memory_stats().live_allocations, 0);
}

#[test]
fn a_redefinition_names_the_object_that_defines_the_name_again() {
    let jit = Jit::new().unwrap();
    let lib = jit.main_library();
    jit.library(lib).define_symbol("second_fn", 0x1000).unwrap();
    let first = compile("first", "int first_fn(void) { return 1; }");
    let second = compile("second", "int second_fn(void) { return 2; }");
    jit.library(lib)
        .add(Input::object("first.o", first))
        .unwrap();
    jit.library(lib)
        .add(Input::object("second.o", second))
        .unwrap();
    let error = jit.link_pending(lib).unwrap_err().to_string();
    assert!(
        error.contains("'second_fn' is defined twice")
            && error.contains("absolute definition at 0x1000")
            && error.contains("by second.o"),
        "{error}"
    );
    // Nothing was published: first_fn is not there either.
    assert!(jit.lookup(lib, "first_fn").is_err());
}

#[test]
fn objects_added_together_all_go_in_or_none_does() {
    let shared = |bytes: Vec<u8>| -> kiln::SharedBytes { std::sync::Arc::new(bytes) };
    // Large enough to be checked on every core: the first bad one in order is named.
    let mut big = String::new();
    for i in 0..3000 {
        big.push_str(&format!("int big{i}(int x) {{ return x * {i} + {i}; }}\n"));
    }
    let big = compile("together_big", &big);
    let good = compile("together_good", "int together(void) { return 7; }");
    let mut cut = good.clone();
    cut.truncate(cut.len() / 2);
    let jit = Jit::new().unwrap();
    let lib = jit.main_library();
    let mut batch: Vec<(String, kiln::SharedBytes)> = Vec::new();
    for i in 0..10 {
        batch.push((format!("big{i}.o"), shared(big.clone())));
        if i == 4 {
            batch.push(("first_bad.o".into(), shared(cut.clone())));
        }
    }
    batch.push(("second_bad.o".into(), shared(cut)));
    let bytes: usize = batch.iter().map(|(_, b)| (**b).as_ref().len()).sum();
    assert!(
        bytes >= 2 << 20,
        "{bytes} bytes: too few to be checked in parallel"
    );
    let err = jit.library(lib).add(Input::Objects(batch)).unwrap_err();
    assert!(err.to_string().contains("first_bad.o"), "{err}");
    // Nothing of that batch went in.
    assert!(jit.link_pending(lib).unwrap().is_none());
    jit.library(lib)
        .add(Input::Objects(vec![
            ("big.o".into(), shared(big)),
            ("good.o".into(), shared(good)),
        ]))
        .unwrap();
    assert_eq!(call0(jit.lookup(lib, "together").unwrap()), 7);
    assert!(jit.lookup(lib, "big2999").is_ok());
}

/// A module's names are published unhashed (its sorted table answers) and hashed when a
/// later link resolves against the library: lookups, the module that defines a name, a
/// hidden `main` and redefinitions give the same answers on either side of that.
#[test]
fn names_answer_the_same_before_and_after_a_link_hashes_them() {
    let first = compile(
        "first",
        "int a(void) { return 1; } int b(void) { return 2; } \
         __attribute__((visibility(\"hidden\"))) int main(void) { return 3; }",
    );
    let again = compile("again", "int a(void) { return 9; }");
    let user = compile("user", "int b(void); int use_b(void) { return b() * 10; }");
    // `hashed`: whether a link resolved against the library (hashing the names) first.
    for hashed in [false, true] {
        let jit = Jit::new().unwrap();
        let lib = jit.main_library();
        jit.library(lib)
            .add(Input::object("first.o", first.clone()))
            .unwrap();
        let (module, _) = jit.link_pending(lib).unwrap().unwrap();
        if hashed {
            jit.library(lib)
                .add(Input::object("user.o", user.clone()))
                .unwrap();
            jit.link_pending(lib).unwrap().unwrap();
            assert_eq!(call0(jit.lookup(lib, "use_b").unwrap()), 20);
        }
        assert_eq!(call0(jit.lookup(lib, "a").unwrap()), 1, "hashed: {hashed}");
        assert_eq!(
            call0(jit.lookup(lib, "main").unwrap()),
            3,
            "hashed: {hashed}"
        );
        let of_b = jit.library(lib).module_of("b").unwrap();
        assert_eq!(of_b.and_then(|m| m.symbol("b")), module.symbol("b"));
        assert!(jit.lookup(lib, "nothing").is_err());
        // A second definition of `a` is refused, naming the module that has it.
        jit.library(lib)
            .add(Input::object("again.o", again.clone()))
            .unwrap();
        let err = jit.link_pending(lib).unwrap_err().to_string();
        assert!(
            err.contains("'a' is defined twice") && err.contains("by module first.o"),
            "hashed: {hashed}: {err}"
        );
    }
}
