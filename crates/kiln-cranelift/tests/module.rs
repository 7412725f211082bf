//! `KilnModule` as a Cranelift user drives it: calls across finalizes, data with
//! relocations, host symbols and lookups, freeing one function (refused while it is
//! called; a stale call traps), thread-locals from several threads, a thousand functions
//! at once, and the errors of bad input beside `JITModule`'s.

use cranelift_codegen::ir::{
    types, AbiParam, Function, InstBuilder, Signature, UserFuncName, Value,
};
use cranelift_codegen::isa::TargetFrontendConfig;
use cranelift_codegen::Context;
use cranelift_frontend::{FunctionBuilder, FunctionBuilderContext};
use cranelift_module::{default_libcall_names, DataDescription, FuncId, Linkage, Module};
use kiln_cranelift::{KilnBuilder, KilnModule};

fn module() -> KilnModule {
    KilnModule::new(KilnBuilder::new(default_libcall_names()).unwrap())
}

fn sig(module: &impl Module, params: usize) -> Signature {
    let mut sig = module.make_signature();
    for _ in 0..params {
        sig.params.push(AbiParam::new(types::I64));
    }
    sig.returns.push(AbiParam::new(types::I64));
    sig
}

/// Builds `f(x) = body(x)` into `func`: one block, `x` its only parameter.
fn build_body(
    func: &mut Function,
    config: TargetFrontendConfig,
    body: impl FnOnce(&mut FunctionBuilder, Value) -> Value,
) {
    let mut fctx = FunctionBuilderContext::new();
    let mut b = FunctionBuilder::new(func, &mut fctx);
    let block = b.create_block();
    b.append_block_params_for_function_params(block);
    b.switch_to_block(block);
    let x = b.block_params(block)[0];
    let y = body(&mut b, x);
    b.ins().return_(&[y]);
    b.seal_all_blocks();
    b.finalize(config);
}

/// Defines `name(x) = body(x)` with `body` given the builder, the module and `x`.
fn define<M: Module>(
    module: &mut M,
    name: &str,
    linkage: Linkage,
    body: impl FnOnce(&mut FunctionBuilder, &mut M, Value) -> Value,
) -> FuncId {
    let signature = sig(module, 1);
    let id = module.declare_function(name, linkage, &signature).unwrap();
    let mut ctx = Context::new();
    ctx.func.signature = signature;
    ctx.func.name = UserFuncName::user(0, id.as_u32());
    let config = module.target_config();
    build_body(&mut ctx.func, config, |b, x| body(b, module, x));
    module.define_function(id, &mut ctx).unwrap();
    id
}

fn call(module: &KilnModule, id: FuncId, x: i64) -> i64 {
    // SAFETY: every function of these tests is `fn(i64) -> i64`.
    let f: extern "C" fn(i64) -> i64 =
        unsafe { std::mem::transmute(module.get_finalized_function(id)) };
    f(x)
}

fn calls(name: &'static str) -> impl FnOnce(&mut FunctionBuilder, &mut KilnModule, Value) -> Value {
    move |b, m, x| {
        let callee = m
            .declare_function(name, Linkage::Import, &sig(m, 1))
            .unwrap();
        let callee = m.declare_func_in_func(callee, b.func);
        let call = b.ins().call(callee, &[x]);
        b.inst_results(call)[0]
    }
}

#[test]
fn calls_and_data_across_finalizes() {
    let mut m = module();
    let double = define(&mut m, "double", Linkage::Local, |b, _, x| {
        b.ins().iadd(x, x)
    });
    m.finalize_definitions().unwrap();
    // A later finalize calls the earlier function, and reads a word that points at it.
    let table = m
        .declare_data("table", Linkage::Local, false, false)
        .unwrap();
    let mut data = DataDescription::new();
    data.define_zeroinit(8);
    let fref = m.declare_func_in_data(double, &mut data);
    data.write_function_addr(0, fref);
    m.define_data(table, &data).unwrap();
    let quad = define(&mut m, "quad", Linkage::Export, |b, m, x| {
        let double = m
            .declare_function("double", Linkage::Local, &sig(m, 1))
            .unwrap();
        let double = m.declare_func_in_func(double, b.func);
        let call = b.ins().call(double, &[x]);
        let y = b.inst_results(call)[0];
        // And once more through the table.
        let gv = m.declare_data_in_func(table, b.func);
        let ptr = b.ins().symbol_value(types::I64, gv);
        let fp = b.ins().load(
            types::I64,
            cranelift_codegen::ir::MemFlagsData::trusted(),
            ptr,
            0,
        );
        let sigref = b.import_signature(sig(m, 1));
        let call = b.ins().call_indirect(sigref, fp, &[y]);
        b.inst_results(call)[0]
    });
    m.finalize_definitions().unwrap();
    assert_eq!(call(&m, double, 5), 10);
    assert_eq!(call(&m, quad, 5), 20);
    let (ptr, size) = m.get_finalized_data(table);
    assert_eq!(size, 8);
    // SAFETY: the table's one word, finalized.
    let word = unsafe { (ptr as *const usize).read() };
    assert_eq!(word, m.get_finalized_function(double) as usize);
}

