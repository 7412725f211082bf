//! Spans: a module's memory as one range of its own, its segments in request order, each
//! starting on a page. The layout of a span is the same wherever it is mapped, so what is
//! written into one (code that reaches its data PC-relatively) can be saved to a file and
//! mapped again later, by this process or another: [`map_span_from_file`] maps such a
//! file's pages `MAP_PRIVATE`, so that pages nobody writes stay clean and are shared by
//! every process that maps them (the page cache's copy).
//!
//! Spans do not pack modules together (the slab manager does): they are for large modules
//! whose image is cached (`kiln run`'s programs), where one module fills many pages anyway.
//!
//! W^X: a span's pages are read-write (never executable) while in flight, and take their
//! final permission at [`InFlightAllocation::finalize`]; no page is ever writable and
//! executable at once.

use crate::allocation::{FinalizedBackend, InFlightBackend, WorkingSegment};
use crate::mapper::{placement, sys};
use crate::{
    icache, AllocationRequest, InFlightAllocation, MapperError, MemoryError, MemoryManager,
    Permission, Placement, SegmentRange,
};

/// Where each segment of a span lies: its offset from the span's start and its length.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpanLayout {
    /// `(offset, len, permission)` of each segment, in request order; offsets are
    /// multiples of the page size, the first is 0.
    pub segments: Vec<(u64, u64, Permission)>,
    /// The span's length (a multiple of the page size).
    pub len: u64,
}

impl SpanLayout {
    /// The layout of `segments` (`(len, permission)`) with pages of `page` bytes: each
    /// segment starts on a page after the one before it.
    pub fn new(segments: &[(u64, Permission)], page: u64) -> Result<Self, MemoryError> {
        let mut cursor = 0u64;
        let mut placed = Vec::with_capacity(segments.len());
        for (i, &(len, permission)) in segments.iter().enumerate() {
            placed.push((cursor, len, permission));
            cursor = cursor
                .checked_add(len)
                .and_then(|end| end.checked_next_multiple_of(page))
                .ok_or(MemoryError::SizeOverflow {
                    segment: i,
                    size: len,
                    align: page,
                })?;
        }
        Ok(SpanLayout {
            segments: placed,
            len: cursor.max(page),
        })
    }
}

/// A memory manager that gives each allocation a span of its own (its segments on successive
/// pages, in request order), placed as its
/// [`Placement`] asks (by default near the host's shared libraries, as the slab manager's
/// reservations are).
#[derive(Debug, Clone)]
pub struct SpanMemoryManager {
    placement: Placement,
    page: u64,
}

impl SpanMemoryManager {
    /// A span manager placing spans as `placement` asks.
    pub fn new(placement: Placement) -> Self {
        SpanMemoryManager {
            placement,
            page: sys::page_size(),
        }
    }

    /// The page size spans are laid out with.
    pub fn page_size(&self) -> u64 {
        self.page
    }
}

impl Default for SpanMemoryManager {
    fn default() -> Self {
        Self::new(Placement::HostLibraries)
    }
}

fn os(
    operation: &'static str,
    address: u64,
    len: u64,
) -> impl FnOnce(std::io::Error) -> MemoryError {
    move |source| MemoryError::Mapper {
        mapper: "span",
        source: MapperError::Os {
            operation,
            address,
            len,
            source,
        },
    }
}

/// Reserves `len` bytes, inaccessible, as `placement` asks; never at an address whose
/// low 32 bits are 0 (a span's code starts at its first byte, and libgcc's unwinder reads
/// a function there as removed: see `slab::unwinder_blind_spots`).
fn reserve(len: u64, page: u64, placement: &Placement) -> Result<u64, MemoryError> {
    let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE;
    // One page more, to move off such an address (the extra page is given back).
    let with_spare = len + page;
    let start = placement::reserve_placed(
        with_spare,
        page,
        placement,
        |fixed| sys::mmap(fixed, None, with_spare, libc::PROT_NONE, flags, None),
        // SAFETY: a mapping reserve_placed just made and nobody else knows.
        |misplaced| drop(unsafe { sys::munmap(misplaced, with_spare) }),
    )
    .map_err(|source| MemoryError::Mapper {
        mapper: "span",
        source,
    })?;
    let (kept, spare) = if start % (1 << 32) == 0 {
        (start + page, start)
    } else {
        (start, start + len)
    };
    // SAFETY: the spare page of the reservation just made, which nothing uses.
    let _ = unsafe { sys::munmap(spare, page) };
    Ok(kept)
}

/// The span layout of `request` with pages of `page` bytes: its segments on successive
/// pages, each aligned as asked (no alignment above a page).
pub(crate) fn layout_of(request: &AllocationRequest, page: u64) -> Result<SpanLayout, MemoryError> {
    if request.segments().is_empty() {
        return Err(MemoryError::EmptyRequest);
    }
    for (i, s) in request.segments().iter().enumerate() {
        if !s.align.is_power_of_two() {
            return Err(MemoryError::InvalidAlignment {
                segment: i,
                align: s.align,
            });
        }
        if s.align > page {
            return Err(MemoryError::AlignmentTooLarge {
                segment: i,
                align: s.align,
                max: page,
            });
        }
    }
    let sizes: Vec<(u64, Permission)> = request
        .segments()
        .iter()
        .map(|s| (s.size, s.permission))
        .collect();
    SpanLayout::new(&sizes, page)
}

