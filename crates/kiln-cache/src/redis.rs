//! The Redis backend: entries as Redis strings under `kiln:v2:<key>`, sealed with the MAC
//! key (the fleet's, from `$KILN_CACHE_KEY_FILE`, or this user's), so that an entry nobody
//! holding the key made, or a corrupt one, is never loaded, whoever wrote it.
//!
//! Redis never hangs a run: every cache operation (connecting, the connection's set-up and
//! the command) has one deadline, `timeout` from its start, and a store that is down, slow,
//! read-only or full is a miss (a counted error and a [`CacheSkip`]), never a failure.
//! After a store was found down or slow, the operations of the next
//! [`UNAVAILABLE_FOR`] are skipped at once rather than each waiting for its deadline.
//!
//! Why the connection is not the `redis` crate's: its blocking `Connection` applies a
//! timeout per socket call (set once for the whole set-up, then once per command), so a
//! server that answers byte by byte, or half of the set-up, keeps a run waiting far past
//! any timeout (issue 23 saw 30 to 90 s). Here the deadline is checked, and the socket's
//! timeout set to what is left of it, before every read and write, and a reply is never
//! read past the entry limit. The `redis` crate still parses the URL, packs the commands
//! and parses the replies. The set-up is only what the URL asks for (`AUTH`, `SELECT`; no
//! `CLIENT SETINFO`); resolving a host name and connecting to a local socket, which take
//! no deadline of their own, run on a helper thread waited for until the deadline.

use crate::{entry, trust, CacheError, CacheKey, CacheSkip, CacheStats, Counters, MacKey};
use crate::{ObjectCache, SkipReason};
use parking_lot::Mutex;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

/// How long a store found down or slow is skipped without trying.
pub const UNAVAILABLE_FOR: Duration = Duration::from_secs(10);

/// Room for a reply's framing around an entry.
const FRAMING: u64 = 64;
/// The largest reply read for commands other than `GET`.
const SMALL_REPLY: u64 = 4096;

/// A cache in a Redis server.
pub struct RedisCache {
    url: String,
    info: redis::ConnectionInfo,
    connection: Mutex<Option<Connection>>,
    /// Until when, and why, operations are skipped without trying.
    unavailable: Mutex<Option<(Instant, SkipReason, String)>>,
    timeout: Duration,
    max_entry_bytes: u64,
    mac_key: MacKey,
    counters: Counters,
}

impl std::fmt::Debug for RedisCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisCache")
            .field("url", &self.url)
            .field("timeout", &self.timeout)
            .finish()
    }
}

/// Why an operation failed: the reason in a word, and the detail.
struct Failure(SkipReason, String);

impl Failure {
    fn io(error: &std::io::Error) -> Self {
        Failure(SkipReason::of_io(error), error.to_string())
    }
}

impl RedisCache {
    /// A cache at `url` (`redis://[user:password@]host:port[/db]` or
    /// `redis+unix:///path`), each operation bounded by `timeout`; connects on first use.
    /// Entries are sealed with the key in `$KILN_CACHE_KEY_FILE` (the key a fleet sharing
    /// the store configures), else with this user's own key (`key` in the default disk
    /// cache root, made on first use), so that only this user's entries are loaded.
    pub fn open(url: &str, timeout: Duration) -> Result<Self, CacheError> {
        let mac_key = match MacKey::configured()? {
            Some(key) => key,
            None => {
                let root = crate::DiskCache::default_root().ok_or_else(|| CacheError::Store {
                    store: url.to_string(),
                    what: format!(
                        "no key: set {} (or HOME, XDG_CACHE_HOME or KILN_CACHE_DIR for a key of this user's)",
                        trust::KEY_FILE_VARIABLE
                    ),
                })?;
                let root = trust::private_directory(&root)?;
                MacKey::load_or_create(&root.join("key"))?
            }
        };
        Self::open_with_key(url, timeout, mac_key)
    }

    /// A cache at `url` whose entries are sealed with `mac_key`.
    pub fn open_with_key(
        url: &str,
        timeout: Duration,
        mac_key: MacKey,
    ) -> Result<Self, CacheError> {
        let info = redis::IntoConnectionInfo::into_connection_info(url).map_err(|e| {
            CacheError::Store {
                store: url.to_string(),
                what: e.to_string(),
            }
        })?;
        Ok(RedisCache {
            url: url.to_string(),
            info,
            connection: Mutex::new(None),
            unavailable: Mutex::new(None),
            timeout,
            max_entry_bytes: crate::MAX_ENTRY_BYTES,
            mac_key,
            counters: Counters::default(),
        })
    }

    /// Sets the largest object an entry may hold (a bigger value is not read).
    pub fn with_max_entry_bytes(mut self, limit: u64) -> Self {
        self.max_entry_bytes = limit;
        self
    }

