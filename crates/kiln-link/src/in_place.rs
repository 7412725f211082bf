//! Bytes read where they lie: a range of a shared buffer (an image file mapped from the
//! cache), kept alive by whoever reads it. A mapped image's exports and relative words are
//! read from the file's pages this way, not copied into fresh memory: for a program of
//! 20,000 functions, 130 fresh pages (and their page faults) fewer on every warm run.

use std::ops::Range;
use std::sync::Arc;

/// A buffer shared by whatever reads it in place: a mapped file (`memmap2::Mmap`), or a
/// `Vec<u8>`.
pub type SharedBytes = Arc<dyn AsRef<[u8]> + Send + Sync>;

/// A range of a [`SharedBytes`], checked to be inside it when made.
#[derive(Clone)]
pub(crate) struct InPlace {
    owner: SharedBytes,
    range: Range<usize>,
}

impl InPlace {
    /// `range` of `owner`; `None` if it is not inside.
    pub(crate) fn new(owner: SharedBytes, range: Range<usize>) -> Option<Self> {
        (range.start <= range.end && range.end <= (*owner).as_ref().len())
            .then_some(InPlace { owner, range })
    }

    /// The bytes.
    pub(crate) fn bytes(&self) -> &[u8] {
        // Checked inside when made; the owner's bytes do not change length.
        (*self.owner)
            .as_ref()
            .get(self.range.clone())
            .unwrap_or_default()
    }
}

impl std::fmt::Debug for InPlace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "InPlace({:?})", self.range)
    }
}

/// Offsets of 64-bit words to which a load adds the image's address (see
/// [`crate::RelocatableImage::relative`]): a list a link made, or the description's own
/// bytes, read in place (8 bytes each, little-endian).
#[derive(Debug, Clone)]
pub struct RelativeWords(Words);

#[derive(Debug, Clone)]
enum Words {
    Owned(Vec<u64>),
    InPlace(InPlace),
}

impl RelativeWords {
    /// Words read from `bytes` (a multiple of 8 bytes, checked by the caller).
    pub(crate) fn in_place(bytes: InPlace) -> Self {
        RelativeWords(Words::InPlace(bytes))
    }

    /// How many words.
    pub fn len(&self) -> usize {
        match &self.0 {
            Words::Owned(v) => v.len(),
            Words::InPlace(b) => b.bytes().len() / 8,
        }
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Word `i`'s offset.
    pub fn get(&self, i: usize) -> Option<u64> {
        match &self.0 {
            Words::Owned(v) => v.get(i).copied(),
            Words::InPlace(b) => {
                let at = i.checked_mul(8)?;
                let word = b.bytes().get(at..at.checked_add(8)?)?;
                Some(u64::from_le_bytes(word.try_into().ok()?))
            }
        }
    }

    /// Every offset, in order.
    pub fn iter(&self) -> impl Iterator<Item = u64> + '_ {
        let (owned, in_place): (&[u64], &[u8]) = match &self.0 {
            Words::Owned(v) => (v, &[]),
            Words::InPlace(b) => (&[], b.bytes()),
        };
        // One of the two is empty.
        owned.iter().copied().chain(
            in_place
                .chunks_exact(8)
                .map(|w| u64::from_le_bytes(w.try_into().unwrap_or([0; 8]))),
        )
    }
}

impl From<Vec<u64>> for RelativeWords {
    fn from(words: Vec<u64>) -> Self {
        RelativeWords(Words::Owned(words))
    }
}

impl PartialEq for RelativeWords {
    fn eq(&self, other: &Self) -> bool {
        self.len() == other.len() && self.iter().eq(other.iter())
    }
}

impl Eq for RelativeWords {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_read_in_place_are_the_words_written() {
        let bytes: Vec<u8> = [8u64, 16, 4096]
            .iter()
            .flat_map(|w| w.to_le_bytes())
            .collect();
        let owner: SharedBytes = Arc::new(bytes);
        let words = RelativeWords::in_place(InPlace::new(owner.clone(), 8..24).unwrap());
        assert_eq!(words.len(), 2);
        assert_eq!(words.iter().collect::<Vec<_>>(), [16, 4096]);
        assert_eq!(words.get(1), Some(4096));
        assert_eq!(words.get(2), None);
        assert_eq!(words, RelativeWords::from(vec![16, 4096]));
        assert!(InPlace::new(owner, 16..32).is_none());
    }
}
