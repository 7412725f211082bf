//! How a link's names resolve: the link's library, then each library of its search order
//! (linking another library's lazy objects first when they define a name: a nested link,
//! as an explicit step), Kiln's runtime, then each library's generators (what they found
//! remembered).

use crate::jit::Jit;
use crate::library::{Generators, LibraryData};
use crate::link_request::{LinkRequest, Publish};
use crate::module::Module;
use crate::Error;
use kiln_link::{LinkContext, SymbolKind};
use rustc_hash::FxHashMap;
use std::sync::Arc;

pub(crate) struct SessionContext<'s> {
    pub(crate) jit: &'s Jit,
    pub(crate) library: &'s Arc<LibraryData>,
    /// Whether the link publishes into `library` (it then holds the library's link lock:
    /// the library's lazy objects were taken before the link, not during it).
    pub(crate) publish: Publish,
    /// Whether the names generators resolved are functions, as far as they know.
    pub(crate) kinds: FxHashMap<String, SymbolKind>,
    /// The modules whose definitions the link used, by id.
    pub(crate) uses: FxHashMap<u64, Module>,
    /// Whether the link resolved `__cxa_thread_atexit` (the module registers thread-local
    /// destructors).
    pub(crate) thread_atexit: bool,
    /// Why a lazy object of another library that this link needed could not be linked.
    pub(crate) lazy_error: Option<Error>,
    /// The search order, once read.
    pub(crate) order: Option<SearchOrder>,
    /// The inputs' functions whose references reach call-through stubs.
    pub(crate) through: Option<&'s crate::link_request::CallsThrough>,
}

/// A link's libraries in search order.
pub(crate) type SearchOrder = smallvec::SmallVec<[Arc<LibraryData>; 4]>;

impl<'s> SessionContext<'s> {
    pub(crate) fn new(jit: &'s Jit, library: &'s Arc<LibraryData>, publish: Publish) -> Self {
        SessionContext {
            jit,
            library,
            publish,
            kinds: FxHashMap::default(),
            uses: FxHashMap::default(),
            thread_atexit: false,
            through: None,
            lazy_error: None,
            order: None,
        }
    }

    /// The libraries whose indexes resolve names for this link, in order (read once per
    /// link; inline for up to four libraries).
    pub(crate) fn order(&mut self) -> SearchOrder {
        if let Some(order) = &self.order {
            return order.clone();
        }
        let mut order = SearchOrder::new();
        order.push(self.library.clone());
        // The ids first: no library's state is held while the list of libraries is read.
        let search_order = self.library.state.read().search_order.clone();
        order.extend(
            search_order
                .iter()
                .filter_map(|&l| self.jit.library_data(l).ok()),
        );
        self.order = Some(order.clone());
        order
    }

    /// Names found in the indexes of `order`; records the modules they come from. A name
    /// that a library has only in a lazy object is linked there first (as a module of its
    /// own), except in the library this link publishes into (whose lazy objects the link
    /// took before it began).
    pub(crate) fn search_indexes(
        &mut self,
        order: &[Arc<LibraryData>],
        names: &[&str],
    ) -> Vec<Option<u64>> {
        let mut out = vec![None; names.len()];
        for library in order {
            let own = Arc::ptr_eq(library, self.library) && self.publish == Publish::Yes;
            if !own {
                self.link_lazy_objects_of(library, names, &out);
            }
            let state = library.read_hashed();
            for (slot, name) in out.iter_mut().zip(names) {
                if slot.is_some() {
                    continue;
                }
                if let Some(d) = state.index.get(*name) {
                    *slot = Some(d.address);
                    if let Some(id) = d.module_id() {
                        if let Some(m) = state.modules.get(&id) {
                            self.uses.entry(id).or_insert_with(|| m.clone());
                        }
                    }
                }
            }
        }
        out
    }

    /// The nested link: the lazy objects of `library` (not the one this link publishes
    /// into) that define names still unresolved become a module of that library, before
    /// its index is searched. A failure leaves those names undefined and is kept as the
    /// cause this link reports.
    fn link_lazy_objects_of(
        &mut self,
        library: &LibraryData,
        names: &[&str],
        found: &[Option<u64>],
    ) {
        let lazy: Vec<&str> = {
            let state = library.read_hashed();
            if state.lazy.is_empty() {
                return;
            }
            names
                .iter()
                .zip(found)
                .filter(|(n, slot)| {
                    slot.is_none() && !state.index.contains_key(**n) && state.lazy.contains_key(**n)
                })
                .map(|(n, _)| *n)
                .collect()
        };
        if lazy.is_empty() {
            return;
        }
        let request = LinkRequest {
            wanted: &lazy,
            ..LinkRequest::module()
        };
        if let Err(error) = self.jit.link(library.id, request) {
            self.lazy_error.get_or_insert(error);
        }
    }
}

