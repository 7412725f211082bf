//! The program's `argv[0]`: a launcher that runs the same program again.
//!
//! A native program's `argv[0]` names its executable, and programs run themselves again
//! through it (CPython's `sys.executable`, which its `subprocess` tests start). A program
//! `kiln run` links has no executable of its own: its `argv[0]` is a small script in the
//! cache directory that runs `kiln run` again with the same inputs and options (paths made
//! absolute), passing its own arguments on — fast, because the second run maps the
//! program from the image cache. The script is named after the first input (`python` for
//! `python.o`), in a directory named by a hash of the command it runs; it is written
//! atomically, readable and runnable by this user only.
//!
//! The launchers are a cache like the objects and images beside them (`launchers-v1/` in
//! the cache root): counted by `kiln cache stats`, removed by `kiln cache clear`, and
//! evicted least recently used first (a launcher reused is touched) beyond the cache's
//! limits, by `kiln cache prune` and after a new one is written.

use crate::RunArgs;
use std::ffi::OsString;
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

/// The launchers' directory in a cache root (its layout version).
pub(crate) const DIR: &str = "launchers-v1";

/// A temporary file older than this was left by a writer that died: pruned.
const STALE_TEMPORARY: Duration = Duration::from_secs(3600);

/// A path made absolute against the working directory (not resolved: a link stays a
/// link, as the user gave it).
fn absolute(path: &Path) -> PathBuf {
    std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf())
}

/// The `kiln run` arguments that make the same program (before `--`): every option that
/// changes what is linked or how it runs, with absolute paths; none that only reports
/// (`-v`, `--map`, `--show-times`, `--stats`).
fn arguments(o: &RunArgs) -> Vec<OsString> {
    let mut a: Vec<OsString> = vec!["run".into()];
    let mut flag = |name: &str, on: bool| {
        if on {
            a.push(name.into());
        }
    };
    flag("-g", o.source.debug_info);
    flag("--no-cache", o.source.no_cache);
    flag("--no-image-cache", o.link.no_image_cache);
    flag("--whole-archive", o.link.whole_archive);
    flag("-pthread", o.link.pthread);
    flag("--no-export-dynamic", o.link.no_export_dynamic);
    flag("--oop", o.exec.oop);
    flag("--sandbox", o.exec.sandbox);
    flag("--no-env", o.exec.no_env);
    flag("--gdb", o.debug.gdb);
    flag("--perf-map", o.debug.perf_map);
    let mut pairs: Vec<(&str, OsString)> = Vec::new();
    let mut pair = |name: &'static str, value: OsString| pairs.push((name, value));
    if let Some(level) = &o.source.optimize {
        pair("-O", level.into());
    }
    for dir in &o.source.include {
        pair("-I", absolute(dir).into());
    }
    for d in &o.source.define {
        pair("-D", d.into());
    }
    if let Some(std) = &o.source.standard {
        pair("--std", std.into());
    }
    if let Some(flags) = &o.source.cflags {
        a.push(format!("--cflags={flags}").into());
    }
    if let Some(dir) = &o.source.cache_dir {
        pair("--cache-dir", absolute(dir).into());
    }
    if let Some(url) = &o.source.cache_redis {
        pair("--cache-redis", url.into());
    }
    for u in &o.link.undefined {
        pair("-u", u.into());
    }
    for d in &o.link.defsym {
        pair("--defsym", d.into());
    }
    for l in &o.link.libraries {
        pair("-l", l.into());
    }
    for dir in &o.link.library_dirs {
        pair("-L", absolute(dir).into());
    }
    pair("--entry", (&o.link.entry).into());
    if let Some(t) = &o.exec.transport {
        pair("--transport", format!("{t:?}").to_lowercase().into());
    }
    if let Some(c) = &o.exec.connect {
        pair("--connect", c.into());
    }
    for p in &o.exec.sandbox_read {
        pair("--sandbox-read", absolute(p).into());
    }
    for p in &o.exec.sandbox_write {
        pair("--sandbox-write", absolute(p).into());
    }
    if let Some(k) = &o.exec.key_file {
        pair("--key-file", absolute(k).into());
    }
    if let Some(e) = &o.exec.executor {
        pair("--executor", absolute(e).into());
    }
    for (name, value) in pairs {
        a.push(name.into());
        a.push(value);
    }
    if let Some(dir) = &o.debug.jitdump {
        a.push(if dir.as_os_str().is_empty() {
            "--jitdump".into()
        } else {
            let mut s = OsString::from("--jitdump=");
            s.push(absolute(dir));
            s
        });
    }
    a.extend(o.inputs.iter().map(|p| absolute(p).into_os_string()));
    a
}

