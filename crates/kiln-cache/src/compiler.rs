//! Source to object: the `Compiler` trait, the system compiler behind it, and the cached
//! compile that ties compiler, signature and cache together.

use crate::files::{self, Links};
use crate::{io, note, trust, CacheError, CacheKey, ObjectCache, Signature};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::path::Path;
use std::process::Command;

/// Turns a source file into a relocatable object, and says what the object would be the
/// product of (without compiling).
pub trait Compiler: Send + Sync {
    /// The signature of compiling `source` with `flags`.
    fn signature(&self, source: &Path, flags: &[String]) -> Result<Signature, CacheError>;
    /// Compiles `source` with `flags` into an ELF relocatable object.
    fn compile(&self, source: &Path, flags: &[String]) -> Result<Vec<u8>, CacheError>;

    /// The text that, with the contents of the headers a previous compile read, decides
    /// the object without preprocessing: the unpreprocessed source's hash, its path and
    /// the working directory (which relative includes depend on), the compiler, target,
    /// CPU, flags and environment (`None`: this compiler has no such shortcut).
    fn direct_text(&self, source: &Path, flags: &[String]) -> Result<Option<String>, CacheError> {
        let _ = (source, flags);
        Ok(None)
    }
}

/// The system's C and C++ compilers (`$CC` or `cc` for `.c`, `$CXX` or `c++` for `.cc`,
/// `.cpp`, `.cxx`, `.C`).
#[derive(Debug)]
pub struct SystemCompiler {
    c: String,
    cxx: String,
    environment: Vec<String>,
    /// Driver → (identity, target triple), asked once.
    identities: Mutex<HashMap<String, (String, String)>>,
}

impl Default for SystemCompiler {
    fn default() -> Self {
        Self::new()
    }
}

impl SystemCompiler {
    /// The system compilers, with no environment variable declared relevant.
    pub fn new() -> Self {
        SystemCompiler {
            c: std::env::var("CC").unwrap_or_else(|_| "cc".into()),
            cxx: std::env::var("CXX").unwrap_or_else(|_| "c++".into()),
            environment: Vec::new(),
            identities: Mutex::new(HashMap::new()),
        }
    }

    /// Declares environment variables whose values change the compiler's output (they
    /// become part of the signature).
    pub fn with_environment(mut self, names: impl IntoIterator<Item = String>) -> Self {
        self.environment.extend(names);
        self
    }

    /// Whether `path` is a source this compiler takes.
    pub fn is_source(path: &Path) -> bool {
        matches!(
            path.extension().and_then(|e| e.to_str()),
            Some("c" | "cc" | "cpp" | "cxx" | "C" | "c++")
        )
    }

    fn driver(&self, source: &Path) -> &str {
        match source.extension().and_then(|e| e.to_str()) {
            Some("c") => &self.c,
            _ => &self.cxx,
        }
    }

    /// The driver's identity (its path and `--version`) and target (`-dumpmachine`),
    /// remembered in this process and, by the compiler binary's path, size and
    /// modification time, in a file under the default cache root (asking the driver costs
    /// two process starts).
    fn identity(&self, driver: &str) -> Result<(String, String), CacheError> {
        if let Some(known) = self.identities.lock().get(driver) {
            return Ok(known.clone());
        }
        let binary = which(driver);
        // Only under a cache root no other user can write to: the memo decides what the
        // signature says of the compiler.
        let memo_dir = crate::DiskCache::default_root()
            .and_then(|root| trust::private_directory(&root).ok())
            .map(|root| root.join("compilers"));
        let memo = binary.as_ref().zip(memo_dir).and_then(|(path, dir)| {
            let meta = std::fs::metadata(path).ok()?;
            let stamp = format!("{path} {} {:?}", meta.len(), meta.modified().ok()?);
            let name = blake3::hash(stamp.as_bytes()).to_hex();
            Some(dir.join(format!("{}.txt", &name[..32])))
        });
        let remembered = memo
            .as_ref()
            .and_then(|m| files::read_regular(m, Links::Refuse, 4096).ok())
            .and_then(|bytes| String::from_utf8(bytes).ok());
        if let Some(text) = remembered {
            if let Some((identity, target)) = text.split_once('\n') {
                let known = (identity.to_string(), target.trim().to_string());
                self.identities
                    .lock()
                    .insert(driver.to_string(), known.clone());
                return Ok(known);
            }
        }
        let run = |arg: &str| -> Result<String, CacheError> {
            let out = Command::new(driver)
                .arg(arg)
                .output()
                .map_err(io(format!("running {driver} {arg}")))?;
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        };
        let version = run("--version")?;
        let path = which(driver).unwrap_or_else(|| driver.to_string());
        let identity = format!("{path} {}", version.lines().next().unwrap_or("").trim());
        let target = run("-dumpmachine")?.trim().to_string();
        if let Some(memo) = memo {
            // Best effort: a cache root that cannot be written only costs the two runs.
            let _ = remember(&memo, &format!("{identity}\n{target}\n"));
        }
        self.identities
            .lock()
            .insert(driver.to_string(), (identity.clone(), target.clone()));
        Ok((identity, target))
    }
}

