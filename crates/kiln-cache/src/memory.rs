//! A cache in this process's memory (a JIT that compiles the same code again within one
//! run; also the reference the other backends are tested against).

use crate::{entry, CacheError, CacheKey, CacheStats, Counters, MacKey, ObjectCache};
use parking_lot::Mutex;
use std::collections::HashMap;

/// Entries in memory, stored sealed (with a MAC under a key of this cache's own) as the
/// other backends store them.
#[derive(Debug)]
pub struct MemoryCache {
    entries: Mutex<HashMap<CacheKey, Vec<u8>>>,
    mac_key: MacKey,
    counters: Counters,
}

impl Default for MemoryCache {
    fn default() -> Self {
        Self::new()
    }
}

impl MemoryCache {
    /// An empty cache.
    pub fn new() -> Self {
        MemoryCache {
            entries: Mutex::default(),
            mac_key: MacKey::ephemeral(),
            counters: Counters::default(),
        }
    }
}

impl ObjectCache for MemoryCache {
    fn name(&self) -> String {
        "memory".into()
    }

    fn get(&self, key: &CacheKey) -> Result<Option<crate::CachedObject>, CacheError> {
        let mut entries = self.entries.lock();
        match entries
            .get(key)
            .map(|stored| entry::open(&self.mac_key, key, stored).map(<[u8]>::to_vec))
        {
            Some(Some(object)) => {
                self.counters.hit();
                self.counters.checked_whole();
                Ok(Some(object.into()))
            }
            Some(None) => {
                entries.remove(key);
                self.counters.reject();
                self.counters.miss();
                Ok(None)
            }
            None => {
                self.counters.miss();
                Ok(None)
            }
        }
    }

    fn put(&self, key: &CacheKey, object: &[u8]) -> Result<(), CacheError> {
        self.entries
            .lock()
            .insert(*key, entry::seal(&self.mac_key, key, object));
        self.counters.put();
        Ok(())
    }

    fn remove(&self, key: &CacheKey) -> Result<(), CacheError> {
        self.entries.lock().remove(key);
        Ok(())
    }

    fn stats(&self) -> CacheStats {
        self.counters.snapshot()
    }

    fn count_rejected(&self) {
        self.counters.reject();
    }
}
