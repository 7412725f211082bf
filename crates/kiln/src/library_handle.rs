//! A library's handle, [`Library`], and what it is given, [`Input`]: one call,
//! [`Library::add`], for every kind of input.

use crate::generator::SymbolGenerator;
use crate::inputs::SharedBytes;
use crate::jit::Jit;
use crate::library::LibraryId;
use crate::module::Module;
use crate::Error;
use std::path::PathBuf;
use std::sync::Arc;

/// What a library is given: relocatable objects (now or lazily), static archives, files
/// of either, symbol generators, the executor's process symbols and shared libraries.
/// Added with [`Library::add`]; a C or C++ source is compiled and added with
/// [`Library::compile`].
///
/// Bytes given to [`Input::object`] and its kind are copied once into memory the session
/// keeps (an `Arc<[u8]>` is shared, not copied); the `_shared` constructors take bytes
/// the caller lends (a memory-mapped file, a compiler's buffer) for as long as the
/// session needs them, never copied.
///
/// ```no_run
/// # fn main() -> Result<(), kiln::Error> {
/// use kiln::Input;
/// let jit = kiln::Jit::new()?;
/// let lib = jit.library(jit.main_library());
/// lib.add(Input::object_file("add.o"))?;
/// lib.add(Input::archive_file("/usr/lib/x86_64-linux-gnu/libz.a"))?;
/// lib.add(Input::process_symbols())?;
/// # Ok(()) }
/// ```
#[non_exhaustive]
pub enum Input {
    /// A relocatable object, linked with the library's next link.
    Object {
        /// The name errors and debuggers give it.
        name: String,
        /// Its bytes.
        bytes: SharedBytes,
    },
    /// Relocatable objects checked together (on every core when they are several and
    /// large): all are added, in their order, or none, the error naming the first bad one.
    Objects(Vec<(String, SharedBytes)>),
    /// A relocatable object added lazily: only its symbol table is read now, and it is
    /// linked — as part of the link that needs it — when one of the names it defines is
    /// first looked up in the library or needed by a link that searches it. An object
    /// nobody needs is never linked (nor is the rest of it read: a malformed section is
    /// reported by the link that needs it, and the object then stays lazy).
    ///
    /// Lazy objects that need each other are linked together, as archive members are. A
    /// link of a library takes the lazy objects its inputs need from it; a lazy object of
    /// a library in the search order is linked into that library, as a module of its
    /// own. An error if the library (or one of its lazy objects) already defines a name
    /// the object defines (weak definitions excepted).
    LazyObject {
        /// The name errors and debuggers give it.
        name: String,
        /// Its bytes.
        bytes: SharedBytes,
    },
    /// A static archive: its members are linked when they define a symbol a link needs.
    Archive {
        /// The name errors give it.
        name: String,
        /// Its bytes (members linked share them).
        bytes: SharedBytes,
    },
    /// A file holding a relocatable object.
    ObjectFile(PathBuf),
    /// A file holding a static archive.
    ArchiveFile(PathBuf),
    /// A file holding an object or an archive, told apart by its contents.
    File(PathBuf),
    /// A generator for names the library does not define.
    Generator(Box<dyn SymbolGenerator>),
    /// The executor's process symbols (this process's, for the in-process executor) for
    /// what the library does not define.
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
    ProcessSymbols,
    /// `-l name`: the library found in `dirs` and then the system directories; an
    /// archive is added, a shared library (following GNU ld scripts) opened in the
    /// executor as a generator.
    LibraryByName {
        /// The `name` of `-lname`.
        name: String,
        /// Directories searched first (`-L`).
        dirs: Vec<PathBuf>,
    },
    /// A shared library loaded in the executor, resolving what the library does not
    /// define (a `.so` given as an input, as a linker takes one). With an executor still
    /// starting ([`Executor::start`](crate::Executor::start)) it is loaded after the
    /// executor's hello: a library that cannot be loaded is then the error of every link
    /// of the library, not of this `add` (see
    /// [`Executor::load_library`](crate::Executor::load_library)). So is a shared
    /// library `LibraryByName` finds.
    SharedLibrary(PathBuf),
}

impl Input {
    /// [`Input::Object`] of bytes the session keeps (copied once, unless an `Arc<[u8]>`).
    pub fn object(name: impl Into<String>, bytes: impl Into<Arc<[u8]>>) -> Input {
        Input::Object {
            name: name.into(),
            bytes: owned(bytes),
        }
    }

    /// [`Input::Object`] of bytes the caller lends (never copied).
    pub fn object_shared(name: impl Into<String>, bytes: SharedBytes) -> Input {
        Input::Object {
            name: name.into(),
            bytes,
        }
    }

