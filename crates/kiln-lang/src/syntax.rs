//! The language's syntax: a lexer and a recursive-descent parser.
//!
//! ```text
//! program   := item*
//! item      := "extern" "fn" NAME "(" [param ("," param)*] ")" ["->" type] ";"
//!            | "fn" NAME "(" [NAME ("," NAME)*] ")" "=" expr ";"
//!            | expr ";"                                 (evaluated when loaded)
//! param     := NAME [":" type]          type := "i64" | "i32"
//! expr      := "if" expr "then" expr "else" expr
//!            | "while" expr "do" expr
//!            | NAME "=" expr                            (assignment to a local)
//!            | or
//! or        := and ("||" and)*          and := cmp ("&&" cmp)*
//! cmp       := sum [("==" | "!=" | "<" | "<=" | ">" | ">=") sum]
//! sum       := product (("+" | "-") product)*
//! product   := unary (("*" | "/" | "%") unary)*
//! unary     := ("-" | "!") unary | atom
//! atom      := NUMBER | NAME | NAME "(" [expr ("," expr)*] ")" | "(" expr ")"
//!            | "{" (("let" NAME "=" expr | expr) ";")* [expr] "}"
//! ```
//!
//! Every value is a 64-bit integer (arithmetic wraps; `x / 0` and `x % 0` are 0);
//! comparisons give 0 or 1; `if` and `while` test for
//! non-zero; a block's value is its last expression (0 if it ends with `;`), a `while`'s
//! is 0. `#` starts a comment.
//!
//! Nesting is limited ([`MAX_NESTING`]): parentheses, blocks, `if`s, `while`s,
//! assignments, call arguments, unary operators and the right operands of binary operators
//! each count one level, so that no program makes the parser, the checker or the code
//! generator overflow a thread's stack (2 MiB for a test thread); a deeper program is a
//! "too deeply nested" error at the place the limit was passed. A chain of binary
//! operators (`1 + 1 + …`, as long as it likes) is read in a loop and built leaning left;
//! whatever walks the tree walks such a left spine in a loop too ([`Expr::left_spine`]),
//! and dropping a tree takes it apart with a work list.

use std::fmt;

/// Where in the source: 1-based line and column.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Position {
    /// Line.
    pub line: u32,
    /// Column.
    pub column: u32,
}

impl fmt::Display for Position {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.line, self.column)
    }
}

/// How deeply expressions may nest (see the module's documentation for what counts). C
/// promises 63 levels of parentheses and 127 of blocks; this is 128 of either.
pub const MAX_NESTING: u32 = 128;

/// The precedence level of comparisons (which do not chain).
const COMPARISON: usize = 2;

/// A syntax error.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{position}: {message}")]
pub struct SyntaxError {
    /// Where.
    pub position: Position,
    /// What.
    pub message: String,
}

/// A binary operator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BinaryOp {
    /// `+`
    Add,
    /// `-`
    Sub,
    /// `*`
    Mul,
    /// `/` (signed, truncating; `x / 0` is 0, `MIN / -1` wraps to `MIN`)
    Div,
    /// `%` (the remainder of `/`; `x % 0` is 0)
    Rem,
    /// `==`
    Eq,
    /// `!=`
    Ne,
    /// `<`
    Lt,
    /// `<=`
    Le,
    /// `>`
    Gt,
    /// `>=`
    Ge,
    /// `&&` (both sides evaluated)
    And,
    /// `||` (both sides evaluated)
    Or,
}

/// A unary operator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UnaryOp {
    /// `-`
    Neg,
    /// `!` (1 for 0, else 0)
    Not,
}

/// An expression.
#[derive(Debug, Clone, PartialEq)]
pub enum Expr {
    /// A literal.
    Number(i64),
    /// A parameter or local.
    Var(String, Position),
    /// `-e`, `!e`.
    Unary(UnaryOp, Box<Expr>),
    /// `a op b`.
    Binary(BinaryOp, Box<Expr>, Box<Expr>),
    /// `f(args)`.
    Call(String, Vec<Expr>, Position),
    /// `if c then a else b`.
    If(Box<Expr>, Box<Expr>, Box<Expr>),
    /// `while c do body`.
    While(Box<Expr>, Box<Expr>),
    /// `name = value`.
    Assign(String, Box<Expr>, Position),
    /// `{ statements; value }`.
    Block(Vec<Statement>, Option<Box<Expr>>),
}

