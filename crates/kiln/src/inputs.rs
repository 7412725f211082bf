//! What a library is given: relocatable objects (now or lazily), static archives, C and
//! C++ sources, symbol generators, the executor's process symbols and shared libraries.

use crate::executor::ExecutorSymbols;
use crate::generator::SymbolGenerator;
use crate::jit::Jit;
use crate::library::{describe, LazyObject, LibraryId};
use crate::library_search::{find_library, search_dirs_for, LibraryFile};
use crate::Error;
use kiln_link::{ArchiveInput, ObjectInput};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Opens an input file: without blocking (a FIFO with no writer would block the open for
/// good), then checked on the descriptor to be a regular file. A character device
/// (`/dev/zero`), a FIFO, a socket, a directory is refused at once with its kind — never
/// read (`/dev/zero` never ends; `/proc` files say their size is 0). Links are followed.
pub(crate) fn open_input(path: &Path) -> Result<(std::fs::File, std::fs::Metadata), Error> {
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
    let io = |source| Error::Io {
        path: path.to_path_buf(),
        source,
    };
    let file = std::fs::File::options()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .map_err(io)?;
    let meta = file.metadata().map_err(io)?;
    let procfs = {
        // SAFETY: an all-zero statfs is a valid value, filled by the call.
        let mut fs: libc::statfs = unsafe { std::mem::zeroed() };
        // SAFETY: a descriptor this function owns and an out-pointer to a statfs.
        let r = unsafe { libc::fstatfs(std::os::fd::AsRawFd::as_raw_fd(&file), &mut fs) };
        r == 0 && fs.f_type == libc::PROC_SUPER_MAGIC
    };
    if !meta.file_type().is_file() || procfs {
        let kind = if procfs {
            "a /proc file"
        } else {
            kiln_cache::kind_of(meta.mode())
        };
        return Err(io(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("not a regular file ({kind}): inputs are read from regular files"),
        )));
    }
    Ok((file, meta))
}

/// A file's bytes, read once into memory the session shares (never copied again). Only
/// a regular file is read ([`open_input`]), and no more than its size when opened.
pub(crate) fn read_file(path: &Path) -> Result<Arc<dyn AsRef<[u8]> + Send + Sync>, Error> {
    let io = |source| Error::Io {
        path: path.to_path_buf(),
        source,
    };
    let (file, meta) = open_input(path)?;
    let mut bytes = Vec::with_capacity(usize::try_from(meta.len()).unwrap_or(0));
    std::io::Read::read_to_end(&mut std::io::Read::take(&file, meta.len()), &mut bytes)
        .map_err(io)?;
    Ok(Arc::new(bytes))
}

/// A file's bytes, shared: mapped when it is large (an archive: never copied, pages read
/// as the link touches them), read when it is small — for a short-lived tool that adds
/// them with [`Input::object_shared`](crate::Input::object_shared) or
/// [`Input::archive_shared`](crate::Input::archive_shared) (`kiln run` does).
///
/// A mapped file must not change while the session may read it: one rewritten in place
/// gives the link inconsistent bytes, and one truncated makes a later read of its pages
/// fault (`SIGBUS`). [`Input::file`](crate::Input::file) and the other file inputs read
/// files instead.
pub fn map_file(path: &Path) -> Result<Arc<dyn AsRef<[u8]> + Send + Sync>, Error> {
    let io = |source| Error::Io {
        path: path.to_path_buf(),
        source,
    };
    // A regular file only: a device, a FIFO, a /proc file is refused at once.
    let (file, meta) = open_input(path)?;
    let len = meta.len();
    if len < 64 << 10 {
        let mut bytes = Vec::with_capacity(len as usize);
        std::io::Read::read_to_end(&mut std::io::Read::take(&file, len), &mut bytes).map_err(io)?;
        return Ok(Arc::new(bytes));
    }
    // SAFETY: a private read-only mapping of a file Kiln only reads. Link inputs are build
    // outputs that nothing writes while they are linked; one rewritten under a link reads
    // as inconsistent bytes, which the linker checks like any input (bounds, tables), and
    // one truncated under it would fault — the same contract every linker that maps its
    // inputs (mold, lld) has.
    let map = unsafe { memmap2::Mmap::map(&file) }.map_err(io)?;
    Ok(Arc::new(map))
}

