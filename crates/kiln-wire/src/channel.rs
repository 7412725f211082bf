//! Frames over a stream socket (Unix or TCP), with file descriptors passed beside the
//! bytes (`SCM_RIGHTS`) on Unix sockets, timeouts, a frame-size limit checked before
//! anything is allocated, and — over TCP — authentication and encryption
//! ([`crate::secure`]).

use crate::protocol::MAX_FRAME;
use crate::secure::{self, Key, Role, MAX_NOISE_MESSAGE, TAG};
use parking_lot::Mutex;
use std::collections::VecDeque;
use std::io::{self, Read};
use std::net::TcpStream;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::time::Duration;

/// The socket under a channel.
#[derive(Debug)]
pub enum Stream {
    /// A Unix stream socket (socketpair with a child executor): can pass descriptors.
    Unix(UnixStream),
    /// A TCP connection: bytes only.
    Tcp(TcpStream),
}

/// Why a channel operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ChannelError {
    /// The peer closed the connection.
    #[error("connection closed by the peer")]
    Closed,
    /// No answer in time.
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    /// A frame longer than the protocol allows.
    #[error("frame of {0} bytes exceeds the protocol's limit")]
    TooLarge(u32),
    /// The peer failed authentication, or a message failed its integrity check (wrong
    /// key, plaintext peer, tampered, replayed or reordered message).
    #[error("authentication failed: {0}")]
    Auth(String),
    /// Another I/O error.
    #[error(transparent)]
    Io(io::Error),
}

/// A framed, bidirectional channel. Receiving is the owner's; sending is shared with the
/// channel's [`Sender`]s (one lock, so frames from several threads never interleave).
pub struct Channel {
    stream: Stream,
    /// Descriptors received and not yet taken, each with the offset in the byte stream of
    /// a byte of the frame it came with.
    fds: VecDeque<(u64, OwnedFd)>,
    /// Bytes read off the socket so far.
    read_total: u64,
    /// Bytes of the stream handed to frames so far (read ahead ones not yet).
    delivered: u64,
    timeout: Option<Duration>,
    max_frame: u32,
    secure: Option<Secure>,
    send: Arc<Mutex<SendState>>,
    /// While set, every read must complete by then (not only each read within the
    /// timeout): a peer that trickles bytes cannot stretch it.
    deadline: Option<std::time::Instant>,
    /// Whether each received frame must arrive whole within the timeout.
    frame_deadline: bool,
    /// Bytes read off the socket ahead of the frames that hold them (one `recvmsg`
    /// usually brings a frame's length and its body, and the next frames too); empty until
    /// the first small read.
    ahead: Vec<u8>,
    /// The unread part of `ahead`.
    ahead_at: std::ops::Range<usize>,
}

/// How many bytes one read off the socket asks for when a frame's part is smaller: a
/// larger part is read straight into its place.
const READ_AHEAD: usize = 64 << 10;

/// The sending side: its own handle on the socket and, on a secure channel, the transport
/// and the next outgoing nonce.
struct SendState {
    stream: Option<Stream>,
    secure: Option<(Arc<secure::Transport>, u64)>,
    /// Ciphertext of one frame, reused.
    wire: Vec<u8>,
}

/// A handle that shuts a [`Channel`]'s socket down from another thread (a thread blocked
/// in [`Channel::recv`] then returns), with a descriptor of its own: valid however long the
/// channel lives.
#[derive(Debug)]
pub struct Closer(Stream);

impl Closer {
    /// Shuts the socket down in both directions.
    pub fn shutdown(&self) {
        let _ = match &self.0 {
            Stream::Unix(s) => s.shutdown(std::net::Shutdown::Both),
            Stream::Tcp(s) => s.shutdown(std::net::Shutdown::Both),
        };
    }
}

/// A handle that sends frames on a [`Channel`] from another thread (or, with
/// [`Sender::try_send_now`], from a signal handler or an exit handler).
#[derive(Clone)]
pub struct Sender {
    send: Arc<Mutex<SendState>>,
}