    /// [`Input::Objects`]: objects whose bytes the caller lends, checked together.
    ///
    /// ```no_run
    /// # fn main() -> Result<(), kiln::Error> {
    /// let jit = kiln::Jit::new()?;
    /// let objects = ["a.o", "b.o"]
    ///     .into_iter()
    ///     .map(|path| Ok((path.to_string(), kiln::map_file(std::path::Path::new(path))?)))
    ///     .collect::<Result<Vec<_>, kiln::Error>>()?;
    /// jit.library(jit.main_library()).add(kiln::Input::Objects(objects))?;
    /// # Ok(()) }
    /// ```
    pub fn objects(objects: Vec<(String, SharedBytes)>) -> Input {
        Input::Objects(objects)
    }

    /// [`Input::LazyObject`] of bytes the session keeps.
    ///
    /// ```no_run
    /// # fn main() -> Result<(), kiln::Error> {
    /// use kiln::Input;
    /// let jit = kiln::Jit::new()?;
    /// let lib = jit.main_library();
    /// jit.library(lib).add(Input::process_symbols())?;
    /// for path in ["a.o", "b.o", "c.o"] {
    ///     jit.library(lib).add(Input::lazy_object(path, std::fs::read(path).unwrap()))?;
    /// }
    /// // Links a.o only (and what a.o needs): b.o and c.o stay unread.
    /// let f = jit.lookup(lib, "defined_in_a")?;
    /// # Ok(()) }
    /// ```
    pub fn lazy_object(name: impl Into<String>, bytes: impl Into<Arc<[u8]>>) -> Input {
        Input::LazyObject {
            name: name.into(),
            bytes: owned(bytes),
        }
    }

    /// [`Input::LazyObject`] of bytes the caller lends.
    pub fn lazy_object_shared(name: impl Into<String>, bytes: SharedBytes) -> Input {
        Input::LazyObject {
            name: name.into(),
            bytes,
        }
    }

    /// [`Input::Archive`] of bytes the session keeps.
    pub fn archive(name: impl Into<String>, bytes: impl Into<Arc<[u8]>>) -> Input {
        Input::Archive {
            name: name.into(),
            bytes: owned(bytes),
        }
    }

    /// [`Input::Archive`] of bytes the caller lends (a memory-mapped file): never copied.
    pub fn archive_shared(name: impl Into<String>, bytes: SharedBytes) -> Input {
        Input::Archive {
            name: name.into(),
            bytes,
        }
    }

    /// [`Input::ObjectFile`].
    pub fn object_file(path: impl Into<PathBuf>) -> Input {
        Input::ObjectFile(path.into())
    }

    /// [`Input::ArchiveFile`].
    pub fn archive_file(path: impl Into<PathBuf>) -> Input {
        Input::ArchiveFile(path.into())
    }

    /// [`Input::File`]: an object or an archive, by its contents.
    pub fn file(path: impl Into<PathBuf>) -> Input {
        Input::File(path.into())
    }

    /// [`Input::Generator`].
    pub fn generator(generator: impl SymbolGenerator + 'static) -> Input {
        Input::Generator(Box::new(generator))
    }

    /// [`Input::ProcessSymbols`].
    pub fn process_symbols() -> Input {
        Input::ProcessSymbols
    }

    /// [`Input::LibraryByName`]: `-l name` with `-L` directories `dirs`.
    pub fn library_by_name(name: impl Into<String>, dirs: &[PathBuf]) -> Input {
        Input::LibraryByName {
            name: name.into(),
            dirs: dirs.to_vec(),
        }
    }

    /// [`Input::SharedLibrary`].
    pub fn shared_library(path: impl Into<PathBuf>) -> Input {
        Input::SharedLibrary(path.into())
    }
}

impl std::fmt::Debug for Input {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let len = |bytes: &SharedBytes| (**bytes).as_ref().len();
        match self {
            Input::Object { name, bytes } => write!(f, "Object({name}, {} bytes)", len(bytes)),
            Input::Objects(list) => write!(f, "Objects({} objects)", list.len()),
            Input::LazyObject { name, bytes } => {
                write!(f, "LazyObject({name}, {} bytes)", len(bytes))
            }
            Input::Archive { name, bytes } => write!(f, "Archive({name}, {} bytes)", len(bytes)),
            Input::ObjectFile(path) => write!(f, "ObjectFile({})", path.display()),
            Input::ArchiveFile(path) => write!(f, "ArchiveFile({})", path.display()),
            Input::File(path) => write!(f, "File({})", path.display()),
            Input::Generator(_) => f.write_str("Generator"),
            Input::ProcessSymbols => f.write_str("ProcessSymbols"),
            Input::LibraryByName { name, dirs } => write!(f, "LibraryByName({name}, {dirs:?})"),
            Input::SharedLibrary(path) => write!(f, "SharedLibrary({})", path.display()),
        }
    }
}

