//! Tests of the vsock device through its virtqueues (a mock guest driver,
//! [`driver`]) and real Unix sockets on the host side.

mod driver;
mod stress;

use std::io::{Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::time::{Duration, Instant};

use boxdesk_channel::hybrid::{self, Refusal};
use boxdesk_channel::AGENT_PORT;
use boxdesk_platform::SocketError;
use virtio_bindings::bindings::virtio_ring::{VRING_DESC_F_NEXT, VRING_DESC_F_WRITE};
use vm_memory::{Bytes, GuestAddress};

use self::driver::{GuestStream, Harness, GUEST_CID, RAW_DESC, SCRATCH, WAIT};
use super::packet::{Header, Op, HOST_CID, SHUTDOWN_BOTH, SHUTDOWN_SEND, TYPE_STREAM};
use super::{Vsock, VsockError, BUF_ALLOC, CONNECT_TIMEOUT, MAX_CONNECTIONS};
use crate::virtio::{VirtioDevice, VIRTIO_F_VERSION_1};

/// Reads one `\n`-terminated line, a byte at a time.
fn read_line(s: &mut UnixStream) -> String {
    let mut line = Vec::new();
    let mut b = [0u8; 1];
    while line.last() != Some(&b'\n') {
        assert_eq!(s.read(&mut b).unwrap(), 1, "host socket closed mid-line");
        line.push(b[0]);
    }
    String::from_utf8(line).unwrap()
}

/// Reads exactly `n` bytes.
fn read_n(s: &mut UnixStream, n: usize) -> Vec<u8> {
    let mut buf = vec![0u8; n];
    s.read_exact(&mut buf).unwrap();
    buf
}

/// Whether the host socket reaches EOF (or a reset) within [`WAIT`].
fn closes(s: &mut UnixStream) -> bool {
    s.set_read_timeout(Some(WAIT)).unwrap();
    let mut buf = [0u8; 256];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return true,
            Err(_) => return false,
        }
    }
}

