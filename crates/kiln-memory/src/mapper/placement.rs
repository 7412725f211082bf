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
        match self.window(len) {
            Ok(None) => true,
            Ok(Some((lo, hi, _))) => start >= lo && start.saturating_add(len) <= hi,
            Err(_) => false,
        }
    }

    /// The window `[lo, hi)` a reservation of `len` bytes must lie in, and the address it
    /// should preferably be close to; `None` for anywhere.
    fn window(&self, len: u64) -> Result<Option<(u64, u64, u64)>, MapperError> {
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
                let (start, end) = host_library_span();
                Placement::Near { start, end }.window(len)
            }
        }
    }
}

/// One line of `/proc/self/maps`.
#[derive(Debug, Clone)]
struct MapsEntry {
    start: u64,
    end: u64,
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
        entries.push(MapsEntry { start, end });
    }
    entries.sort_by_key(|e| e.start);
    Ok(entries)
}

/// The address span of this process's shared libraries (the objects the dynamic loader
/// loaded from a path: not the executable, not the vDSO); libc's own span if the
/// libraries are scattered too widely. Read from the loader's list (`dl_iterate_phdr`, no
/// system call), not from `/proc/self/maps`, whose text the kernel makes line by line.
fn host_library_span() -> (u64, u64) {
    let anchor = libc::malloc as *const () as u64;
    let mut libs: Vec<(u64, u64)> = Vec::new();
    unsafe extern "C" fn each(
        info: *mut libc::dl_phdr_info,
        _size: libc::size_t,
        data: *mut libc::c_void,
    ) -> libc::c_int {
        // SAFETY: the loader passes a valid entry for the duration of the call; `data` is
        // the Vec below, borrowed for the duration of dl_iterate_phdr.
        let (info, libs) = unsafe { (&*info, &mut *(data as *mut Vec<(u64, u64)>)) };
        // SAFETY: dlpi_name is a NUL-terminated string (empty for the executable).
        let from_path =
            !info.dlpi_name.is_null() && unsafe { *info.dlpi_name } == b'/' as libc::c_char;
        if !from_path || info.dlpi_phdr.is_null() {
            return 0;
        }
        // SAFETY: dlpi_phdr points at dlpi_phnum program headers.
        let headers = unsafe { std::slice::from_raw_parts(info.dlpi_phdr, info.dlpi_phnum.into()) };
        let loads = headers.iter().filter(|h| h.p_type == libc::PT_LOAD);
        let lo = loads.clone().map(|h| h.p_vaddr).min();
        let hi = loads.map(|h| h.p_vaddr.saturating_add(h.p_memsz)).max();
        if let (Some(lo), Some(hi)) = (lo, hi) {
            libs.push((
                info.dlpi_addr.saturating_add(lo),
                info.dlpi_addr.saturating_add(hi),
            ));
        }
        0
    }
    // SAFETY: `each` only reads the entries it is given and writes `libs`.
    unsafe { libc::dl_iterate_phdr(Some(each), &mut libs as *mut _ as *mut libc::c_void) };
    let lo = libs.iter().map(|l| l.0).min();
    let hi = libs.iter().map(|l| l.1).max();
    match (lo, hi) {
        (Some(lo), Some(hi)) if hi - lo <= (1 << 30) && (lo..hi).contains(&anchor) => (lo, hi),
        // Only the object that holds malloc (libc).
        _ => libs
            .into_iter()
            .find(|l| (l.0..l.1).contains(&anchor))
            .unwrap_or((anchor, anchor + 1)),
    }
}

