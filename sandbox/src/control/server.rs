//! Serving the control socket: a lobby thread ([`crate::conn::lobby`])
//! holds each new connection until its first request line is complete,
//! then the connection gets a blocking thread of its own that reads
//! request lines and answers them from a [`Controlled`] (a
//! [`crate::keeper::Keeper`], which holds one running [`crate::Sandbox`]).
//!
//! This module owns the per-connection rules of docs/CONTROL.md:
//! peers of another uid are refused, a bad line ends only its own
//! connection, the connection stays open after `info` and `err` replies,
//! and `stop` is answered `ok` before teardown begins. It also owns its
//! limits: at most [`MAX_CONNECTIONS`] at once (then `err too many
//! connections` and close), a first line within [`STALL_TIMEOUT`] of
//! connecting and any later line within [`STALL_TIMEOUT`] of its first
//! byte (else `err no complete request line within 10 s` and close). A
//! connection idle *between* lines is not stalled and stays: a client may
//! hold one open (a `display` or `input` stream will live for hours).
//! It must never panic or exit on anything a peer sends, and never let one
//! connection's write (EPIPE, a peer that does not read) stall another.

use std::io::{self, Read, Write};
use std::net::Shutdown;
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use boxdesk_platform::socket::ensure_same_uid;

use boxdesk_platform::screen::{InputSink, Screen};

use super::input::InputStream;
use super::protocol::{self, LineBuffer, Request, LINE_MAX};
use crate::conn::lobby::{self, Admitted, Rules};
use crate::conn::{Admission, MAX_CONNECTIONS, STALL_TIMEOUT};

/// How long a reply may wait for a peer that does not read.
const WRITE_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a refused connection's leftover input is drained.
const DRAIN_TIME: Duration = Duration::from_millis(200);
/// How much of it, at most.
const DRAIN_MAX: usize = 256 * 1024;
/// Stack of a connection thread: lines are at most 4 KiB and live on the heap.
/// Only the pages touched are resident (about 12 KiB); the size matters
/// after a crowd of connections has gone: glibc keeps up to 40 MiB of
/// exited threads' stacks, counted by size, so 64 KiB stacks left ~600 of
/// them (7 MiB) resident after 900 relays, 512 KiB ones leave ~80 (1 MiB).
const THREAD_STACK: usize = 512 * 1024;

/// Sent to a peer refused past [`MAX_CONNECTIONS`].
pub const TOO_MANY: &str = "err too many connections\n";
/// Sent to a peer whose request line is not complete in time.
pub const STALLED: &str = "err no complete request line within 10 s\n";
const FOREIGN: &str = "err permission denied: peer runs as another uid\n";

/// A line (or a NUL, refused at once) is a request to hand on.
fn line_or_nul(b: &[u8]) -> bool {
    b.iter().any(|&c| c == b'\n' || c == 0)
}

const RULES: Rules = Rules {
    complete: line_or_nul,
    line_max: LINE_MAX,
    full: TOO_MANY.as_bytes(),
    stalled: STALLED.as_bytes(),
    foreign: FOREIGN.as_bytes(),
};

/// What the control socket reports on and acts on: the keeper of one
/// sandbox (its `info` pairs, its teardown).
pub trait Controlled: Send + Sync + 'static {
    /// The `key value` pairs of an `info` reply, in order.
    fn info(&self) -> Vec<(&'static str, String)>;
    /// Starts tearing the sandbox down. Called after `ok` was written; may
    /// not return (the helper exits once torn down).
    fn stop(&self);
    /// Its screen, when it has a display (`display` leases it).
    fn screen(&self) -> Option<Arc<Screen>> {
        None
    }
    /// Where its input events go, when it has a display (`input`).
    fn input(&self) -> Option<Arc<dyn InputSink>> {
        None
    }
}

/// Accepts connections forever: each, once its first line is in, on a
/// thread of its own. Returns only when `accept` fails in a way that will
/// not get better.
pub fn serve(listener: UnixListener, sandbox: Arc<dyn Controlled>) -> io::Error {
    let admission = Admission::new("control socket", MAX_CONNECTIONS);
    let flood = Arc::clone(&admission);
    lobby::serve(listener, &RULES, &admission, move |a: Admitted| {
        let sandbox = Arc::clone(&sandbox);
        let spawned = std::thread::Builder::new()
            .name("control".into())
            .stack_size(THREAD_STACK)
            .spawn(move || {
                boxdesk_platform::threads::enter(boxdesk_platform::threads::Class::Control);
                let _slot = a.slot;
                converse(a.stream, &a.first, &*sandbox);
            });
        if let Err(e) = spawned {
            flood.flood(format_args!("cannot start a connection thread: {e}"));
        }
    })
}

