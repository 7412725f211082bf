//! A complete JIT on Kiln: compile `square` with Cranelift, call it, free it.
use cranelift_codegen::ir::{types::I64, AbiParam, InstBuilder};
use cranelift_frontend::{FunctionBuilder, FunctionBuilderContext};
use cranelift_module::{default_libcall_names, Linkage, Module};
use kiln_cranelift::{KilnBuilder, KilnModule};

fn main() {
    let mut module = KilnModule::new(KilnBuilder::new(default_libcall_names()).unwrap());
    let mut ctx = module.make_context();
    ctx.func.signature.params.push(AbiParam::new(I64));
    ctx.func.signature.returns.push(AbiParam::new(I64));
    let sig = ctx.func.signature.clone();
    let id = module
        .declare_function("square", Linkage::Export, &sig)
        .unwrap();
    let mut fctx = FunctionBuilderContext::new();
    let mut b = FunctionBuilder::new(&mut ctx.func, &mut fctx);
    let block = b.create_block();
    b.append_block_params_for_function_params(block);
    b.switch_to_block(block);
    let x = b.block_params(block)[0];
    let y = b.ins().imul(x, x);
    b.ins().return_(&[y]);
    b.seal_all_blocks();
    b.finalize(module.target_config());
    module.define_function(id, &mut ctx).unwrap();
    module.finalize_definitions().unwrap();
    let code = module.get_finalized_function(id);
    // SAFETY: the code was compiled with this signature.
    let square: extern "C" fn(i64) -> i64 = unsafe { std::mem::transmute(code) };
    assert_eq!(square(12), 144);
    println!("square(12) = {}", square(12));
    module.free_function(id).unwrap(); // JITModule cannot free one function
}
