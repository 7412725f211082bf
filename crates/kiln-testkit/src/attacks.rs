//! What the tests of a keyed executor do to it, and how they see what it holds: a man in
//! the middle that alters one Noise message, a proxy that records a handshake's first
//! message (to replay it), a check that a peer closes, and the processes and memory below
//! a listener.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

/// What [`man_in_the_middle`] does to the message it alters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Attack {
    /// Flips a bit of its tag.
    Tamper,
    /// Sends the message before it again instead.
    Replay,
}

/// The client's fourth Noise message: after the handshake's first and the confirmation,
/// its second request.
pub const SECOND_REQUEST: usize = 4;

/// A proxy on a loopback port for one connection to `upstream`: what the executor sends
/// goes back to the client as it is (and the client is hung up on when the executor hangs
/// up); what the client sends is given to `forward` (the client's reading half, the
/// executor's writing half). Its address.
fn proxy(upstream: String, forward: impl FnOnce(TcpStream, TcpStream) + Send + 'static) -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a proxy port");
    let address = listener.local_addr().expect("its address").to_string();
    std::thread::spawn(move || {
        let Ok((mut client, _)) = listener.accept() else {
            return;
        };
        let Ok(mut server) = TcpStream::connect(&upstream) else {
            return;
        };
        let (Ok(client_r), Ok(server_w)) = (client.try_clone(), server.try_clone()) else {
            return;
        };
        std::thread::spawn(move || {
            let _ = std::io::copy(&mut server, &mut client);
            let _ = client.shutdown(std::net::Shutdown::Both);
        });
        forward(client_r, server_w);
    });
    address
}

/// A man in the middle between a client and `upstream` that forwards everything, except
/// that the client's `nth` Noise message (1-based, each a big-endian `u16` length and the
/// message) is altered by `attack`. Its address.
pub fn man_in_the_middle(upstream: String, attack: Attack, nth: usize) -> String {
    proxy(upstream, move |mut client_r, mut server_w| {
        let mut previous: Vec<u8> = Vec::new();
        let mut n = 0;
        loop {
            let mut len = [0u8; 2];
            if client_r.read_exact(&mut len).is_err() {
                break;
            }
            let mut body = vec![0u8; u16::from_be_bytes(len) as usize];
            if client_r.read_exact(&mut body).is_err() {
                break;
            }
            n += 1;
            let mut record = len.to_vec();
            record.extend_from_slice(&body);
            let sent = match attack {
                _ if n != nth => record.clone(),
                Attack::Tamper => {
                    let mut altered = record.clone();
                    let last = altered.len() - 1;
                    altered[last] ^= 1;
                    altered
                }
                Attack::Replay => previous.clone(),
            };
            if server_w.write_all(&sent).is_err() {
                break;
            }
            previous = record;
        }
    })
}

/// A proxy that forwards one connection to `upstream` both ways and sends on the
/// channel the client's first record (the handshake's first message, with its length).
pub fn recording_proxy(upstream: String) -> (String, std::sync::mpsc::Receiver<Vec<u8>>) {
    let (send, recorded) = std::sync::mpsc::channel();
    let address = proxy(upstream, move |mut client_r, mut server_w| {
        let mut len = [0u8; 2];
        if client_r.read_exact(&mut len).is_err() {
            return;
        }
        let mut record = len.to_vec();
        record.resize(2 + u16::from_be_bytes(len) as usize, 0);
        if client_r.read_exact(&mut record[2..]).is_err() || server_w.write_all(&record).is_err() {
            return;
        }
        let _ = send.send(record);
        let _ = std::io::copy(&mut client_r, &mut server_w);
    });
    (address, recorded)
}

/// Reads until the peer closes; `true` if it closed (without sending more than `limit`
/// bytes) within `within`.
pub fn closed_within(s: &mut TcpStream, within: Duration, limit: usize) -> bool {
    if s.set_read_timeout(Some(within)).is_err() {
        return false;
    }
    let mut got = 0;
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return got <= limit,
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return got <= limit,
            Err(_) => return false,
        }
    }
}

/// VmRSS of `pid` in KiB (`None` if it is gone).
pub fn rss_kib(pid: u32) -> Option<u64> {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
}

/// `pid` and every process below it (children of any of its threads, and theirs).
pub fn process_tree(pid: u32) -> Vec<u32> {
    let mut all = vec![pid];
    let mut at = 0;
    while at < all.len() {
        let p = all[at];
        at += 1;
        let tasks = std::fs::read_dir(format!("/proc/{p}/task"))
            .into_iter()
            .flatten();
        for task in tasks.flatten() {
            let children =
                std::fs::read_to_string(task.path().join("children")).unwrap_or_default();
            all.extend(
                children
                    .split_whitespace()
                    .filter_map(|c| c.parse::<u32>().ok()),
            );
        }
    }
    all
}

/// The processes below `pid` and the RSS of it and them (KiB).
pub fn held(pid: u32) -> (usize, u64) {
    let all = process_tree(pid);
    (all.len() - 1, all.iter().filter_map(|&p| rss_kib(p)).sum())
}

/// Connections waiting in the accept queue of the listening socket on `port` (its
/// `rx_queue` in /proc/net/tcp).
pub fn accept_queue(port: u16) -> usize {
    let text = std::fs::read_to_string("/proc/net/tcp").unwrap_or_default();
    text.lines()
        .skip(1)
        .find_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let local = u16::from_str_radix(fields.get(1)?.rsplit(':').next()?, 16).ok()?;
            (local == port && *fields.get(3)? == "0A")
                .then(|| usize::from_str_radix(fields.get(4)?.split(':').nth(1)?, 16).ok())
                .flatten()
        })
        .unwrap_or(0)
}

/// Waits (at most a minute) until the listener at `address` has taken every connection
/// off its accept queue, and a little more for it to act on the last.
pub fn accepted_all(address: &str) {
    let port = address
        .rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .unwrap_or(0);
    let start = Instant::now();
    while accept_queue(port) > 0 && start.elapsed() < Duration::from_secs(60) {
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_millis(200));
}
