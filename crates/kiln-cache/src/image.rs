//! The linked-image cache: after a link, the module's image (its segments as written and
//! a description of what to rebind at load, made by the linker) is stored under a key of
//! everything the link read; a later link of the same inputs maps the image's file instead
//! of linking. The cache stores and checks; what the description says is the linker's.
//!
//! An image file, written once (a temporary file renamed over the entry, so a reader sees
//! a whole image or none) and never changed in place:
//!
//! ```text
//! header:  "KILNIMG2" | header length u64 | cache key [32] | page size u32
//!          | segments: count u32, then (file offset: Option<u64>, length u64) each
//!          | block size u32 | the blocks' BLAKE3 hashes, 32 bytes each, as a byte string
//!          | description, as a byte string | MAC [32]
//! (fields in kiln-codec's encodings: a byte string is a u32 length and the bytes, an
//! option a byte, 0 or 1, and the value if 1)
//! padding to a page
//! segments, each from a page boundary, padded to whole pages
//! ```
//!
//! The MAC (keyed BLAKE3 under the cache's [`MacKey`], as object entries) covers the
//! header: an image this user did not make, or moved from another key, is a miss. The
//! segments are covered block by block: each block's hash is in the MACed header. The
//! first hit checks the MAC and every block (in parallel, over the pages the mapping will
//! share); a truncated file, a block of zeros left by a crash, any flipped bit is a miss,
//! and the entry is removed. That check is then *stamped* (see `stamp.rs`): later hits of
//! the same, unchanged file hash nothing, and any change of the file (which moves its
//! change time) makes the next hit check it whole again.

use crate::disk::{DiskCache, EntryKind};
use crate::files::{self, Links, ReadRefusal};
use crate::{
    io, CacheError, CacheKey, CacheSkip, CacheStats, DiskLimits, DiskUsage, MacKey, SkipReason,
};
use kiln_codec::{Field, Reader, Writer};
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

const MAGIC: &[u8; 8] = b"KILNIMG2";
/// What the MAC covers first: the format, so that no other use of the key collides.
const DOMAIN: &[u8] = b"kiln-cache image 2\0";
/// Bytes of segment data per checked block.
const BLOCK: u64 = 256 << 10;
/// The largest header read (a description of a few hundred thousand symbols).
const MAX_HEADER: u64 = 256 << 20;

/// The image cache's entries in a cache root.
const IMAGES: EntryKind = EntryKind {
    dir: "images-v1",
    suffix: ".kimg",
};

/// An image found in a cache, checked: its file (to map), where each segment's bytes are
/// in it, and the linker's description.
#[derive(Debug)]
pub struct CachedImage {
    /// The image file, open for reading (map its segments `MAP_PRIVATE`).
    pub file: File,
    /// Where it is.
    pub path: PathBuf,
    /// The file, mapped read-only (the description is read from it: no copy).
    map: std::sync::Arc<memmap2::Mmap>,
    /// Where the description is in the file.
    description: std::ops::Range<usize>,
    /// Each segment's offset in the file (a multiple of the page size the image was
    /// stored with); `None` for a segment that is not in the file (zero-filled or empty).
    pub segments: Vec<Option<u64>>,
}

impl CachedImage {
    /// The description the linker stored with the image.
    pub fn description(&self) -> &[u8] {
        &self.map[self.description.clone()]
    }

    /// The file's mapping and where the description is in it, for a reader that keeps
    /// parts of it where they lie (the mapping lives as long as the reader holds it).
    pub fn description_in_place(&self) -> (std::sync::Arc<memmap2::Mmap>, std::ops::Range<usize>) {
        (self.map.clone(), self.description.clone())
    }
}

/// An image to store: the linker's description, each segment's bytes (`None`: not stored,
/// zero-filled), and the page size segments are aligned to in the file.
#[derive(Debug, Clone, Copy)]
pub struct ImageToStore<'a> {
    /// What the linker needs to rebind the image.
    pub description: &'a [u8],
    /// The segments' bytes, in the image's order.
    pub segments: &'a [Option<&'a [u8]>],
    /// The page size (segments start on its multiples in the file).
    pub page: u64,
}

