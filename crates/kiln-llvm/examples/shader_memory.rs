//! The shader-pattern figure, side by side in one run, each contender in a child process:
//! N small modules (~10.9 KB code, 1 KB constants, 64 B data) compiled with MCJIT,
//! - `a`: one engine per module kept alive, LLVM's default memory manager (today's pattern);
//! - `b`: engines (and contexts) destroyed, code kept in one shared LLVM SectionMemoryManager
//!   (through the C++ shim);
//! - `c`: engines (and contexts) destroyed, code kept by Kiln;
//! - `r`: as `c`, but each module's code freed at once: what compiling leaves behind in the
//!   process (LLVM's and the C heap's residue), to tell it apart from the code's memory.
//!
//! Reports resident bytes (PSS and RSS) and address space per module, and time per module.
//!
//! `cargo run --release -p kiln-llvm --features llvm --example shader_memory -- [--modules N]`

use kiln_llvm::{compile_with_default_memory, ir, KilnMcjit, SharedSectionMemoryManager};
use kiln_memory::SlabMemoryManager;
use llvm_sys::core::{LLVMContextCreate, LLVMContextDispose};
use std::process::Command;
use std::time::Instant;

const ROUNDS: u32 = 395;
/// Code generation level for every contender (0: fast instruction selection; the
/// memory figures do not depend on it, compile time does).
const OPT: u32 = 0;

fn kib(text: &str, field: &str) -> f64 {
    text.lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse::<f64>().ok())
        .unwrap_or(0.0)
}

fn memory() -> (f64, f64, f64) {
    let rollup = std::fs::read_to_string("/proc/self/smaps_rollup").unwrap_or_default();
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    (
        kib(&rollup, "Pss:"),
        kib(&rollup, "Rss:"),
        kib(&status, "VmSize:"),
    )
}

fn check(index: u32, address: u64) {
    // SAFETY: `i32 shader_<index>(i32)` just compiled, still owned.
    let f: extern "C" fn(i32) -> i32 = unsafe { std::mem::transmute(address as usize) };
    assert_eq!(f(5), ir::expected(index, ROUNDS, 5));
}

