//! The listening socket: AF_VSOCK (any CID, the given port) in a VM, a
//! Unix stream socket at a path, or an inherited Unix stream socket that
//! the host already bound and listens on (`fd:N`: the namespace backend,
//! where a path inside the sandbox could be renamed or replaced by the
//! sandbox's own processes). Owns binding (a stale socket file nobody
//! serves is replaced by `boxdesk_platform::socket`'s one rule), checking
//! an inherited descriptor, and accepting with close-on-exec. The
//! listening socket is non-blocking, so an accept after `poll(2)` never
//! waits (a shared inherited socket may lose a connection to another
//! holder). Where the host says who it is (`--peer-uid`), a Unix peer of
//! any other uid is refused: the socket file sits in the host user's state
//! dir, which root (or a process holding a descriptor of it) can reach past
//! its 0700. It must never remove a path that is not a socket or that a
//! live agent serves, and never take over a descriptor that is not a
//! listening Unix stream socket.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixListener;

use boxdesk_platform::socket::{clear_if_stale, SocketError, Staleness};
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
    /// The Unix socket path holds something that is not a stale socket
    /// (a symlink, a regular file) or cannot be checked.
    #[error("cannot listen on {what}: {err}")]
    Path {
        /// The address, for the message.
        what: String,
        /// What the path holds.
        err: SocketError,
    },
    /// The inherited descriptor is not a listening Unix stream socket.
    #[error("--listen fd:{fd}: {why}")]
    NotListening {
        /// The descriptor number.
        fd: i32,
        /// What it is instead.
        why: String,
    },
}