/// A store of linked images. Implementations must return only images stored under the
/// same key by this user (or whoever shares the MAC key), whole and unaltered.
pub trait ImageCache: Send + Sync {
    /// A name for messages (`disk:/home/u/.cache/kiln/images-v1`).
    fn name(&self) -> String;
    /// The image stored under `key`, checked; `None` if there is none (or it failed a
    /// check, and was removed).
    fn get(&self, key: &CacheKey) -> Result<Option<CachedImage>, CacheError>;
    /// Stores `image` under `key`, replacing any other atomically.
    fn put(&self, key: &CacheKey, image: &ImageToStore<'_>) -> Result<(), CacheError>;
    /// Counters since the cache was opened.
    fn stats(&self) -> CacheStats;
    /// Operations skipped since the last call (a full or read-only disk), and why.
    fn take_skips(&self) -> Vec<CacheSkip>;
}

/// Linked images in files, in a cache root (`ROOT/images-v1`) checked and keyed as the
/// [`DiskCache`]'s objects are.
#[derive(Debug)]
pub struct DiskImageCache {
    store: DiskCache,
}

impl DiskImageCache {
    /// The image cache in `root` (made 0700 if missing), sealed with the key of
    /// `$KILN_CACHE_KEY_FILE` or `root/key`, as [`DiskCache::open`].
    pub fn open(root: impl AsRef<Path>, limits: DiskLimits) -> Result<Self, CacheError> {
        Ok(DiskImageCache {
            store: DiskCache::open_kind(root.as_ref(), limits, None, IMAGES)?,
        })
    }

    /// The image cache in `root` sealed with `mac_key`.
    pub fn open_with_key(
        root: impl AsRef<Path>,
        limits: DiskLimits,
        mac_key: MacKey,
    ) -> Result<Self, CacheError> {
        Ok(DiskImageCache {
            store: DiskCache::open_kind(root.as_ref(), limits, Some(mac_key), IMAGES)?,
        })
    }

    /// The cache root (checked at open), which holds the images' directory.
    pub fn root(&self) -> &Path {
        self.store.root()
    }

    /// The directory images are in.
    pub fn dir(&self) -> &Path {
        self.store.dir()
    }

    /// What the cache holds.
    pub fn usage(&self) -> Result<DiskUsage, CacheError> {
        self.store.usage()
    }

    /// Removes every image. Returns how many went.
    pub fn clear(&self) -> Result<u64, CacheError> {
        self.store.clear()
    }

    /// Applies the limits (least recently used first). Returns how many images went.
    pub fn prune(&self) -> Result<u64, CacheError> {
        self.store.prune()
    }

    /// Removes an entry that failed a check, counted as rejected.
    fn reject(&self, path: &Path, why: &str) -> Result<Option<CachedImage>, CacheError> {
        tracing::warn!(entry = %path.display(), why, "a cached image failed a check: removed");
        self.store.remove_entry(path);
        self.store.counters.reject();
        self.store.counters.miss();
        Ok(None)
    }
}

fn tag(mac_key: &MacKey, key: &CacheKey, header: &[u8]) -> blake3::Hash {
    let mut hasher = mac_key.hasher();
    hasher.update(DOMAIN);
    hasher.update(&key.0);
    hasher.update(header);
    hasher.finalize()
}

/// A header, parsed: the segments' places, the blocks' hashes, the description.
struct Header<'b> {
    page: u64,
    segments: Vec<(Option<u64>, u64)>,
    block: u64,
    hashes: &'b [u8],
    description: &'b [u8],
}

