//! The wire protocol between a controller (where Kiln links) and an executor (where the
//! code runs).
//!
//! Every message is a frame: a little-endian `u32` length of what follows, a `u32` message
//! id, a one-byte message tag, and the tag's fields in a fixed order (integers
//! little-endian, byte strings as a `u32` length and the bytes). The executor speaks first
//! with [`Hello`] (protocol version, page size, target triple, frame limit, runtime
//! symbols); then the controller sends requests and reads responses. Shared-memory file
//! descriptors travel beside the bytes of a [`Response::Reserved`] as `SCM_RIGHTS`
//! ancillary data on Unix sockets.
//!
//! Message ids, in both directions: a request of the controller carries an id of its
//! choosing (non-zero, below 2^31) and its response carries the same id. Messages the
//! executor sends on its own — [`Response::Output`], [`Response::Crashed`],
//! [`Response::Exited`] — carry id 0. Ids with the top bit set are reserved for requests
//! the *executor* makes of the controller (a lazy-compilation stub hit out of process),
//! answered with the same id; a controller that does not serve such requests treats one
//! as a protocol error.
//!
//! Over TCP the frames travel inside an authenticated, encrypted Noise session
//! ([`crate::secure`]); the executor first sends an 8-byte preamble saying whether it
//! requires it. The whole exchange is written down for implementers in
//! `docs/PROTOCOL.md`.
//!
//! The encoding is written by hand rather than with serde: the format is the contract
//! between two programs that may be built apart, so it is spelled out here byte by byte,
//! versioned, and bounded (every length is checked against [`MAX_FRAME`] and the bytes
//! left before anything is allocated) — which is also what the decoder's fuzz target
//! exercises.

use std::fmt;

/// Protocol version; the executor's [`Hello`] must match.
pub const VERSION: u32 = 2;
/// Magic bytes at the start of a [`Hello`].
pub const MAGIC: [u8; 4] = *b"KILN";
/// Largest frame accepted: a copy-transport write carries at most [`MAX_WRITE`] bytes.
pub const MAX_FRAME: u32 = MAX_WRITE + (64 << 10);
/// Largest write (or read) of code bytes in one request; larger ones go in pieces.
pub const MAX_WRITE: u32 = 32 << 20;
/// Largest string (symbol names, paths, arguments).
pub const MAX_STRING: usize = 1 << 16;
/// Largest number of items in a list (arguments, segments, initializers).
pub const MAX_ITEMS: usize = 1 << 20;

/// Why a frame could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DecodeError {
    /// The frame ended before a field.
    #[error("message truncated: {0}")]
    Truncated(&'static str),
    /// An unknown message tag.
    #[error("unknown message tag {0}")]
    UnknownTag(u8),
    /// A field out of its range.
    #[error("invalid {what}: {value}")]
    Invalid {
        /// The field.
        what: &'static str,
        /// Its value.
        value: u64,
    },
    /// Bytes left over after the last field.
    #[error("{0} bytes after the end of the message")]
    Trailing(usize),
}

/// Where a reservation must lie (mirrors `kiln_memory::Placement`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WirePlacement {
    /// Anywhere.
    Anywhere,
    /// Near the executor's shared libraries.
    HostLibraries,
    /// Within ±2 GiB of `[start, end)`.
    Near(u64, u64),
    /// Below 2 GiB.
    Low2GiB,
}

/// A finished segment: `(target, len, permission)` with permission 0 = RX, 1 = R, 2 = RW.
pub type WireSegment = (u64, u64, u8);

/// What the executor says first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hello {
    /// Protocol version.
    pub version: u32,
    /// The executor's page size.
    pub page_size: u64,
    /// The executor's target triple.
    pub triple: String,
    /// The executor's process id.
    pub pid: u32,
    /// The largest frame the executor accepts.
    pub max_frame: u32,
    /// The names the executor's runtime provides to JIT code in place of the C
    /// runtime's (`__tls_get_addr`, `__cxa_thread_atexit`, …), with their addresses there.
    pub runtime_symbols: Vec<(String, u64)>,
    /// What the executor serves beyond the base protocol ([`FEATURE_BATCH`]); an
    /// executor that sends no such field (executor-c) serves none.
    pub features: u32,
}

/// [`Hello::features`]: the executor serves [`Request::Batch`].
pub const FEATURE_BATCH: u32 = 1;

impl Hello {
    /// The address of runtime symbol `name`, if the executor provides it.
    pub fn runtime_symbol(&self, name: &str) -> Option<u64> {
        self.runtime_symbols
            .iter()
            .find(|(n, _)| n == name)
            .map(|&(_, a)| a)
    }
}

/// One definition to export to libraries the executor loads later: name, address, size,
/// and whether it is a function.
pub type WireExport = (String, u64, u64, bool);

/// What an executor writes for debuggers and profilers, enabled once per executor
/// process ([`Request::EnableDebugOutputs`]); several enables add up.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DebugOutputs {
    /// Register each module's debug image with the GDB JIT interface
    /// (`__jit_debug_register_code`), read by gdb and lldb.
    pub gdb: bool,
    /// Append each function to `/tmp/perf-<pid>.map`.
    pub perf_map: bool,
    /// Write a jitdump file (`jit-<pid>.dump`, for `perf inject --jit`) in this directory.
    pub jitdump_dir: Option<String>,
}

/// A source line of a function: the first address of its code, its line, its file (an
/// index into [`DebugModule::files`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LineRow {
    /// Target address.
    pub address: u64,
    /// Line number (1-based).
    pub line: u32,
    /// File, an index into [`DebugModule::files`].
    pub file: u32,
}

/// A function of a module, for profilers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DebugFunction {
    /// Its name (as the object spells it: mangled for C++).
    pub name: String,
    /// Target address.
    pub address: u64,
    /// Size in bytes.
    pub size: u64,
    /// Its source lines, by address (empty without `-g`).
    pub lines: Vec<LineRow>,
}

/// A linked module as debuggers and profilers are told of it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DebugModule {
    /// In-memory ELF images (one per object), each section's address its target address,
    /// for the GDB JIT interface (empty unless [`DebugOutputs::gdb`]).
    pub images: Vec<Vec<u8>>,
    /// Its functions, for the perf outputs below.
    pub functions: Vec<DebugFunction>,
    /// Write the functions to the perf map (if the executor's is enabled).
    pub perf_map: bool,
    /// Write the functions to the jitdump file (if the executor's is enabled).
    pub jitdump: bool,
    /// Source file names that [`LineRow::file`] indexes.
    pub files: Vec<String>,
}

