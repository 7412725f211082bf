//! # kiln-lang
//!
//! A small expression language, compiled function by function with Cranelift and linked
//! by Kiln through kiln-cranelift's [`KilnModule`] (no object file on the way) — lazily:
//! each function is a call-through stub until its first call compiles it
//! ([`KilnModule::declare_lazy_function`]), and redefining a function replaces its body
//! while the program runs (the module's hot swap: `define_function` on the finalized
//! function, then `finalize_definitions`).
//!
//! ```
//! # fn main() -> Result<(), kiln_lang::LangError> {
//! # if !cfg!(target_arch = "x86_64") { return Ok(()); }
//! let mut rt = kiln_lang::Runtime::new(kiln_lang::Options::default())?;
//! rt.load("fn square(x) = x * x; fn unused(x) = x;")?;
//! assert_eq!(rt.call("square", &[12])?, 144);
//! assert_eq!(rt.compiled_functions(), 1); // `unused` never compiled
//! assert_eq!(rt.load("square(3) + 1;")?, vec![Outcome::Value(10)]);
//! # use kiln_lang::Outcome;
//! # Ok(()) }
//! ```
//!
//! The language is in [`syntax`]; the code generator, usable with any Cranelift module,
//! in [`codegen`].

// Errors wrap Kiln's, which are large by design (link errors carry their context).
#![allow(clippy::result_large_err)]

pub mod check;
pub mod codegen;
pub mod syntax;

use codegen::{Callee, Callees, CompileError, Imports};
use cranelift_codegen::ir::{self, FuncRef, Signature};
use cranelift_codegen::isa::CallConv;
use cranelift_frontend::FunctionBuilderContext;
use cranelift_module::{FuncId, Linkage, Module, ModuleError};
use kiln::{lazy::CodeThread, Jit, LibraryId};
use kiln_cranelift::{KilnBuilder, KilnModule, LazyCompile, LazyContext};
use parking_lot::RwLock;
use rustc_hash::FxHashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use syntax::{Extern, Function, FunctionOutline, OutlineItem, SyntaxError, Type};

