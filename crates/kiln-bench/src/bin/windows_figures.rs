//! Figures of "COFF and ELF objects on a Windows host", side by side in one run:
//!
//! 1. The SQLite program (SQLite's amalgamation from the source `libsqlite3-sys` carries,
//!    and tests/programs/sqlite_driver.c; `--opt`, -O2 by default) under Wine: `kiln run
//!    --connect` to the Windows executor (link + run) of COFF objects compiled by
//!    `x86_64-w64-mingw32-gcc -O2 -c`, and of ELF objects compiled by `clang-16
//!    --target=x86_64-w64-windows-gnu-elf -O2`, against the native program: the same COFF
//!    objects linked by mingw-w64 and run by Wine; whole runs, wall clock, interleaved,
//!    medians.
//! 2. Kiln's link of that program for the Windows executor against its link for Linux
//!    (the same source compiled by `clang-16 -O2` for x86-64 Linux, linked in process):
//!    the link phases `kiln run --noexec --show-times` prints (parse to finalize), and
//!    the whole `kiln run --noexec`.
//!
//! Needs clang-16, mingw-w64 and wine64 (scripts/test_deps.sh installs them); says what is
//! missing otherwise.

use clap::Parser;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[derive(Parser, Debug)]
struct Args {
    /// Runs of each (interleaved; medians reported).
    #[arg(long, default_value_t = 7)]
    runs: usize,
    /// Scratch directory.
    #[arg(long, default_value = "/tmp/kiln-windows-figures")]
    dir: PathBuf,
    /// The kiln binary (default: next to this one).
    #[arg(long)]
    kiln: Option<PathBuf>,
    /// The optimization level every build uses (the figures: -O2; the test command's
    /// smoke run: -O0, which compiles the amalgamation in seconds).
    #[arg(long, default_value = "-O2", allow_hyphen_values = true)]
    opt: String,
}

fn wine() -> Command {
    kiln_testkit::wine(&std::env::temp_dir().join("kiln-windows-figures-wine"))
}

