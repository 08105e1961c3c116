//! Serving the control socket: one blocking thread per connection, each
//! reading request lines and answering them from a [`Sandbox`].
//!
//! This module owns the per-connection rules of DESIGN.md's "Host control
//! socket": peers of another uid are refused, a bad line ends only its own
//! connection, the connection stays open after `info` and `err` replies,
//! and `stop` is answered `ok` before teardown begins. It must never panic
//! or exit on anything a peer sends, and never let one connection's write
//! (EPIPE, a peer that does not read) stall another.

use std::io::{self, Read, Write};
use std::net::Shutdown;
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::Arc;
use std::time::Duration;

use boxdesk_platform::socket::ensure_same_uid;

use super::protocol::{self, LineBuffer, Request};

/// How long a reply may wait for a peer that does not read.
const WRITE_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a refused connection's leftover input is drained.
const DRAIN_TIME: Duration = Duration::from_millis(200);
/// How much of it, at most.
const DRAIN_MAX: usize = 256 * 1024;
/// Stack of a connection thread: lines are at most 4 KiB and live on the heap.
const THREAD_STACK: usize = 64 * 1024;

/// What the control socket reports on and acts on.
pub trait Sandbox: Send + Sync + 'static {
    /// The `key value` pairs of an `info` reply, in order.
    fn info(&self) -> Vec<(&'static str, String)>;
    /// Starts tearing the sandbox down. Called after `ok` was written; may
    /// not return (the helper exits once torn down).
    fn stop(&self);
}

/// Accepts connections forever, one thread each. Returns only when
/// `accept` fails in a way that will not get better.
pub fn serve(listener: UnixListener, sandbox: Arc<dyn Sandbox>) -> io::Error {
    loop {
        match listener.accept() {
            Ok((stream, _)) => {
                let sandbox = Arc::clone(&sandbox);
                let spawned = std::thread::Builder::new()
                    .name("control".into())
                    .stack_size(THREAD_STACK)
                    .spawn(move || handle(stream, &*sandbox));
                if let Err(e) = spawned {
                    tracing::warn!("cannot start a control connection thread: {e}");
                }
            }
            Err(e) if transient(&e) => {
                tracing::warn!("control accept: {e}");
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(e) => return e,
        }
    }
}

/// Errors after which `accept` can succeed again (a peer that vanished,
/// descriptors or memory short for a moment).
pub(crate) fn transient(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(
            libc::ECONNABORTED
                | libc::EINTR
                | libc::EMFILE
                | libc::ENFILE
                | libc::ENOBUFS
                | libc::ENOMEM
                | libc::EPROTO
                | libc::EPERM
        )
    )
}

/// Serves one connection until the peer closes, a line is refused, or a
/// write fails. Errors end this connection only.
pub fn handle(mut stream: UnixStream, sandbox: &dyn Sandbox) {
    if let Err(e) = ensure_same_uid(&stream) {
        tracing::warn!("control: refused a peer: {e}");
        let _ = stream.set_write_timeout(Some(WRITE_TIMEOUT));
        let _ = stream.write_all(b"err permission denied: peer runs as another uid\n");
        let _ = stream.shutdown(Shutdown::Both);
        return;
    }
    let _ = stream.set_write_timeout(Some(WRITE_TIMEOUT));
    let mut lines = LineBuffer::new();
    let mut chunk = [0u8; 1024];
    loop {
        loop {
            match lines.next_line() {
                Ok(Some(line)) => match answer(&mut stream, &line, sandbox) {
                    Step::Continue => {}
                    Step::Close => return,
                },
                Ok(None) => break,
                Err(e) => return close_with(stream, &e.reply()),
            }
        }
        let want = lines.room().min(chunk.len());
        match stream.read(&mut chunk[..want]) {
            Ok(0) => {
                if let Err(e) = lines.finish() {
                    let _ = stream.write_all(e.reply().as_bytes());
                }
                return;
            }
            Ok(n) => lines.push(&chunk[..n]),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
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
    Close,
}

fn answer(stream: &mut UnixStream, line: &[u8], sandbox: &dyn Sandbox) -> Step {
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
        Request::Display | Request::Input => protocol::NO_DISPLAY.to_owned(),
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
    use super::*;
    use std::io::BufRead;
    use std::sync::atomic::{AtomicUsize, Ordering};

    struct Fake {
        stops: AtomicUsize,
    }

    impl Sandbox for Fake {
        fn info(&self) -> Vec<(&'static str, String)> {
            vec![("proto", "1".into()), ("name", "t".into())]
        }
        fn stop(&self) {
            self.stops.fetch_add(1, Ordering::SeqCst);
        }
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
    fn a_peer_that_closes_without_reading_ends_only_its_connection() {
        let (mut c, t) = pair();
        c.write_all(b"info\ninfo\ninfo\n").unwrap();
        drop(c);
        t.join().unwrap();
    }
}