impl LinkContext for SessionContext<'_> {
    fn resolve(&mut self, name: &str) -> Option<u64> {
        self.resolve_many(&[name]).pop().flatten()
    }

    fn routes_calls(&self) -> bool {
        self.through.is_some()
    }

    fn called_through(&mut self, names: &[&str]) -> Vec<Option<u64>> {
        let Some(through) = self.through else {
            return vec![None; names.len()];
        };
        let found: Vec<Option<u64>> = names
            .iter()
            .map(|name| through.addresses.get(*name).copied())
            .collect();
        if found.iter().any(Option::is_some) {
            // The module's code calls the stubs: they stay while it lives.
            let stubs = &through.stubs;
            self.uses
                .entry(stubs.inner.id)
                .or_insert_with(|| stubs.clone());
        }
        found
    }

    fn defined_here(&mut self, names: &[&str]) -> Vec<Option<u64>> {
        // The library's index only: its lazy objects are the link's inputs or wait, and
        // the search order's libraries are other namespaces.
        let state = self.library.read_hashed();
        names
            .iter()
            .map(|name| {
                let d = state.index.get(*name)?;
                if let Some(id) = d.module_id() {
                    if let Some(m) = state.modules.get(&id) {
                        self.uses.entry(id).or_insert_with(|| m.clone());
                    }
                }
                Some(d.address)
            })
            .collect()
    }

    fn resolve_defined(&mut self, names: &[&str]) -> Vec<Option<u64>> {
        let order = self.order();
        self.search_indexes(&order, names)
    }

    fn resolve_many(&mut self, names: &[&str]) -> Vec<Option<u64>> {
        let executor = &self.jit.inner.executor;
        let order = self.order();
        let mut out = self.search_indexes(&order, names);
        for (slot, name) in out.iter_mut().zip(names) {
            if slot.is_none() {
                // What Kiln's runtime provides in place of the C runtime's (and the
                // loader's shims, when exports wait for the loader's first use).
                *slot = executor.runtime_symbol(name).or_else(|| {
                    if self.jit.inner.exports_on_demand && self.jit.inner.export_to_libraries {
                        executor.loader_shim(name)
                    } else {
                        None
                    }
                });
                if slot.is_some() && name.starts_with("__cxa_thread_atexit") {
                    self.thread_atexit = true;
                }
            }
        }
        // Generators, library by library, each asked once for everything still missing
        // that it has not answered before.
        for library in &order {
            let mut pending: Vec<usize> = (0..names.len()).filter(|&i| out[i].is_none()).collect();
            if pending.is_empty() {
                break;
            }
            let mut generators = library.generators.lock();
            pending.retain(|&i| match generators.found.get(names[i]) {
                Some(&(address, kind)) => {
                    out[i] = Some(address);
                    if kind != SymbolKind::Other {
                        self.kinds.insert(names[i].to_string(), kind);
                    }
                    false
                }
                None => true,
            });
            let Generators { list, found } = &mut *generators;
            for generator in list.iter_mut() {
                if pending.is_empty() {
                    break;
                }
                let ask: Vec<&str> = pending.iter().map(|&i| names[i]).collect();
                let got = generator.generate_many(&ask);
                let mut still = Vec::new();
                for (&i, hit) in pending.iter().zip(got) {
                    match hit {
                        Some((address, kind)) => {
                            out[i] = Some(address);
                            found.insert(names[i].into(), (address, kind));
                            if kind != SymbolKind::Other {
                                self.kinds.insert(names[i].to_string(), kind);
                            }
                        }
                        None => still.push(i),
                    }
                }
                pending = still;
            }
        }
        out
    }

    fn tls_module_id(&mut self) -> Result<u64, String> {
        self.jit
            .inner
            .executor
            .reserve_tls_module()
            .map_err(|e| e.to_string())
    }

    fn place_static_tls(
        &mut self,
        module_id: u64,
        image: &[u8],
        size: u64,
        align: u64,
    ) -> Result<i64, String> {
        self.jit
            .inner
            .executor
            .place_static_tls(module_id, image, size, align)
            .map_err(|e| e.to_string())
    }

    fn symbol_kind(&mut self, name: &str, address: u64) -> SymbolKind {
        self.symbol_kinds(&[(name, address)])[0]
    }

    /// Kinds the generators gave; in process, `dladdr` of each (few links ask); another
    /// process's executor is asked for the rest in one lookup (the names of its runtime,
    /// say, which its hello gives without kinds), the kind kept where the address is the
    /// one the link has.
    fn symbol_kinds(&mut self, symbols: &[(&str, u64)]) -> Vec<SymbolKind> {
        let mut kinds: Vec<Option<SymbolKind>> = symbols
            .iter()
            .map(|(name, _)| self.kinds.get(*name).copied())
            .collect();
        let executor = &self.jit.inner.executor;
        if executor.runs_in_this_process() {
            for (kind, &(_, address)) in kinds.iter_mut().zip(symbols) {
                kind.get_or_insert_with(|| {
                    crate::executor::symbol_kind(kiln_runtime::runtime::host_symbol_is_function(
                        address,
                    ))
                });
            }
        } else {
            let unknown: Vec<usize> = (0..symbols.len()).filter(|&i| kinds[i].is_none()).collect();
            if !unknown.is_empty() {
                let names: Vec<&str> = unknown.iter().map(|&i| symbols[i].0).collect();
                if let Ok(found) = executor.lookup_many(0, &names) {
                    for (&i, found) in unknown.iter().zip(found) {
                        if let Some((_, kind)) = found.filter(|f| f.0 == symbols[i].1) {
                            kinds[i] = Some(kind);
                        }
                    }
                }
            }
        }
        kinds
            .into_iter()
            .map(|k| k.unwrap_or(SymbolKind::Other))
            .collect()
    }
}
