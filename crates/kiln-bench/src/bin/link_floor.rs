//! Figure of the link-graph issue: whole-process link time of Kiln against the *copy
//! floor* — a process that only maps the same input files and copies every byte once into
//! fresh memory, what any linker pays — and against mold invoked directly (the collect2
//! command line of `gcc -fuse-ld=mold`, run as `mold …`, without the driver), for x86-64,
//! AArch64 and RISC-V 64 inputs, side by side in one run, interleaved.
//!
//! ```text
//! cargo build --release -p kiln-bench -p kiln-cli && ./target/release/link_floor
//! ```
//!
//! Kiln is `kiln run --noexec` for x86-64 (this machine) and `kiln link --target aarch64`
//! or `riscv64` for the others (a link for chosen addresses, written to an ELF image file:
//! no executor to ask). The SQLite input is Debian's libsqlite3.a for x86-64 and AArch64,
//! and for RISC-V (Debian has no riscv64 packages here) SQLite's amalgamation compiled
//! from the source the crate libsqlite3-sys carries (tests/c-sources). `link_floor copy
//! FILE…` is the floor in fresh 4 KiB pages, `link_floor copy-huge FILE…` the floor in 2 MiB
//! transparent huge pages (`MADV_HUGEPAGE`): a ratio is met only against the second too. After the ratios, a table of where Kiln's time goes, phase by
//! phase and pass by pass, from one more run of each with `--show-times`. Then what a
//! call through a stub costs on each architecture: the instructions of the stub a link
//! made, read back from its image with `llvm-objdump-16`, from the stub's entry to its
//! indirect jump (a direct call has none), and the instructions a resolved call-through
//! stub (a lazy function's, as Kiln writes it) adds to each call, counted under qemu
//! (`-singlestep -d exec,nochain -dfilter` on the stub's page). Then start-up: `kiln run` of an empty `main`
//! against the natively linked empty program, CPU time of the whole process (from
//! `wait4`), interleaved.

use clap::Parser;
use kiln_bench::sh;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[derive(Parser, Debug)]
struct Args {
    /// `copy FILE…`: be the copy floor (map the files, copy every byte once, exit);
    /// `copy-huge FILE…`: the same into 2 MiB transparent huge pages.
    #[arg(trailing_var_arg = true)]
    copy: Vec<String>,
    /// Runs per command (the median is reported).
    #[arg(long, default_value_t = 21)]
    runs: usize,
    /// Scratch directory for the inputs.
    #[arg(long, default_value = "/tmp/kiln-link-floor")]
    dir: PathBuf,
    /// The architectures whose inputs are linked and timed (each one skipped, saying why,
    /// when its compiler or libraries are missing). The stub-call row is printed for every
    /// architecture whose compiler is here.
    #[arg(long, value_delimiter = ',', default_value = "x86-64,aarch64,riscv64")]
    arch: Vec<String>,
    /// Functions of the generated input, in 4 objects (the figure is 20,000; the test
    /// command's smoke run takes fewer: compiling 20,000 takes the compiler 25 s here).
    #[arg(long, default_value_t = 20_000)]
    functions: usize,
}

