//! The connection of an executor in another process, which may still be starting: a
//! child started by [`super::Executor::start`] says hello while the session is built and
//! loads its inputs; whatever needs the connection itself waits for the hello then. What
//! the session needs before that — the architecture, the operating system and the page
//! size — is read from the executor binary's ELF header (a child's binary of this
//! system's kind runs on this system), and checked against the hello when it comes.

use super::Transport;
use crate::Error;
use kiln_link::Architecture;
use kiln_memory::{Mapper, MapperError, Permission, Placement, Reservation, SegmentRange};
use kiln_remote::{CopyMapper, RemoteError, RemoteExecutor, SharedMemoryMapper, StartingExecutor};
use parking_lot::Mutex;
use std::path::Path;
use std::sync::{Arc, OnceLock};

/// What an executor's hello will say, known before it: see the module's documentation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Expected {
    pub(crate) architecture: Architecture,
    pub(crate) target_os: crate::executor::TargetOs,
    pub(crate) page_size: u64,
}

impl Expected {
    /// What a child running `binary` will say: known when `binary` is an ELF executable
    /// for this machine (it then runs on this system: Linux, this page size); `None`
    /// for anything else (a script, another architecture run by an emulator).
    pub(crate) fn of_binary(binary: &Path) -> Option<Expected> {
        use std::io::Read;
        let mut header = [0u8; 20];
        std::fs::File::open(binary)
            .and_then(|mut f| f.read_exact(&mut header))
            .ok()?;
        // ELF, 64-bit, little-endian (every architecture Kiln links for).
        if header[..4] != *b"\x7fELF" || header[4] != 2 || header[5] != 1 {
            return None;
        }
        let machine = u16::from_le_bytes([header[18], header[19]]);
        let architecture = match machine {
            m if m == object::elf::EM_X86_64.0 => Architecture::X86_64,
            m if m == object::elf::EM_AARCH64.0 => Architecture::Aarch64,
            m if m == object::elf::EM_RISCV.0 => Architecture::Riscv64,
            _ => return None,
        };
        (architecture == Architecture::host()).then(|| Expected {
            architecture,
            target_os: crate::executor::TargetOs::Linux,
            page_size: kiln_memory::page_size().max(4096),
        })
    }
}

/// A child on its way: its process started on a thread of its own (`fork` and `exec` of
/// a large process take a good part of a millisecond, which the caller spends loading its
/// inputs instead); the thread's result is the started child, yet to say hello.
type Spawning = std::thread::JoinHandle<Result<StartingExecutor, RemoteError>>;

/// An executor's connection, ready or still starting.
pub(crate) struct Connection {
    ready: OnceLock<Result<Arc<RemoteExecutor>, String>>,
    starting: Mutex<Option<Spawning>>,
    expected: Option<Expected>,
    /// The executor's process id, once known (0 before).
    pid: std::sync::atomic::AtomicU32,
    /// Libraries whose load was asked for before the hello: sent, in order, right after
    /// it, before the connection is anyone's (see [`Connection::load_library`]).
    libraries: Mutex<EarlyLoads>,
    /// A thread's batch asked for before the hello (see [`Connection::batch_when_ready`]).
    batch: Mutex<Option<LaterBatch>>,
    /// Whether `batch` holds one (read without its lock on every use of the connection).
    batch_asked: std::sync::atomic::AtomicBool,
}

/// The loads asked for before the hello.
struct EarlyLoads {
    loads: Vec<LibraryLoad>,
    /// Whether they were sent (or the start failed): a load asked for now goes at once.
    closed: bool,
}

/// A batch asked for before the executor's hello, by one thread (whose scope alone
/// ends it).
#[derive(Clone, Copy)]
enum LaterBatch {
    /// To begin at that thread's first use of the connection.
    Asked(std::thread::ThreadId),
    /// Begun.
    Begun(std::thread::ThreadId),
}

impl LaterBatch {
    fn thread(self) -> std::thread::ThreadId {
        match self {
            LaterBatch::Asked(t) | LaterBatch::Begun(t) => t,
        }
    }
}

/// A library's load asked for before the executor's hello.
enum LibraryLoad {
    /// Not sent yet: its path.
    Waiting(String),
    /// Loaded: the executor's handle.
    Loaded(u64),
    /// Refused: why.
    Failed(String),
}

/// The bit that marks a handle [`Connection::load_library`] gave before the hello (an
/// index into its loads; the executor's own handles are small counts).
const LOAD_ASKED_EARLY: u64 = 1 << 62;

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection")
            .field("pid", &self.pid())
            .field("ready", &self.ready.get().map(|r| r.is_ok()))
            .finish()
    }
}

