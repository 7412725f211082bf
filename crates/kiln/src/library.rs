//! A library: a namespace of definitions (its index, its hidden names, its modules), a
//! search order, lazy objects not linked yet and generators. The data only: what the
//! session does with libraries is in [`crate::libraries`].

use crate::generator::{Found, SymbolGenerator};
pub use crate::library_id::LibraryId;
use crate::module::Module;
use kiln_link::{ArchiveInput, ObjectInput};
use parking_lot::{Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard};
use rustc_hash::FxHashMap;
use std::sync::Arc;

/// A definition in a library's index: its address and the module that holds it (`None`
/// for [`Library::define_symbol`](crate::Library::define_symbol)'s).
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
    /// Objects added with [`Input::lazy_object`](crate::Input::lazy_object), by slot: `None` once linked.
    pub(crate) lazy_objects: Vec<Option<LazyObject>>,
    /// The names the lazy objects define, to their slot.
    pub(crate) lazy: FxHashMap<kiln_link::Name, usize>,
    /// Archives, lent to every link.
    pub(crate) archives: Arc<Vec<ArchiveInput>>,
    /// Every exported definition of the library, by name: one hash lookup per name,
    /// whatever the number of modules.
    pub(crate) index: FxHashMap<kiln_link::Name, Definition>,
    /// Hidden definitions of the library's modules (a hidden `main` is still the
    /// program's entry): the last place a lookup looks.
    pub(crate) hidden: FxHashMap<kiln_link::Name, Definition>,
    /// Live modules, by id.
    pub(crate) modules: FxHashMap<u64, Module>,
    /// The module published last, if its names are not in `index` and `hidden` yet: its
    /// sorted table answers for it ([`LibraryState::exported`]) until a link resolves
    /// against the library ([`LibraryData::read_hashed`]) or another module is published.
    /// A session that maps one image and links nothing more (`kiln run`'s warm run:
    /// 20,000 names) never hashes them.
    pub(crate) unhashed: Option<Module>,
    pub(crate) search_order: Vec<LibraryId>,
}

/// An object added lazily: its bytes and what its symbol table says.
pub(crate) struct LazyObject {
    pub(crate) input: ObjectInput,
    pub(crate) symbols: kiln_link::ObjectSymbols,
}

impl LibraryState {
    /// The exported definition of `name`: the index's, else that of a module not hashed
    /// yet (its table, by binary search).
    pub(crate) fn exported(&self, name: &str) -> Option<Definition> {
        if let Some(d) = self.index.get(name) {
            return Some(*d);
        }
        self.unhashed.as_ref()?.inner.definition(name, true)
    }

    /// The hidden definition of `name`: the newest module's (as `hidden` keeps the last
    /// one inserted), so the module not hashed yet first.
    pub(crate) fn hidden_definition(&self, name: &str) -> Option<Definition> {
        self.unhashed
            .as_ref()
            .and_then(|m| m.inner.definition(name, false))
            .or_else(|| self.hidden.get(name).copied())
    }

    /// Puts the names of the module not hashed yet into `index` and `hidden` (sharing
    /// the module's name strings: no allocation per name): before `index` and `hidden`
    /// are read or written directly.
    pub(crate) fn hash_pending(&mut self) {
        let Some(module) = self.unhashed.take() else {
            return;
        };
        let id = std::num::NonZeroU64::new(module.inner.id);
        self.index.reserve(module.inner.symbols.len());
        let symbols = &module.inner.symbols;
        for (i, symbol) in symbols.iter().enumerate() {
            let map = if symbol.visible {
                &mut self.index
            } else {
                &mut self.hidden
            };
            // The name shared with the module's table (no copy).
            let Some(name) = symbols.shared_name(i) else {
                continue;
            };
            let definition = Definition {
                address: symbol.address,
                module: id,
            };
            // A name defined before (a hidden name another module defines too) keeps its
            // first key on `insert`, and that key would keep the first module's block of
            // names alive after its removal: the entry is made again with this one's.
            if map.insert(name, definition).is_some() {
                map.remove(symbol.name);
                if let Some(name) = symbols.shared_name(i) {
                    map.insert(name, definition);
                }
            }
        }
    }

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
                self.lazy
                    .entry(kiln_link::Name::from(&**name))
                    .or_insert(slot);
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
            if self.exported(&name).is_some() {
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

pub(crate) struct LibraryData {
    pub(crate) id: LibraryId,
    pub(crate) name: String,
    /// Held for the whole of a link into this library (links of other libraries, and
    /// lookups, do not wait for it).
    pub(crate) link: Mutex<()>,
    pub(crate) state: RwLock<LibraryState>,
    pub(crate) generators: Mutex<Generators>,
}

impl LibraryData {
    /// The state, read, with every published module's names in `index` and `hidden`
    /// (hashed first if some were not: [`LibraryState::unhashed`]).
    pub(crate) fn read_hashed(&self) -> RwLockReadGuard<'_, LibraryState> {
        {
            let state = self.state.read();
            if state.unhashed.is_none() {
                return state;
            }
        }
        let mut state = self.state.write();
        state.hash_pending();
        RwLockWriteGuard::downgrade(state)
    }
}

/// "module NAME" or "define_symbol", for messages.
pub(crate) fn describe(state: &LibraryState, d: &Definition) -> String {
    match d.module_id().and_then(|id| state.modules.get(&id)) {
        Some(m) => format!("module {}", m.inner.name),
        None => format!(
            "an absolute definition at {:#x} (Library::define_symbol)",
            d.address
        ),
    }
}
