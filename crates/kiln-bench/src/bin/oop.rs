//! Figures of the out-of-process issue, side by side in one run:
//! 1. end-to-end link + run of SQLite and Lua: Kiln in-process, Kiln out-of-process
//!    (shared memory, copy), and `llvm-jitlink-16` in-process and with
//!    `-oop-executor=llvm-jitlink-executor` (with and without `-use-shared-memory`);
//! 2. the transport alone: a 64 MiB code image placed in an executor by shared memory and
//!    by copy over the socket;
//! 3. over TCP (loopback): `kiln run --connect` of SQLite against an executor that
//!    authenticates and encrypts (Noise) and one started with `--no-auth`, interleaved;
//! 4. one request's round trip to a child executor: a lookup (served on the thread that
//!    reads the connection) and a call of JIT code (run on main's thread, while the
//!    reading thread serves beside it), interleaved;
//! 5. a child executor's start (spawn to hello) from a controller that holds 0 and 1,024
//!    MiB it has written: Kiln's (`posix_spawnp`) against a start that forks the
//!    controller (std's `Command` with a `pre_exec` closure, as Kiln did before),
//!    interleaved.

use clap::Parser;
use kiln_bench::sh;
use kiln_memory::{
    AllocationRequest, MemoryManager, Permission, SegmentRequest, SlabLayout, SlabMemoryManager,
};
use kiln_remote::{CopyMapper, RemoteExecutor, SharedMemoryMapper, Timeouts};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(Parser, Debug)]
struct Args {
    /// Runs per command (median reported).
    #[arg(long, default_value_t = 7)]
    runs: usize,
    /// Scratch directory.
    #[arg(long, default_value = "/tmp/kiln-oop-bench")]
    dir: PathBuf,
    /// Size of the code image for the transport figure, MiB.
    #[arg(long, default_value_t = 64)]
    image_mib: u64,
    /// Only the TCP figure (3).
    #[arg(long)]
    only_tcp: bool,
    /// Only the round trips (4).
    #[arg(long)]
    only_round_trips: bool,
    /// Only the executor's start (5).
    #[arg(long)]
    only_start: bool,
}

/// A `kiln-executor --listen` for the TCP figure; killed on drop.
struct Listener(std::process::Child, String);

impl Drop for Listener {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start_listener(executor: &Path, extra: &[&str]) -> Listener {
    use std::io::BufRead;
    let mut child = Command::new(executor)
        .args(["--listen", "127.0.0.1:0"])
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("kiln-executor --listen");
    let mut stderr = std::io::BufReader::new(child.stderr.take().expect("stderr"));
    let mut line = String::new();
    while !line.starts_with("kiln-executor: listening on") {
        line.clear();
        if stderr.read_line(&mut line).unwrap_or(0) == 0 {
            panic!("kiln-executor --listen ended");
        }
    }
    std::thread::spawn(move || {
        let mut sink = String::new();
        let _ = std::io::Read::read_to_string(&mut stderr, &mut sink);
    });
    let address = line
        .trim()
        .rsplit(' ')
        .next()
        .unwrap_or_default()
        .to_string();
    Listener(child, address)
}

/// Figure 3: authenticated + encrypted TCP against plaintext on the same link.
fn tcp_figure(kiln: &Path, executor: &Path, dir: &Path, files: &[String], runs: usize) {
    let key = dir.join("bench.key");
    let _ = std::fs::remove_file(&key);
    let key_arg = key.display().to_string();
    let secure = start_listener(executor, &["--key-file", &key_arg]);
    let plain = start_listener(executor, &["--no-auth"]);
    let mut times: [Vec<Duration>; 2] = [Vec::new(), Vec::new()];
    for _ in 0..runs {
        for (i, (address, key)) in [(&secure.1, Some(&key_arg)), (&plain.1, None)]
            .into_iter()
            .enumerate()
        {
            let start = Instant::now();
            let mut c = Command::new(kiln);
            c.args(["run", "--connect", address]);
            if let Some(k) = key {
                c.args(["--key-file", k]);
            }
            let ok = c
                .args(files)
                .arg("-lm")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
            assert!(ok, "kiln run --connect failed");
            times[i].push(start.elapsed());
        }
    }
    for t in &mut times {
        t.sort();
    }
    let median = |t: &[Duration]| t[t.len() / 2].as_secs_f64() * 1e3;
    let (s, p) = (median(&times[0]), median(&times[1]));
    println!(
        "
over TCP (loopback), SQLite link + run, median of {runs}: authenticated + encrypted {s:.1} ms, plaintext {p:.1} ms, ratio {:.3} (target <= 1.10)",
        s / p
    );
}

/// Runs each command `runs` times, round-robin (the machine's noise falls on all alike);
/// each one's wall time per round, `None` for one that failed.
fn interleaved<'a>(
    runs: usize,
    commands: impl Iterator<Item = &'a Command>,
) -> Vec<Option<Vec<Duration>>> {
    let commands: Vec<&Command> = commands.collect();
    let mut times: Vec<Option<Vec<Duration>>> = vec![Some(Vec::new()); commands.len()];
    for _ in 0..runs {
        for (command, times) in commands.iter().zip(&mut times) {
            let Some(list) = times else { continue };
            let mut c = Command::new(command.get_program());
            c.args(command.get_args());
            for (k, v) in command.get_envs() {
                if let Some(v) = v {
                    c.env(k, v);
                }
            }
            let start = Instant::now();
            let ok = c
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
            if ok {
                list.push(start.elapsed());
            } else {
                *times = None;
            }
        }
    }
    times
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values.get(values.len() / 2).copied().unwrap_or(f64::NAN)
}

