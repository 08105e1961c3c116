//! A client session with the guest agent over one stream: a Unix socket,
//! the VMM's hybrid vsock socket, or (Linux) AF_VSOCK.
//!
//! The hybrid socket is Firecracker's convention: the host connects to a
//! Unix socket, writes `CONNECT <port>\n` and reads `OK <hostport>\n` (or
//! `ERR <why>\n`, an error here); the AGCH stream starts after that line.
//! The lines are [`crate::hybrid`]'s. The namespace backend's
//! `<name>.agent` speaks the same preamble, so a client has one path for
//! every backend.

use std::io::{self, Read, Write};
use std::net::Shutdown;
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

use crate::blocking::{check_header, read_exact_or_eof};
use crate::{
    handshake, hybrid, session_header, ChannelError, Frame, FrameReader, FrameWriter, HEADER_LEN,
};

/// How long connecting may wait for the peer's header or preamble reply.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// A connected byte stream a session runs over.
#[derive(Debug)]
pub enum Stream {
    /// A Unix stream socket (agent socket or hybrid vsock socket).
    Unix(UnixStream),
    /// An AF_VSOCK stream.
    #[cfg(target_os = "linux")]
    Vsock(vsock::VsockStream),
}

impl Stream {
    /// A second handle to the same stream, for a reader/writer split.
    pub fn try_clone(&self) -> io::Result<Stream> {
        match self {
            Stream::Unix(s) => s.try_clone().map(Stream::Unix),
            #[cfg(target_os = "linux")]
            Stream::Vsock(s) => s.try_clone().map(Stream::Vsock),
        }
    }

    /// Shuts down one or both directions.
    pub fn shutdown(&self, how: Shutdown) -> io::Result<()> {
        match self {
            Stream::Unix(s) => s.shutdown(how),
            #[cfg(target_os = "linux")]
            Stream::Vsock(s) => s.shutdown(how),
        }
    }

    /// Sets the read timeout (`None` blocks).
    pub fn set_read_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        match self {
            Stream::Unix(s) => s.set_read_timeout(t),
            #[cfg(target_os = "linux")]
            Stream::Vsock(s) => s.set_read_timeout(t),
        }
    }
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Unix(s) => s.read(buf),
            #[cfg(target_os = "linux")]
            Stream::Vsock(s) => s.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Unix(s) => s.write(buf),
            #[cfg(target_os = "linux")]
            Stream::Vsock(s) => s.write(buf),
        }
    }

    fn write_vectored(&mut self, bufs: &[io::IoSlice<'_>]) -> io::Result<usize> {
        match self {
            Stream::Unix(s) => s.write_vectored(bufs),
            #[cfg(target_os = "linux")]
            Stream::Vsock(s) => s.write_vectored(bufs),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl AsFd for Stream {
    fn as_fd(&self) -> BorrowedFd<'_> {
        match self {
            Stream::Unix(s) => s.as_fd(),
            #[cfg(target_os = "linux")]
            Stream::Vsock(s) => s.as_fd(),
        }
    }
}

/// One AGCH session, after the handshake.
pub struct Session {
    reader: FrameReader<Stream>,
    writer: FrameWriter<Stream>,
}

impl Session {
    /// Connects to an agent listening on a Unix socket.
    pub fn connect_unix(path: impl AsRef<Path>) -> Result<Self, ChannelError> {
        Self::over(Stream::Unix(UnixStream::connect(path)?))
    }

    /// Connects through a hybrid vsock socket: `CONNECT <port>\n`, expect
    /// `OK <n>\n`, then the session; the preamble and the handshake within
    /// [`HANDSHAKE_TIMEOUT`].
    pub fn connect_hybrid(path: impl AsRef<Path>, port: u32) -> Result<Self, ChannelError> {
        Self::hybrid_over(UnixStream::connect(path)?, port, HANDSHAKE_TIMEOUT)
    }

    /// The hybrid preamble and the handshake over `stream`, already
    /// connected to a hybrid socket, all within `limit` however the peer
    /// spreads its bytes. A peer too slow is an [`ChannelError::Io`] of
    /// kind [`io::ErrorKind::TimedOut`].
    pub fn hybrid_over(
        stream: UnixStream,
        port: u32,
        limit: Duration,
    ) -> Result<Self, ChannelError> {
        let mut timed = Deadline {
            stream: &stream,
            at: Instant::now() + limit,
        };
        let read_ahead = hybrid_handshake(&mut timed, port)?;
        stream.set_write_timeout(None)?;
        stream.set_read_timeout(None)?;
        let stream = Stream::Unix(stream);
        Ok(Self {
            writer: FrameWriter::new(stream.try_clone()?),
            reader: FrameReader::with_read_ahead(stream, &read_ahead),
        })
    }

    /// Connects to `port` of the VM with context id `cid` over AF_VSOCK.
    #[cfg(target_os = "linux")]
    pub fn connect_vsock(cid: u32, port: u32) -> Result<Self, ChannelError> {
        Self::over(Stream::Vsock(vsock::VsockStream::connect_with_cid_port(
            cid, port,
        )?))
    }

    /// Runs the handshake over a connected stream (either side) and splits
    /// it into a reader and a writer.
    pub fn over(mut stream: Stream) -> Result<Self, ChannelError> {
        stream.set_read_timeout(Some(HANDSHAKE_TIMEOUT))?;
        handshake(&mut stream)?;
        Self::ready(stream)
    }

    /// A session over `stream`, handshaken: no read timeout from here on.
    fn ready(stream: Stream) -> Result<Self, ChannelError> {
        stream.set_read_timeout(None)?;
        let writer = FrameWriter::new(stream.try_clone()?);
        Ok(Self {
            reader: FrameReader::new(stream),
            writer,
        })
    }

    /// Sends one frame.
    pub fn send(&mut self, frame: &Frame) -> Result<(), ChannelError> {
        self.writer.write_frame(frame)
    }

    /// Receives one frame; `None` when the peer closed cleanly.
    pub fn recv(&mut self) -> Result<Option<Frame>, ChannelError> {
        self.reader.read_frame()
    }

    /// Half-closes: the peer reads EOF, frames still arrive.
    pub fn close_write(&self) -> io::Result<()> {
        self.writer.get_ref().shutdown(Shutdown::Write)
    }

    /// The two halves, for a reader thread and a writer thread.
    pub fn into_split(self) -> (FrameReader<Stream>, FrameWriter<Stream>) {
        (self.reader, self.writer)
    }
}

/// A connected Unix stream whose reads and writes share one deadline: each
/// waits at most the time left, and none starts once it has passed.
struct Deadline<'a> {
    stream: &'a UnixStream,
    at: Instant,
}

impl Deadline<'_> {
    /// The time left, or `TimedOut` when there is none.
    fn left(&self) -> io::Result<Duration> {
        let left = self.at.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(timed_out());
        }
        Ok(left)
    }
}

