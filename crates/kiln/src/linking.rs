//! The links a session's users ask for: an object linked at once (copied or lent), what
//! is pending in a library, the body of a lazy function, and a module placed in memory
//! without a link (call-through stubs). Each is one [`crate::link_job`].

use crate::jit::Jit;
use crate::library::LibraryId;
use crate::link_job::LinkReport;
use crate::link_request::LinkRequest;
use crate::module::Module;
use crate::Error;
use kiln_link::ObjectInput;
use std::sync::Arc;

impl Jit {
    /// Links the body of a lazy function: `object`, which must define `name`, resolved as
    /// `lib` resolves names, published nowhere. Its address and module.
    pub(crate) fn link_body(
        &self,
        lib: LibraryId,
        name: &str,
        object: Vec<u8>,
    ) -> Result<(u64, Module), Error> {
        // Linked alone: a bad object fails only its own link.
        let input = ObjectInput::new(format!("{name} (body)"), object);
        let (module, _) = self
            .link(lib, LinkRequest::body(input))?
            .ok_or_else(|| Error::SymbolNotFound(name.to_string()))?;
        let address = module.symbol(name).ok_or_else(|| Error::LazyCompile {
            function: name.to_string(),
            source: "the compiled object does not define it".into(),
        })?;
        Ok((address, module))
    }

    /// Adds and links one object at once: its module (or the link's error, the library
    /// left as it was). Objects added before and not linked yet are linked with it.
    pub fn link_object(
        &self,
        lib: LibraryId,
        name: &str,
        bytes: impl Into<Arc<[u8]>>,
    ) -> Result<Module, Error> {
        let input = ObjectInput::new(name, bytes);
        // Linked under the library's link lock with what is pending, so that a concurrent
        // lookup's link cannot take it away (checked first when there is something pending:
        // a bad object must not fail a link of good ones).
        match self.link(lib, LinkRequest::module().with(input))? {
            Some((module, _)) => Ok(module),
            None => Err(Error::Executor("nothing was linked".into())),
        }
    }

    /// As [`Jit::link_object`], with bytes the caller lends for as long as the session
    /// needs them (a compiler's buffer, a memory-mapped file): never copied.
    ///
    /// ```
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # if !cfg!(target_arch = "x86_64") { return Ok(()); }
    /// use std::sync::Arc;
    /// let jit = kiln::Jit::new()?;
    /// let lib = jit.main_library();
    /// let object: Arc<Vec<u8>> = Arc::new(kiln::lazy::testing::constant_function("seven", 7));
    /// let module = jit.link_object_shared(lib, "seven.o", object)?;
    /// assert!(module.symbol("seven").is_some());
    /// # Ok(()) }
    /// ```
    pub fn link_object_shared(
        &self,
        lib: LibraryId,
        name: &str,
        bytes: Arc<dyn AsRef<[u8]> + Send + Sync>,
    ) -> Result<Module, Error> {
        let input = ObjectInput::shared(name, bytes);
        match self.link(lib, LinkRequest::module().with(input))? {
            Some((module, _)) => Ok(module),
            None => Err(Error::Executor("nothing was linked".into())),
        }
    }

    /// Links `input` alone into a module of `lib` kept out of the library's index: its
    /// undefined names resolve as `lib` resolves them (the library's definitions, its
    /// generators, the process's symbols), but its own definitions are reached only
    /// through the returned handle ([`Module::symbol`]) — no later link or lookup binds to
    /// them, and another private module may define the same names. What is pending in
    /// `lib` stays pending. The module lives as long as a handle to it: when the last one
    /// is dropped its finalizers run, its unwind information is withdrawn, listeners are
    /// told, and its memory is freed and poisoned.
    ///
    /// For a front end with its own namespace (`kiln-cranelift`'s `KilnModule` resolves
    /// references between its functions itself, and frees them one batch at a time).
    pub fn link_private(&self, lib: LibraryId, input: ObjectInput) -> Result<Module, Error> {
        match self.link(lib, LinkRequest::body(input))? {
            Some((module, _)) => Ok(module),
            None => Err(Error::Executor("nothing was linked".into())),
        }
    }

    /// Links the objects added to `lib` since its last link (and the archive members they
    /// need) into a module, registers its unwind information and runs its initializers.
    /// Returns `None` if there was nothing to link.
    ///
    /// On failure the library is exactly as it was before the link: the objects of the
    /// failed link are dropped (add them again, corrected, to retry), no definition of
    /// theirs is published, their memory is freed.
    pub fn link_pending(&self, lib: LibraryId) -> Result<Option<(Module, LinkReport)>, Error> {
        self.link(
            lib,
            LinkRequest {
                times: true,
                ..LinkRequest::module()
            },
        )
    }

    /// [`Jit::link_pending`] through the session's image cache
    /// ([`JitBuilder::image_cache`](crate::JitBuilder::image_cache)): if it holds an image
    /// under `key`, the module is mapped from it — its code pages shared with every
    /// process that maps the same image, only the fields that depend on this process
    /// written — and published as a link would publish it (symbols, initializers,
    /// `.eh_frame`, thread-locals, removal); else the pending objects are linked and the
    /// image stored under `key`. [`LinkReport::image`] says which, and why an image was not
    /// used or stored.
    ///
    /// `key` must name everything the link reads: the objects and archives (their
    /// contents, or identities that change with them), the host libraries symbols resolve
    /// into, the options, and the modules linked earlier in the session whose definitions
    /// the link uses (an image binds to them by name, but which archive members it holds
    /// depends on what they defined). [`kiln_cache::ImageKeyBuilder`] makes one, and
    /// [`Jit::add_image_key_inputs`] adds what the session knows; `kiln run` shows how.
    /// A key that leaves an input out maps a stale image.
    ///
    /// Out of process the image is copied into the executor's memory and rebound there.
    /// The cache is not used (the link runs as [`Jit::link_pending`]'s) for a Windows
    /// executor, with a plugin that adds link passes, with gdb registration
    /// (gdb is given each object's debug information), or when the session has no image
    /// cache. Plugins are told of a mapped module with its symbols (every one, local ones
    /// too, as a link tells them) but no objects or sections: none was linked.
    pub fn link_pending_cached(
        &self,
        lib: LibraryId,
        key: &kiln_cache::CacheKey,
    ) -> Result<Option<(Module, LinkReport)>, Error> {
        self.link(
            lib,
            LinkRequest {
                times: true,
                image: Some(*key),
                ..LinkRequest::module()
            },
        )
    }
}