extern "C" fn host_triple(x: i64) -> i64 {
    3 * x
}

extern "C" fn host_negate(x: i64) -> i64 {
    -x
}

#[test]
fn builder_symbols_then_lookups_newest_first_then_the_process() {
    let mut builder = KilnBuilder::new(default_libcall_names()).unwrap();
    builder.symbol("triple", host_triple as *const u8);
    builder.symbol_lookup_fn(Box::new(|name| {
        (name == "negate" || name == "triple").then_some(host_triple as *const u8)
    }));
    builder.symbol_lookup_fn(Box::new(|name| {
        (name == "negate").then_some(host_negate as *const u8)
    }));
    let mut m = KilnModule::new(builder);
    let t = define(&mut m, "t", Linkage::Local, calls("triple"));
    let n = define(&mut m, "n", Linkage::Local, calls("negate"));
    // `labs` comes from the process (the C library).
    let a = define(&mut m, "a", Linkage::Local, calls("labs"));
    m.finalize_definitions().unwrap();
    assert_eq!(call(&m, t, 7), 21);
    assert_eq!(call(&m, n, 7), -7, "the newest lookup first");
    assert_eq!(call(&m, a, -9), 9);
}

#[test]
fn one_function_is_freed_and_defined_again() {
    let mut m = module();
    let f = define(&mut m, "f", Linkage::Export, |b, _, x| {
        b.ins().iadd_imm_s(x, 1)
    });
    m.finalize_definitions().unwrap();
    assert_eq!(call(&m, f, 1), 2);
    let before = m.session().memory_stats();
    m.free_function(f).unwrap();
    assert!(
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| m.get_finalized_function(f)))
            .is_err(),
        "a freed function has no address"
    );
    let after = m.session().memory_stats();
    assert!(
        after.live_allocations < before.live_allocations,
        "its memory went back: {before:?} -> {after:?}"
    );
    // Its name can be defined again, with another body.
    define(&mut m, "f", Linkage::Export, |b, _, x| {
        b.ins().imul_imm_s(x, 100)
    });
    m.finalize_definitions().unwrap();
    assert_eq!(call(&m, f, 2), 200);
}

#[test]
fn a_function_still_called_is_not_freed() {
    let mut m = module();
    let callee = define(&mut m, "callee", Linkage::Local, |b, _, x| {
        b.ins().iadd_imm_s(x, 10)
    });
    m.finalize_definitions().unwrap();
    let caller = define(&mut m, "caller", Linkage::Local, calls("callee"));
    m.finalize_definitions().unwrap();
    let error = m.free_function(callee).unwrap_err().to_string();
    assert!(
        error.contains("callee") && error.contains("caller"),
        "{error}"
    );
    assert_eq!(call(&m, caller, 1), 11, "nothing was freed");
    m.free_function(caller).unwrap();
    m.free_function(callee).unwrap();
    let error = m.free_function(callee).unwrap_err().to_string();
    assert!(error.contains("not defined"), "{error}");
}

/// The child of `a_stale_call_traps`: frees a function, then calls it.
#[test]
fn stale_call_child() {
    if std::env::var_os("KILN_CRANELIFT_STALE_CHILD").is_none() {
        return; // only as the child
    }
    let mut m = module();
    let f = define(&mut m, "f", Linkage::Export, |b, _, x| {
        b.ins().iadd_imm_s(x, 1)
    });
    m.finalize_definitions().unwrap();
    let stale: extern "C" fn(i64) -> i64 =
        // SAFETY: `fn(i64) -> i64`; called after the free on purpose, to trap.
        unsafe { std::mem::transmute(m.get_finalized_function(f)) };
    assert_eq!(stale(1), 2);
    m.free_function(f).unwrap();
    println!("calling the freed function");
    let value = stale(1);
    println!("it returned {value}");
}

