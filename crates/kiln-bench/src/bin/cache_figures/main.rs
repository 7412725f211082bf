//! Figures of the object-cache issue, side by side in one run:
//!
//! 1. `kiln run prog.c` cold (empty cache) and warm (cached), for a large generated
//!    program and a small one; against `ccache cc -c` + a static link + running the
//!    program, cold and warm, on the same sources.
//! 2. The cache's own cost on a hit — hashing the preprocessed source, reading the entry,
//!    verifying its checksum and signature — against the in-process link of the object
//!    (the preprocessor's run is shown apart: it is the compiler's, and what the key
//!    needs).
//! 3. Redis: the hit latency over loopback, and a warm `kiln run` with two processes
//!    sharing one Redis at once.
//! 4. The linked-image cache (`image.rs`).

mod image;

use clap::Parser;
use kiln_cache::{compile_cached, Compiler, DiskCache, DiskLimits, ObjectCache, SystemCompiler};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

#[derive(Parser, Debug)]
struct Args {
    /// Functions in the large generated program.
    #[arg(long, default_value_t = 6000)]
    functions: usize,
    /// Warm runs (the median is reported).
    #[arg(long, default_value_t = 5)]
    runs: usize,
    /// Scratch directory.
    #[arg(long, default_value = "/tmp/kiln-cache-bench")]
    dir: PathBuf,
    /// The kiln binary (default: next to this one).
    #[arg(long)]
    kiln: Option<PathBuf>,
    /// Functions of the image cache's many-function program (in five objects).
    #[arg(long, default_value_t = 20_000)]
    image_functions: usize,
    /// Runs of the image cache's figures (interleaved; the median is reported).
    #[arg(long, default_value_t = 11)]
    image_runs: usize,
    /// Only the image cache's figures (section 4).
    #[arg(long)]
    only_images: bool,
}

fn generate(path: &Path, functions: usize) {
    let mut src = String::from("#include <stdio.h>\n#include <string.h>\n");
    for i in 0..functions {
        src.push_str(&format!(
            "static int f{i}(int x) {{\n  int acc = {i};\n  for (int k = 0; k < (x & 7); k++) {{\n    \
             switch ((k + {i}) % 5) {{\n    case 0: acc += k * {m}; break;\n    case 1: acc ^= x << (k & 3); break;\n    \
             case 2: acc -= {i} % (k + 1); break;\n    case 3: acc = acc * 3 + 1; break;\n    default: acc += (int)strlen(\"f{i}\");\n    }}\n  }}\n  return acc;\n}}\n",
            m = i % 13 + 1
        ));
    }
    src.push_str("typedef int (*fn)(int);\nstatic fn table[] = {");
    for i in 0..functions {
        src.push_str(&format!("f{i},"));
    }
    src.push_str("};\nint main(void) {\n  long s = 0;\n  for (unsigned i = 0; i < sizeof table / sizeof *table; i++) s += table[i]((int)i);\n  printf(\"%ld\\n\", s);\n  return 0;\n}\n");
    std::fs::write(path, src).unwrap();
}