    fn redis_key(key: &CacheKey) -> String {
        format!("kiln:v2:{}", key.hex())
    }

    /// Runs `command` (connecting and setting up first if needed) within one deadline;
    /// its reply is read up to `limit` bytes. A failure drops the connection, so the next
    /// operation reconnects; a store found down or slow is skipped for a while.
    fn run(&self, command: &redis::Cmd, limit: u64) -> Result<redis::Value, Failure> {
        let deadline = Instant::now() + self.timeout;
        if let Some((until, reason, why)) = self.unavailable.lock().clone() {
            let now = Instant::now();
            if now < until {
                let ago = (UNAVAILABLE_FOR - (until - now)).as_secs_f64();
                return Err(Failure(
                    reason,
                    format!(
                        "{} (it was {reason} {ago:.1} s ago: {why})",
                        crate::NOT_TRIED
                    ),
                ));
            }
        }
        let mut slot = self.connection.lock();
        let result = (|| {
            if slot.is_none() {
                *slot = Some(Connection::open(&self.info, deadline)?);
            }
            let Some(connection) = slot.as_mut() else {
                return Err(Failure(SkipReason::Failed, "no connection".into()));
            };
            connection.send(&command.get_packed_command(), deadline)?;
            connection.receive(deadline, limit)
        })();
        if let Err(Failure(reason, why)) = &result {
            *slot = None;
            if matches!(reason, SkipReason::Down | SkipReason::Slow) {
                *self.unavailable.lock() =
                    Some((Instant::now() + UNAVAILABLE_FOR, *reason, why.clone()));
            }
        }
        result
    }

    fn skip(&self, operation: &'static str, Failure(reason, why): Failure) -> CacheError {
        self.counters.skip(self.name(), operation, reason, &why);
        CacheError::Store {
            store: self.url.clone(),
            what: format!("{reason}: {why}"),
        }
    }
}

/// The reason an error reply stands for.
fn server_error(error: &redis::ServerError) -> Failure {
    let reason = match error.code() {
        "READONLY" => SkipReason::ReadOnly,
        "OOM" => SkipReason::Full,
        "LOADING" | "BUSY" | "MASTERDOWN" | "TRYAGAIN" => SkipReason::Slow,
        _ => SkipReason::Refused,
    };
    let detail = match error.details() {
        Some(details) => format!("{} {details}", error.code()),
        None => error.code().to_string(),
    };
    Failure(reason, detail)
}

fn unexpected(what: &str, value: &redis::Value) -> Failure {
    Failure(
        SkipReason::Failed,
        format!("unexpected reply to {what}: {value:?}"),
    )
}

impl ObjectCache for RedisCache {
    fn name(&self) -> String {
        self.url.clone()
    }