#[test]
fn a_stale_call_traps() {
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "module::stale_call_child",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("KILN_CRANELIFT_STALE_CHILD", "1")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("calling the freed function"), "{stdout}");
    assert!(!stdout.contains("it returned"), "{stdout}");
    use std::os::unix::process::ExitStatusExt;
    let signal = out.status.signal();
    assert!(
        matches!(signal, Some(libc::SIGILL | libc::SIGTRAP | libc::SIGSEGV)),
        "the child ended with {:?}: {stdout}",
        out.status
    );
}

#[test]
fn thread_locals_from_several_threads() {
    let mut m = module();
    let counter = m
        .declare_data("counter", Linkage::Local, true, true)
        .unwrap();
    let mut data = DataDescription::new();
    data.define(Box::new(100i64.to_le_bytes()));
    m.define_data(counter, &data).unwrap();
    // bump(x): counter += x; return counter
    let bump = define(&mut m, "bump", Linkage::Export, |b, m, x| {
        let gv = m.declare_data_in_func(counter, b.func);
        let addr = b.ins().tls_value(types::I64, gv);
        let flags = cranelift_codegen::ir::MemFlagsData::trusted();
        let v = b.ins().load(types::I64, flags, addr, 0);
        let v = b.ins().iadd(v, x);
        b.ins().store(flags, v, addr, 0);
        v
    });
    m.finalize_definitions().unwrap();
    let address = m.get_finalized_function(bump) as usize;
    let threads: Vec<_> = (1..=4i64)
        .map(|t| {
            std::thread::spawn(move || {
                // SAFETY: `fn(i64) -> i64`, alive while the module is (joined below).
                let f: extern "C" fn(i64) -> i64 = unsafe { std::mem::transmute(address) };
                let mut last = 0;
                for _ in 0..1000 {
                    last = f(t);
                }
                last
            })
        })
        .collect();
    for (t, thread) in (1..=4i64).zip(threads) {
        assert_eq!(
            thread.join().unwrap(),
            100 + 1000 * t,
            "thread {t}'s own counter"
        );
    }
    assert_eq!(call(&m, bump, 1), 101, "this thread's counter is untouched");
}

#[test]
fn a_thousand_functions_finalized_at_once() {
    let mut m = module();
    let mut ids = Vec::new();
    ids.push(define(&mut m, "chain0", Linkage::Local, |b, _, x| {
        b.ins().iadd_imm_s(x, 1)
    }));
    for i in 1..1000 {
        let previous: &'static str = Box::leak(format!("chain{}", i - 1).into_boxed_str());
        ids.push(define(
            &mut m,
            &format!("chain{i}"),
            Linkage::Local,
            move |b, m, x| {
                let v = calls(previous)(b, m, x);
                b.ins().iadd_imm_s(v, 1)
            },
        ));
    }
    m.finalize_definitions().unwrap();
    assert_eq!(call(&m, ids[999], 0), 1000);
    assert_eq!(call(&m, ids[499], 0), 500);
}

#[test]
fn an_unresolved_name_names_the_function_and_nothing_finalized_is_lost() {
    let mut m = module();
    let good = define(&mut m, "good", Linkage::Local, |b, _, x| {
        b.ins().iadd_imm_s(x, 2)
    });
    m.finalize_definitions().unwrap();
    let bad = define(
        &mut m,
        "uses_a_missing_name",
        Linkage::Local,
        calls("kiln_cranelift_no_such_function"),
    );
    let error = format!("{:#}", m.finalize_definitions().unwrap_err());
    assert!(
        error.contains("kiln_cranelift_no_such_function") && error.contains("uses_a_missing_name"),
        "{error}"
    );
    assert_eq!(call(&m, good, 1), 3, "the earlier finalize is intact");
    // The failed definition is dropped: defined again (correctly), it links.
    define(&mut m, "uses_a_missing_name", Linkage::Local, |_, _, x| x);
    m.finalize_definitions().unwrap();
    assert_eq!(call(&m, bad, 9), 9);
}

#[test]
fn a_relocation_kind_kiln_does_not_link_is_named() {
    let mut m = module();
    let f = m
        .declare_function("f", Linkage::Local, &sig(&m, 1))
        .unwrap();
    let target = m
        .declare_function("g", Linkage::Import, &sig(&m, 1))
        .unwrap();
    let reloc = cranelift_module::ModuleReloc {
        offset: 0,
        kind: cranelift_codegen::binemit::Reloc::X86SecRel,
        name: cranelift_module::ModuleRelocTarget::from(target),
        addend: 0,
    };
    m.define_function_bytes(f, 16, &[0xc3; 8], &[reloc])
        .unwrap();
    let error = format!("{:#}", m.finalize_definitions().unwrap_err());
    assert!(
        error.contains("X86SecRel") && error.contains("f"),
        "{error}"
    );
}

