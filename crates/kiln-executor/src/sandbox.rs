//! The executor's sandbox (opt-in: `kiln-executor --sandbox`): once it has started, a
//! seccomp filter and a Landlock ruleset restrict what the JIT code it runs can do.
//!
//! What it takes away:
//! - **starting programs and reaching into others**: `execve`, `execveat`, `ptrace`,
//!   `process_vm_readv`/`writev` fail with `EPERM` (seccomp, every thread);
//! - **serving the network**: `listen` fails with `EPERM` (outgoing connections stay);
//! - **changing the system or its own confinement**: `mount`, `umount2`, `pivot_root`,
//!   `chroot`, `setns`, `unshare`, `bpf`, `perf_event_open`, `userfaultfd`, module and
//!   `kexec` loading, and the kernel keyring fail with `EPERM`;
//! - **files outside the configuration**: Landlock (the calling thread and everything it
//!   starts later) allows reading (and mapping) only beneath the system directories the
//!   C runtime needs (`/usr`, `/lib`, `/lib64`, `/bin`, `/etc`, `/proc`, `/sys`, `/dev`,
//!   `/opt`) and the directories given with `--sandbox-read`, and writing only
//!   `/dev/null` and beneath `--sandbox-write` directories; anything else fails with
//!   `EACCES`.
//!
//! What it does not protect: memory, CPU and time (use the controller's timeouts and
//! resource limits), descriptors the executor already holds (its standard streams, the
//! connection, shared memory), outgoing network connections, and signals to processes of
//! the same user. JIT code still runs with the user's identity: the sandbox narrows what
//! a compromised or malicious program can reach, it is not a boundary between users.
//!
//! Both layers use crates made for the job: `seccompiler` (rust-vmm, Firecracker's) builds
//! the BPF program, `landlock` the ruleset. A kernel without Landlock gets the seccomp part
//! and a warning ([`SandboxReport::files_restricted`] is `false`).

use landlock::{
    path_beneath_rules, Access, AccessFs, Ruleset, RulesetAttr, RulesetCreatedAttr, RulesetStatus,
    ABI,
};
use seccompiler::{SeccompAction, SeccompFilter, TargetArch};
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
        libc::SYS_listen,
        libc::SYS_mount,
        libc::SYS_umount2,
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
    ];
    #[cfg(target_arch = "x86_64")]
    calls.push(libc::SYS_uselib);
    calls
}

/// Restricts this process as [the module](self) says: call it once, before the thread that
/// runs JIT code starts (Landlock applies to the calling thread and what it starts later;
/// the seccomp filter to every thread).
pub fn enter(config: &SandboxConfig) -> Result<SandboxReport, String> {
    let files_restricted = restrict_files(config)?;
    restrict_syscalls()?;
    Ok(SandboxReport {
        syscalls_restricted: true,
        files_restricted,
    })
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
    let rules: BTreeMap<i64, Vec<seccompiler::SeccompRule>> = denied_syscalls()
        .into_iter()
        .map(|n| (n, Vec::new()))
        .collect();
    let filter = SeccompFilter::new(
        rules,
        SeccompAction::Allow,
        SeccompAction::Errno(libc::EPERM as u32),
        arch,
    )
    .map_err(|e| format!("sandbox: seccomp filter: {e}"))?;
    let program: seccompiler::BpfProgram = filter
        .try_into()
        .map_err(|e| format!("sandbox: seccomp filter: {e:?}"))?;
    seccompiler::apply_filter_all_threads(&program)
        .map_err(|e| format!("sandbox: installing the seccomp filter: {e}"))
}
