//! Shared pieces of Kiln's benchmarks: tiny functions in machine code, process memory
//! figures from /proc, a small deterministic random generator, and running one contender
//! per child process so their memory figures do not mix.
//!
//! Figures are always printed side by side with ratios; see docs/BENCHMARKS.md.

pub mod cranelift_workload;

use std::process::Command;
use std::time::Duration;

/// Machine code of `extern "C" fn() -> u32 { value }`.
pub fn return_const(value: u32) -> [u8; 12] {
    let mut code = [0xccu8; 12];
    #[cfg(target_arch = "x86_64")]
    {
        code[0] = 0xb8; // mov eax, imm32
        code[1..5].copy_from_slice(&value.to_le_bytes());
        code[5] = 0xc3; // ret
    }
    #[cfg(target_arch = "aarch64")]
    {
        let lo = 0x5280_0000u32 | ((value & 0xffff) << 5);
        let hi = 0x72a0_0000u32 | ((value >> 16) << 5);
        code[0..4].copy_from_slice(&lo.to_le_bytes());
        code[4..8].copy_from_slice(&hi.to_le_bytes());
        code[8..12].copy_from_slice(&0xd65f_03c0u32.to_le_bytes());
    }
    code
}

/// Writes a function returning `value` at the start of `bytes` and fills the rest with a
/// pattern, the way a linker writes every byte of a section.
pub fn write_function(bytes: &mut [u8], value: u32) {
    bytes.fill(0xcc);
    let code = return_const(value);
    let n = code.len().min(bytes.len());
    bytes[..n].copy_from_slice(&code[..n]);
}

/// Calls the function at `addr`.
///
/// # Safety
/// `addr` must hold a finalized `extern "C" fn() -> u32`.
pub unsafe fn call(addr: usize) -> u32 {
    // SAFETY: the caller's contract.
    let f: extern "C" fn() -> u32 = unsafe { std::mem::transmute(addr) };
    f()
}

/// Memory figures of this process.
#[derive(Debug, Clone, Copy, Default)]
pub struct ProcessMemory {
    /// Resident set size (a page mapped twice counts twice).
    pub rss: u64,
    /// Proportional set size (a page mapped twice in this process counts once).
    pub pss: u64,
    /// Address space.
    pub vsz: u64,
    /// Lines in /proc/self/maps.
    pub mappings: u64,
}

fn kib_field(text: &str, name: &str) -> u64 {
    text.lines()
        .find(|l| l.starts_with(name))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(0)
        * 1024
}

impl ProcessMemory {
    /// Reads the figures now.
    pub fn now() -> Self {
        let rollup = std::fs::read_to_string("/proc/self/smaps_rollup").unwrap_or_default();
        let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap_or_default();
        ProcessMemory {
            rss: kib_field(&rollup, "Rss:"),
            pss: kib_field(&rollup, "Pss:"),
            vsz: kib_field(&status, "VmSize:"),
            mappings: maps.lines().count() as u64,
        }
    }
}

/// xorshift64*: deterministic, dependency-free randomness for workloads.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator from a non-zero seed.
    pub fn new(seed: u64) -> Self {
        Rng(seed | 1)
    }

    /// The next value.
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// A value in `[lo, hi]`.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next_u64() % (hi - lo + 1)
    }
}

/// Runs this executable again with `args`, returning its `RESULT` lines as key/value maps,
/// or the reason it failed (a crash is reported, not propagated).
pub fn run_child(args: &[String]) -> Result<Vec<Vec<(String, String)>>, String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let out = Command::new(exe)
        .args(args)
        .output()
        .map_err(|e| e.to_string())?;
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        // The panic message if there is one, else the last lines.
        let lines: Vec<&str> = stderr.lines().collect();
        let detail = match lines.iter().position(|l| l.contains("panicked at")) {
            Some(i) => lines[i..(i + 2).min(lines.len())].join(" "),
            None => lines
                .iter()
                .rev()
                .take(3)
                .rev()
                .cloned()
                .collect::<Vec<_>>()
                .join(" | "),
        };
        return Err(format!("{} ({detail})", out.status));
    }
    Ok(parse_results(&String::from_utf8_lossy(&out.stdout)))
}

/// Parses `RESULT key=value ...` lines.
pub fn parse_results(text: &str) -> Vec<Vec<(String, String)>> {
    text.lines()
        .filter_map(|l| l.strip_prefix("RESULT "))
        .map(|l| {
            l.split_whitespace()
                .filter_map(|kv| kv.split_once('='))
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        })
        .collect()
}

/// The value of `key` in a parsed result, as a float.
pub fn field(result: &[(String, String)], key: &str) -> f64 {
    result
        .iter()
        .find(|(k, _)| k == key)
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or(f64::NAN)
}

/// Runs a shell command; panics if it fails (benchmark set-up).
pub fn sh(cmd: &str) {
    let status = Command::new("sh")
        .arg("-c")
        .arg(cmd)
        .status()
        .expect("sh runs");
    assert!(status.success(), "failed: {cmd}");
}

