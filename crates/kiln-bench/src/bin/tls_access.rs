//! Figure of the runtime-fidelity issue: the cost of a thread-local access in JIT code.
//!
//! A loop calls a non-inlined function that increments a `__thread` counter `--iterations`
//! times. Three contenders run the same source side by side in one run: the natively
//! linked program (`-fPIE`: local-exec, `%fs`-relative), Kiln with the same `-fPIE`
//! object (its block in static TLS: the same instructions), and Kiln with a `-fPIC`
//! object (general dynamic: a call to Kiln's `__tls_get_addr` per access). Each is a
//! whole process (Kiln's include its link, a few milliseconds); the best of `--runs` is
//! reported with its ratio to native.

use clap::Parser;
use kiln_bench::sh;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

#[derive(Parser, Debug)]
struct Args {
    /// Accesses per run.
    #[arg(long, default_value_t = 100_000_000)]
    iterations: u64,
    /// Runs per contender (the best is reported).
    #[arg(long, default_value_t = 5)]
    runs: usize,
    /// The kiln binary (default: next to this one).
    #[arg(long)]
    kiln: Option<PathBuf>,
    /// Scratch directory.
    #[arg(long, default_value = "/tmp/kiln-tls-bench")]
    dir: PathBuf,
}

const SOURCE: &str = r#"
#include <stdio.h>
#include <stdlib.h>
__thread long counter;
__attribute__((noinline)) void bump(long i) { counter += i & 3; }
int main(int argc, char **argv) {
    long n = argc > 1 ? atol(argv[1]) : 1000;
    for (long i = 0; i < n; i++) bump(i);
    printf("%ld\n", counter);
    return 0;
}
"#;

fn main() {
    let args = Args::parse();
    let kiln = args
        .kiln
        .clone()
        .unwrap_or_else(|| std::env::current_exe().unwrap().with_file_name("kiln"));
    assert!(
        kiln.exists(),
        "{} not found: build it with cargo build --release -p kiln-cli",
        kiln.display()
    );
    std::fs::create_dir_all(&args.dir).unwrap();
    let d = args.dir.display();
    std::fs::write(args.dir.join("tls_loop.c"), SOURCE).unwrap();
    sh(&format!(
        "cc -O2 -fPIE -c {d}/tls_loop.c -o {d}/tls_loop_pie.o"
    ));
    sh(&format!(
        "cc -O2 -fPIC -c {d}/tls_loop.c -o {d}/tls_loop_pic.o"
    ));
    sh(&format!(
        "cc -O2 -pie {d}/tls_loop_pie.o -o {d}/tls_loop_native"
    ));
    let n = args.iterations.to_string();
    let contenders: Vec<(&str, Vec<String>)> = vec![
        (
            "native -fPIE (local-exec)",
            vec![format!("{d}/tls_loop_native"), n.clone()],
        ),
        (
            "kiln -fPIE (static TLS)",
            vec![
                kiln.display().to_string(),
                "run".into(),
                format!("{d}/tls_loop_pie.o"),
                "--".into(),
                n.clone(),
            ],
        ),
        (
            "kiln -fPIC (general dynamic)",
            vec![
                kiln.display().to_string(),
                "run".into(),
                format!("{d}/tls_loop_pic.o"),
                "--".into(),
                n.clone(),
            ],
        ),
    ];
    let expected = (0..args.iterations).map(|i| i & 3).sum::<u64>().to_string();
    let mut best = vec![Duration::MAX; contenders.len()];
    // Interleaved: each round runs every contender once, so drift hits all alike.
    for _ in 0..args.runs {
        for (i, (name, cmd)) in contenders.iter().enumerate() {
            let start = Instant::now();
            let out = Command::new(&cmd[0]).args(&cmd[1..]).output().unwrap();
            let elapsed = start.elapsed();
            assert!(
                out.status.success(),
                "{name}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            assert_eq!(
                String::from_utf8_lossy(&out.stdout).trim(),
                expected,
                "{name}"
            );
            best[i] = best[i].min(elapsed);
        }
    }
    println!(
        "thread-local access, {} iterations, best of {} runs (whole process)",
        args.iterations, args.runs
    );
    let native = best[0].as_secs_f64();
    for ((name, _), t) in contenders.iter().zip(&best) {
        let t = t.as_secs_f64();
        println!(
            "  {name:<30} {:>9.1} ms  {:>5.2}x native  {:>6.2} ns/access",
            t * 1e3,
            t / native,
            t * 1e9 / args.iterations as f64
        );
    }
    let ratio = best[1].as_secs_f64() / native;
    println!(
        "target: kiln static TLS within 5% of native: {:.3}x — {}",
        ratio,
        if ratio <= 1.05 { "met" } else { "MISSED" }
    );
}
