//! Figure 1, 3 and 4 of the memory layer: many small modules kept alive.
//!
//! Each module has ~10.9 KB of code (RX), 1 KB of constants (R) and 64 B of data (RW); all
//! bytes are written, the module is finalized and its function called once, and every
//! module stays alive. Contenders, each in a child process of its own:
//! - `kiln`: Kiln's default manager (dual-mapped memfd, sections of many modules share
//!   pages);
//! - `kiln-in-process`: Kiln with the in-process mapper (code on pages of its own);
//! - `page-per-section`: the strategy of LLVM's SectionMemoryManager, written here: every
//!   section rounded up to whole pages, mapped read-write, then protected.
//!
//! Prints resident bytes (PSS and RSS), address space and time per module, the number of
//! mappings afterwards, and (with strace) system calls per module in the steady state.

use clap::Parser;
use kiln_bench::*;
use kiln_memory::*;
use std::sync::Arc;
use std::time::Instant;

const CODE: usize = 10_900;
const CONSTANTS: usize = 1024;
const DATA: usize = 64;
const CONTENDERS: [&str; 3] = ["kiln", "kiln-in-process", "page-per-section"];

#[derive(Parser, Debug)]
struct Args {
    /// Number of modules.
    #[arg(long, default_value_t = 10_000)]
    modules: usize,
    /// Run one contender in this process and print its RESULT line.
    #[arg(long)]
    only: Option<String>,
    /// Skip the strace syscall count.
    #[arg(long)]
    no_syscalls: bool,
}

trait Contender {
    /// Builds, finalizes and calls one module; keeps it alive.
    fn module(&mut self, index: u32);
    fn extra(&self) -> String {
        String::new()
    }
}

struct Kiln {
    manager: SlabMemoryManager,
    modules: Vec<FinalizedAllocation>,
    request: AllocationRequest,
}

impl Kiln {
    fn new(mapper: Arc<dyn Mapper>) -> Self {
        Kiln {
            manager: SlabMemoryManager::builder()
                .mapper(mapper)
                .build()
                .expect("manager"),
            modules: Vec::new(),
            request: AllocationRequest::new()
                .segment(SegmentRequest::new(
                    Permission::ReadExecute,
                    CODE as u64,
                    16,
                ))
                .segment(SegmentRequest::new(Permission::Read, CONSTANTS as u64, 16))
                .segment(SegmentRequest::new(Permission::ReadWrite, DATA as u64, 8)),
        }
    }
}

impl Contender for Kiln {
    fn module(&mut self, index: u32) {
        let mut in_flight = self.manager.allocate(&self.request).expect("allocate");
        {
            let mut segments = in_flight.segments_mut();
            write_function(segments[0].bytes, index);
            segments[1].bytes.fill(index as u8);
            segments[2].bytes.fill(1);
        }
        let finalized = in_flight.finalize().expect("finalize");
        // SAFETY: segment 0 holds the function just written.
        let got = unsafe { call(finalized.target(0).unwrap_or(0) as usize) };
        assert_eq!(got, index);
        self.modules.push(finalized);
    }

    fn extra(&self) -> String {
        let stats = self.manager.stats();
        format!(
            "mapped={} resident_counted_once={} reserved={}",
            stats.bytes_mapped,
            stats.bytes_resident.unwrap_or(0),
            stats.bytes_reserved
        )
    }
}

/// LLVM SectionMemoryManager's strategy: each section its own whole pages.
struct PagePerSection {
    page: usize,
    modules: Vec<[(usize, usize); 3]>,
}

impl PagePerSection {
    fn map(&self, len: usize) -> (usize, usize) {
        let len = len.next_multiple_of(self.page);
        // SAFETY: a fresh anonymous mapping, owned by this contender.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED);
        (p as usize, len)
    }

    fn protect(&self, (addr, len): (usize, usize), prot: libc::c_int) {
        // SAFETY: our own mapping, no longer written.
        assert_eq!(unsafe { libc::mprotect(addr as *mut _, len, prot) }, 0);
    }
}

fn bytes_at<'a>((addr, len): (usize, usize)) -> &'a mut [u8] {
    // SAFETY: a live read-write mapping of ours, not otherwise borrowed.
    unsafe { std::slice::from_raw_parts_mut(addr as *mut u8, len) }
}