/// A request from the controller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    /// Reserve address space (a memfd mapped twice in the executor); with `share`, the
    /// memfd is sent back for the controller to map.
    Reserve {
        /// Bytes.
        len: u64,
        /// Where.
        placement: WirePlacement,
        /// Whether to send the memfd (shared-memory transport).
        share: bool,
    },
    /// Give pages their final permission in the executor's view.
    Prepare {
        /// Reservation handle.
        handle: u64,
        /// First byte (page aligned, target address).
        start: u64,
        /// End (page aligned).
        end: u64,
        /// Permission (0 RX, 1 R, 2 RW).
        permission: u8,
    },
    /// Make segments runnable (instruction-cache coherence).
    Initialize {
        /// Reservation handle.
        handle: u64,
        /// The segments.
        segments: Vec<WireSegment>,
    },
    /// Return pages.
    Deinitialize {
        /// Reservation handle.
        handle: u64,
        /// First byte.
        start: u64,
        /// End.
        end: u64,
    },
    /// Release a reservation.
    Release {
        /// Reservation handle.
        handle: u64,
    },
    /// Write bytes into a reservation (copy transport).
    Write {
        /// Reservation handle.
        handle: u64,
        /// Target address.
        address: u64,
        /// The bytes.
        bytes: Vec<u8>,
    },
    /// Read bytes from a reservation.
    Read {
        /// Reservation handle.
        handle: u64,
        /// Target address.
        address: u64,
        /// Length.
        len: u64,
    },
    /// Look a symbol up: in the whole process (`library` 0) or a library opened before.
    Lookup {
        /// Library handle, 0 for the process.
        library: u64,
        /// Symbol name.
        name: String,
    },
    /// Look many symbols up at once (one round trip for a link's undefined names).
    LookupMany {
        /// Library handle, 0 for the process.
        library: u64,
        /// Symbol names.
        names: Vec<String>,
    },
    /// `dlopen` a shared library.
    LoadLibrary {
        /// Path or name.
        path: String,
    },
    /// Register `.eh_frame` data at an address inside a reservation.
    RegisterEhFrame {
        /// Address.
        address: u64,
    },
    /// Deregister it.
    DeregisterEhFrame {
        /// Address.
        address: u64,
    },
    /// Run initializers.
    RunInitializers {
        /// Function addresses.
        functions: Vec<u64>,
    },
    /// Run finalizers: `__cxa_finalize(dso_handle)` then the functions.
    RunFinalizers {
        /// The module's `__dso_handle`.
        dso_handle: u64,
        /// Function addresses.
        functions: Vec<u64>,
    },
    /// A fresh TLS module id.
    ReserveTlsModule,
    /// Install a TLS template.
    InstallTls {
        /// Module id.
        module_id: u64,
        /// Block size.
        size: u64,
        /// Block alignment.
        align: u64,
        /// Initialized part.
        image: Vec<u8>,
    },
    /// Forget a TLS template.
    RemoveTls {
        /// Module id.
        module_id: u64,
    },
    /// Call `main(argc, argv, envp)`.
    RunMain {
        /// Address of main.
        address: u64,
        /// argv (`argv[0]` first).
        args: Vec<String>,
    },
    /// Call `u64 f(u64, …)` with up to six integer arguments.
    Call {
        /// Address.
        address: u64,
        /// Arguments.
        args: Vec<u64>,
    },
    /// Flush stdio and exit.
    Shutdown,
    /// Place a reserved TLS module's block in static TLS (every thread, one offset from
    /// the thread pointer); answers the offset as a `u64` (two's complement).
    PlaceStaticTls {
        /// Module id.
        module_id: u64,
        /// Block size.
        size: u64,
        /// Block alignment.
        align: u64,
        /// Initialized part.
        image: Vec<u8>,
    },
    /// Make definitions visible to libraries loaded later (an `RTLD_GLOBAL` object of
    /// absolute symbols); answers a handle for [`Request::UnexportSymbols`].
    ExportSymbols {
        /// The definitions.
        symbols: Vec<WireExport>,
    },
    /// Withdraw definitions exported with [`Request::ExportSymbols`].
    UnexportSymbols {
        /// The handle.
        handle: u64,
    },
    /// Bytes for the program's standard input (an executor that forwards output reads
    /// its input from these); empty means end of input. Never answered; may be sent at any
    /// time, also while `RunMain` runs.
    Input {
        /// The bytes.
        bytes: Vec<u8>,
    },
    /// The program's standard input, output and error are the three descriptors sent with
    /// this message (`SCM_RIGHTS`, Unix sockets only): the controller's own, so that a
    /// pre-started executor's program reads and writes where a local one would.
    AdoptStdio,
    /// Turn on debugger and profiler outputs (answers `Ok`).
    EnableDebugOutputs(DebugOutputs),
    /// Tell debuggers and profilers of a module (answers a handle for
    /// [`Request::UnregisterDebug`]).
    RegisterDebug(DebugModule),
    /// A module registered with [`Request::RegisterDebug`] is about to be freed: its images
    /// leave the GDB JIT interface.
    UnregisterDebug {
        /// The handle.
        handle: u64,
    },
    /// Executor → controller (an id with [`EXECUTOR_REQUEST`] set): JIT code called the
    /// call-through stub `stub` (the id its code pushes) before it had a body. The
    /// controller compiles and links the body and answers [`Response::StubResolved`].
    ResolveStub {
        /// The stub's id.
        stub: u64,
    },
    /// The program's environment and working directory are the controller's: the
    /// executor replaces its environment with `variables` and enters `directory` (unless
    /// empty). Answers `Ok`, or an `Error` naming what it could not adopt.
    SetEnvironment {
        /// Each variable as `NAME=VALUE` (bytes: neither has to be UTF-8).
        variables: Vec<Vec<u8>>,
        /// The working directory (empty: unchanged).
        directory: Vec<u8>,
    },
    /// The code in `[address, address + len)` (whole pages, already read-execute) was
    /// built for branch-target enforcement (AArch64 BTI: every object's GNU property note
    /// says so): map it guarded (`PROT_BTI`), so an indirect branch to anything but a
    /// landing pad traps. Answers `Ok` (also where the architecture has no such guard).
    GuardBranchTargets {
        /// First byte (page-aligned).
        address: u64,
        /// Length (whole pages).
        len: u64,
    },
    /// Stores `target` in the call-through stub slot at `slot` with one atomic store
    /// (hot swap: calls that load the slot after the answer reach `target`). The slot
    /// must be 8-byte aligned on prepared pages of a reservation, `target` in reserved
    /// code. Answers `Ok`.
    StoreCodePointer {
        /// The slot's address.
        slot: u64,
        /// Where calls through it go from now on.
        target: u64,
    },
    /// Requests served in order as if sent one by one, answered with one
    /// [`Response::Batched`]: one round trip for steps that need no answer before the
    /// next (prepare, initialize, register `.eh_frame`, ...). The executor stops at the
    /// first that fails (its `Error` is the last answer). Only an executor whose hello
    /// has [`FEATURE_BATCH`] serves it; a batch holds no batch, and no request that runs
    /// JIT code, passes descriptors or ends the connection.
    Batch(Vec<Request>),
}

/// A response from the executor (or, to a [`Request::ResolveStub`], from the controller).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Response {
    /// Done.
    Ok,
    /// A value.
    Value(u64),
    /// A reservation.
    Reserved {
        /// Target address.
        target: u64,
        /// Handle for later requests.
        handle: u64,
    },
    /// Bytes read.
    Bytes(Vec<u8>),
    /// A symbol: address (0 if not found) and kind (0 unknown, 1 function, 2 data).
    Symbol {
        /// Address, 0 if not found.
        address: u64,
        /// 0 unknown, 1 function, 2 data.
        kind: u8,
    },
    /// Symbols, in the order asked: (address or 0, kind).
    Symbols(Vec<(u64, u8)>),
    /// The request failed.
    Error(String),
    /// The executor caught a fatal signal while running JIT code and is dying.
    Crashed {
        /// The signal number.
        signal: i32,
        /// The address whose access faulted (`si_addr`; 0 if the signal has none or the
        /// executor did not say).
        fault_address: u64,
        /// The instruction that faulted (0 if the executor did not say).
        pc: u64,
    },
    /// JIT code called `exit(status)`: the executor is ending with that status.
    Exited {
        /// The exit status.
        status: i32,
    },
    /// Output of the program (its standard output or error), forwarded by an executor
    /// that serves a remote controller; may arrive at any time, not as an answer.
    Output {
        /// 1 standard output, 2 standard error.
        stream: u8,
        /// The bytes.
        bytes: Vec<u8>,
    },
    /// The controller's answer to [`Request::ResolveStub`]: where the call continues (the
    /// body, or a fallback after a failed compile), and the stub's slot to store it in
    /// (0: store nothing, the next call asks again).
    StubResolved {
        /// Where the call goes.
        target: u64,
        /// The stub's pointer slot, or 0.
        slot: u64,
    },
    /// The answers to a [`Request::Batch`], in its order: as many as were served (the
    /// last is an `Error` when one failed and the rest were not served).
    Batched(Vec<Response>),
}