/// A listening socket.
pub struct Listener {
    fd: OwnedFd,
    /// The one uid (as this process's user namespace sees it) a peer may
    /// have, when one is set.
    peer: Option<u32>,
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
                // A socket file left by an agent that died is removed; a
                // live one, a symlink or anything that is not a socket is
                // left alone and refused.
                match clear_if_stale(path) {
                    Ok(Staleness::Live) => return Err(ListenError::InUse(what.clone())),
                    Ok(Staleness::Absent | Staleness::Removed) => {}
                    Err(err) => {
                        return Err(ListenError::Path {
                            what: what.clone(),
                            err,
                        })
                    }
                }
                let l = UnixListener::bind(path).map_err(err)?;
                l.set_nonblocking(true).map_err(err)?;
                Ok(Listener {
                    fd: l.into(),
                    peer: None,
                })
            }
            Listen::Fd(fd) => adopt(*fd),
            Listen::Vsock(port) => {
                let fd = socket(
                    AddressFamily::Vsock,
                    SockType::Stream,
                    SockFlag::SOCK_CLOEXEC | SockFlag::SOCK_NONBLOCK,
                    None,
                )
                .map_err(|e| err(e.into()))?;
                let addr = VsockAddr::new(libc::VMADDR_CID_ANY, *port);
                bind(fd.as_raw_fd(), &addr).map_err(|e| err(e.into()))?;
                let backlog = Backlog::new(128).unwrap_or(Backlog::MAXCONN);
                listen_on(&fd, backlog).map_err(|e| err(e.into()))?;
                Ok(Listener { fd, peer: None })
            }
        }
    }

    /// The listening descriptor, for `poll(2)`.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// Accepts one connection (close-on-exec, non-blocking); `WouldBlock`
    /// when none is waiting.
    pub fn accept(&self) -> io::Result<OwnedFd> {
        loop {
            match accept4(
                self.fd.as_raw_fd(),
                SockFlag::SOCK_CLOEXEC | SockFlag::SOCK_NONBLOCK,
            ) {
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

/// Takes over descriptor `fd`: it must be open, a Unix stream socket, and
/// listening. It becomes close-on-exec (no exec inherits the agent's
/// socket) and non-blocking. Call it before the process opens anything
/// else: a number that was not inherited could by then be one of the
/// agent's own descriptors.
pub fn adopt(fd: i32) -> Result<Listener, ListenError> {
    let refuse = |why: String| ListenError::NotListening { fd, why };
    // SAFETY: F_GETFD takes no argument and only reads the descriptor
    // table; it tells whether `fd` is open before anything takes it over.
    if unsafe { libc::fcntl(fd, libc::F_GETFD) } < 0 {
        return Err(refuse(format!("{}", io::Error::last_os_error())));
    }
    // SAFETY: `fd` is open (checked above), was inherited for the agent to
    // own, and nothing else in this process refers to it.
    let owned = unsafe { OwnedFd::from_raw_fd(fd) };
    let int = |opt: libc::c_int| -> Result<libc::c_int, ListenError> {
        let mut value: libc::c_int = 0;
        let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
        // SAFETY: `value` and `len` are valid for writing, and `len` says
        // how many bytes `value` holds.
        let rc = unsafe {
            libc::getsockopt(
                owned.as_raw_fd(),
                libc::SOL_SOCKET,
                opt,
                (&mut value as *mut libc::c_int).cast(),
                &mut len,
            )
        };
        if rc != 0 {
            let e = io::Error::last_os_error();
            return Err(refuse(match e.raw_os_error() {
                Some(libc::ENOTSOCK) => "not a socket".into(),
                _ => e.to_string(),
            }));
        }
        Ok(value)
    };
    let domain = int(libc::SO_DOMAIN)?;
    if domain != libc::AF_UNIX {
        return Err(refuse(format!(
            "a socket of address family {domain}, not a Unix socket"
        )));
    }
    if int(libc::SO_TYPE)? != libc::SOCK_STREAM {
        return Err(refuse("a Unix socket, but not a stream socket".into()));
    }
    if int(libc::SO_ACCEPTCONN)? == 0 {
        return Err(refuse(
            "a Unix stream socket that is not listening (bind and listen first)".into(),
        ));
    }
    let setup = |e: nix::Error| refuse(format!("cannot set it up: {e}"));
    nix::fcntl::fcntl(
        owned.as_raw_fd(),
        nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::FD_CLOEXEC),
    )
    .map_err(setup)?;
    crate::fdio::set_nonblocking(owned.as_fd(), true).map_err(|e| refuse(e.to_string()))?;
    Ok(Listener {
        fd: owned,
        peer: None,
    })
}

impl Listener {
    /// From now on only peers of host uid `outside` are served: the host's
    /// user that runs the sandbox, seen here through this process's
    /// `uid_map` (or as the kernel's overflow uid, where it has no id here).
    pub fn only_peer(&mut self, outside: u32) {
        let map = std::fs::read_to_string("/proc/self/uid_map").unwrap_or_default();
        let overflow = std::fs::read_to_string("/proc/sys/kernel/overflowuid")
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(65534);
        self.peer = Some(uid_inside(outside, &map, overflow));
    }

    /// `Err(uid)` when `conn`'s peer may not be served: its uid is not the
    /// one [`Listener::only_peer`] set (`u32::MAX` when its credentials
    /// cannot be read, or it is no Unix peer).
    pub fn check_peer(&self, conn: &OwnedFd) -> Result<(), u32> {
        let Some(want) = self.peer else {
            return Ok(());
        };
        match nix::sys::socket::getsockopt(conn, nix::sys::socket::sockopt::PeerCredentials) {
            Ok(cred) if cred.uid() == want => Ok(()),
            Ok(cred) => Err(cred.uid()),
            Err(_) => Err(u32::MAX),
        }
    }
}

/// The id `outside` (of the parent user namespace) has in a namespace whose
/// `uid_map` is `map`; `overflow` where the map does not hold it.
fn uid_inside(outside: u32, map: &str, overflow: u32) -> u32 {
    for line in map.lines() {
        let mut n = line.split_whitespace().map(str::parse::<u64>);
        let (Some(Ok(inside)), Some(Ok(start)), Some(Ok(count))) = (n.next(), n.next(), n.next())
        else {
            continue;
        };
        let outside = u64::from(outside);
        if outside >= start && outside - start < count {
            return u32::try_from(inside + (outside - start)).unwrap_or(overflow);
        }
    }
    overflow
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_host_uid_is_seen_through_the_uid_map_or_as_the_overflow_uid() {
        // A user's sandbox: the user is root inside.
        assert_eq!(
            uid_inside(1000, "         0       1000          1\n", 65534),
            0
        );
        // Root elsewhere has no id there.
        assert_eq!(
            uid_inside(0, "         0       1000          1\n", 65534),
            65534
        );
        // Root's sandbox maps a subordinate range; root itself is outside it.
        let sub = "         0 1879048192      65536\n";
        assert_eq!(uid_inside(0, sub, 65534), 65534);
        assert_eq!(uid_inside(1879048192 + 5, sub, 65534), 5);
        // The initial namespace maps everything to itself.
        assert_eq!(
            uid_inside(1000, "         0          0 4294967295\n", 65534),
            1000
        );
        assert_eq!(uid_inside(7, "garbage\n", 65534), 65534);
    }

    #[test]
    fn a_peer_of_the_set_uid_is_served_and_one_of_another_is_refused_with_its_uid() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.sock");
        let mut l = Listener::bind(&Listen::Unix(path.clone())).unwrap();
        let me = nix::unistd::geteuid().as_raw();
        let _c = std::os::unix::net::UnixStream::connect(&path).unwrap();
        let conn = l.accept().unwrap();
        assert_eq!(l.check_peer(&conn), Ok(()));
        // The initial namespace's map is the identity: a peer of this uid
        // is served once only this uid may connect...
        l.peer = Some(uid_inside(me, "0 0 4294967295", 65534));
        assert_eq!(l.check_peer(&conn), Ok(()));
        // ...and refused, with its uid said, when another is the owner.
        l.peer = Some(me.wrapping_add(1));
        assert_eq!(l.check_peer(&conn), Err(me));
    }

    #[test]
    fn a_stale_socket_file_is_replaced_a_live_one_refused_and_a_regular_file_left_alone() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("agent.sock");
        let unix = Listen::Unix(path.clone());
        drop(UnixListener::bind(&path).unwrap());
        let live = Listener::bind(&unix).expect("a stale socket file is replaced");
        assert!(matches!(Listener::bind(&unix), Err(ListenError::InUse(_))));
        drop(live);

        let file = dir.path().join("file");
        std::fs::write(&file, b"data").unwrap();
        let e = Listener::bind(&Listen::Unix(file.clone())).err().unwrap();
        assert!(
            matches!(
                e,
                ListenError::Path {
                    err: SocketError::NotASocket { .. },
                    ..
                }
            ),
            "{e}"
        );
        assert_eq!(std::fs::read(&file).unwrap(), b"data");
    }
}
