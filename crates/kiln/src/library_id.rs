//! The id of a library: what the session's users hold.

/// A library of a [`Jit`](crate::Jit): a namespace of definitions with a search order. Valid only
/// with the session that made it (another session's id is an error, not a wrong library).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LibraryId {
    pub(crate) session: u32,
    pub(crate) index: u32,
}

impl LibraryId {
    /// The id as one integer (for C and other foreign callers); [`LibraryId::from_raw`]
    /// gives it back. A session checks every id it is given, so a forged one is an error.
    pub fn to_raw(self) -> u64 {
        u64::from(self.session) << 32 | u64::from(self.index)
    }

    /// An id from [`LibraryId::to_raw`].
    pub fn from_raw(raw: u64) -> Self {
        LibraryId {
            session: (raw >> 32) as u32,
            index: raw as u32,
        }
    }
}