impl Expr {
    /// A chain of binary operators leaning left, walked in a loop: the innermost left
    /// operand, then each operator with its right operand, innermost first. For
    /// `1 + 2 * 3 - 4` that is `1`, then `(+, 2 * 3)`, `(-, 4)`. Any other expression is its
    /// own first operand with no operators.
    pub fn left_spine(&self) -> (&Expr, Vec<(BinaryOp, &Expr)>) {
        let mut operators = Vec::new();
        let mut e = self;
        while let Expr::Binary(op, left, right) = e {
            operators.push((*op, &**right));
            e = left;
        }
        operators.reverse();
        (e, operators)
    }

    /// Moves this expression's operands into `out`, leaving it shallow.
    fn take_operands(&mut self, out: &mut Vec<Expr>) {
        fn take(out: &mut Vec<Expr>, e: &mut Expr) {
            out.push(std::mem::replace(e, Expr::Number(0)));
        }
        match self {
            Expr::Number(_) | Expr::Var(..) => {}
            Expr::Unary(_, a) | Expr::Assign(_, a, _) => take(out, a),
            Expr::Binary(_, a, b) | Expr::While(a, b) => {
                take(out, a);
                take(out, b);
            }
            Expr::If(c, a, b) => {
                take(out, c);
                take(out, a);
                take(out, b);
            }
            Expr::Call(_, args, _) => out.append(args),
            Expr::Block(statements, value) => {
                out.extend(statements.drain(..).map(|s| match s {
                    Statement::Let(_, e) | Statement::Expr(e) => e,
                }));
                if let Some(v) = value {
                    take(out, v);
                }
            }
        }
    }
}

impl Drop for Expr {
    /// Takes the tree apart with a work list: the drop the compiler writes recurses once
    /// per level, and a chain of 20,000 operators is 20,000 levels.
    fn drop(&mut self) {
        let mut pending = Vec::new();
        self.take_operands(&mut pending);
        while let Some(mut e) = pending.pop() {
            e.take_operands(&mut pending);
        }
    }
}

/// A statement of a block.
#[derive(Debug, Clone, PartialEq)]
pub enum Statement {
    /// `let name = value;`
    Let(String, Expr),
    /// `expr;`
    Expr(Expr),
}

/// A type of an `extern` function's parameter or result.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Type {
    /// 64-bit integer (the default).
    I64,
    /// 32-bit integer (C's `int`): truncated on the way in, sign-extended on the way out.
    I32,
}

/// A function of the language.
#[derive(Debug, Clone, PartialEq)]
pub struct Function {
    /// Its name (the symbol it is linked as).
    pub name: String,
    /// Its parameters.
    pub params: Vec<String>,
    /// Its body.
    pub body: Expr,
    /// Where it is defined.
    pub position: Position,
}

/// A function of the host or of a C library.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Extern {
    /// Its symbol.
    pub name: String,
    /// Its parameters' types.
    pub params: Vec<Type>,
    /// Its result's type.
    pub result: Type,
}

/// A top-level item.
#[derive(Debug, Clone, PartialEq)]
pub enum Item {
    /// `fn …`
    Function(Function),
    /// `extern fn …`
    Extern(Extern),
    /// An expression to evaluate.
    Expr(Expr),
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Token<'s> {
    Number(i64),
    Name(&'s str),
    Symbol(&'static str),
    End,
}

const SYMBOLS: [&str; 24] = [
    "->", "==", "!=", "<=", ">=", "&&", "||", "(", ")", "{", "}", ",", ";", ":", "=", "<", ">",
    "+", "-", "*", "/", "%", "!", ".",
];

const KEYWORDS: [&str; 9] = [
    "fn", "extern", "let", "if", "then", "else", "while", "do", "in",
];

/// Byte offsets to positions.
struct Lines<'s> {
    source: &'s str,
    /// Where each line starts.
    starts: Vec<usize>,
}

impl Lines<'_> {
    fn position(&self, offset: usize) -> Position {
        let line = self.starts.partition_point(|&s| s <= offset).max(1);
        let start = self.starts[line - 1];
        Position {
            line: line as u32,
            column: (self.source[start..offset].chars().count() + 1) as u32,
        }
    }
}

/// The tokens of a source, one at a time (a program's tokens are never all held at once),
/// each with its byte offset (positions are worked out only for what needs one).
struct Lexer<'s> {
    source: &'s str,
    at: usize,
    lines: Lines<'s>,
}