/// The floor: every input byte read once from a mapping of its file and written once into
/// fresh anonymous memory; with `huge`, memory that takes 2 MiB transparent huge pages
/// (`MADV_HUGEPAGE` on a 2 MiB-aligned range: one page fault per 2 MiB where the kernel
/// gives them, 512 fewer than with 4 KiB pages) — the floor a linker that commits its
/// output in huge pages could reach.
fn copy_floor(files: &[String], huge: bool) {
    let maps: Vec<memmap2::Mmap> = files
        .iter()
        .map(|f| {
            let file = std::fs::File::open(f).unwrap_or_else(|e| panic!("{f}: {e}"));
            // SAFETY: the files are inputs nobody modifies while this short process runs.
            unsafe { memmap2::Mmap::map(&file) }.unwrap_or_else(|e| panic!("{f}: {e}"))
        })
        .collect();
    let total: usize = maps.iter().map(|m| m.len()).sum();
    const HUGE: usize = 2 << 20;
    // With huge pages: 2 MiB more than needed, to start at a 2 MiB boundary.
    let len = if huge { total + HUGE } else { total.max(1) };
    let mut map = memmap2::MmapMut::map_anon(len).expect("anonymous memory");
    let skip = if huge {
        let misalign = map.as_ptr() as usize % HUGE;
        let skip = (HUGE - misalign) % HUGE;
        // SAFETY: advice on this process's own fresh anonymous mapping, inside it.
        unsafe {
            libc::madvise(
                map.as_mut_ptr().add(skip).cast(),
                len - skip,
                libc::MADV_HUGEPAGE,
            )
        };
        skip
    } else {
        0
    };
    let out = &mut map[skip..];
    let mut at = 0;
    for m in &maps {
        out[at..at + m.len()].copy_from_slice(m);
        at += m.len();
    }
    // The copy is used (the optimizer cannot drop it).
    let sum = out
        .iter()
        .step_by(4096)
        .fold(0u8, |a, &b| a.wrapping_add(b));
    std::hint::black_box(sum);
}

struct Input {
    name: String,
    files: Vec<PathBuf>,
    kiln: Command,
    /// The same command with `--show-times`.
    kiln_times: Command,
    mold: Option<Command>,
}

/// The `--show-times` lines of a kiln command: (phase or pass, milliseconds), in order.
fn show_times(cmd: &mut Command) -> Vec<(String, f64)> {
    let Ok(out) = cmd.stdout(Stdio::null()).stderr(Stdio::piped()).output() else {
        return Vec::new();
    };
    String::from_utf8_lossy(&out.stderr)
        .lines()
        .filter_map(|line| {
            let rest = line.strip_prefix("kiln: ")?.strip_suffix(" ms")?;
            let (name, value) = rest.trim_end().rsplit_once(' ')?;
            let name = name.trim();
            let label = match name.strip_prefix("pass ") {
                Some(pass) => format!("  {}", pass.trim()),
                None => name.to_string(),
            };
            Some((label, value.trim().parse().ok()?))
        })
        .collect()
}

/// One column per input, one row per phase and pass (in the order the first input gives
/// them); milliseconds.
fn print_times_table(names: &[String], columns: &[Vec<(String, f64)>]) {
    let mut rows: Vec<String> = Vec::new();
    for column in columns {
        for (label, _) in column {
            if !rows.contains(label) {
                rows.push(label.clone());
            }
        }
    }
    if rows.is_empty() {
        return;
    }
    // The whole command last.
    if let Some(i) = rows.iter().position(|r| r == "total") {
        let total = rows.remove(i);
        rows.push(total);
    }
    println!("\nwhere kiln's time goes (ms, one run with --show-times)\n");
    print!("{:<30}", "phase / pass");
    for name in names {
        print!(" {name:>15}");
    }
    println!();
    for row in rows {
        print!("{row:<30}");
        for column in columns {
            match column.iter().find(|(label, _)| *label == row) {
                Some((_, ms)) => print!(" {ms:>15.3}"),
                None => print!(" {:>15}", "-"),
            }
        }
        println!();
    }
}

/// `mold` with the arguments gcc's driver would give its linker (`-###`), so that mold
/// runs without the driver.
fn mold_command(driver: &str, args: &[String], out: &Path) -> Option<Command> {
    let output = Command::new(driver)
        .arg("-fuse-ld=mold")
        .arg("-###")
        .args(args)
        .arg("-o")
        .arg(out)
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&output.stderr);
    let line = text.lines().find(|l| l.contains("collect2"))?;
    let words: Vec<String> = line
        .split_whitespace()
        .map(|w| w.trim_matches('"').to_string())
        .skip(1)
        .filter(|w| {
            !w.starts_with("-plugin")
                && !w.starts_with("-fuse-ld")
                && !w.contains("liblto_plugin")
                && !w.contains("lto-wrapper")
                && w != "--fix-cortex-a53-843419"
        })
        .collect();
    let mut cmd = Command::new("mold");
    cmd.args(words);
    // Check that it links before timing it.
    let ok = Command::new("mold")
        .args(cmd.get_args())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    ok.then_some(cmd)
}

