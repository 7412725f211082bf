//! Where debuggers and profilers find the code this process runs: the GDB JIT interface
//! (gdb and lldb), `/tmp/perf-<pid>.map` and a jitdump file (`perf inject --jit`).
//!
//! The controller builds what to tell them (`kiln-debug`); this module, in the process
//! that runs the code, writes it where the tools look. All outputs are per process and
//! enabled once ([`enable`]); several sessions add theirs up.
//!
//! Registration is O(1) per module: the GDB list is doubly linked, an image is inserted at
//! its head and unlinked in place. Perf records are formatted and appended by a writer
//! thread, off the link's path: a module's records carry the time of its registration
//! (perf orders them by it), a module's free waits until its records are written (they
//! copy its code), and what is pending is written at `exit` (an `atexit` handler) or by
//! [`flush`].

use kiln_wire::protocol::{DebugFunction, DebugModule, DebugOutputs};
use parking_lot::{Condvar, Mutex};
use rustc_hash::FxHashMap;
use std::collections::VecDeque;
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

/// `struct jit_code_entry` of the GDB JIT interface.
#[repr(C)]
struct JitCodeEntry {
    next: *mut JitCodeEntry,
    prev: *mut JitCodeEntry,
    symfile_addr: *const u8,
    symfile_size: u64,
}

/// `struct jit_descriptor` of the GDB JIT interface.
#[repr(C)]
struct JitDescriptor {
    version: u32,
    action_flag: u32,
    relevant_entry: *mut JitCodeEntry,
    first_entry: *mut JitCodeEntry,
}

const JIT_NOACTION: u32 = 0;
const JIT_REGISTER_FN: u32 = 1;
const JIT_UNREGISTER_FN: u32 = 2;

extern "C" {
    /// The process's `__jit_debug_descriptor` (csrc/gdb_jit.c; weak, maybe another
    /// runtime's).
    fn kiln_gdb_jit_descriptor() -> *mut JitDescriptor;
    /// Calls `__jit_debug_register_code`, where the debugger stops to read the list.
    fn kiln_gdb_jit_notify();
}

/// One image in the GDB list: the entry (at a stable address, in a box) and its bytes.
struct GdbEntry {
    entry: JitCodeEntry,
    _image: Box<[u8]>,
}

// SAFETY: an entry's pointers are those of the process-wide GDB list, read and written
// only under `OUTPUTS`'s lock (and by the debugger while the process is stopped).
unsafe impl Send for GdbEntry {}

/// The jitdump file and its marker mapping.
struct Jitdump {
    file: File,
    path: PathBuf,
    marker: *mut libc::c_void,
    marker_len: usize,
    code_index: u64,
}

// SAFETY: `marker` is a mapping only this value unmaps; nothing reads through it.
unsafe impl Send for Jitdump {}

impl Drop for Jitdump {
    fn drop(&mut self) {
        let _ = self
            .file
            .write_all(&record_header(JIT_CODE_CLOSE, 16, timestamp()));
        // SAFETY: the marker was mapped by `Jitdump::create` and is unmapped once, here.
        unsafe { libc::munmap(self.marker, self.marker_len) };
    }
}

struct Outputs {
    /// The process whose files are open (a forked child opens its own).
    pid: u32,
    settings: DebugOutputs,
    /// Which perf files are open (they are in [`FILES`], the writer's).
    perf_map_open: bool,
    /// The perf map was wanted but its name was taken by something not ours (a link,
    /// another user's file): skipped, with a warning, for this process.
    perf_map_skipped: bool,
    jitdump_open: bool,
    /// Each entry is boxed: the debugger's list points at it, so it must not move
    /// when the vector grows.
    #[allow(clippy::vec_box)]
    modules: FxHashMap<u64, Vec<Box<GdbEntry>>>,
    /// Handle → the sequence number of its perf records (for [`unregister`] to wait on).
    perf_jobs: FxHashMap<u64, u64>,
    next_handle: u64,
}

static OUTPUTS: Mutex<Option<Outputs>> = Mutex::new(None);

