//! The 8250/16550A UART (`vm_superio::Serial`) as a [`BusDevice`] of
//! [`SERIAL_PORT_LEN`] bytes, at [`SERIAL_PORT_BASE`] (COM1) on x86_64 PIO
//! or anywhere on an MMIO bus (one-byte registers, no shift).
//!
//! Owns: the UART registers, the output writer the VMM hands in (a log file
//! or the terminal) with the last [`TAIL_BYTES`] of output (for the VMM to
//! show when a guest panics), console input waiting for room in the 64-byte
//! receive FIFO (at most [`MAX_PENDING_INPUT`] bytes), and the interrupt
//! line (through a [`Trigger`] over [`IrqLine`]). The tail and the input
//! queue are [`console`](crate::console)'s, shared with the PL011; the VMM
//! may hold the UART as a [`Console`].
//!
//! Must never: panic on any access (wider accesses and offsets beyond the
//! eight registers read as 0 and are ignored), block the vCPU on anything
//! but the output writer, or grow without bound on input or output.

use std::convert::Infallible;
use std::io::Write;
use std::sync::Arc;

use tracing::debug;
use vm_superio::serial::NoEvents;
use vm_superio::{Serial as Uart, Trigger};

use crate::bus::BusDevice;
use crate::console::{Console, PendingInput, TailWriter};
pub use crate::console::{MAX_PENDING_INPUT, TAIL_BYTES};
use crate::irq::IrqLine;

/// COM1's first port.
pub const SERIAL_PORT_BASE: u64 = 0x3f8;
/// The UART's eight registers.
pub const SERIAL_PORT_LEN: u64 = 8;

/// What the UART ignored or lost (debug logs only: the guest never sees an
/// error).
#[derive(Debug, thiserror::Error)]
pub enum SerialError {
    /// An access wider than one byte, or beyond the eight registers.
    #[error("ignored {len}-byte access at offset {offset:#x}")]
    BadAccess {
        /// The offset from the first port.
        offset: u64,
        /// The width of the access.
        len: usize,
    },
    /// The output writer failed; the byte is in the tail but lost there.
    #[error("serial output: {0}")]
    Output(String),
    /// Console input beyond [`MAX_PENDING_INPUT`] was dropped.
    #[error("{0} bytes of console input dropped")]
    InputDropped(usize),
}

/// The UART's interrupt: an edge on the device's [`IrqLine`].
struct IrqTrigger(Arc<dyn IrqLine>);

impl Trigger for IrqTrigger {
    type E = Infallible;

    fn trigger(&self) -> Result<(), Infallible> {
        self.0.trigger();
        Ok(())
    }
}

/// The UART, its output tail and its pending console input.
pub struct Serial {
    uart: Uart<IrqTrigger, NoEvents, TailWriter>,
    pending: PendingInput,
}

impl std::fmt::Debug for Serial {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Serial")
            .field("pending_input", &self.pending.len())
            .finish()
    }
}

impl Serial {
    /// A UART writing the guest's output to `out` and raising `irq`.
    pub fn new(out: Box<dyn Write + Send>, irq: Arc<dyn IrqLine>) -> Self {
        Self {
            uart: Uart::new(IrqTrigger(irq), TailWriter::new(out)),
            pending: PendingInput::default(),
        }
    }

    /// Console input for the guest: fills the receive FIFO (raising the
    /// interrupt if the guest enabled it) and keeps the rest until the
    /// guest has read room free.
    pub fn enqueue_input(&mut self, bytes: &[u8]) {
        let dropped = self.pending.push(bytes);
        if dropped > 0 {
            debug!("serial: {}", SerialError::InputDropped(dropped));
        }
        self.fill_fifo();
    }

    /// The last (up to) [`TAIL_BYTES`] bytes the guest wrote, oldest first.
    pub fn tail(&self) -> Vec<u8> {
        self.uart.writer().tail()
    }

    /// Moves pending input into the FIFO while it has room.
    fn fill_fifo(&mut self) {
        while !self.pending.is_empty() && self.uart.fifo_capacity() > 0 {
            match self.uart.enqueue_raw_bytes(self.pending.front()) {
                // 0: loopback mode, where input is not received.
                Ok(0) | Err(_) => break,
                Ok(n) => self.pending.consume(n),
            }
        }
    }
}

impl BusDevice for Serial {
    fn read(&mut self, offset: u64, data: &mut [u8]) {
        data.fill(0);
        let len = data.len();
        let ([byte], Ok(reg)) = (data, u8::try_from(offset)) else {
            debug!("serial: {}", SerialError::BadAccess { offset, len });
            return;
        };
        if offset >= SERIAL_PORT_LEN {
            debug!("serial: {}", SerialError::BadAccess { offset, len: 1 });
            return;
        }
        *byte = self.uart.read(reg);
        // A read of the receive buffer may have made room in the FIFO.
        self.fill_fifo();
    }

