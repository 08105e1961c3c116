//! Frames: the [`Tag`]s of docs/CHANNEL.md, the typed [`Frame`] enum and the one
//! decoder core every reader shares.
//!
//! Decoding is two steps so that no reader allocates before it knows the
//! frame is acceptable: [`FrameHeader::parse`] checks the tag and the length
//! against [`MAX_PAYLOAD`](crate::MAX_PAYLOAD) from the 5 header bytes alone;
//! only then does the reader collect `len` bytes and hand them to
//! [`Frame::decode_payload`]. Encoding splits a frame into a small prefix
//! (header and fields) and its trailing data, so large data is written with
//! one vectored write and never copied.

use crate::sanitize::{sanitize_error, sanitize_error_bytes};
use crate::secret::SecretBytes;
use crate::wire::{put_bytes, put_u32, Cursor};
use crate::MAX_PAYLOAD;

/// A malformed frame.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// The tag byte names no frame of protocol version 3.
    #[error("unknown frame tag {0}")]
    UnknownTag(u8),
    /// The length field is over [`MAX_PAYLOAD`](crate::MAX_PAYLOAD); nothing
    /// was allocated for it.
    #[error("frame tag {tag} declares {len} bytes, over the 1 MiB limit")]
    TooLarge {
        /// The frame's tag byte.
        tag: u8,
        /// The declared (or, when encoding, the needed) payload length.
        len: u64,
    },
    /// A field runs past the end of the payload.
    #[error("frame payload ends inside its {0} field")]
    Truncated(&'static str),
    /// The payload goes on after its last field.
    #[error("frame tag {tag} has {extra} bytes after its last field")]
    TrailingBytes {
        /// The frame's tag byte.
        tag: u8,
        /// How many bytes were left over.
        extra: usize,
    },
}

/// The frame discriminants of docs/CHANNEL.md.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Tag {
    /// Host → guest: run a command on pipes.
    Exec = 1,
    /// Guest → host: stdout bytes.
    Stdout = 2,
    /// Guest → host: stderr bytes.
    Stderr = 3,
    /// Guest → host: the exit status.
    Exit = 4,
    /// Guest → host: a sanitised error message.
    Error = 5,
    /// Host → guest: a chunk of a file to write.
    PutFile = 6,
    /// Guest → host: a chunk of a file read back.
    File = 7,
    /// Guest → host: the exec's deadline passed.
    TimedOut = 8,
    /// Host → guest: run a command on a PTY.
    ExecPty = 9,
    /// Host → guest: stdin bytes; empty means EOF.
    Stdin = 10,
    /// Host → guest: new PTY size.
    Resize = 11,
    /// Host → guest: a signal for the process group.
    Signal = 12,
    /// Host → guest: read a file back.
    GetFile = 13,
    /// Host → guest: power off (VM) or exit (namespace backend).
    Shutdown = 14,
}

impl TryFrom<u8> for Tag {
    type Error = FrameError;

    fn try_from(b: u8) -> Result<Self, FrameError> {
        Ok(match b {
            1 => Tag::Exec,
            2 => Tag::Stdout,
            3 => Tag::Stderr,
            4 => Tag::Exit,
            5 => Tag::Error,
            6 => Tag::PutFile,
            7 => Tag::File,
            8 => Tag::TimedOut,
            9 => Tag::ExecPty,
            10 => Tag::Stdin,
            11 => Tag::Resize,
            12 => Tag::Signal,
            13 => Tag::GetFile,
            14 => Tag::Shutdown,
            other => return Err(FrameError::UnknownTag(other)),
        })
    }
}

impl Tag {
    /// True for frames whose payload may hold a secret (env values, file
    /// data, typed input): their buffers are wiped once decoded.
    pub fn may_hold_secret(self) -> bool {
        matches!(self, Tag::Exec | Tag::ExecPty | Tag::PutFile | Tag::Stdin)
    }
}

/// The 5 bytes in front of every payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameHeader {
    /// What the payload is.
    pub tag: Tag,
    /// Payload length, at most [`MAX_PAYLOAD`].
    pub len: u32,
}

impl FrameHeader {
    /// Encoded size: tag byte + `u32` length.
    pub const LEN: usize = 5;

    /// Checks a header before anything is allocated for its payload: an
    /// unknown tag or a length over [`MAX_PAYLOAD`] is an error.
    pub fn parse(b: [u8; Self::LEN]) -> Result<Self, FrameError> {
        let tag = Tag::try_from(b[0])?;
        let len = u32::from_le_bytes([b[1], b[2], b[3], b[4]]);
        if len > MAX_PAYLOAD {
            return Err(FrameError::TooLarge {
                tag: b[0],
                len: len.into(),
            });
        }
        Ok(Self { tag, len })
    }