/// Writes `text` to `memo` whole (a temporary file renamed over it), its directory made
/// private if missing.
fn remember(memo: &Path, text: &str) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::DirBuilderExt;
    let dir = memo.parent().unwrap_or(Path::new("."));
    if std::fs::symlink_metadata(dir).is_err() {
        std::fs::DirBuilder::new().mode(0o700).create(dir)?;
    }
    let mut file = tempfile::Builder::new().prefix(".tmp").tempfile_in(dir)?;
    file.write_all(text.as_bytes())?;
    file.persist(memo).map_err(|e| e.error)?;
    Ok(())
}

/// The absolute path `PATH` finds `program` at (its resolved target, so that a
/// replaced compiler is a different identity).
fn which(program: &str) -> Option<String> {
    if program.contains('/') {
        return std::fs::canonicalize(program)
            .ok()
            .map(|p| p.display().to_string());
    }
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .find_map(|dir| {
            let candidate = Path::new(dir).join(program);
            candidate
                .is_file()
                .then(|| std::fs::canonicalize(&candidate).ok())
                .flatten()
                .map(|p| p.display().to_string())
        })
}

/// The files of a make dependency rule (`out.o: a.c b.h \\\n c.h`), the target excepted.
fn make_dependencies(rule: &str) -> Vec<std::path::PathBuf> {
    let joined = rule.replace("\\\n", " ");
    let Some((_, files)) = joined.split_once(": ") else {
        return Vec::new();
    };
    files
        .split_whitespace()
        .skip(1) // the source itself (the caller lists it first)
        .map(std::path::PathBuf::from)
        .collect()
}

/// The CPU's feature flags, when the flags ask for the host CPU.
fn host_cpu(flags: &[String]) -> String {
    let native = flags.iter().any(|f| {
        matches!(
            f.as_str(),
            "-march=native" | "-mtune=native" | "-mcpu=native"
        )
    });
    if !native {
        return String::new();
    }
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|info| {
            info.lines()
                .find(|l| l.starts_with("flags") || l.starts_with("Features"))
                .map(str::to_string)
        })
        .unwrap_or_default()
}

impl Compiler for SystemCompiler {
    fn signature(&self, source: &Path, flags: &[String]) -> Result<Signature, CacheError> {
        let driver = self.driver(source);
        let (compiler, target) = self.identity(driver)?;
        // Preprocessed: every header the source includes, expanded, is in the hash; the
        // preprocessor also lists the headers it read (-MD).
        let deps_dir = tempfile::tempdir().map_err(io("creating a temporary directory"))?;
        let deps = deps_dir.path().join("deps.d");
        // A file modified from here on may have been read half old, half new.
        let started = std::time::SystemTime::now();
        let out = Command::new(driver)
            .arg("-E")
            .args(flags)
            .arg("-MD")
            .arg("-MF")
            .arg(&deps)
            .arg(source)
            .output()
            .map_err(io(format!("running {driver} -E")))?;
        if !out.status.success() {
            return Err(CacheError::Compile {
                compiler: driver.to_string(),
                source_file: source.display().to_string(),
                output: String::from_utf8_lossy(&out.stderr).into_owned(),
            });
        }
        Ok(Signature {
            source: *blake3::hash(&out.stdout).as_bytes(),
            compiler,
            target,
            cpu: host_cpu(flags),
            flags: flags.to_vec(),
            environment: self
                .environment
                .iter()
                .map(|name| (name.clone(), std::env::var(name).unwrap_or_default()))
                .collect(),
            inputs: Vec::new(),
            racy: false,
        }
        .with_inputs(
            std::iter::once(source.to_path_buf()).chain(
                std::fs::read_to_string(&deps)
                    .map(|d| make_dependencies(&d))
                    .unwrap_or_default(),
            ),
            started,
        ))
    }