fn many_objects(dir: &Path, compiler: &str, suffix: &str, functions: usize) -> Vec<PathBuf> {
    // `functions` (20,000 for the figure) in 4 objects, each function in its own section,
    // called through tables from main; compiled side by side (each of the figure's takes
    // the compiler ~6 s).
    let per = (functions / 4).max(1);
    let mut objects = Vec::new();
    let mut compiles = Vec::new();
    for part in 0..4 {
        let c = dir.join(format!("many{part}-{per}.c"));
        if !c.exists() {
            let mut src = String::new();
            for i in 0..per {
                let n = part * per + i;
                src.push_str(&format!(
                    "int f{n}(int x) {{ return x * {} + {n}; }}\n",
                    n % 7 + 1
                ));
            }
            src.push_str(&format!("typedef int (*fn)(int);\nfn table{part}[] = {{"));
            for i in 0..per {
                src.push_str(&format!("f{},", part * per + i));
            }
            src.push_str("};\n");
            if part == 0 {
                src.push_str(&format!("#include <stdio.h>\nextern fn table1[], table2[], table3[];\nint main(void) {{ long s = 0; fn *t[] = {{table0, table1, table2, table3}}; for (int k = 0; k < 4; k++) for (int i = 0; i < {per}; i++) s += t[k][i](i); printf(\"%ld\\n\", s); return 0; }}\n"));
            }
            std::fs::write(&c, src).unwrap();
        }
        let o = dir.join(format!("many{part}-{per}{suffix}.o"));
        let command = format!(
            "{compiler} -O1 -ffunction-sections -c {} -o {}",
            c.display(),
            o.display()
        );
        let child = Command::new("sh").arg("-c").arg(&command).spawn();
        compiles.push((command, child.expect("sh runs")));
        objects.push(o);
    }
    for (command, mut child) in compiles {
        let status = child.wait().expect("the compiler runs");
        assert!(status.success(), "failed: {command}");
    }
    objects
}

/// SQLite's amalgamation from the crate libsqlite3-sys (tests/c-sources, which
/// scripts/test_deps.sh fetches).
fn sqlite_amalgamation() -> Option<PathBuf> {
    kiln_testkit::find_c_sources("libsqlite3-sys")
        .ok()
        .map(|dir| dir.join("sqlite3/sqlite3.c"))
        .filter(|c| c.exists())
}