    /// The header's wire bytes.
    pub fn to_bytes(self) -> [u8; Self::LEN] {
        let l = self.len.to_le_bytes();
        [self.tag as u8, l[0], l[1], l[2], l[3]]
    }
}

/// PTY window size.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WinSize {
    /// Columns.
    pub cols: u16,
    /// Rows.
    pub rows: u16,
}

/// What to run: the fields shared by Exec and ExecPty. All strings are OS
/// bytes, not necessarily UTF-8.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Exec {
    /// argv\[0\], looked up in the exec environment's `PATH`.
    pub command: Vec<u8>,
    /// argv\[1..\].
    pub args: Vec<Vec<u8>>,
    /// Working directory; empty means `/`.
    pub cwd: Vec<u8>,
    /// Environment over the agent's fixed defaults. Values may be secret.
    pub env: Vec<(Vec<u8>, SecretBytes)>,
    /// Deadline in milliseconds after the start; 0 means none.
    pub timeout_ms: u32,
    /// [`Exec::ISOLATE`] and future bits; 0 is sent as nothing at all, so
    /// an agent that predates the field reads every exec without one.
    pub flags: u32,
}

impl Exec {
    /// The exec runs in a Landlock domain of its own, nested in the
    /// agent's: it and its descendants cannot read (`/proc/PID/environ`,
    /// `mem`…) or trace another exec's processes on any Landlock kernel,
    /// nor signal them or reach their abstract sockets from Linux 6.12
    /// (ABI 6). cowork sets it for every spawn, so sessions of one profile
    /// are sealed from each other.
    pub const ISOLATE: u32 = 1;
    /// The flag bits this version knows; an exec with another is refused.
    pub const KNOWN_FLAGS: u32 = Self::ISOLATE;

    /// An exec of `command` with `args`, no env, cwd `/`, no deadline.
    pub fn new<I, A>(command: impl Into<Vec<u8>>, args: I) -> Self
    where
        I: IntoIterator<Item = A>,
        A: Into<Vec<u8>>,
    {
        Self {
            command: command.into(),
            args: args.into_iter().map(Into::into).collect(),
            ..Self::default()
        }
    }

    fn encode(&self, out: &mut Vec<u8>) {
        put_bytes(out, &self.command);
        put_u32(out, self.args.len() as u32);
        for a in &self.args {
            put_bytes(out, a);
        }
        put_bytes(out, &self.cwd);
        put_u32(out, self.env.len() as u32);
        for (k, v) in &self.env {
            put_bytes(out, k);
            put_bytes(out, v);
        }
        put_u32(out, self.timeout_ms);
    }

    fn decode(c: &mut Cursor<'_>) -> Result<Self, FrameError> {
        let command = c.bytes("command")?.to_vec();
        let n = c.count(4, "args")?;
        let mut args = Vec::with_capacity(n);
        for _ in 0..n {
            args.push(c.bytes("args")?.to_vec());
        }
        let cwd = c.bytes("cwd")?.to_vec();
        let n = c.count(8, "env")?;
        let mut env = Vec::with_capacity(n);
        for _ in 0..n {
            let k = c.bytes("env key")?.to_vec();
            let v = SecretBytes::copy_from(c.bytes("env value")?);
            env.push((k, v));
        }
        let timeout_ms = c.u32("timeout_ms")?;
        Ok(Self {
            command,
            args,
            cwd,
            env,
            timeout_ms,
            flags: 0,
        })
    }

    /// The optional last field of Exec and ExecPty: `u32 flags` when any
    /// bit is set.
    fn put_flags(&self, out: &mut Vec<u8>) {
        if self.flags != 0 {
            put_u32(out, self.flags);
        }
    }

    fn take_flags(&mut self, c: &mut Cursor<'_>) -> Result<(), FrameError> {
        if c.remaining() > 0 {
            self.flags = c.u32("flags")?;
        }
        Ok(())
    }
}