impl fmt::Display for Request {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = match self {
            Request::Reserve { .. } => "reserve",
            Request::Prepare { .. } => "prepare",
            Request::Initialize { .. } => "initialize",
            Request::Deinitialize { .. } => "deinitialize",
            Request::Release { .. } => "release",
            Request::Write { .. } => "write",
            Request::Read { .. } => "read",
            Request::Lookup { .. } => "lookup",
            Request::LookupMany { .. } => "lookup many",
            Request::LoadLibrary { .. } => "load library",
            Request::RegisterEhFrame { .. } => "register eh_frame",
            Request::DeregisterEhFrame { .. } => "deregister eh_frame",
            Request::RunInitializers { .. } => "run initializers",
            Request::RunFinalizers { .. } => "run finalizers",
            Request::ReserveTlsModule => "reserve TLS module",
            Request::InstallTls { .. } => "install TLS",
            Request::RemoveTls { .. } => "remove TLS",
            Request::RunMain { .. } => "run main",
            Request::Call { .. } => "call",
            Request::Shutdown => "shutdown",
            Request::PlaceStaticTls { .. } => "place static TLS",
            Request::ExportSymbols { .. } => "export symbols",
            Request::UnexportSymbols { .. } => "unexport symbols",
            Request::Input { .. } => "input",
            Request::AdoptStdio => "adopt stdio",
            Request::EnableDebugOutputs(_) => "enable debug outputs",
            Request::RegisterDebug(_) => "register debug information",
            Request::UnregisterDebug { .. } => "unregister debug information",
            Request::ResolveStub { .. } => "resolve a call-through stub",
            Request::SetEnvironment { .. } => "set environment",
            Request::GuardBranchTargets { .. } => "guard branch targets",
            Request::StoreCodePointer { .. } => "store code pointer",
            Request::Batch(_) => "batch",
        };
        f.write_str(name)
    }
}

/// Declares the protocol's messages once: the [`tag`] constants the codec writes and
/// matches, and [`MESSAGES`], the table the tests hold docs/PROTOCOL.md and executor-c to.
macro_rules! message_table {
    ($($name:ident = $tag:literal as $konst:ident),* $(,)?) => {
        /// Each message's tag, named as executor-c names it (`Hello` is `HELLO`).
        pub mod tag {
            $(
                #[doc = concat!("The tag of `", stringify!($name), "`.")]
                pub const $konst: u8 = $tag;
            )*
        }

        /// Every message of the protocol, tag and name, as docs/PROTOCOL.md and
        /// executor-c name them: the one list a tag is written against. A test holds the
        /// encoders, the document's tables and executor-c's enum to it, so a tag cannot
        /// drift in one place alone.
        pub const MESSAGES: &[(u8, &str)] = &[$(($tag, stringify!($name))),*];
    };
}

message_table! {
    Hello = 0 as HELLO,
    Reserve = 1 as RESERVE,
    Prepare = 2 as PREPARE,
    Initialize = 3 as INITIALIZE,
    Deinitialize = 4 as DEINITIALIZE,
    Release = 5 as RELEASE,
    Write = 6 as WRITE,
    Read = 7 as READ,
    Lookup = 8 as LOOKUP,
    LoadLibrary = 9 as LOAD_LIBRARY,
    RegisterEhFrame = 10 as REGISTER_EH_FRAME,
    DeregisterEhFrame = 11 as DEREGISTER_EH_FRAME,
    RunInitializers = 12 as RUN_INITIALIZERS,
    RunFinalizers = 13 as RUN_FINALIZERS,
    ReserveTlsModule = 14 as RESERVE_TLS_MODULE,
    InstallTls = 15 as INSTALL_TLS,
    RemoveTls = 16 as REMOVE_TLS,
    RunMain = 17 as RUN_MAIN,
    Call = 18 as CALL,
    Shutdown = 19 as SHUTDOWN,
    LookupMany = 20 as LOOKUP_MANY,
    PlaceStaticTls = 21 as PLACE_STATIC_TLS,
    ExportSymbols = 22 as EXPORT_SYMBOLS,
    UnexportSymbols = 23 as UNEXPORT_SYMBOLS,
    Input = 24 as INPUT,
    AdoptStdio = 25 as ADOPT_STDIO,
    EnableDebugOutputs = 26 as ENABLE_DEBUG_OUTPUTS,
    RegisterDebug = 27 as REGISTER_DEBUG,
    UnregisterDebug = 28 as UNREGISTER_DEBUG,
    ResolveStub = 29 as RESOLVE_STUB,
    SetEnvironment = 30 as SET_ENVIRONMENT,
    GuardBranchTargets = 31 as GUARD_BRANCH_TARGETS,
    Batch = 32 as BATCH,
    StoreCodePointer = 33 as STORE_CODE_POINTER,
    Ok = 100 as OK,
    Value = 101 as VALUE,
    Reserved = 102 as RESERVED,
    Bytes = 103 as BYTES,
    Symbol = 104 as SYMBOL,
    Error = 105 as ERROR,
    Crashed = 106 as CRASHED,
    Symbols = 107 as SYMBOLS,
    Exited = 108 as EXITED,
    Output = 109 as OUTPUT,
    StubResolved = 110 as STUB_RESOLVED,
    Batched = 111 as BATCHED,
}

// --- encoding ---------------------------------------------------------------------------

/// The id of a frame's body (see the module documentation).
pub fn message_id(body: &[u8]) -> Option<u32> {
    body.get(..4)
        .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
}

/// Sets the id of an encoded frame (length first).
pub fn with_id(mut frame: Vec<u8>, id: u32) -> Vec<u8> {
    if frame.len() >= 8 {
        frame[4..8].copy_from_slice(&id.to_le_bytes());
    }
    frame
}

/// Ids of requests the executor makes of the controller have this bit set.
pub const EXECUTOR_REQUEST: u32 = 1 << 31;

/// Builds one frame.
#[derive(Debug, Default)]
pub struct Writer {
    buf: Vec<u8>,
}

impl Writer {
    fn new(tag: u8) -> Self {
        let mut buf = Vec::with_capacity(64);
        buf.extend_from_slice(&[0, 0, 0, 0, 0, 0, 0, 0, tag]);
        Writer { buf }
    }
    fn u8(&mut self, v: u8) -> &mut Self {
        self.buf.push(v);
        self
    }
    fn u32(&mut self, v: u32) -> &mut Self {
        self.buf.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn u64(&mut self, v: u64) -> &mut Self {
        self.buf.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn bytes(&mut self, v: &[u8]) -> &mut Self {
        self.u32(v.len() as u32);
        self.buf.extend_from_slice(v);
        self
    }
    fn finish(mut self) -> Vec<u8> {
        let len = (self.buf.len() - 4) as u32;
        self.buf[..4].copy_from_slice(&len.to_le_bytes());
        self.buf
    }
}

/// Reads the fields of one frame (after its length).
#[derive(Debug)]
pub struct Reader<'a> {
    data: &'a [u8],
}

impl<'a> Reader<'a> {
    /// A reader over a frame's body (tag first).
    pub fn new(data: &'a [u8]) -> Self {
        Reader { data }
    }
    fn take(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], DecodeError> {
        if self.data.len() < n {
            return Err(DecodeError::Truncated(what));
        }
        let (head, rest) = self.data.split_at(n);
        self.data = rest;
        Ok(head)
    }
    fn u8(&mut self, what: &'static str) -> Result<u8, DecodeError> {
        Ok(self.take(1, what)?[0])
    }
    fn u32(&mut self, what: &'static str) -> Result<u32, DecodeError> {
        let b = self.take(4, what)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
    fn u64(&mut self, what: &'static str) -> Result<u64, DecodeError> {
        let b = self.take(8, what)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_le_bytes(a))
    }
    fn bytes(&mut self, what: &'static str) -> Result<Vec<u8>, DecodeError> {
        let n = self.u32(what)? as usize;
        Ok(self.take(n, what)?.to_vec())
    }
    fn string(&mut self, what: &'static str) -> Result<String, DecodeError> {
        let n = self.u32(what)? as usize;
        if n > MAX_STRING {
            return Err(DecodeError::Invalid {
                what,
                value: n as u64,
            });
        }
        let b = self.take(n, what)?;
        String::from_utf8(b.to_vec()).map_err(|_| DecodeError::Invalid {
            what,
            value: n as u64,
        })
    }
    fn count(&mut self, what: &'static str, item_size: usize) -> Result<usize, DecodeError> {
        let n = self.u32(what)? as usize;
        if n > MAX_ITEMS || n.saturating_mul(item_size) > self.data.len() {
            return Err(DecodeError::Invalid {
                what,
                value: n as u64,
            });
        }
        Ok(n)
    }
    fn permission(&mut self) -> Result<u8, DecodeError> {
        let p = self.u8("permission")?;
        if p > 2 {
            return Err(DecodeError::Invalid {
                what: "permission",
                value: u64::from(p),
            });
        }
        Ok(p)
    }
    fn remaining(&self) -> usize {
        self.data.len()
    }