/// The header's fields (every length checked by the codec); why not, for the message.
fn parse_header<'b>(header: &'b [u8], key: &CacheKey) -> Result<Header<'b>, String> {
    let mut r = Reader::new(header);
    let decode = |e: kiln_codec::DecodeError| e.to_string();
    if r.take(8, "magic").map_err(decode)? != MAGIC {
        return Err("not an image of this format".into());
    }
    u64::get(&mut r, "header length").map_err(decode)?;
    if r.take(32, "cache key").map_err(decode)? != key.0 {
        return Err("another key's image".into());
    }
    let page = u64::from(u32::get(&mut r, "page size").map_err(decode)?);
    if !page.is_power_of_two() || !(4096..=1 << 16).contains(&page) {
        return Err(format!("page size {page}"));
    }
    let segments = Vec::<(Option<u64>, u64)>::get(&mut r, "segments").map_err(decode)?;
    if segments.len() > 64 {
        return Err(format!("{} segments", segments.len()));
    }
    let block = u64::from(u32::get(&mut r, "block size").map_err(decode)?);
    let hashes = r.bytes("block hashes").map_err(decode)?;
    if hashes.len() % 32 != 0 {
        return Err(format!("{} bytes of block hashes", hashes.len()));
    }
    let description = r.bytes("description").map_err(decode)?;
    r.end().map_err(decode)?;
    Ok(Header {
        page,
        segments,
        block,
        hashes,
        description,
    })
}

/// The data region the blocks cover: from the first stored segment to the end of the
/// last one's pages.
fn data_region(segments: &[(Option<u64>, u64)], page: u64) -> Option<(u64, u64)> {
    let stored = segments.iter().filter_map(|&(o, len)| Some((o?, len)));
    let start = stored.clone().map(|(o, _)| o).min()?;
    let end = stored
        .map(|(o, len)| o.checked_add(len.next_multiple_of(page)))
        .collect::<Option<Vec<_>>>()?
        .into_iter()
        .max()?;
    Some((start, end))
}

/// Whether every block of `data` (the segments' region of a mapped image) has its hash:
/// on one core, or on every core for an image of many megabytes.
fn blocks_intact(data: &[u8], block: u64, hashes: &[u8]) -> bool {
    let count = (data.len() as u64).div_ceil(block) as usize;
    if count * 32 != hashes.len() {
        return false;
    }
    let check = |i: usize| -> bool {
        let at = i * block as usize;
        let bytes = &data[at..(at + block as usize).min(data.len())];
        blake3::hash(bytes).as_bytes()[..] == hashes[i * 32..i * 32 + 32]
    };
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    if threads < 2 || data.len() < PARALLEL_CHECK {
        return (0..count).all(check);
    }
    std::thread::scope(|scope| {
        let others: Vec<_> = (1..threads)
            .map(|t| scope.spawn(move || (t..count).step_by(threads).all(check)))
            .collect();
        let mine = (0..count).step_by(threads).all(check);
        others.into_iter().all(|h| h.join().unwrap_or(false)) && mine
    })
}

/// Bytes of segments from which their blocks are checked on every core.
const PARALLEL_CHECK: usize = 16 << 20;

impl ImageCache for DiskImageCache {
    fn name(&self) -> String {
        format!("disk:{}", self.store.dir().display())
    }

