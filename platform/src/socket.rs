//! Unix socket files: telling a live server from a stale file, binding a
//! path without stealing it, and checking who is on the other end.
//!
//! This module owns the liveness rule of the control socket — a
//! non-blocking `connect` — the bounded `connect` of a client, and the
//! same-uid rule for peers. It must never block on a peer without a limit, never unlink a socket a server still answers on, and
//! never unlink (or follow) anything that is not a socket: symlinks and
//! regular files are refused and left in place.

mod peer;

use std::fs;
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::time::Duration;

use nix::errno::Errno;
use nix::sys::socket::{connect, setsockopt, sockopt, AddressFamily, SockFlag, SockType, UnixAddr};
use nix::sys::time::{TimeVal, TimeValLike};

use crate::names::{self, NameError};

pub use peer::{peer_pid, peer_uid};

/// Why a socket path cannot be used, or a peer is not trusted.
#[derive(Debug, thiserror::Error)]
pub enum SocketError {
    /// A live server answers on the path; it is not ours to take.
    #[error("{} is in use by a live server", .0.display())]
    InUse(PathBuf),
    /// The path is a symlink, which could point anywhere.
    #[error("{} is a symlink; refusing to follow or remove it", path.display())]
    Symlink {
        /// The symlink.
        path: PathBuf,
    },
    /// Something other than a socket is at the path.
    #[error("{} exists and is not a socket; leaving it alone", path.display())]
    NotASocket {
        /// The path.
        path: PathBuf,
    },
    /// The path does not fit in `sun_path`.
    #[error(transparent)]
    Path(#[from] NameError),
    /// `lstat` on the path failed.
    #[error("cannot inspect {}", path.display())]
    Inspect {
        /// The path.
        path: PathBuf,
        /// What the OS said.
        #[source]
        source: io::Error,
    },
    /// A connect attempt failed in a way that says neither live nor dead.
    #[error("cannot tell whether {} is live", path.display())]
    Probe {
        /// The socket path.
        path: PathBuf,
        /// What `connect` said.
        #[source]
        source: Errno,
    },
    /// Removing a stale socket failed.
    #[error("cannot remove stale socket {}", path.display())]
    Remove {
        /// The socket path.
        path: PathBuf,
        /// What the OS said.
        #[source]
        source: io::Error,
    },
    /// `bind` failed for a reason other than the path being taken.
    #[error("cannot bind {}", path.display())]
    Bind {
        /// The socket path.
        path: PathBuf,
        /// What the OS said.
        #[source]
        source: io::Error,
    },
    /// Restricting the new socket file to mode 0600 failed.
    #[error("cannot set mode 0600 on {}", path.display())]
    Chmod {
        /// The socket path.
        path: PathBuf,
        /// What the OS said.
        #[source]
        source: io::Error,
    },
    /// The peer's credentials could not be read.
    #[error("cannot read the peer's credentials")]
    PeerCred(#[source] io::Error),
    /// The peer runs as another user.
    #[error("peer runs as uid {peer}, not {ours}; refusing it")]
    ForeignPeer {
        /// The peer's uid.
        peer: u32,
        /// Our effective uid.
        ours: u32,
    },
}

/// What [`clear_if_stale`] found at a socket path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Staleness {
    /// Nothing is at the path.
    Absent,
    /// A server answers on it; it was left alone.
    Live,
    /// It was a socket nobody answers on, and it has been unlinked.
    Removed,
}

/// Whether a server accepts connections on `path`, by a non-blocking
/// `connect` that is closed at once. Never blocks; anything other than a
/// connection or a full backlog counts as not live.
pub fn is_live(path: &Path) -> bool {
    knock(path) == Knock::Live
}

/// Unlinks `path` if it is a socket nobody answers on.
///
/// A symlink or a non-socket is an error and is never unlinked; so is a
/// connect failure that does not prove the socket dead.
pub fn clear_if_stale(path: &Path) -> Result<Staleness, SocketError> {
    let meta = match fs::symlink_metadata(path) {
        Ok(meta) => meta,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Staleness::Absent),
        Err(source) => return Err(inspect(path, source)),
    };
    let path_buf = || path.to_owned();
    if meta.file_type().is_symlink() {
        return Err(SocketError::Symlink { path: path_buf() });
    }
    if !meta.file_type().is_socket() {
        return Err(SocketError::NotASocket { path: path_buf() });
    }
    match knock(path) {
        Knock::Live => Ok(Staleness::Live),
        Knock::Unknown(source) => Err(SocketError::Probe {
            path: path_buf(),
            source,
        }),
        Knock::Dead => match fs::remove_file(path) {
            Ok(()) => Ok(Staleness::Removed),
            // Someone else cleared it first: the outcome we wanted.
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Staleness::Removed),
            Err(source) => Err(SocketError::Remove {
                path: path_buf(),
                source,
            }),
        },
    }
}

