//! The object cache with the real system compiler: cold and warm, and every fault the
//! issue names — corrupt, truncated, foreign and adversarial entries, a full disk (a small
//! tmpfs), a read-only cache, a writer that died mid-write (two `kiln run` processes
//! racing on one key: kiln-cli's tests/cli.rs), least-recently-used eviction, and a Redis server stopped mid-run. The run
//! always succeeds and never loads a wrong object.

use kiln_cache::{
    compile_cached, signature_of, Compiler, DiskCache, DiskLimits, MemoryCache, ObjectCache,
    RedisCache, SkipReason, SystemCompiler,
};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

fn scratch(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join("cache")
        .join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn source(dir: &Path, name: &str, body: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, body).unwrap();
    path
}

fn flags() -> Vec<String> {
    vec!["-O1".into()]
}

/// The single object entry of a disk cache (the other entries are manifests).
fn entry_file(cache: &DiskCache) -> PathBuf {
    let files: Vec<PathBuf> = std::fs::read_dir(cache.dir())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "kobj"))
        .filter(|p| std::fs::read(p).unwrap().get(48..52) == Some(b"\x7fELF"))
        .collect();
    assert_eq!(files.len(), 1, "{files:?}");
    files[0].clone()
}

#[test]
fn cold_then_warm_gives_the_same_verified_object() {
    let dir = scratch("warm");
    let src = source(&dir, "f.c", "int f(int x) { return x * 3; }\n");
    let cache = DiskCache::open(dir.join("cache"), DiskLimits::default()).unwrap();
    let compiler = SystemCompiler::new();
    let cold = compile_cached(&compiler, Some(&cache), &src, &flags()).unwrap();
    assert!(!cold.hit);
    let warm = compile_cached(&compiler, Some(&cache), &src, &flags()).unwrap();
    assert!(warm.hit);
    assert_eq!(cold.object, warm.object);
    assert_eq!(cold.key, warm.key);
    // The object carries its signature, and it is the compile's.
    let signature = compiler.signature(&src, &flags()).unwrap();
    assert_eq!(signature_of(&warm.object), Some(signature.canonical()));
    // Another flag, another key; an edited source, another key.
    let other = compile_cached(&compiler, Some(&cache), &src, &["-O2".into()]).unwrap();
    assert!(!other.hit && other.key != cold.key);
    source(&dir, "f.c", "int f(int x) { return x * 4; }\n");
    let edited = compile_cached(&compiler, Some(&cache), &src, &flags()).unwrap();
    assert!(!edited.hit && edited.key != cold.key);
    // Each compile looks up and stores its manifest (the headers it read) and its object;
    // the warm run found both without preprocessing.
    let stats = cache.stats();
    assert_eq!((stats.hits, stats.misses, stats.puts), (2, 6, 6));
}

#[test]
fn a_header_change_is_a_different_key() {
    let dir = scratch("header");
    source(&dir, "h.h", "#define K 3\n");
    let src = source(&dir, "g.c", "#include \"h.h\"\nint g(void) { return K; }\n");
    let cache = MemoryCache::new();
    let compiler = SystemCompiler::new();
    let a = compile_cached(&compiler, Some(&cache), &src, &flags()).unwrap();
    source(&dir, "h.h", "#define K 4\n");
    let b = compile_cached(&compiler, Some(&cache), &src, &flags()).unwrap();
    assert!(!b.hit && a.key != b.key, "the preprocessed input is hashed");
}

#[test]
fn a_file_changed_while_it_was_read_is_not_cached() {
    let dir = scratch("racy");
    source(&dir, "h.h", "#define K 3\n");
    let src = source(&dir, "g.c", "#include \"h.h\"\nint g(void) { return K; }\n");
    // A header modified "now or later" (as one being edited during the compile would be).
    let future = std::time::SystemTime::now() + Duration::from_secs(60);
    std::fs::File::options()
        .append(true)
        .open(dir.join("h.h"))
        .unwrap()
        .set_modified(future)
        .unwrap();
    let cache = MemoryCache::new();
    let compiler = SystemCompiler::new();
    let first = compile_cached(&compiler, Some(&cache), &src, &flags()).unwrap();
    let second = compile_cached(&compiler, Some(&cache), &src, &flags()).unwrap();
    assert!(!first.hit && !second.hit, "never cached while racy");
    assert_eq!(cache.stats().puts, 0);
}

