//! The host side of the agent protocol (docs/CHANNEL.md), once, for the CLI and
//! for cowork: getting through to a sandbox's agent, one exec with its
//! input and output, PutFile and GetFile series, and how an exec's end
//! becomes an exit status ([`status`]).
//!
//! * Blocking ([`connect`] → [`Connection`]): what `boxdesk exec`, `cp` and
//!   `run` use. A plain exec starts no thread pool and no async runtime:
//!   the connect, the hybrid `CONNECT` line and the handshake, then frames.
//! * tokio ([`connect_async`], [`exec_async`], [`get_file_async`]): what
//!   cowork's server uses, on a handshaken `tokio::net::UnixStream`.
//!
//! Both flavours read frames through the same state machines (the exec's
//! [`Event`]s, a file's reassembly), so they cannot disagree about what a
//! frame means. Getting through is bounded: the connect, the preamble and
//! the handshake take at most [`CONNECT_TIMEOUT`] on a hybrid socket (a
//! peer too slow is [`AgentError::Stalled`], naming the sandbox).
//!
//! This module must never decide what a front end prints or shows (it
//! hands over output, errors and an [`Outcome`]), never buffer an exec's
//! output beyond one frame (except [`Connection::capture`], bounded), and
//! never allocate for a file more than the caller allowed.

mod async_io;
mod exec;
mod files;
pub mod status;

use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use boxdesk_channel::{ChannelError, Session, Tag};

pub use crate::conn::dial::CONNECT_TIMEOUT;
pub use async_io::{connect_async, exec_async, get_file_async, AsyncInput, AsyncOutput};
pub use exec::{Captured, Control, Event, Input, Output, CAPTURE_STDERR_MAX, CAPTURE_STDOUT_MAX};
pub use files::{Fetched, Upload, PUT_CHUNK};
pub use status::{Outcome, EXIT_BOXDESK, EXIT_CANNOT_RUN, EXIT_NOT_FOUND, EXIT_TIMEOUT};

use crate::conn::dial::ClientError;
use crate::conn::dial::{connect_socket, is_timeout};

/// Why talking to an agent failed. Each is boxdesk failing, not the
/// command: a front end exits [`EXIT_BOXDESK`] for any of them.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// The sandbox's socket could not be connected to (no such sandbox,
    /// a listener that never accepts, a refusal).
    #[error(transparent)]
    Connect(#[from] ClientError),
    /// The agent (or what listens in its place) did not answer in time:
    /// while getting through, or in the middle of a frame.
    #[error("sandbox {name} did not answer on its agent socket within {} s (a wedged helper, or something else listening there)", .after.as_secs())]
    Stalled {
        /// The sandbox.
        name: String,
        /// How long it was given.
        after: Duration,
    },
    /// The preamble or the handshake failed (not an agent, a refusal).
    #[error("cannot reach the agent of sandbox {name}")]
    Handshake {
        /// The sandbox.
        name: String,
        /// What went wrong.
        #[source]
        source: ChannelError,
    },
    /// The session failed after the handshake.
    #[error(transparent)]
    Channel(#[from] ChannelError),
    /// The agent closed the session before the exec ended (no Exit, no
    /// TimedOut, no Error).
    #[error("the sandbox closed the session before the command exited")]
    Closed,
    /// The agent closed the session in the middle of a file.
    #[error("the sandbox closed the session in the middle of a file")]
    ClosedInFile,
    /// The agent sent a frame that has no place here.
    #[error("unexpected {0:?} frame from the agent")]
    Unexpected(Tag),
    /// An Exit frame carried a status no process can have.
    #[error("the agent sent exit status {0}, which no process can have")]
    BadStatus(i32),
    /// File frames did not follow each other (path, offset or size).
    #[error("the agent sent a file frame out of order")]
    OutOfOrder,
    /// A file or an output is larger than the caller allowed.
    #[error("{what} is {size} bytes, over the {max}-byte limit")]
    TooLarge {
        /// What was too large.
        what: String,
        /// Its size (or the size reached).
        size: u64,
        /// The limit.
        max: u64,
    },
    /// The agent refused (its Error frame, sanitised).
    #[error("{0}")]
    Refused(String),
    /// Reading what was to be sent failed (a PutFile's source).
    #[error("reading the source")]
    Source(#[source] io::Error),
}

impl AgentError {
    /// A transport error of sandbox `name`'s session: a socket timeout is
    /// the peer stalling for `after`.
    fn of_channel(e: ChannelError, name: &str, after: Duration) -> AgentError {
        match e {
            ChannelError::Io(io) if is_timeout(&io) => AgentError::Stalled {
                name: name.to_owned(),
                after,
            },
            e => AgentError::Channel(e),
        }
    }
}

/// Where a sandbox's agent listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Endpoint {
    /// The agent's own Unix socket: the AGCH stream starts at once.
    Unix(PathBuf),
    /// A hybrid vsock socket (`<name>.agent`, namespace helper or VMM):
    /// `CONNECT <port>\n`, `OK <n>\n`, then the AGCH stream.
    Hybrid {
        /// The socket.
        path: PathBuf,
        /// The guest port (the agent's is [`boxdesk_channel::AGENT_PORT`]).
        port: u32,
    },
}

impl Endpoint {
    /// The socket path.
    pub fn path(&self) -> &Path {
        match self {
            Endpoint::Unix(p) | Endpoint::Hybrid { path: p, .. } => p,
        }
    }
}

/// One handshaken session with the agent of a named sandbox. A session
/// carries either file frames then at most one exec, or only file frames
/// (docs/CHANNEL.md "Session flow"); the methods that start an exec consume it.
pub struct Connection {
    session: Session,
    name: String,
}

/// Opens a session with the agent of sandbox `name` at `endpoint`. On a
/// hybrid socket the connect, the `CONNECT` line and the handshake take at
/// most [`CONNECT_TIMEOUT`] together however the peer spreads its bytes; on
/// a plain agent socket the connect takes at most that, and the handshake
/// at most [`boxdesk_channel::session::HANDSHAKE_TIMEOUT`].
pub fn connect(endpoint: &Endpoint, name: &str) -> Result<Connection, AgentError> {
    let started = Instant::now();
    let stream = connect_socket(endpoint.path(), name, "agent socket")?;
    let session = match endpoint {
        Endpoint::Unix(_) => Session::over(boxdesk_channel::Stream::Unix(stream)),
        Endpoint::Hybrid { port, .. } => {
            let left = CONNECT_TIMEOUT.saturating_sub(started.elapsed());
            Session::hybrid_over(stream, *port, left)
        }
    };
    let session = session.map_err(|e| match AgentError::of_channel(e, name, CONNECT_TIMEOUT) {
        AgentError::Channel(source) => AgentError::Handshake {
            name: name.to_owned(),
            source,
        },
        e => e,
    })?;
    Ok(Connection {
        session,
        name: name.to_owned(),
    })
}

impl Connection {
    /// A session already handshaken (e.g. over a socket pair), for sandbox
    /// `name`.
    pub fn from_session(session: Session, name: &str) -> Connection {
        Connection {
            session,
            name: name.to_owned(),
        }
    }

    /// The sandbox this session is with.
    pub fn name(&self) -> &str {
        &self.name
    }

    fn channel(&self, e: ChannelError) -> AgentError {
        AgentError::of_channel(e, &self.name, CONNECT_TIMEOUT)
    }
}
