//! `kiln link` gives the same image bytes for the same inputs (issue 29): Debian's SQLite
//! with its driver, for x86-64 and, with the cross toolchain, for AArch64, linked twice
//! by two processes; and objects large enough to be parsed, decoded, written and fixed
//! up on every core, linked on one thread and on several. A link whose layout followed a hash map's order, an address of
//! this process, the clock or which thread finished first would differ.

use std::path::{Path, PathBuf};
use std::process::Command;

fn kiln() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_kiln"))
}

/// Links `inputs` for `target` into `image`; the image's bytes.
fn link(target: &str, inputs: &[PathBuf], image: &Path) -> Vec<u8> {
    link_on(None, target, inputs, image).0
}

/// [`link`] with `threads` threads for the parallel parts (`RAYON_NUM_THREADS`; `None`:
/// one per core), with `--show-times`; the image's bytes and what the link said.
fn link_on(
    threads: Option<usize>,
    target: &str,
    inputs: &[PathBuf],
    image: &Path,
) -> (Vec<u8>, String) {
    let mut command = Command::new(kiln());
    match threads {
        Some(n) => command.env("RAYON_NUM_THREADS", n.to_string()),
        None => command.env_remove("RAYON_NUM_THREADS"),
    };
    let out = command
        .args([
            "link",
            "--show-times",
            "--target",
            target,
            "--allow-undefined",
            "-o",
        ])
        .arg(image)
        .args(inputs)
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "kiln link failed: {said}");
    (std::fs::read(image).unwrap(), said)
}

/// Links twice and compares; says where the first difference lies.
fn assert_links_alike(label: &str, target: &str, inputs: &[PathBuf], dir: &Path) {
    let first = link(target, inputs, &dir.join(format!("{label}-1.elf")));
    let second = link(target, inputs, &dir.join(format!("{label}-2.elf")));
    assert!(
        first.len() > 100_000,
        "{label}: an image of SQLite ({} bytes)",
        first.len()
    );
    if let Some(at) = first.iter().zip(&second).position(|(a, b)| a != b) {
        panic!("{label}: the two images differ first at byte {at:#x}");
    }
    assert_eq!(first.len(), second.len(), "{label}: lengths");
}

#[test]
fn the_same_inputs_give_the_same_image() {
    let dir = kiln_testkit::scratch_dir("link_determinism");
    let driver = dir.join("sqlite_driver.o");
    kiln_testkit::cc(
        &["-O2", "-fPIC", "-c"],
        &kiln_testkit::source("sqlite_driver.c"),
        &driver,
    );
    let sqlite = kiln_testkit::host_file("/usr/lib/x86_64-linux-gnu/libsqlite3.a");
    assert_links_alike("x86-64", "x86_64", &[driver, sqlite], &dir);

    if kiln_testkit::skip_cross("the_same_inputs_give_the_same_image (AArch64)") {
        return;
    }
    let driver = dir.join("sqlite_driver.aarch64.o");
    let mut compile = Command::new("aarch64-linux-gnu-gcc");
    compile
        .args(["-O2", "-fPIC", "-c"])
        .args(kiln_testkit::aarch64_includes())
        .arg(kiln_testkit::source("sqlite_driver.c"))
        .arg("-o")
        .arg(&driver);
    assert!(compile.status().unwrap().success(), "aarch64-linux-gnu-gcc");
    let sqlite = kiln_testkit::aarch64_lib_dir().join("libsqlite3.a");
    assert_links_alike("aarch64", "aarch64", &[driver, sqlite], &dir);
}

