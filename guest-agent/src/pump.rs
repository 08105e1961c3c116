//! The `poll(2)` loop of one running exec: socket, the child's stdout and
//! stderr pipes (or its PTY master), its stdin, and the wake-up pipe the
//! reaper writes when the child exits — until Exit, TimedOut or the end of
//! the session.
//!
//! Back-pressure: child output is read only when the socket has taken
//! everything queued before, so the agent holds at most about one output
//! frame per stream however slow the host is; the socket is read only while
//! stdin has room. Ending: Exit goes out once the child has exited and its
//! output has reached EOF, or — when a background process still holds the
//! pipe — [`DRAIN_GRACE`] after the exit, after a last read of whatever the
//! pipe still holds. A timeout kills the process group and ends in
//! TimedOut; the drain grace never does. A host frame that stops half-way
//! for `conn::STALL` while the socket is being read is a protocol error
//! (the time stdin is full and the socket not read does not count). The
//! rest of the exec's session is `sweep`'s, after this loop.
//!
//! Never: block on one descriptor, buffer output the socket has not
//! accepted, or signal anything but the exec's own process group.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::time::{Duration, Instant};

use boxdesk_channel::{Frame, Tag};

use crate::conn::{Conn, ConnError, Pull};
use crate::fdio;
use crate::reaper::{ExitSlot, Registry};
use crate::spawn::{ChildIo, Spawned};
use crate::stdin::{Feed, Stdin};

/// How long after the child's exit its output may still be read before
/// Exit is sent anyway (a backgrounded grandchild may hold the pipe open).
pub const DRAIN_GRACE: Duration = Duration::from_millis(200);
/// Largest output frame: one pipe-buffer's worth.
const OUTPUT_CHUNK: usize = 64 * 1024;
/// Output chunks read in one go while the socket keeps up.
const BURST: usize = 16;
/// Output a PTY may still hold after the drain grace.
const PTY_DRAIN_BUDGET: usize = 1 << 20;

/// How an exec's loop ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The child exited with this status and its output is all queued.
    Exit(i32),
    /// The deadline passed; the process group was killed.
    TimedOut,
    /// The session is over: the host disconnected, or an Error was queued
    /// and the process group killed.
    Ended,
    /// The host asked the agent to shut down.
    Shutdown,
}

/// Why the pump stopped unexpectedly (logged, never sent as is).
#[derive(Debug, thiserror::Error)]
pub enum PumpError {
    /// poll(2) itself failed.
    #[error("poll: {0}")]
    Poll(io::Error),
}

struct Output {
    tag: Tag,
    fd: OwnedFd,
    open: bool,
    pty: bool,
    /// Bytes still allowed after the drain grace.
    budget: usize,
}

/// One exec in flight.
pub struct Pump<'w> {
    conn: &'w mut Conn,
    pid: i32,
    pidfd: Option<OwnedFd>,
    registry: &'w Registry,
    slot: &'w ExitSlot,
    wake: OwnedFd,
    outputs: Vec<Output>,
    stdin: Stdin,
    deadline: Option<Instant>,
    exited: Option<(i32, Instant)>,
    final_drain: bool,
    told_after_eof: bool,
    /// Whether the socket was being read at the last turn of the loop.
    reading: bool,
}

#[derive(Clone, Copy)]
enum Role {
    Socket,
    Output(usize),
    StdinPipe,
    Wake,
    PidFd,
}