/// Bytes the caller lends the session (a memory-mapped file, a compiler's buffer): the
/// linker's own name for them.
pub use kiln_link::SharedBytes;

/// The first bytes of shared file contents.
pub(crate) fn starts_with(bytes: &Arc<dyn AsRef<[u8]> + Send + Sync>, prefix: &[u8]) -> bool {
    (**bytes).as_ref().starts_with(prefix)
}

impl Jit {
    /// Adds a relocatable object whose bytes the caller lends for as long as the session
    /// needs them (a memory-mapped file, a buffer of a compiler): never copied.
    pub(crate) fn add_object_shared(
        &self,
        lib: LibraryId,
        name: &str,
        bytes: Arc<dyn AsRef<[u8]> + Send + Sync>,
    ) -> Result<(), Error> {
        self.add_input(lib, ObjectInput::shared(name, bytes))
    }

    /// Adds relocatable objects whose bytes the caller lends (as
    /// `Input::object_shared` does one), checked together: on every core when they are
    /// several and large. All are added, in their order, or none: the error names the
    /// first bad one.
    pub(crate) fn add_objects_shared(
        &self,
        lib: LibraryId,
        objects: Vec<(String, SharedBytes)>,
    ) -> Result<(), Error> {
        let mut inputs: Vec<ObjectInput> = objects
            .into_iter()
            .map(|(name, bytes)| ObjectInput::shared(name, bytes))
            .collect();
        // With an image cache, the objects are parsed by the link, if one runs: a module
        // mapped from its image reads none of them.
        if self.inner.image_cache.is_none() {
            kiln_link::check_objects(&mut inputs, self.inner.architecture)?;
        }
        for input in &inputs {
            check_format(self.inner.target_os, &input.name, input.bytes())?;
            if self.inner.target_os == crate::executor::TargetOs::Windows {
                refuse_thread_locals(&input.name, input.bytes())?;
            }
        }
        self.library_data(lib)?.state.write().pending.extend(inputs);
        Ok(())
    }

    pub(crate) fn add_input(&self, lib: LibraryId, mut input: ObjectInput) -> Result<(), Error> {
        // The parse is kept for the link: one parse per object (with an image cache, the
        // link parses it, if one runs).
        if self.inner.image_cache.is_none() {
            input.check(self.inner.architecture)?;
        }
        check_format(self.inner.target_os, &input.name, input.bytes())?;
        if self.inner.target_os == crate::executor::TargetOs::Windows {
            refuse_thread_locals(&input.name, input.bytes())?;
        }
        self.library_data(lib)?.state.write().pending.push(input);
        Ok(())
    }

    /// Reads an input file, remembered for an image's key ([`Jit::add_image_key_inputs`]).
    fn read_input(&self, path: &Path) -> Result<Arc<dyn AsRef<[u8]> + Send + Sync>, Error> {
        let bytes = read_file(path)?;
        self.inner
            .files_read
            .lock()
            .push((path.to_path_buf(), bytes.clone()));
        Ok(bytes)
    }

    /// Adds to an image's key what the session knows the link will read: the target, every
    /// file the session read an input from (objects, archives, the archives `-l` found,
    /// `libc_nonshared.a`), every file mapped in this process (the linker's own
    /// executable and libraries, inputs mapped by the caller), and — for an executor
    /// process — every file mapped in it (its executable, the shared libraries host
    /// symbols come from), read once it has started. The caller adds what only it knows:
    /// inputs given as bytes, options, and the modules linked earlier whose definitions
    /// the link uses (see [`Jit::link_pending_cached`]).
    ///
    /// An error for an executor whose mapped files cannot be read (one reached over TCP,
    /// another user's): its links cannot be keyed, and go without the image cache.
    pub fn add_image_key_inputs(&self, key: &mut kiln_cache::ImageKeyBuilder) -> Result<(), Error> {
        let io = |e: kiln_cache::CacheError| Error::Unsupported(format!("an image key: {e}"));
        key.text("architecture", &self.inner.architecture.to_string());
        let files = self.inner.files_read.lock().clone();
        for (path, bytes) in files {
            key.file_read(&path, (*bytes).as_ref()).map_err(io)?;
        }
        key.mapped_files().map_err(io)?;
        let executor = &self.inner.executor;
        if executor.runs_in_this_process() {
            return Ok(());
        }
        // Its hello comes once its dynamic loader has mapped its libraries.
        executor.wait_started()?;
        let pid = executor.local_pid().ok_or_else(|| {
            Error::Unsupported(
                "an image key: the executor is no process this machine names (reached over TCP): its mapped files cannot be read"
                    .into(),
            )
        })?;
        key.text("executor", "another process");
        key.mapped_files_of(pid).map_err(io)?;
        Ok(())
    }