/// Turns outputs on (adding to those already on). A jitdump directory of `""` means the
/// default: `$JITDUMPDIR`, else `$HOME/.debug/jit`, in a new `kiln-<pid>-<time>`
/// directory.
pub fn enable(settings: &DebugOutputs) -> Result<(), String> {
    let mut guard = OUTPUTS.lock();
    let outputs = guard.get_or_insert_with(|| Outputs {
        pid: 0,
        settings: DebugOutputs::default(),
        perf_map_open: false,
        perf_map_skipped: false,
        jitdump_open: false,
        modules: FxHashMap::default(),
        perf_jobs: FxHashMap::default(),
        next_handle: 1,
    });
    outputs.settings.gdb |= settings.gdb;
    outputs.settings.perf_map |= settings.perf_map;
    if outputs.settings.jitdump_dir.is_none() {
        outputs.settings.jitdump_dir = settings.jitdump_dir.clone();
    }
    outputs.open_files()
}

/// The jitdump file this process writes, if any.
pub fn jitdump_path() -> Option<PathBuf> {
    FILES
        .lock()
        .as_ref()
        .and_then(|f| f.jitdump.as_ref().map(|j| j.path.clone()))
}

/// The perf files, used by the writer (under their own lock, so that registering a
/// module never waits for a file write).
struct PerfFiles {
    perf_map: Option<File>,
    jitdump: Option<Jitdump>,
}

static FILES: Mutex<Option<PerfFiles>> = Mutex::new(None);

impl Outputs {
    /// Opens the files the settings ask for and this process has not opened yet.
    fn open_files(&mut self) -> Result<(), String> {
        let pid = std::process::id();
        let wanted = (self.settings.perf_map, self.settings.jitdump_dir.is_some());
        let settled = (
            self.perf_map_open || self.perf_map_skipped,
            self.jitdump_open,
        );
        if pid == self.pid && settled == wanted {
            return Ok(());
        }
        let mut files = FILES.lock();
        let files = files.get_or_insert_with(|| PerfFiles {
            perf_map: None,
            jitdump: None,
        });
        if pid != self.pid {
            // A forked child: the parent's files are the parent's.
            self.pid = pid;
            files.perf_map = None;
            self.perf_map_skipped = false;
            // The parent's jitdump is left as it is (no close record from the child).
            std::mem::forget(files.jitdump.take());
        }
        if self.settings.perf_map && files.perf_map.is_none() && !self.perf_map_skipped {
            let path = format!("/tmp/perf-{pid}.map");
            files.perf_map = open_perf_map(Path::new(&path));
            self.perf_map_skipped = files.perf_map.is_none();
        }
        if let (Some(dir), None) = (&self.settings.jitdump_dir, &files.jitdump) {
            files.jitdump = Some(Jitdump::create(dir, pid)?);
        }
        self.perf_map_open = files.perf_map.is_some();
        self.jitdump_open = files.jitdump.is_some();
        Ok(())
    }
}

/// Tells debuggers and profilers of a module; answers a handle for [`unregister`].
///
/// # Safety
/// With a perf output on, every function's `[address, address + size)` must be readable
/// memory of this process (the jitdump file holds a copy of the code).
pub unsafe fn register(module: DebugModule) -> Result<u64, String> {
    let mut guard = OUTPUTS.lock();
    let outputs = guard
        .as_mut()
        .ok_or("debug outputs are not enabled in this executor")?;
    outputs.open_files()?;
    let handle = outputs.next_handle;
    outputs.next_handle += 1;
    let perf_map = module.perf_map && outputs.perf_map_open;
    let jitdump = module.jitdump && outputs.jitdump_open;
    if (perf_map || jitdump) && !module.functions.is_empty() {
        let seq = queue_perf_job(PerfJob {
            seq: 0,
            functions: module.functions,
            files: module.files,
            perf_map,
            jitdump,
            timestamp: timestamp(),
            pid: std::process::id(),
            // SAFETY: gettid has no preconditions.
            tid: unsafe { libc::gettid() } as u32,
        });
        outputs.perf_jobs.insert(handle, seq);
    }
    if outputs.settings.gdb && !module.images.is_empty() {
        let mut entries = Vec::with_capacity(module.images.len());
        for image in module.images {
            let image = image.into_boxed_slice();
            let mut entry = Box::new(GdbEntry {
                entry: JitCodeEntry {
                    next: std::ptr::null_mut(),
                    prev: std::ptr::null_mut(),
                    symfile_addr: image.as_ptr(),
                    symfile_size: image.len() as u64,
                },
                _image: image,
            });
            // SAFETY: the list is changed only under OUTPUTS's lock (held); the entry is
            // boxed, so its address stays valid until `unregister` unlinks it.
            unsafe {
                let descriptor = kiln_gdb_jit_descriptor();
                let new: *mut JitCodeEntry = &mut entry.entry;
                let first = (*descriptor).first_entry;
                (*new).next = first;
                if !first.is_null() {
                    (*first).prev = new;
                }
                (*descriptor).first_entry = new;
                (*descriptor).relevant_entry = new;
                (*descriptor).action_flag = JIT_REGISTER_FN;
                kiln_gdb_jit_notify();
                (*descriptor).action_flag = JIT_NOACTION;
            }
            entries.push(entry);
        }
        outputs.modules.insert(handle, entries);
    }
    Ok(handle)
}

