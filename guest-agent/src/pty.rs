//! Pseudo-terminals for ExecPty: a master/slave pair that is close-on-exec
//! from birth, the window size, and the byte that means end-of-file.
//!
//! Owns the PTY file descriptors until the spawn takes the slave. It must
//! never keep a slave descriptor open in the agent once the child has its
//! copies: the end of a PTY session is the master's `EIO`, which comes only
//! when every slave descriptor is closed.

use std::fs::OpenOptions;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::OpenOptionsExt;

use boxdesk_channel::WinSize;
use nix::sys::termios::{tcgetattr, SpecialCharacterIndices};

/// Why a PTY could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum PtyError {
    /// Opening or configuring the master/slave pair failed.
    #[error("pty {what}: {err}")]
    Os {
        /// The step that failed.
        what: &'static str,
        /// The system error.
        err: io::Error,
    },
}

fn os(what: &'static str) -> impl FnOnce(io::Error) -> PtyError {
    move |err| PtyError::Os { what, err }
}

/// Opens a PTY of size `ws`: `(master, slave)`, both close-on-exec and
/// neither the agent's controlling terminal.
pub fn open(ws: WinSize) -> Result<(OwnedFd, OwnedFd), PtyError> {
    let flags = libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC;
    // SAFETY: posix_openpt takes only flags and returns a new descriptor or -1.
    let raw = unsafe { libc::posix_openpt(flags) };
    if raw < 0 {
        return Err(os("posix_openpt")(io::Error::last_os_error()));
    }
    // SAFETY: `raw` is a descriptor we just opened and own exclusively.
    let master = unsafe { OwnedFd::from_raw_fd(raw) };
    // SAFETY: grantpt/unlockpt only act on the valid master descriptor.
    if unsafe { libc::grantpt(master.as_raw_fd()) } != 0 {
        return Err(os("grantpt")(io::Error::last_os_error()));
    }
    // SAFETY: as above.
    if unsafe { libc::unlockpt(master.as_raw_fd()) } != 0 {
        return Err(os("unlockpt")(io::Error::last_os_error()));
    }
    let slave = open_peer(&master)?;
    set_size(master.as_fd(), ws)?;
    Ok((master, slave))
}

/// The slave side: `TIOCGPTPEER` (Linux 4.13+, no path lookup, so it works
/// whatever `/dev/pts` this mount namespace shows), else by name.
fn open_peer(master: &OwnedFd) -> Result<OwnedFd, PtyError> {
    let flags = libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC;
    // SAFETY: TIOCGPTPEER takes an int of open flags and returns a new fd.
    let raw = unsafe { libc::ioctl(master.as_raw_fd(), libc::TIOCGPTPEER, flags) };
    if raw >= 0 {
        // SAFETY: the ioctl returned a fresh descriptor that we now own.
        return Ok(unsafe { OwnedFd::from_raw_fd(raw) });
    }
    let mut name = [0 as libc::c_char; 128];
    // SAFETY: `name` is writable for its whole length, which is passed.
    let rc = unsafe { libc::ptsname_r(master.as_raw_fd(), name.as_mut_ptr(), name.len()) };
    if rc != 0 {
        return Err(os("ptsname_r")(io::Error::from_raw_os_error(rc)));
    }
    // SAFETY: ptsname_r succeeded, so `name` holds a NUL-terminated string.
    let path = unsafe { std::ffi::CStr::from_ptr(name.as_ptr()) };
    let path = std::ffi::OsStr::from_bytes(path.to_bytes());
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NOCTTY)
        .open(path)
        .map_err(os("open slave"))?;
    Ok(OwnedFd::from(file))
}

/// Sets the window size; the kernel sends SIGWINCH to the terminal's
/// foreground process group when it changes.
pub fn set_size(master: BorrowedFd<'_>, ws: WinSize) -> Result<(), PtyError> {
    let size = libc::winsize {
        ws_row: ws.rows,
        ws_col: ws.cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCSWINSZ reads one `winsize` from the valid pointer.
    if unsafe { libc::ioctl(master.as_raw_fd(), libc::TIOCSWINSZ, &size) } != 0 {
        return Err(os("TIOCSWINSZ")(io::Error::last_os_error()));
    }
    Ok(())
}

/// The terminal's current VEOF character (normally 0x04, `^D`), which an
/// empty Stdin frame writes to end a canonical-mode read.
pub fn veof(master: BorrowedFd<'_>) -> u8 {
    match tcgetattr(master) {
        Ok(t) => match t.control_chars[SpecialCharacterIndices::VEOF as usize] {
            0 => 0x04,
            c => c,
        },
        Err(_) => 0x04,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_pty_has_the_requested_size_and_close_on_exec_ends() {
        let (master, slave) = match open(WinSize { cols: 91, rows: 17 }) {
            Ok(p) => p,
            Err(e) => {
                use std::io::Write;
                let _ = writeln!(std::io::stderr(), "skipped: no pty here: {e}");
                return;
            }
        };
        let mut ws = libc::winsize {
            ws_row: 0,
            ws_col: 0,
            ws_xpixel: 0,
            ws_ypixel: 0,
        };
        // SAFETY: TIOCGWINSZ writes one `winsize` through the valid pointer.
        let rc = unsafe { libc::ioctl(slave.as_raw_fd(), libc::TIOCGWINSZ, &mut ws) };
        assert_eq!(rc, 0);
        assert_eq!((ws.ws_col, ws.ws_row), (91, 17));
        for fd in [&master, &slave] {
            // SAFETY: F_GETFD on a valid descriptor has no side effects.
            let fl = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETFD) };
            assert_ne!(fl & libc::FD_CLOEXEC, 0);
        }
        assert_eq!(veof(master.as_fd()), 0x04);
    }
}