/// A word of a shell script, quoted: its bytes as they are (a path need not be UTF-8),
/// in single quotes (a quote inside as `'\''`).
fn quoted(word: &std::ffi::OsStr) -> Vec<u8> {
    use std::os::unix::ffi::OsStrExt;
    let mut out = Vec::with_capacity(word.len() + 2);
    out.push(b'\'');
    for &b in word.as_bytes() {
        if b == b'\'' {
            out.extend_from_slice(b"'\\''");
        } else {
            out.push(b);
        }
    }
    out.push(b'\'');
    out
}

/// The launcher for `o`'s program in the cache root `root` (made if missing), named
/// `name`; `None` if it cannot be made (the program then gets `name` alone).
pub(crate) fn launcher(o: &RunArgs, root: &Path, name: &std::ffi::OsStr) -> Option<PathBuf> {
    let kiln = std::env::current_exe().ok()?;
    let mut script: Vec<u8> = b"#!/bin/sh\n# Made by kiln run: this program's argv[0]. It runs the same program again (mapped\n# from Kiln's image cache), with this script's arguments.\nexec".to_vec();
    script.push(b' ');
    script.extend_from_slice(&quoted(kiln.as_os_str()));
    for word in arguments(o) {
        script.push(b' ');
        script.extend_from_slice(&quoted(&word));
    }
    script.extend_from_slice(b" -- \"$@\"\n");
    let hash = blake3::hash(&script).to_hex();
    let dir = root.join(DIR).join(&hash.as_str()[..32]);
    let path = dir.join(name);
    if std::fs::read(&path).is_ok_and(|s| s == script) {
        // Used: the last to be evicted.
        let _ = std::fs::File::options()
            .append(true)
            .open(&path)
            .and_then(|f| f.set_modified(SystemTime::now()));
        return Some(path);
    }
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&dir)
        .ok()?;
    let mut file = tempfile::Builder::new()
        .prefix(".tmp")
        .permissions(std::fs::Permissions::from_mode(0o700))
        .tempfile_in(&dir)
        .ok()?;
    file.write_all(&script).ok()?;
    file.persist(&path).ok()?;
    // One more launcher: the limits are applied (this one is the newest, evicted last).
    if let Err(why) = prune(root, &kiln_cache::DiskLimits::default()) {
        tracing::warn!(%why, "the launchers were not pruned");
    }
    Some(path)
}

/// What the launchers' directory holds.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Usage {
    /// Launchers.
    pub(crate) entries: u64,
    /// Their bytes.
    pub(crate) bytes: u64,
    /// Temporary files (writes in progress, or left by a writer that died).
    pub(crate) temporaries: u64,
    /// What is no launcher (a link, a FIFO, a stray directory): removed by a prune.
    pub(crate) strays: u64,
}

/// The launchers' directory, read: never following a link (one is a stray, removed
/// itself, never what it points to).
#[derive(Debug, Default)]
struct Scan {
    /// Launchers: last use, size, path (oldest first).
    launchers: Vec<(SystemTime, u64, PathBuf)>,
    /// Temporary files: last change, path.
    temporaries: Vec<(SystemTime, PathBuf)>,
    /// Names that are no launcher.
    strays: Vec<PathBuf>,
    /// The launchers' directories (one per command).
    dirs: Vec<PathBuf>,
}

/// The launchers' directory in `root`.
pub(crate) fn dir(root: &Path) -> PathBuf {
    root.join(DIR)
}

