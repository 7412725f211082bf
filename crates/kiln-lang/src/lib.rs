//! # kiln-lang
//!
//! A small expression language, compiled function by function with Cranelift into ELF
//! objects and linked by Kiln — lazily: each function is a call-through stub until its
//! first call compiles it ([`kiln::Jit::add_lazy_functions`]), and redefining a function
//! replaces its body while the program runs ([`kiln::Jit::replace_function`]).
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

use codegen::{Callee, Callees, CompileError};
use cranelift_codegen::isa::TargetIsa;
use kiln::{CodeThread, Jit, LazyCompiler, LibraryId};
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
    pub debug: kiln::DebugSupport,
    /// Run the program in an executor listening at this address (`kiln-executor --listen`
    /// or executor-c, on this machine, under qemu or Wine, or on another machine): its
    /// functions are compiled for the executor's architecture and linked into it; a first
    /// call made there compiles through the connection.
    pub connect: Option<String>,
    /// The executor's key (its `--key-file`'s); `None` connects in plaintext, which only an
    /// executor started with `--no-auth` accepts.
    pub key: Option<kiln::Key>,
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

/// Compiles a function from its definition, on its first call.
struct Compiler {
    definitions: Arc<RwLock<Definitions>>,
    isa: Arc<dyn TargetIsa>,
    compiled: AtomicUsize,
}

impl LazyCompiler for Compiler {
    fn compile(&self, name: &str) -> Result<Vec<u8>, kiln::CompileError> {
        let definitions = self.definitions.read();
        let f = definitions
            .functions
            .get(name)
            .ok_or_else(|| format!("no function {name}"))?;
        let object = codegen::compile_object(&self.isa, &f.function()?, &*definitions)?;
        self.compiled.fetch_add(1, Ordering::Relaxed);
        Ok(object)
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

/// A program being run: a Kiln session, the definitions, the Cranelift ISA.
pub struct Runtime {
    jit: Jit,
    lib: LibraryId,
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
        let mut builder = Jit::builder().debug_support(options.debug);
        if let Some(address) = &options.connect {
            builder = builder.executor(kiln::Executor::connect_with_key(
                address,
                options.key.as_ref(),
                Default::default(),
            )?);
        }
        let jit = builder.build()?;
        let remote = options.connect.is_some();
        let lib = jit.main_library();
        jit.add_process_symbols(lib)?;
        let definitions = Arc::new(RwLock::new(Definitions::default()));
        let isa = if remote {
            codegen::isa_for(jit.architecture()).map_err(LangError::Usage)?
        } else {
            jit.define_symbol(lib, "print", kiln_lang_print as *const () as u64)?;
            definitions.write().externs.insert(
                "print".into(),
                Extern {
                    name: "print".into(),
                    params: vec![Type::I64],
                    result: Type::I64,
                },
            );
            codegen::host_isa(true).map_err(LangError::Usage)?
        };
        let thread = jit.register_thread();
        let mut runtime = Runtime {
            lib,
            compiler: Arc::new(Compiler {
                definitions,
                isa,
                compiled: AtomicUsize::new(0),
            }),
            thread,
            eager: options.eager,
            remote,
            expressions: 0,
            jit,
        };
        if remote {
            runtime.load(REMOTE_PRELUDE)?;
        }
        Ok(runtime)
    }

    /// The Kiln session (for its statistics, plugins, …).
    pub fn jit(&self) -> &Jit {
        &self.jit
    }

    /// The library the program's functions are defined in.
    pub fn library(&self) -> LibraryId {
        self.lib
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

    /// Links the functions a load defined and replaced. On an error, the names whose
    /// definitions must go back to what they were (nothing of theirs was linked).
    fn link_functions(
        &mut self,
        new: &[String],
        replaced: &[String],
    ) -> Result<(), (LangError, Vec<String>)> {
        let definitions = self.compiler.definitions.read();
        let everything = || new.iter().chain(replaced).cloned().collect::<Vec<_>>();
        let compile = |name: &String| {
            let f = definitions.functions[name].function()?;
            codegen::compile_object(&self.compiler.isa, &f, &*definitions).map_err(LangError::from)
        };
        if self.eager {
            // Every object compiled before any is added: an error leaves nothing pending.
            let objects = new
                .iter()
                .map(compile)
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| (e, everything()))?;
            for (name, object) in new.iter().zip(objects) {
                self.compiler.compiled.fetch_add(1, Ordering::Relaxed);
                self.jit
                    .add_object(self.lib, name, object)
                    .map_err(|e| (e.into(), everything()))?;
            }
            // A failed link drops what was pending: nothing of this load stays.
            self.jit
                .link_pending(self.lib)
                .map_err(|e| (e.into(), everything()))?;
            return Ok(());
        }
        // Replacements compiled first: a compile error changes nothing.
        let bodies = replaced
            .iter()
            .map(compile)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| (e, everything()))?;
        if !new.is_empty() {
            let names: Vec<&str> = new.iter().map(String::as_str).collect();
            self.jit
                .add_lazy_functions(self.lib, &names, self.compiler.clone())
                .map_err(|e| (e.into(), everything()))?;
        }
        for (i, (name, object)) in replaced.iter().zip(bodies).enumerate() {
            self.compiler.compiled.fetch_add(1, Ordering::Relaxed);
            // The new functions and the replacements before this one stand.
            self.jit
                .replace_function(self.lib, name, object)
                .map_err(|e| (e.into(), replaced[i..].to_vec()))?;
        }
        Ok(())
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
        let object = {
            let definitions = self.compiler.definitions.read();
            codegen::compile_object(&self.compiler.isa, &f, &*definitions).map_err(|mut e| {
                // The wrapper's name means nothing to the user.
                e.function = "expression".into();
                e
            })?
        };
        let module = self.jit.link_object(self.lib, &f.name, object)?;
        let result = self.call(&f.name, &[]);
        self.jit.remove_module(&module)?;
        result
    }