    fn get(&self, key: &CacheKey) -> Result<Option<CachedImage>, CacheError> {
        let path = self.store.path(key);
        let limit = self.store.limits.max_entry_bytes;
        let (file, meta) = match files::open_regular(&path, Links::Refuse, limit) {
            Ok(opened) => opened,
            Err(ReadRefusal::Missing) => {
                self.store.counters.miss();
                return Ok(None);
            }
            Err(ReadRefusal::Io(e)) => {
                self.store
                    .counters
                    .skip(self.name(), "lookup", SkipReason::of_read(&e), &e);
                self.store.counters.miss();
                return Err(io(format!("reading {}", path.display()))(e));
            }
            Err(refusal) => return self.reject(&path, &refusal.to_string()),
        };
        if meta.len() < 16 {
            return self.reject(&path, "not an image");
        }
        // The whole file mapped read-only: the header and the blocks are read from the page
        // cache, not copied.
        // SAFETY: an image file is written whole under another name and renamed into
        // place, never changed in place; its directory is this user's alone (checked at
        // open), so no other writer can truncate it under the mapping.
        let map = match unsafe { memmap2::Mmap::map(&file) } {
            Ok(map) => map,
            // No mapping to be had (too many, no memory): a miss; the image stays.
            Err(e) => {
                self.store
                    .counters
                    .skip(self.name(), "lookup", SkipReason::of_read(&e), &e);
                self.store.counters.miss();
                return Ok(None);
            }
        };
        if map.len() < 16 || &map[..8] != MAGIC {
            return self.reject(&path, "not an image");
        }
        let header_len = u64::from_le_bytes(map[8..16].try_into().unwrap_or([0; 8]));
        if header_len < 32 + 16 || header_len > (map.len() as u64).min(MAX_HEADER) {
            return self.reject(&path, "header length");
        }
        let header = &map[..header_len as usize];
        let (body, mac) = header.split_at(header.len() - 32);
        // Checked whole once (the MAC, every block); while the file keeps that identity,
        // its stamp says so and nothing is hashed again.
        let stamped = crate::stamp::holds(&self.store.mac_key, key, &path, &file, &meta, map.len());
        let found: [u8; 32] = mac.try_into().unwrap_or([0; 32]);
        // blake3::Hash compares in constant time.
        if !stamped && tag(&self.store.mac_key, key, body) != blake3::Hash::from_bytes(found) {
            return self.reject(&path, "not sealed with this cache's key for this key");
        }
        let parsed = match parse_header(body, key) {
            Ok(parsed) => parsed,
            Err(why) => return self.reject(&path, &format!("malformed header: {why}")),
        };
        let region = data_region(&parsed.segments, parsed.page);
        let aligned = parsed
            .segments
            .iter()
            .filter_map(|s| s.0)
            .all(|o| o % parsed.page == 0 && o >= header_len);
        let intact = match region {
            Some((start, end)) => {
                aligned
                    && parsed.block > 0
                    && end <= map.len() as u64
                    && (stamped
                        || blocks_intact(
                            &map[start as usize..end as usize],
                            parsed.block,
                            parsed.hashes,
                        ))
            }
            None => parsed.hashes.is_empty(),
        };
        if !intact {
            return self.reject(&path, "a block of the segments is truncated or corrupt");
        }
        self.store.counters.hit();
        if !stamped {
            self.store.checked_whole(key, &path, &meta);
        }
        let segments = parsed.segments.iter().map(|s| s.0).collect();
        // The description's place in the file (a slice of the header, found by address).
        let start = parsed.description.as_ptr() as usize - map.as_ptr() as usize;
        let description = start..start + parsed.description.len();
        Ok(Some(CachedImage {
            map: std::sync::Arc::new(map),
            description,
            segments,
            file,
            path,
        }))
    }

    fn put(&self, key: &CacheKey, image: &ImageToStore<'_>) -> Result<(), CacheError> {
        let page = image.page.max(4096);
        let description = image.description;
        // The header's length first: the data starts on the page after it. Magic, length,
        // key, page size; the segments (a count; each an option's byte, its offset if
        // stored, its length); the block size, the hashes' and the description's lengths.
        let stored = image.segments.iter().flatten().count();
        let fixed = 8 + 8 + 32 + 4 + 4 + image.segments.len() * 9 + stored * 8 + 4 + 4 + 4;
        let data_bytes: u64 = image
            .segments
            .iter()
            .flatten()
            .map(|s| (s.len() as u64).next_multiple_of(page))
            .sum();
        let blocks = data_bytes.div_ceil(BLOCK) as usize;
        let header_len = (fixed + blocks * 32 + description.len() + 32) as u64;
        let data_start = header_len.next_multiple_of(page);
        let total = data_start + data_bytes;
        if total > self.store.limits.max_entry_bytes {
            return Err(CacheError::Store {
                store: self.name(),
                what: format!(
                    "an image of {total} bytes, more than the entry limit of {}",
                    self.store.limits.max_entry_bytes
                ),
            });
        }
        // The data region as it will be in the file, for the blocks' hashes.
        let mut data = Vec::with_capacity(data_bytes as usize);
        let mut places = Vec::with_capacity(image.segments.len());
        for segment in image.segments {
            match segment {
                Some(bytes) => {
                    places.push((Some(data_start + data.len() as u64), bytes.len() as u64));
                    data.extend_from_slice(bytes);
                    data.resize((data.len() as u64).next_multiple_of(page) as usize, 0);
                }
                None => places.push((None, 0)),
            }
        }
        let mut hashes = Vec::with_capacity(blocks * 32);
        for chunk in data.chunks(BLOCK as usize) {
            hashes.extend_from_slice(blake3::hash(chunk).as_bytes());
        }
        let mut w = Writer::with_capacity(header_len as usize);
        w.raw(MAGIC).u64(header_len).raw(&key.0);
        (page as u32).put(&mut w);
        places.put(&mut w);
        (BLOCK as u32).put(&mut w);
        w.bytes(&hashes).bytes(description);
        let mut header = w.into_bytes();
        let mac = tag(&self.store.mac_key, key, &header);
        header.extend_from_slice(mac.as_bytes());
        debug_assert_eq!(header.len() as u64, header_len);
        header.resize(data_start as usize, 0);
        let result = (|| {
            let mut file = tempfile::Builder::new()
                .prefix(".tmp")
                .tempfile_in(self.store.dir())
                .map_err(|e| (e, "creating a file in"))?;
            file.write_all(&header).map_err(|e| (e, "writing in"))?;
            file.write_all(&data).map_err(|e| (e, "writing in"))?;
            file.persist(self.store.path(key))
                .map_err(|e| (e.error, "renaming into"))?;
            Ok(())
        })();
        match result {
            Ok(()) => {
                self.store.counters.put();
                self.store.prune()?;
                Ok(())
            }
            Err((e, what)) => {
                self.store
                    .counters
                    .skip(self.name(), "store", SkipReason::of_io(&e), &e);
                Err(io(format!("{what} {}", self.store.dir().display()))(e))
            }
        }
    }