fn scan(root: &Path) -> Result<Scan, String> {
    let top = dir(root);
    let mut scan = Scan::default();
    let io = |what: &Path| {
        let what = what.display().to_string();
        move |e: std::io::Error| format!("{what}: {e}")
    };
    match std::fs::symlink_metadata(&top) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(scan),
        Err(e) => return Err(io(&top)(e)),
        Ok(meta) if !meta.file_type().is_dir() => {
            return Err(format!(
                "{}: not a directory (a link?): left alone",
                top.display()
            ))
        }
        Ok(_) => {}
    }
    for entry in std::fs::read_dir(&top).map_err(io(&top))? {
        let entry = entry.map_err(io(&top))?;
        let path = entry.path();
        // `DirEntry::file_type` does not follow links.
        if !entry.file_type().map_err(io(&path))?.is_dir() {
            scan.strays.push(path);
            continue;
        }
        for file in std::fs::read_dir(&path).map_err(io(&path))? {
            let file = file.map_err(io(&path))?;
            let file_path = file.path();
            let meta = match file.metadata() {
                Ok(meta) => meta,
                // Removed meanwhile (another prune).
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => return Err(io(&file_path)(e)),
            };
            let modified = meta.modified().unwrap_or(SystemTime::UNIX_EPOCH);
            if !meta.file_type().is_file() {
                scan.strays.push(file_path);
            } else if file.file_name().as_encoded_bytes().starts_with(b".tmp") {
                scan.temporaries.push((modified, file_path));
            } else {
                scan.launchers.push((modified, meta.len(), file_path));
            }
        }
        scan.dirs.push(path);
    }
    scan.launchers.sort();
    Ok(scan)
}

/// Removes `path` itself: a file or a link (not what it points to), or a directory and
/// what is in it (links in it are removed, not followed).
fn remove(path: &Path) {
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_dir() => {
            let _ = std::fs::remove_dir_all(path);
        }
        Ok(_) => {
            let _ = std::fs::remove_file(path);
        }
        Err(_) => {}
    }
}

/// What the launchers' directory of `root` holds now.
pub(crate) fn usage(root: &Path) -> Result<Usage, String> {
    let scan = scan(root)?;
    Ok(Usage {
        entries: scan.launchers.len() as u64,
        bytes: scan.launchers.iter().map(|l| l.1).sum(),
        temporaries: scan.temporaries.len() as u64,
        strays: scan.strays.len() as u64,
    })
}

/// Evicts the least recently used launchers until `limits` hold (their count and bytes),
/// removes temporary files left by writers that died, strays, and the directories left
/// empty. Returns how many launchers went.
pub(crate) fn prune(root: &Path, limits: &kiln_cache::DiskLimits) -> Result<u64, String> {
    let scan = scan(root)?;
    scan.strays.iter().for_each(|p| remove(p));
    let now = SystemTime::now();
    for (modified, path) in &scan.temporaries {
        if now.duration_since(*modified).unwrap_or_default() > STALE_TEMPORARY {
            remove(path);
        }
    }
    let mut bytes: u64 = scan.launchers.iter().map(|l| l.1).sum();
    let mut count = scan.launchers.len() as u64;
    let mut evicted = 0;
    for (_, len, path) in &scan.launchers {
        if bytes <= limits.max_bytes && count <= limits.max_entries {
            break;
        }
        if std::fs::remove_file(path).is_ok() {
            bytes -= len;
            count -= 1;
            evicted += 1;
        }
    }
    // Only an empty directory goes (a launcher being written in one keeps it).
    for dir in &scan.dirs {
        let _ = std::fs::remove_dir(dir);
    }
    Ok(evicted)
}

/// Removes every launcher, temporary file and stray. Returns how many launchers went.
pub(crate) fn clear(root: &Path) -> Result<u64, String> {
    let scan = scan(root)?;
    let removed = scan
        .launchers
        .iter()
        .filter(|l| std::fs::remove_file(&l.2).is_ok())
        .count() as u64;
    for path in scan
        .strays
        .iter()
        .chain(scan.temporaries.iter().map(|t| &t.1))
    {
        remove(path);
    }
    for dir in &scan.dirs {
        let _ = std::fs::remove_dir(dir);
    }
    Ok(removed)
}

