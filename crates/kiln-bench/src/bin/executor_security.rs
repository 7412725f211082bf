//! Figures of "W^X everywhere … an executor no one can flood or escape", side by side in
//! one run:
//! 1. a flood of unauthenticated connections against `kiln-executor --listen` with a key:
//!    the processes and RSS it holds, and how long a client with the key waits to be
//!    served meanwhile (target: within 1 s);
//! 2. replayed first handshake messages: the same;
//! 3. the sandbox's cost: the SQLite program (Debian's libsqlite3.a) run by `kiln run
//!    --oop` with and without `--sandbox`, interleaved, medians (target ≤ 1.02×).

use clap::Parser;
use kiln_bench::{sh, verdict};
use kiln_remote::protocol::{Request, Response};
use kiln_remote::secure::Key;
use kiln_remote::{RemoteExecutor, Timeouts};
use std::io::{BufRead, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

#[derive(Parser, Debug)]
struct Args {
    /// Unauthenticated connections in the flood.
    #[arg(long, default_value_t = 2000)]
    connections: usize,
    /// Runs of the SQLite program per mode (medians).
    #[arg(long, default_value_t = 11)]
    runs: usize,
    /// Scratch directory.
    #[arg(long, default_value = "/tmp/kiln-executor-security")]
    dir: PathBuf,
}

struct Listener(Child, String);

impl Drop for Listener {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn listen(executor: &Path, key: &Path) -> Listener {
    let mut child = Command::new(executor)
        .args(["--listen", "127.0.0.1:0", "--key-file"])
        .arg(key)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("kiln-executor --listen");
    let mut stderr = std::io::BufReader::new(child.stderr.take().expect("stderr"));
    let mut line = String::new();
    while !line.contains("listening on") {
        line.clear();
        assert!(
            stderr.read_line(&mut line).unwrap_or(0) > 0,
            "the listener ended"
        );
    }
    std::thread::spawn(move || std::io::copy(&mut stderr, &mut std::io::sink()));
    let address = line
        .trim()
        .rsplit(' ')
        .next()
        .unwrap_or_default()
        .to_string();
    Listener(child, address)
}

/// The listener's children and the RSS of it and them, KiB.
fn held(pid: u32) -> (usize, u64) {
    let rss = |p: u32| -> u64 {
        std::fs::read_to_string(format!("/proc/{p}/status"))
            .ok()
            .and_then(|s| {
                s.lines()
                    .find_map(|l| l.strip_prefix("VmRSS:"))
                    .and_then(|v| v.split_whitespace().next()?.parse().ok())
            })
            .unwrap_or(0)
    };
    let children: Vec<u32> = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect();
    let total = rss(pid) + children.iter().map(|&c| rss(c)).sum::<u64>();
    (children.len(), total)
}

/// How long a client with the key waits for its first answer.
fn keyed_client(address: &str, key: &Key) -> Duration {
    let start = Instant::now();
    let timeouts = Timeouts {
        request: Duration::from_secs(30),
        run: None,
    };
    let remote = RemoteExecutor::connect_with_key(address, Some(key), timeouts)
        .expect("the keyed client connects");
    let reply = remote.request(&Request::Lookup {
        library: 0,
        name: "getpid".into(),
    });
    assert!(matches!(reply, Ok(Response::Symbol { .. })), "{reply:?}");
    let served = start.elapsed();
    remote.shutdown();
    served
}

/// One handshake's first message, recorded by a proxy between a real client and `address`.
fn record_message1(address: &str, key: &Key) -> Vec<u8> {
    let proxy = std::net::TcpListener::bind("127.0.0.1:0").expect("proxy");
    let proxy_address = proxy.local_addr().expect("address").to_string();
    let upstream = address.to_string();
    let recorder = std::thread::spawn(move || {
        let (mut client, _) = proxy.accept().expect("accept");
        let mut server = TcpStream::connect(&upstream).expect("upstream");
        let mut server_r = server.try_clone().expect("clone");
        let mut client_w = client.try_clone().expect("clone");
        std::thread::spawn(move || std::io::copy(&mut server_r, &mut client_w));
        let mut len = [0u8; 2];
        client.read_exact(&mut len).expect("length");
        let mut record = len.to_vec();
        record.resize(2 + u16::from_be_bytes(len) as usize, 0);
        client.read_exact(&mut record[2..]).expect("message 1");
        server.write_all(&record).expect("forward");
        std::thread::spawn(move || std::io::copy(&mut client, &mut server));
        record
    });
    keyed_client(&proxy_address, key);
    recorder.join().expect("recorder")
}

fn flood_figures(executor: &Path, dir: &Path, connections: usize) {
    let key_path = dir.join("flood.key");
    let _ = std::fs::remove_file(&key_path);
    let key = Key::generate().expect("key");
    key.write_new_file(&key_path).expect("key file");
    // 1. Silent connections.
    let listener = listen(executor, &key_path);
    let pid = listener.0.id();
    let quiet = held(pid);
    let flood: Vec<TcpStream> = (0..connections)
        .filter_map(|_| TcpStream::connect(&listener.1).ok())
        .collect();
    std::thread::sleep(Duration::from_millis(500));
    let (processes, rss) = held(pid);
    let served = keyed_client(&listener.1, &key);
    println!(
        "flood: {} silent connections: {processes} connection processes, {:.1} MB RSS in all (idle listener: {:.1} MB); a keyed client served in {:.1} ms (target <= 1000 ms): {}",
        flood.len(),
        rss as f64 / 1024.0,
        quiet.1 as f64 / 1024.0,
        served.as_secs_f64() * 1e3,
        verdict(served < Duration::from_secs(1))
    );
    drop(flood);
    drop(listener);
    // 2. Replayed first handshake messages.
    let listener = listen(executor, &key_path);
    let pid = listener.0.id();
    let message1 = record_message1(&listener.1, &key);
    let replayers: Vec<TcpStream> = (0..connections.min(1000))
        .filter_map(|_| {
            let mut s = TcpStream::connect(&listener.1).ok()?;
            s.write_all(&message1).ok()?;
            Some(s)
        })
        .collect();
    std::thread::sleep(Duration::from_millis(500));
    let (processes, rss) = held(pid);
    let served = keyed_client(&listener.1, &key);
    println!(
        "replay: {} replayed first messages: {processes} connection processes, {:.1} MB RSS in all; a keyed client served in {:.1} ms (target <= 1000 ms): {}",
        replayers.len(),
        rss as f64 / 1024.0,
        served.as_secs_f64() * 1e3,
        verdict(served < Duration::from_secs(1))
    );
    let _ = std::fs::remove_file(&key_path);
}

fn sandbox_cost(kiln: &Path, dir: &Path, runs: usize) {
    let programs = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/programs");
    let d = dir.display();
    sh(&format!(
        "cc -O2 -c {}/sqlite_driver.c -o {d}/sqlite_driver.o",
        programs.display()
    ));
    let run = |sandbox: bool| -> Duration {
        let start = Instant::now();
        let mut c = Command::new(kiln);
        c.args(["run", "--oop"]);
        if sandbox {
            c.arg("--sandbox");
        }
        let ok = c
            .arg(dir.join("sqlite_driver.o"))
            .arg("/usr/lib/x86_64-linux-gnu/libsqlite3.a")
            .arg("-lm")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "kiln run --oop (sandbox: {sandbox}) failed");
        start.elapsed()
    };
    let mut times: [Vec<Duration>; 2] = [Vec::new(), Vec::new()];
    run(false);
    run(true);
    for _ in 0..runs {
        times[0].push(run(false));
        times[1].push(run(true));
    }
    for t in &mut times {
        t.sort();
    }
    let median = |t: &[Duration]| t[t.len() / 2].as_secs_f64() * 1e3;
    let (plain, sandboxed) = (median(&times[0]), median(&times[1]));
    let ratio = sandboxed / plain;
    println!(
        "sandbox: SQLite program, kiln run --oop, median of {runs}: without {plain:.1} ms, --sandbox {sandboxed:.1} ms, ratio {ratio:.3} (target <= 1.02): {}",
        verdict(ratio <= 1.02)
    );
}

fn main() {
    let args = Args::parse();
    let here = std::env::current_exe().expect("this binary");
    let bin = here.parent().expect("its directory");
    std::fs::create_dir_all(&args.dir).expect("scratch directory");
    flood_figures(&bin.join("kiln-executor"), &args.dir, args.connections);
    sandbox_cost(&bin.join("kiln"), &args.dir, args.runs);
}
