//! Where a reservation may lie: anywhere, within ±2 GiB of an address range (by default the
//! host's shared libraries), or in the low 2 GiB.

use crate::MapperError;
use std::fmt;
use std::io;

/// Reach of a signed 32-bit PC-relative displacement, less a margin for addends.
const PC32_REACH: u64 = (1 << 31) - (1 << 20);
/// The low 2 GiB, for code with absolute 32-bit addresses.
const LOW_2GIB_END: u64 = 1 << 31;
/// Lowest address tried for low placements (above `vm.mmap_min_addr` and the null page).
const LOW_START: u64 = 1 << 20;
/// Highest user address on x86-64 and AArch64 with 47/48-bit address spaces.
const USER_END: u64 = 0x7fff_ffff_f000;

/// Where [`Mapper::reserve`](crate::Mapper::reserve) must put a reservation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Placement {
    /// Wherever the kernel likes.
    Anywhere,
    /// Every byte of the reservation within ±2 GiB (a signed 32-bit PC-relative
    /// displacement) of every byte of `[start, end)`.
    Near {
        /// Start of the range to stay near.
        start: u64,
        /// End (exclusive) of the range to stay near.
        end: u64,
    },
    /// Near the shared libraries mapped in this process (libc, the dynamic loader, ...), so
    /// that code compiled as PIE can reach their data with a plain 32-bit PC-relative
    /// reference. The default.
    #[default]
    HostLibraries,
    /// Entirely below 2 GiB, for non-PIC code with absolute 32-bit addresses
    /// (`R_X86_64_32`, `R_X86_64_32S`).
    Low2GiB,
}

impl fmt::Display for Placement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Placement::Anywhere => f.write_str("anywhere"),
            Placement::Near { start, end } => {
                write!(f, "within ±2 GiB of {start:#x}..{end:#x}")
            }
            Placement::HostLibraries => f.write_str("near the host's shared libraries"),
            Placement::Low2GiB => f.write_str("in the low 2 GiB"),
        }
    }
}

impl Placement {
    /// Whether every byte of `[start, start + len)` satisfies this placement. For
    /// [`Placement::HostLibraries`] the libraries mapped now are used.
    pub fn admits(&self, start: u64, len: u64) -> bool {
        let maps = match self {
            Placement::HostLibraries => read_maps().ok(),
            _ => None,
        };
        match self.window(len, maps.as_deref()) {
            Ok(None) => true,
            Ok(Some((lo, hi, _))) => start >= lo && start.saturating_add(len) <= hi,
            Err(_) => false,
        }
    }

    /// The window `[lo, hi)` a reservation of `len` bytes must lie in, and the address it
    /// should preferably be close to; `None` for anywhere. `maps` is this process's
    /// mappings, for [`Placement::HostLibraries`] (`None`: they could not be read).
    fn window(
        &self,
        len: u64,
        maps: Option<&[MapsEntry]>,
    ) -> Result<Option<(u64, u64, u64)>, MapperError> {
        match *self {
            Placement::Anywhere => Ok(None),
            Placement::Low2GiB => Ok(Some((LOW_START, LOW_2GIB_END, LOW_2GIB_END))),
            Placement::Near { start, end } => {
                let lo = end.saturating_sub(PC32_REACH).max(LOW_START);
                let hi = start.saturating_add(PC32_REACH).min(USER_END);
                if hi < lo.saturating_add(len) {
                    return Err(MapperError::PlacementUnavailable {
                        placement: *self,
                        len,
                        reason: "the range to stay near is too wide for the reservation".into(),
                    });
                }
                Ok(Some((lo, hi, start)))
            }
            Placement::HostLibraries => {
                let (start, end) = host_library_span(maps);
                Placement::Near { start, end }.window(len, None)
            }
        }
    }
}

/// One line of `/proc/self/maps`.
#[derive(Debug, Clone)]
struct MapsEntry {
    start: u64,
    end: u64,
    path: String,
}

fn read_maps() -> io::Result<Vec<MapsEntry>> {
    // The file says its size is 0: read it in large pieces (a few reads, not one per
    // doubling of a small buffer).
    let mut text = String::with_capacity(16 << 10);
    io::Read::read_to_string(&mut std::fs::File::open("/proc/self/maps")?, &mut text)?;
    let mut entries = Vec::new();
    for line in text.lines() {
        let mut fields = line.split_whitespace();
        let Some(range) = fields.next() else { continue };
        let Some((s, e)) = range.split_once('-') else {
            continue;
        };
        let (Ok(start), Ok(end)) = (u64::from_str_radix(s, 16), u64::from_str_radix(e, 16)) else {
            continue;
        };
        let path = fields.nth(4).unwrap_or("").to_string();
        entries.push(MapsEntry { start, end, path });
    }
    entries.sort_by_key(|e| e.start);
    Ok(entries)
}