/// What a host client reads until the end (or a reset, when the device
/// closed with bytes of the client's unread).
fn answer(s: &mut UnixStream) -> String {
    s.set_read_timeout(Some(WAIT)).unwrap();
    let mut got = Vec::new();
    let mut b = [0u8; 256];
    loop {
        match s.read(&mut b) {
            Ok(0) => break,
            Ok(n) => got.extend_from_slice(&b[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => break,
            Err(e) => panic!("reading the answer: {e}"),
        }
    }
    String::from_utf8(got).unwrap()
}

/// A host client connected to guest `port` through the hybrid socket, and
/// the guest's end of the stream (it answered RESPONSE).
fn host_connect(h: &mut Harness, port: u32) -> (UnixStream, GuestStream) {
    let mut host = UnixStream::connect(&h.uds).unwrap();
    host.set_read_timeout(Some(WAIT)).unwrap();
    host.write_all(format!("CONNECT {port}\n").as_bytes())
        .unwrap();
    let req = h.expect(Op::Request);
    assert_eq!(
        (
            req.hdr.src_cid,
            req.hdr.dst_cid,
            req.hdr.dst_port,
            req.hdr.type_
        ),
        (HOST_CID, GUEST_CID, port, TYPE_STREAM)
    );
    let mut g = GuestStream::new(port, req.hdr.src_port, 256 * 1024);
    g.absorb(&req);
    let resp = g.hdr(Op::Response, 0, 0);
    h.send(&resp, &[]);
    assert_eq!(read_line(&mut host), format!("OK {}\n", req.hdr.src_port));
    (host, g)
}

/// SHUTDOWN packets for `g` until both flags arrived: a host close may be
/// seen as EOF (SEND) just before its hang-up (RCV too).
fn expect_full_shutdown(h: &mut Harness, g: &GuestStream) {
    let mut flags = 0;
    while flags != SHUTDOWN_BOTH {
        let p = h.expect(Op::Shutdown);
        assert!(g.owns(&p));
        flags |= p.hdr.flags;
    }
}

/// Data packets for `g` until `n` bytes arrived.
fn recv_bytes(h: &mut Harness, g: &mut GuestStream, n: usize) -> Vec<u8> {
    let mut got = Vec::new();
    while got.len() < n {
        let p = h.expect(Op::Rw);
        assert!(g.owns(&p));
        g.absorb(&p);
        got.extend_from_slice(&p.payload);
    }
    got
}

fn guest_hdr(op: Op, src_port: u32, dst_port: u32) -> Header {
    Header {
        src_cid: GUEST_CID,
        dst_cid: HOST_CID,
        src_port,
        dst_port,
        type_: TYPE_STREAM,
        op: op as u16,
        buf_alloc: 65536,
        ..Header::default()
    }
}

#[test]
fn the_device_is_type_19_with_three_queues_and_its_cid_in_config() {
    let dir = tempfile::tempdir().unwrap();
    let mut dev = Vsock::new(0x0203_0405, &dir.path().join("a.agent")).unwrap();
    assert_eq!(dev.device_type(), 19);
    assert_eq!(dev.queue_max_sizes(), &[256, 256, 256]);
    assert_eq!(dev.features(), VIRTIO_F_VERSION_1);
    dev.ack_features(u64::MAX);
    let mut cfg = [0xffu8; 12];
    dev.read_config(0, &mut cfg);
    assert_eq!(cfg, [5, 4, 3, 2, 0, 0, 0, 0, 0, 0, 0, 0]);
    let mut hi = [0xffu8; 4];
    dev.read_config(4, &mut hi);
    assert_eq!(hi, [0; 4]);
    dev.read_config(u64::MAX, &mut hi);
    assert_eq!(hi, [0; 4]);
    dev.write_config(0, &[9; 8]);
    dev.read_config(0, &mut hi);
    assert_eq!(hi, [5, 4, 3, 2]);
}

#[test]
fn reserved_cids_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    for cid in [0, 1, 2, u64::from(u32::MAX), u64::MAX] {
        let e = Vsock::new(cid, &dir.path().join("a.agent")).unwrap_err();
        assert!(matches!(e, VsockError::InvalidCid(c) if c == cid));
    }
}

#[test]
fn a_stale_socket_is_replaced_a_live_one_refused_and_ours_removed_on_drop() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("vm.agent");
    drop(UnixListener::bind(&path).unwrap());
    assert!(path.exists(), "a stale socket file");
    let dev = Vsock::new(3, &path).unwrap();
    assert!(matches!(
        Vsock::new(3, &path),
        Err(VsockError::Socket(SocketError::InUse(_)))
    ));
    drop(dev);
    assert!(!path.exists(), "the device removes the socket it bound");

    std::fs::write(&path, b"not a socket").unwrap();
    assert!(matches!(
        Vsock::new(3, &path),
        Err(VsockError::Socket(SocketError::NotASocket { .. }))
    ));
    assert!(path.exists(), "a regular file is left alone");
}

#[test]
fn a_host_connect_reaches_the_guest_as_a_request_and_its_response_as_ok() {
    let mut h = Harness::new();
    let (_host, g) = host_connect(&mut h, 1024);
    assert!(g.host_port >= 1 << 30, "an ephemeral host port");
    let (_host2, g2) = host_connect(&mut h, 1024);
    assert_ne!(g.host_port, g2.host_port);
    assert!(h.irq.count() > 0, "used buffers were signalled");
}

#[test]
fn a_host_client_may_write_before_ok_and_its_bytes_follow_the_response() {
    let mut h = Harness::new();
    let mut host = UnixStream::connect(&h.uds).unwrap();
    host.set_read_timeout(Some(WAIT)).unwrap();
    host.write_all(b"CONNECT 1024\nAGCH\x03\x00").unwrap();
    let req = h.expect(Op::Request);
    assert!(
        h.silent_for(Duration::from_millis(100)),
        "no data before the response"
    );
    let mut g = GuestStream::new(1024, req.hdr.src_port, 65536);
    let resp = g.hdr(Op::Response, 0, 0);
    h.send(&resp, &[]);
    assert_eq!(recv_bytes(&mut h, &mut g, 6), b"AGCH\x03\x00");
    assert_eq!(read_line(&mut host), format!("OK {}\n", req.hdr.src_port));
}

