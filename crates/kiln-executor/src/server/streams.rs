//! The program's standard streams when the executor forwards them: output pumped to
//! the controller, input fed from its `Input` messages.

use super::*;

/// Output pumps still running (0 when output is not forwarded).
pub(super) static PUMPS_RUNNING: AtomicUsize = AtomicUsize::new(0);

/// Where `Input` messages go: a thread that writes them into the program's standard
/// input (a pipe on descriptor 0).
pub(super) static STDIN_QUEUE: parking_lot::Mutex<Option<std::sync::mpsc::Sender<Vec<u8>>>> =
    parking_lot::const_mutex(None);

/// Takes its bytes off [`STDIN_QUEUED`] when dropped.
pub(super) struct QueuedBytes(usize);

impl Drop for QueuedBytes {
    fn drop(&mut self) {
        STDIN_QUEUED.fetch_sub(self.0, Ordering::SeqCst);
    }
}

/// Bytes of `Input` queued and not yet written into the program's standard input.
pub(super) static STDIN_QUEUED: AtomicUsize = AtomicUsize::new(0);

/// Most bytes of `Input` held for a program that does not read them.
pub const MAX_QUEUED_INPUT: usize = 16 << 20;

/// Passes `Input` bytes on to the program's standard input; empty bytes close it. Past
/// [`MAX_QUEUED_INPUT`] unread bytes, input is dropped and the program's standard error
/// (the controller's) says so once: the executor's memory is not the client's to fill.
pub(super) fn give_input(bytes: Vec<u8>) {
    static WARNED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    if STDIN_QUEUED.load(Ordering::SeqCst) + bytes.len() > MAX_QUEUED_INPUT {
        if !WARNED.swap(true, Ordering::SeqCst) {
            let warning = format!(
                "kiln-executor: the program left {MAX_QUEUED_INPUT} bytes of standard input unread; further input is dropped\n"
            );
            // SAFETY: writes a local buffer to descriptor 2 (the forwarded stderr pipe).
            unsafe { libc::write(2, warning.as_ptr().cast(), warning.len()) };
        }
        return;
    }
    if let Some(queue) = STDIN_QUEUE.lock().as_ref() {
        STDIN_QUEUED.fetch_add(bytes.len(), Ordering::SeqCst);
        let _ = queue.send(bytes);
    }
}

/// Connects the program's standard streams to the controller: descriptors 1 and 2 become
/// pipes that a thread each reads and sends as `Output` messages; descriptor 0 a pipe that
/// `Input` messages fill. For an executor whose terminal is not the user's (`--listen`).
pub(super) fn forward_output(sender: &Sender) -> std::io::Result<()> {
    let mut ends = [-1; 2];
    // SAFETY: pipe2 writes two descriptors.
    if unsafe { libc::pipe2(ends.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: the read end replaces this process's standard input.
    unsafe {
        libc::dup2(ends[0], 0);
        libc::close(ends[0]);
    }
    let stdin_write = ends[1];
    let (queue, inputs) = std::sync::mpsc::channel::<Vec<u8>>();
    *STDIN_QUEUE.lock() = Some(queue);
    std::thread::spawn(move || {
        for bytes in inputs {
            if bytes.is_empty() {
                break;
            }
            // Counted as written whether or not the pipe takes it all.
            let _queued = QueuedBytes(bytes.len());
            let mut done = 0;
            while done < bytes.len() {
                // SAFETY: writing our buffer to our pipe's write end.
                let n = unsafe {
                    libc::write(
                        stdin_write,
                        bytes[done..].as_ptr().cast(),
                        bytes.len() - done,
                    )
                };
                if n <= 0 {
                    break;
                }
                done += n as usize;
            }
        }
        // SAFETY: our descriptor, closed once: the program reads end of input.
        unsafe { libc::close(stdin_write) };
    });
    for (fd, stream) in [(1, 1u8), (2, 2u8)] {
        let mut ends = [-1; 2];
        // SAFETY: pipe2 writes two descriptors.
        if unsafe { libc::pipe2(ends.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: the write end replaces this process's descriptor `fd` (stdout/stderr).
        unsafe {
            libc::dup2(ends[1], fd);
            libc::close(ends[1]);
        }
        let read_end = ends[0];
        let sender = sender.clone();
        PUMPS_RUNNING.fetch_add(1, Ordering::SeqCst);
        std::thread::spawn(move || {
            let mut buf = vec![0u8; 64 << 10];
            loop {
                // SAFETY: reading into our buffer from our pipe's read end.
                let n = unsafe { libc::read(read_end, buf.as_mut_ptr().cast(), buf.len()) };
                if n < 0
                    && std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted
                {
                    continue;
                }
                if n <= 0 {
                    break;
                }
                let frame = Response::Output {
                    stream,
                    bytes: buf[..n as usize].to_vec(),
                }
                .encode();
                if sender.send(&frame).is_err() {
                    break;
                }
            }
            // SAFETY: our descriptor, closed once.
            unsafe { libc::close(read_end) };
            PUMPS_RUNNING.fetch_sub(1, Ordering::SeqCst);
        });
    }
    Ok(())
}

/// Ends output forwarding: closes this process's write ends (descriptors 1 and 2 become
/// `/dev/null`) and waits up to a second for the pumps to send what is left.
pub(super) fn finish_output() {
    close_output_and_wait(1000);
}

/// Descriptors 1 and 2 become `/dev/null`, so the output pumps read what is left in the
/// pipes, send it and see the end; waits up to `max_ms` milliseconds for them (a forked
/// child of the program holding the pipes open keeps them reading). Async-signal-safe
/// calls only: the crash handler calls it too, with 200 ms, so that what the program
/// wrote just before it crashed goes out before the report.
pub(super) fn close_output_and_wait(max_ms: u32) {
    if PUMPS_RUNNING.load(Ordering::SeqCst) == 0 {
        return;
    }
    // SAFETY: open, dup2 and close are async-signal-safe; they act on this process's
    // standard descriptors only.
    unsafe {
        let null = libc::open(c"/dev/null".as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
        if null >= 0 {
            libc::dup2(null, 1);
            libc::dup2(null, 2);
            libc::close(null);
        }
    }
    for _ in 0..max_ms {
        if PUMPS_RUNNING.load(Ordering::SeqCst) == 0 {
            return;
        }
        pause_a_millisecond();
    }
}

/// Sleeps about a millisecond (async-signal-safe: `nanosleep`).
pub(super) fn pause_a_millisecond() {
    let pause = libc::timespec {
        tv_sec: 0,
        tv_nsec: 1_000_000,
    };
    // SAFETY: nanosleep is async-signal-safe; the pause is on this stack.
    unsafe { libc::nanosleep(&pause, std::ptr::null_mut()) };
}
