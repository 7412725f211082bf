//! Debugger and profiler support: a built-in plugin that tells the executor's GDB JIT
//! interface, perf map and jitdump file of every module.

use crate::executor::Executor;
use crate::plugin::{LoadedModule, Plugin, PluginError};
use crate::Error;
use kiln_debug::ObjectPlacement;
use kiln_link::SymbolKind;
use kiln_remote::protocol::{DebugFunction, DebugOutputs};
use parking_lot::Mutex;
use rustc_hash::FxHashMap;
use std::path::PathBuf;

/// What debuggers and profilers are told of a session's modules (all off by default).
///
/// The outputs are written by the executor, in the process that runs the code: for an
/// out-of-process executor, a debugger attaches to the executor and the perf files are
/// named after its pid.
///
/// ```no_run
/// let jit = kiln::Jit::builder()
///     .debug_support(kiln::debug::DebugSupport { gdb: true, perf_map: true, ..Default::default() })
///     .build()?;
/// # Ok::<(), kiln::Error>(())
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DebugSupport {
    /// Register each module with the GDB JIT interface (`__jit_debug_register_code`):
    /// gdb and lldb then see its functions, source lines (objects built with `-g`) and
    /// frames. Unregistered when the module is freed.
    pub gdb: bool,
    /// Append each function to `/tmp/perf-<pid>.map` (read by `perf report`).
    pub perf_map: bool,
    /// Write `jit-<pid>.dump` for `perf inject --jit`: each function's code and, with
    /// `-g`, its source lines.
    pub jitdump: bool,
    /// Where the jitdump file goes (default: `$JITDUMPDIR`, else `~/.debug/jit`, in a new
    /// `kiln-<pid>-<time>` directory).
    pub jitdump_dir: Option<PathBuf>,
}

impl DebugSupport {
    fn any(&self) -> bool {
        self.gdb || self.perf_map || self.jitdump
    }
}

/// The listener behind [`DebugSupport`]: builds each module's debug images and function
/// list (`kiln-debug`) and hands them to the executor. [`crate::JitBuilder::debug_support`]
/// registers one for the session's whole life; one made with [`DebugListener::start`] and
/// registered with [`crate::Jit::add_plugin`] covers the modules loaded while its
/// registration lives (and unregisters each at its free).
pub struct DebugListener {
    executor: Executor,
    support: DebugSupport,
    /// Module id → the executor's registration handle.
    handles: Mutex<FxHashMap<u64, u64>>,
}

impl DebugListener {
    /// Turns the executor's outputs on; `None` if `support` asks for nothing.
    ///
    /// A session built without debug support maps code in process as two shared views;
    /// gdb cannot set software breakpoints there and perf does not apply perf maps to it
    /// (use [`crate::JitBuilder::debug_support`] for those).
    pub fn start(support: &DebugSupport, executor: &Executor) -> Result<Option<Self>, Error> {
        if !support.any() {
            return Ok(None);
        }
        executor.enable_debug_outputs(&DebugOutputs {
            gdb: support.gdb,
            perf_map: support.perf_map,
            jitdump_dir: support.jitdump.then(|| {
                support
                    .jitdump_dir
                    .as_ref()
                    .map(|d| d.to_string_lossy().into_owned())
                    .unwrap_or_default()
            }),
        })?;
        Ok(Some(DebugListener {
            executor: executor.clone(),
            support: support.clone(),
            handles: Mutex::new(FxHashMap::default()),
        }))
    }
}

impl Plugin for DebugListener {
    fn name(&self) -> &str {
        "debug support"
    }

    fn module_loaded(&self, module: &LoadedModule) -> Result<(), PluginError> {
        let mut placements: Vec<ObjectPlacement<'_>> = module
            .objects
            .iter()
            .map(|o| ObjectPlacement {
                name: &o.name,
                data: o.bytes(),
                sections: Vec::new(),
            })
            .collect();
        for s in &module.sections {
            if let Some(p) = placements.get_mut(s.object) {
                p.sections.push((s.index, s.address));
            }
        }
        let functions = if self.support.perf_map || self.support.jitdump {
            module
                .symbols
                .iter()
                .filter(|s| s.kind == SymbolKind::Function && s.size > 0)
                // Only code inside the module's memory (an object's st_size is its word).
                .filter(|s| {
                    module.segments.iter().any(|g| {
                        g.target <= s.address
                            && s.address.saturating_add(s.size) <= g.target + g.len
                    })
                })
                .map(|s| DebugFunction {
                    name: s.name.clone(),
                    address: s.address,
                    size: s.size,
                    lines: Vec::new(),
                })
                .collect()
        } else {
            Vec::new()
        };
        let (mut debug, errors) = kiln_debug::debug_module(
            &placements,
            functions,
            self.support.gdb,
            self.support.jitdump,
        );
        debug.perf_map = self.support.perf_map;
        debug.jitdump = self.support.jitdump;
        let handle = self.executor.register_debug(debug)?;
        self.handles.lock().insert(module.id, handle);
        match errors.len() {
            0 => Ok(()),
            1 => Err(errors[0].to_string().into()),
            n => Err(format!("{} (and {} more objects not described)", errors[0], n - 1).into()),
        }
    }

    fn module_freed(&self, module: &LoadedModule) -> Result<(), PluginError> {
        if let Some(handle) = self.handles.lock().remove(&module.id) {
            self.executor.unregister_debug(handle);
        }
        Ok(())
    }
}
