//! A library's link lock, and which libraries this thread is linking into (a link may
//! link the lazy objects of another library it needs).

use crate::library::{LibraryData, LibraryId};
use crate::Error;

thread_local! {
    /// The libraries this thread is linking into, outermost first (a link may link the
    /// lazy objects of another library it needs).
    static LINKING: std::cell::RefCell<Vec<LibraryId>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Marks a library as being linked into by this thread, while the value lives.
pub(crate) struct LinkingHere;

impl LinkingHere {
    pub(crate) fn enter(lib: LibraryId) -> Self {
        LINKING.with(|l| l.borrow_mut().push(lib));
        LinkingHere
    }
}

impl Drop for LinkingHere {
    fn drop(&mut self) {
        LINKING.with(|l| l.borrow_mut().pop());
    }
}

/// Takes a library's link lock. A link nested in another (lazy objects of a library in
/// the search order) neither waits for a library this thread is already linking into
/// (libraries whose lazy objects need each other) nor forever for one another thread
/// links into (two threads each linking into one library of such a pair): both are
/// errors, not deadlocks.
pub(crate) fn lock_for_link(
    library: &LibraryData,
) -> Result<parking_lot::MutexGuard<'_, ()>, Error> {
    let nested = LINKING.with(|l| {
        let l = l.borrow();
        if l.contains(&library.id) {
            Err(Error::Unsupported(format!(
                "library {} is being linked on this thread already: its lazy objects and another library's need each other",
                library.name
            )))
        } else {
            Ok(!l.is_empty())
        }
    })?;
    if !nested {
        return Ok(library.link.lock());
    }
    library
        .link
        .try_lock_for(std::time::Duration::from_secs(10))
        .ok_or_else(|| {
            Error::Unsupported(format!(
                "waited 10 s to link lazy objects of library {} (another thread links into it and may wait for this one)",
                library.name
            ))
        })
}
