//! Figures of the session-at-scale issue (30), side by side in one run: a JIT that compiles one
//! function per module with Cranelift 0.135 and keeps them all.
//!
//! N one-function modules (a quarter compute and read a global shared through a runtime
//! module, a quarter call a host function, a quarter call libc's `labs`, a quarter call
//! the previous module's function), linked one by one, each looked up, called and
//! finally removed (newest first: a module that others call cannot go before them):
//! - **kiln**: cranelift-object makes one ELF object per function; `Jit::link_object`
//!   links it into the main library;
//! - **cranelift-jit**: one `JITModule`, `define_function` + `finalize_definitions` per
//!   function (its own "link"), `get_finalized_function`, `free_memory` at the end (it
//!   cannot free one function).
//!
//! Code generation is timed apart (it is the same Cranelift in both). Each contender runs
//! in a child process of its own (memory figures do not mix); `kiln2` links half the
//! modules into each of two libraries from two threads at once.

use clap::Parser;
use cranelift_frontend::FunctionBuilderContext;
use cranelift_module::{default_libcall_names, Module};
use kiln_bench::cranelift_workload::{compile, define_shared, expected, isa, kiln_bench_host};
use kiln_bench::{field, run_child, verdict, CountingAllocator, ProcessMemory};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator;

#[derive(Parser, Debug)]
struct Args {
    /// Module counts to measure.
    #[arg(long, value_delimiter = ',', default_value = "1000,10000,100000")]
    modules: Vec<usize>,
    /// Link-and-remove cycles of the churn figure (0: not run).
    #[arg(long, default_value_t = 100_000)]
    churn: usize,
    /// Largest count cranelift-jit is run with.
    #[arg(long, default_value_t = 100_000)]
    jit_max: usize,
    /// Run one contender (internal: the child process).
    #[arg(long)]
    contender: Option<String>,
}

/// The runtime module's object: `shared_value`, an i64 of 7.
fn runtime_object(isa: &Arc<dyn cranelift_codegen::isa::TargetIsa>) -> Vec<u8> {
    let mut module = cranelift_object::ObjectModule::new(
        cranelift_object::ObjectBuilder::new(isa.clone(), "runtime", default_libcall_names())
            .expect("builder"),
    );
    define_shared(&mut module);
    module.finish().emit().expect("emit")
}

/// Module `i`'s object as a JIT using Kiln makes it: compile (timed apart), then emit an
/// ELF object with cranelift-object.
fn object_for(
    isa: &Arc<dyn cranelift_codegen::isa::TargetIsa>,
    i: usize,
    fbc: &mut FunctionBuilderContext,
    ctx: &mut cranelift_codegen::Context,
    codegen: &mut Duration,
) -> Vec<u8> {
    let mut module = cranelift_object::ObjectModule::new(
        cranelift_object::ObjectBuilder::new(isa.clone(), format!("m{i}"), default_libcall_names())
            .expect("builder"),
    );
    let t = Instant::now();
    let (id, align, code, relocs) = compile(&mut module, i, fbc, ctx);
    *codegen += t.elapsed();
    module
        .define_function_bytes(id, align, &code, &relocs)
        .expect("define");
    module.finish().emit().expect("emit")
}

fn result(pairs: &[(&str, f64)]) {
    let fields: Vec<String> = pairs.iter().map(|(k, v)| format!("{k}={v}")).collect();
    println!("RESULT {}", fields.join(" "));
}

fn mean(d: &[Duration]) -> f64 {
    d.iter().map(Duration::as_secs_f64).sum::<f64>() / d.len().max(1) as f64
}

/// First and last tenth of the per-module link times, in µs.
fn tenths(times: &[Duration]) -> (f64, f64) {
    let tenth = (times.len() / 10).max(1);
    (
        mean(&times[..tenth]) * 1e6,
        mean(&times[times.len() - tenth..]) * 1e6,
    )
}

