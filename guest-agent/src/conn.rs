//! One session's socket on the agent side: a non-blocking stream with an
//! input buffer that yields whole frames and an output buffer of encoded
//! frames, so one `poll(2)` loop can serve the socket and a child at once.
//!
//! Owns agent-side framing after the session headers (`gate` exchanged
//! those): a frame header is checked (tag, length ≤ `MAX_PAYLOAD`) before
//! its payload is awaited or allocated; bytes of frames that may hold
//! secrets are wiped once decoded and when the buffer moves or drops. Child
//! output is read straight into the output buffer behind a frame header,
//! without a copy. A frame must arrive whole within [`STALL`] of its first
//! byte being read ([`Conn::stall_deadline`]); the time between frames is
//! the peer's own. Nothing here blocks unless its name ends in
//! `_blocking`; the input buffer never holds more than one maximum frame,
//! and no buffer is allocated before the first byte to go in it.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::time::{Duration, Instant};

use boxdesk_channel::{Frame, FrameError, FrameHeader, Tag, MAX_PAYLOAD};
use nix::sys::socket::{send, shutdown, MsgFlags, Shutdown};
use zeroize::Zeroize;

use crate::fdio;

/// Bytes read from the socket at a time (and the input buffer's resting
/// size).
const READ_CHUNK: usize = 64 * 1024;
/// How long a frame may take to arrive once its first byte was read: a
/// peer that stops in the middle of a frame for this long is dropped.
pub const STALL: Duration = Duration::from_secs(10);
/// How long [`Conn::close`] keeps reading (and discarding) what the peer
/// still sends, so unread bytes do not turn our close into a reset.
const LINGER: Duration = Duration::from_millis(500);
/// How long a send that found no kernel memory waits before the next try.
const NO_MEMORY_PAUSE: Duration = Duration::from_millis(1);

/// Why a session's stream failed.
#[derive(Debug, thiserror::Error)]
pub enum ConnError {
    /// The socket failed (the peer is gone, usually).
    #[error("session socket: {0}")]
    Io(io::Error),
    /// The peer sent a malformed frame.
    #[error(transparent)]
    Frame(#[from] FrameError),
    /// The peer closed its side in the middle of a frame.
    #[error("peer closed the stream in the middle of a frame")]
    Truncated,
    /// The peer stopped in the middle of a frame for [`STALL`].
    #[error("ETIMEDOUT: no complete frame within 10 s of its start; closing")]
    Stalled,
}

/// By hand, not `#[from]`: the cause is in the message, so it is not a
/// `source()` too (a `{e:#}` chain prints it once).
impl From<io::Error> for ConnError {
    fn from(e: io::Error) -> Self {
        ConnError::Io(e)
    }
}

impl ConnError {
    /// True when the peer sent something wrong (it gets an Error frame);
    /// false when the stream itself failed (nobody to tell).
    pub fn is_protocol(&self) -> bool {
        matches!(
            self,
            ConnError::Frame(_) | ConnError::Truncated | ConnError::Stalled
        )
    }
}

/// The outcome of one non-blocking read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pull {
    /// This many bytes arrived.
    Data(usize),
    /// End of stream.
    Eof,
    /// Nothing to read now.
    Again,
}

/// A session socket with its buffers.
pub struct Conn {
    fd: OwnedFd,
    inb: Vec<u8>,
    start: usize,
    end: usize,
    out: Vec<u8>,
    out_pos: usize,
    /// When the first byte of the partial frame now buffered was read.
    partial_since: Option<Instant>,
    /// `inb[..dirty]` may hold bytes read from the peer (the rest of the
    /// buffer was never written).
    dirty: usize,
}

impl Conn {
    /// Wraps a connected stream socket and makes it non-blocking. The
    /// buffers start empty: a session that sends nothing costs nothing.
    pub fn new(fd: OwnedFd) -> io::Result<Conn> {
        fdio::set_nonblocking(fd.as_fd(), true)?;
        Ok(Conn {
            fd,
            inb: Vec::new(),
            start: 0,
            end: 0,
            out: Vec::new(),
            out_pos: 0,
            partial_since: None,
            dirty: 0,
        })
    }

    /// The socket, for `poll(2)`.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// Reads once from the socket into the input buffer, with room for at
    /// least the whole next frame (its header is checked by
    /// [`Conn::next_frame`], not here).
    pub fn fill(&mut self) -> io::Result<Pull> {
        let need = self.inb[self.start..self.end]
            .first_chunk::<{ FrameHeader::LEN }>()
            .and_then(|h| FrameHeader::parse(*h).ok())
            .map_or(FrameHeader::LEN, |h| FrameHeader::LEN + h.len as usize);
        self.fill_for(need)
    }

