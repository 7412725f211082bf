//! `kiln`: the command-line front end of Kiln. `kiln run` compiles (through the object
//! cache), links in memory and runs; `kiln link` links for a chosen architecture and
//! address and writes the image to a file; `kiln cache` looks after the cache; `kiln demo`
//! shows the memory layer alone.
//!
//! `main` is a C `main` that skips Rust's runtime set-up (see
//! `kiln_runtime::process_entry`: 0.06 ms of CPU of every run).

// (The test harness brings its own `main`.)
#![cfg_attr(not(test), no_main)]

mod image;
mod inputs;
mod launcher;
mod link_only;
mod times;

use clap::{Args, Parser, Subcommand, ValueEnum};
use kiln::Input;
use kiln_memory::{
    AllocationRequest, DualMappedMapper, FinalizedAllocation, InProcessMapper, Mapper,
    MemoryManager, Permission, SegmentRequest, SlabMemoryManager,
};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

#[derive(Parser, Debug)]
#[command(
    name = "kiln",
    version,
    about = "Kiln: a JIT linker and executable-memory manager",
    after_help = "Examples:
  kiln run prog.c                                  compile (cached), link in memory, run
  kiln run -O2 prog.c util.cpp /usr/lib/x86_64-linux-gnu/libz.a -lm -- arg1 arg2
  cc -c prog.c && kiln run prog.o libsqlite3.a -lm
  kiln run --oop prog.o                            run the code in a kiln-executor process
  kiln run --gdb prog.o                            debuggable (gdb, lldb); --perf-map, --jitdump
  kiln run --noexec --map prog.o                   link only, show where symbols landed
  kiln link --target aarch64 -o image.elf prog.o   link for AArch64 at 0x10000000, write
                                                   an ELF image (llvm-objdump -d image.elf)
  kiln cache stats | clear | prune

