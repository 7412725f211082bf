//! The names a function uses, checked against what it may call and read: on a tree
//! ([`check`]) or on the body's source without building one ([`check_outline`], what a
//! lazy runtime does at load). Both report the same first error.

use crate::codegen::{count, Callees, CompileError};
use crate::syntax::{
    parse_outline_with, read_body, BinaryOp, Build, Expr, Function, FunctionOutline, OutlineItem,
    Place, Position, Statement, SyntaxError, UnaryOp,
};

/// Checks `f`'s calls and variables against `callees` without compiling it.
pub fn check(f: &Function, callees: &dyn Callees) -> Result<(), CompileError> {
    fn walk<'f>(
        f: &'f Function,
        e: &'f Expr,
        scopes: &mut Vec<Vec<&'f str>>,
        callees: &dyn Callees,
    ) -> Result<(), CompileError> {
        let err = |position, message: String| CompileError {
            function: f.name.clone(),
            position,
            message,
        };
        let known = |scopes: &Vec<Vec<&str>>, n: &str| scopes.iter().any(|s| s.contains(&n));
        match e {
            Expr::Number(_) => Ok(()),
            Expr::Var(n, p) => {
                if known(scopes, n) {
                    Ok(())
                } else {
                    Err(err(*p, format!("unknown variable '{n}'")))
                }
            }
            Expr::Assign(n, v, p) => {
                if !known(scopes, n) {
                    return Err(err(*p, format!("assignment to unknown variable '{n}'")));
                }
                walk(f, v, scopes, callees)
            }
            Expr::Unary(_, a) => walk(f, a, scopes, callees),
            Expr::Binary(..) => {
                // A chain as long as it likes, in a loop (only its operands recurse).
                let (first, operators) = e.left_spine();
                walk(f, first, scopes, callees)?;
                operators
                    .into_iter()
                    .try_for_each(|(_, right)| walk(f, right, scopes, callees))
            }
            Expr::While(a, b) => {
                walk(f, a, scopes, callees)?;
                walk(f, b, scopes, callees)
            }
            Expr::If(c, a, b) => {
                walk(f, c, scopes, callees)?;
                walk(f, a, scopes, callees)?;
                walk(f, b, scopes, callees)
            }
            Expr::Call(name, args, p) => {
                let Some(arity) = callees.arity(name) else {
                    return Err(err(*p, format!("unknown function '{name}'")));
                };
                if arity != args.len() {
                    return Err(err(
                        *p,
                        format!(
                            "'{name}' takes {}, given {}",
                            count(arity, "argument"),
                            args.len()
                        ),
                    ));
                }
                args.iter().try_for_each(|a| walk(f, a, scopes, callees))
            }
            Expr::Block(statements, value) => {
                scopes.push(Vec::new());
                for s in statements {
                    match s {
                        Statement::Let(n, v) => {
                            walk(f, v, scopes, callees)?;
                            if let Some(scope) = scopes.last_mut() {
                                scope.push(n);
                            }
                        }
                        Statement::Expr(v) => walk(f, v, scopes, callees)?,
                    }
                }
                if let Some(v) = value {
                    walk(f, v, scopes, callees)?;
                }
                scopes.pop();
                Ok(())
            }
        }
    }
    let mut scopes = vec![f.params.iter().map(String::as_str).collect()];
    walk(f, &f.body, &mut scopes, callees)
}

/// Checks the body of `f` (an outline of `source`) as [`check`] checks a tree — the same
/// first error, at the same position — reading the source without building a tree. The
/// source must be the one [`crate::syntax::parse_outline`] read `f` from.
pub fn check_outline(
    source: &str,
    f: &FunctionOutline,
    callees: &dyn Callees,
) -> Result<(), CompileError> {
    let mut names = BodyNames::default();
    names.body(&f.params.iter().map(String::as_str).collect::<Vec<_>>());
    read_body(source, f, &mut names).map_err(|e| CompileError {
        function: f.name.clone(),
        position: e.position,
        message: e.message,
    })?;
    names.check(0, source, f, callees)
}

/// Parses a program as [`crate::syntax::parse_outline`] does and reads the names of its
/// function bodies in the same pass: what [`check`] would find in the trees, found
/// without them or a second reading. Check each function with [`BodyNames::check`] once
/// every function it may call is known.
pub fn parse_checked(source: &str) -> Result<(Vec<OutlineItem>, BodyNames<'_>), SyntaxError> {
    let mut names = BodyNames::default();
    let items = parse_outline_with(source, &mut names)?;
    Ok((items, names))
}