#[test]
fn bytes_flow_both_ways_and_the_host_credits_what_it_read() {
    let mut h = Harness::new();
    let (mut host, mut g) = host_connect(&mut h, 1024);
    host.write_all(b"hello guest").unwrap();
    assert_eq!(recv_bytes(&mut h, &mut g, 11), b"hello guest");

    let hdr = g.rw(10);
    h.send(&hdr, b"hello host");
    assert_eq!(read_n(&mut host, 10), b"hello host");

    // Enough guest bytes that the device volunteers a credit update.
    let chunk = vec![0x5au8; 65536];
    for _ in 0..3 {
        let hdr = g.rw(chunk.len());
        h.send(&hdr, &chunk);
    }
    assert_eq!(read_n(&mut host, 3 * 65536), vec![0x5a; 3 * 65536]);
    let upd = h.expect(Op::CreditUpdate);
    assert!(g.owns(&upd));
    assert_eq!(upd.hdr.buf_alloc, BUF_ALLOC);
    assert!(
        upd.hdr.fwd_cnt >= (BUF_ALLOC / 2),
        "fwd_cnt {}",
        upd.hdr.fwd_cnt
    );
}

#[test]
fn a_credit_request_is_answered_with_a_credit_update() {
    let mut h = Harness::new();
    let (mut host, mut g) = host_connect(&mut h, 1024);
    let hdr = g.rw(3);
    h.send(&hdr, b"abc");
    assert_eq!(read_n(&mut host, 3), b"abc");
    let ask = g.hdr(Op::CreditRequest, 0, 0);
    h.send(&ask, &[]);
    let upd = h.expect(Op::CreditUpdate);
    assert_eq!((upd.hdr.fwd_cnt, upd.hdr.buf_alloc), (3, BUF_ALLOC));
}

#[test]
fn host_data_stops_at_the_guests_buf_alloc_until_a_credit_update() {
    let mut h = Harness::new();
    let mut host = UnixStream::connect(&h.uds).unwrap();
    host.set_read_timeout(Some(WAIT)).unwrap();
    host.write_all(b"CONNECT 77\n").unwrap();
    let req = h.expect(Op::Request);
    let mut g = GuestStream::new(77, req.hdr.src_port, 10_000);
    let resp = g.hdr(Op::Response, 0, 0);
    h.send(&resp, &[]);
    assert_eq!(read_line(&mut host), format!("OK {}\n", req.hdr.src_port));

    host.write_all(&[1u8; 50_000]).unwrap();
    let got = recv_bytes(&mut h, &mut g, 10_000);
    assert_eq!(got.len(), 10_000, "exactly the guest's buffer");
    let ask = h.expect(Op::CreditRequest);
    assert!(g.owns(&ask));
    assert!(
        h.silent_for(Duration::from_millis(200)),
        "nothing past the credit"
    );

    g.consume(4_000);
    let upd = g.hdr(Op::CreditUpdate, 0, 0);
    h.send(&upd, &[]);
    assert_eq!(recv_bytes(&mut h, &mut g, 4_000).len(), 4_000);
    assert!(g.owns(&h.expect(Op::CreditRequest)), "out of credit again");
    assert!(h.silent_for(Duration::from_millis(200)));
}

#[test]
fn host_eof_reaches_the_guest_as_shutdown_and_its_rst_ends_the_stream() {
    let mut h = Harness::new();
    let (host, mut g) = host_connect(&mut h, 1024);
    drop(host);
    expect_full_shutdown(&mut h, &g);
    let rst = g.hdr(Op::Rst, 0, 0);
    h.send(&rst, &[]);
    assert!(h.silent_for(Duration::from_millis(100)));
    // The stream is gone: data for it is answered with RST.
    let hdr = g.rw(1);
    h.send(&hdr, b"x");
    assert!(g.owns(&h.expect(Op::Rst)));
}