/// One frame of docs/CHANNEL.md.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame {
    /// Tag 1: run a command with pipes.
    Exec(Exec),
    /// Tag 2: output bytes from stdout (or the PTY).
    Stdout(Vec<u8>),
    /// Tag 3: output bytes from stderr.
    Stderr(Vec<u8>),
    /// Tag 4: exit status 0–255, or −N when killed by signal N.
    Exit(i32),
    /// Tag 5: an error message; sanitised when encoded and when decoded.
    Error(String),
    /// Tag 6: a chunk of a file to write beneath the agent's root.
    PutFile {
        /// Target path (OS bytes).
        path: Vec<u8>,
        /// Permission bits.
        mode: u32,
        /// Where this chunk starts; 0 starts the file.
        offset: u64,
        /// The chunk.
        data: SecretBytes,
    },
    /// Tag 7: a chunk of a file read back (`/results` or GetFile).
    File {
        /// Path, relative to `/results` or as requested by GetFile.
        path: Vec<u8>,
        /// `st_mode & 0o7777`.
        mode: u32,
        /// Where this chunk starts.
        offset: u64,
        /// Size of the whole file.
        total_size: u64,
        /// The chunk.
        data: Vec<u8>,
    },
    /// Tag 8: the deadline passed; the process group was killed.
    TimedOut,
    /// Tag 9: run a command on a PTY of the given size.
    ExecPty(Exec, WinSize),
    /// Tag 10: stdin bytes; empty is EOF.
    Stdin(SecretBytes),
    /// Tag 11: the PTY's new size.
    Resize(WinSize),
    /// Tag 12: a signal number for the process group.
    Signal(i32),
    /// Tag 13: read a file back as File frames.
    GetFile(Vec<u8>),
    /// Tag 14: power off the guest, or end the namespace agent.
    Shutdown,
}

impl Frame {
    /// An Error frame carrying `msg`, sanitised.
    pub fn error(msg: impl AsRef<str>) -> Self {
        Frame::Error(sanitize_error(msg.as_ref()).into_owned())
    }

    /// This frame's tag.
    pub fn tag(&self) -> Tag {
        match self {
            Frame::Exec(_) => Tag::Exec,
            Frame::Stdout(_) => Tag::Stdout,
            Frame::Stderr(_) => Tag::Stderr,
            Frame::Exit(_) => Tag::Exit,
            Frame::Error(_) => Tag::Error,
            Frame::PutFile { .. } => Tag::PutFile,
            Frame::File { .. } => Tag::File,
            Frame::TimedOut => Tag::TimedOut,
            Frame::ExecPty(..) => Tag::ExecPty,
            Frame::Stdin(_) => Tag::Stdin,
            Frame::Resize(_) => Tag::Resize,
            Frame::Signal(_) => Tag::Signal,
            Frame::GetFile(_) => Tag::GetFile,
            Frame::Shutdown => Tag::Shutdown,
        }
    }

    /// Appends the frame's header and fixed fields to `prefix` and returns
    /// its trailing data, so `prefix ++ data` is the whole frame. Fails when
    /// the payload would be over [`MAX_PAYLOAD`]. Error text is sanitised
    /// here, so no unsanitised message reaches the wire.
    pub fn encode_parts<'a>(&'a self, prefix: &mut Vec<u8>) -> Result<&'a [u8], FrameError> {
        let start = prefix.len();
        prefix.extend_from_slice(&[self.tag() as u8, 0, 0, 0, 0]);
        let data: &[u8] = match self {
            Frame::Stdout(d) | Frame::Stderr(d) => d,
            Frame::Stdin(d) => d,
            Frame::Exit(v) | Frame::Signal(v) => {
                prefix.extend_from_slice(&v.to_le_bytes());
                &[]
            }
            Frame::Error(msg) => match sanitize_error(msg) {
                std::borrow::Cow::Borrowed(clean) => clean.as_bytes(),
                std::borrow::Cow::Owned(clean) => {
                    prefix.extend_from_slice(clean.as_bytes());
                    &[]
                }
            },
            Frame::Exec(exec) => {
                exec.encode(prefix);
                exec.put_flags(prefix);
                &[]
            }
            Frame::ExecPty(exec, size) => {
                exec.encode(prefix);
                put_winsize(prefix, *size);
                exec.put_flags(prefix);
                &[]
            }
            Frame::Resize(size) => {
                put_winsize(prefix, *size);
                &[]
            }
            Frame::PutFile {
                path,
                mode,
                offset,
                data,
            } => {
                put_bytes(prefix, path);
                put_u32(prefix, *mode);
                prefix.extend_from_slice(&offset.to_le_bytes());
                data
            }
            Frame::File {
                path,
                mode,
                offset,
                total_size,
                data,
            } => {
                put_bytes(prefix, path);
                put_u32(prefix, *mode);
                prefix.extend_from_slice(&offset.to_le_bytes());
                prefix.extend_from_slice(&total_size.to_le_bytes());
                data
            }
            Frame::GetFile(path) => {
                put_bytes(prefix, path);
                &[]
            }
            Frame::TimedOut | Frame::Shutdown => &[],
        };
        let len = (prefix.len() - start - FrameHeader::LEN) as u64 + data.len() as u64;
        if len > u64::from(MAX_PAYLOAD) {
            prefix.truncate(start);
            return Err(FrameError::TooLarge {
                tag: self.tag() as u8,
                len,
            });
        }
        prefix[start + 1..start + FrameHeader::LEN].copy_from_slice(&(len as u32).to_le_bytes());
        Ok(data)
    }

    /// Appends the whole encoded frame to `out`.
    pub fn encode(&self, out: &mut Vec<u8>) -> Result<(), FrameError> {
        let data = self.encode_parts(out)?;
        // `data` borrows `self`, not `out`, so this copy is sound; it is the
        // one copy a caller who wants a single buffer asks for.
        out.extend_from_slice(data);
        Ok(())
    }

    /// The decoder core: builds a frame from a payload whose header
    /// [`FrameHeader::parse`] accepted. Takes the buffer so output data is
    /// moved, not copied; buffers of frames that may hold secrets are wiped
    /// when this returns.
    pub fn decode_payload(tag: Tag, payload: Vec<u8>) -> Result<Frame, FrameError> {
        match tag {
            Tag::Stdout => Ok(Frame::Stdout(payload)),
            Tag::Stderr => Ok(Frame::Stderr(payload)),
            Tag::Stdin => Ok(Frame::Stdin(SecretBytes::new(payload))),
            Tag::Error => Ok(Frame::Error(sanitize_error_bytes(&payload).into_owned())),
            _ => decode_fields(tag, &SecretBytes::new(payload)),
        }
    }
}

