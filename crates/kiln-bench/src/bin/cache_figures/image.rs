//! 4. The linked-image cache, side by side in one run: for SQLite and Lua (Debian's static
//!    libraries) and a program of many functions in five objects, the native executable,
//!    `kiln run` mapping the program from the image cache (warm) and `kiln run
//!    --no-image-cache` (a link every time), whole processes, interleaved; the image
//!    cache's own cost on a hit against the link it saves (in process, from the link
//!    report); and the proportional resident memory (PSS) of the image's pages per process
//!    with one and with ten processes running the program at once.

use super::{median, ms, time as run};
use kiln::Input;
use kiln_bench::sh;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

/// One program: its objects and libraries (`kiln run` arguments), its arguments.
struct Program {
    name: &'static str,
    inputs: Vec<String>,
    args: Vec<String>,
    native: PathBuf,
}

/// `functions` functions in five objects, each in its own section, called through tables
/// from main; with an argument, main waits for a line on stdin before it returns (to
/// measure the memory of processes running at once).
fn many(dir: &Path, functions: usize) -> Vec<String> {
    let per = (functions / 5).max(1);
    let mut objects = Vec::new();
    for part in 0..5 {
        let c = dir.join(format!("many{part}.c"));
        let mut src = String::new();
        for i in 0..per {
            let n = part * per + i;
            src.push_str(&format!(
                "int f{n}(int x) {{ int s = 0; for (int k = 0; k < (x & 15); k++) s += k * {} ^ {n}; return s; }}\n",
                n % 7 + 1
            ));
        }
        src.push_str(&format!("typedef int (*fn)(int);\nfn table{part}[] = {{"));
        for i in 0..per {
            src.push_str(&format!("f{},", part * per + i));
        }
        src.push_str("};\n");
        if part == 0 {
            src.push_str(&format!(
                "#include <stdio.h>\nextern fn table1[], table2[], table3[], table4[];\n\
                 int main(int argc, char **argv) {{ long s = 0; fn *t[] = {{table0, table1, table2, table3, table4}};\n\
                 for (int r = 0; r < 10; r++) for (int k = 0; k < 5; k++) for (int i = 0; i < {per}; i++) s += t[k][i](i + r);\n\
                 printf(\"%ld\\n\", s); fflush(stdout); if (argc > 1) getchar(); return 0; }}\n"
            ));
        }
        std::fs::write(&c, src).unwrap();
        let o = dir.join(format!("many{part}.o"));
        objects.push((c, o));
    }
    let children: Vec<_> = objects
        .iter()
        .map(|(c, o)| {
            Command::new("cc")
                .args(["-O1", "-ffunction-sections", "-c"])
                .arg(c)
                .arg("-o")
                .arg(o)
                .spawn()
                .expect("cc runs")
        })
        .collect();
    for mut child in children {
        assert!(child.wait().unwrap().success());
    }
    objects
        .into_iter()
        .map(|(_, o)| o.display().to_string())
        .collect()
}

fn programs(dir: &Path, functions: usize) -> Vec<Program> {
    let repo = kiln_testkit::repository();
    let src = repo.join("tests/programs");
    let lib = "/usr/lib/x86_64-linux-gnu";
    let mut list = Vec::new();
    let sqlite = format!("{lib}/libsqlite3.a");
    if Path::new(&sqlite).exists() {
        sh(&format!(
            "cc -O2 -fPIE -c {} -o {d}/sqlite_driver.o && cc {d}/sqlite_driver.o {sqlite} -lm -o {d}/sqlite.native",
            src.join("sqlite_driver.c").display(),
            d = dir.display()
        ));
        list.push(Program {
            name: "sqlite",
            inputs: vec![
                format!("{}/sqlite_driver.o", dir.display()),
                sqlite,
                "-lm".into(),
            ],
            args: vec![],
            native: dir.join("sqlite.native"),
        });
    }
    let lua = format!("{lib}/liblua5.4.a");
    if Path::new(&lua).exists() {
        sh(&format!(
            "cc -O2 -fPIE -I/usr/include/lua5.4 -c {} -o {d}/lua_driver.o && cc {d}/lua_driver.o {lua} -lm -o {d}/lua.native",
            src.join("lua_driver.c").display(),
            d = dir.display()
        ));
        list.push(Program {
            name: "lua",
            inputs: vec![format!("{}/lua_driver.o", dir.display()), lua, "-lm".into()],
            args: vec![src.join("script.lua").display().to_string()],
            native: dir.join("lua.native"),
        });
    }
    let objects = many(dir, functions);
    sh(&format!(
        "cc {} -o {}/many.native",
        objects.join(" "),
        dir.display()
    ));
    list.push(Program {
        name: "many",
        inputs: objects,
        args: vec![],
        native: dir.join("many.native"),
    });
    list
}

