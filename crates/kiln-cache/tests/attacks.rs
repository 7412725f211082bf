//! Issue 23's adversarial round, replayed: another local user who can reach the cache
//! plants objects, links, rewritten manifests, recomputed checksums, FIFOs, `/dev/zero`
//! links, sparse giants and a linked `v1/`, or makes the cache directory first. Every
//! scenario must end in a miss (the victim's own object, compiled or genuinely cached) or
//! a refusal of the cache, never in the planted object being loaded, nor in a hang.
//!
//! The tests run as root (the test command does): "another user" is uid 65534 (nobody),
//! made the owner of files with chown.

use kiln_cache::{
    compile_cached, embed_signature, CacheError, Compiler, DiskCache, DiskLimits, MacKey,
    ObjectCache, SystemCompiler,
};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

fn scratch(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join("attacks")
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

const GOOD: &str = "int answer(void) { return 42; }\n";
const EVIL: &str = "int answer(void) { return 666; } /* EVIL: code of another user */\n";

/// The cache's files, with what each holds: (path, is an object entry).
fn entries(cache: &DiskCache) -> Vec<(PathBuf, bool)> {
    let mut files: Vec<(PathBuf, bool)> = std::fs::read_dir(cache.dir())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "kobj"))
        .map(|p| {
            let object = std::fs::read(&p).unwrap().get(48..52) == Some(b"\x7fELF");
            (p, object)
        })
        .collect();
    files.sort();
    files
}

fn only(cache: &DiskCache, object: bool) -> PathBuf {
    let found: Vec<PathBuf> = entries(cache)
        .into_iter()
        .filter(|e| e.1 == object)
        .map(|e| e.0)
        .collect();
    assert_eq!(found.len(), 1, "{found:?}");
    found[0].clone()
}

/// The victim's cache with good.c compiled once (an object and a manifest), and the
/// attacker's own cache, key and evil object carrying good.c's note.
struct Scene {
    dir: PathBuf,
    compiler: SystemCompiler,
    victim: DiskCache,
    good_src: PathBuf,
    good_object: Vec<u8>,
    good_key: kiln_cache::CacheKey,
    /// EVIL's object with good.c's signature note, as the attacker can make it (the note
    /// is no secret: compiling the same source gives it).
    evil_with_good_note: Vec<u8>,
    attacker: DiskCache,
}

fn scene(name: &str) -> Scene {
    let dir = scratch(name);
    let compiler = SystemCompiler::new();
    let victim = DiskCache::open(dir.join("victim"), DiskLimits::default()).unwrap();
    let good_src = source(&dir, "good.c", GOOD);
    let good = compile_cached(&compiler, Some(&victim), &good_src, &flags()).unwrap();
    assert!(!good.hit);
    let evil_src = source(&dir, "evil.c", EVIL);
    let evil = compiler.compile(&evil_src, &flags()).unwrap();
    let note = compiler.signature(&good_src, &flags()).unwrap().canonical();
    let evil_with_good_note = embed_signature(&evil, &note).unwrap();
    let attacker = DiskCache::open_with_key(
        dir.join("attacker"),
        DiskLimits::default(),
        MacKey::random().unwrap(),
    )
    .unwrap();
    Scene {
        dir,
        compiler,
        victim,
        good_src,
        good_object: good.object.to_vec(),
        good_key: good.key,
        evil_with_good_note,
        attacker,
    }
}

impl Scene {
    /// The victim compiles good.c again: it must get good.c's object, whatever is planted.
    fn victim_runs(&self) -> kiln_cache::CompileOutcome {
        let outcome =
            compile_cached(&self.compiler, Some(&self.victim), &self.good_src, &flags()).unwrap();
        assert_eq!(
            outcome.object, self.good_object,
            "the planted object was loaded"
        );
        assert_ne!(outcome.object, self.evil_with_good_note);
        outcome
    }
}

#[test]
fn another_object_carrying_the_good_note_is_never_loaded() {
    let s = scene("note");
    // The attacker stores EVIL with good.c's note under good.c's key in a cache of their
    // own (a well-formed entry, sealed with their key), then copies it over the victim's.
    s.attacker.put(&s.good_key, &s.evil_with_good_note).unwrap();
    let planted = only(&s.attacker, true);
    let target = only(&s.victim, true);
    std::fs::copy(&planted, &target).unwrap();
    let before = s.victim.stats().rejected;
    let outcome = s.victim_runs();
    assert!(
        !outcome.hit,
        "a miss: the entry was not sealed with the victim's key"
    );
    assert_eq!(s.victim.stats().rejected, before + 1);
    // The planted entry was replaced by the victim's own.
    assert!(s.victim.get(&s.good_key).unwrap().is_some());
}