impl Connection {
    /// A connection whose hello was read.
    pub(crate) fn ready(remote: Arc<RemoteExecutor>) -> Self {
        let pid = remote.pid();
        Connection {
            ready: OnceLock::from(Ok(remote)),
            starting: Mutex::new(None),
            expected: None,
            pid: pid.into(),
            libraries: Mutex::new(EarlyLoads {
                loads: Vec::new(),
                closed: true,
            }),
            batch: Mutex::new(None),
            batch_asked: false.into(),
        }
    }

    /// A child being started by `spawn` (on a thread of its own), its hello to be read at
    /// the first need; `expected` is what the hello must say.
    pub(crate) fn spawning(
        spawn: impl FnOnce() -> Result<StartingExecutor, RemoteError> + Send + 'static,
        expected: Expected,
    ) -> Result<Self, Error> {
        let thread = std::thread::Builder::new()
            .name("kiln-executor-start".into())
            .spawn(spawn)
            .map_err(|e| Error::Remote(RemoteError::Start(format!("a thread to start it: {e}"))))?;
        Ok(Connection {
            ready: OnceLock::new(),
            starting: Mutex::new(Some(thread)),
            expected: Some(expected),
            pid: 0.into(),
            libraries: Mutex::new(EarlyLoads {
                loads: Vec::new(),
                closed: false,
            }),
            batch: Mutex::new(None),
            batch_asked: false.into(),
        })
    }

    /// The executor's process id (0 while its process is being started).
    pub(crate) fn pid(&self) -> u32 {
        match self.get_if_ready() {
            Some(remote) => remote.pid(),
            None => self.pid.load(std::sync::atomic::Ordering::Relaxed),
        }
    }

    /// What the hello says (or will say) that the session needs before it.
    pub(crate) fn expected(&self) -> Option<Expected> {
        self.expected
    }

    /// The connection, once the executor said hello (waiting for it the first time); a
    /// start that failed is this error, every time. The libraries whose load was asked for
    /// before the hello were loaded before it is returned the first time (one that failed
    /// is [`Connection::library_failure`]'s to tell). A batch the calling thread asked for
    /// before the hello begins here.
    pub(crate) fn get(&self) -> Result<&Arc<RemoteExecutor>, Error> {
        let remote = self
            .ready
            .get_or_init(|| self.finish())
            .as_ref()
            .map_err(|why| Error::Remote(RemoteError::Start(why.clone())))?;
        if self.batch_asked.load(std::sync::atomic::Ordering::Acquire) {
            let this_thread = std::thread::current().id();
            let mut batch = self.batch.lock();
            if let Some(LaterBatch::Asked(thread)) = *batch {
                if thread == this_thread {
                    *batch = remote
                        .begin_batch()
                        .then_some(LaterBatch::Begun(this_thread));
                    self.batch_asked
                        .store(false, std::sync::atomic::Ordering::Release);
                }
            }
        }
        Ok(remote)
    }