    /// Reads once, first making room for `need` bytes from `start` (and at
    /// least one more byte than is buffered).
    fn fill_for(&mut self, need: usize) -> io::Result<Pull> {
        let want = need.max(READ_CHUNK);
        if self.start + want > self.inb.len() || self.end == self.inb.len() {
            self.compact();
            let mut len = self.inb.len().max(want);
            if self.end == len {
                len = self.end + READ_CHUNK;
            }
            if len > self.inb.len() {
                self.grow(len);
            }
        }
        match fdio::read(self.fd.as_fd(), &mut self.inb[self.end..]) {
            Ok(0) => Ok(Pull::Eof),
            Ok(n) => {
                if self.end == self.start {
                    self.partial_since = Some(Instant::now());
                }
                self.end += n;
                self.dirty = self.dirty.max(self.end);
                Ok(Pull::Data(n))
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(Pull::Again),
            Err(e) => Err(e),
        }
    }

    /// When the partial frame now buffered must be complete; `None` when
    /// none is.
    pub fn stall_deadline(&self) -> Option<Instant> {
        self.partial_since
            .filter(|_| self.has_partial_frame())
            .map(|t| t + STALL)
    }

    /// Restarts the clock of a partial frame: the agent stopped reading
    /// for a while (back-pressure), which is not the peer's stall.
    pub fn restart_stall_clock(&mut self) {
        if self.has_partial_frame() {
            self.partial_since = Some(Instant::now());
        }
    }

    /// Moves the input to a larger buffer of `len` bytes, wiping the old
    /// one (a plain `resize` could free it unwiped when it reallocates).
    fn grow(&mut self, len: usize) {
        let mut bigger = vec![0; len];
        bigger[..self.end].copy_from_slice(&self.inb[..self.end]);
        self.wipe_input();
        self.inb = bigger;
        self.dirty = self.end;
    }

    /// Wipes every input byte ever written (not the whole buffer: a
    /// volatile wipe of 64 KiB is a visible part of a short session).
    fn wipe_input(&mut self) {
        self.inb[..self.dirty].zeroize();
        self.dirty = 0;
    }

    /// Moves the unread bytes to the front, wiping where they were.
    fn compact(&mut self) {
        if self.start == 0 {
            return;
        }
        let len = self.end - self.start;
        self.inb.copy_within(self.start..self.end, 0);
        self.inb[len..self.end].zeroize();
        self.start = 0;
        self.end = len;
    }

    /// The next whole frame already buffered, if any.
    pub fn next_frame(&mut self) -> Result<Option<Frame>, FrameError> {
        let Some(head) = self.inb[self.start..self.end].first_chunk::<{ FrameHeader::LEN }>()
        else {
            return Ok(None);
        };
        let header = FrameHeader::parse(*head)?;
        let total = FrameHeader::LEN + header.len as usize;
        if self.end - self.start < total {
            return Ok(None);
        }
        let whole = &mut self.inb[self.start..self.start + total];
        let payload = whole[FrameHeader::LEN..].to_vec();
        if header.tag.may_hold_secret() {
            whole.zeroize();
        }
        self.start += total;
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
            if self.inb.len() > 2 * READ_CHUNK {
                self.wipe_input();
                self.inb = Vec::new();
            }
        } else {
            // The next frame's first bytes came with this one.
            self.partial_since = Some(Instant::now());
        }
        Frame::decode_payload(header.tag, payload).map(Some)
    }

    /// True when part of a frame is buffered (an EOF now truncates it).
    pub fn has_partial_frame(&self) -> bool {
        self.end > self.start
    }

    /// Appends an encoded frame to the output buffer.
    pub fn queue(&mut self, frame: &Frame) -> Result<(), FrameError> {
        self.reset_out_if_flushed();
        frame.encode(&mut self.out)
    }

