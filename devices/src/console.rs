//! What the console UARTs ([`serial`](crate::serial) on x86_64,
//! [`pl011`](crate::pl011) on aarch64) share: the [`Console`] contract the
//! VMM holds them by, the output writer that keeps the last [`TAIL_BYTES`]
//! of output, and the bounded queue of console input waiting for room in a
//! receive FIFO.
//!
//! Owns: nothing of a UART's registers or interrupt; only the byte plumbing
//! around them. Must never: grow without bound (the tail is capped at
//! [`TAIL_BYTES`], pending input at [`MAX_PENDING_INPUT`]), or lose a byte
//! from the tail because the output writer failed.

use std::collections::VecDeque;
use std::io::{self, Write};
use std::sync::{Arc, Mutex};

use crate::bus::{BusDevice, SharedDevice};

/// How much of the latest output [`Console::tail`] keeps.
pub const TAIL_BYTES: usize = 4096;
/// How much console input may wait for the guest to read; more is dropped.
pub const MAX_PENDING_INPUT: usize = 32 << 10;

/// A UART the VMM uses as the guest's console, whichever the architecture.
pub trait Console: BusDevice {
    /// The last (up to) [`TAIL_BYTES`] bytes the guest wrote, oldest first.
    fn tail(&self) -> Vec<u8>;
    /// Console input for the guest: fills the receive FIFO (raising the
    /// interrupt if the guest enabled it) and keeps up to
    /// [`MAX_PENDING_INPUT`] more until the guest has read room free; the
    /// rest is dropped.
    fn enqueue_input(&mut self, bytes: &[u8]);
}

/// A console as the VMM holds it (locked per use, like a [`SharedDevice`]).
pub type SharedConsole = Arc<Mutex<dyn Console>>;

/// One console, two views of the same lock: as a [`Console`] for the VMM
/// and as a [`SharedDevice`] to insert in a [`Bus`](crate::bus::Bus).
///
/// (A `SharedConsole` cannot itself become a `SharedDevice`: the unsizing
/// has to happen from the concrete type, which is what this does.)
pub fn shared<C: Console + 'static>(console: C) -> (SharedConsole, SharedDevice) {
    let concrete = Arc::new(Mutex::new(console));
    (concrete.clone(), concrete)
}

/// The output writer plus a ring of the last [`TAIL_BYTES`] written.
pub(crate) struct TailWriter {
    out: Box<dyn Write + Send>,
    tail: VecDeque<u8>,
}

impl TailWriter {
    /// Output to `out`, with an empty tail.
    pub(crate) fn new(out: Box<dyn Write + Send>) -> Self {
        Self {
            out,
            tail: VecDeque::with_capacity(TAIL_BYTES),
        }
    }

    /// The tail, oldest byte first.
    pub(crate) fn tail(&self) -> Vec<u8> {
        self.tail.iter().copied().collect()
    }
}

impl Write for TailWriter {
    /// Keeps `buf` in the tail first, so a failing writer loses nothing
    /// there.
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let keep = &buf[buf.len().saturating_sub(TAIL_BYTES)..];
        let overflow = (self.tail.len() + keep.len()).saturating_sub(TAIL_BYTES);
        self.tail.drain(..overflow);
        self.tail.extend(keep);
        self.out.write_all(buf)?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
    }
}

/// Console input not yet in a receive FIFO, at most [`MAX_PENDING_INPUT`]
/// bytes.
#[derive(Debug, Default)]
pub(crate) struct PendingInput(VecDeque<u8>);

impl PendingInput {
    /// Queues as much of `bytes` as fits; returns how many were dropped.
    pub(crate) fn push(&mut self, bytes: &[u8]) -> usize {
        let room = MAX_PENDING_INPUT.saturating_sub(self.0.len());
        let taken = bytes.len().min(room);
        self.0.extend(&bytes[..taken]);
        bytes.len() - taken
    }

    /// The oldest bytes, as one contiguous slice (possibly not all of them).
    pub(crate) fn front(&self) -> &[u8] {
        self.0.as_slices().0
    }

    /// Forgets the `n` oldest bytes (those a FIFO took).
    pub(crate) fn consume(&mut self, n: usize) {
        self.0.drain(..n.min(self.0.len()));
    }

    /// Takes the oldest byte.
    pub(crate) fn pop(&mut self) -> Option<u8> {
        self.0.pop_front()
    }

    /// How many bytes wait.
    pub(crate) fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether none wait.
    pub(crate) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// A writer whose bytes the test keeps a handle on: for tests.
#[cfg(test)]
#[derive(Clone, Default)]
pub(crate) struct Captured(pub(crate) Arc<Mutex<Vec<u8>>>);

#[cfg(test)]
impl Captured {
    /// Everything written so far.
    pub(crate) fn bytes(&self) -> Vec<u8> {
        self.0.lock().unwrap().clone()
    }
}

#[cfg(test)]
impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bus::Bus;

    /// A console that echoes the last byte written as its tail.
    #[derive(Default)]
    struct Echo(Vec<u8>);

    impl BusDevice for Echo {
        fn read(&mut self, _offset: u64, data: &mut [u8]) {
            data.fill(0);
        }
        fn write(&mut self, _offset: u64, data: &[u8]) {
            self.0.extend_from_slice(data);
        }
    }

    impl Console for Echo {
        fn tail(&self) -> Vec<u8> {
            self.0.clone()
        }
        fn enqueue_input(&mut self, _bytes: &[u8]) {}
    }

    #[test]
    fn a_shared_console_and_its_bus_device_are_the_same_device() {
        let (console, device) = shared(Echo::default());
        let mut bus = Bus::default();
        bus.insert(0x1000, 0x1000, device).unwrap();
        assert!(bus.write(0x1000, b"hi"));
        assert_eq!(console.lock().unwrap().tail(), b"hi");
    }

    #[test]
    fn pending_input_beyond_its_bound_is_dropped_and_counted() {
        let mut p = PendingInput::default();
        assert_eq!(p.push(&vec![1; MAX_PENDING_INPUT - 10]), 0);
        assert_eq!(p.push(&[2; 25]), 15);
        assert_eq!(p.len(), MAX_PENDING_INPUT);
        p.consume(MAX_PENDING_INPUT - 10);
        assert_eq!(p.front().first(), Some(&2));
        let rest: Vec<u8> = std::iter::from_fn(|| p.pop()).collect();
        assert_eq!(rest, [2; 10]);
        assert!(p.is_empty());
    }
}
