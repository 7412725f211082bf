//! MCJIT engines whose sections live in Kiln's memory.

use kiln_memory::{
    AllocationRequest, FinalizedAllocation, InFlightAllocation, MemoryManager, Permission,
    SegmentRequest, SlabMemoryManager,
};
use llvm_sys::core::LLVMDisposeMessage;
use llvm_sys::execution_engine::{
    LLVMCreateMCJITCompilerForModule, LLVMDisposeExecutionEngine, LLVMExecutionEngineRef,
    LLVMGetFunctionAddress, LLVMInitializeMCJITCompilerOptions, LLVMLinkInMCJIT,
    LLVMMCJITCompilerOptions, LLVMMCJITMemoryManagerRef,
};
use llvm_sys::prelude::LLVMModuleRef;
use llvm_sys::target::{LLVM_InitializeNativeAsmPrinter, LLVM_InitializeNativeTarget};
use parking_lot::Mutex;
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::sync::{Arc, Once};

/// Why compiling with Kiln's memory failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// LLVM refused to create the engine.
    #[error("creating the MCJIT engine: {0}")]
    Engine(String),
    /// Kiln could not allocate (or finalize) memory for a section; LLVM was told and the
    /// module's code must not run.
    #[error("memory for the module: {0}")]
    Memory(String),
    /// The function is not in the module.
    #[error("function '{0}' not found in the module")]
    FunctionNotFound(String),
}

type AllocateFn = extern "C" fn(*mut c_void, usize, u32, u32, c_int, *mut u64) -> *mut u8;
type FinalizeFn = extern "C" fn(*mut c_void, *mut *mut c_char) -> c_int;
type DestroyFn = extern "C" fn(*mut c_void);
type ResolveFn = extern "C" fn(*mut c_void, *const c_char) -> u64;

extern "C" {
    fn kiln_mcjit_memory_manager(
        ctx: *mut c_void,
        allocate: AllocateFn,
        finalize: FinalizeFn,
        destroy: DestroyFn,
        resolve: ResolveFn,
    ) -> LLVMMCJITMemoryManagerRef;
    fn kiln_shared_section_memory_manager_create() -> *mut c_void;
    fn kiln_shared_section_memory_manager_destroy(shared: *mut c_void);
    fn kiln_shared_section_forwarder(shared: *mut c_void) -> LLVMMCJITMemoryManagerRef;
}

/// Nanoseconds spent in Kiln's memory-manager callbacks (allocate, finalize) so far, in
/// this process.
pub fn memory_manager_nanos() -> u64 {
    MM_NANOS.load(std::sync::atomic::Ordering::Relaxed)
}

static MM_NANOS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

fn count_time(start: std::time::Instant) {
    MM_NANOS.fetch_add(
        start.elapsed().as_nanos() as u64,
        std::sync::atomic::Ordering::Relaxed,
    );
}

/// Initializes LLVM's native target and MCJIT, once per process.
pub fn initialize_llvm() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // SAFETY: LLVM's initializers, called once before any engine is made.
        unsafe {
            LLVMLinkInMCJIT();
            LLVM_InitializeNativeTarget();
            LLVM_InitializeNativeAsmPrinter();
        }
    });
}

/// A resolver for the modules' external symbols: name → address (`None` falls back to the
/// process's symbols).
pub type Resolver = Arc<dyn Fn(&str) -> Option<u64> + Send + Sync>;

/// One module's memory: in flight while LLVM writes it, then finalized and owned by the
/// client's [`ModuleCode`].
#[derive(Default)]
struct ModuleMemory {
    in_flight: Vec<InFlightAllocation>,
    finalized: Vec<FinalizedAllocation>,
    /// Where LLVM writes when Kiln could not allocate (never run).
    scratch: Vec<Box<[u128]>>,
    error: Option<String>,
}

/// The code of one module: keeps its memory alive after the engine, the module and the
/// context are disposed; dropping it frees the memory (coalesced, poisoned, pages returned
/// as Kiln's memory layer does).
pub struct ModuleCode {
    memory: Arc<Mutex<ModuleMemory>>,
}

impl ModuleCode {
    /// The error of an allocation LLVM asked for, if one failed.
    pub fn error(&self) -> Option<String> {
        self.memory.lock().error.clone()
    }

    /// Number of sections placed in Kiln's memory.
    pub fn sections(&self) -> usize {
        self.memory.lock().finalized.len()
    }
}

