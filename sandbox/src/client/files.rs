//! Files through the agent: PutFile series out ([`Upload`]) and the File
//! frames answering a GetFile back in, reassembled ([`Incoming`], the one
//! reading both flavours share; [`Connection::get_file`] into a host file,
//! [`get_file_async`](super::get_file_async) into memory).
//!
//! A file coming back must arrive in order: its frames echo the requested
//! path, start at offset 0, follow each other without a gap or overlap,
//! keep one `total_size` and carry no byte past it; anything else is
//! [`AgentError::OutOfOrder`], and the session is out of step. Nothing is
//! allocated from the agent's sizes beyond the caller's limit.
//!
//! A file going out is PutFile frames of at most [`PUT_CHUNK`] bytes with
//! contiguous offsets. When its source fails in the middle, the series is
//! ended with a chunk at an impossible offset, so the agent discards the
//! partial file (docs/CHANNEL.md: a gap is an Error, the temporary file is
//! removed) rather than renaming half a file into place.

use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::thread::JoinHandle;

use boxdesk_channel::{Frame, FrameReader, FrameWriter, SecretBytes, Stream};

use super::{AgentError, Connection, CONNECT_TIMEOUT};

/// Bytes per PutFile frame.
pub const PUT_CHUNK: usize = 512 * 1024;

/// One piece of a file coming back.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Piece {
    /// Bytes of the file (possibly none); `last` once it is whole.
    Data {
        /// `st_mode & 0o7777` on the agent's side.
        mode: u32,
        /// The file's whole size, as announced (at most the limit).
        total: u64,
        /// This chunk.
        data: Vec<u8>,
        /// Whether the file is now whole.
        last: bool,
    },
    /// The agent refused the file (its Error frame), before its first
    /// chunk or (it failed to read on) after some; the session goes on.
    Refused(String),
}

/// The reassembly of one file answering a GetFile.
#[derive(Debug)]
pub(super) struct Incoming {
    requested: Vec<u8>,
    max: u64,
    got: u64,
    total: Option<u64>,
}

impl Incoming {
    /// A file `requested` (the path as sent) of at most `max` bytes.
    pub(super) fn new(requested: &[u8], max: u64) -> Incoming {
        Incoming {
            requested: requested.to_vec(),
            max,
            got: 0,
            total: None,
        }
    }

    /// What `frame` (`None`: the agent closed) adds to the file.
    pub(super) fn take(&mut self, frame: Option<Frame>) -> Result<Piece, AgentError> {
        match frame {
            Some(Frame::File {
                path,
                mode,
                offset,
                total_size,
                data,
            }) => {
                let end = self.got.checked_add(data.len() as u64);
                let in_order = path == self.requested
                    && offset == self.got
                    && self.total.is_none_or(|t| t == total_size)
                    && end.is_some_and(|end| end <= total_size);
                if !in_order {
                    return Err(AgentError::OutOfOrder);
                }
                if total_size > self.max {
                    return Err(AgentError::TooLarge {
                        what: String::from_utf8_lossy(&self.requested).into_owned(),
                        size: total_size,
                        max: self.max,
                    });
                }
                self.total = Some(total_size);
                self.got += data.len() as u64;
                Ok(Piece::Data {
                    mode,
                    total: total_size,
                    data,
                    last: self.got == total_size,
                })
            }
            Some(Frame::Error(msg)) => Ok(Piece::Refused(msg)),
            Some(other) => Err(AgentError::Unexpected(other.tag())),
            None => Err(AgentError::ClosedInFile),
        }
    }
}

/// How one file came back.
#[derive(Debug)]
pub enum Fetched {
    /// Whole, in the file `create` made, with the agent's permission bits.
    Copied,
    /// The agent refused it (its Error frame, sanitised).
    Refused(String),
    /// `create` refused (its message); the file's frames were read to their
    /// end, so the session is still in step.
    NotCreated(String),
    /// Writing it failed; the frames were read to their end.
    WriteFailed(io::Error),
}