#[test]
fn an_entry_reached_through_a_link_is_never_loaded() {
    let s = scene("link");
    let target = only(&s.victim, true);
    // A link to the attacker's entry, and then a link to a genuine copy of the victim's
    // own entry: neither is followed.
    s.attacker.put(&s.good_key, &s.evil_with_good_note).unwrap();
    let genuine_copy = s.dir.join("genuine-copy.kobj");
    std::fs::copy(&target, &genuine_copy).unwrap();
    for pointee in [only(&s.attacker, true), genuine_copy.clone()] {
        std::fs::remove_file(&target).unwrap();
        std::os::unix::fs::symlink(&pointee, &target).unwrap();
        assert!(
            s.victim.get(&s.good_key).unwrap().is_none(),
            "a link is a miss"
        );
        assert!(
            std::fs::symlink_metadata(&target).is_err(),
            "the link was removed"
        );
        assert!(pointee.exists(), "what it pointed to was not touched");
        std::os::unix::fs::symlink(&pointee, &target).unwrap();
        s.victim_runs();
    }
}

#[test]
fn a_manifest_rewritten_to_another_signature_is_never_followed() {
    let s = scene("manifest");
    let good_manifest = only(&s.victim, false);
    let good_manifest_bytes = std::fs::read(&good_manifest).unwrap();
    // other.c, compiled by the victim: a genuine object and a genuine manifest.
    let before: Vec<PathBuf> = entries(&s.victim).into_iter().map(|e| e.0).collect();
    let other_src = source(&s.dir, "other.c", EVIL);
    let other = compile_cached(&s.compiler, Some(&s.victim), &other_src, &flags()).unwrap();
    let other_manifest = entries(&s.victim)
        .into_iter()
        .find(|(p, object)| !object && !before.contains(p))
        .unwrap()
        .0;
    // 1. other.c's genuine manifest copied over good.c's: sealed for another key.
    std::fs::copy(&other_manifest, &good_manifest).unwrap();
    let outcome = s.victim_runs();
    assert_ne!(
        outcome.object, other.object,
        "other.c's object ran for good.c"
    );
    // 2. good.c's manifest edited to name other.c's signature, checksum recomputed as the
    //    old format allowed, and resealed with the attacker's key.
    let text = String::from_utf8_lossy(&good_manifest_bytes[48..]).into_owned();
    let other_signature = s.compiler.signature(&other_src, &flags()).unwrap();
    let (head, _) = text.split_once("signature\n").unwrap();
    let forged = format!("{head}signature\n{}", other_signature.canonical());
    let mut resealed = good_manifest_bytes[..48].to_vec();
    resealed[8..16].copy_from_slice(&(forged.len() as u64).to_le_bytes());
    resealed[16..48].copy_from_slice(blake3::hash(forged.as_bytes()).as_bytes());
    resealed.extend_from_slice(forged.as_bytes());
    std::fs::write(&good_manifest, &resealed).unwrap();
    let outcome = s.victim_runs();
    assert_ne!(outcome.object, other.object);
    // 3. The same forged manifest, sealed by the attacker's own cache for good.c's
    //    manifest key (found by name): still not the victim's key.
    let manifest_name = good_manifest.file_name().unwrap().to_owned();
    let attacker_path = s.attacker.dir().join(&manifest_name);
    let hex = manifest_name
        .to_string_lossy()
        .trim_end_matches(".kobj")
        .to_string();
    let mut key = [0u8; 32];
    for (i, byte) in key.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).unwrap();
    }
    s.attacker
        .put(&kiln_cache::CacheKey(key), forged.as_bytes())
        .unwrap();
    std::fs::copy(&attacker_path, &good_manifest).unwrap();
    let outcome = s.victim_runs();
    assert_ne!(outcome.object, other.object);
}