/// Reserves `len` bytes as `placement` asks, by calling `map` with a fixed address (or
/// `None` for anywhere). `map` must create the mapping exactly there or fail with `EEXIST`;
/// `unmap` removes a mapping `map(None)` made that is not where it must be.
pub(crate) fn reserve_placed(
    len: u64,
    page: u64,
    placement: &Placement,
    mut map: impl FnMut(Option<u64>) -> io::Result<u64>,
    mut unmap: impl FnMut(u64),
) -> Result<u64, MapperError> {
    let read = || {
        read_maps().map_err(|source| MapperError::Os {
            operation: "read /proc/self/maps",
            address: 0,
            len,
            source,
        })
    };
    let Some((lo, hi, prefer)) = placement.window(len)? else {
        return map(None).map_err(|source| MapperError::Os {
            operation: "mmap",
            address: 0,
            len,
            source,
        });
    };
    // Near the libraries, first where the kernel puts a new mapping: below the lowest one,
    // which is within reach unless the process has mapped gigabytes since. No maps to
    // read then.
    if !matches!(placement, Placement::Low2GiB) {
        if let Ok(got) = map(None) {
            if got >= lo && got.saturating_add(len) <= hi {
                return Ok(got);
            }
            unmap(got);
        }
    }
    let mut last_error = None;
    for _attempt in 0..4 {
        let maps = read()?;
        // Free gaps between mappings, clipped to the window.
        let mut candidates = Vec::new();
        let mut cursor = lo;
        for entry in maps
            .iter()
            .chain(std::iter::once(&MapsEntry { start: hi, end: hi }))
        {
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

#[cfg(test)]
mod tests {
    use super::*;

    const LEN: u64 = 1 << 20;
    const PAGE: u64 = 4096;

    #[test]
    fn where_the_kernel_puts_it_is_kept_when_it_is_near_enough() {
        let near = Placement::Near {
            start: 0x7f00_0000_0000,
            end: 0x7f00_0100_0000,
        };
        let (mut maps, mut unmaps) = (Vec::new(), Vec::new());
        let got = reserve_placed(
            LEN,
            PAGE,
            &near,
            |fixed| {
                maps.push(fixed);
                Ok(0x7eff_c000_0000)
            },
            |at| unmaps.push(at),
        )
        .unwrap();
        assert_eq!((got, maps, unmaps), (0x7eff_c000_0000, vec![None], vec![]));
    }

    #[test]
    fn too_far_is_given_back_and_a_gap_in_the_window_is_taken() {
        let host = host_library_span();
        let placement = Placement::HostLibraries;
        let (lo, hi, _) = placement.window(LEN).unwrap().unwrap();
        let (mut maps, mut unmaps) = (Vec::new(), Vec::new());
        // The kernel's choice is out of reach (as when the process has mapped gigabytes
        // below its libraries); the fixed address asked next must be within the window.
        let got = reserve_placed(
            LEN,
            PAGE,
            &placement,
            |fixed| {
                maps.push(fixed);
                Ok(fixed.unwrap_or(0x1000_0000))
            },
            |at| unmaps.push(at),
        )
        .unwrap();
        assert_eq!(unmaps, vec![0x1000_0000]);
        assert_eq!(maps.len(), 2, "{maps:x?}");
        assert_eq!(maps[1], Some(got));
        assert!(
            got >= lo && got + LEN <= hi,
            "{got:#x} not in {lo:#x}..{hi:#x}"
        );
        assert!(got.abs_diff(host.0) < 1 << 31 && (got + LEN).abs_diff(host.1) < 1 << 31);
    }

    #[test]
    fn low_memory_is_never_asked_of_the_kernel_anywhere() {
        let mut maps = Vec::new();
        let got = reserve_placed(
            LEN,
            PAGE,
            &Placement::Low2GiB,
            |fixed| {
                maps.push(fixed);
                Ok(fixed.unwrap_or(0x7f00_0000_0000))
            },
            |_| panic!("nothing to give back"),
        )
        .unwrap();
        assert!(maps.iter().all(Option::is_some), "{maps:x?}");
        assert!(got + LEN <= 1 << 31);
    }

    #[test]
    fn the_host_span_holds_libc() {
        let (lo, hi) = host_library_span();
        let malloc = libc::malloc as *const () as u64;
        assert!((lo..hi).contains(&malloc), "{lo:#x}..{hi:#x} {malloc:#x}");
        assert!(hi - lo > 4096);
    }
}
