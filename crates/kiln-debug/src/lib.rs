//! # kiln-debug
//!
//! What Kiln tells debuggers and profilers about the code it links, built on the
//! controller's side from the objects and where their sections landed:
//!
//! - [`gdb_image`]: a copy of an object with each section header's address set to where
//!   the section landed, for the GDB JIT interface. gdb and lldb read it as they read any
//!   relocatable object: they apply its relocations to the DWARF themselves, with the
//!   section addresses given, so source lines, breakpoints by name and unwinding through
//!   `.eh_frame` work without Kiln rewriting any debug section.
//! - [`debug_module`]: the module's functions (name, address, size) with their source
//!   lines from the objects' DWARF line tables, relocated to target addresses — what a
//!   perf map and a jitdump file hold.
//!
//! The executor (in this process or another) writes these where the tools look: see
//! `kiln-executor`'s `debug_outputs`.
//!
//! ```no_run
//! use kiln_debug::{debug_module, ObjectPlacement};
//! use kiln_wire::protocol::DebugFunction;
//! let object = std::fs::read("f.o")?; // built with -g
//! // Section 1 (.text) of f.o landed at 0x7f00_0000_1000; `f` is its first 32 bytes.
//! let placed = [ObjectPlacement {
//!     name: "f.o",
//!     data: &object,
//!     sections: vec![(1, 0x7f00_0000_1000)],
//! }];
//! let f = DebugFunction { name: "f".into(), address: 0x7f00_0000_1000, size: 32, lines: vec![] };
//! let (module, errors) = debug_module(&placed, vec![f], true, true);
//! assert!(errors.is_empty());
//! println!("{} image(s); f's lines: {:?}", module.images.len(), module.functions[0].lines);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod gdb_image;
mod lines;

pub use gdb_image::gdb_image;
pub use lines::{debug_module, ObjectPlacement};

/// Why debug information could not be built for an object.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DebugError {
    /// The object is not a well-formed ELF64 little-endian object.
    #[error("{object}: {what}")]
    Malformed {
        /// The object's name.
        object: String,
        /// What is wrong.
        what: String,
    },
    /// The object's DWARF could not be read.
    #[error("{object}: reading DWARF ({section}): {what}")]
    Dwarf {
        /// The object's name.
        object: String,
        /// The DWARF section or unit involved.
        section: String,
        /// What is wrong.
        what: String,
    },
}
