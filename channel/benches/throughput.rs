//! Channel throughput: Stdout frames of 64 KiB encoded and decoded in
//! memory, and sent over a Unix socket pair next to a raw `write`/`read`
//! loop of the same sizes in the same run. Not a timed test: it prints
//! figures and ratios (`cargo bench -p boxdesk-channel`).

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::thread;
use std::time::{Duration, Instant};

use boxdesk_channel::{Frame, FrameReader, FrameWriter};

const CHUNK: usize = 64 * 1024;
const SOCKET_BYTES: usize = 2 << 30;

fn gbps(bytes: usize, d: Duration) -> f64 {
    bytes as f64 / d.as_secs_f64() / 1e9
}

/// Encodes batches of 64 Stdout frames into one reused buffer and decodes
/// them back, `batches` times.
fn in_memory(batches: usize) -> Duration {
    const BATCH: usize = 64;
    let frame = Frame::Stdout(vec![0xa5; CHUNK]);
    let mut wire = Vec::with_capacity(BATCH * (CHUNK + 5));
    let mut n = 0;
    let t = Instant::now();
    for _ in 0..batches {
        wire.clear();
        let mut w = FrameWriter::new(&mut wire);
        for _ in 0..BATCH {
            w.write_frame(&frame).unwrap();
        }
        drop(w);
        let mut r = FrameReader::new(&wire[..]);
        while let Some(Frame::Stdout(d)) = r.read_frame().unwrap() {
            n += d.len();
        }
    }
    let d = t.elapsed();
    assert_eq!(n, batches * BATCH * CHUNK);
    d
}

fn framed_socket() -> Duration {
    let (a, b) = UnixStream::pair().unwrap();
    let t = Instant::now();
    let writer = thread::spawn(move || {
        let frame = Frame::Stdout(vec![0x5a; CHUNK]);
        let mut w = FrameWriter::new(a);
        for _ in 0..SOCKET_BYTES / CHUNK {
            w.write_frame(&frame).unwrap();
        }
    });
    let mut r = FrameReader::new(b);
    let mut n = 0;
    while let Some(Frame::Stdout(d)) = r.read_frame().unwrap() {
        n += d.len();
    }
    writer.join().unwrap();
    assert_eq!(n, SOCKET_BYTES);
    t.elapsed()
}

fn raw_socket() -> Duration {
    let (mut a, mut b) = UnixStream::pair().unwrap();
    let t = Instant::now();
    let writer = thread::spawn(move || {
        let chunk = vec![0x5a; CHUNK];
        for _ in 0..SOCKET_BYTES / CHUNK {
            a.write_all(&chunk).unwrap();
        }
    });
    let mut buf = vec![0; CHUNK];
    let mut n = 0;
    loop {
        match b.read(&mut buf).unwrap() {
            0 => break,
            k => n += k,
        }
    }
    writer.join().unwrap();
    assert_eq!(n, SOCKET_BYTES);
    t.elapsed()
}

fn main() {
    // `cargo test --benches` runs this with `--bench` absent: keep it quick.
    let quick = !std::env::args().any(|a| a == "--bench");
    let rounds = if quick { 1 } else { 5 };

    let batches = if quick { 1 } else { 64 };
    let best = (0..rounds).map(|_| in_memory(batches)).min().unwrap();
    let mem = gbps(batches * 64 * CHUNK, best);
    println!("in memory: encode+decode of 64 KiB Stdout frames: {mem:.2} GB/s (target >= 2 GB/s)");
    if quick {
        return;
    }

    // Alternate the two so both see the same machine state; keep the best.
    let (mut framed, mut raw) = (Duration::MAX, Duration::MAX);
    for _ in 0..rounds {
        framed = framed.min(framed_socket());
        raw = raw.min(raw_socket());
    }
    let (f, r) = (gbps(SOCKET_BYTES, framed), gbps(SOCKET_BYTES, raw));
    println!(
        "unix socket: framed {f:.2} GB/s, raw write/read {r:.2} GB/s, ratio {:.2} (target >= 0.80)",
        f / r
    );
}
