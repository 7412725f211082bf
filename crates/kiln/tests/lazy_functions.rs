//! Call-through stubs: compile on first call, concurrent first calls, failed compiles, a
//! lazy function calling another, and hot swap under threads calling in a loop.
#![cfg(target_arch = "x86_64")]

use kiln::lazy::testing::{constant_function, function_object};
use kiln::Input;
use kiln::{lazy::LazyCompiler, Error, Jit};
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Barrier, Mutex};
use std::time::Duration;

/// Compiles from a table of objects, counting compiles; optionally slowly.
#[derive(Default)]
struct Table {
    objects: Mutex<HashMap<String, Vec<u8>>>,
    compiles: AtomicUsize,
    delay: Duration,
    fallback: Option<u64>,
}

impl LazyCompiler for Table {
    fn compile(&self, name: &str) -> Result<Vec<u8>, kiln::lazy::CompileError> {
        self.compiles.fetch_add(1, Ordering::SeqCst);
        std::thread::sleep(self.delay);
        if name == "panics" {
            panic!("the compiler panicked on purpose");
        }
        self.objects
            .lock()
            .unwrap()
            .get(name)
            .cloned()
            .ok_or_else(|| format!("no source for {name}").into())
    }

    fn compile_failed(&self, _: &str, _: &Error) -> Option<u64> {
        self.fallback
    }
}

fn table(entries: &[(&str, Vec<u8>)]) -> Table {
    Table {
        objects: Mutex::new(
            entries
                .iter()
                .map(|(n, o)| (n.to_string(), o.clone()))
                .collect(),
        ),
        ..Table::default()
    }
}

/// `long sum6(long a, …, long f)`: the six integer argument registers survive the stub.
fn sum6() -> Vec<u8> {
    function_object(
        "sum6",
        &[
            0x48, 0x89, 0xf8, // mov %rdi,%rax
            0x48, 0x01, 0xf0, // add %rsi,%rax
            0x48, 0x01, 0xd0, // add %rdx,%rax
            0x48, 0x01, 0xc8, // add %rcx,%rax
            0x4c, 0x01, 0xc0, // add %r8,%rax
            0x4c, 0x01, 0xc8, // add %r9,%rax
            0xc3,
        ],
    )
}

/// `double fsub(double a, double b)`: xmm0 and xmm1 survive the stub.
fn fsub() -> Vec<u8> {
    function_object("fsub", &[0xf2, 0x0f, 0x5c, 0xc1, 0xc3]) // subsd %xmm1,%xmm0; ret
}

/// `long version(void)`: spins a while, then returns `v`. Freed code is trap bytes, so a
/// body freed while a thread runs it kills the test.
fn slow_version(v: i32) -> Vec<u8> {
    let mut code = vec![0xb9, 0x00, 0x04, 0x00, 0x00]; // mov $1024,%ecx
    code.extend_from_slice(&[0xff, 0xc9, 0x75, 0xfc]); // 1: dec %ecx; jnz 1b
    code.push(0xb8); // mov $v,%eax
    code.extend_from_slice(&v.to_le_bytes());
    code.extend_from_slice(&[0x48, 0x63, 0xc0, 0xc3]); // movslq %eax,%rax; ret
    function_object("version", &code)
}

#[test]
fn compiled_on_first_call_with_the_callers_arguments() {
    let jit = Jit::new().unwrap();
    let lib = jit.main_library();
    let compiler = Arc::new(table(&[("sum6", sum6()), ("fsub", fsub())]));
    jit.add_lazy_functions(lib, &["sum6", "fsub"], compiler.clone())
        .unwrap();
    assert_eq!(
        compiler.compiles.load(Ordering::SeqCst),
        0,
        "nothing compiled yet"
    );
    assert!(!jit.is_compiled(lib, "sum6").unwrap());
    // SAFETY: the signatures match the bodies above; this process runs them.
    let (sum, sub) = unsafe {
        (
            jit.lookup_fn::<extern "C" fn(i64, i64, i64, i64, i64, i64) -> i64>(lib, "sum6")
                .unwrap(),
            jit.lookup_fn::<extern "C" fn(f64, f64) -> f64>(lib, "fsub")
                .unwrap(),
        )
    };
    assert_eq!(sum(1, 20, 300, 4000, 50000, 600000), 654321);
    assert_eq!(compiler.compiles.load(Ordering::SeqCst), 1);
    assert!(jit.is_compiled(lib, "sum6").unwrap());
    assert!(!jit.is_compiled(lib, "fsub").unwrap());
    assert_eq!(sub(10.5, 0.25), 10.25);
    assert_eq!(sum(1, 1, 1, 1, 1, 1), 6);
    assert_eq!(
        compiler.compiles.load(Ordering::SeqCst),
        2,
        "each compiled once"
    );
    // The name resolved to the stub, which stays the address.
    assert_eq!(jit.lookup(lib, "sum6").unwrap(), sum as usize as u64);
}

#[test]
fn concurrent_first_calls_compile_once() {
    let jit = Jit::new().unwrap();
    let lib = jit.main_library();
    let mut compiler = table(&[("answer", constant_function("answer", 42))]);
    compiler.delay = Duration::from_millis(100);
    let compiler = Arc::new(compiler);
    jit.add_lazy_functions(lib, &["answer"], compiler.clone())
        .unwrap();
    // SAFETY: `long answer(void)`, in this process, kept by the session.
    let answer = unsafe {
        jit.lookup_fn::<extern "C" fn() -> i64>(lib, "answer")
            .unwrap()
    };
    let barrier = Arc::new(Barrier::new(8));
    let threads: Vec<_> = (0..8)
        .map(|_| {
            let barrier = barrier.clone();
            std::thread::spawn(move || {
                barrier.wait();
                answer()
            })
        })
        .collect();
    for t in threads {
        assert_eq!(t.join().unwrap(), 42);
    }
    assert_eq!(compiler.compiles.load(Ordering::SeqCst), 1);
}

extern "C" fn minus_one() -> i64 {
    -1
}

