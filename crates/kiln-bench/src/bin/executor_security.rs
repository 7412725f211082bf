//! Figures of "an executor no one can flood or escape", side by side in one run, for each
//! keyed executor (`--executors`: kiln-executor, executor-c on x86-64, on AArch64 and
//! RISC-V 64 under qemu, on Windows under Wine):
//! 1. a flood of unauthenticated connections: the processes and RSS it holds, and how long
//!    a client with the key waits to be served meanwhile (target: within 1 s);
//! 2. replayed first handshake messages: the same;
//! 3. the handshake's cost per connection: a keyed client's connection (handshake, one
//!    Lookup, Shutdown) beside a plaintext one's to the same executor started with
//!    `--no-auth`, interleaved, medians;
//! 4. the sandbox's cost: the SQLite program (Debian's libsqlite3.a) run by `kiln run
//!    --oop` with and without `--sandbox`, interleaved, medians (target ≤ 1.02×).

use clap::Parser;
use kiln_bench::{sh, verdict};
use kiln_remote::protocol::{Request, Response};
use kiln_remote::secure::Key;
use kiln_remote::{RemoteExecutor, Timeouts};
use kiln_testkit::attacks::{accepted_all, held};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[derive(Parser, Debug)]
struct Args {
    /// Unauthenticated connections in the flood.
    #[arg(long, default_value_t = 2000)]
    connections: usize,
    /// Runs of the SQLite program per mode (medians).
    #[arg(long, default_value_t = 11)]
    runs: usize,
    /// Connections per mode for the handshake's cost (medians).
    #[arg(long, default_value_t = 21)]
    handshakes: usize,
    /// The executors measured (comma-separated): kiln-executor, x86_64, aarch64, riscv64,
    /// windows.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "kiln-executor,x86_64,aarch64,riscv64,windows"
    )]
    executors: Vec<String>,
    /// Scratch directory.
    #[arg(long, default_value = "/tmp/kiln-executor-security")]
    dir: PathBuf,
}

/// An executor listening (killed when dropped), and its address.
struct Listener(kiln_testkit::ExecutorProcess);

impl Listener {
    fn address(&self) -> &str {
        &self.0.address
    }
    fn pid(&self) -> u32 {
        self.0.child.id()
    }
}

/// The command that runs executor `name` (without arguments).
fn executor_command(name: &str, kiln_executor: &Path) -> Command {
    let qemu = |qemu: &str, root: &str, gcc: &str| {
        let mut c = Command::new(qemu);
        c.args(["-L", root])
            .arg(kiln_testkit::c_executor_binary(gcc));
        c
    };
    match name {
        "kiln-executor" => Command::new(kiln_executor),
        "x86_64" => Command::new(kiln_testkit::c_executor_binary("cc")),
        "aarch64" => qemu(
            "qemu-aarch64-static",
            "/usr/aarch64-linux-gnu",
            "aarch64-linux-gnu-gcc",
        ),
        "riscv64" => qemu(
            "qemu-riscv64-static",
            "/usr/riscv64-linux-gnu",
            "riscv64-linux-gnu-gcc",
        ),
        "windows" => {
            let mut c = kiln_testkit::wine(Path::new("/tmp/kiln-executor-security-wine"));
            c.arg(kiln_testkit::c_executor_binary("x86_64-w64-mingw32-gcc"));
            c
        }
        other => panic!("no executor {other:?} (kiln-executor, x86_64, aarch64, riscv64, windows)"),
    }
}

/// `name` listening on a loopback port with `key` (or `--no-auth` without).
fn listen(name: &str, kiln_executor: &Path, key: Option<&Path>) -> Listener {
    let mut command = executor_command(name, kiln_executor);
    command.args(["--listen", "127.0.0.1:0"]);
    match key {
        Some(key) => command.arg("--key-file").arg(key),
        None => command.arg("--no-auth"),
    };
    Listener(kiln_testkit::start_listening(&mut command))
}

/// How long a client with the key waits for its first answer.
fn keyed_client(address: &str, key: &Key) -> Duration {
    client(address, Some(key))
}

