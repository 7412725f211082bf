//! Spans in a [`Mapper`]'s memory: the layout of [`crate::SpanMemoryManager`] (each
//! allocation a range of its own, its segments on successive pages, so that what is
//! written into one can be stored and laid out again anywhere) in memory a mapper gives —
//! an executor process's, reached through the mapper's working view. For the linked-image
//! cache out of process: a relocatable link into the executor, and a cached image laid
//! out there again.
//!
//! W^X as the mapper keeps it: the working view is writable from [`Mapper::prepare`] on,
//! the target view takes each segment's final permission at [`Mapper::initialize`] (a
//! page-sharing mapper at prepare, never writable in the target).

use crate::allocation::{FinalizedBackend, InFlightBackend, WorkingSegment};
use crate::{
    AllocationRequest, InFlightAllocation, Mapper, MapperError, MemoryError, MemoryManager,
    Placement, Reservation, SegmentRange, SpanLayout,
};
use std::sync::Arc;

/// A memory manager giving each allocation a span of its own in `mapper`'s memory, placed
/// as `placement` asks; [`MapperSpanManager::allocate_layout`] lays out a span as a stored
/// image says.
pub struct MapperSpanManager {
    mapper: Arc<dyn Mapper>,
    placement: Placement,
}

impl std::fmt::Debug for MapperSpanManager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MapperSpanManager")
            .field("mapper", &self.mapper.name())
            .field("placement", &self.placement)
            .finish()
    }
}

impl MapperSpanManager {
    /// Spans in `mapper`'s memory, placed as `placement` asks.
    pub fn new(mapper: Arc<dyn Mapper>, placement: Placement) -> Self {
        MapperSpanManager { mapper, placement }
    }

    /// The page size of the mapper's target (what spans are laid out with).
    pub fn page_size(&self) -> u64 {
        self.mapper.page_size()
    }

    /// A span laid out as `layout` (made with this mapper's page size), every segment
    /// writable in the working view. A layout whose segments do not lie on pages of their
    /// own inside its length is refused.
    pub fn allocate_layout(&self, layout: &SpanLayout) -> Result<InFlightAllocation, MemoryError> {
        self.allocate_in(layout).map(|(allocation, _)| allocation)
    }

    /// [`MapperSpanManager::allocate_layout`], and the reservation the span is in.
    fn allocate_in(
        &self,
        layout: &SpanLayout,
    ) -> Result<(InFlightAllocation, Reservation), MemoryError> {
        let page = self.mapper.page_size();
        if layout.len == 0 || layout.len % page != 0 {
            return Err(MemoryError::InvalidConfiguration(format!(
                "a span of {:#x} bytes is not made of pages of {page:#x}",
                layout.len
            )));
        }
        let mut end_of_last = 0;
        for (i, &(offset, len, _)) in layout.segments.iter().enumerate() {
            let fits = offset % page == 0
                && offset >= end_of_last
                && offset.checked_add(len).is_some_and(|end| end <= layout.len);
            if !fits {
                return Err(MemoryError::InvalidConfiguration(format!(
                    "span segment {i} ({len:#x} bytes at {offset:#x}) is not on pages of its own inside the span ({:#x} bytes, pages of {page:#x})",
                    layout.len
                )));
            }
            end_of_last = (offset + len).next_multiple_of(page);
        }
        let error = |source| MemoryError::Mapper {
            mapper: self.mapper.name(),
            source,
        };
        // One page more, so that the span can move off an address whose low 32 bits are 0:
        // a span's code starts at its first byte, and libgcc's unwinder reads a function
        // there as removed (see `slab::unwinder_blind_spots`; SpanMemoryManager does the
        // same).
        let reservation = self
            .mapper
            .reserve(layout.len + page, &self.placement)
            .map_err(error)?;
        let base = if reservation.target % (1 << 32) == 0 {
            reservation.target + page
        } else {
            reservation.target
        };
        let backend = MapperSpanBackend {
            mapper: self.mapper.clone(),
            reservation,
        };
        let mut segments = Vec::with_capacity(layout.segments.len());
        for &(offset, len, permission) in &layout.segments {
            let target = base + offset;
            if len > 0 {
                let end = (target + len).next_multiple_of(page);
                // SAFETY: the reservation was just made by this mapper and is released
                // only by `backend`; `[target, end)` is page-aligned, inside it (checked
                // above) and on pages no other segment uses.
                let prepared =
                    unsafe { self.mapper.prepare(&reservation, target, end, permission) };
                if let Err(source) = prepared {
                    backend.release();
                    return Err(error(source));
                }
            }
            let working = reservation
                .working_address(target)
                .unwrap_or(std::ptr::NonNull::<u8>::dangling().as_ptr());
            segments.push(WorkingSegment::new(target, len, permission, working));
        }
        // SAFETY: each segment's working memory is `len` bytes of the reservation's working
        // view, prepared (writable) above, disjoint from the others (own pages), and owned by
        // this allocation alone until `backend` finalizes or releases it.
        let allocation = unsafe { InFlightAllocation::from_parts(segments, Box::new(backend)) };
        Ok((allocation, reservation))
    }
}