#[test]
fn a_failed_compile_reaches_the_fallback_not_a_crash() {
    let jit = Jit::new().unwrap();
    let lib = jit.main_library();
    // No source for `missing`; `panics` panics; `unlinkable` calls what nobody defines.
    let unlinkable = {
        use object::write::{Object, Relocation, StandardSection, Symbol, SymbolSection};
        use object::{elf, RelocationFlags, SymbolFlags, SymbolKind, SymbolScope};
        let mut obj = Object::new(
            object::BinaryFormat::Elf,
            object::Architecture::X86_64,
            object::Endianness::Little,
        );
        let text = obj.section_id(StandardSection::Text);
        obj.append_section_data(text, &[0xe9, 0, 0, 0, 0], 16); // jmp nowhere
        obj.add_symbol(Symbol {
            name: b"unlinkable".to_vec(),
            value: 0,
            size: 5,
            kind: SymbolKind::Text,
            scope: SymbolScope::Dynamic,
            weak: false,
            section: SymbolSection::Section(text),
            flags: SymbolFlags::None,
        });
        let nowhere = obj.add_symbol(Symbol {
            name: b"nowhere_at_all".to_vec(),
            value: 0,
            size: 0,
            kind: SymbolKind::Text,
            scope: SymbolScope::Dynamic,
            weak: false,
            section: SymbolSection::Undefined,
            flags: SymbolFlags::None,
        });
        obj.add_relocation(
            text,
            Relocation {
                offset: 1,
                symbol: nowhere,
                addend: -4,
                flags: RelocationFlags::Elf {
                    r_type: elf::R_X86_64_PLT32,
                },
            },
        )
        .unwrap();
        obj.write().unwrap()
    };
    let plain = Arc::new(table(&[("unlinkable", unlinkable)]));
    jit.add_lazy_functions(lib, &["missing", "panics", "unlinkable"], plain.clone())
        .unwrap();
    let mut custom = table(&[]);
    custom.fallback = Some(minus_one as *const () as u64);
    jit.add_lazy_functions(lib, &["custom"], Arc::new(custom))
        .unwrap();
    let call = |name: &str| {
        // SAFETY: every function here is `long f(void)` (or its fallback), in this process.
        let f = unsafe { jit.lookup_fn::<extern "C" fn() -> i64>(lib, name).unwrap() };
        f()
    };
    assert_eq!(call("missing"), 0, "Kiln's fallback returns 0");
    assert_eq!(call("panics"), 0);
    assert_eq!(call("unlinkable"), 0);
    assert_eq!(call("custom"), -1, "the client's fallback");
    assert_eq!(call("missing"), 0);
    let failures = jit.lazy_failures();
    let text: Vec<String> = failures
        .iter()
        .map(|f| format!("{}: {}", f.function, f.error))
        .collect();
    assert_eq!(failures.len(), 4, "{text:?}");
    assert!(
        text[0].contains("missing") && text[0].contains("no source"),
        "{text:?}"
    );
    assert!(text[1].contains("panicked"), "{text:?}");
    assert!(text[2].contains("nowhere_at_all"), "{text:?}");
    // A failed function is compiled once; it is not retried on every call.
    assert_eq!(plain.compiles.load(Ordering::SeqCst), 3);
    // Replacing a failed function gives it a body.
    jit.replace_function(lib, "missing", constant_function("missing", 5))
        .unwrap();
    assert_eq!(call("missing"), 5);
    assert!(matches!(
        jit.replace_function(lib, "not_lazy", constant_function("not_lazy", 1)),
        Err(Error::NotLazy(_))
    ));
    // A replacement that does not define the name is refused; the body stays.
    let error = jit
        .replace_function(lib, "missing", constant_function("other", 6))
        .unwrap_err();
    assert!(error.to_string().contains("does not define"), "{error}");
    assert_eq!(call("missing"), 5);
}

#[test]
fn lazy_functions_call_each_other_through_their_stubs() {
    let calls = kiln_testkit::cc_object(
        "calls",
        "long inner(long); long outer(long x) { return inner(x) * 10; }",
        &["-O2", "-fPIC"],
    );
    let jit = Jit::new().unwrap();
    let lib = jit.main_library();
    let compiler = Arc::new(table(&[
        ("outer", calls),
        ("inner", constant_function("inner", 4)),
    ]));
    jit.add_lazy_functions(lib, &["outer", "inner"], compiler.clone())
        .unwrap();
    // SAFETY: `long outer(long)`, in this process.
    let outer = unsafe {
        jit.lookup_fn::<extern "C" fn(i64) -> i64>(lib, "outer")
            .unwrap()
    };
    assert_eq!(outer(0), 40);
    assert_eq!(compiler.compiles.load(Ordering::SeqCst), 2);
    // outer's body calls inner's stub: a new inner reaches it without relinking outer.
    jit.replace_function(lib, "inner", constant_function("inner", 7))
        .unwrap();
    assert_eq!(outer(0), 70);
    assert_eq!(compiler.compiles.load(Ordering::SeqCst), 2);
}

#[test]
fn hot_swap_1000_times_under_two_calling_threads() {
    let jit = Jit::new().unwrap();
    let lib = jit.main_library();
    let compiler = Arc::new(table(&[("version", slow_version(0))]));
    jit.add_lazy_functions(lib, &["version"], compiler).unwrap();
    // SAFETY: `long version(void)`, in this process; calls are made under guards.
    let version = unsafe {
        jit.lookup_fn::<extern "C" fn() -> i64>(lib, "version")
            .unwrap()
    };
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let callers: Vec<_> = (0..2)
        .map(|_| {
            let jit = jit.clone();
            let stop = stop.clone();
            std::thread::spawn(move || {
                let thread = jit.register_thread();
                let (mut last, mut calls) = (0, 0u64);
                while !stop.load(Ordering::SeqCst) {
                    let _guard = thread.pin();
                    for _ in 0..16 {
                        let v = version();
                        // Calls after a swap reach the new body: versions never go back.
                        assert!(v >= last, "version {v} after {last}");
                        last = v;
                        calls += 1;
                    }
                }
                (last, calls)
            })
        })
        .collect();
    let thread = jit.register_thread();
    for v in 1..=1000 {
        jit.replace_function(lib, "version", slow_version(v))
            .unwrap();
        // A caller that pins after the swap sees it.
        let _guard = thread.pin();
        assert_eq!(version(), i64::from(v));
    }
    stop.store(true, Ordering::SeqCst);
    for c in callers {
        let (last, calls) = c.join().unwrap();
        assert!(calls > 0);
        assert!(last <= 1000);
    }
    // With no guard held, every retired body can be freed.
    assert_eq!(jit.reclaim(), 0, "retired bodies left");
}