impl<'w> Pump<'w> {
    /// A pump for a just-started child; `timeout_ms` 0 means no deadline.
    pub fn new(
        conn: &'w mut Conn,
        child: Spawned,
        registry: &'w Registry,
        slot: &'w ExitSlot,
        wake: OwnedFd,
        timeout_ms: u32,
    ) -> Pump<'w> {
        let deadline =
            (timeout_ms != 0).then(|| Instant::now() + Duration::from_millis(timeout_ms.into()));
        let output = |tag, fd, pty| Output {
            tag,
            fd,
            open: true,
            pty,
            budget: 0,
        };
        let (outputs, stdin) = match child.io {
            ChildIo::Pipes {
                stdin,
                stdout,
                stderr,
            } => (
                vec![
                    output(Tag::Stdout, stdout, false),
                    output(Tag::Stderr, stderr, false),
                ],
                Stdin::pipe(stdin),
            ),
            ChildIo::Pty(master) => (vec![output(Tag::Stdout, master, true)], Stdin::pty()),
        };
        Pump {
            conn,
            pid: child.pid,
            pidfd: child.pidfd,
            registry,
            slot,
            wake,
            outputs,
            stdin,
            deadline,
            exited: None,
            final_drain: false,
            told_after_eof: false,
            reading: true,
        }
    }

    /// Runs the exec to its end.
    pub fn run(mut self) -> Outcome {
        let mut fds: Vec<libc::pollfd> = Vec::with_capacity(6);
        let mut roles: Vec<Role> = Vec::with_capacity(6);
        loop {
            if let Err(end) = self.take_frames() {
                return end;
            }
            self.check_exit();
            if let Some(outcome) = self.finished() {
                return outcome;
            }
            if let Err(end) = self.check_stall() {
                return end;
            }
            if self.final_drain && self.conn.pending_out() == 0 {
                self.drain_once();
                continue;
            }
            fds.clear();
            roles.clear();
            self.interest(&mut fds, &mut roles);
            if let Err(e) = fdio::poll(&mut fds, self.next_timer()) {
                log!("exec {}: {}", self.pid, PumpError::Poll(e));
                return self.end_with_kill();
            }
            for (pfd, role) in fds.iter().zip(roles.iter()) {
                if pfd.revents != 0 {
                    if let Err(end) = self.on_ready(*role, pfd.revents) {
                        return end;
                    }
                }
            }
        }
    }

    fn master(&self) -> Option<BorrowedFd<'_>> {
        self.outputs.iter().find(|o| o.pty).map(|o| o.fd.as_fd())
    }

    fn interest(&self, fds: &mut Vec<libc::pollfd>, roles: &mut Vec<Role>) {
        let mut sock = libc::POLLRDHUP;
        if !self.stdin.is_full() {
            sock |= libc::POLLIN;
        }
        if self.conn.pending_out() > 0 {
            sock |= libc::POLLOUT;
        }
        fds.push(fdio::pollfd(self.conn.fd(), sock));
        roles.push(Role::Socket);
        let may_read = self.conn.pending_out() == 0;
        for (i, o) in self.outputs.iter().enumerate() {
            let mut ev = 0;
            if o.open && may_read {
                ev |= libc::POLLIN;
            }
            if o.pty && self.stdin.wants_write() {
                ev |= libc::POLLOUT;
            }
            // A descriptor is left out rather than polled for nothing:
            // POLLHUP is reported even with no events asked for.
            if ev != 0 {
                fds.push(fdio::pollfd(o.fd.as_fd(), ev));
                roles.push(Role::Output(i));
            }
        }
        if let (Some(fd), true) = (self.stdin.pipe_fd(), self.stdin.wants_write()) {
            fds.push(fdio::pollfd(fd, libc::POLLOUT));
            roles.push(Role::StdinPipe);
        }
        if self.exited.is_none() {
            fds.push(fdio::pollfd(self.wake.as_fd(), libc::POLLIN));
            roles.push(Role::Wake);
            if let Some(fd) = &self.pidfd {
                fds.push(fdio::pollfd(fd.as_fd(), libc::POLLIN));
                roles.push(Role::PidFd);
            }
        }
    }

    /// The next moment the loop must wake up without an event.
    fn next_timer(&self) -> Option<Duration> {
        let at = match self.exited {
            None => self.deadline,
            Some((_, at)) if !self.final_drain => Some(at + DRAIN_GRACE),
            Some(_) => None,
        };
        let stall = self.reading.then(|| self.conn.stall_deadline()).flatten();
        fdio::until(match (at, stall) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        })
    }

    /// Ends the session when a host frame stopped half-way for
    /// `conn::STALL` while the socket was read.
    fn check_stall(&mut self) -> Result<(), Outcome> {
        let reading = !self.stdin.is_full();
        if reading && !self.reading {
            self.conn.restart_stall_clock();
        }
        self.reading = reading;
        match self.conn.stall_deadline() {
            Some(d) if reading && Instant::now() >= d => {
                Err(self.fail(&ConnError::Stalled.to_string()))
            }
            _ => Ok(()),
        }
    }

    fn on_ready(&mut self, role: Role, revents: libc::c_short) -> Result<(), Outcome> {
        match role {
            Role::Socket => self.on_socket(revents),
            Role::Output(i) => {
                if self.outputs[i].pty && fdio::writable(revents) && self.stdin.wants_write() {
                    self.feed_stdin()?;
                }
                if self.outputs[i].open && fdio::readable(revents) {
                    self.read_output(i)?;
                }
                Ok(())
            }
            Role::StdinPipe => self.feed_stdin(),
            Role::Wake => {
                let mut buf = [0u8; 16];
                while matches!(fdio::read(self.wake.as_fd(), &mut buf), Ok(n) if n > 0) {}
                self.check_exit();
                Ok(())
            }
            Role::PidFd => {
                self.registry.try_reap(self.pid);
                self.check_exit();
                if self.exited.is_none() {
                    // Readable yet nothing to reap: leave it to the reaper's
                    // wake-up rather than spin on a level-triggered fd.
                    self.pidfd = None;
                }
                Ok(())
            }
        }
    }

    fn on_socket(&mut self, revents: libc::c_short) -> Result<(), Outcome> {
        if fdio::writable(revents) {
            self.flush()?;
        }
        if self.stdin.is_full() {
            // Not reading: a hang-up is still a disconnect.
            if revents & (libc::POLLRDHUP | libc::POLLHUP | libc::POLLERR) != 0 {
                return Err(self.end_with_kill());
            }
            return Ok(());
        }
        if !fdio::readable(revents) && revents & libc::POLLRDHUP == 0 {
            return Ok(());
        }
        match self.conn.fill() {
            Ok(Pull::Data(_)) | Ok(Pull::Again) => Ok(()),
            Ok(Pull::Eof) if self.conn.has_partial_frame() => {
                Err(self.fail("peer closed the stream in the middle of a frame"))
            }
            // EOF (close or half-close) before Exit is a disconnect.
            Ok(Pull::Eof) => Err(self.end_with_kill()),
            Err(_) => Err(self.end_with_kill()),
        }
    }

    /// Handles every whole frame already received, while stdin has room.
    fn take_frames(&mut self) -> Result<(), Outcome> {
        while !self.stdin.is_full() {
            match self.conn.next_frame() {
                Ok(Some(frame)) => self.on_frame(frame)?,
                Ok(None) => return Ok(()),
                Err(e) => return Err(self.fail(&e.to_string())),
            }
        }
        Ok(())
    }

    fn on_frame(&mut self, frame: Frame) -> Result<(), Outcome> {
        match frame {
            Frame::Stdin(data) => {
                let master = self.outputs.iter().find(|o| o.pty).map(|o| o.fd.as_fd());
                let veof = || master.map_or(0x04, crate::pty::veof);
                if self.stdin.push(data, veof).is_err() && !self.told_after_eof {
                    // Answered once and the session continues (docs/CHANNEL.md).
                    self.told_after_eof = true;
                    self.queue(Frame::error("stdin data after stdin EOF ignored"))?;
                }
                self.feed_stdin()
            }
            Frame::Resize(ws) => match self.master() {
                Some(m) => {
                    if let Err(e) = crate::pty::set_size(m, ws) {
                        log!("exec {}: resize: {e}", self.pid);
                    }
                    Ok(())
                }
                None => self.queue(Frame::error("Resize on a pipe exec ignored (no PTY)")),
            },
            Frame::Signal(sig) => {
                // A negative number is for the exec's own process only (an
                // OCI container's init, as `kill` means it), a positive one
                // for its whole process group.
                let Some(n) = sig.checked_abs() else {
                    return Err(self.fail(&format!("EINVAL: signal {sig}")));
                };
                let target = if sig < 0 { self.pid } else { -self.pid };
                // SAFETY: kill has no memory arguments; -pid is the
                // exec's own process group (the child called setsid).
                if unsafe { libc::kill(target, n) } != 0 {
                    let e = io::Error::last_os_error();
                    if e.raw_os_error() != Some(libc::ESRCH) {
                        return Err(self.fail(&format!("EINVAL: signal {sig}: {e}")));
                    }
                }
                Ok(())
            }
            Frame::Shutdown => {
                self.kill_group();
                Err(Outcome::Shutdown)
            }
            other => Err(self.fail(&format!(
                "unexpected {:?} frame during an exec",
                other.tag()
            ))),
        }
    }

    fn queue(&mut self, frame: Frame) -> Result<(), Outcome> {
        match self.conn.queue(&frame) {
            Ok(()) => Ok(()),
            Err(_) => Err(self.end_with_kill()),
        }
    }

    fn feed_stdin(&mut self) -> Result<(), Outcome> {
        let master = self.outputs.iter().find(|o| o.pty).map(|o| o.fd.as_fd());
        match self.stdin.feed(master) {
            Ok(Feed::Ok) | Ok(Feed::Gone) => Ok(()),
            Err(e) => {
                log!("exec {}: stdin: {e}", self.pid);
                self.stdin.finish();
                Ok(())
            }
        }
    }

    /// Reads output into frames while the socket takes each one whole, up
    /// to [`BURST`] chunks (then the other descriptors get their turn): a
    /// busy stream costs a read and a send per chunk, not a poll as well.
    fn read_output(&mut self, i: usize) -> Result<(), Outcome> {
        for _ in 0..BURST {
            if self.conn.pending_out() > 0 || !self.outputs[i].open {
                return Ok(());
            }
            let o = &mut self.outputs[i];
            match self.conn.queue_output(o.tag, o.fd.as_fd(), OUTPUT_CHUNK) {
                Ok(Pull::Data(n)) => o.budget = o.budget.saturating_sub(n),
                Ok(Pull::Again) => return Ok(()),
                // EIO is how a PTY master reports that every slave is closed.
                Ok(Pull::Eof) | Err(_) => o.open = false,
            }
            self.flush()?;
        }
        Ok(())
    }

    /// After the drain grace: take what each output holds right now, up
    /// to its budget, and close it at the first empty read.
    fn drain_once(&mut self) {
        for i in 0..self.outputs.len() {
            if !self.outputs[i].open || self.conn.pending_out() > 0 {
                continue;
            }
            let o = &mut self.outputs[i];
            match self.conn.queue_output(o.tag, o.fd.as_fd(), OUTPUT_CHUNK) {
                Ok(Pull::Data(n)) => {
                    o.budget = o.budget.saturating_sub(n);
                    if o.budget == 0 {
                        o.open = false;
                    }
                }
                Ok(_) | Err(_) => o.open = false,
            }
            if self.conn.flush_some().is_err() {
                self.outputs.iter_mut().for_each(|o| o.open = false);
            }
        }
    }

    fn check_exit(&mut self) {
        if self.exited.is_none() {
            if let Some(code) = self.slot.status() {
                self.exited = Some((code, Instant::now()));
            }
        }
    }

    fn finished(&mut self) -> Option<Outcome> {
        let now = Instant::now();
        match self.exited {
            None => match self.deadline {
                Some(d) if now >= d => {
                    self.kill_group();
                    Some(Outcome::TimedOut)
                }
                _ => None,
            },
            Some((code, _)) if self.outputs.iter().all(|o| !o.open) => Some(Outcome::Exit(code)),
            Some((_, at)) => {
                if !self.final_drain && now >= at + DRAIN_GRACE {
                    self.final_drain = true;
                    for o in &mut self.outputs {
                        o.budget = drain_budget(o);
                    }
                }
                None
            }
        }
    }

    fn kill_group(&self) {
        // SAFETY: kill has no memory arguments; the target is the exec's
        // own process group.
        unsafe { libc::kill(-self.pid, libc::SIGKILL) };
    }

    /// Queues an Error, kills the process group, ends the session.
    fn fail(&mut self, msg: &str) -> Outcome {
        let _ = self.conn.queue(&Frame::error(msg));
        self.end_with_kill()
    }

    /// Sends what the socket takes now of the queued output. A failed
    /// send ends the session as [`Self::end_with_kill`]; anything but the
    /// peer being gone is said in the agent's log first (the host only
    /// sees the session end).
    fn flush(&mut self) -> Result<(), Outcome> {
        if self.conn.pending_out() == 0 {
            return Ok(());
        }
        let Err(e) = self.conn.flush_some() else {
            return Ok(());
        };
        let gone = matches!(
            e.kind(),
            io::ErrorKind::BrokenPipe | io::ErrorKind::ConnectionReset
        );
        if !gone {
            log!("exec {}: {}", self.pid, ConnError::Io(e));
        }
        Err(self.end_with_kill())
    }

    fn end_with_kill(&mut self) -> Outcome {
        self.kill_group();
        Outcome::Ended
    }
}

/// What an output may still hold once nothing writes to it any more: a
/// pipe's capacity (plus slack), or a generous bound for a PTY.
fn drain_budget(o: &Output) -> usize {
    if o.pty {
        return PTY_DRAIN_BUDGET;
    }
    // SAFETY: F_GETPIPE_SZ takes no argument and only reads the fd's state.
    let size = unsafe { libc::fcntl(o.fd.as_raw_fd(), libc::F_GETPIPE_SZ) };
    usize::try_from(size).unwrap_or(OUTPUT_CHUNK) + OUTPUT_CHUNK
}
