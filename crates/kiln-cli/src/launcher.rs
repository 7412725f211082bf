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

use crate::RunArgs;
use std::ffi::OsString;
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};

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
    flag("-g", o.debug_info);
    flag("--no-cache", o.no_cache);
    flag("--no-image-cache", o.no_image_cache);
    flag("--whole-archive", o.whole_archive);
    flag("-pthread", o.pthread);
    flag("--no-export-dynamic", o.no_export_dynamic);
    flag("--oop", o.oop);
    flag("--sandbox", o.sandbox);
    flag("--no-env", o.no_env);
    flag("--gdb", o.gdb);
    flag("--perf-map", o.perf_map);
    let mut pairs: Vec<(&str, OsString)> = Vec::new();
    let mut pair = |name: &'static str, value: OsString| pairs.push((name, value));
    if let Some(level) = &o.optimize {
        pair("-O", level.into());
    }
    for dir in &o.include {
        pair("-I", absolute(dir).into());
    }
    for d in &o.define {
        pair("-D", d.into());
    }
    if let Some(std) = &o.standard {
        pair("--std", std.into());
    }
    if let Some(flags) = &o.cflags {
        a.push(format!("--cflags={flags}").into());
    }
    if let Some(dir) = &o.cache_dir {
        pair("--cache-dir", absolute(dir).into());
    }
    if let Some(url) = &o.cache_redis {
        pair("--cache-redis", url.into());
    }
    for u in &o.undefined {
        pair("-u", u.into());
    }
    for d in &o.defsym {
        pair("--defsym", d.into());
    }
    for l in &o.libraries {
        pair("-l", l.into());
    }
    for dir in &o.library_dirs {
        pair("-L", absolute(dir).into());
    }
    pair("--entry", (&o.entry).into());
    if let Some(t) = &o.transport {
        pair("--transport", format!("{t:?}").to_lowercase().into());
    }
    if let Some(c) = &o.connect {
        pair("--connect", c.into());
    }
    for p in &o.sandbox_read {
        pair("--sandbox-read", absolute(p).into());
    }
    for p in &o.sandbox_write {
        pair("--sandbox-write", absolute(p).into());
    }
    if let Some(k) = &o.key_file {
        pair("--key-file", absolute(k).into());
    }
    if let Some(e) = &o.executor {
        pair("--executor", absolute(e).into());
    }
    for (name, value) in pairs {
        a.push(name.into());
        a.push(value);
    }
    if let Some(dir) = &o.jitdump {
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

/// A word of a shell script, quoted.
fn quoted(word: &std::ffi::OsStr) -> String {
    format!("'{}'", word.to_string_lossy().replace('\'', r"'\''"))
}

/// The launcher for `o`'s program in the cache root `root` (made if missing), named
/// `name`; `None` if it cannot be made (the program then gets `name` alone).
pub(crate) fn launcher(o: &RunArgs, root: &Path, name: &str) -> Option<PathBuf> {
    let kiln = std::env::current_exe().ok()?;
    let mut script = String::from(
        "#!/bin/sh\n# Made by kiln run: this program's argv[0]. It runs the same program again (mapped\n# from Kiln's image cache), with this script's arguments.\nexec",
    );
    script.push(' ');
    script.push_str(&quoted(kiln.as_os_str()));
    for word in arguments(o) {
        script.push(' ');
        script.push_str(&quoted(&word));
    }
    script.push_str(" -- \"$@\"\n");
    let hash = blake3::hash(script.as_bytes()).to_hex();
    let dir = root.join("launchers-v1").join(&hash.as_str()[..32]);
    let path = dir.join(name);
    if std::fs::read_to_string(&path).is_ok_and(|s| s == script) {
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
    file.write_all(script.as_bytes()).ok()?;
    file.persist(&path).ok()?;
    Some(path)
}
