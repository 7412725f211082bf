//! `kiln run`'s image cache: when it is used, and the key of a program's link.

use crate::RunArgs;
use std::path::Path;
use std::sync::Arc;

/// The image cache `kiln run` links through, or why none (said with `-v`).
pub(crate) fn open(o: &RunArgs) -> Result<Arc<kiln::cache::DiskImageCache>, String> {
    let why = if o.link.no_image_cache {
        Some("--no-image-cache")
    } else if o.noexec {
        Some("--noexec links only")
    } else if o.exec.connect.is_some() {
        Some("the executor is no process of this machine: its libraries cannot be keyed")
    } else if o.debug.gdb || o.debug.jitdump.is_some() {
        Some("gdb and jitdump are given every object linked, with its debug information")
    } else {
        None
    };
    if let Some(why) = why {
        return Err(why.to_string());
    }
    let root = o
        .source
        .cache_dir
        .clone()
        .or_else(kiln_cache::DiskCache::default_root)
        .ok_or(
            "no cache directory (none of KILN_CACHE_DIR, XDG_CACHE_HOME, HOME, XDG_RUNTIME_DIR)",
        )?;
    kiln::cache::DiskImageCache::open(&root, kiln_cache::DiskLimits::default())
        .map(Arc::new)
        .map_err(|e| e.to_string())
}

/// The start of a program's image key: Kiln's version, the target, the options that
/// change what is linked. Inputs and the process's mapped files are added as they come.
pub(crate) fn key_start(o: &RunArgs, jit: &kiln::Jit) -> kiln::cache::ImageKeyBuilder {
    let mut key = kiln::cache::ImageKeyBuilder::new(concat!("kiln ", env!("CARGO_PKG_VERSION")));
    key.text("target", &jit.architecture().to_string());
    key.text(
        "options",
        &format!(
            "whole-archive={} undefined={:?} defsym={:?} libraries={:?} library-dirs={:?} export-dynamic={} flags={:?}",
            o.link.whole_archive,
            o.link.undefined,
            o.link.defsym,
            o.link.libraries,
            o.link.library_dirs,
            !o.link.no_export_dynamic,
            crate::compiler_flags(o),
        ),
    );
    key
}

/// Adds an input file (an object, archive or shared library) to `key`: `contents` what
/// was read or mapped of it (keyed if it changed within the last seconds).
pub(crate) fn add_file(
    key: &mut kiln::cache::ImageKeyBuilder,
    path: &Path,
    contents: Option<&[u8]>,
) -> Result<(), String> {
    match contents {
        Some(bytes) => key.file_read(path, bytes),
        None => key.file(path),
    }
    .map(|_| ())
    .map_err(|e| e.to_string())
}

/// What `-v` says of a link through the image cache.
pub(crate) fn describe(report: &kiln::link::LinkReport) -> Option<String> {
    let refused = report
        .image_refused
        .as_ref()
        .map(|why| format!(" (a cached image was not used: {why})"))
        .unwrap_or_default();
    Some(match report.image.as_ref()? {
        kiln::cache::ImageOutcome::Mapped { path, fixups } => format!(
            "kiln: mapped from the image cache ({}, {fixups} fixups): no link",
            path.display()
        ),
        kiln::cache::ImageOutcome::Stored => {
            format!("kiln: linked; image stored in the image cache{refused}")
        }
        kiln::cache::ImageOutcome::NotStored(why) => {
            format!("kiln: linked; image not stored: {why}{refused}")
        }
        kiln::cache::ImageOutcome::Bypassed(why) => format!("kiln: image cache not used: {why}"),
        other => format!("kiln: image cache: {other:?}"),
    })
}
