//! # kiln-llvm
//!
//! Kiln's memory under LLVM's own JIT. Shader compilers keep one MCJIT `ExecutionEngine`
//! per module today, because destroying the engine destroys its memory manager and the
//! code in it (over a megabyte per module). With `KilnMcjit` (feature `llvm`), every
//! engine's sections go to one shared Kiln
//! [`SlabMemoryManager`](kiln_memory::SlabMemoryManager): the client
//! disposes the engine, the module and the context after `LLVMGetFunctionAddress`, keeps a
//! `ModuleCode` per module, and the code stays callable, packed with other modules' in
//! shared pages; dropping the handle frees it.
//!
//! Built with the cargo feature `llvm` against Debian's llvm-14-dev through `llvm-sys`
//! (set `LLVM_SYS_140_PREFIX=/usr/lib/llvm-14`); without it the crate is empty, so the
//! rest of Kiln builds without LLVM. A small C++ shim (shim/kiln_mcjit.cpp) subclasses
//! `RTDyldMemoryManager`: Kiln's memory is dual-mapped, and only the C++ API can tell
//! RuntimeDyld the run-time address of each section (`mapSectionAddress`).
//!
//! ```ignore
//! let jit = kiln_llvm::KilnMcjit::new(kiln_memory::SlabMemoryManager::new()?);
//! let (engine, code) = unsafe { jit.compile(module)? };   // module built with LLVM-C
//! let f = engine.function_address("shader_0")?;
//! drop(engine);                                           // also disposes the module
//! unsafe { LLVMContextDispose(context) };
//! let f: extern "C" fn(i32) -> i32 = unsafe { std::mem::transmute(f as usize) };
//! f(3);                                                   // still runs: `code` owns it
//! drop(code);                                             // freed
//! ```

#[cfg(feature = "llvm")]
pub mod ir;
#[cfg(feature = "llvm")]
mod mcjit;

#[cfg(feature = "llvm")]
pub use mcjit::{
    compile_with_default_memory, initialize_llvm, memory_manager_nanos, Engine, Error, KilnMcjit,
    ModuleCode, Resolver, SharedSectionMemoryManager,
};