fn prepare(dir: &Path, kiln: &Path, arches: &[String], functions: usize) -> Vec<Input> {
    std::fs::create_dir_all(dir).unwrap();
    let programs = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/programs");
    let d = dir.display();
    let mut inputs = Vec::new();
    // Debian's arm64 libraries: the private sysroot scripts/test_deps.sh fills, or the
    // machine's multiarch directory.
    let arm64 = std::env::var_os("KILN_AARCH64_SYSROOT")
        .map(|root| PathBuf::from(root).join("usr/lib/aarch64-linux-gnu"))
        .unwrap_or_else(|| "/usr/lib/aarch64-linux-gnu".into());
    for (arch, compiler, suffix) in [
        ("x86-64", "cc", ""),
        ("aarch64", "aarch64-linux-gnu-gcc", "-a64"),
        ("riscv64", "riscv64-linux-gnu-gcc", "-rv64"),
    ] {
        if !arches.iter().any(|a| a == arch) {
            continue;
        }
        if Command::new(compiler).arg("--version").output().is_err() {
            eprintln!("{arch}: {compiler} missing, skipped");
            continue;
        }
        let sqlite_lib = match arch {
            "x86-64" => Some(PathBuf::from("/usr/lib/x86_64-linux-gnu/libsqlite3.a")),
            "aarch64" => Some(arm64.join("libsqlite3.a")),
            // Compiled once from the amalgamation (-O1: 17 s here), kept in `dir`.
            _ => sqlite_amalgamation().map(|source| {
                let object = dir.join(format!("sqlite3{suffix}.o"));
                if !object.exists() {
                    sh(&format!(
                        "{compiler} -O1 -c {} -o {}",
                        source.display(),
                        object.display()
                    ));
                }
                object
            }),
        };
        let Some(sqlite_lib) = sqlite_lib.filter(|l| l.exists()) else {
            eprintln!("{arch}: SQLite missing (libsqlite3.a, or the amalgamation of tests/c-sources), skipped");
            continue;
        };
        let includes = match sqlite_amalgamation() {
            Some(source) if arch == "riscv64" => {
                format!("-I{}", source.parent().unwrap().display())
            }
            _ => String::new(),
        };
        sh(&format!(
            "{compiler} -O2 {includes} -c {}/sqlite_driver.c -o {d}/sqlite_driver{suffix}.o",
            programs.display()
        ));
        let sqlite = vec![dir.join(format!("sqlite_driver{suffix}.o")), sqlite_lib];
        let many = many_objects(dir, compiler, suffix, functions);
        for (name, files, libs) in [("sqlite", sqlite, vec!["-lm"]), ("many", many, vec![])] {
            let command = || {
                let mut k = Command::new(kiln);
                if arch == "x86-64" {
                    k.args(["run", "--noexec"]).args(&files).args(&libs);
                } else {
                    k.args(["link", "--target", arch, "--allow-undefined", "-o"])
                        .arg(dir.join(format!("{name}{suffix}.elf")))
                        .args(&files);
                }
                k
            };
            let k = command();
            let mut kiln_times = command();
            kiln_times.arg("--show-times");
            let mut args: Vec<String> = files.iter().map(|f| f.display().to_string()).collect();
            args.extend(libs.iter().map(|s| s.to_string()));
            let mold = mold_command(compiler, &args, &dir.join(format!("{name}{suffix}.mold")));
            if mold.is_none() {
                eprintln!("{arch} {name}: mold could not link it directly; not compared");
            }
            inputs.push(Input {
                name: format!("{name} {arch}"),
                files,
                kiln: k,
                kiln_times,
                mold,
            });
        }
    }
    inputs
}

fn time(cmd: &mut Command) -> Option<Duration> {
    let start = Instant::now();
    let status = cmd
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .ok()?;
    status.success().then(|| start.elapsed())
}

fn median(mut v: Vec<Duration>) -> Option<Duration> {
    v.sort();
    v.get(v.len() / 2).copied()
}

fn ms(d: Option<Duration>) -> String {
    d.map_or_else(
        || "failed".into(),
        |d| format!("{:.2} ms", d.as_secs_f64() * 1e3),
    )
}

