//! The executor written in C (`executor-c/`), from docs/PROTOCOL.md alone: built for
//! AArch64 and RISC-V 64 with their cross compilers and run under qemu, `kiln run
//! --connect` links on x86-64 and the program runs on the other architecture — the test
//! programs, Debian's arm64 zlib, SQLite and Lua, and on RISC-V the same three compiled
//! from the C sources crates carry, each checked against the same program linked
//! natively for that architecture and run under qemu. Built for this machine too, it answers
//! malformed messages without dying. The guest's C library is the cross compiler's
//! (qemu's `-L /usr/aarch64-linux-gnu`); Debian's arm64 libraries come from the private
//! sysroot scripts/test_deps.sh fills. `KILN_TEST_SKIP_CROSS=1` skips the AArch64 tests.

use kiln::executor::Key;
use kiln_remote::channel::{Channel, Stream};
use kiln_remote::secure::{Role, PREAMBLE_NOISE};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::Arc;
use std::time::Duration;

fn kiln() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_kiln"))
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn tmp() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("c_executor");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A running executor and the port it listens on; killed on drop.
struct Executor {
    _process: kiln_testkit::ExecutorProcess,
    port: u16,
}

fn start(command: &mut Command) -> Executor {
    let process = kiln_testkit::start_listening(
        command
            .args(["--listen", "127.0.0.1:0", "--key-file"])
            .arg(kiln_testkit::key_file()),
    );
    let port = process
        .address
        .rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("no port in {:?}", process.address));
    Executor {
        _process: process,
        port,
    }
}

/// The executor built for this machine, once per test process (tests run in parallel).
fn native_executor() -> PathBuf {
    kiln_testkit::c_executor_binary("cc")
}

/// Static TLS for JIT modules comes from the C library's surplus, which is small unless
/// enlarged when the process starts (as for Kiln's own executor): tls.c's block is 4 KiB.
const STATIC_TLS_TUNABLE: &str = "glibc.rtld.optional_static_tls=200000";

/// A foreign architecture the programs run on under qemu: its cross compiler, its qemu,
/// and the guest's root (the cross compiler's C library, the one programs are linked
/// against: qemu's `-L`).
#[derive(Clone, Copy)]
struct Guest {
    name: &'static str,
    gcc: &'static str,
    gxx: &'static str,
    qemu: &'static str,
    root: &'static str,
}

const AARCH64: Guest = Guest {
    name: "aarch64",
    gcc: "aarch64-linux-gnu-gcc",
    gxx: "aarch64-linux-gnu-g++",
    qemu: "qemu-aarch64-static",
    root: kiln_testkit::AARCH64_GUEST_ROOT,
};

const RISCV64: Guest = Guest {
    name: "riscv64",
    gcc: "riscv64-linux-gnu-gcc",
    gxx: "riscv64-linux-gnu-g++",
    qemu: "qemu-riscv64-static",
    root: "/usr/riscv64-linux-gnu",
};

impl Guest {
    /// The executor under qemu, started for one test (each connection is served by a
    /// process of its own); the binary is built once per test process.
    fn executor(self) -> Executor {
        let binary = kiln_testkit::c_executor_binary(self.gcc);
        start(
            Command::new(self.qemu)
                .env("GLIBC_TUNABLES", STATIC_TLS_TUNABLE)
                .args(["-L", self.root])
                .arg(binary),
        )
    }

    /// Compiles each of `sources` with `flags` into `dir`, all at once.
    fn compile_all(self, dir: &Path, sources: &[PathBuf], flags: &[&str]) -> Vec<PathBuf> {
        self.compile_with(self.gcc, dir, sources, flags)
    }

    /// [`Guest::compile_all`] with `compiler` (the C++ one, say).
    fn compile_with(
        self,
        compiler: &str,
        dir: &Path,
        sources: &[PathBuf],
        flags: &[&str],
    ) -> Vec<PathBuf> {
        let jobs: Vec<(PathBuf, std::process::Child)> = sources
            .iter()
            .map(|source| {
                let stem = source.file_stem().unwrap().to_string_lossy();
                let out = dir.join(format!("{stem}.o"));
                let child = Command::new(compiler)
                    .args(flags)
                    .arg("-c")
                    .arg(source)
                    .arg("-o")
                    .arg(&out)
                    .spawn()
                    .unwrap();
                (out, child)
            })
            .collect();
        jobs.into_iter()
            .zip(sources)
            .map(|((out, mut child), source)| {
                let status = child.wait().unwrap();
                assert!(
                    status.success(),
                    "{} {flags:?} {}",
                    self.gcc,
                    source.display()
                );
                out
            })
            .collect()
    }

    /// Compiles a program of tests/programs.
    fn compile(self, dir: &Path, program: &str, flags: &[&str]) -> PathBuf {
        let source = repo().join("tests/programs").join(program);
        self.compile_all(dir, &[source], flags).remove(0)
    }

    /// Links `inputs` natively (`libs` as the driver takes them) and runs the result
    /// under qemu with `args`.
    fn native_run(self, dir: &Path, inputs: &[PathBuf], libs: &[&str], args: &[&str]) -> Output {
        self.native_run_with(self.gcc, dir, inputs, libs, args)
    }

    /// [`Guest::native_run`] linked by `driver` (the C++ one, say).
    fn native_run_with(
        self,
        driver: &str,
        dir: &Path,
        inputs: &[PathBuf],
        libs: &[&str],
        args: &[&str],
    ) -> Output {
        let exe = dir.join("native");
        let status = Command::new(driver)
            .args(inputs)
            .args(libs)
            .arg("-o")
            .arg(&exe)
            .status()
            .unwrap();
        assert!(status.success(), "native link of {inputs:?}");
        Command::new(self.qemu)
            .args(["-L", self.root])
            .arg(&exe)
            .args(args)
            .output()
            .unwrap()
    }
}

