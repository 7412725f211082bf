//! `kiln-executor --listen` as an attacker on this machine would try it: wrong keys,
//! plaintext, tampered and replayed messages, non-loopback binds, one client trying to
//! crash, stop, stall or outlast another, oversized frames, and thousands of connections.

// kiln::Error wraps link errors, which are large by design (see kiln-link).
#![allow(clippy::result_large_err)]

use kiln::{
    executor::{Key, RemoteError, Timeouts},
    Executor, Jit,
};
use kiln_remote::protocol::{Request, Response};
use kiln_remote::RemoteExecutor;
use kiln_testkit::attacks::{
    closed_within, man_in_the_middle, recording_proxy, rss_kib, Attack, SECOND_REQUEST,
};
use std::io::{BufRead, Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

struct Listener {
    child: Child,
    address: String,
    /// What it printed up to "listening on".
    banner: String,
}

impl Drop for Listener {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn listen(args: &[&str]) -> Listener {
    let mut child = Command::new(kiln_testkit::executor_binary())
        .arg("--listen")
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = std::io::BufReader::new(child.stderr.take().unwrap());
    let mut line = String::new();
    let mut banner = String::new();
    while !line.starts_with("kiln-executor: listening on") {
        line.clear();
        assert!(stderr.read_line(&mut line).unwrap() > 0, "listener ended");
        banner.push_str(&line);
    }
    let address = line.trim().rsplit(' ').next().unwrap().to_string();
    // Keep draining its stderr so that it never blocks on a full pipe.
    std::thread::spawn(move || {
        let mut sink = String::new();
        let _ = stderr.read_to_string(&mut sink);
    });
    Listener {
        child,
        address,
        banner,
    }
}

fn key_file(name: &str) -> (PathBuf, Key) {
    let path = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("{name}-{}.key", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let key = Key::generate().unwrap();
    key.write_new_file(&path).unwrap();
    (path, key)
}

fn timeouts() -> Timeouts {
    Timeouts {
        request: Duration::from_secs(20),
        run: Some(Duration::from_secs(60)),
    }
}

fn lookup_getpid(remote: &RemoteExecutor) -> Result<u64, RemoteError> {
    match remote.request(&Request::Lookup {
        library: 0,
        name: "getpid".into(),
    })? {
        Response::Symbol { address, .. } if address != 0 => Ok(address),
        other => panic!("unexpected {other:?}"),
    }
}

#[test]
fn a_wrong_key_or_a_plaintext_client_is_refused_before_any_request() {
    let (path, key) = key_file("auth");
    let listener = listen(&["127.0.0.1:0", "--key-file", path.to_str().unwrap()]);
    // A wrong key fails the handshake.
    let wrong = Key::generate().unwrap();
    match RemoteExecutor::connect_with_key(&listener.address, Some(&wrong), timeouts()) {
        Err(RemoteError::Authentication { .. }) => {}
        Err(other) => panic!("wrong key: expected an authentication error, got {other}"),
        Ok(_) => panic!("wrong key: connected"),
    }
    // No key: refused at once with a clear error.
    match RemoteExecutor::connect_with_key(&listener.address, None, timeouts()) {
        Err(RemoteError::Authentication { reason, .. }) => {
            assert!(reason.contains("requires a key"), "{reason}")
        }
        Err(other) => panic!("no key: expected an authentication error, got {other}"),
        Ok(_) => panic!("no key: connected"),
    }
    // A client speaking the plain protocol (a Reserve request) gets nothing back — no
    // hello, no answer — and the connection is closed: nothing was served.
    let mut s = TcpStream::connect(&listener.address).unwrap();
    let mut preamble = [0u8; 8];
    s.read_exact(&mut preamble).unwrap();
    assert_eq!(preamble, kiln_remote::secure::PREAMBLE_NOISE);
    s.write_all(
        &Request::Reserve {
            len: 1 << 20,
            placement: kiln_remote::protocol::WirePlacement::Anywhere,
            share: false,
        }
        .encode(),
    )
    .unwrap();
    assert!(closed_within(&mut s, Duration::from_secs(15), 0));
    // The right key works.
    let remote = RemoteExecutor::connect_with_key(&listener.address, Some(&key), timeouts())
        .expect("the right key connects");
    lookup_getpid(&remote).unwrap();
    let _ = std::fs::remove_file(&path);
}

#[test]
fn tampered_and_replayed_messages_end_the_connection() {
    let (path, key) = key_file("mitm");
    let listener = listen(&["127.0.0.1:0", "--key-file", path.to_str().unwrap()]);
    for attack in [Attack::Tamper, Attack::Replay] {
        let address = man_in_the_middle(listener.address.clone(), attack, SECOND_REQUEST);
        let remote = RemoteExecutor::connect_with_key(&address, Some(&key), timeouts()).unwrap();
        // The first request passes untouched…
        lookup_getpid(&remote).unwrap();
        // …the second is altered on the way and the executor drops the connection
        // instead of acting on it.
        let error = lookup_getpid(&remote).expect_err("an altered request was served");
        let text = error.to_string();
        assert!(
            text.contains("died") || text.contains("closed") || text.contains("connection"),
            "{text}"
        );
    }
    // The executor itself is fine.
    let remote =
        RemoteExecutor::connect_with_key(&listener.address, Some(&key), timeouts()).unwrap();
    lookup_getpid(&remote).unwrap();
    let _ = std::fs::remove_file(&path);
}

#[test]
fn a_non_loopback_address_needs_authentication_and_is_announced() {
    let out = Command::new(kiln_testkit::executor_binary())
        .args(["--listen", "0.0.0.0:0", "--no-auth"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("without authentication"));
    let (path, _) = key_file("wide");
    let listener = listen(&["0.0.0.0:0", "--key-file", path.to_str().unwrap()]);
    assert!(
        listener.banner.contains("beyond this machine"),
        "{}",
        listener.banner
    );
    drop(listener);
    let _ = std::fs::remove_file(&path);
}

fn compile(name: &str, source: &str) -> Vec<u8> {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("executor-security");
    std::fs::create_dir_all(&dir).unwrap();
    let c = dir.join(format!("{name}.c"));
    let o = dir.join(format!("{name}.o"));
    std::fs::write(&c, source).unwrap();
    assert!(Command::new("cc")
        .args(["-O1", "-fPIE", "-c"])
        .arg(&c)
        .arg("-o")
        .arg(&o)
        .status()
        .unwrap()
        .success());
    std::fs::read(&o).unwrap()
}

/// Links `source` in a session on the executor at `address` and runs its main.
fn run_remote(address: &str, key: &Key, name: &str, source: &str) -> Result<i32, kiln::Error> {
    let executor = Executor::connect_with_key(address, Some(key), timeouts())?;
    let jit = Jit::builder().executor(executor).build()?;
    let lib = jit.main_library();
    jit.library(lib).add(kiln::Input::object(
        format!("{name}.o"),
        compile(name, source),
    ))?;
    jit.library(lib).add(kiln::Input::ProcessSymbols).unwrap();
    run_main(&jit, lib, &[name.to_string()])
}

#[test]
fn one_client_cannot_crash_stop_or_stall_another() {
    let (path, key) = key_file("isolation");
    let listener = listen(&["127.0.0.1:0", "--key-file", path.to_str().unwrap()]);
    // A client that stalls after connecting, holding its connection open.
    let mut stalled = TcpStream::connect(&listener.address).unwrap();
    let mut preamble = [0u8; 8];
    stalled.read_exact(&mut preamble).unwrap();
    // One that crashes its executor, one that exits it, one that shuts it down.
    let crash = run_remote(
        &listener.address,
        &key,
        "crash",
        "int main(void) { *(volatile int *)8 = 1; return 0; }\n",
    );
    assert!(
        matches!(
            crash,
            Err(kiln::Error::Remote(RemoteError::Crashed { signal: 11, .. }))
        ),
        "{crash:?}"
    );
    let exit = run_remote(
        &listener.address,
        &key,
        "exits",
        "#include <stdlib.h>\nint main(void) { exit(9); }\n",
    );
    assert!(
        matches!(
            exit,
            Err(kiln::Error::Remote(RemoteError::Exited { status: 9, .. }))
        ),
        "{exit:?}"
    );
    let remote =
        RemoteExecutor::connect_with_key(&listener.address, Some(&key), timeouts()).unwrap();
    remote.shutdown();
    // And the next client is served as if nothing happened.
    let status = run_remote(
        &listener.address,
        &key,
        "fine",
        "int main(void) { return 42; }\n",
    )
    .unwrap();
    assert_eq!(status, 42);
    drop(stalled);
    let _ = std::fs::remove_file(&path);
}

#[test]
fn a_silent_client_is_dropped_after_the_idle_timeout_and_a_huge_frame_before_allocation() {
    let listener = listen(&["127.0.0.1:0", "--no-auth", "--idle-timeout", "1"]);
    let read_frame = |s: &mut TcpStream| -> Vec<u8> {
        let mut len = [0u8; 4];
        s.read_exact(&mut len).unwrap();
        let mut body = vec![0u8; u32::from_le_bytes(len) as usize];
        s.read_exact(&mut body).unwrap();
        body
    };
    let connect = || {
        let mut s = TcpStream::connect(&listener.address).unwrap();
        let mut preamble = [0u8; 8];
        s.read_exact(&mut preamble).unwrap();
        assert_eq!(&read_frame(&mut s)[5..9], b"KILN");
        s
    };
    // Silent after the hello: dropped after about a second.
    let mut silent = connect();
    let start = Instant::now();
    assert!(closed_within(&mut silent, Duration::from_secs(10), 0));
    assert!(start.elapsed() < Duration::from_secs(5));
    // Half a frame, then silence: dropped too.
    let mut half = connect();
    half.write_all(&[100, 0, 0, 0, 1, 2]).unwrap();
    assert!(closed_within(&mut half, Duration::from_secs(10), 0));
    // A frame trickled a byte at a time, each within the timeout: the whole frame has
    // the idle timeout too, so it is dropped anyway.
    let mut trickle = connect();
    trickle.write_all(&[100, 0, 0, 0]).unwrap();
    let start = Instant::now();
    let mut dropped = false;
    for _ in 0..20 {
        std::thread::sleep(Duration::from_millis(300));
        if trickle.write_all(&[0]).is_err() {
            dropped = true;
            break;
        }
    }
    assert!(
        dropped || closed_within(&mut trickle, Duration::from_secs(2), 0),
        "a trickled frame outlived the deadline"
    );
    assert!(start.elapsed() < Duration::from_secs(5));
    // A 1 GiB length prefix: refused at once (an error reply), nothing allocated first.
    let mut huge = connect();
    huge.write_all(&(1u32 << 30).to_le_bytes()).unwrap();
    huge.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let reply = Response::decode(&read_frame(&mut huge)).unwrap();
    assert!(
        matches!(&reply, Response::Error(m) if m.contains("too large")),
        "{reply:?}"
    );
}

fn process_rss_kib(pid: u32) -> u64 {
    rss_kib(pid).expect("the process is alive")
}

fn process_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .count()
}

#[test]
fn ten_thousand_connections_leave_the_listener_flat() {
    let listener = listen(&["127.0.0.1:0", "--no-auth"]);
    let pid = listener.child.id();
    let session = || {
        let mut s = TcpStream::connect(&listener.address).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut preamble = [0u8; 8];
        s.read_exact(&mut preamble).unwrap();
        let mut len = [0u8; 4];
        s.read_exact(&mut len).unwrap();
        let mut hello = vec![0u8; u32::from_le_bytes(len) as usize];
        s.read_exact(&mut hello).unwrap();
        s.write_all(&Request::Shutdown.encode()).unwrap();
        let mut ok = [0u8; 9];
        s.read_exact(&mut ok).unwrap();
    };
    for _ in 0..200 {
        session();
    }
    let (rss0, fds0) = (process_rss_kib(pid), process_fds(pid));
    // Two clients at a time, 5,000 sessions each: the listener serves them side by side,
    // as it would a real load (and the test takes half the time one client would).
    std::thread::scope(|scope| {
        for _ in 0..2 {
            scope.spawn(|| {
                for _ in 0..5_000 {
                    session();
                }
            });
        }
    });
    std::thread::sleep(Duration::from_millis(200));
    let (rss1, fds1) = (process_rss_kib(pid), process_fds(pid));
    assert!(
        rss1 <= rss0 + 256,
        "listener RSS grew from {rss0} to {rss1} KiB"
    );
    assert!(
        fds1 <= fds0 + 2,
        "listener descriptors grew from {fds0} to {fds1}"
    );
}

#[test]
fn well_behaved_clients_are_served_while_a_hundred_others_stall() {
    let (path, key) = key_file("hostile");
    let listener = listen(&["127.0.0.1:0", "--key-file", path.to_str().unwrap()]);
    let stalled: Vec<TcpStream> = (0..100)
        .map(|_| TcpStream::connect(&listener.address).unwrap())
        .collect();
    let start = Instant::now();
    let workers: Vec<_> = (0..100)
        .map(|_| {
            let address = listener.address.clone();
            let key = key.clone();
            std::thread::spawn(move || {
                let remote =
                    RemoteExecutor::connect_with_key(&address, Some(&key), timeouts()).unwrap();
                lookup_getpid(&remote).unwrap();
                remote.shutdown();
            })
        })
        .collect();
    for w in workers {
        w.join().expect("a well-behaved client was not served");
    }
    eprintln!(
        "100 well-behaved clients served beside 100 stalled ones in {:?}",
        start.elapsed()
    );
    assert!(
        start.elapsed() < Duration::from_secs(20),
        "took {:?}",
        start.elapsed()
    );
    drop(stalled);
    let _ = std::fs::remove_file(&path);
}

/// Runs `main` of a test program.
fn run_main(jit: &kiln::Jit, lib: kiln::LibraryId, args: &[String]) -> Result<i32, kiln::Error> {
    // SAFETY: every test program defines a C `int main(int, char **)`.
    unsafe { jit.run_main(lib, args) }
}

/// The listener's children (connection processes) and how many are zombies.
fn children_of(pid: u32) -> (Vec<u32>, usize) {
    let list = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).unwrap();
    let children: Vec<u32> = list
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect();
    let zombies = children
        .iter()
        .filter(|c| {
            std::fs::read_to_string(format!("/proc/{c}/stat"))
                .map(|s| {
                    s.rsplit(')')
                        .next()
                        .unwrap_or("")
                        .trim_start()
                        .starts_with('Z')
                })
                .unwrap_or(false)
        })
        .count();
    (children, zombies)
}

/// Sum of the RSS of the listener and its children, in KiB.
fn rss_of_tree_kib(pid: u32) -> u64 {
    let (children, _) = children_of(pid);
    process_rss_kib(pid) + children.iter().filter_map(|&c| rss_kib(c)).sum::<u64>()
}

/// Waits (up to `within`) until `pid` has at most `n` children; how many it has then.
fn settle_children(pid: u32, n: usize, within: Duration) -> usize {
    let start = Instant::now();
    loop {
        let count = children_of(pid).0.len();
        if count <= n || start.elapsed() > within {
            return count;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_flood_of_silent_connections_holds_few_processes_and_a_keyed_client_gets_in() {
    let (path, key) = key_file("flood");
    let listener = listen(&[
        "127.0.0.1:0",
        "--key-file",
        path.to_str().unwrap(),
        "--max-unauthenticated",
        "32",
    ]);
    let pid = listener.child.id();
    let flood: Vec<TcpStream> = (0..2_000)
        .filter_map(|_| TcpStream::connect(&listener.address).ok())
        .collect();
    assert!(flood.len() > 1_900, "only {} connections", flood.len());
    // Let the listener accept all of them.
    std::thread::sleep(Duration::from_millis(500));
    let held = children_of(pid).0.len();
    let rss = rss_of_tree_kib(pid);
    assert!(held <= 32, "{held} processes for 2,000 silent connections");
    let start = Instant::now();
    let remote = RemoteExecutor::connect_with_key(&listener.address, Some(&key), timeouts())
        .expect("a keyed client gets in during the flood");
    lookup_getpid(&remote).unwrap();
    let served = start.elapsed();
    eprintln!(
        "2,000 silent connections: {held} processes, {rss} KiB RSS in all; a keyed client served in {served:?}"
    );
    assert!(served < Duration::from_secs(1), "served after {served:?}");
    drop(remote);
    drop(flood);
    let left = settle_children(pid, 0, Duration::from_secs(5));
    assert_eq!(left, 0, "connection processes left after the flood ended");
    let _ = std::fs::remove_file(&path);
}

#[test]
fn replayed_first_handshake_messages_are_held_no_longer_than_the_handshake() {
    let (path, key) = key_file("replay");
    let listener = listen(&[
        "127.0.0.1:0",
        "--key-file",
        path.to_str().unwrap(),
        "--idle-timeout",
        "60",
        "--max-unauthenticated",
        "16",
    ]);
    let pid = listener.child.id();
    // Watch one real handshake.
    let (proxy, recorded) = recording_proxy(listener.address.clone());
    let remote = RemoteExecutor::connect_with_key(&proxy, Some(&key), timeouts()).unwrap();
    lookup_getpid(&remote).unwrap();
    let message1 = recorded.recv().unwrap();
    remote.shutdown();
    // Replay it 100 times: the executor answers each (the handshake's first message has no
    // replay protection), but no replayer can send a request it can decrypt.
    let replayers: Vec<TcpStream> = (0..100)
        .map(|_| {
            let mut s = TcpStream::connect(&listener.address).unwrap();
            s.write_all(&message1).unwrap();
            s
        })
        .collect();
    std::thread::sleep(Duration::from_millis(500));
    let held = children_of(pid).0.len();
    assert!(held <= 16, "{held} processes for 100 replayers");
    // A keyed client is served meanwhile.
    let start = Instant::now();
    let remote =
        RemoteExecutor::connect_with_key(&listener.address, Some(&key), timeouts()).unwrap();
    let connected = start.elapsed();
    lookup_getpid(&remote).unwrap();
    // Served, not held until the replayers' handshake deadline (10 s): half of it leaves
    // room for a test machine busy with other tests.
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "{:?} (connected after {connected:?})",
        start.elapsed()
    );
    remote.shutdown();
    // Each replayer's process ends at the handshake deadline (10 s), not the idle timeout.
    let start = Instant::now();
    let left = settle_children(pid, 0, Duration::from_secs(15));
    assert_eq!(left, 0, "replayers still held after {:?}", start.elapsed());
    drop(replayers);
    let _ = std::fs::remove_file(&path);
}

#[test]
fn finished_connections_leave_no_zombies() {
    let listener = listen(&["127.0.0.1:0", "--no-auth"]);
    let pid = listener.child.id();
    for _ in 0..50 {
        let mut s = TcpStream::connect(&listener.address).unwrap();
        let mut preamble = [0u8; 8];
        s.read_exact(&mut preamble).unwrap();
        drop(s);
    }
    // No further connection comes: the listener must reap on its own.
    let left = settle_children(pid, 0, Duration::from_secs(3));
    let (_, zombies) = children_of(pid);
    assert_eq!(
        (left, zombies),
        (0, 0),
        "children left after the connections ended"
    );
}

#[test]
fn every_static_tls_edge_gets_an_error_reply_and_the_connection_lives() {
    let listener = listen(&["127.0.0.1:0", "--no-auth"]);
    let remote = RemoteExecutor::connect_with_key(&listener.address, None, timeouts()).unwrap();
    let module_id = match remote.request(&Request::ReserveTlsModule).unwrap() {
        Response::Value(id) => id,
        other => panic!("unexpected {other:?}"),
    };
    let edges: [(u64, u64, usize); 6] = [
        (0, 8, 0),       // size 0 (glibc divides by it)
        (0, 1, 0),       // size 0, alignment 1
        (16, 0, 0),      // alignment 0
        (16, 24, 0),     // alignment not a power of two
        (8, 8, 16),      // an image larger than the block
        (1 << 40, 8, 0), // more than a module gets
    ];
    for (size, align, image) in edges {
        let reply = remote.request(&Request::PlaceStaticTls {
            module_id,
            size,
            align,
            image: vec![0; image],
        });
        assert!(
            matches!(&reply, Err(RemoteError::Refused { .. })),
            "size {size}, align {align}, image {image}: {reply:?}"
        );
        // The connection's process is alive and serving.
        lookup_getpid(&remote).unwrap();
    }
}
