//! Figures of the lazy-linking issue, side by side in one run, each contender in a child
//! process of its own (memory figures do not mix), runs interleaved, medians reported:
//!
//! - **start-up**: a kiln-lang program of N functions of which 1% are called, from
//!   `Runtime::new` to `main`'s first result, and the total with 1,000 more calls of
//!   `main`: lazy (call-through stubs, each function compiled on its first call) against
//!   eager (every function compiled by Cranelift and linked by Kiln before the call);
//! - **stub**: a call through a resolved call-through stub against a call of the body's
//!   address (both through a function pointer from Rust), ns per call;
//! - **Cranelift + Kiln vs cranelift-jit** on the same generated functions: compile +
//!   link per function, one at a time (Kiln: `cranelift-object` → `Jit::link_object`;
//!   cranelift-jit: `define_function` + `finalize_definitions`), and resident bytes per
//!   function;
//! - **hot swap**: `Jit::replace_function` of pre-compiled bodies for a while, with two
//!   threads calling the function in a loop (each pinned per 64 calls): swaps per second.

use clap::Parser;
use cranelift_frontend::FunctionBuilderContext;
use cranelift_module::{Linkage, Module};
use kiln_bench::{field, run_child, ProcessMemory};
use kiln_lang::codegen::{self, Callee};
use kiln_lang::syntax::{self, Extern, Function, Item, Type};
use kiln_lang::{Options, Runtime};
use std::collections::HashMap;
use std::hint::black_box;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(Parser, Debug)]
struct Args {
    /// Functions in the program.
    #[arg(long, default_value_t = 10_000)]
    functions: usize,
    /// Interleaved runs of each contender (medians reported).
    #[arg(long, default_value_t = 5)]
    runs: usize,
    /// Calls timed per round for the stub figure.
    #[arg(long, default_value_t = 20_000_000)]
    calls: u64,
    /// How long to swap for.
    #[arg(long, default_value_t = 1.0)]
    swap_seconds: f64,
    /// Run one contender (internal: the child process).
    #[arg(long)]
    child: Option<String>,
}

fn result(pairs: &[(&str, f64)]) {
    let fields: Vec<String> = pairs.iter().map(|(k, v)| format!("{k}={v}")).collect();
    println!("RESULT {}", fields.join(" "));
}

/// Function `i` of the generated program: a leaf of a few operations.
fn function_source(i: usize) -> String {
    format!(
        "fn f{i}(x) = {{ let y = x * {} + {i}; if y % 2 == 0 then y / 2 else 3 * y + 1 }};\n",
        i % 7 + 2
    )
}

fn expected_f(i: usize, x: i64) -> i64 {
    let y = x * (i % 7 + 2) as i64 + i as i64;
    if y % 2 == 0 {
        y / 2
    } else {
        3 * y + 1
    }
}

/// The program: N functions, `main` calls every hundredth.
fn program(n: usize) -> (String, i64) {
    let mut source = String::with_capacity(n * 80);
    for i in 0..n {
        source.push_str(&function_source(i));
    }
    let called: Vec<usize> = (0..n).step_by(100).collect();
    let terms: Vec<String> = called.iter().map(|i| format!("f{i}(1)")).collect();
    source.push_str(&format!("fn main() = {};\n", terms.join(" + ")));
    let expected = called.iter().map(|&i| expected_f(i, 1)).sum();
    (source, expected)
}

