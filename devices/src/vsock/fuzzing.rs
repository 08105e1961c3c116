//! virtio-vsock as a guest drives it, from arbitrary bytes: the fuzz
//! target `virtio_vsock` (`fuzz/`) and the replay of its regressions in
//! `cargo test` both call [`run`].
//!
//! The real event loop (`worker::EventLoop`: TX parsing, the muxer's
//! connection table, credit, RX filling) runs on the fuzzing thread, one
//! turn at a time, over real sockets: the device's own listener (a host
//! client may connect and write `CONNECT 1024\n` first) and listeners at
//! `<uds>_1024` and `<uds>_1025`, so guest REQUESTs to those ports connect
//! and any other port gets RST.
//!
//! Layout of an input: byte 0 holds how many TX chains are on the ring
//! (1–16, bits 0–3), whether a host client connects first (bit 4), and
//! how many turns run (1–4, bits 5–6; each later turn is one
//! [`CONNECT_TIMEOUT`] later, so deadlines expire); byte 1 how many RX
//! buffers the guest posts (0–15); then 32 bytes of RX heads (u16 each);
//! the rest is the TX ring and guest memory as [`fuzz_ring`] lays them out
//! (headers, payloads, RX buffers — the two rings share one descriptor
//! table).

use std::io::Write;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicU32;
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use mio::Events;

use super::worker::{EventLoop, Setup};
use super::CONNECT_TIMEOUT;
use crate::irq::CountingIrq;
use crate::virtio::{fuzz_ring, Interrupt};

/// Where this process's sockets live, and the guest-port listeners.
struct Place {
    _dir: tempfile::TempDir,
    uds: PathBuf,
    ports: Vec<UnixListener>,
}

fn place() -> Option<&'static Place> {
    static PLACE: OnceLock<Option<Place>> = OnceLock::new();
    PLACE
        .get_or_init(|| {
            let dir = tempfile::tempdir().ok()?;
            let uds = dir.path().join("v.sock");
            let mut ports = Vec::new();
            for port in [1024, 1025] {
                let l = UnixListener::bind(format!("{}_{port}", uds.display())).ok()?;
                l.set_nonblocking(true).ok()?;
                ports.push(l);
            }
            Some(Place {
                _dir: dir,
                uds,
                ports,
            })
        })
        .as_ref()
}

fn listener(uds: &Path) -> Option<UnixListener> {
    let _ = std::fs::remove_file(uds);
    UnixListener::bind(uds).ok()
}

/// Feeds one input through the device's event loop; panics only on a bug.
pub fn run(data: &[u8]) {
    let (Some(&first), Some(&rx_count)) = (data.first(), data.get(1)) else {
        return;
    };
    let Some(place) = place() else {
        return;
    };
    let heads = data.get(2..34).unwrap_or_default();
    let ring = data.get(34..).unwrap_or_default();
    let Some((mem, tx)) = fuzz_ring::build(ring, u16::from(first & 15) + 1) else {
        return;
    };
    let Some(rx) = fuzz_ring::second(&mem, heads, u16::from(rx_count % 16)) else {
        return;
    };
    let Some(listen) = listener(&place.uds) else {
        return;
    };
    let status = Arc::new(AtomicU32::new(0));
    let interrupt = Interrupt::new(status.clone(), status, Arc::new(CountingIrq::default()));
    let setup = Setup {
        mem,
        interrupt,
        rx,
        tx,
        guest_cid: 3,
    };
    let Ok((mut ev, _waker)) = EventLoop::new(setup, listen, &place.uds) else {
        return;
    };
    let _client = (first & 16 != 0)
        .then(|| UnixStream::connect(&place.uds).ok())
        .flatten()
        .map(|mut c| {
            let _ = c.write_all(b"CONNECT 1024\n");
            c
        });
    let mut events = Events::with_capacity(64);
    let start = Instant::now();
    for turn in 0..u32::from((first >> 5) & 3) + 1 {
        if ev
            .poll_once(&mut events, start + CONNECT_TIMEOUT * turn)
            .is_err()
        {
            break;
        }
    }
    drop(ev);
    // What the guest's REQUESTs connected is closed now; empty the backlog.
    for l in &place.ports {
        while l.accept().is_ok() {}
    }
}

#[cfg(test)]
mod tests {
    /// The fuzz target's saved inputs (`fuzz/regressions/virtio_vsock`),
    /// replayed on every `cargo test`.
    #[test]
    fn every_saved_fuzz_input_runs_through_the_event_loop_without_a_panic() {
        assert!(crate::virtio::fuzz_ring::replay("virtio_vsock", super::run) > 0);
    }
}
