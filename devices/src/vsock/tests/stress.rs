//! Volume tests: one stream carrying 64 MiB each way at once, and a
//! hundred streams echoing their own bytes concurrently.

use std::collections::{HashMap, VecDeque};
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::driver::{pattern, Checksum, GuestStream, Harness, WAIT};
use super::{host_connect, read_line};
use crate::vsock::packet::{Op, MAX_PAYLOAD, SHUTDOWN_BOTH};

const BIG: usize = 64 << 20;

fn mb_per_s(bytes: usize, d: Duration) -> f64 {
    bytes as f64 / d.as_secs_f64() / 1e6
}

#[test]
fn sixty_four_mib_cross_one_stream_each_way_with_matching_checksums() {
    let mut h = Harness::with_rx_payload(MAX_PAYLOAD as u32);
    let (host, mut g) = host_connect(&mut h, 1024);
    let start = Instant::now();

    let mut writer = host.try_clone().unwrap();
    let sent = std::thread::spawn(move || {
        let mut hash = Checksum::default();
        let mut buf = vec![0u8; 256 * 1024];
        let mut off = 0;
        while off < BIG {
            let n = buf.len().min(BIG - off);
            pattern(1, off as u64, &mut buf[..n]);
            hash.update(&buf[..n]);
            writer.write_all(&buf[..n]).unwrap();
            off += n;
        }
        (hash, start.elapsed())
    });
    let mut reader = host;
    reader.set_read_timeout(Some(WAIT)).unwrap();
    let received = std::thread::spawn(move || {
        let mut hash = Checksum::default();
        let mut buf = vec![0u8; 256 * 1024];
        let mut total = 0;
        while total < BIG {
            let n = reader.read(&mut buf).unwrap();
            assert!(n > 0, "early EOF after {total} bytes");
            hash.update(&buf[..n]);
            total += n;
        }
        (hash, start.elapsed())
    });

    let mut in_hash = Checksum::default();
    let mut in_bytes = 0;
    let mut in_done = None;
    let mut out_hash = Checksum::default();
    let mut out_bytes = 0;
    let mut chunk = vec![0u8; MAX_PAYLOAD];
    let deadline = Instant::now() + Duration::from_secs(300);
    while in_bytes < BIG || out_bytes < BIG {
        assert!(
            Instant::now() < deadline,
            "stalled: in {in_bytes}, out {out_bytes}"
        );
        let mut idle = h.poll() == 0;
        while let Some(p) = h.recv_within(Duration::ZERO) {
            assert!(g.owns(&p), "{:?}", p.hdr);
            g.absorb(&p);
            match p.op() {
                Some(Op::Rw) => {
                    in_hash.update(&p.payload);
                    in_bytes += p.payload.len();
                    if in_bytes == BIG {
                        in_done = Some(start.elapsed());
                    }
                    if g.consume(p.payload.len()) {
                        let upd = g.hdr(Op::CreditUpdate, 0, 0);
                        h.send(&upd, &[]);
                    }
                }
                Some(Op::CreditUpdate) => {}
                Some(Op::CreditRequest) => {
                    let upd = g.hdr(Op::CreditUpdate, 0, 0);
                    h.send(&upd, &[]);
                }
                other => panic!("unexpected {other:?}"),
            }
        }
        while out_bytes < BIG {
            let n = (g.peer_credit() as usize)
                .min(MAX_PAYLOAD)
                .min(BIG - out_bytes);
            if n == 0 {
                break;
            }
            pattern(2, out_bytes as u64, &mut chunk[..n]);
            let hdr = g.rw(n);
            if !h.try_send(&hdr, &chunk[..n]) {
                g.tx_cnt = g.tx_cnt.wrapping_sub(n as u32);
                break;
            }
            out_hash.update(&chunk[..n]);
            out_bytes += n;
            idle = false;
        }
        if idle {
            std::thread::sleep(Duration::from_micros(10));
        }
    }
    let (host_sent_hash, host_sent_at) = sent.join().unwrap();
    let (host_got_hash, host_got_at) = received.join().unwrap();
    assert_eq!(in_hash, host_sent_hash, "host → guest checksum");
    assert_eq!(out_hash, host_got_hash, "guest → host checksum");
    let in_at = in_done.unwrap_or(host_sent_at);
    println!(
        "vsock 64 MiB each way at once: host→guest {:.0} MB/s ({:?}), guest→host {:.0} MB/s ({:?})",
        mb_per_s(BIG, in_at),
        in_at,
        mb_per_s(BIG, host_got_at),
        host_got_at
    );
}

