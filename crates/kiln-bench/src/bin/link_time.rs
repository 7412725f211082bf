//! Figure of the linker issue: whole-process link-only time and peak memory of real
//! inputs, Kiln (`kiln run --noexec`) against `llvm-jitlink-16 -noexec` and a static link
//! with mold through gcc, side by side in one run; plus link + run against the natively
//! linked program.
//!
//! Inputs (built into a scratch directory first): SQLite, Lua and zlib drivers with
//! Debian's static libraries, CPython from libpython3.11-dev (python.o +
//! libpython3.11-pic.a), and a generated program of 20,000 small functions, each in its
//! own section, called through a table. Each command runs `--runs` times; the median
//! wall time and the largest peak RSS are reported.

use clap::Parser;
use kiln_bench::sh;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[derive(Parser, Debug)]
struct Args {
    /// Runs per command (the median is reported).
    #[arg(long, default_value_t = 7)]
    runs: usize,
    /// The kiln binary (default: next to this one).
    #[arg(long)]
    kiln: Option<PathBuf>,
    /// Scratch directory for the inputs.
    #[arg(long, default_value = "/tmp/kiln-link-bench")]
    dir: PathBuf,
    /// Only these inputs (sqlite, lua, zlib, python, many).
    #[arg(long)]
    only: Vec<String>,
}

struct Input {
    name: &'static str,
    /// Objects and archives, as paths.
    files: Vec<PathBuf>,
    /// Extra libraries for kiln and gcc (`-lm`).
    libs: Vec<&'static str>,
    /// Arguments when run.
    run_args: Vec<String>,
}

fn prepare(dir: &Path) -> Vec<Input> {
    std::fs::create_dir_all(dir).unwrap();
    let programs = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/programs");
    let lib = "/usr/lib/x86_64-linux-gnu";
    let d = dir.display();
    sh(&format!(
        "cc -O2 -c {}/sqlite_driver.c -o {d}/sqlite_driver.o",
        programs.display()
    ));
    sh(&format!(
        "cc -O2 -I/usr/include/lua5.4 -c {}/lua_driver.c -o {d}/lua_driver.o",
        programs.display()
    ));
    sh(&format!(
        "cp {}/script.lua {d}/script.lua",
        programs.display()
    ));
    sh(&format!(
        "cc -O2 -c {}/zlib_driver.c -o {d}/zlib_driver.o",
        programs.display()
    ));
    // 20,000 functions, one section each, called through a table.
    let many = dir.join("many.c");
    if !many.exists() {
        let mut src = String::from("#include <stdio.h>\n");
        for i in 0..20_000 {
            src.push_str(&format!(
                "int f{i}(int x) {{ return x * {} + {i}; }}\n",
                i % 7 + 1
            ));
        }
        src.push_str("typedef int (*fn)(int);\nstatic fn table[] = {");
        for i in 0..20_000 {
            src.push_str(&format!("f{i},"));
        }
        src.push_str("};\nint main(void) { long s = 0; for (unsigned i = 0; i < sizeof table / sizeof *table; i++) s += table[i](i); printf(\"%ld\\n\", s); return 0; }\n");
        std::fs::write(&many, src).unwrap();
    }
    sh(&format!(
        "cc -O1 -ffunction-sections -c {d}/many.c -o {d}/many.o"
    ));
    let mut inputs = vec![
        Input {
            name: "sqlite",
            files: vec![
                dir.join("sqlite_driver.o"),
                format!("{lib}/libsqlite3.a").into(),
            ],
            libs: vec!["-lm"],
            run_args: vec![],
        },
        Input {
            name: "lua",
            files: vec![
                dir.join("lua_driver.o"),
                format!("{lib}/liblua5.4.a").into(),
            ],
            libs: vec!["-lm"],
            run_args: vec![dir.join("script.lua").display().to_string()],
        },
        Input {
            name: "zlib",
            files: vec![dir.join("zlib_driver.o"), format!("{lib}/libz.a").into()],
            libs: vec![],
            run_args: vec![],
        },
        Input {
            name: "many",
            files: vec![dir.join("many.o")],
            libs: vec![],
            run_args: vec![],
        },
    ];
    let config = Path::new("/usr/lib/python3.11/config-3.11-x86_64-linux-gnu");
    if config.join("libpython3.11-pic.a").exists() {
        inputs.push(Input {
            name: "python",
            files: vec![config.join("python.o"), config.join("libpython3.11-pic.a")],
            libs: vec!["-lm", "-lz", "-lexpat"],
            run_args: vec!["-c".into(), "print(sum(range(10)))".into()],
        });
    }
    inputs
}

