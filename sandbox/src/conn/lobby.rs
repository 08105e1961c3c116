//! The lobby of a thread-per-connection server: one thread accepts, checks
//! the peer's uid and the cap, and holds each new connection until its
//! first request is complete, then hands it on (to a thread of its own).
//! The connections waiting here cost a descriptor and a small entry each —
//! no thread, no stack, and no buffer until a byte arrives — so a flood of
//! idle peers leaves nothing behind once it is gone.
//!
//! A peer that sends no complete first request within [`STALL_TIMEOUT`] is
//! sent [`Rules::stalled`] and dropped; past the cap a new peer is sent
//! [`Rules::full`], and another uid [`Rules::foreign`]. Replies here are
//! one non-blocking write: this thread never waits on a peer.
//!
//! This module owns accepting and the first request's arrival, nothing of
//! what the request means ([`Rules::complete`] only says where it ends).

use std::io::{self, Read, Write};
use std::net::Shutdown;
use std::os::fd::AsFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use boxdesk_platform::socket::ensure_same_uid;
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};

use super::{Admission, Slot, STALL_TIMEOUT};

/// What a server's lobby says and waits for.
pub struct Rules {
    /// Whether the bytes received so far hold a whole first request (or
    /// something the server's handler will refuse at once).
    pub complete: fn(&[u8]) -> bool,
    /// Most bytes of a first request read here; a peer that sends this
    /// many without completing one is handed on, for its handler to refuse.
    pub line_max: usize,
    /// Sent to a peer refused past the cap.
    pub full: &'static [u8],
    /// Sent to a peer dropped for sending no complete request in time.
    pub stalled: &'static [u8],
    /// Sent to a peer that runs as another uid.
    pub foreign: &'static [u8],
}

/// A connection whose first request is in: blocking again, no timeouts.
pub struct Admitted {
    /// The connection.
    pub stream: UnixStream,
    /// Every byte read so far: the first request and whatever followed it
    /// in the same reads (or, at end of stream, a request cut short).
    pub first: Vec<u8>,
    /// Its place under the cap; hold it as long as the connection.
    pub slot: Slot,
}

/// How long to stop accepting after the process ran out of descriptors,
/// so a full descriptor table is not a busy loop.
const EMFILE_PAUSE: Duration = Duration::from_millis(100);
/// Most connections accepted in one go before the waiting ones are read.
const ACCEPT_BATCH: usize = 256;

struct Waiting {
    stream: UnixStream,
    got: Vec<u8>,
    deadline: Instant,
    slot: Slot,
}

/// Accepts on `listener` forever, handing each connection with a complete
/// first request to `hand_on`. Returns only when `accept` fails in a way
/// that will not get better, or once the listener is shut down
/// (`shutdown(2)` on it, or a duplicate of it: how its owner ends it).
pub fn serve(
    listener: UnixListener,
    rules: &Rules,
    admission: &Arc<Admission>,
    mut hand_on: impl FnMut(Admitted),
) -> io::Error {
    if let Err(e) = listener.set_nonblocking(true) {
        return e;
    }
    let mut waiting: Vec<Waiting> = Vec::new();
    let mut paused_until: Option<Instant> = None;
    let mut chunk = vec![0u8; rules.line_max.min(4096)];
    loop {
        let now = Instant::now();
        if paused_until.is_some_and(|t| t <= now) {
            paused_until = None;
        }
        let next = waiting
            .iter()
            .map(|w| w.deadline)
            .chain(paused_until)
            .min()
            .map(|t| t.saturating_duration_since(now));
        let (accept_ready, ready) = {
            let mut fds = Vec::with_capacity(waiting.len() + 1);
            for w in &waiting {
                fds.push(PollFd::new(w.stream.as_fd(), PollFlags::POLLIN));
            }
            if paused_until.is_none() {
                fds.push(PollFd::new(listener.as_fd(), PollFlags::POLLIN));
            }
            match poll(&mut fds, timeout(next)) {
                Ok(_) | Err(nix::errno::Errno::EINTR) => {}
                Err(e) => return e.into(),
            }
            let is_ready = |f: &PollFd<'_>| f.revents().is_some_and(|r| !r.is_empty());
            let accept_ready = paused_until.is_none() && fds.last().is_some_and(is_ready);
            // A listener shut down by its owner (whose sandbox ended) hangs
            // up: its accept would only ever say EAGAIN.
            let hung_up =
                |f: &PollFd<'_>| f.revents().is_some_and(|r| r.contains(PollFlags::POLLHUP));
            if paused_until.is_none() && fds.last().is_some_and(hung_up) {
                return io::Error::new(
                    io::ErrorKind::ConnectionAborted,
                    "the socket was shut down",
                );
            }
            let ready: Vec<usize> = (0..waiting.len()).filter(|&i| is_ready(&fds[i])).collect();
            (accept_ready, ready)
        };
        // Highest index first: swap_remove only moves entries already seen.
        for &i in ready.iter().rev() {
            match read_more(&mut waiting[i], rules, &mut chunk) {
                Arrival::More => {}
                Arrival::Gone => drop(waiting.swap_remove(i)),
                Arrival::Complete => {
                    let w = waiting.swap_remove(i);
                    admit(w.stream, w.got, w.slot, &mut hand_on);
                }
            }
        }
        let now = Instant::now();
        let mut i = 0;
        while i < waiting.len() {
            if waiting[i].deadline <= now {
                let w = waiting.swap_remove(i);
                say(&w.stream, rules.stalled);
                admission.flood(format_args!(
                    "dropped a peer that sent no complete request within {} s",
                    STALL_TIMEOUT.as_secs()
                ));
            } else {
                i += 1;
            }
        }
        if accept_ready {
            for _ in 0..ACCEPT_BATCH {
                match listener.accept() {
                    Ok((stream, _)) => {
                        let Some(mut w) = welcome(stream, rules, admission) else {
                            continue;
                        };
                        // A quick client has sent its request already.
                        match read_more(&mut w, rules, &mut chunk) {
                            Arrival::More => waiting.push(w),
                            Arrival::Gone => {}
                            Arrival::Complete => admit(w.stream, w.got, w.slot, &mut hand_on),
                        }
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(e) if matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE)) => {
                        admission.flood(format_args!("accept: {e}; pausing accepts briefly"));
                        paused_until = Some(Instant::now() + EMFILE_PAUSE);
                        break;
                    }
                    Err(e) if super::transient(&e) => {}
                    Err(e) => return e,
                }
            }
        }
    }
}