impl Connection {
    /// Asks for `path` (as the sandbox sees it) and writes it into the file
    /// `create(mode & 0o777)` makes once the first frame arrived, setting
    /// those permission bits at the end. No size limit: the data goes to
    /// disk a frame at a time. The session stays usable for the next file
    /// whatever [`Fetched`] says; an `Err` ends it.
    pub fn get_file(
        &mut self,
        path: &[u8],
        create: impl FnOnce(u32) -> Result<File, String>,
    ) -> Result<Fetched, AgentError> {
        self.session
            .send(&Frame::GetFile(path.to_vec()))
            .map_err(|e| self.channel(e))?;
        let mut incoming = Incoming::new(path, u64::MAX);
        let mut create = Some(create);
        let mut out: Option<Result<File, Fetched>> = None;
        loop {
            let frame = self.session.recv().map_err(|e| self.channel(e))?;
            let (mode, data, last) = match incoming.take(frame)? {
                Piece::Refused(msg) => return Ok(Fetched::Refused(msg)),
                Piece::Data {
                    mode, data, last, ..
                } => (mode & 0o777, data, last),
            };
            let file = out.get_or_insert_with(|| match create.take() {
                Some(create) => create(mode).map_err(Fetched::NotCreated),
                None => Err(Fetched::NotCreated("created twice".into())),
            });
            if let Ok(f) = file {
                if let Err(e) = f.write_all(&data) {
                    out = Some(Err(Fetched::WriteFailed(e)));
                }
            }
            if last {
                return Ok(match out {
                    Some(Ok(f)) => match f.set_permissions(fs::Permissions::from_mode(mode)) {
                        Ok(()) => Fetched::Copied,
                        Err(e) => Fetched::WriteFailed(e),
                    },
                    Some(Err(why)) => why,
                    None => Fetched::Copied,
                });
            }
        }
    }

    /// Turns the session into an [`Upload`]: PutFile series go out on this
    /// thread while a thread of its own collects the agent's refusals, so
    /// neither side can stall the other.
    pub fn upload(self) -> Result<Upload, AgentError> {
        let name = self.name;
        let (reader, writer) = self.session.into_split();
        let errors = std::thread::Builder::new()
            .name("agent-errors".into())
            .spawn(move || collect_errors(reader))
            .map_err(AgentError::Source)?;
        Ok(Upload {
            writer,
            errors,
            name,
        })
    }
}

/// PutFile series on one session.
pub struct Upload {
    writer: FrameWriter<Stream>,
    errors: JoinHandle<Vec<String>>,
    name: String,
}

impl Upload {
    /// Sends `src` as `guest` with permission bits `mode` (the agent keeps
    /// `mode & 0o777`). [`AgentError::Source`] when reading `src` failed
    /// (the partial file is discarded; the session goes on); any other
    /// error ends the session.
    pub fn file(&mut self, guest: &[u8], mode: u32, src: &mut impl Read) -> Result<(), AgentError> {
        let mut buf = SecretBytes::new(vec![0u8; PUT_CHUNK]);
        let mut offset = 0u64;
        loop {
            let n = match read_full(src, &mut buf) {
                Ok(n) => n,
                Err(e) => {
                    if offset > 0 {
                        self.put(guest, mode, u64::MAX, SecretBytes::default())?;
                    }
                    return Err(AgentError::Source(e));
                }
            };
            if n == 0 && offset > 0 {
                return Ok(());
            }
            self.put(guest, mode, offset, SecretBytes::copy_from(&buf[..n]))?;
            offset += n as u64;
            if n < PUT_CHUNK {
                return Ok(());
            }
        }
    }

    fn put(
        &mut self,
        path: &[u8],
        mode: u32,
        offset: u64,
        data: SecretBytes,
    ) -> Result<(), AgentError> {
        let frame = Frame::PutFile {
            path: path.to_vec(),
            mode,
            offset,
            data,
        };
        self.writer
            .write_frame(&frame)
            .map_err(|e| AgentError::of_channel(e, &self.name, CONNECT_TIMEOUT))
    }

    /// Ends the session (the agent finishes the last series and closes)
    /// and returns the agent's refusals, in order: none means every file
    /// landed.
    pub fn finish(self) -> Vec<String> {
        let _ = self.writer.get_ref().shutdown(std::net::Shutdown::Write);
        self.errors
            .join()
            .unwrap_or_else(|_| vec!["the thread reading the agent's answers failed".into()])
    }
}