Exit status of `kiln run`: main's status (or exit()'s); 128 + N when the program dies of
signal N; 1 when kiln itself fails (a link error, a missing file)."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Links objects and archives in memory and runs their `main`, with main's exit code
    /// as this command's.
    Run(Box<RunArgs>),
    /// Links for a chosen architecture at chosen addresses, without running anything,
    /// and writes the result as an ELF image to disassemble (`llvm-objdump -d FILE`).
    Link(Box<link_only::LinkArgs>),
    /// The caches of `kiln run` (objects, linked images and the programs' launchers):
    /// their figures, emptying them, applying their limits.
    Cache {
        /// What to do.
        #[arg(value_enum)]
        action: CacheAction,
        /// The cache directory (default: $KILN_CACHE_DIR, $XDG_CACHE_HOME/kiln,
        /// ~/.cache/kiln or $XDG_RUNTIME_DIR/kiln).
        #[arg(long, value_name = "DIR")]
        cache_dir: Option<PathBuf>,
    },
    /// Writes N small functions into executable memory, calls each, frees half, and prints
    /// memory figures.
    Demo {
        /// How many functions (one module each).
        #[arg(long, default_value_t = 1000)]
        modules: u32,
        /// Which mapper to use.
        #[arg(long, value_enum, default_value_t = MapperKind::Default)]
        mapper: MapperKind,
    },
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum CacheAction {
    /// Entries, bytes and leftover temporary files.
    Stats,
    /// Removes every entry.
    Clear,
    /// Evicts least-recently-used entries beyond the limits, removes stale temporaries.
    Prune,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum TransportKind {
    /// Shared memory (memfd passed over the Unix socket).
    Shm,
    /// Bytes copied over the socket.
    Copy,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum MapperKind {
    /// Dual-mapped where the kernel allows it, else in-process.
    Default,
    /// Dual-mapped memfd (fails if the kernel refuses).
    Dual,
    /// mmap + mprotect in this process.
    InProcess,
}

/// Machine code of `extern "C" fn(x: u32) -> u32 { x * k + 1 }`.
fn times_plus_one(k: u32) -> Vec<u8> {
    #[cfg(target_arch = "x86_64")]
    {
        let mut code = vec![0x69, 0xc7]; // imul eax, edi, imm32
        code.extend_from_slice(&k.to_le_bytes());
        code.extend_from_slice(&[0x83, 0xc0, 0x01, 0xc3]); // add eax, 1; ret
        code
    }
    #[cfg(target_arch = "aarch64")]
    {
        let movz = 0x5280_0001u32 | ((k & 0xffff) << 5); // movz w1, #lo
        let movk = 0x72a0_0001u32 | ((k >> 16) << 5); // movk w1, #hi, lsl 16
        let madd = 0x1b01_0000u32; // mul w0, w0, w1
        let add = 0x1100_0400u32; // add w0, w0, #1
        let ret = 0xd65f_03c0u32;
        [movz, movk, madd, add, ret]
            .iter()
            .flat_map(|w| w.to_le_bytes())
            .collect()
    }
}

fn wx_mappings() -> usize {
    std::fs::read_to_string("/proc/self/maps")
        .unwrap_or_default()
        .lines()
        .filter(|l| {
            l.split_whitespace()
                .nth(1)
                .is_some_and(|p| p.get(1..3) == Some("wx"))
        })
        .count()
}

fn demo(modules: u32, kind: MapperKind) -> Result<(), String> {
    let mut builder = SlabMemoryManager::builder();
    match kind {
        MapperKind::Default => {}
        MapperKind::Dual => {
            let mapper = DualMappedMapper::new().map_err(|e| format!("dual-mapped mapper: {e}"))?;
            builder = builder.mapper(Arc::new(mapper) as Arc<dyn Mapper>);
        }
        MapperKind::InProcess => builder = builder.mapper(Arc::new(InProcessMapper::new())),
    }
    let manager = builder.build().map_err(|e| e.to_string())?;
    println!("mapper: {}", manager.mapper().name());
    let mut live: Vec<(u32, FinalizedAllocation)> = Vec::new();
    for k in 0..modules {
        let code = times_plus_one(k);
        let request = AllocationRequest::new().segment(SegmentRequest::new(
            Permission::ReadExecute,
            code.len() as u64,
            16,
        ));
        let mut in_flight = manager.allocate(&request).map_err(|e| e.to_string())?;
        in_flight
            .working_memory(0)
            .ok_or("allocation has no segment")?
            .copy_from_slice(&code);
        let finalized = in_flight.finalize().map_err(|e| e.to_string())?;
        live.push((k, finalized));
    }
    let mut checked = 0u64;
    for (k, f) in &live {
        let addr = f.target(0).ok_or("allocation has no segment")?;
        // SAFETY: the segment holds the complete function written above, finalized.
        let function: extern "C" fn(u32) -> u32 = unsafe { std::mem::transmute(addr as usize) };
        let got = function(3);
        if got != k.wrapping_mul(3).wrapping_add(1) {
            return Err(format!("function {k} returned {got}"));
        }
        checked += 1;
    }
    println!("called {checked} JIT functions, all returned x*k+1");
    let first = live.first().and_then(|(_, f)| f.target(0)).unwrap_or(0);
    let last = live.last().and_then(|(_, f)| f.target(0)).unwrap_or(0);
    println!(
        "code spans {first:#x}..{last:#x} ({} bytes for {modules} functions)",
        last.saturating_sub(first)
    );
    println!("\n-- after linking --\n{}", manager.stats());
    live.retain(|(k, _)| k % 2 == 0);
    println!("\n-- after freeing half --\n{}", manager.stats());
    println!(
        "\nwritable+executable mappings in this process: {}",
        wx_mappings()
    );
    Ok(())
}

/// Options of `kiln run`. In groups, each flattened into the command (clap builds each
/// group's arguments in a function of its own: one function of 37 arguments took a
/// 45 KiB stack frame, 11 fresh stack pages on every run).
#[derive(Args, Debug)]
struct RunArgs {
    /// C and C++ sources (compiled with the system compiler, through the object cache),
    /// object files, static archives and shared libraries.
    #[arg(required = true)]
    inputs: Vec<PathBuf>,
    /// Says what is loaded from where: compiled or cached sources, archives, archive
    /// members linked, shared libraries.
    #[arg(short = 'v', long)]
    verbose: bool,
    /// Prints where every symbol landed (address, size, name) after the link.
    #[arg(long, alias = "show-addrs")]
    map: bool,
    /// Link only; run no code at all (no initializers, no main, no finalizers).
    #[arg(long)]
    noexec: bool,
    /// Print the time of each link phase to stderr.
    #[arg(long)]
    show_times: bool,
    /// Print memory figures to stderr.
    #[arg(long)]
    stats: bool,
    /// Arguments for the program (after `--`), passed on as the operating system's bytes.
    #[arg(last = true)]
    args: Vec<std::ffi::OsString>,
    // The groups last: each names the heading of what follows it in the help.
    #[command(flatten)]
    source: SourceOptions,
    #[command(flatten)]
    link: LinkFlags,
    #[command(flatten)]
    exec: ExecutorOptions,
    #[command(flatten)]
    debug: DebugOptions,
}

/// How `kiln run` compiles sources, and the object cache it compiles through.
#[derive(Args, Debug)]
#[command(next_help_heading = "Sources (compiled through the object cache)")]
struct SourceOptions {
    /// Optimization level for sources (`-O2`).
    #[arg(short = 'O', value_name = "LEVEL")]
    optimize: Option<String>,
    /// Include directory for sources.
    #[arg(short = 'I', value_name = "DIR")]
    include: Vec<PathBuf>,
    /// Macro definition for sources (`-DNAME` or `-DNAME=VALUE`).
    #[arg(short = 'D', value_name = "NAME[=VALUE]")]
    define: Vec<String>,
    /// Language standard for sources (`--std=c11`).
    #[arg(long = "std", value_name = "STD")]
    standard: Option<String>,
    /// Debug information in compiled sources.
    #[arg(short = 'g')]
    debug_info: bool,
    /// More compiler flags for sources, space-separated (`--cflags='-Wall -march=native'`).
    #[arg(long, value_name = "FLAGS", allow_hyphen_values = true)]
    cflags: Option<String>,
    /// Compile sources without the object cache.
    #[arg(long)]
    no_cache: bool,
    /// The object cache's directory (default: $KILN_CACHE_DIR, $XDG_CACHE_HOME/kiln,
    /// ~/.cache/kiln or $XDG_RUNTIME_DIR/kiln; it must be yours and writable by no one
    /// else, or it is not used).
    #[arg(long, value_name = "DIR")]
    cache_dir: Option<PathBuf>,
    /// A Redis object cache shared by a fleet (`redis://host:port/`) instead of the disk;
    /// entries are sealed with the key in $KILN_CACHE_KEY_FILE (else your own); when it is
    /// down, slow, read-only or full, sources are compiled (-v says why).
    #[arg(long, value_name = "URL")]
    cache_redis: Option<String>,
}

/// How `kiln run` links: archives, libraries, symbols, the entry, the image cache.
#[derive(Args, Debug)]
#[command(next_help_heading = "Linking")]
struct LinkFlags {
    /// Link every time: neither map the program from the image cache nor store it there
    /// (by default a program that runs in this process is mapped from its cached image
    /// when the same inputs, libraries and options were linked before).
    #[arg(long)]
    no_image_cache: bool,
    /// Every member of every archive input is linked, not only those the program needs
    /// (for all archives: not positional as in ld).
    #[arg(long)]
    whole_archive: bool,
    /// Makes the link define SYM (pulling the archive member that does), as `ld -u`.
    #[arg(short = 'u', value_name = "SYM")]
    undefined: Vec<String>,
    /// Defines SYM at an absolute address (`--defsym SYM=0x1000`).
    #[arg(long, value_name = "SYM=ADDR")]
    defsym: Vec<String>,
    /// Accepted for compatibility with compiler drivers (threads need nothing more).
    #[arg(long)]
    pthread: bool,
    /// Link against library NAME (`libNAME.so`, an ld script, or `libNAME.a`).
    #[arg(short = 'l', value_name = "NAME")]
    libraries: Vec<String>,
    /// Search DIR for `-l` libraries first.
    #[arg(short = 'L', value_name = "DIR")]
    library_dirs: Vec<PathBuf>,
    /// Call SYM instead of `main` (same signature).
    #[arg(long, value_name = "SYM", default_value = "main")]
    entry: String,
    /// Do not make the program's global definitions visible to shared libraries it loads
    /// (by default they are, as `-Wl,-E` does for a native executable, so that plugins and
    /// CPython's extension modules can call back into the program).
    #[arg(long)]
    no_export_dynamic: bool,
}

/// Where `kiln run` runs the code: another process, another machine, a sandbox.
#[derive(Args, Debug)]
#[command(next_help_heading = "Where the code runs")]
struct ExecutorOptions {
    /// Run the code in a `kiln-executor` child process (out of process).
    #[arg(long)]
    oop: bool,
    /// How code reaches the executor process with --oop: shared memory (default) or
    /// copies.
    #[arg(long, value_enum)]
    transport: Option<TransportKind>,
    /// Run the code in a `kiln-executor --listen` at HOST:PORT (copy transport; the
    /// program's output comes back here).
    #[arg(long, value_name = "HOST:PORT")]
    connect: Option<String>,
    /// With --oop: the executor enters a sandbox before it runs anything: the program
    /// cannot start programs, trace others, listen for connections or change the system,
    /// reads files only beneath system directories and --sandbox-read paths, and writes
    /// only beneath --sandbox-write paths.
    #[arg(long)]
    sandbox: bool,
    /// With --sandbox: a path the program may also read (repeatable).
    #[arg(long, value_name = "PATH")]
    sandbox_read: Vec<PathBuf>,
    /// With --sandbox: a path the program may read and write (repeatable).
    #[arg(long, value_name = "PATH")]
    sandbox_write: Vec<PathBuf>,
    /// With --connect or a pre-started executor: keep the executor's environment and
    /// working directory (by default the program gets this process's, as in process; a
    /// Windows executor always keeps its own).
    #[arg(long)]
    no_env: bool,
    /// The executor's key file, for --connect (else $KILN_EXECUTOR_KEY_FILE, or the key
    /// itself in $KILN_EXECUTOR_KEY; with none, plaintext, which only an executor started
    /// with --no-auth accepts).
    #[arg(long, value_name = "FILE")]
    key_file: Option<PathBuf>,
    /// The executor binary for --oop (default: kiln-executor next to kiln; with
    /// KILN_EXECUTOR_SOCKET set, the pre-started `kiln-executor --listen-unix` there).
    #[arg(long, value_name = "PATH")]
    executor: Option<PathBuf>,
}

/// What `kiln run` tells debuggers and profilers.
#[derive(Args, Debug)]
#[command(next_help_heading = "Debuggers and profilers")]
struct DebugOptions {
    /// Register the code with the GDB JIT interface, for gdb and lldb (run `kiln run`
    /// under the debugger, or attach to the executor with --oop).
    #[arg(long)]
    gdb: bool,
    /// Write /tmp/perf-<pid>.map (pid of the process that runs the code) for `perf
    /// report`.
    #[arg(long)]
    perf_map: bool,
    /// Write a jitdump file for `perf record -k 1` + `perf inject --jit`, in DIR (default:
    /// $JITDUMPDIR, else ~/.debug/jit).
    #[arg(long, value_name = "DIR", num_args = 0..=1, default_missing_value = "")]
    jitdump: Option<PathBuf>,
}

/// Contradictory flags are errors, not ignored.
fn check_flags(o: &RunArgs) -> Result<(), String> {
    if o.exec.transport.is_some() && !o.exec.oop {
        return Err("--transport applies to --oop (an executor child process)".into());
    }
    if o.exec.oop && o.exec.connect.is_some() {
        return Err("--oop and --connect both choose the executor: use one".into());
    }
    if o.exec.key_file.is_some() && o.exec.connect.is_none() {
        return Err("--key-file applies to --connect".into());
    }
    if o.exec.sandbox && !o.exec.oop {
        return Err("--sandbox applies to --oop (start kiln-executor --listen with --sandbox for --connect)".into());
    }
    let sandbox_paths = !o.exec.sandbox_read.is_empty() || !o.exec.sandbox_write.is_empty();
    if !o.exec.sandbox && sandbox_paths {
        return Err("--sandbox-read and --sandbox-write need --sandbox".into());
    }
    if o.exec.executor.is_some() && !o.exec.oop {
        return Err("--executor applies to --oop".into());
    }
    if o.source.no_cache && (o.source.cache_dir.is_some() || o.source.cache_redis.is_some()) {
        return Err("--no-cache contradicts --cache-dir and --cache-redis".into());
    }
    // Compiler flags are text (they key the object cache): a directory whose name is not
    // UTF-8 would reach the compiler with U+FFFD in it, naming another directory.
    if let Some(dir) = o.source.include.iter().find(|d| d.to_str().is_none()) {
        return Err(format!(
            "-I {}: the name is not UTF-8 (compiler flags are passed as text): give it through a link whose name is",
            dir.display()
        ));
    }
    Ok(())
}

/// The flags sources are compiled with.
fn compiler_flags(o: &RunArgs) -> Vec<String> {
    let mut flags = Vec::new();
    if let Some(level) = &o.source.optimize {
        flags.push(format!("-O{level}"));
    }
    flags.extend(
        o.source
            .include
            .iter()
            .map(|d| format!("-I{}", d.display())),
    );
    flags.extend(o.source.define.iter().map(|d| format!("-D{d}")));
    if let Some(std) = &o.source.standard {
        flags.push(format!("-std={std}"));
    }
    if o.source.debug_info {
        flags.push("-g".into());
    }
    if o.link.pthread {
        flags.push("-pthread".into());
    }
    if let Some(more) = &o.source.cflags {
        flags.extend(more.split_whitespace().map(str::to_string));
    }
    flags
}

/// A link error as a C/C++ programmer wants it: undefined C++ names demangled, with the
/// library that usually has them.
fn explain(error: kiln::Error) -> String {
    if let kiln::Error::Link(kiln::link::LinkError::UndefinedSymbols { symbols }) = &error {
        let mut text = String::from("undefined symbols:");
        let mut cxx = false;
        for m in &symbols.0 {
            let readable = inputs::demangle(&m.symbol);
            // Names of the C++ library itself (a missing user function is not helped by it).
            cxx |= readable.starts_with("std::")
                || readable.starts_with("operator new")
                || readable.starts_with("operator delete")
                || m.symbol.starts_with("__cxa_")
                || m.symbol.starts_with("_ZTV")
                || m.symbol.starts_with("_ZTI");
            if readable == m.symbol {
                text.push_str(&format!("\n  {} (wanted by {})", m.symbol, m.wanted_by));
            } else {
                text.push_str(&format!(
                    "\n  {readable} [{}] (wanted by {})",
                    m.symbol, m.wanted_by
                ));
            }
        }
        if cxx {
            text.push_str("\nhint: C++ code needs the C++ library: add -lstdc++");
        }
        return text;
    }
    if let kiln::Error::Redefinition { .. } = &error {
        // The session's absolute definitions are this command's --defsym.
        return error
            .to_string()
            .replace("(Library::define_symbol)", "(--defsym)");
    }
    error.to_string()
}

/// Tells `-v` and `--map` what each module holds.
struct Report {
    verbose: bool,
    map: bool,
}

impl kiln::plugin::Plugin for Report {
    fn name(&self) -> &str {
        "kiln run report"
    }
    // `-v` prints the objects linked; only `--map` prints symbols: `-v` alone maps an
    // image stored without them.
    fn wants_symbols(&self) -> bool {
        self.map
    }
    fn module_loaded(
        &self,
        m: &kiln::plugin::LoadedModule,
    ) -> Result<(), kiln::plugin::PluginError> {
        if self.verbose {
            for object in &m.objects {
                eprintln!("kiln: linked {}", object.name);
            }
        }
        if self.map {
            let mut symbols: Vec<&kiln::plugin::SymbolInfo> = m.symbols.iter().collect();
            symbols.sort_by_key(|s| s.address);
            for s in symbols {
                println!("{:#018x} {:>8} {}", s.address, s.size, s.name);
            }
        }
        Ok(())
    }
}

fn run(o: RunArgs) -> Result<i32, String> {
    check_flags(&o)?;
    let start = Instant::now();
    let timeouts = kiln::executor::Timeouts::default();
    let executor = if let Some(address) = &o.exec.connect {
        let key = match &o.exec.key_file {
            Some(path) => Some(kiln::executor::Key::read_file(path).map_err(|e| e.to_string())?),
            None => kiln::executor::Key::from_env().map_err(|e| e.to_string())?,
        };
        let executor = kiln::Executor::connect_with_key(address, key.as_ref(), timeouts)
            .map_err(|e| e.to_string())?;
        // A Windows executor keeps its own: this system's paths mean nothing there.
        if !o.exec.no_env && executor.target_os() == kiln::executor::TargetOs::Linux {
            if o.verbose {
                eprintln!("kiln: --connect: the program gets this environment and working directory (--no-env keeps the executor's)");
            }
            executor.adopt_environment().map_err(|e| {
                format!("{e} (--no-env keeps the executor's environment and directory)")
            })?;
        }
        executor
    } else if o.exec.oop {
        let path = o
            .exec
            .executor
            .clone()
            .unwrap_or_else(kiln::executor::default_executor_path);
        let transport = match o.exec.transport.unwrap_or(TransportKind::Shm) {
            TransportKind::Shm => kiln::executor::Transport::SharedMemory,
            TransportKind::Copy => kiln::executor::Transport::Copy,
        };
        // A pre-started executor (kiln-executor --listen-unix PATH) saves starting one.
        match std::env::var_os("KILN_EXECUTOR_SOCKET") {
            Some(socket) if o.exec.executor.is_none() && !o.exec.sandbox => {
                let executor = kiln::Executor::connect_unix(
                    std::path::Path::new(&socket),
                    transport,
                    timeouts,
                )
                .map_err(|e| e.to_string())?;
                // A pre-started executor's world is its own: the program gets ours, as a
                // child executor's does (it inherits them).
                if !o.exec.no_env {
                    if o.verbose {
                        eprintln!("kiln: pre-started executor: the program gets this environment and working directory (--no-env keeps the executor's)");
                    }
                    executor.adopt_environment().map_err(|e| e.to_string())?;
                }
                executor
            }
            _ => {
                let sandbox = o.exec.sandbox.then(|| kiln::executor::Sandbox {
                    read: o.exec.sandbox_read.clone(),
                    write: o.exec.sandbox_write.clone(),
                });
                // Started, not waited for: its hello comes while the inputs load.
                kiln::Executor::start(&path, transport, sandbox.as_ref(), timeouts)
                    .map_err(|e| e.to_string())?
            }
        }
    } else {
        kiln::Executor::in_process()
    };
    let executor_ready = start.elapsed();
    // The cache is opened only when there is something to compile.
    let compiles = o
        .inputs
        .iter()
        .any(|p| kiln_cache::SystemCompiler::is_source(p));
    let cache: Option<Arc<dyn kiln_cache::ObjectCache>> = if o.source.no_cache || !compiles {
        None
    } else {
        open_cache(&o)
    };
    let mut builder = kiln::Jit::builder();
    if let Some(cache) = &cache {
        builder = builder.object_cache(cache.clone());
    }
    let image_cache = match image::open(&o) {
        Ok(cache) => Some(cache),
        Err(why) => {
            if o.verbose {
                eprintln!("kiln: image cache not used: {why}");
            }
            None
        }
    };
    if let Some(cache) = &image_cache {
        builder = builder.image_cache(cache.clone());
    }
    let jit = builder
        .executor(executor)
        .export_to_libraries(!o.link.no_export_dynamic && !o.noexec)
        // Published at the program's first dlopen/dlsym (kiln's own code never searches
        // the process for the program's names).
        .exports_on_demand(true)
        .noexec(o.noexec)
        .debug_support(kiln::debug::DebugSupport {
            gdb: o.debug.gdb,
            perf_map: o.debug.perf_map,
            jitdump: o.debug.jitdump.is_some(),
            jitdump_dir: o
                .debug
                .jitdump
                .clone()
                .filter(|d| !d.as_os_str().is_empty()),
        })
        .build()
        .map_err(|e| e.to_string())?;
    let lib = jit.main_library();
    let _report = (o.verbose || o.map).then(|| {
        jit.add_plugin(Arc::new(Report {
            verbose: o.verbose,
            map: o.map,
        }))
    });
    let flags = compiler_flags(&o);
    let mut image_key = image_cache.as_ref().map(|_| image::key_start(&o, &jit));
    // Consecutive objects are added together (checked on every core when they are large),
    // before whatever input comes next: their order among the objects is kept.
    let mut objects = Vec::new();
    let add_objects = |objects: &mut Vec<_>| {
        if objects.is_empty() {
            return Ok(());
        }
        jit.library(lib)
            .add(Input::Objects(std::mem::take(objects)))
            .map_err(explain)
    };
    for input in &o.inputs {
        // Mapped, not read: an archive's members are linked from the file's pages. What is
        // not a regular file (a device, a FIFO, a /proc file) is refused at once, unread;
        // a missing file or a directory is explained by `classify`.
        let bytes = match (!kiln_cache::SystemCompiler::is_source(input))
            .then(|| kiln::map_file(input).map_err(|e| e.to_string()))
        {
            Some(Ok(bytes)) => Some(bytes),
            Some(Err(e)) if input.exists() && !input.is_dir() => return Err(e),
            Some(Err(_)) | None => None,
        };
        let contents = bytes.as_ref().map(|b| (**b).as_ref());
        let name = input.display().to_string();
        let kind = inputs::classify(input, contents)?;
        if let (Some(key), false) = (&mut image_key, kind == inputs::InputKind::Source) {
            if let Err(why) = image::add_file(key, input, contents) {
                if o.verbose {
                    eprintln!("kiln: image cache not used: {why}");
                }
                image_key = None;
            }
        }
        if kind != inputs::InputKind::Object {
            add_objects(&mut objects)?;
        }
        match kind {
            inputs::InputKind::Source if jit.target_os() == kiln::executor::TargetOs::Windows => {
                // The system compiler writes this system's ELF (its calling convention, its
                // C library): nothing a Windows executor can run.
                return Err(format!(
                    "{name}: kiln run compiles sources for this system; for a Windows executor compile them yourself \
                     (clang-16 --target=x86_64-w64-windows-gnu-elf -c {name}) and give the objects"
                ));
            }
            inputs::InputKind::Source => {
                let t = Instant::now();
                let (hit, object_key) = jit
                    .library(lib)
                    .compile(input, &flags)
                    .map(|c| (c.from_cache, c.key))
                    .map_err(explain)?;
                // A source is named by its object's signature (sources compiled without
                // the object cache have none: no image then).
                match (&mut image_key, object_key) {
                    (Some(key), Some(object_key)) => {
                        key.key("source", &object_key);
                    }
                    (Some(_), None) => {
                        if o.verbose {
                            eprintln!("kiln: image cache not used: sources compiled without the object cache");
                        }
                        image_key = None;
                    }
                    (None, _) => {}
                }
                if o.verbose {
                    eprintln!(
                        "kiln: {name}: {} in {:.1} ms",
                        if hit { "from the cache" } else { "compiled" },
                        t.elapsed().as_secs_f64() * 1e3
                    );
                    // Why the cache was skipped (down, slow, refused, read-only, full).
                    for skip in cache.iter().flat_map(|c| c.take_skips()) {
                        eprintln!("kiln: {name}: {skip}");
                    }
                }
            }
            inputs::InputKind::Object => {
                let bytes = bytes.ok_or_else(|| format!("{name}: cannot be read"))?;
                objects.push((name, bytes));
            }
            inputs::InputKind::Archive if o.link.whole_archive => {
                for (member, data) in inputs::archive_members(input, contents.unwrap_or(&[]))? {
                    jit.library(lib)
                        .add(Input::object(&member, data))
                        .map_err(explain)?;
                }
            }
            inputs::InputKind::Archive => {
                if o.verbose {
                    eprintln!("kiln: archive {name}: members linked as needed");
                }
                let bytes = bytes.ok_or_else(|| format!("{name}: cannot be read"))?;
                jit.library(lib)
                    .add(Input::archive_shared(&name, bytes))
                    .map_err(explain)?;
            }
            inputs::InputKind::Shared => {
                if o.verbose {
                    eprintln!("kiln: shared library {name}");
                }
                jit.library(lib)
                    .add(Input::shared_library(input))
                    .map_err(explain)?;
            }
        }
    }
    add_objects(&mut objects)?;
    // C++ sources link the C++ library, as the compiler driver (c++) would link them.
    let cxx_source = o.inputs.iter().any(|p| {
        kiln_cache::SystemCompiler::is_source(p) && p.extension().is_some_and(|e| e != "c")
    });
    if cxx_source && !o.link.libraries.iter().any(|l| l == "stdc++") {
        if o.verbose {
            eprintln!("kiln: -lstdc++ (for the C++ sources)");
        }
        jit.library(lib)
            .add(Input::library_by_name("stdc++", &o.link.library_dirs))
            .map_err(explain)?;
    }
    if !o.link.undefined.is_empty() {
        let object = inputs::undefined_references(&o.link.undefined, jit.architecture())?;
        jit.library(lib)
            .add(Input::object("-u", object))
            .map_err(explain)?;
    }
    for name in &o.link.libraries {
        if o.verbose {
            eprintln!("kiln: -l{name}");
        }
        jit.library(lib)
            .add(Input::library_by_name(name, &o.link.library_dirs))
            .map_err(explain)?;
    }
    for definition in &o.link.defsym {
        let (symbol, value) = definition
            .split_once('=')
            .ok_or_else(|| format!("--defsym {definition}: expected SYM=ADDRESS"))?;
        let address = match value.strip_prefix("0x") {
            Some(hex) => u64::from_str_radix(hex, 16),
            None => value.parse(),
        }
        .map_err(|_| format!("--defsym {definition}: {value} is not an address"))?;
        jit.library(lib)
            .define_symbol(symbol, address)
            .map_err(explain)?;
    }
    jit.library(lib)
        .add(Input::ProcessSymbols)
        .map_err(|e| e.to_string())?;
    // Everything the link reads is in place: the key ends with every file this process
    // maps (the executable, the host's libraries, the mapped inputs) and, with --oop,
    // every file the executor maps.
    let image_key = image_key.and_then(|mut key| match jit.add_image_key_inputs(&mut key) {
        // A file changed within the last seconds: its times may not tell a second change
        // in the same tick, so no image is stored under its key (the link runs as usual).
        Ok(()) if key.unsettled().is_some() => {
            if o.verbose {
                eprintln!(
                    "kiln: image cache not used: {} changed within the last {} s",
                    key.unsettled().unwrap_or_default(),
                    kiln_cache::RACY.as_secs()
                );
            }
            None
        }
        Ok(()) => Some(key.finish()),
        Err(why) => {
            if o.verbose {
                eprintln!("kiln: image cache not used: {why}");
            }
            None
        }
    });
    let load = start.elapsed();
    let linked = match &image_key {
        Some(key) => jit.link_pending_cached(lib, key),
        None => jit.link_pending(lib),
    }
    .map_err(explain)?;
    if let (true, Some((_, report))) = (o.verbose, &linked) {
        if let Some(line) = image::describe(report) {
            eprintln!("{line}");
        }
    }
    for failure in jit.plugin_failures() {
        eprintln!(
            "kiln: warning: {} ({} of {}): {}",
            failure.plugin, failure.event, failure.module, failure.message
        );
    }
    if o.show_times {
        if let Some((_, report)) = &linked {
            times::print_link_times(load, &report.times, &report.pass_times, &report.counts);
        }
        if !jit.executor().runs_in_this_process() {
            times::print_step("executor up", executor_ready);
        }
        times::print_step("total", start.elapsed());
    }
    if o.stats {
        eprintln!("{}", jit.memory_stats());
    }
    if o.noexec {
        // Linked, and nothing ran: the process ends now, as after a program's exit.
        // Unmapping the module and emptying the session would cost SQLite's link 7 % of
        // its whole process for nothing (no initializer ran: no finalizer is due).
        if !jit.executor().runs_in_this_process() {
            jit.executor().shutdown_for_exit();
        }
        std::mem::forget(linked);
        std::mem::forget(jit);
        return Ok(0);
    }
    let name: std::ffi::OsString = o
        .inputs
        .first()
        .and_then(|p| p.file_stem())
        .map_or_else(|| "a.out".into(), |s| s.to_os_string());
    // argv[0]: a launcher that runs this program again (CPython's sys.executable), in the
    // cache directory; the name alone where there is none.
    // The image cache's root was checked when it was opened; without one, it is checked
    // here.
    let root = match &image_cache {
        Some(cache) => Some(cache.root().to_path_buf()),
        None => o
            .source
            .cache_dir
            .clone()
            .or_else(kiln_cache::DiskCache::default_root)
            .and_then(|root| kiln_cache::private_directory(&root).ok()),
    };
    let launcher = root.and_then(|root| launcher::launcher(&o, &root, &name));
    if o.verbose {
        match &launcher {
            Some(path) => eprintln!("kiln: argv[0] {} (runs this program again)", path.display()),
            None => eprintln!(
                "kiln: argv[0] {} (no cache directory for a launcher)",
                name.to_string_lossy()
            ),
        }
    }
    let mut argv = vec![launcher.map_or(name, |p| p.into_os_string())];
    argv.extend(o.args.iter().cloned());
    let address = jit.lookup(lib, &o.link.entry).map_err(explain)?;
    jit.report_crashes();
    if o.exec.connect.is_some() {
        // A remote program reads what is typed here, as a local one would.
        jit.executor().forward_stdin();
    }
    // SAFETY: `address` is the entry function of the module just linked, with main's
    // signature (the user's contract for --entry); the module stays alive in `jit`.
    let status = match unsafe { jit.executor().run_main(address, &argv) } {
        Ok(status) => status,
        // The program's exit(n) and fatal signals give the status they give in process
        // (n, or 128 + the signal number, as a shell reports it).
        Err(kiln::Error::Remote(kiln::executor::RemoteError::Exited { status, .. })) => {
            return Ok(status)
        }
        Err(kiln::Error::Remote(kiln::executor::RemoteError::Crashed {
            pid,
            signal,
            name,
            fault_address,
            pc,
            exception,
            ..
        })) => {
            // As in process: what was accessed, where, in which JIT function.
            let function = (pc != 0).then(|| jit.function_at(pc)).flatten();
            let mut line = if pc != 0 && function.is_none() {
                format!(
                    "kiln: the program crashed (outside JIT code) with {name} (signal {signal})"
                )
            } else {
                format!("kiln: JIT code crashed with {name} (signal {signal})")
            };
            if fault_address != 0 || matches!(signal, 11 | 7) {
                line.push_str(&format!(" accessing {fault_address:#x}"));
            }
            if pc != 0 {
                line.push_str(&format!(" at {pc:#x}"));
            }
            if let Some((function, offset)) = function {
                line.push_str(&format!(" in {function}+{offset:#x}"));
            }
            if exception != 0 {
                line.push_str(&format!(
                    " (Windows exception {exception:#010x}{})",
                    windows_exception_name(exception)
                        .map(|n| format!(", {n}"))
                        .unwrap_or_default()
                ));
            }
            eprintln!("{line} in the executor (pid {pid})");
            return Ok(128 + signal);
        }
        Err(e) => return Err(e.to_string()),
    };
    // As a program's exit: its finalizers, then the process ends (main exits at once with
    // the status). Unmapping, withdrawing exports and emptying the index would cost a
    // large program a millisecond for nothing.
    jit.finalize_for_exit();
    if o.show_times && !jit.executor().runs_in_this_process() {
        times::print_round_trips(&jit.executor().round_trips());
    }
    // A remote executor sends the program's last output before it answers; its exit is
    // not waited for (the system reaps it after ours). Unmapping this side's views of the
    // code would cost time for nothing either way: this process exits now.
    if !jit.executor().runs_in_this_process() {
        jit.executor().shutdown_for_exit();
    }
    std::mem::forget(jit);
    Ok(status)
}

kiln_runtime::process_main!(kiln_main);

fn kiln_main() -> std::ffi::c_int {
    // Kiln's traces, when RUST_LOG asks for them (without it, no subscriber: setting one up
    // costs more than some whole links).
    if std::env::var_os("RUST_LOG").is_some() {
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_writer(std::io::stderr)
            .init();
    }
    // `-pthread`, as compiler drivers spell it, is `--pthread` here. The arguments are
    // the operating system's (not necessarily UTF-8: a program's arguments and paths are
    // passed on as their bytes).
    let args = std::env::args_os().map(|a| {
        if a == "-pthread" {
            "--pthread".into()
        } else {
            a
        }
    });
    let cli = Cli::parse_from(args);
    let result = match cli.command {
        Command::Demo { modules, mapper } => demo(modules, mapper).map(|()| 0),
        Command::Run(args) => run(*args),
        Command::Link(args) => link_only::link_only(*args).map(|()| 0),
        Command::Cache { action, cache_dir } => cache(action, cache_dir).map(|()| 0),
    };
    match result {
        // main's status is the process's, as `exit(status)` would make it.
        Ok(status) => status,
        Err(e) => {
            eprintln!("kiln: error: {e}");
            1
        }
    }
}

/// The object cache of `kiln run`: Redis or the disk. A cache that cannot be used (a
/// directory other users can write to, a bad key file) is a warning and the sources are
/// compiled; no cache directory at all (no home) is said with `-v`.
fn open_cache(o: &RunArgs) -> Option<Arc<dyn kiln_cache::ObjectCache>> {
    let opened: Result<Arc<dyn kiln_cache::ObjectCache>, String> = match &o.source.cache_redis {
        Some(url) => kiln_cache::RedisCache::open(url, std::time::Duration::from_secs(2))
            .map(|c| Arc::new(c) as Arc<dyn kiln_cache::ObjectCache>)
            .map_err(|e| e.to_string()),
        None => match o
            .source
            .cache_dir
            .clone()
            .or_else(kiln_cache::DiskCache::default_root)
        {
            Some(root) => kiln_cache::DiskCache::open(&root, kiln_cache::DiskLimits::default())
                .map(|c| Arc::new(c) as Arc<dyn kiln_cache::ObjectCache>)
                .map_err(|e| e.to_string()),
            None => {
                if o.verbose {
                    eprintln!(
                        "kiln: no object cache (none of KILN_CACHE_DIR, XDG_CACHE_HOME, HOME, \
                         XDG_RUNTIME_DIR is set); compiling"
                    );
                }
                return None;
            }
        },
    };
    match opened {
        Ok(cache) => Some(cache),
        Err(e) => {
            eprintln!("kiln: warning: no object cache ({e}); compiling");
            None
        }
    }
}

/// `kiln cache ACTION`.
fn cache(action: CacheAction, dir: Option<PathBuf>) -> Result<(), String> {
    let root = dir.or_else(kiln_cache::DiskCache::default_root).ok_or(
        "no cache directory: none of KILN_CACHE_DIR, XDG_CACHE_HOME, HOME, XDG_RUNTIME_DIR is set",
    )?;
    let cache = kiln_cache::DiskCache::open(&root, kiln_cache::DiskLimits::default())
        .map_err(|e| e.to_string())?;
    let images = kiln_cache::DiskImageCache::open(&root, kiln_cache::DiskLimits::default())
        .map_err(|e| e.to_string())?;
    match action {
        CacheAction::Stats => {
            let usage = images.usage().map_err(|e| e.to_string())?;
            println!("image cache: {}", images.dir().display());
            println!(
                "images: {} ({} bytes; temporary files: {})",
                usage.entries, usage.bytes, usage.temporaries
            );
            let usage = cache.usage().map_err(|e| e.to_string())?;
            let limits = kiln_cache::DiskLimits::default();
            println!("cache: {}", cache.dir().display());
            println!(
                "entries: {} of at most {}",
                usage.entries, limits.max_entries
            );
            println!("bytes: {} of at most {}", usage.bytes, limits.max_bytes);
            println!("temporary files: {}", usage.temporaries);
            let usage = launcher::usage(cache.root())?;
            println!("launchers: {}", launcher::dir(cache.root()).display());
            println!(
                "launchers: {} of at most {}, {} bytes of at most {}, {} temporary",
                usage.entries, limits.max_entries, usage.bytes, limits.max_bytes, usage.temporaries
            );
        }
        CacheAction::Clear => {
            let removed = cache.clear().map_err(|e| e.to_string())?;
            println!("removed {removed} entries from {}", cache.dir().display());
            let removed = images.clear().map_err(|e| e.to_string())?;
            println!("removed {removed} images from {}", images.dir().display());
            let removed = launcher::clear(cache.root())?;
            println!(
                "removed {removed} launchers from {}",
                launcher::dir(cache.root()).display()
            );
        }
        CacheAction::Prune => {
            let removed = cache.prune().map_err(|e| e.to_string())?;
            println!("evicted {removed} entries from {}", cache.dir().display());
            let removed = images.prune().map_err(|e| e.to_string())?;
            println!("evicted {removed} images from {}", images.dir().display());
            let removed = launcher::prune(cache.root(), &kiln_cache::DiskLimits::default())?;
            println!(
                "evicted {removed} launchers from {}",
                launcher::dir(cache.root()).display()
            );
        }
    }
    Ok(())
}

/// The name of a Windows exception code a crash report carries (`winnt.h`'s).
fn windows_exception_name(code: u32) -> Option<&'static str> {
    Some(match code {
        0xc000_0005 => "EXCEPTION_ACCESS_VIOLATION",
        0xc000_001d => "EXCEPTION_ILLEGAL_INSTRUCTION",
        0xc000_0096 => "EXCEPTION_PRIV_INSTRUCTION",
        0xc000_0094 => "EXCEPTION_INT_DIVIDE_BY_ZERO",
        0xc000_0095 => "EXCEPTION_INT_OVERFLOW",
        0xc000_00fd => "EXCEPTION_STACK_OVERFLOW",
        0x8000_0003 => "EXCEPTION_BREAKPOINT",
        0x8000_0004 => "EXCEPTION_SINGLE_STEP",
        0xc000_0006 => "EXCEPTION_IN_PAGE_ERROR",
        0x8000_0002 => "EXCEPTION_DATATYPE_MISALIGNMENT",
        0xc000_008c => "EXCEPTION_ARRAY_BOUNDS_EXCEEDED",
        0xc000_008e => "EXCEPTION_FLT_DIVIDE_BY_ZERO",
        0xc000_0409 => "STATUS_STACK_BUFFER_OVERRUN",
        _ => return None,
    })
}
