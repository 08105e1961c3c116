//! Blocking frame I/O over `Read`/`Write`, and the session [`handshake`].
//!
//! [`FrameReader`] keeps a small buffer so small frames cost one `read`
//! for many; a payload larger than what is buffered is read straight into
//! its own allocation (sized only after [`FrameHeader::parse`] accepted the
//! length). [`FrameWriter`] writes header, fields and data with one
//! vectored write, so output data is never copied on the way out. Both
//! wipe their buffers on drop.

use std::io::{self, IoSlice, IoSliceMut, Read, Write};

use zeroize::Zeroize;

use crate::frame::{Frame, FrameHeader};
use crate::{session_header, ChannelError, HEADER_LEN, MAGIC, VERSION};

/// Bytes a [`FrameReader`] buffers: room for many small frames; larger
/// payloads bypass it.
const READ_BUF: usize = 16 * 1024;

/// Writes this side's session header, then reads and checks the peer's.
/// Both sides write first, so neither waits for the other.
pub fn handshake<S: Read + Write>(stream: &mut S) -> Result<(), ChannelError> {
    // A peer that already said something and hung up (not an agent, or an
    // agent refusing us) makes our write fail with EPIPE: what it said is
    // still there to read and is the better error.
    let wrote = stream
        .write_all(&session_header())
        .and_then(|()| stream.flush());
    let mut peer = [0u8; HEADER_LEN];
    match (
        wrote,
        read_exact_or_eof(stream, &mut peer, "the session header"),
    ) {
        (_, Ok(())) => check_header(peer),
        (Err(e), Err(_)) => Err(e.into()),
        (Ok(()), Err(e)) => Err(e),
    }
}

/// Checks a peer's 6 header bytes.
pub fn check_header(peer: [u8; HEADER_LEN]) -> Result<(), ChannelError> {
    let magic = [peer[0], peer[1], peer[2], peer[3]];
    if magic != MAGIC {
        return Err(ChannelError::BadMagic(magic));
    }
    match u16::from_le_bytes([peer[4], peer[5]]) {
        VERSION => Ok(()),
        other => Err(ChannelError::UnsupportedVersion(other)),
    }
}

pub(crate) fn read_exact_or_eof<R: Read + ?Sized>(
    r: &mut R,
    buf: &mut [u8],
    what: &'static str,
) -> Result<(), ChannelError> {
    r.read_exact(buf).map_err(|e| match e.kind() {
        io::ErrorKind::UnexpectedEof => ChannelError::UnexpectedEof(what),
        _ => ChannelError::Io(e),
    })
}

/// Reads frames from a blocking byte stream.
///
/// An error from the stream in the middle of a frame (including
/// `WouldBlock` or a read timeout) ends the session: the partial frame is
/// dropped. Event loops over non-blocking sockets keep their own buffer and
/// call [`decode_slice`](crate::frame::decode_slice) instead.
pub struct FrameReader<R> {
    inner: R,
    buf: Box<[u8]>,
    start: usize,
    end: usize,
}

impl<R: Read> FrameReader<R> {
    /// A reader over `inner` (which should not be buffered itself).
    pub fn new(inner: R) -> Self {
        Self {
            inner,
            buf: vec![0; READ_BUF].into_boxed_slice(),
            start: 0,
            end: 0,
        }
    }

    /// A reader over `inner` whose first bytes are `read_ahead`, bytes of
    /// the stream already read from it (behind a hybrid `OK` line).
    pub(crate) fn with_read_ahead(inner: R, read_ahead: &[u8]) -> Self {
        let mut r = Self::new(inner);
        if read_ahead.len() > r.buf.len() {
            r.buf = vec![0; read_ahead.len()].into_boxed_slice();
        }
        r.buf[..read_ahead.len()].copy_from_slice(read_ahead);
        r.end = read_ahead.len();
        r
    }