impl MemoryManager for SpanMemoryManager {
    fn allocate(&self, request: &AllocationRequest) -> Result<InFlightAllocation, MemoryError> {
        let layout = layout_of(request, self.page)?;
        let start = reserve(layout.len, self.page, &self.placement)?;
        let backend = SpanBackend {
            start,
            len: layout.len,
            page: self.page,
        };
        // SAFETY: the span was just reserved by this call and nothing else knows it.
        let writable =
            unsafe { sys::mprotect(start, layout.len, libc::PROT_READ | libc::PROT_WRITE) };
        if let Err(e) = writable {
            backend.release();
            return Err(os("mprotect", start, layout.len)(e));
        }
        Ok(backend.in_flight(&layout))
    }
}

/// One segment of an image file: where its bytes are in the file (`None`: zero-filled,
/// not in the file).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileSegment {
    /// Offset of the segment's first byte in the file (a multiple of the page size).
    pub file_offset: Option<u64>,
}

/// Maps a span laid out as `layout` from `file`: each segment with a file offset is
/// mapped `MAP_PRIVATE` from the file (read-write until finalized: a page written, by a
/// fixup, becomes this process's own copy; the others stay the page cache's, shared), the
/// others anonymous and zero-filled. The file must hold every byte of every mapped page
/// (an image writer pads its segments to whole pages); a shorter file is refused.
pub fn map_span_from_file(
    file: &std::fs::File,
    layout: &SpanLayout,
    segments: &[FileSegment],
    placement: &Placement,
) -> Result<InFlightAllocation, MemoryError> {
    let page = sys::page_size();
    if segments.len() != layout.segments.len() {
        return Err(MemoryError::InvalidConfiguration(format!(
            "{} file segments for a layout of {}",
            segments.len(),
            layout.segments.len()
        )));
    }
    let file_len = file.metadata().map_err(os("fstat", 0, 0))?.len();
    for (i, (seg, &(offset, len, _))) in segments.iter().zip(&layout.segments).enumerate() {
        let fits = offset
            .checked_add(len)
            .is_some_and(|end| end <= layout.len && offset % page == 0);
        let in_file = match seg.file_offset {
            Some(at) => {
                at % page == 0
                    && at
                        .checked_add(len.next_multiple_of(page))
                        .is_some_and(|end| end <= file_len)
            }
            None => true,
        };
        if !fits || !in_file {
            return Err(MemoryError::InvalidConfiguration(format!(
                "segment {i} ({len:#x} bytes at {offset:#x}, file offset {:?}) does not fit the span ({:#x} bytes) or the file ({file_len:#x} bytes)",
                seg.file_offset, layout.len
            )));
        }
    }
    let start = reserve(layout.len, page, placement)?;
    let backend = SpanBackend {
        start,
        len: layout.len,
        page,
    };
    // The whole span read-write first (the zero-filled parts), then the file's pages over it.
    // SAFETY: the span was just reserved by this call and nothing else knows it.
    let writable = unsafe { sys::mprotect(start, layout.len, libc::PROT_READ | libc::PROT_WRITE) };
    if let Err(e) = writable {
        backend.release();
        return Err(os("mprotect", start, layout.len)(e));
    }
    for (seg, &(offset, len, _)) in segments.iter().zip(&layout.segments) {
        let (Some(at), true) = (seg.file_offset, len > 0) else {
            continue;
        };
        let pages = len.next_multiple_of(page);
        // SAFETY: `[start + offset, + pages)` lies inside the span this call reserved
        // (checked above), which nothing else refers to yet.
        let mapped = unsafe {
            sys::mmap_replace(
                start + offset,
                pages,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE,
                file,
                at,
            )
        };
        if let Err(e) = mapped {
            backend.release();
            return Err(os("mmap", start + offset, pages)(e));
        }
    }
    Ok(backend.in_flight(layout))
}

/// A span's memory: what finalizes and frees it.
#[derive(Debug)]
struct SpanBackend {
    start: u64,
    len: u64,
    page: u64,
}

impl SpanBackend {
    /// The in-flight allocation of `layout`'s segments in this span (read-write).
    fn in_flight(self, layout: &SpanLayout) -> InFlightAllocation {
        let segments: Vec<WorkingSegment> = layout
            .segments
            .iter()
            .map(|&(offset, len, permission)| {
                let target = self.start + offset;
                WorkingSegment::new(target, len, permission, target as *mut u8)
            })
            .collect();
        // SAFETY: each segment is `len` bytes of the span, read-write, disjoint from the
        // others (they start on successive pages), owned by this allocation alone until
        // its backend is finalized or dropped.
        unsafe { InFlightAllocation::from_parts(segments, Box::new(self)) }
    }