/// A module is about to be freed: its images leave the GDB list. (Perf maps and jitdump
/// have no unload record: perf tells reused addresses apart by the time of each record.)
pub fn unregister(handle: u64) {
    // Its code must stay until its perf records (a copy of it) are written.
    let job = OUTPUTS
        .lock()
        .as_mut()
        .and_then(|o| o.perf_jobs.remove(&handle));
    if let Some(seq) = job {
        wait_written(seq);
    }
    let mut guard = OUTPUTS.lock();
    let Some(outputs) = guard.as_mut() else {
        return;
    };
    let Some(entries) = outputs.modules.remove(&handle) else {
        return;
    };
    for mut entry in entries {
        // SAFETY: the entry is in the list (linked by `register`, unlinked only here) and
        // the list is changed only under OUTPUTS's lock (held).
        unsafe {
            let descriptor = kiln_gdb_jit_descriptor();
            let this: *mut JitCodeEntry = &mut entry.entry;
            let (prev, next) = ((*this).prev, (*this).next);
            if prev.is_null() {
                (*descriptor).first_entry = next;
            } else {
                (*prev).next = next;
            }
            if !next.is_null() {
                (*next).prev = prev;
            }
            (*descriptor).relevant_entry = this;
            (*descriptor).action_flag = JIT_UNREGISTER_FN;
            kiln_gdb_jit_notify();
            (*descriptor).action_flag = JIT_NOACTION;
            (*descriptor).relevant_entry = std::ptr::null_mut();
        }
    }
}

/// The number of images in the process's GDB list (all runtimes' together).
pub fn gdb_entry_count() -> usize {
    let _guard = OUTPUTS.lock();
    let mut count = 0;
    // SAFETY: the list is read under OUTPUTS's lock; Kiln's entries are valid while
    // listed (other runtimes' too, by the interface's contract).
    unsafe {
        let mut entry = (*kiln_gdb_jit_descriptor()).first_entry;
        while !entry.is_null() {
            count += 1;
            entry = (*entry).next;
        }
    }
    count
}

// --- jitdump (tools/perf/Documentation/jitdump-specification.txt) ---------------------

const JITDUMP_MAGIC: u32 = 0x4A69_5444;
const JITDUMP_VERSION: u32 = 1;
const JIT_CODE_LOAD: u32 = 0;
const JIT_CODE_DEBUG_INFO: u32 = 2;
const JIT_CODE_CLOSE: u32 = 3;

#[cfg(target_arch = "x86_64")]
const ELF_MACHINE: u32 = 62;
#[cfg(target_arch = "aarch64")]
const ELF_MACHINE: u32 = 183;

/// `CLOCK_MONOTONIC` in nanoseconds: the clock `perf record -k mono` stamps samples with.
fn timestamp() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid timespec to write.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

fn record_header(id: u32, total_size: u32, timestamp: u64) -> [u8; 16] {
    let mut r = [0u8; 16];
    r[..4].copy_from_slice(&id.to_le_bytes());
    r[4..8].copy_from_slice(&total_size.to_le_bytes());
    r[8..].copy_from_slice(&timestamp.to_le_bytes());
    r
}