struct CallbackContext {
    manager: SlabMemoryManager,
    memory: Arc<Mutex<ModuleMemory>>,
    resolver: Option<Resolver>,
}

extern "C" fn allocate_section(
    ctx: *mut c_void,
    size: usize,
    align: u32,
    _section_id: u32,
    kind: c_int,
    target: *mut u64,
) -> *mut u8 {
    let start = std::time::Instant::now();
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        // SAFETY: `ctx` is the CallbackContext this manager was created with, alive until
        // the destroy callback.
        let ctx = unsafe { &*(ctx as *const CallbackContext) };
        let permission = match kind {
            0 => Permission::ReadExecute,
            1 => Permission::Read,
            _ => Permission::ReadWrite,
        };
        let align = u64::from(align.max(1)).next_power_of_two();
        let request =
            AllocationRequest::new().segment(SegmentRequest::new(permission, size as u64, align));
        let mut memory = ctx.memory.lock();
        match ctx.manager.allocate(&request) {
            Ok(mut in_flight) => {
                let address = in_flight.target(0).unwrap_or(0);
                let working = in_flight
                    .working_memory(0)
                    .map_or(std::ptr::null_mut(), |w| w.as_mut_ptr());
                memory.in_flight.push(in_flight);
                (working, address)
            }
            Err(error) => {
                // LLVM 14 aborts the process if a section allocation returns null; give it
                // scratch memory to write into and fail the module at finalize instead.
                if memory.error.is_none() {
                    memory.error = Some(format!("{permission} section of {size} bytes: {error}"));
                }
                let words = (size + align as usize).div_ceil(16).max(1);
                let mut scratch = vec![0u128; words].into_boxed_slice();
                let base = scratch.as_mut_ptr() as usize;
                let aligned = base.next_multiple_of(align as usize) as *mut u8;
                memory.scratch.push(scratch);
                (aligned, aligned as u64)
            }
        }
    }));
    count_time(start);
    match result {
        Ok((working, address)) => {
            // SAFETY: LLVM passes a valid out-pointer.
            unsafe { *target = address };
            working
        }
        Err(_) => std::ptr::null_mut(),
    }
}

extern "C" fn finalize_memory(ctx: *mut c_void, error: *mut *mut c_char) -> c_int {
    let start = std::time::Instant::now();
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        // SAFETY: as in allocate_section.
        let ctx = unsafe { &*(ctx as *const CallbackContext) };
        let mut memory = ctx.memory.lock();
        let pending = std::mem::take(&mut memory.in_flight);
        for in_flight in pending {
            match in_flight.finalize() {
                Ok(done) => memory.finalized.push(done),
                Err(e) => {
                    if memory.error.is_none() {
                        memory.error = Some(format!("finalizing: {e}"));
                    }
                }
            }
        }
        memory.error.clone()
    }));
    count_time(start);
    let message = match result {
        Ok(None) => return 0,
        Ok(Some(message)) => message,
        Err(_) => "panic while finalizing Kiln memory".to_string(),
    };
    if !error.is_null() {
        let c = CString::new(message).unwrap_or_default();
        // SAFETY: strdup copies into malloc'ed memory the shim frees; `error` is LLVM's
        // valid out-pointer.
        unsafe { *error = libc::strdup(c.as_ptr()) };
    }
    1
}

extern "C" fn destroy(ctx: *mut c_void) {
    // SAFETY: the shim calls this once, from its destructor, with the pointer created by
    // Box::into_raw in `compile`.
    drop(unsafe { Box::from_raw(ctx as *mut CallbackContext) });
}

extern "C" fn resolve(ctx: *mut c_void, name: *const c_char) -> u64 {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        // SAFETY: as in allocate_section; `name` is a NUL-terminated string from LLVM.
        let ctx = unsafe { &*(ctx as *const CallbackContext) };
        // SAFETY: LLVM passes a NUL-terminated symbol name.
        let name = unsafe { CStr::from_ptr(name) }.to_string_lossy();
        ctx.resolver.as_ref().and_then(|r| r(&name)).unwrap_or(0)
    }))
    .unwrap_or(0)
}

/// An MCJIT execution engine (owns its module); dispose it when the module's functions
/// have been looked up — the code stays in the [`ModuleCode`].
pub struct Engine {
    engine: LLVMExecutionEngineRef,
    memory: Arc<Mutex<ModuleMemory>>,
}