fn aarch64_executor() -> Executor {
    AARCH64.executor()
}

/// An AArch64 object of a program of tests/programs, with the arm64 sysroot's headers.
fn cross_compile(dir: &Path, source: &str, flags: &[&str]) -> PathBuf {
    let includes = kiln_testkit::aarch64_includes();
    let mut flags = flags.to_vec();
    flags.extend(includes.iter().map(String::as_str));
    AARCH64.compile(dir, source, &flags)
}

fn native_run(dir: &Path, inputs: &[PathBuf], libs: &[&str], args: &[&str]) -> Output {
    AARCH64.native_run(dir, inputs, libs, args)
}

fn kiln_run(port: u16, inputs: &[PathBuf], libs: &[&str], args: &[&str]) -> Output {
    Command::new(kiln())
        .args(["run", "--key-file"])
        .arg(kiln_testkit::key_file())
        .arg("--connect")
        .arg(format!("127.0.0.1:{port}"))
        .args(inputs)
        .args(libs)
        .arg("--")
        .args(args)
        .output()
        .unwrap()
}

fn assert_same(name: &str, native: &Output, kiln: &Output) {
    assert_eq!(
        String::from_utf8_lossy(&kiln.stdout),
        String::from_utf8_lossy(&native.stdout),
        "{name}: stdout differs (kiln's stderr: {})",
        String::from_utf8_lossy(&kiln.stderr)
    );
    assert_eq!(
        kiln.status.code(),
        native.status.code(),
        "{name}: status differs (kiln's stderr: {})",
        String::from_utf8_lossy(&kiln.stderr)
    );
    assert!(
        !native.stdout.is_empty(),
        "{name}: the program printed nothing"
    );
}

#[test]
fn test_programs_run_on_aarch64_as_natively() {
    if kiln_testkit::skip_cross("test_programs_run_on_aarch64_as_natively") {
        return;
    }
    let executor = aarch64_executor();
    let flag_sets: &[(&str, &[&str])] = &[
        ("O0", &["-O0", "-fcommon"]),
        ("O2-pic", &["-O2", "-fPIC", "-fcommon"]),
        (
            "O2-large",
            &["-O2", "-fno-pic", "-mcmodel=large", "-fcommon"],
        ),
    ];
    relocs_as_natively(AARCH64, executor.port, flag_sets);
}

/// relocs.c with relocs_other.c compiled with each set of flags for `guest`, run through
/// the executor at `port` and natively: the same output and status.
fn relocs_as_natively(guest: Guest, port: u16, flag_sets: &[(&str, &[&str])]) {
    let includes = match guest.name {
        "aarch64" => kiln_testkit::aarch64_includes(),
        _ => Vec::new(),
    };
    for &(label, flags) in flag_sets {
        let dir = tmp().join(format!("{}-relocs-{label}", guest.name));
        std::fs::create_dir_all(&dir).unwrap();
        let mut flags = flags.to_vec();
        flags.extend(includes.iter().map(String::as_str));
        let objects = vec![
            guest.compile(&dir, "relocs.c", &flags),
            guest.compile(&dir, "relocs_other.c", &flags),
        ];
        let native = guest.native_run(&dir, &objects, &[], &[]);
        let kiln = kiln_run(port, &objects, &[], &[]);
        assert_same(&format!("{} relocs {label}", guest.name), &native, &kiln);
    }
}

#[test]
fn debian_arm64_libraries_run_on_aarch64_as_natively() {
    if kiln_testkit::skip_cross("debian_arm64_libraries_run_on_aarch64_as_natively") {
        return;
    }
    let executor = aarch64_executor();
    let port = executor.port;
    let lib = kiln_testkit::aarch64_lib_dir();
    let script = repo().join("tests/programs/script.lua");
    let script = script.to_str().unwrap();
    for (driver, archive, libs, args) in [
        ("zlib_driver.c", "libz.a", &[][..], &[][..]),
        ("sqlite_driver.c", "libsqlite3.a", &["-lm"][..], &[][..]),
        ("lua_driver.c", "liblua5.4.a", &["-lm"][..], &[script][..]),
    ] {
        let dir = tmp().join(archive);
        std::fs::create_dir_all(&dir).unwrap();
        let inputs = vec![cross_compile(&dir, driver, &["-O2"]), lib.join(archive)];
        let native = native_run(&dir, &inputs, libs, args);
        let kiln = kiln_run(port, &inputs, libs, args);
        assert_same(archive, &native, &kiln);
    }
}

/// exit_and_crash.c's object run through the executor at `port` ending each way: by
/// `return 3`, `exit(7)` and a crash (status 139, SIGSEGV named), its output forwarded.
fn exit_return_and_crash(port: u16, object: &[PathBuf]) {
    for (how, status) in [("return", 3), ("exit", 7), ("crash", 139)] {
        let out = kiln_run(port, object, &[], &[how]);
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(status), "{how}: {stderr}");
        assert!(
            stdout.contains(&format!("ending by {how}")),
            "{how}: {stdout}"
        );
        assert!(stderr.contains("a line on stderr"), "{how}: {stderr}");
        if how == "crash" {
            assert!(stderr.contains("SIGSEGV"), "{stderr}");
        }
    }
}

