//! A library: a namespace of definitions (its index, its hidden names, its modules), a
//! search order, lazy objects not linked yet and generators; lookups of names in it.

use crate::generator::{Found, SymbolGenerator};
use crate::jit::Jit;
use crate::link_job::{LinkRequest, Publish};
use crate::module::Module;
use crate::resolve::SessionContext;
use crate::Error;
use kiln_link::{ArchiveInput, LinkContext, ObjectInput};
use parking_lot::{Mutex, RwLock};
use rustc_hash::FxHashMap;
use std::sync::Arc;

/// A library of a [`Jit`]: a namespace of definitions with a search order. Valid only
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

/// A definition in a library's index: its address and the module that holds it (`None`
/// for [`Jit::define_symbol`]'s).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Definition {
    pub(crate) address: u64,
    /// Module ids start at 1: `None` costs no space (an index entry is 32 bytes).
    pub(crate) module: Option<std::num::NonZeroU64>,
}

impl Definition {
    /// The id of the module that holds it.
    pub(crate) fn module_id(&self) -> Option<u64> {
        self.module.map(u64::from)
    }
}

/// What a library holds. Read by lookups and by links of this and other libraries (a
/// read lock); written briefly when a link ends, a module is removed or an input added.
#[derive(Default)]
pub(crate) struct LibraryState {
    /// Objects added and not linked yet.
    pub(crate) pending: Vec<ObjectInput>,
    /// Objects added with [`Jit::add_lazy_object`], by slot: `None` once linked.
    pub(crate) lazy_objects: Vec<Option<LazyObject>>,
    /// The names the lazy objects define, to their slot.
    pub(crate) lazy: FxHashMap<Arc<str>, usize>,
    /// Archives, lent to every link.
    pub(crate) archives: Arc<Vec<ArchiveInput>>,
    /// Every exported definition of the library, by name: one hash lookup per name,
    /// whatever the number of modules.
    pub(crate) index: FxHashMap<Arc<str>, Definition>,
    /// Hidden definitions of the library's modules (a hidden `main` is still the
    /// program's entry): the last place a lookup looks.
    pub(crate) hidden: FxHashMap<Arc<str>, Definition>,
    /// Live modules, by id.
    pub(crate) modules: FxHashMap<u64, Module>,
    pub(crate) search_order: Vec<LibraryId>,
}

/// An object added lazily: its bytes and what its symbol table says.
pub(crate) struct LazyObject {
    pub(crate) input: ObjectInput,
    pub(crate) symbols: kiln_link::ObjectSymbols,
}

impl LibraryState {
    /// Takes the lazy object in `slot` out of the lazy set (its names go with it).
    pub(crate) fn take_lazy(&mut self, slot: usize) -> Option<LazyObject> {
        let object = self.lazy_objects.get_mut(slot)?.take()?;
        for name in object.symbols.defined.iter().chain(&object.symbols.weak) {
            if self.lazy.get(&**name) == Some(&slot) {
                self.lazy.remove(&**name);
            }
        }
        Some(object)
    }

    /// Puts lazy objects a failed link took back where they were.
    pub(crate) fn restore_lazy(&mut self, taken: Vec<(usize, LazyObject)>) {
        for (slot, object) in taken {
            for name in object.symbols.defined.iter().chain(&object.symbols.weak) {
                self.lazy.entry(Arc::from(&**name)).or_insert(slot);
            }
            self.lazy_objects[slot] = Some(object);
        }
    }

    /// Takes the lazy objects that define `names` — and, transitively, those that define
    /// what they leave undefined — out of the lazy set.
    pub(crate) fn take_lazy_closure<'n>(
        &mut self,
        names: impl IntoIterator<Item = &'n str>,
    ) -> Vec<(usize, LazyObject)> {
        let mut taken = Vec::new();
        if self.lazy.is_empty() {
            return taken;
        }
        let mut work: Vec<Box<str>> = names.into_iter().map(Box::from).collect();
        while let Some(name) = work.pop() {
            if self.index.contains_key(&*name) {
                continue;
            }
            let Some(slot) = self.lazy.get(&*name).copied() else {
                continue;
            };
            if let Some(object) = self.take_lazy(slot) {
                work.extend(object.symbols.undefined.iter().cloned());
                taken.push((slot, object));
            }
        }
        taken
    }
}

