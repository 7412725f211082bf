//! The executor's sandbox (opt-in: `kiln-executor --sandbox`): once it has started, a
//! seccomp filter, a Landlock ruleset and an empty set of capabilities restrict what the
//! JIT code it runs can do.
//!
//! What it takes away:
//! - **starting programs and reaching into others**: `execve`, `execveat`, `ptrace`,
//!   `process_vm_readv`/`writev`, `pidfd_getfd` and `process_madvise` fail with `EPERM`
//!   (seccomp, every thread);
//! - **serving the network**: `listen` fails with `EPERM`, and so does `io_uring_setup`
//!   (io_uring's own operations would get past the filter: its `LISTEN`, say); outgoing
//!   connections stay;
//! - **changing the system or its own confinement**: `mount`, `umount2`, the new mount
//!   calls (`open_tree`, `open_tree_attr`, `move_mount`, `fsopen`, `fsconfig`, `fsmount`,
//!   `fspick`, `mount_setattr`), `pivot_root`, `chroot`, `setns`, `unshare`,
//!   `open_by_handle_at`, `bpf`, `perf_event_open`, `userfaultfd`, module and `kexec`
//!   loading, and the kernel keyring fail with `EPERM`; so does `clone` with any
//!   `CLONE_NEW*` flag (a new namespace), and `clone3` fails with `ENOSYS` (its flags are
//!   in memory a filter cannot read: the C library then falls back to `clone`, whose
//!   flags the filter checks) — threads and `fork` work;
//! - **file metadata**: `chmod`, `fchmod`, `fchmodat(2)`, `chown`, `fchown`, `lchown`,
//!   `fchownat`, `utime`, `utimes`, `futimesat`, `utimensat`, the `setxattr` and
//!   `removexattr` families (`setxattrat` and `removexattrat` too), `file_setattr`, and
//!   `ioctl`'s `FS_IOC_SETFLAGS`, `FS_IOC_FSSETXATTR` and `FS_IOC_SETVERSION` (`chattr`)
//!   fail with `EPERM` everywhere, under `--sandbox-write` too (a filter sees no paths,
//!   and Landlock does not cover metadata): a file the program creates still gets the
//!   mode it asks `open` (or `mkdir`) for, and its times move as it writes;
//! - **capabilities**: every capability is dropped (effective, permitted, inheritable,
//!   ambient) and, where the executor may (as root), the bounding set emptied;
//!   `no_new_privs` is set: a root executor's JIT code has no more rights over files than
//!   their permissions give root's uid, and nothing it starts could gain any;
//! - **writable and executable memory**: `mmap`, `mprotect` and `pkey_mprotect` asking for
//!   `PROT_WRITE | PROT_EXEC` together, `shmat` with `SHM_EXEC`, and `personality` with
//!   `READ_IMPLIES_EXEC` (the kernel would then add `PROT_EXEC` to every readable mapping,
//!   after the filter looked at `mmap`'s arguments) fail with `EPERM`. Kiln maps code W^X
//!   in every mode, so its own loading never asks. `prctl(PR_SET_MDWE,
//!   PR_MDWE_REFUSE_EXEC_GAIN)` is not used: it also refuses making any mapping executable
//!   that was not (tried on Linux 6.18: the executor's first `reserve` then fails, its
//!   `mprotect` to read-execute refused with `EACCES`, for shared memory and copies
//!   alike), and it cannot be undone for the process. What stays possible, as for Kiln
//!   itself: writing a page and then making it read-execute, or mapping a memory file
//!   twice (one view writable, one executable) — never one mapping both at once;
//! - **files outside the configuration**: Landlock (the calling thread and everything it
//!   starts later) allows reading (and mapping) only beneath the system directories the
//!   C runtime needs (`/usr`, `/lib`, `/lib64`, `/bin`, `/etc`, `/proc`, `/sys`, `/dev`,
//!   `/opt`) and the directories given with `--sandbox-read`, and writing only
//!   `/dev/null` and beneath `--sandbox-write` directories; anything else fails with
//!   `EACCES`.
//!
//! The sandbox is entered once, by a process with one thread (a second thread would keep
//! its capabilities and escape Landlock: [`enter`] refuses then), in this order: Landlock,
//! capabilities (with `no_new_privs`, which is what lets a process without
//! `CAP_SYS_ADMIN` install a seccomp filter), seccomp.
//!
//! What stays allowed: threads and `fork`, outgoing connections (`connect`), signals to
//! processes of the same user (`kill`), reading and writing as above, `mmap` and
//! `mprotect` of anything not writable and executable at once. What it does not
//! protect: memory, CPU and time (use the controller's timeouts and resource limits),
//! descriptors the executor already holds (its standard streams, the connection, shared
//! memory). JIT code still runs with the user's identity: the sandbox narrows what a
//! compromised or malicious program can reach, it is not a boundary between users.
//!
//! Both layers use crates made for the job: `seccompiler` (rust-vmm, Firecracker's) builds
//! the BPF programs, `landlock` the ruleset. A kernel without Landlock gets the rest and a
//! warning ([`SandboxReport::files_restricted`] is `false`).

