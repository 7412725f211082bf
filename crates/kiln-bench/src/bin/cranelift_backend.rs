//! Figures of "Cranelift's first alternative JIT backend", side by side in one run:
//! `kiln_cranelift::KilnModule` against `cranelift_jit::JITModule` 0.135, both driven
//! through `cranelift_module::Module` as a Cranelift user drives them, on the workload of
//! `kiln_bench::cranelift_workload` (the same functions, the same compiler flags).
//!
//! - **one function per module**: N times compile `f_i`, `define_function_bytes`,
//!   `finalize_definitions`, `get_finalized_function` (a JIT's compile-between-links);
//! - **a batch**: B functions defined, then one `finalize_definitions` and B lookups.
//!
//! "Link" is the linker's part — all of `define_function` but Cranelift's own
//! `Context::compile` (the code is compiled first, then handed over with
//! `define_function_bytes`), plus `finalize_definitions` and `get_finalized_function`;
//! "whole" adds the compile. Each contender runs in a child process of its own (memory
//! figures do not mix), the two alternating round after round; medians are printed with
//! their ratios. Every function is called and checked before anything is freed.

use clap::Parser;
use cranelift_frontend::FunctionBuilderContext;
use cranelift_module::{default_libcall_names, FuncId, Module};
use kiln_bench::cranelift_workload::{compile, define_shared, expected, isa, kiln_bench_host};
use kiln_bench::{field, run_child, verdict, CountingAllocator, ProcessMemory};
use std::time::{Duration, Instant};

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator;

#[derive(Parser, Debug)]
struct Args {
    /// One-function-module counts to measure.
    #[arg(long, value_delimiter = ',', default_value = "10000,100000")]
    modules: Vec<usize>,
    /// Functions of the one-finalize batch (0: not run).
    #[arg(long, default_value_t = 1000)]
    batch: usize,
    /// Rounds (each runs both contenders, alternating which goes first).
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Run one contender (internal: the child process): kiln or jit.
    #[arg(long)]
    contender: Option<String>,
    /// The child's workload (internal): single or batch.
    #[arg(long, default_value = "single")]
    mode: String,
}

fn result(pairs: &[(&str, f64)]) {
    let fields: Vec<String> = pairs.iter().map(|(k, v)| format!("{k}={v}")).collect();
    println!("RESULT {}", fields.join(" "));
}

fn mean_us(d: &[Duration]) -> f64 {
    d.iter().map(Duration::as_secs_f64).sum::<f64>() * 1e6 / d.len().max(1) as f64
}

/// What both contenders are asked to do, behind one trait: the figures are of the same
/// calls.
trait Contender: Module {
    fn finalize(&mut self);
    fn address(&self, id: FuncId) -> *const u8;
    /// Frees everything, one function at a time where the contender can.
    fn free_all(self, ids: &[FuncId]);
}

impl Contender for kiln_cranelift::KilnModule {
    fn finalize(&mut self) {
        self.finalize_definitions().expect("finalize");
    }
    fn address(&self, id: FuncId) -> *const u8 {
        self.get_finalized_function(id)
    }
    fn free_all(mut self, ids: &[FuncId]) {
        // Newest first: f_i calls f_{i-1}, which cannot go before it.
        for &id in ids.iter().rev() {
            self.free_function(id).expect("free");
        }
        let stats = self.session().memory_stats();
        result(&[
            ("kiln_mapped_freed_kib", stats.bytes_mapped as f64 / 1024.0),
            (
                "kiln_resident_freed_kib",
                stats.bytes_resident.unwrap_or(0) as f64 / 1024.0,
            ),
            ("kiln_live_allocations_freed", stats.live_allocations as f64),
        ]);
        // SAFETY: nothing of the module runs or is called after this.
        unsafe { self.free_memory() };
    }
}