#[test]
fn exit_crash_and_wrong_objects_on_aarch64() {
    if kiln_testkit::skip_cross("exit_crash_and_wrong_objects_on_aarch64") {
        return;
    }
    let executor = aarch64_executor();
    let port = executor.port;
    let dir = tmp().join("exit_and_crash");
    std::fs::create_dir_all(&dir).unwrap();
    let object = vec![cross_compile(&dir, "exit_and_crash.c", &["-O2"])];
    exit_return_and_crash(port, &object);
    // An x86-64 object for an AArch64 executor: the link names both.
    let x86 = dir.join("x86.o");
    let status = Command::new("cc")
        .args(["-c", "-O2"])
        .arg(repo().join("tests/programs/exit_and_crash.c"))
        .arg("-o")
        .arg(&x86)
        .status()
        .unwrap();
    assert!(status.success());
    let out = kiln_run(port, &[x86], &[], &[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("x86.o") && stderr.contains("x86-64") && stderr.contains("AArch64"),
        "{stderr}"
    );
}

/// One frame: length, id, tag, fields.
fn frame(id: u32, tag: u8, fields: &[u8]) -> Vec<u8> {
    let mut f = ((fields.len() + 5) as u32).to_le_bytes().to_vec();
    f.extend(id.to_le_bytes());
    f.push(tag);
    f.extend(fields);
    f
}

/// Reads one frame: (id, tag, fields).
fn read_frame(channel: &mut Channel) -> (u32, u8, Vec<u8>) {
    let body = channel.recv().unwrap();
    let id = u32::from_le_bytes(body[..4].try_into().unwrap());
    (id, body[4], body[5..].to_vec())
}

/// Connects with the test key, checks the preamble, runs the handshake and checks the
/// hello; the channel is ready for requests (sent as raw frames).
fn connect(port: u16) -> Channel {
    let stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
    let mut channel = Channel::new(Stream::Tcp(stream));
    channel.set_timeout(Some(Duration::from_secs(30))).unwrap();
    assert_eq!(channel.recv_raw(8).unwrap(), PREAMBLE_NOISE);
    let key = Key::read_file(&kiln_testkit::key_file()).unwrap();
    channel.secure(&key, Role::Initiator).unwrap();
    let (id, tag, hello) = read_frame(&mut channel);
    assert_eq!((id, tag), (0, 0));
    assert_eq!(&hello[..4], b"KILN");
    assert_eq!(u32::from_le_bytes(hello[4..8].try_into().unwrap()), 2);
    channel
}

fn error_text(channel: &mut Channel, id: u32) -> String {
    let (got, tag, fields) = read_frame(channel);
    assert_eq!(
        (got, tag),
        (id, 105),
        "expected an Error answer to request {id}"
    );
    String::from_utf8_lossy(&fields[4..]).into_owned()
}

#[test]
fn malformed_messages_get_errors_and_the_executor_lives_on() {
    let binary = native_executor();
    let executor = start(&mut Command::new(&binary));
    let mut s = connect(executor.port);
    // An unknown tag, a truncated Reserve, a Write to a reservation that does not exist,
    // a Reserve of a size that is not whole pages, a Lookup with a string longer than the
    // frame: each an Error, and the connection goes on.
    s.send(&frame(1, 77, &[])).unwrap();
    assert!(error_text(&mut s, 1).contains("unknown request tag 77"));
    s.send(&frame(2, 1, &[1, 2, 3])).unwrap();
    assert!(error_text(&mut s, 2).contains("malformed Reserve"));
    let mut write = 9u64.to_le_bytes().to_vec();
    write.extend(0x1000u64.to_le_bytes());
    write.extend(3u32.to_le_bytes());
    write.extend([1, 2, 3]);
    s.send(&frame(3, 6, &write)).unwrap();
    assert!(error_text(&mut s, 3).contains("no reservation with handle 9"));
    let mut reserve = 100u64.to_le_bytes().to_vec();
    reserve.push(0);
    reserve.extend([0u8; 16]);
    reserve.push(0);
    s.send(&frame(4, 1, &reserve)).unwrap();
    assert!(error_text(&mut s, 4).contains("cannot reserve 0x64 bytes"));
    let mut lookup = 0u64.to_le_bytes().to_vec();
    lookup.extend(1000u32.to_le_bytes());
    lookup.extend(b"printf");
    s.send(&frame(5, 8, &lookup)).unwrap();
    assert!(error_text(&mut s, 5).contains("malformed Lookup"));
    // A well-formed Lookup still works on the same connection.
    let mut lookup = 0u64.to_le_bytes().to_vec();
    lookup.extend(6u32.to_le_bytes());
    lookup.extend(b"printf");
    s.send(&frame(6, 8, &lookup)).unwrap();
    let (id, tag, fields) = read_frame(&mut s);
    assert_eq!((id, tag), (6, 104));
    assert_ne!(u64::from_le_bytes(fields[..8].try_into().unwrap()), 0);
    assert_eq!(fields[8], 1, "printf is a function");
    // Memory reserved but not prepared is not run, and not made coherent.
    let mut reserve = 0x10000u64.to_le_bytes().to_vec();
    reserve.push(0);
    reserve.extend([0u8; 16]);
    reserve.push(0);
    s.send(&frame(7, 1, &reserve)).unwrap();
    let (id, tag, fields) = read_frame(&mut s);
    assert_eq!((id, tag), (7, 102), "Reserved");
    let target = u64::from_le_bytes(fields[..8].try_into().unwrap());
    let handle = u64::from_le_bytes(fields[8..16].try_into().unwrap());
    let mut call = target.to_le_bytes().to_vec();
    call.extend(0u32.to_le_bytes());
    s.send(&frame(8, 18, &call)).unwrap();
    assert!(error_text(&mut s, 8).contains("not code this executor prepared to run"));
    let mut initialize = handle.to_le_bytes().to_vec();
    initialize.extend(1u32.to_le_bytes());
    initialize.extend(target.to_le_bytes());
    initialize.extend(0x1000u64.to_le_bytes());
    initialize.push(0);
    s.send(&frame(9, 3, &initialize)).unwrap();
    assert!(error_text(&mut s, 9).contains("not on pages prepared"));
    // A frame beyond the limit ends this connection, before anything is allocated...
    s.send(&u32::MAX.to_le_bytes()).unwrap();
    assert!(s.recv().is_err(), "the connection is closed");
    // ...and the executor serves the next one.
    let mut s = connect(executor.port);
    s.send(&frame(1, 19, &[])).unwrap();
    let (id, tag, _) = read_frame(&mut s);
    assert_eq!((id, tag), (1, 100));
}

#[test]
fn the_c_executor_runs_x86_64_programs_too() {
    let binary = native_executor();
    let executor = start(Command::new(&binary).env("GLIBC_TUNABLES", STATIC_TLS_TUNABLE));
    let dir = tmp().join("native");
    std::fs::create_dir_all(&dir).unwrap();
    let object = dir.join("exit_and_crash.o");
    let status = Command::new("cc")
        .args(["-c", "-O2"])
        .arg(repo().join("tests/programs/exit_and_crash.c"))
        .arg("-o")
        .arg(&object)
        .status()
        .unwrap();
    assert!(status.success());
    let out = kiln_run(executor.port, std::slice::from_ref(&object), &[], &["exit"]);
    assert_eq!(out.status.code(), Some(7));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "ending by exit\n");
    // Thread-locals in every model: static TLS blocks, the executor's __tls_get_addr.
    for (label, flags) in [
        ("le-ie", &["-O2"][..]),
        ("gd", &["-O2", "-fPIC"]),
        ("desc", &["-O2", "-fPIC", "-mtls-dialect=gnu2"]),
    ] {
        let dir = tmp().join(format!("native-tls-{label}"));
        std::fs::create_dir_all(&dir).unwrap();
        let object = dir.join("tls.o");
        let native = dir.join("tls");
        let compile = [&["-c"][..], flags].concat();
        kiln_testkit::cc(&compile, &repo().join("tests/programs/tls.c"), &object);
        kiln_testkit::cc(&["-pthread"], &object, &native);
        let expected = Command::new(&native).output().unwrap();
        let out = kiln_run(executor.port, std::slice::from_ref(&object), &[], &[]);
        assert_same(&format!("native tls {label}"), &expected, &out);
    }
}

