//! Whether a host symbol is a function, from the dynamic symbol table of the object that
//! holds it, read once per object from the loader's memory.
//!
//! `dladdr1` answers the same question, but glibc finds the symbol by scanning the whole
//! symbol table of the object on every call: for the ~100 host names of a Lua link that
//! was 2.9 ms of the executor's answer to one `LookupMany` (a scan of libc's ~3,000
//! symbols per name). No crate reads the loaded objects' tables (the `object` crate reads
//! files, and the file may be out of the sandbox's reach, or gone), hence this reader.
//! Whatever it cannot read (an object without a hash table, an address it does not
//! know) goes to `dladdr1` as before.

use parking_lot::Mutex;
use rustc_hash::FxHashMap;
use std::ffi::c_void;

const DT_NULL: i64 = 0;
const DT_HASH: i64 = 4;
const DT_SYMTAB: i64 = 6;
const DT_SYMENT: i64 = 11;
const DT_GNU_HASH: i64 = 0x6fff_fef5;
const STT_OBJECT: u8 = 1;
const STT_FUNC: u8 = 2;
const STT_GNU_IFUNC: u8 = 10;
/// More symbols than any object has: a count above it is a misread table.
const MAX_SYMBOLS: usize = 1 << 22;

/// A loaded object: its span, its executable segments, where its dynamic section is,
/// and (once asked) its symbols' kinds by address.
struct Object {
    base: u64,
    span: (u64, u64),
    code: Vec<(u64, u64)>,
    dynamic: u64,
    kinds: Option<Option<FxHashMap<u64, bool>>>,
}

/// The loaded objects, as of the last time an address was not in any of them.
static OBJECTS: Mutex<Vec<Object>> = Mutex::new(Vec::new());

/// Whether the host symbol at `address` (what `dlsym` returned) is a function
/// (`STT_FUNC` / `STT_GNU_IFUNC`); `None` if the address is not a symbol of a loaded
/// object.
pub fn host_symbol_is_function(address: u64) -> Option<bool> {
    let mut objects = OBJECTS.lock();
    let mut at = objects
        .iter()
        .position(|o| (o.span.0..o.span.1).contains(&address));
    if at.is_none() {
        // A library opened since: read the list again.
        *objects = loaded_objects();
        at = objects
            .iter()
            .position(|o| (o.span.0..o.span.1).contains(&address));
    }
    let Some(object) = at.map(|i| &mut objects[i]) else {
        return by_scan(address);
    };
    let (base, span, dynamic) = (object.base, object.span, object.dynamic);
    // SAFETY: `dynamic` is the object's PT_DYNAMIC as the loader mapped it, and the
    // object stays loaded (libraries opened for links are never closed).
    let kinds = object
        .kinds
        .get_or_insert_with(|| unsafe { dynamic_kinds(base, span, dynamic) });
    match kinds.as_ref().and_then(|k| k.get(&address)) {
        Some(&function) => Some(function),
        // Not a symbol's own value but in code: what an IFUNC resolver chose.
        None if kinds.is_some() && object.code.iter().any(|c| (c.0..c.1).contains(&address)) => {
            Some(true)
        }
        None => by_scan(address),
    }
}

/// `dladdr1`'s answer: the loader's scan of the object's symbol table.
fn by_scan(address: u64) -> Option<bool> {
    const RTLD_DL_SYMENT: libc::c_int = 1;
    // SAFETY: Dl_info is plain data; zeroed is valid.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    let mut sym: *const libc::Elf64_Sym = std::ptr::null();
    // SAFETY: dladdr1 only reads loader tables and writes the two out-parameters.
    let found = unsafe {
        libc::dladdr1(
            address as *const c_void,
            &mut info,
            (&mut sym as *mut *const libc::Elf64_Sym).cast(),
            RTLD_DL_SYMENT,
        )
    };
    if found == 0 || sym.is_null() {
        return None;
    }
    // SAFETY: dladdr1 points `sym` at an entry of a loaded object's symbol table.
    let st_info = unsafe { (*sym).st_info };
    Some(matches!(st_info & 0xf, STT_FUNC | STT_GNU_IFUNC))
}