    fn direct_text(&self, source: &Path, flags: &[String]) -> Result<Option<String>, CacheError> {
        let driver = self.driver(source);
        let (compiler, target) = self.identity(driver)?;
        let bytes =
            files::read_regular(source, Links::Follow, crate::MAX_ENTRY_BYTES).map_err(|e| {
                CacheError::Io {
                    what: format!("reading {}", source.display()),
                    source: std::io::Error::other(e.to_string()),
                }
            })?;
        // The path as given: it is what the preprocessor writes in its line markers and
        // the compiler in the debug information.
        let path = source;
        let cwd = std::env::current_dir().unwrap_or_default();
        let mut text = String::from("kiln-cache-direct 1\n");
        text.push_str(&format!("source {}\n", blake3::hash(&bytes).to_hex()));
        text.push_str(&format!("path {}\n", path.display()));
        text.push_str(&format!("cwd {}\n", cwd.display()));
        text.push_str(&format!(
            "compiler {compiler}\ntarget {target}\ncpu {}\n",
            host_cpu(flags)
        ));
        for flag in flags {
            text.push_str(&format!("flag {flag}\n"));
        }
        for name in &self.environment {
            text.push_str(&format!(
                "env {name}={}\n",
                std::env::var(name).unwrap_or_default()
            ));
        }
        Ok(Some(text))
    }

    fn compile(&self, source: &Path, flags: &[String]) -> Result<Vec<u8>, CacheError> {
        let driver = self.driver(source);
        let dir = tempfile::tempdir().map_err(io("creating a temporary directory"))?;
        let object = dir.path().join("out.o");
        let out = Command::new(driver)
            .arg("-c")
            .args(flags)
            .arg(source)
            .arg("-o")
            .arg(&object)
            .output()
            .map_err(io(format!("running {driver}")))?;
        if !out.status.success() {
            return Err(CacheError::Compile {
                compiler: driver.to_string(),
                source_file: source.display().to_string(),
                output: String::from_utf8_lossy(&out.stderr).into_owned(),
            });
        }
        std::fs::read(&object).map_err(io(format!("reading {}", object.display())))
    }
}

/// `object` with a note holding `signature`, as the cache stores objects (for tools and
/// tests: [`compile_cached`] adds the note itself). An ELF64 little-endian object.
pub fn embed_signature(object: &[u8], signature: &str) -> Result<Vec<u8>, CacheError> {
    note::embed(object, signature)
}

/// What [`compile_cached`] did.
#[derive(Debug, Clone)]
pub struct CompileOutcome {
    /// The object (with its signature note): mapped from the cache's entry on a hit.
    pub object: crate::CachedObject,
    /// Whether it came from the cache.
    pub hit: bool,
    /// The key it is cached under (all zeros without a cache).
    pub key: CacheKey,
}

/// Compiles `source` through `cache`: the entry for the signature if there is one whose
/// note holds that very signature (a foreign or altered one is removed and counted as
/// rejected), else a compile, whose object is stored with its note. A cache that fails
/// (a full disk, a store that is down) is reported as a warning and the compile goes on.
pub fn compile_cached(
    compiler: &dyn Compiler,
    cache: Option<&dyn ObjectCache>,
    source: &Path,
    flags: &[String],
) -> Result<CompileOutcome, CacheError> {
    let Some(cache) = cache else {
        // No cache: no signature to compute, no note to add.
        return Ok(CompileOutcome {
            object: compiler.compile(source, flags)?.into(),
            hit: false,
            key: CacheKey([0; 32]),
        });
    };
    let cache = Some(cache);
    let direct = compiler.direct_text(source, flags)?;
    let manifest_key = direct
        .as_ref()
        .map(|text| CacheKey(*blake3::hash(format!("manifest\n{text}").as_bytes()).as_bytes()));
    // The direct way: the manifest for this unpreprocessed source names the headers the
    // last compile read and the signature it had; if every header is unchanged, that
    // signature's object is this compile's (its note is checked as always).
    if let (Some(cache), Some(manifest_key)) = (cache, &manifest_key) {
        if let Ok(Some(manifest)) = cache.get(manifest_key) {
            if let Some(canonical) = manifest::check(&manifest) {
                let key = CacheKey(*blake3::hash(canonical.as_bytes()).as_bytes());
                if let Ok(Some(object)) = cache.get(&key) {
                    if note::read(&object).as_deref() == Some(canonical.as_str()) {
                        return Ok(CompileOutcome {
                            object,
                            hit: true,
                            key,
                        });
                    }
                    cache.count_rejected();
                    let _ = cache.remove(&key);
                }
            }
        }
    }
    let signature = compiler.signature(source, flags)?;
    let canonical = signature.canonical();
    let key = signature.key();
    let record_manifest = |cache: &dyn ObjectCache| {
        if let Some(manifest_key) = &manifest_key {
            if let Some(manifest) = manifest::make(&signature) {
                if let Err(error) = cache.put(manifest_key, &manifest) {
                    tracing::warn!(%error, cache = %cache.name(), "manifest not cached");
                }
            }
        }
    };
    if let Some(cache) = cache {
        match cache.get(&key) {
            Ok(Some(object)) if note::read(&object).as_deref() == Some(canonical.as_str()) => {
                record_manifest(cache);
                return Ok(CompileOutcome {
                    object,
                    hit: true,
                    key,
                });
            }
            Ok(Some(_)) => {
                tracing::warn!(cache = %cache.name(), key = %key.hex(),
                    "a cache entry with a foreign signature: not loaded, removed");
                cache.count_rejected();
                let _ = cache.remove(&key);
            }
            Ok(None) => {}
            Err(error) => tracing::warn!(%error, cache = %cache.name(), "cache lookup failed"),
        }
    }
    let compiled = compiler.compile(source, flags)?;
    // Cached only if no input changed while it was read: the object must be the product of
    // exactly what the signature says.
    if signature.racy || !signature.inputs_unchanged() {
        tracing::warn!(source = %source.display(), "an input changed during the compile: not cached");
        return Ok(CompileOutcome {
            object: compiled.into(),
            hit: false,
            key,
        });
    }
    let object = match note::embed(&compiled, &canonical) {
        Ok(object) => object,
        Err(error) => {
            tracing::warn!(%error, "not cached");
            return Ok(CompileOutcome {
                object: compiled.into(),
                hit: false,
                key,
            });
        }
    };
    if let Some(cache) = cache {
        if let Err(error) = cache.put(&key, &object) {
            tracing::warn!(%error, cache = %cache.name(), "not cached");
        } else {
            record_manifest(cache);
        }
    }
    Ok(CompileOutcome {
        object: object.into(),
        hit: false,
        key,
    })
}

