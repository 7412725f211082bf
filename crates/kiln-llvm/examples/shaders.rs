//! The shader pattern with Kiln under MCJIT: compile N small IR modules (a function with a
//! constant table and a writable global, built with the LLVM-C builder), destroy each
//! engine, module and context right after looking the function up, call every function
//! through its pointer, then free them.
//!
//! `cargo run --release -p kiln-llvm --features llvm --example shaders -- [N]`

use kiln_llvm::{ir, KilnMcjit};
use kiln_memory::{MemoryManager, SlabMemoryManager};
use llvm_sys::core::{LLVMContextCreate, LLVMContextDispose};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let n: u32 = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(1000);
    let rounds: u32 = std::env::args()
        .nth(2)
        .and_then(|a| a.parse().ok())
        .unwrap_or(395);
    let jit = KilnMcjit::new(SlabMemoryManager::new()?).with_opt_level(0);
    let mut shaders = Vec::new();
    for i in 0..n {
        // SAFETY: a fresh context and module; the engine owns the module and is dropped
        // before the context is disposed.
        let (code, address) = unsafe {
            let ctx = LLVMContextCreate();
            let (engine, code) = jit.compile(ir::shader_module(ctx, i, rounds))?;
            let address = engine.function_address(&format!("shader_{i}"))?;
            drop(engine);
            LLVMContextDispose(ctx);
            (code, address)
        };
        shaders.push((i, code, address));
    }
    let mut checked = 0;
    for (i, _, address) in &shaders {
        // SAFETY: `i32 shader_i(i32)`, kept alive by its ModuleCode.
        let f: extern "C" fn(i32) -> i32 = unsafe { std::mem::transmute(*address as usize) };
        assert_eq!(f(42), ir::expected(*i, rounds, 42));
        checked += 1;
    }
    let stats = jit.manager().stats();
    println!("{checked} shaders called after their engines were destroyed");
    println!(
        "per module: {} bytes requested, {} allocated",
        stats.bytes_requested / u64::from(n),
        stats.bytes_allocated / u64::from(n)
    );
    println!("{stats}");
    drop(shaders);
    println!(
        "after freeing: {} live allocations, {} bytes allocated",
        jit.manager().stats().live_allocations,
        jit.manager().stats().bytes_allocated
    );
    Ok(())
}