    /// A batch of the calling thread's deferrable requests ([`RemoteExecutor::batch`]),
    /// begun at its first use of the connection after the hello (not waiting for it
    /// here: a link's first steps need no executor), ended with the scope.
    pub(crate) fn batch_when_ready(&self) -> super::service::BatchScope<'_> {
        let thread = std::thread::current().id();
        {
            let mut batch = self.batch.lock();
            if batch.is_some() {
                // Another scope asked first: this one defers nothing.
                return super::service::BatchScope::none();
            }
            *batch = Some(LaterBatch::Asked(thread));
            self.batch_asked
                .store(true, std::sync::atomic::Ordering::Release);
        }
        super::service::BatchScope::ending_with(move || {
            let ended = {
                let mut batch = self.batch.lock();
                // Only this scope's own: another thread's may stand there since.
                match *batch {
                    Some(later) if later.thread() == thread => {
                        self.batch_asked
                            .store(false, std::sync::atomic::Ordering::Release);
                        batch.take()
                    }
                    _ => None,
                }
            };
            if let (Some(LaterBatch::Begun(_)), Some(remote)) = (ended, self.get_if_ready()) {
                // As a dropped scope does: a failure is the next request's to find.
                let _ = remote.end_batch();
            }
        })
    }

    /// Loads the shared library at `path` in the executor: at once when it has said hello,
    /// else right after the hello, before the connection serves any other request (so
    /// the session goes on loading its inputs and linking while the executor starts). The
    /// handle is for [`Connection::executor_library`].
    pub(crate) fn load_library(&self, path: &str) -> Result<u64, Error> {
        {
            let mut early = self.libraries.lock();
            if !early.closed {
                early.loads.push(LibraryLoad::Waiting(path.to_string()));
                return Ok(LOAD_ASKED_EARLY | (early.loads.len() as u64 - 1));
            }
        }
        load_library(self.get()?, path)
    }

    /// The executor's handle of library `handle` (as [`Connection::load_library`] gave
    /// it; 0, the whole process, is itself): loaded first if its load waits for the
    /// hello; an error if it failed to load.
    pub(crate) fn executor_library(&self, handle: u64) -> Result<u64, Error> {
        if handle & LOAD_ASKED_EARLY == 0 {
            return Ok(handle);
        }
        // A failed start is the error; a failed load is said below, by its library.
        self.get()?;
        let index = (handle & !LOAD_ASKED_EARLY) as usize;
        match self.libraries.lock().loads.get(index) {
            Some(LibraryLoad::Loaded(id)) => Ok(*id),
            Some(LibraryLoad::Failed(why)) => Err(Error::Executor(why.clone())),
            Some(LibraryLoad::Waiting(path)) => Err(Error::Executor(format!(
                "{path}: the executor never started to load it"
            ))),
            None => Err(Error::Executor(format!(
                "no library has handle {handle:#x}"
            ))),
        }
    }

    /// Sends the loads asked for before the hello, in order, and closes the queue: called
    /// by [`Connection::finish`] once the hello is read, before the connection is given to
    /// anyone (no other request can overtake them; no JIT code runs yet, so no request of
    /// the executor's can come meanwhile). `remote` is `None` for a start that failed.
    fn send_early_loads(&self, remote: Option<&RemoteExecutor>) {
        let mut early = self.libraries.lock();
        early.closed = true;
        let Some(remote) = remote else {
            return;
        };
        for load in early.loads.iter_mut() {
            let LibraryLoad::Waiting(path) = load else {
                continue;
            };
            *load = match load_library(remote, path) {
                Ok(id) => LibraryLoad::Loaded(id),
                // The executor's message names the file (dlerror does); said once more
                // where it does not.
                Err(error) => {
                    let why = error.to_string();
                    LibraryLoad::Failed(if why.contains(path.as_str()) {
                        why
                    } else {
                        format!("{path}: {why}")
                    })
                }
            };
        }
    }

    /// Why the library of `handle` (one whose load was asked for before the hello) could
    /// not be loaded, once its load was sent; `None` for any other handle.
    pub(crate) fn library_failure(&self, handle: u64) -> Option<String> {
        if handle & LOAD_ASKED_EARLY == 0 {
            return None;
        }
        let index = (handle & !LOAD_ASKED_EARLY) as usize;
        match self.libraries.lock().loads.get(index) {
            Some(LibraryLoad::Failed(why)) => Some(why.clone()),
            _ => None,
        }
    }

    /// The connection if the hello was read already (nothing waited for).
    pub(crate) fn get_if_ready(&self) -> Option<&Arc<RemoteExecutor>> {
        self.ready.get().and_then(|r| r.as_ref().ok())
    }

    /// Kills and reaps a child that never got as far as its hello being read.
    pub(crate) fn abandon(&self) {
        let spawning = self.starting.lock().take();
        if let Some(thread) = spawning {
            // Its process, once started, is killed and reaped as the result drops.
            drop(thread.join());
        }
    }

    /// The hello read, then the loads asked for before it sent (or dropped, if the start
    /// failed), all before the connection is anyone's.
    fn finish(&self) -> Result<Arc<RemoteExecutor>, String> {
        let started = self.read_hello();
        self.send_early_loads(started.as_deref().ok());
        started
    }

    fn read_hello(&self) -> Result<Arc<RemoteExecutor>, String> {
        let thread = self
            .starting
            .lock()
            .take()
            .ok_or_else(|| "the executor was given up before it said hello".to_string())?;
        let starting = match thread.join() {
            Ok(Ok(starting)) => starting,
            Ok(Err(RemoteError::Start(why))) => return Err(why),
            Ok(Err(other)) => return Err(other.to_string()),
            Err(_) => return Err("the thread starting the executor panicked".into()),
        };
        self.pid
            .store(starting.pid(), std::sync::atomic::Ordering::Relaxed);
        let remote = starting.finish().map_err(|e| match e {
            RemoteError::Start(why) => why,
            other => other.to_string(),
        })?;
        if let Some(expected) = self.expected {
            let hello = remote.hello();
            let says = (
                Architecture::from_triple(&hello.triple),
                crate::executor::TargetOs::from_triple(&hello.triple),
                hello.page_size.max(4096),
            );
            if says
                != (
                    Some(expected.architecture),
                    expected.target_os,
                    expected.page_size,
                )
            {
                remote.shutdown();
                return Err(format!(
                    "the executor says it runs {} code with {}-byte pages; its binary was read as {:?} with {}-byte pages",
                    hello.triple, hello.page_size, expected.architecture, expected.page_size
                ));
            }
        }
        Ok(Arc::new(remote))
    }
}