#[test]
fn a_modified_payload_with_its_checksum_recomputed_is_never_loaded() {
    let s = scene("checksum");
    let target = only(&s.victim, true);
    let stored = std::fs::read(&target).unwrap();
    // The evil object in place of the payload, length and unkeyed BLAKE3 recomputed.
    let payload = &s.evil_with_good_note;
    let mut forged = stored[..48].to_vec();
    forged[8..16].copy_from_slice(&(payload.len() as u64).to_le_bytes());
    forged[16..48].copy_from_slice(blake3::hash(payload).as_bytes());
    forged.extend_from_slice(payload);
    std::fs::write(&target, &forged).unwrap();
    assert!(!s.victim_runs().hit);
    // Keyed with a key the attacker chose: the same.
    let mut hasher = blake3::Hasher::new_keyed(&[9; 32]);
    hasher.update(payload);
    forged[16..48].copy_from_slice(hasher.finalize().as_bytes());
    std::fs::write(&target, &forged).unwrap();
    assert!(!s.victim_runs().hit);
}

fn assert_untrusted(result: Result<DiskCache, CacheError>, says: &str) {
    match result {
        Err(e @ CacheError::Untrusted { .. }) => {
            let message = e.to_string();
            assert!(message.contains(says), "{message}");
            assert!(message.contains("not a safe place"), "{message}");
        }
        Err(other) => panic!("another error: {other}"),
        Ok(cache) => panic!("the cache at {} was used", cache.dir().display()),
    }
}

#[test]
fn a_cache_directory_others_can_write_to_or_own_is_refused() {
    let s = scene("directory");
    let root = s.victim.root().to_path_buf();
    std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o777)).unwrap();
    assert_untrusted(DiskCache::open(&root, DiskLimits::default()), "mode 0777");
    std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o700)).unwrap();
    std::os::unix::fs::chown(&root, Some(65534), Some(65534)).unwrap();
    assert_untrusted(
        DiskCache::open(&root, DiskLimits::default()),
        "owned by uid 65534",
    );
    std::os::unix::fs::chown(&root, Some(0), Some(0)).unwrap();
    // v1 made world-writable, or owned by another user.
    std::fs::set_permissions(s.victim.dir(), std::fs::Permissions::from_mode(0o777)).unwrap();
    assert_untrusted(DiskCache::open(&root, DiskLimits::default()), "mode 0777");
    std::fs::set_permissions(s.victim.dir(), std::fs::Permissions::from_mode(0o700)).unwrap();
    // A directory above it writable by others (not sticky).
    let parent = root.parent().unwrap();
    std::fs::set_permissions(parent, std::fs::Permissions::from_mode(0o777)).unwrap();
    assert_untrusted(
        DiskCache::open(&root, DiskLimits::default()),
        "on the path writable",
    );
    std::fs::set_permissions(parent, std::fs::Permissions::from_mode(0o755)).unwrap();
    assert!(DiskCache::open(&root, DiskLimits::default()).is_ok());
}

#[test]
fn a_cache_another_user_made_first_in_a_shared_tmp_is_refused() {
    // As /tmp/kiln-cache was: a sticky, world-writable directory of root's, where
    // "nobody" made the cache directory first (0777) and planted an entry.
    let dir = scratch("tmp");
    let tmp = dir.join("tmp");
    std::fs::create_dir(&tmp).unwrap();
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o1777)).unwrap();
    let theirs = tmp.join("kiln-cache");
    let planted =
        DiskCache::open_with_key(&theirs, DiskLimits::default(), MacKey::random().unwrap())
            .unwrap();
    planted
        .put(&kiln_cache::CacheKey([1; 32]), b"EVIL")
        .unwrap();
    for path in [theirs.clone(), planted.dir().to_path_buf()] {
        std::os::unix::fs::chown(&path, Some(65534), Some(65534)).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o777)).unwrap();
    }
    assert_untrusted(DiskCache::open(&theirs, DiskLimits::default()), "");
    // Even made 0700 (but theirs): refused.
    std::fs::set_permissions(&theirs, std::fs::Permissions::from_mode(0o700)).unwrap();
    assert_untrusted(
        DiskCache::open(&theirs, DiskLimits::default()),
        "owned by uid 65534",
    );
    // A directory of the victim's own in the same sticky directory is fine.
    let mine = tmp.join("mine");
    let cache = DiskCache::open(&mine, DiskLimits::default()).unwrap();
    assert_eq!(
        std::fs::metadata(cache.root())
            .unwrap()
            .permissions()
            .mode()
            & 0o777,
        0o700
    );
}

