//! Reporting a crash of JIT code run in this process, the way the out-of-process executor
//! reports one: the signal's name, the faulting address, the instruction address and the
//! JIT function it falls in, then the process ends with status 128 + the signal number,
//! as a shell reports a program killed by a signal.
//!
//! The handler runs in a signal context: it allocates nothing and takes no lock. The
//! tables are set before the code runs and only read by the handler. They are weak
//! handles of the modules' own symbol tables, not a copy sorted by address: installing costs
//! nothing per function (a program of 20,000 functions starts 0.7 ms sooner), and a crash
//! — once per process — scans its module's table for the nearest definition below the
//! instruction.

use std::sync::{OnceLock, Weak};

pub use crate::module_symbols::ModuleSymbols;

/// A module's code `[start, end)` and its definitions.
#[derive(Clone)]
pub struct CodeTable {
    /// The first byte of the module's code.
    pub start: u64,
    /// One past its last byte.
    pub end: u64,
    /// Its definitions: the module itself, not kept alive by the table (a module removed
    /// later is freed; a crash then names no function in its code).
    pub symbols: Weak<dyn ModuleSymbols>,
}

impl std::fmt::Debug for CodeTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CodeTable")
            .field("start", &self.start)
            .field("end", &self.end)
            .field("alive", &(self.symbols.strong_count() > 0))
            .finish()
    }
}

/// The function `pc` falls in among `module`'s definitions: the one at the highest address
/// at or below it, within `[start, end)`. Linear: only a crash asks.
fn function_at(module: &dyn ModuleSymbols, start: u64, end: u64, pc: u64) -> Option<(&str, u64)> {
    if !(start..end).contains(&pc) {
        return None;
    }
    let mut best: Option<(&str, u64)> = None;
    for (name, address, _) in crate::module_symbols::definitions(module) {
        if (start..=pc).contains(&address) && best.is_none_or(|(_, a)| address > a) {
            best = Some((name, address));
        }
    }
    best
}

/// The JIT code and its functions; set once.
static TABLES: OnceLock<Vec<CodeTable>> = OnceLock::new();

const SIGNALS: [libc::c_int; 6] = [
    libc::SIGSEGV,
    libc::SIGBUS,
    libc::SIGILL,
    libc::SIGFPE,
    libc::SIGTRAP,
    libc::SIGABRT,
];

/// A fixed buffer the handler formats into.
struct Line {
    buf: [u8; 512],
    len: usize,
}

impl Line {
    fn push(&mut self, s: &[u8]) {
        let n = s.len().min(self.buf.len() - self.len);
        self.buf[self.len..self.len + n].copy_from_slice(&s[..n]);
        self.len += n;
    }
    fn hex(&mut self, v: u64) {
        let mut digits = [0u8; 18];
        digits[0] = b'0';
        digits[1] = b'x';
        let mut n = 0;
        let mut x = v;
        let mut tmp = [0u8; 16];
        loop {
            tmp[n] = b"0123456789abcdef"[(x & 0xf) as usize];
            n += 1;
            x >>= 4;
            if x == 0 {
                break;
            }
        }
        for i in 0..n {
            digits[2 + i] = tmp[n - 1 - i];
        }
        self.push(&digits[..2 + n]);
    }
    fn dec(&mut self, v: u64) {
        let mut tmp = [0u8; 20];
        let mut n = 0;
        let mut x = v;
        loop {
            tmp[n] = b'0' + (x % 10) as u8;
            n += 1;
            x /= 10;
            if x == 0 {
                break;
            }
        }
        tmp[..n].reverse();
        self.push(&tmp[..n]);
    }
}

/// The instruction address of the interrupted code.
fn instruction_address(context: *mut libc::c_void) -> u64 {
    if context.is_null() {
        return 0;
    }
    // SAFETY: the kernel passes a valid ucontext_t to an SA_SIGINFO handler.
    let uc = unsafe { &*(context as *const libc::ucontext_t) };
    #[cfg(target_arch = "x86_64")]
    {
        uc.uc_mcontext.gregs[libc::REG_RIP as usize] as u64
    }
    #[cfg(target_arch = "aarch64")]
    {
        uc.uc_mcontext.pc
    }
}