/// Manifests: what lets a run skip the preprocessor. A manifest lists the headers a
/// compile read, each with the BLAKE3 of its contents, then the compile's signature.
/// Headers are read as any file the cache reads: without blocking (a FIFO is a changed
/// header, not a hang), only regular files of bounded size (links are followed, as the
/// compiler followed them, but what they lead to is checked).
mod manifest {
    use crate::files::{self, Links};
    use crate::Signature;

    const HEAD: &str = "kiln-cache-manifest 1\n";

    /// The manifest of a compile whose signature is `signature` (`None` if a header
    /// cannot be read now).
    pub(super) fn make(signature: &Signature) -> Option<Vec<u8>> {
        let mut text = String::from(HEAD);
        // The headers (the source, first, is in the direct text), with the hashes they had
        // when the preprocessor read them.
        for (header, hash) in signature.inputs.iter().skip(1) {
            let path = header.to_str()?;
            if path.contains('\n') {
                return None;
            }
            let hex: String = hash.iter().map(|b| format!("{b:02x}")).collect();
            text.push_str(&format!("header {hex} {path}\n"));
        }
        text.push_str("signature\n");
        text.push_str(&signature.canonical());
        Some(text.into_bytes())
    }

    /// The signature a manifest records, if every header it lists is unchanged.
    pub(super) fn check(manifest: &[u8]) -> Option<String> {
        let text = std::str::from_utf8(manifest).ok()?;
        let mut rest = text.strip_prefix(HEAD)?;
        loop {
            let (line, tail) = rest.split_once('\n')?;
            if line == "signature" {
                return Some(tail.to_string());
            }
            let (hash, path) = line.strip_prefix("header ")?.split_once(' ')?;
            let bytes = files::read_regular(
                std::path::Path::new(path),
                Links::Follow,
                crate::MAX_ENTRY_BYTES,
            )
            .ok()?;
            if blake3::hash(&bytes).to_hex().as_str() != hash {
                return None;
            }
            rest = tail;
        }
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn a_header_that_became_a_fifo_or_a_device_is_a_change_not_a_hang() {
            let dir = tempfile::tempdir().unwrap();
            let header = dir.path().join("h.h");
            std::fs::write(&header, "#define K 1\n").unwrap();
            let hash = blake3::hash(b"#define K 1\n").to_hex();
            let manifest = |path: &std::path::Path| {
                format!(
                    "{HEAD}header {hash} {}\nsignature\nthe signature\n",
                    path.display()
                )
            };
            assert_eq!(
                check(manifest(&header).as_bytes()).as_deref(),
                Some("the signature\n")
            );
            std::fs::remove_file(&header).unwrap();
            assert!(std::process::Command::new("mkfifo")
                .arg(&header)
                .status()
                .unwrap()
                .success());
            let started = std::time::Instant::now();
            assert_eq!(check(manifest(&header).as_bytes()), None, "a FIFO");
            assert_eq!(
                check(manifest(std::path::Path::new("/dev/zero")).as_bytes()),
                None
            );
            assert!(started.elapsed() < std::time::Duration::from_secs(2));
        }
    }
}

/// The note's signature of an object (for tests and `kiln cache`).
pub fn signature_of(object: &[u8]) -> Option<String> {
    note::read(object)
}
