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
    /// A symbol or a keyword (compared as a small integer, not as text).
    Symbol(Sym),
    End,
}

/// The language's symbols and keywords.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Sym {
    Arrow,
    EqEq,
    Ne,
    Le,
    Ge,
    AndAnd,
    OrOr,
    LParen,
    RParen,
    LBrace,
    RBrace,
    Comma,
    Semi,
    Colon,
    Assign,
    Lt,
    Gt,
    Plus,
    Minus,
    Star,
    Slash,
    Percent,
    Bang,
    Dot,
    Fn,
    Extern,
    Let,
    If,
    Then,
    Else,
    While,
    Do,
    In,
}

impl Sym {
    /// As written.
    fn text(self) -> &'static str {
        match self {
            Sym::Arrow => "->",
            Sym::EqEq => "==",
            Sym::Ne => "!=",
            Sym::Le => "<=",
            Sym::Ge => ">=",
            Sym::AndAnd => "&&",
            Sym::OrOr => "||",
            Sym::LParen => "(",
            Sym::RParen => ")",
            Sym::LBrace => "{",
            Sym::RBrace => "}",
            Sym::Comma => ",",
            Sym::Semi => ";",
            Sym::Colon => ":",
            Sym::Assign => "=",
            Sym::Lt => "<",
            Sym::Gt => ">",
            Sym::Plus => "+",
            Sym::Minus => "-",
            Sym::Star => "*",
            Sym::Slash => "/",
            Sym::Percent => "%",
            Sym::Bang => "!",
            Sym::Dot => ".",
            Sym::Fn => "fn",
            Sym::Extern => "extern",
            Sym::Let => "let",
            Sym::If => "if",
            Sym::Then => "then",
            Sym::Else => "else",
            Sym::While => "while",
            Sym::Do => "do",
            Sym::In => "in",
        }
    }

    /// The keyword `name` is, if it is one (not a name a program may give).
    fn keyword(name: &str) -> Option<Sym> {
        Some(match name {
            "fn" => Sym::Fn,
            "extern" => Sym::Extern,
            "let" => Sym::Let,
            "if" => Sym::If,
            "then" => Sym::Then,
            "else" => Sym::Else,
            "while" => Sym::While,
            "do" => Sym::Do,
            "in" => Sym::In,
            _ => return None,
        })
    }

    /// The symbol that starts with byte `c` (followed by `next`), two bytes long if there
    /// is one.
    fn at(c: u8, next: Option<u8>) -> Option<Sym> {
        let two = match (c, next) {
            (b'-', Some(b'>')) => Some(Sym::Arrow),
            (b'=', Some(b'=')) => Some(Sym::EqEq),
            (b'!', Some(b'=')) => Some(Sym::Ne),
            (b'<', Some(b'=')) => Some(Sym::Le),
            (b'>', Some(b'=')) => Some(Sym::Ge),
            (b'&', Some(b'&')) => Some(Sym::AndAnd),
            (b'|', Some(b'|')) => Some(Sym::OrOr),
            _ => None,
        };
        two.or(match c {
            b'(' => Some(Sym::LParen),
            b')' => Some(Sym::RParen),
            b'{' => Some(Sym::LBrace),
            b'}' => Some(Sym::RBrace),
            b',' => Some(Sym::Comma),
            b';' => Some(Sym::Semi),
            b':' => Some(Sym::Colon),
            b'=' => Some(Sym::Assign),
            b'<' => Some(Sym::Lt),
            b'>' => Some(Sym::Gt),
            b'+' => Some(Sym::Plus),
            b'-' => Some(Sym::Minus),
            b'*' => Some(Sym::Star),
            b'/' => Some(Sym::Slash),
            b'%' => Some(Sym::Percent),
            b'!' => Some(Sym::Bang),
            b'.' => Some(Sym::Dot),
            _ => None,
        })
    }
}

/// Byte offsets to positions.
struct Lines<'s> {
    source: &'s str,
    /// The number of the line `starts[0]` starts.
    first_line: u32,
    /// Where each line starts (from the first the lexer saw).
    starts: Vec<usize>,
}