    fn end(&self) -> Result<(), DecodeError> {
        if self.data.is_empty() {
            Ok(())
        } else {
            Err(DecodeError::Trailing(self.data.len()))
        }
    }
}

impl Hello {
    /// Encodes as a frame.
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::new(tag::HELLO);
        w.buf.extend_from_slice(&MAGIC);
        w.u32(self.version)
            .u64(self.page_size)
            .bytes(self.triple.as_bytes())
            .u32(self.pid)
            .u32(self.max_frame)
            .u32(self.runtime_symbols.len() as u32);
        for (name, address) in &self.runtime_symbols {
            w.bytes(name.as_bytes()).u64(*address);
        }
        w.u32(self.features);
        w.finish()
    }

    /// Decodes a frame body.
    pub fn decode(body: &[u8]) -> Result<Self, DecodeError> {
        let mut r = Reader::new(body);
        r.u32("message id")?;
        let tag = r.u8("tag")?;
        if tag != tag::HELLO {
            return Err(DecodeError::UnknownTag(tag));
        }
        if r.take(4, "magic")? != MAGIC {
            return Err(DecodeError::Invalid {
                what: "magic",
                value: 0,
            });
        }
        let version = r.u32("version")?;
        let page_size = r.u64("page size")?;
        let triple = r.string("triple")?;
        let pid = r.u32("pid")?;
        let max_frame = r.u32("max frame")?;
        let n = r.count("runtime symbols", 12)?;
        let mut runtime_symbols = Vec::with_capacity(n);
        for _ in 0..n {
            runtime_symbols.push((r.string("runtime symbol")?, r.u64("runtime symbol")?));
        }
        // Optional: an executor that predates it (or executor-c) ends here.
        let features = if r.data.is_empty() {
            0
        } else {
            r.u32("features")?
        };
        let hello = Hello {
            version,
            page_size,
            triple,
            pid,
            max_frame,
            runtime_symbols,
            features,
        };
        r.end()?;
        Ok(hello)
    }
}

fn placement_fields(w: &mut Writer, p: WirePlacement) {
    match p {
        WirePlacement::Anywhere => w.u8(0).u64(0).u64(0),
        WirePlacement::HostLibraries => w.u8(1).u64(0).u64(0),
        WirePlacement::Near(a, b) => w.u8(2).u64(a).u64(b),
        WirePlacement::Low2GiB => w.u8(3).u64(0).u64(0),
    };
}

impl Request {
    /// Whether an executor serves this request inside a [`Request::Batch`]: not one that
    /// runs JIT code, passes descriptors, reads input, resolves a stub, ends the
    /// connection or is a batch itself.
    pub fn batchable(&self) -> bool {
        !matches!(
            self,
            Request::Reserve { .. }
                | Request::RunMain { .. }
                | Request::Call { .. }
                | Request::RunInitializers { .. }
                | Request::RunFinalizers { .. }
                | Request::Shutdown
                | Request::Input { .. }
                | Request::AdoptStdio
                | Request::ResolveStub { .. }
                | Request::Batch(_)
        )
    }