    /// Adds a relocatable object file.
    pub(crate) fn add_object_file(
        &self,
        lib: LibraryId,
        path: impl AsRef<Path>,
    ) -> Result<(), Error> {
        let path = path.as_ref();
        let bytes = self.read_input(path)?;
        self.add_object_shared(lib, &path.display().to_string(), bytes)
    }

    /// A lazy object of bytes the caller lends (never copied).
    pub(crate) fn add_lazy_object_shared(
        &self,
        lib: LibraryId,
        name: &str,
        bytes: Arc<dyn AsRef<[u8]> + Send + Sync>,
    ) -> Result<(), Error> {
        self.add_lazy_input(lib, ObjectInput::shared(name, bytes))
    }

    pub(crate) fn add_lazy_input(&self, lib: LibraryId, input: ObjectInput) -> Result<(), Error> {
        let symbols = kiln_link::scan_symbols(&input.name, input.bytes(), self.inner.architecture)?;
        let library = self.library_data(lib)?;
        let mut state = library.state.write();
        state.hash_pending();
        for name in &symbols.defined {
            let previous = match (state.index.get(&**name), state.lazy.get(&**name)) {
                (Some(d), _) => describe(&state, d),
                (None, Some(&slot)) => match &state.lazy_objects[slot] {
                    Some(o) if o.symbols.defined.contains(name) => {
                        format!("lazy object {}", o.input.name)
                    }
                    _ => continue, // a weak definition gives way
                },
                (None, None) => continue,
            };
            return Err(Error::Redefinition {
                symbol: name.to_string(),
                library: library.name.clone(),
                previous,
                new: input.name.clone(),
            });
        }
        let slot = state.lazy_objects.len();
        for name in &symbols.defined {
            state.lazy.insert(kiln_link::Name::from(&**name), slot);
        }
        for name in &symbols.weak {
            state
                .lazy
                .entry(kiln_link::Name::from(&**name))
                .or_insert(slot);
        }
        state.lazy_objects.push(Some(LazyObject { input, symbols }));
        Ok(())
    }

    /// The number of lazy objects of `lib` not linked yet.
    pub(crate) fn lazy_objects_pending(&self, lib: LibraryId) -> Result<usize, Error> {
        let library = self.library_data(lib)?;
        let state = library.state.read();
        Ok(state.lazy_objects.iter().filter(|o| o.is_some()).count())
    }

    /// Adds a static archive whose bytes the caller lends (a memory-mapped file): never
    /// copied, its members linked share them.
    pub(crate) fn add_archive_shared(
        &self,
        lib: LibraryId,
        name: &str,
        bytes: Arc<dyn AsRef<[u8]> + Send + Sync>,
    ) -> Result<(), Error> {
        // With an image cache, the archive is read by the link that needs a member, if
        // one runs: a module mapped from its image reads none.
        let archive = if self.inner.image_cache.is_some() {
            ArchiveInput::deferred(name, bytes)
        } else {
            ArchiveInput::parse_shared(name, bytes)?
        };
        self.push_archive(lib, archive)
    }

    pub(crate) fn push_archive(&self, lib: LibraryId, archive: ArchiveInput) -> Result<(), Error> {
        let library = self.library_data(lib)?;
        let mut state = library.state.write();
        let mut archives = (*state.archives).clone();
        archives.push(archive);
        state.archives = Arc::new(archives);
        Ok(())
    }

    /// Adds a static archive file.
    pub(crate) fn add_archive_file(
        &self,
        lib: LibraryId,
        path: impl AsRef<Path>,
    ) -> Result<(), Error> {
        let path = path.as_ref();
        let bytes = self.read_input(path)?;
        self.add_archive_shared(lib, &path.display().to_string(), bytes)
    }

    /// Adds an object or an archive, by its contents.
    pub(crate) fn add_file(&self, lib: LibraryId, path: impl AsRef<Path>) -> Result<(), Error> {
        let path = path.as_ref();
        let bytes = self.read_input(path)?;
        if starts_with(&bytes, b"!<arch>\n") {
            self.add_archive_shared(lib, &path.display().to_string(), bytes)
        } else if starts_with(&bytes, b"\x7fELF") {
            self.add_object_shared(lib, &path.display().to_string(), bytes)
        } else {
            Err(Error::UnknownInput {
                path: path.to_path_buf(),
            })
        }
    }

