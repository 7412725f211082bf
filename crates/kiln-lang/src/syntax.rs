//! The language's syntax: a lexer and a recursive-descent parser.
//!
//! ```text
//! program   := item*
//! item      := "extern" "fn" NAME "(" [param ("," param)*] ")" ["->" type] ";"
//!            | "fn" NAME "(" [NAME ("," NAME)*] ")" "=" expr ";"
//!            | expr ";"                                 (evaluated, in the REPL)
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
//! Every value is a 64-bit integer; comparisons give 0 or 1; `if` and `while` test for
//! non-zero; a block's value is its last expression (0 if it ends with `;`), a `while`'s
//! is 0. `#` starts a comment.

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
    /// `/` (signed; division by zero traps)
    Div,
    /// `%`
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

#[derive(Debug, Clone, PartialEq)]
enum Token {
    Number(i64),
    Name(String),
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

fn lex(source: &str) -> Result<Vec<(Token, Position)>, SyntaxError> {
    let mut tokens = Vec::new();
    let (mut line, mut column) = (1u32, 1u32);
    let chars: Vec<char> = source.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let position = Position { line, column };
        if c == '\n' {
            line += 1;
            column = 1;
            i += 1;
            continue;
        }
        if c.is_whitespace() {
            i += 1;
            column += 1;
            continue;
        }
        if c == '#' {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
            continue;
        }
        let start = i;
        if c.is_ascii_digit() {
            while i < chars.len() && chars[i].is_ascii_alphanumeric() {
                i += 1;
            }
            let text: String = chars[start..i].iter().collect();
            let value = text.parse::<i64>().map_err(|_| SyntaxError {
                position,
                message: format!("'{text}' is not a 64-bit integer"),
            })?;
            tokens.push((Token::Number(value), position));
        } else if c.is_alphabetic() || c == '_' {
            while i < chars.len() && (chars[i].is_alphanumeric() || chars[i] == '_') {
                i += 1;
            }
            tokens.push((Token::Name(chars[start..i].iter().collect()), position));
        } else {
            let rest: String = chars[i..chars.len().min(i + 2)].iter().collect();
            let symbol = SYMBOLS
                .iter()
                .find(|s| rest.starts_with(**s))
                .ok_or_else(|| SyntaxError {
                    position,
                    message: format!("unexpected character '{c}'"),
                })?;
            i += symbol.len();
            tokens.push((Token::Symbol(symbol), position));
        }
        column += (i - start) as u32;
    }
    tokens.push((Token::End, Position { line, column }));
    Ok(tokens)
}

/// Parses a program (a file, or a line of the REPL).
pub fn parse(source: &str) -> Result<Vec<Item>, SyntaxError> {
    let mut parser = Parser {
        tokens: lex(source)?,
        at: 0,
    };
    let mut items = Vec::new();
    while parser.peek() != &Token::End {
        items.push(parser.item()?);
    }
    Ok(items)
}

struct Parser {
    tokens: Vec<(Token, Position)>,
    at: usize,
}

impl Parser {
    fn peek(&self) -> &Token {
        &self.tokens[self.at].0
    }

    fn position(&self) -> Position {
        self.tokens[self.at].1
    }

    fn next(&mut self) -> Token {
        let token = self.tokens[self.at].0.clone();
        if token != Token::End {
            self.at += 1;
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
            || matches!(self.peek(), Token::Name(n) if n == symbol)
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
        match self.peek().clone() {
            Token::Name(n) if !KEYWORDS.contains(&n.as_str()) => {
                self.next();
                Ok(n)
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

    fn expr(&mut self) -> Result<Expr, SyntaxError> {
        if self.eat("if") {
            let c = self.expr()?;
            self.expect("then")?;
            let a = self.expr()?;
            self.expect("else")?;
            let b = self.expr()?;
            return Ok(Expr::If(Box::new(c), Box::new(a), Box::new(b)));
        }
        if self.eat("while") {
            let c = self.expr()?;
            self.expect("do")?;
            let body = self.expr()?;
            return Ok(Expr::While(Box::new(c), Box::new(body)));
        }
        if let (Token::Name(n), Token::Symbol("=")) =
            (self.peek().clone(), self.tokens[self.at + 1].0.clone())
        {
            if !KEYWORDS.contains(&n.as_str()) {
                let position = self.position();
                self.next();
                self.next();
                let value = self.expr()?;
                return Ok(Expr::Assign(n, Box::new(value), position));
            }
        }
        self.binary(0)
    }

    /// Binary operators by precedence level (0 = loosest).
    fn binary(&mut self, level: usize) -> Result<Expr, SyntaxError> {
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
        if level == LEVELS.len() {
            return self.unary();
        }
        let mut left = self.binary(level + 1)?;
        'more: loop {
            for (symbol, op) in LEVELS[level] {
                if self.eat(symbol) {
                    let right = self.binary(level + 1)?;
                    left = Expr::Binary(*op, Box::new(left), Box::new(right));
                    // Comparisons do not chain.
                    if level == 2 {
                        break 'more;
                    }
                    continue 'more;
                }
            }
            break;
        }
        Ok(left)
    }

    fn unary(&mut self) -> Result<Expr, SyntaxError> {
        if self.eat("-") {
            return Ok(Expr::Unary(UnaryOp::Neg, Box::new(self.unary()?)));
        }
        if self.eat("!") {
            return Ok(Expr::Unary(UnaryOp::Not, Box::new(self.unary()?)));
        }
        self.atom()
    }

    fn atom(&mut self) -> Result<Expr, SyntaxError> {
        let position = self.position();
        match self.peek().clone() {
            Token::Number(n) => {
                self.next();
                Ok(Expr::Number(n))
            }
            Token::Symbol("(") => {
                self.next();
                let e = self.expr()?;
                self.expect(")")?;
                Ok(e)
            }
            Token::Symbol("{") => {
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
            Token::Name(_) => {
                let name = self.name()?;
                if self.eat("(") {
                    let mut args = Vec::new();
                    while !self.is(")") {
                        args.push(self.expr()?);
                        if !self.eat(",") {
                            break;
                        }
                    }
                    self.expect(")")?;
                    Ok(Expr::Call(name, args, position))
                } else {
                    Ok(Expr::Var(name, position))
                }
            }
            _ => self.error(format!("expected an expression, found {}", self.describe())),
        }
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
