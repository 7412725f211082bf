//! A link through the session's image cache ([`crate::Jit::link_pending_cached`]): map the
//! module's image if the cache has it (the fixups rebound in this process), else link it
//! relocatable — into one span, its fixups recorded — and store its image.
//!
//! Out of process the span is the executor's ([`kiln_memory::MapperSpanManager`] over the
//! executor's mapper): a relocatable link writes into it as any link does, and a cached
//! image is copied into it from the file (the executor cannot map the controller's file;
//! with shared memory the kernel copies file to memfd) and rebound there — no link runs
//! either way.

use crate::link_job::{LinkJob, Resolved};
use crate::plugin::Plugin;
use crate::resolve::SessionContext;
use crate::Error;
use kiln_cache::{CacheKey, ImageCache, ImageToStore};
use kiln_link::rebind;
use kiln_link::relocatable::RelocatableImage;
use kiln_memory::{FileSegment, MapperSpanManager, Placement};
use std::sync::Arc;
use std::time::Instant;

/// What a link through the image cache did.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ImageOutcome {
    /// The module was mapped from the cache: no link ran.
    Mapped {
        /// The image file.
        path: std::path::PathBuf,
        /// Fixups written (into the executor's memory, out of process).
        fixups: usize,
    },
    /// The module was linked and its image stored.
    Stored,
    /// The module was linked; its image was not stored (why: a module that cannot be an
    /// image, a full or read-only cache).
    NotStored(String),
    /// The cache was not consulted (why: a Windows executor, a plugin's link passes).
    Bypassed(String),
}

/// Linked modules, and images that failed to map, as the link reports them.
pub(crate) struct ImageLink {
    pub(crate) linked: kiln_link::LinkedModule,
    pub(crate) resolved: Resolved,
    pub(crate) outcome: ImageOutcome,
    /// Why an image found in the cache was not used (it failed to map or rebind).
    pub(crate) refused: Option<String>,
}

impl LinkJob<'_> {
    /// Why this link cannot go through the image cache, if it cannot.
    fn image_bypass(&self, plugins: &[Arc<dyn Plugin>]) -> Option<String> {
        let inner = &self.jit.inner;
        if inner.image_cache.is_none() {
            return Some("the session has no image cache".into());
        }
        if inner.target_os != crate::executor::TargetOs::Linux {
            return Some("the code runs on another system than Linux".into());
        }
        // Images are made and mapped for this machine's architecture only (another's
        // runs in an executor reached over TCP, which cannot be keyed anyway).
        if inner.architecture != kiln_link::Architecture::host() {
            return Some("the code is for another architecture".into());
        }
        if !inner.executor.runs_in_this_process() && inner.low_memory.mapper.is_none() {
            return Some("the executor's memory has no mapper to lay a span out in".into());
        }
        if plugins.iter().any(|p| !p.link_passes().is_empty()) {
            return Some("a plugin's passes run in every link".into());
        }
        if inner.gdb {
            return Some("gdb is given every object linked, with its debug information".into());
        }
        None
    }

    /// The link of `gathered` through the image cache under `key`.
    pub(crate) fn link_through_image_cache(
        &self,
        gathered: &crate::link_job::Gathered,
        plugins: &[Arc<dyn Plugin>],
        key: &CacheKey,
    ) -> Result<ImageLink, Error> {
        if let Some(why) = self.image_bypass(plugins) {
            let (linked, resolved) = self.link_objects(gathered, plugins, false)?;
            return Ok(ImageLink {
                linked,
                resolved,
                outcome: ImageOutcome::Bypassed(why),
                refused: None,
            });
        }
        let Some(cache) = self.jit.inner.image_cache.clone() else {
            unreachable!("image_bypass checked the cache");
        };
        let mut refused = None;
        let told = plugins.iter().any(|p| p.wants_symbols());
        match self.map_image(&*cache, key, told) {
            Ok(Some(link)) => return Ok(link),
            Ok(None) => {}
            Err(why) => {
                tracing::debug!(%why, "a cached image was not used");
                refused = Some(why);
            }
        }
        let (mut linked, resolved) = self.link_objects(gathered, plugins, true)?;
        let outcome = store(&*cache, key, &mut linked);
        Ok(ImageLink {
            linked,
            resolved,
            outcome,
            refused,
        })
    }

    /// The module mapped from the cache's image under `key`: `None` if there is none, an
    /// error (the caller links instead) if it cannot be used here. `told`: the session has
    /// plugins that are told of every symbol ([`Plugin::wants_symbols`]).
    fn map_image(
        &self,
        cache: &dyn ImageCache,
        key: &CacheKey,
        told: bool,
    ) -> Result<Option<ImageLink>, String> {
        let t = self.times.then(Instant::now);
        let Some(cached) = cache.get(key).map_err(|e| e.to_string())? else {
            return Ok(None);
        };
        let looked_up = t.map(|t| t.elapsed());
        let t = self.times.then(Instant::now);
        // The exports and relative words read where they lie in the mapped file (the
        // module's table keeps the mapping).
        let (file, description) = cached.description_in_place();
        let image = RelocatableImage::decode_in_place(file, description, told)
            .map_err(|e| format!("{}: {e}", cached.path.display()))?;
        let decoded = t.map(|t| t.elapsed());
        let t = self.times.then(Instant::now);
        let spans = self.remote_spans();
        let page = spans
            .as_ref()
            .map_or_else(kiln_memory::page_size, |spans| spans.page_size());
        if image.page != page || image.architecture != self.jit.inner.architecture {
            return Err(format!(
                "{}: made for pages of {} bytes on {}",
                cached.path.display(),
                image.page,
                image.architecture
            ));
        }
        // Plugins are told of every symbol of a module: an image stored without them (by a
        // session with no plugin) is linked again, and stored with them.
        if image.symbols.is_none() && told {
            return Err(format!(
                "{}: stored without the symbols this session's plugins are told of",
                cached.path.display()
            ));
        }
        let layout = image.layout().map_err(|e| e.to_string())?;
        let memory = match spans {
            // The executor cannot map this process's file: the segments are copied into
            // its memory (by the kernel, file to memfd, where the mapper can).
            Some(spans) => spans
                .allocate_from_file(&layout, &cached.file, &cached.segments)
                .map_err(|e| e.to_string()),
            None => {
                let segments: Vec<FileSegment> = cached
                    .segments
                    .iter()
                    .map(|&file_offset| FileSegment { file_offset })
                    .collect();
                kiln_memory::map_span_from_file(
                    &cached.file,
                    &layout,
                    &segments,
                    &Placement::HostLibraries,
                )
                .map_err(|e| e.to_string())
            }
        }
        .map_err(|e| format!("{}: {e}", cached.path.display()))?;
        let mapped = t.map(|t| t.elapsed());
        let t = self.times.then(Instant::now);
        let mut ctx = SessionContext::new(self.jit, self.library, self.publish);
        let fixups = image.fixups.len() + image.relative.len();
        let mut linked = rebind(image, memory, &mut ctx)
            .map_err(|e| format!("{}: {e}", cached.path.display()))?;
        if let (Some(looked_up), Some(decoded), Some(mapped), Some(t)) =
            (looked_up, decoded, mapped, t)
        {
            linked
                .pass_times
                .push(("image lookup (checked)".into(), looked_up));
            linked.pass_times.push(("image decode".into(), decoded));
            linked.pass_times.push(("map image".into(), mapped));
            linked.pass_times.push(("rebind".into(), t.elapsed()));
        }
        let resolved = Resolved {
            thread_atexit: ctx.thread_atexit,
            uses: ctx.uses.into_values().collect(),
            windows_unwind: Vec::new(),
        };
        Ok(Some(ImageLink {
            linked,
            resolved,
            outcome: ImageOutcome::Mapped {
                path: cached.path,
                fixups,
            },
            refused: None,
        }))
    }
}