fn read_full(src: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut have = 0;
    while have < buf.len() {
        match src.read(&mut buf[have..]) {
            Ok(0) => break,
            Ok(n) => have += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(have)
}

fn collect_errors(mut reader: FrameReader<Stream>) -> Vec<String> {
    let mut errs = Vec::new();
    loop {
        match reader.read_frame() {
            Ok(Some(Frame::Error(m))) => errs.push(m),
            Ok(Some(_)) => {}
            Ok(None) => return errs,
            Err(e) => {
                errs.push(format!("session: {e}"));
                return errs;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(path: &[u8], offset: u64, total: u64, data: &[u8]) -> Option<Frame> {
        Some(Frame::File {
            path: path.to_vec(),
            mode: 0o640,
            offset,
            total_size: total,
            data: data.to_vec(),
        })
    }

    fn data(last: bool, total: u64, d: &[u8]) -> Piece {
        Piece::Data {
            mode: 0o640,
            total,
            data: d.to_vec(),
            last,
        }
    }

    #[test]
    fn chunks_in_order_reassemble_to_the_announced_size() {
        let mut f = Incoming::new(b"/a", 10);
        assert_eq!(
            f.take(file(b"/a", 0, 5, b"abc")).unwrap(),
            data(false, 5, b"abc")
        );
        assert_eq!(
            f.take(file(b"/a", 3, 5, b"de")).unwrap(),
            data(true, 5, b"de")
        );
    }

    #[test]
    fn an_empty_file_is_one_frame_with_no_data() {
        let mut f = Incoming::new(b"/e", 0);
        assert_eq!(f.take(file(b"/e", 0, 0, b"")).unwrap(), data(true, 0, b""));
    }

    #[test]
    fn a_gap_an_overlap_another_path_a_new_size_or_bytes_past_the_size_are_out_of_order() {
        let cases: [&[Option<Frame>]; 5] = [
            &[file(b"/a", 0, 4, b"ab"), file(b"/a", 3, 4, b"d")],
            &[file(b"/a", 0, 4, b"ab"), file(b"/a", 1, 4, b"bc")],
            &[file(b"/b", 0, 4, b"ab")],
            &[file(b"/a", 0, 4, b"ab"), file(b"/a", 2, 5, b"cd")],
            &[file(b"/a", 0, 2, b"abc")],
        ];
        for frames in cases {
            let mut f = Incoming::new(b"/a", 100);
            let last = frames.len() - 1;
            for (i, frame) in frames.iter().enumerate() {
                let r = f.take(frame.clone());
                if i == last {
                    assert!(matches!(r, Err(AgentError::OutOfOrder)), "{frames:?}");
                } else {
                    r.unwrap();
                }
            }
        }
    }

    #[test]
    fn a_file_over_the_limit_is_refused_from_its_announced_size() {
        let mut f = Incoming::new(b"/big", 10);
        let r = f.take(file(b"/big", 0, 1 << 40, b"x"));
        assert!(
            matches!(r, Err(AgentError::TooLarge { size, max: 10, .. }) if size == 1 << 40),
            "{r:?}"
        );
    }

    #[test]
    fn a_refusal_even_mid_file_goes_on_a_close_mid_file_does_not() {
        let mut f = Incoming::new(b"/a", 10);
        assert_eq!(
            f.take(Some(Frame::error("ENOENT: no"))).unwrap(),
            Piece::Refused("ENOENT: no".into())
        );
        let mut f = Incoming::new(b"/a", 10);
        f.take(file(b"/a", 0, 4, b"ab")).unwrap();
        assert!(matches!(f.take(None), Err(AgentError::ClosedInFile)));
        let mut f = Incoming::new(b"/a", 10);
        f.take(file(b"/a", 0, 4, b"ab")).unwrap();
        assert_eq!(
            f.take(Some(Frame::error("EIO: shrank"))).unwrap(),
            Piece::Refused("EIO: shrank".into())
        );
        assert!(matches!(
            f.take(Some(Frame::Exit(0))),
            Err(AgentError::Unexpected(_))
        ));
    }
}