// SAFETY: an engine is used from one thread at a time (it is not Sync); LLVM engines may
// move between threads.
unsafe impl Send for Engine {}

impl Engine {
    /// Compiles (on first use) and returns the address of `name`; an error if Kiln could
    /// not provide the memory (LLVM was told, and the code must not run).
    pub fn function_address(&self, name: &str) -> Result<u64, Error> {
        let c = CString::new(name).map_err(|_| Error::FunctionNotFound(name.to_string()))?;
        // SAFETY: a live engine and a NUL-terminated name.
        let address = unsafe { LLVMGetFunctionAddress(self.engine, c.as_ptr()) };
        if let Some(error) = self.memory.lock().error.clone() {
            return Err(Error::Memory(error));
        }
        if address == 0 {
            return Err(Error::FunctionNotFound(name.to_string()));
        }
        Ok(address)
    }

    /// The raw engine, for LLVM calls this crate does not wrap.
    pub fn raw(&self) -> LLVMExecutionEngineRef {
        self.engine
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        // SAFETY: the engine was created by `compile` and is disposed once; it disposes
        // its module and its memory manager (which keeps Kiln's memory in ModuleCode).
        unsafe { LLVMDisposeExecutionEngine(self.engine) };
    }
}

/// MCJIT with Kiln's memory: one [`SlabMemoryManager`] shared by every engine (and
/// thread); each module's sections are packed into shared pages and owned by a
/// [`ModuleCode`] that outlives the engine.
#[derive(Clone)]
pub struct KilnMcjit {
    manager: SlabMemoryManager,
    resolver: Option<Resolver>,
    opt_level: u32,
}

impl KilnMcjit {
    /// Over `manager`.
    pub fn new(manager: SlabMemoryManager) -> Self {
        initialize_llvm();
        KilnMcjit {
            manager,
            resolver: None,
            opt_level: 2,
        }
    }

    /// Resolves the modules' external symbols through `resolver` first, then the
    /// process's symbols.
    pub fn with_resolver(mut self, resolver: Resolver) -> Self {
        self.resolver = Some(resolver);
        self
    }

    /// MCJIT's code generation level, 0 to 3 (default 2).
    pub fn with_opt_level(mut self, level: u32) -> Self {
        self.opt_level = level.min(3);
        self
    }

    /// The memory manager.
    pub fn manager(&self) -> &SlabMemoryManager {
        &self.manager
    }

    /// Creates an MCJIT engine for `module` (taking ownership of it) whose sections go to
    /// Kiln's memory.
    ///
    /// # Safety
    /// `module` must be a valid module not owned by another engine.
    pub unsafe fn compile(&self, module: LLVMModuleRef) -> Result<(Engine, ModuleCode), Error> {
        let (manager, code) = self.memory_manager();
        // SAFETY: plain-data options initialized by LLVM; the engine takes the memory
        // manager (destroyed with it, or by LLVM if the engine cannot be made).
        unsafe {
            let mut options: LLVMMCJITCompilerOptions = std::mem::zeroed();
            LLVMInitializeMCJITCompilerOptions(
                &mut options,
                std::mem::size_of::<LLVMMCJITCompilerOptions>(),
            );
            options.OptLevel = self.opt_level;
            options.MCJMM = manager;
            create_engine(module, &mut options).map(|engine| {
                (
                    Engine {
                        engine,
                        memory: code.memory.clone(),
                    },
                    code,
                )
            })
        }
    }

    /// A memory manager for one MCJIT engine, for clients that create engines
    /// themselves (LLVM-C's `LLVMCreateMCJITCompilerForModule`, options.MCJMM): the
    /// engine owns the manager (disposing the engine destroys it, or LLVM does if the
    /// engine cannot be made), the returned [`ModuleCode`] owns the code. A manager not
    /// given to an engine must be disposed with `LLVMDisposeMCJITMemoryManager`.
    pub fn memory_manager(&self) -> (LLVMMCJITMemoryManagerRef, ModuleCode) {
        let memory = Arc::new(Mutex::new(ModuleMemory::default()));
        let ctx = Box::into_raw(Box::new(CallbackContext {
            manager: self.manager.clone(),
            memory: memory.clone(),
            resolver: self.resolver.clone(),
        }));
        // SAFETY: the shim takes `ctx` and calls `destroy` on it exactly once, from the
        // manager's destructor.
        let manager = unsafe {
            kiln_mcjit_memory_manager(
                ctx.cast(),
                allocate_section,
                finalize_memory,
                destroy,
                resolve,
            )
        };
        (manager, ModuleCode { memory })
    }
}