    /// Encodes as a frame.
    pub fn encode(&self) -> Vec<u8> {
        let w = match self {
            Request::Reserve {
                len,
                placement,
                share,
            } => {
                let mut w = Writer::new(tag::RESERVE);
                w.u64(*len);
                placement_fields(&mut w, *placement);
                w.u8(u8::from(*share));
                w
            }
            Request::Prepare {
                handle,
                start,
                end,
                permission,
            } => {
                let mut w = Writer::new(tag::PREPARE);
                w.u64(*handle).u64(*start).u64(*end).u8(*permission);
                w
            }
            Request::Initialize { handle, segments } => {
                let mut w = Writer::new(tag::INITIALIZE);
                w.u64(*handle).u32(segments.len() as u32);
                for &(t, l, p) in segments {
                    w.u64(t).u64(l).u8(p);
                }
                w
            }
            Request::Deinitialize { handle, start, end } => {
                let mut w = Writer::new(tag::DEINITIALIZE);
                w.u64(*handle).u64(*start).u64(*end);
                w
            }
            Request::Release { handle } => {
                let mut w = Writer::new(tag::RELEASE);
                w.u64(*handle);
                w
            }
            Request::Write {
                handle,
                address,
                bytes,
            } => {
                let mut w = Writer::new(tag::WRITE);
                w.u64(*handle).u64(*address).bytes(bytes);
                w
            }
            Request::Read {
                handle,
                address,
                len,
            } => {
                let mut w = Writer::new(tag::READ);
                w.u64(*handle).u64(*address).u64(*len);
                w
            }
            Request::Lookup { library, name } => {
                let mut w = Writer::new(tag::LOOKUP);
                w.u64(*library).bytes(name.as_bytes());
                w
            }
            Request::LoadLibrary { path } => {
                let mut w = Writer::new(tag::LOAD_LIBRARY);
                w.bytes(path.as_bytes());
                w
            }
            Request::RegisterEhFrame { address } => {
                let mut w = Writer::new(tag::REGISTER_EH_FRAME);
                w.u64(*address);
                w
            }
            Request::DeregisterEhFrame { address } => {
                let mut w = Writer::new(tag::DEREGISTER_EH_FRAME);
                w.u64(*address);
                w
            }
            Request::RunInitializers { functions } => {
                let mut w = Writer::new(tag::RUN_INITIALIZERS);
                w.u32(functions.len() as u32);
                for &f in functions {
                    w.u64(f);
                }
                w
            }
            Request::RunFinalizers {
                dso_handle,
                functions,
            } => {
                let mut w = Writer::new(tag::RUN_FINALIZERS);
                w.u64(*dso_handle).u32(functions.len() as u32);
                for &f in functions {
                    w.u64(f);
                }
                w
            }
            Request::ReserveTlsModule => Writer::new(tag::RESERVE_TLS_MODULE),
            Request::InstallTls {
                module_id,
                size,
                align,
                image,
            } => {
                let mut w = Writer::new(tag::INSTALL_TLS);
                w.u64(*module_id).u64(*size).u64(*align).bytes(image);
                w
            }
            Request::RemoveTls { module_id } => {
                let mut w = Writer::new(tag::REMOVE_TLS);
                w.u64(*module_id);
                w
            }
            Request::RunMain { address, args } => {
                let mut w = Writer::new(tag::RUN_MAIN);
                w.u64(*address).u32(args.len() as u32);
                for a in args {
                    w.bytes(a.as_bytes());
                }
                w
            }
            Request::Call { address, args } => {
                let mut w = Writer::new(tag::CALL);
                w.u64(*address).u32(args.len() as u32);
                for &a in args {
                    w.u64(a);
                }
                w
            }
            Request::Shutdown => Writer::new(tag::SHUTDOWN),
            Request::LookupMany { library, names } => {
                let mut w = Writer::new(tag::LOOKUP_MANY);
                w.u64(*library).u32(names.len() as u32);
                for n in names {
                    w.bytes(n.as_bytes());
                }
                w
            }
            Request::PlaceStaticTls {
                module_id,
                size,
                align,
                image,
            } => {
                let mut w = Writer::new(tag::PLACE_STATIC_TLS);
                w.u64(*module_id).u64(*size).u64(*align).bytes(image);
                w
            }
            Request::ExportSymbols { symbols } => {
                let mut w = Writer::new(tag::EXPORT_SYMBOLS);
                w.u32(symbols.len() as u32);
                for (name, address, size, function) in symbols {
                    w.bytes(name.as_bytes())
                        .u64(*address)
                        .u64(*size)
                        .u8(u8::from(*function));
                }
                w
            }
            Request::UnexportSymbols { handle } => {
                let mut w = Writer::new(tag::UNEXPORT_SYMBOLS);
                w.u64(*handle);
                w
            }
            Request::Input { bytes } => {
                let mut w = Writer::new(tag::INPUT);
                w.bytes(bytes);
                w
            }
            Request::AdoptStdio => Writer::new(tag::ADOPT_STDIO),
            Request::EnableDebugOutputs(outputs) => {
                let mut w = Writer::new(tag::ENABLE_DEBUG_OUTPUTS);
                w.u8(u8::from(outputs.gdb))
                    .u8(u8::from(outputs.perf_map))
                    .u8(u8::from(outputs.jitdump_dir.is_some()))
                    .bytes(outputs.jitdump_dir.as_deref().unwrap_or("").as_bytes());
                w
            }
            Request::RegisterDebug(module) => {
                let mut w = Writer::new(tag::REGISTER_DEBUG);
                w.u8(u8::from(module.perf_map) | u8::from(module.jitdump) << 1);
                w.u32(module.images.len() as u32);
                for image in &module.images {
                    w.bytes(image);
                }
                w.u32(module.files.len() as u32);
                for file in &module.files {
                    w.bytes(file.as_bytes());
                }
                w.u32(module.functions.len() as u32);
                for f in &module.functions {
                    w.bytes(f.name.as_bytes())
                        .u64(f.address)
                        .u64(f.size)
                        .u32(f.lines.len() as u32);
                    for row in &f.lines {
                        w.u64(row.address).u32(row.line).u32(row.file);
                    }
                }
                w
            }
            Request::UnregisterDebug { handle } => {
                let mut w = Writer::new(tag::UNREGISTER_DEBUG);
                w.u64(*handle);
                w
            }
            Request::ResolveStub { stub } => {
                let mut w = Writer::new(tag::RESOLVE_STUB);
                w.u64(*stub);
                w
            }
            Request::SetEnvironment {
                variables,
                directory,
            } => {
                let mut w = Writer::new(tag::SET_ENVIRONMENT);
                w.u32(variables.len() as u32);
                for v in variables {
                    w.bytes(v);
                }
                w.bytes(directory);
                w
            }
            Request::GuardBranchTargets { address, len } => {
                let mut w = Writer::new(tag::GUARD_BRANCH_TARGETS);
                w.u64(*address).u64(*len);
                w
            }
            Request::StoreCodePointer { slot, target } => {
                let mut w = Writer::new(tag::STORE_CODE_POINTER);
                w.u64(*slot).u64(*target);
                w
            }
            Request::Batch(requests) => {
                let mut w = Writer::new(tag::BATCH);
                w.u32(requests.len() as u32);
                for request in requests {
                    // Each as its frame's body (id 0, tag, fields).
                    w.bytes(&request.encode()[4..]);
                }
                w
            }
        };
        w.finish()
    }