/// The session every Kiln contender starts from: the host function, the process's
/// symbols, the runtime module.
fn kiln_session(isa: &Arc<dyn cranelift_codegen::isa::TargetIsa>) -> (kiln::Jit, kiln::Module) {
    let jit = kiln::Jit::new().expect("session");
    let main = jit.main_library();
    jit.library(main)
        .define_symbol("kiln_bench_host", kiln_bench_host as *const () as u64)
        .expect("host");
    jit.library(main)
        .add(kiln::Input::ProcessSymbols)
        .expect("process symbols");
    let runtime = jit
        .link_object(main, "runtime.o", runtime_object(isa))
        .expect("runtime");
    (jit, runtime)
}

/// Runs `work(k, barrier)` on `threads` threads (`k` = 0..threads) and reports the slowest
/// one's time, as `link_total_s`, for `n` items.
fn run_threads(
    n: usize,
    threads: usize,
    work: impl Fn(usize, &std::sync::Barrier) -> Duration + Sync,
) {
    let barrier = std::sync::Barrier::new(threads);
    let times: Vec<Duration> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..threads)
            .map(|k| {
                let (work, barrier) = (&work, &barrier);
                scope.spawn(move || work(k, barrier))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("thread"))
            .collect()
    });
    let slowest = times.iter().max().copied().unwrap_or_default();
    result(&[
        ("n", n as f64),
        ("threads", threads as f64),
        ("link_total_s", slowest.as_secs_f64()),
    ]);
}

/// Link throughput with `threads` threads, each linking its share of the N modules (made
/// before, in that thread) into a library of its own: the contention figure. Every thread
/// links as fast as it can, so what serializes shows.
fn run_kiln_threads(n: usize, threads: usize) {
    let isa = isa(true);
    let (jit, _runtime) = kiln_session(&isa);
    let main = jit.main_library();
    let libs: Vec<_> = (0..threads)
        .map(|k| {
            let lib = jit.create_library(&format!("part{k}"));
            jit.library(lib).set_search_order(&[main]).expect("order");
            lib
        })
        .collect();
    run_threads(n, threads, |k, barrier| {
        // Parts are contiguous ranges starting at a multiple of 4, so every module that
        // calls its predecessor finds it in its own library.
        let (lo, hi) = (k * n / threads, (k + 1) * n / threads);
        let mut fbc = FunctionBuilderContext::new();
        let mut ctx = cranelift_codegen::Context::new();
        let mut codegen = Duration::ZERO;
        let objects: Vec<Vec<u8>> = (lo..hi)
            .map(|i| object_for(&isa, i, &mut fbc, &mut ctx, &mut codegen))
            .collect();
        barrier.wait();
        let start = Instant::now();
        let mut modules = Vec::with_capacity(objects.len());
        for (i, bytes) in (lo..hi).zip(objects) {
            modules.push(
                jit.link_object(libs[k], &format!("m{i}.o"), bytes)
                    .expect("link"),
            );
        }
        let elapsed = start.elapsed();
        barrier.wait();
        elapsed
    });
}

/// This machine's ceiling for two threads: `threads` threads each compiling their share
/// of N functions with Cranelift, sharing nothing (the same work the link threads did
/// before their barrier). A perfectly parallel workload gets this ratio here; two vCPUs
/// that share a physical core (or a busy host) give well under 2.
fn run_compile_threads(n: usize, threads: usize) {
    let isa = isa(true);
    run_threads(n, threads, |k, barrier| {
        let (lo, hi) = (k * n / threads, (k + 1) * n / threads);
        let mut fbc = FunctionBuilderContext::new();
        let mut ctx = cranelift_codegen::Context::new();
        let mut codegen = Duration::ZERO;
        barrier.wait();
        let start = Instant::now();
        for i in lo..hi {
            std::hint::black_box(object_for(&isa, i, &mut fbc, &mut ctx, &mut codegen));
        }
        start.elapsed()
    });
}

