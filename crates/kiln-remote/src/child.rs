//! A child executor's process, started with `posix_spawnp` and its connection's socket
//! as descriptor 3.
//!
//! Written by hand, not with `std::process::Command`: `Command` can put a descriptor at a
//! number of its choosing only through a `pre_exec` closure, which makes it `fork` the
//! whole controller (its page tables copied; every page the controller then writes until
//! the child's `exec` copied again) instead of `posix_spawn`'s `vfork`-like clone. A
//! controller starts its executor while it loads its inputs, so that copy would come out
//! of the load. `posix_spawn_file_actions_adddup2` moves the socket without a closure.

use std::ffi::{c_char, CString, OsString};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::ExitStatus;

unsafe extern "C" {
    /// The process's environment (POSIX), passed on to the child as it is.
    static environ: *const *mut c_char;
}

/// A child process: killed with [`ExecutorChild::kill`], reaped with
/// [`ExecutorChild::wait`]; dropping it does neither (as with `std::process::Child`).
#[derive(Debug)]
pub(crate) struct ExecutorChild {
    pid: libc::pid_t,
    /// Its status once reaped (its pid may be another process's since).
    status: Option<ExitStatus>,
}

impl ExecutorChild {
    /// Starts `program` (searched in `PATH` when the name has no `/`) with `args`, this
    /// process's environment and standard streams, and `socket` as descriptor 3 (without
    /// close-on-exec); every other descriptor of this process that is close-on-exec stays
    /// behind. The signal mask is emptied and `SIGPIPE` set back to its default, as
    /// `std::process::Command` does.
    pub(crate) fn spawn(
        program: &Path,
        args: &[OsString],
        socket: RawFd,
    ) -> std::io::Result<ExecutorChild> {
        let invalid = |what: &str| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("{what} holds a NUL byte"),
            )
        };
        let path = CString::new(program.as_os_str().as_bytes()).map_err(|_| invalid("the path"))?;
        let mut argv_owned = vec![path.clone()];
        for arg in args {
            argv_owned.push(CString::new(arg.as_bytes()).map_err(|_| invalid("an argument"))?);
        }
        let mut argv: Vec<*mut c_char> = argv_owned
            .iter()
            .map(|a| a.as_ptr() as *mut c_char)
            .collect();
        argv.push(std::ptr::null_mut());
        // dup2 onto itself would leave close-on-exec set: a socket that is descriptor 3
        // already goes through a copy.
        let copy = if socket == 3 {
            // SAFETY: F_DUPFD_CLOEXEC of a descriptor we hold; the copy is owned below.
            let fd = unsafe { libc::fcntl(socket, libc::F_DUPFD_CLOEXEC, 4) };
            if fd < 0 {
                return Err(std::io::Error::last_os_error());
            }
            // SAFETY: the descriptor fcntl just made, owned by nothing else.
            Some(unsafe { OwnedFd::from_raw_fd(fd) })
        } else {
            None
        };
        let from = copy.as_ref().map_or(socket, |c| c.as_raw_fd());
        // SAFETY: the file actions and attributes are initialized before use and destroyed
        // after; every pointer handed to posix_spawnp (path, argv, environ) lives until it
        // returns; the pid is written by it.
        unsafe {
            let mut actions: libc::posix_spawn_file_actions_t = std::mem::zeroed();
            let mut attributes: libc::posix_spawnattr_t = std::mem::zeroed();
            let e = libc::posix_spawn_file_actions_init(&mut actions);
            if e != 0 {
                return Err(std::io::Error::from_raw_os_error(e));
            }
            let e = libc::posix_spawnattr_init(&mut attributes);
            if e != 0 {
                libc::posix_spawn_file_actions_destroy(&mut actions);
                return Err(std::io::Error::from_raw_os_error(e));
            }
            let mut empty: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut empty);
            let mut pipe: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut pipe);
            libc::sigaddset(&mut pipe, libc::SIGPIPE);
            let mut e = libc::posix_spawn_file_actions_adddup2(&mut actions, from, 3);
            if e == 0 {
                e = libc::posix_spawnattr_setsigmask(&mut attributes, &empty);
            }
            if e == 0 {
                e = libc::posix_spawnattr_setsigdefault(&mut attributes, &pipe);
            }
            if e == 0 {
                e = libc::posix_spawnattr_setflags(
                    &mut attributes,
                    (libc::POSIX_SPAWN_SETSIGMASK | libc::POSIX_SPAWN_SETSIGDEF) as _,
                );
            }
            let mut pid: libc::pid_t = 0;
            if e == 0 {
                e = libc::posix_spawnp(
                    &mut pid,
                    path.as_ptr(),
                    &actions,
                    &attributes,
                    argv.as_ptr(),
                    environ,
                );
            }
            libc::posix_spawnattr_destroy(&mut attributes);
            libc::posix_spawn_file_actions_destroy(&mut actions);
            drop(copy);
            if e != 0 {
                return Err(std::io::Error::from_raw_os_error(e));
            }
            Ok(ExecutorChild { pid, status: None })
        }
    }

    /// The process id.
    pub(crate) fn id(&self) -> u32 {
        self.pid as u32
    }

    /// `SIGKILL`, unless it was reaped already (its pid may be another's by then).
    pub(crate) fn kill(&mut self) -> std::io::Result<()> {
        if self.status.is_some() {
            return Ok(());
        }
        // SAFETY: a signal to our own child, not yet reaped: the pid is still its.
        if unsafe { libc::kill(self.pid, libc::SIGKILL) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }

    /// Waits for it to exit and reaps it (once; later calls answer the same status).
    pub(crate) fn wait(&mut self) -> std::io::Result<ExitStatus> {
        loop {
            match self.reap(0)? {
                Some(status) => return Ok(status),
                None => continue,
            }
        }
    }

    /// Its status if it has exited (reaping it), `None` if it runs.
    pub(crate) fn try_wait(&mut self) -> std::io::Result<Option<ExitStatus>> {
        self.reap(libc::WNOHANG)
    }

    fn reap(&mut self, flags: libc::c_int) -> std::io::Result<Option<ExitStatus>> {
        if let Some(status) = self.status {
            return Ok(Some(status));
        }
        let mut raw = 0;
        // SAFETY: waitpid on our own child's pid, with a status word of ours.
        let got = unsafe { libc::waitpid(self.pid, &mut raw, flags) };
        if got < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                return Ok(None);
            }
            return Err(e);
        }
        if got == 0 {
            return Ok(None);
        }
        let status = ExitStatus::from_raw(raw);
        self.status = Some(status);
        Ok(Some(status))
    }
}