/// Runs `f` on a thread and fails the test if it takes longer than `limit` (a hang).
fn within<T: Send + 'static>(limit: Duration, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(limit).expect("no hang")
}

/// Puts something at a path.
type Plant = dyn Fn(&Path);

#[test]
fn a_fifo_a_dev_zero_link_and_a_sparse_giant_are_misses_at_once() {
    let s = scene("special");
    let target = only(&s.victim, true);
    let key = s.good_key;
    let root = s.victim.root().to_path_buf();
    let plants: [(&str, Box<Plant>); 3] = [
        (
            "fifo",
            Box::new(|p: &Path| {
                assert!(std::process::Command::new("mkfifo")
                    .arg(p)
                    .status()
                    .unwrap()
                    .success())
            }),
        ),
        (
            "/dev/zero",
            Box::new(|p: &Path| std::os::unix::fs::symlink("/dev/zero", p).unwrap()),
        ),
        (
            "3 GiB sparse",
            Box::new(|p: &Path| std::fs::File::create(p).unwrap().set_len(3 << 30).unwrap()),
        ),
    ];
    for (what, plant) in plants {
        std::fs::remove_file(&target).unwrap();
        plant(&target);
        let root = root.clone();
        let started = Instant::now();
        let found = within(Duration::from_secs(20), move || {
            let cache = DiskCache::open(&root, DiskLimits::default()).unwrap();
            let found = cache.get(&key).unwrap();
            (found, cache.stats().rejected)
        });
        assert!(found.0.is_none(), "{what}: a miss");
        assert_eq!(found.1, 1, "{what}: rejected");
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{what}: at once, not after reading it ({:?})",
            started.elapsed()
        );
        assert!(
            std::fs::symlink_metadata(&target).is_err(),
            "{what}: the name was removed"
        );
        s.victim_runs();
    }
}

#[test]
fn a_linked_v1_is_refused_and_prune_never_deletes_where_it_points() {
    let dir = scratch("linked-v1");
    // The victim's directory, with a stale temporary file and an entry of theirs.
    let elsewhere = dir.join("elsewhere");
    std::fs::create_dir(&elsewhere).unwrap();
    let stale = elsewhere.join(".tmpPRECIOUS");
    std::fs::write(&stale, b"not the cache's").unwrap();
    std::fs::File::options()
        .append(true)
        .open(&stale)
        .unwrap()
        .set_modified(std::time::SystemTime::now() - Duration::from_secs(7200))
        .unwrap();
    let entry = elsewhere.join(format!("{}.kobj", "ab".repeat(32)));
    std::fs::write(&entry, b"precious too").unwrap();
    // A cache root whose v1 is a link to it: refused at open.
    let root = dir.join("cache");
    std::fs::create_dir(&root).unwrap();
    std::os::unix::fs::symlink(&elsewhere, root.join("v1")).unwrap();
    assert_untrusted(
        DiskCache::open(&root, DiskLimits::default()),
        "symbolic link",
    );
    // A cache opened before v1 became a link: prune and clear refuse, removing nothing.
    std::fs::remove_file(root.join("v1")).unwrap();
    let cache = DiskCache::open(
        &root,
        DiskLimits {
            max_entries: 0,
            ..DiskLimits::default()
        },
    )
    .unwrap();
    std::fs::remove_dir(cache.dir()).unwrap();
    std::os::unix::fs::symlink(&elsewhere, root.join("v1")).unwrap();
    assert!(matches!(cache.prune(), Err(CacheError::Untrusted { .. })));
    assert!(matches!(cache.clear(), Err(CacheError::Untrusted { .. })));
    assert!(cache.usage().is_err());
    assert!(
        stale.exists() && entry.exists(),
        "nothing deleted through the link"
    );
    // Links inside v1 are removed by prune, never what they point to.
    std::fs::remove_file(root.join("v1")).unwrap();
    std::fs::create_dir(root.join("v1")).unwrap();
    std::os::unix::fs::symlink(&stale, root.join("v1").join(".tmpLINK")).unwrap();
    std::os::unix::fs::symlink(&entry, root.join("v1").join("link.kobj")).unwrap();
    let cache = DiskCache::open(&root, DiskLimits::default()).unwrap();
    assert_eq!(cache.usage().unwrap().strays, 2);
    cache.prune().unwrap();
    assert_eq!(cache.usage().unwrap().strays, 0);
    assert!(
        stale.exists() && entry.exists(),
        "links removed, targets kept"
    );
}
