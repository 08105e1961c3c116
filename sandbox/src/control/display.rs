//! A `display` stream of the control socket: the lease of a sandbox's
//! [`Screen`]. The reply is one line, `ok <layout>`, carrying a read-only
//! descriptor of the frame slots (`SCM_RIGHTS`); then one line per record
//! (`present SLOT SEQ X Y W H`, `mode W H`) until the holder closes, a
//! newer lease replaces this one (`end replaced`) or the sandbox stops
//! (`end stopped`).
//!
//! This module owns the stream's pacing: records are taken from the
//! screen only when the previous one is fully written, so a holder that
//! reads slowly gets coalesced records (the screen's rule) and one that
//! never reads holds only this connection's thread — never the VM, never
//! another connection. What the holder sends after `display` is read and
//! dropped; its end of stream ends the lease.

use std::io::{self, IoSlice, Read, Write};
use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::net::UnixStream;
use std::time::Duration;

use boxdesk_platform::screen::{Record, Screen};
use nix::sys::socket::{sendmsg, ControlMessage, MsgFlags};

/// No SIGPIPE from a holder gone (macOS has no such flag: there the
/// process ignores SIGPIPE, as Rust binaries and the helper do).
#[cfg(any(target_os = "linux", target_os = "android"))]
const NO_SIGNAL: MsgFlags = MsgFlags::MSG_NOSIGNAL;
#[cfg(not(any(target_os = "linux", target_os = "android")))]
const NO_SIGNAL: MsgFlags = MsgFlags::empty();

/// How long one wait for a record, or one write, may take before the
/// stream looks at its peer again.
const TICK: Duration = Duration::from_millis(200);

/// Serves a lease of `screen` on `stream` until it ends.
pub fn serve(stream: &mut UnixStream, screen: &Screen) {
    let lease = screen.lease();
    // The layout after the lease began: a mode change from here on is a
    // record of this lease.
    let reply = format!("ok {}\n", screen.layout());
    let fd = match screen.reader_fd() {
        Ok(fd) => fd,
        Err(e) => {
            let _ = stream.write_all(format!("err cannot share the display: {e}\n").as_bytes());
            return;
        }
    };
    let fds = [fd.as_raw_fd()];
    let sent = sendmsg::<()>(
        stream.as_raw_fd(),
        &[IoSlice::new(reply.as_bytes())],
        &[ControlMessage::ScmRights(&fds)],
        NO_SIGNAL,
        None,
    );
    match sent {
        Ok(n) if n == reply.len() => {}
        Ok(n) => {
            if stream.write_all(&reply.as_bytes()[n..]).is_err() {
                return;
            }
        }
        Err(e) => {
            tracing::debug!("display: cannot send the lease: {e}");
            return;
        }
    }
    drop(fd);
    if stream.set_write_timeout(Some(TICK)).is_err() {
        return;
    }
    let mut out: Vec<u8> = Vec::new();
    loop {
        if out.is_empty() {
            match lease.next(TICK) {
                Some(record) => {
                    out = format!("{record}\n").into_bytes();
                    if let Record::End(_) = record {
                        let _ = stream.set_write_timeout(Some(Duration::from_secs(5)));
                        let _ = stream.write_all(&out);
                        return;
                    }
                }
                None => {
                    if peer_gone(stream) {
                        return;
                    }
                    continue;
                }
            }
        }
        match stream.write(&out) {
            Ok(n) => {
                out.drain(..n);
            }
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock
                        | io::ErrorKind::TimedOut
                        | io::ErrorKind::Interrupted
                ) =>
            {
                if peer_gone(stream) {
                    return;
                }
            }
            Err(_) => return,
        }
    }
}

/// Whether the holder closed its end (what it sent is read and dropped).
fn peer_gone(stream: &mut UnixStream) -> bool {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    let mut fds = [PollFd::new(stream.as_fd(), PollFlags::POLLIN)];
    match poll(&mut fds, PollTimeout::ZERO) {
        Ok(0) => return false,
        Ok(_) => {}
        Err(_) => return true,
    }
    let revents = fds[0].revents().unwrap_or(PollFlags::empty());
    if revents.intersects(PollFlags::POLLERR | PollFlags::POLLNVAL) {
        return true;
    }
    let mut sink = [0u8; 4096];
    if stream.set_nonblocking(true).is_err() {
        return true;
    }
    let mut left = 64 * 1024usize;
    let gone = loop {
        match stream.read(&mut sink) {
            Ok(0) => break true,
            Ok(n) if n < left => left -= n,
            Ok(_) => break false,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => break false,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => break true,
        }
    };
    gone || stream.set_nonblocking(false).is_err()
}