/// The guest's side of one echoed stream.
struct Echo {
    g: GuestStream,
    pending: VecDeque<u8>,
}

#[test]
fn a_hundred_concurrent_streams_each_get_their_own_bytes_back() {
    const STREAMS: usize = 100;
    const EACH: usize = 128 * 1024;
    let mut h = Harness::new();
    let uds = h.uds.clone();
    let done = Arc::new(AtomicUsize::new(0));
    let mut hosts = Vec::new();
    for i in 0..STREAMS {
        let (uds, done) = (uds.clone(), done.clone());
        hosts.push(std::thread::spawn(move || {
            let mut s = UnixStream::connect(&uds).unwrap();
            s.set_read_timeout(Some(WAIT)).unwrap();
            s.write_all(b"CONNECT 5000\n").unwrap();
            assert!(read_line(&mut s).starts_with("OK "));
            let mut w = s.try_clone().unwrap();
            let writer = std::thread::spawn(move || {
                let mut buf = vec![0u8; EACH];
                pattern(i as u64 + 10, 0, &mut buf);
                for part in buf.chunks(10_000) {
                    w.write_all(part).unwrap();
                }
            });
            let mut want = vec![0u8; EACH];
            pattern(i as u64 + 10, 0, &mut want);
            let mut got = vec![0u8; EACH];
            s.read_exact(&mut got).unwrap();
            writer.join().unwrap();
            assert!(got == want, "stream {i} got someone else's bytes");
            done.fetch_add(1, Ordering::SeqCst);
            // Closing it now: the guest sees SHUTDOWN.
        }));
    }

    let mut streams: HashMap<u32, Echo> = HashMap::new();
    let mut finished = 0;
    let deadline = Instant::now() + Duration::from_secs(120);
    while finished < STREAMS {
        assert!(
            Instant::now() < deadline,
            "{finished} of {STREAMS} streams finished"
        );
        let mut idle = true;
        while let Some(p) = h.recv_within(Duration::ZERO) {
            idle = false;
            let port = p.hdr.src_port;
            match p.op() {
                Some(Op::Request) => {
                    let mut g = GuestStream::new(5000, port, 64 * 1024);
                    g.absorb(&p);
                    let resp = g.hdr(Op::Response, 0, 0);
                    h.send(&resp, &[]);
                    streams.insert(
                        port,
                        Echo {
                            g,
                            pending: VecDeque::new(),
                        },
                    );
                }
                Some(Op::Rw) => {
                    let e = streams.get_mut(&port).expect("data on a known stream");
                    e.g.absorb(&p);
                    e.pending.extend(&p.payload);
                    // The application "reads" it once it is echoed; until
                    // then it counts against our buffer.
                }
                Some(Op::CreditUpdate) | Some(Op::CreditRequest) => {
                    if let Some(e) = streams.get_mut(&port) {
                        e.g.absorb(&p);
                        if p.op() == Some(Op::CreditRequest) {
                            let upd = e.g.hdr(Op::CreditUpdate, 0, 0);
                            h.send(&upd, &[]);
                        }
                    }
                }
                // The host closed: SHUTDOWN(SEND), perhaps then (RCV|SEND).
                Some(Op::Shutdown) if p.hdr.flags == SHUTDOWN_BOTH => {
                    let mut e = streams.remove(&port).expect("shutdown of a known stream");
                    let rst = e.g.hdr(Op::Rst, 0, 0);
                    h.send(&rst, &[]);
                    finished += 1;
                }
                Some(Op::Shutdown) => assert!(streams.contains_key(&port)),
                other => panic!("unexpected {other:?} {:?}", p.hdr),
            }
        }
        for e in streams.values_mut() {
            while !e.pending.is_empty() {
                let n = (e.g.peer_credit() as usize)
                    .min(e.pending.len())
                    .min(MAX_PAYLOAD);
                if n == 0 {
                    break;
                }
                let data: Vec<u8> = e.pending.iter().take(n).copied().collect();
                let hdr = e.g.rw(n);
                if !h.try_send(&hdr, &data) {
                    e.g.tx_cnt = e.g.tx_cnt.wrapping_sub(n as u32);
                    break;
                }
                e.pending.drain(..n);
                idle = false;
                if e.g.consume(n) {
                    let upd = e.g.hdr(Op::CreditUpdate, 0, 0);
                    h.send(&upd, &[]);
                }
            }
        }
        if idle {
            std::thread::sleep(Duration::from_micros(50));
        }
    }
    for t in hosts {
        t.join().unwrap();
    }
    assert_eq!(done.load(Ordering::SeqCst), STREAMS);
}