fn main() {
    let args = Args::parse();
    match args.copy.first().map(String::as_str) {
        Some("copy") => return copy_floor(&args.copy[1..], false),
        Some("copy-huge") => return copy_floor(&args.copy[1..], true),
        _ => {}
    }
    let me = std::env::current_exe().unwrap();
    let kiln = me.with_file_name("kiln");
    let inputs = prepare(&args.dir, &kiln, &args.arch, args.functions);
    println!("whole process, median of {} interleaved runs\n", args.runs);
    println!(
        "{:<16} {:>10} {:>10} {:>11} {:>10} {:>11} {:>12} {:>10}",
        "input", "kiln", "floor", "floor 2MiB", "mold", "kiln/floor", "kiln/2MiB fl", "kiln/mold"
    );
    let mut verdicts = Vec::new();
    let (mut names, mut columns) = (Vec::new(), Vec::new());
    for mut input in inputs {
        names.push(input.name.clone());
        columns.push(show_times(&mut input.kiln_times));
        let mut floor = Command::new(&me);
        floor.arg("copy").args(&input.files);
        let mut huge_floor = Command::new(&me);
        huge_floor.arg("copy-huge").args(&input.files);
        let (mut k, mut f, mut h, mut m) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for _ in 0..args.runs {
            k.extend(time(&mut input.kiln));
            f.extend(time(&mut floor));
            h.extend(time(&mut huge_floor));
            if let Some(mold) = &mut input.mold {
                m.extend(time(mold));
            }
        }
        let (k, f, h, m) = (median(k), median(f), median(h), median(m));
        let ratio = |a: Option<Duration>, b: Option<Duration>| match (a, b) {
            (Some(a), Some(b)) => Some(a.as_secs_f64() / b.as_secs_f64()),
            _ => None,
        };
        let kf = ratio(k, f);
        let kh = ratio(k, h);
        let km = ratio(k, m);
        let show = |r: Option<f64>| r.map_or_else(|| "-".into(), |r| format!("{r:.2}x"));
        println!(
            "{:<16} {:>10} {:>10} {:>11} {:>10} {:>11} {:>12} {:>10}",
            input.name,
            ms(k),
            ms(f),
            ms(h),
            ms(m),
            show(kf),
            show(kh),
            show(km)
        );
        if let Some(r) = kf {
            verdicts.push(format!(
                "{}: kiln / copy floor {r:.2}x, target <= 2.00x: {}",
                input.name,
                kiln_bench::verdict(r <= 2.0)
            ));
        }
        if let Some(r) = kh {
            verdicts.push(format!(
                "{}: kiln / copy floor in 2 MiB pages {r:.2}x, target <= 2.00x: {}",
                input.name,
                kiln_bench::verdict(r <= 2.0)
            ));
        }
        if let Some(r) = km {
            verdicts.push(format!(
                "{}: kiln / mold {r:.2}x, target < 1.00x: {}",
                input.name,
                kiln_bench::verdict(r < 1.0)
            ));
        }
    }
    print_times_table(&names, &columns);
    stub_calls(&args.dir, &kiln);
    verdicts.extend(start_up(&args.dir, &kiln, args.runs * 4));
    println!();
    for v in verdicts {
        println!("{v}");
    }
}

/// `kiln run` of an empty `main` against the same program linked natively: median CPU
/// time (user + system) of `runs` interleaved runs of each; the verdict line.
fn start_up(dir: &Path, kiln: &Path, runs: usize) -> Option<String> {
    let source = dir.join("empty.c");
    std::fs::write(&source, "int main(void) { return 0; }\n").ok()?;
    let (object, native) = (dir.join("empty.o"), dir.join("empty_native"));
    let d = dir.display();
    sh(&format!(
        "cc -O2 -c {d}/empty.c -o {d}/empty.o && cc -O2 {d}/empty.c -o {d}/empty_native"
    ));
    let object = object.to_str()?;
    let (mut k, mut n) = (Vec::new(), Vec::new());
    for _ in 0..runs {
        k.extend(kiln_bench::cpu_time_of(kiln, &["run", object]));
        n.extend(kiln_bench::cpu_time_of(&native, &[]));
    }
    let (k, n) = (median(k)?, median(n)?);
    let ratio = k.as_secs_f64() / n.as_secs_f64();
    println!(
        "\nstart-up, CPU time, median of {runs} interleaved runs: kiln run empty.o {}, native {}: {ratio:.2}x",
        ms(Some(k)),
        ms(Some(n))
    );
    Some(format!(
        "start-up: kiln run of an empty main / native {ratio:.2}x, target <= 2.00x (aim 1.3x): {}",
        kiln_bench::verdict(ratio <= 2.0)
    ))
}

