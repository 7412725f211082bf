//! Redis never hangs a run, and says why it was skipped: fake servers in the test (one
//! that accepts and never answers, one that answers half of the set-up, one that answers
//! a byte at a time, none at all) and a real `redis-server` made read-only, full, and
//! holding entries sealed with another key.

use kiln_cache::{CacheKey, MacKey, ObjectCache, RedisCache, SkipReason};
use std::io::{Read, Write};
use std::net::TcpListener;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const TIMEOUT: Duration = Duration::from_millis(400);
/// What a bounded operation may take beyond its deadline (scheduling on a busy machine).
const SLACK: Duration = Duration::from_millis(600);

fn key() -> MacKey {
    MacKey::from_bytes([5; 32])
}

/// A server on a loopback port that runs `serve` on each connection until the test ends.
struct FakeServer {
    port: u16,
    stop: Arc<AtomicBool>,
}

impl FakeServer {
    fn start(serve: fn(std::net::TcpStream, &AtomicBool)) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        listener.set_nonblocking(true).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        std::thread::spawn(move || {
            let deadline = Instant::now() + Duration::from_secs(60);
            while !flag.load(Ordering::Relaxed) && Instant::now() < deadline {
                match listener.accept() {
                    Ok((stream, _)) => {
                        stream.set_nonblocking(false).unwrap();
                        let flag = flag.clone();
                        std::thread::spawn(move || serve(stream, &flag));
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
        });
        FakeServer { port, stop }
    }

    fn url(&self, rest: &str) -> String {
        format!("redis://{rest}127.0.0.1:{}/", self.port)
    }
}

impl Drop for FakeServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// Keeps the connection open, reading and answering nothing, until the test ends.
fn hold(mut stream: std::net::TcpStream, stop: &AtomicBool) {
    stream
        .set_read_timeout(Some(Duration::from_millis(50)))
        .unwrap();
    let mut buf = [0u8; 4096];
    while !stop.load(Ordering::Relaxed) {
        if let Ok(0) = stream.read(&mut buf) {
            return;
        }
    }
}

fn silent(stream: std::net::TcpStream, stop: &AtomicBool) {
    hold(stream, stop);
}

/// Answers the first command of the set-up (AUTH) and nothing after.
fn half(mut stream: std::net::TcpStream, stop: &AtomicBool) {
    let mut buf = [0u8; 4096];
    let _ = stream.read(&mut buf);
    let _ = stream.write_all(b"+OK\r\n");
    hold(stream, stop);
}

/// Answers every command with a long bulk string, one byte every 50 ms.
fn trickle(mut stream: std::net::TcpStream, stop: &AtomicBool) {
    let mut buf = [0u8; 4096];
    let _ = stream.read(&mut buf);
    let _ = stream.write_all(b"$100000\r\n");
    while !stop.load(Ordering::Relaxed) {
        if stream.write_all(b"x").is_err() {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Answers a lookup with a value far over the entry limit.
fn giant(mut stream: std::net::TcpStream, stop: &AtomicBool) {
    let mut buf = [0u8; 4096];
    let _ = stream.read(&mut buf);
    let _ = stream.write_all(b"$536870912\r\n");
    let chunk = vec![b'z'; 1 << 16];
    for _ in 0..(1 << 13) {
        if stop.load(Ordering::Relaxed) || stream.write_all(&chunk).is_err() {
            return;
        }
    }
}

/// Looks up a key, checking it is a miss within the deadline, and returns why it was
/// skipped.
fn lookup_skipped(cache: &RedisCache) -> kiln_cache::CacheSkip {
    let started = Instant::now();
    assert!(cache.get(&CacheKey([3; 32])).unwrap().is_none(), "a miss");
    let took = started.elapsed();
    assert!(took < TIMEOUT + SLACK, "bounded by the deadline: {took:?}");
    let mut skips = cache.take_skips();
    assert_eq!(skips.len(), 1, "{skips:?}");
    assert!(cache.stats().errors >= 1);
    skips.remove(0)
}

#[test]
fn a_server_that_accepts_and_never_answers_is_slow_not_a_hang() {
    let server = FakeServer::start(silent);
    let cache = RedisCache::open_with_key(&server.url(""), TIMEOUT, key()).unwrap();
    let skip = lookup_skipped(&cache);
    assert_eq!(skip.reason, SkipReason::Slow, "{skip}");
    assert_eq!(skip.operation, "lookup");
    assert!(skip.to_string().contains("(slow)"), "{skip}");
    // The next operations do not wait again: the store is skipped for a while.
    let started = Instant::now();
    assert!(cache.put(&CacheKey([3; 32]), b"object").is_err());
    assert!(cache.get(&CacheKey([3; 32])).unwrap().is_none());
    // Less than one operation's deadline: neither waited.
    assert!(started.elapsed() < TIMEOUT, "{:?}", started.elapsed());
    let skips = cache.take_skips();
    assert_eq!(
        skips.len(),
        1,
        "one word for operations not tried: {skips:?}"
    );
    assert_eq!(skips[0].reason, SkipReason::Slow);
    assert_eq!(cache.stats().errors, 3, "each counted");
    assert!(skips[0].detail.contains("not tried"), "{skips:?}");
}

#[test]
fn a_server_that_answers_half_of_the_set_up_is_slow_not_a_hang() {
    let server = FakeServer::start(half);
    // A password and a database: the set-up is AUTH then SELECT, pipelined.
    let url = format!("redis://:secret@127.0.0.1:{}/3", server.port);
    let cache = RedisCache::open_with_key(&url, TIMEOUT, key()).unwrap();
    let skip = lookup_skipped(&cache);
    assert_eq!(skip.reason, SkipReason::Slow, "{skip}");
}

#[test]
fn a_server_that_answers_a_byte_at_a_time_is_cut_at_the_deadline() {
    let server = FakeServer::start(trickle);
    let cache = RedisCache::open_with_key(&server.url(""), TIMEOUT, key()).unwrap();
    let skip = lookup_skipped(&cache);
    assert_eq!(skip.reason, SkipReason::Slow, "{skip}");
}

#[test]
fn a_value_over_the_entry_limit_is_not_read() {
    let server = FakeServer::start(giant);
    let cache = RedisCache::open_with_key(&server.url(""), Duration::from_secs(5), key())
        .unwrap()
        .with_max_entry_bytes(1 << 20);
    let started = Instant::now();
    assert!(cache.get(&CacheKey([3; 32])).unwrap().is_none());
    assert!(started.elapsed() < Duration::from_secs(5));
    let skips = cache.take_skips();
    assert!(
        skips[0].detail.contains("larger than the entry limit"),
        "{skips:?}"
    );
}

#[test]
fn a_local_socket_that_never_answers_is_slow_and_a_missing_one_down() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("redis.sock");
    let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
    let held = std::thread::spawn(move || {
        // Accepts one connection and holds it, silent, until the test drops its end.
        if let Ok((mut stream, _)) = listener.accept() {
            let mut buf = [0u8; 4096];
            while matches!(stream.read(&mut buf), Ok(n) if n > 0) {}
        }
    });
    let url = format!("redis+unix://{}", path.display());
    let cache = RedisCache::open_with_key(&url, TIMEOUT, key()).unwrap();
    let skip = lookup_skipped(&cache);
    assert_eq!(skip.reason, SkipReason::Slow, "{skip}");
    drop(cache);
    held.join().unwrap();
    let missing = format!("redis+unix://{}", dir.path().join("none.sock").display());
    let cache = RedisCache::open_with_key(&missing, TIMEOUT, key()).unwrap();
    let skip = lookup_skipped(&cache);
    assert_eq!(skip.reason, SkipReason::Down, "{skip}");
}

#[test]
fn no_server_is_down() {
    // A port nobody listens on: bind one, then close it.
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("redis://127.0.0.1:{port}/");
    let cache = RedisCache::open_with_key(&url, TIMEOUT, key()).unwrap();
    let skip = lookup_skipped(&cache);
    assert_eq!(skip.reason, SkipReason::Down, "{skip}");
}

struct RedisServer(std::process::Child);

impl Drop for RedisServer {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn redis_server(dir: &std::path::Path) -> (RedisServer, u16) {
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let child = Command::new("redis-server")
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .args(["--save", "", "--appendonly", "no", "--dir"])
        .arg(dir)
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("redis-server runs (the test command installs it)");
    let server = RedisServer(child);
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "redis-server did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
    (server, port)
}

fn redis_cli(port: u16, args: &[&str]) -> String {
    let out = Command::new("redis-cli")
        .args(["-p", &port.to_string()])
        .args(args)
        .output()
        .unwrap();
    assert!(out.status.success(), "redis-cli {args:?}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn a_real_server_read_only_full_foreign_and_stopped() {
    let dir = tempfile::tempdir().unwrap();
    let (server, port) = redis_server(dir.path());
    let url = format!("redis://127.0.0.1:{port}/");
    let cache = RedisCache::open_with_key(&url, Duration::from_secs(2), key()).unwrap();
    let k = CacheKey([8; 32]);
    cache.put(&k, b"an object").unwrap();
    assert_eq!(cache.get(&k).unwrap().as_deref(), Some(&b"an object"[..]));
    // Sealed with another key (another user, or a fleet with another key): a miss.
    let other =
        RedisCache::open_with_key(&url, Duration::from_secs(2), MacKey::from_bytes([6; 32]))
            .unwrap();
    other.put(&k, b"EVIL").unwrap();
    assert!(cache.get(&k).unwrap().is_none());
    assert_eq!(cache.stats().rejected, 1);
    assert!(cache.take_skips().is_empty(), "a rejected entry is no skip");
    // Full: no memory left and no eviction.
    redis_cli(port, &["CONFIG", "SET", "maxmemory-policy", "noeviction"]);
    redis_cli(port, &["CONFIG", "SET", "maxmemory", "1"]);
    assert!(cache.put(&k, b"an object").is_err());
    let skips = cache.take_skips();
    assert_eq!(skips[0].reason, SkipReason::Full, "{skips:?}");
    redis_cli(port, &["CONFIG", "SET", "maxmemory", "0"]);
    // Read-only: a replica (of a primary that is not there).
    let unused = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    redis_cli(port, &["REPLICAOF", "127.0.0.1", &unused.to_string()]);
    assert!(cache.put(&k, b"an object").is_err());
    let skips = cache.take_skips();
    assert_eq!(skips[0].reason, SkipReason::ReadOnly, "{skips:?}");
    assert!(skips[0].to_string().contains("(read-only)"));
    redis_cli(port, &["REPLICAOF", "NO", "ONE"]);
    cache.put(&k, b"an object").unwrap();
    // Stopped: down, and a miss.
    drop(server);
    let skip = lookup_skipped(&cache);
    assert_eq!(skip.reason, SkipReason::Down, "{skip}");
}