/// One contender's run as a JIT runs: for each module, compile, make what the linker
/// takes, link, and go on (the caches see the compiler's work between links).
fn run_kiln(n: usize) {
    let isa = isa(true);
    let (jit, _runtime) = kiln_session(&isa);
    let main = jit.main_library();
    let mut fbc = FunctionBuilderContext::new();
    let mut ctx = cranelift_codegen::Context::new();
    // Warm the compiler once, then read memory before any module's object exists.
    let _ = object_for(&isa, 0, &mut fbc, &mut ctx, &mut Duration::default());
    let before = ProcessMemory::now();
    let heap_before = CountingAllocator::live_bytes();
    let mut codegen = Duration::ZERO;
    let mut emit = Duration::ZERO;
    let mut link_times = Vec::with_capacity(n);
    let mut modules = Vec::with_capacity(n);
    let mut allocations = 0;
    for i in 0..n {
        let t = Instant::now();
        let mut compile_time = Duration::ZERO;
        let bytes = object_for(&isa, i, &mut fbc, &mut ctx, &mut compile_time);
        codegen += compile_time;
        emit += t.elapsed() - compile_time;
        let name = format!("m{i}.o");
        let a = CountingAllocator::allocations();
        let t = Instant::now();
        let module = jit.link_object(main, &name, bytes).expect("link");
        link_times.push(t.elapsed());
        allocations += CountingAllocator::allocations() - a;
        modules.push(module);
    }
    let link_total: f64 = link_times.iter().map(Duration::as_secs_f64).sum();
    let after = ProcessMemory::now();
    let heap_after = CountingAllocator::live_bytes();
    let stats = jit.memory_stats();
    let names: Vec<String> = (0..n).map(|i| format!("f_{i}")).collect();
    let t = Instant::now();
    let mut addresses = Vec::with_capacity(n);
    for name in &names {
        addresses.push(jit.lookup(main, name).expect("lookup"));
    }
    let lookup = t.elapsed();
    let t = Instant::now();
    let process = jit.lookup(main, "strlen").expect("strlen");
    let _ = jit.lookup(main, "strlen").expect("strlen");
    let process_lookup = t.elapsed() / 2;
    assert_ne!(process, 0);
    for (i, &address) in addresses.iter().enumerate() {
        // SAFETY: f_i is `i64 f(i64)`, linked above and kept in the library.
        let f: extern "C" fn(i64) -> i64 = unsafe { std::mem::transmute(address as usize) };
        assert_eq!(f(-5), expected(i, -5), "f_{i}");
    }
    let t = Instant::now();
    jit.remove_modules(&modules).expect("remove");
    drop(modules);
    let removal = t.elapsed();
    let (first, last) = tenths(&link_times);
    result(&[
        ("n", n as f64),
        ("codegen_us", codegen.as_secs_f64() * 1e6 / n as f64),
        ("emit_us", emit.as_secs_f64() * 1e6 / n as f64),
        ("link_us", link_total * 1e6 / n as f64),
        ("first_tenth_us", first),
        ("last_tenth_us", last),
        ("lookup_all_ms", lookup.as_secs_f64() * 1e3),
        ("process_lookup_us", process_lookup.as_secs_f64() * 1e6),
        ("remove_us", removal.as_secs_f64() * 1e6 / n as f64),
        (
            "rss_per_module_b",
            after.rss.saturating_sub(before.rss) as f64 / n as f64,
        ),
        (
            "heap_per_module_b",
            (heap_after - heap_before) as f64 / n as f64,
        ),
        (
            "kiln_bytes_per_module_b",
            stats.bytes_allocated as f64 / n as f64,
        ),
        ("allocations_per_link", allocations as f64 / n as f64),
    ]);
}

