//! MCJIT with Kiln's memory: code outlives engines, modules and contexts; freeing returns
//! memory; an allocation failure is an error, not an abort; two threads share a manager;
//! external symbols resolve through the client's resolver, then the process.
#![cfg(feature = "llvm")]

use kiln_llvm::{ir, KilnMcjit};
use kiln_memory::{MemoryManager, SlabLayout, SlabMemoryManager};
use llvm_sys::core::{LLVMContextCreate, LLVMContextDispose};
use std::sync::Arc;

const ROUNDS: u32 = 200;

fn call(address: u64, x: i32) -> i32 {
    // SAFETY: the tests look up `i32 f(i32)` functions they built.
    let f: extern "C" fn(i32) -> i32 = unsafe { std::mem::transmute(address as usize) };
    f(x)
}

/// Compiles shader `index`, disposes the engine, module and context; returns the code
/// handle and the function's address.
fn compile(jit: &KilnMcjit, index: u32) -> Result<(kiln_llvm::ModuleCode, u64), kiln_llvm::Error> {
    // SAFETY: a fresh context and module, handed to the engine, disposed in order.
    unsafe {
        let ctx = LLVMContextCreate();
        let module = ir::shader_module(ctx, index, ROUNDS);
        let result = jit.compile(module).and_then(|(engine, code)| {
            let address = engine.function_address(&format!("shader_{index}"))?;
            drop(engine);
            Ok((code, address))
        });
        LLVMContextDispose(ctx);
        result
    }
}

#[test]
fn code_outlives_engine_module_and_context_and_frees() {
    let jit = KilnMcjit::new(SlabMemoryManager::new().unwrap()).with_opt_level(0);
    let mut modules = Vec::new();
    for i in 0..40 {
        let (code, address) = compile(&jit, i).unwrap();
        assert!(
            code.sections() >= 2,
            "code and data sections placed by Kiln"
        );
        modules.push((i, code, address));
    }
    for (i, _, address) in &modules {
        for x in [0, 1, -7, 12345] {
            assert_eq!(
                call(*address, x),
                ir::expected(*i, ROUNDS, x),
                "shader {i}({x})"
            );
        }
    }
    let stats = jit.manager().stats();
    assert!(stats.live_allocations >= 80);
    drop(modules);
    let stats = jit.manager().stats();
    assert_eq!(stats.live_allocations, 0);
    assert_eq!(stats.bytes_allocated, 0);
}

#[test]
fn an_allocation_failure_is_an_error_not_an_abort() {
    // A code pool of 64 KiB: a few shaders fit, then Kiln runs out.
    let manager = SlabMemoryManager::builder()
        .layout(SlabLayout {
            read_execute: 64 << 10,
            read: 64 << 10,
            read_write: 64 << 10,
        })
        .build()
        .unwrap();
    let jit = KilnMcjit::new(manager).with_opt_level(0);
    let mut kept = Vec::new();
    let error = loop {
        match compile(&jit, kept.len() as u32) {
            Ok(m) => kept.push(m),
            Err(e) => break e,
        }
        assert!(kept.len() < 100, "64 KiB cannot hold 100 shaders");
    };
    assert!(matches!(error, kiln_llvm::Error::Memory(_)), "{error}");
    assert!(error.to_string().contains("out of reservation"), "{error}");
    // What was compiled before still runs; after freeing, compiling works again.
    for (i, (_, address)) in kept.iter().enumerate() {
        assert_eq!(call(*address, 3), ir::expected(i as u32, ROUNDS, 3));
    }
    kept.clear();
    let (_code, address) = compile(&jit, 7).unwrap();
    assert_eq!(call(address, 3), ir::expected(7, ROUNDS, 3));
}

#[test]
fn two_threads_compile_into_one_shared_manager() {
    let jit = KilnMcjit::new(SlabMemoryManager::new().unwrap()).with_opt_level(0);
    let threads: Vec<_> = (0..2u32)
        .map(|t| {
            let jit = jit.clone();
            std::thread::spawn(move || {
                let mut mine = Vec::new();
                for i in 0..25 {
                    let index = t * 1000 + i;
                    mine.push((index, compile(&jit, index).unwrap()));
                }
                for (index, (_, address)) in &mine {
                    assert_eq!(call(*address, 11), ir::expected(*index, ROUNDS, 11));
                }
                mine
            })
        })
        .collect();
    let all: Vec<_> = threads
        .into_iter()
        .flat_map(|t| t.join().unwrap())
        .collect();
    assert_eq!(all.len(), 50);
    for (index, (_, address)) in &all {
        assert_eq!(call(*address, 2), ir::expected(*index, ROUNDS, 2));
    }
}

extern "C" fn host_add(x: i32) -> i32 {
    x + 100
}

#[test]
fn external_symbols_resolve_through_the_client_then_the_process() {
    let resolver: kiln_llvm::Resolver =
        Arc::new(|name: &str| (name == "host_add").then_some(host_add as *const () as u64));
    let jit = KilnMcjit::new(SlabMemoryManager::new().unwrap())
        .with_opt_level(0)
        .with_resolver(resolver);
    // SAFETY: as in `compile`.
    let (code, address) = unsafe {
        let ctx = LLVMContextCreate();
        let (engine, code) = jit.compile(ir::caller_module(ctx)).unwrap();
        let address = engine.function_address("call_host").unwrap();
        drop(engine);
        LLVMContextDispose(ctx);
        (code, address)
    };
    assert_eq!(call(address, 1), 106);
    drop(code);
}

#[test]
fn mcjit_code_in_kiln_memory_leaves_no_mapping_writable_and_executable() {
    let jit = KilnMcjit::new(SlabMemoryManager::new().unwrap()).with_opt_level(0);
    let mut modules = Vec::new();
    for i in 0..16 {
        let (code, address) = compile(&jit, i).unwrap();
        assert_eq!(call(address, 3), ir::expected(i, ROUNDS, 3));
        modules.push(code);
    }
    // The whole process, from a second thread too (its stack is a fresh mapping).
    let scan = || -> Vec<String> {
        std::fs::read_to_string("/proc/self/maps")
            .unwrap()
            .lines()
            .filter(|l| l.split_whitespace().nth(1).and_then(|p| p.get(1..3)) == Some("wx"))
            .map(str::to_string)
            .collect()
    };
    assert_eq!(scan(), Vec::<String>::new());
    let from_thread = std::thread::spawn(scan).join().unwrap();
    assert_eq!(from_thread, Vec::<String>::new());
    drop(modules);
}
