//! The signals the CLI forwards, as a descriptor the exec loop polls beside
//! the socket: a signalfd on Linux; elsewhere (macOS has no signalfd) a
//! thread that takes them with `sigwait` and writes each one's number to a
//! pipe. Either way the signals stay blocked and no handler is installed.
//!
//! This module owns only turning blocked signals into something to poll.
//! The caller must block the set first, before starting any thread
//! ([`super::tty::block`]), and make one [`Signals`] per process.

use std::io;
use std::os::fd::{AsFd, BorrowedFd};

use nix::sys::signal::{SigSet, Signal};

/// The pending forwarded signals; its descriptor is readable when one is.
pub struct Signals(imp::Source);

impl Signals {
    /// Starts taking the signals of `set`, which the caller has blocked.
    pub fn new(set: &SigSet) -> io::Result<Signals> {
        imp::Source::new(set).map(Signals)
    }

    /// The next pending signal, without blocking; `None` when none is.
    pub fn next(&mut self) -> Option<Signal> {
        self.0.next()
    }
}

impl AsFd for Signals {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.0.as_fd()
    }
}

#[cfg(target_os = "linux")]
mod imp {
    use std::io;
    use std::os::fd::{AsFd, BorrowedFd};

    use nix::sys::signal::{SigSet, Signal};
    use nix::sys::signalfd::{SfdFlags, SignalFd};

    /// A non-blocking signalfd.
    pub struct Source(SignalFd);

    impl Source {
        pub fn new(set: &SigSet) -> io::Result<Source> {
            let flags = SfdFlags::SFD_NONBLOCK | SfdFlags::SFD_CLOEXEC;
            Ok(Source(SignalFd::with_flags(set, flags)?))
        }

        pub fn next(&mut self) -> Option<Signal> {
            while let Ok(Some(info)) = self.0.read_signal() {
                if let Ok(sig) = Signal::try_from(info.ssi_signo as i32) {
                    return Some(sig);
                }
            }
            None
        }

        pub fn as_fd(&self) -> BorrowedFd<'_> {
            self.0.as_fd()
        }
    }
}

#[cfg(not(target_os = "linux"))]
mod imp {
    use std::fs::File;
    use std::io::{self, Read, Write};
    use std::os::fd::{AsFd, AsRawFd, BorrowedFd};

    use nix::fcntl::{fcntl, FcntlArg, FdFlag, OFlag};
    use nix::sys::signal::{SigSet, Signal};

    /// The read end (non-blocking) of a pipe a `sigwait` thread feeds one
    /// byte per signal.
    pub struct Source(File);

    impl Source {
        pub fn new(set: &SigSet) -> io::Result<Source> {
            let (read, write) = nix::unistd::pipe()?;
            for fd in [&read, &write] {
                fcntl(fd.as_raw_fd(), FcntlArg::F_SETFD(FdFlag::FD_CLOEXEC))?;
            }
            fcntl(read.as_raw_fd(), FcntlArg::F_SETFL(OFlag::O_NONBLOCK))?;
            let set = *set;
            let mut write = File::from(write);
            std::thread::Builder::new()
                .name("signals".into())
                .spawn(move || {
                    // Ends when the read end is gone (EPIPE: the runtime
                    // ignores SIGPIPE).
                    while let Ok(sig) = set.wait() {
                        if write.write_all(&[sig as u8]).is_err() {
                            break;
                        }
                    }
                })?;
            Ok(Source(File::from(read)))
        }

        pub fn next(&mut self) -> Option<Signal> {
            let mut byte = [0u8; 1];
            loop {
                match self.0.read(&mut byte) {
                    Ok(1) => {
                        if let Ok(sig) = Signal::try_from(i32::from(byte[0])) {
                            return Some(sig);
                        }
                    }
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    _ => return None,
                }
            }
        }

        pub fn as_fd(&self) -> BorrowedFd<'_> {
            self.0.as_fd()
        }
    }
}
