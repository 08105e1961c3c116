//! The listening socket: AF_VSOCK (any CID, the given port) in a VM, a
//! Unix stream socket elsewhere. Owns binding (including replacing a stale
//! socket file nobody serves) and accepting with close-on-exec. It must
//! never remove a path that is not a socket or that a live agent serves.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::fs::FileTypeExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;

use nix::errno::Errno;
use nix::sys::socket::{
    accept4, bind, listen, socket, AddressFamily, Backlog, SockFlag, SockType, VsockAddr,
};

use crate::Listen;

/// Why the agent could not listen.
#[derive(Debug, thiserror::Error)]
pub enum ListenError {
    /// Creating, binding or listening on the socket failed.
    #[error("cannot listen on {what}: {err}")]
    Bind {
        /// The address, for the message.
        what: String,
        /// The system error.
        err: io::Error,
    },
    /// Another agent already serves the Unix socket path.
    #[error("{0} is already served by a running agent")]
    InUse(String),
}

/// A listening socket.
pub struct Listener {
    fd: OwnedFd,
}

impl Listener {
    /// Binds and listens on `listen`.
    pub fn bind(listen: &Listen) -> Result<Listener, ListenError> {
        let what = listen.to_string();
        let err = |err: io::Error| ListenError::Bind {
            what: what.clone(),
            err,
        };
        match listen {
            Listen::Unix(path) => {
                remove_stale(path, &what)?;
                let l = UnixListener::bind(path).map_err(err)?;
                Ok(Listener { fd: l.into() })
            }
            Listen::Vsock(port) => {
                let fd = socket(
                    AddressFamily::Vsock,
                    SockType::Stream,
                    SockFlag::SOCK_CLOEXEC,
                    None,
                )
                .map_err(|e| err(e.into()))?;
                let addr = VsockAddr::new(libc::VMADDR_CID_ANY, *port);
                bind(fd.as_raw_fd(), &addr).map_err(|e| err(e.into()))?;
                let backlog = Backlog::new(128).unwrap_or(Backlog::MAXCONN);
                listen_on(&fd, backlog).map_err(|e| err(e.into()))?;
                Ok(Listener { fd })
            }
        }
    }

    /// The listening descriptor, for `poll(2)`.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// Accepts one connection (close-on-exec).
    pub fn accept(&self) -> io::Result<OwnedFd> {
        loop {
            match accept4(self.fd.as_raw_fd(), SockFlag::SOCK_CLOEXEC) {
                // SAFETY: accept4 returned a new descriptor nothing else owns.
                Ok(fd) => return Ok(unsafe { OwnedFd::from_raw_fd(fd) }),
                Err(Errno::EINTR) => continue,
                Err(e) => return Err(e.into()),
            }
        }
    }
}

fn listen_on(fd: &OwnedFd, backlog: Backlog) -> nix::Result<()> {
    listen(fd, backlog)
}

/// A socket file left by an agent that died is removed; a live one (it
/// accepts a connection) or anything that is not a socket is left alone.
fn remove_stale(path: &Path, what: &str) -> Result<(), ListenError> {
    let Ok(meta) = std::fs::symlink_metadata(path) else {
        return Ok(());
    };
    if !meta.file_type().is_socket() {
        return Ok(()); // bind reports EADDRINUSE, naming the path
    }
    if UnixStream::connect(path).is_ok() {
        return Err(ListenError::InUse(what.to_string()));
    }
    let _ = std::fs::remove_file(path);
    Ok(())
}