use landlock::{
    path_beneath_rules, Access, AccessFs, Ruleset, RulesetAttr, RulesetCreatedAttr, RulesetStatus,
    ABI,
};
use seccompiler::{
    SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter, SeccompRule,
    TargetArch,
};
use std::collections::BTreeMap;
use std::path::PathBuf;

/// What the sandbox allows beyond its defaults.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SandboxConfig {
    /// Directories (or files) JIT code may read, beyond the system's.
    pub read: Vec<PathBuf>,
    /// Directories (or files) JIT code may read and write.
    pub write: Vec<PathBuf>,
}

/// How much of the sandbox the kernel enforces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SandboxReport {
    /// The seccomp filter is installed on every thread.
    pub syscalls_restricted: bool,
    /// The Landlock ruleset is enforced (fully or as far as this kernel's Landlock goes).
    pub files_restricted: bool,
    /// The process holds no capability, and its bounding set is empty (or it could not
    /// be emptied because the process never had the right to: an unprivileged user's).
    pub capabilities_dropped: bool,
}

/// The system directories the C runtime (and `dlopen`) needs to read.
const SYSTEM_READ: &[&str] = &[
    "/usr", "/lib", "/lib64", "/lib32", "/bin", "/sbin", "/etc", "/proc", "/sys", "/dev", "/opt",
];

/// System calls the sandbox refuses with `EPERM`.
fn denied_syscalls() -> Vec<i64> {
    #[allow(unused_mut)] // uselib exists on x86-64 only
    let mut calls = vec![
        libc::SYS_execve,
        libc::SYS_execveat,
        libc::SYS_ptrace,
        libc::SYS_process_vm_readv,
        libc::SYS_process_vm_writev,
        libc::SYS_pidfd_getfd,
        libc::SYS_process_madvise,
        libc::SYS_listen,
        libc::SYS_mount,
        libc::SYS_umount2,
        libc::SYS_open_tree,
        OPEN_TREE_ATTR,
        libc::SYS_move_mount,
        libc::SYS_fsopen,
        libc::SYS_fsconfig,
        libc::SYS_fsmount,
        libc::SYS_fspick,
        libc::SYS_mount_setattr,
        libc::SYS_open_by_handle_at,
        libc::SYS_pivot_root,
        libc::SYS_chroot,
        libc::SYS_setns,
        libc::SYS_unshare,
        libc::SYS_bpf,
        libc::SYS_perf_event_open,
        libc::SYS_userfaultfd,
        libc::SYS_init_module,
        libc::SYS_finit_module,
        libc::SYS_delete_module,
        libc::SYS_kexec_load,
        libc::SYS_kexec_file_load,
        libc::SYS_add_key,
        libc::SYS_request_key,
        libc::SYS_keyctl,
        libc::SYS_io_uring_setup,
        libc::SYS_io_uring_enter,
        libc::SYS_io_uring_register,
        // File metadata (Landlock does not cover it).
        libc::SYS_fchmod,
        libc::SYS_fchmodat,
        FCHMODAT2,
        libc::SYS_fchown,
        libc::SYS_fchownat,
        libc::SYS_utimensat,
        libc::SYS_setxattr,
        libc::SYS_lsetxattr,
        libc::SYS_fsetxattr,
        libc::SYS_removexattr,
        libc::SYS_lremovexattr,
        libc::SYS_fremovexattr,
        SETXATTRAT,
        REMOVEXATTRAT,
        FILE_SETATTR,
    ];
    // The calls x86-64 has besides their `*at` forms (AArch64 has only those).
    #[cfg(target_arch = "x86_64")]
    calls.extend([
        libc::SYS_uselib,
        libc::SYS_chmod,
        libc::SYS_chown,
        libc::SYS_lchown,
        libc::SYS_utime,
        libc::SYS_utimes,
        libc::SYS_futimesat,
    ]);
    calls
}

