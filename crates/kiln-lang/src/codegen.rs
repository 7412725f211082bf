//! From a function's syntax to Cranelift IR: built into any function whose calls an
//! [`Imports`] resolves — a `cranelift_module::Module` (kiln-cranelift's `KilnModule`,
//! which the runtime uses; cranelift-jit's or cranelift-object's, for comparing) or a lazy
//! function's context.

use crate::syntax::{BinaryOp, Expr, Extern, Function, Position, Statement, Type, UnaryOp};
use cranelift_codegen::ir::condcodes::IntCC;
use cranelift_codegen::ir::{self, types, AbiParam, FuncRef, InstBuilder, Signature, Value};
use cranelift_codegen::isa::{TargetFrontendConfig, TargetIsa};
use cranelift_codegen::Context;
use cranelift_frontend::{FunctionBuilder, FunctionBuilderContext, Variable};
use cranelift_module::{FuncId, Linkage, Module};
use std::collections::HashMap;
use std::sync::Arc;

/// A function or local that a program uses wrongly, or a failure of Cranelift.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{function}: {position}: {message}")]
pub struct CompileError {
    /// The function being compiled.
    pub function: String,
    /// Where.
    pub position: Position,
    /// What.
    pub message: String,
}

/// What a call's name refers to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Callee {
    /// A function of the language, with its number of parameters.
    Function(usize),
    /// A host or C library function.
    Extern(Extern),
}

/// Names a program's calls may refer to.
pub trait Callees {
    /// What `name` is, if anything.
    fn callee(&self, name: &str) -> Option<Callee>;

    /// How many arguments `name` takes, if it is a callee.
    fn arity(&self, name: &str) -> Option<usize> {
        self.callee(name).map(|c| match c {
            Callee::Function(n) => n,
            Callee::Extern(x) => x.params.len(),
        })
    }
}

impl Callees for HashMap<String, Callee> {
    fn callee(&self, name: &str) -> Option<Callee> {
        self.get(name).cloned()
    }
}

/// "1 argument", "2 arguments".
pub fn count(n: usize, what: &str) -> String {
    if n == 1 {
        format!("1 {what}")
    } else {
        format!("{n} {what}s")
    }
}

pub use crate::check::check;

/// The signature of a function of the language with `arity` parameters, from `base` (an
/// empty signature in the target's calling convention).
pub fn signature_from(mut base: Signature, arity: usize) -> Signature {
    base.params
        .extend(std::iter::repeat_n(AbiParam::new(types::I64), arity));
    base.returns.push(AbiParam::new(types::I64));
    base
}

/// The signature of a function of the language with `arity` parameters, in `imports`'
/// calling convention.
pub fn signature(imports: &dyn Imports, arity: usize) -> Signature {
    signature_from(imports.new_signature(), arity)
}

/// Where a function's calls go: each callee declared (as an import) and referred to from
/// the function being built.
pub trait Imports {
    /// An empty signature in the target's calling convention.
    fn new_signature(&self) -> Signature;
    /// A reference, in `func`, to `name` with `signature`.
    fn import(
        &mut self,
        func: &mut ir::Function,
        name: &str,
        signature: &Signature,
    ) -> Result<FuncRef, String>;
}

impl<M: Module> Imports for M {
    fn new_signature(&self) -> Signature {
        self.make_signature()
    }

    fn import(
        &mut self,
        func: &mut ir::Function,
        name: &str,
        signature: &Signature,
    ) -> Result<FuncRef, String> {
        let id = self
            .declare_function(name, Linkage::Import, signature)
            .map_err(|e| e.to_string())?;
        Ok(self.declare_func_in_func(id, func))
    }
}

/// The signature of extern `x`, from `base` (an empty signature in the target's calling
/// convention).
pub fn extern_signature(mut base: Signature, x: &Extern) -> Signature {
    let ty = |t: Type| match t {
        Type::I64 => types::I64,
        Type::I32 => types::I32,
    };
    base.params
        .extend(x.params.iter().map(|&t| AbiParam::new(ty(t))));
    base.returns.push(AbiParam::new(ty(x.result)));
    base
}

