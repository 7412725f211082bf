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
//! The messages are declared once, in the table below (`messages!`): each variant's tag,
//! name and fields in wire order. The enums, the [`tag`] constants, [`MESSAGES`], and every
//! encoder and decoder are generated from it, so a tag or a field's order is written in
//! one place; tests hold docs/PROTOCOL.md and executor-c's enum to [`MESSAGES`].
//!
//! The encoding is not serde's: the format is the contract between two programs that may
//! be built apart (executor-c is C), so each field type's bytes are spelled out in
//! `codec.rs`, versioned, and bounded (every length is checked against [`MAX_FRAME`] and
//! the bytes left before anything is allocated) — which is also what the decoder's fuzz
//! target exercises.

/// Protocol version; the executor's [`Hello`] must match.
pub const VERSION: u32 = 2;
/// Magic bytes at the start of a [`Hello`].
pub const MAGIC: [u8; 4] = *b"KILN";
/// Largest frame accepted: a copy-transport write carries at most [`MAX_WRITE`] bytes.
pub const MAX_FRAME: u32 = MAX_WRITE + (64 << 10);
/// Largest write (or read) of code bytes in one request; larger ones go in pieces.
pub const MAX_WRITE: u32 = 32 << 20;
/// Largest string (symbol names, paths, arguments).
pub const MAX_STRING: usize = kiln_codec::MAX_STRING;
/// Largest number of items in a list (arguments, segments, initializers).
pub const MAX_ITEMS: usize = kiln_codec::MAX_ITEMS;

/// Why a frame could not be decoded (the codec's error: kiln-codec).
pub use kiln_codec::DecodeError;

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

/// [`Hello::features`]: the executor serves [`Request::DeferExports`], and its hello's
/// runtime symbols name the loader shims JIT code calls in place of the C library's
/// `dlopen`, `dlmopen`, `dlsym` and `dlvsym` ([`LOADER_SHIM_PREFIX`] and the name), which
/// publish deferred exports first.
pub const FEATURE_DEFERRED_EXPORTS: u32 = 2;

/// The prefix of a loader shim's name among a hello's runtime symbols
/// (`__kiln_loader_dlsym` is the shim for `dlsym`): see [`FEATURE_DEFERRED_EXPORTS`].
pub const LOADER_SHIM_PREFIX: &str = "__kiln_loader_";

/// The bit a handle chosen by the controller for [`Request::DeferExports`] has set (one
/// the executor answered for [`Request::ExportSymbols`] has it clear): the two never meet.
pub const CONTROLLER_HANDLE: u64 = 1 << 63;

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

/// One function's Windows unwind data: its first byte, one past its last byte, and its
/// `UNWIND_INFO` (see [`Request::RegisterUnwindInfo`]).
pub type WireUnwind = (u64, u64, Vec<u8>);

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

#[macro_use]
pub(crate) mod codec;
use codec::{Field, Lossy, Nested, Permission, Segments, UpToSix, ZeroIfAbsent};

