//! One link into a library, as named steps: gather what the link takes (pending objects,
//! the lazy objects they need), link (names resolved by [`crate::resolve`]), check the
//! new definitions against the library's, install what the executor keeps (unwind
//! information, thread-locals, exports to shared libraries), make the module and record
//! what it uses, publish its definitions, and start it (plugins told, initializers run)
//! with no lock held.

use crate::executor::{EhRegistration, ExportHandle};
use crate::jit::Jit;
use crate::library::{describe, LazyObject, LibraryData, LibraryId};
use crate::link_lock::{lock_for_link, LinkingHere};
use crate::link_request::{LinkRequest, Publish};
use crate::module::{Announced, Module, ModuleInner};
use crate::plugin::{LoadedModule, Plugin};
use crate::resolve::SessionContext;
use crate::Error;
use kiln_link::{link, ArchiveInput, LinkCounts, LinkOptions, LinkPass, LinkTimes, ObjectInput};
use kiln_memory::MemoryManager;
use parking_lot::Mutex;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// Figures of one link.
#[derive(Debug, Clone, Default)]
pub struct LinkReport {
    /// Phase times.
    pub times: LinkTimes,
    /// Each pass of the link graph with its time, in order.
    pub pass_times: Vec<(std::borrow::Cow<'static, str>, std::time::Duration)>,
    /// Counts.
    pub counts: LinkCounts,
    /// For a link through the image cache ([`Jit::link_pending_cached`]): whether the
    /// module was mapped from it, or linked and stored, and why not.
    pub image: Option<crate::cache::ImageOutcome>,
    /// Why an image the cache held was not used (it failed to map or to rebind here: the
    /// module was linked instead).
    pub image_refused: Option<String>,
}

/// What a link took from its library: given back if it fails.
pub(crate) struct Gathered {
    /// The inputs, then the lazy objects taken (the module is named after its first).
    /// (Inline for the common link of one object: no heap allocation.)
    objects: smallvec::SmallVec<[ObjectInput; 1]>,
    archives: Arc<Vec<ArchiveInput>>,
    /// The lazy objects taken, by slot.
    taken: Vec<(usize, LazyObject)>,
}

/// What resolution found besides addresses.
pub(crate) struct Resolved {
    /// The modules whose definitions the link used.
    pub(crate) uses: Vec<Module>,
    /// Whether the module registers thread-local destructors.
    pub(crate) thread_atexit: bool,
    /// For a Windows executor: the unwind data of the module's functions, made from its
    /// `.eh_frame` during the link.
    pub(crate) windows_unwind: Vec<kiln_link::windows_unwind::WindowsUnwind>,
}

/// What the executor keeps for a module, installed before it is made.
struct Installed {
    tls_module: Option<u64>,
    eh: Vec<EhRegistration>,
    exports: Option<ExportHandle>,
}

/// One link into one library.
pub(crate) struct LinkJob<'j> {
    pub(crate) jit: &'j Jit,
    pub(crate) library: &'j Arc<LibraryData>,
    pub(crate) publish: Publish,
    pub(crate) times: bool,
    /// References routed through call-through stubs.
    pub(crate) through: Option<&'j crate::link_request::CallsThrough>,
}

impl Jit {
    /// Links what `request` asks for into `lib`: `None` if there was nothing to link. A
    /// failed link leaves the library as it was (the lazy objects it took put back).
    pub(crate) fn link(
        &self,
        lib: LibraryId,
        request: LinkRequest<'_>,
    ) -> Result<Option<(Module, LinkReport)>, Error> {
        let library = self.library_data(lib)?;
        let job = LinkJob {
            jit: self,
            library: &library,
            publish: request.publish,
            times: request.times,
            through: request.through,
        };
        let lock = match job.publish {
            Publish::Yes => Some(lock_for_link(&library)?),
            Publish::No => None,
        };
        let _linking_here = (job.publish == Publish::Yes).then(|| LinkingHere::enter(library.id));
        let Some(gathered) = job.gather(request.extra, request.wanted)? else {
            return Ok(None);
        };
        let result = job.run(&gathered, request.shown, lock, request.image.as_ref());
        if result.is_err() && !gathered.taken.is_empty() {
            library.state.write().restore_lazy(gathered.taken);
        }
        result.map(Some)
    }
}