/// A poll timeout for `d`, rounded up to whole milliseconds.
fn timeout(d: Option<Duration>) -> PollTimeout {
    match d {
        None => PollTimeout::NONE,
        Some(d) => {
            let ms = d.as_nanos().div_ceil(1_000_000).min(60_000) as u32;
            PollTimeout::try_from(ms).unwrap_or(PollTimeout::MAX)
        }
    }
}

/// Checks a new peer: its uid, then the cap. `None` when refused.
fn welcome(stream: UnixStream, rules: &Rules, admission: &Arc<Admission>) -> Option<Waiting> {
    if stream.set_nonblocking(true).is_err() {
        return None;
    }
    if let Err(e) = ensure_same_uid(&stream) {
        say(&stream, rules.foreign);
        admission.flood(format_args!("refused a peer: {e}"));
        return None;
    }
    let Some(slot) = admission.try_admit() else {
        say(&stream, rules.full);
        return None;
    };
    Some(Waiting {
        stream,
        got: Vec::new(),
        deadline: Instant::now() + STALL_TIMEOUT,
        slot,
    })
}

enum Arrival {
    /// Not yet a whole request.
    More,
    /// A whole request, a request cut short by end of stream, or
    /// [`Rules::line_max`] bytes without one: for the handler.
    Complete,
    /// Closed (or failed) before sending anything: dropped silently.
    Gone,
}