#[test]
fn a_retired_body_outlives_the_guards_that_could_reach_it() {
    let jit = Jit::new().unwrap();
    let lib = jit.main_library();
    jit.add_lazy_functions(
        lib,
        &["version"],
        Arc::new(table(&[("version", slow_version(1))])),
    )
    .unwrap();
    // SAFETY: `long version(void)`, in this process.
    let version = unsafe {
        jit.lookup_fn::<extern "C" fn() -> i64>(lib, "version")
            .unwrap()
    };
    let thread = jit.register_thread();
    let guard = thread.pin();
    assert_eq!(version(), 1);
    let in_use = jit.memory_stats();
    jit.replace_function(lib, "version", slow_version(2))
        .unwrap();
    assert_eq!(
        jit.reclaim(),
        1,
        "a guard from before the swap holds the old body"
    );
    assert_eq!(version(), 2);
    drop(guard);
    assert_eq!(jit.reclaim(), 0, "freed once the guard is gone");
    let _ = in_use;
}

#[test]
fn out_of_process_a_stubs_first_call_asks_the_controller() {
    let calls = kiln_testkit::cc_object(
        "remote_calls",
        "long inner(long); long twice(long); long outer(long x) { return twice(inner(x)) * 10; }",
        &["-O2", "-fPIC"],
    );
    for transport in [
        kiln::executor::Transport::SharedMemory,
        kiln::executor::Transport::Copy,
    ] {
        let executor = kiln::Executor::spawn(
            &kiln_testkit::executor_binary(),
            transport,
            kiln::executor::Timeouts::default(),
        )
        .unwrap();
        let jit = Jit::builder().executor(executor).build().unwrap();
        let lib = jit.main_library();
        let compiler = Arc::new(table(&[
            ("outer", calls.clone()),
            ("inner", constant_function("inner", 4)),
            ("sum6", sum6()),
        ]));
        jit.add_lazy_functions(
            lib,
            &["outer", "inner", "sum6", "missing"],
            compiler.clone(),
        )
        .unwrap();
        // `twice` is an ordinary module: a lazy body links against it.
        jit.link_object(
            lib,
            "twice.o",
            function_object("twice", &[0x48, 0x8d, 0x04, 0x3f, 0xc3]), // lea (%rdi,%rdi),%rax
        )
        .unwrap();
        let call = |name: &str, args: &[u64]| {
            let stub = jit.lookup(lib, name).unwrap();
            // SAFETY: the functions take and return integers, in the executor's memory.
            unsafe { jit.executor().call(stub, args) }.unwrap()
        };
        // The executor calls outer's stub, asks the controller, which compiles outer and
        // links it into the executor while the call waits; outer's body calls inner's
        // stub: a second request, nested.
        assert_eq!(call("outer", &[0]), 80, "{transport:?}");
        assert_eq!(compiler.compiles.load(Ordering::SeqCst), 2);
        assert!(jit.is_compiled(lib, "inner").unwrap());
        // Once resolved, the executor's slots lead straight to the bodies.
        assert_eq!(call("outer", &[0]), 80);
        assert_eq!(compiler.compiles.load(Ordering::SeqCst), 2);
        assert_eq!(call("sum6", &[1, 2, 3, 4, 5, 6]), 21);
        // A failed compile: the executor's fallback returns 0, the failure is kept.
        assert_eq!(call("missing", &[]), 0);
        let failures = jit.lazy_failures();
        assert_eq!(failures.len(), 1, "{failures:?}");
        assert!(failures[0].error.contains("no source for missing"));
        // A new body for inner: the executor stores its slot; outer's body, which calls
        // inner through the stub, reaches it.
        jit.replace_function(lib, "inner", constant_function("inner", 5))
            .unwrap();
        assert_eq!(call("outer", &[0]), 100);
        // A replacement that does not link leaves the old body.
        assert!(jit
            .replace_function(lib, "inner", constant_function("not_inner", 6))
            .is_err());
        assert_eq!(call("outer", &[0]), 100);
    }
}

#[test]
fn out_of_process_hot_swap_reaches_direct_and_stub_callers_and_frees_retired_bodies() {
    // `version` swapped 19 times between the controller's calls: a call of its stub and
    // a call of another lazy function whose body calls it through the stub both reach
    // each new body, in every transport.
    let caller = kiln_testkit::cc_object(
        "swap_calls",
        "long version(void); long twice_version(void) { return 2 * version(); }",
        &["-O1"],
    );
    for (how, executor, _listening) in remote_executors() {
        let jit = Jit::builder().executor(executor).build().unwrap();
        let lib = jit.main_library();
        let compiler = Arc::new(table(&[
            ("version", constant_function("version", 1)),
            ("twice_version", caller.clone()),
        ]));
        jit.add_lazy_functions(lib, &["version", "twice_version"], compiler.clone())
            .unwrap();
        let call = |name: &str| {
            let stub = jit.lookup(lib, name).unwrap();
            // SAFETY: the functions take nothing and return integers, in the executor.
            unsafe { jit.executor().call(stub, &[]) }.unwrap()
        };
        assert_eq!(call("twice_version"), 2, "{how}");
        for v in 2..=20i32 {
            jit.replace_function(lib, "version", constant_function("version", v))
                .unwrap();
            assert_eq!(call("version"), v as u64, "{how}");
            assert_eq!(call("twice_version"), 2 * v as u64, "{how}");
        }
        // No call runs in the executor: every old body has been freed as the swaps went.
        assert_eq!(jit.retired_bodies(), 0, "{how}");
        assert_eq!(jit.reclaim(), 0, "{how}");
        assert_eq!(compiler.compiles.load(Ordering::SeqCst), 2, "{how}");
    }
}

