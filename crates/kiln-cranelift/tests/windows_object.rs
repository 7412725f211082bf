//! cranelift-object's COFF objects for a Windows triple (`x86_64-pc-windows-gnu`: what a
//! Cranelift JIT for Windows writes when it links objects) linked by Kiln and run in this
//! process with the Windows x64 calling convention, which Rust speaks on Linux
//! (`extern "win64"`): a call to an imported host function, data read through a symbol, a
//! data object holding a function's address.

use cranelift_codegen::ir::{types, AbiParam, InstBuilder, MemFlagsData, UserFuncName};
use cranelift_codegen::settings::Configurable;
use cranelift_frontend::{FunctionBuilder, FunctionBuilderContext};
use cranelift_module::{default_libcall_names, DataDescription, Linkage, Module};
use kiln::memory::{MemoryManager, SlabMemoryManager};
use kiln_link::{LinkContext, LinkOptions, ObjectInput};

extern "win64" fn host_add(a: i64, b: i64) -> i64 {
    a + b
}

struct Host;

impl LinkContext for Host {
    fn resolve(&mut self, name: &str) -> Option<u64> {
        (name == "host_add").then_some(host_add as *const () as u64)
    }
    fn tls_module_id(&mut self) -> Result<u64, String> {
        Err("no thread-locals here".into())
    }
}

/// `scaled(a, b) = host_add(a, b) * 3 + counter`, `counter` an i64 of 5, and `entry_table`
/// a pointer to `scaled`, in one COFF object.
fn windows_object() -> Vec<u8> {
    let mut flags = cranelift_codegen::settings::builder();
    flags.set("is_pic", "false").unwrap();
    let isa = cranelift_codegen::isa::lookup_by_name("x86_64-pc-windows-gnu")
        .unwrap()
        .finish(cranelift_codegen::settings::Flags::new(flags))
        .unwrap();
    let mut module = cranelift_object::ObjectModule::new(
        cranelift_object::ObjectBuilder::new(isa, "windows", default_libcall_names()).unwrap(),
    );
    let mut sig = module.make_signature();
    sig.params.push(AbiParam::new(types::I64));
    sig.params.push(AbiParam::new(types::I64));
    sig.returns.push(AbiParam::new(types::I64));
    let host = module
        .declare_function("host_add", Linkage::Import, &sig)
        .unwrap();
    let scaled = module
        .declare_function("scaled", Linkage::Export, &sig)
        .unwrap();
    let counter = module
        .declare_data("counter", Linkage::Export, true, false)
        .unwrap();
    let mut data = DataDescription::new();
    data.define(5i64.to_le_bytes().to_vec().into_boxed_slice());
    module.define_data(counter, &data).unwrap();
    let table = module
        .declare_data("entry_table", Linkage::Export, false, false)
        .unwrap();
    let mut data = DataDescription::new();
    // Initialized: cranelift-object puts zero-initialized data in .bss, relocations and
    // all, which no linker can patch.
    data.define(vec![0; 8].into_boxed_slice());
    let f = module.declare_func_in_data(scaled, &mut data);
    data.write_function_addr(0, f);
    module.define_data(table, &data).unwrap();

    let config = module.isa().frontend_config();
    let mut ctx = module.make_context();
    ctx.func.signature = sig;
    ctx.func.name = UserFuncName::user(0, scaled.as_u32());
    let mut fctx = FunctionBuilderContext::new();
    let mut b = FunctionBuilder::new(&mut ctx.func, &mut fctx);
    let block = b.create_block();
    b.append_block_params_for_function_params(block);
    b.switch_to_block(block);
    let (x, y) = (b.block_params(block)[0], b.block_params(block)[1]);
    let callee = module.declare_func_in_func(host, b.func);
    let call = b.ins().call(callee, &[x, y]);
    let sum = b.inst_results(call)[0];
    let tripled = b.ins().imul_imm_s(sum, 3);
    let gv = module.declare_data_in_func(counter, b.func);
    let at = b.ins().symbol_value(types::I64, gv);
    let value = b.ins().load(types::I64, MemFlagsData::trusted(), at, 0);
    let result = b.ins().iadd(tripled, value);
    b.ins().return_(&[result]);
    b.seal_all_blocks();
    b.finalize(config);
    module.define_function(scaled, &mut ctx).unwrap();
    module.finish().emit().unwrap()
}

#[test]
fn cranelift_objects_for_windows_link_and_run_with_its_calling_convention() {
    let object = windows_object();
    assert!(kiln_link::is_coff(&object), "cranelift-object wrote COFF");
    let memory = SlabMemoryManager::new().unwrap();
    let linked = kiln_link::link(
        &[ObjectInput::new("windows.o", object)],
        &[],
        &mut Host,
        &LinkOptions::new(&memory as &dyn MemoryManager),
    )
    .unwrap();
    let scaled = linked.symbol("scaled").unwrap();
    let table = linked.symbol("entry_table").unwrap();
    // SAFETY: `scaled` is code the link made executable, compiled for the Windows x64
    // calling convention (`extern "win64"`); `entry_table` is 8 readable bytes of its data.
    let (direct, through_table, pointer) = unsafe {
        let f: extern "win64" fn(i64, i64) -> i64 = std::mem::transmute(scaled as usize);
        let pointer = *(table as *const u64);
        let g: extern "win64" fn(i64, i64) -> i64 = std::mem::transmute(pointer as usize);
        (f(2, 3), g(10, -4), pointer)
    };
    assert_eq!(pointer, scaled, "IMAGE_REL_AMD64_ADDR64 in data");
    assert_eq!(direct, (2 + 3) * 3 + 5);
    assert_eq!(through_table, (10 - 4) * 3 + 5);
}
