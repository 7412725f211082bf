//! The whole promise of a keyed executor, for each executor-c: x86-64 Linux, AArch64 and
//! RISC-V 64 under qemu-user, and Windows under Wine. Each listens with the test key
//! (`--key-file`, `--max-unauthenticated 32`) and must: refuse a client without the key,
//! with a wrong key, or speaking plaintext, before serving anything; end a connection
//! whose frame was tampered with or replayed; hold replayed first handshake messages and
//! 2,000 silent connections in a bounded number of processes while a keyed client is
//! served within 1 s; answer malformed frames (garbage, truncated, huge lengths,
//! out-of-range addresses in every request kind) with an Error or a closed connection,
//! never a crash of the listener or a hang; and refuse `--no-auth` on a non-loopback
//! address. The cross executors are skipped with KILN_TEST_SKIP_CROSS=1.

use kiln::executor::{Key, RemoteError, Timeouts};
use kiln_remote::channel::{Channel, Stream};
use kiln_remote::protocol::{Request, Response};
use kiln_remote::secure::{Role, PREAMBLE_NOISE};
use kiln_remote::RemoteExecutor;
use kiln_testkit::attacks::{
    accepted_all, closed_within, held, man_in_the_middle, recording_proxy, Attack, SECOND_REQUEST,
};
use kiln_testkit::ExecutorProcess;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::time::{Duration, Instant};

/// The cap every listener here is started with.
const CAP: usize = 32;

#[derive(Clone, Copy, Debug)]
enum Target {
    X86_64,
    Aarch64,
    Riscv64,
    Windows,
}

impl Target {
    /// The command that runs this executor (built for it), without arguments.
    fn command(self) -> Command {
        match self {
            Target::X86_64 => Command::new(kiln_testkit::c_executor_binary("cc")),
            Target::Aarch64 | Target::Riscv64 => {
                let (qemu, root, gcc) = match self {
                    Target::Aarch64 => (
                        "qemu-aarch64-static",
                        "/usr/aarch64-linux-gnu",
                        "aarch64-linux-gnu-gcc",
                    ),
                    _ => (
                        "qemu-riscv64-static",
                        "/usr/riscv64-linux-gnu",
                        "riscv64-linux-gnu-gcc",
                    ),
                };
                let mut command = Command::new(qemu);
                command
                    .args(["-L", root])
                    .arg(kiln_testkit::c_executor_binary(gcc));
                command
            }
            Target::Windows => {
                let mut command = kiln_testkit::wine(&kiln_testkit::wine_prefix());
                command.arg(kiln_testkit::c_executor_binary("x86_64-w64-mingw32-gcc"));
                command
            }
        }
    }

    /// Listening with the test key.
    fn listen(self) -> ExecutorProcess {
        kiln_testkit::start_listening(
            self.command()
                .args(["--listen", "127.0.0.1:0", "--max-unauthenticated"])
                .arg(CAP.to_string())
                .arg("--key-file")
                .arg(kiln_testkit::key_file()),
        )
    }
}

fn key() -> Key {
    Key::read_file(&kiln_testkit::key_file()).unwrap()
}

fn timeouts() -> Timeouts {
    Timeouts {
        request: Duration::from_secs(30),
        run: Some(Duration::from_secs(60)),
    }
}

fn lookup(remote: &RemoteExecutor) -> Result<u64, RemoteError> {
    // A symbol every executor's C library has.
    match remote.request(&Request::Lookup {
        library: 0,
        name: "malloc".into(),
    })? {
        Response::Symbol { address, .. } if address != 0 => Ok(address),
        other => panic!("unexpected {other:?}"),
    }
}

/// A keyed client's time from connecting to its first answer.
fn keyed_client_served(address: &str) -> Duration {
    let start = Instant::now();
    let remote = RemoteExecutor::connect_with_key(address, Some(&key()), timeouts())
        .expect("a keyed client gets in");
    lookup(&remote).expect("a keyed client is served");
    let served = start.elapsed();
    remote.shutdown();
    served
}

/// A keyed channel that has read the hello: raw frames go out as they are given.
fn keyed_channel(address: &str) -> Channel {
    let stream = TcpStream::connect(address).unwrap();
    let mut channel = Channel::new(Stream::Tcp(stream));
    channel.set_timeout(Some(Duration::from_secs(30))).unwrap();
    assert_eq!(channel.recv_raw(8).unwrap(), PREAMBLE_NOISE);
    channel.secure(&key(), Role::Initiator).unwrap();
    let hello = channel.recv().expect("the hello");
    assert_eq!(hello[4], 0, "the hello's tag");
    channel
}

fn frame(id: u32, tag: u8, fields: &[u8]) -> Vec<u8> {
    let mut f = ((fields.len() + 5) as u32).to_le_bytes().to_vec();
    f.extend(id.to_le_bytes());
    f.push(tag);
    f.extend(fields);
    f
}