extern "C" fn on_fatal_signal(
    signal: libc::c_int,
    info: *mut libc::siginfo_t,
    context: *mut libc::c_void,
) {
    let mut line = Line {
        buf: [0; 512],
        len: 0,
    };
    let pc = instruction_address(context);
    let table = TABLES
        .get()
        .and_then(|t| t.iter().find(|t| (t.start..t.end).contains(&pc)));
    let in_jit = table.is_some();
    line.push(b"kiln: ");
    line.push(if in_jit {
        b"JIT code crashed with "
    } else {
        b"the program crashed (outside JIT code) with "
    });
    line.push(kiln_wire::protocol::signal_name(signal).as_bytes());
    line.push(b" (signal ");
    line.dec(signal as u64);
    line.push(b")");
    if matches!(signal, libc::SIGSEGV | libc::SIGBUS) && !info.is_null() {
        line.push(b" accessing ");
        // SAFETY: the kernel fills si_addr for these signals.
        line.hex(unsafe { (*info).si_addr() } as u64);
    }
    line.push(b" at ");
    line.hex(pc);
    // The module, if it is still there: a weak handle raised with atomics only (no lock,
    // no allocation), and never let go — the process ends below, and dropping the last
    // handle here would run the module's destructor in the handler.
    if let Some((table, module)) = table.and_then(|t| Some((t, t.symbols.upgrade()?))) {
        if let Some((name, start)) = function_at(&*module, table.start, table.end, pc) {
            line.push(b" in ");
            line.push(name.as_bytes());
            line.push(b"+");
            line.hex(pc - start);
        }
        std::mem::forget(module);
    }
    line.push(b"\n");
    // SAFETY: write(2) and _exit(2) are async-signal-safe; the buffer is on this stack.
    unsafe {
        libc::write(2, line.buf.as_ptr().cast(), line.len);
        libc::_exit(128 + signal);
    }
}

/// Installs the reporter for JIT code in this process: `tables`, each module's code and
/// definitions. Only the first call's tables are kept.
pub fn install(tables: Vec<CodeTable>) {
    let _ = TABLES.set(tables);
    const STACK: usize = 64 * 1024;
    static ALT_STACK: OnceLock<usize> = OnceLock::new();
    let stack = *ALT_STACK.get_or_init(|| {
        // One alternate stack for the thread that runs main, so a stack overflow in JIT
        // code is reported too; it lives as long as the process. Mapped, not allocated:
        // its pages are touched only if a signal comes (a zeroed heap buffer cost every
        // run 16 page faults), and a guard page below it stops a handler that overflows.
        // SAFETY: sysconf reads a constant of the system.
        let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096);
        // SAFETY: a fresh private anonymous mapping; nothing else refers to it.
        let mapped = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                STACK + page,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_STACK,
                -1,
                0,
            )
        };
        if mapped == libc::MAP_FAILED {
            return Box::leak(vec![0u8; STACK].into_boxed_slice()).as_mut_ptr() as usize;
        }
        // SAFETY: the mapping's first page, just made; a guard only (if this fails, the
        // stack works without one).
        unsafe { libc::mprotect(mapped, page, libc::PROT_NONE) };
        mapped as usize + page
    });
    let ss = libc::stack_t {
        ss_sp: stack as *mut libc::c_void,
        ss_flags: 0,
        ss_size: STACK,
    };
    // SAFETY: the stack lives for the rest of the process.
    unsafe { libc::sigaltstack(&ss, std::ptr::null_mut()) };
    for signal in SIGNALS {
        // SAFETY: sigaction is plain data; zeroed is valid before the fields are set.
        let mut action: libc::sigaction = unsafe { std::mem::zeroed() };
        action.sa_sigaction = on_fatal_signal as *const () as usize;
        action.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
        // SAFETY: installing a handler that only calls async-signal-safe functions.
        unsafe { libc::sigaction(signal, &action, std::ptr::null_mut()) };
    }
}
