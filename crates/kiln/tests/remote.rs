//! Out-of-process execution through the session API: crashes, deaths, stalls and
//! malformed messages become errors; nothing leaks; the controller goes on.

use kiln::Input;
use kiln::{
    executor::{RemoteError, Timeouts, Transport},
    Executor, Jit,
};
use kiln_remote::protocol::{Request, Response};
use std::io::{BufRead, Read, Write};
use std::process::Command;
use std::time::Duration;

fn compile(name: &str, source: &str) -> Vec<u8> {
    compile_with(name, source, &["-O1"])
}

fn compile_with(name: &str, source: &str, flags: &[&str]) -> Vec<u8> {
    kiln_testkit::cc_object(name, source, flags)
}

fn spawn(transport: Transport) -> Executor {
    Executor::spawn(
        &kiln_testkit::executor_binary(),
        transport,
        Timeouts::default(),
    )
    .unwrap()
}

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

#[test]
fn a_crash_in_jit_code_is_an_error_and_a_new_executor_works() {
    for transport in [Transport::SharedMemory, Transport::Copy] {
        let jit = Jit::builder().executor(spawn(transport)).build().unwrap();
        let lib = jit.main_library();
        jit.library(lib)
            .add(Input::object(
                "crash.o",
                compile(
                    "crash",
                    "int main(void) { *(volatile int *)8 = 1; return 0; }",
                ),
            ))
            .unwrap();
        jit.library(lib).add(Input::ProcessSymbols).unwrap();
        let err = run_main(&jit, lib, &["crash".into()]).unwrap_err();
        let text = err.to_string();
        assert!(text.contains("SIGSEGV"), "{text}");
        assert!(
            matches!(
                err,
                kiln::Error::Remote(RemoteError::Crashed { signal: 11, .. })
            ),
            "{err:?}"
        );
        // The controller is fine: another executor runs code.
        let jit = Jit::builder().executor(spawn(transport)).build().unwrap();
        let lib = jit.main_library();
        jit.library(lib)
            .add(Input::object(
                "ok.o",
                compile(
                    "ok",
                    "int main(int argc, char **argv) { return argc + 40; }",
                ),
            ))
            .unwrap();
        assert_eq!(run_main(&jit, lib, &["ok".into(), "x".into()]).unwrap(), 42);
    }
}

#[test]
fn a_trap_that_would_not_fault_again_is_reported_too() {
    // int3 leaves the instruction pointer past itself: returning from the handler would
    // go on running; the executor must still die with SIGTRAP and say so.
    let jit = Jit::builder()
        .executor(spawn(Transport::SharedMemory))
        .build()
        .unwrap();
    let lib = jit.main_library();
    jit.library(lib)
        .add(Input::object(
            "trap.o",
            compile(
                "trap",
                "int main(void) { __asm__ volatile(\"int3\"); return 5; }",
            ),
        ))
        .unwrap();
    let err = run_main(&jit, lib, &["trap".into()]).unwrap_err();
    assert!(err.to_string().contains("SIGTRAP"), "{err}");
}

#[test]
fn abort_is_reported_by_name() {
    let jit = Jit::builder()
        .executor(spawn(Transport::SharedMemory))
        .build()
        .unwrap();
    let lib = jit.main_library();
    jit.library(lib)
        .add(Input::object(
            "abort.o",
            compile("abort", "#include <stdlib.h>\nint main(void) { abort(); }"),
        ))
        .unwrap();
    jit.library(lib).add(Input::ProcessSymbols).unwrap();
    let err = run_main(&jit, lib, &["abort".into()]).unwrap_err();
    assert!(err.to_string().contains("SIGABRT"), "{err}");
}