impl Contender for cranelift_jit::JITModule {
    fn finalize(&mut self) {
        self.finalize_definitions().expect("finalize");
    }
    fn address(&self, id: FuncId) -> *const u8 {
        self.get_finalized_function(id)
    }
    fn free_all(self, _: &[FuncId]) {
        // SAFETY: nothing of the module runs or is called after this.
        unsafe { self.free_memory() };
    }
}

fn kiln_module() -> kiln_cranelift::KilnModule {
    let mut builder = kiln_cranelift::KilnBuilder::with_isa(isa(false), default_libcall_names());
    builder.symbol("kiln_bench_host", kiln_bench_host as *const u8);
    kiln_cranelift::KilnModule::new(builder)
}

fn jit_module() -> cranelift_jit::JITModule {
    let mut builder = cranelift_jit::JITBuilder::with_isa(isa(false), default_libcall_names());
    builder.symbol("kiln_bench_host", kiln_bench_host as *const u8);
    cranelift_jit::JITModule::new(builder)
}

fn check_all<M: Contender>(module: &M, ids: &[FuncId]) {
    for (i, &id) in ids.iter().enumerate() {
        // SAFETY: f_i is `i64 f(i64)`, finalized, the module alive.
        let f: extern "C" fn(i64) -> i64 = unsafe { std::mem::transmute(module.address(id)) };
        assert_eq!(f(-5), expected(i, -5), "f_{i}");
    }
}

/// One function per module, `n` times.
fn run_single<M: Contender>(mut module: M, n: usize) {
    define_shared(&mut module);
    module.finalize();
    let mut fbc = FunctionBuilderContext::new();
    let mut ctx = cranelift_codegen::Context::new();
    let before = ProcessMemory::now();
    let heap_before = CountingAllocator::live_bytes();
    let mut codegen = Duration::ZERO;
    let mut links = Vec::with_capacity(n);
    let mut ids = Vec::with_capacity(n);
    let mut allocations = 0;
    for i in 0..n {
        let t = Instant::now();
        let (id, align, code, relocs) = compile(&mut module, i, &mut fbc, &mut ctx);
        codegen += t.elapsed();
        let a = CountingAllocator::allocations();
        let t = Instant::now();
        module
            .define_function_bytes(id, align, &code, &relocs)
            .expect("define");
        module.finalize();
        let _ = module.address(id);
        links.push(t.elapsed());
        allocations += CountingAllocator::allocations() - a;
        ids.push(id);
    }
    let after = ProcessMemory::now();
    let heap_after = CountingAllocator::live_bytes();
    check_all(&module, &ids);
    let t = Instant::now();
    module.free_all(&ids);
    let free = t.elapsed();
    let freed = ProcessMemory::now();
    // What the C library keeps of the freed heap, told apart from what Kiln keeps.
    // SAFETY: malloc_trim only returns free heap pages to the system.
    unsafe { libc::malloc_trim(0) };
    let trimmed = ProcessMemory::now();
    let tenth = (n / 10).max(1);
    let link_us = mean_us(&links);
    result(&[
        ("n", n as f64),
        ("codegen_us", codegen.as_secs_f64() * 1e6 / n as f64),
        ("link_us", link_us),
        ("first_tenth_us", mean_us(&links[..tenth])),
        ("last_tenth_us", mean_us(&links[n - tenth..])),
        (
            "rss_per_fn_b",
            after.rss.saturating_sub(before.rss) as f64 / n as f64,
        ),
        (
            "heap_per_fn_b",
            (heap_after - heap_before) as f64 / n as f64,
        ),
        ("allocs_per_finalize", allocations as f64 / n as f64),
        ("free_us", free.as_secs_f64() * 1e6 / n as f64),
        ("rss_before_kib", before.rss as f64 / 1024.0),
        ("rss_full_kib", after.rss as f64 / 1024.0),
        ("rss_freed_kib", freed.rss as f64 / 1024.0),
        ("rss_trimmed_kib", trimmed.rss as f64 / 1024.0),
        ("maps_before", before.mappings as f64),
        ("maps_full", after.mappings as f64),
        ("maps_freed", freed.mappings as f64),
    ]);
}