/// Declares `f` in `module` with `linkage` and compiles its body into it. Callees are
/// declared as imports.
pub fn define<M: Module>(
    module: &mut M,
    context: &mut Context,
    builder_context: &mut FunctionBuilderContext,
    f: &Function,
    callees: &dyn Callees,
    linkage: Linkage,
) -> Result<FuncId, CompileError> {
    let failed = |message: String| CompileError {
        function: f.name.clone(),
        position: f.position,
        message,
    };
    check(f, callees)?;
    let sig = signature(module, f.params.len());
    let id = module
        .declare_function(&f.name, linkage, &sig)
        .map_err(|e| failed(e.to_string()))?;
    context.clear();
    let config = module.target_config();
    build(
        &mut context.func,
        builder_context,
        f,
        callees,
        module,
        config,
    )?;
    module
        .define_function(id, context)
        .map_err(|e| failed(format!("{e:?}")))?;
    Ok(id)
}

/// Builds `f` into `func` (its signature set here), its calls resolved by `imports`.
pub fn build(
    func: &mut ir::Function,
    builder_context: &mut FunctionBuilderContext,
    f: &Function,
    callees: &dyn Callees,
    imports: &mut dyn Imports,
    config: TargetFrontendConfig,
) -> Result<(), CompileError> {
    check(f, callees)?;
    let failed = |message: String| CompileError {
        function: f.name.clone(),
        position: f.position,
        message,
    };
    func.signature = signature_from(imports.new_signature(), f.params.len());
    let mut b = FunctionBuilder::new(func, builder_context);
    let entry = b.create_block();
    b.append_block_params_for_function_params(entry);
    b.switch_to_block(entry);
    b.seal_block(entry);
    let mut scopes = vec![HashMap::new()];
    for (i, p) in f.params.iter().enumerate() {
        let var = b.declare_var(types::I64);
        let value = b.block_params(entry)[i];
        b.def_var(var, value);
        scopes[0].insert(p.clone(), var);
    }
    let mut gen = Generator {
        imports,
        b,
        scopes,
        callees,
        refs: HashMap::new(),
    };
    let result = gen.expr(&f.body).map_err(failed)?;
    gen.b.ins().return_(&[result]);
    gen.b.finalize(config);
    Ok(())
}

struct Generator<'a, 'f> {
    imports: &'a mut dyn Imports,
    b: FunctionBuilder<'f>,
    scopes: Vec<HashMap<String, Variable>>,
    callees: &'a dyn Callees,
    refs: HashMap<String, FuncRef>,
}

impl Generator<'_, '_> {
    fn var(&self, name: &str) -> Result<Variable, String> {
        self.scopes
            .iter()
            .rev()
            .find_map(|s| s.get(name).copied())
            .ok_or_else(|| format!("unknown variable '{name}'"))
    }

    fn bool_to_i64(&mut self, v: Value) -> Value {
        self.b.ins().uextend(types::I64, v)
    }

    /// `a op b`.
    fn binary(&mut self, op: BinaryOp, a: Value, b: Value) -> Value {
        let ins = self.b.ins();
        let cmp = |cc| Some(cc);
        let cc = match op {
            BinaryOp::Eq => cmp(IntCC::Equal),
            BinaryOp::Ne => cmp(IntCC::NotEqual),
            BinaryOp::Lt => cmp(IntCC::SignedLessThan),
            BinaryOp::Le => cmp(IntCC::SignedLessThanOrEqual),
            BinaryOp::Gt => cmp(IntCC::SignedGreaterThan),
            BinaryOp::Ge => cmp(IntCC::SignedGreaterThanOrEqual),
            _ => None,
        };
        if let Some(cc) = cc {
            let c = ins.icmp(cc, a, b);
            return self.bool_to_i64(c);
        }
        match op {
            BinaryOp::Add => ins.iadd(a, b),
            BinaryOp::Sub => ins.isub(a, b),
            BinaryOp::Mul => ins.imul(a, b),
            BinaryOp::Div | BinaryOp::Rem => {
                // No trap in the host: x / 0 and x % 0 are 0, and MIN / -1 wraps
                // to MIN (MIN % -1 is 0), so the divisor given to the machine is
                // never 0 or -1.
                let zero = self.b.ins().icmp_imm_s(IntCC::Equal, b, 0);
                let minus_one = self.b.ins().icmp_imm_s(IntCC::Equal, b, -1);
                let special = self.b.ins().bor(zero, minus_one);
                let one = self.b.ins().iconst(types::I64, 1);
                let divisor = self.b.ins().select(special, one, b);
                let nought = self.b.ins().iconst(types::I64, 0);
                if op == BinaryOp::Div {
                    let q = self.b.ins().sdiv(a, divisor);
                    let negated = self.b.ins().ineg(a);
                    let q = self.b.ins().select(minus_one, negated, q);
                    self.b.ins().select(zero, nought, q)
                } else {
                    let r = self.b.ins().srem(a, divisor);
                    self.b.ins().select(special, nought, r)
                }
            }
            BinaryOp::And | BinaryOp::Or => {
                let x = self.b.ins().icmp_imm_s(IntCC::NotEqual, a, 0);
                let y = self.b.ins().icmp_imm_s(IntCC::NotEqual, b, 0);
                let c = if op == BinaryOp::And {
                    self.b.ins().band(x, y)
                } else {
                    self.b.ins().bor(x, y)
                };
                self.bool_to_i64(c)
            }
            _ => unreachable!("comparisons are handled above"),
        }
    }

