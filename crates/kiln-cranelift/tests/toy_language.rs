//! The toy language of cranelift-jit-demo (functions with named results, assignments,
//! `if`/`else` as expressions, `while`, calls, comparisons and global data), written here
//! from its description and compiled function by function through `KilnModule`: the demo's
//! programs (`foo`, `recursive_fib`, `iterative_fib`, `hello` calling `puts`) give the
//! demo's answers.

use cranelift_codegen::ir::condcodes::IntCC;
use cranelift_codegen::ir::{types::I64, AbiParam, InstBuilder, Value};
use cranelift_frontend::{FunctionBuilder, FunctionBuilderContext, Variable};
use cranelift_module::{default_libcall_names, DataDescription, Linkage, Module};
use kiln_cranelift::{KilnBuilder, KilnModule};
use std::collections::HashMap;

#[derive(Debug, Clone)]
enum Expr {
    Number(i64),
    Identifier(String),
    Assign(String, Box<Expr>),
    Binary(String, Box<Expr>, Box<Expr>),
    IfElse(Box<Expr>, Vec<Expr>, Vec<Expr>),
    While(Box<Expr>, Vec<Expr>),
    Call(String, Vec<Expr>),
    GlobalDataAddr(String),
}

struct Function {
    name: String,
    params: Vec<String>,
    result: String,
    body: Vec<Expr>,
}

/// A small recursive-descent parser of the toy language.
struct Parser<'a> {
    tokens: Vec<&'a str>,
    at: usize,
}

fn tokenize(source: &str) -> Vec<&str> {
    let mut tokens = Vec::new();
    let bytes = source.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        let c = bytes[i] as char;
        if c.is_whitespace() {
            i += 1;
        } else if c.is_ascii_alphanumeric() || c == '_' {
            let start = i;
            while i < bytes.len()
                && ((bytes[i] as char).is_ascii_alphanumeric() || bytes[i] == b'_')
            {
                i += 1;
            }
            tokens.push(&source[start..i]);
        } else {
            let two = source.get(i..i + 2).unwrap_or("");
            let len = if ["==", "!=", "<=", ">=", "->"].contains(&two) {
                2
            } else {
                1
            };
            tokens.push(&source[i..i + len]);
            i += len;
        }
    }
    tokens
}

impl<'a> Parser<'a> {
    fn peek(&self) -> &'a str {
        self.tokens.get(self.at).copied().unwrap_or("")
    }
    fn next(&mut self) -> &'a str {
        let t = self.peek();
        self.at += 1;
        t
    }
    fn expect(&mut self, token: &str) {
        let t = self.next();
        assert_eq!(t, token, "expected {token:?} at token {}", self.at - 1);
    }
    fn function(&mut self) -> Function {
        self.expect("fn");
        let name = self.next().to_string();
        self.expect("(");
        let mut params = Vec::new();
        while self.peek() != ")" {
            params.push(self.next().to_string());
            if self.peek() == "," {
                self.next();
            }
        }
        self.expect(")");
        self.expect("->");
        self.expect("(");
        let result = self.next().to_string();
        self.expect(")");
        let body = self.block();
        Function {
            name,
            params,
            result,
            body,
        }
    }
    fn block(&mut self) -> Vec<Expr> {
        self.expect("{");
        let mut statements = Vec::new();
        while self.peek() != "}" {
            statements.push(self.statement());
        }
        self.expect("}");
        statements
    }
    fn statement(&mut self) -> Expr {
        if self.tokens.get(self.at + 1) == Some(&"=") {
            let name = self.next().to_string();
            self.expect("=");
            return Expr::Assign(name, Box::new(self.expression()));
        }
        self.expression()
    }
    fn expression(&mut self) -> Expr {
        let left = self.sum();
        if ["==", "!=", "<", "<=", ">", ">="].contains(&self.peek()) {
            let op = self.next().to_string();
            return Expr::Binary(op, Box::new(left), Box::new(self.sum()));
        }
        left
    }
    fn sum(&mut self) -> Expr {
        let mut left = self.product();
        while ["+", "-"].contains(&self.peek()) {
            let op = self.next().to_string();
            left = Expr::Binary(op, Box::new(left), Box::new(self.product()));
        }
        left
    }
    fn product(&mut self) -> Expr {
        let mut left = self.atom();
        while ["*", "/"].contains(&self.peek()) {
            let op = self.next().to_string();
            left = Expr::Binary(op, Box::new(left), Box::new(self.atom()));
        }
        left
    }
    fn atom(&mut self) -> Expr {
        let t = self.next();
        match t {
            "if" => {
                let condition = self.expression();
                let then = self.block();
                self.expect("else");
                Expr::IfElse(Box::new(condition), then, self.block())
            }
            "while" => {
                let condition = self.expression();
                Expr::While(Box::new(condition), self.block())
            }
            "&" => Expr::GlobalDataAddr(self.next().to_string()),
            "(" => {
                let e = self.expression();
                self.expect(")");
                e
            }
            _ if t.chars().all(|c| c.is_ascii_digit()) => Expr::Number(t.parse().unwrap()),
            _ if self.peek() == "(" => {
                self.next();
                let mut args = Vec::new();
                while self.peek() != ")" {
                    args.push(self.expression());
                    if self.peek() == "," {
                        self.next();
                    }
                }
                self.expect(")");
                Expr::Call(t.to_string(), args)
            }
            _ => Expr::Identifier(t.to_string()),
        }
    }
}

