//! The client side of the control socket, for the CLI: connect by name,
//! ask `info`, ask `stop`.
//!
//! This module owns reading replies within the protocol's limits: it never
//! reads more than [`REPLY_MAX`] bytes for one reply, never waits longer
//! than [`CONNECT_TIMEOUT`] for a listener that does not accept, nor longer
//! than [`REPLY_TIMEOUT`] on a silent helper; a peer that stalls is
//! [`ClientError::Stalled`], naming the sandbox. It must never decide what
//! the CLI prints or exits with.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use super::protocol::{self, Reply, REPLY_MAX};

/// How long a reply may take.
pub const REPLY_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a client waits to get through to a sandbox: a connect to its
/// `<name>.sock` or `<name>.agent` (a listener that never accepts), and
/// for the agent the hybrid preamble and the channel handshake.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Why a control request failed.
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

/// One control connection.
pub struct ControlClient {
    reader: BufReader<UnixStream>,
    name: String,
}

impl ControlClient {
    /// Connects to `sock`, the control socket of sandbox `name`.
    pub fn connect(sock: &Path, name: &str) -> Result<Self, ClientError> {
        let stream = connect_socket(sock, name, "control socket")?;
        stream.set_read_timeout(Some(REPLY_TIMEOUT))?;
        stream.set_write_timeout(Some(REPLY_TIMEOUT))?;
        Ok(Self {
            reader: BufReader::with_capacity(REPLY_MAX, stream),
            name: name.to_owned(),
        })
    }

    /// A failed read or write, a timeout named as the stall it is.
    fn io(&self, e: io::Error) -> ClientError {
        if is_timeout(&e) {
            ClientError::Stalled {
                name: self.name.clone(),
                socket: "control socket",
                after: REPLY_TIMEOUT,
            }
        } else {
            ClientError::Io(e)
        }
    }

    /// The pid of the process listening on the socket, as the kernel
    /// recorded it at `connect` (`SO_PEERCRED`; `LOCAL_PEERPID` on macOS):
    /// known even when the helper never answers.
    pub fn peer_pid(&self) -> Option<i32> {
        let pid = boxdesk_platform::socket::peer_pid(self.reader.get_ref()).ok()?;
        Some(pid).filter(|&pid| pid > 0)
    }

    /// Sends one word and returns the reply's status line.
    pub fn request(&mut self, word: &str) -> Result<Reply, ClientError> {
        let sent = self
            .reader
            .get_mut()
            .write_all(format!("{word}\n").as_bytes());
        sent.map_err(|e| self.io(e))?;
        let mut budget = REPLY_MAX;
        let line = self.line(&mut budget)?;
        Ok(protocol::parse_status_line(&line))
    }

    /// `info`: the `key value` pairs, in the helper's order.
    pub fn info(&mut self) -> Result<Vec<(String, String)>, ClientError> {
        let sent = self.reader.get_mut().write_all(b"info\n");
        sent.map_err(|e| self.io(e))?;
        let mut budget = REPLY_MAX;
        match protocol::parse_status_line(&self.line(&mut budget)?) {
            Reply::Ok(_) => {}
            Reply::Err(why) => return Err(ClientError::Refused(why)),
        }
        let mut lines = Vec::new();
        loop {
            let line = self.line(&mut budget)?;
            if line.is_empty() {
                break;
            }
            lines.push(line);
        }
        Ok(protocol::parse_info_lines(lines.iter().map(String::as_str)))
    }

    /// `stop`: returns once the helper answered `ok` (it exits after).
    pub fn stop(&mut self) -> Result<(), ClientError> {
        match self.request("stop")? {
            Reply::Ok(_) => Ok(()),
            Reply::Err(why) => Err(ClientError::Refused(why)),
        }
    }

    /// Reads one line (without `\n`), charging it to `budget`.
    fn line(&mut self, budget: &mut usize) -> Result<String, ClientError> {
        let mut buf = Vec::new();
        let limit = u64::try_from(*budget).unwrap_or(u64::MAX);
        let read = (&mut self.reader).take(limit).read_until(b'\n', &mut buf);
        let n = read.map_err(|e| self.io(e))?;
        *budget -= n;
        if buf.last() != Some(&b'\n') {
            return Err(ClientError::Malformed(if n as u64 == limit {
                "over 4096 bytes"
            } else {
                "closed mid-reply"
            }));
        }
        buf.pop();
        String::from_utf8(buf).map_err(|_| ClientError::Malformed("not UTF-8"))
    }
}
