//! Paths that are not UTF-8 beyond the program's own arguments (those are in cli.rs): a
//! source compiled in a directory whose name is not UTF-8 runs, and its launcher runs it
//! again; an include directory whose name is not UTF-8 is refused, not bent to U+FFFD.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::process::Command;

fn scratch(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join("bytes-paths")
        .join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Prints each argument after argv[0] in hex, one a line, then argv[0].
const ARGV_HEX: &str = "#include <stdio.h>\nint main(int argc, char **argv) {\n\
    for (int i = 1; i < argc; i++) { for (const unsigned char *p = (const unsigned char *)argv[i]; *p; p++) printf(\"%02x\", *p); printf(\"\\n\"); }\n\
    printf(\"%s\\n\", argv[0]); return 0; }\n";

#[test]
fn a_source_in_a_directory_that_is_not_utf8_runs_and_reruns() {
    let base = scratch("source");
    let dir = base.join(OsStr::from_bytes(b"src-\xe9\xff"));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("argv.c"), ARGV_HEX).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(["run", "--cache-dir"])
        .arg(base.join("cache"))
        .args(["argv.c", "--"])
        .arg(OsStr::from_bytes(b"\xc3\x28"))
        .current_dir(&dir)
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut lines = out.stdout.split(|&b| b == b'\n');
    assert_eq!(lines.next(), Some(&b"c328"[..]));
    let launcher = PathBuf::from(OsStr::from_bytes(lines.next().unwrap()));
    // The launcher names the source at its real path (the directory's bytes).
    let script = std::fs::read(&launcher).unwrap();
    let source = dir.join("argv.c");
    let source = source.as_os_str().as_bytes();
    assert!(
        script.windows(source.len()).any(|w| w == source),
        "{}",
        String::from_utf8_lossy(&script)
    );
    let again = Command::new(&launcher)
        .arg(OsStr::from_bytes(b"\xff"))
        .current_dir("/")
        .output()
        .unwrap();
    assert_eq!(
        again.stdout.split(|&b| b == b'\n').next(),
        Some(&b"ff"[..]),
        "{}",
        String::from_utf8_lossy(&again.stderr)
    );
}

#[test]
fn an_include_directory_that_is_not_utf8_is_refused() {
    let base = scratch("include");
    let inc = base.join(OsStr::from_bytes(b"inc-\xff"));
    std::fs::create_dir_all(&inc).unwrap();
    std::fs::write(base.join("p.c"), "int main(void) { return 0; }\n").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(["run", "--no-cache", "-I"])
        .arg(&inc)
        .arg("p.c")
        .current_dir(&base)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("the name is not UTF-8"), "{stderr}");
}
