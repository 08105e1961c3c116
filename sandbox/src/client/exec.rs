//! One exec on a session: the Exec (or ExecPty) frame, what the host sends
//! while it runs ([`Control`]: stdin, its end, signals, window sizes), and
//! what comes back ([`Event`]: output, the agent's errors, the end).
//!
//! [`ExecState`] is the one reading of the agent's frames during an exec,
//! shared by the blocking [`Output`] and the tokio
//! [`AsyncOutput`](super::AsyncOutput): Exit or TimedOut ends the exec; an
//! Error is handed over and remembered, and when the agent then closes
//! without an Exit the exec ends as [`Outcome::Refused`] with the first
//! one (docs/CHANNEL.md: "Exec of a missing program … → Error (no Exit), then
//! close"; the Errors a session survives, such as a Resize on a pipe exec,
//! are followed by more output and an Exit); a close with neither is
//! [`AgentError::Closed`]. File frames (the sandbox's `/results`, sent
//! after Exit) are skipped.
//!
//! This module never reads past the end of an exec, never sends an empty
//! Stdin frame except as the end of stdin, and never keeps output except
//! in [`Connection::capture`], within its caps.

use std::io;
use std::time::Duration;

use boxdesk_channel::{Exec, Frame, FrameReader, FrameWriter, SecretBytes, Stream, WinSize};

use super::{AgentError, Connection, Outcome, CONNECT_TIMEOUT};

/// Most stdout [`Connection::capture`] keeps (more is an error).
pub const CAPTURE_STDOUT_MAX: usize = 64 << 20;
/// Most stderr [`Connection::capture`] keeps (more is dropped).
pub const CAPTURE_STDERR_MAX: usize = 64 << 10;
/// Largest Stdin frame sent: longer input goes out in several.
const STDIN_FRAME_MAX: usize = boxdesk_channel::MAX_PAYLOAD as usize;

/// What the host sends a running exec.
#[derive(Debug)]
pub enum Control {
    /// Bytes for the command's stdin (nothing is sent for none: an empty
    /// Stdin frame would be the end of stdin).
    Stdin(SecretBytes),
    /// The end of stdin (on a PTY, VEOF).
    EndOfStdin,
    /// A signal for the command's process group.
    Signal(i32),
    /// The PTY's new size (an Error the session survives on a pipe exec).
    Resize(WinSize),
}

impl Control {
    /// The frames that carry this, in order.
    pub(super) fn frames(self) -> Vec<Frame> {
        match self {
            Control::Stdin(data) if data.len() <= STDIN_FRAME_MAX => {
                if data.is_empty() {
                    Vec::new()
                } else {
                    vec![Frame::Stdin(data)]
                }
            }
            Control::Stdin(data) => data
                .chunks(STDIN_FRAME_MAX)
                .map(|c| Frame::Stdin(SecretBytes::copy_from(c)))
                .collect(),
            Control::EndOfStdin => vec![Frame::Stdin(SecretBytes::default())],
            Control::Signal(sig) => vec![Frame::Signal(sig)],
            Control::Resize(size) => vec![Frame::Resize(size)],
        }
    }
}

/// What a running exec said.
#[derive(Debug, PartialEq, Eq)]
pub enum Event {
    /// Bytes the command wrote to stdout (all of its output on a PTY).
    Stdout(Vec<u8>),
    /// Bytes the command wrote to stderr.
    Stderr(Vec<u8>),
    /// The agent's Error frame (sanitised). The exec goes on until an
    /// [`Event::Ended`], which follows at once when the agent closes.
    Error(String),
    /// The exec is over; nothing more is read.
    Ended(Outcome),
}

/// The reading of an exec's frames both flavours share.
#[derive(Debug, Default)]
pub(super) struct ExecState {
    /// The first Error, which becomes the outcome if no Exit follows.
    error: Option<String>,
}