/// Publishes in `lib` a module placed in memory without a link (call-through stubs):
/// checked against the library's definitions, installed, made, published and started
/// as a linked module is, under the library's link lock. What is pending stays
/// pending. On an error its memory is freed and the library is as it was.
pub(crate) fn publish_placed(
    jit: &Jit,
    lib: LibraryId,
    name: &str,
    linked: kiln_link::LinkedModule,
) -> Result<Module, Error> {
    let library = jit.library_data(lib)?;
    let job = LinkJob {
        jit,
        library: &library,
        publish: Publish::Yes,
        times: false,
        through: None,
    };
    let lock = lock_for_link(&library)?;
    let _linking_here = LinkingHere::enter(library.id);
    let resolved = Resolved {
        uses: Vec::new(),
        thread_atexit: false,
        windows_unwind: Vec::new(),
    };
    let plugins = jit.inner.plugins.snapshot();
    job.finish(
        linked,
        resolved,
        &[],
        name.to_string(),
        None,
        plugins,
        Some(lock),
    )
    .map(|(module, _)| module)
}

impl LinkJob<'_> {
    /// The steps after gathering, in order; the lock is let go before the module starts.
    fn run(
        &self,
        gathered: &Gathered,
        shown: Option<ObjectInput>,
        lock: Option<parking_lot::MutexGuard<'_, ()>>,
        image: Option<&kiln_cache::CacheKey>,
    ) -> Result<(Module, LinkReport), Error> {
        // No plugin registered: no walk over plugins, no event built.
        let plugins: Vec<Arc<dyn Plugin>> = self.jit.inner.plugins.snapshot();
        // A remote executor gets the link's steps that need only `Ok` (prepare,
        // initialize, unwind information, guarded pages) in one message, sent when
        // `install` is done (or with the first request that needs an answer).
        let _batching = self.jit.inner.executor.batch();
        let link = match image {
            Some(key) => self
                .link_through_image_cache(gathered, &plugins, key)
                .map(|link| (link.linked, link.resolved, Some(link.outcome), link.refused)),
            None => self
                .link_objects(gathered, &plugins, false)
                .map(|(linked, resolved)| (linked, resolved, None, None)),
        };
        // A library the link searches that the executor could not load (asked for while
        // it started) is the cause, of the symbols the link missed if it missed any: the
        // module is not published.
        if let Some(why) = self.unusable_generator() {
            return Err(Error::Executor(why));
        }
        let (linked, resolved, outcome, refused) = link?;
        let name = gathered
            .objects
            .first()
            .map(|o| o.name.clone())
            .unwrap_or_default();
        let (module, mut report) = self.finish(
            linked,
            resolved,
            &gathered.objects,
            name,
            shown,
            plugins,
            lock,
        )?;
        report.image = outcome;
        report.image_refused = refused;
        Ok((module, report))
    }

    /// Why a generator of a library this link searches cannot answer at all, if one
    /// cannot ([`crate::SymbolGenerator::unusable`]).
    fn unusable_generator(&self) -> Option<String> {
        let mut ctx = SessionContext::new(self.jit, self.library, self.publish);
        ctx.order().iter().find_map(|library| {
            library
                .generators
                .lock()
                .list
                .iter()
                .find_map(|g| g.unusable())
        })
    }

    /// The steps after the link itself (of objects, or of a module placed without one):
    /// check, install, make, record uses, publish, start.
    #[allow(clippy::too_many_arguments)]
    fn finish(
        &self,
        mut linked: kiln_link::LinkedModule,
        resolved: Resolved,
        objects: &[ObjectInput],
        name: String,
        shown: Option<ObjectInput>,
        plugins: Vec<Arc<dyn Plugin>>,
        lock: Option<parking_lot::MutexGuard<'_, ()>>,
    ) -> Result<(Module, LinkReport), Error> {
        let report = LinkReport {
            times: linked.times,
            pass_times: std::mem::take(&mut linked.pass_times),
            counts: linked.counts,
            image: None,
            image_refused: None,
        };
        if self.publish == Publish::Yes {
            self.check_redefinitions(&linked, objects, &name)?;
        }
        let on_demand = self.exports_wanted(&linked)
            && self.jit.inner.exports_on_demand
            && !self.jit.inner.executor.defers_exports();
        let installed = self.install(&mut linked, &resolved.windows_unwind)?;
        let id = self.jit.inner.next_module.fetch_add(1, Ordering::Relaxed);
        let init = std::mem::take(&mut linked.init);
        let event = (!plugins.is_empty()).then(|| loaded_event(id, &name, &mut linked, shown));
        let module = self.make_module(id, name, linked, installed, resolved.uses);
        if on_demand {
            self.export_on_demand(&module)?;
        }
        self.record_uses(&module)?;
        if resolved.thread_atexit {
            // Its thread-local destructors will keep it mapped (a global registry: only
            // for modules that register such destructors).
            let keep_alive: Arc<dyn std::any::Any + Send + Sync> = module.inner.clone();
            self.jit
                .inner
                .executor
                .register_module(module.inner.dso_handle, Arc::downgrade(&keep_alive));
        }
        if self.publish == Publish::Yes {
            self.publish(&module);
        }
        // No lock while plugins and JIT code run: an initializer may call back into the
        // session, even to link into this library.
        drop(lock);
        self.start(&module, event, plugins, &init)?;
        Ok((module, report))
    }

    /// Step 1: takes what the link links out of the library — what is pending (for a
    /// module), `extra`, and the lazy objects that define `wanted` or what the inputs
    /// leave undefined (transitively). `None` if there is nothing to link.
    fn gather(
        &self,
        mut extra: Option<ObjectInput>,
        wanted: &[&str],
    ) -> Result<Option<Gathered>, Error> {
        let architecture = self.jit.inner.architecture;
        let mut state = self.library.state.write();
        if let (Some(extra), Publish::Yes, false) =
            (&mut extra, self.publish, state.pending.is_empty())
        {
            // Checked first when something is pending: a bad object must not fail a link
            // of good ones (the parse is kept for the link).
            extra.check(architecture)?;
        }
        let mut objects: smallvec::SmallVec<[ObjectInput; 1]> = match self.publish {
            Publish::Yes => smallvec::SmallVec::from_vec(std::mem::take(&mut state.pending)),
            Publish::No => smallvec::SmallVec::new(),
        };
        objects.extend(extra);
        let taken = match self.publish {
            // The symbol tables are read only when the library has lazy objects.
            Publish::Yes if !state.lazy.is_empty() => {
                let scanned: Vec<kiln_link::ObjectSymbols> = objects
                    .iter()
                    .filter_map(|o| kiln_link::scan_symbols(&o.name, o.bytes(), architecture).ok())
                    .collect();
                let undefined = scanned.iter().flat_map(|s| s.undefined.iter());
                state.take_lazy_closure(
                    wanted
                        .iter()
                        .copied()
                        .chain(undefined.map(|n| &**n))
                        .collect::<Vec<_>>(),
                )
            }
            _ => Vec::new(),
        };
        if objects.is_empty() && taken.is_empty() {
            return Ok(None);
        }
        objects.extend(taken.iter().map(|(_, o)| o.input.clone()));
        Ok(Some(Gathered {
            objects,
            archives: state.archives.clone(),
            taken,
        }))
    }

    /// Step 2: the link itself, its names resolved as [`crate::resolve`] says;
    /// `relocatable`: into a span of its own, its image kept with its fixups (for the
    /// image cache).
    pub(crate) fn link_objects(
        &self,
        gathered: &Gathered,
        plugins: &[Arc<dyn Plugin>],
        relocatable: bool,
    ) -> Result<(kiln_link::LinkedModule, Resolved), Error> {
        let mut passes: Vec<_> = plugins.iter().flat_map(|p| p.link_passes()).collect();
        let inner = &self.jit.inner;
        // Windows unwinds with its own tables: made from `.eh_frame` once it is relocated.
        let unwind = (inner.target_os == crate::executor::TargetOs::Windows)
            .then(|| Arc::new(kiln_link::windows_unwind::WindowsUnwindPass::default()));
        if let Some(pass) = &unwind {
            passes.push((
                kiln_link::PassPoint::FixedUp,
                pass.clone() as Arc<dyn LinkPass>,
            ));
        }
        // A relocatable link's span: in this process, or in the executor's memory.
        let span: Option<Box<dyn MemoryManager>> = relocatable.then(|| match self.remote_spans() {
            Some(spans) => Box::new(spans) as Box<dyn MemoryManager>,
            None => Box::new(kiln_memory::SpanMemoryManager::default()),
        });
        let options = LinkOptions {
            memory: match &span {
                Some(span) => &**span,
                None => &*inner.memory,
            },
            low_memory: Some(&inner.low_memory as &dyn MemoryManager),
            report_sections: !plugins.is_empty(),
            architecture: inner.architecture,
            keep_image: false,
            passes: &passes,
            relocatable,
            times: self.times,
        };
        let mut ctx = SessionContext::new(self.jit, self.library, self.publish);
        ctx.through = self.through;
        let linked = match link(&gathered.objects, &gathered.archives, &mut ctx, &options) {
            Ok(linked) => linked,
            // What a lazy object it needed said is the cause.
            Err(error) => return Err(ctx.lazy_error.take().unwrap_or(error.into())),
        };
        let windows_unwind = match unwind {
            Some(pass) => {
                let (functions, skipped) = pass.take();
                for s in skipped {
                    tracing::debug!(begin = s.begin, why = %s.why, "no Windows unwind data");
                }
                functions
            }
            None => Vec::new(),
        };
        let resolved = Resolved {
            thread_atexit: ctx.thread_atexit,
            uses: ctx.uses.into_values().collect(),
            windows_unwind,
        };
        Ok((linked, resolved))
    }

    /// Step 3: a name the module exports that the library defines already (or a lazy
    /// object of it does, not weakly) refuses the module: nothing is published, and its
    /// memory is freed unrun.
    fn check_redefinitions(
        &self,
        linked: &kiln_link::LinkedModule,
        objects: &[ObjectInput],
        module_name: &str,
    ) -> Result<(), Error> {
        let state = self.library.state.read();
        // A library that defines nothing yet (a program's first module) has nothing to
        // redefine: its module's names are not read one by one.
        if state.index.is_empty() && state.unhashed.is_none() && state.lazy.is_empty() {
            return Ok(());
        }
        let Some((name, previous)) = linked.exports.iter().filter(|e| e.visible).find_map(|e| {
            let previous = match state.exported(e.name) {
                Some(d) => describe(&state, &d),
                None => state
                    .lazy
                    .get(e.name)
                    .and_then(|&slot| state.lazy_objects[slot].as_ref())
                    .filter(|o| o.symbols.defined.iter().any(|n| **n == *e.name))
                    .map(|o| format!("lazy object {}", o.input.name))?,
            };
            Some((e.name, previous))
        }) else {
            return Ok(());
        };
        // The object (or archive member) that defines it: read on this error path only,
        // from the inputs' symbol tables.
        let new = objects
            .iter()
            .find(|o| {
                kiln_link::scan_symbols(&o.name, &o.data, linked.architecture)
                    .is_ok_and(|s| s.defined.iter().chain(&s.weak).any(|n| **n == *name))
            })
            .map(|o| o.name.clone())
            .unwrap_or_else(|| {
                if objects.is_empty() {
                    return module_name.to_string();
                }
                let names: Vec<&str> = objects.iter().map(|o| o.name.as_str()).collect();
                format!("the link of {}", names.join(", "))
            });
        Err(Error::Redefinition {
            symbol: name.to_string(),
            library: self.library.name.clone(),
            previous,
            new,
        })
    }

    /// Step 4: what the executor keeps for the module — guarded pages for BTI code, the
    /// thread-local template, the unwind information, exports to shared libraries.
    fn install(
        &self,
        linked: &mut kiln_link::LinkedModule,
        windows_unwind: &[kiln_link::windows_unwind::WindowsUnwind],
    ) -> Result<Installed, Error> {
        let executor = &self.jit.inner.executor;
        if linked.branch_protected {
            // BTI-built code (and Kiln's stubs, which start with landing pads): the whole
            // pages of its code are mapped guarded. Pages the slab shares with another
            // module's code stay unguarded (guarding them could break that module).
            if let Some(code) = linked.allocation.segments().first() {
                let page = executor.page_size();
                let start = code.target.next_multiple_of(page);
                let end = (code.target + code.len) / page * page;
                if end > start {
                    executor.guard_branch_targets(start, end - start)?;
                }
            }
        }
        let dynamic_tls = linked.tls.as_ref().is_some_and(|t| t.tp_offset.is_none());
        if dynamic_tls && self.jit.inner.target_os == crate::executor::TargetOs::Windows {
            // An ELF archive member's thread-locals (ELF objects added directly were
            // refused): a COFF module's are in the executor's static TLS, placed by now.
            return Err(Error::Unsupported(
                "the module has ELF thread-locals (from an archive member): they are not supported on Windows executors".into(),
            ));
        }
        let tls_module = linked.tls.as_ref().map(|t| t.module_id);
        if let Some(template) = linked.tls.take() {
            executor.install_tls(template)?;
        }
        let eh = match linked.eh_frame {
            // Windows unwinds with its own tables (RUNTIME_FUNCTION): made from
            // `.eh_frame` during the link, and COFF objects' own (`.pdata`).
            _ if self.jit.inner.target_os == crate::executor::TargetOs::Windows => {
                let made = executor.register_unwind_info(windows_unwind)?;
                let table = match &linked.function_table {
                    Some(table) => executor.register_function_table(table)?,
                    None => None,
                };
                made.into_iter().chain(table).collect()
            }
            Some(address) => executor.register_eh_frame(address)?.into_iter().collect(),
            None => Vec::new(),
        };
        // Windows has no process-wide namespace that a DLL's imports search: nothing to
        // export to.
        // On demand, an executor in another process that can wait gets the list now, in
        // this batch (no round trip of its own); one in this process reads the module
        // later (`export_on_demand`), and others export at once.
        let on_demand = self.jit.inner.exports_on_demand;
        let exports = if self.exports_wanted(linked) && (!on_demand || executor.defers_exports()) {
            let code = linked
                .allocation
                .segments()
                .first()
                .map(|c| c.target..c.target + c.len);
            let list = linked
                .exports
                .iter()
                .filter(|e| e.visible)
                .map(|e| kiln_runtime::shared_object::ExportedSymbol {
                    name: e.name.into(),
                    address: e.address,
                    size: 0,
                    function: code.as_ref().is_some_and(|c| c.contains(&e.address)),
                })
                .collect();
            Some(if on_demand {
                executor.defer_exports(list)?
            } else {
                executor.export_symbols(list)?
            })
        } else {
            None
        };
        // What a batching scope deferred is installed before the module is made.
        executor.flush_batch()?;
        Ok(Installed {
            tls_module,
            eh,
            exports,
        })
    }

    /// Whether the module's definitions are exported to libraries: asked for, a Linux
    /// executor, a published module with something to export.
    fn exports_wanted(&self, linked: &kiln_link::LinkedModule) -> bool {
        self.jit.inner.export_to_libraries
            && self.jit.inner.target_os == crate::executor::TargetOs::Linux
            && self.publish == Publish::Yes
            && linked.exports.iter().any(|e| e.visible)
    }

    /// Step 5b, with exports on demand: the module's exports, made from the module itself
    /// when the program first calls the loader (where the executor can wait; at once
    /// where it cannot). Before the initializers run: one may call `dlopen`.
    fn export_on_demand(&self, module: &Module) -> Result<(), Error> {
        let executor = &self.jit.inner.executor;
        let code = module
            .inner
            .allocation
            .segments()
            .first()
            .map_or(0..0, |c| c.target..c.target + c.len);
        let source: std::sync::Weak<dyn kiln_runtime::module_symbols::ModuleSymbols> =
            Arc::downgrade(&module.inner) as _;
        let handle = match executor.export_module_on_demand(source, code.clone()) {
            Some(handle) => handle,
            None => {
                executor.export_symbols(kiln_runtime::runtime::exports_of(&*module.inner, &code))
            }
        };
        match handle {
            Ok(handle) => {
                *module.inner.exports.lock() = Some(handle);
                Ok(())
            }
            Err(e) => {
                *module.inner.finalized.lock() = true; // its initializers never ran
                Err(e)
            }
        }
    }

    /// Step 5: the module handle, which owns the memory and what was installed.
    fn make_module(
        &self,
        id: u64,
        name: String,
        mut linked: kiln_link::LinkedModule,
        installed: Installed,
        uses: Vec<Module>,
    ) -> Module {
        let inner = &self.jit.inner;
        Module {
            inner: Arc::new(ModuleInner {
                id,
                name: name.into_boxed_str(),
                library: self.library.id,
                // Sorted by name already; the names are shared with the index.
                symbols: std::mem::take(&mut linked.exports),
                fini: if inner.noexec {
                    Box::default()
                } else {
                    linked.fini.into_boxed_slice()
                },
                dso_handle: linked.dso_handle,
                tls_module: installed.tls_module,
                eh: Mutex::new(installed.eh),
                exports: Mutex::new(installed.exports),
                finalized: Mutex::new(inner.noexec),
                executor: inner.executor.clone(),
                uses: uses.into_boxed_slice(),
                users: Mutex::new(Vec::new()),
                announced: Mutex::new(None),
                allocation: linked.allocation,
            }),
        }
    }

    /// Step 6: the module joins the user lists of the modules it uses, and is refused if
    /// one of them was removed while it linked (that removal saw no user yet: now that
    /// this one is a user a removal is refused, and one that came first is caught here —
    /// this module never runs).
    fn record_uses(&self, module: &Module) -> Result<(), Error> {
        for used in &module.inner.uses {
            let mut users = used.inner.users.lock();
            // Entries of users dropped without being removed go when the list is full,
            // before it grows: amortized constant time per link, however many users a
            // long-lived runtime module has.
            if users.len() == users.capacity() {
                users.retain(|u| u.strong_count() > 0);
            }
            users.push(Arc::downgrade(&module.inner));
        }
        for used in &module.inner.uses {
            let listed = self
                .jit
                .library_data(used.inner.library)
                .map(|l| l.state.read().modules.contains_key(&used.inner.id))
                .unwrap_or(false);
            if !listed {
                *module.inner.finalized.lock() = true; // its initializers never ran
                return Err(Error::RemovedDuringLink {
                    module: module.inner.name.to_string(),
                    used: used.inner.name.to_string(),
                });
            }
        }
        Ok(())
    }

    /// Step 7: the module joins the library's list, its definitions published unhashed:
    /// its sorted table answers lookups until a link resolves against the library, or
    /// another module is published, which hash them into the index then
    /// ([`crate::library::LibraryState::unhashed`]: at most one module waits, so a
    /// lookup or a redefinition check searches one table besides the index).
    fn publish(&self, module: &Module) {
        let mut state = self.library.state.write();
        state.hash_pending();
        state.unhashed = Some(module.clone());
        state.modules.insert(module.inner.id, module.clone());
    }

    /// Step 8, with no lock held: plugins told of the module, then its initializers run.
    fn start(
        &self,
        module: &Module,
        event: Option<Arc<LoadedModule>>,
        plugins: Vec<Arc<dyn Plugin>>,
        init: &[u64],
    ) -> Result<(), Error> {
        let inner = &self.jit.inner;
        if let Some(event) = event {
            inner.plugins.announce(&plugins, &event, true);
            *module.inner.announced.lock() = Some(Box::new(Announced {
                plugins: inner.plugins.clone(),
                told: plugins,
                event,
            }));
        }
        if !inner.noexec {
            inner.executor.run_initializers(init)?;
        }
        Ok(())
    }
}

/// What plugins are told of a module's load (built only when a plugin is registered).
fn loaded_event(
    id: u64,
    name: &str,
    linked: &mut kiln_link::LinkedModule,
    shown: Option<ObjectInput>,
) -> Arc<LoadedModule> {
    let mut objects = std::mem::take(&mut linked.objects);
    // Objects built in memory are shown as the ELF files they describe (listeners, gdb's
    // above all, read ELF).
    for object in &mut objects {
        if let Some(elf) = object.as_elf() {
            *object = elf;
        }
    }
    if let Some(shown) = shown {
        if let Some(o) = objects.iter_mut().find(|o| o.name == shown.name) {
            *o = shown;
        }
    }
    Arc::new(LoadedModule {
        id,
        name: name.to_string(),
        segments: linked.allocation.segments().to_vec(),
        sections: std::mem::take(&mut linked.sections),
        symbols: std::mem::take(&mut linked.symbol_info),
        objects,
    })
}