/// What a malformed request got.
#[derive(Debug, PartialEq, Eq)]
enum Outcome {
    /// An Error answer, and the connection served the next request.
    Error,
    /// No answer (a request without one), and the connection served the next request.
    Nothing,
    /// The connection was closed.
    Closed,
}

const TAG_ERROR: u8 = 105;
const TAG_LOOKUP: u8 = 8;

/// Sends `request` (frame bytes) on the open keyed connection (a new one if none is
/// open), then a Lookup of `malloc`; what came back (a closed connection is forgotten). A
/// hang fails the test (the channel's 30 s timeout).
fn try_malformed(address: &str, open: &mut Option<Channel>, what: &str, request: &[u8]) -> Outcome {
    let outcome = answer_to(
        open.get_or_insert_with(|| keyed_channel(address)),
        what,
        request,
    );
    if outcome == Outcome::Closed {
        *open = None;
    }
    outcome
}

fn answer_to(channel: &mut Channel, what: &str, request: &[u8]) -> Outcome {
    if channel.send(request).is_err() {
        return Outcome::Closed;
    }
    let mut lookup = 0u64.to_le_bytes().to_vec();
    lookup.extend(6u32.to_le_bytes());
    lookup.extend(b"malloc");
    if channel
        .send(&frame(0x7000_0000, TAG_LOOKUP, &lookup))
        .is_err()
    {
        return Outcome::Closed;
    }
    let mut errored = false;
    loop {
        match channel.recv() {
            Ok(body) => {
                let id = u32::from_le_bytes(body[..4].try_into().unwrap());
                if id == 0x7000_0000 {
                    return if errored {
                        Outcome::Error
                    } else {
                        Outcome::Nothing
                    };
                }
                errored |= body[4] == TAG_ERROR;
            }
            Err(kiln_remote::channel::ChannelError::Timeout(t)) => {
                panic!("{what}: no answer within {t:?}: the executor hangs")
            }
            Err(_) => return Outcome::Closed,
        }
    }
}