    /// Decodes a frame body (tag first).
    pub fn decode(body: &[u8]) -> Result<Self, DecodeError> {
        let mut r = Reader::new(body);
        r.u32("message id")?;
        let tag = r.u8("tag")?;
        let req = match tag {
            tag::RESERVE => {
                let len = r.u64("len")?;
                let kind = r.u8("placement")?;
                let (a, b) = (r.u64("placement")?, r.u64("placement")?);
                let placement = match kind {
                    tag::HELLO => WirePlacement::Anywhere,
                    tag::RESERVE => WirePlacement::HostLibraries,
                    tag::PREPARE => WirePlacement::Near(a, b),
                    tag::INITIALIZE => WirePlacement::Low2GiB,
                    other => {
                        return Err(DecodeError::Invalid {
                            what: "placement",
                            value: u64::from(other),
                        })
                    }
                };
                let share = r.u8("share")? != 0;
                Request::Reserve {
                    len,
                    placement,
                    share,
                }
            }
            tag::PREPARE => Request::Prepare {
                handle: r.u64("handle")?,
                start: r.u64("start")?,
                end: r.u64("end")?,
                permission: r.permission()?,
            },
            tag::INITIALIZE => {
                let handle = r.u64("handle")?;
                let n = r.count("segments", 17)?;
                let mut segments = Vec::with_capacity(n);
                for _ in 0..n {
                    segments.push((r.u64("target")?, r.u64("len")?, r.permission()?));
                }
                Request::Initialize { handle, segments }
            }
            tag::DEINITIALIZE => Request::Deinitialize {
                handle: r.u64("handle")?,
                start: r.u64("start")?,
                end: r.u64("end")?,
            },
            tag::RELEASE => Request::Release {
                handle: r.u64("handle")?,
            },
            tag::WRITE => Request::Write {
                handle: r.u64("handle")?,
                address: r.u64("address")?,
                bytes: r.bytes("bytes")?,
            },
            tag::READ => Request::Read {
                handle: r.u64("handle")?,
                address: r.u64("address")?,
                len: r.u64("len")?,
            },
            tag::LOOKUP => Request::Lookup {
                library: r.u64("library")?,
                name: r.string("name")?,
            },
            tag::LOAD_LIBRARY => Request::LoadLibrary {
                path: r.string("path")?,
            },
            tag::REGISTER_EH_FRAME => Request::RegisterEhFrame {
                address: r.u64("address")?,
            },
            tag::DEREGISTER_EH_FRAME => Request::DeregisterEhFrame {
                address: r.u64("address")?,
            },
            tag::RUN_INITIALIZERS => {
                let n = r.count("functions", 8)?;
                let mut functions = Vec::with_capacity(n);
                for _ in 0..n {
                    functions.push(r.u64("function")?);
                }
                Request::RunInitializers { functions }
            }
            tag::RUN_FINALIZERS => {
                let dso_handle = r.u64("dso handle")?;
                let n = r.count("functions", 8)?;
                let mut functions = Vec::with_capacity(n);
                for _ in 0..n {
                    functions.push(r.u64("function")?);
                }
                Request::RunFinalizers {
                    dso_handle,
                    functions,
                }
            }
            tag::RESERVE_TLS_MODULE => Request::ReserveTlsModule,
            tag::INSTALL_TLS => Request::InstallTls {
                module_id: r.u64("module id")?,
                size: r.u64("size")?,
                align: r.u64("align")?,
                image: r.bytes("image")?,
            },
            tag::REMOVE_TLS => Request::RemoveTls {
                module_id: r.u64("module id")?,
            },
            tag::RUN_MAIN => {
                let address = r.u64("address")?;
                let n = r.count("args", 4)?;
                let mut args = Vec::with_capacity(n);
                for _ in 0..n {
                    args.push(r.string("arg")?);
                }
                Request::RunMain { address, args }
            }
            tag::CALL => {
                let address = r.u64("address")?;
                let n = r.count("args", 8)?;
                if n > 6 {
                    return Err(DecodeError::Invalid {
                        what: "argument count",
                        value: n as u64,
                    });
                }
                let mut args = Vec::with_capacity(n);
                for _ in 0..n {
                    args.push(r.u64("arg")?);
                }
                Request::Call { address, args }
            }
            tag::SHUTDOWN => Request::Shutdown,
            tag::LOOKUP_MANY => {
                let library = r.u64("library")?;
                let n = r.count("names", 4)?;
                let mut names = Vec::with_capacity(n);
                for _ in 0..n {
                    names.push(r.string("name")?);
                }
                Request::LookupMany { library, names }
            }
            tag::PLACE_STATIC_TLS => Request::PlaceStaticTls {
                module_id: r.u64("module id")?,
                size: r.u64("size")?,
                align: r.u64("align")?,
                image: r.bytes("image")?,
            },
            tag::EXPORT_SYMBOLS => {
                let n = r.count("exports", 21)?;
                let mut symbols = Vec::with_capacity(n);
                for _ in 0..n {
                    symbols.push((
                        r.string("export name")?,
                        r.u64("export address")?,
                        r.u64("export size")?,
                        r.u8("export kind")? != 0,
                    ));
                }
                Request::ExportSymbols { symbols }
            }
            tag::UNEXPORT_SYMBOLS => Request::UnexportSymbols {
                handle: r.u64("handle")?,
            },
            tag::INPUT => Request::Input {
                bytes: r.bytes("input")?,
            },
            tag::ADOPT_STDIO => Request::AdoptStdio,
            tag::ENABLE_DEBUG_OUTPUTS => {
                let gdb = r.u8("gdb flag")? != 0;
                let perf_map = r.u8("perf map flag")? != 0;
                let jitdump = r.u8("jitdump flag")? != 0;
                let dir = r.string("jitdump directory")?;
                Request::EnableDebugOutputs(DebugOutputs {
                    gdb,
                    perf_map,
                    jitdump_dir: jitdump.then_some(dir),
                })
            }
            tag::REGISTER_DEBUG => {
                let outputs = r.u8("perf outputs")?;
                let n = r.count("debug images", 4)?;
                let mut images = Vec::with_capacity(n);
                for _ in 0..n {
                    images.push(r.bytes("debug image")?);
                }
                let n = r.count("source files", 4)?;
                let mut files = Vec::with_capacity(n);
                for _ in 0..n {
                    files.push(r.string("source file")?);
                }
                let n = r.count("debug functions", 24)?;
                let mut functions = Vec::with_capacity(n);
                for _ in 0..n {
                    let name = r.string("function name")?;
                    let address = r.u64("function address")?;
                    let size = r.u64("function size")?;
                    let rows = r.count("line rows", 16)?;
                    let mut lines = Vec::with_capacity(rows);
                    for _ in 0..rows {
                        let row = LineRow {
                            address: r.u64("line address")?,
                            line: r.u32("line number")?,
                            file: r.u32("line file")?,
                        };
                        if row.file as usize >= files.len() {
                            return Err(DecodeError::Invalid {
                                what: "line file",
                                value: u64::from(row.file),
                            });
                        }
                        lines.push(row);
                    }
                    functions.push(DebugFunction {
                        name,
                        address,
                        size,
                        lines,
                    });
                }
                Request::RegisterDebug(DebugModule {
                    images,
                    functions,
                    files,
                    perf_map: outputs & 1 != 0,
                    jitdump: outputs & 2 != 0,
                })
            }
            tag::UNREGISTER_DEBUG => Request::UnregisterDebug {
                handle: r.u64("handle")?,
            },
            tag::RESOLVE_STUB => Request::ResolveStub {
                stub: r.u64("stub")?,
            },
            tag::SET_ENVIRONMENT => {
                let n = r.count("variables", 4)?;
                let mut variables = Vec::with_capacity(n);
                for _ in 0..n {
                    variables.push(r.bytes("variable")?);
                }
                Request::SetEnvironment {
                    variables,
                    directory: r.bytes("directory")?,
                }
            }
            tag::GUARD_BRANCH_TARGETS => Request::GuardBranchTargets {
                address: r.u64("address")?,
                len: r.u64("length")?,
            },
            tag::STORE_CODE_POINTER => Request::StoreCodePointer {
                slot: r.u64("slot")?,
                target: r.u64("target")?,
            },
            tag::BATCH => {
                let n = r.count("batched requests", 9)?;
                let mut requests = Vec::with_capacity(n);
                for _ in 0..n {
                    let body = r.bytes("batched request")?;
                    if body.get(4) == Some(&tag::BATCH) {
                        return Err(DecodeError::Invalid {
                            what: "batch inside a batch",
                            value: u64::from(tag::BATCH),
                        });
                    }
                    requests.push(Request::decode(&body)?);
                }
                Request::Batch(requests)
            }
            other => return Err(DecodeError::UnknownTag(other)),
        };
        r.end()?;
        Ok(req)
    }
}

impl Response {
    /// Encodes as a frame.
    pub fn encode(&self) -> Vec<u8> {
        let w = match self {
            Response::Ok => Writer::new(tag::OK),
            Response::Value(v) => {
                let mut w = Writer::new(tag::VALUE);
                w.u64(*v);
                w
            }
            Response::Reserved { target, handle } => {
                let mut w = Writer::new(tag::RESERVED);
                w.u64(*target).u64(*handle);
                w
            }
            Response::Bytes(b) => {
                let mut w = Writer::new(tag::BYTES);
                w.bytes(b);
                w
            }
            Response::Symbol { address, kind } => {
                let mut w = Writer::new(tag::SYMBOL);
                w.u64(*address).u8(*kind);
                w
            }
            Response::Error(m) => {
                let mut w = Writer::new(tag::ERROR);
                w.bytes(m.as_bytes());
                w
            }
            Response::Crashed {
                signal,
                fault_address,
                pc,
            } => {
                let mut w = Writer::new(tag::CRASHED);
                w.u32(*signal as u32).u64(*fault_address).u64(*pc);
                w
            }
            Response::Exited { status } => {
                let mut w = Writer::new(tag::EXITED);
                w.u32(*status as u32);
                w
            }
            Response::Output { stream, bytes } => {
                let mut w = Writer::new(tag::OUTPUT);
                w.u8(*stream).bytes(bytes);
                w
            }
            Response::StubResolved { target, slot } => {
                let mut w = Writer::new(tag::STUB_RESOLVED);
                w.u64(*target).u64(*slot);
                w
            }
            Response::Symbols(list) => {
                let mut w = Writer::new(tag::SYMBOLS);
                w.u32(list.len() as u32);
                for &(a, k) in list {
                    w.u64(a).u8(k);
                }
                w
            }
            Response::Batched(answers) => {
                let mut w = Writer::new(tag::BATCHED);
                w.u32(answers.len() as u32);
                for answer in answers {
                    w.bytes(&answer.encode()[4..]);
                }
                w
            }
        };
        w.finish()
    }