impl Sender {
    /// Sends a whole frame.
    pub fn send(&self, frame: &[u8]) -> Result<(), ChannelError> {
        send_frame(&mut self.send.lock(), frame)
    }

    /// Sends a small frame (at most 256 bytes) without waiting for the lock and without
    /// allocating: for reporting from a signal handler or an exit handler. Returns `false`
    /// if the frame could not be sent (the lock was held: the process was interrupted in
    /// the middle of sending).
    pub fn try_send_now(&self, frame: &[u8]) -> bool {
        let Some(mut state) = self.send.try_lock() else {
            return false;
        };
        let state = &mut *state;
        let Some(stream) = &state.stream else {
            return false;
        };
        let fd = raw_of(stream);
        let mut wire = [0u8; 256 + 2 + TAG];
        let len = match &mut state.secure {
            None if frame.len() <= 256 => {
                wire[..frame.len()].copy_from_slice(frame);
                frame.len()
            }
            Some((transport, nonce)) if frame.len() <= 256 => {
                let Ok(n) = transport.write_message(*nonce, frame, &mut wire[2..]) else {
                    return false;
                };
                *nonce += 1;
                wire[..2].copy_from_slice(&(n as u16).to_be_bytes());
                n + 2
            }
            _ => return false,
        };
        let mut done = 0;
        while done < len {
            // SAFETY: send(2) is async-signal-safe; the buffer is on this stack.
            let n = unsafe {
                libc::send(
                    fd,
                    wire[done..].as_ptr().cast(),
                    len - done,
                    libc::MSG_NOSIGNAL,
                )
            };
            if n <= 0 {
                return false;
            }
            done += n as usize;
        }
        true
    }
}

/// The socket's descriptor.
fn raw_of(stream: &Stream) -> RawFd {
    match stream {
        Stream::Unix(s) => s.as_raw_fd(),
        Stream::Tcp(s) => s.as_raw_fd(),
    }
}

/// Writes all of `bytes` with `send(MSG_NOSIGNAL)`: a peer that went away is an error,
/// never a `SIGPIPE` for the host program.
fn send_all(fd: RawFd, mut bytes: &[u8]) -> io::Result<()> {
    while !bytes.is_empty() {
        // SAFETY: `bytes` is a valid readable buffer of its length.
        let n = unsafe { libc::send(fd, bytes.as_ptr().cast(), bytes.len(), libc::MSG_NOSIGNAL) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if n == 0 {
            return Err(io::Error::from(io::ErrorKind::WriteZero));
        }
        bytes = &bytes[n as usize..];
    }
    Ok(())
}

fn send_frame(state: &mut SendState, frame: &[u8]) -> Result<(), ChannelError> {
    let SendState {
        stream,
        secure,
        wire,
    } = state;
    let Some(stream) = stream else {
        return Err(ChannelError::Closed);
    };
    let bytes: &[u8] = match secure {
        None => frame,
        Some((transport, nonce)) => {
            const PLAIN: usize = MAX_NOISE_MESSAGE - TAG;
            wire.clear();
            for chunk in frame.chunks(PLAIN) {
                let at = wire.len();
                wire.resize(at + 2 + chunk.len() + TAG, 0);
                let n = transport
                    .write_message(*nonce, chunk, &mut wire[at + 2..])
                    .map_err(|e| ChannelError::Auth(e.to_string()))?;
                *nonce += 1;
                wire[at..at + 2].copy_from_slice(&(n as u16).to_be_bytes());
                wire.truncate(at + 2 + n);
            }
            wire
        }
    };
    let r = send_all(raw_of(stream), bytes);
    if wire.capacity() > 4 << 20 {
        *wire = Vec::new();
    }
    r.map_err(|e| map_io(e, None))
}

impl std::fmt::Debug for Channel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Channel")
            .field("stream", &self.stream)
            .field("secure", &self.secure.is_some())
            .finish()
    }
}

