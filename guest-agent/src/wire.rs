//! One session's socket on the agent side: a non-blocking stream with an
//! input buffer that yields whole frames and an output buffer of encoded
//! frames, so one `poll(2)` loop can serve the socket and a child at once.
//!
//! Owns agent-side framing: a header is checked (tag, length ≤
//! `MAX_PAYLOAD`) before its payload is awaited or allocated; bytes of
//! frames that may hold secrets are wiped once decoded and when the buffer
//! moves or drops. Child output is read straight into the output buffer
//! behind a frame header, without a copy. Nothing here blocks unless its
//! name ends in `_blocking`; the input buffer never holds more than one
//! maximum frame.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::time::{Duration, Instant};

use boxdesk_channel::blocking::check_header;
use boxdesk_channel::{
    session_header, ChannelError, Frame, FrameError, FrameHeader, Tag, HEADER_LEN, MAX_PAYLOAD,
};
use nix::sys::socket::{send, shutdown, MsgFlags, Shutdown};
use zeroize::Zeroize;

use crate::fdio;

/// Bytes read from the socket at a time (and the input buffer's resting
/// size).
const READ_CHUNK: usize = 64 * 1024;
/// How long a peer has to send its 6-byte header.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long [`Wire::close`] keeps reading (and discarding) what the peer
/// still sends, so unread bytes do not turn our close into a reset.
const LINGER: Duration = Duration::from_millis(500);

/// Why a session's stream failed.
#[derive(Debug, thiserror::Error)]
pub enum WireError {
    /// The socket failed (the peer is gone, usually).
    #[error("session socket: {0}")]
    Io(#[from] io::Error),
    /// The peer sent a malformed frame.
    #[error(transparent)]
    Frame(#[from] FrameError),
    /// The peer closed its side in the middle of a frame.
    #[error("peer closed the stream in the middle of a frame")]
    Truncated,
    /// The peer's session header is wrong, missing or late.
    #[error("handshake: {0}")]
    Handshake(ChannelError),
}

impl WireError {
    /// True when the peer sent something wrong (it gets an Error frame);
    /// false when the stream itself failed (nobody to tell).
    pub fn is_protocol(&self) -> bool {
        matches!(self, WireError::Frame(_) | WireError::Truncated)
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
pub struct Wire {
    fd: OwnedFd,
    inb: Vec<u8>,
    start: usize,
    end: usize,
    out: Vec<u8>,
    out_pos: usize,
}

impl Wire {
    /// Wraps a connected stream socket and makes it non-blocking.
    pub fn new(fd: OwnedFd) -> io::Result<Wire> {
        fdio::set_nonblocking(fd.as_fd(), true)?;
        Ok(Wire {
            fd,
            inb: vec![0; READ_CHUNK],
            start: 0,
            end: 0,
            out: Vec::with_capacity(READ_CHUNK + 64),
            out_pos: 0,
        })
    }

    /// The socket, for `poll(2)`.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// Writes our header, then reads and checks the peer's (waiting at most
    /// [`HANDSHAKE_TIMEOUT`]).
    pub fn handshake(&mut self) -> Result<(), WireError> {
        self.out.extend_from_slice(&session_header());
        self.flush_blocking()?;
        let deadline = Instant::now() + HANDSHAKE_TIMEOUT;
        while self.end - self.start < HEADER_LEN {
            let mut fds = [fdio::pollfd(self.fd(), libc::POLLIN)];
            if fdio::poll(&mut fds, fdio::until(Some(deadline)))? == 0 {
                if Instant::now() >= deadline {
                    return Err(WireError::Handshake(ChannelError::UnexpectedEof(
                        "the session header (timed out)",
                    )));
                }
                continue;
            }
            if self.fill_for(HEADER_LEN)? == Pull::Eof {
                return Err(WireError::Handshake(ChannelError::UnexpectedEof(
                    "the session header",
                )));
            }
        }
        let mut peer = [0u8; HEADER_LEN];
        peer.copy_from_slice(&self.inb[self.start..self.start + HEADER_LEN]);
        self.start += HEADER_LEN;
        check_header(peer).map_err(WireError::Handshake)
    }

    /// Reads once from the socket into the input buffer, with room for at
    /// least the whole next frame (its header is checked by
    /// [`Wire::next_frame`], not here).
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
            if want > self.inb.len() {
                self.inb.resize(want, 0);
            }
            if self.end == self.inb.len() {
                self.inb.resize(self.end + READ_CHUNK, 0);
            }
        }
        match fdio::read(self.fd.as_fd(), &mut self.inb[self.end..]) {
            Ok(0) => Ok(Pull::Eof),
            Ok(n) => {
                self.end += n;
                Ok(Pull::Data(n))
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(Pull::Again),
            Err(e) => Err(e),
        }
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
                self.inb.zeroize();
                self.inb = vec![0; READ_CHUNK];
            }
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
    pub fn send_blocking(&mut self, frame: &Frame) -> Result<(), WireError> {
        self.queue(frame)?;
        Ok(self.flush_blocking()?)
    }

    /// The next frame, waiting for it; `None` at a clean end of stream.
    /// Queued output is written while waiting.
    pub fn recv_blocking(&mut self) -> Result<Option<Frame>, WireError> {
        loop {
            if let Some(frame) = self.next_frame()? {
                return Ok(Some(frame));
            }
            let mut events = libc::POLLIN;
            if self.pending_out() > 0 {
                events |= libc::POLLOUT;
            }
            let mut fds = [fdio::pollfd(self.fd(), events)];
            fdio::poll(&mut fds, None)?;
            if fdio::writable(fds[0].revents) && self.pending_out() > 0 {
                self.flush_some()?;
            }
            if fdio::readable(fds[0].revents) {
                match self.fill()? {
                    Pull::Eof if self.has_partial_frame() => return Err(WireError::Truncated),
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

impl Drop for Wire {
    fn drop(&mut self) {
        self.inb.zeroize();
    }
}