    fn expr(&mut self, e: &Expr) -> Result<Value, String> {
        Ok(match e {
            Expr::Number(n) => self.b.ins().iconst(types::I64, *n),
            Expr::Var(n, _) => {
                let var = self.var(n)?;
                self.b.use_var(var)
            }
            Expr::Assign(n, v, _) => {
                let value = self.expr(v)?;
                let var = self.var(n)?;
                self.b.def_var(var, value);
                value
            }
            Expr::Unary(UnaryOp::Neg, a) => {
                let a = self.expr(a)?;
                self.b.ins().ineg(a)
            }
            Expr::Unary(UnaryOp::Not, a) => {
                let a = self.expr(a)?;
                let c = self.b.ins().icmp_imm_s(IntCC::Equal, a, 0);
                self.bool_to_i64(c)
            }
            Expr::Binary(..) => {
                // A chain as long as it likes, in a loop (only its operands recurse).
                let (first, operators) = e.left_spine();
                let mut a = self.expr(first)?;
                for (op, right) in operators {
                    let b = self.expr(right)?;
                    a = self.binary(op, a, b);
                }
                a
            }
            Expr::If(c, then, otherwise) => {
                let c = self.expr(c)?;
                let (then_block, else_block, merge) = (
                    self.b.create_block(),
                    self.b.create_block(),
                    self.b.create_block(),
                );
                self.b.append_block_param(merge, types::I64);
                self.b.ins().brif(c, then_block, &[], else_block, &[]);
                self.b.switch_to_block(then_block);
                self.b.seal_block(then_block);
                let v = self.expr(then)?;
                self.b.ins().jump(merge, &[v.into()]);
                self.b.switch_to_block(else_block);
                self.b.seal_block(else_block);
                let v = self.expr(otherwise)?;
                self.b.ins().jump(merge, &[v.into()]);
                self.b.switch_to_block(merge);
                self.b.seal_block(merge);
                self.b.block_params(merge)[0]
            }
            Expr::While(c, body) => {
                let (header, body_block, exit) = (
                    self.b.create_block(),
                    self.b.create_block(),
                    self.b.create_block(),
                );
                self.b.ins().jump(header, &[]);
                self.b.switch_to_block(header);
                let cv = self.expr(c)?;
                self.b.ins().brif(cv, body_block, &[], exit, &[]);
                self.b.switch_to_block(body_block);
                self.b.seal_block(body_block);
                self.expr(body)?;
                self.b.ins().jump(header, &[]);
                self.b.seal_block(header);
                self.b.switch_to_block(exit);
                self.b.seal_block(exit);
                self.b.ins().iconst(types::I64, 0)
            }
            Expr::Block(statements, value) => {
                self.scopes.push(HashMap::new());
                for s in statements {
                    match s {
                        Statement::Let(n, v) => {
                            let value = self.expr(v)?;
                            let var = self.b.declare_var(types::I64);
                            self.b.def_var(var, value);
                            if let Some(scope) = self.scopes.last_mut() {
                                scope.insert(n.clone(), var);
                            }
                        }
                        Statement::Expr(v) => {
                            self.expr(v)?;
                        }
                    }
                }
                let v = match value {
                    Some(v) => self.expr(v)?,
                    None => self.b.ins().iconst(types::I64, 0),
                };
                self.scopes.pop();
                v
            }
            Expr::Call(name, args, _) => {
                let callee = self
                    .callees
                    .callee(name)
                    .ok_or_else(|| format!("unknown function '{name}'"))?;
                let mut values = Vec::with_capacity(args.len());
                for a in args {
                    values.push(self.expr(a)?);
                }
                let fref = match self.refs.get(name) {
                    Some(&f) => f,
                    None => {
                        let base = self.imports.new_signature();
                        let sig = match &callee {
                            Callee::Function(n) => signature_from(base, *n),
                            Callee::Extern(x) => extern_signature(base, x),
                        };
                        let f = self.imports.import(self.b.func, name, &sig)?;
                        self.refs.insert(name.clone(), f);
                        f
                    }
                };
                if let Callee::Extern(x) = &callee {
                    for (v, t) in values.iter_mut().zip(&x.params) {
                        if *t == Type::I32 {
                            *v = self.b.ins().ireduce(types::I32, *v);
                        }
                    }
                }
                let call = self.b.ins().call(fref, &values);
                let result = self.b.inst_results(call)[0];
                match &callee {
                    Callee::Extern(x) if x.result == Type::I32 => {
                        self.b.ins().sextend(types::I64, result)
                    }
                    _ => result,
                }
            }
        })
    }
}