/// Every loaded object with a dynamic section, from the loader's list.
fn loaded_objects() -> Vec<Object> {
    unsafe extern "C" fn each(
        info: *mut libc::dl_phdr_info,
        _size: libc::size_t,
        data: *mut c_void,
    ) -> libc::c_int {
        // SAFETY: the loader passes a valid entry for the duration of the call; `data` is
        // the Vec below, borrowed for the duration of dl_iterate_phdr.
        let (info, objects) = unsafe { (&*info, &mut *(data as *mut Vec<Object>)) };
        if info.dlpi_phdr.is_null() {
            return 0;
        }
        // SAFETY: dlpi_phdr points at dlpi_phnum program headers.
        let headers = unsafe { std::slice::from_raw_parts(info.dlpi_phdr, info.dlpi_phnum.into()) };
        let base = info.dlpi_addr;
        let loads = headers.iter().filter(|h| h.p_type == libc::PT_LOAD);
        let lo = loads.clone().map(|h| h.p_vaddr).min();
        let hi = loads
            .clone()
            .map(|h| h.p_vaddr.saturating_add(h.p_memsz))
            .max();
        let dynamic = headers.iter().find(|h| h.p_type == libc::PT_DYNAMIC);
        if let (Some(lo), Some(hi), Some(dynamic)) = (lo, hi, dynamic) {
            let code = loads
                .filter(|h| h.p_flags & libc::PF_X != 0)
                .map(|h| (base + h.p_vaddr, base + h.p_vaddr + h.p_memsz))
                .collect();
            objects.push(Object {
                base,
                span: (base.saturating_add(lo), base.saturating_add(hi)),
                code,
                dynamic: base + dynamic.p_vaddr,
                kinds: None,
            });
        }
        0
    }
    let mut objects: Vec<Object> = Vec::new();
    // SAFETY: `each` only reads the entries it is given and writes `objects`.
    unsafe { libc::dl_iterate_phdr(Some(each), &mut objects as *mut _ as *mut c_void) };
    objects
}

/// The kinds of the symbols an object defines, by address; `None` if its tables cannot
/// be read (no hash table to count the symbols by, a table outside the object).
///
/// # Safety
/// `dynamic` must be the address of the loaded object's dynamic section, mapped for as
/// long as this runs, and `span` the object's mapped span.
unsafe fn dynamic_kinds(base: u64, span: (u64, u64), dynamic: u64) -> Option<FxHashMap<u64, bool>> {
    // glibc turns these entries into addresses in place; the vDSO's stay offsets.
    let address = |p: u64| if p < base { p.wrapping_add(base) } else { p };
    let inside = |p: u64, len: u64| p >= span.0 && p.checked_add(len).is_some_and(|e| e <= span.1);
    let (mut symtab, mut hash, mut gnu_hash, mut syment) = (0, 0, 0, 24);
    let mut entry = dynamic as *const [u64; 2];
    loop {
        // SAFETY: the dynamic section is an array of (tag, value) pairs ending in DT_NULL,
        // mapped (the caller's contract).
        let [tag, value] = unsafe { entry.read() };
        match tag as i64 {
            DT_NULL => break,
            DT_SYMTAB => symtab = address(value),
            DT_HASH => hash = address(value),
            DT_GNU_HASH => gnu_hash = address(value),
            DT_SYMENT => syment = value,
            _ => {}
        }
        // SAFETY: not past DT_NULL, which ends the array.
        entry = unsafe { entry.add(1) };
    }
    if syment != std::mem::size_of::<libc::Elf64_Sym>() as u64 || !inside(symtab, 0) {
        return None;
    }
    let count = if hash != 0 && inside(hash, 8) {
        // SAFETY: DT_HASH starts with nbucket, nchain; nchain is the number of symbols.
        unsafe { (hash as *const u32).add(1).read() as usize }
    } else if gnu_hash != 0 && inside(gnu_hash, 16) {
        // SAFETY: inside the object (checked); the GNU hash table's layout.
        unsafe { gnu_hash_count(gnu_hash, &inside)? }
    } else {
        return None;
    };
    let bytes = (count as u64).checked_mul(syment)?;
    if count > MAX_SYMBOLS || !inside(symtab, bytes) {
        return None;
    }
    // SAFETY: `count` entries of the object's symbol table, inside its mapped span.
    let symbols = unsafe { std::slice::from_raw_parts(symtab as *const libc::Elf64_Sym, count) };
    let mut kinds = FxHashMap::default();
    kinds.reserve(count);
    for s in symbols {
        if s.st_shndx == 0 || s.st_value == 0 {
            continue;
        }
        let function = match s.st_info & 0xf {
            STT_FUNC | STT_GNU_IFUNC => true,
            STT_OBJECT => false,
            _ => continue,
        };
        kinds
            .entry(base.wrapping_add(s.st_value))
            .or_insert(function);
    }
    Some(kinds)
}