/// Why loading or running a program failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LangError {
    /// The source does not parse.
    #[error("syntax error at {0}")]
    Syntax(#[from] SyntaxError),
    /// A function uses a name wrongly, or Cranelift failed.
    #[error("{0}")]
    Compile(#[from] CompileError),
    /// Kiln failed to link or run.
    #[error(transparent)]
    Kiln(#[from] kiln::Error),
    /// The module refused a declaration or definition, or its link failed.
    #[error("{0}")]
    Module(#[from] ModuleError),
    /// A call the runtime cannot make, or a redefinition it refuses.
    #[error("{0}")]
    Usage(String),
}

/// How a [`Runtime`] links.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// Compile and link every function when it is defined, instead of on first call.
    pub eager: bool,
    /// Debugger and profiler support for the compiled functions (gdb, perf).
    pub debug: kiln::debug::DebugSupport,
    /// Run the program in an executor listening at this address (`kiln-executor --listen`
    /// or executor-c, on this machine, under qemu or Wine, or on another machine): its
    /// functions are compiled for the executor's architecture and linked into it; a first
    /// call made there compiles through the connection.
    pub connect: Option<String>,
    /// The executor's key (its `--key-file`'s); `None` connects in plaintext, which only an
    /// executor started with `--no-auth` accepts.
    pub key: Option<kiln::executor::Key>,
}

/// `print` where the program runs in another process (no host function reaches it):
/// written in the language, over the C library's `putchar` and `fflush`. Digits come
/// from the number made non-positive, so that `i64::MIN` prints too.
const REMOTE_PRELUDE: &str = "
extern fn putchar(c: i32) -> i32;
extern fn fflush(stream: i64) -> i32;
fn __kiln_lang_digits(x) = if x <= -10 then { __kiln_lang_digits(x / 10); putchar(48 - x % 10) } else putchar(48 - x);
fn print(x) = { if x < 0 then { putchar(45); __kiln_lang_digits(x) } else __kiln_lang_digits(0 - x); putchar(10); fflush(0); x };
";

/// What an item of a loaded source did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// A function was defined (lazily: it compiles on its first call).
    Defined(String),
    /// A function was given a new body (hot swap).
    Replaced(String),
    /// An `extern` was declared.
    Declared(String),
    /// An expression was evaluated.
    Value(i64),
}

/// A function defined: its header and where its body lies in the source it was loaded
/// from. The body is read (into a tree) only when the function is compiled: a lazy
/// runtime's load checks every body's syntax and names without building one.
#[derive(Clone)]
struct Definition {
    outline: FunctionOutline,
    /// The source loaded (shared by every function of one load).
    source: Arc<str>,
}

impl Definition {
    fn arity(&self) -> usize {
        self.outline.params.len()
    }

    /// The function with its body built.
    fn function(&self) -> Result<Function, CompileError> {
        syntax::parse_body(&self.source, &self.outline).map_err(|e| CompileError {
            function: self.outline.name.clone(),
            position: e.position,
            message: e.message,
        })
    }
}

/// The functions and externs defined so far.
#[derive(Default)]
struct Definitions {
    functions: FxHashMap<String, Definition>,
    externs: FxHashMap<String, Extern>,
}

impl Callees for Definitions {
    fn callee(&self, name: &str) -> Option<Callee> {
        if let Some(f) = self.functions.get(name) {
            return Some(Callee::Function(f.arity()));
        }
        self.externs.get(name).cloned().map(Callee::Extern)
    }

    fn arity(&self, name: &str) -> Option<usize> {
        match self.functions.get(name) {
            Some(f) => Some(f.arity()),
            None => self.externs.get(name).map(|x| x.params.len()),
        }
    }
}

/// Compiles the program's functions from their definitions: on their first call (lazy),
/// or when they are defined.
struct Compiler {
    definitions: Arc<RwLock<Definitions>>,
    compiled: AtomicUsize,
    /// The module's ids of the program's functions and externs, by name: what calls refer
    /// to.
    ids: RwLock<FxHashMap<String, FuncId>>,
    /// The target's calling convention (lazy compiles' signatures).
    call_conv: CallConv,
}

/// A lazy compile's calls: to the module's functions by id (the program's stubs, the
/// externs' imports).
struct LazyImports<'a> {
    ids: &'a FxHashMap<String, FuncId>,
    definitions: &'a Definitions,
    call_conv: CallConv,
}

impl Imports for LazyImports<'_> {
    fn new_signature(&self) -> Signature {
        Signature::new(self.call_conv)
    }

    fn import(
        &mut self,
        func: &mut ir::Function,
        name: &str,
        signature: &Signature,
    ) -> Result<FuncRef, String> {
        let id = *self
            .ids
            .get(name)
            .ok_or_else(|| format!("'{name}' is not declared in the module"))?;
        let signature = func.import_signature(signature.clone());
        let user = func.declare_imported_user_function(ir::UserExternalName {
            namespace: 0,
            index: id.as_u32(),
        });
        // The program's functions are the module's own (colocated, as `KilnModule`'s
        // `declare_func_in_func` makes them); externs come from elsewhere.
        let colocated = self.definitions.functions.contains_key(name);
        Ok(func.import_function(ir::ExtFuncData {
            name: ir::ExternalName::user(user),
            signature,
            colocated,
            patchable: false,
        }))
    }
}

impl Compiler {
    /// The callback that compiles function `name` on its first call.
    fn lazy(self: &Arc<Self>, name: String) -> LazyCompile {
        let compiler = self.clone();
        Arc::new(move |ctx: &mut LazyContext<'_>| {
            let definitions = compiler.definitions.read();
            let f = definitions
                .functions
                .get(&name)
                .ok_or_else(|| format!("no function {name}"))?
                .function()
                .map_err(|e| e.to_string())?;
            let ids = compiler.ids.read();
            let mut imports = LazyImports {
                ids: &ids,
                definitions: &definitions,
                call_conv: compiler.call_conv,
            };
            let config = ctx.target_config();
            let mut builder_context = FunctionBuilderContext::new();
            codegen::build(
                ctx.func,
                &mut builder_context,
                &f,
                &*definitions,
                &mut imports,
                config,
            )
            .map_err(|e| e.to_string())?;
            compiler.compiled.fetch_add(1, Ordering::Relaxed);
            Ok(())
        })
    }
}