#[test]
fn an_executor_killed_mid_request_is_an_error_not_a_hang() {
    let executor = spawn(Transport::SharedMemory);
    let remote = executor.clone();
    let jit = Jit::builder().executor(executor).build().unwrap();
    let lib = jit.main_library();
    jit.library(lib)
        .add(Input::object(
            "slow.o",
            compile(
                "slow",
                "#include <unistd.h>\nint main(void) { sleep(30); return 0; }",
            ),
        ))
        .unwrap();
    jit.library(lib).add(Input::ProcessSymbols).unwrap();
    let killer = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(500));
        remote.kill();
    });
    let started = std::time::Instant::now();
    let err = run_main(&jit, lib, &["slow".into()]).unwrap_err();
    killer.join().unwrap();
    assert!(started.elapsed() < Duration::from_secs(10));
    assert!(err.to_string().contains("SIGKILL"), "{err}");
    // Later requests to the dead executor fail at once.
    let started = std::time::Instant::now();
    assert!(jit.executor().lookup(0, "printf").is_err());
    assert!(started.elapsed() < Duration::from_secs(1));
}

#[test]
fn a_stalled_executor_times_out() {
    let timeouts = Timeouts {
        request: Duration::from_millis(700),
        run: Some(Duration::from_millis(700)),
    };
    let executor = Executor::spawn(
        &kiln_testkit::executor_binary(),
        Transport::SharedMemory,
        timeouts,
    )
    .unwrap();
    let pid = executor.pid().unwrap() as i32;
    let jit = Jit::builder().executor(executor).build().unwrap();
    let lib = jit.main_library();
    jit.library(lib)
        .add(Input::object(
            "x.o",
            compile("x", "int main(void) { return 3; }"),
        ))
        .unwrap();
    // SAFETY: stopping our own child process.
    unsafe { libc::kill(pid, libc::SIGSTOP) };
    let err = run_main(&jit, lib, &["x".into()]).unwrap_err();
    // SAFETY: as above.
    unsafe { libc::kill(pid, libc::SIGKILL) };
    assert!(err.to_string().contains("did not answer"), "{err}");
}

/// Runs in a child process of its own (started by the test below), so that other tests'
/// descriptors do not mix in: after a warm-up cycle, three more cycles of spawning an
/// executor, linking, running and shutting down must leave exactly the same descriptors.
#[test]
fn descriptor_check_child() {
    if std::env::var_os("KILN_FD_CHECK_CHILD").is_none() {
        return;
    }
    let cycle = || {
        let jit = Jit::builder()
            .executor(spawn(Transport::SharedMemory))
            .build()
            .unwrap();
        let lib = jit.main_library();
        jit.library(lib)
            .add(Input::object(
                "m.o",
                compile("m", "int main(void) { return 7; }"),
            ))
            .unwrap();
        assert_eq!(run_main(&jit, lib, &["m".into()]).unwrap(), 7);
        jit.shutdown();
    };
    cycle();
    let before = open_fds();
    for _ in 0..3 {
        cycle();
    }
    let after = open_fds();
    assert_eq!(before, after, "descriptors went from {before} to {after}");
    println!("descriptor check passed: {before} before and after");
}

#[test]
fn no_descriptor_or_shared_memory_object_is_left_behind() {
    let shm_before: Vec<_> = std::fs::read_dir("/dev/shm")
        .map(|d| d.filter_map(|e| e.ok()).map(|e| e.file_name()).collect())
        .unwrap_or_default();
    let out = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "descriptor_check_child",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("KILN_FD_CHECK_CHILD", "1")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("descriptor check passed"), "{stdout}");
    let shm_after: Vec<_> = std::fs::read_dir("/dev/shm")
        .map(|d| d.filter_map(|e| e.ok()).map(|e| e.file_name()).collect())
        .unwrap_or_default();
    assert_eq!(
        shm_before.len(),
        shm_after.len(),
        "named shared memory appeared: {shm_after:?}"
    );
}

fn executor_rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap()
}

