//! The front door: the accept loop, and every connection from its accept
//! until its peer's session header is in. One thread polls the listener,
//! the connections still owing their header, and the refused ones being
//! closed. A connection whose header is in goes to a session thread
//! (`workers`); one still owing part of it goes to a worker only if one is
//! idle anyway (which waits for the rest, as on the normal path a client's
//! header is a moment behind its connect), else it waits here. So a
//! connection that never sends a header costs a descriptor and a few
//! bytes, never a new thread or a buffer.
//!
//! Owns the connection cap and its slots ([`Conn`]), the header deadline,
//! the refusal, and the flood warnings. The rules:
//!
//! * at most [`MAX_CONNECTIONS`] connections at once, counted from accept
//!   until their session ends (waiting for a header or in a session);
//! * past the cap a connection gets our header and one Error frame
//!   (`EAGAIN: too many connections …`), then our side is shut down;
//!   what the peer then sends is read and dropped for [`REFUSAL_LINGER`]
//!   (at most [`MAX_LINGERING`] of them at once), so the peer's own
//!   header and request are written without `EPIPE` and the peer reads
//!   the Error before EOF — a client sees "too many connections", not a
//!   broken pipe;
//! * a peer that has not sent its whole header within [`HEADER_TIMEOUT`]
//!   is closed; a wrong header is closed at once with no frame
//!   (docs/CHANNEL.md);
//! * a flood is one log line, then at most one more per [`WARN_EVERY`].
//!
//! It must never block on a peer (every socket here is non-blocking), never
//! read past a peer's 6 header bytes (what follows is the session's), and
//! never let a refused or failed connection stop the loop.

use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use boxdesk_channel::blocking::check_header;
use boxdesk_channel::{session_header, Frame, HEADER_LEN};
use nix::sys::socket::{send, shutdown, MsgFlags, Shutdown};
use zeroize::Zeroize;

use crate::agent::Agent;
use crate::fdio;
use crate::listen::Listener;
use crate::workers::Workers;

/// Most connections served at once (waiting for a header or in a session).
pub const MAX_CONNECTIONS: usize = 1024;
/// How long a peer has to send its 6-byte session header.
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a refused connection is kept open, reading and dropping what
/// its peer sends, before it is closed.
const REFUSAL_LINGER: Duration = Duration::from_secs(2);
/// Refused connections kept open at once; past this they close at once.
const MAX_LINGERING: usize = 64;
/// At most one flood warning of a kind per this long.
const WARN_EVERY: Duration = Duration::from_secs(10);
/// Connections accepted per wake-up before the others get their turn.
const ACCEPT_BATCH: usize = 64;
/// Pause after an accept error such as `EMFILE`, which would otherwise
/// wake the loop again at once.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);

/// Why the accept loop stopped.
#[derive(Debug, thiserror::Error)]
pub enum GateError {
    /// `poll(2)` over the listener failed.
    #[error("accept loop: {0}")]
    Poll(io::Error),
}

/// One connection's place under the cap; the place is freed on drop.
pub struct Slot(Arc<AtomicUsize>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// An accepted connection holding its place under the cap until dropped,
/// with what has arrived of its peer's session header.
pub struct Conn {
    fd: OwnedFd,
    slot: Slot,
    got: [u8; HEADER_LEN],
    have: usize,
    deadline: Instant,
}

impl Conn {
    /// Reads what is there of the peer's header, without waiting.
    fn read_header(&mut self) -> Header {
        while self.have < HEADER_LEN {
            match fdio::read(self.fd.as_fd(), &mut self.got[self.have..]) {
                Ok(0) => return Header::Gone,
                Ok(n) => self.have += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Header::More,
                Err(_) => return Header::Gone,
            }
        }
        Header::Done
    }

    /// On a session thread: waits for the rest of the peer's header (until
    /// [`HEADER_TIMEOUT`] after the accept) and checks it. False: close at
    /// once, with no frame.
    pub fn header_blocking(&mut self) -> bool {
        loop {
            match self.read_header() {
                Header::Done => return check_header(self.got).is_ok(),
                Header::Gone => return false,
                Header::More => {}
            }
            if Instant::now() >= self.deadline {
                return false;
            }
            let mut fds = [fdio::pollfd(self.fd.as_fd(), libc::POLLIN)];
            if fdio::poll(&mut fds, fdio::until(Some(self.deadline))).is_err() {
                return false;
            }
        }
    }

    /// The socket (close-on-exec, non-blocking) and its place under the
    /// cap, to be dropped when the session is over.
    pub fn into_parts(self) -> (OwnedFd, Slot) {
        (self.fd, self.slot)
    }
}

/// A refused connection being closed gently.
struct Lingering {
    fd: OwnedFd,
    deadline: Instant,
}

/// One kind of flood warning: the first line at once, then at most one
/// per [`WARN_EVERY`], counting what was not logged.
#[derive(Default)]
struct Warn {
    last: Option<Instant>,
    unsaid: u64,
}

impl Warn {
    /// Counts `n` events; logs `line(events since the last line)` when the
    /// last line is old enough.
    fn hit(&mut self, now: Instant, n: u64, line: impl FnOnce(u64) -> String) {
        self.unsaid += n;
        if n == 0 || self.last.is_some_and(|t| now < t + WARN_EVERY) {
            return;
        }
        log!("{}", line(self.unsaid));
        self.last = Some(now);
        self.unsaid = 0;
    }
}

/// The accept loop's state.
pub struct Gate<'a> {
    listener: &'a Listener,
    stop: &'a OwnedFd,
    agent: &'a Arc<Agent>,
    workers: Arc<Workers>,
    open: Arc<AtomicUsize>,
    /// Connections whose header is not all in, no worker being idle.
    pending: Vec<Conn>,
    lingering: Vec<Lingering>,
    full: Warn,
    silent: Warn,
    failed: Warn,
    foreign: Warn,
}

