//! `Session` over real Unix sockets: the plain agent socket and the hybrid
//! vsock preamble.

use std::io::{Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::thread;
use std::time::{Duration, Instant};

use boxdesk_channel::{handshake, ChannelError, Frame, FrameReader, FrameWriter, Session};

fn temp_sock(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("bdch-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir.join("s.sock")
}

/// A one-connection hybrid server at a fresh socket: it reads the client's
/// line, checks it is `CONNECT 1024\n`, then runs `after` on the stream.
fn hybrid_server(
    name: &str,
    after: impl FnOnce(UnixStream) + Send + 'static,
) -> (PathBuf, thread::JoinHandle<()>) {
    let path = temp_sock(name);
    let l = UnixListener::bind(&path).unwrap();
    let server = thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        let mut line = [0u8; 13];
        s.read_exact(&mut line).unwrap();
        assert_eq!(&line, b"CONNECT 1024\n");
        after(s);
    });
    (path, server)
}

/// A one-connection echo agent: handshake, then every frame read is
/// written back, until EOF.
fn echo(mut s: UnixStream) {
    handshake(&mut s).unwrap();
    let mut r = FrameReader::new(s.try_clone().unwrap());
    let mut w = FrameWriter::new(s);
    while let Some(f) = r.read_frame().unwrap() {
        w.write_frame(&f).unwrap();
    }
}

#[test]
fn a_unix_session_exchanges_frames_both_ways() {
    let path = temp_sock("unix");
    let l = UnixListener::bind(&path).unwrap();
    let server = thread::spawn(move || echo(l.accept().unwrap().0));
    let mut s = Session::connect_unix(&path).unwrap();
    s.send(&Frame::Stdout(vec![1; 100_000])).unwrap();
    assert_eq!(s.recv().unwrap(), Some(Frame::Stdout(vec![1; 100_000])));
    s.close_write().unwrap();
    assert_eq!(s.recv().unwrap(), None);
    server.join().unwrap();
}

#[test]
fn a_hybrid_session_sends_connect_and_starts_after_the_ok_line() {
    let (path, server) = hybrid_server("hybrid", |mut s| {
        // The OK line and the agent's header in one write: the client must
        // not swallow header bytes while reading the line.
        s.write_all(b"OK 1073741824\nAGCH\x03\x00").unwrap();
        let mut hdr = [0u8; 6];
        s.read_exact(&mut hdr).unwrap();
        assert_eq!(&hdr, b"AGCH\x03\x00");
        FrameWriter::new(s).write_frame(&Frame::Exit(7)).unwrap();
    });
    let mut s = Session::connect_hybrid(&path, 1024).unwrap();
    assert_eq!(s.recv().unwrap(), Some(Frame::Exit(7)));
    server.join().unwrap();
}

#[test]
fn a_hybrid_refusal_is_a_clear_error() {
    let (path, server) = hybrid_server("refused", |mut s| {
        s.write_all(b"ERR no listener on port 1024\n").unwrap();
    });
    let err = Session::connect_hybrid(&path, 1024).err().unwrap();
    assert!(
        matches!(&err, ChannelError::HybridRefused(m) if m.contains("no listener")),
        "{err:?}"
    );
    server.join().unwrap();
}

#[test]
fn a_peer_that_is_not_an_agent_is_refused_at_the_handshake() {
    let path = temp_sock("http");
    let l = UnixListener::bind(&path).unwrap();
    let server = thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        s.write_all(b"HTTP/1.1 400\r\n").unwrap();
    });
    let err = Session::connect_unix(&path).err().unwrap();
    assert!(matches!(err, ChannelError::BadMagic(_)), "{err:?}");
    server.join().unwrap();
}

#[test]
fn a_hybrid_peer_that_trickles_its_answer_is_given_up_on_at_one_deadline() {
    let path = temp_sock("trickle");
    let l = UnixListener::bind(&path).unwrap();
    let server = thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        // Each byte well within the limit, the whole answer well past it.
        for b in b"OK 1\nAGCH\x03\x00" {
            thread::sleep(Duration::from_millis(150));
            if s.write_all(&[*b]).is_err() {
                return;
            }
        }
    });
    let stream = UnixStream::connect(&path).unwrap();
    let start = Instant::now();
    let limit = Duration::from_millis(500);
    let err = Session::hybrid_over(stream, 1024, limit).err().unwrap();
    let took = start.elapsed();
    assert!(
        matches!(&err, ChannelError::Io(e) if e.kind() == std::io::ErrorKind::TimedOut),
        "{err:?}"
    );
    assert!(took < Duration::from_millis(900), "{took:?}");
    server.join().unwrap();
}

#[test]
fn a_hybrid_client_writes_its_header_only_after_ok_and_keeps_what_follows_the_ok() {
    let (path, server) = hybrid_server("pipelined", |mut s| {
        // Nothing behind the line until we answer: not every hybrid server
        // keeps such bytes for the stream (vhost-device-vsock drops them).
        thread::sleep(Duration::from_millis(100));
        s.set_nonblocking(true).unwrap();
        let early = s.read(&mut [0u8; 8]);
        assert!(
            matches!(&early, Err(e) if e.kind() == std::io::ErrorKind::WouldBlock),
            "the client wrote before OK: {early:?}"
        );
        s.set_nonblocking(false).unwrap();
        // The OK line, our header and a first frame in one write: the
        // client reads them together and must lose none of the frame.
        let mut all = b"OK 49153\nAGCH\x03\x00".to_vec();
        Frame::Exit(7).encode(&mut all).unwrap();
        s.write_all(&all).unwrap();
        let mut header = [0u8; 6];
        s.read_exact(&mut header).unwrap();
        assert_eq!(&header, b"AGCH\x03\x00");
    });
    let mut s = Session::connect_hybrid(&path, 1024).unwrap();
    assert_eq!(s.recv().unwrap(), Some(Frame::Exit(7)));
    assert_eq!(s.recv().unwrap(), None);
    server.join().unwrap();
}

#[test]
fn a_hybrid_server_that_refuses_and_closes_at_once_is_read_not_a_broken_pipe() {
    let path = temp_sock("refused-at-once");
    let l = UnixListener::bind(&path).unwrap();
    // Refuses before reading a byte, as a server does a peer of another uid.
    let server = thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        s.write_all(b"ERR permission denied\n").unwrap();
        s.shutdown(std::net::Shutdown::Both).unwrap();
    });
    let stream = UnixStream::connect(&path).unwrap();
    server.join().unwrap();
    let err = Session::hybrid_over(stream, 1024, Duration::from_secs(5))
        .err()
        .unwrap();
    assert!(
        matches!(&err, ChannelError::HybridRefused(m) if m == "permission denied"),
        "{err:?}"
    );
}

#[test]
fn a_malformed_hybrid_answer_is_refused_naming_it() {
    let (path, server) = hybrid_server("malformed", |mut s| {
        s.write_all(b"OK +1\nAGCH\x03\x00").unwrap();
    });
    let err = Session::connect_hybrid(&path, 1024).err().unwrap();
    assert!(
        matches!(&err, ChannelError::HybridRefused(m) if m.contains("bad port") && m.contains("OK +1")),
        "{err:?}"
    );
    server.join().unwrap();
}