/// The default jitdump directory: `$JITDUMPDIR` or `$HOME/.debug/jit` (as LLVM's and
/// perf's own tools use), else `/tmp`.
fn default_jitdump_base() -> PathBuf {
    if let Some(dir) = std::env::var_os("JITDUMPDIR") {
        return PathBuf::from(dir);
    }
    match std::env::var_os("HOME") {
        Some(home) => Path::new(&home).join(".debug").join("jit"),
        None => PathBuf::from("/tmp"),
    }
}

/// Opens the perf map `path` (`/tmp/perf-<pid>.map`) as [`create_own_file`] does; when
/// that fails (the name is taken by a symbolic link, a FIFO, another user's file: planted
/// or not, it is not ours to write) the program still runs: the map is skipped, with a
/// warning on stderr that says what was found there. Perf then shows the JIT code's
/// addresses without names.
pub(crate) fn open_perf_map(path: &Path) -> Option<File> {
    match create_own_file(path, false) {
        Ok(file) => Some(file),
        Err(why) => {
            tracing::warn!(%why, "perf map skipped");
            eprintln!("kiln: warning: no perf map: {why}; the program runs without it (perf shows its JIT code unnamed)");
            None
        }
    }
}

/// What `meta` (an `lstat`'s or `fstat`'s) describes, for messages: its kind and owner
/// ("a symbolic link owned by uid 65534").
fn found(meta: &std::fs::Metadata) -> String {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let t = meta.file_type();
    let kind = if t.is_symlink() {
        "a symbolic link"
    } else if t.is_file() {
        "a regular file"
    } else if t.is_dir() {
        "a directory"
    } else if t.is_fifo() {
        "a FIFO"
    } else if t.is_socket() {
        "a socket"
    } else if t.is_char_device() {
        "a character device"
    } else if t.is_block_device() {
        "a block device"
    } else {
        "an unknown kind of file"
    };
    format!("{kind} owned by uid {}", meta.uid())
}

/// Creates `path` for writing (and reading, with `read`), in a directory others may write
/// to (`/tmp`): never through a symbolic link another user planted, never into a file of
/// theirs. A new file is made with `O_CREAT | O_EXCL` (which does not follow links), mode
/// 0644 as perf expects; if the name is taken, only a regular file of this user's with one
/// link (a stale one of an earlier process with the same pid) is reused, emptied, opened
/// with `O_NOFOLLOW`; anything else is an error that says what is there.
pub(crate) fn create_own_file(path: &Path, read: bool) -> Result<std::fs::File, String> {
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
    let shown = path.display();
    let created = std::fs::OpenOptions::new()
        .read(read)
        .write(true)
        .create_new(true)
        .mode(0o644)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path);
    match created {
        Ok(file) => return Ok(file),
        Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => {
            return Err(format!("creating {shown}: {e}"))
        }
        Err(_) => {}
    }
    let refuse = |what: String| {
        Err(format!(
            "refusing to write {shown}: {what} (another user may have planted it; remove it or choose another directory)"
        ))
    };
    // What is at `path` itself (not where a link leads), for the messages.
    let there = || {
        std::fs::symlink_metadata(path).map_or_else(|e| format!("unreadable ({e})"), |m| found(&m))
    };
    let existing = match std::fs::OpenOptions::new()
        .read(read)
        .write(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK)
        .open(path)
    {
        Ok(file) => file,
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
            return refuse(format!("it is {}", there()))
        }
        Err(e) if e.raw_os_error() == Some(libc::ENXIO) => {
            return refuse(format!("it is not a regular file: {}", there()))
        }
        Err(e) => return Err(format!("opening {shown}: {e}")),
    };
    let meta = existing
        .metadata()
        .map_err(|e| format!("reading {shown}'s status: {e}"))?;
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    if !meta.file_type().is_file() {
        return refuse(format!("it is not a regular file: {}", found(&meta)));
    }
    if meta.uid() != me {
        return refuse(format!("it is {}, not by uid {me}", found(&meta)));
    }
    if meta.nlink() != 1 {
        return refuse(format!("it has {} hard links", meta.nlink()));
    }
    existing
        .set_len(0)
        .map_err(|e| format!("emptying {shown}: {e}"))?;
    Ok(existing)
}