fn run_program(n: usize, eager: bool) {
    let (source, expected) = program(n);
    let before = ProcessMemory::now();
    let t = Instant::now();
    let mut rt = Runtime::new(Options {
        eager,
        ..Default::default()
    })
    .expect("runtime");
    let new = t.elapsed();
    rt.load(&source).expect("load");
    let loaded = t.elapsed();
    let first = rt.call("main", &[]).expect("main");
    let startup = t.elapsed();
    assert_eq!(first, expected);
    for _ in 0..1000 {
        black_box(rt.call("main", &[]).expect("main"));
    }
    let total = t.elapsed();
    let after = ProcessMemory::now();
    // The front end's reading alone, measured apart: the outline (what `load` reads:
    // headers, bodies checked for syntax, no tree), and every body built into a tree.
    let t = Instant::now();
    black_box(kiln_lang::syntax::parse_outline(&source).expect("parses"));
    let outline = t.elapsed();
    let t = Instant::now();
    black_box(kiln_lang::syntax::parse(&source).expect("parses"));
    let parse = t.elapsed();
    result(&[
        ("outline_ms", outline.as_secs_f64() * 1e3),
        ("parse_ms", parse.as_secs_f64() * 1e3),
        ("startup_ms", startup.as_secs_f64() * 1e3),
        ("new_ms", new.as_secs_f64() * 1e3),
        ("load_ms", (loaded - new).as_secs_f64() * 1e3),
        ("first_call_ms", (startup - loaded).as_secs_f64() * 1e3),
        ("total_ms", total.as_secs_f64() * 1e3),
        ("compiled", rt.compiled_functions() as f64),
        ("rss_mb", after.rss.saturating_sub(before.rss) as f64 / 1e6),
    ]);
}

/// The compile + link comparison's figures, per function.
fn per_function_result(
    n: usize,
    compile: Duration,
    link: Duration,
    before: &ProcessMemory,
    after: &ProcessMemory,
) {
    result(&[
        ("compile_us", compile.as_secs_f64() * 1e6 / n as f64),
        ("link_us", link.as_secs_f64() * 1e6 / n as f64),
        (
            "rss_per_fn_b",
            after.rss.saturating_sub(before.rss) as f64 / n as f64,
        ),
    ]);
}

/// `f{i}`s for the compile + link comparison: some call the previous one, some libc.
fn functions(n: usize) -> (Vec<Function>, HashMap<String, Callee>) {
    let mut source = String::new();
    for i in 0..n {
        let body = match i % 3 {
            0 if i > 0 => format!("f{}(x / 3) + {i}", i - 1),
            1 => format!("labs(x - {i}) * 2"),
            _ => format!("x * {} + {i}", i % 7 + 2),
        };
        source.push_str(&format!("fn f{i}(x) = {body};\n"));
    }
    let mut callees = HashMap::new();
    callees.insert(
        "labs".to_string(),
        Callee::Extern(Extern {
            name: "labs".into(),
            params: vec![Type::I64],
            result: Type::I64,
        }),
    );
    let functions: Vec<Function> = syntax::parse(&source)
        .expect("generated source parses")
        .into_iter()
        .filter_map(|item| match item {
            Item::Function(f) => Some(f),
            _ => None,
        })
        .collect();
    for f in &functions {
        callees.insert(f.name.clone(), Callee::Function(1));
    }
    (functions, callees)
}

fn run_kiln_cranelift(n: usize) {
    let (functions, callees) = functions(n);
    let isa = codegen::host_isa(true).expect("isa");
    let jit = kiln::Jit::new().expect("session");
    let lib = jit.main_library();
    jit.library(lib)
        .add(kiln::Input::ProcessSymbols)
        .expect("process symbols");
    let before = ProcessMemory::now();
    let (mut compile, mut link) = (Duration::ZERO, Duration::ZERO);
    let mut modules = Vec::with_capacity(n);
    for f in &functions {
        let t = Instant::now();
        let object = codegen::compile_object(&isa, f, &callees).expect("compile");
        let t2 = Instant::now();
        modules.push(jit.link_object(lib, &f.name, object).expect("link"));
        link += t2.elapsed();
        compile += t2 - t;
    }
    let after = ProcessMemory::now();
    // SAFETY: f{n-1} is `i64 f(i64)`, compiled above, in this process.
    let last = unsafe {
        jit.lookup_fn::<extern "C" fn(i64) -> i64>(lib, &format!("f{}", n - 1))
            .expect("lookup")
    };
    black_box(last(5));
    per_function_result(n, compile, link, &before, &after);
}