/// Bytes the session keeps, shared from here on.
fn owned(bytes: impl Into<Arc<[u8]>>) -> SharedBytes {
    let bytes: Arc<[u8]> = bytes.into();
    Arc::new(bytes)
}

/// A library of a [`Jit`], borrowed from it: where its inputs are added
/// ([`Jit::library`]). The library's id, [`LibraryId`], is what a program keeps; a
/// handle is made from it when needed (it costs nothing).
///
/// ```
/// # fn main() -> Result<(), kiln::Error> {
/// let jit = kiln::Jit::new()?;
/// let lib = jit.library(jit.main_library());
/// lib.add(kiln::Input::process_symbols())?;
/// assert_ne!(jit.lookup(lib.id(), "strlen")?, 0);
/// # Ok(()) }
/// ```
#[derive(Clone, Copy)]
pub struct Library<'j> {
    jit: &'j Jit,
    id: LibraryId,
}

/// What [`Library::compile`] did: where the object came from, and its key.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Compiled {
    /// The object came from the session's object cache (not compiled again).
    pub from_cache: bool,
    /// The object's key in the object cache (the signature of what made it: a
    /// [`kiln_cache::ImageKeyBuilder`] names the source by it); `None` without an
    /// object cache.
    pub key: Option<kiln_cache::CacheKey>,
}

impl Jit {
    /// The handle of library `id`, where its inputs are added. An id of another session
    /// is an error when the handle is used, not here.
    pub fn library(&self, id: LibraryId) -> Library<'_> {
        Library { jit: self, id }
    }
}

impl<'j> Library<'j> {
    /// The library's id.
    pub fn id(&self) -> LibraryId {
        self.id
    }

    /// Adds `input` to the library: see [`Input`] for what each kind does. Objects and
    /// archives are checked now (a truncated or corrupt object, a wrong architecture is an
    /// error naming it) — with an image cache, by the link that reads them, if one runs —
    /// and linked by the library's next link; nothing is added when an error is returned.
    pub fn add(&self, input: Input) -> Result<(), Error> {
        let (jit, lib) = (self.jit, self.id);
        match input {
            Input::Object { name, bytes } => jit.add_object_shared(lib, &name, bytes),
            Input::Objects(objects) => jit.add_objects_shared(lib, objects),
            Input::LazyObject { name, bytes } => jit.add_lazy_object_shared(lib, &name, bytes),
            Input::Archive { name, bytes } => jit.add_archive_shared(lib, &name, bytes),
            Input::ObjectFile(path) => jit.add_object_file(lib, path),
            Input::ArchiveFile(path) => jit.add_archive_file(lib, path),
            Input::File(path) => jit.add_file(lib, path),
            Input::Generator(generator) => jit.add_generator(lib, generator),
            Input::ProcessSymbols => jit.add_process_symbols(lib),
            Input::LibraryByName { name, dirs } => jit.add_library_by_name(lib, &name, &dirs),
            Input::SharedLibrary(path) => jit.add_shared_library(lib, &path),
        }
    }

    /// Compiles a C or C++ source with the session's compiler and `flags` (through its
    /// object cache, if it has one: an entry whose signature does not match this compile
    /// is never loaded) and adds the object to the library.
    pub fn compile(
        &self,
        path: impl AsRef<std::path::Path>,
        flags: &[String],
    ) -> Result<Compiled, Error> {
        let (from_cache, key) = self.jit.add_source_keyed(self.id, path, flags)?;
        Ok(Compiled { from_cache, key })
    }

    /// How many of the library's lazy objects ([`Input::LazyObject`]) are not linked yet.
    pub fn lazy_objects_pending(&self) -> Result<usize, Error> {
        self.jit.lazy_objects_pending(self.id)
    }

    /// Defines `name` in the library at `address` (a host function or data). An error if
    /// the library defines `name` already.
    pub fn define_symbol(&self, name: &str, address: u64) -> Result<(), Error> {
        self.jit.define_symbol(self.id, name, address)
    }

    /// The libraries searched, in order, for what this one does not define.
    pub fn set_search_order(&self, order: &[LibraryId]) -> Result<(), Error> {
        self.jit.set_search_order(self.id, order)
    }

    /// The library's name (as [`Jit::create_library`] was given it).
    pub fn name(&self) -> Result<String, Error> {
        self.jit.library_name(self.id)
    }

    /// The library's live modules, oldest first: its linked modules (call-through stubs
    /// among them) and the current bodies of its lazy functions (which are in no index:
    /// removing the stubs' module takes them with it).
    pub fn modules(&self) -> Result<Vec<Module>, Error> {
        self.jit.modules(self.id)
    }

    /// The module of the library that defines `name`, if a module does.
    pub fn module_of(&self, name: &str) -> Result<Option<Module>, Error> {
        self.jit.module_of(self.id, name)
    }
}

impl std::fmt::Debug for Library<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Library").field("id", &self.id).finish()
    }
}
