//! Frames over a stream socket (Unix or TCP), with file descriptors passed beside the
//! bytes (`SCM_RIGHTS`) on Unix sockets, and timeouts.

use crate::protocol::MAX_FRAME;
use std::collections::VecDeque;
use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
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
    /// Another I/O error.
    #[error(transparent)]
    Io(io::Error),
}

/// A framed, bidirectional channel.
#[derive(Debug)]
pub struct Channel {
    stream: Stream,
    fds: VecDeque<OwnedFd>,
    timeout: Option<Duration>,
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
        Channel {
            stream,
            fds: VecDeque::new(),
            timeout: None,
        }
    }

    /// The socket's descriptor (for the executor's crash reporter).
    pub fn raw_fd(&self) -> RawFd {
        match &self.stream {
            Stream::Unix(s) => s.as_raw_fd(),
            Stream::Tcp(s) => s.as_raw_fd(),
        }
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
        let r = match &mut self.stream {
            Stream::Unix(s) => s.write_all(frame),
            Stream::Tcp(s) => s.write_all(frame),
        };
        r.map_err(|e| map_io(e, self.timeout))
    }

    /// Sends a frame with a descriptor attached to its first byte (Unix sockets only).
    pub fn send_with_fd(&mut self, frame: &[u8], fd: BorrowedFd<'_>) -> Result<(), ChannelError> {
        let Stream::Unix(socket) = &self.stream else {
            return Err(ChannelError::Io(io::Error::new(
                io::ErrorKind::Unsupported,
                "descriptors can only travel on Unix sockets",
            )));
        };
        let raw = fd.as_raw_fd();
        let mut iov = libc::iovec {
            iov_base: frame.as_ptr() as *mut libc::c_void,
            iov_len: frame.len(),
        };
        // SAFETY: CMSG_SPACE is a pure computation.
        let space = unsafe { libc::CMSG_SPACE(std::mem::size_of::<RawFd>() as u32) } as usize;
        let mut control = vec![0u8; space];
        // SAFETY: msghdr is plain data; zeroed is valid before the fields are set.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = control.as_mut_ptr().cast();
        msg.msg_controllen = space as _;
        // SAFETY: `msg` points at `control`, large enough for one descriptor's header and
        // data (CMSG_SPACE), so CMSG_FIRSTHDR is non-null and CMSG_DATA inside it.
        unsafe {
            let cmsg = libc::CMSG_FIRSTHDR(&msg);
            (*cmsg).cmsg_level = libc::SOL_SOCKET;
            (*cmsg).cmsg_type = libc::SCM_RIGHTS;
            (*cmsg).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<RawFd>() as u32) as _;
            std::ptr::write_unaligned(libc::CMSG_DATA(cmsg).cast::<RawFd>(), raw);
        }
        // SAFETY: a valid socket and a message whose buffers outlive the call.
        let sent = unsafe { libc::sendmsg(socket.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) };
        if sent < 0 {
            return Err(map_io(io::Error::last_os_error(), self.timeout));
        }
        let sent = sent as usize;
        if sent < frame.len() {
            self.send(&frame[sent..])?;
        }
        Ok(())
    }

    /// Reads exactly `buf.len()` bytes, keeping any descriptors that arrive.
    fn read_exact(&mut self, buf: &mut [u8]) -> Result<(), ChannelError> {
        let mut done = 0;
        while done < buf.len() {
            let read = match &mut self.stream {
                Stream::Tcp(s) => s.read(&mut buf[done..]),
                Stream::Unix(s) => {
                    let fd = s.as_raw_fd();
                    recv_with_fds(fd, &mut buf[done..], &mut self.fds)
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
            done += n;
        }
        Ok(())
    }

    /// Receives one frame; returns its body (tag and fields).
    pub fn recv(&mut self) -> Result<Vec<u8>, ChannelError> {
        let mut len = [0u8; 4];
        self.read_exact(&mut len)?;
        let len = u32::from_le_bytes(len);
        if len > MAX_FRAME {
            return Err(ChannelError::TooLarge(len));
        }
        let mut body = vec![0u8; len as usize];
        self.read_exact(&mut body)?;
        Ok(body)
    }

    /// The oldest descriptor received and not yet taken.
    pub fn take_fd(&mut self) -> Option<OwnedFd> {
        self.fds.pop_front()
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
fn recv_with_fds(fd: RawFd, buf: &mut [u8], fds: &mut VecDeque<OwnedFd>) -> io::Result<usize> {
    const MAX_FDS: usize = 4;
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // SAFETY: CMSG_SPACE is a pure computation.
    let space =
        unsafe { libc::CMSG_SPACE((MAX_FDS * std::mem::size_of::<RawFd>()) as u32) } as usize;
    let mut control = vec![0u8; space];
    // SAFETY: msghdr is plain data; zeroed is valid before the fields are set.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = space as _;
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
                    fds.push_back(OwnedFd::from_raw_fd(raw));
                }
            }
            cmsg = libc::CMSG_NXTHDR(&msg, cmsg);
        }
    }
    Ok(n as usize)
}