/// The receiving side of a secured channel: the transport, the next expected nonce, and
/// what was decrypted but not yet read.
struct Secure {
    transport: Arc<secure::Transport>,
    nonce: u64,
    plain: Vec<u8>,
    pos: usize,
}

fn map_io(e: io::Error, timeout: Option<Duration>) -> ChannelError {
    match e.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => {
            ChannelError::Timeout(timeout.unwrap_or_default())
        }
        io::ErrorKind::UnexpectedEof
        | io::ErrorKind::ConnectionReset
        | io::ErrorKind::BrokenPipe => ChannelError::Closed,
        _ => ChannelError::Io(e),
    }
}

impl Channel {
    /// A channel over `stream`.
    pub fn new(stream: Stream) -> Self {
        if let Stream::Tcp(t) = &stream {
            let _ = t.set_nodelay(true);
        }
        let writer = match &stream {
            Stream::Unix(s) => s.try_clone().ok().map(Stream::Unix),
            Stream::Tcp(s) => s.try_clone().ok().map(Stream::Tcp),
        };
        Channel {
            stream,
            fds: VecDeque::new(),
            read_total: 0,
            delivered: 0,
            timeout: None,
            max_frame: MAX_FRAME,
            secure: None,
            deadline: None,
            frame_deadline: false,
            ahead: Vec::new(),
            ahead_at: 0..0,
            send: Arc::new(Mutex::new(SendState {
                stream: writer,
                secure: None,
                wire: Vec::new(),
            })),
        }
    }

    /// A handle to shut this channel's socket down from elsewhere.
    pub fn closer(&self) -> io::Result<Closer> {
        Ok(Closer(match &self.stream {
            Stream::Unix(s) => Stream::Unix(s.try_clone()?),
            Stream::Tcp(s) => Stream::Tcp(s.try_clone()?),
        }))
    }

    /// A handle to send frames on this channel from elsewhere.
    pub fn sender(&self) -> Sender {
        Sender {
            send: self.send.clone(),
        }
    }

    /// Frames longer than `max` are refused, before anything is allocated for them.
    pub fn set_max_frame(&mut self, max: u32) {
        self.max_frame = max;
    }

    /// With `on`, each frame [`Channel::recv`] receives must arrive whole within the
    /// timeout (a peer that trickles bytes cannot stretch it); else the timeout bounds
    /// each read.
    pub fn set_frame_deadline(&mut self, on: bool) {
        self.frame_deadline = on;
    }

    /// Whether a received frame's bytes are already decrypted and waiting (so that the
    /// socket need not become readable for the next [`Channel::recv`] to go on).
    pub fn has_buffered(&self) -> bool {
        !self.ahead_at.is_empty() || self.secure.as_ref().is_some_and(|s| s.pos < s.plain.len())
    }

    /// Whether the channel is authenticated and encrypted.
    pub fn is_secure(&self) -> bool {
        self.secure.is_some()
    }

    /// Runs the Noise handshake with `key` as `role` (see [`crate::secure`]); every byte
    /// after it is encrypted and authenticated. Fails — before any frame is read — when
    /// the peer does not hold the key or does not speak Noise.
    pub fn secure(&mut self, key: &Key, role: Role) -> Result<(), ChannelError> {
        // The whole handshake, not each read, gets the channel's timeout.
        self.deadline = self.timeout.map(|t| std::time::Instant::now() + t);
        let result = self.handshake(key, role);
        self.deadline = None;
        if let Some(timeout) = self.timeout {
            let _ = self.set_timeout(Some(timeout));
        }
        result
    }

    #[cfg(not(feature = "noise"))]
    fn handshake(&mut self, _key: &Key, _role: Role) -> Result<(), ChannelError> {
        Err(ChannelError::Auth(
            "this build has no Noise support (kiln-wire's `noise` feature is off): a connection with a key cannot be made".into(),
        ))
    }