messages! {
    hello = 0 as HELLO;

    /// A request from the controller.
    pub enum Request {
        /// Reserve address space (a memfd mapped twice in the executor); with `share`, the
        /// memfd is sent back for the controller to map.
        Reserve = 1 as RESERVE "reserve" {
            /// Bytes.
            len: u64,
            /// Where.
            placement: WirePlacement,
            /// Whether to send the memfd (shared-memory transport).
            share: bool,
        },
        /// Give pages their final permission in the executor's view.
        Prepare = 2 as PREPARE "prepare" {
            /// Reservation handle.
            handle: u64,
            /// First byte (page aligned, target address).
            start: u64,
            /// End (page aligned).
            end: u64,
            /// Permission (0 RX, 1 R, 2 RW).
            permission: u8 as Permission,
        },
        /// Make segments runnable (instruction-cache coherence).
        Initialize = 3 as INITIALIZE "initialize" {
            /// Reservation handle.
            handle: u64,
            /// The segments.
            segments: Vec<WireSegment> as Segments,
        },
        /// Return pages.
        Deinitialize = 4 as DEINITIALIZE "deinitialize" {
            /// Reservation handle.
            handle: u64,
            /// First byte.
            start: u64,
            /// End.
            end: u64,
        },
        /// Release a reservation.
        Release = 5 as RELEASE "release" {
            /// Reservation handle.
            handle: u64,
        },
        /// Write bytes into a reservation (copy transport).
        Write = 6 as WRITE "write" {
            /// Reservation handle.
            handle: u64,
            /// Target address.
            address: u64,
            /// The bytes.
            bytes: Vec<u8>,
        },
        /// Read bytes from a reservation.
        Read = 7 as READ "read" {
            /// Reservation handle.
            handle: u64,
            /// Target address.
            address: u64,
            /// Length.
            len: u64,
        },
        /// Look a symbol up: in the whole process (`library` 0) or a library opened before.
        Lookup = 8 as LOOKUP "lookup" {
            /// Library handle, 0 for the process.
            library: u64,
            /// Symbol name.
            name: String,
        },
        /// `dlopen` a shared library.
        LoadLibrary = 9 as LOAD_LIBRARY "load library" {
            /// Path or name.
            path: String,
        },
        /// Register `.eh_frame` data at an address inside a reservation.
        RegisterEhFrame = 10 as REGISTER_EH_FRAME "register eh_frame" {
            /// Address.
            address: u64,
        },
        /// Deregister it.
        DeregisterEhFrame = 11 as DEREGISTER_EH_FRAME "deregister eh_frame" {
            /// Address.
            address: u64,
        },
        /// Run initializers.
        RunInitializers = 12 as RUN_INITIALIZERS "run initializers" {
            /// Function addresses.
            functions: Vec<u64>,
        },
        /// Run finalizers: `__cxa_finalize(dso_handle)` then the functions.
        RunFinalizers = 13 as RUN_FINALIZERS "run finalizers" {
            /// The module's `__dso_handle`.
            dso_handle: u64,
            /// Function addresses.
            functions: Vec<u64>,
        },
        /// A fresh TLS module id.
        ReserveTlsModule = 14 as RESERVE_TLS_MODULE "reserve TLS module",
        /// Install a TLS template.
        InstallTls = 15 as INSTALL_TLS "install TLS" {
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
        RemoveTls = 16 as REMOVE_TLS "remove TLS" {
            /// Module id.
            module_id: u64,
        },
        /// Call `main(argc, argv, envp)`.
        RunMain = 17 as RUN_MAIN "run main" {
            /// Address of main.
            address: u64,
            /// argv (`argv[0]` first), each the operating system's bytes (not necessarily
            /// UTF-8; no NUL).
            args: Vec<Vec<u8>>,
        },
        /// Call `u64 f(u64, …)` with up to six integer arguments.
        Call = 18 as CALL "call" {
            /// Address.
            address: u64,
            /// Arguments.
            args: Vec<u64> as UpToSix,
        },
        /// Flush stdio and exit.
        Shutdown = 19 as SHUTDOWN "shutdown",
        /// Look many symbols up at once (one round trip for a link's undefined names).
        LookupMany = 20 as LOOKUP_MANY "lookup many" {
            /// Library handle, 0 for the process.
            library: u64,
            /// Symbol names.
            names: Vec<String>,
        },
        /// Place a reserved TLS module's block in static TLS (every thread, one offset from
        /// the thread pointer); answers the offset as a `u64` (two's complement).
        PlaceStaticTls = 21 as PLACE_STATIC_TLS "place static TLS" {
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
        ExportSymbols = 22 as EXPORT_SYMBOLS "export symbols" {
            /// The definitions.
            symbols: Vec<WireExport>,
        },
        /// Withdraw definitions exported with [`Request::ExportSymbols`].
        UnexportSymbols = 23 as UNEXPORT_SYMBOLS "unexport symbols" {
            /// The handle.
            handle: u64,
        },
        /// Bytes for the program's standard input (an executor that forwards output reads
        /// its input from these); empty means end of input. Never answered; may be sent at any
        /// time, also while `RunMain` runs.
        Input = 24 as INPUT "input" {
            /// The bytes.
            bytes: Vec<u8>,
        },
        /// The program's standard input, output and error are the three descriptors sent with
        /// this message (`SCM_RIGHTS`, Unix sockets only): the controller's own, so that a
        /// pre-started executor's program reads and writes where a local one would.
        AdoptStdio = 25 as ADOPT_STDIO "adopt stdio",
        /// Turn on debugger and profiler outputs (answers `Ok`).
        EnableDebugOutputs = 26 as ENABLE_DEBUG_OUTPUTS "enable debug outputs" (outputs: DebugOutputs),
        /// Tell debuggers and profilers of a module (answers a handle for
        /// [`Request::UnregisterDebug`]).
        RegisterDebug = 27 as REGISTER_DEBUG "register debug information" (module: DebugModule),
        /// A module registered with [`Request::RegisterDebug`] is about to be freed: its images
        /// leave the GDB JIT interface.
        UnregisterDebug = 28 as UNREGISTER_DEBUG "unregister debug information" {
            /// The handle.
            handle: u64,
        },
        /// Executor → controller (an id with [`EXECUTOR_REQUEST`] set): JIT code called the
        /// call-through stub `stub` (the id its code pushes) before it had a body. The
        /// controller compiles and links the body and answers [`Response::StubResolved`].
        ResolveStub = 29 as RESOLVE_STUB "resolve a call-through stub" {
            /// The stub's id.
            stub: u64,
        },
        /// The program's environment and working directory are the controller's: the
        /// executor replaces its environment with `variables` and enters `directory` (unless
        /// empty). Answers `Ok`, or an `Error` naming what it could not adopt.
        SetEnvironment = 30 as SET_ENVIRONMENT "set environment" {
            /// Each variable as `NAME=VALUE` (bytes: neither has to be UTF-8).
            variables: Vec<Vec<u8>>,
            /// The working directory (empty: unchanged).
            directory: Vec<u8>,
        },
        /// The code in `[address, address + len)` (whole pages, already read-execute) was
        /// built for branch-target enforcement (AArch64 BTI: every object's GNU property note
        /// says so): map it guarded (`PROT_BTI`), so an indirect branch to anything but a
        /// landing pad traps. Answers `Ok` (also where the architecture has no such guard).
        GuardBranchTargets = 31 as GUARD_BRANCH_TARGETS "guard branch targets" {
            /// First byte (page-aligned).
            address: u64,
            /// Length (whole pages).
            len: u64,
        },
        /// Requests served in order as if sent one by one, answered with one
        /// [`Response::Batched`]: one round trip for steps that need no answer before the
        /// next (prepare, initialize, register `.eh_frame`, ...). The executor stops at the
        /// first that fails (its `Error` is the last answer). Only an executor whose hello
        /// has [`FEATURE_BATCH`] serves it; a batch holds no batch, and no request that runs
        /// JIT code, passes descriptors or ends the connection.
        Batch = 32 as BATCH "batch" (requests: Vec<Request> as Nested),
        /// Stores `target` in the call-through stub slot at `slot` with one atomic store
        /// (hot swap: calls that load the slot after the answer reach `target`). The slot
        /// must be 8-byte aligned on prepared pages of a reservation, `target` in reserved
        /// code. Answers `Value(epoch)`: the epoch of the executor's code guards at which
        /// the replaced body was retired (see [`Request::OldestCodeGuard`]).
        StoreCodePointer = 33 as STORE_CODE_POINTER "store code pointer" {
            /// The slot's address.
            slot: u64,
            /// Where calls through it go from now on.
            target: u64,
        },
        /// The epoch of the oldest guard the executor's threads hold (each request that
        /// runs code holds one, taken when its code starts), or the epoch now if none is
        /// held. Answers `Value(epoch)`: a body retired (by [`Request::StoreCodePointer`])
        /// at an earlier epoch can no longer be running, and may be freed.
        OldestCodeGuard = 34 as OLDEST_CODE_GUARD "oldest code guard",
        /// Windows executors: the unwind data of a module's functions (made by the
        /// controller from the module's `.eh_frame`), for the system's unwinder (crash
        /// reports, debuggers' backtraces, `longjmp`, exceptions): the executor copies it
        /// into memory of its own within reach of the functions and registers it
        /// (`RtlAddFunctionTable`). Answers a handle for [`Request::DeregisterUnwindInfo`].
        RegisterUnwindInfo = 35 as REGISTER_UNWIND_INFO "register unwind data" {
            /// Each function: begin, end, `UNWIND_INFO`.
            functions: Vec<WireUnwind>,
        },
        /// Unwind data registered with [`Request::RegisterUnwindInfo`] goes (its module is
        /// about to be freed).
        DeregisterUnwindInfo = 36 as DEREGISTER_UNWIND_INFO "deregister unwind data" {
            /// The handle.
            handle: u64,
        },
        /// As [`Request::ExportSymbols`], but published only when JIT code first calls the
        /// loader through a shim (see [`FEATURE_DEFERRED_EXPORTS`]) or a library new to the
        /// process is loaded for the program, at once if one was already; a program that
        /// never asks the loader never pays for them. Answers `Ok`: `handle`, chosen by the
        /// controller (with [`CONTROLLER_HANDLE`] set, not in use), names them for
        /// [`Request::UnexportSymbols`] — so the request needs no answer before the next and
        /// can go in a [`Request::Batch`].
        DeferExports = 37 as DEFER_EXPORTS "defer exports" {
            /// The handle for [`Request::UnexportSymbols`].
            handle: u64,
            /// The definitions.
            symbols: Vec<WireExport>,
        },
        /// Windows executors: a module's unwind table as its COFF objects carry it (their
        /// `.pdata`, linked in the module with its `.xdata`): `RUNTIME_FUNCTION` entries
        /// sorted by their first byte, each (begin, end, unwind info) relative to
        /// `image_base`, for the system's unwinder (crash reports, debuggers' backtraces,
        /// `longjmp`, C++ exceptions). The unwind information stays in the module (its
        /// handlers' data is relative to the same base): the executor checks every entry
        /// against the memory it prepared, copies the entries and registers them
        /// (`RtlAddFunctionTable`). Answers a handle for [`Request::DeregisterUnwindInfo`].
        RegisterFunctionTable = 38 as REGISTER_FUNCTION_TABLE "register function table" {
            /// What the entries' offsets count from: the module's lowest address.
            image_base: u64,
            /// Each function: begin, end, `UNWIND_INFO`, as offsets from `image_base`.
            entries: Vec<(u32, u32, u32)>,
        },
    }

    /// A response from the executor (or, to a [`Request::ResolveStub`], from the controller).
    pub enum Response {
        /// Done.
        Ok = 100 as OK "ok",
        /// A value.
        Value = 101 as VALUE "value" (value: u64),
        /// A reservation.
        Reserved = 102 as RESERVED "reserved" {
            /// Target address.
            target: u64,
            /// Handle for later requests.
            handle: u64,
        },
        /// Bytes read.
        Bytes = 103 as BYTES "bytes" (bytes: Vec<u8>),
        /// A symbol: address (0 if not found) and kind (0 unknown, 1 function, 2 data).
        Symbol = 104 as SYMBOL "symbol" {
            /// Address, 0 if not found.
            address: u64,
            /// 0 unknown, 1 function, 2 data.
            kind: u8,
        },
        /// The request failed.
        Error = 105 as ERROR "error" (message: String as Lossy),
        /// The executor caught a fatal signal while running JIT code and is dying.
        Crashed = 106 as CRASHED "crashed" {
            /// The signal number.
            signal: i32,
            /// The address whose access faulted (`si_addr`; 0 if the signal has none or the
            /// executor did not say).
            fault_address: u64 as ZeroIfAbsent,
            /// The instruction that faulted (0 if the executor did not say).
            pc: u64 as ZeroIfAbsent,
            /// A Windows executor's exception code (`0xC0000005`, an access violation),
            /// which the signal stands for; 0 elsewhere.
            exception: u32 as ZeroIfAbsent,
        },
        /// Symbols, in the order asked: (address or 0, kind).
        Symbols = 107 as SYMBOLS "symbols" (symbols: Vec<(u64, u8)>),
        /// JIT code called `exit(status)`: the executor is ending with that status.
        Exited = 108 as EXITED "exited" {
            /// The exit status.
            status: i32,
        },
        /// Output of the program (its standard output or error), forwarded by an executor
        /// that serves a remote controller; may arrive at any time, not as an answer.
        Output = 109 as OUTPUT "output" {
            /// 1 standard output, 2 standard error.
            stream: u8,
            /// The bytes.
            bytes: Vec<u8>,
        },
        /// The controller's answer to [`Request::ResolveStub`]: where the call continues (the
        /// body, or a fallback after a failed compile), and the stub's slot to store it in
        /// (0: store nothing, the next call asks again).
        StubResolved = 110 as STUB_RESOLVED "stub resolved" {
            /// Where the call goes.
            target: u64,
            /// The stub's pointer slot, or 0.
            slot: u64,
        },
        /// The answers to a [`Request::Batch`], in its order: as many as were served (the
        /// last is an `Error` when one failed and the rest were not served).
        Batched = 111 as BATCHED "batched" (answers: Vec<Response> as Nested),
    }
}

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

/// The hello is the one message outside the two enums (it is read before anything else,
/// and starts with [`MAGIC`]); its fields use the same codecs.
impl Hello {
    /// Encodes as a frame.
    pub fn encode(&self) -> Vec<u8> {
        let mut w = codec::frame(tag::HELLO);
        w.raw(&MAGIC);
        self.version.put(&mut w);
        self.page_size.put(&mut w);
        self.triple.put(&mut w);
        self.pid.put(&mut w);
        self.max_frame.put(&mut w);
        w.u32(self.runtime_symbols.len() as u32);
        for symbol in &self.runtime_symbols {
            symbol.put(&mut w);
        }
        self.features.put(&mut w);
        codec::finish(w)
    }

    /// Decodes a frame body.
    pub fn decode(body: &[u8]) -> Result<Self, DecodeError> {
        use codec::Codec;
        let mut r = codec::Reader::new(body);
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
        let hello = Hello {
            version: u32::get(&mut r, "version")?,
            page_size: u64::get(&mut r, "page size")?,
            triple: String::get(&mut r, "triple")?,
            pid: u32::get(&mut r, "pid")?,
            max_frame: u32::get(&mut r, "max frame")?,
            runtime_symbols: {
                let n = r.count("runtime symbols", 12)?;
                let mut symbols = Vec::with_capacity(n);
                for _ in 0..n {
                    symbols.push(<(String, u64)>::get(&mut r, "runtime symbol")?);
                }
                symbols
            },
            // Optional: an executor that predates it (or executor-c) ends here.
            features: ZeroIfAbsent::get(&mut r, "features")?,
        };
        r.end()?;
        Ok(hello)
    }
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
                args: vec![b"prog".to_vec(), vec![b'x', 0xff]],
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
            Request::DeferExports {
                handle: CONTROLLER_HANDLE | 4,
                symbols: vec![("g".into(), 0x3000, 0, true)],
            },
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
            Request::OldestCodeGuard,
            Request::RegisterUnwindInfo {
                functions: vec![(0x1000, 0x1040, vec![1, 4, 1, 0, 4, 0x50, 0, 0])],
            },
            Request::DeregisterUnwindInfo { handle: 2 },
            Request::RegisterFunctionTable {
                image_base: 0x10000,
                entries: vec![(0x1000, 0x1040, 0x3000), (0x1040, 0x1080, 0x3008)],
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
    fn the_table_lists_each_tag_once_in_increasing_order() {
        for pair in MESSAGES.windows(2) {
            assert!(pair[0].0 < pair[1].0, "{:?} then {:?}", pair[0], pair[1]);
        }
        for request in sample_requests() {
            assert_eq!(body(&request.encode())[4], request.tag(), "{request}");
        }
        for answer in sample_responses() {
            assert_eq!(body(&answer.encode())[4], answer.tag(), "{answer}");
        }
    }

    /// The generated codec writes the bytes docs/PROTOCOL.md describes (and executor-c
    /// reads): checked field by field for messages of each shape.
    #[test]
    fn fields_travel_in_the_documented_order_and_widths() {
        let frame = Request::Reserve {
            len: 0x1122,
            placement: WirePlacement::Near(3, 4),
            share: true,
        }
        .encode();
        let mut want = vec![0, 0, 0, 0, tag::RESERVE];
        want.extend_from_slice(&0x1122u64.to_le_bytes());
        want.push(2);
        want.extend_from_slice(&3u64.to_le_bytes());
        want.extend_from_slice(&4u64.to_le_bytes());
        want.push(1);
        assert_eq!(body(&frame), want.as_slice());

        let frame = Response::Crashed {
            signal: -1,
            fault_address: 5,
            pc: 6,
            exception: 0xc000_0005,
        }
        .encode();
        let mut want = vec![0, 0, 0, 0, tag::CRASHED, 0xff, 0xff, 0xff, 0xff];
        want.extend_from_slice(&5u64.to_le_bytes());
        want.extend_from_slice(&6u64.to_le_bytes());
        want.extend_from_slice(&0xc000_0005u32.to_le_bytes());
        assert_eq!(body(&frame), want.as_slice());
        // The signal alone (an older executor's report): the addresses read as 0.
        let alone = [0, 0, 0, 0, tag::CRASHED, 11, 0, 0, 0];
        assert_eq!(
            Response::decode(&alone).unwrap(),
            Response::Crashed {
                signal: 11,
                fault_address: 0,
                pc: 0,
                exception: 0,
            }
        );

        let frame = Request::RunMain {
            address: 7,
            args: vec![b"ab".to_vec()],
        }
        .encode();
        let mut want = vec![0, 0, 0, 0, tag::RUN_MAIN];
        want.extend_from_slice(&7u64.to_le_bytes());
        want.extend_from_slice(&1u32.to_le_bytes());
        want.extend_from_slice(&2u32.to_le_bytes());
        want.extend_from_slice(b"ab");
        assert_eq!(body(&frame), want.as_slice());

        // An error's text need not be UTF-8.
        let mut error = vec![0, 0, 0, 0, tag::ERROR, 2, 0, 0, 0, b'x', 0xff];
        assert_eq!(
            Response::decode(&error).unwrap(),
            Response::Error("x\u{fffd}".into())
        );
        error.push(0);
        assert_eq!(Response::decode(&error), Err(DecodeError::Trailing(1)));

        // Seven call arguments are refused, naming the field.
        let mut call = Request::Call {
            address: 1,
            args: vec![0; 6],
        }
        .encode();
        call[4 + 5 + 8] = 7;
        call.extend_from_slice(&0u64.to_le_bytes());
        assert!(matches!(
            Request::decode(&call[4..]),
            Err(DecodeError::Invalid {
                what: "argument count",
                value: 7
            })
        ));
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
                exception: 0,
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
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../executor-c/wire.h"),
        )
        .expect("executor-c/wire.h");
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