fn run(kind: &str, n: u32) {
    kiln_llvm::initialize_llvm();
    // Warm LLVM up (first-use allocations) before measuring.
    // SAFETY: a throwaway context and module.
    unsafe {
        let ctx = LLVMContextCreate();
        let engine =
            compile_with_default_memory(ir::shader_module(ctx, 999_999, ROUNDS), OPT).unwrap();
        let _ = engine.function_address("shader_999999");
        drop(engine);
        LLVMContextDispose(ctx);
    }
    let before = memory();
    let start = Instant::now();
    let mut keep_engines = Vec::new();
    let mut keep_codes = Vec::new();
    let shared = SharedSectionMemoryManager::new();
    let kiln = KilnMcjit::new(SlabMemoryManager::new().unwrap()).with_opt_level(OPT);
    let mm_before = kiln_llvm::memory_manager_nanos();
    for i in 0..n {
        // SAFETY: fresh context and module per shader, disposed in order unless kept.
        unsafe {
            let ctx = LLVMContextCreate();
            let module = ir::shader_module(ctx, i, ROUNDS);
            let name = format!("shader_{i}");
            match kind {
                "a" => {
                    let engine = compile_with_default_memory(module, OPT).unwrap();
                    check(i, engine.function_address(&name).unwrap());
                    keep_engines.push((engine, ctx));
                }
                "b" => {
                    let engine = shared.compile(module, OPT).unwrap();
                    check(i, engine.function_address(&name).unwrap());
                    drop(engine);
                    LLVMContextDispose(ctx);
                }
                _ => {
                    let (engine, code) = kiln.compile(module).unwrap();
                    check(i, engine.function_address(&name).unwrap());
                    drop(engine);
                    LLVMContextDispose(ctx);
                    if kind == "c" {
                        keep_codes.push(code);
                    }
                }
            }
        }
    }
    let elapsed = start.elapsed();
    // Give the C heap's free pages back (LLVM's transient allocations), for every
    // contender alike, so that what remains is what the process keeps.
    // SAFETY: malloc_trim has no preconditions.
    unsafe { libc::malloc_trim(0) };
    let after = memory();
    let n = f64::from(n);
    let mm = (kiln_llvm::memory_manager_nanos() - mm_before) as f64 / n;
    let stats = kiln_memory::MemoryManager::stats(kiln.manager());
    println!(
        "RESULT kind={kind} kiln_code_kib={:.2} pss_kib={:.2} rss_kib={:.2} vsz_kib={:.2} us_per_module={:.1} kiln_mm_ns={:.0}",
        stats.bytes_resident.unwrap_or(0) as f64 / 1024.0 / n,
        (after.0 - before.0) / n,
        (after.1 - before.1) / n,
        (after.2 - before.2) / n,
        elapsed.as_secs_f64() * 1e6 / n,
        mm
    );
    std::mem::forget(keep_engines);
    std::mem::forget(keep_codes);
    std::mem::forget(shared);
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let get = |flag: &str| {
        args.iter()
            .position(|a| a == flag)
            .and_then(|i| args.get(i + 1))
            .cloned()
    };
    let n: u32 = get("--modules")
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000);
    if let Some(kind) = get("--only") {
        run(&kind, n);
        return;
    }
    let exe = std::env::current_exe().unwrap();
    println!("shader pattern, {n} modules (~10.9 KB code, 1 KB constants, 64 B data each), MCJIT / LLVM 14\n");
    println!(
        "{:<44} {:>11} {:>11} {:>12} {:>12} {:>10} {:>12}",
        "contender",
        "PSS KB/mod",
        "RSS KB/mod",
        "addr KB/mod",
        "us/mod",
        "MM ns/mod",
        "Kiln KB/mod"
    );
    let mut results = Vec::new();
    for (kind, label) in [
        ("c", "(c) Kiln, engines destroyed"),
        ("b", "(b) shared SectionMemoryManager, destroyed"),
        ("a", "(a) one engine per module, kept"),
        ("r", "(r) Kiln, code freed: compile residue"),
    ] {
        let out = Command::new(&exe)
            .args(["--only", kind, "--modules", &n.to_string()])
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        let Some(line) = text
            .lines()
            .find(|l| l.starts_with("RESULT"))
            .map(str::to_string)
        else {
            println!(
                "{label:<44} failed: {}",
                String::from_utf8_lossy(&out.stderr)
                    .lines()
                    .last()
                    .unwrap_or("")
            );
            continue;
        };
        let field = |k: &str| -> f64 {
            line.split_whitespace()
                .find_map(|kv| kv.strip_prefix(&format!("{k}=")))
                .and_then(|v| v.parse().ok())
                .unwrap_or(f64::NAN)
        };
        let kiln_kb = if kind == "c" {
            format!("{:.2}", field("kiln_code_kib"))
        } else {
            "-".into()
        };
        let mm = if kind == "c" {
            format!("{:.0}", field("kiln_mm_ns"))
        } else {
            "-".into()
        };
        println!(
            "{label:<44} {:>11.2} {:>11.2} {:>12.2} {:>12.1} {:>10} {:>12}",
            field("pss_kib"),
            field("rss_kib"),
            field("vsz_kib"),
            field("us_per_module"),
            mm,
            kiln_kb
        );
        results.push((kind, field("pss_kib")));
    }
    let get = |k: &str| {
        results
            .iter()
            .find(|(kind, _)| *kind == k)
            .map_or(f64::NAN, |r| r.1)
    };
    let residue = get("r");
    println!("\nresident per module with the compile residue (r) subtracted:");
    for (k, label) in [
        ("c", "(c) Kiln"),
        ("b", "(b) shared SectionMemoryManager"),
        ("a", "(a) engine per module"),
    ] {
        println!(
            "  {label:<34} {:>9.2} KB  ({:.1}x Kiln's)",
            get(k) - residue,
            (get(k) - residue) / (get("c") - residue)
        );
    }
    println!("\ntarget: (c) <= 12.5 KB per module, ~90x below (a), below every LLVM configuration");
}