fn timed_out() -> io::Error {
    io::Error::new(io::ErrorKind::TimedOut, "the peer did not answer in time")
}

/// A socket timeout reads as `WouldBlock` (`EAGAIN`) on Linux.
fn or_timed_out(e: io::Error) -> io::Error {
    match e.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => timed_out(),
        _ => e,
    }
}

impl Read for Deadline<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.stream.set_read_timeout(Some(self.left()?))?;
        self.stream.read(buf).map_err(or_timed_out)
    }
}

impl Write for Deadline<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.stream.set_write_timeout(Some(self.left()?))?;
        self.stream.write(buf).map_err(or_timed_out)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// The hybrid preamble and the handshake in as few system calls as they
/// allow: `CONNECT <port>\n`, then reads of up to a whole reply and header
/// at once (the agent's header follows the `OK` line at once, both sides
/// writing first), our session header once `OK` is in (a server need not
/// keep bytes sent behind the line: vhost-device-vsock does not). What was
/// read past the peer's header is returned, for the session's reader.
fn hybrid_handshake(s: &mut (impl Read + Write), port: u32) -> Result<Vec<u8>, ChannelError> {
    let refused = |why: &dyn std::fmt::Display| Err(ChannelError::HybridRefused(why.to_string()));
    if !(1..=hybrid::MAX_PORT).contains(&port) {
        return refused(&hybrid::ConnectError::PortRange);
    }
    // A server that refuses at once (another uid, its cap) may close before
    // our write: its `ERR` line is still there to read, the better error.
    let wrote = s.write_all(hybrid::request(port).as_bytes());
    let mut buf = [0u8; hybrid::REPLY_MAX + HEADER_LEN];
    let mut got = 0;
    let line = loop {
        let n = match s.read(&mut buf[got..]) {
            Ok(n) if n > 0 => n,
            // Nothing (more) to read: a failed write of ours is the error.
            r => {
                wrote?;
                return match r {
                    Err(e) => Err(e.into()),
                    Ok(_) => refused(&format_args!(
                        "closed after {:?}",
                        crate::sanitize_error(&String::from_utf8_lossy(&buf[..got]))
                    )),
                };
            }
        };
        got += n;
        match hybrid::scan_reply(&buf[..got]) {
            hybrid::Reply::Partial => {}
            hybrid::Reply::Ok { len, .. } => break len,
            hybrid::Reply::Err(why) => return refused(&why),
            hybrid::Reply::Malformed(bad) => {
                let line = buf[..got].split(|&b| b == b'\n').next().unwrap_or_default();
                return refused(&format_args!(
                    "{bad}: {}",
                    crate::sanitize_error(&String::from_utf8_lossy(line))
                ));
            }
        }
    };
    wrote?;
    s.write_all(&session_header())?;
    let header_end = line + HEADER_LEN;
    if got < header_end {
        read_exact_or_eof(s, &mut buf[got..header_end], "the session header")?;
        got = header_end;
    }
    let mut peer = [0u8; HEADER_LEN];
    peer.copy_from_slice(&buf[line..header_end]);
    check_header(peer)?;
    Ok(buf[header_end..got].to_vec())
}