impl<'a> Gate<'a> {
    /// A gate over `listener` that stops when `stop` turns readable.
    pub fn new(listener: &'a Listener, stop: &'a OwnedFd, agent: &'a Arc<Agent>) -> Gate<'a> {
        Gate {
            listener,
            stop,
            agent,
            workers: Arc::new(Workers::default()),
            open: Arc::new(AtomicUsize::new(0)),
            pending: Vec::new(),
            lingering: Vec::new(),
            full: Warn::default(),
            silent: Warn::default(),
            failed: Warn::default(),
            foreign: Warn::default(),
        }
    }

    /// Serves until `stop` is written.
    pub fn run(mut self) -> Result<(), GateError> {
        let mut fds: Vec<libc::pollfd> = Vec::new();
        loop {
            fds.clear();
            fds.push(fdio::pollfd(self.listener.fd(), libc::POLLIN));
            fds.push(fdio::pollfd(self.stop.as_fd(), libc::POLLIN));
            for p in &self.pending {
                fds.push(fdio::pollfd(p.fd.as_fd(), libc::POLLIN));
            }
            for l in &self.lingering {
                fds.push(fdio::pollfd(l.fd.as_fd(), libc::POLLIN));
            }
            let next = self
                .pending
                .iter()
                .map(|p| p.deadline)
                .chain(self.lingering.iter().map(|l| l.deadline))
                .min();
            fdio::poll(&mut fds, fdio::until(next)).map_err(GateError::Poll)?;
            if fds[1].revents != 0 {
                return Ok(());
            }
            let now = Instant::now();
            let (pending_ev, lingering_ev) = fds[2..].split_at(self.pending.len());
            let pending_ev: Vec<_> = pending_ev.iter().map(|f| f.revents).collect();
            let lingering_ev: Vec<_> = lingering_ev.iter().map(|f| f.revents).collect();
            self.step_pending(&pending_ev, now);
            self.step_lingering(&lingering_ev, now);
            if fds[0].revents != 0 {
                self.accept_some(now);
            }
        }
    }

    fn step_pending(&mut self, revents: &[libc::c_short], now: Instant) {
        let mut dropped = 0u64;
        let pending = std::mem::take(&mut self.pending);
        for (mut p, &ev) in pending.into_iter().zip(revents) {
            if ev != 0 {
                match p.read_header() {
                    Header::More => {}
                    Header::Done => {
                        self.start_session(p);
                        continue;
                    }
                    Header::Gone => continue,
                }
            }
            if now >= p.deadline {
                dropped += 1;
                continue;
            }
            self.pending.push(p);
        }
        self.silent.hit(now, dropped, |n| {
            format!(
                "closed {n} connection(s) that sent no session header within {}s",
                HEADER_TIMEOUT.as_secs()
            )
        });
    }

    fn step_lingering(&mut self, revents: &[libc::c_short], now: Instant) {
        let lingering = std::mem::take(&mut self.lingering);
        for (l, &ev) in lingering.into_iter().zip(revents) {
            if ev != 0 && !drain(&l.fd) {
                continue;
            }
            if now < l.deadline {
                self.lingering.push(l);
            }
        }
    }

    fn accept_some(&mut self, now: Instant) {
        for _ in 0..ACCEPT_BATCH {
            let fd = match self.listener.accept() {
                Ok(fd) => fd,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) => {
                    // EMFILE and friends: the listener stays readable, so
                    // pause rather than spin; say so once in a while.
                    self.failed
                        .hit(now, 1, |n| format!("accept: {e} ({n} time(s))"));
                    std::thread::sleep(ACCEPT_BACKOFF);
                    return;
                }
            };
            if let Err(uid) = self.listener.check_peer(&fd) {
                // Closed unanswered: not even the handshake goes to a peer
                // that is not the sandbox's owner.
                self.foreign.hit(now, 1, |n| {
                    format!("refused {n} connection(s) from uid {uid}: only the sandbox's owner may connect")
                });
                continue;
            }
            if self.open.load(Ordering::Relaxed) >= MAX_CONNECTIONS {
                self.full.hit(now, 1, |n| {
                    format!(
                        "too many connections ({MAX_CONNECTIONS} open): refused {n} connection(s)"
                    )
                });
                let msg = format!(
                    "EAGAIN: too many connections to the agent (at most {MAX_CONNECTIONS} \
                     at once); try again when some have ended"
                );
                self.refuse(fd, true, &msg, now);
                continue;
            }
            self.open.fetch_add(1, Ordering::Relaxed);
            let mut conn = Conn {
                fd,
                slot: Slot(Arc::clone(&self.open)),
                got: [0; HEADER_LEN],
                have: 0,
                deadline: now + HEADER_TIMEOUT,
            };
            if send_all(&conn.fd, &session_header()).is_err() {
                continue;
            }
            match conn.read_header() {
                Header::Done => self.start_session(conn),
                Header::Gone => {}
                // A worker that is idle anyway waits for the rest (no
                // extra hop through this thread on the normal path); with
                // none idle, it waits here, costing no thread.
                Header::More => {
                    if let Err(conn) = self.workers.hand_to_idle(conn) {
                        self.pending.push(conn);
                    }
                }
            }
        }
    }

