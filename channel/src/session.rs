//! A client session with the guest agent over one stream: a Unix socket,
//! the VMM's hybrid vsock socket, or (Linux) AF_VSOCK.
//!
//! The hybrid socket is Firecracker's convention: the host connects to a
//! Unix socket, writes `CONNECT <port>\n` and reads `OK <hostport>\n`; the
//! AGCH stream starts after that line. The namespace backend's
//! `<name>.agent` speaks the same preamble, so a client has one path for
//! every backend.

use std::io::{self, Read, Write};
use std::net::Shutdown;
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

use crate::{handshake, ChannelError, Frame, FrameReader, FrameWriter};

/// How long connecting may wait for the peer's header or preamble reply.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Longest `OK <port>\n` line accepted from a hybrid socket.
const PREAMBLE_MAX: usize = 64;

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
        hybrid_preamble(&mut timed, port)?;
        handshake(&mut timed)?;
        stream.set_write_timeout(None)?;
        Self::ready(Stream::Unix(stream))
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

/// Writes `CONNECT <port>\n` and reads the one-line answer byte by byte,
/// so no byte of the AGCH stream behind it is consumed.
fn hybrid_preamble(s: &mut (impl Read + Write), port: u32) -> Result<(), ChannelError> {
    s.write_all(format!("CONNECT {port}\n").as_bytes())?;
    let mut line = Vec::with_capacity(16);
    let mut byte = [0u8; 1];
    loop {
        if s.read(&mut byte)? == 0 {
            return Err(ChannelError::HybridRefused(format!(
                "closed after {:?}",
                String::from_utf8_lossy(&line)
            )));
        }
        if byte[0] == b'\n' {
            break;
        }
        line.push(byte[0]);
        if line.len() > PREAMBLE_MAX {
            return Err(ChannelError::HybridRefused("answer line too long".into()));
        }
    }
    let text = String::from_utf8_lossy(&line);
    match text.strip_prefix("OK ").map(|n| n.trim().parse::<u32>()) {
        Some(Ok(_)) => Ok(()),
        _ => Err(ChannelError::HybridRefused(
            crate::sanitize_error(&text).into_owned(),
        )),
    }
}