    /// Calls function `name` (a function of the program, or an expression's) with `args`
    /// (at most 6), under a guard of this thread: a body replaced meanwhile stays mapped
    /// until the call returns.
    pub fn call(&self, name: &str, args: &[i64]) -> Result<i64, LangError> {
        let address = self.jit.lookup(self.lib, name)?;
        let _guard = self.thread.pin();
        type F0 = extern "C" fn() -> i64;
        type F1 = extern "C" fn(i64) -> i64;
        type F2 = extern "C" fn(i64, i64) -> i64;
        type F3 = extern "C" fn(i64, i64, i64) -> i64;
        type F4 = extern "C" fn(i64, i64, i64, i64) -> i64;
        type F5 = extern "C" fn(i64, i64, i64, i64, i64) -> i64;
        type F6 = extern "C" fn(i64, i64, i64, i64, i64, i64) -> i64;
        let arity = self
            .compiler
            .definitions
            .read()
            .functions
            .get(name)
            .map_or(args.len(), Definition::arity);
        if arity != args.len() {
            return Err(LangError::Usage(format!(
                "'{name}' takes {}, given {}",
                codegen::count(arity, "argument"),
                args.len()
            )));
        }
        if self.remote {
            // The executor guards its own threads while the call runs.
            let args: Vec<u64> = args.iter().map(|&a| a as u64).collect();
            // SAFETY: every function of the language (and every expression) is compiled
            // with the signature `extern "C" fn(i64 × arity) -> i64`, checked above, for
            // the executor's architecture, and lies in the executor's memory.
            let result = unsafe { self.jit.executor().call(address, &args) }? as i64;
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
        if let Some(failure) = self.jit.lazy_failures().into_iter().next() {
            return Err(LangError::Usage(format!(
                "compiling {} failed: {}",
                failure.function, failure.error
            )));
        }
        Ok(result)
    }
}