impl<'s> Lexer<'s> {
    fn new(source: &'s str) -> Self {
        Lexer {
            source,
            at: 0,
            lines: Lines {
                source,
                starts: vec![0],
            },
        }
    }

    fn token(&mut self) -> Result<(Token<'s>, usize), SyntaxError> {
        let source = self.source;
        let bytes = source.as_bytes();
        let mut i = self.at;
        while i < bytes.len() {
            let c = bytes[i];
            if c == b'\n' {
                i += 1;
                self.lines.starts.push(i);
            } else if c.is_ascii_whitespace() {
                i += 1;
            } else if c == b'#' {
                while i < bytes.len() && bytes[i] != b'\n' {
                    i += 1;
                }
            } else {
                break;
            }
        }
        let start = i;
        if i == bytes.len() {
            self.at = i;
            return Ok((Token::End, i));
        }
        let c = bytes[i];
        let token = if c.is_ascii_digit() {
            while i < bytes.len() && bytes[i].is_ascii_alphanumeric() {
                i += 1;
            }
            let text = &source[start..i];
            let value = text.parse::<i64>().map_err(|_| SyntaxError {
                position: self.lines.position(start),
                message: format!("'{text}' is not a 64-bit integer"),
            })?;
            Token::Number(value)
        } else if c.is_ascii_alphabetic() || c == b'_' || c >= 0x80 {
            let rest = &source[start..];
            let len = rest
                .char_indices()
                .find(|(_, ch)| !(ch.is_alphanumeric() || *ch == '_'))
                .map_or(rest.len(), |(at, _)| at);
            if len == 0 {
                let ch = rest.chars().next().unwrap_or('?');
                return Err(SyntaxError {
                    position: self.lines.position(start),
                    message: format!("unexpected character '{ch}'"),
                });
            }
            i += len;
            Token::Name(&source[start..i])
        } else {
            let rest = &bytes[i..bytes.len().min(i + 2)];
            let symbol = SYMBOLS
                .iter()
                .find(|s| rest.starts_with(s.as_bytes()))
                .ok_or_else(|| SyntaxError {
                    position: self.lines.position(start),
                    message: format!(
                        "unexpected character '{}'",
                        source[i..].chars().next().unwrap_or('?')
                    ),
                })?;
            i += symbol.len();
            Token::Symbol(symbol)
        };
        self.at = i;
        Ok((token, start))
    }
}

/// Parses a program (a file, or a line of the REPL).
pub fn parse(source: &str) -> Result<Vec<Item>, SyntaxError> {
    let mut parser = Parser {
        lexer: Lexer::new(source),
        current: (Token::End, 0),
        ahead: None,
        lex_error: None,
        depth: 0,
    };
    parser.current = parser.lex();
    let mut items = Vec::new();
    let parsed = (|| {
        while parser.peek() != &Token::End {
            items.push(parser.item()?);
        }
        Ok(())
    })();
    // A character the lexer refused ends the tokens early: its error is the one to
    // report, whatever the parser made of the early end.
    match (parser.lex_error.take(), parsed) {
        (Some(error), _) | (None, Err(error)) => Err(error),
        (None, Ok(())) => Ok(items),
    }
}