#[test]
fn many_link_run_cycles_do_not_grow_the_executor() {
    let executor = spawn(Transport::SharedMemory);
    let pid = executor.pid().unwrap();
    let jit = Jit::builder().executor(executor).build().unwrap();
    let obj = compile_with(
        "cycle",
        "#include <stdlib.h>\n#include <string.h>\nstatic char big[256 * 1024] = {1};\n__thread int t = 5;\nint run(int x) { char *p = malloc(1000); memset(p, x, 1000); int r = p[10] + big[0] + t; free(p); return r; }\nint main(int argc, char **argv) { (void)argv; return run(argc); }\n",
        &["-O1", "-fPIC"],
    );
    let mut rss = Vec::new();
    let mut fds = Vec::new();
    for i in 0..150 {
        let lib = jit.create_library(&format!("cycle{i}"));
        jit.library(lib)
            .add(Input::object("cycle.o", obj.clone()))
            .unwrap();
        jit.library(lib).add(Input::ProcessSymbols).unwrap();
        assert_eq!(run_main(&jit, lib, &["c".into()]).unwrap(), 7);
        let (module, _) = jit
            .link_pending(lib)
            .unwrap()
            .map_or_else(|| (None, ()), |(m, _)| (Some(m), ()));
        drop(module);
        jit.shutdown();
        if i % 50 == 49 {
            rss.push(executor_rss_kib(pid));
            fds.push(
                std::fs::read_dir(format!("/proc/{pid}/fd"))
                    .unwrap()
                    .count(),
            );
        }
    }
    // The executor closes what each cycle opened (memfds, libraries).
    assert_eq!(fds[1], fds[2], "executor descriptors: {fds:?}");
    // After the first 50 cycles warm everything up, 100 more may not add more than a
    // few hundred KiB (each cycle maps 256 KiB of data).
    assert!(rss[2] <= rss[0] + 2048, "executor RSS grew: {rss:?} KiB");
}