#[test]
fn declaration_errors_are_jitmodules() {
    let mut kiln = module();
    let mut jit = cranelift_jit::JITModule::new(cranelift_jit::JITBuilder::with_isa(
        cranelift_native::builder()
            .unwrap()
            .finish(cranelift_codegen::settings::Flags::new({
                use cranelift_codegen::settings::Configurable;
                let mut b = cranelift_codegen::settings::builder();
                b.set("is_pic", "false").unwrap();
                b
            }))
            .unwrap(),
        default_libcall_names(),
    ));
    fn errors<M: Module>(m: &mut M) -> Vec<String> {
        let one = sig(m, 1);
        let two = sig(m, 2);
        let mut out = Vec::new();
        let f = m.declare_function("f", Linkage::Local, &one).unwrap();
        out.push(format!(
            "{:?}",
            m.declare_function("f", Linkage::Local, &two).unwrap_err()
        ));
        out.push(format!(
            "{:?}",
            m.declare_data("f", Linkage::Local, false, false)
                .unwrap_err()
        ));
        let i = m
            .declare_function("imported", Linkage::Import, &one)
            .unwrap();
        let mut ctx = Context::new();
        ctx.func.signature = one.clone();
        out.push(format!(
            "{:?}",
            m.define_function_bytes(i, 1, &[0xc3], &[]).unwrap_err()
        ));
        m.define_function_bytes(f, 1, &[0xc3], &[]).unwrap();
        out.push(format!(
            "{:?}",
            m.define_function_bytes(f, 1, &[0xc3], &[]).unwrap_err()
        ));
        out
    }
    let theirs = errors(&mut jit);
    let ours = errors(&mut kiln);
    assert_eq!(ours, theirs);
    assert!(ours[0].starts_with("IncompatibleSignature"), "{ours:?}");
    assert!(ours[1].starts_with("IncompatibleDeclaration"), "{ours:?}");
    assert!(ours[2].starts_with("InvalidImportDefinition"), "{ours:?}");
    assert!(ours[3].starts_with("DuplicateDefinition"), "{ours:?}");
}

static FRAMES: std::sync::Mutex<Vec<usize>> = std::sync::Mutex::new(Vec::new());

/// Called from JIT code: records the stack (walked by the unwinder, through the JIT
/// frame), then panics for 13.
extern "C-unwind" fn host_may_panic(x: i64) -> i64 {
    let mut frames = [std::ptr::null_mut(); 64];
    // SAFETY: glibc's backtrace writes at most 64 entries into the array.
    let n = unsafe { libc::backtrace(frames.as_mut_ptr(), 64) };
    *FRAMES.lock().unwrap() = frames[..n.max(0) as usize]
        .iter()
        .map(|&p| p as usize)
        .collect();
    if x == 13 {
        panic!("thirteen");
    }
    x + 1
}

#[inline(never)]
fn call_through(address: usize, x: i64) -> i64 {
    // SAFETY: `fn(i64) -> i64` that may unwind (its unwind table is registered).
    let f: extern "C-unwind" fn(i64) -> i64 = unsafe { std::mem::transmute(address) };
    f(x)
}

#[test]
fn a_panic_passes_through_jit_frames_and_a_backtrace_names_them() {
    let mut builder = KilnBuilder::new(default_libcall_names()).unwrap();
    builder.symbol("host_may_panic", host_may_panic as *const u8);
    let mut m = KilnModule::new(builder);
    let through = define(&mut m, "jit_through", Linkage::Export, |b, m, x| {
        let v = calls("host_may_panic")(b, m, x);
        // Work after the call: the call is not a tail call.
        b.ins().imul_imm_s(v, 2)
    });
    m.finalize_definitions().unwrap();
    let address = m.get_finalized_function(through) as usize;
    assert_eq!(call_through(address, 1), 4);
    // The stack as the unwinder walked it: the JIT frame, named, and the frames of the
    // test beyond it (the walk went through the JIT frame).
    let frames = FRAMES.lock().unwrap().clone();
    let jit = frames
        .iter()
        .position(|&pc| m.function_at(pc as *const u8).is_some())
        .unwrap_or_else(|| panic!("no JIT frame in {frames:x?}"));
    assert_eq!(
        m.function_at(frames[jit] as *const u8).map(|(n, _)| n),
        Some("jit_through".to_string())
    );
    assert!(
        frames.len() > jit + 2,
        "the walk stopped at the JIT frame: {frames:x?}"
    );
    let caught = std::panic::catch_unwind(|| call_through(address, 13));
    let message = caught.expect_err("the panic reaches the host");
    assert_eq!(message.downcast_ref::<&str>(), Some(&"thirteen"));
    // The module still works after the unwind.
    assert_eq!(call_through(address, 2), 6);
}