/// How long a client (with `key`, or plaintext) takes from connecting to its first answer
/// and its connection's end.
fn client(address: &str, key: Option<&Key>) -> Duration {
    let start = Instant::now();
    let timeouts = Timeouts {
        request: Duration::from_secs(30),
        run: None,
    };
    let remote =
        RemoteExecutor::connect_with_key(address, key, timeouts).expect("the client connects");
    let reply = remote.request(&Request::Lookup {
        library: 0,
        name: "malloc".into(),
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

fn flood_figures(name: &str, kiln_executor: &Path, dir: &Path, connections: usize) {
    let key_path = dir.join("flood.key");
    let _ = std::fs::remove_file(&key_path);
    let key = Key::generate().expect("key");
    key.write_new_file(&key_path).expect("key file");
    // 1. Silent connections.
    let listener = listen(name, kiln_executor, Some(&key_path));
    let pid = listener.pid();
    let quiet = held(pid);
    let flood: Vec<TcpStream> = (0..connections)
        .filter_map(|_| TcpStream::connect(listener.address()).ok())
        .collect();
    accepted_all(listener.address());
    let (processes, rss) = held(pid);
    let served = keyed_client(listener.address(), &key);
    println!(
        "{name}: flood: {} silent connections: {processes} processes below the listener, {:.1} MB RSS in all (idle listener: {:.1} MB); a keyed client served in {:.1} ms (target <= 1000 ms): {}",
        flood.len(),
        rss as f64 / 1024.0,
        quiet.1 as f64 / 1024.0,
        served.as_secs_f64() * 1e3,
        verdict(served < Duration::from_secs(1))
    );
    drop(flood);
    drop(listener);
    // 2. Replayed first handshake messages.
    let listener = listen(name, kiln_executor, Some(&key_path));
    let pid = listener.pid();
    let message1 = record_message1(listener.address(), &key);
    let replayers: Vec<TcpStream> = (0..connections.min(1000))
        .filter_map(|_| {
            let mut s = TcpStream::connect(listener.address()).ok()?;
            s.write_all(&message1).ok()?;
            Some(s)
        })
        .collect();
    accepted_all(listener.address());
    let (processes, rss) = held(pid);
    let served = keyed_client(listener.address(), &key);
    println!(
        "{name}: replay: {} replayed first messages: {processes} processes below the listener, {:.1} MB RSS in all; a keyed client served in {:.1} ms (target <= 1000 ms): {}",
        replayers.len(),
        rss as f64 / 1024.0,
        served.as_secs_f64() * 1e3,
        verdict(served < Duration::from_secs(1))
    );
    drop(replayers);
    drop(listener);
    let _ = std::fs::remove_file(&key_path);
}

/// The handshake's cost per connection: keyed and plaintext connections (handshake or
/// not, one Lookup, Shutdown) to the same executor, interleaved, medians.
fn handshake_cost(name: &str, kiln_executor: &Path, dir: &Path, rounds: usize) {
    let key_path = dir.join("handshake.key");
    let _ = std::fs::remove_file(&key_path);
    let key = Key::generate().expect("key");
    key.write_new_file(&key_path).expect("key file");
    let keyed = listen(name, kiln_executor, Some(&key_path));
    let plain = listen(name, kiln_executor, None);
    client(keyed.address(), Some(&key));
    client(plain.address(), None);
    let mut times: [Vec<f64>; 2] = [Vec::new(), Vec::new()];
    for _ in 0..rounds.max(1) {
        times[0].push(client(keyed.address(), Some(&key)).as_secs_f64() * 1e3);
        times[1].push(client(plain.address(), None).as_secs_f64() * 1e3);
    }
    for t in &mut times {
        t.sort_by(f64::total_cmp);
    }
    let (k, p) = (times[0][times[0].len() / 2], times[1][times[1].len() / 2]);
    println!(
        "{name}: handshake: a connection (connect, one Lookup, Shutdown), median of {rounds}: keyed {k:.2} ms, --no-auth {p:.2} ms: the handshake costs {:.2} ms per connection",
        k - p
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
    let kiln_executor = bin.join("kiln-executor");
    for name in &args.executors {
        flood_figures(name, &kiln_executor, &args.dir, args.connections);
        handshake_cost(name, &kiln_executor, &args.dir, args.handshakes);
    }
    sandbox_cost(&bin.join("kiln"), &args.dir, args.runs);
}