    #[cfg(feature = "noise")]
    fn handshake(&mut self, key: &Key, role: Role) -> Result<(), ChannelError> {
        let auth = |e: snow::Error| ChannelError::Auth(e.to_string());
        let mut handshake = secure::handshake_state(key, role).map_err(auth)?;
        let mut buf = vec![0u8; MAX_NOISE_MESSAGE];
        let mut scratch = vec![0u8; MAX_NOISE_MESSAGE];
        while !handshake.is_handshake_finished() {
            if handshake.is_my_turn() {
                let n = handshake.write_message(&[], &mut buf).map_err(auth)?;
                self.write_record(&buf[..n])?;
            } else {
                let record = self.read_record()?;
                handshake.read_message(&record, &mut scratch).map_err(|_| {
                    ChannelError::Auth(
                        "the peer does not hold the key (or does not speak Kiln's Noise handshake)"
                            .into(),
                    )
                })?;
            }
        }
        let transport = handshake.into_stateless_transport_mode().map_err(auth)?;
        // The initiator's first transport message, empty: the responder serves nothing
        // before it decrypts (see crate::secure).
        match role {
            Role::Initiator => {
                let n = transport.write_message(0, &[], &mut buf).map_err(auth)?;
                self.write_record(&buf[..n])?;
            }
            Role::Responder => {
                let record = self.read_record()?;
                let n = transport
                    .read_message(0, &record, &mut scratch)
                    .map_err(|_| {
                        ChannelError::Auth(
                            "the peer did not complete the handshake (a replayed first message, or a wrong key)"
                                .into(),
                        )
                    })?;
                if n != 0 {
                    return Err(ChannelError::Auth(
                        "the handshake's confirmation carried data".into(),
                    ));
                }
            }
        }
        let transport = Arc::new(transport);
        self.send.lock().secure = Some((transport.clone(), u64::from(role == Role::Initiator)));
        self.secure = Some(Secure {
            transport,
            nonce: u64::from(role == Role::Responder),
            plain: Vec::new(),
            pos: 0,
        });
        Ok(())
    }

    /// One Noise message to the wire: a big-endian `u16` length and the bytes.
    #[cfg(feature = "noise")]
    fn write_record(&mut self, message: &[u8]) -> Result<(), ChannelError> {
        let mut record = Vec::with_capacity(message.len() + 2);
        record.extend_from_slice(&(message.len() as u16).to_be_bytes());
        record.extend_from_slice(message);
        self.raw_write(&record)
    }

    /// Sends raw bytes (before any framing: the TCP preamble).
    pub fn send_raw(&mut self, bytes: &[u8]) -> Result<(), ChannelError> {
        self.raw_write(bytes)
    }

    /// Receives exactly `n` raw bytes (before any framing: the TCP preamble).
    pub fn recv_raw(&mut self, n: usize) -> Result<Vec<u8>, ChannelError> {
        let mut buf = vec![0u8; n];
        self.raw_read_exact(&mut buf)?;
        Ok(buf)
    }

    /// One Noise message from the wire: a big-endian `u16` length and the bytes.
    fn read_record(&mut self) -> Result<Vec<u8>, ChannelError> {
        let mut len = [0u8; 2];
        self.raw_read_exact(&mut len)?;
        let len = u16::from_be_bytes(len) as usize;
        let mut record = vec![0u8; len];
        self.raw_read_exact(&mut record)?;
        Ok(record)
    }

    fn raw_write(&mut self, bytes: &[u8]) -> Result<(), ChannelError> {
        send_all(raw_of(&self.stream), bytes).map_err(|e| map_io(e, self.timeout))
    }

    /// The socket's descriptor (for the executor's crash reporter).
    pub fn raw_fd(&self) -> RawFd {
        match &self.stream {
            Stream::Unix(s) => s.as_raw_fd(),
            Stream::Tcp(s) => s.as_raw_fd(),
        }
    }

