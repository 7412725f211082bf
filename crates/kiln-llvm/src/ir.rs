//! Shader-like IR modules built with LLVM-C's builder: a function with a constant table
//! and a writable global, like the modules shader compilers JIT by the thousand.

use llvm_sys::core::*;
use llvm_sys::prelude::*;
use llvm_sys::LLVMIntPredicate;
use std::ffi::CString;

/// The constant table of shader `index` (1 KiB).
pub fn table(index: u32) -> [i32; 256] {
    let mut t = [0i32; 256];
    for (i, v) in t.iter_mut().enumerate() {
        *v = (i as u32).wrapping_mul(2_654_435_761).wrapping_add(index) as i32;
    }
    t
}

/// What `shader_<index>(x)` returns, computed here.
pub fn expected(index: u32, rounds: u32, x: i32) -> i32 {
    let t = table(index);
    let mut v = x;
    for k in 0..rounds as i32 {
        let idx = (v.wrapping_add(k) & 255) as usize;
        v = (v.wrapping_mul(31 + k).wrapping_add(t[idx])) ^ k.wrapping_mul(7);
    }
    v
}

/// Builds module `shader<index>` in `ctx`: `i32 shader_<index>(i32)` doing `rounds` rounds of
/// table lookups and arithmetic (about 18 bytes of x86-64 code per round), a 1 KiB constant
/// table and a 64-byte writable global it stores its result in.
///
/// # Safety
/// `ctx` must be a live LLVM context.
pub unsafe fn shader_module(ctx: LLVMContextRef, index: u32, rounds: u32) -> LLVMModuleRef {
    let c = |s: &str| CString::new(s).unwrap_or_default();
    // SAFETY: LLVM-C builder calls on objects created here, in the caller's live context.
    unsafe {
        let name = c(&format!("shader{index}"));
        let module = LLVMModuleCreateWithNameInContext(name.as_ptr(), ctx);
        let i32t = LLVMInt32TypeInContext(ctx);
        let i64t = LLVMInt64TypeInContext(ctx);
        // Constant table.
        let values: Vec<LLVMValueRef> = table(index)
            .iter()
            .map(|&v| LLVMConstInt(i32t, v as u32 as u64, 0))
            .collect();
        let table_ty = LLVMArrayType(i32t, 256);
        let table_name = c(&format!("table{index}"));
        let table = LLVMAddGlobal(module, table_ty, table_name.as_ptr());
        LLVMSetInitializer(table, LLVMConstArray(i32t, values.as_ptr() as *mut _, 256));
        LLVMSetGlobalConstant(table, 1);
        LLVMSetLinkage(table, llvm_sys::LLVMLinkage::LLVMPrivateLinkage);
        // Writable state: 16 x i32 = 64 bytes.
        let state_ty = LLVMArrayType(i32t, 16);
        let state_name = c(&format!("state{index}"));
        let state = LLVMAddGlobal(module, state_ty, state_name.as_ptr());
        LLVMSetInitializer(state, LLVMConstNull(state_ty));
        // The function.
        let mut params = [i32t];
        let fn_ty = LLVMFunctionType(i32t, params.as_mut_ptr(), 1, 0);
        let fn_name = c(&format!("shader_{index}"));
        let function = LLVMAddFunction(module, fn_name.as_ptr(), fn_ty);
        let entry_name = c("entry");
        let entry = LLVMAppendBasicBlockInContext(ctx, function, entry_name.as_ptr());
        let b = LLVMCreateBuilderInContext(ctx);
        LLVMPositionBuilderAtEnd(b, entry);
        let empty = c("");
        let mut v = LLVMGetParam(function, 0);
        for k in 0..rounds {
            // A block every 16 rounds: instruction selection is superlinear in the size of
            // a block, and shaders are made of many small blocks anyway.
            if k % 16 == 15 {
                let block_name = c(&format!("r{k}"));
                let next = LLVMAppendBasicBlockInContext(ctx, function, block_name.as_ptr());
                LLVMBuildBr(b, next);
                LLVMPositionBuilderAtEnd(b, next);
            }
            let kc = LLVMConstInt(i32t, u64::from(k), 0);
            let sum = LLVMBuildAdd(b, v, kc, empty.as_ptr());
            let idx = LLVMBuildAnd(b, sum, LLVMConstInt(i32t, 255, 0), empty.as_ptr());
            let idx64 = LLVMBuildZExt(b, idx, i64t, empty.as_ptr());
            let mut indices = [LLVMConstInt(i64t, 0, 0), idx64];
            let p = LLVMBuildGEP2(b, table_ty, table, indices.as_mut_ptr(), 2, empty.as_ptr());
            let t = LLVMBuildLoad2(b, i32t, p, empty.as_ptr());
            let mul = LLVMBuildMul(
                b,
                v,
                LLVMConstInt(i32t, u64::from(31 + k), 0),
                empty.as_ptr(),
            );
            let add = LLVMBuildAdd(b, mul, t, empty.as_ptr());
            v = LLVMBuildXor(
                b,
                add,
                LLVMConstInt(i32t, u64::from(k.wrapping_mul(7)), 0),
                empty.as_ptr(),
            );
        }
        // state[index % 16] = v, and a comparison so the store is not folded away.
        let mut indices = [
            LLVMConstInt(i64t, 0, 0),
            LLVMConstInt(i64t, u64::from(index % 16), 0),
        ];
        let slot = LLVMBuildGEP2(b, state_ty, state, indices.as_mut_ptr(), 2, empty.as_ptr());
        LLVMBuildStore(b, v, slot);
        let _ = LLVMBuildICmp(b, LLVMIntPredicate::LLVMIntEQ, v, v, empty.as_ptr());
        LLVMBuildRet(b, v);
        LLVMDisposeBuilder(b);
        module
    }
}