/// `kiln run [flags] INPUTS -- ARGS` with the image cache in `cache`.
fn kiln_run(kiln: &Path, cache: &Path, p: &Program, flags: &[&str], args: &[String]) -> Command {
    let mut c = Command::new(kiln);
    c.env("KILN_CACHE_DIR", cache)
        .arg("run")
        .args(flags)
        .args(&p.inputs)
        .arg("--")
        .args(args);
    c
}

/// The proportional resident bytes of the executable mappings of `pid` whose file name
/// ends with `.kimg` (the image's code pages), and their resident bytes.
fn image_pss(pid: u32) -> (u64, u64) {
    let smaps = std::fs::read_to_string(format!("/proc/{pid}/smaps")).unwrap_or_default();
    let (mut pss, mut rss, mut inside) = (0, 0, false);
    for line in smaps.lines() {
        let first = line.split_whitespace().next().unwrap_or("");
        if first.contains('-') && !first.ends_with(':') {
            let perms = line.split_whitespace().nth(1).unwrap_or("");
            inside = line.ends_with(".kimg") && perms.contains('x');
            continue;
        }
        if !inside {
            continue;
        }
        let kb = |l: &str| {
            l.split_whitespace()
                .nth(1)
                .and_then(|v| v.parse::<u64>().ok())
        };
        if line.starts_with("Pss:") {
            pss += kb(line).unwrap_or(0) * 1024;
        } else if line.starts_with("Rss:") {
            rss += kb(line).unwrap_or(0) * 1024;
        }
    }
    (pss, rss)
}

/// Starts `n` processes of the program at once (each waits on stdin once it has printed
/// its result), measures each one's image PSS, then lets them finish. The mean PSS and
/// RSS per process.
fn pss_with(kiln: &Path, cache: &Path, p: &Program, n: usize) -> (u64, u64) {
    let mut children: Vec<_> = (0..n)
        .map(|_| {
            kiln_run(kiln, cache, p, &[], &["wait".into()])
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::null())
                .spawn()
                .expect("kiln runs")
        })
        .collect();
    for child in &mut children {
        let mut line = String::new();
        let stdout = child.stdout.as_mut().expect("piped");
        BufReader::new(stdout).read_line(&mut line).unwrap();
    }
    let figures: Vec<(u64, u64)> = children.iter().map(|c| image_pss(c.id())).collect();
    for mut child in children {
        let _ = child.stdin.take().map(|mut s| s.write_all(b"\n"));
        let _ = child.wait();
    }
    let pss = figures.iter().map(|f| f.0).sum::<u64>() / n as u64;
    let rss = figures.iter().map(|f| f.1).sum::<u64>() / n as u64;
    (pss, rss)
}

/// The image cache's cost on a hit (look up and check, decode, map, rebind) and the link
/// it saves (parse, resolve, lay out, fix up, finalize), in process, median of `runs`.
fn hit_cost(dir: &Path, p: &Program, runs: usize) -> (Duration, Duration) {
    let cache = dir.join(format!("inprocess-{}", p.name));
    let images = std::sync::Arc::new(
        kiln::cache::DiskImageCache::open(&cache, kiln_cache::DiskLimits::default()).unwrap(),
    );
    let key = {
        let mut k = kiln::cache::ImageKeyBuilder::new("cache_figures");
        k.text("program", p.name);
        k.finish()
    };
    let link = |cached: bool| -> kiln::link::LinkReport {
        let mut builder = kiln::Jit::builder().noexec(true);
        if cached {
            builder = builder.image_cache(images.clone());
        }
        let jit = builder.build().unwrap();
        let lib = jit.main_library();
        for input in &p.inputs {
            if let Some(name) = input.strip_prefix("-l") {
                jit.library(lib)
                    .add(Input::library_by_name(name, &[]))
                    .unwrap();
            } else if input.ends_with(".a") {
                let bytes = kiln::map_file(Path::new(input)).unwrap();
                jit.library(lib)
                    .add(Input::archive_shared(input, bytes))
                    .unwrap();
            } else {
                jit.library(lib).add(Input::object_file(input)).unwrap();
            }
        }
        jit.library(lib).add(Input::ProcessSymbols).unwrap();
        let (_, report) = if cached {
            jit.link_pending_cached(lib, &key)
        } else {
            jit.link_pending(lib)
        }
        .unwrap()
        .expect("a module");
        report
    };
    link(true); // stores
                // Past the racy seconds, the first hit checks the image whole and stamps it.
    std::thread::sleep(kiln_cache::RACY + Duration::from_millis(100));
    link(true);
    let mut hits = Vec::new();
    let mut links = Vec::new();
    for _ in 0..runs {
        let report = link(true);
        assert!(
            matches!(report.image, Some(kiln::cache::ImageOutcome::Mapped { .. })),
            "{:?}",
            report.image
        );
        hits.push(report.pass_times.iter().map(|(_, d)| *d).sum());
        let report = link(false);
        let t = report.times;
        links.push(t.parse + t.resolve + t.layout + t.fixup + t.finalize);
    }
    (median(hits), median(links))
}

