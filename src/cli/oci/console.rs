//! A container process's terminal: a pseudo-terminal whose master end goes
//! to the engine over `--console-socket` (`SCM_RIGHTS`, with the slave's
//! path as the message, as runc sends it) and whose slave end becomes this
//! process's stdio and controlling terminal. The exec relay then runs
//! against it as against a user's terminal: raw mode, its window size,
//! SIGWINCH when the engine resizes the master.
//!
//! This module owns that hand-over. It must never keep the master end.

use std::io::IoSlice;
use std::os::fd::{AsRawFd as _, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::Path;

use anyhow::Context as _;
use nix::sys::socket::{sendmsg, ControlMessage, MsgFlags};

/// Opens a terminal of `size` (rows, columns), sends its master end to
/// `socket`, and makes its slave end this process's stdin, stdout, stderr
/// and (where this process can lead a session) controlling terminal.
pub fn attach(socket: &Path, size: Option<(u16, u16)>) -> anyhow::Result<()> {
    let ws = size.map(|(rows, cols)| nix::pty::Winsize {
        ws_row: rows,
        ws_col: cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    });
    let pty = nix::pty::openpty(ws.as_ref(), None).context("opening a terminal")?;
    let name = nix::unistd::ttyname(&pty.slave)
        .map(|p| p.to_string_lossy().into_owned())
        .unwrap_or_default();
    let stream = UnixStream::connect(socket)
        .with_context(|| format!("connecting to --console-socket {}", socket.display()))?;
    let fds = [pty.master.as_raw_fd()];
    sendmsg::<()>(
        stream.as_raw_fd(),
        &[IoSlice::new(name.as_bytes())],
        &[ControlMessage::ScmRights(&fds)],
        MsgFlags::empty(),
        None,
    )
    .context("sending the terminal to --console-socket")?;
    drop(pty.master);
    become_terminal(pty.slave)
}

/// The slave end as stdio and, when possible, the controlling terminal.
fn become_terminal(slave: OwnedFd) -> anyhow::Result<()> {
    // A process group leader cannot start a session; it then keeps the
    // terminal as stdio only (no SIGWINCH on a resize).
    if nix::unistd::setsid().is_ok() {
        // SAFETY: TIOCSCTTY on a terminal descriptor we own, argument 0.
        unsafe { libc::ioctl(slave.as_raw_fd(), libc::TIOCSCTTY, 0) };
    }
    for fd in 0..3 {
        nix::unistd::dup2(slave.as_raw_fd(), fd).context("placing the terminal")?;
    }
    Ok(())
}