#[test]
fn out_of_process_hot_swap_while_main_and_its_threads_call() {
    // main and two threads it starts call `version` through its stub in a loop until
    // they see version 20, each checking the versions it sees never go back; meanwhile
    // the controller, on another thread, swaps in versions 2 to 20.
    let program = kiln_testkit::cc_object(
        "swap_while_running",
        r#"
        #include <pthread.h>
        long version(void);
        static void *worker(void *p) {
            long last = 0;
            while (last < 20) { long v = version(); if (v < last) return (void *)-1; last = v; }
            return (void *)last;
        }
        int main(void) {
            pthread_t t[2];
            for (int i = 0; i < 2; i++) pthread_create(&t[i], 0, worker, 0);
            long last = 0;
            while (last < 20) { long v = version(); if (v < last) return 100; last = v; }
            for (int i = 0; i < 2; i++) {
                void *r;
                pthread_join(t[i], &r);
                if ((long)r != 20) return 101 + i;
            }
            return 0;
        }
        "#,
        &["-O1", "-pthread"],
    );
    for (how, executor, _listening) in remote_executors() {
        let jit = Jit::builder().executor(executor).build().unwrap();
        let lib = jit.main_library();
        let compiler = Arc::new(table(&[("version", constant_function("version", 1))]));
        jit.add_lazy_functions(lib, &["version"], compiler.clone())
            .unwrap();
        jit.library(lib)
            .add(Input::object("swap_while_running.o", program.clone()))
            .unwrap();
        jit.library(lib).add(Input::ProcessSymbols).unwrap();
        jit.link_pending(lib).unwrap();
        std::thread::scope(|scope| {
            let running = scope.spawn(|| {
                // SAFETY: the program defines a C main.
                unsafe { jit.run_main(lib, &["swap"]) }.map_err(|e| e.to_string())
            });
            // The first call compiled and linked version 1: main runs.
            let start = std::time::Instant::now();
            while !jit.is_compiled(lib, "version").unwrap() {
                assert!(
                    start.elapsed() < Duration::from_secs(20),
                    "{how}: main never called"
                );
                std::thread::sleep(Duration::from_millis(1));
            }
            for v in 2..=20 {
                jit.replace_function(lib, "version", constant_function("version", v))
                    .unwrap_or_else(|e| panic!("{how}: swap to {v}: {e}"));
                if v < 20 {
                    // main runs until it sees 20, holding the executor's guard from
                    // before every swap: no old body is freed yet.
                    assert_eq!(jit.reclaim(), v as usize - 1, "{how}");
                }
                std::thread::sleep(Duration::from_millis(2));
            }
            assert_eq!(running.join().unwrap().unwrap(), 0, "{how}");
        });
        // main has returned: its guard is gone, and with it every old body.
        assert_eq!(jit.reclaim(), 0, "{how}");
    }
}

#[test]
fn out_of_process_a_call_running_in_a_replaced_body_keeps_it_until_it_returns() {
    // `spin` waits in its first body until `release` (another function, called beside it
    // from another controller thread) sets a flag; `spin` is replaced meanwhile. The old
    // body must stay until the call that runs in it returns, then be freed.
    let spin_v1 = kiln_testkit::cc_object(
        "spin_v1",
        r#"
        extern volatile int released;
        long spin(void) { while (!released) { } return 1; }
        "#,
        &["-O1"],
    );
    let spin_v2 = kiln_testkit::cc_object("spin_v2", "long spin(void) { return 2; }", &["-O1"]);
    let flag = kiln_testkit::cc_object(
        "release",
        "volatile int released; long release(void) { released = 1; return 0; }",
        &["-O1"],
    );
    for (how, executor, _listening) in remote_executors() {
        let jit = Jit::builder().executor(executor).build().unwrap();
        let lib = jit.main_library();
        jit.link_object(lib, "release.o", flag.clone()).unwrap();
        let compiler = Arc::new(table(&[("spin", spin_v1.clone())]));
        jit.add_lazy_functions(lib, &["spin"], compiler).unwrap();
        let spin = jit.lookup(lib, "spin").unwrap();
        let release = jit.lookup(lib, "release").unwrap();
        std::thread::scope(|scope| {
            // SAFETY: `long spin(void)`, in the executor.
            let spinning = scope.spawn(|| unsafe { jit.executor().call(spin, &[]) }.unwrap());
            let start = std::time::Instant::now();
            while !jit.is_compiled(lib, "spin").unwrap() {
                assert!(start.elapsed() < Duration::from_secs(20), "{how}");
                std::thread::sleep(Duration::from_millis(1));
            }
            jit.replace_function(lib, "spin", spin_v2.clone()).unwrap();
            assert_eq!(jit.reclaim(), 1, "{how}: a call runs in the old body");
            // A call made after the swap reaches the new body, beside the spinning one.
            // SAFETY: as above.
            let now = unsafe { jit.executor().call(spin, &[]) }.unwrap();
            assert_eq!(now, 2, "{how}");
            assert_eq!(jit.reclaim(), 1, "{how}: still running");
            // SAFETY: `long release(void)`, in the executor.
            unsafe { jit.executor().call(release, &[]) }.unwrap();
            assert_eq!(
                spinning.join().unwrap(),
                1,
                "{how}: the old body ran to its end"
            );
        });
        assert_eq!(jit.reclaim(), 0, "{how}: freed once the call returned");
    }
}

/// Where a test's lazy functions run out of process: a child executor by each transport,
/// and a listening one reached over TCP.
fn remote_executors() -> Vec<(
    String,
    kiln::Executor,
    Option<kiln_testkit::ExecutorProcess>,
)> {
    let spawn = |transport| {
        kiln::Executor::spawn(
            &kiln_testkit::executor_binary(),
            transport,
            kiln::executor::Timeouts::default(),
        )
        .unwrap()
    };
    let listening =
        kiln_testkit::start_executor(&["--listen", "127.0.0.1:0", "--no-auth"], None, &[]);
    let tcp =
        kiln::Executor::connect(&listening.address, kiln::executor::Timeouts::default()).unwrap();
    vec![
        (
            "shared memory".into(),
            spawn(kiln::executor::Transport::SharedMemory),
            None,
        ),
        ("copy".into(), spawn(kiln::executor::Transport::Copy), None),
        ("--connect".into(), tcp, Some(listening)),
    ]
}