/// Section 4 of the figures.
pub(crate) fn figures(kiln: &Path, dir: &Path, functions: usize, runs: usize) {
    let dir = dir.join("image");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let programs = programs(&dir, functions);
    // Inputs changed within the last two seconds leave the key unsettled (no image is
    // stored): the figures are of the steady state.
    std::thread::sleep(kiln_cache::RACY + Duration::from_millis(100));
    println!(
        "\n4. linked-image cache: whole processes, median of {runs} interleaved runs (many: {functions} functions in 5 objects)"
    );
    println!(
        "{:<8} {:>10} {:>12} {:>12} {:>12} {:>12}  target",
        "program", "native", "image warm", "link (cold)", "warm/native", "link/warm"
    );
    // The targets (Lua has none: its figures are for comparison).
    let targets = [("sqlite", 1.05), ("many", 1.5)];
    for p in &programs {
        let cache = dir.join(format!("cache-{}", p.name));
        let (_, expected) = run(Command::new(&p.native).args(&p.args));
        // The first run stores the image. The first hit, once the file is past the seconds
        // in which a change could keep its times, checks it whole and stamps the check:
        // the figures are of the hits after it (the steady state).
        let (_, out) = run(&mut kiln_run(kiln, &cache, p, &[], &p.args));
        assert_eq!(out, expected, "{}: stored run", p.name);
        std::thread::sleep(kiln_cache::RACY + Duration::from_millis(100));
        let (_, out) = run(&mut kiln_run(kiln, &cache, p, &[], &p.args));
        assert_eq!(out, expected, "{}: first hit", p.name);
        let (mut native, mut warm, mut cold) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..runs {
            native.push(run(Command::new(&p.native).args(&p.args)).0);
            let (t, out) = run(&mut kiln_run(kiln, &cache, p, &[], &p.args));
            assert_eq!(out, expected, "{}: warm", p.name);
            warm.push(t);
            let (t, out) = run(&mut kiln_run(
                kiln,
                &cache,
                p,
                &["--no-image-cache"],
                &p.args,
            ));
            assert_eq!(out, expected, "{}: cold", p.name);
            cold.push(t);
        }
        let (native, warm, cold) = (median(native), median(warm), median(cold));
        let ratio = warm.as_secs_f64() / native.as_secs_f64();
        let target = match targets.iter().find(|t| t.0 == p.name) {
            Some(&(_, target)) => format!(
                "<= {target}x native: {}",
                kiln_bench::verdict(ratio <= target)
            ),
            None => "(none)".into(),
        };
        println!(
            "{:<8} {:>8.2}ms {:>10.2}ms {:>10.2}ms {:>11.2}x {:>11.2}x  {target}",
            p.name,
            ms(native),
            ms(warm),
            ms(cold),
            ratio,
            cold.as_secs_f64() / warm.as_secs_f64(),
        );
    }
    println!("\nimage cache hit (look up (stamped: checked whole at the first hit), decode, map, rebind) vs the link it saves, in process:");
    for p in &programs {
        let (hit, link) = hit_cost(&dir, p, runs);
        println!(
            "{:<8} hit {:>7.2} ms vs link {:>7.2} ms: {:>5.1}%",
            p.name,
            ms(hit),
            ms(link),
            100.0 * hit.as_secs_f64() / link.as_secs_f64()
        );
    }
    if let Some(p) = programs.iter().find(|p| p.name == "many") {
        let cache = dir.join("cache-many");
        let (one, one_rss) = pss_with(kiln, &cache, p, 1);
        let (ten, ten_rss) = pss_with(kiln, &cache, p, 10);
        let ratio = ten as f64 / one.max(1) as f64;
        println!(
            "\nthe image's code per process (PSS), many: 1 process {:.0} KiB (RSS {:.0} KiB), 10 at once {:.0} KiB each (RSS {:.0} KiB): {:.3} of one (target ~0.1: {})",
            one as f64 / 1024.0,
            one_rss as f64 / 1024.0,
            ten as f64 / 1024.0,
            ten_rss as f64 / 1024.0,
            ratio,
            kiln_bench::verdict(ratio <= 0.15)
        );
    }
}