#[test]
fn corrupt_truncated_foreign_and_adversarial_entries_are_misses_never_loaded() {
    let dir = scratch("damaged");
    let src = source(&dir, "f.c", "int f(int x) { return x + 1; }\n");
    let cache = DiskCache::open(dir.join("cache"), DiskLimits::default()).unwrap();
    let compiler = SystemCompiler::new();
    let good = compile_cached(&compiler, Some(&cache), &src, &flags()).unwrap();
    let file = entry_file(&cache);
    let stored = std::fs::read(&file).unwrap();
    // Corrupt: one byte flipped in the object.
    let mut corrupt = stored.clone();
    let at = corrupt.len() - 10;
    corrupt[at] ^= 0xff;
    // Truncated.
    let truncated = stored[..stored.len() / 2].to_vec();
    for (what, bytes) in [("corrupt", corrupt), ("truncated", truncated)] {
        std::fs::write(&file, bytes).unwrap();
        let again = compile_cached(&compiler, Some(&cache), &src, &flags()).unwrap();
        assert!(!again.hit, "{what}");
        assert_eq!(
            again.object, good.object,
            "{what}: recompiled, the same object"
        );
        assert_eq!(std::fs::read(&file).unwrap(), stored, "{what}: replaced");
    }
    // Foreign: a well-formed entry (valid checksum) whose object was made from something
    // else — the signature in its note is not this compile's.
    let other_src = source(&dir, "other.c", "int f(int x) { return 666; }\n");
    let foreign = compile_cached(&compiler, None, &other_src, &flags()).unwrap();
    cache.put(&good.key, &foreign.object).unwrap();
    let again = compile_cached(&compiler, Some(&cache), &src, &flags()).unwrap();
    assert!(
        !again.hit && again.object == good.object,
        "foreign entry not loaded"
    );
    // Adversarial: a valid checksum over bytes that are no object at all.
    cache.put(&good.key, b"\x7fELF not really").unwrap();
    let again = compile_cached(&compiler, Some(&cache), &src, &flags()).unwrap();
    assert!(!again.hit && again.object == good.object);
    let stats = cache.stats();
    assert_eq!(stats.rejected, 4, "{stats:?}");
}

/// Mounts a tmpfs of `size` at `dir` (read-only with `ro`); `None` where mounting is not
/// allowed (the test then says so and checks what it can).
fn tmpfs(dir: &Path, options: &str) -> Option<Mount> {
    std::fs::create_dir_all(dir).unwrap();
    let ok = Command::new("mount")
        .args(["-t", "tmpfs", "-o", options, "tmpfs"])
        .arg(dir)
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    ok.then(|| Mount(dir.to_path_buf()))
}

struct Mount(PathBuf);

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