/// Raw protocol against `kiln-executor --listen`: malformed and out-of-range requests get
/// error replies and the executor keeps serving.
#[test]
fn malformed_and_out_of_range_requests_get_error_replies() {
    // Plaintext (--no-auth, loopback only), to speak the raw protocol.
    struct KillOnDrop(std::process::Child);
    impl Drop for KillOnDrop {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let mut child = KillOnDrop(
        Command::new(kiln_testkit::executor_binary())
            .args(["--listen", "--no-auth"])
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let mut stderr = std::io::BufReader::new(child.0.stderr.take().unwrap());
    let mut line = String::new();
    while !line.contains("listening on") {
        line.clear();
        stderr.read_line(&mut line).unwrap();
    }
    let address = line.trim().rsplit(' ').next().unwrap().to_string();
    assert!(
        address.starts_with("127.0.0.1:"),
        "binds loopback by default: {line}"
    );
    let connect = |address: &str| {
        let mut s = std::net::TcpStream::connect(address).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut preamble = [0u8; 8];
        s.read_exact(&mut preamble).unwrap();
        assert_eq!(preamble, kiln_remote::secure::PREAMBLE_PLAIN);
        s
    };
    let mut s = connect(&address);
    let read_frame = |s: &mut std::net::TcpStream| -> Vec<u8> {
        let mut len = [0u8; 4];
        s.read_exact(&mut len).unwrap();
        let mut body = vec![0u8; u32::from_le_bytes(len) as usize];
        s.read_exact(&mut body).unwrap();
        body
    };
    let hello = read_frame(&mut s);
    assert_eq!(&hello[5..9], b"KILN");
    let ask = |frame: Vec<u8>, s: &mut std::net::TcpStream| -> Response {
        s.write_all(&frame).unwrap();
        Response::decode(&read_frame(s)).unwrap()
    };
    // Unknown tag.
    let r = ask(vec![5, 0, 0, 0, 7, 0, 0, 0, 250], &mut s);
    assert!(
        matches!(&r, Response::Error(m) if m.contains("unknown message tag 250")),
        "{r:?}"
    );
    // Truncated fields.
    let r = ask(vec![7, 0, 0, 0, 8, 0, 0, 0, 5, 1, 2], &mut s);
    assert!(
        matches!(&r, Response::Error(m) if m.contains("truncated")),
        "{r:?}"
    );
    // A write to memory the executor did not reserve.
    let r = ask(
        Request::Write {
            handle: 1,
            address: 0x1000,
            bytes: vec![0xcc; 16],
        }
        .encode(),
        &mut s,
    );
    assert!(
        matches!(&r, Response::Error(m) if m.contains("no reservation")),
        "{r:?}"
    );
    // Reserve, then write past its end.
    let Response::Reserved { target, handle } = ask(
        Request::Reserve {
            len: 1 << 20,
            placement: kiln_remote::protocol::WirePlacement::Anywhere,
            share: false,
        }
        .encode(),
        &mut s,
    ) else {
        panic!()
    };
    let r = ask(
        Request::Write {
            handle,
            address: target + (1 << 20) - 8,
            bytes: vec![0; 16],
        }
        .encode(),
        &mut s,
    );
    assert!(
        matches!(&r, Response::Error(m) if m.contains("outside reservation")),
        "{r:?}"
    );
    // Calling outside reserved memory is refused, not done.
    let r = ask(
        Request::Call {
            address: 0x4141_4141,
            args: vec![],
        }
        .encode(),
        &mut s,
    );
    assert!(
        matches!(&r, Response::Error(m) if m.contains("not in memory this executor reserved")),
        "{r:?}"
    );
    // Unwind data on pages never prepared is refused, not walked.
    let r = ask(
        Request::RegisterEhFrame { address: target }.encode(),
        &mut s,
    );
    assert!(
        matches!(&r, Response::Error(m) if m.contains("not prepared")),
        "{r:?}"
    );
    // Unwind data that is walked by gimli before libgcc sees it: a CIE of an unknown
    // version, an FDE whose range wraps around, an FDE over memory never prepared.
    let r = ask(
        Request::Prepare {
            handle,
            start: target,
            end: target + 4096,
            permission: 1,
        }
        .encode(),
        &mut s,
    );
    assert_eq!(r, Response::Ok);
    let cie = |version: u8| -> Vec<u8> {
        // length 12: id 0, version, augmentation "", code align 1, data align -8, RA 16,
        // three DW_CFA_nop.
        let mut c = 12u32.to_le_bytes().to_vec();
        c.extend_from_slice(&0u32.to_le_bytes());
        c.extend_from_slice(&[version, 0, 1, 0x78, 16, 0, 0, 0]);
        c
    };
    let fde = |begin: u64, len: u64| -> Vec<u8> {
        // length 20: CIE pointer (back to offset 0 from offset 20), begin, range.
        let mut f = 20u32.to_le_bytes().to_vec();
        f.extend_from_slice(&20u32.to_le_bytes());
        f.extend_from_slice(&begin.to_le_bytes());
        f.extend_from_slice(&len.to_le_bytes());
        f
    };
    for (what, mut bytes, expect) in [
        ("unknown CIE version", cie(99), "malformed"),
        (
            "reversed range",
            [cie(1), fde(0xffff_ffff_ffff_f000, 0x10000)].concat(),
            "reversed",
        ),
        (
            "range outside",
            [cie(1), fde(0x4141_0000, 16)].concat(),
            "FDE range",
        ),
    ] {
        bytes.extend_from_slice(&[0; 4]);
        let r = ask(
            Request::Write {
                handle,
                address: target,
                bytes,
            }
            .encode(),
            &mut s,
        );
        assert_eq!(r, Response::Ok, "{what}");
        let r = ask(
            Request::RegisterEhFrame { address: target }.encode(),
            &mut s,
        );
        assert!(
            matches!(&r, Response::Error(m) if m.contains(expect)),
            "{what}: {r:?}"
        );
    }
    // Shared memory cannot travel over TCP: an error reply, not a dropped connection.
    let r = ask(
        Request::Reserve {
            len: 1 << 20,
            placement: kiln_remote::protocol::WirePlacement::Anywhere,
            share: true,
        }
        .encode(),
        &mut s,
    );
    assert!(
        matches!(&r, Response::Error(m) if m.contains("copy transport")),
        "{r:?}"
    );
    // A reversed placement range.
    let r = ask(
        Request::Reserve {
            len: 1 << 20,
            placement: kiln_remote::protocol::WirePlacement::Near(0x7000_0000, 0x1000_0000),
            share: false,
        }
        .encode(),
        &mut s,
    );
    assert!(
        matches!(&r, Response::Error(m) if m.contains("reversed")),
        "{r:?}"
    );
    // A TLS template for a module id never reserved here.
    let r = ask(
        Request::InstallTls {
            module_id: 0,
            size: 16,
            align: 16,
            image: vec![],
        }
        .encode(),
        &mut s,
    );
    assert!(
        matches!(&r, Response::Error(m) if m.contains("not reserved")),
        "{r:?}"
    );
    // Misaligned page range.
    let r = ask(
        Request::Prepare {
            handle,
            start: target + 1,
            end: target + 4096,
            permission: 0,
        }
        .encode(),
        &mut s,
    );
    assert!(matches!(&r, Response::Error(_)), "{r:?}");
    // Still alive and well.
    let r = ask(
        Request::Lookup {
            library: 0,
            name: "printf".into(),
        }
        .encode(),
        &mut s,
    );
    assert!(
        matches!(r, Response::Symbol { address, kind: 1 } if address != 0),
        "{r:?}"
    );
    let r = ask(Request::Release { handle }.encode(), &mut s);
    assert_eq!(r, Response::Ok);
    // An absurd frame length closes this connection, not the executor.
    s.write_all(&u32::MAX.to_le_bytes()).unwrap();
    let r = Response::decode(&read_frame(&mut s)).unwrap();
    assert!(
        matches!(&r, Response::Error(m) if m.contains("too large")),
        "{r:?}"
    );
    let mut s2 = connect(&address);
    assert_eq!(&read_frame(&mut s2)[5..9], b"KILN");
    s2.write_all(&Request::Shutdown.encode()).unwrap();
    assert_eq!(
        Response::decode(&read_frame(&mut s2)).unwrap(),
        Response::Ok
    );
    // A client's Shutdown ends its own connection; the listener serves the next one.
    let mut s3 = connect(&address);
    assert_eq!(&read_frame(&mut s3)[5..9], b"KILN");
    assert!(
        child.0.try_wait().unwrap().is_none(),
        "the listener lives on"
    );
}

#[test]
fn a_wrong_protocol_version_is_refused() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let address = listener.local_addr().unwrap().to_string();
    let server = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        s.write_all(&kiln_remote::secure::PREAMBLE_PLAIN).unwrap();
        let hello = kiln_remote::protocol::Hello {
            version: 999,
            page_size: 4096,
            triple: "x86_64-unknown-linux-gnu".into(),
            pid: 1,
            max_frame: kiln_remote::protocol::MAX_FRAME,
            runtime_symbols: Vec::new(),
            features: 0,
        };
        s.write_all(&hello.encode()).unwrap();
    });
    let err = Executor::connect(&address, Timeouts::default()).unwrap_err();
    server.join().unwrap();
    assert!(
        matches!(
            err,
            kiln::Error::Remote(RemoteError::Version { found: 999, .. })
        ),
        "{err:?}"
    );
}