/// Binds a listener on `path`, first removing a stale socket there, and
/// restricts the socket file to mode 0600.
///
/// A live server, or one that binds between our check and our `bind`
/// (`EADDRINUSE`), gives [`SocketError::InUse`]. The 0600 comes after
/// `bind`; until then the 0700 runtime dir is what keeps others out.
pub fn bind_exclusive(path: &Path) -> Result<UnixListener, SocketError> {
    names::check_socket_path(path)?;
    if clear_if_stale(path)? == Staleness::Live {
        return Err(SocketError::InUse(path.to_owned()));
    }
    let listener = match UnixListener::bind(path) {
        Ok(listener) => listener,
        Err(e) if e.kind() == io::ErrorKind::AddrInUse => {
            return Err(SocketError::InUse(path.to_owned()))
        }
        Err(source) => {
            return Err(SocketError::Bind {
                path: path.to_owned(),
                source,
            })
        }
    };
    if let Err(source) = fs::set_permissions(path, fs::Permissions::from_mode(0o600)) {
        // The file is ours (we just bound it); leave nothing half-made.
        let _ = fs::remove_file(path);
        return Err(SocketError::Chmod {
            path: path.to_owned(),
            source,
        });
    }
    Ok(listener)
}

/// Connects to the Unix socket at `path`, waiting at most `limit` for room
/// in its backlog: a plain blocking `connect` waits forever on a listener
/// that never accepts. Running out of time is an error of kind
/// [`io::ErrorKind::TimedOut`]; a missing or dead socket is `NotFound` or
/// `ConnectionRefused`, as from [`UnixStream::connect`]. The stream comes
/// back blocking, with no timeouts set.
pub fn connect_within(path: &Path, limit: Duration) -> io::Result<UnixStream> {
    let addr = UnixAddr::new(path).map_err(io::Error::from)?;
    let fd = stream_socket(false).map_err(io::Error::from)?;
    // SO_SNDTIMEO bounds a connect that waits for backlog room (Linux);
    // zero would mean "no limit", and an hour is already forever here.
    let limit = limit.clamp(Duration::from_millis(1), Duration::from_secs(3600));
    let micros = limit.as_micros() as i64;
    setsockopt(&fd, sockopt::SendTimeout, &TimeVal::microseconds(micros))
        .map_err(io::Error::from)?;
    loop {
        match connect(fd.as_raw_fd(), &addr) {
            Ok(()) => break,
            Err(Errno::EINTR) => continue,
            Err(Errno::EAGAIN | Errno::EINPROGRESS | Errno::ETIMEDOUT) => {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!(
                        "no room in the backlog of {} within {limit:?}",
                        path.display()
                    ),
                ))
            }
            Err(e) => return Err(e.into()),
        }
    }
    setsockopt(&fd, sockopt::SendTimeout, &TimeVal::zero()).map_err(io::Error::from)?;
    Ok(UnixStream::from(fd))
}

/// Refuses a connected Unix socket whose peer is not our effective uid.
pub fn ensure_same_uid(stream: &impl AsFd) -> Result<(), SocketError> {
    let peer = peer_uid(stream).map_err(SocketError::PeerCred)?;
    let ours = crate::euid();
    if peer != ours {
        return Err(SocketError::ForeignPeer { peer, ours });
    }
    Ok(())
}

/// Refuses `path` if it is a symlink; a missing path is fine.
pub fn check_not_symlink(path: &Path) -> Result<(), SocketError> {
    match fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_symlink() => Err(SocketError::Symlink {
            path: path.to_owned(),
        }),
        Ok(_) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(source) => Err(inspect(path, source)),
    }
}

fn inspect(path: &Path, source: io::Error) -> SocketError {
    SocketError::Inspect {
        path: path.to_owned(),
        source,
    }
}

/// The outcome of one non-blocking connect.
#[derive(Debug, PartialEq, Eq)]
enum Knock {
    /// Connected, or queued (`EINPROGRESS`/`EAGAIN`: the backlog is full).
    Live,
    /// `ECONNREFUSED` or `ENOENT`: nobody is listening.
    Dead,
    /// Anything else (`EACCES`, a path too long…): we cannot tell.
    Unknown(Errno),
}

fn knock(path: &Path) -> Knock {
    let attempt = || -> Result<(), Errno> {
        let addr = UnixAddr::new(path)?;
        let fd = stream_socket(true)?;
        connect(fd.as_raw_fd(), &addr)
    };
    match attempt() {
        Ok(()) | Err(Errno::EINPROGRESS | Errno::EAGAIN) => Knock::Live,
        Err(Errno::ECONNREFUSED | Errno::ENOENT) => Knock::Dead,
        Err(e) => Knock::Unknown(e),
    }
}

/// A close-on-exec Unix stream socket, non-blocking when asked.
#[cfg(not(target_vendor = "apple"))]
fn stream_socket(nonblocking: bool) -> Result<OwnedFd, Errno> {
    let mut flags = SockFlag::SOCK_CLOEXEC;
    if nonblocking {
        flags |= SockFlag::SOCK_NONBLOCK;
    }
    nix::sys::socket::socket(AddressFamily::Unix, SockType::Stream, flags, None)
}

/// Apple has no `SOCK_NONBLOCK`/`SOCK_CLOEXEC`; set both right after.
#[cfg(target_vendor = "apple")]
fn stream_socket(nonblocking: bool) -> Result<OwnedFd, Errno> {
    use nix::fcntl::{fcntl, FcntlArg, FdFlag, OFlag};
    let fd = nix::sys::socket::socket(
        AddressFamily::Unix,
        SockType::Stream,
        SockFlag::empty(),
        None,
    )?;
    fcntl(fd.as_raw_fd(), FcntlArg::F_SETFD(FdFlag::FD_CLOEXEC))?;
    if nonblocking {
        fcntl(fd.as_raw_fd(), FcntlArg::F_SETFL(OFlag::O_NONBLOCK))?;
    }
    Ok(fd)
}