    /// Reads up to `max` bytes of child output from `src` straight into a
    /// new `tag` frame in the output buffer.
    pub fn queue_output(&mut self, tag: Tag, src: BorrowedFd<'_>, max: usize) -> io::Result<Pull> {
        self.reset_out_if_flushed();
        let max = max.min(MAX_PAYLOAD as usize);
        let base = self.out.len();
        self.out.extend_from_slice(&[0; FrameHeader::LEN]);
        let pull = match fdio::read_append(src, &mut self.out, max) {
            Ok(0) => Pull::Eof,
            Ok(n) => {
                let header = FrameHeader { tag, len: n as u32 };
                self.out[base..base + FrameHeader::LEN].copy_from_slice(&header.to_bytes());
                return Ok(Pull::Data(n));
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Pull::Again,
            Err(e) => {
                self.out.truncate(base);
                return Err(e);
            }
        };
        self.out.truncate(base);
        Ok(pull)
    }

    fn reset_out_if_flushed(&mut self) {
        if self.out_pos == self.out.len() {
            self.out.clear();
            self.out_pos = 0;
        }
    }

    /// Bytes queued but not yet written to the socket.
    pub fn pending_out(&self) -> usize {
        self.out.len() - self.out_pos
    }

    /// Writes as much queued output as the socket takes now.
    pub fn flush_some(&mut self) -> io::Result<()> {
        while self.out_pos < self.out.len() {
            // MSG_NOSIGNAL: a vanished peer is EPIPE for this session, never
            // a SIGPIPE for the agent (even if an embedder restored it).
            match send(
                self.fd.as_raw_fd(),
                &self.out[self.out_pos..],
                MsgFlags::MSG_NOSIGNAL | MsgFlags::MSG_DONTWAIT,
            ) {
                Ok(n) => self.out_pos += n,
                Err(nix::errno::Errno::EINTR) => {}
                Err(nix::errno::Errno::EAGAIN) => return Ok(()),
                // The kernel had no memory for the buffer this time (a
                // container at its memory limit while the OOM killer frees
                // some): back-pressure, not a lost peer.
                Err(nix::errno::Errno::ENOBUFS | nix::errno::Errno::ENOMEM) => {
                    std::thread::sleep(NO_MEMORY_PAUSE);
                    return Ok(());
                }
                Err(e) => return Err(e.into()),
            }
        }
        self.reset_out_if_flushed();
        Ok(())
    }

    /// Writes all queued output, waiting for the socket as needed.
    pub fn flush_blocking(&mut self) -> io::Result<()> {
        loop {
            self.flush_some()?;
            if self.pending_out() == 0 {
                return Ok(());
            }
            let mut fds = [fdio::pollfd(self.fd(), libc::POLLOUT)];
            fdio::poll(&mut fds, None)?;
        }
    }

    /// Queues `frame` and writes everything, waiting as needed.
    pub fn send_blocking(&mut self, frame: &Frame) -> Result<(), ConnError> {
        self.queue(frame)?;
        Ok(self.flush_blocking()?)
    }

    /// The next frame, waiting for it (between frames, for ever; inside
    /// one, until its [`STALL`] deadline); `None` at a clean end of stream.
    /// Queued output is written while waiting.
    pub fn recv_blocking(&mut self) -> Result<Option<Frame>, ConnError> {
        loop {
            if let Some(frame) = self.next_frame()? {
                return Ok(Some(frame));
            }
            let stall = self.stall_deadline();
            if stall.is_some_and(|d| Instant::now() >= d) {
                return Err(ConnError::Stalled);
            }
            let mut events = libc::POLLIN;
            if self.pending_out() > 0 {
                events |= libc::POLLOUT;
            }
            let mut fds = [fdio::pollfd(self.fd(), events)];
            fdio::poll(&mut fds, fdio::until(stall))?;
            if fdio::writable(fds[0].revents) && self.pending_out() > 0 {
                self.flush_some()?;
            }
            if fdio::readable(fds[0].revents) {
                match self.fill()? {
                    Pull::Eof if self.has_partial_frame() => return Err(ConnError::Truncated),
                    Pull::Eof => return Ok(None),
                    Pull::Data(_) | Pull::Again => {}
                }
            }
        }
    }

    /// Ends the session: writes what is queued, half-closes so the peer
    /// reads EOF, and briefly drains what the peer still sends.
    pub fn close(mut self) {
        if self.flush_blocking().is_err() {
            return;
        }
        let _ = shutdown(self.fd.as_raw_fd(), Shutdown::Write);
        let deadline = Instant::now() + LINGER;
        let mut scratch = [0u8; 4096];
        while Instant::now() < deadline {
            let mut fds = [fdio::pollfd(self.fd(), libc::POLLIN)];
            match fdio::poll(&mut fds, fdio::until(Some(deadline))) {
                Ok(0) => continue,
                Ok(_) => {}
                Err(_) => break,
            }
            match fdio::read(self.fd(), &mut scratch) {
                Ok(0) => break,
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(_) => break,
            }
        }
        scratch.zeroize();
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        self.wipe_input();
    }
}