    fn start_session(&mut self, conn: Conn) {
        if check_header(conn.got).is_err() {
            return; // wrong magic or version: close at once, no frames
        }
        if let Err((conn, e)) = self.workers.dispatch(conn, self.agent) {
            self.failed
                .hit(Instant::now(), 1, |n| format!("{e} ({n} time(s))"));
            let (fd, slot) = conn.into_parts();
            drop(slot);
            self.refuse(fd, false, &format!("EAGAIN: {e}"), Instant::now());
        }
    }

    /// Sends (our header and) one Error frame, shuts our side down, and
    /// keeps the socket a while to read and drop what the peer sends.
    fn refuse(&mut self, fd: OwnedFd, with_header: bool, msg: &str, now: Instant) {
        let mut bytes = Vec::with_capacity(128);
        if with_header {
            bytes.extend_from_slice(&session_header());
        }
        if Frame::error(msg).encode(&mut bytes).is_err() || send_all(&fd, &bytes).is_err() {
            return;
        }
        let _ = shutdown(fd.as_raw_fd(), Shutdown::Write);
        if self.lingering.len() < MAX_LINGERING && drain(&fd) {
            self.lingering.push(Lingering {
                fd,
                deadline: now + REFUSAL_LINGER,
            });
        }
    }
}

/// The outcome of reading what is there of a peer's header.
enum Header {
    /// Not all 6 bytes yet.
    More,
    /// All 6 bytes are in `got`.
    Done,
    /// The peer closed or the socket failed.
    Gone,
}

/// Writes `bytes` now or fails: a fresh socket has room for a header and a
/// short Error frame, and nothing here may wait for a peer.
fn send_all(fd: &OwnedFd, bytes: &[u8]) -> io::Result<()> {
    let mut at = 0;
    while at < bytes.len() {
        match send(
            fd.as_raw_fd(),
            &bytes[at..],
            MsgFlags::MSG_NOSIGNAL | MsgFlags::MSG_DONTWAIT,
        ) {
            Ok(n) => at += n,
            Err(nix::errno::Errno::EINTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// Reads and drops what a refused peer sent; false once it closed or the
/// socket failed.
fn drain(fd: &OwnedFd) -> bool {
    let mut scratch = [0u8; 4096];
    let open = loop {
        match fdio::read(fd.as_fd(), &mut scratch) {
            Ok(0) => break false,
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => break true,
            Err(_) => break false,
        }
    };
    // What a refused peer sent may be an Exec with secrets in its env.
    scratch.zeroize();
    open
}