/// Builds a module whose `i32 call_host(i32 x)` returns `host_add(x) + abs(-5)`: one
/// symbol for the client's resolver, one for the process's symbols.
///
/// # Safety
/// `ctx` must be a live LLVM context.
pub unsafe fn caller_module(ctx: LLVMContextRef) -> LLVMModuleRef {
    let c = |s: &str| CString::new(s).unwrap_or_default();
    // SAFETY: LLVM-C builder calls on objects created here, in the caller's live context.
    unsafe {
        let name = c("caller");
        let module = LLVMModuleCreateWithNameInContext(name.as_ptr(), ctx);
        let i32t = LLVMInt32TypeInContext(ctx);
        let mut one = [i32t];
        let fn_ty = LLVMFunctionType(i32t, one.as_mut_ptr(), 1, 0);
        let host_name = c("host_add");
        let host = LLVMAddFunction(module, host_name.as_ptr(), fn_ty);
        let abs_name = c("abs");
        let abs = LLVMAddFunction(module, abs_name.as_ptr(), fn_ty);
        let f_name = c("call_host");
        let f = LLVMAddFunction(module, f_name.as_ptr(), fn_ty);
        let entry_name = c("entry");
        let entry = LLVMAppendBasicBlockInContext(ctx, f, entry_name.as_ptr());
        let b = LLVMCreateBuilderInContext(ctx);
        LLVMPositionBuilderAtEnd(b, entry);
        let empty = c("");
        let mut args = [LLVMGetParam(f, 0)];
        let r1 = LLVMBuildCall2(b, fn_ty, host, args.as_mut_ptr(), 1, empty.as_ptr());
        let mut args = [LLVMConstInt(i32t, (-5i32) as u32 as u64, 1)];
        let r2 = LLVMBuildCall2(b, fn_ty, abs, args.as_mut_ptr(), 1, empty.as_ptr());
        let sum = LLVMBuildAdd(b, r1, r2, empty.as_ptr());
        LLVMBuildRet(b, sum);
        LLVMDisposeBuilder(b);
        module
    }
}