fn time(cmd: &mut Command) -> (Duration, String) {
    let t = Instant::now();
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    let elapsed = t.elapsed();
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    (elapsed, String::from_utf8_lossy(&out.stdout).into_owned())
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn main() {
    let args = Args::parse();
    let dir = &args.dir;
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir).unwrap();
    let kiln = args
        .kiln
        .clone()
        .unwrap_or_else(|| std::env::current_exe().unwrap().with_file_name("kiln"));
    if args.only_images {
        image::figures(&kiln, dir, args.image_functions, args.image_runs);
        return;
    }
    let large = dir.join("large.c");
    generate(&large, args.functions);
    let small = dir.join("small.c");
    generate(&small, 20);
    let lines = |p: &Path| std::fs::read_to_string(p).unwrap().lines().count();
    println!(
        "large: {} lines ({:.1} MB); small: {} lines; -O1",
        lines(&large),
        std::fs::metadata(&large).unwrap().len() as f64 / 1e6,
        lines(&small)
    );
    println!(
        "{:<7} {:>12} {:>12} {:>10} {:>16} {:>16} {:>10}",
        "program",
        "kiln cold",
        "kiln warm",
        "cold/warm",
        "ccache+ld cold",
        "ccache+ld warm",
        "kiln/ccache warm"
    );
    for (name, src) in [("large", &large), ("small", &small)] {
        let cache_dir = dir.join(format!("cache-{name}"));
        let kiln_run = || {
            let mut c = Command::new(&kiln);
            c.args(["run", "-O1", "--cache-dir"])
                .arg(&cache_dir)
                .arg(src);
            c
        };
        let (cold, expected) = time(&mut kiln_run());
        let mut warm = Vec::new();
        for _ in 0..args.runs {
            let (t, out) = time(&mut kiln_run());
            assert_eq!(out, expected);
            warm.push(t);
        }
        let warm = median(warm);
        // ccache + a static link + running the program.
        let ccache_dir = dir.join(format!("ccache-{name}"));
        let object = dir.join(format!("{name}.o"));
        let binary = dir.join(format!("{name}.bin"));
        let ccache_run = || {
            let mut c = Command::new("sh");
            c.arg("-c")
                .arg(format!(
                    "ccache cc -O1 -c {} -o {} && cc {} -o {} && {}",
                    src.display(),
                    object.display(),
                    object.display(),
                    binary.display(),
                    binary.display()
                ))
                .env("CCACHE_DIR", &ccache_dir);
            c
        };
        let (ccache_cold, out) = time(&mut ccache_run());
        assert_eq!(out, expected);
        let mut ccache_warm = Vec::new();
        for _ in 0..args.runs {
            ccache_warm.push(time(&mut ccache_run()).0);
        }
        let ccache_warm = median(ccache_warm);
        println!(
            "{name:<7} {:>10.1}ms {:>10.1}ms {:>9.1}x {:>14.1}ms {:>14.1}ms {:>15.2}x  (>= 20x: {})",
            ms(cold),
            ms(warm),
            cold.as_secs_f64() / warm.as_secs_f64(),
            ms(ccache_cold),
            ms(ccache_warm),
            warm.as_secs_f64() / ccache_warm.as_secs_f64(),
            kiln_bench::verdict(cold.as_secs_f64() / warm.as_secs_f64() >= 20.0)
        );
    }
    println!("target: warm >= 20x faster than cold");

    // 2. The cache's own cost on a hit, against the link.
    let compiler = SystemCompiler::new();
    let cache = DiskCache::open(dir.join("cache-large"), DiskLimits::default()).unwrap();
    let flags = vec!["-O1".to_string()];
    let t = Instant::now();
    let signature = compiler.signature(&large, &flags).unwrap();
    let preprocess = t.elapsed();
    let key = signature.key();
    // An entry is checked whole (its MAC) at its first hit, and the check stamped once the
    // file is older than the seconds in which a change could keep its times: wait those
    // out, then time the first hit (checks and stamps) apart from the later ones.
    std::thread::sleep(kiln_cache::RACY + std::time::Duration::from_millis(100));
    let mut own = Vec::new();
    let mut object = Vec::new();
    let mut first = None;
    for _ in 0..args.runs + 1 {
        let t = Instant::now();
        // Hash: the key from the preprocessed text's hash (done in `signature`) is
        // recomputed here from the canonical text; look up (map, check or stamp): `get`;
        // verify: the note.
        let key2 = signature.key();
        let entry = cache.get(&key2).unwrap().expect("warm");
        assert_eq!(
            kiln_cache::signature_of(&entry).as_deref(),
            Some(signature.canonical().as_str())
        );
        match first {
            None => first = Some(t.elapsed()),
            Some(_) => own.push(t.elapsed()),
        }
        object = entry.to_vec();
    }
    let first = first.unwrap_or_default();
    let own = median(own);
    let mut links = Vec::new();
    for _ in 0..args.runs {
        let jit = kiln::Jit::builder().noexec(true).build().unwrap();
        let lib = jit.main_library();
        jit.library(lib)
            .add(kiln::Input::object("large.o", object.clone()))
            .unwrap();
        jit.library(lib).add(kiln::Input::ProcessSymbols).unwrap();
        let t = Instant::now();
        jit.link_pending(lib).unwrap();
        links.push(t.elapsed());
    }
    let link = median(links);
    println!(
        "\ncache hit, large program: look up (mapped, stamped) + signature check {:.3} ms ({} KB entry) vs its link {:.2} ms: {:.1}% (target <= 10%: {}); the first hit after the store (MAC checked whole, then stamped) {:.2} ms: {:.1}%; the preprocessor run that hashes the source: {:.1} ms",
        ms(own),
        object.len() / 1024,
        ms(link),
        100.0 * own.as_secs_f64() / link.as_secs_f64(),
        kiln_bench::verdict(own.as_secs_f64() <= 0.1 * link.as_secs_f64()),
        ms(first),
        100.0 * first.as_secs_f64() / link.as_secs_f64(),
        ms(preprocess)
    );
    let _ = key;

    // 3. Redis.
    image::figures(&kiln, dir, args.image_functions, args.image_runs);
    if Command::new("redis-server")
        .arg("--version")
        .output()
        .is_err()
    {
        println!("redis-server not installed: Redis figures skipped");
        return;
    }
    let port = 26379u16;
    let mut server = Command::new("redis-server")
        .args([
            "--port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
        ])
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline);
        std::thread::sleep(Duration::from_millis(20));
    }
    let url = format!("redis://127.0.0.1:{port}/");
    let redis = kiln_cache::RedisCache::open(&url, Duration::from_secs(2)).unwrap();
    let warmed = compile_cached(&compiler, Some(&redis), &large, &flags).unwrap();
    let mut hits = Vec::new();
    for _ in 0..args.runs * 4 {
        let t = Instant::now();
        assert!(redis.get(&warmed.key).unwrap().is_some());
        hits.push(t.elapsed());
    }
    println!(
        "redis over loopback: hit latency {:.2} ms for a {} KB entry (median of {})",
        ms(median(hits)),
        warmed.object.len() / 1024,
        args.runs * 4
    );
    let run_redis = || {
        let mut c = Command::new(&kiln);
        c.args(["run", "-O1", "--cache-redis", &url]).arg(&large);
        c
    };
    time(&mut run_redis()); // the entry is there (compile_cached above stored it)
    let t = Instant::now();
    let children: Vec<_> = (0..2)
        .map(|_| {
            run_redis()
                .stdout(std::process::Stdio::null())
                .spawn()
                .unwrap()
        })
        .collect();
    for mut child in children {
        assert!(child.wait().unwrap().success());
    }
    println!(
        "two processes sharing one redis, warm `kiln run` of the large program at once: {:.1} ms for both",
        ms(t.elapsed())
    );
    let _ = server.kill();
    let _ = server.wait();
}
