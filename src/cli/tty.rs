//! Terminal and process plumbing for the CLI: raw mode with guaranteed
//! restore, the window size, the signals forwarded to the sandboxed
//! command, `pre_exec` steps for the helper, and adopting an inherited
//! descriptor.
//!
//! This module owns every `unsafe` call the CLI makes. It must never leave
//! the user's terminal in raw mode on a normal return, and never install a
//! signal handler (signals are blocked and read through `super::signals`).

use std::io;
use std::os::fd::{AsFd, BorrowedFd, FromRawFd, OwnedFd};
use std::sync::Mutex;

use boxdesk_channel::WinSize;
use nix::sys::signal::{SigSet, SigmaskHow, Signal};
use nix::sys::termios::{self, SetArg, Termios};

/// Takes ownership of an inherited descriptor after checking it is open,
/// and marks it close-on-exec so no child inherits it.
pub fn adopt_fd(fd: i32) -> io::Result<OwnedFd> {
    if fd < 3 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "not a spare descriptor",
        ));
    }
    // SAFETY: F_GETFD only queries the descriptor table.
    if unsafe { libc::fcntl(fd, libc::F_GETFD) } == -1 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: F_SETFD on a descriptor just shown to be open.
    if unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) } == -1 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the descriptor is open and was handed to this process for
    // it alone (by `boxdesk run`); nothing else in the process owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Whether `fd` is a terminal.
pub fn is_tty(fd: BorrowedFd<'_>) -> bool {
    termios::tcgetattr(fd).is_ok()
}

/// Standard input as a borrowed descriptor.
pub fn stdin_fd() -> BorrowedFd<'static> {
    // SAFETY: descriptor 0 stays open for the life of the process.
    unsafe { BorrowedFd::borrow_raw(0) }
}

/// Standard output as a borrowed descriptor.
pub fn stdout_fd() -> BorrowedFd<'static> {
    // SAFETY: descriptor 1 stays open for the life of the process.
    unsafe { BorrowedFd::borrow_raw(1) }
}

/// Whether stdin is `/dev/null` (nothing to read: send EOF at once).
pub fn stdin_is_dev_null() -> bool {
    use nix::sys::stat::{fstat, stat};
    let (Ok(stdin), Ok(null)) = (fstat(0), stat("/dev/null")) else {
        return false;
    };
    stdin.st_mode & libc::S_IFMT == libc::S_IFCHR && stdin.st_rdev == null.st_rdev
}

/// The size of the terminal on stdout (or stdin), 80×24 if neither is one.
pub fn window_size() -> WinSize {
    for fd in [stdout_fd(), stdin_fd()] {
        let mut ws = libc::winsize {
            ws_row: 0,
            ws_col: 0,
            ws_xpixel: 0,
            ws_ypixel: 0,
        };
        // SAFETY: TIOCGWINSZ writes one `winsize` into the struct we own.
        let rc = unsafe {
            libc::ioctl(
                std::os::fd::AsRawFd::as_raw_fd(&fd),
                libc::TIOCGWINSZ,
                &mut ws,
            )
        };
        if rc == 0 && ws.ws_col > 0 && ws.ws_row > 0 {
            return WinSize {
                cols: ws.ws_col,
                rows: ws.ws_row,
            };
        }
    }
    WinSize { cols: 80, rows: 24 }
}

/// The settings raw mode replaced, for [`restore`] from any thread.
static SAVED: Mutex<Option<Termios>> = Mutex::new(None);

/// Raw mode on stdin while alive; the saved settings come back on drop.
pub struct RawMode(());

impl RawMode {
    /// Puts stdin's terminal in raw mode; `None` when stdin is no terminal.
    pub fn enter() -> Option<RawMode> {
        let fd = stdin_fd();
        let saved = termios::tcgetattr(fd).ok()?;
        let mut raw = saved.clone();
        termios::cfmakeraw(&mut raw);
        *boxdesk_platform::sync::lock(&SAVED) = Some(saved);
        termios::tcsetattr(fd, SetArg::TCSANOW, &raw).ok()?;
        Some(RawMode(()))
    }
}

impl Drop for RawMode {
    fn drop(&mut self) {
        restore();
    }
}

/// Puts back the terminal settings raw mode replaced, if any; for a
/// thread that must exit the process while raw mode is on.
pub fn restore() {
    if let Some(saved) = boxdesk_platform::sync::lock(&SAVED).take() {
        let _ = termios::tcsetattr(stdin_fd().as_fd(), SetArg::TCSANOW, &saved);
    }
}