/// The generators of a library and what they already answered.
#[derive(Default)]
pub(crate) struct Generators {
    pub(crate) list: Vec<Box<dyn SymbolGenerator>>,
    /// Names the generators resolved (process and shared-library symbols do not move).
    pub(crate) found: FxHashMap<Box<str>, Found>,
}

pub(crate) struct Library {
    pub(crate) id: LibraryId,
    pub(crate) name: String,
    /// Held for the whole of a link into this library (links of other libraries, and
    /// lookups, do not wait for it).
    pub(crate) link: Mutex<()>,
    pub(crate) state: RwLock<LibraryState>,
    pub(crate) generators: Mutex<Generators>,
}

/// "module NAME" or "define_symbol", for messages.
pub(crate) fn describe(state: &LibraryState, d: &Definition) -> String {
    match d.module_id().and_then(|id| state.modules.get(&id)) {
        Some(m) => format!("module {}", m.inner.name),
        None => format!(
            "an absolute definition at {:#x} (Jit::define_symbol)",
            d.address
        ),
    }
}

impl Jit {
    pub(crate) fn library(&self, lib: LibraryId) -> Result<Arc<Library>, Error> {
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

    /// Creates a library.
    pub fn create_library(&self, name: &str) -> LibraryId {
        let mut libraries = self.inner.libraries.write();
        let id = LibraryId {
            session: self.inner.session,
            index: libraries.len() as u32,
        };
        libraries.push(Arc::new(Library {
            id,
            name: name.to_string(),
            link: Mutex::new(()),
            state: RwLock::new(LibraryState::default()),
            generators: Mutex::new(Generators::default()),
        }));
        id
    }

    /// Libraries searched, in order, for what `lib` does not define.
    pub fn set_search_order(&self, lib: LibraryId, order: &[LibraryId]) -> Result<(), Error> {
        for &other in order {
            self.library(other)?;
        }
        self.library(lib)?.state.write().search_order = order.to_vec();
        Ok(())
    }

    /// Defines `name` in `lib` at `address` (a host function or data). An error if the
    /// library defines `name` already.
    pub fn define_symbol(&self, lib: LibraryId, name: &str, address: u64) -> Result<(), Error> {
        let library = self.library(lib)?;
        let mut state = library.state.write();
        if let Some(previous) = state.index.get(name) {
            return Err(Error::Redefinition {
                symbol: name.to_string(),
                library: library.name.clone(),
                previous: describe(&state, previous),
                new: format!("an absolute definition at {address:#x} (Jit::define_symbol)"),
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
                if let Some(d) = library.state.read().index.get(name) {
                    return Ok(d.address);
                }
            }
        }
        Ok(self.lookup_many(lib, &[name])?[0])
    }

    /// [`Jit::lookup`] of many names (one batch to a remote executor for those the
    /// generators answer); an error names the first name not found.
    pub fn lookup_many(&self, lib: LibraryId, names: &[&str]) -> Result<Vec<u64>, Error> {
        let library = self.library(lib)?;
        // What is linked already answers without linking what is pending.
        {
            let state = library.state.read();
            let known: Option<Vec<u64>> = names
                .iter()
                .map(|n| state.index.get(*n).map(|d| d.address))
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
                    .or_else(|| state.hidden.get(*name).map(|d| d.address))
                    .ok_or_else(|| Error::SymbolNotFound(name.to_string()))
            })
            .collect()
    }

    /// The name of a library.
    pub fn library_name(&self, lib: LibraryId) -> Result<String, Error> {
        Ok(self.library(lib)?.name.clone())
    }
}

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
pub(crate) fn lock_for_link(library: &Library) -> Result<parking_lot::MutexGuard<'_, ()>, Error> {
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