/// What the bodies of a program use, read without trees: for each body (in source
/// order) its first error about a variable, and its calls, to check against the
/// functions known when [`BodyNames::check`] is called.
///
/// Errors are found in source order but for a call's arity (known at its `)`, after
/// errors in its arguments): the one of smallest offset is [`check`]'s first, whose walk
/// is in source order.
#[derive(Default)]
pub struct BodyNames<'s> {
    /// The variables in scope: one stack, a block's start marked by an empty name (no
    /// name is empty).
    scopes: Vec<&'s str>,
    bodies: Vec<BodyUses>,
    calls: Vec<CallUse<'s>>,
}

/// One body's first variable error (offset, message) and where its calls start.
struct BodyUses {
    variable_error: Option<(usize, String)>,
    first_call: usize,
}

/// A call: the callee's name, the number of arguments, the name's offset.
struct CallUse<'s> {
    name: &'s str,
    args: usize,
    offset: usize,
}

impl<'s> BodyNames<'s> {
    /// The first error of body `index` (the `index`-th function of the source read, `f`)
    /// as [`check`] reports it, its calls checked against `callees`.
    pub fn check(
        &self,
        index: usize,
        source: &str,
        f: &FunctionOutline,
        callees: &dyn Callees,
    ) -> Result<(), CompileError> {
        let Some(body) = self.bodies.get(index) else {
            return Err(CompileError {
                function: f.name.clone(),
                position: f.position,
                message: format!("no body {index} was read"),
            });
        };
        let end = self
            .bodies
            .get(index + 1)
            .map_or(self.calls.len(), |next| next.first_call);
        let mut first = body.variable_error.clone();
        for call in &self.calls[body.first_call..end] {
            if first
                .as_ref()
                .is_some_and(|(offset, _)| *offset < call.offset)
            {
                // Calls are in source order: no later one can come first.
                break;
            }
            let message = match callees.arity(call.name) {
                None => format!("unknown function '{}'", call.name),
                Some(arity) if arity != call.args => format!(
                    "'{}' takes {}, given {}",
                    call.name,
                    count(arity, "argument"),
                    call.args
                ),
                Some(_) => continue,
            };
            first = Some((call.offset, message));
        }
        match first {
            None => Ok(()),
            Some((offset, message)) => Err(CompileError {
                function: f.name.clone(),
                position: position_in(source, f, offset),
                message,
            }),
        }
    }

    fn known(&self, name: &str) -> bool {
        self.scopes.contains(&name)
    }

    fn variable_error(&mut self, at: Place, message: impl FnOnce() -> String) {
        if let Some(body) = self.bodies.last_mut() {
            if body.variable_error.is_none() {
                body.variable_error = Some((at.offset, message()));
            }
        }
    }
}

/// The line and column of byte `offset` of `f`'s body.
fn position_in(source: &str, f: &FunctionOutline, offset: usize) -> Position {
    let text = source.get(f.body.line_start..offset).unwrap_or("");
    let line = f.body.line as usize + text.matches('\n').count();
    let column = text.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    Position {
        line: line as u32,
        column: column as u32,
    }
}

impl<'s> Build<'s> for BodyNames<'s> {
    type Expr = ();
    type Statement = ();
    const POSITIONS: bool = false;
    fn body(&mut self, params: &[&'s str]) {
        self.scopes.clear();
        self.scopes.extend_from_slice(params);
        self.bodies.push(BodyUses {
            variable_error: None,
            first_call: self.calls.len(),
        });
    }
    fn number(&mut self, _: i64) {}
    fn var(&mut self, name: &'s str, at: Place) {
        if !self.known(name) {
            self.variable_error(at, || format!("unknown variable '{name}'"));
        }
    }
    fn unary(&mut self, _: UnaryOp, _: ()) {}
    fn binary(&mut self, _: BinaryOp, _: (), _: ()) {}
    fn call_name(&mut self, _: &'s str, _: Place) {}
    fn call(&mut self, name: &'s str, args: Vec<()>, at: Place) {
        // Kept in the order of their names (a call inside another's arguments ends first).
        let call = CallUse {
            name,
            args: args.len(),
            offset: at.offset,
        };
        let first = self.bodies.last().map_or(0, |b| b.first_call);
        let at = self.calls[first..].partition_point(|c| c.offset < call.offset) + first;
        self.calls.insert(at, call);
    }
    fn if_then_else(&mut self, _: (), _: (), _: ()) {}
    fn while_do(&mut self, _: (), _: ()) {}
    fn assign_name(&mut self, name: &'s str, at: Place) {
        if !self.known(name) {
            self.variable_error(at, || format!("assignment to unknown variable '{name}'"));
        }
    }
    fn assign(&mut self, _: &'s str, _: (), _: Place) {}
    fn block_open(&mut self) {
        self.scopes.push("");
    }
    fn let_statement(&mut self, name: &'s str, _: ()) {
        self.scopes.push(name);
    }
    fn expr_statement(&mut self, _: ()) {}
    fn block(&mut self, _: Vec<()>, _: Option<()>) {
        while let Some(name) = self.scopes.pop() {
            if name.is_empty() {
                break;
            }
        }
    }
}