/// A JIT that keeps a runtime module and churns small modules: `n` cycles of compile,
/// link, call, remove. Heap and RSS are read after the first tenth and at the end (they
/// must stay flat), and the session's memory figures after the last removal (resident
/// never above mapped).
fn run_kiln_churn(n: usize) {
    let isa = isa(true);
    let (jit, _runtime) = kiln_session(&isa);
    let main = jit.main_library();
    let mut fbc = FunctionBuilderContext::new();
    let mut ctx = cranelift_codegen::Context::new();
    let mut marks = Vec::new();
    for k in 0..n {
        // Module 4 * k' computes with the runtime's global (a module that uses another).
        let i = (k % 1000) * 4;
        let bytes = object_for(&isa, i, &mut fbc, &mut ctx, &mut Duration::default());
        let module = jit.link_object(main, "churn.o", bytes).expect("link");
        let address = module.symbol(&format!("f_{i}")).expect("f_i");
        // SAFETY: f_i is `i64 f(i64)`, linked just now, alive until removed below.
        let f: extern "C" fn(i64) -> i64 = unsafe { std::mem::transmute(address as usize) };
        assert_eq!(f(-5), expected(i, -5), "f_{i}");
        jit.remove_module(&module).expect("remove");
        drop(module);
        if (k + 1) % (n / 10).max(1) == 0 {
            marks.push((ProcessMemory::now().rss, CountingAllocator::live_bytes()));
        }
    }
    let stats = jit.memory_stats();
    let (rss_first, heap_first) = marks.first().copied().unwrap_or_default();
    let (rss_last, heap_last) = marks.last().copied().unwrap_or_default();
    result(&[
        ("n", n as f64),
        ("rss_first_kib", rss_first as f64 / 1024.0),
        ("rss_last_kib", rss_last as f64 / 1024.0),
        ("heap_first_kib", heap_first as f64 / 1024.0),
        ("heap_last_kib", heap_last as f64 / 1024.0),
        ("mapped_kib", stats.bytes_mapped as f64 / 1024.0),
        (
            "resident_kib",
            stats.bytes_resident.unwrap_or(0) as f64 / 1024.0,
        ),
    ]);
}

fn run_cranelift_jit(n: usize) {
    let isa = isa(false);
    let mut builder = cranelift_jit::JITBuilder::with_isa(isa.clone(), default_libcall_names());
    builder.symbol("kiln_bench_host", kiln_bench_host as *const u8);
    let mut module = cranelift_jit::JITModule::new(builder);
    define_shared(&mut module);
    module.finalize_definitions().expect("finalize");
    let mut fbc = FunctionBuilderContext::new();
    let mut ctx = cranelift_codegen::Context::new();
    let before = ProcessMemory::now();
    let heap_before = CountingAllocator::live_bytes();
    let mut codegen = Duration::ZERO;
    let mut link_times = Vec::with_capacity(n);
    let mut ids = Vec::with_capacity(n);
    let mut allocations = 0;
    for i in 0..n {
        let t = Instant::now();
        let (id, align, code, relocs) = compile(&mut module, i, &mut fbc, &mut ctx);
        codegen += t.elapsed();
        let a = CountingAllocator::allocations();
        let t = Instant::now();
        // cranelift-jit's own link: the bytes into its memory, relocations applied,
        // permissions set, the address read back.
        module
            .define_function_bytes(id, align, &code, &relocs)
            .expect("define");
        module.finalize_definitions().expect("finalize");
        let _ = module.get_finalized_function(id);
        link_times.push(t.elapsed());
        allocations += CountingAllocator::allocations() - a;
        ids.push(id);
    }
    let link_total: f64 = link_times.iter().map(Duration::as_secs_f64).sum();
    let after = ProcessMemory::now();
    let heap_after = CountingAllocator::live_bytes();
    let t = Instant::now();
    let mut addresses = Vec::with_capacity(n);
    for i in 0..n {
        // The lookup a cranelift-jit user does: name → id → finalized address.
        let id = match module.get_name(&format!("f_{i}")) {
            Some(cranelift_module::FuncOrDataId::Func(id)) => id,
            _ => panic!("f_{i}"),
        };
        addresses.push(module.get_finalized_function(id) as u64);
    }
    let lookup = t.elapsed();
    for (i, &address) in addresses.iter().enumerate() {
        // SAFETY: f_i is `i64 f(i64)`, finalized above, the module alive.
        let f: extern "C" fn(i64) -> i64 = unsafe { std::mem::transmute(address as usize) };
        assert_eq!(f(-5), expected(i, -5), "f_{i}");
    }
    let t = Instant::now();
    // SAFETY: no function of the module is running or called after this.
    unsafe { module.free_memory() };
    let removal = t.elapsed();
    let (first, last) = tenths(&link_times);
    result(&[
        ("n", n as f64),
        ("codegen_us", codegen.as_secs_f64() * 1e6 / n as f64),
        ("emit_us", 0.0),
        ("link_us", link_total * 1e6 / n as f64),
        ("first_tenth_us", first),
        ("last_tenth_us", last),
        ("lookup_all_ms", lookup.as_secs_f64() * 1e3),
        ("process_lookup_us", 0.0),
        ("remove_us", removal.as_secs_f64() * 1e6 / n as f64),
        (
            "rss_per_module_b",
            after.rss.saturating_sub(before.rss) as f64 / n as f64,
        ),
        (
            "heap_per_module_b",
            (heap_after - heap_before) as f64 / n as f64,
        ),
        ("kiln_bytes_per_module_b", 0.0),
        ("allocations_per_link", allocations as f64 / n as f64),
    ]);
}

