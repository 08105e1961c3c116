//! The client side of the control socket, for the CLI: connect by name,
//! ask `info`, ask `stop`.
//!
//! This module owns reading replies within the protocol's limits: it never
//! reads more than [`REPLY_MAX`] bytes for one reply and never waits on a
//! silent helper longer than [`REPLY_TIMEOUT`]. It must never decide what
//! the CLI prints or exits with.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use super::protocol::{self, Reply, REPLY_MAX};

/// How long a reply may take.
pub const REPLY_TIMEOUT: Duration = Duration::from_secs(5);

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

/// One control connection.
pub struct ControlClient {
    reader: BufReader<UnixStream>,
}

impl ControlClient {
    /// Connects to `sock`, the control socket of sandbox `name`.
    pub fn connect(sock: &Path, name: &str) -> Result<Self, ClientError> {
        let stream = UnixStream::connect(sock).map_err(|source| match source.kind() {
            io::ErrorKind::NotFound | io::ErrorKind::ConnectionRefused => {
                ClientError::NoSuchSandbox(name.to_owned())
            }
            _ => ClientError::Connect {
                name: name.to_owned(),
                source,
            },
        })?;
        stream.set_read_timeout(Some(REPLY_TIMEOUT))?;
        stream.set_write_timeout(Some(REPLY_TIMEOUT))?;
        Ok(Self {
            reader: BufReader::with_capacity(REPLY_MAX, stream),
        })
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
        self.reader
            .get_mut()
            .write_all(format!("{word}\n").as_bytes())?;
        let mut budget = REPLY_MAX;
        let line = self.line(&mut budget)?;
        Ok(protocol::parse_status_line(&line))
    }

    /// `info`: the `key value` pairs, in the helper's order.
    pub fn info(&mut self) -> Result<Vec<(String, String)>, ClientError> {
        self.reader.get_mut().write_all(b"info\n")?;
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
        let n = (&mut self.reader).take(limit).read_until(b'\n', &mut buf)?;
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