/// Translates one function's body, as the demo's `FunctionTranslator` does.
struct Translator<'a, 'b> {
    b: FunctionBuilder<'a>,
    variables: HashMap<String, Variable>,
    module: &'b mut KilnModule,
}

impl Translator<'_, '_> {
    fn variable(&mut self, name: &str) -> Variable {
        if let Some(&v) = self.variables.get(name) {
            return v;
        }
        let v = self.b.declare_var(I64);
        let zero = self.b.ins().iconst(I64, 0);
        self.b.def_var(v, zero);
        self.variables.insert(name.to_string(), v);
        v
    }
    fn block(&mut self, statements: &[Expr]) -> Value {
        let mut last = self.b.ins().iconst(I64, 0);
        for s in statements {
            last = self.expr(s);
        }
        last
    }
    fn expr(&mut self, e: &Expr) -> Value {
        match e {
            Expr::Number(n) => self.b.ins().iconst(I64, *n),
            Expr::Identifier(name) => {
                let v = self.variable(name);
                self.b.use_var(v)
            }
            Expr::Assign(name, value) => {
                let value = self.expr(value);
                let v = self.variable(name);
                self.b.def_var(v, value);
                value
            }
            Expr::Binary(op, l, r) => {
                let (l, r) = (self.expr(l), self.expr(r));
                let cc = match op.as_str() {
                    "+" => return self.b.ins().iadd(l, r),
                    "-" => return self.b.ins().isub(l, r),
                    "*" => return self.b.ins().imul(l, r),
                    "/" => return self.b.ins().sdiv(l, r),
                    "==" => IntCC::Equal,
                    "!=" => IntCC::NotEqual,
                    "<" => IntCC::SignedLessThan,
                    "<=" => IntCC::SignedLessThanOrEqual,
                    ">" => IntCC::SignedGreaterThan,
                    _ => IntCC::SignedGreaterThanOrEqual,
                };
                let flag = self.b.ins().icmp(cc, l, r);
                self.b.ins().uextend(I64, flag)
            }
            Expr::IfElse(condition, then, otherwise) => {
                let condition = self.expr(condition);
                let (then_block, else_block, merge) = (
                    self.b.create_block(),
                    self.b.create_block(),
                    self.b.create_block(),
                );
                self.b.append_block_param(merge, I64);
                self.b
                    .ins()
                    .brif(condition, then_block, &[], else_block, &[]);
                for (block, body) in [(then_block, then), (else_block, otherwise)] {
                    self.b.switch_to_block(block);
                    self.b.seal_block(block);
                    let value = self.block(body);
                    self.b.ins().jump(merge, &[value.into()]);
                }
                self.b.switch_to_block(merge);
                self.b.seal_block(merge);
                self.b.block_params(merge)[0]
            }
            Expr::While(condition, body) => {
                let (header, body_block, exit) = (
                    self.b.create_block(),
                    self.b.create_block(),
                    self.b.create_block(),
                );
                self.b.ins().jump(header, &[]);
                self.b.switch_to_block(header);
                let c = self.expr(condition);
                self.b.ins().brif(c, body_block, &[], exit, &[]);
                self.b.switch_to_block(body_block);
                self.b.seal_block(body_block);
                self.block(body);
                self.b.ins().jump(header, &[]);
                self.b.switch_to_block(exit);
                self.b.seal_block(header);
                self.b.seal_block(exit);
                self.b.ins().iconst(I64, 0)
            }
            Expr::Call(name, args) => {
                let mut sig = self.module.make_signature();
                for _ in args {
                    sig.params.push(AbiParam::new(I64));
                }
                sig.returns.push(AbiParam::new(I64));
                let callee = self
                    .module
                    .declare_function(name, Linkage::Import, &sig)
                    .unwrap();
                let callee = self.module.declare_func_in_func(callee, self.b.func);
                let args: Vec<Value> = args.iter().map(|a| self.expr(a)).collect();
                let call = self.b.ins().call(callee, &args);
                self.b.inst_results(call)[0]
            }
            Expr::GlobalDataAddr(name) => {
                let data = self
                    .module
                    .declare_data(name, Linkage::Export, true, false)
                    .unwrap();
                let gv = self.module.declare_data_in_func(data, self.b.func);
                self.b.ins().symbol_value(I64, gv)
            }
        }
    }
}