    /// On a Unix socket: whether the process at the other end runs as this process's
    /// user (`SO_PEERCRED`); `false` on TCP or if the kernel cannot say.
    pub fn peer_is_same_user(&self) -> bool {
        // SAFETY: geteuid has no preconditions.
        self.peer_credentials()
            .is_some_and(|cred| cred.uid == unsafe { libc::geteuid() })
    }

    /// On a Unix socket: the process id at the other end, in this process's PID
    /// namespace (`SO_PEERCRED`, as the kernel translates it); `None` on TCP, if the
    /// kernel cannot say, or if the peer is in no namespace this one sees.
    pub fn peer_pid(&self) -> Option<u32> {
        self.peer_credentials()
            .and_then(|cred| u32::try_from(cred.pid).ok())
            .filter(|&pid| pid != 0)
    }

    fn peer_credentials(&self) -> Option<libc::ucred> {
        let Stream::Unix(socket) = &self.stream else {
            return None;
        };
        let mut cred = libc::ucred {
            pid: 0,
            uid: u32::MAX,
            gid: u32::MAX,
        };
        let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
        // SAFETY: getsockopt writes at most `len` bytes into `cred`.
        let rc = unsafe {
            libc::getsockopt(
                socket.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_PEERCRED,
                (&mut cred as *mut libc::ucred).cast(),
                &mut len,
            )
        };
        (rc == 0).then_some(cred)
    }

    /// Whether descriptors can travel on this channel.
    pub fn can_pass_fds(&self) -> bool {
        matches!(self.stream, Stream::Unix(_))
    }

    /// Sets the time a receive may wait (`None`: forever).
    pub fn set_timeout(&mut self, timeout: Option<Duration>) -> io::Result<()> {
        self.timeout = timeout;
        match &self.stream {
            Stream::Unix(s) => {
                s.set_read_timeout(timeout)?;
                s.set_write_timeout(timeout)
            }
            Stream::Tcp(s) => {
                s.set_read_timeout(timeout)?;
                s.set_write_timeout(timeout)
            }
        }
    }

    /// Sends a whole frame.
    pub fn send(&mut self, frame: &[u8]) -> Result<(), ChannelError> {
        let timeout = self.timeout;
        send_frame(&mut self.send.lock(), frame).map_err(|e| match e {
            ChannelError::Timeout(_) => ChannelError::Timeout(timeout.unwrap_or_default()),
            other => other,
        })
    }

    /// Sends a frame with a descriptor attached to its first byte (Unix sockets only).
    pub fn send_with_fd(&mut self, frame: &[u8], fd: BorrowedFd<'_>) -> Result<(), ChannelError> {
        self.send_with_fds(frame, &[fd])
    }