fn run_cranelift_jit(n: usize) {
    let (functions, callees) = functions(n);
    let isa = codegen::host_isa(false).expect("isa");
    let builder =
        cranelift_jit::JITBuilder::with_isa(isa, cranelift_module::default_libcall_names());
    let mut module = cranelift_jit::JITModule::new(builder);
    let mut context = module.make_context();
    let mut builder_context = FunctionBuilderContext::new();
    let before = ProcessMemory::now();
    let (mut compile, mut link) = (Duration::ZERO, Duration::ZERO);
    let mut last = None;
    for f in &functions {
        let t = Instant::now();
        let id = codegen::define(
            &mut module,
            &mut context,
            &mut builder_context,
            f,
            &callees,
            Linkage::Export,
        )
        .expect("define");
        let t2 = Instant::now();
        module.finalize_definitions().expect("finalize");
        last = Some(module.get_finalized_function(id));
        link += t2.elapsed();
        compile += t2 - t;
    }
    let after = ProcessMemory::now();
    if let Some(last) = last {
        // SAFETY: `i64 f(i64)`, finalized above.
        let f = unsafe { std::mem::transmute::<*const u8, extern "C" fn(i64) -> i64>(last) };
        black_box(f(5));
    }
    per_function_result(n, compile, link, &before, &after);
}

fn run_stub_call(calls: u64) {
    let mut rt = Runtime::new(Options::default()).expect("runtime");
    rt.load("fn inc(x) = x + 1;").expect("load");
    assert_eq!(rt.call("inc", &[1]).expect("first call compiles"), 2);
    let stub = rt.jit().lookup(rt.library(), "inc").expect("stub");
    let body = rt
        .jit()
        .body_address(rt.library(), "inc")
        .expect("lazy")
        .expect("compiled");
    assert_ne!(stub, body);
    let thread = rt.jit().register_thread();
    let _guard = thread.pin();
    // SAFETY: both are `i64 inc(i64)` in this process; the body stays current.
    let (stub, body) = unsafe {
        (
            std::mem::transmute::<usize, extern "C" fn(i64) -> i64>(stub as usize),
            std::mem::transmute::<usize, extern "C" fn(i64) -> i64>(body as usize),
        )
    };
    let time = |f: extern "C" fn(i64) -> i64| {
        let f = black_box(f);
        let t = Instant::now();
        let mut x = 0;
        for _ in 0..calls {
            x = f(x);
        }
        assert_eq!(x as u64, calls);
        t.elapsed().as_secs_f64() * 1e9 / calls as f64
    };
    // Interleaved rounds; the best of each (the least disturbed).
    let (mut via_stub, mut direct) = (f64::MAX, f64::MAX);
    for _ in 0..5 {
        via_stub = via_stub.min(time(stub));
        direct = direct.min(time(body));
    }
    // Defining 10,000 stubs alone (one object, one link), in a session of its own.
    struct Never;
    impl kiln::lazy::LazyCompiler for Never {
        fn compile(&self, _: &str) -> Result<Vec<u8>, kiln::lazy::CompileError> {
            Err("not called".into())
        }
    }
    let names: Vec<String> = (0..10_000).map(|i| format!("g{i}")).collect();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    let jit = kiln::Jit::new().expect("session");
    let faults = kiln_bench::minor_faults();
    let (user, system) = kiln_bench::cpu_times();
    let t = Instant::now();
    jit.add_lazy_functions(jit.main_library(), &names, Arc::new(Never))
        .expect("stubs");
    let stubs = t.elapsed();
    let stub_faults = kiln_bench::minor_faults() - faults;
    let (user_after, system_after) = kiln_bench::cpu_times();
    // Again, in the same session: the tables and memory are grown already.
    let again: Vec<String> = (0..10_000).map(|i| format!("h{i}")).collect();
    let again: Vec<&str> = again.iter().map(String::as_str).collect();
    let t = Instant::now();
    jit.add_lazy_functions(jit.main_library(), &again, Arc::new(Never))
        .expect("stubs");
    let stubs_again = t.elapsed();
    result(&[
        ("stub_ns", via_stub),
        ("direct_ns", direct),
        ("stubs_10000_ms", stubs.as_secs_f64() * 1e3),
        ("stubs_10000_faults", stub_faults as f64),
        (
            "stubs_10000_user_ms",
            (user_after - user).as_secs_f64() * 1e3,
        ),
        (
            "stubs_10000_system_ms",
            (system_after - system).as_secs_f64() * 1e3,
        ),
        ("stubs_10000_again_ms", stubs_again.as_secs_f64() * 1e3),
    ]);
}

