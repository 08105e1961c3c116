//! Peer credentials of a connected Unix socket: `SO_PEERCRED` on Linux,
//! `getpeereid` and `LOCAL_PEERPID` on macOS (`getpeereid` on the BSDs).
//!
//! This module owns only reading the peer's uid and pid. It must never
//! decide trust itself; `ensure_same_uid` in the parent module does.

use std::io;
use std::os::fd::AsFd;

/// The effective uid of the process at the other end of a connected Unix
/// socket (as of its `connect`, or of `socketpair`).
#[cfg(any(target_os = "linux", target_os = "android"))]
pub fn peer_uid(fd: &impl AsFd) -> io::Result<u32> {
    use nix::sys::socket::{getsockopt, sockopt::PeerCredentials};
    let cred = getsockopt(fd, PeerCredentials)?;
    Ok(cred.uid())
}

/// The effective uid of the process at the other end of a connected Unix
/// socket (as of its `connect`, or of `socketpair`).
#[cfg(not(any(target_os = "linux", target_os = "android")))]
pub fn peer_uid(fd: &impl AsFd) -> io::Result<u32> {
    let (uid, _gid) = nix::unistd::getpeereid(fd.as_fd())?;
    Ok(uid.as_raw())
}

/// The pid of the process at the other end of a connected Unix socket, as
/// the kernel recorded it at `connect` (known even when that process never
/// answers).
#[cfg(any(target_os = "linux", target_os = "android"))]
pub fn peer_pid(fd: &impl AsFd) -> io::Result<i32> {
    use nix::sys::socket::{getsockopt, sockopt::PeerCredentials};
    Ok(getsockopt(fd, PeerCredentials)?.pid())
}

/// The pid of the process at the other end of a connected Unix socket, as
/// the kernel recorded it at `connect` (known even when that process never
/// answers).
#[cfg(target_vendor = "apple")]
pub fn peer_pid(fd: &impl AsFd) -> io::Result<i32> {
    use nix::sys::socket::{getsockopt, sockopt::LocalPeerPid};
    Ok(getsockopt(fd, LocalPeerPid)?)
}

/// The pid of the process at the other end of a connected Unix socket:
/// not known on this OS.
#[cfg(not(any(target_os = "linux", target_os = "android", target_vendor = "apple")))]
pub fn peer_pid(_fd: &impl AsFd) -> io::Result<i32> {
    Err(io::ErrorKind::Unsupported.into())
}