#[test]
fn out_of_process_stubs_resolve_from_main_and_every_thread_it_starts() {
    // main and four threads it starts each make a stub's first call (inner's, and sq's
    // with its argument): each must reach the body the controller links, not the
    // fallback (which returns 0).
    let program = kiln_testkit::cc_object(
        "threads_call_stubs",
        r#"
        #include <pthread.h>
        long inner(long);
        long sq(long);
        static void *worker(void *p) { long i = (long)p; return (void *)(inner(i) + sq(i)); }
        int main(void) {
            pthread_t t[4];
            long sum = 0;
            for (long i = 0; i < 4; i++) pthread_create(&t[i], 0, worker, (void *)(i + 1));
            for (int i = 0; i < 4; i++) { void *r; pthread_join(t[i], &r); sum += (long)r; }
            return (int)(sum + inner(10));
        }
        /* Called (not as main): threads that make cube's first call. */
        long cube(long);
        static void *cuber(void *p) { return (void *)cube((long)p); }
        long spawn_and_sum(long n) {
            pthread_t t[4];
            long sum = 0;
            for (long i = 0; i < n && i < 4; i++) pthread_create(&t[i], 0, cuber, (void *)(i + 1));
            for (long i = 0; i < n && i < 4; i++) { void *r; pthread_join(t[i], &r); sum += (long)r; }
            return sum;
        }
        "#,
        &["-O1", "-pthread"],
    );
    let sq = kiln_testkit::cc_object("sq", "long sq(long x) { return x * x; }", &["-O1"]);
    let cube = kiln_testkit::cc_object("cube", "long cube(long x) { return x * x * x; }", &["-O1"]);
    for (how, executor, _listening) in remote_executors() {
        let jit = Jit::builder().executor(executor).build().unwrap();
        let lib = jit.main_library();
        let compiler = Arc::new(table(&[
            ("inner", constant_function("inner", 4)),
            ("sq", sq.clone()),
            ("cube", cube.clone()),
        ]));
        jit.add_lazy_functions(lib, &["inner", "sq", "cube"], compiler.clone())
            .unwrap();
        jit.library(lib)
            .add(Input::object("threads_call_stubs.o", program.clone()))
            .unwrap();
        jit.library(lib).add(Input::ProcessSymbols).unwrap();
        // SAFETY: the program defines a C main.
        let status = unsafe { jit.run_main(lib, &["threads"]) }.unwrap();
        // 4 threads: inner 4 each, sq 1 + 4 + 9 + 16; main: inner 4.
        assert_eq!(status, 16 + 30 + 4, "{how}");
        assert_eq!(compiler.compiles.load(Ordering::SeqCst), 2, "{how}");
        assert!(jit.lazy_failures().is_empty(), "{how}");
        // A call (not main), whose threads make a stub's first call: cube's.
        let spawn = jit.lookup(lib, "spawn_and_sum").unwrap();
        // SAFETY: `long spawn_and_sum(long)`, in the executor.
        let sum = unsafe { jit.executor().call(spawn, &[4]) }.unwrap();
        assert_eq!(sum, 1 + 8 + 27 + 64, "{how}");
        assert_eq!(compiler.compiles.load(Ordering::SeqCst), 3, "{how}");
        assert!(jit.lazy_failures().is_empty(), "{how}");
    }
}

#[test]
fn stubs_outliving_their_session_return_zero_and_names_are_checked() {
    let jit = Jit::new().unwrap();
    let lib = jit.main_library();
    let compiler = Arc::new(table(&[("answer", constant_function("answer", 42))]));
    // Names are checked first: duplicates, empty names.
    for names in [&["answer", "answer"][..], &[""][..]] {
        assert!(jit
            .add_lazy_functions(lib, names, compiler.clone())
            .is_err());
    }
    let stubs = jit
        .add_lazy_functions(lib, &["answer"], compiler.clone())
        .unwrap();
    assert!(matches!(
        jit.add_lazy_functions(lib, &["answer"], compiler),
        Err(Error::Redefinition { .. })
    ));
    // SAFETY: `long answer(void)`, in this process.
    let answer = unsafe {
        jit.lookup_fn::<extern "C" fn() -> i64>(lib, "answer")
            .unwrap()
    };
    assert_eq!(answer(), 42);
    // The session goes; the stubs' module is still held. The body is freed, and the stub
    // leads back into Kiln, which finds no function: 0, not freed memory.
    drop(jit);
    assert_eq!(answer(), 0);
    drop(stubs);
}

#[test]
fn stubs_for_a_name_the_library_defines_are_refused_and_leave_nothing() {
    let jit = Jit::new().unwrap();
    let lib = jit.main_library();
    jit.link_object(lib, "taken.o", constant_function("taken", 7))
        .unwrap();
    let before = jit.memory_stats();
    let compiler = Arc::new(table(&[("fresh", constant_function("fresh", 1))]));
    match jit.add_lazy_functions(lib, &["fresh", "taken"], compiler.clone()) {
        Err(Error::Redefinition { symbol, new, .. }) => {
            assert_eq!(symbol, "taken");
            assert_eq!(new, "(call-through stubs)");
        }
        other => panic!("expected a redefinition, got {other:?}"),
    }
    // Nothing of the refused stubs stays: not the names, not the memory.
    assert!(jit.lookup(lib, "fresh").is_err());
    let after = jit.memory_stats();
    assert_eq!(after.live_allocations, before.live_allocations);
    assert_eq!(after.bytes_allocated, before.bytes_allocated);
    // SAFETY: `long taken(void)`, in this process.
    let taken = unsafe {
        jit.lookup_fn::<extern "C" fn() -> i64>(lib, "taken")
            .unwrap()
    };
    assert_eq!(taken(), 7);
    // The names are free again for stubs.
    jit.add_lazy_functions(lib, &["fresh"], compiler).unwrap();
    // SAFETY: `long fresh(void)`, in this process.
    let fresh = unsafe {
        jit.lookup_fn::<extern "C" fn() -> i64>(lib, "fresh")
            .unwrap()
    };
    assert_eq!(fresh(), 1);
}

