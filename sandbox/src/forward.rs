//! `<name>.agent`: the hybrid socket in front of the agent. A client writes
//! `CONNECT 1024\n`, gets `OK <n>\n`, and from then on its bytes are copied
//! to a fresh connection to the agent's own Unix socket and back.
//!
//! The preamble's grammar and rules are [`boxdesk_channel::hybrid`]'s, the
//! same as the VMM's vsock muxer: the peer's uid checked first, the line
//! judged at its first bad byte and never read past
//! [`hybrid::REQUEST_MAX`], every refusal one `ERR <why>\n` line. Only
//! port [`AGENT_PORT`] has a listener here.
//!
//! This module owns serving the preamble and the byte copying: a lobby
//! thread ([`crate::conn::lobby`]) holds each new connection until its
//! preamble line is settled, then a relay thread ([`crate::conn::workers`],
//! reused) copies both ways over non-blocking sockets and `poll`, with a
//! 64 KiB buffer per direction held only while bytes flow, a half-close
//! passed on as a half-close, and any error ending that connection only.
//! Limits: at most [`MAX_CONNECTIONS`] at once (then
//! [`hybrid::Refusal::TooMany`]), a preamble within
//! [`crate::conn::STALL_TIMEOUT`] of connecting (else
//! [`hybrid::Refusal::Stalled`]). Once relayed a connection is the agent's:
//! it stays as long as both ends keep it (an exec can run for hours), and
//! the agent applies its own rules to the session inside. It must never
//! look inside the AGCH stream, never buffer more than one read per
//! direction, and never let a peer of another uid through.

use std::io::{self, Read, Write};
use std::net::Shutdown;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use boxdesk_channel::hybrid::{self, Refusal};
use boxdesk_channel::AGENT_PORT;
use boxdesk_platform::SUN_PATH_MAX;

use crate::conn::lobby::{self, Admitted, Rules};
use crate::conn::workers::Workers;
use crate::conn::{Admission, MAX_CONNECTIONS};

/// Copy buffer per direction, while bytes flow.
const COPY_BUF: usize = 64 * 1024;
/// Stack of a relay thread (its buffers are on the heap).
/// Only the pages touched are resident (about 12 KiB); the size matters
/// after a crowd of connections has gone: glibc keeps up to 40 MiB of
/// exited threads' stacks, counted by size, so 64 KiB stacks left ~600 of
/// them (7 MiB) resident after 900 relays, 512 KiB ones leave ~80 (1 MiB).
const THREAD_STACK: usize = 512 * 1024;
/// Most relay threads kept idle for the next connection.
const IDLE_MAX: usize = 2;

const RULES: Rules = Rules {
    complete: hybrid::request_settled,
    line_max: hybrid::REQUEST_MAX,
    full: hybrid::REPLY_TOO_MANY,
    stalled: hybrid::REPLY_STALLED,
    foreign: hybrid::REPLY_FOREIGN,
};
/// The host-side ports named in `OK` lines: the dynamic range, in turn.
const HOST_PORTS: std::ops::RangeInclusive<u32> = 49152..=65535;

/// The agent's listening socket as the helper reaches it: by path when the
/// path fits in `sun_path`, else through `/proc/self/fd/<dir>/<file>`.
#[derive(Debug)]
pub struct AgentAddr {
    path: PathBuf,
    _dir: Option<OwnedFd>,
}

impl AgentAddr {
    /// The agent socket at `sock` (which need not exist yet).
    pub fn new(sock: &Path) -> io::Result<Self> {
        if sock.as_os_str().len() < SUN_PATH_MAX {
            return Ok(Self {
                path: sock.to_owned(),
                _dir: None,
            });
        }
        let dir = sock.parent().unwrap_or(Path::new("/"));
        let file = sock.file_name().unwrap_or_default();
        let fd: OwnedFd = std::fs::File::open(dir)?.into();
        let path = Path::new(&format!("/proc/self/fd/{}", fd.as_raw_fd())).join(file);
        Ok(Self {
            path,
            _dir: Some(fd),
        })
    }

    /// The path to connect to (`/proc/self/fd/…` for a long one).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Connects to the agent.
    pub fn connect(&self) -> io::Result<UnixStream> {
        UnixStream::connect(&self.path)
    }
}

