//! Guards on the executor's threads that run code for requests, so that a body replaced
//! out of process (`StoreCodePointer`) is freed only when no thread can be in it.
//!
//! The scheme is the one a session uses in process (see `kiln::lazy`), kept by the
//! executor for its own threads: each request that runs code (main, a call, initializers)
//! holds a [`Guard`] of the epoch current when its code started; a store of a stub's slot
//! [`advance`]s the epoch and gives the controller the epoch of the store; the controller
//! frees a body retired at epoch `e` once [`oldest`] is later than `e`, i.e. once every
//! guard held when it was replaced has been dropped. A thread whose guard came after the
//! store loads the new slot (the store precedes the epoch's advance, which precedes the
//! guard's reading of it).
//!
//! Guards are taken once per request, not per call, so a mutex over the epochs held is
//! cheap enough and simpler to show right than a lock-free scheme.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// The epoch now: advanced by each store of a stub's slot.
static EPOCH: AtomicU64 = AtomicU64::new(1);

/// The epoch of each guard held (a multiset: equal epochs repeat).
static HELD: Mutex<Vec<u64>> = Mutex::new(Vec::new());

/// While it lives, bodies replaced after it was taken are not freed.
#[derive(Debug)]
pub struct Guard {
    epoch: u64,
}

/// Guards the calling thread's run of JIT code.
pub fn pin() -> Guard {
    let mut held = HELD.lock().unwrap_or_else(|p| p.into_inner());
    let epoch = EPOCH.load(Ordering::SeqCst);
    held.push(epoch);
    Guard { epoch }
}

impl Drop for Guard {
    fn drop(&mut self) {
        let mut held = HELD.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(i) = held.iter().position(|&e| e == self.epoch) {
            held.swap_remove(i);
        }
    }
}

/// After a slot's store: the epoch the replaced body was retired at.
pub fn advance() -> u64 {
    // Under the lock: a guard taken concurrently reads the epoch either before (and is
    // counted at it) or after (and loads the new slot).
    let _held = HELD.lock().unwrap_or_else(|p| p.into_inner());
    EPOCH.fetch_add(1, Ordering::SeqCst)
}

/// The epoch now (the next [`advance`] returns it).
pub fn now() -> u64 {
    EPOCH.load(Ordering::SeqCst)
}

/// The epoch of the oldest guard held, or the epoch now when none is: a body retired at
/// an epoch before it is unreachable.
pub fn oldest() -> u64 {
    let held = HELD.lock().unwrap_or_else(|p| p.into_inner());
    held.iter()
        .copied()
        .min()
        .unwrap_or_else(|| EPOCH.load(Ordering::SeqCst))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_body_retired_under_a_guard_waits_for_it() {
        let before = pin();
        let retired = advance();
        assert!(oldest() <= retired, "the guard from before holds it");
        let after = pin();
        drop(before);
        assert!(oldest() > retired, "a guard from after does not");
        drop(after);
        assert!(oldest() > retired);
    }
}
