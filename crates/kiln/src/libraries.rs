//! The session's libraries: made, given a search order, defined into and looked up in
//! (a lookup links what is pending and the lazy objects it needs).

use crate::jit::Jit;
use crate::library::{describe, Definition, Generators, LibraryData, LibraryId, LibraryState};
use crate::link_request::{LinkRequest, Publish};
use crate::resolve::SessionContext;
use crate::Error;
use kiln_link::LinkContext;
use parking_lot::{Mutex, RwLock};
use std::sync::Arc;

impl Jit {
    pub(crate) fn library_data(&self, lib: LibraryId) -> Result<Arc<LibraryData>, Error> {
        if lib.session != self.inner.session {
            return Err(Error::UnknownLibrary(format!(
                "library {} belongs to another session",
                lib.index
            )));
        }
        self.inner
            .libraries
            .read()
            .get(lib.index as usize)
            .cloned()
            .ok_or_else(|| Error::UnknownLibrary(format!("no library {}", lib.index)))
    }

    /// Creates a library: an empty namespace of definitions named `name` (names need not
    /// be unique). It cannot fail — nothing is allocated outside this process's heap and
    /// nothing is checked — so it is the one session call that returns no `Result`.
    pub fn create_library(&self, name: &str) -> LibraryId {
        let mut libraries = self.inner.libraries.write();
        let id = LibraryId {
            session: self.inner.session,
            index: libraries.len() as u32,
        };
        libraries.push(Arc::new(LibraryData {
            id,
            name: name.to_string(),
            link: Mutex::new(()),
            state: RwLock::new(LibraryState::default()),
            generators: Mutex::new(Generators::default()),
        }));
        id
    }

    /// Libraries searched, in order, for what `lib` does not define.
    pub(crate) fn set_search_order(
        &self,
        lib: LibraryId,
        order: &[LibraryId],
    ) -> Result<(), Error> {
        for &other in order {
            self.library_data(other)?;
        }
        self.library_data(lib)?.state.write().search_order = order.to_vec();
        Ok(())
    }

    /// Defines `name` in `lib` at `address` (a host function or data). An error if the
    /// library defines `name` already.
    pub(crate) fn define_symbol(
        &self,
        lib: LibraryId,
        name: &str,
        address: u64,
    ) -> Result<(), Error> {
        let library = self.library_data(lib)?;
        let mut state = library.state.write();
        state.hash_pending();
        if let Some(previous) = state.index.get(name) {
            return Err(Error::Redefinition {
                symbol: name.to_string(),
                library: library.name.clone(),
                previous: describe(&state, previous),
                new: format!("an absolute definition at {address:#x} (Library::define_symbol)"),
            });
        }
        state.index.insert(
            name.into(),
            Definition {
                address,
                module: None,
            },
        );
        Ok(())
    }

    /// The address of `name` as `lib` sees it: its definitions and modules; else, after
    /// linking what is pending (with the lazy objects that define `name` or what the link
    /// needs), those again, the libraries in its search order (linking their lazy objects
    /// that define it), and its generators. A lazy function's name gives its stub.
    pub fn lookup(&self, lib: LibraryId, name: &str) -> Result<u64, Error> {
        // The common case, one hash lookup under a read lock.
        if lib.session == self.inner.session {
            if let Some(library) = self.inner.libraries.read().get(lib.index as usize) {
                if let Some(d) = library.state.read().exported(name) {
                    return Ok(d.address);
                }
            }
        }
        Ok(self.lookup_many(lib, &[name])?[0])
    }

    /// [`Jit::lookup`] of many names (one batch to a remote executor for those the
    /// generators answer); an error names the first name not found.
    pub fn lookup_many(&self, lib: LibraryId, names: &[&str]) -> Result<Vec<u64>, Error> {
        let library = self.library_data(lib)?;
        // What is linked already answers without linking what is pending.
        {
            let state = library.state.read();
            let known: Option<Vec<u64>> = names
                .iter()
                .map(|n| state.exported(n).map(|d| d.address))
                .collect();
            if let Some(known) = known {
                return Ok(known);
            }
        }
        self.link(
            lib,
            LinkRequest {
                wanted: names,
                ..LinkRequest::module()
            },
        )?;
        let mut ctx = SessionContext::new(self, &library, Publish::Yes);
        let found = ctx.resolve_many(names);
        let state = library.state.read();
        names
            .iter()
            .zip(found)
            .map(|(name, address)| {
                address
                    // Last, the library's modules' hidden definitions (a hidden `main` is
                    // still the program's entry).
                    .or_else(|| state.hidden_definition(name).map(|d| d.address))
                    .ok_or_else(|| Error::SymbolNotFound(name.to_string()))
            })
            .collect()
    }

    /// The name of a library.
    pub(crate) fn library_name(&self, lib: LibraryId) -> Result<String, Error> {
        Ok(self.library_data(lib)?.name.clone())
    }
}