/// Serves hybrid connections forever: the calling thread is the lobby,
/// each connection with its preamble in goes to a relay thread. Returns
/// only when `accept` fails for good.
pub fn serve(listener: UnixListener, agent: Arc<AgentAddr>) -> io::Error {
    let admission = Admission::new("agent socket", MAX_CONNECTIONS);
    let workers = Workers::new("agent-fwd", THREAD_STACK, IDLE_MAX);
    let flood = Arc::clone(&admission);
    let mut port: u32 = *HOST_PORTS.start();
    lobby::serve(listener, &RULES, &admission, move |a: Admitted| {
        port = if port < *HOST_PORTS.end() {
            port + 1
        } else {
            *HOST_PORTS.start()
        };
        let (agent, host_port) = (Arc::clone(&agent), port);
        if let Err(e) = workers.run(move || handle(a, &agent, host_port)) {
            flood.flood(format_args!("cannot start a relay thread: {e}"));
        }
    })
}

fn handle(a: Admitted, agent: &AgentAddr, host_port: u32) {
    let Admitted {
        stream: mut client,
        first,
        slot: _slot,
    } = a;
    // The lobby hands on a settled line, or what came before the end of
    // the stream.
    let (port, extra) = match hybrid::scan_request_at_eof(&first) {
        Ok(r) => (r.port, first.get(r.len..).unwrap_or_default()),
        Err(e) => return refuse(&mut client, e.into()),
    };
    if port != AGENT_PORT {
        return refuse(&mut client, Refusal::NoListener(port));
    }
    let upstream = match agent.connect() {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!("agent socket: cannot reach the agent: {e}");
            return refuse(&mut client, Refusal::Unreachable);
        }
    };
    if client
        .write_all(hybrid::ok_reply(host_port).as_bytes())
        .is_err()
    {
        return;
    }
    relay(client, upstream, extra.to_vec());
}

/// The client's last word from us; the connection closes after it.
fn refuse(client: &mut UnixStream, why: Refusal) {
    let _ = client.write_all(why.reply().as_bytes());
}

/// One direction of a relay: bytes read from one side, not yet written to
/// the other. Its buffer exists only while bytes flow: a relay idle both
/// ways (an exec running quietly for hours) holds none.
struct Dir {
    buf: Vec<u8>,
    start: usize,
    end: usize,
    /// The source reached end of stream.
    eof: bool,
    /// That end was passed on as a half-close.
    shut: bool,
}

impl Dir {
    fn new(pending: Vec<u8>) -> Self {
        Dir {
            end: pending.len(),
            buf: pending,
            start: 0,
            eof: false,
            shut: false,
        }
    }

    /// Gives the buffer back when nothing is pending (before a wait).
    fn release_if_idle(&mut self) {
        if !self.pending() && self.buf.capacity() > 0 {
            self.buf = Vec::new();
        }
    }

    fn pending(&self) -> bool {
        self.start < self.end
    }

    /// Reads once if there is room; false when the connection is broken.
    fn fill(&mut self, from: &mut UnixStream) -> bool {
        if self.pending() || self.eof {
            return true;
        }
        self.start = 0;
        self.end = 0;
        if self.buf.len() < COPY_BUF {
            self.buf = vec![0u8; COPY_BUF];
        }
        match from.read(&mut self.buf) {
            Ok(0) => self.eof = true,
            Ok(n) => self.end = n,
            Err(e) if would_block(&e) => {}
            Err(_) => return false,
        }
        true
    }

    /// Writes what is pending, then passes on a half-close once drained;
    /// false when the connection is broken.
    fn drain(&mut self, to: &mut UnixStream) -> bool {
        while self.pending() {
            match to.write(&self.buf[self.start..self.end]) {
                Ok(0) => return false,
                Ok(n) => self.start += n,
                Err(e) if would_block(&e) => return true,
                Err(_) => return false,
            }
        }
        if self.eof && !self.shut {
            self.shut = true;
            let _ = to.shutdown(Shutdown::Write);
        }
        true
    }
}

fn would_block(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
    )
}