/// A module whose session tells debuggers and profilers what `support` says.
fn debug_module(support: kiln::debug::DebugSupport) -> KilnModule {
    let jit = kiln::Jit::builder().debug_support(support).build().unwrap();
    let mut builder = KilnBuilder::new(default_libcall_names()).unwrap();
    builder.session(jit);
    KilnModule::new(builder)
}

#[test]
fn perf_sees_jit_functions_through_the_sessions_listeners() {
    // A pid is reused: what an earlier process left at this one's perf map name, Kiln
    // would refuse to write.
    kiln_testkit::free_perf_map(std::process::id());
    let mut m = debug_module(kiln::debug::DebugSupport {
        perf_map: true,
        ..Default::default()
    });
    let f = define(
        &mut m,
        "kiln_cranelift_perf_probe",
        Linkage::Export,
        |b, _, x| b.ins().iadd_imm_s(x, 5),
    );
    m.finalize_definitions().unwrap();
    assert_eq!(call(&m, f, 1), 6);
    // The map is written by the executor's writer thread: flushed here, as at exit.
    kiln_runtime::debug_outputs::flush();
    let map = std::fs::read_to_string(format!("/tmp/perf-{}.map", std::process::id())).unwrap();
    let address = m.get_finalized_function(f) as usize;
    let line = map
        .lines()
        .find(|l| l.ends_with(" kiln_cranelift_perf_probe"))
        .unwrap_or_else(|| {
            panic!(
                "not in the perf map:\n{map}\n{:?}",
                m.session().plugin_failures()
            )
        });
    assert!(
        line.starts_with(&format!("{address:x} ")),
        "{line} vs {address:x}"
    );
}

#[test]
fn out_of_process_the_code_runs_in_kiln_executor() {
    let executor = kiln::Executor::spawn(
        &kiln_testkit::executor_binary(),
        kiln::executor::Transport::SharedMemory,
        kiln::executor::Timeouts::default(),
    )
    .unwrap();
    let pid = executor.pid();
    let jit = kiln::Jit::builder().executor(executor).build().unwrap();
    let mut builder = KilnBuilder::new(default_libcall_names()).unwrap();
    builder.session(jit);
    let mut m = KilnModule::new(builder);
    // Calls libc's `labs` as the executor's process resolves it.
    let f = define(&mut m, "remote_abs_plus_one", Linkage::Export, |b, m, x| {
        let v = calls("labs")(b, m, x);
        b.ins().iadd_imm_s(v, 1)
    });
    m.finalize_definitions().unwrap();
    let address = m.get_finalized_function(f) as u64;
    assert!(pid.is_some_and(|p| p != std::process::id()));
    // SAFETY: `fn(i64) -> i64`, called in the executor's process.
    let result = unsafe { m.session().executor().call(address, &[(-41i64) as u64]) }.unwrap();
    assert_eq!(result, 42);
    m.free_function(f).unwrap();
}

fn hot_swap_module() -> KilnModule {
    let mut builder = KilnBuilder::new(default_libcall_names()).unwrap();
    builder.hot_swap(true);
    KilnModule::new(builder)
}

/// Defines (or defines again) `name(x) = x + k`.
fn define_plus(m: &mut KilnModule, name: &str, k: i64) -> FuncId {
    define(m, name, Linkage::Export, move |b, _, x| {
        b.ins().iadd_imm_s(x, k)
    })
}

#[test]
fn hot_swap_callers_reach_the_new_body_and_the_old_one_is_freed() {
    let mut m = hot_swap_module();
    let value = define_plus(&mut m, "value", 1);
    m.finalize_definitions().unwrap();
    let caller = define(&mut m, "caller", Linkage::Export, |b, m, x| {
        let v = calls("value")(b, m, x);
        b.ins().imul_imm_s(v, 10)
    });
    m.finalize_definitions().unwrap();
    let stub = m.get_finalized_function(value);
    let thread = m.session().register_thread();
    {
        let _guard = thread.pin();
        assert_eq!(call(&m, caller, 1), 20);
    }
    // Defined again while finalized: the next finalize makes the new body current.
    define_plus(&mut m, "value", 2);
    m.finalize_definitions().unwrap();
    assert_eq!(
        m.get_finalized_function(value),
        stub,
        "callers hold the stub"
    );
    {
        let _guard = thread.pin();
        assert_eq!(call(&m, caller, 1), 30, "the caller reaches the new body");
        assert_eq!(call(&m, value, 1), 3);
    }
    assert_eq!(m.session().reclaim(), 0, "the old body is freed");
    // A function that was redefined can be freed (its caller first).
    m.free_function(caller).unwrap();
    m.free_function(value).unwrap();
    assert_eq!(m.session().reclaim(), 0);
    // And defined again after its free: its stub leads to the new body.
    define_plus(&mut m, "value", 7);
    m.finalize_definitions().unwrap();
    assert_eq!(m.get_finalized_function(value), stub);
    assert_eq!(call(&m, value, 1), 8);
}