/// `fchmodat2` (Linux 6.6), `setxattrat`, `removexattrat`, `open_tree_attr` (Linux 6.13
/// and 6.15) and `file_setattr` (Linux 6.17): the same numbers on every architecture (the
/// unified table), not all in the `libc` crate yet.
const FCHMODAT2: i64 = 452;
const SETXATTRAT: i64 = 463;
const REMOVEXATTRAT: i64 = 466;
const OPEN_TREE_ATTR: i64 = 467;
const FILE_SETATTR: i64 = 469;

/// `ioctl` requests that change a file's attributes (`chattr`'s flags, the `fsxattr`
/// flags and project, the inode generation), as the generic `_IOW` encoding of x86-64 and
/// AArch64 spells them: `FS_IOC_SETFLAGS`, `FS_IOC32_SETFLAGS`, `FS_IOC_FSSETXATTR`,
/// `FS_IOC_SETVERSION`, `FS_IOC32_SETVERSION`.
const FILE_ATTRIBUTE_IOCTLS: [u64; 5] = [
    0x4008_6602,
    0x4004_6602,
    0x401c_5820,
    0x4008_7602,
    0x4004_7602,
];

/// `personality`'s `READ_IMPLIES_EXEC` (every readable mapping made after it executable
/// too) and the query that changes nothing (`0xffffffff`).
const READ_IMPLIES_EXEC: u64 = 0x0040_0000;
const PERSONALITY_QUERY: u64 = 0xffff_ffff;

/// `shmat`'s `SHM_EXEC`: the segment mapped executable (and writable, unless read-only).
const SHM_EXEC: u64 = 0o100000;

/// `clone` flags that make a namespace.
const NAMESPACE_FLAGS: [u64; 8] = [
    libc::CLONE_NEWNS as u64,
    libc::CLONE_NEWCGROUP as u64,
    libc::CLONE_NEWUTS as u64,
    libc::CLONE_NEWIPC as u64,
    libc::CLONE_NEWUSER as u64,
    libc::CLONE_NEWPID as u64,
    libc::CLONE_NEWNET as u64,
    0x80, // CLONE_NEWTIME
];