/// The median of each round's ratio and difference against the same round's baseline
/// (ms): a noisy minute slows a round's commands alike, so pairing them cancels most of
/// it, where a ratio of medians does not.
fn paired(rounds: &[Duration], baseline: &[Duration]) -> (f64, f64) {
    let pairs = rounds.iter().zip(baseline);
    let ratio = median(
        pairs
            .clone()
            .map(|(t, b)| t.as_secs_f64() / b.as_secs_f64())
            .collect(),
    );
    let added = median(
        pairs
            .map(|(t, b)| (t.as_secs_f64() - b.as_secs_f64()) * 1e3)
            .collect(),
    );
    (ratio, added)
}

fn verdict(met: bool) -> &'static str {
    if met {
        "met"
    } else {
        "MISSED"
    }
}

/// Figure 5: a child executor's start, from spawning it to its hello, by Kiln and by a
/// fork of the controller, from a controller holding `mib` MiB it has written.
fn start_figure(executor: &Path, runs: usize) {
    use std::io::Read;
    use std::os::fd::AsRawFd;
    use std::os::unix::process::CommandExt;
    println!(
        "\na child executor's start (spawn to hello), median of {runs} interleaved: Kiln (posix_spawnp) against a fork of the controller (Command + pre_exec)"
    );
    for mib in [0usize, 1024] {
        // Every page written: the controller's memory is real, as a JIT host's is.
        let ballast = vec![1u8; mib << 20];
        let (mut kiln, mut fork) = (Vec::new(), Vec::new());
        for _ in 0..runs {
            let t = Instant::now();
            let remote = RemoteExecutor::spawn(executor, Timeouts::default()).expect("executor");
            kiln.push(t.elapsed().as_secs_f64() * 1e3);
            drop(remote);
            let t = Instant::now();
            let (ours, theirs) = std::os::unix::net::UnixStream::pair().expect("socketpair");
            let fd = theirs.as_raw_fd();
            assert_ne!(fd, 3, "dup2 onto itself would keep close-on-exec");
            let mut command = Command::new(executor);
            command.args(["--fd", "3"]);
            // SAFETY: between fork and exec only dup2, which is async-signal-safe.
            unsafe {
                command.pre_exec(move || {
                    if libc::dup2(fd, 3) < 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
            let mut child = command.spawn().expect("fork-based start");
            drop(theirs);
            let mut first = [0u8; 1];
            (&ours)
                .read_exact(&mut first)
                .expect("the hello's first byte");
            fork.push(t.elapsed().as_secs_f64() * 1e3);
            let _ = child.kill();
            let _ = child.wait();
        }
        std::hint::black_box(&ballast);
        let (k, f) = (median(kiln), median(fork));
        println!(
            "  controller holding {mib:>5} MiB: Kiln {k:.2} ms, fork-based {f:.2} ms, Kiln / fork {:.2}x",
            k / f
        );
    }
}

/// Figure 4: median round trips (µs) of a lookup and of a call of `long f(long)`, over
/// shared memory to a child executor, `runs` × 200 interleaved.
fn round_trips(executor: &Path, dir: &Path, runs: usize) -> (f64, f64) {
    let source = dir.join("add_one.c");
    std::fs::write(&source, "long add_one(long x) { return x + 1; }\n").unwrap();
    let object = dir.join("add_one.o");
    sh(&format!(
        "cc -O2 -c {} -o {}",
        source.display(),
        object.display()
    ));
    let spawned = kiln::Executor::spawn(
        executor,
        kiln::executor::Transport::SharedMemory,
        kiln::executor::Timeouts::default(),
    )
    .expect("executor");
    let jit = kiln::Jit::builder().executor(spawned).build().expect("jit");
    let lib = jit.main_library();
    jit.link_object(lib, "add_one.o", std::fs::read(&object).unwrap())
        .expect("link");
    let f = jit.lookup(lib, "add_one").expect("add_one");
    let (mut lookups, mut calls) = (Vec::new(), Vec::new());
    for i in 0..runs * 200 {
        let t = Instant::now();
        let found = jit.executor().lookup(0, "malloc").expect("lookup");
        lookups.push(t.elapsed().as_secs_f64() * 1e6);
        assert!(found.is_some());
        let t = Instant::now();
        // SAFETY: `long add_one(long)`, linked into the executor above.
        let v = unsafe { jit.executor().call(f, &[i as u64]) }.expect("call");
        calls.push(t.elapsed().as_secs_f64() * 1e6);
        assert_eq!(v, i as u64 + 1);
    }
    (median(lookups), median(calls))
}

/// Time to place an `image`-byte code segment in the executor. `warm`: the manager keeps
/// the pages of freed code (a JIT that replaces code reuses memory); cold: each placement
/// gets fresh pages, which the kernel must allocate and zero.
fn transport_time(executor: &Path, shared: bool, image: u64, runs: usize, warm: bool) -> Duration {
    let remote = Arc::new(RemoteExecutor::spawn(executor, Timeouts::default()).expect("executor"));
    let mapper: Arc<dyn kiln_memory::Mapper> = if shared {
        Arc::new(SharedMemoryMapper::new(remote.clone()).expect("shm"))
    } else {
        Arc::new(CopyMapper::new(remote.clone()))
    };
    let pool = (image + (16 << 20)).next_multiple_of(1 << 20);
    let mut builder = SlabMemoryManager::builder()
        .mapper(mapper)
        .layout(SlabLayout {
            read_execute: pool,
            read: 1 << 20,
            read_write: 1 << 20,
        })
        .arenas(1);
    if warm {
        // Freed runs keep all their pages prepared.
        builder = builder.prepare_chunk(pool);
    }
    let manager = builder.build().expect("manager");
    // A small live allocation keeps the pool from being "all free" (which always returns
    // its pages).
    let _anchor = manager
        .allocate(&AllocationRequest::new().segment(SegmentRequest::new(
            Permission::ReadExecute,
            16,
            16,
        )))
        .and_then(|a| a.finalize())
        .expect("anchor");
    if warm {
        let mut first = manager
            .allocate(&AllocationRequest::new().segment(SegmentRequest::new(
                Permission::ReadExecute,
                image,
                16,
            )))
            .expect("warm-up");
        first.working_memory(0).expect("segment").fill(0xc3);
        drop(first.finalize().expect("warm-up"));
    }
    let request =
        AllocationRequest::new().segment(SegmentRequest::new(Permission::ReadExecute, image, 16));
    let mut times = Vec::new();
    let mut phases = Vec::new();
    for _ in 0..runs {
        let start = Instant::now();
        let mut in_flight = manager.allocate(&request).expect("allocate");
        let a = start.elapsed();
        in_flight.working_memory(0).expect("segment").fill(0xc3);
        let w = start.elapsed();
        let code = in_flight.finalize().expect("finalize");
        times.push(start.elapsed());
        phases.push((a, w - a, start.elapsed() - w));
        drop(code);
    }
    times.sort();
    let (a, w, f) = phases[phases.len() / 2];
    eprintln!(
        "  ({} {}: allocate {:.1} ms, write {:.1} ms, finalize {:.1} ms)",
        if shared { "shm" } else { "copy" },
        if warm { "warm" } else { "cold" },
        a.as_secs_f64() * 1e3,
        w.as_secs_f64() * 1e3,
        f.as_secs_f64() * 1e3
    );
    times[times.len() / 2]
}

fn main() {
    let args = Args::parse();
    let here = std::env::current_exe().unwrap();
    let bin = here.parent().unwrap();
    let kiln = bin.join("kiln");
    let executor = bin.join("kiln-executor");
    std::fs::create_dir_all(&args.dir).unwrap();
    let programs = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/programs");
    let d = args.dir.display();
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
    let lib = "/usr/lib/x86_64-linux-gnu";
    let inputs = [
        (
            "sqlite",
            vec![
                format!("{d}/sqlite_driver.o"),
                format!("{lib}/libsqlite3.a"),
            ],
            vec![],
        ),
        (
            "lua",
            vec![format!("{d}/lua_driver.o"), format!("{lib}/liblua5.4.a")],
            vec![format!("{d}/script.lua")],
        ),
    ];
    if args.only_round_trips {
        let (lookup, call) = round_trips(&executor, &args.dir, args.runs);
        println!(
            "lookup {lookup:.1} µs, call {call:.1} µs (+{:.1} µs)",
            call - lookup
        );
        return;
    }
    if args.only_start {
        start_figure(&executor, args.runs);
        return;
    }
    if args.only_tcp {
        tcp_figure(&kiln, &executor, &args.dir, &inputs[0].1, args.runs);
        return;
    }
    // A pre-started executor on a Unix socket, which `kiln run --oop` uses when
    // KILN_EXECUTOR_SOCKET names it.
    let socket = args.dir.join("executor.sock");
    let mut prestarted = Command::new(&executor)
        .arg("--listen-unix")
        .arg(&socket)
        .stderr(Stdio::null())
        .spawn()
        .expect("kiln-executor --listen-unix");
    for _ in 0..100 {
        if socket.exists() {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let jitlink_executor = "/usr/lib/llvm-16/bin/llvm-jitlink-executor";
    // An executor that authenticates and encrypts, for `--connect` with the key.
    let key = args.dir.join("bench.key");
    let _ = std::fs::remove_file(&key);
    let key_arg = key.display().to_string();
    let secure = start_listener(&executor, &["--key-file", &key_arg]);
    println!(
        "end-to-end link + run, whole process, median of {} interleaved runs\n",
        args.runs
    );
    let mut verdicts = Vec::new();
    for (name, files, run_args) in &inputs {
        let kiln_run = |env: Option<(&str, &Path)>, extra: &[&str]| {
            let mut c = Command::new(&kiln);
            if let Some((k, v)) = env {
                c.env(k, v);
            }
            c.arg("run")
                .args(extra)
                .args(files)
                .arg("-lm")
                .arg("--")
                .args(run_args);
            c
        };
        let jitlink = |extra: &[&str]| {
            let mut c = Command::new("llvm-jitlink-16");
            c.args(extra).args(files).arg("--").args(run_args);
            c
        };
        let oop = format!("-oop-executor={jitlink_executor}");
        // The first four link (`--no-image-cache`: the default maps a linked image when
        // the cache holds one, in process and out); the last two map the warm image.
        let variants: Vec<(&str, Command)> = vec![
            (
                "kiln in process (links)",
                kiln_run(None, &["--no-image-cache"]),
            ),
            (
                "kiln --oop (shm, links)",
                kiln_run(None, &["--oop", "--no-image-cache"]),
            ),
            (
                "kiln --oop, pre-started",
                kiln_run(
                    Some(("KILN_EXECUTOR_SOCKET", &socket)),
                    &["--oop", "--no-image-cache"],
                ),
            ),
            (
                "kiln --oop --transport copy",
                kiln_run(None, &["--oop", "--transport", "copy", "--no-image-cache"]),
            ),
            (
                "kiln --connect (key)",
                kiln_run(None, &["--connect", &secure.1, "--key-file", &key_arg]),
            ),
            ("llvm-jitlink", jitlink(&[])),
            ("llvm-jitlink oop", jitlink(&[&oop])),
            (
                "llvm-jitlink oop+shm",
                jitlink(&[&oop, "-use-shared-memory"]),
            ),
            ("kiln in process (warm image)", kiln_run(None, &[])),
            ("kiln --oop (warm image)", kiln_run(None, &["--oop"])),
        ];
        // The warm variants' images stored first: inputs written within the image cache's
        // racy window are not stored, so the warm-up waits it out.
        std::thread::sleep(kiln_cache::RACY + Duration::from_millis(200));
        for (_, warm) in &variants[8..] {
            let _ = interleaved(1, std::iter::once(warm));
        }
        let rounds = interleaved(args.runs, variants.iter().map(|(_, c)| c));
        let times: Vec<Option<Duration>> = rounds
            .iter()
            .map(|r| {
                let mut r = r.clone()?;
                r.sort();
                r.get(r.len() / 2).copied()
            })
            .collect();
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        let (Some(inproc), Some(baseline)) = (times[0], &rounds[0]) else {
            println!("{name}: kiln in process failed");
            continue;
        };
        println!("{name}:");
        for ((label, _), time) in variants.iter().zip(&times) {
            match time {
                Some(t) => println!(
                    "  {label:<28} {:>8.1} ms  {:>5.2}x  {:>+6.1} ms",
                    ms(*t),
                    t.as_secs_f64() / inproc.as_secs_f64(),
                    ms(*t) - ms(inproc)
                ),
                None => println!("  {label:<28} failed"),
            }
        }
        // Issue 47's targets: SQLite as a ratio, Lua (a short program, where start-up
        // dominates) as milliseconds added; each the median over rounds of the round's
        // own comparison with in process, both linking.
        for (i, target) in [(1, 1.05), (2, 1.05), (3, f64::NAN), (4, 1.15)] {
            let label = variants[i].0;
            let Some(r) = &rounds[i] else {
                verdicts.push(format!("{name} {label}: failed: MISSED"));
                continue;
            };
            let (ratio, added) = paired(r, baseline);
            let line = match (*name, i) {
                ("lua", 1 | 2) => format!(
                    "{name} {label}: {added:+.1} ms (target <= +2 ms): {}",
                    verdict(added <= 2.0)
                ),
                ("sqlite", _) if !target.is_nan() => format!(
                    "{name} {label}: {ratio:.3}x in process (target <= {target}x): {}",
                    verdict(ratio <= target)
                ),
                _ => format!("{name} {label}: {ratio:.3}x, {added:+.1} ms (no target)"),
            };
            verdicts.push(line);
        }
        // A warm `--oop` run (the image copied into the executor, rebound there) against
        // the warm default (which maps its linked image).
        if let (Some(oop), Some(warm)) = (&rounds[9], &rounds[8]) {
            let (ratio, added) = paired(oop, warm);
            verdicts.push(format!(
                "{name} kiln --oop against the warm in-process run: {ratio:.3}x, {added:+.1} ms (target <= 1.10x): {}",
                verdict(ratio <= 1.10)
            ));
        }
        if let (Some(shm), Some(j1), Some(j2)) = (times[1], times[6], times[7]) {
            println!(
                "  kiln --oop vs llvm-jitlink oop (best): {:.2}x faster",
                j1.min(j2).as_secs_f64() / shm.as_secs_f64()
            );
        }
    }
    drop(secure);
    println!();
    println!(
        "each against in process, the median over the {} rounds of the round's own ratio:",
        args.runs
    );
    for line in &verdicts {
        println!("{line}");
    }
    println!();
    let image = args.image_mib << 20;
    println!(
        "\ntransport alone: {} MiB code image placed in the executor (allocate + write + finalize), median of {} runs",
        args.image_mib, args.runs
    );
    for warm in [false, true] {
        let shm = transport_time(&executor, true, image, args.runs, warm);
        let copy = transport_time(&executor, false, image, args.runs, warm);
        println!(
            "{}: shared memory {:>7.1} ms   copy {:>7.1} ms   copy / shm {:>6.2}x",
            if warm {
                "warm pages (memory reused)  "
            } else {
                "cold pages (fresh each time)"
            },
            shm.as_secs_f64() * 1e3,
            copy.as_secs_f64() * 1e3,
            copy.as_secs_f64() / shm.as_secs_f64()
        );
    }
    let _ = prestarted.kill();
    let _ = prestarted.wait();
    let (lookup, call) = round_trips(&executor, &args.dir, args.runs);
    println!(
        "\none request's round trip to a child executor (shared memory), median of {}: lookup {lookup:.1} µs, call of JIT code {call:.1} µs (+{:.1} µs: the code runs on main's thread)",
        args.runs * 200,
        call - lookup
    );
    tcp_figure(&kiln, &executor, &args.dir, &inputs[0].1, args.runs);
    start_figure(&executor, args.runs);
    println!("\ntargets: kiln oop >= 2x faster than llvm-jitlink oop; shm >= 5x faster than copy");
}
