//! Lazy functions' entry point, and the declarations the lazy compiler reads (see
//! `crate::lazy`).
use super::*;

impl KilnModule {
    /// Declares function `name` as lazy (with [`KilnBuilder::hot_swap`]): its stub exists
    /// at once ([`KilnModule::get_finalized_function`] gives it), and its first call builds
    /// it with `compile`, compiles and links it on the calling thread, then continues into
    /// it; later calls go straight to the body. `compile` builds the function in the
    /// [`LazyContext`](crate::LazyContext) it is given, and may call the module's other
    /// functions ([`LazyContext::declare_func_in_func`](crate::LazyContext::declare_func_in_func))
    /// and the host's names; a compile that fails leaves calls to Kiln's fallback (which
    /// returns 0), and the failure in the session's `lazy_failures`. Defined again
    /// (`define_function` and a finalize) or freed, it is as any hot-swap function.
    ///
    /// [`KilnBuilder::hot_swap`]: crate::KilnBuilder::hot_swap
    pub fn declare_lazy_function(
        &mut self,
        name: &str,
        linkage: Linkage,
        signature: &ir::Signature,
        compile: crate::lazy::LazyCompile,
    ) -> ModuleResult<FuncId> {
        if !self.hot_swap {
            return Err(ModuleError::Backend(anyhow::anyhow!(
                "lazy function {name}: lazy functions are called through stubs, which KilnBuilder::hot_swap(true) gives every function"
            )));
        }
        let id = self.declare_function(name, linkage, signature)?;
        self.start_definition(FuncOrDataId::Func(id))?;
        let function = self.name_of(FuncOrDataId::Func(id));
        let lazy = match &self.lazy {
            Some(lazy) => lazy.clone(),
            None => {
                let lazy = std::sync::Arc::new(crate::lazy::LazyFunctions {
                    isa: self.isa.clone(),
                    architecture: self.architecture,
                    functions: self.shared_functions.clone().unwrap_or_default(),
                    libcall_names: self.libcall_names.clone(),
                    callbacks: Default::default(),
                });
                self.lazy = Some(lazy.clone());
                lazy
            }
        };
        if let Ok(mut callbacks) = lazy.callbacks.write() {
            callbacks.push((function.clone(), id, compile));
        }
        let session = |source| {
            backend(KilnModuleError::Session {
                what: format!("making lazy function {function}'s stub"),
                source,
            })
        };
        let stubs = self
            .jit
            .add_lazy_functions(self.lib, &[function.as_str()], lazy)
            .map_err(session)?;
        self.stub_modules.push(stubs);
        self.stubbed.insert(id);
        let address = self.jit.lookup(self.lib, &function).map_err(session)?;
        self.functions[id] = Slot::Finalized(Definition {
            address,
            body: 0,
            size: 0,
            batch: u32::MAX, // in no finalize's module
        });
        Ok(id)
    }

    /// Shares function `id`'s declaration with the lazy functions' compiler.
    pub(super) fn share_declaration(&mut self, id: FuncId) {
        let Some(shared) = &self.shared_functions else {
            return;
        };
        let decl = self.declarations.get_function_decl(id);
        let declared = crate::lazy::DeclaredFunction {
            name: decl.linkage_name(id).into_owned(),
            signature: decl.signature.clone(),
            linkage: decl.linkage,
        };
        if let Ok(mut functions) = shared.write() {
            let index = id.as_u32() as usize;
            if functions.len() <= index {
                functions.resize(index + 1, None);
            }
            functions[index] = Some(declared);
        }
    }
}
