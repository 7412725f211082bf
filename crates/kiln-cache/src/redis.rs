//! The Redis backend: entries as Redis strings under `kiln:v1:<key>`, stored sealed
//! (checksummed) as on disk, so an entry whose checksum or signature does not match is
//! never loaded, whoever wrote it. Every operation has a timeout; a store that is down is
//! a miss (and a counted error), never a failure of the run.

use crate::{entry, CacheError, CacheKey, CacheStats, Counters, ObjectCache};
use parking_lot::Mutex;
use std::time::Duration;

/// A cache in a Redis server.
pub struct RedisCache {
    url: String,
    client: redis::Client,
    connection: Mutex<Option<redis::Connection>>,
    timeout: Duration,
    counters: Counters,
}

impl std::fmt::Debug for RedisCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisCache")
            .field("url", &self.url)
            .finish()
    }
}

impl RedisCache {
    /// A cache at `url` (`redis://host:port/`); connects on first use, each operation
    /// bounded by `timeout`.
    pub fn open(url: &str, timeout: Duration) -> Result<Self, CacheError> {
        let client = redis::Client::open(url).map_err(|e| CacheError::Store {
            store: url.to_string(),
            what: e.to_string(),
        })?;
        Ok(RedisCache {
            url: url.to_string(),
            client,
            connection: Mutex::new(None),
            timeout,
            counters: Counters::default(),
        })
    }

    fn store_error(&self, e: impl std::fmt::Display) -> CacheError {
        CacheError::Store {
            store: self.url.clone(),
            what: e.to_string(),
        }
    }

    /// Runs `f` on a connection (made if needed); a failed operation drops the
    /// connection, so the next one reconnects.
    fn with<T>(
        &self,
        f: impl FnOnce(&mut redis::Connection) -> redis::RedisResult<T>,
    ) -> Result<T, CacheError> {
        let mut slot = self.connection.lock();
        if slot.is_none() {
            let connection = self
                .client
                .get_connection_with_timeout(self.timeout)
                .map_err(|e| self.store_error(e))?;
            connection
                .set_read_timeout(Some(self.timeout))
                .and_then(|()| connection.set_write_timeout(Some(self.timeout)))
                .map_err(|e| self.store_error(e))?;
            *slot = Some(connection);
        }
        let Some(connection) = slot.as_mut() else {
            return Err(self.store_error("no connection"));
        };
        f(connection).map_err(|e| {
            *slot = None;
            self.store_error(e)
        })
    }

    fn redis_key(key: &CacheKey) -> String {
        format!("kiln:v1:{}", key.hex())
    }
}

impl ObjectCache for RedisCache {
    fn name(&self) -> String {
        self.url.clone()
    }

    fn get(&self, key: &CacheKey) -> Result<Option<Vec<u8>>, CacheError> {
        let name = Self::redis_key(key);
        let stored: Option<Vec<u8>> = match self.with(|c| redis::cmd("GET").arg(&name).query(c)) {
            Ok(v) => v,
            Err(e) => {
                // Down or slow: a miss, and the run compiles.
                tracing::warn!(error = %e, "redis cache unavailable");
                self.counters.error();
                self.counters.miss();
                return Ok(None);
            }
        };
        match stored.as_deref().map(entry::open) {
            Some(Some(object)) => {
                self.counters.hit();
                Ok(Some(object.to_vec()))
            }
            Some(None) => {
                self.counters.reject();
                self.counters.miss();
                let _ = self.with(|c| redis::cmd("DEL").arg(&name).query::<i64>(c));
                Ok(None)
            }
            None => {
                self.counters.miss();
                Ok(None)
            }
        }
    }

    fn put(&self, key: &CacheKey, object: &[u8]) -> Result<(), CacheError> {
        let name = Self::redis_key(key);
        let sealed = entry::seal(object);
        match self.with(|c| redis::cmd("SET").arg(&name).arg(sealed).query::<()>(c)) {
            Ok(()) => {
                self.counters.put();
                Ok(())
            }
            Err(e) => {
                self.counters.error();
                Err(e)
            }
        }
    }

    fn remove(&self, key: &CacheKey) -> Result<(), CacheError> {
        let name = Self::redis_key(key);
        self.with(|c| redis::cmd("DEL").arg(&name).query::<i64>(c))
            .map(|_| ())
    }

    fn stats(&self) -> CacheStats {
        self.counters.snapshot()
    }

    fn count_rejected(&self) {
        self.counters.reject();
    }
}