impl Jitdump {
    fn create(dir: &str, pid: u32) -> Result<Self, String> {
        let dir = if dir.is_empty() {
            let nanos = timestamp();
            default_jitdump_base().join(format!("kiln-{pid}-{nanos}"))
        } else {
            PathBuf::from(dir)
        };
        std::fs::create_dir_all(&dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
        let path = dir.join(format!("jit-{pid}.dump"));
        let mut file = create_own_file(&path, true)?;
        let mut header = Vec::with_capacity(40);
        for v in [JITDUMP_MAGIC, JITDUMP_VERSION, 40, ELF_MACHINE, 0, pid] {
            header.extend_from_slice(&v.to_le_bytes());
        }
        header.extend_from_slice(&timestamp().to_le_bytes());
        header.extend_from_slice(&0u64.to_le_bytes()); // flags
        file.write_all(&header)
            .map_err(|e| format!("writing {}: {e}", path.display()))?;
        // The marker: perf record sees this mapping of the file and perf inject finds
        // the file from it.
        // SAFETY: sysconf has no preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as usize;
        use std::os::fd::AsRawFd;
        // SAFETY: a new private read-only mapping of a file we hold open; nothing else is
        // mapped over.
        let marker = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                page,
                libc::PROT_READ | libc::PROT_EXEC,
                libc::MAP_PRIVATE,
                file.as_raw_fd(),
                0,
            )
        };
        if marker == libc::MAP_FAILED {
            return Err(format!(
                "mapping the jitdump marker of {}: {}",
                path.display(),
                std::io::Error::last_os_error()
            ));
        }
        Ok(Jitdump {
            file,
            path,
            marker,
            marker_len: page,
            code_index: 0,
        })
    }

    /// Appends a function's debug-info record (if it has lines) and its code-load record
    /// to `out`.
    ///
    /// # Safety
    /// `[f.address, f.address + f.size)` is readable memory of this process.
    unsafe fn code_load(
        &mut self,
        f: &DebugFunction,
        files: &[String],
        job: &PerfJob,
        out: &mut Vec<u8>,
    ) {
        if !f.lines.is_empty() {
            let mut body = Vec::new();
            body.extend_from_slice(&f.address.to_le_bytes());
            body.extend_from_slice(&(f.lines.len() as u64).to_le_bytes());
            for row in &f.lines {
                body.extend_from_slice(&row.address.to_le_bytes());
                body.extend_from_slice(&row.line.to_le_bytes());
                body.extend_from_slice(&0u32.to_le_bytes()); // discriminator
                let name = files.get(row.file as usize).map_or("", |s| s.as_str());
                body.extend_from_slice(name.as_bytes());
                body.push(0);
            }
            out.extend_from_slice(&record_header(
                JIT_CODE_DEBUG_INFO,
                16 + body.len() as u32,
                job.timestamp,
            ));
            out.extend_from_slice(&body);
        }
        // SAFETY: the caller's contract.
        let code = unsafe { std::slice::from_raw_parts(f.address as *const u8, f.size as usize) };
        let size = 16 + 8 + 32 + f.name.len() + 1 + code.len();
        let record = out;
        record.extend_from_slice(&record_header(JIT_CODE_LOAD, size as u32, job.timestamp));
        record.extend_from_slice(&job.pid.to_le_bytes());
        record.extend_from_slice(&job.tid.to_le_bytes());
        record.extend_from_slice(&f.address.to_le_bytes()); // vma
        record.extend_from_slice(&f.address.to_le_bytes()); // code address
        record.extend_from_slice(&f.size.to_le_bytes());
        record.extend_from_slice(&self.code_index.to_le_bytes());
        self.code_index += 1;
        record.extend_from_slice(f.name.as_bytes());
        record.push(0);
        record.extend_from_slice(code);
    }
}

// --- the perf writer ------------------------------------------------------------------

/// A module's perf records to write.
struct PerfJob {
    seq: u64,
    functions: Vec<DebugFunction>,
    files: Vec<String>,
    perf_map: bool,
    jitdump: bool,
    /// When the module was registered (its records' time).
    timestamp: u64,
    pid: u32,
    tid: u32,
}