#[test]
fn ten_thousand_stubs_each_reach_their_own_body() {
    let jit = Jit::new().unwrap();
    let lib = jit.main_library();
    let names: Vec<String> = (0..10_000).map(|i| format!("f{i}")).collect();
    let objects: Vec<(String, Vec<u8>)> = names
        .iter()
        .enumerate()
        .filter(|(i, _)| i % 997 == 0 || *i == 9_999)
        .map(|(i, n)| (n.clone(), constant_function(n, i as i32)))
        .collect();
    let entries: Vec<(&str, Vec<u8>)> = objects
        .iter()
        .map(|(n, o)| (n.as_str(), o.clone()))
        .collect();
    let compiler = Arc::new(table(&entries));
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    jit.add_lazy_functions(lib, &refs, compiler.clone())
        .unwrap();
    for (name, _) in &objects {
        let i: i64 = name[1..].parse().unwrap();
        // SAFETY: `long fN(void)`, in this process.
        let f = unsafe { jit.lookup_fn::<extern "C" fn() -> i64>(lib, name).unwrap() };
        assert_eq!(f(), i, "{name}");
        assert_eq!(f(), i, "{name}, again through the slot");
    }
    assert_eq!(compiler.compiles.load(Ordering::SeqCst), objects.len());
}

#[test]
fn a_first_call_keeps_its_vector_arguments_whole() {
    if !std::arch::is_x86_feature_detected!("avx") {
        eprintln!("skipped: this CPU has no AVX");
        return;
    }
    let jit = Jit::new().unwrap();
    let lib = jit.main_library();
    // Two `__m256` arguments, in ymm0 and ymm1: the compile on the calling thread (Rust,
    // glibc's AVX memcpy and its `vzeroupper`) must not cost them their upper halves.
    let body = kiln_testkit::cc_object(
        "sum16",
        "#include <immintrin.h>\nfloat sum16(__m256 a, __m256 b) { float t[8]; _mm256_storeu_ps(t, _mm256_add_ps(a, b)); float s = 0; for (int i = 0; i < 8; i++) s += t[i]; return s; }\n",
        &["-O1", "-mavx"],
    );
    let compiler = Arc::new(table(&[("sum16", body)]));
    jit.add_lazy_functions(lib, &["sum16"], compiler.clone())
        .unwrap();
    let caller = kiln_testkit::cc_object(
        "call_sum16",
        "#include <immintrin.h>\nfloat sum16(__m256, __m256);\nfloat call_sum16(void) { return sum16(_mm256_setr_ps(1, 2, 3, 4, 5, 6, 7, 8), _mm256_setr_ps(10, 20, 30, 40, 50, 60, 70, 80)); }\n",
        &["-O1", "-mavx"],
    );
    jit.link_object(lib, "call_sum16.o", caller).unwrap();
    // SAFETY: `float call_sum16(void)`, in this process.
    let call = unsafe {
        jit.lookup_fn::<extern "C" fn() -> f32>(lib, "call_sum16")
            .unwrap()
    };
    assert_eq!(call(), 396.0, "the first call, through the entry");
    assert_eq!(call(), 396.0, "a later call, through the slot");
    assert_eq!(compiler.compiles.load(Ordering::SeqCst), 1);

    // The same in an executor process: its entry waits for the controller's answer.
    let executor = kiln::Executor::spawn(
        &kiln_testkit::executor_binary(),
        kiln::executor::Transport::SharedMemory,
        kiln::executor::Timeouts::default(),
    )
    .unwrap();
    let jit = Jit::builder().executor(executor).build().unwrap();
    let lib = jit.main_library();
    let body = kiln_testkit::cc_object(
        "sum16",
        "#include <immintrin.h>\nfloat sum16(__m256 a, __m256 b) { float t[8]; _mm256_storeu_ps(t, _mm256_add_ps(a, b)); float s = 0; for (int i = 0; i < 8; i++) s += t[i]; return s; }\n",
        &["-O1", "-mavx", "-fPIC"],
    );
    let compiler = Arc::new(table(&[("sum16", body)]));
    jit.add_lazy_functions(lib, &["sum16"], compiler).unwrap();
    let caller = kiln_testkit::cc_object(
        "call_sum16",
        "#include <immintrin.h>\nfloat sum16(__m256, __m256);\nlong call_sum16(void) { return (long) sum16(_mm256_setr_ps(1, 2, 3, 4, 5, 6, 7, 8), _mm256_setr_ps(10, 20, 30, 40, 50, 60, 70, 80)); }\n",
        &["-O1", "-mavx", "-fPIC"],
    );
    jit.link_object(lib, "call_sum16.o", caller).unwrap();
    let address = jit.lookup(lib, "call_sum16").unwrap();
    // SAFETY: `long call_sum16(void)`, in the executor's memory.
    let result = unsafe { jit.executor().call(address, &[]) }.unwrap();
    assert_eq!(result, 396, "out of process");
}

#[test]
fn an_empty_batch_gone_leaves_the_next_batch_registered() {
    // An empty batch takes no ids: the next batch starts at the same id. Dropping the
    // empty one must not take the other's registration with it.
    let first = Jit::new().unwrap();
    let empty = first
        .add_lazy_functions(first.main_library(), &[], Arc::new(table(&[])))
        .unwrap();
    let jit = Jit::new().unwrap();
    let lib = jit.main_library();
    let compiler = Arc::new(table(&[(
        "after_empty",
        constant_function("after_empty", 9),
    )]));
    jit.add_lazy_functions(lib, &["after_empty"], compiler)
        .unwrap();
    drop(empty);
    drop(first);
    // SAFETY: `long after_empty(void)`, in this process.
    let f = unsafe {
        jit.lookup_fn::<extern "C" fn() -> i64>(lib, "after_empty")
            .unwrap()
    };
    assert_eq!(f(), 9);
}