/// Whether `strace` can be run here.
pub fn have_strace() -> bool {
    Command::new("strace")
        .arg("-V")
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Total system calls made by this executable run with `args`, counted by `strace -f -c`.
pub fn count_syscalls(args: &[String]) -> Result<u64, String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let out_file = std::env::temp_dir().join(format!("kiln-strace-{}.txt", std::process::id()));
    let status = Command::new("strace")
        .arg("-f")
        .arg("-c")
        .arg("-o")
        .arg(&out_file)
        .arg(exe)
        .args(args)
        .stdout(std::process::Stdio::null())
        .status()
        .map_err(|e| e.to_string())?;
    let text = std::fs::read_to_string(&out_file).map_err(|e| e.to_string())?;
    let _ = std::fs::remove_file(&out_file);
    if !status.success() {
        return Err(format!("strace run failed: {status}"));
    }
    // The "total" line: "100.00  0.001  1  1234  5  total" -> calls is the 4th column.
    text.lines()
        .find(|l| l.trim_end().ends_with("total"))
        .and_then(|l| l.split_whitespace().nth(3))
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| format!("no total in strace output: {text}"))
}

/// How a figure compares with its target, as the benchmarks print it: a miss is said,
/// not left for the reader to work out.
pub fn verdict(met: bool) -> &'static str {
    if met {
        "met"
    } else {
        "MISSED"
    }
}

/// A global allocator that forwards to the system's and counts calls and live bytes, for
/// benchmarks that report allocations per operation and heap growth. Install it in a
/// benchmark binary with `#[global_allocator] static A: CountingAllocator = CountingAllocator;`.
pub struct CountingAllocator;

static ALLOCATIONS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
static LIVE_BYTES: std::sync::atomic::AtomicI64 = std::sync::atomic::AtomicI64::new(0);

impl CountingAllocator {
    /// Allocation calls (`alloc`, `alloc_zeroed`, `realloc`) so far, in every thread.
    pub fn allocations() -> u64 {
        ALLOCATIONS.load(std::sync::atomic::Ordering::Relaxed)
    }
    /// Heap bytes allocated and not freed.
    pub fn live_bytes() -> i64 {
        LIVE_BYTES.load(std::sync::atomic::Ordering::Relaxed)
    }
}

// SAFETY: every call is forwarded unchanged to the system allocator; only counters change.
unsafe impl std::alloc::GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: std::alloc::Layout) -> *mut u8 {
        use std::sync::atomic::Ordering::Relaxed;
        ALLOCATIONS.fetch_add(1, Relaxed);
        LIVE_BYTES.fetch_add(layout.size() as i64, Relaxed);
        // SAFETY: the caller's layout, passed on.
        unsafe { std::alloc::System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: std::alloc::Layout) -> *mut u8 {
        use std::sync::atomic::Ordering::Relaxed;
        ALLOCATIONS.fetch_add(1, Relaxed);
        LIVE_BYTES.fetch_add(layout.size() as i64, Relaxed);
        // SAFETY: the caller's layout, passed on.
        unsafe { std::alloc::System.alloc_zeroed(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: std::alloc::Layout) {
        LIVE_BYTES.fetch_sub(layout.size() as i64, std::sync::atomic::Ordering::Relaxed);
        // SAFETY: a block this allocator gave out with this layout.
        unsafe { std::alloc::System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: std::alloc::Layout, new: usize) -> *mut u8 {
        use std::sync::atomic::Ordering::Relaxed;
        ALLOCATIONS.fetch_add(1, Relaxed);
        LIVE_BYTES.fetch_add(new as i64 - layout.size() as i64, Relaxed);
        // SAFETY: a block this allocator gave out with this layout, and the caller's size.
        unsafe { std::alloc::System.realloc(ptr, layout, new) }
    }
}

/// This process's resource usage so far (`getrusage`), zeros if it cannot be read.
fn usage() -> libc::rusage {
    // SAFETY: getrusage writes the struct it is given; zeroed is a valid rusage.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: RUSAGE_SELF with a valid out-pointer.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) } != 0 {
        // SAFETY: as above: zeroed is a valid rusage.
        return unsafe { std::mem::zeroed() };
    }
    usage
}

/// Minor page faults of this process so far (`getrusage`): first touches of memory, the
/// kernel's share of a fresh process's work.
pub fn minor_faults() -> u64 {
    usage().ru_minflt as u64
}

/// CPU time of this process so far, in user mode and in the kernel (`getrusage`).
pub fn cpu_times() -> (Duration, Duration) {
    let u = usage();
    let time = |t: libc::timeval| {
        Duration::from_secs(t.tv_sec as u64) + Duration::from_micros(t.tv_usec as u64)
    };
    (time(u.ru_utime), time(u.ru_stime))
}

/// The CPU time (user + system) of running `program` with `args` to its end, its output
/// discarded; `None` if it fails or exits other than 0.
pub fn cpu_time_of(program: &std::path::Path, args: &[&str]) -> Option<Duration> {
    let child = std::process::Command::new(program)
        .args(args)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .ok()?;
    let pid = child.id() as libc::pid_t;
    let mut status = 0;
    // SAFETY: wait4 writes the status and the rusage it is given; zeroed is a valid
    // rusage.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `pid` is our child, not waited for yet; valid out-pointers.
    let waited = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
    if waited != pid || !libc::WIFEXITED(status) || libc::WEXITSTATUS(status) != 0 {
        return None;
    }
    let time = |t: libc::timeval| {
        Duration::from_secs(t.tv_sec as u64) + Duration::from_micros(t.tv_usec as u64)
    };
    Some(time(usage.ru_utime) + time(usage.ru_stime))
}