/// Puts back the definitions `previous` records (newest last) for the names `which` picks.
fn undo(
    definitions: &mut Definitions,
    previous: Vec<(String, Option<Definition>)>,
    which: impl Fn(&str) -> bool,
) {
    for (name, old) in previous.into_iter().rev() {
        if !which(&name) {
            continue;
        }
        match old {
            Some(f) => definitions.functions.insert(name, f),
            None => definitions.functions.remove(&name),
        };
    }
}

/// The name in the last outcome (an extern just declared).
fn outcomes_name(outcomes: &[Outcome]) -> String {
    match outcomes.last() {
        Some(Outcome::Declared(name)) => name.clone(),
        _ => String::new(),
    }
}

/// `print(x)`: prints `x` and a newline; returns `x`.
extern "C" fn kiln_lang_print(x: i64) -> i64 {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{x}");
    let _ = out.flush();
    x
}

/// A program being run: its functions in a [`KilnModule`] (and so a Kiln session), the
/// definitions.
pub struct Runtime {
    module: KilnModule,
    compiler: Arc<Compiler>,
    thread: CodeThread,
    eager: bool,
    /// The program runs in an executor process ([`Options::connect`]).
    remote: bool,
    expressions: usize,
}

impl Runtime {
    /// A runtime with the built-in `print` and the process's C library as externs.
    ///
    /// With [`Options::connect`], the program runs in that executor: compiled for its
    /// architecture, with the executor's C library as externs and a `print` of the
    /// language's own (a function of the program, compiled on first call like the rest).
    pub fn new(options: Options) -> Result<Self, LangError> {
        let mut session = Jit::builder().debug_support(options.debug);
        if let Some(address) = &options.connect {
            session = session.executor(kiln::Executor::connect_with_key(
                address,
                options.key.as_ref(),
                Default::default(),
            )?);
        }
        let session = session.build()?;
        let remote = options.connect.is_some();
        let isa = if remote {
            codegen::isa_for(session.architecture()).map_err(LangError::Usage)?
        } else {
            codegen::host_isa(true).map_err(LangError::Usage)?
        };
        let call_conv = isa.default_call_conv();
        let mut builder = KilnBuilder::with_isa(isa, cranelift_module::default_libcall_names());
        // Lazy: every function behind a stub, compiled on first call and redefinable.
        builder.session(session).hot_swap(!options.eager);
        if !remote {
            builder.symbol("print", kiln_lang_print as *const u8);
        }
        let module = KilnModule::try_new(builder)?;
        let thread = module.session().register_thread();
        let mut runtime = Runtime {
            module,
            compiler: Arc::new(Compiler {
                definitions: Arc::new(RwLock::new(Definitions::default())),
                compiled: AtomicUsize::new(0),
                ids: RwLock::new(FxHashMap::default()),
                call_conv,
            }),
            thread,
            eager: options.eager,
            remote,
            expressions: 0,
        };
        if !remote {
            let print = Extern {
                name: "print".into(),
                params: vec![Type::I64],
                result: Type::I64,
            };
            runtime.declare_extern(&print)?;
            let mut definitions = runtime.compiler.definitions.write();
            definitions.externs.insert(print.name.clone(), print);
        }
        if remote {
            runtime.load(REMOTE_PRELUDE)?;
        }
        Ok(runtime)
    }

    /// The Kiln session (for its statistics, plugins, …).
    pub fn jit(&self) -> &Jit {
        self.module.session()
    }

    /// The session's library the program's functions are defined in.
    pub fn library(&self) -> LibraryId {
        self.module.library()
    }

    /// The module the program's functions are defined in.
    pub fn module(&self) -> &KilnModule {
        &self.module
    }

    /// Declares extern `x` in the module (an import), for calls to refer to.
    fn declare_extern(&mut self, x: &Extern) -> Result<(), LangError> {
        let signature = codegen::extern_signature(self.module.make_signature(), x);
        let id = self
            .module
            .declare_function(&x.name, Linkage::Import, &signature)?;
        self.compiler.ids.write().insert(x.name.clone(), id);
        Ok(())
    }

    /// Functions compiled so far (lazily or eagerly).
    pub fn compiled_functions(&self) -> usize {
        self.compiler.compiled.load(Ordering::Relaxed)
    }

    /// Functions defined so far.
    pub fn defined_functions(&self) -> usize {
        self.compiler.definitions.read().functions.len()
    }