#[test]
fn stubs_added_while_objects_are_pending_are_checked_against_them() {
    let jit = Jit::new().unwrap();
    let lib = jit.main_library();
    jit.library(lib)
        .add(Input::object(
            "pending.o",
            constant_function("pending_f", 3),
        ))
        .unwrap();
    let compiler = Arc::new(table(&[("pending_f", constant_function("pending_f", 4))]));
    // Linked with what is pending: the two definitions of one name are refused together.
    match jit.add_lazy_functions(lib, &["pending_f"], compiler) {
        Err(Error::Link(kiln_link::LinkError::DuplicateSymbol {
            symbol,
            first,
            second,
        })) => {
            assert_eq!(symbol, "pending_f");
            assert_eq!(
                (first.as_str(), second.as_str()),
                ("pending.o", "(call-through stubs)")
            );
        }
        other => panic!("expected a duplicate symbol, got {other:?}"),
    }
    // Nothing of either is left: the name is free.
    assert!(jit.lookup(lib, "pending_f").is_err());
}

/// The writable-and-executable mappings of this process.
fn wx_mappings() -> Vec<String> {
    std::fs::read_to_string("/proc/self/maps")
        .unwrap()
        .lines()
        .filter(|l| l.split_whitespace().nth(1).and_then(|p| p.get(1..3)) == Some("wx"))
        .map(str::to_string)
        .collect()
}

#[test]
fn stubs_first_calls_and_a_hot_swap_leave_no_mapping_writable_and_executable() {
    let jit = Jit::new().unwrap();
    let lib = jit.main_library();
    let names: Vec<String> = (0..64).map(|i| format!("wx_f{i}")).collect();
    let objects: Vec<(&str, Vec<u8>)> = names
        .iter()
        .enumerate()
        .map(|(i, n)| (n.as_str(), constant_function(n, i as i32)))
        .collect();
    let compiler = Arc::new(table(&objects));
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    jit.add_lazy_functions(lib, &refs, compiler).unwrap();
    assert_eq!(wx_mappings(), Vec::<String>::new(), "after defining stubs");
    for (i, name) in names.iter().enumerate() {
        // SAFETY: each is `long f(void)`, in this process.
        let f = unsafe { jit.lookup_fn::<extern "C" fn() -> i64>(lib, name).unwrap() };
        assert_eq!(f(), i as i64);
    }
    assert_eq!(wx_mappings(), Vec::<String>::new(), "after first calls");
    jit.replace_function(lib, "wx_f3", constant_function("wx_f3", 333))
        .unwrap();
    // SAFETY: as above.
    let f = unsafe {
        jit.lookup_fn::<extern "C" fn() -> i64>(lib, "wx_f3")
            .unwrap()
    };
    assert_eq!(f(), 333);
    assert_eq!(wx_mappings(), Vec::<String>::new(), "after a hot swap");
    // The stack of this thread and of a new one.
    let stack = std::fs::read_to_string("/proc/self/maps")
        .unwrap()
        .lines()
        .find(|l| l.ends_with("[stack]"))
        .map(|l| l.split_whitespace().nth(1).unwrap().to_string());
    assert_eq!(stack.as_deref(), Some("rw-p"));
}

#[test]
fn lazy_bodies_are_listed_and_go_with_their_stubs() {
    // even and odd call each other through their stubs: each body uses the stubs' module.
    let even = kiln_testkit::cc_object(
        "even",
        "long odd(long); long even(long n) { return n == 0 ? 1 : odd(n - 1); }",
        &["-O1", "-fPIC", "-fno-optimize-sibling-calls"],
    );
    let odd = kiln_testkit::cc_object(
        "odd",
        "long even(long); long odd(long n) { return n == 0 ? 0 : even(n - 1); }",
        &["-O1", "-fPIC", "-fno-optimize-sibling-calls"],
    );
    let jit = Jit::new().unwrap();
    let lib = jit.main_library();
    let compiler = Arc::new(table(&[("even", even), ("odd", odd)]));
    let stubs = jit
        .add_lazy_functions(lib, &["even", "odd"], compiler)
        .unwrap();
    // SAFETY: `long even(long)`, in this process.
    let even_fn = unsafe {
        jit.lookup_fn::<extern "C" fn(i64) -> i64>(lib, "even")
            .unwrap()
    };
    assert_eq!(even_fn(10), 1);
    assert_eq!(even_fn(7), 0);
    // The stubs and both bodies are the library's modules.
    let modules = jit.library(lib).modules().unwrap();
    let names: Vec<&str> = modules.iter().map(|m| m.name()).collect();
    assert_eq!(modules.len(), 3, "{names:?}");
    assert!(names.iter().any(|n| n.starts_with("even")), "{names:?}");
    assert!(names.iter().any(|n| n.starts_with("odd")), "{names:?}");
    // A module that uses a stub keeps the stubs (and so their bodies) as they are.
    let caller = kiln_testkit::cc_object(
        "caller",
        "long even(long); long caller(void) { return even(4); }",
        &["-O1", "-fPIC"],
    );
    let caller = jit.link_object(lib, "caller.o", caller).unwrap();
    assert!(matches!(
        jit.remove_module(&stubs),
        Err(Error::ModuleInUse { ref users, .. }) if users == &["caller.o".to_string()]
    ));
    assert_eq!(even_fn(2), 1, "nothing was retired by the refused removal");
    jit.remove_module(&caller).unwrap();
    drop(caller);
    // The stubs go, and their bodies with them (no code guard is held).
    drop(modules);
    jit.remove_module(&stubs).unwrap();
    assert_eq!(jit.retired_bodies(), 0);
    assert!(jit.library(lib).modules().unwrap().is_empty());
    assert!(jit.lookup(lib, "even").is_err());
}

/// `even` and `odd` call each other (compiled by cc, calls not inlined), and `counter` is
/// data of the same object.
fn even_odd() -> Vec<u8> {
    kiln_testkit::cc_object(
        "swappable_even_odd",
        "int odd(int n);\n\
         int counter = 40;\n\
         int even(int n) { counter++; return n == 0 ? 1 : odd(n - 1); }\n\
         int odd(int n) { return n == 0 ? 0 : even(n - 1); }\n",
        &["-O1", "-fno-inline", "-fno-optimize-sibling-calls"],
    )
}

