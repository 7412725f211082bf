//! A symbol name shared from a block of names: the names of a module's
//! [`SymbolTable`](crate::SymbolTable) (one block of text for all of them) as the session
//! hands them out, to its libraries' indexes and lazy functions, without a string each.

use std::borrow::Borrow;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::ops::Deref;
use std::sync::Arc;

/// A symbol's name: a shared, immutable string. Clones share the text; names cut from one
/// block of text ([`Name::in_block`]) share its allocation. Compares, orders and hashes as
/// the `str` it holds, so a map keyed by `Name` is looked up by `&str`.
///
/// ```
/// use kiln_link::Name;
/// use std::sync::Arc;
/// let block: Arc<str> = Arc::from("addsub");
/// let add = Name::in_block(&block, 0..3).unwrap();
/// let sub = Name::in_block(&block, 3..6).unwrap();
/// assert_eq!(&*add, "add");
/// assert_eq!(sub, Name::from("sub"));
/// assert!(Name::in_block(&block, 4..9).is_none());
/// ```
#[derive(Clone)]
pub struct Name {
    /// The block: its text reached in one step (a name is 24 bytes; a thin pointer to a
    /// `String` made it 16, but every comparison of a looked-up name one load longer).
    block: Arc<str>,
    start: u32,
    len: u32,
}

/// `len` of a name that is its block's whole text from `start`: a name of 4 GiB or more
/// (kept correct rather than truncated; symbol names are not that long).
const TO_THE_END: u32 = u32::MAX;

impl Name {
    /// The name `block[range]`, sharing `block`'s allocation; `None` if `range` is not a
    /// string of `block` (out of bounds, or not on character boundaries).
    pub fn in_block(block: &Arc<str>, range: std::ops::Range<usize>) -> Option<Name> {
        let text = block.get(range.clone())?;
        match (u32::try_from(range.start), u32::try_from(text.len())) {
            (Ok(start), Ok(len)) if len != TO_THE_END => Some(Name {
                block: block.clone(),
                start,
                len,
            }),
            // Past 4 GiB: a copy of its own (symbol names are not that long).
            _ => Some(Name::from(text)),
        }
    }

    /// The name's text.
    pub fn as_str(&self) -> &str {
        // Made only from whole strings pushed into the block: in bounds, on boundaries.
        let start = self.start as usize;
        if self.len == TO_THE_END {
            &self.block[start..]
        } else {
            &self.block[start..start + self.len as usize]
        }
    }
}

impl Deref for Name {
    type Target = str;
    fn deref(&self) -> &str {
        self.as_str()
    }
}

impl AsRef<str> for Name {
    fn as_ref(&self) -> &str {
        self.as_str()
    }
}

impl Borrow<str> for Name {
    fn borrow(&self) -> &str {
        self.as_str()
    }
}

impl PartialEq for Name {
    fn eq(&self, other: &Self) -> bool {
        self.as_str() == other.as_str()
    }
}

impl Eq for Name {}

impl PartialEq<str> for Name {
    fn eq(&self, other: &str) -> bool {
        self.as_str() == other
    }
}

impl PartialEq<&str> for Name {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

impl PartialOrd for Name {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Name {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.as_str().cmp(other.as_str())
    }
}

impl Hash for Name {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.as_str().hash(state);
    }
}

impl fmt::Debug for Name {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), f)
    }
}

impl fmt::Display for Name {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self.as_str(), f)
    }
}

impl From<Arc<str>> for Name {
    /// The whole string as a name of its own (no copy).
    fn from(block: Arc<str>) -> Self {
        let len = u32::try_from(block.len())
            .ok()
            .filter(|&len| len != TO_THE_END)
            .unwrap_or(TO_THE_END);
        Name {
            block,
            start: 0,
            len,
        }
    }
}

impl From<&str> for Name {
    fn from(name: &str) -> Self {
        Name::from(Arc::<str>::from(name))
    }
}

impl From<String> for Name {
    fn from(name: String) -> Self {
        Name::from(Arc::<str>::from(name))
    }
}

const _: () = assert!(std::mem::size_of::<Name>() == 24);

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn block_of(names: &[&str]) -> Vec<Name> {
        let block: Arc<str> = Arc::from(names.concat());
        let mut at = 0;
        names
            .iter()
            .map(|n| {
                at += n.len();
                Name::in_block(&block, at - n.len()..at).expect("a name of the block")
            })
            .collect()
    }

    #[test]
    fn names_of_a_block_share_one_allocation_and_read_back() {
        let names = block_of(&["main", "", "helper"]);
        assert_eq!(
            names.iter().map(|n| n.as_str()).collect::<Vec<_>>(),
            ["main", "", "helper"]
        );
        assert!(Arc::ptr_eq(&names[0].block, &names[2].block));
        assert_eq!(names[2], Name::from("helper"));
        assert!(names[0] > names[2]);
    }

    #[test]
    fn a_map_keyed_by_names_is_looked_up_by_str() {
        let mut map = HashMap::new();
        for (i, n) in block_of(&["alpha", "beta"]).into_iter().enumerate() {
            map.insert(n, i);
        }
        assert_eq!(map.get("beta"), Some(&1));
        assert_eq!(map.get("gamma"), None);
        assert_eq!(
            format!("{:?} {}", Name::from("x"), Name::from("y")),
            "\"x\" y"
        );
        // Not a string of the block: past its end, or inside a character.
        let block: Arc<str> = Arc::from("é");
        assert!(Name::in_block(&block, 0..3).is_none());
        assert!(Name::in_block(&block, 1..2).is_none());
    }
}
