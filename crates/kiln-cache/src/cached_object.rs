//! What a cache hands back for a hit: an object's bytes, owned (from memory or a network
//! store) or mapped from the entry's file, never copied, for the link to read in place.

use std::sync::Arc;

/// An object found in a cache. Reads as `&[u8]`; [`CachedObject::into_shared`] gives the
/// bytes to a session without a copy.
#[derive(Clone)]
pub struct CachedObject(Arc<dyn AsRef<[u8]> + Send + Sync>);

impl CachedObject {
    /// Bytes of any holder: a vector, a mapping.
    pub fn new(bytes: Arc<dyn AsRef<[u8]> + Send + Sync>) -> Self {
        CachedObject(bytes)
    }

    /// The bytes, shared.
    pub fn into_shared(self) -> Arc<dyn AsRef<[u8]> + Send + Sync> {
        self.0
    }
}

impl std::ops::Deref for CachedObject {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        (*self.0).as_ref()
    }
}

impl AsRef<[u8]> for CachedObject {
    fn as_ref(&self) -> &[u8] {
        self
    }
}

impl From<Vec<u8>> for CachedObject {
    fn from(bytes: Vec<u8>) -> Self {
        CachedObject(Arc::new(bytes))
    }
}

impl std::fmt::Debug for CachedObject {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CachedObject({} bytes)", self.len())
    }
}

/// An entry's bytes (mapped or read), and where its object is in them.
pub(crate) struct EntrySlice {
    pub(crate) bytes: Arc<dyn AsRef<[u8]> + Send + Sync>,
    pub(crate) object: std::ops::Range<usize>,
}

impl AsRef<[u8]> for EntrySlice {
    fn as_ref(&self) -> &[u8] {
        &(*self.bytes).as_ref()[self.object.clone()]
    }
}

impl PartialEq for CachedObject {
    fn eq(&self, other: &Self) -> bool {
        **self == **other
    }
}

impl Eq for CachedObject {}

impl PartialEq<[u8]> for CachedObject {
    fn eq(&self, other: &[u8]) -> bool {
        **self == *other
    }
}

impl PartialEq<Vec<u8>> for CachedObject {
    fn eq(&self, other: &Vec<u8>) -> bool {
        **self == other[..]
    }
}