/// Decodes a payload made of fields; `payload` is wiped by the caller.
fn decode_fields(tag: Tag, payload: &[u8]) -> Result<Frame, FrameError> {
    let mut c = Cursor::new(payload);
    let frame = match tag {
        Tag::Exit => Frame::Exit(c.i32("exit status")?),
        Tag::Signal => Frame::Signal(c.i32("signal")?),
        Tag::TimedOut => Frame::TimedOut,
        Tag::Shutdown => Frame::Shutdown,
        Tag::Exec => {
            let mut exec = Exec::decode(&mut c)?;
            exec.take_flags(&mut c)?;
            Frame::Exec(exec)
        }
        Tag::ExecPty => {
            let mut exec = Exec::decode(&mut c)?;
            let size = winsize(&mut c)?;
            exec.take_flags(&mut c)?;
            Frame::ExecPty(exec, size)
        }
        Tag::Resize => Frame::Resize(winsize(&mut c)?),
        Tag::GetFile => Frame::GetFile(c.bytes("path")?.to_vec()),
        Tag::PutFile => Frame::PutFile {
            path: c.bytes("path")?.to_vec(),
            mode: c.u32("mode")?,
            offset: c.u64("offset")?,
            data: SecretBytes::copy_from(c.rest()),
        },
        Tag::File => Frame::File {
            path: c.bytes("path")?.to_vec(),
            mode: c.u32("mode")?,
            offset: c.u64("offset")?,
            total_size: c.u64("total_size")?,
            data: c.rest().to_vec(),
        },
        // Raw-data frames are decoded without a copy by `decode_payload`;
        // this arm keeps the match total.
        Tag::Stdout | Tag::Stderr | Tag::Stdin | Tag::Error => {
            return Frame::decode_payload(tag, c.rest().to_vec())
        }
    };
    c.finish(tag as u8)?;
    Ok(frame)
}

fn put_winsize(out: &mut Vec<u8>, s: WinSize) {
    out.extend_from_slice(&s.cols.to_le_bytes());
    out.extend_from_slice(&s.rows.to_le_bytes());
}

fn winsize(c: &mut Cursor<'_>) -> Result<WinSize, FrameError> {
    Ok(WinSize {
        cols: c.u16("cols")?,
        rows: c.u16("rows")?,
    })
}

/// Outcome of [`decode_slice`].
#[derive(Debug, PartialEq, Eq)]
pub enum Decoded {
    /// A whole frame and how many bytes of the input it used.
    Frame(Frame, usize),
    /// The input holds only part of a frame: at least this many bytes in
    /// all are needed (already checked against [`MAX_PAYLOAD`]).
    NeedMore(usize),
}

/// Decodes the first frame of `src` if it is complete. The header is
/// checked first, so an oversized or unknown frame fails before its
/// payload is awaited or allocated.
pub fn decode_slice(src: &[u8]) -> Result<Decoded, FrameError> {
    let Some(head) = src.first_chunk::<{ FrameHeader::LEN }>() else {
        return Ok(Decoded::NeedMore(FrameHeader::LEN));
    };
    let header = FrameHeader::parse(*head)?;
    let total = FrameHeader::LEN + header.len as usize;
    match src.get(FrameHeader::LEN..total) {
        Some(payload) => {
            let frame = Frame::decode_payload(header.tag, payload.to_vec())?;
            Ok(Decoded::Frame(frame, total))
        }
        None => Ok(Decoded::NeedMore(total)),
    }
}