fn run_swap(seconds: f64) {
    let isa = codegen::host_isa(true).expect("isa");
    let jit = kiln::Jit::new().expect("session");
    let lib = jit.main_library();
    let callees: HashMap<String, Callee> = HashMap::new();
    let bodies: Vec<Vec<u8>> = (0..16)
        .map(|v| {
            let f = match syntax::parse(&format!("fn version() = {v};")).expect("parses")[0].clone()
            {
                Item::Function(f) => f,
                _ => unreachable!("a function"),
            };
            codegen::compile_object(&isa, &f, &callees).expect("compile")
        })
        .collect();
    struct Table(Vec<Vec<u8>>);
    impl kiln::lazy::LazyCompiler for Table {
        fn compile(&self, _: &str) -> Result<Vec<u8>, kiln::lazy::CompileError> {
            Ok(self.0[0].clone())
        }
    }
    jit.add_lazy_functions(lib, &["version"], Arc::new(Table(bodies.clone())))
        .expect("stubs");
    // SAFETY: `i64 version()`, in this process; called under guards.
    let version = unsafe {
        jit.lookup_fn::<extern "C" fn() -> i64>(lib, "version")
            .expect("lookup")
    };
    let stop = Arc::new(AtomicBool::new(false));
    let calls = Arc::new(AtomicU64::new(0));
    let threads: Vec<_> = (0..2)
        .map(|_| {
            let (jit, stop, calls) = (jit.clone(), stop.clone(), calls.clone());
            std::thread::spawn(move || {
                let thread = jit.register_thread();
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let _guard = thread.pin();
                    for _ in 0..64 {
                        black_box(version());
                    }
                    n += 64;
                }
                calls.fetch_add(n, Ordering::Relaxed);
            })
        })
        .collect();
    let t = Instant::now();
    let mut swaps = 0u64;
    while t.elapsed().as_secs_f64() < seconds {
        let body = bodies[(swaps % 16) as usize].clone();
        jit.replace_function(lib, "version", body).expect("swap");
        swaps += 1;
    }
    let elapsed = t.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        t.join().expect("caller");
    }
    let left = jit.reclaim();
    result(&[
        ("swaps_per_s", swaps as f64 / elapsed),
        (
            "calls_per_s",
            calls.load(Ordering::Relaxed) as f64 / elapsed,
        ),
        ("retired_left", left as f64),
    ]);
}

/// Function `i` of the program run from outside: a loop and lets.
fn looping_function_source(i: usize) -> String {
    format!(
        "fn f{i}(x) = {{ let y = x * {} + {i}; let n = 0; while n < 3 do {{ y = if y % 2 == 0 then y / 2 else 3 * y + 1; n = n + 1 }}; y }};\n",
        i % 7 + 2
    )
}

fn expected_looping_f(i: usize, x: i64) -> i64 {
    let mut y = x * (i % 7 + 2) as i64 + i as i64;
    for _ in 0..3 {
        y = if y % 2 == 0 { y / 2 } else { 3 * y + 1 };
    }
    y
}