    /// Sends a frame with up to four descriptors attached to its first byte (Unix sockets
    /// only).
    pub fn send_with_fds(
        &mut self,
        frame: &[u8],
        fds: &[BorrowedFd<'_>],
    ) -> Result<(), ChannelError> {
        let (Stream::Unix(socket), None) = (&self.stream, &self.secure) else {
            return Err(ChannelError::Io(io::Error::new(
                io::ErrorKind::Unsupported,
                "descriptors can only travel on Unix sockets",
            )));
        };
        if fds.is_empty() || fds.len() > 4 {
            return Err(ChannelError::Io(io::Error::new(
                io::ErrorKind::InvalidInput,
                "one to four descriptors per frame",
            )));
        }
        let raws: Vec<RawFd> = fds.iter().map(|fd| fd.as_raw_fd()).collect();
        let data_len = std::mem::size_of_val(raws.as_slice()) as u32;
        // Frames from other senders must not come between this one's pieces.
        let _sending = self.send.lock();
        let mut iov = libc::iovec {
            iov_base: frame.as_ptr() as *mut libc::c_void,
            iov_len: frame.len(),
        };
        // SAFETY: CMSG_SPACE is a pure computation.
        let space = unsafe { libc::CMSG_SPACE(data_len) } as usize;
        let mut control = vec![0u8; space];
        // SAFETY: msghdr is plain data; zeroed is valid before the fields are set.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = control.as_mut_ptr().cast();
        msg.msg_controllen = space as _;
        // SAFETY: `msg` points at `control`, large enough for the descriptors' header and
        // data (CMSG_SPACE), so CMSG_FIRSTHDR is non-null and the data fits after it.
        unsafe {
            let cmsg = libc::CMSG_FIRSTHDR(&msg);
            (*cmsg).cmsg_level = libc::SOL_SOCKET;
            (*cmsg).cmsg_type = libc::SCM_RIGHTS;
            (*cmsg).cmsg_len = libc::CMSG_LEN(data_len) as _;
            for (i, raw) in raws.iter().enumerate() {
                std::ptr::write_unaligned(libc::CMSG_DATA(cmsg).cast::<RawFd>().add(i), *raw);
            }
        }
        // SAFETY: a valid socket and a message whose buffers outlive the call.
        let sent = unsafe { libc::sendmsg(socket.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) };
        if sent < 0 {
            return Err(map_io(io::Error::last_os_error(), self.timeout));
        }
        let sent = sent as usize;
        if sent < frame.len() {
            send_all(socket.as_raw_fd(), &frame[sent..]).map_err(|e| map_io(e, self.timeout))?;
        }
        Ok(())
    }

    /// Reads exactly `buf.len()` bytes of the frame stream (decrypted on a secure channel).
    fn read_exact(&mut self, buf: &mut [u8]) -> Result<(), ChannelError> {
        if self.secure.is_none() {
            return self.raw_read_exact(buf);
        }
        let mut done = 0;
        while done < buf.len() {
            let available = self.secure.as_ref().map_or(0, |s| s.plain.len() - s.pos);
            if available == 0 {
                let record = self.read_record()?;
                let Some(secure) = &mut self.secure else {
                    break;
                };
                secure.plain.resize(record.len(), 0);
                let n = secure
                    .transport
                    .read_message(secure.nonce, &record, &mut secure.plain)
                    .map_err(|_| {
                        ChannelError::Auth(
                            "a message failed its integrity check (tampered, replayed or out of order)"
                                .into(),
                        )
                    })?;
                secure.nonce += 1;
                secure.plain.truncate(n);
                secure.pos = 0;
                continue;
            }
            let Some(secure) = &mut self.secure else {
                break;
            };
            let n = available.min(buf.len() - done);
            buf[done..done + n].copy_from_slice(&secure.plain[secure.pos..secure.pos + n]);
            secure.pos += n;
            done += n;
        }
        Ok(())
    }

    /// Reads exactly `buf.len()` bytes off the socket, keeping any descriptors that arrive:
    /// first what was read ahead, then (for a small part) as much as the socket holds, up
    /// to [`READ_AHEAD`], kept for the next reads.
    fn raw_read_exact(&mut self, buf: &mut [u8]) -> Result<(), ChannelError> {
        let mut done = self.take_ahead(buf);
        while done < buf.len() {
            if buf.len() - done < READ_AHEAD {
                if self.ahead.is_empty() {
                    self.ahead = vec![0; READ_AHEAD];
                }
                let mut ahead = std::mem::take(&mut self.ahead);
                let read = self.raw_read_some(&mut ahead);
                self.ahead = ahead;
                self.ahead_at = 0..read?;
                done += self.take_ahead(&mut buf[done..]);
            } else {
                let n = self.raw_read_some(&mut buf[done..])?;
                self.delivered += n as u64;
                done += n;
            }
        }
        Ok(())
    }

    /// Moves what was read ahead into `buf`, as much as fits; how much.
    fn take_ahead(&mut self, buf: &mut [u8]) -> usize {
        let n = self.ahead_at.len().min(buf.len());
        let from = self.ahead_at.start;
        buf[..n].copy_from_slice(&self.ahead[from..from + n]);
        self.ahead_at.start += n;
        self.delivered += n as u64;
        n
    }

    /// One read off the socket into `buf` (at least one byte), keeping any descriptors
    /// that arrive; within the deadline, if one is set.
    fn raw_read_some(&mut self, buf: &mut [u8]) -> Result<usize, ChannelError> {
        loop {
            if let Some(deadline) = self.deadline {
                let left = deadline.saturating_duration_since(std::time::Instant::now());
                if left.is_zero() {
                    return Err(ChannelError::Timeout(self.timeout.unwrap_or_default()));
                }
                let set = match &self.stream {
                    Stream::Unix(s) => s.set_read_timeout(Some(left)),
                    Stream::Tcp(s) => s.set_read_timeout(Some(left)),
                };
                set.map_err(ChannelError::Io)?;
            }
            let read = match &mut self.stream {
                Stream::Tcp(s) => s.read(buf),
                Stream::Unix(s) => {
                    // The kernel ends a read with the message that carried descriptors
                    // (it glues no later one to it): they came with the frame that holds
                    // the last byte read.
                    let mut fds = Vec::new();
                    let read = recv_with_fds(s.as_raw_fd(), buf, &mut fds);
                    if let Ok(n) = read {
                        let at = (self.read_total + n as u64).saturating_sub(1);
                        self.fds.extend(fds.into_iter().map(|fd| (at, fd)));
                    }
                    read
                }
            };
            let n = match read {
                Ok(n) => n,
                // A signal handled in this process interrupted the wait: go on waiting.
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(map_io(e, self.timeout)),
            };
            if n == 0 {
                return Err(ChannelError::Closed);
            }
            self.read_total += n as u64;
            return Ok(n);
        }
    }

    /// Receives one frame; returns its body (tag and fields).
    pub fn recv(&mut self) -> Result<Vec<u8>, ChannelError> {
        if !self.frame_deadline || self.timeout.is_none() {
            return self.recv_frame();
        }
        self.deadline = self.timeout.map(|t| std::time::Instant::now() + t);
        let result = self.recv_frame();
        self.deadline = None;
        if let Some(timeout) = self.timeout {
            let _ = self.set_timeout(Some(timeout));
        }
        result
    }

    fn recv_frame(&mut self) -> Result<Vec<u8>, ChannelError> {
        let mut len = [0u8; 4];
        self.read_exact(&mut len)?;
        let len = u32::from_le_bytes(len);
        if len > self.max_frame {
            return Err(ChannelError::TooLarge(len));
        }
        // Grown as the bytes arrive: a peer that announces a large frame and sends nothing
        // costs nothing.
        const STEP: usize = 1 << 20;
        let len = len as usize;
        let mut body = Vec::with_capacity(len.min(STEP));
        while body.len() < len {
            let at = body.len();
            let next = (len - at).min(STEP);
            body.resize(at + next, 0);
            self.read_exact(&mut body[at..])?;
        }
        Ok(body)
    }

    /// The oldest descriptor received and not yet taken.
    pub fn take_fd(&mut self) -> Option<OwnedFd> {
        // Not one that came with a frame read ahead and not yet received.
        if self.fds.front()?.0 >= self.delivered {
            return None;
        }
        self.fds.pop_front().map(|(_, fd)| fd)
    }

    /// Shuts the socket down in both directions.
    pub fn shutdown(&self) {
        let _ = match &self.stream {
            Stream::Unix(s) => s.shutdown(std::net::Shutdown::Both),
            Stream::Tcp(s) => s.shutdown(std::net::Shutdown::Both),
        };
    }
}

/// `recvmsg` into `buf`, collecting `SCM_RIGHTS` descriptors (closed on exec).
fn recv_with_fds(fd: RawFd, buf: &mut [u8], fds: &mut Vec<OwnedFd>) -> io::Result<usize> {
    const MAX_FDS: usize = 4;
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // SAFETY: CMSG_SPACE is a pure computation.
    let space =
        unsafe { libc::CMSG_SPACE((MAX_FDS * std::mem::size_of::<RawFd>()) as u32) } as usize;
    // On the stack, aligned as a `cmsghdr` (its fields are at most 8 bytes wide).
    let mut control = [0u64; 8];
    debug_assert!(space <= std::mem::size_of_val(&control));
    // SAFETY: msghdr is plain data; zeroed is valid before the fields are set.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = space.min(std::mem::size_of_val(&control)) as _;
    // SAFETY: `msg` points at live buffers for the duration of the call.
    let n = unsafe { libc::recvmsg(fd, &mut msg, libc::MSG_CMSG_CLOEXEC) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: walking the control messages the kernel wrote into `control`, within
    // msg_controllen, with the CMSG_* accessors.
    unsafe {
        let mut cmsg = libc::CMSG_FIRSTHDR(&msg);
        while !cmsg.is_null() {
            if (*cmsg).cmsg_level == libc::SOL_SOCKET && (*cmsg).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(cmsg).cast::<RawFd>();
                let header = libc::CMSG_LEN(0) as usize;
                let count = ((*cmsg).cmsg_len as usize).saturating_sub(header)
                    / std::mem::size_of::<RawFd>();
                for i in 0..count {
                    let raw = std::ptr::read_unaligned(data.add(i));
                    // The kernel installed this descriptor in our table for us.
                    fds.push(OwnedFd::from_raw_fd(raw));
                }
            }
            cmsg = libc::CMSG_NXTHDR(&msg, cmsg);
        }
    }
    Ok(n as usize)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;
    use std::os::unix::net::UnixStream;

    /// A frame: its body's length, then the body.
    fn frame(body: &[u8]) -> Vec<u8> {
        let mut f = (body.len() as u32).to_le_bytes().to_vec();
        f.extend_from_slice(body);
        f
    }

    fn pair() -> (Channel, Channel) {
        let (a, b) = UnixStream::pair().expect("a socket pair");
        (Channel::new(Stream::Unix(a)), Channel::new(Stream::Unix(b)))
    }

    #[test]
    fn frames_read_ahead_keep_their_order_and_their_descriptors() {
        let (mut tx, mut rx) = pair();
        let file = std::fs::File::open("/dev/null").expect("/dev/null");
        // Sent before anything is read: one read brings several frames.
        tx.send(&frame(b"first")).unwrap();
        tx.send_with_fd(&frame(b"second"), file.as_fd()).unwrap();
        tx.send(&frame(b"third")).unwrap();
        let big = vec![7u8; 3 * READ_AHEAD + 5];
        let sender = std::thread::spawn(move || {
            tx.send(&frame(&big)).unwrap();
            tx.send(&frame(b"last")).unwrap();
            tx
        });
        assert_eq!(rx.recv().unwrap(), b"first");
        // The descriptor came with the second frame, not with the first.
        assert!(rx.take_fd().is_none());
        assert_eq!(rx.recv().unwrap(), b"second");
        assert!(rx.take_fd().is_some());
        assert_eq!(rx.recv().unwrap(), b"third");
        assert!(rx.take_fd().is_none());
        let body = rx.recv().unwrap();
        assert_eq!(body.len(), 3 * READ_AHEAD + 5);
        assert!(body.iter().all(|&b| b == 7));
        assert_eq!(rx.recv().unwrap(), b"last");
        assert!(!rx.has_buffered());
        drop(sender.join().unwrap());
        assert!(matches!(rx.recv(), Err(ChannelError::Closed)));
    }

    /// A build without Noise cannot make a keyed connection: it says so, and the channel
    /// stays plaintext and usable (no byte of a handshake was written).
    #[cfg(not(feature = "noise"))]
    #[test]
    fn without_noise_a_keyed_connection_is_a_clear_error() {
        let (mut a, mut b) = pair();
        let key = Key::from_bytes([7; 32]);
        let error = a
            .secure(&key, Role::Initiator)
            .expect_err("no Noise in this build");
        assert!(error.to_string().contains("`noise` feature"), "{error}");
        assert!(!a.is_secure());
        a.send(&frame(b"plain")).unwrap();
        assert_eq!(b.recv().unwrap(), b"plain");
    }
}