/// The host's instruction set, for position-independent objects (`pic`) or for
/// cranelift-jit (which needs it off), optimizing for speed.
pub fn host_isa(pic: bool) -> Result<Arc<dyn TargetIsa>, String> {
    use cranelift_codegen::settings::{self, Configurable};
    let mut flags = settings::builder();
    flags
        .set("is_pic", if pic { "true" } else { "false" })
        .map_err(|e| e.to_string())?;
    flags.set("opt_level", "speed").map_err(|e| e.to_string())?;
    cranelift_native::builder()
        .map_err(|e| e.to_string())?
        .finish(settings::Flags::new(flags))
        .map_err(|e| e.to_string())
}

/// The instruction set of `architecture` (an executor's that is not this machine, say),
/// for position-independent objects, optimizing for speed: the architecture's baseline
/// (no CPU feature beyond it is assumed). An error names an architecture this build of
/// Cranelift has no backend for (kiln-lang enables x86-64 and AArch64).
pub fn isa_for(architecture: kiln::Architecture) -> Result<Arc<dyn TargetIsa>, String> {
    use cranelift_codegen::settings::{self, Configurable};
    let triple = match architecture {
        kiln::Architecture::X86_64 => "x86_64-unknown-linux-gnu",
        kiln::Architecture::Aarch64 => "aarch64-unknown-linux-gnu",
        kiln::Architecture::Riscv64 => "riscv64gc-unknown-linux-gnu",
    };
    let mut flags = settings::builder();
    flags.set("is_pic", "true").map_err(|e| e.to_string())?;
    flags.set("opt_level", "speed").map_err(|e| e.to_string())?;
    cranelift_codegen::isa::lookup_by_name(triple)
        .map_err(|e| {
            format!("no Cranelift backend for {architecture} ({triple}) in this build: {e}")
        })?
        .finish(settings::Flags::new(flags))
        .map_err(|e| e.to_string())
}

/// Compiles `f` alone into an ELF relocatable object that defines it (global) and
/// imports what it calls (with cranelift-object: the path the runtime took before
/// `KilnModule`, kept for comparing the two in kiln-bench's `lazy_figures`).
pub fn compile_object(
    isa: &Arc<dyn TargetIsa>,
    f: &Function,
    callees: &dyn Callees,
) -> Result<Vec<u8>, CompileError> {
    let failed = |message: String| CompileError {
        function: f.name.clone(),
        position: f.position,
        message,
    };
    let builder = cranelift_object::ObjectBuilder::new(
        isa.clone(),
        f.name.as_bytes().to_vec(),
        cranelift_module::default_libcall_names(),
    )
    .map_err(|e| failed(e.to_string()))?;
    let mut module = cranelift_object::ObjectModule::new(builder);
    let mut context = module.make_context();
    let mut builder_context = FunctionBuilderContext::new();
    define(
        &mut module,
        &mut context,
        &mut builder_context,
        f,
        callees,
        Linkage::Export,
    )?;
    module.finish().emit().map_err(|e| failed(e.to_string()))
}