/// The number of symbols of a GNU hash table at `table`: one past the last symbol any
/// bucket's chain reaches (the symbols below `symoffset` are not in the table).
///
/// # Safety
/// `table` must be a mapped GNU hash table; `inside` says whether a range is mapped.
unsafe fn gnu_hash_count(table: u64, inside: &dyn Fn(u64, u64) -> bool) -> Option<usize> {
    let words = table as *const u32;
    // SAFETY: the 16-byte header, inside the object (the caller checked).
    let (nbuckets, symoffset, bloom_size) =
        unsafe { (words.read(), words.add(1).read(), words.add(2).read()) };
    let buckets = table + 16 + u64::from(bloom_size) * 8;
    if !inside(buckets, u64::from(nbuckets) * 4) {
        return None;
    }
    // SAFETY: `nbuckets` words, inside the object (checked above).
    let bucket_list =
        unsafe { std::slice::from_raw_parts(buckets as *const u32, nbuckets as usize) };
    let last = bucket_list.iter().copied().max().unwrap_or(0);
    if last < symoffset {
        return Some(symoffset as usize);
    }
    let chains = buckets + u64::from(nbuckets) * 4;
    let mut index = last;
    loop {
        let at = chains + u64::from(index - symoffset) * 4;
        if !inside(at, 4) || index as usize > MAX_SYMBOLS {
            return None;
        }
        // SAFETY: inside the object (checked just above).
        let hash = unsafe { (at as *const u32).read() };
        if hash & 1 != 0 {
            return Some(index as usize + 1);
        }
        index += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The same answers as `dladdr1`, for functions and data of libc and libm, and code
    /// where `dladdr1` has none (an IFUNC's choice).
    #[test]
    fn as_the_loaders_scan_says() {
        let names = [
            "printf",
            "puts",
            "malloc",
            "memcpy",
            "strlen",
            "strchr",
            "environ",
            "stdout",
            "stderr",
            "optarg",
            "sin",
            "cos",
            "__libc_single_threaded",
            "qsort",
            "tzname",
        ];
        let mut checked = 0;
        for name in names {
            let Some(address) = crate::loader::dlsym(std::ptr::null_mut(), name) else {
                continue;
            };
            match by_scan(address) {
                Some(kind) => assert_eq!(
                    host_symbol_is_function(address),
                    Some(kind),
                    "{name} at {address:#x}"
                ),
                // The loader's scan finds no symbol at what an IFUNC's resolver chose
                // (memcpy, strlen: a variant no symbol names); it is code all the same.
                None => assert_eq!(
                    host_symbol_is_function(address),
                    Some(true),
                    "{name} at {address:#x}, where an IFUNC resolver pointed"
                ),
            }
            checked += 1;
        }
        assert!(checked >= 10, "only {checked} of the names found");
        // Data is data, code is code.
        let environ = crate::loader::dlsym(std::ptr::null_mut(), "environ").unwrap();
        assert_eq!(host_symbol_is_function(environ), Some(false));
        let puts = crate::loader::dlsym(std::ptr::null_mut(), "puts").unwrap();
        assert_eq!(host_symbol_is_function(puts), Some(true));
        // Every object's table was read, not scanned: each has its kinds.
        let objects = OBJECTS.lock();
        let read = objects
            .iter()
            .filter(|o| matches!(o.kinds, Some(Some(_))))
            .count();
        assert!(read >= 1, "no object's table was read");
    }
}