fn promise(target: Target) {
    let name = format!("{target:?}");
    let executor = target.listen();
    let address = executor.address.clone();
    let pid = executor.child.id();

    // No key, a wrong key: refused, with errors that say so.
    match RemoteExecutor::connect_with_key(&address, None, timeouts()) {
        Err(RemoteError::Authentication { reason, .. }) => {
            assert!(reason.contains("requires a key"), "{name}: {reason}")
        }
        Err(other) => panic!("{name}: no key: expected an authentication error, got {other}"),
        Ok(_) => panic!("{name}: no key: connected"),
    }
    match RemoteExecutor::connect_with_key(&address, Some(&Key::generate().unwrap()), timeouts()) {
        Err(RemoteError::Authentication { .. }) => {}
        Err(other) => panic!("{name}: wrong key: expected an authentication error, got {other}"),
        Ok(_) => panic!("{name}: wrong key: connected"),
    }
    // A client speaking the plain protocol gets nothing back (no hello, no answer) and is
    // closed.
    let mut s = TcpStream::connect(&address).unwrap();
    let mut preamble = [0u8; 8];
    s.read_exact(&mut preamble).unwrap();
    assert_eq!(preamble, PREAMBLE_NOISE, "{name}");
    s.write_all(&frame(1, 1, &[0; 26])).unwrap();
    assert!(
        closed_within(&mut s, Duration::from_secs(20), 0),
        "{name}: a plaintext client was answered"
    );

    // A tampered or replayed frame ends its connection; the executor serves on.
    for attack in [Attack::Tamper, Attack::Replay] {
        let proxy = man_in_the_middle(address.clone(), attack, SECOND_REQUEST);
        let remote = RemoteExecutor::connect_with_key(&proxy, Some(&key()), timeouts()).unwrap();
        lookup(&remote).unwrap();
        let error = lookup(&remote).expect_err("an altered request was served");
        let text = error.to_string();
        assert!(
            text.contains("died") || text.contains("closed") || text.contains("connection"),
            "{name}: {text}"
        );
    }

    // Replayed first messages: none gets past the confirmation; they hold at most CAP
    // processes; a keyed client is served meanwhile.
    let (proxy, recorded) = recording_proxy(address.clone());
    let remote = RemoteExecutor::connect_with_key(&proxy, Some(&key()), timeouts()).unwrap();
    lookup(&remote).unwrap();
    let message1 = recorded.recv().unwrap();
    remote.shutdown();
    let replayers: Vec<TcpStream> = (0..100)
        .map(|_| {
            let mut s = TcpStream::connect(&address).unwrap();
            s.write_all(&message1).unwrap();
            s
        })
        .collect();
    accepted_all(&address);
    let (replay_processes, replay_rss) = held(pid);
    let replay_served = keyed_client_served(&address);
    drop(replayers);

    // 2,000 silent connections.
    let flood: Vec<TcpStream> = (0..2_000)
        .filter_map(|_| TcpStream::connect(&address).ok())
        .collect();
    assert!(
        flood.len() > 1_900,
        "{name}: only {} connections",
        flood.len()
    );
    accepted_all(&address);
    let (flood_processes, flood_rss) = held(pid);
    let flood_served = keyed_client_served(&address);
    drop(flood);
    eprintln!(
        "{name}: 100 replayed first messages: {replay_processes} processes, {replay_rss} KiB RSS in all, a keyed client served in {replay_served:?}; \
         2,000 silent connections: {flood_processes} processes, {flood_rss} KiB, a keyed client served in {flood_served:?}"
    );
    // The listener's own helpers (Wine's) aside, at most CAP connection processes.
    assert!(
        replay_processes <= CAP + 2,
        "{name}: {replay_processes} processes for 100 replayers"
    );
    assert!(
        flood_processes <= CAP + 2,
        "{name}: {flood_processes} processes for 2,000 silent connections"
    );
    assert!(
        replay_served < Duration::from_secs(1),
        "{name}: served after {replay_served:?} among replayers"
    );
    assert!(
        flood_served < Duration::from_secs(1),
        "{name}: served after {flood_served:?} among 2,000 silent connections"
    );

    // Malformed frames: every request kind with its fields cut off, and with every field
    // all ones (addresses, handles and lengths out of range), an answer to a ResolveStub
    // never asked, and unknown tags.
    let mut outcomes = Vec::new();
    let mut open = None;
    let tags: Vec<u8> = (1..=36).chain([77, 110, 255]).collect();
    for &tag in &tags {
        for fields in [Vec::new(), vec![0xff; 64], vec![0x00; 3]] {
            let what = format!("{name}: tag {tag} with {} field bytes", fields.len());
            let outcome = try_malformed(&address, &mut open, &what, &frame(9, tag, &fields));
            outcomes.push((what, outcome));
        }
    }
    let stray = try_malformed(
        &address,
        &mut open,
        "stray stub answer",
        &frame(0x8000_0007, 110, &[0xff; 16]),
    );
    outcomes.push(("stray stub answer".into(), stray));
    // A frame longer than the limit, a length shorter than a frame, a frame cut short
    // (the connection then closed by the client), bytes that are no Noise message.
    let huge = try_malformed(&address, &mut open, "huge length", &u32::MAX.to_le_bytes());
    assert_eq!(huge, Outcome::Closed, "{name}: a frame of 4 GiB");
    let tiny = try_malformed(&address, &mut open, "length 2", &2u32.to_le_bytes());
    assert_eq!(
        tiny,
        Outcome::Closed,
        "{name}: a frame shorter than its header"
    );
    {
        let mut channel = keyed_channel(&address);
        let mut cut = frame(3, TAG_LOOKUP, &[0u8; 40]);
        cut.truncate(20);
        channel.send(&cut).unwrap();
        channel.shutdown();
        assert!(
            channel.recv().is_err(),
            "{name}: a frame cut short was answered"
        );
    }
    {
        let mut s = TcpStream::connect(&address).unwrap();
        let mut preamble = [0u8; 8];
        s.read_exact(&mut preamble).unwrap();
        let garbage: Vec<u8> = (0..4096u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect();
        let _ = s.write_all(&garbage);
        assert!(
            closed_within(&mut s, Duration::from_secs(20), 0),
            "{name}: garbage was answered"
        );
    }
    // Each request kind: an Error, nothing (Input), or the connection closed; the listener
    // lives and serves a keyed client after all of them.
    let errors = outcomes
        .iter()
        .filter(|(_, o)| *o == Outcome::Error)
        .count();
    assert!(
        errors > tags.len(),
        "{name}: only {errors} Errors: {outcomes:?}"
    );
    assert!(executor_alive(&executor), "{name}: the listener died");
    keyed_client_served(&address);

    // --no-auth refuses a non-loopback address.
    let out = target
        .command()
        .args(["--listen", "0.0.0.0:0", "--no-auth"])
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(2),
        "{name}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("without authentication"),
        "{name}"
    );
}

/// The listener still runs (not ended, not a zombie).
fn executor_alive(executor: &ExecutorProcess) -> bool {
    std::fs::read_to_string(format!("/proc/{}/stat", executor.child.id()))
        .map(|s| {
            !s.rsplit(')')
                .next()
                .unwrap_or("")
                .trim_start()
                .starts_with('Z')
        })
        .unwrap_or(false)
}

#[test]
fn the_x86_64_c_executor_keeps_the_promise() {
    promise(Target::X86_64);
}

#[test]
fn the_aarch64_c_executor_keeps_the_promise() {
    if kiln_testkit::skip_cross("the_aarch64_c_executor_keeps_the_promise") {
        return;
    }
    promise(Target::Aarch64);
}

#[test]
fn the_riscv64_c_executor_keeps_the_promise() {
    if kiln_testkit::skip_cross("the_riscv64_c_executor_keeps_the_promise") {
        return;
    }
    promise(Target::Riscv64);
}

#[test]
fn the_windows_executor_keeps_the_promise() {
    if kiln_testkit::skip_cross("the_windows_executor_keeps_the_promise") {
        return;
    }
    promise(Target::Windows);
}
