//! The child's stdin during an exec: Stdin frames queue bytes, an empty
//! Stdin frame is end-of-file (close the pipe; on a PTY, write the VEOF
//! character), and the queue drains as fast as the child reads.
//!
//! Owns the queued bytes (wiped when written or dropped: they may be a
//! typed password) and the EOF state. It must never block, and never hold
//! more than [`Stdin::FULL`] bytes plus one frame: when the queue is full
//! the session stops reading the socket until it drains.

use std::collections::VecDeque;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use boxdesk_channel::SecretBytes;

use crate::fdio;

/// What writing to the child's stdin came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Feed {
    /// Bytes were written or nothing was queued.
    Ok,
    /// The child closed its stdin (EPIPE); further input is dropped.
    Gone,
}

/// Why stdin data was refused.
#[derive(Debug, thiserror::Error)]
pub enum StdinError {
    /// Data arrived after the host's EOF; it is ignored.
    #[error("stdin data after stdin EOF ignored")]
    AfterEof,
}

/// Where the bytes go: the stdin pipe (closed at EOF) or the PTY master
/// (owned by the exec, which also reads output from it).
enum Sink {
    Pipe(Option<OwnedFd>),
    Pty,
}

/// Queued stdin for one child.
pub struct Stdin {
    sink: Sink,
    queue: VecDeque<SecretBytes>,
    /// Bytes of `queue[0]` already written.
    written: usize,
    queued: usize,
    /// The host sent EOF (it may still be queued behind data).
    eof: bool,
    /// The VEOF byte to write on a PTY at EOF.
    veof: Option<u8>,
    /// The child will get no more input.
    done: bool,
}

impl Stdin {
    /// Bytes queued beyond which the session stops reading the socket.
    pub const FULL: usize = 1 << 20;

    /// Stdin over a pipe's write end.
    pub fn pipe(fd: OwnedFd) -> Stdin {
        Stdin::new(Sink::Pipe(Some(fd)))
    }

    /// Stdin into a PTY master the caller owns.
    pub fn pty() -> Stdin {
        Stdin::new(Sink::Pty)
    }

    fn new(sink: Sink) -> Stdin {
        Stdin {
            sink,
            queue: VecDeque::new(),
            written: 0,
            queued: 0,
            eof: false,
            veof: None,
            done: false,
        }
    }

    /// Takes one Stdin frame's bytes; an empty one is EOF. `veof` is the
    /// PTY's end-of-file character, read when the EOF arrives.
    pub fn push(&mut self, data: SecretBytes, veof: impl FnOnce() -> u8) -> Result<(), StdinError> {
        if self.eof {
            return Err(StdinError::AfterEof);
        }
        if self.done {
            return Ok(());
        }
        if data.is_empty() {
            self.eof = true;
            if matches!(self.sink, Sink::Pty) {
                let v = veof();
                self.veof = Some(v);
                self.queued += 1;
                self.queue.push_back(SecretBytes::new(vec![v]));
            }
            return Ok(());
        }
        self.queued += data.len();
        self.queue.push_back(data);
        Ok(())
    }

    /// True when the socket should not be read until stdin drains.
    pub fn is_full(&self) -> bool {
        self.queued >= Self::FULL
    }

    /// True when bytes (or a pipe close) are waiting for the child.
    pub fn wants_write(&self) -> bool {
        !self.done && (self.queued > 0 || (self.eof && matches!(self.sink, Sink::Pipe(Some(_)))))
    }

    /// The pipe to poll for writability (`None` on a PTY: poll the master).
    pub fn pipe_fd(&self) -> Option<BorrowedFd<'_>> {
        match &self.sink {
            Sink::Pipe(Some(fd)) => Some(fd.as_fd()),
            _ => None,
        }
    }

    /// Writes queued bytes until the target would block; `pty` is the
    /// master when the sink is a PTY.
    pub fn feed(&mut self, pty: Option<BorrowedFd<'_>>) -> io::Result<Feed> {
        loop {
            let target = match (&self.sink, pty) {
                (Sink::Pipe(Some(fd)), _) => fd.as_fd(),
                (Sink::Pty, Some(m)) => m,
                _ => return Ok(Feed::Ok),
            };
            let Some(chunk) = self.queue.front() else {
                if self.eof {
                    self.finish();
                }
                return Ok(Feed::Ok);
            };
            match fdio::write(target, &chunk[self.written..]) {
                Ok(n) => {
                    self.written += n;
                    self.queued -= n;
                    if self.written == chunk.len() {
                        self.queue.pop_front();
                        self.written = 0;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(Feed::Ok),
                Err(e) if matches!(e.raw_os_error(), Some(libc::EPIPE) | Some(libc::EIO)) => {
                    self.finish();
                    return Ok(Feed::Gone);
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// No more input: drop the queue (wiped on drop) and close the pipe.
    pub fn finish(&mut self) {
        self.done = true;
        self.queue.clear();
        self.queued = 0;
        self.written = 0;
        if let Sink::Pipe(fd) = &mut self.sink {
            fd.take();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_empty_frame_closes_the_pipe_after_the_queued_bytes() {
        let (r, w) = fdio::pipe().unwrap();
        let mut s = Stdin::pipe(w);
        s.push("abc".into(), || 4).unwrap();
        s.push(SecretBytes::default(), || 4).unwrap();
        assert!(s.wants_write());
        assert_eq!(s.feed(None).unwrap(), Feed::Ok);
        assert!(!s.wants_write());
        let mut buf = [0u8; 8];
        assert_eq!(fdio::read(r.as_fd(), &mut buf).unwrap(), 3);
        assert_eq!(fdio::read(r.as_fd(), &mut buf).unwrap(), 0, "pipe closed");
        assert!(matches!(
            s.push("late".into(), || 4),
            Err(StdinError::AfterEof)
        ));
    }

    #[test]
    fn eof_on_a_pty_queues_the_veof_byte() {
        let (r, w) = fdio::pipe().unwrap();
        let mut s = Stdin::pty();
        s.push(SecretBytes::default(), || 0x04).unwrap();
        s.feed(Some(w.as_fd())).unwrap();
        let mut buf = [0u8; 8];
        assert_eq!(fdio::read(r.as_fd(), &mut buf).unwrap(), 1);
        assert_eq!(buf[0], 0x04);
    }

    #[test]
    fn a_child_that_closed_stdin_makes_further_input_vanish() {
        let (r, w) = fdio::pipe().unwrap();
        drop(r);
        let mut s = Stdin::pipe(w);
        s.push("x".into(), || 4).unwrap();
        assert_eq!(s.feed(None).unwrap(), Feed::Gone);
        s.push("y".into(), || 4).unwrap();
        assert!(!s.wants_write());
    }
}