    /// Whether `name` is a function of the program.
    pub fn has_function(&self, name: &str) -> bool {
        self.compiler
            .definitions
            .read()
            .functions
            .contains_key(name)
    }

    /// Loads a source: declares its externs, defines its functions (all checked first: a
    /// source with an error defines nothing) and evaluates its expressions in order.
    /// Redefining a function with the same number of parameters replaces its body.
    ///
    /// Every body's syntax and names are checked here, in one pass over the source that
    /// builds no tree ([`check::parse_checked`]); a body is read into a tree only when the
    /// function is compiled (on its first call, or here if the runtime is eager).
    pub fn load(&mut self, source: &str) -> Result<Vec<Outcome>, LangError> {
        // Bodies are checked, not built: each is read into a tree when it is compiled.
        // Their names are read in the same pass, checked below once every function of
        // this load is known.
        let (items, names) = check::parse_checked(source)?;
        let text = source;
        let source: Arc<str> = Arc::from(source);
        let mut outcomes = Vec::with_capacity(items.len());
        let mut new = Vec::new();
        let mut replaced = Vec::new();
        let mut expressions = Vec::new();
        let previous = {
            let mut definitions = self.compiler.definitions.write();
            // What this load changed, to put back if it fails.
            let mut previous_functions: Vec<(String, Option<Definition>)> = Vec::new();
            // The number of each function among this source's (its body's in `names`),
            // and where its body starts.
            let mut bodies = Vec::new();
            let mut previous_externs: Vec<(String, Option<Extern>)> = Vec::new();
            let mut failure = None;
            for item in items {
                match item {
                    OutlineItem::Extern(x) => {
                        outcomes.push(Outcome::Declared(x.name.clone()));
                        let old = definitions.externs.insert(x.name.clone(), x);
                        let name = outcomes_name(&outcomes);
                        previous_externs.push((name, old));
                    }
                    OutlineItem::Function(f) => {
                        let refused = if definitions.externs.contains_key(&f.name) {
                            Some(format!("{}: '{}' is an extern", f.position, f.name))
                        } else {
                            match definitions.functions.get(&f.name) {
                                Some(old) if old.arity() != f.params.len() => Some(format!(
                                    "{}: '{}' has {}; a new body must keep them (its callers are compiled)",
                                    f.position, f.name, codegen::count(old.arity(), "parameter")
                                )),
                                Some(_) if self.eager => Some(format!(
                                    "{}: '{}' is defined already (redefinition needs lazy mode)",
                                    f.position, f.name
                                )),
                                _ => None,
                            }
                        };
                        if let Some(message) = refused {
                            failure = Some(LangError::Usage(message));
                            break;
                        }
                        bodies.push((bodies.len(), f.body.start));
                        let name = f.name.clone();
                        let definition = Definition {
                            outline: f,
                            source: source.clone(),
                        };
                        let old = definitions.functions.insert(name.clone(), definition);
                        if old.is_some() {
                            replaced.push(name.clone());
                            outcomes.push(Outcome::Replaced(name.clone()));
                        } else {
                            new.push(name.clone());
                            outcomes.push(Outcome::Defined(name.clone()));
                        }
                        previous_functions.push((name, old));
                    }
                    OutlineItem::Expr(e) => {
                        expressions.push((outcomes.len(), e));
                        outcomes.push(Outcome::Value(0));
                    }
                }
            }
            // Everything checked before anything is linked; on an error nothing changes.
            if failure.is_none() {
                failure = previous_functions
                    .iter()
                    .zip(&bodies)
                    .try_for_each(|((name, _), &(body, start))| {
                        let f = &definitions.functions[name];
                        // A body defined again later in this source is never compiled.
                        if f.outline.body.start != start {
                            return Ok(());
                        }
                        names.check(body, text, &f.outline, &*definitions)
                    })
                    .err()
                    .map(LangError::from);
            }
            if let Some(error) = failure {
                undo(&mut definitions, previous_functions, |_| true);
                for (name, old) in previous_externs.into_iter().rev() {
                    match old {
                        Some(x) => definitions.externs.insert(name, x),
                        None => definitions.externs.remove(&name),
                    };
                }
                return Err(error);
            }
            previous_functions
        };
        let externs: Vec<Extern> = {
            let definitions = self.compiler.definitions.read();
            outcomes
                .iter()
                .filter_map(|o| match o {
                    Outcome::Declared(name) => definitions.externs.get(name).cloned(),
                    _ => None,
                })
                .collect()
        };
        for x in &externs {
            self.declare_extern(x)?;
        }
        if let Err((error, revert)) = self.link_functions(&new, &replaced) {
            let mut definitions = self.compiler.definitions.write();
            undo(&mut definitions, previous, |name| {
                revert.iter().any(|r| r == name)
            });
            return Err(error);
        }
        for (at, e) in expressions {
            outcomes[at] = Outcome::Value(self.evaluate(e)?);
        }
        Ok(outcomes)
    }

