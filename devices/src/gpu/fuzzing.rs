//! virtio-gpu as a guest drives it, from arbitrary bytes: the fuzz target
//! `virtio_gpu` (`fuzz/`) and the replay of its regressions in `cargo
//! test` both call [`run`].
//!
//! Layout of an input: byte 0 picks the queue (bit 0: the cursor queue)
//! and how many chains are on its ring (1–8, bits 1–3); the rest is the
//! ring and guest memory as [`crate::virtio::fuzz_ring`] lays them out,
//! the commands, backing entries and pixels in that memory. The
//! chains run in order against one device state, so a input can create,
//! back, transfer and flush a resource: every command sequence a driver
//! can send, through the real parser, 2D engine and screen.

use std::sync::atomic::{AtomicBool, AtomicU32};
use std::sync::{Arc, Condvar, Mutex};

use boxdesk_platform::screen::Screen;
use virtio_queue::{Queue, QueueT};

use super::state::Gpu2d;
use super::Shared;
use crate::irq::CountingIrq;
use crate::virtio::{fuzz_ring, Interrupt};

/// Feeds one input through the device; panics only on a bug.
pub fn run(data: &[u8]) {
    let Some(&first) = data.first() else {
        return;
    };
    let Ok(screen) = Screen::new(64, 48) else {
        return;
    };
    let cursor = first & 1 == 1;
    let chains = u16::from(first >> 1) % 8 + 1;
    let Some((mem, queue)) = fuzz_ring::build(&data[1..], chains) else {
        return;
    };
    let status = Arc::new(AtomicU32::new(0));
    let interrupt = Interrupt::new(status.clone(), status, Arc::new(CountingIrq::default()));
    let mut queues = vec![Mutex::new(queue)];
    if cursor {
        // The same ring as queue 1 (the cursor queue); queue 0 unused.
        let Ok(control) = Queue::new(fuzz_ring::QSIZE) else {
            return;
        };
        queues.insert(0, Mutex::new(control));
    }
    let shared = Shared {
        mem,
        interrupt,
        queues,
        gpu: Arc::new(Mutex::new(Gpu2d::new(Arc::new(screen)))),
        pending: Mutex::new((0, false)),
        wake: Condvar::new(),
        broken: AtomicBool::new(false),
    };
    shared.drain(usize::from(cursor));
}

#[cfg(test)]
mod tests {
    /// The fuzz target's saved inputs (`fuzz/regressions/virtio_gpu`),
    /// replayed on every `cargo test`.
    #[test]
    fn every_saved_fuzz_input_runs_through_the_device_without_a_panic() {
        assert!(crate::virtio::fuzz_ring::replay("virtio_gpu", super::run) > 0);
    }
}
