//! `kiln run --perf-map` when `/tmp/perf-<pid>.map` is already taken by something not
//! ours (planted by another user, or a link): the program runs, the map is skipped with a
//! warning that says what was found there, and what was there is left alone.
//!
//! The pid is known in advance by planting from a shell that then `exec`s kiln (the same
//! process, the same pid).

use std::path::PathBuf;
use std::process::{Command, Output};

fn scratch(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join("perf-map")
        .join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| o.stdout == b"0\n")
}

/// A program that says it ran, compiled with `cc -c`.
fn program(dir: &std::path::Path) -> PathBuf {
    let source = dir.join("hello.c");
    std::fs::write(
        &source,
        "#include <stdio.h>\nint main(void) { puts(\"ran\"); return 3; }\n",
    )
    .unwrap();
    let object = dir.join("hello.o");
    kiln_testkit::cc(&["-c", "-O1"], &source, &object);
    object
}

/// What a test planted at a perf map name, removed when the test ends (also when it
/// fails): left there, it would take the name from whichever later process gets the pid.
struct Planted(String);

impl Drop for Planted {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

impl std::ops::Deref for Planted {
    type Target = str;
    fn deref(&self) -> &str {
        &self.0
    }
}

/// Runs `plant` (a shell command that may use `$map`, the perf map's path) in a shell
/// that then becomes `kiln run --perf-map OBJECT`; the map's path and the output.
fn run_with_planted(object: &std::path::Path, plant: &str) -> (Planted, Output) {
    let script = format!(
        "map=/tmp/perf-$$.map; rm -f \"$map\"; {plant} || exit 99; echo \"$map\" >&2; \
         exec \"$0\" run --no-image-cache --perf-map \"$1\""
    );
    let out = Command::new("sh")
        .arg("-c")
        .arg(script)
        .arg(env!("CARGO_BIN_EXE_kiln"))
        .arg(object)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let map = Planted(stderr.lines().next().unwrap_or_default().to_string());
    assert!(map.starts_with("/tmp/perf-"), "{stderr}");
    (map, out)
}

#[test]
fn a_planted_symlink_does_not_stop_the_run() {
    let dir = scratch("symlink");
    let object = program(&dir);
    let victim = dir.join("victim");
    std::fs::write(&victim, "precious\n").unwrap();
    let chown = if root() {
        "chown -h 65534:65534 \"$map\" &&"
    } else {
        ""
    };
    let (map, out) = run_with_planted(
        &object,
        &format!("ln -s '{}' \"$map\" && {chown} true", victim.display()),
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{stderr}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "ran\n");
    assert!(
        stderr.contains("warning: no perf map")
            && stderr.contains(&format!("refusing to write {}", &*map))
            && stderr.contains("a symbolic link owned by uid"),
        "{stderr}"
    );
    if root() {
        assert!(stderr.contains("owned by uid 65534"), "{stderr}");
    }
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious\n");
    assert!(std::fs::symlink_metadata(&*map)
        .unwrap()
        .file_type()
        .is_symlink());
}

#[test]
fn another_users_perf_map_does_not_stop_the_run() {
    if !root() {
        eprintln!("skipped: giving a file to another user needs root");
        return;
    }
    let dir = scratch("owner");
    let object = program(&dir);
    let (map, out) = run_with_planted(
        &object,
        "echo theirs > \"$map\" && chown 65534:65534 \"$map\"",
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{stderr}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "ran\n");
    assert!(
        stderr.contains("warning: no perf map")
            && stderr.contains("a regular file owned by uid 65534"),
        "{stderr}"
    );
    assert_eq!(std::fs::read_to_string(&*map).unwrap(), "theirs\n");
}

#[test]
fn a_free_name_gets_the_perf_map() {
    let dir = scratch("free");
    let object = program(&dir);
    let (map, out) = run_with_planted(&object, "true");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{stderr}");
    assert!(!stderr.contains("warning"), "{stderr}");
    let text = std::fs::read_to_string(&*map).unwrap();
    assert!(text.contains(" main"), "{text}");
}