fn main() {
    let args = Args::parse();
    if let Some(contender) = &args.contender {
        let n = args.modules[0];
        match contender.as_str() {
            "kiln" => run_kiln(n),
            "kiln1" => run_kiln_threads(n, 1),
            "kiln2" => run_kiln_threads(n, 2),
            "compile1" => run_compile_threads(n, 1),
            "compile2" => run_compile_threads(n, 2),
            "churn" => run_kiln_churn(n),
            "cranelift-jit" => run_cranelift_jit(n),
            other => panic!("unknown contender {other}"),
        }
        return;
    }
    println!(
        "one function per module, Cranelift 0.135 code, compiled between links as a JIT does;"
    );
    println!("per module unless said; each contender in its own process; memory read before the first module's object exists\n");
    for &n in &args.modules {
        println!("N = {n}");
        println!(
            "  {:<14} {:>9} {:>8} {:>9} {:>10} {:>10} {:>11} {:>9} {:>8} {:>9} {:>7}",
            "contender",
            "codegen",
            "emit",
            "link",
            "first 10%",
            "last 10%",
            "lookup all",
            "remove",
            "RSS/mod",
            "heap/mod",
            "allocs"
        );
        let mut rows = Vec::new();
        for contender in ["kiln", "cranelift-jit"] {
            if contender == "cranelift-jit" && n > args.jit_max {
                println!("  {contender:<14} (not run above {})", args.jit_max);
                continue;
            }
            let run = run_child(&[
                "--contender".into(),
                contender.into(),
                "--modules".into(),
                n.to_string(),
            ]);
            match run {
                Ok(r) if !r.is_empty() => {
                    let r = r.into_iter().next().unwrap_or_default();
                    println!(
                        "  {contender:<14} {:>7.1}µs {:>6.1}µs {:>7.2}µs {:>8.2}µs {:>8.2}µs {:>9.2}ms {:>7.2}µs {:>6.0} B {:>7.0} B {:>7.1}",
                        field(&r, "codegen_us"),
                        field(&r, "emit_us"),
                        field(&r, "link_us"),
                        field(&r, "first_tenth_us"),
                        field(&r, "last_tenth_us"),
                        field(&r, "lookup_all_ms"),
                        field(&r, "remove_us"),
                        field(&r, "rss_per_module_b"),
                        field(&r, "heap_per_module_b"),
                        field(&r, "allocations_per_link"),
                    );
                    rows.push((contender, r));
                }
                Ok(_) => println!("  {contender:<14} printed no result"),
                Err(e) => println!("  {contender:<14} failed: {e}"),
            }
        }
        let kiln = rows.iter().find(|(c, _)| *c == "kiln").map(|(_, r)| r);
        let jit = rows
            .iter()
            .find(|(c, _)| *c == "cranelift-jit")
            .map(|(_, r)| r);
        if let Some(k) = kiln {
            let flat = field(k, "last_tenth_us") / field(k, "first_tenth_us");
            let allocs = field(k, "allocations_per_link");
            let rss = field(k, "rss_per_module_b");
            println!(
                "  kiln: flat (last 10% / first 10% link time) {flat:.2}, target <= 1.2: {}",
                verdict(flat <= 1.2)
            );
            println!(
                "  kiln: heap allocations per link {allocs:.1}, target <= 5: {}",
                verdict(allocs <= 5.0)
            );
            println!(
                "  kiln: resident per module {rss:.0} B (heap {:.0} B, Kiln's memory {:.0} B), target <= 512 B: {}",
                field(k, "heap_per_module_b"),
                field(k, "kiln_bytes_per_module_b"),
                verdict(rss <= 512.0)
            );
            if let Some(j) = jit {
                let link = field(k, "link_us") / field(j, "link_us");
                let lookup = field(k, "lookup_all_ms") / field(j, "lookup_all_ms");
                println!(
                    "  kiln / cranelift-jit: link {link:.2}x, target <= 0.5: {}; lookup of all N one at a time {lookup:.2}x, target <= 1: {}; RSS per module {:.2}x",
                    verdict(link <= 0.5),
                    verdict(lookup <= 1.0),
                    rss / field(j, "rss_per_module_b"),
                );
            }
        }
        let threads = |t: &str| {
            run_child(&[
                "--contender".into(),
                t.into(),
                "--modules".into(),
                n.to_string(),
            ])
            .ok()
            .and_then(|r| r.into_iter().next())
            .map(|r| field(&r, "link_total_s"))
        };
        if let (Some(one), Some(two)) = (threads("kiln1"), threads("kiln2")) {
            let ratio = one / two;
            println!(
                "  kiln, two threads into two libraries: {ratio:.2}x the link throughput of one ({:.2} ms vs {:.2} ms), target >= 1.8: {}",
                two * 1e3,
                one * 1e3,
                verdict(ratio >= 1.8)
            );
        }
        if let (Some(one), Some(two)) = (threads("compile1"), threads("compile2")) {
            println!(
                "  this machine's ceiling: two threads compiling with Cranelift, sharing nothing, {:.2}x the throughput of one",
                one / two
            );
        }
        println!();
    }
    if args.churn > 0 {
        let n = args.churn;
        match run_child(&[
            "--contender".into(),
            "churn".into(),
            "--modules".into(),
            n.to_string(),
        ]) {
            Ok(r) if !r.is_empty() => {
                let r = &r[0];
                let heap = field(r, "heap_last_kib") - field(r, "heap_first_kib");
                let rss = field(r, "rss_last_kib") - field(r, "rss_first_kib");
                let (mapped, resident) = (field(r, "mapped_kib"), field(r, "resident_kib"));
                println!(
                    "churn: {n} cycles of compile, link, call, remove (a runtime module kept)"
                );
                println!(
                    "  heap from the first tenth to the end: {heap:+.0} KiB ({:.1} B per cycle), RSS {rss:+.0} KiB; flat (< 8 B per cycle): {}",
                    heap * 1024.0 / (n as f64 * 0.9),
                    verdict(heap * 1024.0 / (n as f64 * 0.9) < 8.0)
                );
                println!(
                    "  after the last removal: mapped {mapped:.0} KiB, resident {resident:.0} KiB; resident <= mapped: {}",
                    verdict(resident <= mapped)
                );
            }
            Ok(_) => println!("churn: printed no result"),
            Err(e) => println!("churn: failed: {e}"),
        }
    }
}