    /// Reads the next frame. `Ok(None)` is a clean end of stream at a frame
    /// boundary; an end inside a frame is [`ChannelError::UnexpectedEof`].
    pub fn read_frame(&mut self) -> Result<Option<Frame>, ChannelError> {
        loop {
            let avail = &mut self.buf[self.start..self.end];
            if let Some(head) = avail.first_chunk::<{ FrameHeader::LEN }>() {
                let header = FrameHeader::parse(*head)?;
                let total = FrameHeader::LEN + header.len as usize;
                if let Some(whole) = avail.get_mut(..total) {
                    let payload = whole[FrameHeader::LEN..].to_vec();
                    if header.tag.may_hold_secret() {
                        whole.zeroize();
                    }
                    self.start += total;
                    return Ok(Some(Frame::decode_payload(header.tag, payload)?));
                }
                if total > self.buf.len() {
                    return self.read_large(header).map(Some);
                }
            }
            if !self.fill()? {
                return match self.end - self.start {
                    0 => Ok(None),
                    _ => Err(ChannelError::UnexpectedEof("a frame")),
                };
            }
        }
    }

    /// A frame bigger than the buffer: copy what is buffered into the
    /// payload's own allocation and read the rest straight into it. Each
    /// read also offers the (empty) buffer as a second slice, so the next
    /// frame's header arrives in the same system call.
    fn read_large(&mut self, header: FrameHeader) -> Result<Frame, ChannelError> {
        let len = header.len as usize;
        let secret = header.tag.may_hold_secret();
        let buffered = &mut self.buf[self.start + FrameHeader::LEN..self.end];
        let mut payload = vec![0; len];
        let mut have = buffered.len();
        payload[..have].copy_from_slice(buffered);
        if secret {
            buffered.zeroize();
        }
        self.start = 0;
        self.end = 0;
        while have < len {
            let mut bufs = [
                IoSliceMut::new(&mut payload[have..]),
                IoSliceMut::new(&mut self.buf),
            ];
            match self.inner.read_vectored(&mut bufs) {
                Ok(0) => {
                    if secret {
                        payload.zeroize();
                    }
                    return Err(ChannelError::UnexpectedEof("a frame payload"));
                }
                Ok(n) => {
                    let into_payload = n.min(len - have);
                    have += into_payload;
                    self.end = n - into_payload;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(Frame::decode_payload(header.tag, payload)?)
    }

    /// Reads more bytes into the buffer; false at end of stream.
    fn fill(&mut self) -> Result<bool, ChannelError> {
        if self.start > 0 {
            self.buf.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        loop {
            match self.inner.read(&mut self.buf[self.end..]) {
                Ok(0) => return Ok(false),
                Ok(n) => {
                    self.end += n;
                    return Ok(true);
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Bytes received but not yet decoded.
    pub fn buffered(&self) -> usize {
        self.end - self.start
    }

    /// The underlying stream.
    pub fn get_ref(&self) -> &R {
        &self.inner
    }
}

impl<R> Drop for FrameReader<R> {
    fn drop(&mut self) {
        self.buf.zeroize();
    }
}

/// Writes frames to a byte stream.
pub struct FrameWriter<W> {
    inner: W,
    prefix: Vec<u8>,
}

impl<W: Write> FrameWriter<W> {
    /// A writer over `inner`. Each frame is one vectored write; wrap
    /// `inner` in a `BufWriter` only if many tiny frames go out at once.
    pub fn new(inner: W) -> Self {
        Self {
            inner,
            prefix: Vec::with_capacity(64),
        }
    }

    /// Writes one whole frame. A frame over the payload limit is refused
    /// before anything is written.
    pub fn write_frame(&mut self, frame: &Frame) -> Result<(), ChannelError> {
        self.prefix.clear();
        let data = frame.encode_parts(&mut self.prefix)?;
        let result = write_all_vectored(&mut self.inner, &self.prefix, data);
        if frame.tag().may_hold_secret() {
            self.prefix.zeroize();
        }
        Ok(result?)
    }

    /// Flushes the underlying stream.
    pub fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }

    /// The underlying stream.
    pub fn get_ref(&self) -> &W {
        &self.inner
    }

    /// The underlying stream, mutably.
    pub fn get_mut(&mut self) -> &mut W {
        &mut self.inner
    }
}

impl<W> Drop for FrameWriter<W> {
    fn drop(&mut self) {
        self.prefix.zeroize();
    }
}

fn write_all_vectored<W: Write>(w: &mut W, a: &[u8], b: &[u8]) -> io::Result<()> {
    let mut slices = [IoSlice::new(a), IoSlice::new(b)];
    let mut bufs: &mut [IoSlice<'_>] = &mut slices;
    IoSlice::advance_slices(&mut bufs, 0);
    while !bufs.is_empty() {
        match w.write_vectored(bufs) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => IoSlice::advance_slices(&mut bufs, n),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}
