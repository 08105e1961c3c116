//! Bringing the loopback interface up, as a VM's init must (the kernel
//! creates `lo` down). Owns only `lo`'s flags; it must never configure any
//! other interface or address.

use std::io;
use std::os::fd::AsRawFd;

use nix::sys::socket::{socket, AddressFamily, SockFlag, SockType};

/// Why `lo` could not be brought up.
#[derive(Debug, thiserror::Error)]
pub enum LoopbackError {
    /// A socket for the ioctl could not be created.
    #[error("loopback socket: {0}")]
    Socket(nix::Error),
    /// Reading or setting the flags failed.
    #[error("loopback {what}: {err}")]
    Ioctl {
        /// SIOCGIFFLAGS or SIOCSIFFLAGS.
        what: &'static str,
        /// The system error.
        err: io::Error,
    },
}

/// Sets `IFF_UP` on `lo` (a no-op when it is already up).
pub fn up() -> Result<(), LoopbackError> {
    let sock = socket(
        AddressFamily::Inet,
        SockType::Datagram,
        SockFlag::SOCK_CLOEXEC,
        None,
    )
    .map_err(LoopbackError::Socket)?;
    // SAFETY: ifreq is a plain C struct for which all-zero bytes are valid.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in req.ifr_name.iter_mut().zip(b"lo\0") {
        *dst = *src as libc::c_char;
    }
    // SAFETY: SIOCGIFFLAGS fills the flags of the ifreq we pass by pointer.
    if unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFFLAGS as _, &mut req) } < 0 {
        return Err(LoopbackError::Ioctl {
            what: "SIOCGIFFLAGS",
            err: io::Error::last_os_error(),
        });
    }
    // SAFETY: after SIOCGIFFLAGS the union holds the flags member.
    let flags = unsafe { req.ifr_ifru.ifru_flags };
    let up = (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short;
    if flags & up == up {
        return Ok(());
    }
    req.ifr_ifru.ifru_flags = flags | up;
    // SAFETY: SIOCSIFFLAGS reads the name and flags from the valid ifreq.
    if unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCSIFFLAGS as _, &req) } < 0 {
        return Err(LoopbackError::Ioctl {
            what: "SIOCSIFFLAGS",
            err: io::Error::last_os_error(),
        });
    }
    Ok(())
}