/// What a call through a stub adds to a direct call, per architecture: the instructions
/// from the stub's entry to its indirect jump, in the image of a link whose program calls
/// a host function out of a direct call's reach (`--defsym` 500 GiB away).
fn stub_calls(dir: &Path, kiln: &Path) {
    let source = dir.join("stub_call.c");
    let program = "#include <unistd.h>\nint main(void) { return getpid() & 1; }\n";
    if std::fs::write(&source, program).is_err() {
        return;
    }
    println!("\ncall through a stub, instructions added to a direct call (from the linked image):");
    for (arch, compiler, objdump_options) in [
        ("x86-64", "cc", ""),
        ("aarch64", "aarch64-linux-gnu-gcc", ""),
        ("riscv64", "riscv64-linux-gnu-gcc", "--mattr=+m,+a,+f,+d,+c"),
    ] {
        let (object, image) = (
            dir.join(format!("stub_call-{arch}.o")),
            dir.join(format!("stub_call-{arch}.elf")),
        );
        let built = Command::new(compiler)
            .args(["-O2", "-c"])
            .arg(&source)
            .arg("-o")
            .arg(&object)
            .status()
            .is_ok_and(|s| s.success())
            && Command::new(kiln)
                .args([
                    "link",
                    "--target",
                    arch,
                    "--defsym",
                    "getpid=0x7d0000000000",
                    "-o",
                ])
                .arg(&image)
                .arg(&object)
                .stdout(Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
        let listing = built
            .then(|| {
                Command::new("llvm-objdump-16")
                    .arg("-d")
                    .args(objdump_options.split_whitespace())
                    .arg(&image)
                    .output()
                    .ok()
            })
            .flatten();
        let Some(listing) = listing else {
            println!("  {arch:<8} not measured ({compiler}, kiln link or llvm-objdump-16 failed)");
            continue;
        };
        let text = String::from_utf8_lossy(&listing.stdout);
        // The instructions of `getpid@plt`, up to and with its indirect jump.
        let mut stub = Vec::new();
        let mut inside = false;
        for line in text.lines() {
            if line.ends_with("<getpid@plt>:") {
                inside = true;
                continue;
            }
            if !inside {
                continue;
            }
            let Some((_, rest)) = line.trim_start().split_once(": ") else {
                if line.trim().is_empty() && !stub.is_empty() {
                    break;
                }
                continue;
            };
            let insn = rest
                .split_once('\t')
                .map_or("", |(_, text)| text)
                .replace('\t', " ");
            let jump = insn.starts_with("jmpq *")
                || insn.starts_with("jmp *")
                || insn.starts_with("br ")
                || insn.starts_with("jr ");
            stub.push(insn);
            if jump {
                break;
            }
        }
        if stub.is_empty() {
            println!("  {arch:<8} not measured (no getpid@plt in the image)");
        } else {
            println!(
                "  {arch:<8} +{} instructions: {}",
                stub.len(),
                stub.join("; ")
            );
        }
    }
    resolved_stub_calls(dir);
}

/// Where the harness of [`resolved_stub_calls`] maps the stub's code and its slots: fixed,
/// so that qemu's log can be filtered to the stub's page (below 2^38 for RISC-V's Sv39).
const STUB_PAGE: u64 = 0x20_0000_0000;
const SLOT_PAGE: u64 = STUB_PAGE + 0x1000;

/// The guest program that calls through a resolved call-through stub: the stub's code
/// (Kiln's, from a file) at [`STUB_PAGE`], its slot pointing at `body`, the entry's slot
/// at `abort` (a resolved stub never reaches its entry).
const STUB_HARNESS: &str = r#"
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
__attribute__((noinline)) long body(long x) { return x + 1; }
int main(int argc, char **argv) {
    if (argc != 3) return 2;
    unsigned char bytes[4096];
    FILE *f = fopen(argv[1], "rb");
    if (!f) return 2;
    size_t len = fread(bytes, 1, sizeof bytes, f);
    fclose(f);
    long n = atol(argv[2]);
    int flags = MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE;
    unsigned char *code = mmap((void *)STUB_PAGE, 4096, PROT_READ | PROT_WRITE, flags, -1, 0);
    uint64_t *slots = mmap((void *)SLOT_PAGE, 4096, PROT_READ | PROT_WRITE, flags, -1, 0);
    if (code != (void *)STUB_PAGE || slots != (void *)SLOT_PAGE) return 3;
    memcpy(code, bytes, len);
    if (mprotect(code, 4096, PROT_READ | PROT_EXEC)) return 4;
    __builtin___clear_cache((char *)code, (char *)code + len);
    slots[0] = (uint64_t)(uintptr_t)body;
    slots[1] = (uint64_t)(uintptr_t)abort;
    long (*stub)(long) = (long (*)(long))(uintptr_t)STUB_PAGE;
    long sum = 0;
    for (long i = 0; i < n; i++) sum += stub(i);
    printf("%ld\n", sum);
    return 0;
}
"#;

/// What a resolved call-through stub adds to a call, counted under qemu: the guest
/// harness calls `body` through Kiln's stub (written for the harness's addresses by
/// `kiln_link::call_through`) `CALLS` times, one instruction per translation block, with
/// qemu logging each block run on the stub's page only. A direct call runs nothing there:
/// the count per call is what the stub adds.
fn resolved_stub_calls(dir: &Path) {
    const CALLS: u64 = 10_000;
    println!(
        "\nresolved call-through stub (a lazy function's), instructions added to a direct call (counted under qemu, {CALLS} calls):"
    );
    let source = dir.join("stub_harness.c");
    if std::fs::write(&source, STUB_HARNESS).is_err() {
        return;
    }
    for (arch, architecture, compiler, qemu) in [
        (
            "x86-64",
            kiln::Architecture::X86_64,
            "cc",
            "qemu-x86_64-static",
        ),
        (
            "aarch64",
            kiln::Architecture::Aarch64,
            "aarch64-linux-gnu-gcc",
            "qemu-aarch64-static",
        ),
        (
            "riscv64",
            kiln::Architecture::Riscv64,
            "riscv64-linux-gnu-gcc",
            "qemu-riscv64-static",
        ),
    ] {
        let stubs = architecture.call_through();
        let mut code = vec![0u8; stubs.code_size(1)];
        if stubs
            .write_code(&mut code, 0..1, Some((STUB_PAGE, SLOT_PAGE)))
            .is_err()
        {
            println!("  {arch:<8} not measured (the stub cannot reach its slot)");
            continue;
        }
        let (code_file, harness, log) = (
            dir.join(format!("stub_code-{arch}.bin")),
            dir.join(format!("stub_harness-{arch}")),
            dir.join(format!("stub_harness-{arch}.log")),
        );
        let built = std::fs::write(&code_file, &code).is_ok()
            && Command::new(compiler)
                .args(["-O2", "-static"])
                .arg(format!("-DSTUB_PAGE={STUB_PAGE:#x}UL"))
                .arg(format!("-DSLOT_PAGE={SLOT_PAGE:#x}UL"))
                .arg(&source)
                .arg("-o")
                .arg(&harness)
                .status()
                .is_ok_and(|s| s.success());
        let _ = std::fs::remove_file(&log);
        let ran = built
            && Command::new(qemu)
                .args(["-singlestep", "-d", "exec,nochain", "-dfilter"])
                .arg(format!("{STUB_PAGE:#x}+0x1000"))
                .arg("-D")
                .arg(&log)
                .arg(&harness)
                .arg(&code_file)
                .arg(CALLS.to_string())
                .stdout(Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
        let Some(text) = ran.then(|| std::fs::read_to_string(&log).ok()).flatten() else {
            println!("  {arch:<8} not measured ({compiler} -static or {qemu} failed)");
            continue;
        };
        // `Trace N: HOST [FLAGS/PC/…] …`: one line per instruction run on the page.
        let pcs: Vec<u64> = text
            .lines()
            .filter(|l| l.starts_with("Trace "))
            .filter_map(|l| {
                let fields = l.split_once('[')?.1.split('/').nth(1)?;
                u64::from_str_radix(fields, 16).ok()
            })
            .collect();
        let entry = STUB_PAGE + kiln_link::call_through::STUB_ENTRY;
        let in_entry = pcs.iter().filter(|&&pc| pc >= entry).count();
        println!(
            "  {arch:<8} +{:.2} instructions per call ({} run on the stub's page; its entry half {in_entry} times)",
            pcs.len() as f64 / CALLS as f64,
            pcs.len()
        );
    }
}