impl ExecState {
    /// What `frame` (`None`: the agent closed) means; `None` for a frame
    /// with nothing in it for the caller.
    pub(super) fn take(&mut self, frame: Option<Frame>) -> Result<Option<Event>, AgentError> {
        Ok(Some(match frame {
            Some(Frame::Stdout(d)) => Event::Stdout(d),
            Some(Frame::Stderr(d)) => Event::Stderr(d),
            Some(Frame::Exit(s)) => {
                Event::Ended(Outcome::from_status(s).ok_or(AgentError::BadStatus(s))?)
            }
            Some(Frame::TimedOut) => Event::Ended(Outcome::TimedOut),
            Some(Frame::Error(msg)) => {
                self.error.get_or_insert_with(|| msg.clone());
                Event::Error(msg)
            }
            Some(Frame::File { .. }) => return Ok(None),
            Some(other) => return Err(AgentError::Unexpected(other.tag())),
            None => match self.error.take() {
                Some(msg) => Event::Ended(Outcome::Refused(msg)),
                None => return Err(AgentError::Closed),
            },
        }))
    }
}

/// The receiving half of a blocking exec.
pub struct Output {
    frames: FrameReader<Stream>,
    state: ExecState,
    name: String,
    stall: Duration,
}

impl Output {
    /// The next event; blocks until the agent says something (or, after
    /// [`Output::stall_after`], fails once a frame has not arrived whole in
    /// that time). Not to be called after [`Event::Ended`].
    pub fn next_event(&mut self) -> Result<Event, AgentError> {
        loop {
            let frame = self
                .frames
                .read_frame()
                .map_err(|e| AgentError::of_channel(e, &self.name, self.stall))?;
            if let Some(event) = self.state.take(frame)? {
                return Ok(event);
            }
        }
    }

    /// Reads that wait longer than `after` fail as
    /// [`AgentError::Stalled`]: for a caller that polls the socket and
    /// reads only once a frame has begun (the agent writes frames whole).
    pub fn stall_after(&mut self, after: Duration) -> io::Result<()> {
        self.frames.get_ref().set_read_timeout(Some(after))?;
        self.stall = after;
        Ok(())
    }

    /// Bytes received but not yet made into events: when non-zero, the
    /// next [`Output::next_event`] may not need the socket.
    pub fn buffered(&self) -> usize {
        self.frames.buffered()
    }

    /// The socket, to poll for readability.
    pub fn stream(&self) -> &Stream {
        self.frames.get_ref()
    }
}

/// The sending half of a blocking exec (a thread of its own may own it,
/// e.g. behind a mutex shared with a stdin thread).
pub struct Input {
    frames: FrameWriter<Stream>,
    name: String,
}

impl Input {
    /// Sends `control`; blocks while the socket is full.
    pub fn send(&mut self, control: Control) -> Result<(), AgentError> {
        for frame in control.frames() {
            self.frames
                .write_frame(&frame)
                .map_err(|e| AgentError::of_channel(e, &self.name, CONNECT_TIMEOUT))?;
        }
        Ok(())
    }

    /// The socket, to poll for writability.
    pub fn stream(&self) -> &Stream {
        self.frames.get_ref()
    }
}

/// What [`Connection::capture`] collected.
#[derive(Debug)]
pub struct Captured {
    /// How the command ended (never [`Outcome::Refused`]: that is an error).
    pub outcome: Outcome,
    /// Its stdout, at most [`CAPTURE_STDOUT_MAX`].
    pub stdout: Vec<u8>,
    /// Its stderr, cut at [`CAPTURE_STDERR_MAX`].
    pub stderr: Vec<u8>,
}

impl Connection {
    /// Starts `exec`, on a PTY of size `pty` when given.
    pub fn exec(mut self, exec: Exec, pty: Option<WinSize>) -> Result<(Output, Input), AgentError> {
        let frame = match pty {
            Some(size) => Frame::ExecPty(exec, size),
            None => Frame::Exec(exec),
        };
        self.session.send(&frame).map_err(|e| self.channel(e))?;
        let (reader, writer) = self.session.into_split();
        let output = Output {
            frames: reader,
            state: ExecState::default(),
            name: self.name.clone(),
            stall: CONNECT_TIMEOUT,
        };
        let input = Input {
            frames: writer,
            name: self.name,
        };
        Ok((output, input))
    }

