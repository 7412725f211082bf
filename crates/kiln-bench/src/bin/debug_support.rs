//! Figures of the debuggers-and-profilers issue, side by side in one run:
//!
//! 1. Link time of SQLite (sqlite_driver.o + Debian's libsqlite3.a, in process, no code
//!    run) with listeners off, perf map, jitdump and GDB registration, the configurations
//!    interleaved round by round; the median of each and its ratio to "off".
//! 2. `llvm-jitlink-16 -noexec` on the same input with `-debugger-support` off and on
//!    (whole process, median wall time).
//! 3. Registration cost per module as modules accumulate: N one-function modules
//!    (cranelift-object), each registered with all three outputs; the time the listener
//!    takes for modules 10..110 against the last 100. With `--under-gdb`, the same under a
//!    real gdb (GDB registration only), where the debugger's own work at each registration
//!    counts too.

use clap::Parser;
use cranelift_codegen::ir::{types::I64, AbiParam, InstBuilder};
use cranelift_codegen::settings::{self, Configurable};
use cranelift_frontend::{FunctionBuilder, FunctionBuilderContext};
use cranelift_module::{default_libcall_names, Linkage, Module};
use kiln::Input;
use kiln::{
    debug::{DebugListener, DebugSupport},
    plugin::{LoadedModule, Plugin, PluginError},
    Jit,
};
use kiln_bench::sh;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(Parser, Debug)]
struct Args {
    /// Rounds of the SQLite links (each round links once per configuration).
    #[arg(long, default_value_t = 15)]
    rounds: usize,
    /// Modules registered one by one (part 3).
    #[arg(long, default_value_t = 10_000)]
    modules: usize,
    /// Modules for the run under gdb (part 3 under a debugger; 0 skips it).
    #[arg(long, default_value_t = 2_000)]
    gdb_modules: usize,
    /// Skip part 3 (registration as modules accumulate).
    #[arg(long)]
    sqlite_only: bool,
    /// Internal: run part 3 only, GDB registration only (the process gdb runs).
    #[arg(long)]
    registration_only: bool,
    /// Scratch directory.
    #[arg(long, default_value = "/tmp/kiln-debug-bench")]
    dir: PathBuf,
}

/// The debug listener, its load announcements timed.
struct TimedListener {
    inner: DebugListener,
    times: std::sync::Mutex<Vec<Duration>>,
}

