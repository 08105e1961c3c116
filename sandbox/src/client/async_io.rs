//! The tokio flavour of the client, for servers that run many sessions at
//! once (cowork): a handshaken `tokio::net::UnixStream` to an agent's own
//! socket, an exec's two halves, and a file read into memory. It reads
//! frames through the same [`ExecState`] and [`Incoming`] as the blocking
//! flavour, so the two mean the same by every frame.
//!
//! Only plain agent sockets are reached from here (cowork's sandboxes hand
//! their agent a socket cowork bound); a hybrid `CONNECT` socket is the
//! blocking [`connect`](super::connect)'s. Every future here is
//! cancel-safe between frames: dropping [`AsyncOutput::next_event`] loses no
//! frame (a half-sent [`AsyncInput::send`] leaves the session unusable).
//! It never gives a frame a meaning of its own: that is [`ExecState`]'s
//! and [`Incoming`]'s.

use std::path::Path;

use boxdesk_channel::codec::handshake;
use boxdesk_channel::{AgchCodec, Exec, Frame, WinSize};
use futures_util::{SinkExt, StreamExt};
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::UnixStream;
use tokio_util::codec::{Framed, FramedRead, FramedWrite};

use super::exec::ExecState;
use super::files::{Incoming, Piece};
use super::{AgentError, Control, Event, CONNECT_TIMEOUT};
use crate::conn::dial::is_timeout;
use crate::conn::dial::ClientError;

/// Connects to the agent socket `path` of sandbox `name` and does the
/// handshake, all within [`CONNECT_TIMEOUT`].
pub async fn connect_async(path: &Path, name: &str) -> Result<UnixStream, AgentError> {
    let stalled = || AgentError::Stalled {
        name: name.to_owned(),
        after: CONNECT_TIMEOUT,
    };
    let connect = async {
        let mut stream = UnixStream::connect(path).await.map_err(|source| {
            if is_timeout(&source) {
                return stalled();
            }
            match source.kind() {
                std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused => {
                    ClientError::NoSuchSandbox(name.to_owned()).into()
                }
                _ => ClientError::Connect {
                    name: name.to_owned(),
                    source,
                }
                .into(),
            }
        })?;
        handshake(&mut stream)
            .await
            .map_err(|source| AgentError::Handshake {
                name: name.to_owned(),
                source,
            })?;
        Ok(stream)
    };
    tokio::time::timeout(CONNECT_TIMEOUT, connect)
        .await
        .unwrap_or_else(|_| Err(stalled()))
}

/// The receiving half of an async exec.
pub struct AsyncOutput {
    frames: FramedRead<OwnedReadHalf, AgchCodec>,
    state: ExecState,
}

impl AsyncOutput {
    /// The next event. Not to be called after [`Event::Ended`].
    pub async fn next_event(&mut self) -> Result<Event, AgentError> {
        loop {
            let frame = self.frames.next().await.transpose()?;
            if let Some(event) = self.state.take(frame)? {
                return Ok(event);
            }
        }
    }
}

/// The sending half of an async exec.
pub struct AsyncInput {
    frames: FramedWrite<OwnedWriteHalf, AgchCodec>,
}

impl AsyncInput {
    /// Sends `control`, waiting while the socket is full.
    pub async fn send(&mut self, control: Control) -> Result<(), AgentError> {
        for frame in control.frames() {
            self.frames.send(frame).await?;
        }
        Ok(())
    }
}

/// Starts `exec` (on a PTY of size `pty` when given) on `stream`, an agent
/// session already handshaken ([`connect_async`]).
pub async fn exec_async(
    stream: UnixStream,
    exec: Exec,
    pty: Option<WinSize>,
) -> Result<(AsyncOutput, AsyncInput), AgentError> {
    let (rd, wr) = stream.into_split();
    let mut input = AsyncInput {
        frames: FramedWrite::new(wr, AgchCodec),
    };
    let frame = match pty {
        Some(size) => Frame::ExecPty(exec, size),
        None => Frame::Exec(exec),
    };
    input.frames.send(frame).await?;
    let output = AsyncOutput {
        frames: FramedRead::new(rd, AgchCodec),
        state: ExecState::default(),
    };
    Ok((output, input))
}

/// Reads `path` (as the sandbox sees it) on `stream`, an agent session
/// already handshaken, into memory: at most `max` bytes, refused from the
/// announced size before anything is allocated. The agent's refusal is
/// [`AgentError::Refused`].
pub async fn get_file_async(
    stream: UnixStream,
    path: &[u8],
    max: u64,
) -> Result<Vec<u8>, AgentError> {
    let mut frames = Framed::new(stream, AgchCodec);
    frames.send(Frame::GetFile(path.to_vec())).await?;
    let mut incoming = Incoming::new(path, max);
    let mut out: Vec<u8> = Vec::new();
    loop {
        let frame = frames.next().await.transpose()?;
        match incoming.take(frame)? {
            Piece::Refused(msg) => return Err(AgentError::Refused(msg)),
            Piece::Data {
                total, data, last, ..
            } => {
                if out.is_empty() {
                    // `total` is at most `max`: `Incoming` checked it.
                    out.reserve_exact(usize::try_from(total).unwrap_or(0));
                }
                out.extend_from_slice(&data);
                if last {
                    return Ok(out);
                }
            }
        }
    }
}
