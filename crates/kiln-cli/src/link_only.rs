//! `kiln link`: a link for a chosen architecture at chosen addresses, with no executor,
//! written to a file as an ELF image ("show me what you linked"): disassemble it with
//! `llvm-objdump -d`, compare it with another linker's output, or load it in gdb.

use clap::{Args, ValueEnum};
use kiln_link::{link, Architecture, ArchiveInput, LinkContext, LinkOptions, ObjectInput};
use kiln_memory::{OfflineMapper, SlabMemoryManager};
use std::path::PathBuf;
use std::sync::Arc;

/// The architectures `kiln link --target` accepts.
#[derive(Clone, Copy, Debug, ValueEnum)]
pub(crate) enum Target {
    /// x86-64.
    #[value(name = "x86_64", alias = "x86-64")]
    X86_64,
    /// AArch64.
    #[value(name = "aarch64", alias = "arm64")]
    Aarch64,
    /// RISC-V 64 (RV64GC, LP64D).
    #[value(name = "riscv64", alias = "riscv64gc")]
    Riscv64,
}

/// `kiln link` arguments.
#[derive(Args, Debug)]
pub(crate) struct LinkArgs {
    /// Relocatable objects (`.o`) and static archives (`.a`), in link order.
    #[arg(required = true, value_name = "INPUT")]
    inputs: Vec<PathBuf>,
    /// Where to write the image.
    #[arg(short = 'o', long, value_name = "FILE")]
    output: PathBuf,
    /// The architecture to link for (default: this machine's).
    #[arg(long, value_enum)]
    target: Option<Target>,
    /// The target address of the first segment (code); constants and data follow.
    #[arg(long, value_name = "ADDRESS", default_value = "0x10000000", value_parser = parse_address)]
    base: u64,
    /// Gives an undefined symbol an address: `--defsym printf=0x7f0000001000`.
    #[arg(long, value_name = "NAME=ADDRESS")]
    defsym: Vec<String>,
    /// Gives every symbol still undefined a placeholder address of its own, 1 GiB above
    /// the base, named in the image's symbol table (instead of failing).
    #[arg(long)]
    allow_undefined: bool,
    /// Prints where each symbol landed.
    #[arg(long)]
    map: bool,
    /// Print the time of each link phase and pass to stderr (as `kiln run --show-times`).
    #[arg(long)]
    show_times: bool,
}

fn parse_address(text: &str) -> Result<u64, String> {
    let parsed = match text.strip_prefix("0x").or_else(|| text.strip_prefix("0X")) {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => text.parse(),
    };
    parsed.map_err(|_| format!("'{text}' is not an address (decimal or 0x-hex)"))
}

/// Resolves from `--defsym`, then (with `--allow-undefined`) with placeholders.
struct OfflineContext {
    defined: Vec<(String, u64)>,
    placeholders: Vec<(String, u64)>,
    next_placeholder: Option<u64>,
    architecture: Architecture,
}

impl LinkContext for OfflineContext {
    fn resolve(&mut self, name: &str) -> Option<u64> {
        if let Some(&(_, address)) = self.defined.iter().find(|(n, _)| n == name) {
            return Some(address);
        }
        let next = self.next_placeholder.as_mut()?;
        let address = *next;
        *next += 16;
        self.placeholders.push((name.to_string(), address));
        Some(address)
    }

    fn tls_module_id(&mut self) -> Result<u64, String> {
        Ok(1)
    }

    /// The module's block is the first after the thread control block: at TP + 16 on
    /// AArch64 (TLS variant I), at TP on RISC-V (variant I, glibc's TCB lies below TP),
    /// just below TP on x86-64 (variant II).
    fn place_static_tls(&mut self, _: u64, _: &[u8], size: u64, align: u64) -> Result<i64, String> {
        let align = align.max(1);
        Ok(match self.architecture {
            Architecture::Aarch64 => 16u64.next_multiple_of(align) as i64,
            Architecture::Riscv64 => 0,
            Architecture::X86_64 => -(size.next_multiple_of(align) as i64),
        })
    }
}

/// Runs `kiln link`.
pub(crate) fn link_only(args: LinkArgs) -> Result<(), String> {
    let architecture = match args.target {
        Some(Target::X86_64) => Architecture::X86_64,
        Some(Target::Aarch64) => Architecture::Aarch64,
        Some(Target::Riscv64) => Architecture::Riscv64,
        None => Architecture::host(),
    };
    let start = std::time::Instant::now();
    let mut objects = Vec::new();
    let mut archives = Vec::new();
    for path in &args.inputs {
        let name = path.display().to_string();
        let bytes = kiln::map_file(path).map_err(|e| e.to_string())?;
        if (*bytes).as_ref().starts_with(b"!<arch>\n") {
            archives.push(ArchiveInput::parse_shared(name, bytes).map_err(|e| e.to_string())?);
        } else {
            objects.push(ObjectInput::shared(name, bytes));
        }
    }
    let mut defined = Vec::new();
    for entry in &args.defsym {
        let (name, address) = entry
            .split_once('=')
            .ok_or_else(|| format!("--defsym {entry}: expected NAME=ADDRESS"))?;
        defined.push((name.to_string(), parse_address(address)?));
    }
    let memory = SlabMemoryManager::builder()
        .mapper(Arc::new(OfflineMapper::new(args.base, 4096)))
        .build()
        .map_err(|e| e.to_string())?;
    let mut options = LinkOptions::new(&memory);
    options.architecture = architecture;
    // The image's symbol table is made from the graph; the report (owned names) only for
    // --map.
    options.keep_image = true;
    options.report_sections = args.map;
    options.times = args.show_times;
    let load = start.elapsed();
    let mut ctx = OfflineContext {
        defined,
        placeholders: Vec::new(),
        next_placeholder: args.allow_undefined.then(|| args.base + (1 << 30)),
        architecture,
    };
    let module = link(&objects, &archives, &mut ctx, &options).map_err(|e| e.to_string())?;
    let mut extra = ctx.placeholders.clone();
    extra.extend(ctx.defined.iter().cloned());
    let written = std::time::Instant::now();
    let image = module.image_elf(&extra).ok_or("the link kept no image")?;
    std::fs::write(&args.output, &image).map_err(|e| format!("{}: {e}", args.output.display()))?;
    if args.show_times {
        let (times, passes, counts) = (&module.times, &module.pass_times, &module.counts);
        crate::times::print_link_times(load, times, passes, counts);
        crate::times::print_step("write image", written.elapsed());
        crate::times::print_step("total", start.elapsed());
    }
    let names = ["code", "constants", "data", "zero-filled"];
    println!(
        "linked {} objects for {architecture} into {}:",
        module.counts.objects,
        args.output.display()
    );
    for (name, segment) in names.iter().zip(&module.image) {
        if segment.size > 0 {
            println!(
                "  {name:<12} {:#x}..{:#x} ({} bytes)",
                segment.address,
                segment.address + segment.size,
                segment.size
            );
        }
    }
    if !ctx.placeholders.is_empty() {
        println!(
            "  {} undefined symbols at placeholder addresses from {:#x}",
            ctx.placeholders.len(),
            args.base + (1 << 30)
        );
    }
    if args.map {
        let mut symbols: Vec<_> = module.symbol_info.iter().collect();
        symbols.sort_by_key(|s| s.address);
        for s in symbols {
            println!("{:#018x} {:>8} {}", s.address, s.size, s.name);
        }
    }
    // The process ends now: freeing the link's memory, image and inputs' tables would be
    // work for nothing (as `kiln run --noexec`).
    std::mem::forget((module, image, objects, archives, ctx));
    Ok(())
}
