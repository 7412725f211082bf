//! Removing modules: one module, or a set in users-first order, refused while modules
//! outside the set use them; and the session's shutdown.

use crate::jit::Jit;
use crate::library::{LibraryId, LibraryState};
use crate::module::{Module, ModuleInner};
use crate::Error;
use rustc_hash::FxHashMap;
use std::sync::{Arc, Weak};

/// Whether `module` is still in its library's index.
fn is_listed(module: &ModuleInner, state: &LibraryState) -> bool {
    state.modules.contains_key(&module.id)
}

impl Jit {
    /// The module of `lib` that defines `name`, if a module does.
    pub(crate) fn module_of(&self, lib: LibraryId, name: &str) -> Result<Option<Module>, Error> {
        let library = self.library_data(lib)?;
        let state = library.state.read();
        Ok(state
            .exported(name)
            .or_else(|| state.hidden_definition(name))
            .and_then(|d| d.module_id())
            .and_then(|id| state.modules.get(&id).cloned()))
    }

    /// The live modules of `lib`, oldest first: its linked modules (call-through stubs
    /// among them) and the current bodies of its lazy functions (which are in no index:
    /// removing the stubs' module takes them with it).
    pub(crate) fn modules(&self, lib: LibraryId) -> Result<Vec<Module>, Error> {
        let mut modules: Vec<Module> = {
            let library = self.library_data(lib)?;
            let state = library.state.read();
            state.modules.values().cloned().collect()
        };
        modules.extend(self.lazy_bodies(lib));
        modules.sort_by_key(|m| m.inner.id);
        Ok(modules)
    }

    /// Removes every module of `modules`, in an order that removes users before the
    /// modules they use (as [`Jit::remove_module`] each). Refused before anything is
    /// removed, with [`Error::ModuleInUse`] naming them, if live modules outside the set
    /// use one of it.
    ///
    /// ```
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # if !cfg!(target_arch = "x86_64") { return Ok(()); }
    /// use kiln::lazy::testing::constant_function;
    /// let jit = kiln::Jit::new()?;
    /// let lib = jit.main_library();
    /// jit.library(lib).add(kiln::Input::object("one.o", constant_function("one", 1)))?;
    /// let (one, _) = jit.link_pending(lib)?.expect("a module");
    /// jit.library(lib).add(kiln::Input::object("two.o", constant_function("two", 2)))?;
    /// let (two, _) = jit.link_pending(lib)?.expect("a module");
    /// jit.remove_modules(&[one, two])?;
    /// assert!(jit.lookup(lib, "one").is_err());
    /// # Ok(()) }
    /// ```
    pub fn remove_modules(&self, modules: &[Module]) -> Result<(), Error> {
        // Members by identity (a module listed twice counts once).
        let key = |m: &ModuleInner| m as *const ModuleInner;
        let index: FxHashMap<*const ModuleInner, usize> = modules
            .iter()
            .enumerate()
            .map(|(i, m)| (key(&m.inner), i))
            .collect();
        // Users outside the set (live, or still listed) refuse the whole removal.
        for module in modules {
            let library = self.library_data(module.inner.library)?;
            let state = library.state.read();
            let own_bodies = self.stub_bodies(module);
            let outside = blocking_users(module, &state, |u| {
                index.contains_key(&u) || own_bodies.contains(&u)
            });
            if !outside.is_empty() {
                return Err(Error::ModuleInUse {
                    module: module.inner.name.to_string(),
                    users: outside,
                });
            }
        }
        // Users first (Kahn's order): a member goes once no remaining member uses it.
        let mut users_left = vec![0usize; modules.len()];
        for (i, m) in modules.iter().enumerate() {
            if index.get(&key(&m.inner)) != Some(&i) {
                continue; // a repeat
            }
            for used in m.inner.uses.iter() {
                if let Some(&j) = index.get(&key(&used.inner)) {
                    users_left[j] += 1;
                }
            }
        }
        let mut ready: Vec<usize> = (0..modules.len())
            .filter(|&i| index.get(&key(&modules[i].inner)) == Some(&i) && users_left[i] == 0)
            .collect();
        let mut removed = 0;
        while let Some(i) = ready.pop() {
            self.remove_module(&modules[i])?;
            removed += 1;
            for used in modules[i].inner.uses.iter() {
                if let Some(&j) = index.get(&key(&used.inner)) {
                    users_left[j] -= 1;
                    if users_left[j] == 0 {
                        ready.push(j);
                    }
                }
            }
        }
        if removed < index.len() {
            // Modules cannot use each other in a cycle (a module uses only earlier ones).
            let left: Vec<String> = index
                .values()
                .filter(|&&i| users_left[i] > 0)
                .map(|&i| modules[i].inner.name.to_string())
                .collect();
            return Err(Error::ModuleInUse {
                module: left.first().cloned().unwrap_or_default(),
                users: left,
            });
        }
        Ok(())
    }