    fn stats(&self) -> CacheStats {
        self.store.counters.snapshot()
    }

    fn take_skips(&self) -> Vec<CacheSkip> {
        self.store.counters.take_skips()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::FileExt;

    fn cache() -> (tempfile::TempDir, DiskImageCache) {
        let dir = tempfile::tempdir().unwrap();
        let cache = DiskImageCache::open_with_key(
            dir.path().join("c"),
            DiskLimits::default(),
            MacKey::from_bytes([7; 32]),
        )
        .unwrap();
        (dir, cache)
    }

    #[test]
    fn an_image_comes_back_whole_and_a_damaged_one_is_a_miss() {
        let (_dir, cache) = cache();
        let key = CacheKey([1; 32]);
        let code = vec![0xc3u8; 5000];
        let data = [9u8; 10];
        let segments = [Some(&code[..]), None, Some(&data[..]), None];
        let image = ImageToStore {
            description: b"the linker's",
            segments: &segments,
            page: 4096,
        };
        cache.put(&key, &image).unwrap();
        let got = cache.get(&key).unwrap().expect("a hit");
        assert_eq!(got.description(), b"the linker's");
        let offsets: Vec<_> = got.segments.clone();
        assert_eq!(offsets[1], None);
        let code_at = offsets[0].unwrap();
        assert_eq!(code_at % 4096, 0);
        let mut read = vec![0u8; 5000];
        got.file.read_exact_at(&mut read, code_at).unwrap();
        assert_eq!(read, code);
        // Another key: a miss (the header names its key, the MAC binds it).
        assert!(cache.get(&CacheKey([2; 32])).unwrap().is_none());
        let path = got.path.clone();
        drop(got);
        // One flipped bit in the code: a miss, and the entry is gone.
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[code_at as usize + 100] ^= 1;
        std::fs::write(&path, &bytes).unwrap();
        assert!(cache.get(&key).unwrap().is_none());
        assert!(!path.exists());
        // Truncated: a miss.
        cache.put(&key, &image).unwrap();
        let len = std::fs::metadata(&path).unwrap().len();
        let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        file.set_len(len - 4096).unwrap();
        assert!(cache.get(&key).unwrap().is_none());
        // Sealed with another key: a miss.
        let other = DiskImageCache::open_with_key(
            cache.store.root(),
            DiskLimits::default(),
            MacKey::from_bytes([8; 32]),
        )
        .unwrap();
        other.put(&key, &image).unwrap();
        assert!(cache.get(&key).unwrap().is_none());
        assert_eq!(cache.stats().rejected, 3);
    }
}