/// Runs `main` of a test program.
#[allow(clippy::result_large_err)]
fn run_main(jit: &kiln::Jit, lib: kiln::LibraryId, args: &[String]) -> Result<i32, kiln::Error> {
    // SAFETY: every test program defines a C `int main(int, char **)`.
    unsafe { jit.run_main(lib, args) }
}

#[test]
fn a_missing_executor_binary_says_how_to_build_it() {
    let missing = std::path::Path::new("/nonexistent/kiln-executor");
    let err = Executor::spawn(missing, Transport::SharedMemory, Timeouts::default()).unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("/nonexistent/kiln-executor")
            && text.contains("cargo build -p kiln-executor"),
        "{text}"
    );
    // The default finds the executor this build made (beside the test binary's directory).
    let path = kiln::executor::default_executor_path();
    assert!(path.is_file(), "{}", path.display());
}

#[test]
fn a_links_steps_after_layout_are_one_round_trip_and_a_batched_failure_names_its_request() {
    for transport in [Transport::SharedMemory, Transport::Copy] {
        // The connection is kept, to speak the protocol on it below.
        let remote = std::sync::Arc::new(
            kiln_remote::RemoteExecutor::spawn(
                &kiln_testkit::executor_binary(),
                Timeouts::default(),
            )
            .unwrap(),
        );
        let executor = Executor::from_connection(remote.clone(), transport);
        let jit = Jit::builder().executor(executor).build().unwrap();
        let lib = jit.main_library();
        jit.library(lib)
            .add(Input::object(
                "two.o",
                compile(
                    "two",
                    "static int data = 40; int main(int argc, char **argv) { return argc + data; }",
                ),
            ))
            .unwrap();
        jit.library(lib).add(Input::ProcessSymbols).unwrap();
        assert_eq!(
            run_main(&jit, lib, &["two".into(), "x".into()]).unwrap(),
            42
        );
        assert_steps_after_layout_batched(&jit);
        // A deferred request that fails fails the scope's end, by name; the executor
        // serves nothing after it and the connection goes on.
        let batching = remote.batch();
        for address in [8u64, 16] {
            let deferred = remote
                .request(&Request::RegisterEhFrame { address })
                .unwrap();
            assert_eq!(deferred, Response::Ok);
        }
        let err = batching.finish().unwrap_err();
        assert!(
            matches!(&err, RemoteError::Refused { request, .. } if request == "register eh_frame (batched)"),
            "{err:?}"
        );
        assert!(err.to_string().contains("0x8"), "{err}");
        assert!(remote.request(&Request::ReserveTlsModule).is_ok());
        // A request that runs code is refused inside a batch, and nothing after it runs.
        let answer = remote
            .request(&Request::Batch(vec![
                Request::ReserveTlsModule,
                Request::RunMain {
                    address: 0x1000,
                    args: vec![],
                },
                Request::ReserveTlsModule,
            ]))
            .unwrap();
        let Response::Batched(answers) = answer else {
            panic!("{answer:?}");
        };
        assert_eq!(answers.len(), 2, "{answers:?}");
        assert!(matches!(answers[0], Response::Value(_)), "{answers:?}");
        assert!(
            matches!(&answers[1], Response::Error(m) if m.contains("run main cannot be batched")),
            "{answers:?}"
        );
    }
}