#[test]
fn a_host_half_close_is_a_send_shutdown_and_the_guest_may_still_answer() {
    let mut h = Harness::new();
    let (mut host, mut g) = host_connect(&mut h, 1024);
    host.write_all(b"question").unwrap();
    host.shutdown(std::net::Shutdown::Write).unwrap();
    assert_eq!(recv_bytes(&mut h, &mut g, 8), b"question");
    let shut = h.expect(Op::Shutdown);
    assert_eq!(shut.hdr.flags, SHUTDOWN_SEND);
    let hdr = g.rw(6);
    h.send(&hdr, b"answer");
    assert_eq!(read_n(&mut host, 6), b"answer");
    let bye = g.hdr(Op::Shutdown, SHUTDOWN_BOTH, 0);
    h.send(&bye, &[]);
    assert!(g.owns(&h.expect(Op::Rst)));
    assert!(closes(&mut host));
}

#[test]
fn a_host_that_does_not_finish_after_its_shutdown_is_reset_after_the_timeout() {
    let mut h = Harness::new();
    let (host, g) = host_connect(&mut h, 1024);
    drop(host);
    expect_full_shutdown(&mut h, &g);
    let start = Instant::now();
    let rst = h.expect(Op::Rst);
    assert!(g.owns(&rst));
    assert!(
        start.elapsed() >= Duration::from_millis(1500),
        "{:?}",
        start.elapsed()
    );
}

#[test]
fn a_guest_rst_closes_the_host_socket() {
    let mut h = Harness::new();
    let (mut host, mut g) = host_connect(&mut h, 1024);
    let rst = g.hdr(Op::Rst, 0, 0);
    h.send(&rst, &[]);
    assert!(closes(&mut host));
    assert!(
        h.silent_for(Duration::from_millis(100)),
        "no answer to an RST"
    );
}

#[test]
fn a_guest_shutdown_half_closes_the_host_socket_after_its_data() {
    let mut h = Harness::new();
    let (mut host, mut g) = host_connect(&mut h, 1024);
    let hdr = g.rw(4);
    h.send(&hdr, b"last");
    let shut = g.hdr(Op::Shutdown, SHUTDOWN_SEND, 0);
    h.send(&shut, &[]);
    let mut all = Vec::new();
    host.read_to_end(&mut all).unwrap();
    assert_eq!(all, b"last", "data, then EOF");
    // The host may still talk.
    host.write_all(b"still here").unwrap();
    assert_eq!(recv_bytes(&mut h, &mut g, 10), b"still here");
    let both = g.hdr(Op::Shutdown, SHUTDOWN_BOTH, 0);
    h.send(&both, &[]);
    assert!(g.owns(&h.expect(Op::Rst)));
    assert!(closes(&mut host));
}

#[test]
fn a_guest_connect_to_a_listening_port_socket_is_accepted_and_carries_bytes() {
    let mut h = Harness::new();
    let server = UnixListener::bind(h.port_path(5000)).unwrap();
    let mut g = GuestStream::new(40_000, 5000, 65536);
    let req = g.hdr(Op::Request, 0, 0);
    h.send(&req, &[]);
    let resp = h.expect(Op::Response);
    assert!(g.owns(&resp));
    assert_eq!(resp.hdr.buf_alloc, BUF_ALLOC);
    let (mut conn, _) = server.accept().unwrap();
    conn.set_read_timeout(Some(WAIT)).unwrap();
    let hdr = g.rw(4);
    h.send(&hdr, b"ping");
    assert_eq!(
        read_n(&mut conn, 4),
        b"ping",
        "no preamble on guest-initiated streams"
    );
    conn.write_all(b"pong").unwrap();
    assert_eq!(recv_bytes(&mut h, &mut g, 4), b"pong");
}

#[test]
fn a_guest_connect_to_a_port_nobody_listens_on_gets_rst() {
    let mut h = Harness::new();
    let mut g = GuestStream::new(40_001, 6000, 65536);
    let req = g.hdr(Op::Request, 0, 0);
    h.send(&req, &[]);
    let rst = h.expect(Op::Rst);
    assert!(g.owns(&rst));
    // A stale socket file with nobody behind it: the same.
    drop(UnixListener::bind(h.port_path(6001)).unwrap());
    let mut g = GuestStream::new(40_002, 6001, 65536);
    let req = g.hdr(Op::Request, 0, 0);
    h.send(&req, &[]);
    assert!(g.owns(&h.expect(Op::Rst)));
}