    /// Builds function `name`'s body into a new context of the module (declaring what it
    /// calls).
    fn build(&mut self, name: &str) -> Result<cranelift_codegen::Context, LangError> {
        let definitions = self.compiler.definitions.read();
        let f = definitions.functions[name].function()?;
        let mut context = self.module.make_context();
        let config = self.module.target_config();
        codegen::build(
            &mut context.func,
            &mut FunctionBuilderContext::new(),
            &f,
            &*definitions,
            &mut self.module,
            config,
        )?;
        Ok(context)
    }

    /// Declares function `name` of the program (exported) in the module.
    fn declare(&mut self, name: &str) -> Result<FuncId, LangError> {
        let arity = self.compiler.definitions.read().functions[name].arity();
        let signature = codegen::signature(&self.module, arity);
        let id = self
            .module
            .declare_function(name, Linkage::Export, &signature)?;
        self.compiler.ids.write().insert(name.to_string(), id);
        Ok(id)
    }

    /// Links the functions a load defined and replaced. On an error, the names whose
    /// definitions must go back to what they were (nothing of theirs was linked).
    fn link_functions(
        &mut self,
        new: &[String],
        replaced: &[String],
    ) -> Result<(), (LangError, Vec<String>)> {
        let everything = || new.iter().chain(replaced).cloned().collect::<Vec<_>>();
        if self.eager {
            // Every body built before any is defined: an error leaves nothing pending.
            let contexts = new
                .iter()
                .map(|name| self.build(name))
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| (e, everything()))?;
            for (name, mut context) in new.iter().zip(contexts) {
                let id = self.declare(name).map_err(|e| (e, everything()))?;
                self.module
                    .define_function(id, &mut context)
                    .map_err(|e| (e.into(), everything()))?;
                self.compiler.compiled.fetch_add(1, Ordering::Relaxed);
            }
            // A failed finalize drops what was pending: nothing of this load stays.
            return self
                .module
                .finalize_definitions()
                .map_err(|e| (e.into(), everything()));
        }
        // Replacements built first: an error changes nothing.
        let bodies = replaced
            .iter()
            .map(|name| self.build(name))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| (e, everything()))?;
        for name in new {
            let arity = self.compiler.definitions.read().functions[name].arity();
            let signature = codegen::signature(&self.module, arity);
            let compile = self.compiler.lazy(name.clone());
            let id = self
                .module
                .declare_lazy_function(name, Linkage::Export, &signature, compile)
                .map_err(|e| (e.into(), everything()))?;
            self.compiler.ids.write().insert(name.clone(), id);
        }
        if replaced.is_empty() {
            return Ok(());
        }
        // The new functions stand; the replacements are one finalize (all or none).
        for (name, mut context) in replaced.iter().zip(bodies) {
            let id = self.compiler.ids.read()[name];
            self.module
                .define_function(id, &mut context)
                .map_err(|e| (e.into(), replaced.to_vec()))?;
            self.compiler.compiled.fetch_add(1, Ordering::Relaxed);
        }
        self.module
            .finalize_definitions()
            .map_err(|e| (e.into(), replaced.to_vec()))
    }

    /// Compiles `e` as a function of no parameters, links it, calls it and frees it.
    fn evaluate(&mut self, e: syntax::Expr) -> Result<i64, LangError> {
        self.expressions += 1;
        let f = Function {
            name: format!("__kiln_lang_expression_{}", self.expressions),
            params: Vec::new(),
            body: e,
            position: syntax::Position { line: 1, column: 1 },
        };
        let id = {
            let definitions = self.compiler.definitions.read();
            let mut context = self.module.make_context();
            codegen::define(
                &mut self.module,
                &mut context,
                &mut FunctionBuilderContext::new(),
                &f,
                &*definitions,
                Linkage::Export,
            )
            .map_err(|mut e| {
                // The wrapper's name means nothing to the user.
                e.function = "expression".into();
                e
            })?
        };
        self.module.finalize_definitions()?;
        let address = self.module.get_finalized_function(id) as u64;
        let result = self.call_address(address, &[]);
        self.module.free_function(id)?;
        result
    }

    /// Calls function `name` (a function of the program, or an expression's) with `args`
    /// (at most 6), under a guard of this thread: a body replaced meanwhile stays mapped
    /// until the call returns.
    pub fn call(&self, name: &str, args: &[i64]) -> Result<i64, LangError> {
        let arity = self
            .compiler
            .definitions
            .read()
            .functions
            .get(name)
            .map(Definition::arity);
        let Some(arity) = arity else {
            return Err(LangError::Usage(format!("no function '{name}'")));
        };
        if arity != args.len() {
            return Err(LangError::Usage(format!(
                "'{name}' takes {}, given {}",
                codegen::count(arity, "argument"),
                args.len()
            )));
        }
        let id = self.compiler.ids.read().get(name).copied();
        let Some(id) = id else {
            return Err(LangError::Usage(format!("no function '{name}'")));
        };
        self.call_address(self.module.get_finalized_function(id) as u64, args)
    }

    /// Calls the function at `address` with `args` (its arity checked by the caller).
    fn call_address(&self, address: u64, args: &[i64]) -> Result<i64, LangError> {
        let _guard = self.thread.pin();
        type F0 = extern "C" fn() -> i64;
        type F1 = extern "C" fn(i64) -> i64;
        type F2 = extern "C" fn(i64, i64) -> i64;
        type F3 = extern "C" fn(i64, i64, i64) -> i64;
        type F4 = extern "C" fn(i64, i64, i64, i64) -> i64;
        type F5 = extern "C" fn(i64, i64, i64, i64, i64) -> i64;
        type F6 = extern "C" fn(i64, i64, i64, i64, i64, i64) -> i64;
        if self.remote {
            // The executor guards its own threads while the call runs.
            let args: Vec<u64> = args.iter().map(|&a| a as u64).collect();
            // SAFETY: every function of the language (and every expression) is compiled
            // with the signature `extern "C" fn(i64 × arity) -> i64`, checked above, for
            // the executor's architecture, and lies in the executor's memory.
            let result = unsafe { self.module.session().executor().call(address, &args) }? as i64;
            return self.no_failed_compile(result);
        }
        let a = |i: usize| args[i];
        // SAFETY: every function of the language (and every expression) is compiled with
        // the signature `extern "C" fn(i64 × arity) -> i64`, checked above; it runs in this
        // process, kept by the session, and under this thread's guard.
        let result = unsafe {
            let p = address as usize;
            match args.len() {
                0 => std::mem::transmute::<usize, F0>(p)(),
                1 => std::mem::transmute::<usize, F1>(p)(a(0)),
                2 => std::mem::transmute::<usize, F2>(p)(a(0), a(1)),
                3 => std::mem::transmute::<usize, F3>(p)(a(0), a(1), a(2)),
                4 => std::mem::transmute::<usize, F4>(p)(a(0), a(1), a(2), a(3)),
                5 => std::mem::transmute::<usize, F5>(p)(a(0), a(1), a(2), a(3), a(4)),
                6 => std::mem::transmute::<usize, F6>(p)(a(0), a(1), a(2), a(3), a(4), a(5)),
                n => {
                    return Err(LangError::Usage(format!(
                        "calls from the host take at most 6 arguments, given {n}"
                    )))
                }
            }
        };
        self.no_failed_compile(result)
    }

    /// `result`, unless a compile on first call failed meanwhile.
    fn no_failed_compile(&self, result: i64) -> Result<i64, LangError> {
        if let Some(failure) = self.module.session().lazy_failures().into_iter().next() {
            return Err(LangError::Usage(format!(
                "compiling {} failed: {}",
                failure.function, failure.error
            )));
        }
        Ok(result)
    }
}