/// Thread-locals (local-exec, initial-exec, general-dynamic through the executor's
/// `__tls_get_addr`) and exports that a plugin the program `dlopen`s calls back through,
/// on each architecture under qemu, as natively.
#[test]
fn thread_locals_and_exports_on_aarch64_and_riscv64_as_natively() {
    if kiln_testkit::skip_cross("thread_locals_and_exports_on_aarch64_and_riscv64_as_natively") {
        return;
    }
    for guest in [AARCH64, RISCV64] {
        let executor = guest.executor();
        let port = executor.port;
        for (label, flags) in [
            ("O2", &["-O2"][..]),
            ("O2-pic", &["-O2", "-fPIC"]),
            ("O0-pic", &["-O0", "-fPIC"]),
        ] {
            let dir = tmp().join(format!("{}-tls-{label}", guest.name));
            std::fs::create_dir_all(&dir).unwrap();
            let objects = vec![guest.compile(&dir, "tls.c", flags)];
            let native = guest.native_run(&dir, &objects, &["-pthread"], &[]);
            let kiln = kiln_run(port, &objects, &[], &[]);
            assert_same(&format!("{} tls {label}", guest.name), &native, &kiln);
        }
        let dir = tmp().join(format!("{}-plugin", guest.name));
        std::fs::create_dir_all(&dir).unwrap();
        let host = vec![guest.compile(&dir, "plugin_host.c", &["-O2"])];
        let plugin = dir.join("plugin.so");
        let status = Command::new(guest.gcc)
            .args(["-O2", "-fPIC", "-shared", "-o"])
            .arg(&plugin)
            .arg(repo().join("tests/programs/plugin.c"))
            .status()
            .unwrap();
        assert!(status.success(), "{} plugin.so", guest.gcc);
        let plugin = plugin.to_str().unwrap();
        let native = guest.native_run(&dir, &host, &["-Wl,-E", "-ldl"], &[plugin]);
        let kiln = kiln_run(port, &host, &[], &[plugin]);
        assert_same(&format!("{} plugin", guest.name), &native, &kiln);
        // With a thread-local beside the exports: each in-memory object the executor
        // loads for them (a static TLS block, then the exports) is one of its own.
        let with_tls = dir.join("with_tls");
        std::fs::create_dir_all(&with_tls).unwrap();
        let source = with_tls.join("plugin_tls.c");
        std::fs::write(
            &source,
            "__thread int tls_counter = 5;\nint touch_tls(void) { return ++tls_counter; }\n",
        )
        .unwrap();
        let mut inputs = host.clone();
        inputs.extend(guest.compile_all(&with_tls, &[source], &["-O2"]));
        let native = guest.native_run(&with_tls, &inputs, &["-Wl,-E", "-ldl"], &[plugin]);
        let kiln = kiln_run(port, &inputs, &[], &[plugin]);
        assert_same(&format!("{} plugin with TLS", guest.name), &native, &kiln);
    }
}