impl Contender for PagePerSection {
    fn module(&mut self, index: u32) {
        let code = self.map(CODE);
        let constants = self.map(CONSTANTS);
        let data = self.map(DATA);
        write_function(&mut bytes_at(code)[..CODE], index);
        bytes_at(constants)[..CONSTANTS].fill(index as u8);
        bytes_at(data)[..DATA].fill(1);
        self.protect(code, libc::PROT_READ | libc::PROT_EXEC);
        self.protect(constants, libc::PROT_READ);
        // SAFETY: the function just written, now executable.
        assert_eq!(unsafe { call(code.0) }, index);
        self.modules.push([code, constants, data]);
    }
}

fn run_one(name: &str, modules: usize) {
    let before = ProcessMemory::now();
    let mut contender: Box<dyn Contender> = match name {
        "kiln" => Box::new(Kiln::new(Arc::new(DualMappedMapper::new().expect("memfd")))),
        "kiln-in-process" => Box::new(Kiln::new(Arc::new(InProcessMapper::new()))),
        "page-per-section" => Box::new(PagePerSection {
            page: 4096,
            modules: Vec::new(),
        }),
        other => panic!("unknown contender {other}"),
    };
    let start = Instant::now();
    for i in 0..modules {
        contender.module(i as u32);
    }
    let elapsed = start.elapsed();
    let after = ProcessMemory::now();
    let n = modules as f64;
    println!(
        "RESULT name={name} modules={modules} pss_per_module={:.0} rss_per_module={:.0} vsz_per_module={:.0} ns_per_module={:.0} mappings={} {}",
        (after.pss as f64 - before.pss as f64) / n,
        (after.rss as f64 - before.rss as f64) / n,
        (after.vsz as f64 - before.vsz as f64) / n,
        elapsed.as_nanos() as f64 / n,
        after.mappings,
        contender.extra()
    );
    // Keep teardown out of the figures (and out of the syscall count): the modules are
    // "kept alive" until the process ends.
    std::mem::forget(contender);
}

fn main() {
    let args = Args::parse();
    if let Some(name) = &args.only {
        run_one(name, args.modules);
        return;
    }
    println!(
        "many small modules: {} modules of {CODE} B code (RX) + {CONSTANTS} B constants (R) + {DATA} B data (RW), all kept alive",
        args.modules
    );
    println!("raw bytes per module: {} B\n", CODE + CONSTANTS + DATA);
    println!(
        "{:<18} {:>12} {:>12} {:>14} {:>12} {:>10} {:>14}",
        "contender",
        "PSS KB/mod",
        "RSS KB/mod",
        "addr KB/mod",
        "ns/mod",
        "mappings",
        "syscalls/mod"
    );
    let mut kiln_pss = f64::NAN;
    let mut rows = Vec::new();
    for name in CONTENDERS {
        let result = run_child(&[
            "--only".into(),
            name.into(),
            "--modules".into(),
            args.modules.to_string(),
        ]);
        let syscalls = if args.no_syscalls || !have_strace() {
            None
        } else {
            // Steady state: the difference between N and N/10 modules, per extra module.
            let small = (args.modules / 10).max(1);
            let count = |m: usize| {
                count_syscalls(&[
                    "--only".into(),
                    name.into(),
                    "--modules".into(),
                    m.to_string(),
                ])
            };
            match (count(small), count(args.modules)) {
                (Ok(a), Ok(b)) => Some((b as f64 - a as f64) / (args.modules - small) as f64),
                _ => None,
            }
        };
        match result {
            Ok(results) => {
                let r = &results[0];
                let pss = field(r, "pss_per_module") / 1024.0;
                if name == "kiln" {
                    kiln_pss = pss;
                }
                println!(
                    "{:<18} {:>12.2} {:>12.2} {:>14.2} {:>12.0} {:>10} {:>14}",
                    name,
                    pss,
                    field(r, "rss_per_module") / 1024.0,
                    field(r, "vsz_per_module") / 1024.0,
                    field(r, "ns_per_module"),
                    field(r, "mappings"),
                    syscalls.map_or("n/a".to_string(), |s| format!("{s:.3}")),
                );
                rows.push((name, pss, r.clone()));
            }
            Err(e) => println!("{name:<18} failed: {e}"),
        }
    }
    println!();
    for (name, pss, r) in &rows {
        if *name != "kiln" {
            println!("{name} / kiln resident (PSS): {:.2}x", pss / kiln_pss);
        } else {
            let extra: Vec<String> = r
                .iter()
                .filter(|(k, _)| {
                    ["mapped", "resident_counted_once", "reserved"].contains(&k.as_str())
                })
                .map(|(k, v)| format!("{k}={v}"))
                .collect();
            println!("kiln manager stats: {}", extra.join(" "));
        }
    }
    println!("target: kiln <= 12.5 KB resident per module; mappings not growing with modules; <= 0.1 syscalls per module");
}