/// The toy JIT: compiles each function of `source` and finalizes them.
fn compile(module: &mut KilnModule, source: &str) -> Vec<(String, cranelift_module::FuncId)> {
    let mut parser = Parser {
        tokens: tokenize(source),
        at: 0,
    };
    let mut defined = Vec::new();
    let mut fctx = FunctionBuilderContext::new();
    while !parser.peek().is_empty() {
        let f = parser.function();
        let mut ctx = module.make_context();
        for _ in &f.params {
            ctx.func.signature.params.push(AbiParam::new(I64));
        }
        ctx.func.signature.returns.push(AbiParam::new(I64));
        let id = module
            .declare_function(&f.name, Linkage::Export, &ctx.func.signature)
            .unwrap();
        let config = module.target_config();
        {
            let mut b = FunctionBuilder::new(&mut ctx.func, &mut fctx);
            let entry = b.create_block();
            b.append_block_params_for_function_params(entry);
            b.switch_to_block(entry);
            b.seal_block(entry);
            let mut t = Translator {
                b,
                variables: HashMap::new(),
                module,
            };
            for (i, p) in f.params.iter().enumerate() {
                let value = t.b.block_params(entry)[i];
                let v = t.variable(p);
                t.b.def_var(v, value);
            }
            t.variable(&f.result);
            t.block(&f.body);
            let result = t.variables[&f.result];
            let value = t.b.use_var(result);
            t.b.ins().return_(&[value]);
            t.b.finalize(config);
        }
        module.define_function(id, &mut ctx).unwrap();
        defined.push((f.name, id));
    }
    module.finalize_definitions().unwrap();
    defined
}

fn call(module: &KilnModule, id: cranelift_module::FuncId, args: &[i64]) -> i64 {
    let code = module.get_finalized_function(id);
    // SAFETY: toy functions take and return i64s, as many as the source says.
    unsafe {
        match args {
            [] => std::mem::transmute::<*const u8, extern "C" fn() -> i64>(code)(),
            [a] => std::mem::transmute::<*const u8, extern "C" fn(i64) -> i64>(code)(*a),
            [a, b] => {
                std::mem::transmute::<*const u8, extern "C" fn(i64, i64) -> i64>(code)(*a, *b)
            }
            _ => unreachable!("the demo's functions take at most two"),
        }
    }
}

/// The demo's programs.
const FOO: &str = "
fn foo(a, b) -> (c) {
    c = if a {
        if b { 30 } else { 40 }
    } else { 50 }
    c = c + 2
}";

const FIB: &str = "
fn recursive_fib(n) -> (r) {
    r = if n == 0 { 0 } else {
        if n == 1 { 1 } else { recursive_fib(n - 1) + recursive_fib(n - 2) }
    }
}
fn iterative_fib(n) -> (r) {
    if n == 0 { r = 0 } else {
        n = n - 1
        a = 0
        r = 1
        while n != 0 {
            t = r
            r = r + a
            a = t
            n = n - 1
        }
    }
}";

const HELLO: &str = "
fn hello() -> (r) {
    puts(&hello_string)
    r = 0
}";

#[test]
fn the_demos_programs_give_the_demos_answers() {
    let mut m = KilnModule::new(KilnBuilder::new(default_libcall_names()).unwrap());
    let foo = compile(&mut m, FOO);
    assert_eq!(call(&m, foo[0].1, &[1, 0]), 42);
    assert_eq!(call(&m, foo[0].1, &[1, 1]), 32);
    assert_eq!(call(&m, foo[0].1, &[0, 1]), 52);
    let fib = compile(&mut m, FIB);
    for (name, id) in &fib {
        assert_eq!(call(&m, *id, &[10]), 55, "{name}");
        assert_eq!(call(&m, *id, &[0]), 0, "{name}");
    }
    // The demo's global string, then a function that passes its address to libc.
    let data = m
        .declare_data("hello_string", Linkage::Export, true, false)
        .unwrap();
    let mut description = DataDescription::new();
    description.define(b"hello world!\0".to_vec().into_boxed_slice());
    m.define_data(data, &description).unwrap();
    let hello = compile(&mut m, HELLO);
    assert_eq!(call(&m, hello[0].1, &[]), 0);
    let (address, size) = m.get_finalized_data(data);
    assert_eq!(size, 13);
    // SAFETY: the finalized string, alive with the module.
    let text = unsafe { std::ffi::CStr::from_ptr(address.cast()) };
    assert_eq!(text.to_str(), Ok("hello world!"));
    // The toy functions were finalized in three links; they still call each other.
    assert_eq!(call(&m, fib[0].1, &[20]), 6765);
}