#[test]
fn test_programs_run_on_riscv64_as_natively() {
    if kiln_testkit::skip_cross("test_programs_run_on_riscv64_as_natively") {
        return;
    }
    let executor = RISCV64.executor();
    let port = executor.port;
    // gcc's code models: medany (its default, PIE), medlow (PIE, and non-PIC with
    // everything in the low 2 GiB), and PIC.
    let flag_sets: &[(&str, &[&str])] = &[
        ("O0-medany", &["-O0", "-fcommon"]),
        ("O2-pic", &["-O2", "-fPIC", "-fcommon"]),
        (
            "O2-medlow-pie",
            &["-O2", "-fPIE", "-mcmodel=medlow", "-fcommon"],
        ),
    ];
    relocs_as_natively(RISCV64, port, flag_sets);
    // Non-PIC medlow code: 32-bit absolute addresses (lui/addi) of its data, which the
    // session places in the low 2 GiB; natively a non-PIE executable.
    let dir = tmp().join("riscv64-nopic-medlow");
    std::fs::create_dir_all(&dir).unwrap();
    let objects = vec![RISCV64.compile(&dir, "nopic.c", &["-O2", "-fno-pic", "-mcmodel=medlow"])];
    let native = RISCV64.native_run(&dir, &objects, &["-no-pie"], &[]);
    let kiln = kiln_run(port, &objects, &[], &[]);
    assert_same("riscv64 nopic medlow", &native, &kiln);
}

/// zlib, SQLite and Lua compiled for RISC-V from the C sources that crates on the
/// registry carry (tests/c-sources), each with its driver program.
#[test]
fn zlib_sqlite_and_lua_from_source_run_on_riscv64_as_natively() {
    if kiln_testkit::skip_cross("zlib_sqlite_and_lua_from_source_run_on_riscv64_as_natively") {
        return;
    }
    let executor = RISCV64.executor();
    let port = executor.port;
    let script = repo().join("tests/programs/script.lua");
    let script = script.to_str().unwrap();
    let zlib = kiln_testkit::c_sources("libz-sys").join("src/zlib");
    let sqlite = kiln_testkit::c_sources("libsqlite3-sys").join("sqlite3");
    let lua = kiln_testkit::c_sources("lua-src").join("lua-5.4.8");
    let include = |dir: &Path| format!("-I{}", dir.display());
    for (name, sources, flags, libs, args) in [
        (
            "zlib",
            kiln_testkit::c_files(&zlib, &[]),
            vec!["-O2".into(), "-DHAVE_UNISTD_H".into(), include(&zlib)],
            &[][..],
            &[][..],
        ),
        (
            "sqlite",
            vec![sqlite.join("sqlite3.c")],
            // -O0: the amalgamation takes 6 s to compile so, 17 s at -O1.
            vec!["-O0".to_string(), include(&sqlite)],
            &["-lm"][..],
            &[][..],
        ),
        (
            "lua",
            kiln_testkit::c_files(&lua, &["lua.c", "luac.c", "onelua.c"]),
            vec![
                "-O2".into(),
                "-fPIC".into(),
                "-DLUA_USE_LINUX".into(),
                include(&lua),
            ],
            &["-lm"][..],
            &[script][..],
        ),
    ] {
        let dir = tmp().join(format!("riscv64-{name}"));
        std::fs::create_dir_all(&dir).unwrap();
        let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
        let mut inputs = RISCV64.compile_all(&dir, &sources, &flags);
        inputs.push(RISCV64.compile(&dir, &format!("{name}_driver.c"), &flags));
        let native = RISCV64.native_run(&dir, &inputs, libs, args);
        let kiln = kiln_run(port, &inputs, libs, args);
        assert_same(&format!("riscv64 {name}"), &native, &kiln);
    }
}