impl Plugin for TimedListener {
    fn name(&self) -> &str {
        "timed debug listener"
    }
    fn module_loaded(&self, module: &LoadedModule) -> Result<(), PluginError> {
        let t = Instant::now();
        let result = self.inner.module_loaded(module);
        self.times.lock().unwrap().push(t.elapsed());
        result
    }
    fn module_freed(&self, module: &LoadedModule) -> Result<(), PluginError> {
        self.inner.module_freed(module)
    }
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

const CONFIGS: [&str; 5] = ["off", "no-op plugin", "perf map", "jitdump", "gdb"];

/// A plugin that does nothing: what the hook itself costs (sections and symbols
/// reported, the module described).
struct NoOp;

impl Plugin for NoOp {
    fn name(&self) -> &str {
        "no-op"
    }
}

fn support(config: &str, dir: &Path) -> DebugSupport {
    DebugSupport {
        gdb: config == "gdb",
        perf_map: config == "perf map",
        jitdump: config == "jitdump",
        jitdump_dir: Some(dir.join("jitdump")),
    }
}

/// One in-process link of SQLite (no code run), with `config`'s outputs, made as
/// `JitBuilder::debug_support` makes them (the same memory mapping, the same listener,
/// here timed): (whole link, the listener's part).
fn link_sqlite(
    driver: &[u8],
    archive: &Arc<[u8]>,
    config: &str,
    dir: &Path,
) -> (Duration, Duration) {
    let mut builder = Jit::builder().noexec(true);
    if config == "gdb" || config == "perf map" {
        // What debug_support chooses for these: private code pages.
        let memory = kiln_memory::SlabMemoryManager::builder()
            .mapper(Arc::new(kiln_memory::InProcessMapper::new()))
            .build()
            .expect("memory");
        builder = builder.memory(memory);
    }
    let jit = builder.build().expect("session");
    let listener = DebugListener::start(&support(config, dir), jit.executor())
        .expect("outputs")
        .map(|inner| {
            Arc::new(TimedListener {
                inner,
                times: Default::default(),
            })
        });
    let _registration = listener.clone().map(|l| jit.add_plugin(l));
    let _no_op = (config == "no-op plugin").then(|| jit.add_plugin(Arc::new(NoOp)));
    let lib = jit.main_library();
    jit.library(lib)
        .add(Input::object("sqlite_driver.o", driver.to_vec()))
        .expect("driver");
    jit.library(lib)
        .add(Input::archive("libsqlite3.a", archive.clone()))
        .expect("archive");
    jit.library(lib)
        .add(Input::library_by_name("m", &[]))
        .expect("libm");
    jit.library(lib)
        .add(Input::ProcessSymbols)
        .expect("process symbols");
    let t = Instant::now();
    let linked = jit.link_pending(lib).expect("link");
    let elapsed = t.elapsed();
    assert!(linked.is_some());
    assert!(jit.plugin_failures().is_empty());
    let listening = listener.map_or(Duration::ZERO, |l| l.times.lock().unwrap().iter().sum());
    (elapsed, listening)
}

fn part_sqlite(args: &Args) {
    let dir = &args.dir;
    let programs = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/programs");
    sh(&format!(
        "cc -O2 -c {}/sqlite_driver.c -o {}/sqlite_driver.o",
        programs.display(),
        dir.display()
    ));
    let driver = std::fs::read(dir.join("sqlite_driver.o")).unwrap();
    let archive: Arc<[u8]> = std::fs::read("/usr/lib/x86_64-linux-gnu/libsqlite3.a")
        .unwrap()
        .into();
    let mut times: Vec<Vec<Duration>> = vec![Vec::new(); CONFIGS.len()];
    let mut listening: Vec<Vec<Duration>> = vec![Vec::new(); CONFIGS.len()];
    link_sqlite(&driver, &archive, "off", dir); // warm-up
    for _ in 0..args.rounds {
        for (i, config) in CONFIGS.iter().enumerate() {
            let (link, listener) = link_sqlite(&driver, &archive, config, dir);
            times[i].push(link);
            listening[i].push(listener);
        }
    }
    let off = median(times[0].clone());
    println!(
        "== SQLite link in process (median of {} rounds)",
        args.rounds
    );
    println!(
        "{:<12} {:>10} {:>10} {:>12}  target",
        "outputs", "ms", "vs off", "listener ms"
    );
    for (i, config) in CONFIGS.iter().enumerate() {
        let m = median(times[i].clone());
        let l = median(listening[i].clone());
        let ratio = m.as_secs_f64() / off.as_secs_f64();
        let target = match *config {
            "off" | "no-op plugin" => String::new(),
            "gdb" => format!("<= 1.25 {}", kiln_bench::verdict(ratio <= 1.25)),
            _ => format!("<= 1.10 {}", kiln_bench::verdict(ratio <= 1.10)),
        };
        println!(
            "{config:<12} {:>10.2} {:>10.2} {:>12.2}  {target}",
            ms(m),
            m.as_secs_f64() / off.as_secs_f64(),
            ms(l)
        );
    }
    let _ = std::fs::remove_file(format!("/tmp/perf-{}.map", std::process::id()));

    if Command::new("llvm-jitlink-16")
        .arg("-version")
        .output()
        .is_ok()
    {
        let mut jl: Vec<Vec<Duration>> = vec![Vec::new(); 2];
        for _ in 0..args.rounds {
            for (i, on) in ["false", "true"].iter().enumerate() {
                let t = Instant::now();
                let out = Command::new("llvm-jitlink-16")
                    .arg("-noexec")
                    .arg(format!("-debugger-support={on}"))
                    .arg(dir.join("sqlite_driver.o"))
                    .arg("/usr/lib/x86_64-linux-gnu/libsqlite3.a")
                    .output()
                    .expect("llvm-jitlink-16");
                jl[i].push(t.elapsed());
                assert!(
                    out.status.success(),
                    "llvm-jitlink-16: {}",
                    String::from_utf8_lossy(&out.stderr)
                );
            }
        }
        let (off, on) = (median(jl[0].clone()), median(jl[1].clone()));
        println!(
            "llvm-jitlink-16 -noexec (whole process): debugger support off {:.2} ms, on {:.2} ms ({:.2}x)",
            ms(off),
            ms(on),
            on.as_secs_f64() / off.as_secs_f64()
        );
    }
}

fn isa() -> Arc<dyn cranelift_codegen::isa::TargetIsa> {
    let mut flags = settings::builder();
    flags.set("is_pic", "true").expect("flag");
    let builder = cranelift_native::builder().expect("host ISA");
    builder
        .finish(settings::Flags::new(flags))
        .expect("host ISA")
}

/// An object with one function, `long f<i>(long x) { return x + i; }`.
fn object_for(isa: &Arc<dyn cranelift_codegen::isa::TargetIsa>, i: usize) -> Vec<u8> {
    let mut module = cranelift_object::ObjectModule::new(
        cranelift_object::ObjectBuilder::new(isa.clone(), format!("m{i}"), default_libcall_names())
            .expect("builder"),
    );
    let mut sig = module.make_signature();
    sig.params.push(AbiParam::new(I64));
    sig.returns.push(AbiParam::new(I64));
    let id = module
        .declare_function(&format!("f{i}"), Linkage::Export, &sig)
        .expect("declare");
    let mut ctx = module.make_context();
    ctx.func.signature = sig;
    let mut fbc = FunctionBuilderContext::new();
    {
        let mut b = FunctionBuilder::new(&mut ctx.func, &mut fbc);
        let block = b.create_block();
        b.append_block_params_for_function_params(block);
        b.switch_to_block(block);
        b.seal_block(block);
        let x = b.block_params(block)[0];
        let r = b.ins().iadd_imm_s(x, i as i64);
        b.ins().return_(&[r]);
        b.finalize(module.target_config());
    }
    module.define_function(id, &mut ctx).expect("define");
    module.finish().emit().expect("emit")
}

/// Links `n` modules with a timed debug listener; prints the first and last windows.
fn part_registration(n: usize, support: DebugSupport, label: &str) {
    let isa = isa();
    let objects: Vec<Vec<u8>> = (0..n).map(|i| object_for(&isa, i)).collect();
    let jit = Jit::builder().noexec(true).build().expect("session");
    let listener = Arc::new(TimedListener {
        inner: DebugListener::start(&support, jit.executor())
            .expect("outputs")
            .expect("some output on"),
        times: Default::default(),
    });
    let _registration = jit.add_plugin(listener.clone());
    let lib = jit.main_library();
    let mut modules = Vec::with_capacity(n);
    for (i, object) in objects.into_iter().enumerate() {
        modules.push(
            jit.link_object(lib, &format!("m{i}.o"), object)
                .expect("link"),
        );
    }
    assert!(jit.plugin_failures().is_empty());
    let times = listener.times.lock().unwrap().clone();
    let window = 100.min(n / 4).max(1);
    let mean = |w: &[Duration]| w.iter().map(Duration::as_secs_f64).sum::<f64>() / w.len() as f64;
    let start = 10.min(n - window);
    let first = mean(&times[start..start + window]);
    let last = mean(&times[n - window..]);
    println!(
        "{label}: {n} modules, registration of modules {start}..{} {:.1} µs, of the last {window} {:.1} µs: {:.2}x (target <= 1.2: {})",
        start + window,
        first * 1e6,
        last * 1e6,
        last / first,
        kiln_bench::verdict(last / first <= 1.2)
    );
    let t = Instant::now();
    for m in modules.into_iter().rev() {
        jit.remove_module(&m).expect("remove");
    }
    println!(
        "{label}: removing (unregistering) all {n}: {:.1} µs per module",
        t.elapsed().as_secs_f64() * 1e6 / n as f64
    );
}

fn main() {
    let args = Args::parse();
    std::fs::create_dir_all(&args.dir).unwrap();
    let gdb_only = DebugSupport {
        gdb: true,
        ..Default::default()
    };
    if args.registration_only {
        part_registration(args.modules, gdb_only, "under gdb, GDB registration");
        return;
    }
    part_sqlite(&args);
    if args.sqlite_only {
        return;
    }
    println!("\n== registration as modules accumulate");
    part_registration(
        args.modules,
        DebugSupport {
            gdb: true,
            perf_map: true,
            jitdump: true,
            jitdump_dir: Some(args.dir.join("jitdump-many")),
        },
        "no debugger attached, all outputs",
    );
    let _ = std::fs::remove_file(format!("/tmp/perf-{}.map", std::process::id()));
    if args.gdb_modules > 0 && Command::new("gdb").arg("--version").output().is_ok() {
        let me = std::env::current_exe().unwrap();
        let out = Command::new("gdb")
            .args([
                "-batch",
                "-nx",
                "-ex",
                "set debuginfod enabled off",
                "-ex",
                "run",
            ])
            .arg("--args")
            .arg(me)
            .arg("--registration-only")
            .arg("--modules")
            .arg(args.gdb_modules.to_string())
            .output()
            .expect("gdb");
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            if line.starts_with("under gdb") {
                println!("{line}");
            }
        }
    }
}
