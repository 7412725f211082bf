//! # kiln-cranelift
//!
//! A JIT backend for Cranelift on Kiln: [`KilnModule`] implements
//! [`cranelift_module::Module`] as `cranelift_jit::JITModule` does, with the same builder
//! methods ([`KilnBuilder`]) and the same inherent methods (`finalize_definitions`,
//! `get_finalized_function`, `get_finalized_data`, `get_address`, `free_memory`):
//! switching a program from `JITModule` is a change of type names.
//!
//! Compiled code never becomes an object file: each function's bytes and relocations go
//! into Kiln's link graph as a section and its edges ([`kiln_link::BuiltObject`]), and
//! each `finalize_definitions` is one link of what is pending. What Kiln adds to
//! `JITModule`:
//!
//! - **free one function** ([`KilnModule::free_function`], [`KilnModule::free_data`]):
//!   refused while other code refers to it; once a finalize's definitions are all freed
//!   their memory is returned and filled with traps;
//! - **thread-locals** (`declare_data(.., tls: true)`), resolved for every thread;
//! - **unwind tables** (`.eh_frame` from Cranelift's unwind information, registered): a
//!   Rust panic or a C++ exception passes through JIT frames;
//! - **relocations that never overflow**: every module of a session lies in one reserved
//!   range, and calls beyond a branch's reach go through stubs or veneers;
//! - **a code cache**: compiled functions kept in one of Kiln's object caches under the
//!   caller's key, defined again in a later process without compiling;
//! - **hot swap** ([`KilnBuilder::hot_swap`]): a finalized function defined again while
//!   it runs; callers reach the new body;
//! - **lazy functions** ([`KilnModule::declare_lazy_function`]): compiled on first call;
//! - **the session's services**: another executor process, debuggers and profilers
//!   (gdb, perf map, jitdump) as listeners, through [`KilnBuilder::session`].
//!
//! ```
//! use cranelift_codegen::ir::{types, AbiParam, InstBuilder, UserFuncName};
//! use cranelift_frontend::{FunctionBuilder, FunctionBuilderContext};
//! use cranelift_module::{default_libcall_names, Linkage, Module};
//! use kiln_cranelift::{KilnBuilder, KilnModule};
//!
//! let mut module = KilnModule::new(KilnBuilder::new(default_libcall_names()).unwrap());
//! let mut ctx = module.make_context();
//! ctx.func.signature.params.push(AbiParam::new(types::I64));
//! ctx.func.signature.returns.push(AbiParam::new(types::I64));
//! let id = module
//!     .declare_function("plus_one", Linkage::Export, &ctx.func.signature)
//!     .unwrap();
//! ctx.func.name = UserFuncName::user(0, id.as_u32());
//! let mut fctx = FunctionBuilderContext::new();
//! let mut b = FunctionBuilder::new(&mut ctx.func, &mut fctx);
//! let block = b.create_block();
//! b.append_block_params_for_function_params(block);
//! b.switch_to_block(block);
//! let x = b.block_params(block)[0];
//! let y = b.ins().iadd_imm_s(x, 1);
//! b.ins().return_(&[y]);
//! b.seal_all_blocks();
//! b.finalize(module.target_config());
//! module.define_function(id, &mut ctx).unwrap();
//! module.finalize_definitions().unwrap();
//! // SAFETY: the function was compiled with this signature.
//! let plus_one: extern "C" fn(i64) -> i64 =
//!     unsafe { std::mem::transmute(module.get_finalized_function(id)) };
//! assert_eq!(plus_one(41), 42);
//! module.free_function(id).unwrap();
//! ```

// Cranelift's `ModuleError` (136 bytes) is the error type of the `Module` trait and of
// `JITModule`'s methods, which this crate mirrors: it is not ours to box.
#![allow(clippy::result_large_err)]

mod builder;
mod code_cache;
mod lazy;
mod module;
mod relocations;
mod unwind;

pub use builder::KilnBuilder;
pub use lazy::{LazyCompile, LazyContext};
pub use module::{KilnModule, KilnModuleError};

/// The README's example, `examples/square.rs`, run as a test (`cargo test --doc`); a test
/// of `tests/main.rs` checks that the README shows it word for word.
///
/// ```
#[doc = include_str!("../examples/square.rs")]
/// ```
#[cfg(doctest)]
pub struct ReadmeExample;