/// Runs `cmd` and returns (wall time, peak RSS in KiB, success).
fn measure(cmd: &mut Command) -> (Duration, u64, bool) {
    let start = Instant::now();
    let child = cmd.stdout(Stdio::null()).stderr(Stdio::null()).spawn();
    let Ok(child) = child else {
        return (Duration::ZERO, 0, false);
    };
    let mut status = 0;
    // SAFETY: rusage is plain data; wait4 fills it for our child.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: waiting for our own child with valid out-pointers.
    unsafe { libc::wait4(child.id() as i32, &mut status, 0, &mut usage) };
    let wall = start.elapsed();
    let ok = libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0;
    (wall, usage.ru_maxrss as u64, ok)
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn bench(runs: usize, mut make: impl FnMut() -> Command) -> Option<(Duration, u64)> {
    let mut times = Vec::new();
    let mut peak = 0;
    for _ in 0..runs {
        let (t, rss, ok) = measure(&mut make());
        if !ok {
            return None;
        }
        times.push(t);
        peak = peak.max(rss);
    }
    Some((median(times), peak))
}

fn main() {
    let args = Args::parse();
    let kiln = args.kiln.clone().unwrap_or_else(|| {
        std::env::current_exe()
            .unwrap()
            .parent()
            .unwrap()
            .join("kiln")
    });
    let inputs = prepare(&args.dir);
    let have = |tool: &str| {
        Command::new(tool)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success())
    };
    let jitlink = have("llvm-jitlink-16");
    let mold = have("mold");
    println!(
        "link-only, whole process, median of {} runs (peak RSS in MiB)\n",
        args.runs
    );
    println!(
        "{:<8} {:>14} {:>18} {:>16} {:>12} {:>12}",
        "input", "kiln --noexec", "llvm-jitlink-16", "gcc+mold", "jitlink/kiln", "mold/kiln"
    );
    let mut run_rows = Vec::new();
    for input in &inputs {
        if !args.only.is_empty() && !args.only.iter().any(|o| o == input.name) {
            continue;
        }
        let kiln_cmd = || {
            let mut c = Command::new(&kiln);
            c.arg("run")
                .arg("--noexec")
                .args(&input.files)
                .args(&input.libs);
            c
        };
        let k = bench(args.runs, kiln_cmd);
        let j = if jitlink {
            bench(args.runs, || {
                // llvm-jitlink's -lm fails on Debian's libm.so ld script; the libraries
                // are in its own process anyway, where it resolves host symbols.
                let mut c = Command::new("llvm-jitlink-16");
                c.arg("-noexec").args(&input.files);
                c
            })
        } else {
            None
        };
        let exe = args.dir.join(format!("{}.mold", input.name));
        let m = if mold {
            bench(args.runs, || {
                let mut c = Command::new("gcc");
                c.arg("-fuse-ld=mold")
                    .args(&input.files)
                    .args(&input.libs)
                    .arg("-o")
                    .arg(&exe);
                c
            })
        } else {
            None
        };
        let fmt = |r: Option<(Duration, u64)>| match r {
            Some((t, rss)) => format!("{:.1} ms {:>4}M", t.as_secs_f64() * 1e3, rss / 1024),
            None => "failed".to_string(),
        };
        let ratio = |a: Option<(Duration, u64)>, b: Option<(Duration, u64)>| match (a, b) {
            (Some((a, _)), Some((b, _))) => format!("{:.2}x", a.as_secs_f64() / b.as_secs_f64()),
            _ => "-".into(),
        };
        println!(
            "{:<8} {:>14} {:>18} {:>16} {:>12} {:>12}",
            input.name,
            fmt(k),
            fmt(j),
            fmt(m),
            ratio(j, k),
            ratio(m, k)
        );
        // Full run: kiln run vs the natively linked (mold) program.
        if m.is_some() {
            let kr = bench(args.runs, || {
                let mut c = Command::new(&kiln);
                c.arg("run")
                    .args(&input.files)
                    .args(&input.libs)
                    .arg("--")
                    .args(&input.run_args);
                c
            });
            let nr = bench(args.runs, || {
                let mut c = Command::new(&exe);
                c.args(&input.run_args);
                c
            });
            run_rows.push((input.name, kr, nr));
        }
    }
    println!(
        "\nlink + run, whole process, median of {} runs\n",
        args.runs
    );
    println!(
        "{:<8} {:>16} {:>16} {:>14}",
        "input", "kiln run", "native (mold)", "kiln/native"
    );
    for (name, k, n) in run_rows {
        let f = |r: Option<(Duration, u64)>| {
            r.map_or("failed".into(), |(t, _)| {
                format!("{:.1} ms", t.as_secs_f64() * 1e3)
            })
        };
        let ratio = match (k, n) {
            (Some((a, _)), Some((b, _))) => format!("{:.2}x", a.as_secs_f64() / b.as_secs_f64()),
            _ => "-".into(),
        };
        println!("{name:<8} {:>16} {:>16} {:>14}", f(k), f(n), ratio);
    }
    println!("\ntarget: kiln at or below mold on every input; >= 2x faster than llvm-jitlink on sqlite, >= 7x on many");
}