#[test]
fn without_hot_swap_a_second_definition_is_jitmodules_error() {
    let mut m = module();
    define_plus(&mut m, "once", 1);
    m.finalize_definitions().unwrap();
    let signature = sig(&m, 1);
    let id = m
        .declare_function("once", Linkage::Export, &signature)
        .unwrap();
    let error = m.define_function_bytes(id, 16, &[0xc3], &[]).unwrap_err();
    assert!(
        matches!(error, cranelift_module::ModuleError::DuplicateDefinition(ref n) if n == "once"),
        "{error:?}"
    );
}

/// The child of `a_freed_hot_swap_function_traps`.
#[test]
fn freed_hot_swap_child() {
    if std::env::var_os("KILN_CRANELIFT_FREED_SWAP_CHILD").is_none() {
        return; // only as the child
    }
    let mut m = hot_swap_module();
    let f = define_plus(&mut m, "f", 1);
    m.finalize_definitions().unwrap();
    let stale: extern "C" fn(i64) -> i64 =
        // SAFETY: `fn(i64) -> i64` (its stub); called after the free on purpose, to trap.
        unsafe { std::mem::transmute(m.get_finalized_function(f)) };
    assert_eq!(stale(1), 2);
    m.free_function(f).unwrap();
    m.session().reclaim();
    println!("calling the freed function");
    let value = stale(1);
    println!("it returned {value}");
}

#[test]
fn a_freed_hot_swap_function_traps() {
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "module::freed_hot_swap_child",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("KILN_CRANELIFT_FREED_SWAP_CHILD", "1")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("calling the freed function"), "{stdout}");
    assert!(!stdout.contains("it returned"), "{stdout}");
    use std::os::unix::process::ExitStatusExt;
    assert!(
        matches!(out.status.signal(), Some(libc::SIGILL | libc::SIGTRAP)),
        "the child ended with {:?}: {stdout}",
        out.status
    );
}

/// Functions compiled here for `triple`, linked into a session whose executor is
/// executor-c under `qemu` (built with `gcc`, its guest's libraries at `root`), run there:
/// a call across finalizes and a call into the executor's C library.
fn run_under_qemu(triple: &str, gcc: &str, qemu: &str, root: &str) {
    let binary = kiln_testkit::c_executor_binary(gcc);
    let executor = kiln_testkit::start_listening(
        std::process::Command::new(qemu)
            .args(["-L", root])
            .arg(binary)
            .args(["--listen", "127.0.0.1:0", "--key-file"])
            .arg(kiln_testkit::key_file()),
    );
    let key = kiln::executor::Key::read_file(&kiln_testkit::key_file()).unwrap();
    let jit = kiln::Jit::builder()
        .executor(
            kiln::Executor::connect_with_key(
                &executor.address,
                Some(&key),
                kiln::executor::Timeouts::default(),
            )
            .unwrap(),
        )
        .build()
        .unwrap();
    let isa = {
        use cranelift_codegen::settings::Configurable;
        let mut flags = cranelift_codegen::settings::builder();
        flags.set("is_pic", "false").unwrap();
        flags.set("use_colocated_libcalls", "false").unwrap();
        cranelift_codegen::isa::lookup_by_name(triple)
            .unwrap()
            .finish(cranelift_codegen::settings::Flags::new(flags))
            .unwrap()
    };
    let mut builder = KilnBuilder::with_isa(isa, default_libcall_names());
    builder.session(jit);
    let mut m = KilnModule::new(builder);
    // libc's labs, in the executor's process.
    define(&mut m, "inner", Linkage::Local, calls("labs"));
    m.finalize_definitions().unwrap();
    // A later finalize calls it (a direct call: within the session's range).
    let outer = define(&mut m, "outer", Linkage::Export, |b, m, x| {
        let v = calls("inner")(b, m, x);
        b.ins().iadd_imm_s(v, 100)
    });
    m.finalize_definitions().unwrap();
    let address = m.get_finalized_function(outer) as u64;
    // SAFETY: `fn(i64) -> i64`, in the executor's process.
    let result = unsafe { m.session().executor().call(address, &[(-5i64) as u64]) }.unwrap();
    assert_eq!(result, 105, "{triple}");
}