    /// Runs `exec` with no stdin and collects its output (bounded). A
    /// command the agent could not start is [`AgentError::Refused`].
    pub fn capture(self, exec: Exec) -> Result<Captured, AgentError> {
        let what = String::from_utf8_lossy(&exec.command).into_owned();
        let (mut output, mut input) = self.exec(exec, None)?;
        input.send(Control::EndOfStdin)?;
        let mut stdout = Vec::new();
        let mut stderr = Vec::new();
        loop {
            match output.next_event()? {
                Event::Stdout(d) => {
                    let size = stdout.len() + d.len();
                    if size > CAPTURE_STDOUT_MAX {
                        return Err(AgentError::TooLarge {
                            what: format!("the output of {what}"),
                            size: size as u64,
                            max: CAPTURE_STDOUT_MAX as u64,
                        });
                    }
                    stdout.extend_from_slice(&d);
                }
                Event::Stderr(d) => {
                    let room = CAPTURE_STDERR_MAX.saturating_sub(stderr.len());
                    stderr.extend_from_slice(&d[..d.len().min(room)]);
                }
                Event::Error(_) => {}
                Event::Ended(Outcome::Refused(msg)) => return Err(AgentError::Refused(msg)),
                Event::Ended(outcome) => {
                    return Ok(Captured {
                        outcome,
                        stdout,
                        stderr,
                    })
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn take(state: &mut ExecState, frame: Option<Frame>) -> Result<Option<Event>, AgentError> {
        state.take(frame)
    }

    #[test]
    fn an_error_then_a_close_ends_the_exec_as_refused_with_the_first_error() {
        let mut s = ExecState::default();
        let first = Frame::error("ENOENT: cannot run \"x\"");
        assert_eq!(
            take(&mut s, Some(first)).unwrap(),
            Some(Event::Error("ENOENT: cannot run \"x\"".into()))
        );
        take(&mut s, Some(Frame::error("EIO: later"))).unwrap();
        assert_eq!(
            take(&mut s, None).unwrap(),
            Some(Event::Ended(Outcome::Refused(
                "ENOENT: cannot run \"x\"".into()
            )))
        );
    }

    #[test]
    fn an_error_the_session_survives_gives_way_to_the_exit() {
        let mut s = ExecState::default();
        take(&mut s, Some(Frame::error("Resize on a pipe exec ignored"))).unwrap();
        assert_eq!(
            take(&mut s, Some(Frame::Exit(-9))).unwrap(),
            Some(Event::Ended(Outcome::Signaled(9)))
        );
    }

    #[test]
    fn a_close_with_no_exit_and_no_error_is_a_lost_session() {
        let mut s = ExecState::default();
        assert!(matches!(take(&mut s, None), Err(AgentError::Closed)));
    }

    #[test]
    fn a_nonsense_status_or_a_host_frame_is_a_protocol_error() {
        let mut s = ExecState::default();
        assert!(matches!(
            take(&mut s, Some(Frame::Exit(300))),
            Err(AgentError::BadStatus(300))
        ));
        assert!(matches!(
            take(&mut s, Some(Frame::Signal(9))),
            Err(AgentError::Unexpected(boxdesk_channel::Tag::Signal))
        ));
    }

    #[test]
    fn result_files_are_skipped_and_a_timeout_ends_the_exec() {
        let mut s = ExecState::default();
        let file = Frame::File {
            path: b"r".to_vec(),
            mode: 0o644,
            offset: 0,
            total_size: 0,
            data: Vec::new(),
        };
        assert_eq!(take(&mut s, Some(file)).unwrap(), None);
        assert_eq!(
            take(&mut s, Some(Frame::TimedOut)).unwrap(),
            Some(Event::Ended(Outcome::TimedOut))
        );
    }

    #[test]
    fn stdin_is_never_an_accidental_eof_and_long_input_is_split() {
        assert!(Control::Stdin(SecretBytes::default()).frames().is_empty());
        let eof = Control::EndOfStdin.frames();
        assert_eq!(eof, vec![Frame::Stdin(SecretBytes::default())]);
        let big = SecretBytes::new(vec![7; STDIN_FRAME_MAX * 2 + 1]);
        let frames = Control::Stdin(big).frames();
        let lens: Vec<usize> = frames
            .iter()
            .map(|f| match f {
                Frame::Stdin(d) => d.len(),
                _ => 0,
            })
            .collect();
        assert_eq!(lens, [STDIN_FRAME_MAX, STDIN_FRAME_MAX, 1]);
    }
}