/// With exports waiting for the loader's first use, a shared library added after a link
/// that imports one of the program's names is loaded only after they are published (it
/// binds to the program's definition, as a native `-rdynamic` program's library would),
/// in process and out of process; the library's function then runs into JIT code.
#[test]
fn a_library_added_after_the_link_binds_to_the_programs_definitions() {
    let dir = std::env::temp_dir().join(format!("kiln-needs-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let source = dir.join("needs.c");
    std::fs::write(
        &source,
        "int twice(int);\nint call_twice(int x) { return twice(x) + 1; }\n",
    )
    .unwrap();
    let library = dir.join("libneeds.so");
    kiln_testkit::cc(&["-O2", "-fPIC", "-shared"], &source, &library);
    for executor in [Executor::in_process(), spawn(Transport::SharedMemory)] {
        let jit = Jit::builder()
            .executor(executor)
            .export_to_libraries(true)
            .exports_on_demand(true)
            .build()
            .unwrap();
        let lib = jit.main_library();
        jit.library(lib)
            .add(Input::object(
                "twice.o",
                compile("twice", "int twice(int x) { return 2 * x; }"),
            ))
            .unwrap();
        jit.library(lib).add(Input::ProcessSymbols).unwrap();
        jit.lookup(lib, "twice").unwrap();
        jit.library(lib)
            .add(Input::shared_library(&library))
            .expect("the library binds to the program's twice");
        jit.library(lib)
            .add(Input::object(
                "use.o",
                compile(
                    "use",
                    "int call_twice(int);\nlong use_library(void) { return call_twice(20); }",
                ),
            ))
            .unwrap();
        let address = jit.lookup(lib, "use_library").unwrap();
        // SAFETY: `long use_library(void)`, just linked.
        let value = unsafe { jit.executor().call(address, &[]) }.unwrap();
        assert_eq!(value, 41);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// `Executor::start` returns once the process runs; the session is built and loads its
/// inputs before the hello. An executor that never says hello (here `/bin/false`, an ELF
/// program of this machine) makes the first step that needs it fail, naming why; a binary
/// that does not start at all fails at once; a script (no ELF header to read) is waited
/// for as `spawn_with` waits, and works.
#[test]
fn a_started_executor_is_waited_for_at_its_first_use() {
    let object = compile("answer", "int main(void) { return 42; }");
    // Works: the inputs load before the hello, main runs after.
    let executor = starting_executor();
    let jit = Jit::builder().executor(executor).build().unwrap();
    let lib = jit.main_library();
    jit.library(lib)
        .add(Input::object("answer.o", object.clone()))
        .unwrap();
    jit.library(lib).add(Input::ProcessSymbols).unwrap();
    assert_eq!(run_main(&jit, lib, &["answer".into()]).unwrap(), 42);
    // Never says hello: the session builds and takes the object; the link fails.
    let executor = Executor::start(
        std::path::Path::new("/bin/false"),
        Transport::SharedMemory,
        None,
        Timeouts::default(),
    )
    .unwrap();
    let jit = Jit::builder().executor(executor).build().unwrap();
    let lib = jit.main_library();
    jit.library(lib)
        .add(Input::object("answer.o", object.clone()))
        .unwrap();
    let error = jit.lookup(lib, "main").unwrap_err().to_string();
    assert!(error.contains("no hello from the executor"), "{error}");
    // Does not start: at once.
    let missing = std::path::Path::new("/nonexistent/kiln-executor");
    let error = Executor::start(missing, Transport::SharedMemory, None, Timeouts::default())
        .unwrap_err()
        .to_string();
    assert!(error.contains("/nonexistent/kiln-executor"), "{error}");
    // A script: waited for here, then as any executor.
    let dir = std::env::temp_dir().join(format!("kiln-start-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let script = dir.join("executor.sh");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\nexec '{}' \"$@\"\n",
            kiln_testkit::executor_binary().display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let executor = Executor::start(&script, Transport::Copy, None, Timeouts::default()).unwrap();
    let jit = Jit::builder().executor(executor).build().unwrap();
    let lib = jit.main_library();
    jit.library(lib)
        .add(Input::object("answer.o", object))
        .unwrap();
    jit.library(lib).add(Input::ProcessSymbols).unwrap();
    assert_eq!(run_main(&jit, lib, &["answer".into()]).unwrap(), 42);
    let _ = std::fs::remove_dir_all(&dir);
}

/// With an executor still starting (`Executor::start`), a library's load waits for its
/// hello: the session loads its inputs and starts linking meanwhile. The load is sent
/// before any other request, so the library is there for the link's lookups (its handle
/// works as any), and the link's steps after layout still go as one batch.
#[test]
fn a_library_loaded_while_the_executor_starts_is_there_for_the_link() {
    let executor = starting_executor();
    let libm =
        kiln::library_search::find_library("m", &kiln::library_search::default_search_dirs())
            .unwrap()
            .into_iter()
            .find_map(|file| match file {
                kiln::library_search::LibraryFile::Shared(path) => Some(path),
                kiln::library_search::LibraryFile::Archive(_) => None,
            })
            .expect("a shared libm");
    let handle = executor.load_library(&libm.display().to_string()).unwrap();
    // Not waited for: no request was made yet (the hello is not even read).
    assert!(executor.round_trips().is_empty());
    let jit = Jit::builder().executor(executor).build().unwrap();
    let lib = jit.main_library();
    jit.library(lib)
        .add(Input::object(
            "floor.o",
            compile(
                "floor",
                "double floor(double);\nint main(void) { volatile double x = 41.7; return (int)floor(x) + 1; }",
            ),
        ))
        .unwrap();
    jit.library(lib)
        .add(Input::library_by_name("m", &[]))
        .unwrap();
    jit.library(lib).add(Input::ProcessSymbols).unwrap();
    assert_eq!(run_main(&jit, lib, &["floor".into()]).unwrap(), 42);
    // The handle given before the hello finds libm's definitions.
    let floor = jit.executor().lookup(handle, "floor").unwrap();
    assert!(floor.is_some_and(|(address, _)| address != 0), "{floor:?}");
    assert_steps_after_layout_batched(&jit);
}

/// `kiln-executor` started, its hello not yet read (`Executor::start`).
fn starting_executor() -> Executor {
    Executor::start(
        &kiln_testkit::executor_binary(),
        Transport::SharedMemory,
        None,
        Timeouts::default(),
    )
    .unwrap()
}

/// A session's one link made its steps after layout in one round trip: code, constants
/// and data prepared, initialized and the unwind information registered, sent together,
/// none alone.
fn assert_steps_after_layout_batched(jit: &Jit) {
    let trips = jit.executor().round_trips();
    let count = |name: &str| {
        trips
            .iter()
            .find(|t| t.request == name)
            .map_or(0, |t| t.count)
    };
    assert_eq!(count("batch"), 1, "{trips:?}");
    for alone in ["prepare", "initialize", "register eh_frame"] {
        assert_eq!(count(alone), 0, "{alone}: {trips:?}");
    }
}

/// A library that cannot be loaded, asked for while the executor starts, fails every link
/// of the library that added it, naming the library and why (nothing is published), and
/// a lookup in it; another library of the session, which does not search it, links.
#[test]
fn a_library_that_cannot_be_loaded_while_the_executor_starts_fails_the_links_that_search_it() {
    const MISSING: &str = "/nonexistent/libkiln-missing.so";
    let executor = starting_executor();
    let handle = executor.load_library(MISSING).unwrap();
    let jit = Jit::builder().executor(executor).build().unwrap();
    let lib = jit.main_library();
    let object = compile("answer", "int main(void) { return 42; }");
    jit.library(lib)
        .add(Input::shared_library(MISSING))
        .unwrap();
    jit.library(lib).add(Input::ProcessSymbols).unwrap();
    // A failed link drops its objects: they are added again for the second.
    for _ in 0..2 {
        jit.library(lib)
            .add(Input::object("answer.o", object.clone()))
            .unwrap();
        let error = jit.lookup(lib, "main").unwrap_err().to_string();
        assert!(error.contains(MISSING), "{error}");
    }
    assert!(jit.library(lib).modules().unwrap().is_empty());
    let error = jit
        .executor()
        .lookup(handle, "anything")
        .unwrap_err()
        .to_string();
    assert!(error.contains(MISSING), "{error}");
    let other = jit.create_library("other");
    jit.library(other)
        .add(Input::object("answer.o", object))
        .unwrap();
    jit.library(other).add(Input::ProcessSymbols).unwrap();
    assert_eq!(run_main(&jit, other, &["answer".into()]).unwrap(), 42);
}
