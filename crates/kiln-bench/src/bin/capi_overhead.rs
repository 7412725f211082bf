//! Figures of the C API:
//! 1. the C layer's cost on a link. SQLite (sqlite_driver.o + Debian's libsqlite3.a)
//!    linked in process with no code run, each link in a fresh session, through the C API
//!    (kiln-capi's examples/link_bench.c, built against the release library installed by
//!    scripts/install_capi.sh) and through the Rust API in this process, the two
//!    alternating in batches; the median of each and their ratio.
//! 2. LLVM-C's users (a database's query JIT): kiln-capi's examples/llvm_queries.c emits
//!    each query module to an ELF object in memory with LLVM 16's target machine, then
//!    links + looks it up with Kiln's C API or with LLVM's LLJIT through LLVM-C; modules
//!    kept (link + lookup per module, resident bytes per module) and a cycle of modules
//!    linked, called and removed in turn (resource trackers on the LLJIT side). The two
//!    run alternately, `--llvm-rounds` processes each; medians and ratios.

use clap::Parser;
use kiln::Input;
use kiln_bench::sh;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

#[derive(Parser, Debug)]
struct Args {
    /// Links per batch.
    #[arg(long, default_value_t = 15)]
    rounds: usize,
    /// Batches of each (alternating C, Rust).
    #[arg(long, default_value_t = 4)]
    batches: usize,
    /// Scratch directory.
    #[arg(long, default_value = "/tmp/kiln-capi-bench")]
    dir: PathBuf,
    /// Query modules per process for figure 2 (kept, then as many cycled).
    #[arg(long, default_value_t = 10_000)]
    queries: usize,
    /// Processes of each linker for figure 2 (alternating).
    #[arg(long, default_value_t = 3)]
    llvm_rounds: usize,
}

/// One `llvm_queries` run's figures: link + lookup µs per module, resident KB per kept
/// module, KB grown over the last nine tenths of the remove cycle.
fn llvm_queries(binary: &Path, mode: &str, queries: usize) -> (f64, f64, f64) {
    let out = Command::new(binary)
        .args([mode, &queries.to_string()])
        .output()
        .expect("llvm_queries");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "llvm_queries {mode}: {text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let line = text
        .lines()
        .find_map(|l| l.strip_prefix("RESULT "))
        .expect("RESULT line");
    let field = |key: &str| -> f64 {
        line.split_whitespace()
            .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('='))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no {key} in {line}"))
    };
    (
        field("link_lookup_us"),
        field("resident_kb"),
        field("cycle_growth_kb"),
    )
}

fn median_f(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Figure 2 (see the module documentation).
fn llvm_figure(root: &Path, dir: &Path, prefix: &Path, queries: usize, rounds: usize) {
    let llvm_config = "/usr/lib/llvm-16/bin/llvm-config";
    let binary = dir.join("llvm_queries");
    sh(&format!(
        "cc -std=c11 -O2 $({llvm_config} --cflags) {}/crates/kiln-capi/examples/llvm_queries.c \
         -o {} $(PKG_CONFIG_PATH={p}/lib/pkgconfig pkg-config --cflags --libs kiln) \
         $({llvm_config} --ldflags) -lLLVM-16",
        root.display(),
        binary.display(),
        p = prefix.display()
    ));
    let (mut kiln, mut lljit) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        kiln.push(llvm_queries(&binary, "kiln", queries));
        lljit.push(llvm_queries(&binary, "lljit", queries));
    }
    let pick = |runs: &[(f64, f64, f64)], i: usize| {
        median_f(runs.iter().map(|r| [r.0, r.1, r.2][i]).collect::<Vec<_>>())
    };
    let (k_link, k_resident, k_growth) = (pick(&kiln, 0), pick(&kiln, 1), pick(&kiln, 2));
    let (l_link, l_resident, l_growth) = (pick(&lljit, 0), pick(&lljit, 1), pick(&lljit, 2));
    let cycled = queries - queries / 10;
    println!(
        "\nLLVM-C query modules (LLVM 16 target machine, objects in memory), {queries} kept then {queries} cycled, median of {rounds} processes each:"
    );
    println!(
        "  link + lookup per module: Kiln {k_link:.2} µs, LLJIT {l_link:.2} µs: {:.3}x (target <= 0.15: {})",
        k_link / l_link,
        kiln_bench::verdict(k_link / l_link <= 0.15)
    );
    println!(
        "  resident per kept module: Kiln {k_resident:.2} KB, LLJIT {l_resident:.2} KB: {:.3}x (target <= 0.1: {})",
        k_resident / l_resident,
        kiln_bench::verdict(k_resident / l_resident <= 0.1)
    );
    // Flat: less than 64 bytes a cycled module (a leak of the module would be its code,
    // its symbols and its eh_frame: hundreds of bytes each).
    let (k_each, l_each) = (
        k_growth * 1000.0 / cycled as f64,
        l_growth * 1000.0 / cycled as f64,
    );
    println!(
        "  remove cycle, resident growth over the last {cycled}: Kiln {k_growth:.1} KB ({k_each:.1} B a module: {}), LLJIT {l_growth:.1} KB ({l_each:.1} B a module: {})",
        if k_each < 64.0 { "flat: met" } else { "grows: MISSED" },
        if l_each < 64.0 { "flat" } else { "grows" }
    );
}