impl MapperSpanManager {
    /// A span laid out as `layout` holding `file`'s bytes: segment `i` from file offset
    /// `file_offsets[i]` (its length's worth), or zero-filled where that is `None` — a
    /// stored image laid out again in memory that cannot map the file (another
    /// process's). The mapper copies file to memory itself where it can
    /// ([`Mapper::copy_from_file`]); else the bytes are read into the working view.
    pub fn allocate_from_file(
        &self,
        layout: &SpanLayout,
        file: &std::fs::File,
        file_offsets: &[Option<u64>],
    ) -> Result<InFlightAllocation, MemoryError> {
        use std::os::unix::fs::FileExt;
        if file_offsets.len() != layout.segments.len() {
            return Err(MemoryError::InvalidConfiguration(format!(
                "{} file segments for a layout of {}",
                file_offsets.len(),
                layout.segments.len()
            )));
        }
        let (mut allocation, reservation) = self.allocate_in(layout)?;
        let error = |source| MemoryError::Mapper {
            mapper: self.mapper.name(),
            source,
        };
        for (i, (&at, &(_, len, _))) in file_offsets.iter().zip(&layout.segments).enumerate() {
            let Some(target) = allocation.target(i) else {
                continue;
            };
            let copied = match at {
                // SAFETY: the segment's pages are this allocation's, prepared by
                // allocate_in, and not borrowed (no working slice is live here).
                Some(at) if len > 0 => unsafe {
                    self.mapper
                        .copy_from_file(&reservation, target, file, at, len)
                        .map_err(error)?
                },
                _ => false,
            };
            if copied {
                continue;
            }
            let Some(working) = allocation.working_memory(i) else {
                continue;
            };
            match at {
                Some(at) => {
                    file.read_exact_at(working, at)
                        .map_err(|source| MemoryError::Mapper {
                            mapper: self.mapper.name(),
                            source: MapperError::Os {
                                operation: "reading an image's segment",
                                address: target,
                                len,
                                source,
                            },
                        })?
                }
                None => working.fill(0),
            }
        }
        Ok(allocation)
    }
}

impl MemoryManager for MapperSpanManager {
    fn allocate(&self, request: &AllocationRequest) -> Result<InFlightAllocation, MemoryError> {
        let layout = crate::span::layout_of(request, self.mapper.page_size())?;
        let mut allocation = self.allocate_layout(&layout)?;
        // A mapper's fresh pages are not promised to be zero (a reused memfd range is not):
        // zero-filled segments are cleared.
        for (i, s) in request.segments().iter().enumerate() {
            if s.zero_fill {
                if let Some(bytes) = allocation.working_memory(i) {
                    bytes.fill(0);
                }
            }
        }
        Ok(allocation)
    }
}

/// A span's reservation in a mapper: what finalizes and frees it.
struct MapperSpanBackend {
    mapper: Arc<dyn Mapper>,
    reservation: Reservation,
}

impl MapperSpanBackend {
    fn release(&self) {
        // SAFETY: the reservation is this backend's alone, released once (the backend is
        // consumed by every caller), and nothing refers to it any more.
        if let Err(error) = unsafe { self.mapper.release(&self.reservation) } {
            tracing::warn!(%error, target = self.reservation.target, "releasing a span failed");
        }
    }
}

impl InFlightBackend for MapperSpanBackend {
    fn finalize(
        self: Box<Self>,
        segments: &[SegmentRange],
    ) -> Result<Box<dyn FinalizedBackend>, MemoryError> {
        let present: Vec<SegmentRange> = segments.iter().copied().filter(|s| s.len > 0).collect();
        // SAFETY: the segments lie on pages of this reservation prepared by allocate_layout,
        // are this allocation's alone, and are no longer borrowed (finalize takes it).
        let initialized = unsafe { self.mapper.initialize(&self.reservation, &present) };
        if let Err(source) = initialized {
            self.release();
            return Err(MemoryError::Mapper {
                mapper: self.mapper.name(),
                source,
            });
        }
        Ok(self)
    }

    fn abandon(self: Box<Self>, _: &[SegmentRange]) {
        self.release();
    }
}