    fn get(&self, key: &CacheKey) -> Result<Option<crate::CachedObject>, CacheError> {
        let name = Self::redis_key(key);
        let limit = self
            .max_entry_bytes
            .saturating_add(entry::HEADER as u64 + FRAMING);
        let stored = match self.run(redis::cmd("GET").arg(&name), limit) {
            Ok(redis::Value::Nil) => None,
            Ok(redis::Value::BulkString(bytes)) => Some(bytes),
            Ok(redis::Value::ServerError(e)) => {
                self.skip("lookup", server_error(&e));
                self.counters.miss();
                return Ok(None);
            }
            Ok(other) => {
                // Not a string: nothing Kiln stores, whoever put it there.
                tracing::warn!(store = %self.url, key = %name, value = ?other,
                    "a cache key holding no entry: removed");
                self.counters.reject();
                self.counters.miss();
                let _ = self.remove(key);
                return Ok(None);
            }
            Err(failure) => {
                // Down, slow or refusing: a miss, and the run compiles.
                self.skip("lookup", failure);
                self.counters.miss();
                return Ok(None);
            }
        };
        match stored
            .as_deref()
            .map(|s| entry::open(&self.mac_key, key, s))
        {
            Some(Some(object)) => {
                self.counters.hit();
                self.counters.checked_whole();
                Ok(Some(object.to_vec().into()))
            }
            Some(None) => {
                tracing::warn!(store = %self.url, key = %name,
                    "a cache entry not sealed with this cache's key, or corrupt: removed");
                self.counters.reject();
                self.counters.miss();
                let _ = self.remove(key);
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
        let sealed = entry::seal(&self.mac_key, key, object);
        match self.run(redis::cmd("SET").arg(&name).arg(sealed), SMALL_REPLY) {
            Ok(redis::Value::Okay) => {
                self.counters.put();
                Ok(())
            }
            Ok(redis::Value::ServerError(e)) => Err(self.skip("store", server_error(&e))),
            Ok(other) => Err(self.skip("store", unexpected("SET", &other))),
            Err(failure) => Err(self.skip("store", failure)),
        }
    }

    fn remove(&self, key: &CacheKey) -> Result<(), CacheError> {
        let name = Self::redis_key(key);
        match self.run(redis::cmd("DEL").arg(&name), SMALL_REPLY) {
            Ok(redis::Value::Int(_)) => Ok(()),
            Ok(redis::Value::ServerError(e)) => Err(self.skip("remove", server_error(&e))),
            Ok(other) => Err(self.skip("remove", unexpected("DEL", &other))),
            Err(failure) => Err(self.skip("remove", failure)),
        }
    }

    fn stats(&self) -> CacheStats {
        self.counters.snapshot()
    }

    fn count_rejected(&self) {
        self.counters.reject();
    }

    fn take_skips(&self) -> Vec<CacheSkip> {
        self.counters.take_skips()
    }
}

/// A socket to the server.
enum Stream {
    Tcp(TcpStream),
    Unix(UnixStream),
}

impl Stream {
    fn set_timeouts(&self, left: Duration) -> std::io::Result<()> {
        match self {
            Stream::Tcp(s) => {
                s.set_read_timeout(Some(left))?;
                s.set_write_timeout(Some(left))
            }
            Stream::Unix(s) => {
                s.set_read_timeout(Some(left))?;
                s.set_write_timeout(Some(left))
            }
        }
    }
}

/// What is left until `deadline`, or a time-out error if nothing is.
fn left(deadline: Instant) -> std::io::Result<Duration> {
    deadline
        .checked_duration_since(Instant::now())
        .filter(|d| !d.is_zero())
        .ok_or_else(|| {
            std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "no answer within the deadline",
            )
        })
}

/// A socket call's time-out reads as `WouldBlock` on Linux: it is a time-out.
fn timed_out(error: std::io::Error) -> std::io::Error {
    if error.kind() == std::io::ErrorKind::WouldBlock {
        std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            "no answer within the deadline",
        )
    } else {
        error
    }
}

/// Reads from a stream within a deadline and up to a number of bytes, remembering the
/// first I/O error (the reply parser wraps it).
struct Bounded<'a> {
    stream: &'a mut Stream,
    deadline: Instant,
    budget: u64,
    failure: Option<std::io::Error>,
}

impl Bounded<'_> {
    fn read_inner(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.stream.set_timeouts(left(self.deadline)?)?;
        if self.budget == 0 {
            return Err(std::io::Error::other("a reply larger than the entry limit"));
        }
        let room = usize::try_from(self.budget).unwrap_or(usize::MAX);
        let len = buf.len().min(room);
        let Some(buf) = buf.get_mut(..len) else {
            return Ok(0);
        };
        let n = match self.stream {
            Stream::Tcp(s) => s.read(buf),
            Stream::Unix(s) => s.read(buf),
        }
        .map_err(timed_out)?;
        if n == 0 && !buf.is_empty() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "the server closed the connection",
            ));
        }
        self.budget -= n as u64;
        Ok(n)
    }
}

impl Read for Bounded<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.read_inner(buf).inspect_err(|e| {
            if self.failure.is_none() {
                self.failure = Some(std::io::Error::new(e.kind(), e.to_string()));
            }
        })
    }
}

/// A connection, set up (authenticated, its database selected).
struct Connection {
    stream: Stream,
    parser: redis::Parser,
}

impl Connection {
    /// Connects to the server `info` names and sets the connection up, all before
    /// `deadline`.
    fn open(info: &redis::ConnectionInfo, deadline: Instant) -> Result<Self, Failure> {
        let stream = match info.addr() {
            redis::ConnectionAddr::Tcp(host, port) => {
                Stream::Tcp(connect_tcp(host, *port, deadline)?)
            }
            redis::ConnectionAddr::Unix(path) => Stream::Unix(connect_unix(path, deadline)?),
            other => {
                return Err(Failure(
                    SkipReason::Failed,
                    format!("{other}: only redis:// and redis+unix:// are supported"),
                ))
            }
        };
        let mut connection = Connection {
            stream,
            parser: redis::Parser::new(),
        };
        // The set-up, pipelined: AUTH if the URL has a password, SELECT if it names a
        // database other than 0. Every reply must come before the deadline.
        let settings = info.redis_settings();
        let mut setup = Vec::new();
        if let Some(password) = settings.password() {
            let mut auth = redis::cmd("AUTH");
            if let Some(user) = settings.username() {
                auth.arg(user);
            }
            auth.arg(password);
            setup.push(("AUTH", auth));
        }
        if settings.db() != 0 {
            let mut select = redis::cmd("SELECT");
            select.arg(settings.db());
            setup.push(("SELECT", select));
        }
        let mut packed = Vec::new();
        for (_, command) in &setup {
            command.write_packed_command(&mut packed);
        }
        if !packed.is_empty() {
            connection.send(&packed, deadline)?;
        }
        for (name, _) in &setup {
            match connection.receive(deadline, SMALL_REPLY)? {
                redis::Value::Okay => {}
                redis::Value::ServerError(e) => {
                    let Failure(reason, detail) = server_error(&e);
                    return Err(Failure(reason, format!("{name}: {detail}")));
                }
                other => return Err(unexpected(name, &other)),
            }
        }
        Ok(connection)
    }