#[test]
fn a_full_disk_and_a_read_only_cache_never_fail_the_compile() {
    let dir = scratch("full");
    // Big enough to be slow to fill: a source whose object is far larger than the disk.
    let mut body = String::new();
    for i in 0..400 {
        body.push_str(&format!("int big{i}(int x) {{ return x * {i} + {i}; }}\n"));
    }
    let src = source(&dir, "big.c", &body);
    let compiler = SystemCompiler::new();
    let root = dir.join("small");
    let Some(_mount) = tmpfs(&root, "size=16k,mode=0700") else {
        panic!("mounting a tmpfs failed: the test command runs as root");
    };
    let cache = DiskCache::open(&root, DiskLimits::default()).unwrap();
    let outcome = compile_cached(&compiler, Some(&cache), &src, &flags()).unwrap();
    assert!(!outcome.hit);
    assert!(
        outcome.object.len() > 16 << 10,
        "the object does not fit the disk"
    );
    assert_eq!(cache.stats().errors, 1, "the failed store is counted");
    let skips = cache.take_skips();
    assert_eq!(skips.len(), 1, "{skips:?}");
    assert_eq!(skips[0].reason, SkipReason::Full, "{skips:?}");
    assert_eq!(skips[0].operation, "store");
    assert_eq!(
        cache.usage().unwrap().temporaries,
        0,
        "no half-written file left"
    );
    assert!(cache.get(&outcome.key).unwrap().is_none());
    // Read-only: the same cache remounted read-only.
    drop(_mount);
    let ro = dir.join("ro");
    let Some(_ro) = tmpfs(&ro, "size=1m,mode=0700") else {
        panic!("mounting a tmpfs failed");
    };
    let writable = DiskCache::open(&ro, DiskLimits::default()).unwrap();
    let small = source(&dir, "small.c", "int s(void) { return 1; }\n");
    let stored = compile_cached(&compiler, Some(&writable), &small, &flags()).unwrap();
    assert!(Command::new("mount")
        .args(["-o", "remount,ro"])
        .arg(&ro)
        .status()
        .unwrap()
        .success());
    let cache = DiskCache::open(&ro, DiskLimits::default()).unwrap();
    let hit = compile_cached(&compiler, Some(&cache), &small, &flags()).unwrap();
    assert!(
        hit.hit && hit.object == stored.object,
        "a read-only cache still serves"
    );
    let miss = compile_cached(&compiler, Some(&cache), &src, &flags()).unwrap();
    assert!(
        !miss.hit && cache.stats().errors == 1,
        "and cannot store: counted"
    );
    let skips = cache.take_skips();
    assert_eq!(skips.len(), 1, "{skips:?}");
    assert_eq!(skips[0].reason, SkipReason::ReadOnly, "{skips:?}");
    assert!(skips[0].to_string().contains("(read-only)"), "{}", skips[0]);
}

#[test]
fn a_cache_out_of_inodes_never_fails_the_compile_and_says_full() {
    let dir = scratch("inodes");
    let src = source(&dir, "i.c", "int i(void) { return 7; }\n");
    let root = dir.join("cache");
    // Three inodes: the root, its key and v1; no room for an entry.
    let Some(_mount) = tmpfs(&root, "size=1m,nr_inodes=3,mode=0700") else {
        panic!("mounting a tmpfs failed: the test command runs as root");
    };
    let cache = DiskCache::open(&root, DiskLimits::default()).unwrap();
    let compiler = SystemCompiler::new();
    let outcome = compile_cached(&compiler, Some(&cache), &src, &flags()).unwrap();
    assert!(!outcome.hit);
    assert!(
        signature_of(&outcome.object).is_some(),
        "compiled, with its note"
    );
    let skips = cache.take_skips();
    assert_eq!(skips.len(), 1, "{skips:?}");
    assert_eq!(skips[0].reason, SkipReason::Full, "{skips:?}");
    assert!(skips[0].to_string().contains("(full)"), "{}", skips[0]);
    assert_eq!(cache.usage().unwrap().temporaries, 0);
}

#[test]
fn least_recently_used_entries_are_evicted_beyond_the_limits() {
    let dir = scratch("lru");
    let cache = DiskCache::open(
        dir.join("cache"),
        DiskLimits {
            max_bytes: 1 << 30,
            max_entries: 4, // two compiles: an object and a manifest each
            ..DiskLimits::default()
        },
    )
    .unwrap();
    let compiler = SystemCompiler::new();
    let srcs: Vec<PathBuf> = (0..3)
        .map(|i| {
            source(
                &dir,
                &format!("s{i}.c"),
                &format!("int s{i}(void) {{ return {i}; }}\n"),
            )
        })
        .collect();
    let first = compile_cached(&compiler, Some(&cache), &srcs[0], &flags()).unwrap();
    std::thread::sleep(Duration::from_millis(20));
    let second = compile_cached(&compiler, Some(&cache), &srcs[1], &flags()).unwrap();
    std::thread::sleep(Duration::from_millis(20));
    // A hit makes the first the most recently used.
    assert!(
        compile_cached(&compiler, Some(&cache), &srcs[0], &flags())
            .unwrap()
            .hit
    );
    std::thread::sleep(Duration::from_millis(20));
    compile_cached(&compiler, Some(&cache), &srcs[2], &flags()).unwrap();
    assert_eq!(cache.usage().unwrap().entries, 4);
    assert!(
        cache.get(&first.key).unwrap().is_some(),
        "recently used: kept"
    );
    assert!(
        cache.get(&second.key).unwrap().is_none(),
        "least recently used: evicted"
    );
}

