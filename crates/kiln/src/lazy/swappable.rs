//! Objects linked at once with their functions behind call-through stubs
//! ([`Jit::link_swappable`]): eagerly linked, and each function replaceable later.

use super::{CompileError, LazyCompiler};
use crate::jit::Jit;
use crate::library::LibraryId;
use crate::link_request::{CallsThrough, LinkRequest};
use crate::module::Module;
use crate::Error;
use kiln_link::ObjectInput;
use std::sync::Arc;

/// What [`Jit::link_swappable`] linked: the object's module and its functions' stubs.
#[derive(Debug, Clone)]
pub struct SwappableModule {
    /// The call-through stubs, published under the functions' names (what lookups and
    /// later links reach). Removing it ([`Jit::remove_module`]) takes the functions out
    /// of service: their stubs lead to the fallback.
    pub stubs: Module,
    /// The object's module: its code and data (its data symbols published as a linked
    /// module's are), its functions' first bodies listed under their names as the
    /// module's own ([`Module::symbol`]).
    pub module: Module,
}

/// The stubs' compiler: their bodies are the linked object's, set before
/// [`Jit::link_swappable`] returns; a call that reaches a stub before (another thread
/// calling a name it looked up meanwhile) gets this error and the fallback.
struct LinkedWithTheirObject;

impl LazyCompiler for LinkedWithTheirObject {
    fn compile(&self, name: &str) -> Result<Vec<u8>, CompileError> {
        Err(format!("{name} was called while its object was being linked").into())
    }
}

impl Jit {
    /// Links `bytes` (an object named `name`) at once, as [`Jit::link_object`] does, with
    /// every function it defines (`STT_FUNC` of default or protected visibility) reached
    /// through a call-through stub — by the object's own calls to it too — so that
    /// [`Jit::replace_function`] can give a function a new body later and
    /// [`Jit::retire_function`] take it out of service, as for a lazy function.
    ///
    /// JIT authors who want hot swap pick it per object, as cranelift-jit's `hotswap`
    /// and ORC's redirectable symbols are picked: a call to such a function costs one
    /// indirect jump (a load of its slot), and what [`Jit::link_object`] links binds calls
    /// straight to the body, which cannot then be replaced. Calls the compiler bound
    /// inside the object (inlined, or made through a local alias) do not reach the stub.
    ///
    /// A replaced body is freed once no [`CodeGuard`](crate::lazy::CodeGuard) taken before is held, unless
    /// it is the first one, which is part of [`SwappableModule::module`] (freed with it).
    /// Remove [`SwappableModule::stubs`] and [`SwappableModule::module`] together
    /// ([`Jit::remove_modules`]). On an error nothing is published.
    ///
    /// ```
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # if !cfg!(target_arch = "x86_64") { return Ok(()); }
    /// use kiln::lazy::testing::constant_function;
    /// let jit = kiln::Jit::new()?;
    /// let lib = jit.main_library();
    /// let linked = jit.link_swappable(lib, "seven.o", constant_function("seven", 7))?;
    /// let seven = jit.lookup(lib, "seven")?;
    /// // SAFETY: `seven` is `int seven(void)`.
    /// let call = || unsafe { std::mem::transmute::<u64, extern "C" fn() -> i32>(seven)() };
    /// assert_eq!(call(), 7);
    /// jit.replace_function(lib, "seven", constant_function("seven", 8))?;
    /// assert_eq!(call(), 8);
    /// jit.remove_modules(&[linked.stubs, linked.module])?;
    /// # Ok(()) }
    /// ```
    pub fn link_swappable(
        &self,
        lib: LibraryId,
        name: &str,
        bytes: impl Into<Arc<[u8]>>,
    ) -> Result<SwappableModule, Error> {
        let input = ObjectInput::new(name, bytes);
        let scanned = kiln_link::scan_symbols(name, input.bytes(), self.architecture())?;
        let functions: Vec<&str> = scanned.functions.iter().map(|n| &**n).collect();
        if functions.is_empty() {
            return Err(Error::Unsupported(format!(
                "{name} defines no function of default visibility to link swappably"
            )));
        }
        let stubs = self.add_lazy_functions(lib, &functions, Arc::new(LinkedWithTheirObject))?;
        let addresses = functions
            .iter()
            .map(|&f| Some((Box::<str>::from(f), stubs.symbol(f)?)))
            .collect::<Option<_>>();
        let Some(addresses) = addresses else {
            let _ = self.remove_module(&stubs);
            return Err(Error::Unsupported(format!(
                "the stubs of {name} publish not every function's name"
            )));
        };
        let through = CallsThrough {
            stubs: stubs.clone(),
            addresses,
        };
        let request = LinkRequest {
            through: Some(&through),
            ..LinkRequest::module().with(input)
        };
        let module = match self.link(lib, request) {
            Ok(Some((module, _))) => module,
            Ok(None) => {
                let _ = self.remove_module(&stubs);
                return Err(Error::Executor("nothing was linked".into()));
            }
            Err(error) => {
                let _ = self.remove_module(&stubs);
                return Err(error);
            }
        };
        for &function in &functions {
            let body = module.symbol(function).ok_or_else(|| Error::LazyCompile {
                function: function.to_string(),
                source: format!("{name}'s link lists no body of it").into(),
            });
            let set = body.and_then(|body| self.set_function_body(lib, function, body, &module));
            if let Err(error) = set {
                let _ = self.remove_modules(&[stubs, module]);
                return Err(error);
            }
        }
        Ok(SwappableModule { stubs, module })
    }
}
