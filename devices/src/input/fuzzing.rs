//! virtio-input as a guest drives it and the host feeds it, from arbitrary
//! bytes: the fuzz target `virtio_input` (`fuzz/`) and the replay of its
//! regressions in `cargo test` both call [`run`].
//!
//! Layout of an input: byte 0 picks the device (bit 0: the tablet), the
//! queue the ring is (bit 1: the status queue) and how many chains are on
//! it (1–8, bits 2–4); byte 1 how many host events follow (0–15), each 8
//! bytes (type u16, code u16, value i32); the rest is the ring and guest
//! memory as [`crate::virtio::fuzz_ring`] lays them out. The events are
//! sent, the queue notified, and the configuration space read at every
//! select/subsel the input names: every buffer shape a driver can post,
//! with every event the control socket could hand on.

use std::sync::atomic::AtomicU32;
use std::sync::Arc;

use virtio_queue::{Queue, QueueT};

use super::Input;
use crate::irq::CountingIrq;
use crate::virtio::{fuzz_ring, Interrupt, VirtioDevice};

/// Feeds one input through the device; panics only on a bug.
pub fn run(data: &[u8]) {
    let (Some(&first), Some(&count)) = (data.first(), data.get(1)) else {
        return;
    };
    let mut device = if first & 1 == 1 {
        Input::tablet(1280, 800)
    } else {
        Input::keyboard()
    };
    let status_ring = first & 2 != 0;
    let chains = u16::from(first >> 2) % 8 + 1;
    let events = usize::from(count % 16);
    let body = data.get(2..).unwrap_or_default();
    let (events_bytes, rest) = body.split_at((events * 8).min(body.len()));
    let Some((mem, queue)) = fuzz_ring::build(rest, chains) else {
        return;
    };
    let Ok(other) = Queue::new(fuzz_ring::QSIZE) else {
        return;
    };
    let queues = if status_ring {
        vec![other, queue]
    } else {
        vec![queue, other]
    };
    let status = Arc::new(AtomicU32::new(0));
    let interrupt = Interrupt::new(status.clone(), status, Arc::new(CountingIrq::default()));
    let handle = device.handle();
    if device.activate(mem, interrupt, queues).is_err() {
        return;
    }
    for e in events_bytes.chunks_exact(8) {
        let kind = u16::from_le_bytes([e[0], e[1]]);
        let code = u16::from_le_bytes([e[2], e[3]]);
        let value = i32::from_le_bytes([e[4], e[5], e[6], e[7]]);
        let _ = handle.send(kind, code, value);
        // The config space at a select/subsel taken from the event.
        device.write_config(0, &e[..2]);
        let mut out = [0u8; 136];
        device.read_config(0, &mut out);
    }
    device.queue_notify(u16::from(status_ring));
    device.queue_notify(0);
}

#[cfg(test)]
mod tests {
    /// The fuzz target's saved inputs (`fuzz/regressions/virtio_input`),
    /// replayed on every `cargo test`.
    #[test]
    fn every_saved_fuzz_input_runs_through_the_device_without_a_panic() {
        assert!(crate::virtio::fuzz_ring::replay("virtio_input", super::run) > 0);
    }
}