#[test]
fn a_writer_that_died_leaves_no_entry_and_its_file_is_pruned() {
    let dir = scratch("killed");
    let cache = DiskCache::open(dir.join("cache"), DiskLimits::default()).unwrap();
    // What a writer killed between its write and its rename leaves: a temporary file.
    let leftover = cache.dir().join(".tmpKILLED");
    std::fs::write(&leftover, b"KILNOBJ1 half an ent").unwrap();
    let old = std::time::SystemTime::now() - Duration::from_secs(7200);
    std::fs::File::options()
        .append(true)
        .open(&leftover)
        .unwrap()
        .set_modified(old)
        .unwrap();
    assert_eq!(cache.usage().unwrap().entries, 0, "never an entry");
    cache.prune().unwrap();
    assert!(!leftover.exists(), "stale temporary files are pruned");
}

/// A redis-server of this test's own, on `port`; killed when dropped.
struct RedisServer {
    child: std::process::Child,
    port: u16,
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts redis-server on a port the system says is free, storing in `dir`. A port taken
/// between the choice and the server's bind (another test's connection) makes the server
/// exit: then another port is tried, up to five.
fn redis_server(dir: &Path) -> RedisServer {
    for _ in 0..5 {
        let port = std::net::TcpListener::bind(("127.0.0.1", 0))
            .and_then(|l| l.local_addr())
            .expect("a free local port")
            .port();
        let child = Command::new("redis-server")
            .args([
                "--port",
                &port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
            ])
            .arg(dir)
            .stdout(std::process::Stdio::null())
            .spawn()
            .expect("redis-server runs (the test command installs it)");
        let mut server = RedisServer { child, port };
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                return server;
            }
            if server.child.try_wait().ok().flatten().is_some() {
                break; // it could not listen there: another port
            }
            assert!(
                std::time::Instant::now() < deadline,
                "redis-server did not start on port {port}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    panic!("redis-server exited at once on five free ports")
}

#[test]
fn redis_cold_warm_corrupt_and_down() {
    let dir = scratch("redis");
    let server = redis_server(&dir);
    let port = server.port;
    let url = format!("redis://127.0.0.1:{port}/");
    // The key a fleet would share (KILN_CACHE_KEY_FILE); open() reads it from there.
    let fleet = kiln_cache::MacKey::from_bytes([42; 32]);
    let cache = RedisCache::open_with_key(&url, Duration::from_millis(500), fleet.clone()).unwrap();
    let compiler = SystemCompiler::new();
    let src = source(&dir, "r.c", "int r(int x) { return x - 1; }\n");
    let cold = compile_cached(&compiler, Some(&cache), &src, &flags()).unwrap();
    let warm = compile_cached(&compiler, Some(&cache), &src, &flags()).unwrap();
    assert!(!cold.hit && warm.hit && cold.object == warm.object);
    // Another process (a second cache object) sees the same entry.
    let other = RedisCache::open_with_key(&url, Duration::from_millis(500), fleet).unwrap();
    assert!(
        compile_cached(&compiler, Some(&other), &src, &flags())
            .unwrap()
            .hit
    );
    // A corrupt entry written by someone else is never loaded.
    let redis_key = format!("kiln:v2:{}", cold.key.hex());
    assert!(Command::new("redis-cli")
        .args([
            "-p",
            &port.to_string(),
            "SET",
            &redis_key,
            "KILNOBJ2garbage"
        ])
        .output()
        .unwrap()
        .status
        .success());
    let again = compile_cached(&compiler, Some(&cache), &src, &flags()).unwrap();
    assert!(!again.hit && again.object == cold.object);
    assert_eq!(cache.stats().rejected, 1);
    // The server stopped mid-run: a miss and a compile, never a failure.
    drop(server);
    let t = std::time::Instant::now();
    let down = compile_cached(&compiler, Some(&cache), &src, &flags()).unwrap();
    assert!(!down.hit && down.object == cold.object);
    assert!(
        t.elapsed() < Duration::from_secs(5),
        "bounded by the timeout"
    );
    assert!(cache.stats().errors >= 1);
}