/// A new `odd`: `1000 + n` (no recursion).
fn odd_plus(base: i32) -> Vec<u8> {
    kiln_testkit::cc_object(
        &format!("swappable_odd_{base}"),
        &format!("int odd(int n) {{ return {base} + n; }}\n"),
        &["-O1"],
    )
}

#[test]
fn a_function_linked_at_once_is_replaced_and_its_objects_own_calls_reach_the_new_body() {
    let jit = Jit::new().unwrap();
    let lib = jit.main_library();
    let linked = jit.link_swappable(lib, "even_odd.o", even_odd()).unwrap();
    // Linked at once: nothing compiles on a first call, and the names are published.
    // SAFETY: `int even(int)` / `int odd(int)`, in this process, called on this thread
    // (whose calls may reach a retired body only under a guard: none is retired here
    // while a call runs).
    let (even, odd) = unsafe {
        (
            jit.lookup_fn::<extern "C" fn(i32) -> i32>(lib, "even")
                .unwrap(),
            jit.lookup_fn::<extern "C" fn(i32) -> i32>(lib, "odd")
                .unwrap(),
        )
    };
    assert_eq!((even(10), even(7), odd(7)), (1, 0, 1));
    // The data of the object is published and shared as linked.
    let counter = jit.lookup(lib, "counter").unwrap() as *const i32;
    // SAFETY: `int counter`, in this process.
    let calls = unsafe { counter.read_volatile() };
    assert!(calls > 40, "{calls}");
    // A module linked later binds to the stubs too.
    let caller = kiln_testkit::cc_object(
        "swappable_caller",
        "int odd(int n);\nint twice_odd(int n) { return 2 * odd(n); }\n",
        &["-O1"],
    );
    let later = jit.link_object(lib, "caller.o", caller).unwrap();
    // SAFETY: `int twice_odd(int)`, in this process.
    let twice_odd = unsafe {
        jit.lookup_fn::<extern "C" fn(i32) -> i32>(lib, "twice_odd")
            .unwrap()
    };
    assert_eq!(twice_odd(3), 2);
    // The first body is the object's own, listed as the module's (not published).
    let first_body = linked.module.symbol("odd").unwrap();
    assert_ne!(first_body, jit.lookup(lib, "odd").unwrap());
    // Replaced: `even`'s own call (inside the object) reaches the new `odd`, as do the
    // stub's callers and the module linked later.
    let thread = jit.register_thread();
    for base in [1000, 2000, 3000] {
        jit.replace_function(lib, "odd", odd_plus(base)).unwrap();
        let _guard = thread.pin();
        assert_eq!(odd(5), base + 5);
        assert_eq!(even(6), base + 5, "even(6) calls odd(5)");
        assert_eq!(twice_odd(1), 2 * (base + 1));
    }
    // `even` itself is swappable, and the first `odd` body (in the object) is reached
    // again by nothing: every call goes through the stub.
    jit.replace_function(lib, "even", constant_function("even", 77))
        .unwrap();
    {
        let _guard = thread.pin();
        assert_eq!(even(0), 77);
        assert_eq!(odd(1), 3001);
    }
    drop(thread);
    // Retired bodies are freed with no guard held; the library's modules list the
    // current bodies; the object's module goes with its stubs.
    assert_eq!(jit.reclaim(), 0);
    let listed = jit.library(lib).modules().unwrap();
    assert!(listed
        .iter()
        .any(|m| m.symbol("odd").is_some_and(|a| a != first_body)));
    assert!(matches!(
        jit.remove_module(&linked.stubs),
        Err(Error::ModuleInUse { .. })
    ));
    jit.remove_module(&later).unwrap();
    jit.remove_modules(&[linked.stubs, linked.module]).unwrap();
    assert!(jit.lookup(lib, "odd").is_err());
    assert!(jit.lookup(lib, "counter").is_err());
    assert_eq!(jit.reclaim(), 0);
}

#[test]
fn a_function_linked_plainly_is_refused_with_the_way_to_make_it_swappable() {
    let jit = Jit::new().unwrap();
    let lib = jit.main_library();
    jit.link_object(lib, "even_odd.o", even_odd()).unwrap();
    let error = jit
        .replace_function(lib, "odd", odd_plus(1000))
        .unwrap_err();
    assert!(
        matches!(error, Error::NotLazy(ref n) if n == "odd"),
        "{error}"
    );
    assert!(error.to_string().contains("link_swappable"), "{error}");
    // An object without a function, or a broken one, publishes nothing.
    let data_only = kiln_testkit::cc_object("swappable_data", "int only_data = 3;\n", &[]);
    assert!(matches!(
        jit.link_swappable(lib, "data.o", data_only),
        Err(Error::Unsupported(_))
    ));
    let missing = kiln_testkit::cc_object(
        "swappable_missing",
        "int nowhere(int);\nint calls_nowhere(int n) { return nowhere(n); }\n",
        &["-O1"],
    );
    let error = jit.link_swappable(lib, "missing.o", missing).unwrap_err();
    assert!(error.to_string().contains("nowhere"), "{error}");
    assert!(jit.lookup(lib, "calls_nowhere").is_err());
    assert!(jit.lookup(lib, "only_data").is_err());
}

#[test]
fn out_of_process_a_function_linked_at_once_is_replaced() {
    for (how, executor, _listening) in remote_executors() {
        let jit = Jit::builder().executor(executor).build().unwrap();
        let lib = jit.main_library();
        jit.link_swappable(lib, "even_odd.o", even_odd()).unwrap();
        let call = |name: &str, n: u64| {
            let stub = jit.lookup(lib, name).unwrap();
            // SAFETY: `int f(int)`, in the executor.
            unsafe { jit.executor().call(stub, &[n]) }.unwrap() as u32 as i32
        };
        assert_eq!((call("even", 10), call("odd", 7)), (1, 1), "{how}");
        for base in [1000, 2000] {
            jit.replace_function(lib, "odd", odd_plus(base)).unwrap();
            assert_eq!(call("even", 6), base + 5, "{how}");
        }
        assert_eq!(jit.reclaim(), 0, "{how}");
    }
}
