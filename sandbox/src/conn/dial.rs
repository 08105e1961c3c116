//! Reaching a sandbox's sockets as a client (its control socket
//! `<name>.sock`, its agent socket `<name>.agent`): the connect deadline
//! ([`CONNECT_TIMEOUT`]), the one error type both clients answer with
//! ([`ClientError`]: a missing sandbox, a stalled listener, a refusal, a
//! malformed reply), and which i/o errors are timeouts.
//!
//! This module owns how a failed connect is named. It must never wait
//! past [`CONNECT_TIMEOUT`] for a listener that does not accept.

use std::io;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

/// How long a client waits to get through to a sandbox: a connect to its
/// `<name>.sock` or `<name>.agent` (a listener that never accepts), and
/// for the agent the hybrid preamble and the channel handshake.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Why reaching a sandbox, or a request to it, failed: the control
/// client and the agent client both answer with it.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// Nothing answers on the sandbox's control socket.
    #[error("no such sandbox: {0} (`boxdesk ls` lists the running ones)")]
    NoSuchSandbox(String),
    /// Connecting failed for another reason.
    #[error("cannot connect to the control socket of {name}")]
    Connect {
        /// The sandbox.
        name: String,
        /// What the OS said.
        #[source]
        source: io::Error,
    },
    /// Whatever listens there did not get through a connect or answer in
    /// time: a wedged helper, or not a boxdesk sandbox at all.
    #[error("sandbox {name} did not answer on its {socket} within {} s (a wedged helper, or something else listening there)", .after.as_secs())]
    Stalled {
        /// The sandbox.
        name: String,
        /// Which socket: `control socket` or `agent socket`.
        socket: &'static str,
        /// How long it was given.
        after: Duration,
    },
    /// Talking to the helper failed.
    #[error("control socket i/o")]
    Io(#[from] io::Error),
    /// The helper answered `err`.
    #[error("the helper refused: {0}")]
    Refused(String),
    /// The reply broke the protocol (too long, not UTF-8, cut short).
    #[error("malformed reply from the helper: {0}")]
    Malformed(&'static str),
    /// The helper answered `display` or `input` with `err no display`.
    #[error("{0} has no display (start it with `boxdesk run --display`)")]
    NoDisplay(String),
    /// The helper closed a `display` or `input` stream without `end`: it
    /// exited, or dropped the connection.
    #[error("sandbox {0} closed the connection (its helper exited?)")]
    Closed(String),
}

/// Whether an i/o error is a socket timeout running out (`EAGAIN` on
/// Linux for `SO_RCVTIMEO`/`SO_SNDTIMEO`).
pub fn is_timeout(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
    )
}

/// Connects to `path`, a socket of sandbox `name` (`what` names which, for
/// the message), within [`CONNECT_TIMEOUT`].
pub fn connect_socket(
    path: &Path,
    name: &str,
    what: &'static str,
) -> Result<UnixStream, ClientError> {
    boxdesk_platform::socket::connect_within(path, CONNECT_TIMEOUT).map_err(|source| {
        match source.kind() {
            io::ErrorKind::NotFound | io::ErrorKind::ConnectionRefused => {
                ClientError::NoSuchSandbox(name.to_owned())
            }
            _ if is_timeout(&source) => ClientError::Stalled {
                name: name.to_owned(),
                socket: what,
                after: CONNECT_TIMEOUT,
            },
            _ => ClientError::Connect {
                name: name.to_owned(),
                source,
            },
        }
    })
}