#[test]
fn packets_for_a_stream_that_does_not_exist_are_answered_with_rst() {
    let mut h = Harness::new();
    for op in [
        Op::Rw,
        Op::Response,
        Op::Shutdown,
        Op::CreditUpdate,
        Op::CreditRequest,
    ] {
        h.send(&guest_hdr(op, 9, 99), &[]);
        let rst = h.expect(Op::Rst);
        assert_eq!((rst.hdr.src_port, rst.hdr.dst_port), (99, 9));
    }
    h.send(&guest_hdr(Op::Rst, 9, 99), &[]);
    assert!(
        h.silent_for(Duration::from_millis(100)),
        "an RST is never answered"
    );
}

#[test]
fn a_len_over_64k_an_unknown_op_or_type_is_reset_and_the_device_lives_on() {
    let mut h = Harness::new();
    let (mut host, mut g) = host_connect(&mut h, 1024);

    let mut big = g.hdr(Op::Rw, 0, 65537);
    big.len = 65537;
    h.send(&big, &vec![0u8; 65537]);
    assert!(g.owns(&h.expect(Op::Rst)));
    assert!(closes(&mut host), "the stream it named is gone");

    let mut lying = guest_hdr(Op::Rw, 1, 2);
    lying.len = 100;
    h.send(&lying, &[1, 2, 3]);
    assert_eq!(h.expect(Op::Rst).hdr.dst_port, 1);

    let mut odd = guest_hdr(Op::Rw, 3, 4);
    odd.op = 99;
    h.send(&odd, &[]);
    assert_eq!(h.expect(Op::Rst).hdr.dst_port, 3);

    let mut seq = guest_hdr(Op::Request, 5, 6);
    seq.type_ = 2;
    h.send(&seq, &[]);
    assert_eq!(h.expect(Op::Rst).hdr.dst_port, 5);

    let mut spoofed = guest_hdr(Op::Request, 7, 8);
    spoofed.src_cid = 42;
    h.send(&spoofed, &[]);
    // A header cut short cannot be answered at all.
    h.send_raw(&[(SCRATCH, 20, 0, 0)]);
    assert!(
        h.silent_for(Duration::from_millis(100)),
        "spoofed and short packets are dropped"
    );

    assert!(!h.needs_reset());
    let (mut host, mut g) = host_connect(&mut h, 1024);
    let hdr = g.rw(5);
    h.send(&hdr, b"alive");
    assert_eq!(read_n(&mut host, 5), b"alive");
}

#[test]
fn a_tx_chain_outside_memory_looping_or_writable_marks_the_device_needs_reset() {
    let next = VRING_DESC_F_NEXT as u16;
    let write = VRING_DESC_F_WRITE as u16;
    let cases: [&[(u64, u32, u16, u16)]; 5] = [
        // Outside guest memory.
        &[(0xffff_0000_0000, 64, 0, 0)],
        // A descriptor that is its own next.
        &[(SCRATCH, 44, next, RAW_DESC)],
        // Device-writable in a TX chain.
        &[(SCRATCH, 64, write, 0)],
        // `next` outside the table.
        &[(SCRATCH, 44, next, 1000)],
        // The second descriptor ends past memory.
        &[(SCRATCH, 44, next, RAW_DESC + 1), ((32 << 20) - 4, 8, 0, 0)],
    ];
    for (i, chain) in cases.iter().enumerate() {
        let mut h = Harness::new();
        h.mem
            .write_slice(
                &guest_hdr(Op::Request, 1, 2).to_bytes(),
                GuestAddress(SCRATCH),
            )
            .unwrap();
        h.send_raw(chain);
        h.wait_for(&format!("NEEDS_RESET in case {i}"), |h| h.needs_reset());
    }
}