#[test]
fn on_aarch64_through_executor_c_under_qemu() {
    if kiln_testkit::skip_cross("on_aarch64_through_executor_c_under_qemu") {
        return;
    }
    run_under_qemu(
        "aarch64-unknown-linux-gnu",
        "aarch64-linux-gnu-gcc",
        "qemu-aarch64-static",
        kiln_testkit::AARCH64_GUEST_ROOT,
    );
}

#[test]
fn on_riscv64_through_executor_c_under_qemu() {
    if kiln_testkit::skip_cross("on_riscv64_through_executor_c_under_qemu") {
        return;
    }
    run_under_qemu(
        "riscv64gc-unknown-linux-gnu",
        "riscv64-linux-gnu-gcc",
        "qemu-riscv64-static",
        "/usr/riscv64-linux-gnu",
    );
}

/// The child of `gdb_breaks_in_a_jit_function`: a session with gdb registration, one
/// function finalized and called.
#[test]
fn gdb_child() {
    if std::env::var_os("KILN_CRANELIFT_GDB_CHILD").is_none() {
        return; // only as the child
    }
    let mut m = debug_module(kiln::debug::DebugSupport {
        gdb: true,
        ..Default::default()
    });
    let f = define(&mut m, "kiln_gdb_probe", Linkage::Export, |b, _, x| {
        b.ins().imul_imm_s(x, 3)
    });
    m.finalize_definitions().unwrap();
    println!("probe returned {}", call(&m, f, 14));
}

#[test]
fn gdb_breaks_in_a_jit_function() {
    let out = std::process::Command::new("gdb")
        .args(["-batch", "-nx", "-ex", "set debuginfod enabled off"])
        .args([
            "-ex",
            "set breakpoint pending on",
            "-ex",
            "break kiln_gdb_probe",
        ])
        .args([
            "-ex", "run", "-ex", "x/i $pc", "-ex", "bt 4", "-ex", "continue",
        ])
        .arg("--args")
        .arg(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "module::gdb_child",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("KILN_CRANELIFT_GDB_CHILD", "1")
        .stdin(std::process::Stdio::null())
        .output()
        .expect("gdb runs (the test command installs it)");
    let all = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // Pending until the finalize registers the code; hit at the call.
    assert!(
        all.contains("Breakpoint 1, ") && all.contains(" in kiln_gdb_probe ()"),
        "{all}"
    );
    assert!(
        all.lines()
            .any(|l| l.starts_with("=> ") && l.contains("<kiln_gdb_probe")),
        "{all}"
    );
    assert!(all.contains("probe returned 42"), "{all}");
}

/// `twice(x) = 2x`, and `compute(x) = twice(x) + labs(x)`, both compiled and stored in the
/// code cache at `dir` under "v1".
fn cache_module(dir: &std::path::Path) -> (KilnModule, FuncId, FuncId) {
    let cache = kiln_cache::DiskCache::open(dir, kiln_cache::DiskLimits::default()).unwrap();
    let mut builder = KilnBuilder::new(default_libcall_names()).unwrap();
    builder.code_cache(std::sync::Arc::new(cache));
    let mut m = KilnModule::new(builder);
    let signature = sig(&m, 1);
    let twice = m
        .declare_function("twice", Linkage::Local, &signature)
        .unwrap();
    let compute = m
        .declare_function("compute", Linkage::Export, &signature)
        .unwrap();
    (m, twice, compute)
}

/// The child of `a_later_process_defines_cached_functions_without_compiling`.
#[test]
fn cache_child() {
    let Some(dir) = std::env::var_os("KILN_CRANELIFT_CACHE_CHILD") else {
        return; // only as the child
    };
    let (mut m, twice, compute) = cache_module(std::path::Path::new(&dir));
    // No function is built or compiled here: both come from the cache.
    assert!(m.define_function_from_cache(twice, b"v1").unwrap());
    assert!(m.define_function_from_cache(compute, b"v1").unwrap());
    // Another key is a miss.
    let other = m
        .declare_function("other", Linkage::Local, &sig(&m, 1))
        .unwrap();
    assert!(!m.define_function_from_cache(other, b"v1").unwrap());
    m.finalize_definitions().unwrap();
    println!("compute(-5) = {}", call(&m, compute, -5));
}

#[test]
fn a_later_process_defines_cached_functions_without_compiling() {
    let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("code-cache");
    let _ = std::fs::remove_dir_all(&dir);
    {
        let (mut m, twice, compute) = cache_module(&dir);
        assert!(
            !m.define_function_from_cache(compute, b"v1").unwrap(),
            "empty"
        );
        for (id, name) in [(twice, "twice"), (compute, "compute")] {
            let mut ctx = Context::new();
            ctx.func.signature = sig(&m, 1);
            ctx.func.name = UserFuncName::user(0, id.as_u32());
            let config = m.target_config();
            build_body(&mut ctx.func, config, |b, x| {
                if name == "twice" {
                    b.ins().iadd(x, x)
                } else {
                    let t = calls("twice")(b, &mut m, x);
                    let a = calls("labs")(b, &mut m, x);
                    b.ins().iadd(t, a)
                }
            });
            m.define_function_and_cache(id, b"v1", &mut ctx).unwrap();
        }
        m.finalize_definitions().unwrap();
        assert_eq!(call(&m, compute, -5), -5);
    }
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "module::cache_child",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("KILN_CRANELIFT_CACHE_CHILD", &dir)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("compute(-5) = -5"), "{stdout}");
}