/// What a container's monitor forwards besides [`forwarded_signals`]:
/// the other signals an engine's `kill` may send that would end or stop
/// a process (SIGKILL and SIGSTOP cannot be caught: they act on the
/// monitor itself).
#[cfg(target_os = "linux")]
pub const CONTAINER_SIGNALS: &[Signal] = &[
    Signal::SIGUSR1,
    Signal::SIGUSR2,
    Signal::SIGALRM,
    Signal::SIGPWR,
    Signal::SIGCONT,
    Signal::SIGTSTP,
    Signal::SIGTTIN,
    Signal::SIGTTOU,
    Signal::SIGVTALRM,
    Signal::SIGPROF,
    Signal::SIGXCPU,
    Signal::SIGXFSZ,
    Signal::SIGIO,
    Signal::SIGABRT,
    Signal::SIGTRAP,
    Signal::SIGSYS,
    Signal::SIGSTKFLT,
    Signal::SIGURG,
];

/// The signals the CLI forwards to the command instead of dying of them.
pub fn forwarded_signals() -> SigSet {
    let mut set = SigSet::empty();
    for s in [
        Signal::SIGINT,
        Signal::SIGTERM,
        Signal::SIGHUP,
        Signal::SIGQUIT,
        Signal::SIGWINCH,
    ] {
        set.add(s);
    }
    set
}

/// Blocks `set` in the calling thread (and the threads it starts later),
/// so one thread can take them with `sigwait`.
pub fn block(set: &SigSet) -> io::Result<()> {
    nix::sys::signal::pthread_sigmask(SigmaskHow::SIG_BLOCK, Some(set), None)
        .map_err(io::Error::from)
}

/// Puts the calling process in its own process group and (on Linux) asks
/// the kernel to send it SIGTERM when its parent dies; for a foreground
/// helper. macOS has no parent-death signal: there a foreground `run`
/// killed outright leaves its helper running until `boxdesk stop`.
///
/// # Safety
///
/// Only for use in a `pre_exec` hook: it calls async-signal-safe
/// functions only.
pub unsafe fn child_of_foreground(parent: libc::pid_t) -> io::Result<()> {
    // SAFETY: setpgid, prctl and getppid are async-signal-safe syscalls.
    unsafe {
        if libc::setpgid(0, 0) == -1 {
            return Err(io::Error::last_os_error());
        }
        #[cfg(target_os = "linux")]
        if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM as libc::c_ulong) == -1 {
            return Err(io::Error::last_os_error());
        }
        if libc::getppid() != parent {
            // The parent died before the death signal was armed.
            libc::_exit(1);
        }
    }
    Ok(())
}

/// Starts a new session for a detached helper, away from the terminal.
///
/// # Safety
///
/// Only for use in a `pre_exec` hook.
pub unsafe fn child_detached() -> io::Result<()> {
    // SAFETY: setsid is an async-signal-safe syscall.
    if unsafe { libc::setsid() } == -1 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Moves `fd` to descriptor `to` without close-on-exec, in a child.
///
/// # Safety
///
/// Only for use in a `pre_exec` hook, with `fd` open.
pub unsafe fn place_fd(fd: i32, to: i32) -> io::Result<()> {
    // SAFETY: dup2 and fcntl are async-signal-safe; `fd` is open.
    unsafe {
        if fd == to {
            if libc::fcntl(to, libc::F_SETFD, 0) == -1 {
                return Err(io::Error::last_os_error());
            }
        } else if libc::dup2(fd, to) == -1 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// A pipe whose ends are close-on-exec: atomically (`pipe2`) on Linux;
/// elsewhere (macOS has no `pipe2`) flagged right after it is made.
pub fn cloexec_pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    #[cfg(target_os = "linux")]
    let fds = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;
    #[cfg(not(target_os = "linux"))]
    let fds = {
        use nix::fcntl::{fcntl, FcntlArg, FdFlag};
        use std::os::fd::AsRawFd;
        let fds = nix::unistd::pipe()?;
        for fd in [&fds.0, &fds.1] {
            fcntl(fd.as_raw_fd(), FcntlArg::F_SETFD(FdFlag::FD_CLOEXEC))?;
        }
        fds
    };
    Ok(fds)
}