/// Serves one connection until the peer closes, a line is refused, or a
/// write fails. Errors end this connection only.
pub fn handle(stream: UnixStream, sandbox: &dyn Controlled) {
    if let Err(e) = ensure_same_uid(&stream) {
        tracing::warn!("control: refused a peer: {e}");
        let _ = stream.set_write_timeout(Some(WRITE_TIMEOUT));
        let _ = (&stream).write_all(FOREIGN.as_bytes());
        let _ = stream.shutdown(Shutdown::Both);
        return;
    }
    converse(stream, &[], sandbox);
}

/// [`handle`] for a peer already checked, `first` being what it sent so
/// far.
fn converse(mut stream: UnixStream, first: &[u8], sandbox: &dyn Controlled) {
    let _ = stream.set_write_timeout(Some(WRITE_TIMEOUT));
    let mut lines = LineBuffer::new();
    lines.push(first);
    let mut chunk = [0u8; 1024];
    // When the line being read began; the read timeout last set.
    let mut began: Option<Instant> = None;
    let mut timeout: Option<Duration> = None;
    // After `input`, every line is an event (released at the end).
    let mut input: Option<InputStream> = None;
    loop {
        loop {
            match lines.next_line() {
                Ok(Some(line)) => {
                    began = None;
                    if let Some(events) = &mut input {
                        if let Some(err) = events.line(&line) {
                            if stream.write_all(err.as_bytes()).is_err() {
                                return;
                            }
                        }
                        continue;
                    }
                    match answer(&mut stream, &line, sandbox) {
                        Step::Continue => {}
                        Step::Input(sink) => input = Some(InputStream::new(sink)),
                        Step::Close => return,
                    }
                }
                Ok(None) => break,
                Err(e) => return close_with(stream, &e.reply()),
            }
        }
        // Idle between lines: no limit. Inside a line: what is left of it.
        let want = if lines.is_empty() {
            began = None;
            None
        } else {
            let at = *began.get_or_insert_with(Instant::now) + STALL_TIMEOUT;
            match at.checked_duration_since(Instant::now()) {
                Some(left) if !left.is_zero() => Some(left),
                _ => return close_with(stream, STALLED),
            }
        };
        if want != timeout {
            if stream.set_read_timeout(want).is_err() {
                return;
            }
            timeout = want;
        }
        let room = lines.room().min(chunk.len());
        match stream.read(&mut chunk[..room]) {
            Ok(0) => {
                if let Err(e) = lines.finish() {
                    let _ = stream.write_all(e.reply().as_bytes());
                }
                return;
            }
            Ok(n) => lines.push(&chunk[..n]),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                return close_with(stream, STALLED);
            }
            Err(_) => return,
        }
    }
}

/// Sends a last reply and closes. Whatever the peer still sends is read
/// and dropped for a moment first (bounded in bytes and time): closing a
/// Unix socket with unread input makes the peer's next read fail with
/// `ECONNRESET` instead of a clean end after the reply.
fn close_with(stream: impl Into<Option<UnixStream>>, reply: &str) {
    let Some(mut stream) = stream.into() else {
        return;
    };
    let _ = stream.write_all(reply.as_bytes());
    let _ = stream.shutdown(Shutdown::Write);
    let deadline = std::time::Instant::now() + DRAIN_TIME;
    let mut sink = [0u8; 4096];
    let mut left = DRAIN_MAX;
    while left > 0 {
        let remaining = deadline.saturating_duration_since(std::time::Instant::now());
        if remaining.is_zero() || stream.set_read_timeout(Some(remaining)).is_err() {
            break;
        }
        match stream.read(&mut sink) {
            Ok(0) | Err(_) => break,
            Ok(n) => left = left.saturating_sub(n),
        }
    }
}

enum Step {
    Continue,
    /// `input` was accepted: the lines after it are events.
    Input(Arc<dyn InputSink>),
    Close,
}

