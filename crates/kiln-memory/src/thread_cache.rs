//! Each thread's cache of freed ranges: the allocator's fast path.
//!
//! A range freed on a thread (already filled with trap bytes if it held code) stays with
//! that thread, up to [`MAX_ENTRIES`] ranges and [`MAX_BYTES`] bytes, instead of going
//! back to its arena's free list under the arena's lock. The thread's next allocation of a
//! size that fits a cached range takes it without any lock and without touching the heap:
//! a best fit among a few dozen entries, the rest of the range kept. Neighbouring ranges
//! are joined in the cache; when the cache is full, its older half goes back to the arenas,
//! one lock per arena.
//!
//! Only pools that share pages are cached: a private pool's pages lose their permissions
//! when freed, and a cached range would keep them.
//!
//! Entries name their slab by a weak reference: a cache never keeps a slab (and its
//! reservation) alive, and a range of a slab that is gone is simply forgotten. Ranges of
//! a thread that exits go back to their arenas.

use crate::slab::Slab;
use crate::{Permission, Segments};
use std::cell::RefCell;
use std::sync::{Arc, Weak};

/// Ranges a thread keeps at most.
pub(crate) const MAX_ENTRIES: usize = 32;
/// Bytes a thread keeps at most.
pub(crate) const MAX_BYTES: u64 = 256 << 10;
/// Larger ranges go straight back to their arena (where they can be joined and released).
pub(crate) const MAX_RANGE: u64 = 64 << 10;

/// Whose a cached range is: a manager's slab, pool and arena. Few per thread.
struct Key {
    /// The manager's id (`Slab::owner`).
    owner: u64,
    /// The slab's address, for comparisons (the weak reference keeps it unique).
    slab: *const Slab,
    weak: Weak<Slab>,
    permission: Permission,
    arena: usize,
}

/// One cached free range, `[start, end)`, of `keys[key]`.
#[derive(Clone, Copy)]
struct Entry {
    start: u64,
    end: u64,
    key: usize,
}

/// One thread's cache.
struct ThreadCache {
    keys: Vec<Key>,
    entries: Vec<Entry>,
    bytes: u64,
    /// Ranges on their way back to their arenas (kept, so that giving back does not
    /// allocate once the cache has its size).
    scratch: Vec<Entry>,
}

/// Keys a thread tracks at most (a bit each in a mask).
const MAX_KEYS: usize = 64;

impl ThreadCache {
    /// The key of `slab`'s arena `arena` of `permission`, made if new.
    fn key(&mut self, slab: &Arc<Slab>, permission: Permission, arena: usize) -> usize {
        let ptr = Arc::as_ptr(slab);
        if let Some(k) = self
            .keys
            .iter()
            .position(|k| k.slab == ptr && k.permission == permission && k.arena == arena)
        {
            return k;
        }
        if self.keys.len() == MAX_KEYS {
            self.give_back_all();
        }
        self.keys.push(Key {
            owner: slab.owner,
            slab: ptr,
            weak: Arc::downgrade(slab),
            permission,
            arena,
        });
        self.keys.len() - 1
    }

    /// Adds a free range, joined with cached neighbours; gives everything back when full.
    fn put(
        &mut self,
        slab: &Arc<Slab>,
        permission: Permission,
        arena: usize,
        start: u64,
        end: u64,
    ) {
        let key = self.key(slab, permission, arena);
        let (mut lo, mut hi) = (start, end);
        let mut joined = 0i64;
        let mut i = 0;
        while i < self.entries.len() {
            let e = self.entries[i];
            if (e.end == lo || e.start == hi) && e.key == key {
                lo = lo.min(e.start);
                hi = hi.max(e.end);
                self.entries.swap_remove(i);
                joined += 1;
            } else {
                i += 1;
            }
        }
        slab.note_cached(permission, arena, (end - start) as i64, 1 - joined);
        self.bytes += end - start;
        self.entries.push(Entry {
            start: lo,
            end: hi,
            key,
        });
        if self.entries.len() > MAX_ENTRIES || self.bytes > MAX_BYTES {
            // Full: everything but this range goes back (the range freed last is the one
            // most likely to be asked for next).
            let newest = self.entries.pop();
            self.give_back(|_| true);
            if let Some(newest) = newest {
                self.bytes += newest.end - newest.start;
                self.entries.push(newest);
            }
        }
    }

    /// Takes `size` bytes aligned to `align` of `permission` for manager `owner`, from
    /// `slab` if given, else from any of its slabs: the best fit. Returns the slab (alive),
    /// the address and the arena.
    fn take(
        &mut self,
        owner: u64,
        slab: Option<*const Slab>,
        permission: Permission,
        size: u64,
        align: u64,
    ) -> Option<(Arc<Slab>, u64, usize)> {
        let mut mask = 0u64;
        for (i, k) in self.keys.iter().enumerate() {
            if k.owner == owner && k.permission == permission && slab.is_none_or(|s| s == k.slab) {
                mask |= 1 << i;
            }
        }
        loop {
            let mut best: Option<(usize, u64, u64)> = None;
            for (i, e) in self.entries.iter().enumerate() {
                let len = e.end - e.start;
                if mask >> e.key & 1 == 0 || len < size || best.is_some_and(|b| b.2 <= len) {
                    continue;
                }
                let at = e.start.next_multiple_of(align);
                if at + size <= e.end {
                    best = Some((i, at, len));
                }
            }
            let (best, at, _) = best?;
            let e = self.entries[best];
            let Some(alive) = self.keys[e.key].weak.upgrade() else {
                // The slab is gone, and its ranges with it.
                mask &= !(1 << e.key);
                self.entries.retain(|x| x.key != e.key);
                self.bytes = self.entries.iter().map(|x| x.end - x.start).sum();
                continue;
            };
            let front = (e.start < at).then_some((e.start, at));
            let back = (at + size < e.end).then_some((at + size, e.end));
            let pieces = i64::from(front.is_some()) + i64::from(back.is_some());
            match (front, back) {
                (Some((lo, hi)), other) => {
                    self.entries[best] = Entry {
                        start: lo,
                        end: hi,
                        key: e.key,
                    };
                    if let Some((lo, hi)) = other {
                        self.entries.push(Entry {
                            start: lo,
                            end: hi,
                            key: e.key,
                        });
                    }
                }
                (None, Some((lo, hi))) => {
                    self.entries[best] = Entry {
                        start: lo,
                        end: hi,
                        key: e.key,
                    };
                }
                (None, None) => {
                    self.entries.swap_remove(best);
                }
            }
            self.bytes -= size;
            let (permission, arena) = (self.keys[e.key].permission, self.keys[e.key].arena);
            alive.note_cached(permission, arena, -(size as i64), pieces - 1);
            return Some((alive, at, arena));
        }
    }