#[test]
fn an_rx_buffer_the_device_may_not_write_marks_it_needs_reset() {
    for (addr, len, flags) in [
        (SCRATCH, 4096, 0u16),
        (SCRATCH, 20, VRING_DESC_F_WRITE as u16),
        (1 << 40, 4096, VRING_DESC_F_WRITE as u16),
    ] {
        let mut h = Harness::without_rx();
        h.post_raw_rx(0, addr, len, flags);
        let _host = {
            let mut s = UnixStream::connect(&h.uds).unwrap();
            s.write_all(b"CONNECT 1\n").unwrap();
            s
        };
        h.wait_for("NEEDS_RESET", |h| h.needs_reset());
    }
}

#[test]
fn a_connect_the_guest_never_answers_closes_the_host_socket() {
    let mut h = Harness::new();
    let mut host = UnixStream::connect(&h.uds).unwrap();
    host.write_all(b"CONNECT 1024\n").unwrap();
    let req = h.expect(Op::Request);
    let start = Instant::now();
    assert_eq!(answer(&mut host), Refusal::NoAnswer(1024).reply());
    assert!(start.elapsed() + Duration::from_millis(100) >= CONNECT_TIMEOUT);
    let rst = h.expect(Op::Rst);
    assert_eq!(rst.hdr.src_port, req.hdr.src_port);
}

#[test]
fn a_guest_rst_to_a_connect_closes_the_host_client_with_err_no_listener_not_ok() {
    let mut h = Harness::new();
    let mut host = UnixStream::connect(&h.uds).unwrap();
    host.write_all(b"CONNECT 9\n").unwrap();
    let req = h.expect(Op::Request);
    let mut g = GuestStream::new(9, req.hdr.src_port, 0);
    let rst = g.hdr(Op::Rst, 0, 0);
    h.send(&rst, &[]);
    let mut all = Vec::new();
    host.set_read_timeout(Some(WAIT)).unwrap();
    host.read_to_end(&mut all).unwrap();
    assert_eq!(all, b"ERR no listener on port 9\n", "no OK line");
}

#[test]
fn a_bad_connect_line_closes_the_host_client() {
    let h = Harness::new();
    for line in [&b"HELLO 1\n"[..], b"CONNECT x\n", &[b'C'; 100]] {
        let mut host = UnixStream::connect(&h.uds).unwrap();
        host.write_all(line).unwrap();
        assert!(closes(&mut host), "{:?}", String::from_utf8_lossy(line));
    }
}

#[test]
fn bytes_written_behind_the_connect_line_reach_the_guest_first_once_it_answers() {
    let mut h = Harness::new();
    let mut host = UnixStream::connect(&h.uds).unwrap();
    host.set_read_timeout(Some(WAIT)).unwrap();
    // As a client may (ours waits for `OK`): its session header in the
    // same write as the line.
    host.write_all(b"CONNECT 1024\nAGCH\x03\x00").unwrap();
    let req = h.expect(Op::Request);
    assert!(
        h.silent_for(Duration::from_millis(50)),
        "no stream bytes before the guest answers"
    );
    let mut g = GuestStream::new(1024, req.hdr.src_port, 256 * 1024);
    g.absorb(&req);
    h.send(&g.hdr(Op::Response, 0, 0), &[]);
    assert_eq!(read_line(&mut host), hybrid::ok_reply(req.hdr.src_port));
    host.write_all(b"more").unwrap();
    assert_eq!(recv_bytes(&mut h, &mut g, 10), b"AGCH\x03\x00more");
}

#[test]
fn every_case_of_the_hybrid_grammar_gets_the_one_answer_every_server_gives() {
    for c in hybrid::CASES {
        let mut h = Harness::new();
        let mut host = UnixStream::connect(&h.uds).unwrap();
        host.write_all(c.sent).unwrap();
        host.shutdown(std::net::Shutdown::Write).unwrap();
        let port = hybrid::scan_request_at_eof(c.sent).map(|r| r.port);
        match (c.refused, port) {
            (Some(why), _) => {
                assert_eq!(answer(&mut host), why.reply(), "{c}");
                assert!(
                    h.silent_for(Duration::from_millis(50)),
                    "{c} reached the guest"
                );
            }
            // The guest listens on the agent's port only, as in a VM.
            (None, Ok(port)) => {
                let req = h.expect(Op::Request);
                assert_eq!(req.hdr.dst_port, port, "{c}");
                let mut g = GuestStream::new(port, req.hdr.src_port, 65536);
                if port == AGENT_PORT {
                    h.send(&g.hdr(Op::Response, 0, 0), &[]);
                    let ok = read_line(&mut host);
                    assert_eq!(ok, hybrid::ok_reply(req.hdr.src_port), "{c}");
                } else {
                    h.send(&g.hdr(Op::Rst, 0, 0), &[]);
                    assert_eq!(answer(&mut host), Refusal::NoListener(port).reply(), "{c}");
                }
            }
            (None, Err(e)) => unreachable!("{c} is refused: {e}"),
        }
    }
}