impl LinkJob<'_> {
    /// Spans in the executor's memory, when the code runs in another process.
    pub(crate) fn remote_spans(&self) -> Option<MapperSpanManager> {
        let inner = &self.jit.inner;
        if inner.executor.runs_in_this_process() {
            return None;
        }
        let mapper = inner.low_memory.mapper.clone()?;
        Some(MapperSpanManager::new(mapper, Placement::HostLibraries))
    }
}

/// Stores the image of `linked` (a relocatable link's) under `key`.
fn store(
    cache: &dyn ImageCache,
    key: &CacheKey,
    linked: &mut kiln_link::LinkedModule,
) -> ImageOutcome {
    let image = match linked.relocatable.take() {
        Some(Ok(image)) => image,
        Some(Err(why)) => return ImageOutcome::NotStored(why),
        None => return ImageOutcome::NotStored("the link made no image".into()),
    };
    // Each segment's bytes, whole; none for zero-filled data. A segment whose bytes were
    // not kept whole is no image.
    let mut segments: Vec<Option<&[u8]>> = Vec::with_capacity(image.segments.len());
    for (i, &(len, permission)) in image.segments.iter().enumerate() {
        let bytes = linked.image.get(i).map_or(&[][..], |s| &s.bytes[..]);
        if bytes.len() as u64 == len && len > 0 {
            segments.push(Some(bytes));
        } else if bytes.is_empty() && (len == 0 || permission == kiln_memory::Permission::ReadWrite)
        {
            segments.push(None);
        } else {
            return ImageOutcome::NotStored(format!(
                "segment {i}: {} bytes kept of {len}",
                bytes.len()
            ));
        }
    }
    let description = image.encode();
    let stored = cache.put(
        key,
        &ImageToStore {
            description: &description,
            segments: &segments,
            page: image.page,
        },
    );
    // The copy is not needed any more.
    linked.image = Vec::new();
    match stored {
        Ok(()) => ImageOutcome::Stored,
        Err(e) => ImageOutcome::NotStored(e.to_string()),
    }
}
