//! The launchers `kiln run` writes (each program's `argv[0]`, in `launchers-v1/` of the
//! cache root) are a cache like the objects and images: listed by `kiln cache stats`,
//! removed by `kiln cache clear`, pruned (strays, stale temporaries) by `kiln cache
//! prune`.

use std::path::{Path, PathBuf};
use std::process::Command;

fn kiln() -> Command {
    Command::new(env!("CARGO_BIN_EXE_kiln"))
}

fn scratch(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join("launcher-cache")
        .join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn cache(action: &str, root: &Path) -> String {
    let out = kiln()
        .args(["cache", action, "--cache-dir"])
        .arg(root)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// The launchers under `root` (the files in `launchers-v1/*/`).
fn launchers(root: &Path) -> Vec<PathBuf> {
    let Ok(dirs) = std::fs::read_dir(root.join("launchers-v1")) else {
        return Vec::new();
    };
    let mut found = Vec::new();
    for dir in dirs.flatten() {
        if dir.file_type().unwrap().is_dir() {
            found.extend(
                std::fs::read_dir(dir.path())
                    .unwrap()
                    .map(|f| f.unwrap().path()),
            );
        }
    }
    found
}

#[test]
fn launchers_are_listed_pruned_and_cleared_with_the_cache() {
    let dir = scratch("all");
    let source = dir.join("prog.c");
    std::fs::write(
        &source,
        "#include <stdio.h>\nint main(int argc, char **argv) { puts(argv[0]); return 0; }\n",
    )
    .unwrap();
    let object = dir.join("prog.o");
    kiln_testkit::cc(&["-c", "-O1"], &source, &object);
    let root = dir.join("cache");
    let run = || {
        let out = kiln()
            .args(["run", "--cache-dir"])
            .arg(&root)
            .arg(&object)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        PathBuf::from(String::from_utf8_lossy(&out.stdout).trim_end())
    };
    let argv0 = run();
    assert_eq!(launchers(&root), vec![argv0.clone()]);
    let stats = cache("stats", &root);
    assert!(
        stats.contains(&format!(
            "launchers: {}",
            root.canonicalize().unwrap().join("launchers-v1").display()
        )) && stats.contains("launchers: 1 of at most"),
        "{stats}"
    );
    // A stray (a link planted where a launcher's directory goes) and a stale temporary
    // file: prune removes them (not what the link points to), keeps the launcher.
    let victim = dir.join("victim");
    std::fs::write(&victim, "precious\n").unwrap();
    let planted = root.join("launchers-v1").join("planted");
    std::os::unix::fs::symlink(&dir, &planted).unwrap();
    let stale = argv0.parent().unwrap().join(".tmpLEFT");
    std::fs::write(&stale, "half").unwrap();
    std::fs::File::options()
        .append(true)
        .open(&stale)
        .unwrap()
        .set_modified(std::time::SystemTime::now() - std::time::Duration::from_secs(7200))
        .unwrap();
    let pruned = cache("prune", &root);
    assert!(pruned.contains("evicted 0 launchers"), "{pruned}");
    assert!(std::fs::symlink_metadata(&planted).is_err());
    assert!(!stale.exists());
    assert!(argv0.exists());
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious\n");
    // The same program again: the same launcher (reused, not another).
    assert_eq!(run(), argv0);
    assert_eq!(launchers(&root).len(), 1);
    // clear removes it; the next run writes it again.
    let cleared = cache("clear", &root);
    assert!(cleared.contains("removed 1 launchers"), "{cleared}");
    assert!(launchers(&root).is_empty());
    assert!(cache("stats", &root).contains("launchers: 0 of at most"));
    assert_eq!(run(), argv0);
    assert!(argv0.exists());
}