impl FinalizedBackend for MapperSpanBackend {
    fn free(self: Box<Self>, _: &[SegmentRange]) -> Result<(), MemoryError> {
        // SAFETY: as in `release`: the span's code no longer runs (the caller's contract).
        unsafe { self.mapper.release(&self.reservation) }.map_err(|source: MapperError| {
            MemoryError::Mapper {
                mapper: self.mapper.name(),
                source,
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{DualMappedMapper, InProcessMapper, Permission};

    fn mappers() -> Vec<Arc<dyn Mapper>> {
        let mut all: Vec<Arc<dyn Mapper>> = vec![Arc::new(InProcessMapper::new())];
        if let Ok(dual) = DualMappedMapper::new() {
            all.push(Arc::new(dual));
        }
        all
    }

    /// The segments keep the layout's distances (what a stored image's PC-relative code
    /// needs), are written through the working view, and run once finalized.
    #[test]
    fn a_span_in_a_mappers_memory_keeps_its_layout_and_runs() {
        for mapper in mappers() {
            let name = mapper.name();
            let page = mapper.page_size();
            let manager = MapperSpanManager::new(mapper, Placement::Anywhere);
            let layout = SpanLayout::new(
                &[
                    (6, Permission::ReadExecute),
                    (3 * page + 8, Permission::Read),
                    (64, Permission::ReadWrite),
                ],
                page,
            )
            .unwrap();
            let mut span = manager.allocate_layout(&layout).unwrap();
            let base = span.target(0).unwrap();
            assert_ne!(base % (1 << 32), 0, "{name}: a span never starts on 4 GiB");
            for (i, &(offset, _, _)) in layout.segments.iter().enumerate() {
                assert_eq!(
                    span.target(i).unwrap() - base,
                    offset,
                    "{name}: segment {i}"
                );
            }
            span.working_memory(0)
                .unwrap()
                .copy_from_slice(&[0xb8, 42, 0, 0, 0, 0xc3]); // mov eax, 42; ret
            span.working_memory(2).unwrap()[0] = 7;
            let done = span.finalize().unwrap();
            let data = done.target(2).unwrap();
            // SAFETY: the read-write segment of the finalized span, 64 bytes.
            assert_eq!(unsafe { *(data as *const u8) }, 7, "{name}");
            if cfg!(target_arch = "x86_64") {
                // SAFETY: segment 0 holds the function above, now read-execute.
                let f: extern "C" fn() -> u32 =
                    unsafe { std::mem::transmute(done.target(0).unwrap() as usize) };
                assert_eq!(f(), 42, "{name}");
            }
            done.free().unwrap();
        }
    }

    /// Zero-filled segments start zeroed; a layout whose segments overlap, or that is not
    /// made of whole pages, is refused before anything is reserved.
    #[test]
    fn requests_are_zeroed_as_asked_and_bad_layouts_refused() {
        let manager = MapperSpanManager::new(Arc::new(InProcessMapper::new()), Placement::Anywhere);
        let page = manager.page_size();
        let mut span = manager
            .allocate(
                &AllocationRequest::new()
                    .segment(crate::SegmentRequest::new(Permission::Read, 100, 16))
                    .segment(
                        crate::SegmentRequest::new(Permission::ReadWrite, 2 * page, 8)
                            .zero_filled(),
                    ),
            )
            .unwrap();
        assert!(span.working_memory(1).unwrap().iter().all(|&b| b == 0));
        drop(span);
        let overlapping = SpanLayout {
            segments: vec![
                (0, 2 * page, Permission::ReadExecute),
                (page, 8, Permission::ReadWrite),
            ],
            len: 3 * page,
        };
        let ragged = SpanLayout {
            segments: vec![(0, 8, Permission::ReadExecute)],
            len: page + 1,
        };
        for (layout, why) in [
            (overlapping, "not on pages of its own"),
            (ragged, "not made of pages"),
        ] {
            let error = manager.allocate_layout(&layout).unwrap_err().to_string();
            assert!(error.contains(why), "{error}");
        }
    }

    /// A span filled from a file: each segment from its offset, a segment with none
    /// zeroed; a file too short for a segment is an error, not a short span.
    #[test]
    fn a_span_from_a_file_holds_its_segments() {
        use std::io::Write;
        let manager = MapperSpanManager::new(Arc::new(InProcessMapper::new()), Placement::Anywhere);
        let page = manager.page_size();
        let mut file = tempfile_in_tmp();
        let mut bytes = vec![0u8; 2 * page as usize];
        bytes[..5].copy_from_slice(b"code!");
        bytes[page as usize..page as usize + 4].copy_from_slice(b"data");
        file.write_all(&bytes).unwrap();
        let layout = SpanLayout::new(
            &[
                (5, Permission::ReadExecute),
                (4, Permission::ReadWrite),
                (16, Permission::ReadWrite),
            ],
            page,
        )
        .unwrap();
        let mut span = manager
            .allocate_from_file(&layout, &file, &[Some(0), Some(page), None])
            .unwrap();
        assert_eq!(span.working_memory(0).unwrap(), b"code!");
        assert_eq!(span.working_memory(1).unwrap(), b"data");
        assert!(span.working_memory(2).unwrap().iter().all(|&b| b == 0));
        drop(span);
        let short = manager.allocate_from_file(&layout, &file, &[Some(0), Some(4 * page), None]);
        assert!(short.is_err());
        let wrong = manager.allocate_from_file(&layout, &file, &[Some(0)]);
        assert!(wrong.unwrap_err().to_string().contains("file segments"));
    }

    fn tempfile_in_tmp() -> std::fs::File {
        let path = std::env::temp_dir().join(format!(
            "kiln-mapper-span-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let file = std::fs::File::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .unwrap();
        std::fs::remove_file(&path).unwrap();
        file
    }
}
