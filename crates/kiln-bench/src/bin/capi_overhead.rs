//! Figure of the C API issue: the C layer's cost on a link. SQLite (sqlite_driver.o +
//! Debian's libsqlite3.a) linked in process with no code run, each link in a fresh
//! session, through the C API (kiln-capi's examples/link_bench.c, built against the
//! release library installed by scripts/install_capi.sh) and through the Rust API in
//! this process, the two alternating in batches; the median of each and their ratio.

use clap::Parser;
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
}

fn rust_link(driver: &[u8], archive: &std::sync::Arc<[u8]>) -> Duration {
    let jit = kiln::Jit::builder().noexec(true).build().expect("session");
    let lib = jit.main_library();
    jit.add_object(lib, "sqlite_driver.o", driver.to_vec())
        .expect("driver");
    jit.add_archive(lib, "libsqlite3.a", archive.to_vec())
        .expect("archive");
    jit.add_library_by_name(lib, "m", &[]).expect("libm");
    jit.add_process_symbols(lib).expect("process symbols");
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
    sh(&format!(
        "bash {}/scripts/install_capi.sh {} >/dev/null",
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
}