struct PerfQueue {
    jobs: VecDeque<PerfJob>,
    next_seq: u64,
    /// The last sequence number written.
    written: u64,
    /// The process whose writer thread runs (a forked child starts its own).
    writer_pid: u32,
}

static QUEUE: Mutex<PerfQueue> = Mutex::new(PerfQueue {
    jobs: VecDeque::new(),
    next_seq: 1,
    written: 0,
    writer_pid: 0,
});
static WORK: Condvar = Condvar::new();
/// Held while one job is written, by the writer thread or by a caller that needs it done:
/// jobs are written one at a time, in order.
static WRITING: Mutex<()> = Mutex::new(());

/// Queues a job (starting this process's writer thread if needed); returns its sequence
/// number.
fn queue_perf_job(mut job: PerfJob) -> u64 {
    let mut queue = QUEUE.lock();
    job.seq = queue.next_seq;
    queue.next_seq += 1;
    let seq = job.seq;
    queue.jobs.push_back(job);
    let pid = std::process::id();
    if queue.writer_pid != pid {
        if queue.writer_pid != 0 {
            // A forked child: the parent's pending records are the parent's to write.
            queue.jobs.retain(|j| j.seq == seq);
            queue.written = seq - 1;
        }
        queue.writer_pid = pid;
        OWNER.store(pid, std::sync::atomic::Ordering::Relaxed);
        let started = std::thread::Builder::new()
            .name("kiln-perf-writer".into())
            .spawn(|| loop {
                {
                    let mut queue = QUEUE.lock();
                    while queue.jobs.is_empty() {
                        WORK.wait(&mut queue);
                    }
                }
                write_one();
            });
        if started.is_err() {
            queue.writer_pid = 0; // no thread: callers write (flush, unregister, exit)
        }
        static AT_EXIT: std::sync::Once = std::sync::Once::new();
        AT_EXIT.call_once(|| {
            // SAFETY: registers a function with no preconditions, run once at exit.
            unsafe { libc::atexit(flush_at_exit) };
        });
    }
    WORK.notify_one();
    seq
}

/// The process whose writer thread writes the queue (a forked child's exit must not
/// write its parent's records, nor wait on locks held by a thread it does not have).
static OWNER: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

extern "C" fn flush_at_exit() {
    if OWNER.load(std::sync::atomic::Ordering::Relaxed) == std::process::id() {
        flush();
    }
}

/// Writes every perf record queued so far (what `exit` does too).
pub fn flush() {
    while write_one() {}
}

/// Waits until job `seq` is written, writing what is queued before it meanwhile.
fn wait_written(seq: u64) {
    while QUEUE.lock().written < seq {
        if !write_one() {
            // Another writer holds it: `write_one` waited for it; look again.
            continue;
        }
    }
}

/// Writes the oldest queued job; `false` if there was none.
fn write_one() -> bool {
    let _writing = WRITING.lock();
    let Some(job) = QUEUE.lock().jobs.pop_front() else {
        return false;
    };
    /// Marks the job written however `write_one` ends (a panic included), so that no
    /// waiter spins on it.
    struct Written(u64);
    impl Drop for Written {
        fn drop(&mut self) {
            QUEUE.lock().written = self.0;
        }
    }
    let _written = Written(job.seq);
    let mut guard = FILES.lock();
    if let Some(files) = guard.as_mut() {
        if let Err(error) = write_job(files, &job) {
            tracing::warn!(%error, "writing perf records failed");
        }
    }
    true
}