    /// Decodes a frame body.
    pub fn decode(body: &[u8]) -> Result<Self, DecodeError> {
        let mut r = Reader::new(body);
        r.u32("message id")?;
        let resp = match r.u8("tag")? {
            tag::OK => Response::Ok,
            tag::VALUE => Response::Value(r.u64("value")?),
            tag::RESERVED => Response::Reserved {
                target: r.u64("target")?,
                handle: r.u64("handle")?,
            },
            tag::BYTES => Response::Bytes(r.bytes("bytes")?),
            tag::SYMBOL => Response::Symbol {
                address: r.u64("address")?,
                kind: r.u8("kind")?,
            },
            tag::ERROR => {
                Response::Error(String::from_utf8_lossy(&r.bytes("message")?).into_owned())
            }
            tag::CRASHED => {
                let signal = r.u32("signal")? as i32;
                // Both or neither: an executor may send the signal alone.
                let (fault_address, pc) = if r.remaining() > 0 {
                    (r.u64("fault address")?, r.u64("instruction address")?)
                } else {
                    (0, 0)
                };
                Response::Crashed {
                    signal,
                    fault_address,
                    pc,
                }
            }
            tag::EXITED => Response::Exited {
                status: r.u32("status")? as i32,
            },
            tag::OUTPUT => Response::Output {
                stream: r.u8("stream")?,
                bytes: r.bytes("output")?,
            },
            tag::SYMBOLS => {
                let n = r.count("symbols", 9)?;
                let mut list = Vec::with_capacity(n);
                for _ in 0..n {
                    list.push((r.u64("address")?, r.u8("kind")?));
                }
                Response::Symbols(list)
            }
            tag::STUB_RESOLVED => Response::StubResolved {
                target: r.u64("target")?,
                slot: r.u64("slot")?,
            },
            tag::BATCHED => {
                let n = r.count("batched answers", 9)?;
                let mut answers = Vec::with_capacity(n);
                for _ in 0..n {
                    let body = r.bytes("batched answer")?;
                    if body.get(4) == Some(&tag::BATCHED) {
                        return Err(DecodeError::Invalid {
                            what: "batched answers inside batched answers",
                            value: u64::from(tag::BATCHED),
                        });
                    }
                    answers.push(Response::decode(&body)?);
                }
                Response::Batched(answers)
            }
            other => return Err(DecodeError::UnknownTag(other)),
        };
        r.end()?;
        Ok(resp)
    }
}

/// A symbol's kind on the wire: 0 unknown, 1 function, 2 data.
pub fn kind_to_wire(is_function: Option<bool>) -> u8 {
    match is_function {
        None => 0,
        Some(true) => 1,
        Some(false) => 2,
    }
}

/// The inverse of [`kind_to_wire`].
pub fn kind_from_wire(kind: u8) -> Option<bool> {
    match kind {
        1 => Some(true),
        2 => Some(false),
        _ => None,
    }
}

