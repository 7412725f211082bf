//! Entries checked whole once, then trusted while their file is unchanged: the stamp's
//! promises, each tested against the disk cache of objects and the image cache.
//!
//! - An entry changed in the seconds after it was written is never stamped (its times
//!   could not tell a second change apart).
//! - Once stamped, a hit hashes nothing (counted: `checked_whole` does not move).
//! - Any change of the file — bytes written in place, a truncation, another entry renamed
//!   over it — makes the next hit check it whole: a corrupt entry is a miss and is removed,
//!   with its stamp.
//! - A stamp is worth nothing without the cache's key, nor for another entry.

use kiln_cache::{
    CacheKey, DiskCache, DiskImageCache, DiskLimits, ImageCache, ImageToStore, ObjectCache, RACY,
};
use std::io::{Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

fn scratch(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join("stamps")
        .join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Past the seconds in which a file's times cannot tell changes apart.
fn settle() {
    std::thread::sleep(RACY + Duration::from_millis(200));
}

fn entry_path(dir: &Path, key: &CacheKey, suffix: &str) -> PathBuf {
    dir.join(format!("{}{suffix}", key.hex()))
}

fn stamp_of(entry: &Path) -> PathBuf {
    let mut s = entry.as_os_str().to_owned();
    s.push(".ok");
    PathBuf::from(s)
}

/// Whether the entry at `entry` has a stamp (not only a use recorded: 32 zero bytes).
fn stamped(entry: &Path) -> bool {
    std::fs::read(stamp_of(entry)).is_ok_and(|s| s.len() == 32 && s != [0u8; 32])
}

/// Overwrites one byte of `path` at `offset`, in place (the inode and size stay).
fn flip(path: &Path, offset: u64) {
    let mut f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    let mut byte = [0u8; 1];
    let bytes = std::fs::read(path).unwrap();
    byte[0] = bytes[offset as usize] ^ 0x55;
    f.seek(SeekFrom::Start(offset)).unwrap();
    f.write_all(&byte).unwrap();
}

#[test]
fn an_object_entry_is_checked_whole_once_then_stamped() {
    let dir = scratch("objects");
    let cache = DiskCache::open(dir.join("cache"), DiskLimits::default()).unwrap();
    let key = CacheKey([1; 32]);
    let object = b"an object, whatever its bytes".repeat(1000);
    cache.put(&key, &object).unwrap();
    let entry = entry_path(cache.dir(), &key, ".kobj");

    // Just written: checked whole, and not stamped (too recent).
    assert_eq!(cache.get(&key).unwrap().unwrap(), object);
    assert_eq!(cache.stats().checked_whole, 1);
    assert!(!stamped(&entry), "a recent entry is never stamped");
    assert!(
        stamp_of(&entry).exists(),
        "its stamp file carries only the use (for least-recently-used)"
    );

    // Past the racy seconds: checked whole once more, and stamped.
    settle();
    assert_eq!(cache.get(&key).unwrap().unwrap(), object);
    assert_eq!(cache.stats().checked_whole, 2);
    assert!(stamped(&entry), "stamped");

    // Stamped hits hash nothing, in this process and in another cache opened on it.
    for _ in 0..3 {
        assert_eq!(cache.get(&key).unwrap().unwrap(), object);
    }
    assert_eq!(cache.stats().checked_whole, 2);
    let again = DiskCache::open(dir.join("cache"), DiskLimits::default()).unwrap();
    assert_eq!(again.get(&key).unwrap().unwrap(), object);
    assert_eq!(again.stats().checked_whole, 0);

    // A byte changed in place (same inode, same size): checked whole, a miss, removed
    // with its stamp.
    flip(&entry, 100);
    assert!(
        cache.get(&key).unwrap().is_none(),
        "a corrupt entry is a miss"
    );
    assert_eq!(cache.stats().rejected, 1);
    assert!(!entry.exists() && !stamp_of(&entry).exists());
}

#[test]
fn a_change_in_the_racy_seconds_is_caught() {
    let dir = scratch("racy");
    let cache = DiskCache::open(dir.join("cache"), DiskLimits::default()).unwrap();
    let key = CacheKey([2; 32]);
    cache.put(&key, b"first object").unwrap();
    let entry = entry_path(cache.dir(), &key, ".kobj");
    assert!(cache.get(&key).unwrap().is_some());
    // Changed within the same tick as the write the hit saw: no stamp hides it. (Kernels
    // with fine-grained change times after a `stat`, 6.13 and later on ext4, tell such a
    // change apart by its time too; older ones need the racy rule this checks.)
    flip(&entry, 50);
    assert!(cache.get(&key).unwrap().is_none());
    assert_eq!(cache.stats().rejected, 1);
}

#[test]
fn a_stamp_vouches_only_for_its_own_unchanged_entry() {
    let dir = scratch("foreign");
    let cache = DiskCache::open(dir.join("cache"), DiskLimits::default()).unwrap();
    let (a, b) = (CacheKey([3; 32]), CacheKey([4; 32]));
    cache.put(&a, b"object A, this long").unwrap();
    cache.put(&b, b"object B, this long").unwrap();
    settle();
    assert!(cache.get(&a).unwrap().is_some());
    assert!(cache.get(&b).unwrap().is_some());
    let (entry_a, entry_b) = (
        entry_path(cache.dir(), &a, ".kobj"),
        entry_path(cache.dir(), &b, ".kobj"),
    );
    assert!(stamped(&entry_a) && stamped(&entry_b));

    // B's entry renamed over A's (another inode), with A's stamp left in place: A's key
    // finds B's object, sealed for B: checked whole, refused.
    std::fs::rename(&entry_b, &entry_a).unwrap();
    assert!(cache.get(&a).unwrap().is_none(), "a moved entry is a miss");
    assert_eq!(cache.stats().rejected, 1);

    // A stamp copied from another entry, or made up, vouches for nothing: a corrupt entry
    // under it is checked whole and refused.
    let c = CacheKey([5; 32]);
    cache.put(&c, b"object C, this long").unwrap();
    settle();
    let entry_c = entry_path(cache.dir(), &c, ".kobj");
    flip(&entry_c, 60);
    std::fs::write(stamp_of(&entry_c), [7u8; 32]).unwrap();
    assert!(cache.get(&c).unwrap().is_none(), "a made-up stamp");
    assert_eq!(cache.stats().rejected, 2);

    // Another cache key's stamp (of the same store, but not this key's): the same.
    let other_key = DiskCache::open_with_key(
        dir.join("cache"),
        DiskLimits::default(),
        kiln_cache::MacKey::from_bytes([9; 32]),
    )
    .unwrap();
    let d = CacheKey([6; 32]);
    cache.put(&d, b"object D, this long").unwrap();
    settle();
    assert!(
        cache.get(&d).unwrap().is_some(),
        "stamped under the cache's key"
    );
    assert!(
        other_key.get(&d).unwrap().is_none(),
        "neither the entry nor its stamp opens under another key"
    );
}

#[test]
fn pruning_and_clearing_take_the_stamps_with_the_entries() {
    let dir = scratch("prune");
    let cache = DiskCache::open(dir.join("cache"), DiskLimits::default()).unwrap();
    let key = CacheKey([8; 32]);
    cache.put(&key, b"an entry").unwrap();
    settle();
    assert!(cache.get(&key).unwrap().is_some());
    let entry = entry_path(cache.dir(), &key, ".kobj");
    assert!(stamped(&entry));
    assert_eq!(cache.usage().unwrap().entries, 1, "a stamp is no entry");
    // A stamp left without its entry (another process removed it) is pruned.
    std::fs::remove_file(&entry).unwrap();
    cache.prune().unwrap();
    assert!(!stamp_of(&entry).exists());
    cache.put(&key, b"an entry").unwrap();
    settle();
    assert!(cache.get(&key).unwrap().is_some());
    assert_eq!(cache.clear().unwrap(), 1);
    assert_eq!(std::fs::read_dir(cache.dir()).unwrap().count(), 0);
}

#[test]
fn an_image_is_checked_whole_once_then_stamped_and_a_changed_block_is_caught() {
    let dir = scratch("image");
    let cache = DiskImageCache::open(dir.join("cache"), DiskLimits::default()).unwrap();
    let key = CacheKey([10; 32]);
    let code = vec![0xc3u8; 3 * 4096];
    let data = vec![0x11u8; 4096];
    let segments = [Some(&code[..]), Some(&data[..])];
    cache
        .put(
            &key,
            &ImageToStore {
                description: b"the linker's description",
                segments: &segments,
                page: 4096,
            },
        )
        .unwrap();
    let entry = entry_path(cache.dir(), &key, ".kimg");
    settle();
    let image = cache.get(&key).unwrap().expect("a hit");
    assert_eq!(image.description(), b"the linker's description");
    assert_eq!(cache.stats().checked_whole, 1);
    assert!(stamped(&entry));
    for _ in 0..2 {
        assert!(cache.get(&key).unwrap().is_some());
    }
    assert_eq!(cache.stats().checked_whole, 1, "stamped hits hash nothing");
    // A byte of the code's last page changed in place: the next hit checks every block.
    let len = std::fs::metadata(&entry).unwrap().len();
    flip(&entry, len - 4096 - 10);
    assert!(
        cache.get(&key).unwrap().is_none(),
        "a changed block is a miss"
    );
    assert_eq!(cache.stats().rejected, 1);
    assert!(!entry.exists() && !stamp_of(&entry).exists());
}

#[test]
fn an_entry_hit_every_half_second_is_stamped_all_the_same() {
    let dir = scratch("often");
    let cache = DiskCache::open(dir.join("cache"), DiskLimits::default()).unwrap();
    let key = CacheKey([11; 32]);
    cache.put(&key, b"an entry hit often").unwrap();
    let entry = entry_path(cache.dir(), &key, ".kobj");
    // Hits inside the racy seconds must not move the entry's change time on (touching it
    // for least-recently-used would): the one past them stamps it.
    for _ in 0..6 {
        assert!(cache.get(&key).unwrap().is_some());
        std::thread::sleep(Duration::from_millis(500));
    }
    assert!(cache.get(&key).unwrap().is_some());
    assert!(stamped(&entry), "stamped once past the racy seconds");
}