fn run_ok(command: &mut Command, what: &str) -> Result<(), String> {
    let status = command.status().map_err(|e| format!("{what}: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("{what}: {status}"))
    }
}

/// Compiles each source with `compiler FLAGS -c` into `dir`, in parallel.
fn compile(
    compiler: &[&str],
    flags: &[String],
    sources: &[PathBuf],
    dir: &Path,
) -> Result<Vec<PathBuf>, String> {
    let jobs: Vec<(PathBuf, std::process::Child)> = sources
        .iter()
        .map(|source| {
            let stem = source.file_stem().unwrap_or_default().to_string_lossy();
            let object = dir.join(format!("{stem}.o"));
            Command::new(compiler[0])
                .args(&compiler[1..])
                .args(flags)
                .arg("-c")
                .arg(source)
                .arg("-o")
                .arg(&object)
                .spawn()
                .map(|child| (object, child))
                .map_err(|e| format!("{}: {e}", compiler[0]))
        })
        .collect::<Result<_, _>>()?;
    jobs.into_iter()
        .map(|(object, mut child)| match child.wait() {
            Ok(s) if s.success() => Ok(object),
            _ => Err(format!("{compiler:?} failed for {}", object.display())),
        })
        .collect()
}

/// The sum of the link phases `--show-times` printed (parse, resolve, layout, fixup,
/// finalize), ms.
fn link_ms(stderr: &str) -> Option<f64> {
    let phases = ["parse", "resolve", "layout", "fixup", "finalize"];
    let mut sum = 0.0;
    let mut seen = 0;
    for line in stderr.lines() {
        let Some(rest) = line.strip_prefix("kiln: ") else {
            continue;
        };
        let mut words = rest.split_whitespace();
        let (Some(name), Some(value)) = (words.next(), words.next()) else {
            continue;
        };
        if phases.contains(&name) && words.next() == Some("ms") {
            sum += value.parse::<f64>().ok()?;
            seen += 1;
        }
    }
    (seen == phases.len()).then_some(sum)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn timed(command: &mut Command) -> Result<(Duration, std::process::Output), String> {
    let start = Instant::now();
    let out = command.output().map_err(|e| e.to_string())?;
    let took = start.elapsed();
    if !out.status.success() {
        return Err(format!(
            "{command:?}: {} ({})",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok((took, out))
}

fn main() {
    let args = Args::parse();
    if let Err(why) = figures(&args) {
        // A failure, not a skip: the test command installs what this needs.
        println!("windows figures not measured: {why}");
        std::process::exit(1);
    }
}

fn figures(args: &Args) -> Result<(), String> {
    let next_to_this = std::env::current_exe().map(|e| e.with_file_name("kiln"));
    let kiln = match &args.kiln {
        Some(kiln) => kiln.clone(),
        None => next_to_this.map_err(|e| format!("this binary's path: {e}"))?,
    };
    std::fs::create_dir_all(&args.dir).map_err(|e| e.to_string())?;
    let sqlite = kiln_testkit::find_c_sources("libsqlite3-sys")?.join("sqlite3");
    let repo = kiln_testkit::repository();
    let sources = vec![
        sqlite.join("sqlite3.c"),
        repo.join("tests/programs/sqlite_driver.c"),
    ];
    let include = format!("-I{}", sqlite.display());
    let flags = vec![args.opt.clone(), include.clone()];
    let (windows_dir, linux_dir) = (args.dir.join("windows"), args.dir.join("linux"));
    for dir in [&windows_dir, &linux_dir] {
        std::fs::create_dir_all(dir).map_err(|e| e.to_string())?;
    }
    let windows = compile(
        &["clang-16", "--target=x86_64-w64-windows-gnu-elf"],
        &flags,
        &sources,
        &windows_dir,
    )?;
    let linux = compile(&["clang-16"], &flags, &sources, &linux_dir)?;
    let coff_dir = args.dir.join("coff");
    std::fs::create_dir_all(&coff_dir).map_err(|e| e.to_string())?;
    let coff = compile(&["x86_64-w64-mingw32-gcc"], &flags, &sources, &coff_dir)?;
    // The native program: the same COFF objects, linked by mingw-w64.
    let native = args.dir.join("sqlite-native.exe");
    run_ok(
        Command::new("x86_64-w64-mingw32-gcc")
            .args(&coff)
            .arg("-o")
            .arg(&native),
        "x86_64-w64-mingw32-gcc",
    )?;
    // The executor, under Wine (its prefix made by a first run).
    let executor = args.dir.join("kiln-executor-win");
    run_ok(
        Command::new("bash")
            .arg(repo.join("executor-c/build.sh"))
            .arg(&executor)
            .arg("x86_64-w64-mingw32-gcc"),
        "executor-c/build.sh",
    )?;
    run_ok(
        wine()
            .args(["cmd.exe", "/c", "exit"])
            .stdout(Stdio::null())
            .stderr(Stdio::null()),
        "wine",
    )?;
    let listening = kiln_testkit::start_listening(
        wine()
            .arg(executor.with_extension("exe"))
            .args(["--listen", "127.0.0.1:0", "--key-file"])
            .arg(kiln_testkit::key_file()),
    );
    let address = listening.address.clone();

    let kiln_windows_of = |objects: &[PathBuf], noexec: bool| {
        let mut c = Command::new(&kiln);
        c.args(["run", "--connect", &address, "--key-file"])
            .arg(kiln_testkit::key_file());
        if noexec {
            c.args(["--noexec", "--show-times"]);
        }
        c.args(objects);
        c
    };
    let kiln_windows = |noexec: bool| kiln_windows_of(&windows, noexec);
    let kiln_coff = || kiln_windows_of(&coff, false);
    let kiln_linux = || {
        let mut c = Command::new(&kiln);
        c.args(["run", "--noexec", "--show-times"]).args(&linux);
        c
    };
    // One run of each first: outputs checked equal, caches warm.
    let (_, here) = timed(&mut kiln_windows(false))?;
    let (_, there) = timed(wine().arg(&native))?;
    let (_, coff_run) = timed(&mut kiln_coff())?;
    if here.stdout != there.stdout || coff_run.stdout != there.stdout {
        return Err("Kiln-linked and native output differ".into());
    }
    let (mut kiln_whole, mut native_whole, mut coff_whole) = (Vec::new(), Vec::new(), Vec::new());
    let (mut link_windows, mut link_linux, mut noexec_windows, mut noexec_linux) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for _ in 0..args.runs {
        kiln_whole.push(timed(&mut kiln_windows(false))?.0.as_secs_f64() * 1e3);
        native_whole.push(timed(wine().arg(&native))?.0.as_secs_f64() * 1e3);
        coff_whole.push(timed(&mut kiln_coff())?.0.as_secs_f64() * 1e3);
        let (took, out) = timed(&mut kiln_windows(true))?;
        noexec_windows.push(took.as_secs_f64() * 1e3);
        link_windows.push(link_ms(&String::from_utf8_lossy(&out.stderr)).ok_or("no link times")?);
        let (took, out) = timed(&mut kiln_linux())?;
        noexec_linux.push(took.as_secs_f64() * 1e3);
        link_linux.push(link_ms(&String::from_utf8_lossy(&out.stderr)).ok_or("no link times")?);
    }
    let (kw, nw, cw) = (median(kiln_whole), median(native_whole), median(coff_whole));
    let (lw, ll) = (median(link_windows), median(link_linux));
    let (ew, el) = (median(noexec_windows), median(noexec_linux));
    println!(
        "SQLite program under Wine, whole run, median of {} interleaved runs:",
        args.runs
    );
    println!("  native mingw-w64 .exe under wine:      {nw:8.1} ms");
    println!(
        "  kiln run --connect, COFF (mingw gcc):  {cw:8.1} ms  {:5.2}x native",
        cw / nw
    );
    println!(
        "  kiln run --connect, ELF (clang):       {kw:8.1} ms  {:5.2}x native",
        kw / nw
    );
    println!("Kiln's link of the same source, Windows target vs Linux (medians):");
    println!(
        "  link phases (parse..finalize): Windows {lw:7.2} ms, Linux {ll:7.2} ms: {:.2}x",
        lw / ll
    );
    println!(
        "  kiln run --noexec, whole:      Windows {ew:7.1} ms, Linux {el:7.1} ms: {:.2}x",
        ew / el
    );
    Ok(())
}
