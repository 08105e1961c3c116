//! Raw file-descriptor helpers shared by the socket, pipe, PTY and file
//! code: non-blocking mode, `EINTR`-safe read/write, close-on-exec pipes and
//! `poll(2)` with a deadline. Owns no policy; nothing here blocks unless its
//! name or doc says so, and nothing creates a descriptor without
//! `O_CLOEXEC` (a leaked pipe end in a child would hold another session's
//! EOF hostage).

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};
use std::time::{Duration, Instant};

use nix::fcntl::{fcntl, FcntlArg, OFlag};

/// Sets or clears `O_NONBLOCK` on the open file description.
pub fn set_nonblocking(fd: BorrowedFd<'_>, on: bool) -> io::Result<()> {
    let flags = OFlag::from_bits_retain(fcntl(fd.as_raw_fd(), FcntlArg::F_GETFL)?);
    let want = if on {
        flags | OFlag::O_NONBLOCK
    } else {
        flags - OFlag::O_NONBLOCK
    };
    if want != flags {
        fcntl(fd.as_raw_fd(), FcntlArg::F_SETFL(want))?;
    }
    Ok(())
}

/// `read(2)`, retried on `EINTR`. `Ok(0)` is end of file; a non-blocking
/// descriptor with nothing to read gives `ErrorKind::WouldBlock`.
pub fn read(fd: BorrowedFd<'_>, buf: &mut [u8]) -> io::Result<usize> {
    loop {
        match nix::unistd::read(fd.as_raw_fd(), buf) {
            Err(nix::errno::Errno::EINTR) => continue,
            r => return r.map_err(io::Error::from),
        }
    }
}

/// Appends up to `max` bytes read from `fd` to `buf` without zero-filling
/// the room first (output is relayed in 64 KiB chunks; a memset per chunk
/// is a third pass over every byte). Same results as [`read`].
pub fn read_append(fd: BorrowedFd<'_>, buf: &mut Vec<u8>, max: usize) -> io::Result<usize> {
    buf.reserve(max);
    let spare = &mut buf.spare_capacity_mut()[..max];
    loop {
        // SAFETY: `spare` is writable, uninitialised memory of `max` bytes
        // owned by `buf`; read(2) writes at most that many.
        let n = unsafe { libc::read(fd.as_raw_fd(), spare.as_mut_ptr().cast(), max) };
        if n >= 0 {
            let len = buf.len() + n as usize;
            // SAFETY: read(2) initialised the first `n` bytes of the spare
            // capacity, so the first `len` bytes are now initialised.
            unsafe { buf.set_len(len) };
            return Ok(n as usize);
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// `write(2)`, retried on `EINTR`; may write less than `buf`.
pub fn write(fd: BorrowedFd<'_>, buf: &[u8]) -> io::Result<usize> {
    loop {
        match nix::unistd::write(fd, buf) {
            Err(nix::errno::Errno::EINTR) => continue,
            r => return r.map_err(io::Error::from),
        }
    }
}

/// A pipe whose both ends are close-on-exec and non-blocking:
/// `(read end, write end)`.
pub fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    Ok(nix::unistd::pipe2(OFlag::O_CLOEXEC | OFlag::O_NONBLOCK)?)
}

/// Time left until `deadline` (zero once it has passed); `None` means no
/// deadline.
pub fn until(deadline: Option<Instant>) -> Option<Duration> {
    deadline.map(|d| d.saturating_duration_since(Instant::now()))
}

/// One `poll(2)` entry.
pub fn pollfd(fd: BorrowedFd<'_>, events: libc::c_short) -> libc::pollfd {
    libc::pollfd {
        fd: fd.as_raw_fd(),
        events,
        revents: 0,
    }
}

/// `poll(2)` over `fds`, waiting at most `timeout` (`None`: forever).
/// Returns how many entries have events; an `EINTR` counts as 0 so the
/// caller simply goes round its loop again.
pub fn poll(fds: &mut [libc::pollfd], timeout: Option<Duration>) -> io::Result<usize> {
    let ms = match timeout {
        None => -1,
        // Round up so a deadline 0.4 ms away does not spin at timeout 0.
        Some(t) => t.as_micros().div_ceil(1000).min(i32::MAX as u128) as libc::c_int,
    };
    // SAFETY: `fds` is a valid, writable slice of `pollfd` for the call and
    // its length is passed alongside.
    let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) };
    if n < 0 {
        let e = io::Error::last_os_error();
        return match e.kind() {
            io::ErrorKind::Interrupted => Ok(0),
            _ => Err(e),
        };
    }
    Ok(n as usize)
}

/// True when `revents` says the descriptor can be read (or has hung up or
/// failed, which a read will report).
pub fn readable(revents: libc::c_short) -> bool {
    revents & (libc::POLLIN | libc::POLLHUP | libc::POLLERR | libc::POLLNVAL) != 0
}

/// True when `revents` says a write will not block (or will fail).
pub fn writable(revents: libc::c_short) -> bool {
    revents & (libc::POLLOUT | libc::POLLHUP | libc::POLLERR | libc::POLLNVAL) != 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    #[test]
    fn a_pipe_is_close_on_exec_and_non_blocking_at_both_ends() {
        let (r, w) = pipe().unwrap();
        for fd in [r.as_fd(), w.as_fd()] {
            let fdflags = fcntl(fd.as_raw_fd(), FcntlArg::F_GETFD).unwrap();
            assert_ne!(fdflags & libc::FD_CLOEXEC, 0);
            let fl = OFlag::from_bits_retain(fcntl(fd.as_raw_fd(), FcntlArg::F_GETFL).unwrap());
            assert!(fl.contains(OFlag::O_NONBLOCK));
        }
        let mut buf = [0u8; 4];
        let e = read(r.as_fd(), &mut buf).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::WouldBlock);
        assert_eq!(write(w.as_fd(), b"ab").unwrap(), 2);
        assert_eq!(read(r.as_fd(), &mut buf).unwrap(), 2);
        write(w.as_fd(), b"xyz").unwrap();
        let mut v = b"ab".to_vec();
        assert_eq!(read_append(r.as_fd(), &mut v, 64).unwrap(), 3);
        assert_eq!(v, b"abxyz");
        let e = read_append(r.as_fd(), &mut v, 64).unwrap_err();
        assert_eq!((e.kind(), v.len()), (io::ErrorKind::WouldBlock, 5));
    }

    #[test]
    fn poll_with_a_passed_deadline_returns_at_once() {
        let (r, _w) = pipe().unwrap();
        let mut fds = [pollfd(r.as_fd(), libc::POLLIN)];
        let start = Instant::now();
        assert_eq!(poll(&mut fds, until(Some(start))).unwrap(), 0);
        assert!(start.elapsed() < Duration::from_millis(500));
    }
}
