//! The session's state: what every room of the session works on (its libraries, memory,
//! executor, plugins, what layers on top keep). It imports no room: the rooms (library
//! operations, links, resolution, removal) each add their methods to [`crate::Jit`] and
//! work on this.

use crate::executor::Executor;
use crate::library::LibraryData;
use crate::plugin::{PluginRegistration, Plugins};
use kiln_memory::{MemoryManager, Placement, SlabLayout, SlabMemoryManager};
use parking_lot::RwLock;
use std::sync::atomic::{AtomicU32, AtomicU64};
use std::sync::Arc;

pub(crate) static NEXT_SESSION: AtomicU32 = AtomicU32::new(1);

/// What layers on top of the session keep per session (the lazy layer's stubs and
/// epochs), made on first use. The session holds it without knowing its types: a layer
/// depends on the session, not the other way round.
#[derive(Default)]
pub(crate) struct Extensions(parking_lot::Mutex<Vec<Arc<dyn std::any::Any + Send + Sync>>>);

impl Extensions {
    /// The session's `T`, made now if it has none.
    pub(crate) fn get<T: std::any::Any + Send + Sync + Default>(&self) -> Arc<T> {
        let mut list = self.0.lock();
        if let Some(found) = list.iter().find_map(|e| e.clone().downcast::<T>().ok()) {
            return found;
        }
        let made = Arc::new(T::default());
        list.push(made.clone());
        made
    }
}

pub(crate) struct Inner {
    /// What layers on top keep (first: dropped before the memory their modules use).
    pub(crate) extensions: Extensions,
    /// The executor's instruction set: what every link is for.
    pub(crate) architecture: kiln_link::Architecture,
    /// The executor's operating system: what a link takes from the system.
    pub(crate) target_os: crate::executor::TargetOs,
    pub(crate) session: u32,
    pub(crate) executor: Executor,
    pub(crate) export_to_libraries: bool,
    /// Exports published at JIT code's first call of the loader
    /// ([`crate::JitBuilder::exports_on_demand`]).
    pub(crate) exports_on_demand: bool,
    pub(crate) noexec: bool,
    pub(crate) memory: Arc<dyn MemoryManager>,
    pub(crate) low_memory: LowMemory,
    pub(crate) libraries: RwLock<Vec<Arc<LibraryData>>>,
    pub(crate) plugins: Arc<Plugins>,
    /// The built-in debugger and profiler listener's registration, if on.
    pub(crate) _debug_support: Option<PluginRegistration>,
    /// Whether modules are registered with the GDB JIT interface (which is given each
    /// object linked, with its debug information: no module is mapped from an image).
    pub(crate) gdb: bool,
    pub(crate) next_module: AtomicU64,
    pub(crate) compiler: Arc<dyn kiln_cache::Compiler>,
    pub(crate) object_cache: Option<Arc<dyn kiln_cache::ObjectCache>>,
    pub(crate) image_cache: Option<Arc<dyn kiln_cache::ImageCache>>,
    /// Every file the session read an input from (objects, archives, `-l` libraries'
    /// archives), for an image's key: files read are not in `/proc/self/maps`.
    pub(crate) files_read: parking_lot::Mutex<Vec<(std::path::PathBuf, crate::SharedBytes)>>,
}

/// Memory in the low 2 GiB for non-PIC code, reserved on first use (most programs never
/// need it, and reserving costs a round trip to a remote executor).
pub(crate) struct LowMemory {
    pub(crate) given: Option<Option<Arc<dyn MemoryManager>>>,
    /// The executor's architecture's trap bytes, for freed code.
    pub(crate) trap: [u8; 4],
    pub(crate) mapper: Option<Arc<dyn kiln_memory::Mapper>>,
    pub(crate) built: std::sync::OnceLock<Option<SlabMemoryManager>>,
}

impl LowMemory {
    pub(crate) fn get(&self) -> Option<&dyn MemoryManager> {
        if let Some(given) = &self.given {
            return given.as_deref();
        }
        self.built
            .get_or_init(|| {
                let mut builder = SlabMemoryManager::builder()
                    .trap_pattern(self.trap)
                    .placement(Placement::Low2GiB)
                    .layout(SlabLayout {
                        read_execute: 64 << 20,
                        read: 32 << 20,
                        read_write: 32 << 20,
                    });
                if let Some(m) = &self.mapper {
                    builder = builder.mapper(m.clone());
                }
                builder
                    .build()
                    .map_err(
                        |e| tracing::debug!(%e, "no low-2GiB memory: non-PIC code will not link"),
                    )
                    .ok()
            })
            .as_ref()
            .map(|m| m as &dyn MemoryManager)
    }
}

impl MemoryManager for LowMemory {
    fn allocate(
        &self,
        request: &kiln_memory::AllocationRequest,
    ) -> Result<kiln_memory::InFlightAllocation, kiln_memory::MemoryError> {
        match self.get() {
            Some(m) => m.allocate(request),
            None => Err(kiln_memory::MemoryError::InvalidConfiguration(
                "no memory in the low 2 GiB could be reserved for non-PIC code".into(),
            )),
        }
    }
}

/// Kiln's default memory manager: built — its first slab reserved — at the first
/// allocation. A session whose executor is still starting ([`crate::Executor::start`])
/// is built and loads its inputs while the executor starts; a run that maps its module
/// from the image cache reserves no slab at all (in process: the mapper's probe and a
/// 256 MiB dual mapping, 5 % of an empty program's run). A build that fails is that
/// allocation's error (and is tried again at the next).
pub(crate) struct MemoryAtFirstUse {
    /// The executor's mapper; `None`: this process's default (made at first use too).
    pub(crate) mapper: Option<Arc<dyn kiln_memory::Mapper>>,
    /// The executor's architecture's trap bytes, for freed code.
    pub(crate) trap: [u8; 4],
    pub(crate) built: std::sync::OnceLock<SlabMemoryManager>,
    pub(crate) building: parking_lot::Mutex<()>,
}

impl MemoryAtFirstUse {
    fn get(&self) -> Result<&SlabMemoryManager, kiln_memory::MemoryError> {
        if let Some(built) = self.built.get() {
            return Ok(built);
        }
        let _one = self.building.lock();
        if let Some(built) = self.built.get() {
            return Ok(built);
        }
        let mut builder = SlabMemoryManager::builder().trap_pattern(self.trap);
        if let Some(mapper) = &self.mapper {
            builder = builder.mapper(mapper.clone());
        }
        let built = builder.build()?;
        Ok(self.built.get_or_init(|| built))
    }
}

impl MemoryManager for MemoryAtFirstUse {
    fn allocate(
        &self,
        request: &kiln_memory::AllocationRequest,
    ) -> Result<kiln_memory::InFlightAllocation, kiln_memory::MemoryError> {
        self.get()?.allocate(request)
    }

    fn stats(&self) -> kiln_memory::MemoryStats {
        self.built
            .get()
            .map(MemoryManager::stats)
            .unwrap_or_default()
    }
}