    fn write(&mut self, offset: u64, data: &[u8]) {
        let (&[byte], Ok(reg)) = (data, u8::try_from(offset)) else {
            debug!(
                "serial: {}",
                SerialError::BadAccess {
                    offset,
                    len: data.len()
                }
            );
            return;
        };
        if offset >= SERIAL_PORT_LEN {
            debug!("serial: {}", SerialError::BadAccess { offset, len: 1 });
            return;
        }
        if let Err(e) = self.uart.write(reg, byte) {
            debug!("serial: {}", SerialError::Output(e.to_string()));
        }
    }
}

impl Console for Serial {
    fn tail(&self) -> Vec<u8> {
        Serial::tail(self)
    }

    fn enqueue_input(&mut self, bytes: &[u8]) {
        Serial::enqueue_input(self, bytes);
    }
}

#[cfg(test)]
mod tests {
    use std::io;
    use std::sync::Mutex;

    use super::*;
    use crate::irq::CountingIrq;

    /// THR/RBR, IER, LSR offsets and the LSR data-ready bit.
    const THR: u64 = 0;
    const IER: u64 = 1;
    const LSR: u64 = 5;
    const LSR_DATA_READY: u8 = 0x01;

    #[derive(Clone, Default)]
    struct Shared(Arc<Mutex<Vec<u8>>>);

    impl Write for Shared {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    struct Broken;

    impl Write for Broken {
        fn write(&mut self, _: &[u8]) -> io::Result<usize> {
            Err(io::Error::other("gone"))
        }
        fn flush(&mut self) -> io::Result<()> {
            Err(io::Error::other("gone"))
        }
    }

    fn uart() -> (Serial, Shared, Arc<CountingIrq>) {
        let out = Shared::default();
        let irq = Arc::new(CountingIrq::default());
        (Serial::new(Box::new(out.clone()), irq.clone()), out, irq)
    }

    fn inb(s: &mut Serial, offset: u64) -> u8 {
        let mut b = [0u8];
        s.read(offset, &mut b);
        b[0]
    }

    #[test]
    fn bytes_written_to_the_thr_reach_the_writer_and_the_tail() {
        let (mut s, out, _) = uart();
        for &b in b"Linux version 6.1\n" {
            s.write(THR, &[b]);
        }
        assert_eq!(&*out.0.lock().unwrap(), b"Linux version 6.1\n");
        assert_eq!(s.tail(), b"Linux version 6.1\n");
    }

    #[test]
    fn the_tail_keeps_only_the_last_4_kib_of_output() {
        let (mut s, out, _) = uart();
        for i in 0..(TAIL_BYTES + 100) {
            s.write(THR, &[(i % 251) as u8]);
        }
        let tail = s.tail();
        assert_eq!(tail.len(), TAIL_BYTES);
        assert_eq!(tail[0], 100);
        assert_eq!(*tail.last().unwrap(), ((TAIL_BYTES + 99) % 251) as u8);
        assert_eq!(out.0.lock().unwrap().len(), TAIL_BYTES + 100);
    }

    #[test]
    fn output_still_reaches_the_tail_when_the_writer_fails() {
        let irq = Arc::new(CountingIrq::default());
        let mut s = Serial::new(Box::new(Broken), irq);
        s.write(THR, b"x");
        assert_eq!(s.tail(), b"x");
    }

    #[test]
    fn console_input_beyond_the_fifo_is_delivered_as_the_guest_reads() {
        let (mut s, _, irq) = uart();
        s.write(IER, &[0x01]);
        let input: Vec<u8> = (0..200u8).collect();
        s.enqueue_input(&input);
        assert!(irq.count() >= 1, "the receive interrupt fired");
        let mut got = Vec::new();
        while inb(&mut s, LSR) & LSR_DATA_READY != 0 {
            got.push(inb(&mut s, THR));
        }
        assert_eq!(got, input);
    }

    #[test]
    fn accesses_wider_than_a_byte_or_beyond_the_registers_are_ignored() {
        let (mut s, out, _) = uart();
        s.write(THR, b"ab");
        s.write(8, b"a");
        s.write(u64::MAX, b"a");
        let mut wide = [0xffu8; 2];
        s.read(LSR, &mut wide);
        assert_eq!(wide, [0, 0]);
        assert_eq!(inb(&mut s, 300), 0);
        assert!(out.0.lock().unwrap().is_empty());
        assert!(s.tail().is_empty());
    }
}