fn rust_link(driver: &[u8], archive: &std::sync::Arc<[u8]>) -> Duration {
    let jit = kiln::Jit::builder().noexec(true).build().expect("session");
    let lib = jit.main_library();
    jit.library(lib)
        .add(Input::object("sqlite_driver.o", driver.to_vec()))
        .expect("driver");
    jit.library(lib)
        .add(Input::archive("libsqlite3.a", archive.to_vec()))
        .expect("archive");
    jit.library(lib)
        .add(Input::library_by_name("m", &[]))
        .expect("libm");
    jit.library(lib)
        .add(Input::ProcessSymbols)
        .expect("process symbols");
    let t = Instant::now();
    jit.link_pending(lib).expect("link");
    t.elapsed()
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn main() {
    let args = Args::parse();
    let dir = &args.dir;
    std::fs::create_dir_all(dir).unwrap();
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let prefix = dir.join("prefix");
    // The C library of this build's profile (the directory this binary is in: release,
    // or the test command's smoke), not another optimized build of it.
    let profile = std::env::current_exe()
        .ok()
        .and_then(|e| Some(e.parent()?.file_name()?.to_string_lossy().into_owned()))
        .unwrap_or_else(|| "release".into());
    sh(&format!(
        "bash {}/scripts/install_capi.sh {} --profile {profile} >/dev/null",
        root.display(),
        prefix.display()
    ));
    sh(&format!(
        "cc -O2 -c {}/tests/programs/sqlite_driver.c -o {}/sqlite_driver.o",
        root.display(),
        dir.display()
    ));
    sh(&format!(
        "cc -O2 {}/crates/kiln-capi/examples/link_bench.c -o {d}/link_bench \
         $(PKG_CONFIG_PATH={p}/lib/pkgconfig pkg-config --cflags --libs kiln)",
        root.display(),
        d = dir.display(),
        p = prefix.display()
    ));
    let driver = std::fs::read(dir.join("sqlite_driver.o")).unwrap();
    let archive_path = "/usr/lib/x86_64-linux-gnu/libsqlite3.a";
    let archive: std::sync::Arc<[u8]> = std::fs::read(archive_path).unwrap().into();
    rust_link(&driver, &archive); // warm-up
    let mut c_times = Vec::new();
    let mut rust_times = Vec::new();
    for _ in 0..args.batches {
        let out = Command::new(dir.join("link_bench"))
            .arg(dir.join("sqlite_driver.o"))
            .arg(archive_path)
            .arg(args.rounds.to_string())
            .output()
            .expect("link_bench");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let text = String::from_utf8_lossy(&out.stdout);
        // The first link of a process pays one-time costs (both sides skip it).
        c_times.extend(
            text.lines()
                .skip(1)
                .filter_map(|l| l.trim().parse::<u64>().ok())
                .map(Duration::from_nanos),
        );
        for _ in 0..args.rounds {
            rust_times.push(rust_link(&driver, &archive));
        }
    }
    let (c, rust) = (median(c_times), median(rust_times));
    println!(
        "SQLite link in process, median of {} links each: C API {:.3} ms, Rust API {:.3} ms: {:.3}x (target <= 1.02: {})",
        args.rounds * args.batches,
        c.as_secs_f64() * 1e3,
        rust.as_secs_f64() * 1e3,
        c.as_secs_f64() / rust.as_secs_f64(),
        kiln_bench::verdict(c.as_secs_f64() / rust.as_secs_f64() <= 1.02)
    );
    llvm_figure(&root, dir, &prefix, args.queries, args.llvm_rounds);
}