struct Parser<'s> {
    lexer: Lexer<'s>,
    current: (Token<'s>, usize),
    /// The token after `current`, once looked at.
    ahead: Option<(Token<'s>, usize)>,
    lex_error: Option<SyntaxError>,
    /// How deeply the expression being parsed is nested (see [`MAX_NESTING`]).
    depth: u32,
}

impl<'s> Parser<'s> {
    fn peek(&self) -> &Token<'s> {
        &self.current.0
    }

    fn lex(&mut self) -> (Token<'s>, usize) {
        if self.lex_error.is_some() {
            return (Token::End, self.lexer.at);
        }
        self.lexer.token().unwrap_or_else(|error| {
            let at = self.lexer.at;
            self.lex_error = Some(error);
            (Token::End, at)
        })
    }

    /// The token after the current one.
    fn peek_second(&mut self) -> Token<'s> {
        if self.ahead.is_none() {
            self.ahead = Some(self.lex());
        }
        self.ahead.map_or(Token::End, |(t, _)| t)
    }

    fn position(&self) -> Position {
        self.lexer.lines.position(self.current.1)
    }

    fn next(&mut self) -> Token<'s> {
        let token = self.current.0;
        if token != Token::End || self.ahead.is_some() {
            self.current = match self.ahead.take() {
                Some(t) => t,
                None => self.lex(),
            };
        }
        token
    }

    fn error<T>(&self, message: impl Into<String>) -> Result<T, SyntaxError> {
        Err(SyntaxError {
            position: self.position(),
            message: message.into(),
        })
    }

    fn is(&self, symbol: &str) -> bool {
        matches!(self.peek(), Token::Symbol(s) if *s == symbol)
            || matches!(self.peek(), Token::Name(n) if *n == symbol)
    }

    fn eat(&mut self, symbol: &str) -> bool {
        let yes = self.is(symbol);
        if yes {
            self.next();
        }
        yes
    }

    fn expect(&mut self, symbol: &str) -> Result<(), SyntaxError> {
        if self.eat(symbol) {
            Ok(())
        } else {
            self.error(format!("expected '{symbol}', found {}", self.describe()))
        }
    }

    fn describe(&self) -> String {
        match self.peek() {
            Token::Number(n) => format!("{n}"),
            Token::Name(n) => format!("'{n}'"),
            Token::Symbol(s) => format!("'{s}'"),
            Token::End => "the end".into(),
        }
    }

    fn name(&mut self) -> Result<String, SyntaxError> {
        match *self.peek() {
            Token::Name(n) if !KEYWORDS.contains(&n) => {
                self.next();
                Ok(n.to_string())
            }
            _ => self.error(format!("expected a name, found {}", self.describe())),
        }
    }

    fn item(&mut self) -> Result<Item, SyntaxError> {
        let position = self.position();
        if self.eat("extern") {
            self.expect("fn")?;
            let name = self.name()?;
            self.expect("(")?;
            let mut params = Vec::new();
            while !self.is(")") {
                self.name()?;
                params.push(if self.eat(":") { self.ty()? } else { Type::I64 });
                if !self.eat(",") {
                    break;
                }
            }
            self.expect(")")?;
            let result = if self.eat("->") {
                self.ty()?
            } else {
                Type::I64
            };
            self.expect(";")?;
            return Ok(Item::Extern(Extern {
                name,
                params,
                result,
            }));
        }
        if self.eat("fn") {
            let name = self.name()?;
            self.expect("(")?;
            let mut params = Vec::new();
            while !self.is(")") {
                params.push(self.name()?);
                if !self.eat(",") {
                    break;
                }
            }
            self.expect(")")?;
            self.expect("=")?;
            let body = self.expr()?;
            self.expect(";")?;
            return Ok(Item::Function(Function {
                name,
                params,
                body,
                position,
            }));
        }
        if self.is("let") {
            return self.error("'let' belongs in a block: { let x = 1; x + 1 }");
        }
        let expr = self.expr()?;
        if !self.eat(";") && self.peek() != &Token::End {
            return self.error(format!("expected ';', found {}", self.describe()));
        }
        Ok(Item::Expr(expr))
    }

    fn ty(&mut self) -> Result<Type, SyntaxError> {
        match self.name()?.as_str() {
            "i64" => Ok(Type::I64),
            "i32" => Ok(Type::I32),
            other => self.error(format!("unknown type '{other}' (i64 or i32)")),
        }
    }

    /// One level deeper, or a "too deeply nested" error here.
    fn deeper(&mut self) -> Result<(), SyntaxError> {
        if self.depth >= MAX_NESTING {
            return self.too_deep();
        }
        self.depth += 1;
        Ok(())
    }

    #[cold]
    fn too_deep(&self) -> Result<(), SyntaxError> {
        self.error(format!(
            "too deeply nested (more than {MAX_NESTING} levels of parentheses, blocks, \
             conditions, calls or operators)"
        ))
    }

    fn expr(&mut self) -> Result<Expr, SyntaxError> {
        self.deeper()?;
        let expr = self.expr_at_depth();
        self.depth -= 1;
        expr
    }

    // The parser's functions on the way down a nesting level (expr, expr_at_depth,
    // binary, unary, atom) are kept small, each construct's own work in a function of
    // its own: a debug build gives every local of a function its own stack slot, so one
    // big function would make each level of nesting cost several kilobytes.
    fn expr_at_depth(&mut self) -> Result<Expr, SyntaxError> {
        if self.eat("if") {
            return self.if_then_else();
        }
        if self.eat("while") {
            return self.while_do();
        }
        if let (Token::Name(n), Token::Symbol("=")) = (*self.peek(), self.peek_second()) {
            if !KEYWORDS.contains(&n) {
                return self.assignment(n);
            }
        }
        self.binary(0)
    }

    fn if_then_else(&mut self) -> Result<Expr, SyntaxError> {
        let c = self.expr()?;
        self.expect("then")?;
        let a = self.expr()?;
        self.expect("else")?;
        let b = self.expr()?;
        Ok(Expr::If(Box::new(c), Box::new(a), Box::new(b)))
    }

    fn while_do(&mut self) -> Result<Expr, SyntaxError> {
        let c = self.expr()?;
        self.expect("do")?;
        let body = self.expr()?;
        Ok(Expr::While(Box::new(c), Box::new(body)))
    }

    fn assignment(&mut self, name: &str) -> Result<Expr, SyntaxError> {
        let position = self.position();
        self.next();
        self.next();
        let value = self.expr()?;
        Ok(Expr::Assign(name.to_string(), Box::new(value), position))
    }

    /// The binary operator at the current token, with its precedence level (0 = loosest).
    fn binary_operator(&self) -> Option<(usize, BinaryOp)> {
        const LEVELS: [&[(&str, BinaryOp)]; 5] = [
            &[("||", BinaryOp::Or)],
            &[("&&", BinaryOp::And)],
            &[
                ("==", BinaryOp::Eq),
                ("!=", BinaryOp::Ne),
                ("<=", BinaryOp::Le),
                (">=", BinaryOp::Ge),
                ("<", BinaryOp::Lt),
                (">", BinaryOp::Gt),
            ],
            &[("+", BinaryOp::Add), ("-", BinaryOp::Sub)],
            &[
                ("*", BinaryOp::Mul),
                ("/", BinaryOp::Div),
                ("%", BinaryOp::Rem),
            ],
        ];
        let Token::Symbol(symbol) = *self.peek() else {
            return None;
        };
        LEVELS.iter().enumerate().find_map(|(level, operators)| {
            operators
                .iter()
                .find(|(s, _)| *s == symbol)
                .map(|&(_, op)| (level, op))
        })
    }

    /// Binary operators of level `min` or tighter, by precedence climbing: a chain
    /// (`1 + 1 + …`) is read in a loop and built leaning left, its right operands (of
    /// tighter operators) one level deeper; one call whatever the number of levels.
    fn binary(&mut self, min: usize) -> Result<Expr, SyntaxError> {
        let mut left = self.unary()?;
        while let Some((level, op)) = self.binary_operator() {
            if level < min {
                break;
            }
            self.next();
            self.deeper()?;
            let right = self.binary(level + 1);
            self.depth -= 1;
            left = Expr::Binary(op, Box::new(left), Box::new(right?));
            if level == COMPARISON && matches!(self.binary_operator(), Some((COMPARISON, _))) {
                return self.error("comparisons do not chain: write (a < b) == c");
            }
        }
        Ok(left)
    }

    /// Prefix operators, read in a loop (not one call each), then their operand.
    fn unary(&mut self) -> Result<Expr, SyntaxError> {
        let depth = self.depth;
        let mut operators = Vec::new();
        let operand = (|| {
            loop {
                let op = if self.is("-") {
                    UnaryOp::Neg
                } else if self.is("!") {
                    UnaryOp::Not
                } else {
                    break;
                };
                self.deeper()?;
                self.next();
                operators.push(op);
            }
            self.atom()
        })();
        self.depth = depth;
        let mut expr = operand?;
        for op in operators.into_iter().rev() {
            expr = Expr::Unary(op, Box::new(expr));
        }
        Ok(expr)
    }

    fn atom(&mut self) -> Result<Expr, SyntaxError> {
        match *self.peek() {
            Token::Number(n) => {
                self.next();
                Ok(Expr::Number(n))
            }
            Token::Symbol("(") => self.parenthesized(),
            Token::Symbol("{") => self.block(),
            Token::Name(_) => self.variable_or_call(),
            _ => self.not_an_expression(),
        }
    }

    fn parenthesized(&mut self) -> Result<Expr, SyntaxError> {
        self.next();
        let e = self.expr()?;
        self.expect(")")?;
        Ok(e)
    }

    fn block(&mut self) -> Result<Expr, SyntaxError> {
        self.next();
        let mut statements = Vec::new();
        loop {
            if self.eat("}") {
                return Ok(Expr::Block(statements, None));
            }
            let statement = if self.eat("let") {
                let name = self.name()?;
                self.expect("=")?;
                Statement::Let(name, self.expr()?)
            } else {
                let e = self.expr()?;
                if self.eat("}") {
                    return Ok(Expr::Block(statements, Some(Box::new(e))));
                }
                Statement::Expr(e)
            };
            self.expect(";")?;
            statements.push(statement);
        }
    }

    fn variable_or_call(&mut self) -> Result<Expr, SyntaxError> {
        let position = self.position();
        let name = self.name()?;
        if !self.eat("(") {
            return Ok(Expr::Var(name, position));
        }
        let mut args = Vec::new();
        while !self.is(")") {
            args.push(self.expr()?);
            if !self.eat(",") {
                break;
            }
        }
        self.expect(")")?;
        Ok(Expr::Call(name, args, position))
    }

    #[cold]
    fn not_an_expression(&self) -> Result<Expr, SyntaxError> {
        self.error(format!("expected an expression, found {}", self.describe()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn precedence_and_items() {
        let items = parse("extern fn putchar(c: i32) -> i32; fn f(a, b) = a + b * 2 < 7; f(1, 2);")
            .unwrap();
        assert_eq!(items.len(), 3);
        let Item::Function(f) = &items[1] else {
            panic!()
        };
        assert_eq!(f.params, ["a", "b"]);
        let Expr::Binary(BinaryOp::Lt, sum, _) = &f.body else {
            panic!("{:?}", f.body)
        };
        assert!(matches!(&**sum, Expr::Binary(BinaryOp::Add, _, _)));
        assert_eq!(
            items[0],
            Item::Extern(Extern {
                name: "putchar".into(),
                params: vec![Type::I32],
                result: Type::I32
            })
        );
    }

    #[test]
    fn deep_programs_are_errors_that_say_where_not_overflows() {
        let deep = [
            format!("{}1{}", "(".repeat(5_000), ")".repeat(5_000)),
            format!("1{};", "+(1".repeat(20_000)),
            format!("{}1;", "-".repeat(100_000)),
            format!("{}1;", "!".repeat(100_000)),
            format!("{}1{}", "{".repeat(20_000), "}".repeat(20_000)),
            format!(
                "{}1{};",
                "if 1 then ".repeat(20_000),
                " else 0".repeat(20_000)
            ),
            format!("fn f(x) = {}1;", "x = ".repeat(20_000)),
            format!("fn f(x) = {}1{};", "f(".repeat(20_000), ")".repeat(20_000)),
            format!("fn f(x) = {}1;", "while 1 do ".repeat(20_000)),
        ];
        for program in &deep {
            let e = parse(program).unwrap_err();
            assert!(e.message.contains("too deeply nested"), "{e}");
            assert_eq!(e.position.line, 1, "{e}");
            assert!(e.position.column > MAX_NESTING / 2, "{e}");
        }
        // Up to the limit, programs parse.
        let n = MAX_NESTING as usize - 1;
        assert!(parse(&format!("{}1{};", "(".repeat(n), ")".repeat(n))).is_ok());
        assert!(parse(&format!("{}1;", "-".repeat(n - 1))).is_ok());
        // A flat chain is not deep, however long: a loop builds it, a loop drops it.
        let items = parse(&format!("1{};", "+1".repeat(199_999))).unwrap();
        let Item::Expr(sum) = &items[0] else { panic!() };
        let (first, operators) = sum.left_spine();
        assert_eq!((first, operators.len()), (&Expr::Number(1), 199_999));
        assert!(parse("1 < 2 < 3;")
            .unwrap_err()
            .message
            .contains("do not chain"));
        assert!(parse("(1 < 2) < 3;").is_ok());
        // Many statements and arguments are flat, not deep.
        let statements = format!("{{ {} 1 }};", "1;".repeat(50_000));
        assert!(parse(&statements).is_ok());
    }

    #[test]
    fn errors_say_where() {
        let e = parse("fn f(x) = x +;").unwrap_err();
        assert_eq!(
            e.position,
            Position {
                line: 1,
                column: 14
            }
        );
        assert!(e.message.contains("expected an expression"), "{e}");
        let e = parse("fn f(x) =\n  99999999999999999999;").unwrap_err();
        assert_eq!(e.position.line, 2);
        assert!(parse("fn if(x) = x;").is_err());
        assert!(parse("1 $ 2").unwrap_err().message.contains("'$'"));
    }
}
