//! The workload of the Cranelift figures (`session_scale`, `cranelift_backend`): a JIT
//! that compiles one small function per module with Cranelift 0.135. Module `i`'s
//! function `f_i(x)`: a quarter compute and read a global `shared_value` (7), a quarter
//! call a host function, a quarter call libc's `labs`, a quarter call `f_{i-1}`.

use cranelift_codegen::ir::{types::I64, AbiParam, InstBuilder, MemFlagsData};
use cranelift_codegen::settings::{self, Configurable};
use cranelift_frontend::{FunctionBuilder, FunctionBuilderContext};
use cranelift_module::{DataDescription, FuncId, Linkage, Module, ModuleReloc};
use std::sync::Arc;

/// The host function a quarter of the modules call.
pub extern "C" fn kiln_bench_host(x: i64) -> i64 {
    x ^ 0x55
}

/// What module `i`'s function returns for `x` (with the shared global at 7).
pub fn expected(i: usize, x: i64) -> i64 {
    match i % 4 {
        0 => x * 3 + i as i64 + 7,
        1 => kiln_bench_host(x) + i as i64,
        2 => x.abs() + i as i64,
        _ => expected(i - 1, x) + 1,
    }
}

/// The host ISA, optimizing for speed; position-independent code for objects
/// (cranelift-jit needs it off).
pub fn isa(pic: bool) -> Arc<dyn cranelift_codegen::isa::TargetIsa> {
    let mut flags = settings::builder();
    flags
        .set("is_pic", if pic { "true" } else { "false" })
        .expect("flag");
    flags.set("opt_level", "speed").expect("flag");
    cranelift_native::builder()
        .expect("host ISA")
        .finish(settings::Flags::new(flags))
        .expect("ISA")
}

/// Builds module `i`'s function `f_i` in `module`'s namespace and compiles it (the JIT's
/// own work, the same for every contender): its id, alignment, code and relocations.
pub fn compile<M: Module>(
    module: &mut M,
    i: usize,
    fbc: &mut FunctionBuilderContext,
    ctx: &mut cranelift_codegen::Context,
) -> (FuncId, u64, Vec<u8>, Vec<ModuleReloc>) {
    let mut sig = module.make_signature();
    sig.params.push(AbiParam::new(I64));
    sig.returns.push(AbiParam::new(I64));
    let id = module
        .declare_function(&format!("f_{i}"), Linkage::Export, &sig)
        .expect("declare");
    let callee = match i % 4 {
        1 => Some("kiln_bench_host".to_string()),
        2 => Some("labs".to_string()),
        3 => Some(format!("f_{}", i - 1)),
        _ => None,
    }
    .map(|name| {
        module
            .declare_function(&name, Linkage::Import, &sig)
            .expect("declare import")
    });
    let shared = (i % 4 == 0).then(|| {
        module
            .declare_data("shared_value", Linkage::Import, true, false)
            .expect("declare data")
    });
    ctx.clear();
    ctx.func.signature = sig;
    {
        let mut b = FunctionBuilder::new(&mut ctx.func, fbc);
        let block = b.create_block();
        b.append_block_params_for_function_params(block);
        b.switch_to_block(block);
        b.seal_block(block);
        let x = b.block_params(block)[0];
        let k = b.ins().iconst(I64, i as i64);
        let result = match (callee, shared) {
            (Some(callee), _) => {
                let fref = module.declare_func_in_func(callee, b.func);
                let call = b.ins().call(fref, &[x]);
                let r = b.inst_results(call)[0];
                if i % 4 == 3 {
                    b.ins().iadd_imm_s(r, 1)
                } else {
                    b.ins().iadd(r, k)
                }
            }
            (None, Some(data)) => {
                let gv = module.declare_data_in_func(data, b.func);
                let address = b.ins().symbol_value(I64, gv);
                let value = b.ins().load(I64, MemFlagsData::trusted(), address, 0);
                let three = b.ins().imul_imm_s(x, 3);
                let sum = b.ins().iadd(three, k);
                b.ins().iadd(sum, value)
            }
            (None, None) => unreachable!("every module either calls or reads the global"),
        };
        b.ins().return_(&[result]);
        b.finalize(module.target_config());
    }
    let isa = module.isa();
    ctx.compile(isa, &mut Default::default()).expect("compile");
    let compiled = ctx.compiled_code().expect("compiled");
    let align = (compiled.buffer.alignment as u64)
        .max(isa.function_alignment().minimum as u64)
        .max(isa.symbol_alignment());
    let code = compiled.code_buffer().to_vec();
    let relocs = compiled
        .buffer
        .relocs()
        .iter()
        .map(|r| ModuleReloc::from_mach_reloc(r, &ctx.func, id))
        .collect();
    (id, align, code, relocs)
}

/// Defines `shared_value`, an i64 of 7, in `module`.
pub fn define_shared<M: Module>(module: &mut M) {
    let id = module
        .declare_data("shared_value", Linkage::Export, true, false)
        .expect("declare data");
    let mut data = DataDescription::new();
    data.define(7i64.to_le_bytes().to_vec().into_boxed_slice());
    module.define_data(id, &data).expect("define data");
}