    /// Compiles and adds a source (`Library::compile`), also giving the object's key in the object cache (the
    /// signature of what made it: a [`kiln_cache::ImageKeyBuilder`] names the source by
    /// it); `None` without an object cache.
    pub(crate) fn add_source_keyed(
        &self,
        lib: LibraryId,
        path: impl AsRef<Path>,
        flags: &[String],
    ) -> Result<(bool, Option<kiln_cache::CacheKey>), Error> {
        let path = path.as_ref();
        let outcome = kiln_cache::compile_cached(
            &*self.inner.compiler,
            self.inner.object_cache.as_deref(),
            path,
            flags,
        )
        .map_err(|e| Error::Compile(e.to_string()))?;
        // The cache's bytes as they are (an entry's mapping): no copy.
        self.add_input(
            lib,
            ObjectInput::shared(path.display().to_string(), outcome.object.into_shared()),
        )?;
        let key = self.inner.object_cache.is_some().then_some(outcome.key);
        Ok((outcome.hit, key))
    }

    /// Adds a generator for names `lib` does not define.
    pub(crate) fn add_generator(
        &self,
        lib: LibraryId,
        generator: Box<dyn SymbolGenerator>,
    ) -> Result<(), Error> {
        self.library_data(lib)?
            .generators
            .lock()
            .list
            .push(generator);
        Ok(())
    }

    /// Resolves what `lib` does not define from the executor's process symbols (this
    /// process's, for the in-process executor).
    ///
    /// A function of the host program itself (not of a library it loaded) is among them
    /// only if the program exports it: link the host with `-rdynamic` (`-Wl,-E`; for a
    /// Rust host, `-C link-args=-rdynamic` or `-C link-arg=-Wl,--export-dynamic-symbol=NAME`),
    /// or hand the function to the session with [`Library::define_symbol`](crate::Library::define_symbol).
    ///
    /// The C library's few functions that a native link takes from `libc_nonshared.a`
    /// rather than `libc.so.6` — `atexit`, `at_quick_exit`, `pthread_atfork` — are linked
    /// from that archive into the module that calls them, as a native link does, so that
    /// their handlers belong to the calling module (its own `__dso_handle`) and run when
    /// it is removed.
    ///
    /// For a Windows executor the process symbols are those of its C runtime's DLLs and
    /// of the DLLs loaded since (no `libc_nonshared.a`).
    pub(crate) fn add_process_symbols(&self, lib: LibraryId) -> Result<(), Error> {
        // The executor's architecture's archive (Debian multiarch).
        let dirs = if self.inner.target_os == crate::executor::TargetOs::Linux {
            search_dirs_for(self.inner.architecture)
        } else {
            Vec::new()
        };
        let found = dirs
            .into_iter()
            .map(|d| d.join("libc_nonshared.a"))
            .find(|p| p.is_file());
        if let Some(path) = found {
            if let Err(error) = self.add_archive_file(lib, &path) {
                tracing::debug!(%error, "libc_nonshared.a not used");
            }
        }
        self.add_generator(
            lib,
            Box::new(ExecutorSymbols {
                executor: self.inner.executor.clone(),
                library: 0,
                name: "process symbols".into(),
            }),
        )
    }