/// Reads what has arrived, never more than [`Rules::line_max`] in all.
fn read_more(w: &mut Waiting, rules: &Rules, chunk: &mut [u8]) -> Arrival {
    loop {
        let room = rules.line_max.saturating_sub(w.got.len()).min(chunk.len());
        if room == 0 {
            return Arrival::Complete;
        }
        match (&w.stream).read(&mut chunk[..room]) {
            Ok(0) if w.got.is_empty() => return Arrival::Gone,
            Ok(0) => return Arrival::Complete,
            Ok(n) => {
                w.got.extend_from_slice(&chunk[..n]);
                if (rules.complete)(&w.got) {
                    return Arrival::Complete;
                }
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Arrival::More,
            Err(_) => return Arrival::Gone,
        }
    }
}

fn admit(stream: UnixStream, first: Vec<u8>, slot: Slot, hand_on: &mut impl FnMut(Admitted)) {
    if stream.set_nonblocking(false).is_err() {
        return;
    }
    hand_on(Admitted {
        stream,
        first,
        slot,
    });
}

/// One non-blocking write of a last word, then the end of the connection.
fn say(stream: &UnixStream, msg: &[u8]) {
    let _ = (&*stream).write(msg);
    let _ = stream.shutdown(Shutdown::Both);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    fn line(b: &[u8]) -> bool {
        b.contains(&b'\n')
    }

    const RULES: Rules = Rules {
        complete: line,
        line_max: 64,
        full: b"FULL\n",
        stalled: b"SLOW\n",
        foreign: b"WHO\n",
    };

    fn lobby(
        max: usize,
    ) -> (
        tempfile::TempDir,
        std::path::PathBuf,
        mpsc::Receiver<Admitted>,
    ) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("l.sock");
        let listener = UnixListener::bind(&path).unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let admission = Admission::new("test", max);
            serve(listener, &RULES, &admission, |a| tx.send(a).unwrap())
        });
        (dir, path, rx)
    }

    fn read_all(mut s: UnixStream) -> String {
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let mut out = String::new();
        let _ = s.read_to_string(&mut out);
        out
    }

    #[test]
    fn a_listener_shut_down_through_a_duplicate_ends_the_lobby_instead_of_spinning() {
        let dir = tempfile::tempdir().unwrap();
        let listener = UnixListener::bind(dir.path().join("l.sock")).unwrap();
        let dup = listener.try_clone().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let admission = Admission::new("test", 4);
            let e = serve(listener, &RULES, &admission, |_| {});
            tx.send(e.kind()).unwrap();
        });
        std::thread::sleep(Duration::from_millis(50));
        nix::sys::socket::shutdown(
            std::os::fd::AsRawFd::as_raw_fd(&dup),
            nix::sys::socket::Shutdown::Both,
        )
        .unwrap();
        let kind = rx.recv_timeout(Duration::from_secs(5)).unwrap();
        assert_eq!(kind, io::ErrorKind::ConnectionAborted);
    }

    #[test]
    fn a_request_and_the_bytes_after_it_are_handed_on_together() {
        let (_d, path, rx) = lobby(4);
        let mut c = UnixStream::connect(&path).unwrap();
        c.write_all(b"CONNECT 1024\nrest").unwrap();
        let a = rx.recv_timeout(Duration::from_secs(5)).unwrap();
        assert!(a.first.starts_with(b"CONNECT 1024\n"), "{:?}", a.first);
        // The rest may come in the same read or stay in the socket.
        let mut more = a.first[13..].to_vec();
        while more.len() < 4 {
            let mut b = [0u8; 4];
            let n = (&a.stream).read(&mut b).unwrap();
            more.extend_from_slice(&b[..n]);
        }
        assert_eq!(more, b"rest");
    }

    #[test]
    fn past_the_cap_a_peer_is_told_and_a_silent_one_is_dropped_after_the_stall_timeout() {
        let (_d, path, rx) = lobby(2);
        let start = Instant::now();
        let silent: Vec<UnixStream> = (0..2)
            .map(|_| UnixStream::connect(&path).unwrap())
            .collect();
        let third = UnixStream::connect(&path).unwrap();
        assert_eq!(read_all(third), "FULL\n");
        for s in silent {
            assert_eq!(read_all(s), "SLOW\n");
        }
        let took = start.elapsed();
        assert!(
            took >= STALL_TIMEOUT - Duration::from_millis(100),
            "{took:?}"
        );
        assert!(took < STALL_TIMEOUT + Duration::from_secs(5), "{took:?}");
        // The slots are free again.
        let mut c = UnixStream::connect(&path).unwrap();
        c.write_all(b"hi\n").unwrap();
        assert_eq!(
            rx.recv_timeout(Duration::from_secs(5)).unwrap().first,
            b"hi\n"
        );
    }

    #[test]
    fn a_request_cut_short_by_the_peer_closing_is_handed_on_and_an_empty_one_is_not() {
        let (_d, path, rx) = lobby(4);
        drop(UnixStream::connect(&path).unwrap());
        let mut c = UnixStream::connect(&path).unwrap();
        c.write_all(b"half").unwrap();
        c.shutdown(Shutdown::Write).unwrap();
        let a = rx.recv_timeout(Duration::from_secs(5)).unwrap();
        assert_eq!(a.first, b"half");
        assert!(rx.try_recv().is_err());
    }

    #[test]
    fn a_line_over_the_limit_is_handed_on_at_the_limit() {
        let (_d, path, rx) = lobby(4);
        let mut c = UnixStream::connect(&path).unwrap();
        c.write_all(&[b'x'; 100]).unwrap();
        let a = rx.recv_timeout(Duration::from_secs(5)).unwrap();
        assert_eq!(a.first.len(), 64);
    }
}