    fn send(&mut self, bytes: &[u8], deadline: Instant) -> Result<(), Failure> {
        let mut rest = bytes;
        while !rest.is_empty() {
            let result = left(deadline)
                .and_then(|left| self.stream.set_timeouts(left))
                .and_then(|()| match &mut self.stream {
                    Stream::Tcp(s) => s.write(rest),
                    Stream::Unix(s) => s.write(rest),
                })
                .map_err(timed_out);
            match result {
                Ok(0) => {
                    return Err(Failure(
                        SkipReason::Down,
                        "the server closed the connection".into(),
                    ))
                }
                Ok(n) => rest = rest.get(n..).unwrap_or_default(),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(Failure::io(&e)),
            }
        }
        Ok(())
    }

    fn receive(&mut self, deadline: Instant, limit: u64) -> Result<redis::Value, Failure> {
        let mut reader = Bounded {
            stream: &mut self.stream,
            deadline,
            budget: limit,
            failure: None,
        };
        match self.parser.parse_value(&mut reader) {
            Ok(value) => Ok(value),
            Err(error) => Err(match reader.failure.take() {
                Some(io) => Failure::io(&io),
                None => Failure(SkipReason::Failed, format!("not a Redis reply: {error}")),
            }),
        }
    }
}

/// Runs `work` on a helper thread and waits for it until `deadline`: for the blocking
/// calls that take no deadline (a name's resolution, a local socket's connect to a server
/// whose backlog is full). One that outlives the deadline is left to finish alone.
fn before<T: Send + 'static>(
    deadline: Instant,
    what: &str,
    work: impl FnOnce() -> std::io::Result<T> + Send + 'static,
) -> Result<T, Failure> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name("kiln-redis-connect".into())
        .spawn(move || {
            let _ = tx.send(work());
        })
        .map_err(|e| Failure::io(&e))?;
    let wait = left(deadline).map_err(|e| Failure::io(&e))?;
    match rx.recv_timeout(wait) {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(e)) => {
            let Failure(reason, detail) = Failure::io(&e);
            Err(Failure(reason, format!("{what}: {detail}")))
        }
        Err(_) => Err(Failure(
            SkipReason::Slow,
            format!("{what}: no answer within the deadline"),
        )),
    }
}

/// A connection to the local socket `path`, made before `deadline`.
fn connect_unix(path: &std::path::Path, deadline: Instant) -> Result<UnixStream, Failure> {
    let target = path.to_path_buf();
    before(deadline, &path.display().to_string(), move || {
        UnixStream::connect(target)
    })
    .map_err(|Failure(reason, detail)| match reason {
        // No socket there (NotFound): no server.
        SkipReason::Failed => Failure(SkipReason::Down, detail),
        other => Failure(other, detail),
    })
}

/// A TCP connection to `host:port` made before `deadline`: the name is resolved on a
/// helper thread (the resolver has no deadline of its own; one that outlives ours is left
/// to finish alone), then each address is tried with what is left of the deadline.
fn connect_tcp(host: &str, port: u16, deadline: Instant) -> Result<TcpStream, Failure> {
    let addresses: Vec<SocketAddr> = match host.parse::<std::net::IpAddr>() {
        Ok(ip) => vec![SocketAddr::new(ip, port)],
        Err(_) => {
            let name = (host.to_string(), port);
            let resolved = before(deadline, host, move || {
                name.to_socket_addrs().map(|a| a.collect::<Vec<_>>())
            });
            match resolved {
                // A name that does not resolve: nothing to reach.
                Err(Failure(SkipReason::Failed, detail)) => {
                    return Err(Failure(SkipReason::Down, detail))
                }
                other => other?,
            }
        }
    };
    let mut last = Failure(SkipReason::Down, format!("{host}: no address"));
    for address in addresses {
        let wait = left(deadline).map_err(|e| Failure::io(&e))?;
        match TcpStream::connect_timeout(&address, wait) {
            Ok(stream) => {
                let _ = stream.set_nodelay(true);
                return Ok(stream);
            }
            Err(e) => last = Failure::io(&timed_out(e)),
        }
    }
    Err(last)
}
