//! The linked-image cache of `kiln run`, tested from outside as a user meets it: real
//! programs (SQLite, Lua, C++ exceptions, thread-locals in static TLS, PIE code reading
//! libc's data, a plugin the program `dlopen`s) give the native program's output when
//! linked and stored, and again when mapped from the cache, in other processes (other
//! libc addresses: ASLR); any change of an input is a miss; a damaged image is a miss and
//! is replaced; writers racing leave one whole image; mapped code is the file's pages,
//! never writable and executable.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn kiln() -> Command {
    Command::new(env!("CARGO_BIN_EXE_kiln"))
}

fn text(out: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A fresh directory for one test (its cache, its sources).
fn scratch(name: &str) -> PathBuf {
    let dir = kiln_testkit::scratch_dir(&format!("image-cache/{name}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

const STORED: &str = "image stored in the image cache";
const MAPPED: &str = "mapped from the image cache";

/// `kiln run -v ARGS` with the cache in `cache`.
fn run(cache: &Path, dir: &Path, args: &[&str]) -> Output {
    kiln()
        .current_dir(dir)
        .env("KILN_CACHE_DIR", cache)
        .arg("run")
        .arg("-v")
        .args(args)
        .output()
        .unwrap()
}

/// Waits until files written now are older than [`kiln_cache::RACY`]: a run whose inputs
/// changed within it links without storing an image (its key is unsettled), so a cold
/// run that is to store one waits first.
fn settle() {
    std::thread::sleep(kiln_cache::RACY + std::time::Duration::from_millis(200));
}

fn images(cache: &Path) -> Vec<PathBuf> {
    // The images, not their stamps (`NAME.kimg.ok`) nor temporary files.
    let mut found: Vec<PathBuf> = std::fs::read_dir(cache.join("images-v1"))
        .map(|d| {
            d.flatten()
                .map(|e| e.path())
                .filter(|p| p.extension().is_some_and(|e| e == "kimg"))
                .collect()
        })
        .unwrap_or_default();
    found.sort();
    found
}

fn cc(dir: &Path, source: &str, text: &str, flags: &[&str]) -> PathBuf {
    let src = dir.join(source);
    std::fs::write(&src, text).unwrap();
    let object = src.with_extension("o");
    let status = Command::new("cc")
        .args(flags)
        .arg("-c")
        .arg(&src)
        .arg("-o")
        .arg(&object)
        .status()
        .unwrap();
    assert!(status.success(), "cc {source}");
    object
}

/// One program of tests/programs/build_native.sh's manifest: its `kiln run` arguments
/// and the native program's output.
fn program(name: &str) -> (Vec<String>, String) {
    let p = kiln_testkit::native_program(name);
    (p.kiln_run_args(), p.expected)
}

#[test]
fn programs_mapped_from_the_cache_behave_as_linked_and_as_native() {
    // Initial-exec and TLS-descriptor thread-locals (static TLS: offsets of this process),
    // PIE code reading libc's data directly (environ, stdout), C++ exceptions through JIT
    // frames with static constructors, thread-local destructors, atexit, SQLite and Lua
    // from Debian's static libraries.
    for name in [
        "tls_static-pie",
        "tls_static-desc",
        "relocs-O2-pie",
        "relocs-O0-pie",
        "cxx_exceptions",
        "thread_local_dtors",
        // atexit handlers under the module's own __dso_handle (a word of the image that
        // holds its own address), run in order with the finalizers.
        "runtime_exit",
        "sqlite_driver",
        "lua_driver",
    ] {
        let dir = scratch(name);
        let cache = dir.join("cache");
        let (args, expected) = program(name);
        // The programs are built once, at the first (see settle).
        if name == "tls_static-pie" {
            settle();
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let cold = run(&cache, &dir, &args);
        let (stdout, stderr) = text(&cold);
        assert_eq!(cold.status.code(), Some(0), "{name} cold: {stderr}");
        assert_eq!(stdout, expected, "{name} cold, as native:\n{stderr}");
        assert!(stderr.contains(STORED), "{name} cold: {stderr}");
        // Twice more, each its own process: libc and the stack elsewhere (ASLR), the image
        // mapped elsewhere, its fixups written again.
        for n in 0..2 {
            let warm = run(&cache, &dir, &args);
            let (stdout, stderr) = text(&warm);
            assert_eq!(warm.status.code(), Some(0), "{name} warm {n}: {stderr}");
            assert!(stderr.contains(MAPPED), "{name} warm {n}: {stderr}");
            assert!(
                !stderr.contains("kiln: linked "),
                "{name} warm {n}: nothing linked: {stderr}"
            );
            assert_eq!(stdout, expected, "{name} warm {n}, as native:\n{stderr}");
        }
        assert_eq!(images(&cache).len(), 1, "{name}: one image");
    }
}

/// Out of process the image is the executor's: a cold `--oop` run links into a span of
/// the executor's memory and stores the image, a warm one copies the image into the
/// executor and rebinds it there — no link — with either transport (shared memory,
/// copies), and the programs behave as native (thread-locals in the executor's static
/// TLS, C++ exceptions, atexit, SQLite, Lua).
#[test]
fn programs_mapped_into_an_executor_behave_as_native() {
    let names = [
        "sqlite_driver",
        "lua_driver",
        "cxx_exceptions",
        "tls_static-pie",
        "runtime_exit",
    ];
    let programs: Vec<(&str, (Vec<String>, String))> =
        names.iter().map(|&name| (name, program(name))).collect();
    // The programs were just built, maybe (see settle).
    settle();
    for (name, (args, expected)) in &programs {
        for transport in ["shm", "copy"] {
            let dir = scratch(&format!("oop-{name}-{transport}"));
            let cache = dir.join("cache");
            let mut all = vec!["--oop", "--transport", transport];
            all.extend(args.iter().map(String::as_str));
            let cold = run(&cache, &dir, &all);
            let (stdout, stderr) = text(&cold);
            assert_eq!(
                cold.status.code(),
                Some(0),
                "{name} {transport} cold: {stderr}"
            );
            assert_eq!(stdout, *expected, "{name} {transport} cold:\n{stderr}");
            assert!(stderr.contains(STORED), "{name} {transport} cold: {stderr}");
            let warm = run(&cache, &dir, &all);
            let (stdout, stderr) = text(&warm);
            assert_eq!(
                warm.status.code(),
                Some(0),
                "{name} {transport} warm: {stderr}"
            );
            assert!(stderr.contains(MAPPED), "{name} {transport} warm: {stderr}");
            assert!(
                !stderr.contains("kiln: linked "),
                "{name} {transport} warm: nothing linked: {stderr}"
            );
            assert_eq!(stdout, *expected, "{name} {transport} warm:\n{stderr}");
            assert_eq!(images(&cache).len(), 1, "{name} {transport}: one image");
        }
    }
}

#[test]
fn a_plugin_the_mapped_program_dlopens_calls_back_into_it() {
    let dir = scratch("plugin");
    let cache = dir.join("cache");
    let host = kiln_testkit::source("plugin_host.c");
    let status = Command::new("cc")
        .args(["-O2", "-c"])
        .arg(&host)
        .arg("-o")
        .arg(dir.join("plugin_host.o"))
        .status()
        .unwrap();
    assert!(status.success());
    let status = Command::new("cc")
        .args(["-shared", "-fPIC", "-O2"])
        .arg(kiln_testkit::source("plugin.c"))
        .arg("-o")
        .arg(dir.join("plugin.so"))
        .status()
        .unwrap();
    assert!(status.success());
    settle();
    let plugin = dir.join("plugin.so").display().to_string();
    let args = ["plugin_host.o", "--", &plugin];
    for (n, expect) in [STORED, MAPPED, MAPPED].into_iter().enumerate() {
        let out = run(&cache, &dir, &args);
        let (stdout, stderr) = text(&out);
        assert_eq!(out.status.code(), Some(0), "run {n}: {stderr}");
        assert!(stderr.contains(expect), "run {n}: {stderr}");
        assert_eq!(
            stdout,
            "dlsym(host_log): found\nhost_log: plugin says hello\nplugin_run(5) = 210, host_calls = 1\n",
            "run {n}"
        );
    }
}

#[test]
fn any_changed_input_is_a_miss_even_within_one_clock_tick() {
    // Each change is made, then the runs wait past the seconds in which a changed file
    // leaves the key unsettled (settle); one change is run at once too: right after an
    // object is rewritten (same size, likely the same clock tick), the run is the new
    // program's.
    let dir = scratch("changes");
    let cache = dir.join("cache");
    let library = |value: u32| {
        let src = dir.join("version.c");
        std::fs::write(
            &src,
            format!("int shared_value = {value}; int version(void) {{ return {value}; }}\n"),
        )
        .unwrap();
        let status = Command::new("cc")
            .args(["-shared", "-fPIC", "-O2"])
            .arg(&src)
            .arg("-o")
            .arg(dir.join("libversion.so"))
            .status()
            .unwrap();
        assert!(status.success());
    };
    let main = |value: u32| {
        cc(
            &dir,
            "main.c",
            &format!(
                "#include <stdio.h>\nint version(void); extern int shared_value; int static_value(void);\n\
                 int main(void) {{ printf(\"%d %d %d %d\\n\", {value}, version(), shared_value, static_value()); return 0; }}\n"
            ),
            &["-O2"],
        )
    };
    // A static library too, small enough to be read (not mapped): found by -l.
    let archive = |value: u32| {
        cc(
            &dir,
            "stat.c",
            &format!("int static_value(void) {{ return {value}0; }}\n"),
            &["-O2"],
        );
        let _ = std::fs::remove_file(dir.join("libstat.a"));
        let status = Command::new("ar")
            .arg("rcs")
            .arg(dir.join("libstat.a"))
            .arg(dir.join("stat.o"))
            .status()
            .unwrap();
        assert!(status.success());
    };
    library(1);
    archive(1);
    main(1);
    settle();
    let args = ["main.o", "-L", ".", "-lversion", "-lstat"];
    let out = |expect: &str, stdout: &str| {
        let out = run(&cache, &dir, &args);
        let (o, e) = text(&out);
        assert!(e.contains(expect), "{e}");
        assert_eq!(o, stdout, "{e}");
    };
    out(STORED, "1 1 1 10\n");
    out(MAPPED, "1 1 1 10\n");
    // The object rewritten at once (same size, the same clock tick likely): a miss.
    let written = std::time::Instant::now();
    main(2);
    let now = run(&cache, &dir, &args);
    // Whether the run keyed main.o within the seconds after its change (a machine too
    // busy to start it in time keys it settled, and stores the image: checked below).
    let within = written.elapsed() < kiln_cache::RACY - std::time::Duration::from_millis(200);
    assert_eq!(text(&now).0, "2 1 1 10\n", "{}", text(&now).1);
    assert!(!text(&now).1.contains(MAPPED), "{}", text(&now).1);
    if within {
        // ... and nothing is stored under a key whose file may change again within the
        // tick.
        assert!(!text(&now).1.contains(STORED), "{}", text(&now).1);
        assert!(
            text(&now).1.contains("main.o changed within the last"),
            "{}",
            text(&now).1
        );
    }
    settle();
    if within {
        out(STORED, "2 1 1 10\n");
    }
    out(MAPPED, "2 1 1 10\n");
    // A host library changed (same name): a miss.
    library(3);
    settle();
    out(STORED, "2 3 3 10\n");
    out(MAPPED, "2 3 3 10\n");
    // A static library -l finds changed: a miss.
    archive(4);
    settle();
    out(STORED, "2 3 3 40\n");
    out(MAPPED, "2 3 3 40\n");
    // Other options: a miss.
    let other = run(
        &cache,
        &dir,
        &[
            "--defsym",
            "unused=0x10",
            "main.o",
            "-L",
            ".",
            "-lversion",
            "-lstat",
        ],
    );
    assert!(text(&other).1.contains(STORED), "{}", text(&other).1);
    // Five stores: the run right after a change stored none (six if it came too late).
    assert_eq!(images(&cache).len(), if within { 5 } else { 6 });
}

#[test]
fn a_damaged_image_is_a_miss_and_is_replaced() {
    let dir = scratch("damaged");
    let cache = dir.join("cache");
    cc(
        &dir,
        "prog.c",
        "#include <stdio.h>\nstatic const char *words[] = {\"one\", \"two\"};\n\
         int main(void) { for (int i = 0; i < 2; i++) puts(words[i]); return 4; }\n",
        &["-O2"],
    );
    settle();
    let args = ["prog.o"];
    let first = run(&cache, &dir, &args);
    assert!(text(&first).1.contains(STORED));
    let image = images(&cache).pop().expect("an image");
    let len = std::fs::metadata(&image).unwrap().len();
    // A flipped bit in the last page (the program's data), then the file cut short.
    let damages: [&dyn Fn(&Path); 2] = [
        &|p| {
            let mut bytes = std::fs::read(p).unwrap();
            let at = bytes.len() - 100;
            bytes[at] ^= 0x40;
            std::fs::write(p, bytes).unwrap();
        },
        &|p| {
            let file = std::fs::OpenOptions::new().write(true).open(p).unwrap();
            file.set_len(len - 1000).unwrap();
        },
    ];
    for (n, damage) in damages.iter().enumerate() {
        damage(&image);
        let out = run(&cache, &dir, &args);
        let (stdout, stderr) = text(&out);
        assert_eq!(out.status.code(), Some(4), "damage {n}: {stderr}");
        assert_eq!(stdout, "one\ntwo\n", "damage {n}");
        assert!(!stderr.contains(MAPPED), "damage {n}: {stderr}");
        assert!(stderr.contains(STORED), "damage {n}: replaced: {stderr}");
        let again = run(&cache, &dir, &args);
        assert!(
            text(&again).1.contains(MAPPED),
            "damage {n}: {}",
            text(&again).1
        );
        assert_eq!(text(&again).0, "one\ntwo\n");
    }
}

#[test]
fn writers_racing_leave_one_whole_image() {
    let dir = scratch("race");
    let cache = dir.join("cache");
    let (args, expected) = program("sqlite_driver");
    settle();
    let children: Vec<_> = (0..4)
        .map(|_| {
            kiln()
                .current_dir(&dir)
                .env("KILN_CACHE_DIR", &cache)
                .args(["run", "-v"])
                .args(&args)
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    for child in children {
        let out = child.wait_with_output().unwrap();
        assert_eq!(out.status.code(), Some(0), "{}", text(&out).1);
        assert_eq!(text(&out).0, expected);
    }
    let left: Vec<_> = std::fs::read_dir(cache.join("images-v1"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(left.len(), 1, "one image, no temporary file: {left:?}");
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let warm = run(&cache, &dir, &args);
    assert!(text(&warm).1.contains(MAPPED), "{}", text(&warm).1);
    assert_eq!(text(&warm).0, expected);
}

#[test]
fn mapped_code_is_the_files_pages_never_writable_and_executable() {
    let dir = scratch("mapping");
    let cache = dir.join("cache");
    cc(
        &dir,
        "maps.c",
        "#include <stdio.h>\n#include <string.h>\n\
         int main(void) {\n\
           FILE *f = fopen(\"/proc/self/maps\", \"r\"); char line[512];\n\
           while (fgets(line, sizeof line, f)) {\n\
             char perms[5] = {0}; sscanf(line, \"%*s %4s\", perms);\n\
             if (perms[1] == 'w' && perms[2] == 'x') printf(\"WX %s\", line);\n\
             if (strstr(line, \".kimg\")) printf(\"image %s\\n\", perms);\n\
           }\n\
           return 0;\n\
         }\n",
        &["-O2"],
    );
    settle();
    let cold = run(&cache, &dir, &["maps.o"]);
    assert!(text(&cold).1.contains(STORED));
    assert!(!text(&cold).0.contains("WX"), "{}", text(&cold).0);
    let warm = run(&cache, &dir, &["maps.o"]);
    let (stdout, stderr) = text(&warm);
    assert!(stderr.contains(MAPPED), "{stderr}");
    assert!(
        !stdout.contains("WX"),
        "no page writable and executable:\n{stdout}"
    );
    assert!(
        stdout.lines().any(|l| l == "image r-xp"),
        "the code runs from the image file's pages:\n{stdout}"
    );
}

#[test]
fn no_image_cache_and_an_unusable_cache_only_cost_the_speed() {
    let dir = scratch("bypass");
    let cache = dir.join("cache");
    cc(&dir, "p.c", "int main(void) { return 9; }\n", &[]);
    settle();
    let out = run(&cache, &dir, &["--no-image-cache", "p.o"]);
    assert_eq!(out.status.code(), Some(9));
    assert!(text(&out)
        .1
        .contains("image cache not used: --no-image-cache"));
    assert!(images(&cache).is_empty());
    let out = run(&cache, &dir, &["p.o"]);
    assert_eq!(out.status.code(), Some(9));
    let stats = kiln()
        .args(["cache", "stats", "--cache-dir"])
        .arg(&cache)
        .output()
        .unwrap();
    assert!(text(&stats).0.contains("images: 1 ("), "{}", text(&stats).0);
    // A file where the image directory should be: the program runs, linked, and -v says
    // why no image.
    std::fs::remove_dir_all(cache.join("images-v1")).unwrap();
    std::fs::write(cache.join("images-v1"), "not a directory").unwrap();
    let out = run(&cache, &dir, &["p.o"]);
    assert_eq!(out.status.code(), Some(9), "{}", text(&out).1);
    assert!(
        text(&out).1.contains("image cache not used"),
        "{}",
        text(&out).1
    );
}

#[test]
fn a_full_or_read_only_disk_only_costs_the_speed() {
    // The cache on a small file system of its own (a private mount namespace: nothing
    // outside this test sees it): too small for SQLite's image, then read-only.
    let dir = scratch("full");
    let cache = dir.join("cache");
    std::fs::create_dir_all(&cache).unwrap();
    let probe = Command::new("unshare")
        .args(["-m", "sh", "-c"])
        .arg(format!(
            "mount -t tmpfs -o size=64k tmpfs {}",
            cache.display()
        ))
        .output();
    if !probe.is_ok_and(|o| o.status.success()) {
        eprintln!("a_full_or_read_only_disk_only_costs_the_speed: skipped: no private mount namespace here (unshare -m)");
        return;
    }
    let (args, expected) = program("sqlite_driver");
    let kiln = env!("CARGO_BIN_EXE_kiln");
    let quoted: Vec<String> = args.iter().map(|a| format!("'{a}'")).collect();
    let script = format!(
        "set -e; mount -t tmpfs -o size=256k,mode=0700 tmpfs {c}; \
         KILN_CACHE_DIR={c} {kiln} run -v {a} > {d}/full.out 2> {d}/full.err; \
         mount -o remount,ro {c}; \
         KILN_CACHE_DIR={c} {kiln} run -v {a} > {d}/ro.out 2> {d}/ro.err",
        c = cache.display(),
        d = dir.display(),
        a = quoted.join(" ")
    );
    let out = Command::new("unshare")
        .args(["-m", "sh", "-c", &script])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out).1);
    for case in ["full", "ro"] {
        let stdout = std::fs::read_to_string(dir.join(format!("{case}.out"))).unwrap();
        let stderr = std::fs::read_to_string(dir.join(format!("{case}.err"))).unwrap();
        assert_eq!(stdout, expected, "{case}: {stderr}");
        assert!(
            stderr.contains("image not stored") || stderr.contains("image cache not used"),
            "{case}: -v says why: {stderr}"
        );
    }
    let full = std::fs::read_to_string(dir.join("full.err")).unwrap();
    assert!(full.contains("image not stored"), "{full}");
}

#[test]
fn plugins_see_a_mapped_program_as_a_linked_one() {
    // --map and --perf-map are plugins: told of every symbol of the module, local ones
    // too. An image stored without them (a run with no plugin) is linked again once.
    let dir = scratch("plugins");
    let cache = dir.join("cache");
    cc(
        &dir,
        "syms.c",
        "#include <stdio.h>\n#include <unistd.h>\n\
         static int hidden_helper(int x) { return x * 3; }\n\
         int visible_one(int x) { return hidden_helper(x) + 1; }\n\
         int table_value = 5;\n\
         int main(void) { printf(\"%d %d\\n\", (int)getpid(), visible_one(table_value)); return 0; }\n",
        &["-O1", "-fno-inline"],
    );
    settle();
    // Without -v (itself a plugin: it lists what is linked).
    let plain = kiln()
        .current_dir(&dir)
        .env("KILN_CACHE_DIR", &cache)
        .args(["run", "syms.o"])
        .output()
        .unwrap();
    assert_eq!(plain.status.code(), Some(0), "{}", text(&plain).1);
    assert_eq!(images(&cache).len(), 1);
    // (name, size) of --map's lines; the functions of /tmp/perf-PID.map.
    let listing = |out: &Output| -> (Vec<(String, String)>, Vec<String>) {
        let (stdout, stderr) = text(out);
        assert_eq!(out.status.code(), Some(0), "{stderr}");
        let mut map: Vec<(String, String)> = stdout
            .lines()
            .filter(|l| l.starts_with("0x"))
            .map(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                (f[2].to_string(), f[1].to_string())
            })
            .collect();
        map.sort();
        let last = stdout.lines().last().unwrap_or_default();
        let pid = last.split_whitespace().next().unwrap_or_default();
        assert_eq!(last.split_whitespace().nth(1), Some("16"), "{stdout}");
        let path = kiln_testkit::perf_map_path(pid.parse().expect("the program's pid"));
        let perf = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("{}: {e}; kiln said: {stderr}", path.display()));
        let _ = std::fs::remove_file(&path);
        let mut functions: Vec<String> = perf
            .lines()
            .filter_map(|l| l.split_whitespace().nth(2).map(str::to_string))
            .collect();
        functions.sort();
        (map, functions)
    };
    let args = ["--map", "--perf-map", "syms.o"];
    // Each run's perf map name freed first: a pid is reused, and a name an earlier process
    // left taken (by a link, another user's file) is rightly refused.
    let run = |cache: &Path, dir: &Path, args: &[&str]| {
        let mut command = kiln();
        command
            .current_dir(dir)
            .env("KILN_CACHE_DIR", cache)
            .arg("run")
            .arg("-v")
            .args(args);
        kiln_testkit::output_with_free_perf_map(&command).1
    };
    let relinked = run(&cache, &dir, &args);
    let stderr = text(&relinked).1;
    assert!(
        stderr.contains("stored without the symbols") && stderr.contains(STORED),
        "{stderr}"
    );
    let (map_linked, perf_linked) = listing(&relinked);
    let mapped = run(&cache, &dir, &args);
    assert!(text(&mapped).1.contains(MAPPED), "{}", text(&mapped).1);
    let (map_mapped, perf_mapped) = listing(&mapped);
    assert!(
        map_linked.iter().any(|(n, _)| n == "hidden_helper"),
        "local symbols too: {map_linked:?}"
    );
    assert_eq!(map_mapped, map_linked, "--map, mapped as linked");
    assert!(
        perf_linked.contains(&"visible_one".to_string()),
        "{perf_linked:?}"
    );
    assert!(
        perf_linked.contains(&"hidden_helper".to_string()),
        "{perf_linked:?}"
    );
    assert_eq!(perf_mapped, perf_linked, "the perf map, mapped as linked");
}

/// `-v` lists what is linked and reads no symbol: an image stored by a run without it is
/// mapped, not linked again and stored a second time (`--map`, which prints every symbol,
/// still links such an image again once, as `plugins_see_a_mapped_program_as_a_linked_one`
/// shows).
#[test]
fn verbose_maps_an_image_stored_without_it() {
    let dir = scratch("verbose");
    let cache = dir.join("cache");
    cc(
        &dir,
        "hello.c",
        "#include <stdio.h>\nint main(void) { puts(\"hello\"); return 0; }\n",
        &["-O1"],
    );
    settle();
    let plain = kiln()
        .current_dir(&dir)
        .env("KILN_CACHE_DIR", &cache)
        .args(["run", "hello.o"])
        .output()
        .unwrap();
    assert_eq!(plain.status.code(), Some(0), "{}", text(&plain).1);
    assert_eq!(images(&cache).len(), 1);
    let verbose = run(&cache, &dir, &["hello.o"]);
    let (stdout, stderr) = text(&verbose);
    assert_eq!(stdout, "hello\n", "{stderr}");
    assert!(stderr.contains(MAPPED), "{stderr}");
    assert_eq!(images(&cache).len(), 1, "{stderr}");
}