/// # Safety
/// `module` valid and unowned; `options` initialized.
unsafe fn create_engine(
    module: LLVMModuleRef,
    options: &mut LLVMMCJITCompilerOptions,
) -> Result<LLVMExecutionEngineRef, Error> {
    let mut engine: LLVMExecutionEngineRef = std::ptr::null_mut();
    let mut error: *mut c_char = std::ptr::null_mut();
    // SAFETY: the caller's contract; out-pointers are valid.
    let failed = unsafe {
        LLVMCreateMCJITCompilerForModule(
            &mut engine,
            module,
            options,
            std::mem::size_of::<LLVMMCJITCompilerOptions>(),
            &mut error,
        )
    };
    if failed != 0 {
        let message = if error.is_null() {
            "unknown error".to_string()
        } else {
            // SAFETY: LLVM's message, freed with LLVMDisposeMessage.
            let m = unsafe { CStr::from_ptr(error) }
                .to_string_lossy()
                .into_owned();
            // SAFETY: the message LLVM allocated, disposed once.
            unsafe { LLVMDisposeMessage(error) };
            m
        };
        return Err(Error::Engine(message));
    }
    Ok(engine)
}

/// An MCJIT engine with LLVM's default memory manager (SectionMemoryManager owned by the
/// engine): its code dies with the engine. For comparisons.
///
/// # Safety
/// `module` must be a valid module not owned by another engine.
pub unsafe fn compile_with_default_memory(
    module: LLVMModuleRef,
    opt_level: u32,
) -> Result<Engine, Error> {
    initialize_llvm();
    // SAFETY: as in KilnMcjit::compile, with MCJMM left null (LLVM's default).
    unsafe {
        let mut options: LLVMMCJITCompilerOptions = std::mem::zeroed();
        LLVMInitializeMCJITCompilerOptions(
            &mut options,
            std::mem::size_of::<LLVMMCJITCompilerOptions>(),
        );
        options.OptLevel = opt_level.min(3);
        create_engine(module, &mut options).map(|engine| Engine {
            engine,
            memory: Arc::new(Mutex::new(ModuleMemory::default())),
        })
    }
}

/// One LLVM `SectionMemoryManager` shared by many engines (through a forwarder the engine
/// may destroy): LLVM's best pattern for keeping code after the engine. For comparisons.
pub struct SharedSectionMemoryManager {
    raw: *mut c_void,
}

// SAFETY: used from one thread at a time in the benchmark; SectionMemoryManager has no
// thread affinity.
unsafe impl Send for SharedSectionMemoryManager {}

impl SharedSectionMemoryManager {
    /// A new shared SectionMemoryManager.
    pub fn new() -> Self {
        initialize_llvm();
        // SAFETY: the shim allocates a SectionMemoryManager, freed in drop.
        let raw = unsafe { kiln_shared_section_memory_manager_create() };
        SharedSectionMemoryManager { raw }
    }

    /// An engine for `module` whose sections go to the shared manager.
    ///
    /// # Safety
    /// `module` must be a valid module not owned by another engine; `self` must outlive
    /// every call into the code.
    pub unsafe fn compile(&self, module: LLVMModuleRef, opt_level: u32) -> Result<Engine, Error> {
        // SAFETY: as in KilnMcjit::compile; the forwarder does not own the shared manager.
        unsafe {
            let mut options: LLVMMCJITCompilerOptions = std::mem::zeroed();
            LLVMInitializeMCJITCompilerOptions(
                &mut options,
                std::mem::size_of::<LLVMMCJITCompilerOptions>(),
            );
            options.OptLevel = opt_level.min(3);
            options.MCJMM = kiln_shared_section_forwarder(self.raw);
            create_engine(module, &mut options).map(|engine| Engine {
                engine,
                memory: Arc::new(Mutex::new(ModuleMemory::default())),
            })
        }
    }
}

impl Default for SharedSectionMemoryManager {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for SharedSectionMemoryManager {
    fn drop(&mut self) {
        // SAFETY: created by the shim, destroyed once, after every engine (the benchmark's
        // contract).
        unsafe { kiln_shared_section_memory_manager_destroy(self.raw) };
    }
}