    fn release(&self) {
        // SAFETY: the span is this backend's alone; nothing refers to it any more (the
        // caller's contract: abandoned, freed, or never handed out).
        if let Err(error) = unsafe { sys::munmap(self.start, self.len) } {
            tracing::warn!(%error, start = self.start, "unmapping a span failed");
        }
    }
}

impl InFlightBackend for SpanBackend {
    fn finalize(
        self: Box<Self>,
        segments: &[SegmentRange],
    ) -> Result<Box<dyn FinalizedBackend>, MemoryError> {
        let mut executable = false;
        for segment in segments.iter().filter(|s| s.len > 0) {
            if segment.permission == Permission::ReadWrite {
                continue;
            }
            let start = segment.target;
            let end = (segment.target + segment.len).next_multiple_of(self.page);
            // SAFETY: the segment's pages are this span's alone (segments start on pages of
            // their own) and no longer borrowed as working memory (finalize takes the
            // allocation).
            let changed =
                unsafe { sys::mprotect(start, end - start, sys::prot_of(segment.permission)) };
            if let Err(e) = changed {
                self.release();
                return Err(os("mprotect", start, end - start)(e));
            }
            if segment.permission.is_executable() {
                icache::make_coherent(segment.target, segment.len);
                executable = true;
            }
        }
        if executable {
            icache::synchronize_cores();
        }
        Ok(self)
    }

    fn abandon(self: Box<Self>, _: &[SegmentRange]) {
        self.release();
    }
}

impl FinalizedBackend for SpanBackend {
    fn free(self: Box<Self>, _: &[SegmentRange]) -> Result<(), MemoryError> {
        // SAFETY: the allocation is being freed: its code must not run any more (the
        // contract of FinalizedBackend::free); a stale call faults on the unmapped range.
        unsafe { sys::munmap(self.start, self.len) }.map_err(os("munmap", self.start, self.len))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::SegmentRequest;
    use std::io::Write;

    #[test]
    fn segments_start_on_pages_in_request_order() {
        let layout = SpanLayout::new(
            &[
                (5000, Permission::ReadExecute),
                (0, Permission::Read),
                (10, Permission::ReadWrite),
            ],
            4096,
        )
        .unwrap();
        assert_eq!(
            layout.segments,
            vec![
                (0, 5000, Permission::ReadExecute),
                (8192, 0, Permission::Read),
                (8192, 10, Permission::ReadWrite)
            ]
        );
        assert_eq!(layout.len, 12288);
    }

    #[test]
    fn a_span_is_written_then_finalized_and_a_file_mapped_span_reads_the_file() {
        let manager = SpanMemoryManager::default();
        let page = manager.page_size();
        let request = AllocationRequest::new()
            .segment(SegmentRequest::new(Permission::Read, 100, 8))
            .segment(SegmentRequest::new(Permission::ReadWrite, 8, 8));
        let mut in_flight = manager.allocate(&request).unwrap();
        let (a, b) = (in_flight.target(0).unwrap(), in_flight.target(1).unwrap());
        assert_eq!(b - a, page);
        in_flight.working_memory(0).unwrap().fill(7);
        let finalized = in_flight.finalize().unwrap();
        // SAFETY: segment 0 is mapped readable.
        assert_eq!(unsafe { *(a as *const u8).add(99) }, 7);
        drop(finalized);

        let dir = std::env::temp_dir().join(format!("kiln-span-{}", std::process::id()));
        let mut file = std::fs::File::create(&dir).unwrap();
        let mut bytes = vec![1u8; page as usize];
        bytes.extend(vec![2u8; page as usize]);
        file.write_all(&bytes).unwrap();
        let file = std::fs::File::open(&dir).unwrap();
        let layout = SpanLayout::new(
            &[
                (page, Permission::Read),
                (16, Permission::ReadWrite),
                (32, Permission::ReadWrite),
            ],
            page,
        )
        .unwrap();
        let segments = [
            FileSegment {
                file_offset: Some(0),
            },
            FileSegment {
                file_offset: Some(page),
            },
            FileSegment { file_offset: None },
        ];
        let mut in_flight =
            map_span_from_file(&file, &layout, &segments, &Placement::HostLibraries).unwrap();
        assert!(in_flight.working_memory(0).unwrap().iter().all(|&b| b == 1));
        in_flight.working_memory(1).unwrap()[0] = 9;
        assert!(in_flight.working_memory(2).unwrap().iter().all(|&b| b == 0));
        let finalized = in_flight.finalize().unwrap();
        drop(finalized);
        // A write to a private mapping never reaches the file.
        assert_eq!(std::fs::read(&dir).unwrap()[page as usize], 2);
        // A file shorter than its segments' pages is refused, not mapped (no SIGBUS later).
        let short = [
            FileSegment {
                file_offset: Some(page),
            },
            FileSegment {
                file_offset: Some(page),
            },
            FileSegment { file_offset: None },
        ];
        let layout = SpanLayout::new(
            &[
                (2 * page, Permission::Read),
                (16, Permission::ReadWrite),
                (1, Permission::ReadWrite),
            ],
            page,
        )
        .unwrap();
        assert!(map_span_from_file(&file, &layout, &short, &Placement::HostLibraries).is_err());
        std::fs::remove_file(&dir).unwrap();
    }
}