/// A lazy function's callback: `name(x) = x * factor`, counting its compiles.
fn times(
    factor: i64,
    compiles: &std::sync::Arc<std::sync::atomic::AtomicUsize>,
) -> kiln_cranelift::LazyCompile {
    let compiles = compiles.clone();
    std::sync::Arc::new(move |cx: &mut kiln_cranelift::LazyContext<'_>| {
        compiles.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let config = cx.target_config();
        build_body(cx.func, config, |b, x| b.ins().imul_imm_s(x, factor));
        Ok(())
    })
}

#[test]
fn lazy_functions_compile_on_first_call_and_can_be_swapped() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let mut m = hot_swap_module();
    let compiles = std::sync::Arc::new(AtomicUsize::new(0));
    let signature = sig(&m, 1);
    let lazy = m
        .declare_lazy_function(
            "lazy_times7",
            Linkage::Export,
            &signature,
            times(7, &compiles),
        )
        .unwrap();
    // An eager caller, finalized while the lazy function is still uncompiled.
    let caller = define(&mut m, "calls_lazy", Linkage::Export, |b, m, x| {
        let v = calls("lazy_times7")(b, m, x);
        b.ins().iadd_imm_s(v, 1)
    });
    m.finalize_definitions().unwrap();
    assert_eq!(compiles.load(Ordering::SeqCst), 0, "nothing compiled yet");
    let thread = m.session().register_thread();
    {
        let _guard = thread.pin();
        assert_eq!(call(&m, caller, 3), 22);
        assert_eq!(call(&m, lazy, 2), 14);
    }
    assert_eq!(
        compiles.load(Ordering::SeqCst),
        1,
        "compiled once, on the first call"
    );
    // A lazy function calling another lazy one, both compiled on that first call.
    let inner = m
        .declare_lazy_function(
            "lazy_inner",
            Linkage::Local,
            &signature,
            times(3, &compiles),
        )
        .unwrap();
    let outer_compile: kiln_cranelift::LazyCompile =
        std::sync::Arc::new(move |cx: &mut kiln_cranelift::LazyContext<'_>| {
            let callee = cx
                .declare_func_in_func(inner)
                .ok_or("lazy_inner undeclared")?;
            let config = cx.target_config();
            build_body(cx.func, config, |b, x| {
                let call = b.ins().call(callee, &[x]);
                let y = b.inst_results(call)[0];
                b.ins().iadd_imm_s(y, 100)
            });
            Ok(())
        });
    let outer = m
        .declare_lazy_function("lazy_outer", Linkage::Export, &signature, outer_compile)
        .unwrap();
    {
        let _guard = thread.pin();
        assert_eq!(call(&m, outer, 5), 115);
    }
    assert_eq!(
        compiles.load(Ordering::SeqCst),
        2,
        "lazy_inner compiled on its first call"
    );
    // Defined again (hot swap): the caller reaches the new body; then freed.
    define_plus(&mut m, "lazy_times7", 1000);
    m.finalize_definitions().unwrap();
    {
        let _guard = thread.pin();
        assert_eq!(call(&m, caller, 3), 1004);
    }
    m.free_function(caller).unwrap();
    m.free_function(lazy).unwrap();
    assert_eq!(m.session().reclaim(), 0);
}

#[test]
fn a_lazy_function_needs_hot_swap() {
    let mut m = module();
    let compiles = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let signature = sig(&m, 1);
    let error = m
        .declare_lazy_function("nope", Linkage::Export, &signature, times(2, &compiles))
        .unwrap_err()
        .to_string();
    assert!(error.contains("hot_swap"), "{error}");
}