/// Rules refusing calls by their arguments (the same argument order on x86-64 and
/// AArch64): `clone` with a namespace flag (flags: argument 0), memory made writable and
/// executable at once (`prot`: argument 2 of `mmap`, `mprotect` and `pkey_mprotect`;
/// `SHM_EXEC`: argument 2 of `shmat`; `READ_IMPLIES_EXEC`: argument 0 of `personality`,
/// which would make the kernel add `PROT_EXEC` to a writable mapping after the filter
/// looked), and a file's attributes changed by `ioctl` (the request: argument 1). Arguments
/// the kernel takes as 32-bit are compared on their low 32 bits only, as the kernel reads
/// them.
fn argument_rules() -> Result<Vec<(i64, Vec<SeccompRule>)>, seccompiler::BackendError> {
    let condition = |index: u8, len: SeccompCmpArgLen, op: SeccompCmpOp, value: u64| {
        SeccompCondition::new(index, len, op, value)
    };
    let flag = |index: u8, len: SeccompCmpArgLen, bits: u64| {
        condition(index, len, SeccompCmpOp::MaskedEq(bits), bits)
            .and_then(|c| SeccompRule::new(vec![c]))
    };
    let clone: Vec<SeccompRule> = NAMESPACE_FLAGS
        .iter()
        .map(|&f| flag(0, SeccompCmpArgLen::Qword, f))
        .collect::<Result<_, _>>()?;
    let wx = (libc::PROT_WRITE | libc::PROT_EXEC) as u64;
    let wx_rule = || flag(2, SeccompCmpArgLen::Qword, wx);
    let ioctl: Vec<SeccompRule> = FILE_ATTRIBUTE_IOCTLS
        .iter()
        .map(|&request| {
            condition(1, SeccompCmpArgLen::Dword, SeccompCmpOp::Eq, request)
                .and_then(|c| SeccompRule::new(vec![c]))
        })
        .collect::<Result<_, _>>()?;
    let personality = SeccompRule::new(vec![
        condition(
            0,
            SeccompCmpArgLen::Dword,
            SeccompCmpOp::MaskedEq(READ_IMPLIES_EXEC),
            READ_IMPLIES_EXEC,
        )?,
        condition(
            0,
            SeccompCmpArgLen::Dword,
            SeccompCmpOp::Ne,
            PERSONALITY_QUERY,
        )?,
    ])?;
    Ok(vec![
        (libc::SYS_clone, clone),
        (libc::SYS_mmap, vec![wx_rule()?]),
        (libc::SYS_mprotect, vec![wx_rule()?]),
        (libc::SYS_pkey_mprotect, vec![wx_rule()?]),
        (
            libc::SYS_shmat,
            vec![flag(2, SeccompCmpArgLen::Dword, SHM_EXEC)?],
        ),
        (libc::SYS_personality, vec![personality]),
        (libc::SYS_ioctl, ioctl),
    ])
}

/// Restricts this process as [the module](self) says: call it once, before the thread that
/// runs JIT code starts (Landlock applies to the calling thread and what it starts later;
/// the seccomp filter to every thread).
pub fn enter(config: &SandboxConfig) -> Result<SandboxReport, String> {
    // Landlock and capabilities hold for the calling thread (and those it starts later):
    // a thread started before would keep its rights.
    let threads = std::fs::read_dir("/proc/self/task").map_or(1, |d| d.count());
    if threads != 1 {
        return Err(format!(
            "sandbox: entered with {threads} threads (it must be entered before any other starts)"
        ));
    }
    let files_restricted = restrict_files(config)?;
    let capabilities_dropped = drop_capabilities()?;
    restrict_syscalls()?;
    Ok(SandboxReport {
        syscalls_restricted: true,
        files_restricted,
        capabilities_dropped,
    })
}

/// Sets `no_new_privs`, empties the bounding set (where the process may: it needs
/// `CAP_SETPCAP`, which root has) and the ambient set, then drops every capability of the
/// calling thread (effective, permitted, inheritable). Called while the process has one
/// thread: capabilities are per thread.
fn drop_capabilities() -> Result<bool, String> {
    let error = |what: &str| format!("sandbox: {what}: {}", std::io::Error::last_os_error());
    // SAFETY: prctl with integer arguments only.
    if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } != 0 {
        return Err(error("setting no_new_privs"));
    }
    let last = std::fs::read_to_string("/proc/sys/kernel/cap_last_cap")
        .ok()
        .and_then(|s| s.trim().parse::<libc::c_ulong>().ok())
        .unwrap_or(40);
    let mut bounding_emptied = true;
    for cap in 0..=last {
        // SAFETY: prctl with integer arguments only.
        if unsafe { libc::prctl(libc::PR_CAPBSET_DROP, cap, 0, 0, 0) } != 0 {
            match std::io::Error::last_os_error().raw_os_error() {
                // Without CAP_SETPCAP (an unprivileged user): it can gain nothing by the
                // bounding set, execve being refused and no_new_privs set.
                Some(libc::EPERM) => bounding_emptied = false,
                Some(libc::EINVAL) => break, // past this kernel's last capability
                _ => return Err(error("emptying the capability bounding set")),
            }
        }
    }
    // SAFETY: prctl with integer arguments only.
    unsafe {
        libc::prctl(
            libc::PR_CAP_AMBIENT,
            libc::PR_CAP_AMBIENT_CLEAR_ALL,
            0,
            0,
            0,
        )
    };
    // capset(2) with version 3 and two empty data words: no capability left. Written
    // out (no crate needed for one call): the header and data layouts are the kernel's ABI.
    #[repr(C)]
    struct Header {
        version: u32,
        pid: libc::c_int,
    }
    #[repr(C)]
    #[derive(Clone, Copy)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    let mut header = Header {
        version: 0x2008_0522, // _LINUX_CAPABILITY_VERSION_3
        pid: 0,
    };
    let data = [Data {
        effective: 0,
        permitted: 0,
        inheritable: 0,
    }; 2];
    // SAFETY: capset reads the header and two data structs, all valid for the call.
    if unsafe { libc::syscall(libc::SYS_capset, &mut header as *mut Header, data.as_ptr()) } != 0 {
        return Err(error("dropping the capabilities"));
    }
    let root = {
        // SAFETY: geteuid has no preconditions.
        unsafe { libc::geteuid() == 0 }
    };
    Ok(bounding_emptied || !root)
}