    /// `-l name`: finds the library in `dirs` and then the system directories; adds an
    /// archive, or opens a shared library in the executor (following GNU ld scripts) as a
    /// generator.
    pub(crate) fn add_library_by_name(
        &self,
        lib: LibraryId,
        name: &str,
        dirs: &[PathBuf],
    ) -> Result<(), Error> {
        if self.inner.target_os == crate::executor::TargetOs::Windows {
            // What mingw's driver links by default is the executor's process already: its
            // C runtime (with libmingwex's C99 functions) and libgcc.
            const PROVIDED: [&str; 8] = [
                "c", "m", "pthread", "mingw32", "mingwex", "msvcrt", "gcc", "moldname",
            ];
            if PROVIDED.contains(&name) {
                return Ok(());
            }
            // `libNAME.a` of objects for Windows, in the directories given (-L).
            if let Some(archive) = dirs
                .iter()
                .map(|d| d.join(format!("lib{name}.a")))
                .find(|p| p.is_file())
            {
                return self.add_archive_file(lib, archive);
            }
            // Else `-lNAME` is `NAME.dll`, found by the executor's own search (LoadLibrary).
            let dll = if name.to_ascii_lowercase().ends_with(".dll") {
                name.to_string()
            } else {
                format!("{name}.dll")
            };
            let handle = self.inner.executor.load_library(&dll)?;
            return self.add_generator(
                lib,
                Box::new(ExecutorSymbols {
                    executor: self.inner.executor.clone(),
                    library: handle,
                    name: dll,
                }),
            );
        }
        let mut all = dirs.to_vec();
        all.extend(search_dirs_for(self.inner.architecture));
        for file in find_library(name, &all)? {
            match file {
                LibraryFile::Archive(path) => self.add_archive_file(lib, path)?,
                LibraryFile::Shared(path) => self.add_shared_library(lib, &path)?,
            }
        }
        Ok(())
    }

    /// Loads the shared library at `path` in the executor and resolves what `lib` does
    /// not define from it (a `.so` given as an input, as a linker takes one).
    pub(crate) fn add_shared_library(&self, lib: LibraryId, path: &Path) -> Result<(), Error> {
        // A relative path is the caller's (dlopen would search the system's directories).
        let path = std::fs::canonicalize(path)
            .unwrap_or_else(|_| path.to_path_buf())
            .display()
            .to_string();
        let handle = self.inner.executor.load_library(&path)?;
        self.add_generator(
            lib,
            Box::new(ExecutorSymbols {
                executor: self.inner.executor.clone(),
                library: handle,
                name: path,
            }),
        )
    }
}

/// Refuses an ELF object with thread-local sections for a Windows executor: its code
/// reaches them the ELF way (`%fs`, `__tls_get_addr`), which Windows has no equivalent
/// of. (A COFF object's thread-locals are placed in the executor's static TLS.)
fn refuse_thread_locals(name: &str, bytes: &[u8]) -> Result<(), Error> {
    if kiln_link::is_coff(bytes) {
        return Ok(());
    }
    match kiln_link::thread_local_section(bytes, kiln_link::Architecture::X86_64) {
        Some(section) => Err(Error::Unsupported(format!(
            "{name}: section {section}: an ELF object's thread-locals are not supported on Windows executors (compile for x86_64-w64-windows-gnu: a COFF object's are)"
        ))),
        None => Ok(()),
    }
}

/// Checks an object's format against the executor's system: a COFF object (Windows') is
/// refused for an executor that runs Linux, before anything is linked.
fn check_format(
    target_os: crate::executor::TargetOs,
    name: &str,
    bytes: &[u8],
) -> Result<(), Error> {
    if target_os != crate::executor::TargetOs::Windows && kiln_link::is_coff(bytes) {
        return Err(Error::Unsupported(format!(
            "{name}: a COFF object (Windows'), but the executor runs Linux: compile for it (an ELF object, `cc -c`)"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{map_file, read_file};
    use std::path::Path;

    /// Both readers refuse `path`, naming it and `kind` (a reader that blocked would hang
    /// the test: it is not timed, which a busy machine could fail).
    fn refused(path: &Path, kind: &str) {
        for result in [read_file(path).map(|_| ()), map_file(path).map(|_| ())] {
            let error = result.expect_err("not a regular file").to_string();
            assert!(
                error.starts_with(&format!("{}: not a regular file ({kind})", path.display())),
                "{error}"
            );
        }
    }

    #[test]
    fn inputs_that_are_not_regular_files_are_refused_unread() {
        refused(Path::new("/dev/zero"), "a character device");
        refused(Path::new("/proc/self/status"), "a /proc file");
        let dir = std::env::temp_dir().join(format!("kiln-inputs-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        refused(&dir, "a directory");
        let fifo = dir.join("fifo.o");
        let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: mkfifo with a valid C string.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        // No writer: an open that blocked would never return.
        refused(&fifo, "a FIFO");
        // A regular file is read whole.
        let file = dir.join("file.o");
        std::fs::write(&file, b"\x7fELF bytes").unwrap();
        assert_eq!((*read_file(&file).unwrap()).as_ref(), b"\x7fELF bytes");
        assert_eq!((*map_file(&file).unwrap()).as_ref(), b"\x7fELF bytes");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