/// The address span of this process's shared libraries in `maps`; libc's own span if the
/// libraries are scattered too widely, or the address of `malloc` if the maps could not be
/// read.
fn host_library_span(maps: Option<&[MapsEntry]>) -> (u64, u64) {
    let anchor = libc::malloc as *const () as u64;
    let Some(maps) = maps else {
        return (anchor, anchor + 1);
    };
    let is_library = |p: &str| p.starts_with('/') && (p.ends_with(".so") || p.contains(".so."));
    let libs: Vec<&MapsEntry> = maps.iter().filter(|e| is_library(&e.path)).collect();
    let lo = libs.iter().map(|e| e.start).min();
    let hi = libs.iter().map(|e| e.end).max();
    match (lo, hi) {
        (Some(lo), Some(hi)) if hi - lo <= (1 << 30) && (lo..hi).contains(&anchor) => (lo, hi),
        _ => {
            // Only the object that holds malloc (libc).
            let owner = maps
                .iter()
                .find(|e| (e.start..e.end).contains(&anchor))
                .map(|e| e.path.clone());
            let span = owner.and_then(|path| {
                let same: Vec<&MapsEntry> = maps.iter().filter(|e| e.path == path).collect();
                Some((
                    same.iter().map(|e| e.start).min()?,
                    same.iter().map(|e| e.end).max()?,
                ))
            });
            span.unwrap_or((anchor, anchor + 1))
        }
    }
}

/// Reserves `len` bytes as `placement` asks, by calling `map` with a fixed address (or
/// `None` for anywhere). `map` must create the mapping exactly there or fail with `EEXIST`.
pub(crate) fn reserve_placed(
    len: u64,
    page: u64,
    placement: &Placement,
    mut map: impl FnMut(Option<u64>) -> io::Result<u64>,
) -> Result<u64, MapperError> {
    let read = || {
        read_maps().map_err(|source| MapperError::Os {
            operation: "read /proc/self/maps",
            address: 0,
            len,
            source,
        })
    };
    // Read once for both the window and the gaps (unless nothing needs them).
    let mut maps = match placement {
        Placement::Anywhere => None,
        Placement::HostLibraries => read_maps().ok(),
        _ => Some(read()?),
    };
    let Some((lo, hi, prefer)) = placement.window(len, maps.as_deref())? else {
        return map(None).map_err(|source| MapperError::Os {
            operation: "mmap",
            address: 0,
            len,
            source,
        });
    };
    let mut last_error = None;
    for _attempt in 0..4 {
        let maps = match maps.take() {
            Some(maps) => maps,
            None => read()?,
        };
        // Free gaps between mappings, clipped to the window.
        let mut candidates = Vec::new();
        let mut cursor = lo;
        for entry in maps.iter().chain(std::iter::once(&MapsEntry {
            start: hi,
            end: hi,
            path: String::new(),
        })) {
            let gap_start = cursor.max(lo);
            let gap_end = entry.start.min(hi);
            if gap_end > gap_start && gap_end - gap_start >= len {
                // The base inside this gap closest to `prefer`.
                let last_base = (gap_end - len) & !(page - 1);
                let first_base = gap_start.next_multiple_of(page);
                if first_base <= last_base {
                    let target =
                        prefer.saturating_sub(len).clamp(first_base, last_base) & !(page - 1);
                    let target = target.max(first_base);
                    candidates.push(target);
                }
            }
            cursor = cursor.max(entry.end);
            if cursor >= hi {
                break;
            }
        }
        candidates.sort_by_key(|&base| base.abs_diff(prefer));
        for base in candidates {
            match map(Some(base)) {
                Ok(got) => return Ok(got),
                Err(e) if e.raw_os_error() == Some(libc::EEXIST) => last_error = Some(e),
                Err(source) => {
                    return Err(MapperError::Os {
                        operation: "mmap",
                        address: base,
                        len,
                        source,
                    })
                }
            }
        }
        if last_error.is_none() {
            break;
        }
    }
    Err(MapperError::PlacementUnavailable {
        placement: *placement,
        len,
        reason: match last_error {
            Some(e) => format!("every free gap was taken while trying ({e})"),
            None => format!("no free gap of that size between {lo:#x} and {hi:#x}"),
        },
    })
}