#[cfg(test)]
mod tests {
    use super::{clear, prune, usage, DIR};
    use std::path::{Path, PathBuf};
    use std::time::{Duration, SystemTime};

    fn scratch(name: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("kiln-launchers-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    /// A launcher `name` in the command directory `hash`, last used `age` seconds ago.
    fn plant(root: &Path, hash: &str, name: &str, age: u64) -> PathBuf {
        let dir = root.join(DIR).join(hash);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(name);
        std::fs::write(&path, "#!/bin/sh\nexec true\n").unwrap();
        let when = SystemTime::now() - Duration::from_secs(age);
        std::fs::File::options()
            .append(true)
            .open(&path)
            .unwrap()
            .set_modified(when)
            .unwrap();
        path
    }

    #[test]
    fn the_least_recently_used_launchers_are_evicted_beyond_the_limits() {
        let root = scratch("lru");
        let old = plant(&root, "aa", "prog", 300);
        let middle = plant(&root, "bb", "prog", 200);
        let new = plant(&root, "cc", "prog", 100);
        let before = usage(&root).unwrap();
        assert_eq!((before.entries, before.bytes), (3, 3 * 20));
        let limits = kiln_cache::DiskLimits {
            max_entries: 2,
            ..Default::default()
        };
        assert_eq!(prune(&root, &limits).unwrap(), 1);
        assert!(!old.exists() && middle.exists() && new.exists());
        // The emptied directory went with it.
        assert!(!root.join(DIR).join("aa").exists());
        // By bytes: one launcher's worth left.
        let limits = kiln_cache::DiskLimits {
            max_bytes: 20,
            ..Default::default()
        };
        assert_eq!(prune(&root, &limits).unwrap(), 1);
        assert!(!middle.exists() && new.exists());
        let _ = std::fs::remove_dir_all(&root);
    }

    #[test]
    fn strays_and_stale_temporaries_are_pruned_never_followed() {
        let root = scratch("strays");
        let kept = plant(&root, "aa", "prog", 10);
        let victim = root.join("victim");
        std::fs::write(&victim, "precious\n").unwrap();
        std::os::unix::fs::symlink(&victim, root.join(DIR).join("aa").join("link")).unwrap();
        std::os::unix::fs::symlink(&root, root.join(DIR).join("dirlink")).unwrap();
        let stale = plant(&root, "aa", ".tmpXYZ", 7200);
        let fresh = plant(&root, "aa", ".tmpNEW", 1);
        let before = usage(&root).unwrap();
        assert_eq!(
            (before.entries, before.temporaries, before.strays),
            (1, 2, 2)
        );
        assert_eq!(prune(&root, &kiln_cache::DiskLimits::default()).unwrap(), 0);
        assert!(kept.exists() && fresh.exists() && !stale.exists());
        assert!(!root.join(DIR).join("dirlink").exists());
        assert!(std::fs::symlink_metadata(root.join(DIR).join("aa").join("link")).is_err());
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious\n");
        assert_eq!(clear(&root).unwrap(), 1);
        assert!(!kept.exists() && !fresh.exists());
        assert_eq!(usage(&root).unwrap(), super::Usage::default());
        assert_eq!(std::fs::read_dir(root.join(DIR)).unwrap().count(), 0);
        let _ = std::fs::remove_dir_all(&root);
    }

    #[test]
    fn a_launchers_directory_that_is_a_link_is_left_alone() {
        let root = scratch("toplink");
        let elsewhere = root.join("elsewhere");
        std::fs::create_dir_all(elsewhere.join("aa")).unwrap();
        std::fs::write(elsewhere.join("aa").join("prog"), "x").unwrap();
        std::os::unix::fs::symlink(&elsewhere, root.join(DIR)).unwrap();
        assert!(clear(&root).unwrap_err().contains("not a directory"));
        assert!(elsewhere.join("aa").join("prog").exists());
        let _ = std::fs::remove_dir_all(&root);
    }
}