/// Lazy start-up measured from outside, as a user runs it: the `kiln-lang` binary on a
/// generated program of `n` functions with loops and lets whose `main` calls 100 of them
/// (and exits 0 if they return what they should), the CPU time of the whole process,
/// lazy against `--eager`, interleaved.
fn outside(n: usize, runs: usize) {
    let Some(binary) = std::env::current_exe()
        .ok()
        .and_then(|exe| Some(exe.parent()?.join("kiln-lang")))
        .filter(|b| b.exists())
    else {
        println!("\nfrom outside: no kiln-lang binary beside this one (cargo build --release -p kiln-lang)");
        return;
    };
    let mut source = String::with_capacity(n * 130);
    for i in 0..n {
        source.push_str(&looping_function_source(i));
    }
    let called: Vec<usize> = (0..n).step_by(100).collect();
    let terms: Vec<String> = called.iter().map(|i| format!("f{i}(1)")).collect();
    let expected: i64 = called.iter().map(|&i| expected_looping_f(i, 1)).sum();
    source.push_str(&format!(
        "fn main() = if {} == {expected} then 0 else 1;\n",
        terms.join(" + ")
    ));
    let file = std::env::temp_dir().join(format!("kiln-lazy-figures-{}.kl", std::process::id()));
    if std::fs::write(&file, &source).is_err() {
        println!("\nfrom outside: cannot write {}", file.display());
        return;
    }
    let path = file.display().to_string();
    let (mut lazy, mut eager) = (Vec::new(), Vec::new());
    for _ in 0..runs {
        lazy.extend(kiln_bench::cpu_time_of(&binary, &[&path]).map(|t| t.as_secs_f64() * 1e3));
        eager.extend(
            kiln_bench::cpu_time_of(&binary, &["--eager", &path]).map(|t| t.as_secs_f64() * 1e3),
        );
    }
    let _ = std::fs::remove_file(&file);
    if lazy.len() != runs || eager.len() != runs {
        println!("\nfrom outside: kiln-lang failed or printed a wrong result");
        return;
    }
    let (lazy, eager) = (median(lazy), median(eager));
    println!(
        "\nfrom outside (kiln-lang FILE, {n} functions with loops and lets, main calls 100; CPU time of the whole process, median of {runs}):"
    );
    println!(
        "  lazy {lazy:.1} ms, eager {eager:.1} ms: lazy start-up {:.1}x faster (target >= 30x: {})",
        eager / lazy,
        kiln_bench::verdict(eager / lazy >= 30.0)
    );
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

fn main() {
    let args = Args::parse();
    if let Some(child) = &args.child {
        match child.as_str() {
            "lazy" => run_program(args.functions, false),
            "eager" => run_program(args.functions, true),
            "kiln" => run_kiln_cranelift(args.functions),
            "cranelift-jit" => run_cranelift_jit(args.functions),
            "stub" => run_stub_call(args.calls),
            "swap" => run_swap(args.swap_seconds),
            other => panic!("unknown child {other}"),
        }
        return;
    }
    let n = args.functions;
    let contenders = ["lazy", "eager", "kiln", "cranelift-jit"];
    let mut runs: HashMap<&str, Vec<Vec<(String, String)>>> = HashMap::new();
    for _ in 0..args.runs {
        for c in contenders {
            let r = run_child(&[
                "--child".into(),
                c.into(),
                "--functions".into(),
                n.to_string(),
            ]);
            match r.ok().and_then(|r| r.into_iter().next()) {
                Some(r) => runs.entry(c).or_default().push(r),
                None => println!("{c}: crashed or failed"),
            }
        }
    }
    let med = |c: &str, key: &str| {
        median(
            runs.get(c)
                .map(|rs| rs.iter().map(|r| field(r, key)).collect())
                .unwrap_or_default(),
        )
    };
    println!(
        "{n} functions, 1% called (main calls every hundredth); medians of {} interleaved runs, each in its own process\n",
        args.runs
    );
    println!(
        "start-up (Runtime::new → parse → main's first result) and total (+1,000 calls of main):"
    );
    for c in ["lazy", "eager"] {
        println!(
            "  {c:<6} start-up {:>9.2} ms   total {:>9.2} ms   compiled {:>6.0}   RSS +{:.1} MB",
            med(c, "startup_ms"),
            med(c, "total_ms"),
            med(c, "compiled"),
            med(c, "rss_mb")
        );
    }
    let speedup = med("eager", "startup_ms") / med("lazy", "startup_ms");
    println!(
        "  lazy start-up {speedup:.1}x faster than eager (target >= 30x, issue 30; 20x, issue 15: {}); total {:.1}x",
        kiln_bench::verdict(speedup >= 30.0),
        med("eager", "total_ms") / med("lazy", "total_ms")
    );
    for c in ["lazy", "eager"] {
        println!(
            "  {c:<6} = Runtime::new {:.2} ms + load {:.2} ms + first call {:.2} ms",
            med(c, "new_ms"),
            med(c, "load_ms"),
            med(c, "first_call_ms")
        );
    }
    println!(
        "  reading the source alone, timed apart: the outline load reads (bodies checked, no tree) {:.2} ms; every body built into a tree {:.2} ms",
        med("lazy", "outline_ms"),
        med("lazy", "parse_ms")
    );
    println!("\ncompile + link, one function at a time, same Cranelift IR:");
    for c in ["kiln", "cranelift-jit"] {
        println!(
            "  {c:<14} compile {:>7.1} µs   link {:>7.1} µs   compile+link {:>7.1} µs   RSS/function {:>7.0} B",
            med(c, "compile_us"),
            med(c, "link_us"),
            med(c, "compile_us") + med(c, "link_us"),
            med(c, "rss_per_fn_b")
        );
    }
    println!(
        "  kiln / cranelift-jit: compile+link {:.2}x, link {:.2}x, RSS per function {:.2}x",
        (med("kiln", "compile_us") + med("kiln", "link_us"))
            / (med("cranelift-jit", "compile_us") + med("cranelift-jit", "link_us")),
        med("kiln", "link_us") / med("cranelift-jit", "link_us"),
        med("kiln", "rss_per_fn_b") / med("cranelift-jit", "rss_per_fn_b"),
    );
    outside(n, args.runs);
    let stub = run_child(&[
        "--child".into(),
        "stub".into(),
        "--calls".into(),
        args.calls.to_string(),
    ]);
    match stub.ok().and_then(|r| r.into_iter().next()) {
        Some(r) => {
            let extra = field(&r, "stub_ns") - field(&r, "direct_ns");
            println!(
                "\ncall through a resolved stub {:.2} ns, direct {:.2} ns: {extra:.2} ns extra (target <= 1 ns: {})",
                field(&r, "stub_ns"),
                field(&r, "direct_ns"),
                kiln_bench::verdict(extra <= 1.0)
            );
            let ms = field(&r, "stubs_10000_ms");
            println!(
                "defining 10,000 call-through stubs (written straight into code memory): {ms:.2} ms, {:.0} ns per stub, {:.0} page faults (target <= 2 ms: {}); again in the same session {:.2} ms",
                ms * 100.0,
                field(&r, "stubs_10000_faults"),
                kiln_bench::verdict(ms <= 2.0),
                field(&r, "stubs_10000_again_ms"),
            );
        }
        None => println!("stub: crashed or failed"),
    }
    let swap = run_child(&[
        "--child".into(),
        "swap".into(),
        "--swap-seconds".into(),
        args.swap_seconds.to_string(),
    ]);
    match swap.ok().and_then(|r| r.into_iter().next()) {
        Some(r) => println!(
            "hot swap with 2 threads calling: {:.0} swaps/s, {:.2} M calls/s meanwhile, {:.0} retired bodies left after reclaim",
            field(&r, "swaps_per_s"),
            field(&r, "calls_per_s") / 1e6,
            field(&r, "retired_left")
        ),
        None => println!("swap: crashed or failed"),
    }
}
