//! The stored form of an entry: a header with the payload's length and BLAKE3, so that a
//! truncated or corrupt entry is detected on read, whoever wrote it.

/// `KILNOBJ` + format version.
const MAGIC: &[u8; 8] = b"KILNOBJ1";
const HEADER: usize = 8 + 8 + 32;

/// The stored bytes of `object`.
pub(crate) fn seal(object: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER + object.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&(object.len() as u64).to_le_bytes());
    out.extend_from_slice(blake3::hash(object).as_bytes());
    out.extend_from_slice(object);
    out
}

/// The object in stored bytes, if they are whole and unaltered.
pub(crate) fn open(stored: &[u8]) -> Option<&[u8]> {
    if stored.len() < HEADER || &stored[..8] != MAGIC {
        return None;
    }
    let len = u64::from_le_bytes(stored[8..16].try_into().ok()?) as usize;
    let payload = &stored[HEADER..];
    if payload.len() != len || blake3::hash(payload).as_bytes() != &stored[16..48] {
        return None;
    }
    Some(payload)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sealed_entries_open_and_damaged_ones_do_not() {
        let object = b"\x7fELF and the rest".to_vec();
        let sealed = seal(&object);
        assert_eq!(open(&sealed), Some(&object[..]));
        assert_eq!(open(&sealed[..sealed.len() - 1]), None, "truncated");
        let mut flipped = sealed.clone();
        let last = flipped.len() - 1;
        flipped[last] ^= 1;
        assert_eq!(open(&flipped), None, "corrupt");
        let mut longer = sealed.clone();
        longer.push(0);
        assert_eq!(open(&longer), None, "trailing bytes");
        assert_eq!(open(b"KILNOBJ1"), None);
        assert_eq!(open(b""), None);
    }
}