impl Lines<'_> {
    fn position(&self, offset: usize) -> Position {
        let index = self.starts.partition_point(|&s| s <= offset).max(1) - 1;
        let start = self.starts[index];
        Position {
            line: self.first_line + index as u32,
            column: (self
                .source
                .get(start..offset)
                .map_or(0, |s| s.chars().count())
                + 1) as u32,
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
        Self::starting_at(source, 0, 1, 0)
    }

    /// A lexer that starts at byte `at`, on line `line` which starts at `line_start`.
    fn starting_at(source: &'s str, at: usize, line: u32, line_start: usize) -> Self {
        Lexer {
            source,
            at: at.min(source.len()),
            lines: Lines {
                source,
                first_line: line,
                starts: vec![line_start.min(at)],
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
            // Up to 18 digits cannot overflow: summed here; anything else through `parse`.
            let value = if text.len() <= 18 && text.bytes().all(|b| b.is_ascii_digit()) {
                Ok(text.bytes().fold(0i64, |v, b| v * 10 + i64::from(b - b'0')))
            } else {
                text.parse::<i64>()
            };
            Token::Number(value.map_err(|_| SyntaxError {
                position: self.lines.position(start),
                message: format!("'{text}' is not a 64-bit integer"),
            })?)
        } else if c.is_ascii_alphabetic() || c == b'_' || c >= 0x80 {
            // ASCII names byte by byte; a name with other letters by characters.
            while i < bytes.len() && (bytes[i].is_ascii_alphanumeric() || bytes[i] == b'_') {
                i += 1;
            }
            if i < bytes.len() && bytes[i] >= 0x80 {
                let rest = &source[start..];
                i = start
                    + rest
                        .char_indices()
                        .find(|(_, ch)| !(ch.is_alphanumeric() || *ch == '_'))
                        .map_or(rest.len(), |(at, _)| at);
            }
            if i == start {
                let ch = source[start..].chars().next().unwrap_or('?');
                return Err(SyntaxError {
                    position: self.lines.position(start),
                    message: format!("unexpected character '{ch}'"),
                });
            }
            let name = &source[start..i];
            Sym::keyword(name).map_or(Token::Name(name), Token::Symbol)
        } else {
            let symbol = Sym::at(c, bytes.get(i + 1).copied()).ok_or_else(|| SyntaxError {
                position: self.lines.position(start),
                message: format!(
                    "unexpected character '{}'",
                    source[i..].chars().next().unwrap_or('?')
                ),
            })?;
            i += symbol.text().len();
            Token::Symbol(symbol)
        };
        self.at = i;
        Ok((token, start))
    }
}

/// What the parser makes of an expression, as it reads it: a tree ([`Tree`]), nothing at
/// all (a check of the syntax alone), or a check of names that builds nothing
/// (`codegen::check_body`). One grammar, several products: a body can be read at load
/// without a tree and read again into one when it is first compiled.
///
/// The methods are called in source order: a call's or an assignment's name before its
/// operands (`call_name`, `assign_name`), a `let`'s name after its value, a block's
/// opening before its statements. `Expr` and `Statement` of `()` make every `Vec` and
/// `Box` of the parser free (they allocate nothing for a zero-sized type).
pub trait Build<'s> {
    /// An expression made.
    type Expr;
    /// A block's statement made.
    type Statement;
    /// Whether the builder wants [`Place::position`] filled in (working it out costs).
    const POSITIONS: bool;
    /// A literal.
    fn number(&mut self, n: i64) -> Self::Expr;
    /// A variable read.
    fn var(&mut self, name: &'s str, at: Place) -> Self::Expr;
    /// `-e`, `!e`.
    fn unary(&mut self, op: UnaryOp, e: Self::Expr) -> Self::Expr;
    /// `a op b`.
    fn binary(&mut self, op: BinaryOp, a: Self::Expr, b: Self::Expr) -> Self::Expr;
    /// A call's name, before its arguments are read.
    fn call_name(&mut self, name: &'s str, at: Place);
    /// The call, its arguments read.
    fn call(&mut self, name: &'s str, args: Vec<Self::Expr>, at: Place) -> Self::Expr;
    /// `if c then a else b`.
    fn if_then_else(&mut self, c: Self::Expr, a: Self::Expr, b: Self::Expr) -> Self::Expr;
    /// `while c do body`.
    fn while_do(&mut self, c: Self::Expr, body: Self::Expr) -> Self::Expr;
    /// An assignment's target, before its value is read.
    fn assign_name(&mut self, name: &'s str, at: Place);
    /// The assignment, its value read.
    fn assign(&mut self, name: &'s str, value: Self::Expr, at: Place) -> Self::Expr;
    /// `{` read.
    fn block_open(&mut self);
    /// `let name = value`, its value read.
    fn let_statement(&mut self, name: &'s str, value: Self::Expr) -> Self::Statement;
    /// `expr;` in a block.
    fn expr_statement(&mut self, e: Self::Expr) -> Self::Statement;
    /// `}` read.
    fn block(&mut self, statements: Vec<Self::Statement>, value: Option<Self::Expr>) -> Self::Expr;
    /// A function's body is about to be read (its parameters in scope). Nothing by default.
    fn body(&mut self, params: &[&'s str]) {
        let _ = params;
    }
}

/// Where a name was read: its byte offset in the source and, if the builder asked for it
/// ([`Build::POSITIONS`]), its line and column.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Place {
    /// Byte offset in the source.
    pub offset: usize,
    /// Line and column (1:1 when the builder did not ask).
    pub position: Position,
}

/// Builds the expression tree ([`Expr`]).
pub struct Tree;

impl<'s> Build<'s> for Tree {
    type Expr = Expr;
    type Statement = Statement;
    const POSITIONS: bool = true;
    fn number(&mut self, n: i64) -> Expr {
        Expr::Number(n)
    }
    fn var(&mut self, name: &'s str, at: Place) -> Expr {
        Expr::Var(name.to_string(), at.position)
    }
    fn unary(&mut self, op: UnaryOp, e: Expr) -> Expr {
        Expr::Unary(op, Box::new(e))
    }
    fn binary(&mut self, op: BinaryOp, a: Expr, b: Expr) -> Expr {
        Expr::Binary(op, Box::new(a), Box::new(b))
    }
    fn call_name(&mut self, _: &'s str, _: Place) {}
    fn call(&mut self, name: &'s str, args: Vec<Expr>, at: Place) -> Expr {
        Expr::Call(name.to_string(), args, at.position)
    }
    fn if_then_else(&mut self, c: Expr, a: Expr, b: Expr) -> Expr {
        Expr::If(Box::new(c), Box::new(a), Box::new(b))
    }
    fn while_do(&mut self, c: Expr, body: Expr) -> Expr {
        Expr::While(Box::new(c), Box::new(body))
    }
    fn assign_name(&mut self, _: &'s str, _: Place) {}
    fn assign(&mut self, name: &'s str, value: Expr, at: Place) -> Expr {
        Expr::Assign(name.to_string(), Box::new(value), at.position)
    }
    fn block_open(&mut self) {}
    fn let_statement(&mut self, name: &'s str, value: Expr) -> Statement {
        Statement::Let(name.to_string(), value)
    }
    fn expr_statement(&mut self, e: Expr) -> Statement {
        Statement::Expr(e)
    }
    fn block(&mut self, statements: Vec<Statement>, value: Option<Expr>) -> Expr {
        Expr::Block(statements, value.map(Box::new))
    }
}

/// Builds nothing: the syntax is checked, no tree is made.
struct SyntaxOnly;

impl<'s> Build<'s> for SyntaxOnly {
    type Expr = ();
    type Statement = ();
    const POSITIONS: bool = false;
    fn number(&mut self, _: i64) {}
    fn var(&mut self, _: &'s str, _: Place) {}
    fn unary(&mut self, _: UnaryOp, _: ()) {}
    fn binary(&mut self, _: BinaryOp, _: (), _: ()) {}
    fn call_name(&mut self, _: &'s str, _: Place) {}
    fn call(&mut self, _: &'s str, _: Vec<()>, _: Place) {}
    fn if_then_else(&mut self, _: (), _: (), _: ()) {}
    fn while_do(&mut self, _: (), _: ()) {}
    fn assign_name(&mut self, _: &'s str, _: Place) {}
    fn assign(&mut self, _: &'s str, _: (), _: Place) {}
    fn block_open(&mut self) {}
    fn let_statement(&mut self, _: &'s str, _: ()) {}
    fn expr_statement(&mut self, _: ()) {}
    fn block(&mut self, _: Vec<()>, _: Option<()>) {}
}

/// Where a function's body lies in its source: what reading it again needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Span {
    /// Byte offset of the body's first token.
    pub start: usize,
    /// Byte offset just after its last token.
    pub end: usize,
    /// The line the body starts on (1-based).
    pub line: u32,
    /// Byte offset of that line's start.
    pub line_start: usize,
}

/// A function as read at load: its header, and where its body lies (checked for syntax,
/// not built: [`parse_body`] builds it, [`read_body`] reads it with any [`Build`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FunctionOutline {
    /// Its name.
    pub name: String,
    /// Its parameters.
    pub params: Vec<String>,
    /// Where it is defined.
    pub position: Position,
    /// Its body.
    pub body: Span,
}

/// A top-level item as [`parse_outline`] reads it.
#[derive(Debug, Clone, PartialEq)]
pub enum OutlineItem {
    /// `fn …`, its body not built.
    Function(FunctionOutline),
    /// `extern fn …`
    Extern(Extern),
    /// An expression to evaluate (built: it runs at once).
    Expr(Expr),
}

/// An item with its function's body made by some builder.
enum RawItem<E> {
    Function(FunctionOutline, E),
    Extern(Extern),
    Expr(Expr),
}

/// Reads a whole source, making each function's body with `body`.
fn read_items<'s, B: Build<'s>>(
    source: &'s str,
    body: &mut B,
) -> Result<Vec<RawItem<B::Expr>>, SyntaxError> {
    let mut parser = Parser::new(Lexer::new(source));
    let mut items = Vec::new();
    let parsed = (|| {
        while parser.peek() != &Token::End {
            items.push(parser.item(body)?);
        }
        Ok(())
    })();
    parser.finish(parsed).map(|()| items)
}

/// Parses a program (a file, or a line of the REPL), every body built into a tree.
pub fn parse(source: &str) -> Result<Vec<Item>, SyntaxError> {
    let items = read_items(source, &mut Tree)?;
    Ok(items
        .into_iter()
        .map(|item| match item {
            RawItem::Function(f, body) => Item::Function(Function {
                name: f.name,
                params: f.params,
                body,
                position: f.position,
            }),
            RawItem::Extern(x) => Item::Extern(x),
            RawItem::Expr(e) => Item::Expr(e),
        })
        .collect())
}

/// Parses a program as [`parse`] does (the same errors) but builds no function's body:
/// each is checked for syntax and its place recorded, to be built when it is needed
/// ([`parse_body`]). What a lazy runtime reads at load.
pub fn parse_outline(source: &str) -> Result<Vec<OutlineItem>, SyntaxError> {
    parse_outline_with(source, &mut SyntaxOnly)
}

/// [`parse_outline`], each body also read by `body` (which builds nothing), told of each
/// body's start with [`Build::body`]: e.g. a check of names in the same pass
/// (`check::parse_checked`).
pub fn parse_outline_with<'s, B: Build<'s, Expr = ()>>(
    source: &'s str,
    body: &mut B,
) -> Result<Vec<OutlineItem>, SyntaxError> {
    let items = read_items(source, body)?;
    Ok(items
        .into_iter()
        .map(|item| match item {
            RawItem::Function(f, ()) => OutlineItem::Function(f),
            RawItem::Extern(x) => OutlineItem::Extern(x),
            RawItem::Expr(e) => OutlineItem::Expr(e),
        })
        .collect())
}

/// Reads the body of `f` (from the `source` [`parse_outline`] read it in) with `build`.
/// Positions are the source's own lines and columns.
pub fn read_body<'s, B: Build<'s>>(
    source: &'s str,
    f: &FunctionOutline,
    build: &mut B,
) -> Result<B::Expr, SyntaxError> {
    let body = f.body;
    let within = source
        .get(..body.end)
        .filter(|s| {
            s.is_char_boundary(body.start)
                && s.is_char_boundary(body.line_start)
                && body.line_start <= body.start
        })
        .ok_or_else(|| SyntaxError {
            position: f.position,
            message: format!("the body of '{}' lies outside its source", f.name),
        })?;
    let mut parser = Parser::new(Lexer::starting_at(
        within,
        body.start,
        body.line,
        body.line_start,
    ));
    let expr = parser.expr(build);
    let expr = parser.finish(expr)?;
    if parser.peek() != &Token::End {
        return parser.error(format!("expected the end of '{}'s body", f.name));
    }
    Ok(expr)
}

/// The tree of `f`'s body (see [`read_body`]).
pub fn parse_body(source: &str, f: &FunctionOutline) -> Result<Function, SyntaxError> {
    let body = read_body(source, f, &mut Tree)?;
    Ok(Function {
        name: f.name.clone(),
        params: f.params.clone(),
        body,
        position: f.position,
    })
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
    fn new(lexer: Lexer<'s>) -> Self {
        let mut parser = Parser {
            lexer,
            current: (Token::End, 0),
            ahead: None,
            lex_error: None,
            depth: 0,
        };
        parser.current = parser.lex();
        parser
    }

    /// What a read came to: a character the lexer refused ends the tokens early, and its
    /// error is the one to report, whatever the parser made of the early end.
    fn finish<T>(&mut self, parsed: Result<T, SyntaxError>) -> Result<T, SyntaxError> {
        match (self.lex_error.take(), parsed) {
            (Some(error), _) | (None, Err(error)) => Err(error),
            (None, Ok(value)) => Ok(value),
        }
    }

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

    /// The current token's place, its position worked out if `B` wants it.
    fn place<B: Build<'s>>(&self) -> Place {
        Place {
            offset: self.current.1,
            position: if B::POSITIONS {
                self.position()
            } else {
                Position { line: 1, column: 1 }
            },
        }
    }

    /// The line (1-based) of byte `offset` (read already) and where that line starts.
    fn line_of(&self, offset: usize) -> (u32, usize) {
        let lines = &self.lexer.lines;
        let index = lines.starts.partition_point(|&s| s <= offset).max(1) - 1;
        (lines.first_line + index as u32, lines.starts[index])
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

    fn is(&self, symbol: Sym) -> bool {
        *self.peek() == Token::Symbol(symbol)
    }

    fn eat(&mut self, symbol: Sym) -> bool {
        let yes = self.is(symbol);
        if yes {
            self.next();
        }
        yes
    }

    fn expect(&mut self, symbol: Sym) -> Result<(), SyntaxError> {
        if self.eat(symbol) {
            Ok(())
        } else {
            self.error(format!(
                "expected '{}', found {}",
                symbol.text(),
                self.describe()
            ))
        }
    }

    fn describe(&self) -> String {
        match self.peek() {
            Token::Number(n) => format!("{n}"),
            Token::Name(n) => format!("'{n}'"),
            Token::Symbol(s) => format!("'{}'", s.text()),
            Token::End => "the end".into(),
        }
    }

    /// A name (not a keyword), as read.
    fn name_str(&mut self) -> Result<&'s str, SyntaxError> {
        match *self.peek() {
            Token::Name(n) => {
                self.next();
                Ok(n)
            }
            _ => self.error(format!("expected a name, found {}", self.describe())),
        }
    }

    fn name(&mut self) -> Result<String, SyntaxError> {
        self.name_str().map(str::to_string)
    }

    fn item<B: Build<'s>>(&mut self, body: &mut B) -> Result<RawItem<B::Expr>, SyntaxError> {
        let position = self.position();
        if self.eat(Sym::Extern) {
            self.expect(Sym::Fn)?;
            let name = self.name()?;
            self.expect(Sym::LParen)?;
            let mut params = Vec::new();
            while !self.is(Sym::RParen) {
                self.name()?;
                params.push(if self.eat(Sym::Colon) {
                    self.ty()?
                } else {
                    Type::I64
                });
                if !self.eat(Sym::Comma) {
                    break;
                }
            }
            self.expect(Sym::RParen)?;
            let result = if self.eat(Sym::Arrow) {
                self.ty()?
            } else {
                Type::I64
            };
            self.expect(Sym::Semi)?;
            return Ok(RawItem::Extern(Extern {
                name,
                params,
                result,
            }));
        }
        if self.eat(Sym::Fn) {
            let name = self.name()?;
            self.expect(Sym::LParen)?;
            let mut params = Vec::new();
            while !self.is(Sym::RParen) {
                params.push(self.name_str()?);
                if !self.eat(Sym::Comma) {
                    break;
                }
            }
            self.expect(Sym::RParen)?;
            self.expect(Sym::Assign)?;
            let start = self.current.1;
            let (line, line_start) = self.line_of(start);
            body.body(&params);
            let built = self.expr(body)?;
            let params = params.into_iter().map(str::to_string).collect();
            // Up to the `;`: what lies between is blank or a comment.
            let end = self.current.1;
            self.expect(Sym::Semi)?;
            let outline = FunctionOutline {
                name,
                params,
                position,
                body: Span {
                    start,
                    end,
                    line,
                    line_start,
                },
            };
            return Ok(RawItem::Function(outline, built));
        }
        if self.is(Sym::Let) {
            return self.error("'let' belongs in a block: { let x = 1; x + 1 }");
        }
        let expr = self.expr(&mut Tree)?;
        if !self.eat(Sym::Semi) && self.peek() != &Token::End {
            return self.error(format!("expected ';', found {}", self.describe()));
        }
        Ok(RawItem::Expr(expr))
    }

    fn ty(&mut self) -> Result<Type, SyntaxError> {
        match self.name_str()? {
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

    fn expr<B: Build<'s>>(&mut self, b: &mut B) -> Result<B::Expr, SyntaxError> {
        self.deeper()?;
        let expr = self.expr_at_depth(b);
        self.depth -= 1;
        expr
    }

    // The parser's functions on the way down a nesting level (expr, expr_at_depth,
    // binary, unary, atom) are kept small, each construct's own work in a function of
    // its own: a debug build gives every local of a function its own stack slot, so one
    // big function would make each level of nesting cost several kilobytes.
    fn expr_at_depth<B: Build<'s>>(&mut self, b: &mut B) -> Result<B::Expr, SyntaxError> {
        if self.eat(Sym::If) {
            return self.if_then_else(b);
        }
        if self.eat(Sym::While) {
            return self.while_do(b);
        }
        if let Token::Name(n) = *self.peek() {
            if self.peek_second() == Token::Symbol(Sym::Assign) {
                return self.assignment(n, b);
            }
        }
        self.binary(0, b)
    }

    fn if_then_else<B: Build<'s>>(&mut self, b: &mut B) -> Result<B::Expr, SyntaxError> {
        let c = self.expr(b)?;
        self.expect(Sym::Then)?;
        let yes = self.expr(b)?;
        self.expect(Sym::Else)?;
        let no = self.expr(b)?;
        Ok(b.if_then_else(c, yes, no))
    }

    fn while_do<B: Build<'s>>(&mut self, b: &mut B) -> Result<B::Expr, SyntaxError> {
        let c = self.expr(b)?;
        self.expect(Sym::Do)?;
        let body = self.expr(b)?;
        Ok(b.while_do(c, body))
    }

    fn assignment<B: Build<'s>>(
        &mut self,
        name: &'s str,
        b: &mut B,
    ) -> Result<B::Expr, SyntaxError> {
        let at = self.place::<B>();
        b.assign_name(name, at);
        self.next();
        self.next();
        let value = self.expr(b)?;
        Ok(b.assign(name, value, at))
    }

    /// The binary operator at the current token, with its precedence level (0 = loosest).
    fn binary_operator(&self) -> Option<(usize, BinaryOp)> {
        let Token::Symbol(symbol) = *self.peek() else {
            return None;
        };
        Some(match symbol {
            Sym::OrOr => (0, BinaryOp::Or),
            Sym::AndAnd => (1, BinaryOp::And),
            Sym::EqEq => (COMPARISON, BinaryOp::Eq),
            Sym::Ne => (COMPARISON, BinaryOp::Ne),
            Sym::Le => (COMPARISON, BinaryOp::Le),
            Sym::Ge => (COMPARISON, BinaryOp::Ge),
            Sym::Lt => (COMPARISON, BinaryOp::Lt),
            Sym::Gt => (COMPARISON, BinaryOp::Gt),
            Sym::Plus => (3, BinaryOp::Add),
            Sym::Minus => (3, BinaryOp::Sub),
            Sym::Star => (4, BinaryOp::Mul),
            Sym::Slash => (4, BinaryOp::Div),
            Sym::Percent => (4, BinaryOp::Rem),
            _ => return None,
        })
    }

    /// Binary operators of level `min` or tighter, by precedence climbing: a chain
    /// (`1 + 1 + …`) is read in a loop and built leaning left, its right operands (of
    /// tighter operators) one level deeper; one call whatever the number of levels.
    fn binary<B: Build<'s>>(&mut self, min: usize, b: &mut B) -> Result<B::Expr, SyntaxError> {
        let mut left = self.unary(b)?;
        while let Some((level, op)) = self.binary_operator() {
            if level < min {
                break;
            }
            self.next();
            self.deeper()?;
            let right = self.binary(level + 1, b);
            self.depth -= 1;
            left = b.binary(op, left, right?);
            if level == COMPARISON && matches!(self.binary_operator(), Some((COMPARISON, _))) {
                return self.error("comparisons do not chain: write (a < b) == c");
            }
        }
        Ok(left)
    }

    /// Prefix operators, read in a loop (not one call each), then their operand.
    fn unary<B: Build<'s>>(&mut self, b: &mut B) -> Result<B::Expr, SyntaxError> {
        let depth = self.depth;
        let mut operators = Vec::new();
        let operand = (|| {
            loop {
                let op = if self.is(Sym::Minus) {
                    UnaryOp::Neg
                } else if self.is(Sym::Bang) {
                    UnaryOp::Not
                } else {
                    break;
                };
                self.deeper()?;
                self.next();
                operators.push(op);
            }
            self.atom(b)
        })();
        self.depth = depth;
        let mut expr = operand?;
        for op in operators.into_iter().rev() {
            expr = b.unary(op, expr);
        }
        Ok(expr)
    }

    fn atom<B: Build<'s>>(&mut self, b: &mut B) -> Result<B::Expr, SyntaxError> {
        match *self.peek() {
            Token::Number(n) => {
                self.next();
                Ok(b.number(n))
            }
            Token::Symbol(Sym::LParen) => self.parenthesized(b),
            Token::Symbol(Sym::LBrace) => self.block(b),
            Token::Name(_) => self.variable_or_call(b),
            _ => self.not_an_expression(),
        }
    }

    fn parenthesized<B: Build<'s>>(&mut self, b: &mut B) -> Result<B::Expr, SyntaxError> {
        self.next();
        let e = self.expr(b)?;
        self.expect(Sym::RParen)?;
        Ok(e)
    }

    fn block<B: Build<'s>>(&mut self, b: &mut B) -> Result<B::Expr, SyntaxError> {
        self.next();
        b.block_open();
        let mut statements = Vec::new();
        loop {
            if self.eat(Sym::RBrace) {
                return Ok(b.block(statements, None));
            }
            let statement = if self.eat(Sym::Let) {
                let name = self.name_str()?;
                self.expect(Sym::Assign)?;
                let value = self.expr(b)?;
                b.let_statement(name, value)
            } else {
                let e = self.expr(b)?;
                if self.eat(Sym::RBrace) {
                    return Ok(b.block(statements, Some(e)));
                }
                b.expr_statement(e)
            };
            self.expect(Sym::Semi)?;
            statements.push(statement);
        }
    }

    fn variable_or_call<B: Build<'s>>(&mut self, b: &mut B) -> Result<B::Expr, SyntaxError> {
        let at = self.place::<B>();
        let name = self.name_str()?;
        if !self.eat(Sym::LParen) {
            return Ok(b.var(name, at));
        }
        b.call_name(name, at);
        let mut args = Vec::new();
        while !self.is(Sym::RParen) {
            args.push(self.expr(b)?);
            if !self.eat(Sym::Comma) {
                break;
            }
        }
        self.expect(Sym::RParen)?;
        Ok(b.call(name, args, at))
    }

    #[cold]
    fn not_an_expression<T>(&self) -> Result<T, SyntaxError> {
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