/// `n` functions defined, then one finalize.
fn run_batch<M: Contender>(mut module: M, n: usize) {
    define_shared(&mut module);
    module.finalize();
    let mut fbc = FunctionBuilderContext::new();
    let mut ctx = cranelift_codegen::Context::new();
    let mut codegen = Duration::ZERO;
    let mut link = Duration::ZERO;
    let mut ids = Vec::with_capacity(n);
    for i in 0..n {
        let t = Instant::now();
        let (id, align, code, relocs) = compile(&mut module, i, &mut fbc, &mut ctx);
        codegen += t.elapsed();
        let t = Instant::now();
        module
            .define_function_bytes(id, align, &code, &relocs)
            .expect("define");
        link += t.elapsed();
        ids.push(id);
    }
    let defines = link;
    let t = Instant::now();
    module.finalize();
    let finalize = t.elapsed();
    for &id in &ids {
        let _ = module.address(id);
    }
    link += t.elapsed();
    check_all(&module, &ids);
    module.free_all(&ids);
    result(&[
        ("n", n as f64),
        ("codegen_us", codegen.as_secs_f64() * 1e6 / n as f64),
        ("link_us", link.as_secs_f64() * 1e6 / n as f64),
        ("define_us", defines.as_secs_f64() * 1e6 / n as f64),
        ("finalize_us", finalize.as_secs_f64() * 1e6 / n as f64),
    ]);
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

/// Runs both contenders `rounds` times, alternating, and returns each one's results.
fn rounds(mode: &str, n: usize, rounds: usize) -> [Vec<Vec<(String, String)>>; 2] {
    let mut runs: [Vec<Vec<(String, String)>>; 2] = [Vec::new(), Vec::new()];
    for round in 0..rounds {
        let order = if round % 2 == 0 { [0, 1] } else { [1, 0] };
        for c in order {
            let name = ["kiln", "jit"][c];
            match run_child(&[
                "--contender".into(),
                name.into(),
                "--mode".into(),
                mode.into(),
                "--modules".into(),
                n.to_string(),
            ]) {
                // A child's RESULT lines make one row.
                Ok(r) if !r.is_empty() => runs[c].push(r.into_iter().flatten().collect()),
                Ok(_) => println!("  {name}: printed no result"),
                Err(e) => println!("  {name}: failed: {e}"),
            }
        }
    }
    runs
}

fn med(runs: &[Vec<(String, String)>], key: &str) -> f64 {
    median(runs.iter().map(|r| field(r, key)).collect())
}

fn main() {
    let args = Args::parse();
    if let Some(contender) = &args.contender {
        let n = args.modules[0];
        match (contender.as_str(), args.mode.as_str()) {
            ("kiln", "single") => run_single(kiln_module(), n),
            ("jit", "single") => run_single(jit_module(), n),
            ("kiln", "batch") => run_batch(kiln_module(), n),
            ("jit", "batch") => run_batch(jit_module(), n),
            other => panic!("unknown contender {other:?}"),
        }
        return;
    }
    println!("KilnModule (kiln-cranelift) against JITModule (cranelift-jit 0.135), Cranelift 0.135 code,");
    println!(
        "medians of {} interleaved rounds, each contender in its own process; per function",
        args.rounds
    );
    for &n in &args.modules {
        let [kiln, jit] = rounds("single", n, args.rounds);
        if kiln.is_empty() || jit.is_empty() {
            continue;
        }
        println!("\none function per module, N = {n}");
        println!(
            "  {:<11} {:>9} {:>9} {:>9} {:>10} {:>9} {:>9} {:>8} {:>8}",
            "contender",
            "compile",
            "link",
            "whole",
            "last/first",
            "RSS/fn",
            "heap/fn",
            "allocs",
            "free"
        );
        for (name, runs) in [("KilnModule", &kiln), ("JITModule", &jit)] {
            let whole = med(runs, "codegen_us") + med(runs, "link_us");
            println!(
                "  {name:<11} {:>7.2}µs {:>7.2}µs {:>7.2}µs {:>10.2} {:>7.0} B {:>7.0} B {:>8.1} {:>6.2}µs",
                med(runs, "codegen_us"),
                med(runs, "link_us"),
                whole,
                med(runs, "last_tenth_us") / med(runs, "first_tenth_us"),
                med(runs, "rss_per_fn_b"),
                med(runs, "heap_per_fn_b"),
                med(runs, "allocs_per_finalize"),
                med(runs, "free_us"),
            );
        }
        let link = med(&kiln, "link_us") / med(&jit, "link_us");
        let whole = (med(&kiln, "codegen_us") + med(&kiln, "link_us"))
            / (med(&jit, "codegen_us") + med(&jit, "link_us"));
        let flat = med(&kiln, "last_tenth_us") / med(&kiln, "first_tenth_us");
        let rss = med(&kiln, "rss_per_fn_b") / med(&jit, "rss_per_fn_b");
        let allocs = med(&kiln, "allocs_per_finalize");
        let (before, freed) = (med(&kiln, "rss_before_kib"), med(&kiln, "rss_freed_kib"));
        let back = freed / before;
        println!(
            "  link: KilnModule / JITModule {link:.2}x, target <= 0.5 (aim 0.3): {}",
            verdict(link <= 0.5)
        );
        println!(
            "  whole (compile included): {whole:.2}x, target <= 1: {}",
            verdict(whole <= 1.0)
        );
        println!(
            "  KilnModule flat in N (last 10% / first 10%): {flat:.2}, target <= 1.2: {}",
            verdict(flat <= 1.2)
        );
        println!(
            "  resident per function: {rss:.2}x JITModule's, target <= 0.2: {}",
            verdict(rss <= 0.2)
        );
        println!(
            "  after freeing all: resident {freed:.0} KiB vs {before:.0} KiB before ({back:.2}x), target <= 1.1: {}; mappings {:.0} before, {:.0} full, {:.0} freed",
            verdict(back <= 1.1),
            med(&kiln, "maps_before"),
            med(&kiln, "maps_full"),
            med(&kiln, "maps_freed"),
        );
        println!(
            "    of which the C library's freed heap: {:.0} KiB after malloc_trim (JITModule: {:.0} KiB freed, {:.0} KiB trimmed, from {:.0} KiB); Kiln's own memory with every function freed: {:.0} KiB mapped, {:.0} KiB resident, {:.0} live allocations",
            med(&kiln, "rss_trimmed_kib"),
            med(&jit, "rss_freed_kib"),
            med(&jit, "rss_trimmed_kib"),
            med(&jit, "rss_before_kib"),
            med(&kiln, "kiln_mapped_freed_kib"),
            med(&kiln, "kiln_resident_freed_kib"),
            med(&kiln, "kiln_live_allocations_freed"),
        );
        println!(
            "  heap allocations per one-function finalize: {allocs:.1} (JITModule {:.1}), target <= 5: {}",
            med(&jit, "allocs_per_finalize"),
            verdict(allocs <= 5.0)
        );
    }
    if args.batch > 0 {
        let [kiln, jit] = rounds("batch", args.batch, args.rounds);
        if !kiln.is_empty() && !jit.is_empty() {
            let link = med(&kiln, "link_us") / med(&jit, "link_us");
            println!("\n{} functions, one finalize_definitions", args.batch);
            println!(
                "  link per function: KilnModule {:.2}µs, JITModule {:.2}µs: {link:.2}x, target <= 0.5: {}",
                med(&kiln, "link_us"),
                med(&jit, "link_us"),
                verdict(link <= 0.5)
            );
            for (name, runs) in [("KilnModule", &kiln), ("JITModule", &jit)] {
                println!(
                    "    {name}: define_function_bytes {:.2}µs, finalize_definitions {:.2}µs, the rest (lookups) per function",
                    med(runs, "define_us"),
                    med(runs, "finalize_us"),
                );
            }
        }
    }
}