#[test]
fn one_thread_and_several_give_the_same_image() {
    let dir = kiln_testkit::scratch_dir("link_determinism_threads");
    // Four objects of 1,500 functions each (each in a section of its own, calling into
    // the next object) and 640 KiB of constants: megabytes of input, which the link
    // parses on every core; tens of thousands of relocations, which it decodes and
    // applies on every core; megabytes of contents, which it writes on every core.
    // Compiled side by side (the test's time is mostly the compiler's).
    let inputs: Vec<PathBuf> = std::thread::scope(|scope| {
        let compiles: Vec<_> = (0..4)
            .map(|o| {
                let dir = &dir;
                scope.spawn(move || {
                    let next = (o + 1) % 4;
                    let mut c = format!(
                        "const unsigned char blob{o}[640 << 10] = {{ {o}, 1, 2, 3 }};\n\
                         int b{o}(int i) {{ return blob{o}[i]; }}\n"
                    );
                    for i in 0..1500 {
                        c.push_str(&format!(
                            "int g{o}_{i}(int x);\nint v{o}_{i} = {i};\n\
                             int f{o}_{i}(int x) {{ return x > 0 ? g{next}_{i}(x - 1) + v{o}_{i} : {i}; }}\n\
                             int g{o}_{i}(int x) {{ return f{o}_{i}(x) ^ {o}; }}\n"
                        ));
                    }
                    let source = dir.join(format!("threads{o}.c"));
                    std::fs::write(&source, c).unwrap();
                    let object = dir.join(format!("threads{o}.o"));
                    let flags = ["-O1", "-fPIC", "-c", "-ffunction-sections", "-fdata-sections"];
                    kiln_testkit::cc(&flags, &source, &object);
                    object
                })
            })
            .collect();
        compiles.into_iter().map(|c| c.join().unwrap()).collect()
    });
    let bytes: u64 = inputs
        .iter()
        .map(|p| std::fs::metadata(p).unwrap().len())
        .sum();
    assert!(
        bytes >= 2 << 20,
        "{bytes} bytes of objects: too few for the link to parse them in parallel"
    );
    let target = if cfg!(target_arch = "aarch64") {
        "aarch64"
    } else {
        "x86_64"
    };
    // The four links side by side too: each is its own process.
    let ((one, _), (two, _), (four, _), (all, said)) = std::thread::scope(|scope| {
        let on = |threads: Option<usize>, name: &'static str| {
            let (inputs, dir) = (&inputs, &dir);
            scope.spawn(move || link_on(threads, target, inputs, &dir.join(name)))
        };
        let one = on(Some(1), "one.elf");
        let two = on(Some(2), "two.elf");
        // Contents are written on every core only from 4 threads.
        let four = on(Some(4), "four.elf");
        let all = on(None, "all.elf");
        (
            one.join().unwrap(),
            two.join().unwrap(),
            four.join().unwrap(),
            all.join().unwrap(),
        )
    });
    // Past the link's thresholds for decoding and applying relocations (16 Ki) and for
    // writing contents (2 MiB, from 4 threads) on every core.
    let relocations: usize = said
        .split(" relocations")
        .next()
        .and_then(|before| before.rsplit(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no relocation count in: {said}"));
    assert!(
        relocations >= 16 << 10,
        "{relocations} relocations: too few for the link to apply them in parallel"
    );
    assert!(
        one.len() >= 2 << 20,
        "an image of {} bytes: too little for the link to write it in parallel",
        one.len()
    );
    for (label, other) in [
        ("two threads", &two),
        ("four threads", &four),
        ("every core", &all),
    ] {
        if let Some(at) = one.iter().zip(other).position(|(a, b)| a != b) {
            panic!("one thread and {label}: the images differ first at byte {at:#x}");
        }
        assert_eq!(one.len(), other.len(), "one thread and {label}: lengths");
    }
}

/// One large section (6,000 functions in one `.text`, 18,000 calls: past the 16 Ki edges
/// from which a section is cut into pieces) is patched in pieces on several cores: the
/// image is the same as on one thread.
#[test]
fn a_large_section_patched_in_pieces_gives_the_same_image() {
    let dir = kiln_testkit::scratch_dir("link_determinism_pieces");
    let mut c = String::new();
    for i in 0..6000 {
        c.push_str(&format!("int h{i}(int x);\n"));
    }
    for i in 0..6000 {
        let (a, b, d) = ((i + 1) % 6000, (i + 7) % 6000, (i + 13) % 6000);
        c.push_str(&format!(
            "int h{i}(int x) {{ return x > 0 ? h{a}(x - 1) + h{b}(x - 2) + h{d}(x - 3) : {i}; }}\n"
        ));
    }
    let source = dir.join("one_text.c");
    std::fs::write(&source, c).unwrap();
    let object = dir.join("one_text.o");
    kiln_testkit::cc(&["-O0", "-c"], &source, &object);
    let inputs = [object];
    let (one, said) = link_on(Some(1), "x86_64", &inputs, &dir.join("one.elf"));
    let relocations: usize = said
        .split_whitespace()
        .collect::<Vec<_>>()
        .windows(2)
        .find(|w| w[1].starts_with("relocations"))
        .and_then(|w| w[0].parse().ok())
        .unwrap_or(0);
    assert!(
        relocations >= 24_000,
        "{relocations} relocations: too few to be cut into pieces:\n{said}"
    );
    for threads in [2, 3, 4] {
        let (many, _) = link_on(
            Some(threads),
            "x86_64",
            &inputs,
            &dir.join(format!("{threads}.elf")),
        );
        assert!(
            one == many,
            "linked on {threads} threads, the image differs from one thread's"
        );
    }
}