/// Set by [`a_peer_of_another_uid_is_refused_before_its_line_is_read`]
/// for the probe it runs as uid 65534.
const PEER_ENV: &str = "BOXDESK_TEST_HYBRID_PEER";

/// Run by [`a_peer_of_another_uid_is_refused_before_its_line_is_read`] as
/// uid 65534; does nothing otherwise.
#[test]
fn foreign_peer_probe_does_nothing_unless_spawned_by_its_test() {
    if let Some(path) = std::env::var_os(PEER_ENV) {
        let mut s = UnixStream::connect(path).unwrap();
        let _ = s.write_all(b"CONNECT 1024\n");
        println!("ANSWER<{}>", answer(&mut s).escape_default());
    }
}

#[test]
fn a_peer_of_another_uid_is_refused_before_its_line_is_read() {
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::process::CommandExt;
    if boxdesk_platform::euid() != 0 {
        println!("skipped: connecting as uid 65534 needs root");
        return;
    }
    let mut h = Harness::new();
    // Let uid 65534 reach the socket: what must refuse it is the
    // SO_PEERCRED check.
    let mode = |p: &std::path::Path, m| std::fs::set_permissions(p, PermissionsExt::from_mode(m));
    mode(h.uds.parent().unwrap(), 0o711).unwrap();
    mode(&h.uds, 0o666).unwrap();
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "vsock::tests::foreign_peer_probe_does_nothing_unless_spawned_by_its_test",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(PEER_ENV, &h.uds)
        .uid(65534)
        .gid(65534)
        .output();
    let out = match out {
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
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
    assert!(
        h.silent_for(Duration::from_millis(100)),
        "the guest heard of it"
    );
    // The device serves the next client as before.
    let _ = host_connect(&mut h, AGENT_PORT);
}

#[test]
fn past_the_cap_a_client_is_told_and_one_without_a_line_is_told_it_stalled() {
    boxdesk_platform::limits::raise_nofile().unwrap();
    let h = Harness::new();
    let start = Instant::now();
    let silent: Vec<UnixStream> = (0..MAX_CONNECTIONS)
        .map(|_| UnixStream::connect(&h.uds).unwrap())
        .collect();
    let mut late = UnixStream::connect(&h.uds).unwrap();
    assert_eq!(
        answer(&mut late),
        String::from_utf8_lossy(hybrid::REPLY_TOO_MANY)
    );
    let mut first = silent.into_iter().next().unwrap();
    assert_eq!(
        answer(&mut first),
        String::from_utf8_lossy(hybrid::REPLY_STALLED)
    );
    assert!(start.elapsed() + Duration::from_millis(100) >= CONNECT_TIMEOUT);
}

#[test]
fn reset_stops_the_event_thread_and_closes_every_host_socket() {
    let mut h = Harness::new();
    let (mut host, _g) = host_connect(&mut h, 1024);
    h.dev.reset();
    assert!(!h.dev.is_active());
    assert!(closes(&mut host));
    // The socket stays bound: a client waits in the backlog until the next activation.
    assert!(UnixStream::connect(&h.uds).is_ok());
}

#[test]
fn the_event_queue_notification_is_ignored_and_the_tx_queue_still_works() {
    let mut h = Harness::new();
    h.dev.queue_notify(2);
    h.dev.queue_notify(7);
    let (mut host, mut g) = host_connect(&mut h, 1);
    let hdr = g.rw(2);
    h.send(&hdr, b"ok");
    assert_eq!(read_n(&mut host, 2), b"ok");
}