/// The name of a signal, for messages.
pub fn signal_name(signal: i32) -> &'static str {
    match signal {
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGBUS => "SIGBUS",
        libc::SIGILL => "SIGILL",
        libc::SIGFPE => "SIGFPE",
        libc::SIGABRT => "SIGABRT",
        libc::SIGTRAP => "SIGTRAP",
        libc::SIGKILL => "SIGKILL",
        libc::SIGTERM => "SIGTERM",
        _ => "signal",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(frame: &[u8]) -> &[u8] {
        let len = u32::from_le_bytes(frame[..4].try_into().unwrap()) as usize;
        assert_eq!(len, frame.len() - 4);
        &frame[4..]
    }

    /// One request of every kind.
    fn sample_requests() -> Vec<Request> {
        vec![
            Request::Reserve {
                len: 1 << 28,
                placement: WirePlacement::Near(1, 2),
                share: true,
            },
            Request::Prepare {
                handle: 3,
                start: 0x1000,
                end: 0x3000,
                permission: 0,
            },
            Request::Initialize {
                handle: 3,
                segments: vec![(0x1000, 10, 0), (0x2000, 5, 2)],
            },
            Request::Deinitialize {
                handle: 3,
                start: 0x1000,
                end: 0x2000,
            },
            Request::Release { handle: 3 },
            Request::Write {
                handle: 3,
                address: 0x1000,
                bytes: vec![1, 2, 3],
            },
            Request::Read {
                handle: 3,
                address: 0x1000,
                len: 3,
            },
            Request::Lookup {
                library: 0,
                name: "printf".into(),
            },
            Request::LoadLibrary {
                path: "libm.so.6".into(),
            },
            Request::RegisterEhFrame { address: 9 },
            Request::DeregisterEhFrame { address: 9 },
            Request::RunInitializers {
                functions: vec![1, 2],
            },
            Request::RunFinalizers {
                dso_handle: 7,
                functions: vec![3],
            },
            Request::ReserveTlsModule,
            Request::InstallTls {
                module_id: 5,
                size: 64,
                align: 16,
                image: vec![9; 8],
            },
            Request::RemoveTls { module_id: 5 },
            Request::RunMain {
                address: 0x1000,
                args: vec!["prog".into(), "x".into()],
            },
            Request::Call {
                address: 0x1000,
                args: vec![1, 2, 3],
            },
            Request::Shutdown,
            Request::ResolveStub { stub: 7 },
            Request::SetEnvironment {
                variables: vec![b"A=1".to_vec(), b"B=\xff".to_vec()],
                directory: b"/tmp".to_vec(),
            },
            Request::GuardBranchTargets {
                address: 0x7f00_0000_0000,
                len: 0x2000,
            },
            Request::LookupMany {
                library: 2,
                names: vec!["a".into(), "bc".into()],
            },
            Request::PlaceStaticTls {
                module_id: 7,
                size: 64,
                align: 16,
                image: vec![1, 2, 3],
            },
            Request::ExportSymbols {
                symbols: vec![
                    ("f".into(), 0x1000, 16, true),
                    ("d".into(), 0x2000, 8, false),
                ],
            },
            Request::UnexportSymbols { handle: 3 },
            Request::Input {
                bytes: b"typed".to_vec(),
            },
            Request::AdoptStdio,
            Request::EnableDebugOutputs(DebugOutputs {
                gdb: true,
                perf_map: false,
                jitdump_dir: Some("/tmp/j".into()),
            }),
            Request::RegisterDebug(DebugModule {
                images: vec![vec![0x7f, b'E'], vec![]],
                functions: vec![DebugFunction {
                    name: "f".into(),
                    address: 0x1000,
                    size: 16,
                    lines: vec![LineRow {
                        address: 0x1004,
                        line: 7,
                        file: 0,
                    }],
                }],
                files: vec!["f.c".into()],
                perf_map: false,
                jitdump: true,
            }),
            Request::UnregisterDebug { handle: 4 },
            Request::StoreCodePointer {
                slot: 0x7000,
                target: 0x8000,
            },
            Request::Batch(vec![
                Request::Prepare {
                    handle: 1,
                    start: 0x1000,
                    end: 0x3000,
                    permission: 1,
                },
                Request::RegisterEhFrame { address: 0x2000 },
            ]),
        ]
    }

    #[test]
    fn requests_round_trip() {
        let all = sample_requests();
        for req in all {
            let frame = req.encode();
            assert_eq!(Request::decode(body(&frame)).unwrap(), req);
        }
    }

    #[test]
    fn a_batch_inside_a_batch_is_refused_and_a_hello_without_features_has_none() {
        let inner = Request::Batch(vec![Request::ReserveTlsModule]);
        let frame = Request::Batch(vec![inner]).encode();
        assert!(matches!(
            Request::decode(body(&frame)),
            Err(DecodeError::Invalid {
                what: "batch inside a batch",
                ..
            })
        ));
        let hello = Hello {
            version: VERSION,
            page_size: 4096,
            triple: "x86_64-unknown-linux-gnu".into(),
            pid: 1,
            max_frame: 1 << 20,
            runtime_symbols: vec![],
            features: FEATURE_BATCH,
        };
        let frame = hello.encode();
        assert_eq!(Hello::decode(body(&frame)).unwrap(), hello);
        // executor-c's hello ends after the runtime symbols.
        let mut old = frame[..frame.len() - 4].to_vec();
        let len = (old.len() - 4) as u32;
        old[..4].copy_from_slice(&len.to_le_bytes());
        assert_eq!(Hello::decode(body(&old)).unwrap().features, 0);
    }

    #[test]
    fn message_ids_travel_in_every_frame() {
        let frame = with_id(Request::ReserveTlsModule.encode(), 77);
        assert_eq!(message_id(body(&frame)), Some(77));
        assert_eq!(
            Request::decode(body(&frame)).unwrap(),
            Request::ReserveTlsModule
        );
        let frame = with_id(Response::Value(5).encode(), EXECUTOR_REQUEST | 3);
        assert_eq!(message_id(body(&frame)), Some(EXECUTOR_REQUEST | 3));
        assert_eq!(Response::decode(body(&frame)).unwrap(), Response::Value(5));
        // A body too short for its id is an error, not a panic.
        assert!(Request::decode(&[1, 2]).is_err());
    }

    /// One response of every kind.
    fn sample_responses() -> Vec<Response> {
        vec![
            Response::Batched(vec![Response::Ok, Response::Error("no".into())]),
            Response::Ok,
            Response::Value(42),
            Response::StubResolved {
                target: 0x7000,
                slot: 0x8000,
            },
            Response::Reserved {
                target: 0x7f00_0000_0000,
                handle: 4,
            },
            Response::Bytes(vec![1, 2]),
            Response::Symbol {
                address: 0x1234,
                kind: 1,
            },
            Response::Error("no".into()),
            Response::Crashed {
                signal: 11,
                fault_address: 0x10,
                pc: 0x7f00_0000_1234,
            },
            Response::Exited { status: 3 },
            Response::Output {
                stream: 2,
                bytes: b"hello".to_vec(),
            },
            Response::Symbols(vec![(1, 1), (0, 0)]),
        ]
    }

    #[test]
    fn responses_and_hello_round_trip() {
        for resp in sample_responses() {
            assert_eq!(Response::decode(body(&resp.encode())).unwrap(), resp);
        }
        let hello = Hello {
            version: VERSION,
            page_size: 4096,
            triple: "x86_64-unknown-linux-gnu".into(),
            pid: 7,
            max_frame: MAX_FRAME,
            runtime_symbols: vec![("__tls_get_addr".into(), 0x1000)],
            features: 0,
        };
        assert_eq!(Hello::decode(body(&hello.encode())).unwrap(), hello);
    }

    #[test]
    fn malformed_frames_are_errors() {
        assert!(matches!(
            Request::decode(&[]),
            Err(DecodeError::Truncated(_))
        ));
        assert!(matches!(
            Request::decode(&[0, 0, 0, 0, 200]),
            Err(DecodeError::UnknownTag(200))
        ));
        assert!(matches!(
            Request::decode(&[0, 0, 0, 0, 5, 1, 2]),
            Err(DecodeError::Truncated(_))
        ));
        // A count larger than the bytes that follow.
        let mut bad = vec![0, 0, 0, 0, 12];
        bad.extend_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(
            Request::decode(&bad),
            Err(DecodeError::Invalid { .. })
        ));
        // Trailing bytes.
        let mut frame = Request::Shutdown.encode();
        frame.push(0);
        assert!(matches!(
            Request::decode(&frame[4..]),
            Err(DecodeError::Trailing(1))
        ));
        // A bad permission.
        let mut p = Request::Prepare {
            handle: 1,
            start: 0,
            end: 0,
            permission: 0,
        }
        .encode();
        *p.last_mut().unwrap() = 9;
        assert!(matches!(
            Request::decode(&p[4..]),
            Err(DecodeError::Invalid {
                what: "permission",
                ..
            })
        ));
    }

    /// A message's name: its variant's, as `Debug` prints it.
    fn variant(debug: String) -> String {
        debug
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric())
            .collect()
    }

    /// UpperCamel to UPPER_SNAKE (`RegisterEhFrame` → `REGISTER_EH_FRAME`).
    fn upper_snake(name: &str) -> String {
        let mut out = String::new();
        for (i, c) in name.chars().enumerate() {
            if c.is_ascii_uppercase() && i > 0 {
                out.push('_');
            }
            out.push(c.to_ascii_uppercase());
        }
        out
    }

    fn table_name(tag: u8) -> Option<&'static str> {
        MESSAGES.iter().find(|(t, _)| *t == tag).map(|(_, n)| *n)
    }

    #[test]
    fn every_encoder_writes_the_tag_of_the_message_table() {
        let mut seen: Vec<u8> = vec![0];
        let hello = Hello {
            version: VERSION,
            page_size: 4096,
            triple: String::new(),
            pid: 1,
            max_frame: MAX_FRAME,
            runtime_symbols: Vec::new(),
            features: FEATURE_BATCH,
        };
        assert_eq!(body(&hello.encode())[4], 0, "Hello is tag 0");
        let frames = sample_requests()
            .into_iter()
            .map(|r| (variant(format!("{r:?}")), r.encode()))
            .chain(
                sample_responses()
                    .into_iter()
                    .map(|r| (variant(format!("{r:?}")), r.encode())),
            );
        for (name, frame) in frames {
            let tag = body(&frame)[4];
            assert_eq!(table_name(tag), Some(name.as_str()), "tag {tag}");
            seen.push(tag);
        }
        seen.sort_unstable();
        seen.dedup();
        let table: Vec<u8> = MESSAGES.iter().map(|(t, _)| *t).collect();
        assert_eq!(
            seen, table,
            "every message of the table has a sample, and no other"
        );
    }

    #[test]
    fn protocol_md_lists_exactly_the_message_table() {
        let doc = std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/PROTOCOL.md"),
        )
        .expect("docs/PROTOCOL.md");
        assert!(doc.contains("first frame, tag 0)"), "the hello's tag");
        let mut rows: Vec<(u8, String)> = doc
            .lines()
            .filter_map(|line| {
                let mut cells = line.split('|').map(str::trim).skip(1);
                let tag = cells.next()?.parse::<u8>().ok()?;
                let name = cells.next()?.split_whitespace().next()?.to_string();
                // Message rows only (the frame layout's rows name fields, in backquotes).
                let message = name.starts_with(|c: char| c.is_ascii_uppercase())
                    && name.chars().all(|c| c.is_ascii_alphanumeric());
                message.then_some((tag, name))
            })
            .collect();
        rows.push((0, "Hello".into()));
        rows.sort();
        let table: Vec<(u8, String)> = MESSAGES.iter().map(|(t, n)| (*t, n.to_string())).collect();
        assert_eq!(rows, table);
    }

    #[test]
    fn executor_c_names_every_tag_it_knows_as_the_table_does() {
        let c = std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../../executor-c/kiln_executor.c"),
        )
        .expect("executor-c/kiln_executor.c");
        // The enum: `T_NAME = N` (requests, and T_HELLO) and `A_NAME = N` (answers).
        let mut checked = 0;
        for word in c.split([',', '{', '}', '\n']) {
            let Some((name, value)) = word.split_once('=') else {
                continue;
            };
            let name = name.trim();
            let Some(short) = name.strip_prefix("T_").or_else(|| name.strip_prefix("A_")) else {
                continue;
            };
            let Ok(tag) = value.trim().parse::<u8>() else {
                continue;
            };
            let expected = table_name(tag).map(upper_snake);
            assert_eq!(
                expected.as_deref(),
                Some(short),
                "executor-c's {name} = {tag}"
            );
            checked += 1;
        }
        assert!(checked >= 25, "read {checked} tags of executor-c's enum");
        // The names it gives requests it does not implement: `case N: return "Name…`.
        for line in c.lines().map(str::trim) {
            let Some(rest) = line.strip_prefix("case ") else {
                continue;
            };
            let Some((tag, text)) = rest.split_once(": return \"") else {
                continue;
            };
            let Ok(tag) = tag.parse::<u8>() else { continue };
            let name: String = text
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric())
                .collect();
            assert_eq!(
                table_name(tag),
                Some(name.as_str()),
                "executor-c's case {tag}"
            );
        }
    }
}