    /// Gives back every range whose key `pick` chooses, one lock per arena.
    fn give_back(&mut self, pick: impl Fn(&Key) -> bool) {
        let mut chosen = 0u64;
        for (i, k) in self.keys.iter().enumerate() {
            if pick(k) {
                chosen |= 1 << i;
            }
        }
        let mut back = std::mem::take(&mut self.scratch);
        back.clear();
        self.entries.retain(|e| {
            let go = chosen >> e.key & 1 == 1;
            if go {
                back.push(*e);
            }
            !go
        });
        self.bytes = self.entries.iter().map(|e| e.end - e.start).sum();
        back.sort_unstable_by_key(|e| (e.key, e.start));
        for group in back.chunk_by(|a, b| a.key == b.key) {
            let key = &self.keys[group[0].key];
            // A slab that is gone took its ranges with it.
            let Some(slab) = key.weak.upgrade() else {
                continue;
            };
            let bytes: u64 = group.iter().map(|e| e.end - e.start).sum();
            slab.note_cached(
                key.permission,
                key.arena,
                -(bytes as i64),
                -(group.len() as i64),
            );
            if let Err(error) = slab.return_ranges(
                key.permission,
                key.arena,
                group.iter().map(|e| (e.start, e.end)),
            ) {
                tracing::warn!(%error, "returning cached free ranges failed");
            }
        }
        back.clear();
        self.scratch = back;
    }

    /// Gives back everything and forgets the keys.
    fn give_back_all(&mut self) {
        self.give_back(|_| true);
        self.keys.clear();
    }

    /// Gives back every range of manager `owner`.
    fn flush(&mut self, owner: u64) {
        self.give_back(|k| k.owner == owner);
    }
}

impl Drop for ThreadCache {
    fn drop(&mut self) {
        self.give_back_all();
    }
}

thread_local! {
    static CACHE: RefCell<ThreadCache> = const {
        RefCell::new(ThreadCache {
            keys: Vec::new(),
            entries: Vec::new(),
            bytes: 0,
            scratch: Vec::new(),
        })
    };
}

/// Keeps the free range `[start, start + len)` of `slab` in this thread's cache. `false`
/// when it cannot be cached (too large, a private pool, the thread is exiting): the caller
/// returns it to its arena.
///
/// The range must be a live range of `slab`'s pool of `permission`, in arena `arena`,
/// already counted as freed (`Slab::note_freed`) and filled with trap bytes if it held
/// code.
pub(crate) fn put(
    slab: &Arc<Slab>,
    permission: Permission,
    arena: usize,
    start: u64,
    len: u64,
) -> bool {
    if len > MAX_RANGE || !slab.is_shared(permission) {
        return false;
    }
    CACHE
        .try_with(|c| match c.try_borrow_mut() {
            Ok(mut cache) => {
                cache.put(slab, permission, arena, start, start + len);
                true
            }
            Err(_) => false,
        })
        .unwrap_or(false)
}

/// Ranges taken from a thread's cache: their slab, and `(target, arena)` per segment.
pub(crate) type Taken = (Arc<Slab>, Segments<(u64, usize)>);

/// Takes ranges for every `(permission, taken, align)` in `wanted` from this thread's
/// cache, all in one slab of manager `owner`: the slab and `(target, arena)` per segment,
/// or `None` (and the cache as it was) when not all fit.
pub(crate) fn take_all(
    owner: u64,
    wanted: impl ExactSizeIterator<Item = (Permission, u64, u64)> + Clone,
) -> Option<Taken> {
    CACHE
        .try_with(|c| {
            let mut cache = c.try_borrow_mut().ok()?;
            let mut slab: Option<Arc<Slab>> = None;
            let mut placed: Segments<(u64, usize)> = Segments::new();
            for (permission, taken, align) in wanted.clone() {
                match cache.take(
                    owner,
                    slab.as_ref().map(Arc::as_ptr),
                    permission,
                    taken,
                    align,
                ) {
                    Some((s, at, arena)) => {
                        slab.get_or_insert(s);
                        placed.push((at, arena));
                    }
                    None => {
                        // Put back what this call took: the cache is as it was, joined.
                        if let Some(s) = &slab {
                            for ((permission, taken, _), &(at, arena)) in wanted.zip(&placed) {
                                cache.put(s, permission, arena, at, at + taken);
                            }
                        }
                        return None;
                    }
                }
            }
            slab.map(|s| (s, placed))
        })
        .ok()
        .flatten()
}

/// Gives this thread's cached ranges of manager `owner` back to their arenas.
pub(crate) fn flush(owner: u64) {
    let _ = CACHE.try_with(|c| {
        if let Ok(mut cache) = c.try_borrow_mut() {
            cache.flush(owner);
        }
    });
}
