//! `kiln-lang`: runs a program of the language (`kiln-lang FILE`: loads it, then calls
//! `main()` if it defines one, whose value is the exit status), or reads it line by line
//! (`kiln-lang` alone: a REPL that prints each expression's value).

// Errors wrap Kiln's, which are large by design.
#![allow(clippy::result_large_err)]

use clap::Parser;
use kiln_lang::{LangError, Options, Outcome, Runtime};
use std::io::{BufRead, IsTerminal};
use std::path::PathBuf;
use std::process::ExitCode;

/// Runs a kiln-lang program, or a REPL without one.
#[derive(Parser)]
#[command(name = "kiln-lang", version)]
struct Args {
    /// The program (without it: a REPL on standard input).
    file: Option<PathBuf>,
    /// Compile and link every function when defined, not on its first call.
    #[arg(long)]
    eager: bool,
    /// Register the code with the GDB JIT interface (gdb, lldb see its functions).
    #[arg(long)]
    gdb: bool,
    /// Write /tmp/perf-PID.map for perf.
    #[arg(long)]
    perf_map: bool,
    /// Print how many functions were defined and compiled (on standard error).
    #[arg(long)]
    stats: bool,
    /// Run the program in the executor listening at ADDRESS (`kiln-executor --listen
    /// ADDRESS`, or executor-c under qemu or Wine), compiled for its architecture.
    #[arg(long, value_name = "ADDRESS")]
    connect: Option<String>,
    /// The executor's key file (else KILN_EXECUTOR_KEY_FILE or KILN_EXECUTOR_KEY; none:
    /// plaintext, for an executor started with --no-auth).
    #[arg(long, value_name = "FILE", requires = "connect")]
    key_file: Option<std::path::PathBuf>,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let key = match &args.key_file {
        Some(path) => kiln::executor::Key::read_file(path).map(Some),
        None if args.connect.is_some() => kiln::executor::Key::from_env(),
        None => Ok(None),
    };
    let key = match key {
        Ok(key) => key,
        Err(e) => {
            eprintln!("kiln-lang: {e}");
            return ExitCode::FAILURE;
        }
    };
    let options = Options {
        eager: args.eager,
        debug: kiln::debug::DebugSupport {
            gdb: args.gdb,
            perf_map: args.perf_map,
            ..Default::default()
        },
        connect: args.connect.clone(),
        key,
    };
    let result = Runtime::new(options).and_then(|mut rt| {
        let status = match &args.file {
            Some(path) => run_file(&mut rt, path),
            None => repl(&mut rt),
        };
        if args.stats {
            eprintln!(
                "kiln-lang: {} functions defined, {} compiled",
                rt.defined_functions(),
                rt.compiled_functions()
            );
        }
        status
    });
    match result {
        Ok(status) => ExitCode::from(status),
        Err(error) => {
            eprintln!("kiln-lang: {error}");
            ExitCode::from(1)
        }
    }
}

fn run_file(rt: &mut Runtime, path: &PathBuf) -> Result<u8, LangError> {
    let source = std::fs::read_to_string(path)
        .map_err(|e| LangError::Usage(format!("{}: {e}", path.display())))?;
    rt.load(&source).map_err(|e| match e {
        LangError::Syntax(s) => LangError::Usage(format!("{}:{s}", path.display())),
        other => other,
    })?;
    if rt.has_function("main") {
        Ok(rt.call("main", &[])? as u8)
    } else {
        Ok(0)
    }
}

/// Where the REPL's lines come from: a line editor (arrows, history, Ctrl-R) on a
/// terminal, plain lines from a pipe or a file.
enum LineSource {
    Edited(Box<rustyline::DefaultEditor>),
    Plain(std::io::Lines<std::io::StdinLock<'static>>),
}

impl LineSource {
    fn new() -> Self {
        if std::io::stdin().is_terminal() && std::io::stdout().is_terminal() {
            if let Ok(editor) = rustyline::DefaultEditor::new() {
                return LineSource::Edited(Box::new(editor));
            }
        }
        LineSource::Plain(std::io::stdin().lock().lines())
    }

    /// The next line (`None` at the end of input), after `prompt` on a terminal.
    fn next(&mut self, prompt: &str) -> Option<Result<String, LangError>> {
        match self {
            LineSource::Edited(editor) => match editor.readline(prompt) {
                Ok(line) => {
                    if !line.trim().is_empty() {
                        let _ = editor.add_history_entry(line.as_str());
                    }
                    Some(Ok(line))
                }
                Err(rustyline::error::ReadlineError::Eof) => None,
                // Ctrl-C drops the line being typed, as shells do.
                Err(rustyline::error::ReadlineError::Interrupted) => Some(Ok(String::new())),
                Err(e) => Some(Err(LangError::Usage(e.to_string()))),
            },
            LineSource::Plain(lines) => lines
                .next()
                .map(|l| l.map_err(|e| LangError::Usage(e.to_string()))),
        }
    }
}

fn repl(rt: &mut Runtime) -> Result<u8, LangError> {
    let mut input = String::new();
    let mut lines = LineSource::new();
    loop {
        let prompt = if input.is_empty() { "> " } else { ". " };
        let Some(line) = lines.next(prompt) else {
            return Ok(0);
        };
        let line = line?;
        input.push_str(&line);
        input.push('\n');
        match rt.load(&input) {
            // An unfinished item: read on.
            Err(LangError::Syntax(e)) if e.message.ends_with("found the end") => continue,
            Err(e) => println!("error: {e}"),
            Ok(outcomes) => {
                for outcome in outcomes {
                    match outcome {
                        Outcome::Value(v) => println!("= {v}"),
                        Outcome::Defined(f) => println!("defined {f}"),
                        Outcome::Replaced(f) => println!("replaced {f}"),
                        Outcome::Declared(f) => println!("declared {f}"),
                    }
                }
            }
        }
        input.clear();
    }
}