/// Copies bytes both ways between `client` and `agent` on this one thread
/// (non-blocking sockets and `poll`), `first` being client bytes already
/// read. An end of stream is passed on as a half-close; any error closes
/// both sides, so each peer sees the connection end.
fn relay(mut client: UnixStream, mut agent: UnixStream, first: Vec<u8>) {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    if client.set_nonblocking(true).is_err() || agent.set_nonblocking(true).is_err() {
        return;
    }
    let mut up = Dir::new(first);
    let mut down = Dir::new(Vec::new());
    // Whether the last poll saw a side hung up (closed both ways) or failed.
    let (mut client_hup, mut agent_hup) = (false, false);
    loop {
        let ok = up.fill(&mut client)
            && up.drain(&mut agent)
            && down.fill(&mut agent)
            && down.drain(&mut client);
        // A side that hung up and has nothing left to read can take no
        // more either: without this, poll would report it forever.
        let gone =
            (client_hup && up.eof && !up.pending()) || (agent_hup && down.eof && !down.pending());
        if !ok || gone || (up.shut && down.shut) {
            break;
        }
        let wants = |reading: &Dir, writing: &Dir| {
            let mut f = PollFlags::empty();
            if !reading.pending() && !reading.eof {
                f |= PollFlags::POLLIN;
            }
            if writing.pending() {
                f |= PollFlags::POLLOUT;
            }
            f
        };
        let (cw, aw) = (wants(&up, &down), wants(&down, &up));
        // A side already seen hung up, from which nothing is wanted now,
        // would wake every poll: leave it out until something is wanted.
        let mut fds = Vec::with_capacity(2);
        let mut which = Vec::with_capacity(2);
        if !(client_hup && cw.is_empty()) {
            fds.push(PollFd::new(client.as_fd(), cw));
            which.push(0);
        }
        if !(agent_hup && aw.is_empty()) {
            fds.push(PollFd::new(agent.as_fd(), aw));
            which.push(1);
        }
        if fds.is_empty() {
            break;
        }
        up.release_if_idle();
        down.release_if_idle();
        match poll(&mut fds, PollTimeout::NONE) {
            Ok(_) | Err(nix::errno::Errno::EINTR) => {}
            Err(_) => break,
        }
        for (f, side) in fds.iter().zip(&which) {
            let hup = f
                .revents()
                .is_some_and(|r| r.intersects(PollFlags::POLLHUP | PollFlags::POLLERR));
            if *side == 0 {
                client_hup |= hup;
            } else {
                agent_hup |= hup;
            }
        }
    }
    let _ = client.shutdown(Shutdown::Both);
    let _ = agent.shutdown(Shutdown::Both);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// A front socket at `<dir>/front.sock` whose agent accepts and closes.
    fn front_with_a_closing_agent() -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let agent_path = dir.path().join("a.sock");
        let agent_l = UnixListener::bind(&agent_path).unwrap();
        std::thread::spawn(move || for _ in agent_l.incoming() {});
        let front_path = dir.path().join("front.sock");
        let front = UnixListener::bind(&front_path).unwrap();
        let addr = Arc::new(AgentAddr::new(&agent_path).unwrap());
        std::thread::spawn(move || serve(front, addr));
        (dir, front_path)
    }

    /// What a client that writes `sent` and half-closes reads: up to the
    /// end of the first line after an `OK`, else up to the end (or the
    /// reset, when the server closed with bytes of ours unread).
    fn answer_to(front: &Path, sent: &[u8]) -> String {
        let mut c = UnixStream::connect(front).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let _ = c.write_all(sent);
        let _ = c.shutdown(Shutdown::Write);
        let mut got = Vec::new();
        let mut b = [0u8; 256];
        while !(got.starts_with(b"OK ") && got.contains(&b'\n')) {
            match c.read(&mut b) {
                Ok(0) => break,
                Ok(n) => got.extend_from_slice(&b[..n]),
                Err(e) if e.kind() == io::ErrorKind::ConnectionReset => break,
                Err(e) => panic!("reading the answer to {sent:?}: {e}"),
            }
        }
        String::from_utf8(got).unwrap()
    }

    #[test]
    fn every_case_of_the_hybrid_grammar_gets_the_one_answer_every_server_gives() {
        let (_d, front) = front_with_a_closing_agent();
        for c in hybrid::CASES {
            let got = answer_to(&front, c.sent);
            let port = hybrid::scan_request_at_eof(c.sent).map(|r| r.port);
            match (c.refused, port) {
                (Some(why), _) => assert_eq!(got, why.reply(), "{c}"),
                (None, Ok(AGENT_PORT)) => {
                    assert!(got.starts_with("OK ") && got.ends_with('\n'), "{c}: {got}")
                }
                (None, Ok(other)) => assert_eq!(got, Refusal::NoListener(other).reply(), "{c}"),
                (None, Err(e)) => unreachable!("{c} is refused: {e}"),
            }
        }
    }

    /// Set by [`a_peer_of_another_uid_is_refused_before_its_line_is_read`]
    /// for the probe it runs as uid 65534.
    const PEER_ENV: &str = "BOXDESK_TEST_HYBRID_PEER";

    /// Run by [`a_peer_of_another_uid_is_refused_before_its_line_is_read`]
    /// as uid 65534; does nothing otherwise.
    #[test]
    fn foreign_peer_probe_does_nothing_unless_spawned_by_its_test() {
        if let Some(front) = std::env::var_os(PEER_ENV) {
            let got = answer_to(Path::new(&front), b"CONNECT 1024\n");
            println!("ANSWER<{}>", got.escape_default());
        }
    }

    #[test]
    fn a_peer_of_another_uid_is_refused_before_its_line_is_read() {
        use std::os::unix::fs::PermissionsExt;
        use std::os::unix::process::CommandExt;
        if !nix::unistd::geteuid().is_root() {
            println!("skipped: connecting as uid 65534 needs root");
            return;
        }
        let (dir, front) = front_with_a_closing_agent();
        // Let uid 65534 reach the socket: what must refuse it is the
        // SO_PEERCRED check.
        let mode = |p: &Path, m| std::fs::set_permissions(p, std::fs::Permissions::from_mode(m));
        mode(dir.path(), 0o711).unwrap();
        mode(&front, 0o666).unwrap();
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "forward::tests::foreign_peer_probe_does_nothing_unless_spawned_by_its_test",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(PEER_ENV, &front)
            .uid(65534)
            .gid(65534)
            .output();
        let out = match out {
            Err(e) if e.kind() == io::ErrorKind::PermissionDenied => {
                println!("skipped: uid 65534 cannot run this test binary: {e}");
                return;
            }
            out => out.unwrap(),
        };
        let text = String::from_utf8_lossy(&out.stdout);
        let got = text
            .split("ANSWER<")
            .nth(1)
            .and_then(|r| r.split('>').next())
            .unwrap_or_else(|| panic!("the probe did not run: {text}"));
        let foreign = String::from_utf8_lossy(hybrid::REPLY_FOREIGN);
        assert_eq!(got, foreign.escape_default().to_string());
        // The server serves the next peer as before.
        assert!(answer_to(&front, b"CONNECT 1024\n").starts_with("OK "));
    }

    #[test]
    fn bytes_flow_both_ways_and_a_half_close_is_passed_on() {
        // An echo agent that answers after its peer half-closes.
        let (_dir, front_path) = front_to_agent(|mut s| {
            let mut got = Vec::new();
            s.read_to_end(&mut got).unwrap();
            s.write_all(&got).unwrap();
        });
        let mut c = UnixStream::connect(&front_path).unwrap();
        c.write_all(b"CONNECT 1024\nhello").unwrap();
        c.shutdown(Shutdown::Write).unwrap();
        let mut all = String::new();
        c.read_to_string(&mut all).unwrap();
        assert_eq!(all, "OK 49153\nhello");
    }

    /// A front socket (its path returned) serving in front of an agent that
    /// runs `agent_fn` on its one connection.
    fn front_to_agent(
        agent_fn: impl FnOnce(UnixStream) + Send + 'static,
    ) -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let agent_path = dir.path().join("a.sock");
        let agent_l = UnixListener::bind(&agent_path).unwrap();
        let front_path = dir.path().join("front.sock");
        let front = UnixListener::bind(&front_path).unwrap();
        let addr = Arc::new(AgentAddr::new(&agent_path).unwrap());
        std::thread::spawn(move || serve(front, addr));
        std::thread::spawn(move || agent_fn(agent_l.accept().unwrap().0));
        (dir, front_path)
    }

    /// [`front_to_agent`], connected and past the `CONNECT` line.
    fn relayed(
        agent_fn: impl FnOnce(UnixStream) + Send + 'static,
    ) -> (tempfile::TempDir, UnixStream) {
        let (dir, front_path) = front_to_agent(agent_fn);
        let mut c = UnixStream::connect(&front_path).unwrap();
        c.write_all(b"CONNECT 1024\n").unwrap();
        let mut ok = [0u8; 9];
        c.read_exact(&mut ok).unwrap();
        assert_eq!(&ok, b"OK 49153\n");
        (dir, c)
    }

    #[test]
    fn megabytes_both_ways_at_once_do_not_deadlock() {
        let (_d, c) = relayed(|s| {
            // Echo as it comes, reading and writing concurrently.
            let mut r = s.try_clone().unwrap();
            let mut w = s;
            std::io::copy(&mut r, &mut w).unwrap();
            w.shutdown(Shutdown::Write).unwrap();
        });
        let data: Vec<u8> = (0..6_000_000u32).map(|i| (i % 251) as u8).collect();
        let mut w = c.try_clone().unwrap();
        let sent = data.clone();
        let t = std::thread::spawn(move || {
            w.write_all(&sent).unwrap();
            w.shutdown(Shutdown::Write).unwrap();
        });
        let mut got = Vec::new();
        let mut r = c;
        r.read_to_end(&mut got).unwrap();
        t.join().unwrap();
        assert!(got == data, "echoed {} of {} bytes", got.len(), data.len());
    }

    #[test]
    fn bytes_sent_before_a_full_close_still_reach_the_agent() {
        let (tx, rx) = std::sync::mpsc::channel();
        let (_d, mut c) = relayed(move |mut s| {
            let mut got = Vec::new();
            s.read_to_end(&mut got).unwrap();
            tx.send(got).unwrap();
        });
        c.write_all(&vec![7u8; 300_000]).unwrap();
        drop(c);
        let got = rx.recv_timeout(Duration::from_secs(10)).unwrap();
        assert_eq!(got.len(), 300_000);
    }

    #[test]
    fn bytes_written_behind_the_connect_line_reach_the_agent_first() {
        let (tx, rx) = std::sync::mpsc::channel();
        let (_dir, front_path) = front_to_agent(move |mut s| {
            let mut got = Vec::new();
            s.read_to_end(&mut got).unwrap();
            tx.send(got).unwrap();
        });
        let mut c = UnixStream::connect(&front_path).unwrap();
        // As a client may (ours waits for `OK`): its session header in the
        // same write.
        c.write_all(b"CONNECT 1024\nAGCH\x03\x00").unwrap();
        let mut ok = [0u8; 9];
        c.read_exact(&mut ok).unwrap();
        assert!(ok.starts_with(b"OK "), "{ok:?}");
        c.write_all(b"more").unwrap();
        drop(c);
        let got = rx.recv_timeout(Duration::from_secs(10)).unwrap();
        assert_eq!(got, b"AGCH\x03\x00more");
    }

    #[test]
    fn another_port_is_refused_with_an_err_line() {
        let dir = tempfile::tempdir().unwrap();
        let front_path = dir.path().join("front.sock");
        let front = UnixListener::bind(&front_path).unwrap();
        let addr = Arc::new(AgentAddr::new(&dir.path().join("none.sock")).unwrap());
        std::thread::spawn(move || serve(front, addr));
        let mut c = UnixStream::connect(&front_path).unwrap();
        c.write_all(b"CONNECT 7\n").unwrap();
        let mut all = String::new();
        c.read_to_string(&mut all).unwrap();
        assert!(all.starts_with("ERR ") && all.contains("port 7"), "{all}");
    }

    #[test]
    fn a_long_agent_path_is_reached_through_proc_self_fd() {
        let dir = tempfile::tempdir().unwrap();
        let deep = dir.path().join("d".repeat(60)).join("e".repeat(60));
        std::fs::create_dir_all(&deep).unwrap();
        let sock = deep.join("agent.sock");
        // Bind through the same trick; a plain bind would not fit.
        let addr = AgentAddr::new(&sock).unwrap();
        assert!(addr.path.starts_with("/proc/self/fd"));
        let l = UnixListener::bind(&addr.path).unwrap();
        let _c = addr.connect().unwrap();
        let _ = l.accept().unwrap();
    }
}