/// Loads the shared library at `path` in the executor: its handle there.
fn load_library(remote: &RemoteExecutor, path: &str) -> Result<u64, Error> {
    match remote.request(&kiln_remote::protocol::Request::LoadLibrary {
        path: path.to_string(),
    })? {
        kiln_remote::protocol::Response::Value(id) => Ok(id),
        other => Err(Error::Executor(format!(
            "load library {path}: unexpected answer {other:?}"
        ))),
    }
}

/// The mapper of an executor still starting: made from the connection at its first use
/// (a reservation, after the inputs loaded); what the memory manager asks before that —
/// its name, page size, whether pages are shared — is known without the connection.
#[derive(Debug)]
pub(crate) struct StartingMapper {
    connection: Arc<Connection>,
    transport: Transport,
    debuggable: bool,
    page_size: u64,
    inner: OnceLock<Result<Arc<dyn Mapper>, String>>,
}

impl StartingMapper {
    pub(crate) fn new(
        connection: Arc<Connection>,
        transport: Transport,
        debuggable: bool,
        page_size: u64,
    ) -> Self {
        StartingMapper {
            connection,
            transport,
            debuggable,
            page_size,
            inner: OnceLock::new(),
        }
    }

    fn inner(&self, operation: &'static str) -> Result<&Arc<dyn Mapper>, MapperError> {
        self.inner
            .get_or_init(|| {
                let remote = self.connection.get().map_err(|e| e.to_string())?.clone();
                let mapper: Arc<dyn Mapper> = match self.transport {
                    Transport::SharedMemory => Arc::new(
                        SharedMemoryMapper::new(remote)
                            .map_err(|e| e.to_string())?
                            .with_shared_pages(!self.debuggable),
                    ),
                    Transport::Copy => {
                        Arc::new(CopyMapper::new(remote).with_shared_pages(!self.debuggable))
                    }
                };
                Ok(mapper)
            })
            .as_ref()
            .map_err(|reason| MapperError::Refused {
                operation,
                reason: reason.clone(),
            })
    }
}

// SAFETY: every operation on memory is the inner mapper's (a `SharedMemoryMapper` or
// `CopyMapper`, made once), which keeps that trait's promises; this one only waits for it.
unsafe impl Mapper for StartingMapper {
    fn name(&self) -> &'static str {
        match self.transport {
            Transport::SharedMemory => "shared-memory",
            Transport::Copy => "copy",
        }
    }

    fn page_size(&self) -> u64 {
        self.page_size
    }

    fn shares_pages(&self) -> bool {
        !self.debuggable
    }

    fn reserve(&self, len: u64, placement: &Placement) -> Result<Reservation, MapperError> {
        self.inner("reserve")?.reserve(len, placement)
    }

    unsafe fn prepare(
        &self,
        reservation: &Reservation,
        start: u64,
        end: u64,
        permission: Permission,
    ) -> Result<(), MapperError> {
        // SAFETY: the caller's promises, passed on.
        unsafe {
            self.inner("prepare")?
                .prepare(reservation, start, end, permission)
        }
    }

    unsafe fn initialize(
        &self,
        reservation: &Reservation,
        segments: &[SegmentRange],
    ) -> Result<(), MapperError> {
        // SAFETY: the caller's promises, passed on.
        unsafe { self.inner("initialize")?.initialize(reservation, segments) }
    }

    unsafe fn deinitialize(
        &self,
        reservation: &Reservation,
        start: u64,
        end: u64,
        permission: Permission,
    ) -> Result<(), MapperError> {
        // SAFETY: the caller's promises, passed on.
        unsafe {
            self.inner("deinitialize")?
                .deinitialize(reservation, start, end, permission)
        }
    }

    fn populate(&self, reservation: &Reservation, start: u64, end: u64) {
        if let Ok(inner) = self.inner("populate") {
            inner.populate(reservation, start, end);
        }
    }

    unsafe fn copy_from_file(
        &self,
        reservation: &Reservation,
        start: u64,
        file: &std::fs::File,
        offset: u64,
        len: u64,
    ) -> Result<bool, MapperError> {
        // SAFETY: the caller's promises, passed on.
        unsafe {
            self.inner("copy from file")?
                .copy_from_file(reservation, start, file, offset, len)
        }
    }

    unsafe fn release(&self, reservation: &Reservation) -> Result<(), MapperError> {
        // SAFETY: the caller's promises, passed on.
        unsafe { self.inner("release")?.release(reservation) }
    }

    fn resident_bytes(&self, reservation: &Reservation) -> Option<u64> {
        self.inner("resident bytes")
            .ok()?
            .resident_bytes(reservation)
    }

    fn target_is_local(&self) -> bool {
        false
    }
}