#[test]
fn exit_crash_and_wrong_objects_on_riscv64() {
    if kiln_testkit::skip_cross("exit_crash_and_wrong_objects_on_riscv64") {
        return;
    }
    let executor = RISCV64.executor();
    let port = executor.port;
    let dir = tmp().join("riscv64-exit-and-crash");
    std::fs::create_dir_all(&dir).unwrap();
    let object = vec![RISCV64.compile(&dir, "exit_and_crash.c", &["-O2"])];
    exit_return_and_crash(port, &object);
    // An AArch64 object, and a RISC-V one of the soft-float ABI: errors naming them.
    let arm = AARCH64.compile(&dir, "exit_and_crash.c", &["-O2"]);
    let out = kiln_run(port, &[arm], &[], &[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("exit_and_crash.o")
            && stderr.contains("AArch64")
            && stderr.contains("RISC-V"),
        "{stderr}"
    );
    let soft_dir = dir.join("soft-float");
    std::fs::create_dir_all(&soft_dir).unwrap();
    // (No C library header: the cross compiler's are for LP64D only.)
    let source = soft_dir.join("soft_float.c");
    std::fs::write(
        &source,
        "double half(double x) { return x / 2; }\nint main(void) { return 0; }\n",
    )
    .unwrap();
    let soft = RISCV64
        .compile_all(
            &soft_dir,
            &[source],
            &["-O2", "-march=rv64imac", "-mabi=lp64"],
        )
        .remove(0);
    let out = kiln_run(port, &[soft], &[], &[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("soft_float.o") && stderr.contains("LP64 (soft-float)"),
        "{stderr}"
    );
}

/// C++ with exceptions thrown and caught across JIT frames, `thread_local` objects with
/// destructors and `atexit`, on each architecture under qemu, as natively (libstdc++ from
/// the cross compiler's directory).
#[test]
fn cxx_programs_on_aarch64_and_riscv64_as_natively() {
    if kiln_testkit::skip_cross("cxx_programs_on_aarch64_and_riscv64_as_natively") {
        return;
    }
    for guest in [AARCH64, RISCV64] {
        let executor = guest.executor();
        for program in ["cxx_exceptions", "thread_local_dtors"] {
            let dir = tmp().join(format!("{}-{program}", guest.name));
            std::fs::create_dir_all(&dir).unwrap();
            let source = repo().join(format!("tests/programs/{program}.cpp"));
            let objects = guest.compile_with(guest.gxx, &dir, &[source], &["-O2"]);
            let native = guest.native_run_with(guest.gxx, &dir, &objects, &["-pthread"], &[]);
            let kiln = kiln_run(executor.port, &objects, &["-lstdc++"], &[]);
            assert_same(&format!("{} {program}", guest.name), &native, &kiln);
        }
    }
}

/// The program of the lazy-function tests: each function a `Call` runs in the executor.
const LAZY_PROGRAM: &str = r#"
#include <pthread.h>
#include <unistd.h>
long answer(void);
long sum8(long, long, long, long, long, long, long, long);
double fmix(double, double, double, double, double, double, double, double);
long outer(long);
long missing(void);
long version(void);
long late(void);

static pthread_barrier_t barrier;
static void *first_call(void *unused) {
    (void)unused;
    pthread_barrier_wait(&barrier);
    return (void *)answer();
}
/* Eight threads make answer's first call at once. */
long eight_first_calls(void) {
    pthread_t t[8];
    long sum = 0;
    pthread_barrier_init(&barrier, 0, 8);
    for (int i = 0; i < 8; i++) pthread_create(&t[i], 0, first_call, 0);
    for (int i = 0; i < 8; i++) { void *r; pthread_join(t[i], &r); sum += (long)r; }
    return sum;
}
/* Every integer and floating-point argument register survives the entry. */
long arguments(void) {
    long s = sum8(1, 20, 300, 4000, 50000, 600000, 7000000, 80000000);
    double f = fmix(1.5, 2, 3, 4, 5, 6, 7, 8.25);
    return s == 87654321 && f == 1.5 - 2 + 3 - 4 + 5 - 6 + 7 - 8.25;
}
long call_outer(long x) { return outer(x); }
long call_missing(void) { return missing(); }
/* Two threads call version until they see 20; the versions they see never go back. */
static void *swap_caller(void *unused) {
    (void)unused;
    long last = 0;
    while (last < 20) { long v = version(); if (v < last) return (void *)-1; last = v; }
    return (void *)last;
}
long two_callers(void) {
    pthread_t t[2];
    long ok = 0;
    for (int i = 0; i < 2; i++) pthread_create(&t[i], 0, swap_caller, 0);
    for (int i = 0; i < 2; i++) { void *r; pthread_join(t[i], &r); ok += (long)r == 20; }
    return ok;
}
/* A thread that outlives its request makes a stub's first call once no request runs. */
static volatile long late_result = -1, go;
static void *late_caller(void *unused) {
    (void)unused;
    while (!go) usleep(1000);
    usleep(300000);
    late_result = late();
    return 0;
}
long start_late_caller(void) {
    pthread_t t;
    pthread_create(&t, 0, late_caller, 0);
    pthread_detach(t);
    go = 1;
    return 0;
}
long late_result_now(void) { return late_result; }
"#;

/// Compiles lazy functions' bodies (from objects made beforehand), counting compiles,
/// each after a delay (so that concurrent first calls overlap).
struct Bodies {
    objects: std::sync::Mutex<std::collections::HashMap<String, Vec<u8>>>,
    compiles: std::sync::atomic::AtomicUsize,
}

impl kiln::lazy::LazyCompiler for Bodies {
    fn compile(&self, name: &str) -> Result<Vec<u8>, kiln::lazy::CompileError> {
        self.compiles
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        std::thread::sleep(Duration::from_millis(100));
        let objects = self.objects.lock().unwrap();
        let object = objects.get(name).cloned();
        object.ok_or_else(|| format!("no source for {name}").into())
    }
}

/// Compiles each `(stem, source, defines)` with `gcc -O1 -fPIC -pthread -c`, all at once;
/// the objects' bytes in order.
fn compile_sources(gcc: &str, dir: &Path, sources: &[(String, &str, String)]) -> Vec<Vec<u8>> {
    let jobs: Vec<_> = sources
        .iter()
        .map(|(stem, source, define)| {
            let c = dir.join(format!("{stem}.c"));
            std::fs::write(&c, source).unwrap();
            let object = dir.join(format!("{stem}.o"));
            let mut command = Command::new(gcc);
            command.args(["-O1", "-fPIC", "-pthread", "-c"]);
            if !define.is_empty() {
                command.arg(define);
            }
            let child = command.arg(&c).arg("-o").arg(&object).spawn().unwrap();
            (object, child)
        })
        .collect();
    jobs.into_iter()
        .map(|(object, mut child)| {
            assert!(
                child.wait().unwrap().success(),
                "{gcc} {}",
                object.display()
            );
            std::fs::read(object).unwrap()
        })
        .collect()
}

/// Lazy functions, hot swap and a stub called after its request, through executor-c on
/// `name` (`gcc` its compiler, the executor at `port`): the checks Kiln's own executor
/// passes in crates/kiln/tests/lazy_functions.rs — eight threads' concurrent first calls
/// compile once, every argument register survives the entry, a body that calls another
/// stub (its `ResolveStub` while the first waits), a failed compile reaching the
/// fallback, hot swap under two calling threads with retired bodies freed only once no
/// request's code can run them, and a thread that outlives its request getting 0 rather
/// than a crash.
fn lazy_functions_through_the_c_executor(name: &str, gcc: &str, port: u16) {
    use kiln::Jit;
    use std::sync::atomic::Ordering::SeqCst;
    let dir = tmp().join(format!("lazy-{name}"));
    std::fs::create_dir_all(&dir).unwrap();
    let mut sources: Vec<(String, &str, String)> = vec![
        ("lazy_program".into(), LAZY_PROGRAM, String::new()),
        (
            "answer".into(),
            "long answer(void) { return 42; }",
            String::new(),
        ),
        (
            "sum8".into(),
            "long sum8(long a, long b, long c, long d, long e, long f, long g, long h) \
             { return a + b + c + d + e + f + g + h; }",
            String::new(),
        ),
        (
            "fmix".into(),
            "double fmix(double a, double b, double c, double d, double e, double f, \
             double g, double h) { return a - b + c - d + e - f + g - h; }",
            String::new(),
        ),
        (
            "outer".into(),
            "long inner(long); long outer(long x) { return inner(x) * 10; }",
            String::new(),
        ),
        (
            "inner".into(),
            "long inner(long x) { return x + 1; }",
            String::new(),
        ),
        (
            "late".into(),
            "long late(void) { return 7; }",
            String::new(),
        ),
    ];
    for v in 1..=20 {
        let source = "long version(void) { return V; }";
        sources.push((format!("version{v}"), source, format!("-DV={v}")));
    }
    let mut objects = compile_sources(gcc, &dir, &sources).into_iter();
    let program = objects.next().unwrap();
    let mut bodies = std::collections::HashMap::new();
    let mut versions = Vec::new();
    for ((stem, _, _), object) in sources[1..].iter().zip(objects) {
        match stem.strip_prefix("version") {
            Some(_) => versions.push(object),
            None => {
                bodies.insert(stem.clone(), object);
            }
        }
    }
    bodies.insert("version".into(), versions[0].clone());
    let compiler = Arc::new(Bodies {
        objects: std::sync::Mutex::new(bodies),
        compiles: Default::default(),
    });
    let address = format!("127.0.0.1:{port}");
    let key = Key::read_file(&kiln_testkit::key_file()).unwrap();
    let remote =
        kiln::Executor::connect_with_key(&address, Some(&key), kiln::executor::Timeouts::default())
            .unwrap();
    let jit = Jit::builder().executor(remote).build().unwrap();
    let lib = jit.main_library();
    let lazy = [
        "answer", "sum8", "fmix", "outer", "inner", "missing", "version", "late",
    ];
    jit.add_lazy_functions(lib, &lazy, compiler.clone())
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    jit.library(lib)
        .add(kiln::Input::object("lazy_program.o", program))
        .unwrap();
    jit.library(lib).add(kiln::Input::ProcessSymbols).unwrap();
    jit.link_pending(lib)
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    assert_eq!(
        compiler.compiles.load(SeqCst),
        0,
        "{name}: nothing compiled yet"
    );
    let call = |function: &str, args: &[u64]| {
        let address = jit.lookup(lib, function).unwrap();
        // SAFETY: the program's functions take and return integers, in the executor.
        unsafe { jit.executor().call(address, args) }
            .unwrap_or_else(|e| panic!("{name}: {function}: {e}"))
    };

    // Eight threads' first calls at once: one compile, every thread reaches the body.
    assert_eq!(call("eight_first_calls", &[]), 8 * 42, "{name}");
    assert_eq!(compiler.compiles.load(SeqCst), 1, "{name}");
    assert!(jit.is_compiled(lib, "answer").unwrap());
    // The calling convention's argument registers, integer and floating-point, whole.
    assert_eq!(call("arguments", &[]), 1, "{name}: arguments lost");
    // outer's body calls inner's stub: a second ResolveStub while the link of outer's
    // body has finished and its call goes on.
    assert_eq!(call("call_outer", &[4]), 50, "{name}");
    assert_eq!(compiler.compiles.load(SeqCst), 5, "{name}");
    // No body for `missing`: the executor's fallback returns 0, the failure is kept.
    assert_eq!(call("call_missing", &[]), 0, "{name}");
    let failures = jit.lazy_failures();
    assert_eq!(failures.len(), 1, "{name}: {failures:?}");
    assert_eq!(failures[0].function, "missing");

    // Hot swap while two threads of a call call `version` in a loop: the executor stores
    // each slot (StoreCodePointer) and frees no old body while that call's guard is held.
    std::thread::scope(|scope| {
        let running = scope.spawn(|| call("two_callers", &[]));
        let start = std::time::Instant::now();
        while !jit.is_compiled(lib, "version").unwrap() {
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "{name}: version never called"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        for (v, object) in versions.iter().enumerate().skip(1) {
            jit.replace_function(lib, "version", object.clone())
                .unwrap_or_else(|e| panic!("{name}: swap to {}: {e}", v + 1));
            if v + 1 < 20 {
                assert_eq!(jit.reclaim(), v, "{name}: a body freed under a guard");
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        assert_eq!(
            running.join().unwrap(),
            2,
            "{name}: a caller saw a version go back"
        );
    });
    assert_eq!(
        jit.reclaim(),
        0,
        "{name}: retired bodies left after the call returned"
    );

    // A thread left running after its request returned reaches a stub with no body: its
    // call returns 0 (no request's code runs to ask for), the executor lives on.
    let compiles = compiler.compiles.load(SeqCst);
    assert_eq!(call("start_late_caller", &[]), 0);
    let start = std::time::Instant::now();
    let result = loop {
        std::thread::sleep(Duration::from_millis(1500));
        let result = call("late_result_now", &[]) as i64;
        if result != -1 || start.elapsed() > Duration::from_secs(60) {
            break result;
        }
    };
    assert_eq!(result, 0, "{name}: a stub called after its request");
    assert_eq!(
        compiler.compiles.load(SeqCst),
        compiles,
        "{name}: nothing asked"
    );
}

#[test]
fn lazy_functions_and_hot_swap_through_the_c_executor_on_x86_64() {
    let binary = native_executor();
    let executor = start(Command::new(&binary).env("GLIBC_TUNABLES", STATIC_TLS_TUNABLE));
    lazy_functions_through_the_c_executor("x86-64", "cc", executor.port);
}

#[test]
fn lazy_functions_and_hot_swap_through_the_c_executor_on_aarch64() {
    if kiln_testkit::skip_cross("lazy_functions_and_hot_swap_through_the_c_executor_on_aarch64") {
        return;
    }
    let executor = AARCH64.executor();
    lazy_functions_through_the_c_executor("aarch64", AARCH64.gcc, executor.port);
}

#[test]
fn lazy_functions_and_hot_swap_through_the_c_executor_on_riscv64() {
    if kiln_testkit::skip_cross("lazy_functions_and_hot_swap_through_the_c_executor_on_riscv64") {
        return;
    }
    let executor = RISCV64.executor();
    lazy_functions_through_the_c_executor("riscv64", RISCV64.gcc, executor.port);
}

#[test]
fn two_hundred_concurrent_clients_are_each_served() {
    // Each client connects at once, runs the handshake, gets the hello from a process of
    // its own, and shuts its connection down; none waits for another. All 200 may be in
    // their handshake at once: the cap on waiting connections (64 by default, the oldest
    // dropped: executor_c_security tests it) is raised above them.
    let binary = native_executor();
    let executor = start(Command::new(&binary).args(["--max-unauthenticated", "256"]));
    let port = executor.port;
    let start = std::sync::Barrier::new(200);
    let served = std::sync::atomic::AtomicUsize::new(0);
    std::thread::scope(|scope| {
        for _ in 0..200 {
            scope.spawn(|| {
                start.wait();
                let mut stream = connect(port);
                // Shutdown (tag 19): an answer, and the connection's process ends.
                stream.send(&frame(1, 19, &[])).unwrap();
                let (id, _, _) = read_frame(&mut stream);
                assert_eq!(id, 1);
                served.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            });
        }
    });
    assert_eq!(served.load(std::sync::atomic::Ordering::SeqCst), 200);
}

/// W^X for executor-c's whole process, on every architecture: the probe
/// (tests/programs/wx_probe.c) run by each executor scans its own `/proc/self/maps` (qemu
/// shows the guest's) from main and from a second thread and finds no mapping writable and
/// executable; the x86-64 listener's and its connection process's maps are scanned from
/// outside too.
#[test]
fn no_c_executor_process_maps_anything_writable_and_executable() {
    let native = native_executor();
    let mut runs = vec![("x86_64", "cc", start(&mut Command::new(&native)))];
    if !kiln_testkit::skip_cross("no_c_executor_process_maps_anything_writable_and_executable") {
        runs.push(("aarch64", AARCH64.gcc, AARCH64.executor()));
        runs.push(("riscv64", RISCV64.gcc, RISCV64.executor()));
    }
    for (name, gcc, executor) in &runs {
        let dir = tmp().join(format!("wx-{name}"));
        std::fs::create_dir_all(&dir).unwrap();
        let object = dir.join("wx_probe.o");
        let status = Command::new(gcc)
            .args(["-O1", "-c"])
            .arg(kiln_testkit::source("wx_probe.c"))
            .arg("-o")
            .arg(&object)
            .status()
            .unwrap();
        assert!(status.success(), "{gcc} wx_probe.c");
        let out = kiln_run(executor.port, &[object], &["-lpthread"], &[]);
        let report = String::from_utf8_lossy(&out.stdout);
        let what = format!(
            "{name}:\n{report}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(!report.contains("W+X"), "writable and executable: {what}");
        for who in ["main", "thread"] {
            assert!(
                report.contains(&format!("{who} stack=")),
                "no report: {what}"
            );
            assert!(report.contains(&format!("{who} stack=rw-p wx=0")), "{what}");
        }
        assert_eq!(out.status.code(), Some(0), "{what}");
    }
    // The x86-64 listener from outside (under qemu, the host's maps are qemu's own).
    let pid = runs[0].2._process.child.id();
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    let wx: Vec<&str> = maps
        .lines()
        .filter(|l| l.split_whitespace().nth(1).and_then(|p| p.get(1..3)) == Some("wx"))
        .collect();
    assert_eq!(wx, Vec::<&str>::new(), "the listener");
}

/// Across machines: executor-c for AArch64 under qemu in a network namespace of its own,
/// listening with its key on its end of a veth pair (not a loopback address), is reached
/// by `kiln run --connect` from this namespace, across the link; a client without the key
/// is refused.
#[test]
fn an_aarch64_executor_on_another_network_is_reached_with_its_key() {
    if kiln_testkit::skip_cross("an_aarch64_executor_on_another_network_is_reached_with_its_key") {
        return;
    }
    let pair = kiln_testkit::VethPair::create();
    let executor = kiln_testkit::start_listening(
        pair.command(AARCH64.qemu)
            .args(["-L", AARCH64.root])
            .arg(kiln_testkit::c_executor_binary(AARCH64.gcc))
            .arg("--listen")
            .arg(format!("{}:0", pair.inside))
            .arg("--key-file")
            .arg(kiln_testkit::key_file()),
    );
    assert!(
        executor.address.starts_with(&pair.inside),
        "{}",
        executor.address
    );
    let dir = tmp().join("across");
    std::fs::create_dir_all(&dir).unwrap();
    let source = kiln_testkit::source("across_machines.c");
    let object = AARCH64.compile_all(&dir, &[source], &["-O2"]).remove(0);
    let out = Command::new(kiln())
        .args(["run", "--key-file"])
        .arg(kiln_testkit::key_file())
        .args(["--connect", &executor.address])
        .arg(&object)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(String::from_utf8_lossy(&out.stdout), "42\n", "{stderr}");
    assert_eq!(out.status.code(), Some(3), "{stderr}");
    let out = Command::new(kiln())
        .args(["run", "--connect", &executor.address])
        .arg(&object)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("requires a key"), "{stderr}");
    drop(executor);
}
