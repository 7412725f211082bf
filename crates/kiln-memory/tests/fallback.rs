//! Where the kernel refuses an executable memfd, the default mapper falls back to the
//! in-process mapper and logs why. Shown for real: a child runs in a new PID namespace
//! with `vm.memfd_noexec = 2`, which makes the kernel refuse `MFD_EXEC`.

mod common;

use kiln_memory::*;

#[test]
fn fallback_child() {
    if std::env::var_os("KILN_FALLBACK_CHILD").is_none() {
        return; // only meaningful in the child started below
    }
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .init();
    let error = DualMappedMapper::new().unwrap_err();
    eprintln!("dual-mapped refused: {error}");
    let manager = SlabMemoryManager::new().unwrap();
    eprintln!("mapper in use: {}", manager.mapper().name());
    let code = common::return_const(3);
    let mut in_flight = manager
        .allocate(&AllocationRequest::new().segment(SegmentRequest::new(
            Permission::ReadExecute,
            16,
            16,
        )))
        .unwrap();
    in_flight.working_memory(0).unwrap()[..code.len()].copy_from_slice(&code);
    let f = in_flight.finalize().unwrap();
    // SAFETY: the function written above.
    eprintln!("code returned {}", unsafe {
        common::call(f.target(0).unwrap())
    });
}

#[test]
fn default_mapper_falls_back_where_memfd_exec_is_refused() {
    let exe = std::env::current_exe().unwrap();
    let script = format!(
        "echo 2 > /proc/sys/vm/memfd_noexec && exec {} --exact fallback_child --nocapture --test-threads=1",
        exe.display()
    );
    let out = std::process::Command::new("unshare")
        .args(["--pid", "--fork", "--mount-proc", "sh", "-c", &script])
        .env("KILN_FALLBACK_CHILD", "1")
        .output()
        .expect("unshare (util-linux) runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() && stderr.contains("Operation not permitted") {
        eprintln!("skipped: this user cannot create a PID namespace: {stderr}");
        return;
    }
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("dual-mapped refused: memfd_create(MFD_EXEC)"),
        "{stderr}"
    );
    assert!(
        stderr.contains("falling back to the in-process mapper"),
        "{stderr}"
    );
    assert!(stderr.contains("mapper in use: in-process"), "{stderr}");
    assert!(stderr.contains("code returned 3"), "{stderr}");
}
