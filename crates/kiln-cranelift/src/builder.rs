//! `KilnBuilder`: what `cranelift_jit::JITBuilder` takes, with the same methods, and a
//! Kiln session of the caller's choosing.

use cranelift_codegen::ir;
use cranelift_codegen::isa::OwnedTargetIsa;
use cranelift_codegen::settings::{self, Configurable};
use cranelift_module::ModuleResult;
use std::collections::HashMap;

/// A lookup a [`KilnBuilder`] is given: the address of a name, or `None`.
pub(crate) type LookupFn = Box<dyn Fn(&str) -> Option<*const u8> + Send>;

/// A host address handed over by the caller (an address, not a reference this crate
/// dereferences).
#[derive(Debug, Clone, Copy)]
pub(crate) struct HostAddress(pub(crate) usize);

/// A builder for [`KilnModule`](crate::KilnModule), with `cranelift_jit::JITBuilder`'s
/// methods: switching from `JITModule` is a change of type names.
///
/// ```
/// use cranelift_module::default_libcall_names;
/// use kiln_cranelift::{KilnBuilder, KilnModule};
/// extern "C" fn host_square(x: i64) -> i64 { x * x }
/// let mut builder = KilnBuilder::new(default_libcall_names()).unwrap();
/// builder.symbol("host_square", host_square as *const u8);
/// let module = KilnModule::new(builder);
/// # drop(module);
/// ```
pub struct KilnBuilder {
    pub(crate) isa: OwnedTargetIsa,
    pub(crate) symbols: HashMap<String, HostAddress>,
    pub(crate) lookup_symbols: Vec<LookupFn>,
    pub(crate) libcall_names: Box<dyn Fn(ir::LibCall) -> String + Send + Sync>,
    pub(crate) session: Option<kiln::Jit>,
    pub(crate) process_symbols: bool,
    pub(crate) hot_swap: bool,
    pub(crate) code_cache: Option<std::sync::Arc<dyn kiln::cache::ObjectCache>>,
}

impl KilnBuilder {
    /// A builder for the host, with Cranelift's default flags (as
    /// `JITBuilder::new`). `libcall_names` names the functions Cranelift's legalization
    /// calls (`cranelift_module::default_libcall_names()` if unsure).
    pub fn new(
        libcall_names: Box<dyn Fn(ir::LibCall) -> String + Send + Sync>,
    ) -> ModuleResult<Self> {
        Self::with_flags(&[], libcall_names)
    }

    /// A builder for the host with `flags` set (as `JITBuilder::with_flags`: libcalls
    /// not colocated, code not position-independent — Kiln links either — and, unless
    /// `flags` says otherwise, thread-locals through the general-dynamic model, which
    /// Kiln resolves for every thread).
    pub fn with_flags(
        flags: &[(&str, &str)],
        libcall_names: Box<dyn Fn(ir::LibCall) -> String + Send + Sync>,
    ) -> ModuleResult<Self> {
        let mut flag_builder = settings::builder();
        flag_builder.set("use_colocated_libcalls", "false")?;
        flag_builder.set("is_pic", "false")?;
        if cfg!(target_os = "linux") && !flags.iter().any(|(name, _)| *name == "tls_model") {
            flag_builder.set("tls_model", "elf_gd")?;
        }
        for (name, value) in flags {
            flag_builder.set(name, value)?;
        }
        let isa_builder = cranelift_native::builder().map_err(|msg| {
            cranelift_module::ModuleError::Backend(anyhow::anyhow!(
                "the host machine is not supported by Cranelift: {msg}"
            ))
        })?;
        let isa = isa_builder.finish(settings::Flags::new(flag_builder))?;
        Ok(Self::with_isa(isa, libcall_names))
    }

    /// A builder for `isa` (as `JITBuilder::with_isa`). Its code runs where the session's
    /// executor runs: this process by default, or another one given with
    /// [`KilnBuilder::session`].
    pub fn with_isa(
        isa: OwnedTargetIsa,
        libcall_names: Box<dyn Fn(ir::LibCall) -> String + Send + Sync>,
    ) -> Self {
        KilnBuilder {
            isa,
            symbols: HashMap::new(),
            lookup_symbols: Vec::new(),
            libcall_names,
            session: None,
            process_symbols: true,
            hot_swap: false,
            code_cache: None,
        }
    }

    /// Defines `name` as `ptr` for the module's code (the most recent definition of a
    /// name wins). Tried before every lookup function and the process's symbols.
    pub fn symbol<K: Into<String>>(&mut self, name: K, ptr: *const u8) -> &mut Self {
        self.symbols.insert(name.into(), HostAddress(ptr as usize));
        self
    }

    /// [`KilnBuilder::symbol`] for each pair.
    pub fn symbols<It, K>(&mut self, symbols: It) -> &mut Self
    where
        It: IntoIterator<Item = (K, *const u8)>,
        K: Into<String>,
    {
        for (name, ptr) in symbols {
            self.symbol(name, ptr);
        }
        self
    }

    /// Adds a lookup for names neither the module nor [`KilnBuilder::symbol`] defines.
    /// Lookups are tried newest first; the process's own symbols (`dlsym`) come last.
    pub fn symbol_lookup_fn(&mut self, symbol_lookup_fn: LookupFn) -> &mut Self {
        self.lookup_symbols.push(symbol_lookup_fn);
        self
    }

    /// Links into `session` instead of a new in-process one: a session whose executor is
    /// another process (`kiln-executor`, or executor-c under qemu for another
    /// architecture: give an `isa` for it with [`KilnBuilder::with_isa`]), with debug
    /// support (gdb, perf map, jitdump), an object cache, or plugins.
    pub fn session(&mut self, session: kiln::Jit) -> &mut Self {
        self.session = Some(session);
        self
    }

    /// Hot swap (off by default): every function is called through a call-through stub
    /// (one indirect jump more per call), so that a finalized function can be defined
    /// again — `define_function` on its id, then `finalize_definitions` — while it runs:
    /// callers reach the new body, and the old one is freed once no thread runs it (the
    /// session's code guards: [`kiln::Jit::register_thread`]). A freed function's stub
    /// leads to a trap.
    pub fn hot_swap(&mut self, on: bool) -> &mut Self {
        self.hot_swap = on;
        self
    }

    /// Keeps compiled functions in `cache` (one of Kiln's object caches: a directory,
    /// `kiln_cache::DiskCache`, or Redis): [`KilnModule::define_function_and_cache`] stores a
    /// function under the caller's key, and [`KilnModule::define_function_from_cache`]
    /// defines it again — in a later process too — without compiling.
    ///
    /// [`KilnModule::define_function_and_cache`]: crate::KilnModule::define_function_and_cache
    /// [`KilnModule::define_function_from_cache`]: crate::KilnModule::define_function_from_cache
    pub fn code_cache(&mut self, cache: std::sync::Arc<dyn kiln::cache::ObjectCache>) -> &mut Self {
        self.code_cache = Some(cache);
        self
    }

    /// Whether names nothing else defines are looked up in the executor's process
    /// (`dlsym`; on by default, as `JITBuilder` does).
    pub fn process_symbols(&mut self, on: bool) -> &mut Self {
        self.process_symbols = on;
        self
    }
}