fn write_job(outputs: &mut PerfFiles, job: &PerfJob) -> std::io::Result<()> {
    if let (Some(map), true) = (&mut outputs.perf_map, job.perf_map) {
        let mut text = String::with_capacity(job.functions.len() * 48);
        for f in &job.functions {
            use std::fmt::Write as _;
            let _ = writeln!(text, "{:x} {:x} {}", f.address, f.size, f.name);
        }
        map.write_all(text.as_bytes())?;
    }
    if let (Some(jitdump), true) = (&mut outputs.jitdump, job.jitdump) {
        // One write per module.
        let mut records = Vec::new();
        for f in &job.functions {
            // SAFETY: `register`'s contract: the code is readable until `unregister`,
            // which waits for this job.
            unsafe { jitdump.code_load(f, &job.files, job, &mut records) };
        }
        jitdump.file.write_all(&records)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{create_own_file, open_perf_map};
    use std::io::Write;
    use std::os::unix::fs::MetadataExt;

    fn scratch(name: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("kiln-own-file-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn a_planted_symlink_is_refused_and_its_target_untouched() {
        let dir = scratch("symlink");
        let victim = dir.join("victim");
        std::fs::write(&victim, "precious\n").unwrap();
        let path = dir.join("perf-1.map");
        std::os::unix::fs::symlink(&victim, &path).unwrap();
        let error = create_own_file(&path, false).unwrap_err();
        assert!(error.contains("symbolic link"), "{error}");
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious\n");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_fifo_or_a_directory_is_refused() {
        let dir = scratch("fifo");
        let fifo = dir.join("fifo.map");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: mkfifo with a valid C string.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let error = create_own_file(&fifo, false).unwrap_err();
        assert!(error.contains("not a regular file"), "{error}");
        let sub = dir.join("sub.map");
        std::fs::create_dir(&sub).unwrap();
        assert!(create_own_file(&sub, false).is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_file_of_another_user_is_refused_and_a_stale_one_of_ours_reused_empty() {
        let dir = scratch("owner");
        let path = dir.join("perf-2.map");
        std::fs::write(&path, "stale lines\n").unwrap();
        let mut file = create_own_file(&path, false).unwrap();
        file.write_all(b"new\n").unwrap();
        drop(file);
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "new\n");
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } == 0 {
            // As root: give the file to `nobody` and try again.
            std::os::unix::fs::chown(&path, Some(65534), Some(65534)).unwrap();
            let error = create_own_file(&path, false).unwrap_err();
            assert!(
                error.contains("owned by uid 65534, not by uid 0"),
                "{error}"
            );
            assert_eq!(std::fs::metadata(&path).unwrap().uid(), 65534);
            assert_eq!(std::fs::read_to_string(&path).unwrap(), "new\n");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_planted_perf_map_is_skipped_saying_what_is_there() {
        let dir = scratch("planted");
        // SAFETY: geteuid has no preconditions.
        let root = unsafe { libc::geteuid() } == 0;
        // A symbolic link (given to `nobody` when we can): skipped, its target untouched.
        let victim = dir.join("victim");
        std::fs::write(&victim, "precious\n").unwrap();
        let link = dir.join("perf-3.map");
        std::os::unix::fs::symlink(&victim, &link).unwrap();
        let owner = if root {
            std::os::unix::fs::lchown(&link, Some(65534), Some(65534)).unwrap();
            65534
        } else {
            // SAFETY: geteuid has no preconditions.
            unsafe { libc::geteuid() }
        };
        assert!(open_perf_map(&link).is_none());
        let error = create_own_file(&link, false).unwrap_err();
        assert!(
            error.contains(&format!("a symbolic link owned by uid {owner}")),
            "{error}"
        );
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious\n");
        assert!(std::fs::symlink_metadata(&link)
            .unwrap()
            .file_type()
            .is_symlink());
        // A FIFO: skipped at once (never blocks).
        let fifo = dir.join("perf-4.map");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: mkfifo with a valid C string.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        assert!(open_perf_map(&fifo).is_none());
        let error = create_own_file(&fifo, false).unwrap_err();
        assert!(error.contains("a FIFO owned by uid"), "{error}");
        // Another user's regular file: skipped, left as it was.
        if root {
            let theirs = dir.join("perf-5.map");
            std::fs::write(&theirs, "theirs\n").unwrap();
            std::os::unix::fs::chown(&theirs, Some(65534), Some(65534)).unwrap();
            assert!(open_perf_map(&theirs).is_none());
            let error = create_own_file(&theirs, false).unwrap_err();
            assert!(
                error.contains("a regular file owned by uid 65534"),
                "{error}"
            );
            assert_eq!(std::fs::read_to_string(&theirs).unwrap(), "theirs\n");
        }
        // A free name: opened.
        assert!(open_perf_map(&dir.join("perf-6.map")).is_some());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