    /// Removes `module` from its library, as `dlclose` would: its definitions leave the
    /// library's index, its finalizers run now, and its memory is freed when the last
    /// handle to it (and the last module that refers to it) is gone.
    ///
    /// Refused, with [`Error::ModuleInUse`] naming them, while live modules refer to it
    /// (remove those first): their code calls into it. A module of call-through stubs
    /// ([`Jit::add_lazy_functions`]) retires its functions' bodies first (their slots lead
    /// to the batch's fallback, and a body is freed once no [`CodeGuard`](crate::lazy::CodeGuard) taken
    /// before is held): the stubs go with their bodies, and a call through a stub held
    /// meanwhile reaches the fallback.
    ///
    /// The finalizers run in this order, on the calling thread:
    /// 1. the calling thread's destructors of the module's C++ `thread_local` objects
    ///    (newest first);
    /// 2. the handlers the module registered with `atexit` / `__cxa_atexit` (newest first,
    ///    through `__cxa_finalize` of the module's own `__dso_handle`, which also forgets
    ///    its `pthread_atfork` handlers);
    /// 3. its `.fini_array` (and `.dtors`).
    ///
    /// Thread-local destructors never run in freed memory: those of *other* threads run
    /// when those threads exit, and every such registration holds the module's memory
    /// mapped until it has run — so a module whose thread-locals are alive in other
    /// threads stays mapped (though removed from its library) until those threads exit.
    /// Handlers still registered when the process exits run in `exit()` while their code
    /// is mapped. (Out of process, the executor runs steps 1–3 on its serving thread.)
    pub fn remove_module(&self, module: &Module) -> Result<(), Error> {
        let library = self.library_data(module.inner.library)?;
        // Call-through stubs go with their functions' bodies, which use them: those are
        // no reason to refuse (they are retired below, once nothing else refuses).
        let own_bodies = self.stub_bodies(module);
        let users = {
            let state = library.state.read();
            blocking_users(module, &state, |u| own_bodies.contains(&u))
        };
        if !users.is_empty() {
            return Err(Error::ModuleInUse {
                module: module.inner.name.to_string(),
                users,
            });
        }
        // Freed once no code guard taken before now is held; with no lock held (freeing
        // a body may ask the executor).
        self.retire_stub_bodies(module)?;
        {
            let mut state = library.state.write();
            state.hash_pending();
            // Refused if a user came meanwhile.
            let users = blocking_users(module, &state, |u| own_bodies.contains(&u));
            if !users.is_empty() {
                return Err(Error::ModuleInUse {
                    module: module.inner.name.to_string(),
                    users,
                });
            }
            if state.modules.remove(&module.inner.id).is_none() {
                return Ok(()); // removed already
            }
            // Only the module's own names: removal costs what the module defines, not
            // what the library holds.
            let id = module.inner.id;
            for symbol in module.inner.symbols.iter() {
                let map = if symbol.visible {
                    &mut state.index
                } else {
                    &mut state.hidden
                };
                if map
                    .get(symbol.name)
                    .is_some_and(|d| d.module_id() == Some(id))
                {
                    map.remove(symbol.name);
                }
            }
        }
        module.inner.leave_users_lists();
        module.inner.finalize();
        Ok(())
    }

    /// Runs the finalizers of every module (newest first), as a program's `exit` does, and
    /// nothing else: the modules stay linked, mapped and published. For a process that
    /// ends right after (`kiln run`): what [`Jit::shutdown`] and dropping the session
    /// would also do — withdraw exports, deregister unwind tables, empty the index, unmap
    /// — the exit does at once. A module's finalizers run once, whichever is called.
    pub fn finalize_for_exit(&self) {
        let mut modules: Vec<Module> = self
            .inner
            .libraries
            .read()
            .iter()
            .flat_map(|library| {
                library
                    .state
                    .read()
                    .modules
                    .values()
                    .cloned()
                    .collect::<Vec<_>>()
            })
            .collect();
        modules.sort_by_key(|m| std::cmp::Reverse(m.inner.id));
        for m in &modules {
            m.inner.run_finalizers();
        }
        self.inner.executor.flush();
    }

    /// Runs the finalizers of every module (newest first) and forgets them, as a program's
    /// exit would.
    pub fn shutdown(&self) {
        let mut modules: Vec<Module> = Vec::new();
        for library in self.inner.libraries.read().iter() {
            let mut state = library.state.write();
            modules.extend(state.modules.drain().map(|(_, m)| m));
            state.unhashed = None;
            state.index.retain(|_, d| d.module.is_none());
            state.hidden.clear();
        }
        modules.sort_by_key(|m| std::cmp::Reverse(m.inner.id));
        for m in &modules {
            m.inner.finalize();
        }
        self.inner.executor.flush();
    }
}

/// The users of `module` that keep it from being removed (live, or still listed in their
/// library), but those `ignored` says.
fn blocking_users(
    module: &Module,
    state: &LibraryState,
    ignored: impl Fn(*const ModuleInner) -> bool,
) -> Vec<String> {
    module
        .inner
        .users
        .lock()
        .iter()
        .filter_map(Weak::upgrade)
        .filter(|u| !ignored(Arc::as_ptr(u)))
        .filter(|u| !*u.finalized.lock() || is_listed(u, state))
        .map(|u| u.name.to_string())
        .collect()
}
