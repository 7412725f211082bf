//! The stored form of an entry: a header with the payload's length and a keyed MAC
//! (BLAKE3 keyed mode) over the cache key and the payload.
//!
//! The MAC is what makes an entry trusted: a checksum anyone can recompute would let
//! whoever can write to the store have their object loaded. Binding the cache key as well
//! means a genuine entry moved to another key (another source's object or manifest under
//! this source's key) does not open either.

use crate::{CacheKey, MacKey};

/// `KILNOBJ` + format version (1 was an unkeyed checksum: such entries are misses).
const MAGIC: &[u8; 8] = b"KILNOBJ2";
/// Magic, payload length, MAC.
pub(crate) const HEADER: usize = 8 + 8 + 32;
/// What the MAC covers first: the format, so that no other use of the key collides.
const DOMAIN: &[u8] = b"kiln-cache entry 2\0";

fn tag(mac_key: &MacKey, key: &CacheKey, payload: &[u8]) -> blake3::Hash {
    let mut hasher = mac_key.hasher();
    hasher.update(DOMAIN);
    hasher.update(&key.0);
    hasher.update(&(payload.len() as u64).to_le_bytes());
    hasher.update(payload);
    hasher.finalize()
}

/// The stored bytes of `object` under `key`.
pub(crate) fn seal(mac_key: &MacKey, key: &CacheKey, object: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER + object.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&(object.len() as u64).to_le_bytes());
    out.extend_from_slice(tag(mac_key, key, object).as_bytes());
    out.extend_from_slice(object);
    out
}

/// The object in stored bytes found under `key`, if they are whole, unaltered and were
/// sealed with `mac_key` for `key`.
pub(crate) fn open<'a>(mac_key: &MacKey, key: &CacheKey, stored: &'a [u8]) -> Option<&'a [u8]> {
    open_range(mac_key, key, stored).map(|r| &stored[r])
}

/// Where the object is in stored bytes found under `key`, as [`open`] checks them.
pub(crate) fn open_range(
    mac_key: &MacKey,
    key: &CacheKey,
    stored: &[u8],
) -> Option<std::ops::Range<usize>> {
    let range = payload_range(stored)?;
    let found: [u8; 32] = stored.get(16..48)?.try_into().ok()?;
    // blake3::Hash compares in constant time.
    (tag(mac_key, key, &stored[range.clone()]) == blake3::Hash::from_bytes(found)).then_some(range)
}

/// Where the object is in stored bytes whose MAC was checked before (a stamped entry):
/// the header's form and length only.
pub(crate) fn payload_range(stored: &[u8]) -> Option<std::ops::Range<usize>> {
    if stored.len() < HEADER || stored.get(..8)? != MAGIC {
        return None;
    }
    let len = u64::from_le_bytes(stored.get(8..16)?.try_into().ok()?);
    if (stored.len() - HEADER) as u64 != len {
        return None;
    }
    Some(HEADER..stored.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sealed_entries_open_and_damaged_foreign_or_moved_ones_do_not() {
        let mine = MacKey::from_bytes([1; 32]);
        let theirs = MacKey::from_bytes([2; 32]);
        let key = CacheKey([7; 32]);
        let object = b"\x7fELF and the rest".to_vec();
        let sealed = seal(&mine, &key, &object);
        assert_eq!(open(&mine, &key, &sealed), Some(&object[..]));
        assert_eq!(
            open(&mine, &key, &sealed[..sealed.len() - 1]),
            None,
            "truncated"
        );
        let mut flipped = sealed.clone();
        let last = flipped.len() - 1;
        flipped[last] ^= 1;
        assert_eq!(open(&mine, &key, &flipped), None, "corrupt");
        let mut longer = sealed.clone();
        longer.push(0);
        assert_eq!(open(&mine, &key, &longer), None, "trailing bytes");
        assert_eq!(open(&mine, &key, b"KILNOBJ2"), None);
        assert_eq!(open(&mine, &key, b""), None);
        // Sealed by someone without the key: never opens.
        assert_eq!(open(&mine, &key, &seal(&theirs, &key, &object)), None);
        // A genuine entry moved to another key: never opens there.
        assert_eq!(open(&mine, &CacheKey([8; 32]), &sealed), None);
        // The old unkeyed format, checksum and all: a miss.
        let mut old = b"KILNOBJ1".to_vec();
        old.extend_from_slice(&(object.len() as u64).to_le_bytes());
        old.extend_from_slice(blake3::hash(&object).as_bytes());
        old.extend_from_slice(&object);
        assert_eq!(open(&mine, &key, &old), None);
    }
}
