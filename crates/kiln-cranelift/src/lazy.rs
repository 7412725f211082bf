//! Lazy functions of `KilnModule` ([`crate::KilnModule::declare_lazy_function`]): a
//! function whose stub exists at once and whose body is compiled on its first call, on the
//! calling thread, by a callback the caller gave (Kiln's call-through stubs, as for
//! `kiln::Jit::add_lazy_functions`).

use crate::code_cache::{function_object, CompiledFunction, Target};
use cranelift_codegen::ir;
use cranelift_codegen::isa::{OwnedTargetIsa, TargetFrontendConfig};
use cranelift_module::{FuncId, FuncOrDataId, Linkage, ModuleRelocTarget};
use kiln_link::Architecture;
use std::sync::{Arc, RwLock};

/// What a lazy function's callback builds: the function (its name and signature set) and
/// the module's functions as they are declared when it runs.
pub struct LazyContext<'a> {
    /// The function to fill in (with `cranelift_frontend::FunctionBuilder`, say).
    pub func: &'a mut ir::Function,
    functions: &'a [Option<DeclaredFunction>],
    config: TargetFrontendConfig,
}

impl LazyContext<'_> {
    /// A reference to function `callee` of the module for the function being built (as
    /// `Module::declare_func_in_func`); calls reach its stub, so they reach whatever body
    /// it has when they run. `None` if `callee` is not declared.
    pub fn declare_func_in_func(&mut self, callee: FuncId) -> Option<ir::FuncRef> {
        let declared = self.functions.get(callee.as_u32() as usize)?.as_ref()?;
        let signature = self.func.import_signature(declared.signature.clone());
        let name = self
            .func
            .declare_imported_user_function(ir::UserExternalName {
                namespace: 0,
                index: callee.as_u32(),
            });
        Some(self.func.import_function(ir::ExtFuncData {
            name: ir::ExternalName::user(name),
            signature,
            colocated: declared.linkage.is_final(),
            patchable: false,
        }))
    }

    /// The target's frontend configuration (for `FunctionBuilder::finalize`).
    pub fn target_config(&self) -> TargetFrontendConfig {
        self.config
    }
}

/// A lazy function's callback: builds the function in the context it is given.
pub type LazyCompile = Arc<dyn Fn(&mut LazyContext<'_>) -> Result<(), String> + Send + Sync>;

/// A function's declaration, as lazy callbacks see it.
#[derive(Clone)]
pub(crate) struct DeclaredFunction {
    pub(crate) name: String,
    pub(crate) signature: ir::Signature,
    pub(crate) linkage: Linkage,
}

/// The module's functions by id, shared with the lazy functions' compiler (updated at
/// each declaration while the module has lazy functions or hot swap).
pub(crate) type SharedFunctions = Arc<RwLock<Vec<Option<DeclaredFunction>>>>;

/// Kiln's compiler of one module's lazy functions.
pub(crate) struct LazyFunctions {
    pub(crate) isa: OwnedTargetIsa,
    pub(crate) architecture: Architecture,
    pub(crate) functions: SharedFunctions,
    pub(crate) libcall_names: Arc<dyn Fn(ir::LibCall) -> String + Send + Sync>,
    /// Each lazy function's id and callback, by name.
    pub(crate) callbacks: RwLock<Vec<(String, FuncId, LazyCompile)>>,
}

impl kiln::lazy::LazyCompiler for LazyFunctions {
    fn compile(&self, name: &str) -> Result<Vec<u8>, kiln::lazy::CompileError> {
        let (id, callback) = {
            let callbacks = self
                .callbacks
                .read()
                .map_err(|_| "a lazy callback panicked")?;
            let (_, id, callback) = callbacks
                .iter()
                .find(|(n, _, _)| n == name)
                .ok_or_else(|| format!("{name} is not a lazy function of this module"))?;
            (*id, callback.clone())
        };
        let functions = self
            .functions
            .read()
            .map_err(|_| "a declaration panicked")?;
        let declared = functions
            .get(id.as_u32() as usize)
            .and_then(Option::as_ref)
            .ok_or_else(|| format!("{name} is not declared"))?;
        let mut ctx = cranelift_codegen::Context::new();
        ctx.func.signature = declared.signature.clone();
        ctx.func.name = ir::UserFuncName::user(0, id.as_u32());
        callback(&mut LazyContext {
            func: &mut ctx.func,
            functions: &functions,
            config: self.isa.frontend_config(),
        })?;
        ctx.compile(&*self.isa, &mut Default::default())
            .map_err(|e| format!("compiling {name}: {:?}", e.inner))?;
        let (code, parts) = crate::module::compiled_parts(&*self.isa, &ctx, id)
            .map_err(|e| format!("compiling {name}: {e}"))?;
        // Its references by name: the module's functions are its stubs in the library.
        let name_of = |target: &ModuleRelocTarget| -> Result<(Target, i64), String> {
            if let ModuleRelocTarget::LibCall(libcall) = target {
                return Ok((Target::Name((self.libcall_names)(*libcall)), 0));
            }
            match crate::module::declared_target(target) {
                Some((FuncOrDataId::Func(callee), extra)) if callee == id => {
                    Ok((Target::Itself, extra))
                }
                Some((FuncOrDataId::Func(callee), 0)) => functions
                    .get(callee.as_u32() as usize)
                    .and_then(Option::as_ref)
                    .map(|d| (Target::Name(d.name.clone()), 0))
                    .ok_or_else(|| format!("{name} calls an undeclared function")),
                _ => Err(format!(
                    "{name} refers to {target:?}: a lazy function reaches the module's functions and the host's names only"
                )),
            }
        };
        Ok(function_object(
            &*self.isa,
            self.architecture,
            &CompiledFunction {
                name,
                code,
                align: parts.align,
                relocs: &parts.relocs,
                unwind: parts.unwind.as_ref(),
            },
            name_of,
        )?)
    }
}