fn restrict_files(config: &SandboxConfig) -> Result<bool, String> {
    let abi = ABI::V5;
    let error = |e: landlock::RulesetError| format!("sandbox: Landlock: {e}");
    for path in config.read.iter().chain(&config.write) {
        if !path.exists() {
            return Err(format!(
                "sandbox: {} does not exist (given to --sandbox-read or --sandbox-write)",
                path.display()
            ));
        }
    }
    let status = Ruleset::default()
        .handle_access(AccessFs::from_all(abi))
        .map_err(error)?
        .create()
        .map_err(error)?
        .add_rules(path_beneath_rules(
            SYSTEM_READ
                .iter()
                .copied()
                .filter(|p| std::path::Path::new(p).exists()),
            AccessFs::from_read(abi),
        ))
        .map_err(error)?
        .add_rules(path_beneath_rules(&config.read, AccessFs::from_read(abi)))
        .map_err(error)?
        .add_rules(path_beneath_rules(["/dev/null"], AccessFs::from_all(abi)))
        .map_err(error)?
        .add_rules(path_beneath_rules(&config.write, AccessFs::from_all(abi)))
        .map_err(error)?
        .restrict_self()
        .map_err(error)?;
    Ok(status.ruleset != RulesetStatus::NotEnforced)
}

fn restrict_syscalls() -> Result<(), String> {
    let arch = if cfg!(target_arch = "aarch64") {
        TargetArch::aarch64
    } else {
        TargetArch::x86_64
    };
    let filter_error = |e: seccompiler::BackendError| format!("sandbox: seccomp filter: {e}");
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> = denied_syscalls()
        .into_iter()
        .map(|n| (n, Vec::new()))
        .collect();
    rules.extend(argument_rules().map_err(filter_error)?);
    let refused = SeccompFilter::new(
        rules,
        SeccompAction::Allow,
        SeccompAction::Errno(libc::EPERM as u32),
        arch,
    )
    .map_err(filter_error)?;
    // clone3 is refused with ENOSYS (a second filter: each has one action for its rules;
    // the kernel applies every filter, and clone3 matches only this one).
    let clone3 = SeccompFilter::new(
        BTreeMap::from([(libc::SYS_clone3, Vec::new())]),
        SeccompAction::Allow,
        SeccompAction::Errno(libc::ENOSYS as u32),
        arch,
    )
    .map_err(filter_error)?;
    for filter in [refused, clone3] {
        let program: seccompiler::BpfProgram = filter
            .try_into()
            .map_err(|e| format!("sandbox: seccomp filter: {e:?}"))?;
        seccompiler::apply_filter_all_threads(&program)
            .map_err(|e| format!("sandbox: installing the seccomp filter: {e}"))?;
    }
    Ok(())
}