fn answer(stream: &mut UnixStream, line: &[u8], sandbox: &dyn Controlled) -> Step {
    let request = match Request::parse(line) {
        Ok(request) => request,
        Err(e) => {
            close_with(stream.try_clone().ok(), &e.reply());
            return Step::Close;
        }
    };
    let reply = match request {
        Request::Info => protocol::info_reply(&sandbox.info()),
        Request::Stop => {
            let _ = stream.write_all(protocol::OK.as_bytes());
            let _ = stream.shutdown(Shutdown::Both);
            sandbox.stop();
            return Step::Close;
        }
        Request::Display => match sandbox.screen() {
            Some(screen) => {
                super::display::serve(stream, &screen);
                return Step::Close;
            }
            None => protocol::NO_DISPLAY.to_owned(),
        },
        Request::Input => match sandbox.input() {
            Some(sink) => {
                return match stream.write_all(protocol::OK.as_bytes()) {
                    Ok(()) => Step::Input(sink),
                    Err(_) => Step::Close,
                };
            }
            None => protocol::NO_DISPLAY.to_owned(),
        },
        Request::Empty => protocol::empty_reply(),
        Request::Unknown(word) => protocol::unknown_reply(&word),
    };
    match stream.write_all(reply.as_bytes()) {
        Ok(()) => Step::Continue,
        Err(_) => Step::Close,
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::Desk;
    use super::*;
    use boxdesk_platform::screen::{InputDevice, Rect};
    use std::io::BufRead;
    use std::sync::atomic::{AtomicUsize, Ordering};

    struct Fake {
        stops: AtomicUsize,
    }

    impl Controlled for Fake {
        fn info(&self) -> Vec<(&'static str, String)> {
            vec![("proto", "1".into()), ("name", "t".into())]
        }
        fn stop(&self) {
            self.stops.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn desk() -> Arc<Desk> {
        Desk::new(Some(Screen::new(64, 32).unwrap()))
    }

    fn serve_desk(desk: &Arc<Desk>) -> (UnixStream, std::thread::JoinHandle<()>) {
        let (client, server) = UnixStream::pair().unwrap();
        let d = Arc::clone(desk);
        (client, std::thread::spawn(move || handle(server, &*d)))
    }

    /// Sends `display` and reads the reply line with its descriptor.
    fn lease(c: &UnixStream) -> (String, std::os::fd::OwnedFd) {
        use nix::sys::socket::{recvmsg, ControlMessageOwned};
        use std::os::fd::FromRawFd;
        (&*c).write_all(b"display\n").unwrap();
        let mut buf = [0u8; 256];
        let mut space = nix::cmsg_space!([std::os::fd::RawFd; 1]);
        let mut iov = [std::io::IoSliceMut::new(&mut buf)];
        let msg = recvmsg::<()>(
            std::os::fd::AsRawFd::as_raw_fd(c),
            &mut iov,
            Some(&mut space),
            nix::sys::socket::MsgFlags::empty(),
        )
        .unwrap();
        let mut fd = None;
        for cmsg in msg.cmsgs().unwrap() {
            if let ControlMessageOwned::ScmRights(fds) = cmsg {
                // SAFETY: a descriptor the kernel just gave this process.
                fd = Some(unsafe { std::os::fd::OwnedFd::from_raw_fd(fds[0]) });
            }
        }
        let n = msg.bytes;
        let line = String::from_utf8(buf[..n].to_vec()).unwrap();
        (line, fd.expect("the reply carries a descriptor"))
    }

    fn pair() -> (UnixStream, std::thread::JoinHandle<Arc<Fake>>) {
        let (client, server) = UnixStream::pair().unwrap();
        let fake = Arc::new(Fake {
            stops: AtomicUsize::new(0),
        });
        let f = Arc::clone(&fake);
        let t = std::thread::spawn(move || {
            handle(server, &*f);
            f
        });
        (client, t)
    }

    fn read_line(r: &mut impl BufRead) -> String {
        let mut s = String::new();
        r.read_line(&mut s).unwrap();
        s
    }

    #[test]
    fn after_an_unknown_word_the_same_connection_answers_info() {
        let (mut c, t) = pair();
        c.write_all(b"hello\ninfo\n").unwrap();
        c.shutdown(Shutdown::Write).unwrap();
        let mut r = io::BufReader::new(c);
        assert_eq!(
            read_line(&mut r),
            "err unknown request hello; speaks: info stop display input\n"
        );
        let mut rest = String::new();
        r.read_to_string(&mut rest).unwrap();
        assert_eq!(rest, "ok\nproto 1\nname t\n\n");
        t.join().unwrap();
    }

    #[test]
    fn stop_is_answered_ok_before_the_sandbox_is_told_to_stop() {
        let (mut c, t) = pair();
        c.write_all(b"stop\n").unwrap();
        let mut all = String::new();
        c.read_to_string(&mut all).unwrap();
        assert_eq!(all, "ok\n");
        assert_eq!(t.join().unwrap().stops.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn a_long_line_gets_err_and_the_connection_closes() {
        let (mut c, t) = pair();
        c.write_all(&vec![b'x'; 5000]).unwrap();
        let mut all = String::new();
        c.read_to_string(&mut all).unwrap();
        assert!(all.starts_with("err ") && all.ends_with('\n'), "{all}");
        assert_eq!(all.lines().count(), 1);
        t.join().unwrap();
    }

    #[test]
    fn display_and_input_say_there_is_no_display() {
        let (mut c, t) = pair();
        c.write_all(b"display\ninput\n").unwrap();
        c.shutdown(Shutdown::Write).unwrap();
        let mut all = String::new();
        c.read_to_string(&mut all).unwrap();
        assert_eq!(all, "err no display\nerr no display\n");
        t.join().unwrap();
    }

    #[test]
    fn a_line_begun_and_not_finished_within_the_stall_timeout_is_dropped_with_err() {
        let (mut c, t) = pair();
        c.write_all(b"info\nin").unwrap();
        let start = Instant::now();
        let mut all = String::new();
        c.read_to_string(&mut all).unwrap();
        assert!(all.starts_with("ok\nproto 1\n"), "{all}");
        assert!(all.ends_with(STALLED), "{all}");
        assert!(start.elapsed() >= STALL_TIMEOUT - Duration::from_millis(50));
        t.join().unwrap();
    }

    #[test]
    fn a_peer_that_closes_without_reading_ends_only_its_connection() {
        let (mut c, t) = pair();
        c.write_all(b"info\ninfo\ninfo\n").unwrap();
        drop(c);
        t.join().unwrap();
    }

    #[test]
    fn display_leases_the_frame_slots_and_streams_a_record_per_present() {
        let d = desk();
        let (c, t) = serve_desk(&d);
        let (line, fd) = lease(&c);
        assert_eq!(
            line,
            "ok width 64 height 32 stride 256 format XRGB8888 slots 3 slot_size 8192\n"
        );
        let pattern: Vec<u8> = (0..64 * 32 * 4).map(|i| (i * 7 % 251) as u8).collect();
        d.screen()
            .present(&pattern, 256, 64, 32, Rect::whole(64, 32));
        let mut r = io::BufReader::new(c.try_clone().unwrap());
        assert_eq!(read_line(&mut r), "present 1 1 0 0 64 32\n");
        let mut slots = Vec::new();
        std::fs::File::from(fd).read_to_end(&mut slots).unwrap();
        assert_eq!(&slots[8192..16384], &pattern[..]);
        c.shutdown(Shutdown::Both).unwrap();
        t.join().unwrap();
    }

    #[test]
    fn a_second_lease_ends_the_first_with_end_replaced() {
        let d = desk();
        let (c1, t1) = serve_desk(&d);
        let _ = lease(&c1);
        let (c2, t2) = serve_desk(&d);
        let _ = lease(&c2);
        let mut rest = String::new();
        (&c1).read_to_string(&mut rest).unwrap();
        assert_eq!(rest, "end replaced\n");
        t1.join().unwrap();
        drop(c2);
        t2.join().unwrap();
    }

    #[test]
    fn a_holder_that_never_reads_blocks_neither_presents_nor_other_requests() {
        let d = desk();
        let (c, t) = serve_desk(&d);
        let _ = lease(&c);
        let frame = vec![5u8; 64 * 32 * 4];
        let start = Instant::now();
        for i in 0..10_000u32 {
            d.screen().present(
                &frame,
                256,
                64,
                32,
                Rect {
                    x: i % 64,
                    y: 0,
                    w: 1,
                    h: 1,
                },
            );
        }
        assert!(start.elapsed() < Duration::from_secs(10));
        let (mut other, t2) = serve_desk(&d);
        other.write_all(b"info\n").unwrap();
        other.shutdown(Shutdown::Write).unwrap();
        let mut all = String::new();
        other.read_to_string(&mut all).unwrap();
        assert_eq!(all, "ok\nproto 1\n\n");
        t2.join().unwrap();
        drop(c);
        t.join().unwrap();
    }

    #[test]
    fn input_sends_each_line_answers_bad_ones_and_releases_what_is_down_at_close() {
        let d = desk();
        let (mut c, t) = serve_desk(&d);
        c.write_all(b"input\nkbd key 30 1\nnonsense\nkbd key 300 1\nptr abs 0 17\n")
            .unwrap();
        c.shutdown(Shutdown::Write).unwrap();
        let mut all = String::new();
        c.read_to_string(&mut all).unwrap();
        let lines: Vec<&str> = all.lines().collect();
        assert_eq!(lines.len(), 3, "{all}");
        assert_eq!(lines[0], "ok");
        assert!(lines[1].starts_with("err bad input line"), "{all}");
        assert_eq!(lines[2], "err kbd does not report type 1 code 300");
        t.join().unwrap();
        let got: Vec<_> = d
            .events
            .lock()
            .unwrap()
            .iter()
            .map(|e| (e.device, e.kind, e.code, e.value))
            .collect();
        assert_eq!(
            got,
            [
                (InputDevice::Keyboard, 1, 30, 1),
                (InputDevice::Pointer, 3, 0, 17),
                (InputDevice::Keyboard, 1, 30, 0)
            ]
        );
    }
}
