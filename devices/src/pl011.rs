//! The Arm PrimeCell PL011 UART (r1p5) as a [`BusDevice`] of
//! [`PL011_SIZE`] bytes: the aarch64 guest's console, driven by Linux's
//! `amba-pl011` driver (and its earlycon).
//!
//! Transmission is instant: a byte written to DR reaches the output writer
//! before the write returns, so the transmit FIFO is always empty (FR.TXFE
//! set, TXFF and BUSY clear). Received bytes go through a 32-byte FIFO (one
//! byte while LCR_H.FEN is clear); console input beyond it waits in the
//! shared [`console`](crate::console) queue. The UARTEN/TXE/RXE bits of CR
//! are stored but not obeyed, since earlycon writes before anyone sets
//! them; CR.LBE (loopback) sends written bytes to the receive side instead
//! of the writer. There is no DMA, no modem line and no receive error.
//!
//! Interrupts: RIS holds TX (set when a byte has been sent, and when the
//! guest unmasks TXIM — Linux's interrupt-driven transmit waits for that
//! edge), RX and RT (set when input arrives, cleared when the FIFO drains);
//! ICR clears any of them. The line is edge-only, so one edge is raised each
//! time the masked status (RIS & IMSC) gains a bit: never while a bit the
//! guest has not yet handled stays set, and never on an access that sets
//! nothing new.
//!
//! Owns: the registers, the receive FIFO, the output writer with the last
//! [`TAIL_BYTES`](crate::console::TAIL_BYTES) of output, pending console
//! input and the interrupt line. Must never: panic on any access (widths
//! other than 1, 2 or 4 bytes, unaligned offsets and writes to anything
//! but a register's low byte are ignored, reading as 0), block the vCPU on
//! anything but the output writer, or grow without bound.

use std::collections::VecDeque;
use std::io::Write;
use std::sync::Arc;

use tracing::debug;

use crate::bus::BusDevice;
use crate::console::{Console, PendingInput, TailWriter};
use crate::irq::IrqLine;

/// The length of the PL011's bus range.
pub const PL011_SIZE: u64 = 0x1000;

/// Data: write transmits, read takes a byte from the receive FIFO.
const DR: u64 = 0x000;
/// Receive status (read) / error clear (write).
const RSR_ECR: u64 = 0x004;
/// Flags (read-only).
const FR: u64 = 0x018;
/// IrDA low-power counter.
const ILPR: u64 = 0x020;
/// Integer baud rate divisor.
const IBRD: u64 = 0x024;
/// Fractional baud rate divisor.
const FBRD: u64 = 0x028;
/// Line control.
const LCR_H: u64 = 0x02c;
/// Control.
const CR: u64 = 0x030;
/// FIFO interrupt levels.
const IFLS: u64 = 0x034;
/// Interrupt mask set/clear.
const IMSC: u64 = 0x038;
/// Raw interrupt status (read-only).
const RIS: u64 = 0x03c;
/// Masked interrupt status (read-only).
const MIS: u64 = 0x040;
/// Interrupt clear (write-only).
const ICR: u64 = 0x044;
/// DMA control.
const DMACR: u64 = 0x048;
/// PeriphID0..3 then PCellID0..3, one byte per word.
const ID_BASE: u64 = 0xfe0;
/// PL011 r1p5, then the PrimeCell signature: what the AMBA bus matches.
const AMBA_IDS: [u8; 8] = [0x11, 0x10, 0x14, 0x00, 0x0d, 0xf0, 0x05, 0xb1];

/// FR: the UART is sending (never: transmission is instant).
#[cfg(test)]
const FR_BUSY: u32 = 1 << 3;
/// FR: the receive FIFO is empty.
const FR_RXFE: u32 = 1 << 4;
/// FR: the receive FIFO is full.
const FR_RXFF: u32 = 1 << 6;
/// FR: the transmit FIFO is empty (always).
const FR_TXFE: u32 = 1 << 7;

/// LCR_H: FIFOs enabled.
const LCR_H_FEN: u32 = 1 << 4;
/// CR: loopback.
const CR_LBE: u32 = 1 << 7;
/// CR at reset: TXE and RXE.
const CR_RESET: u32 = 0x300;
/// IFLS at reset: both FIFOs at half.
const IFLS_RESET: u32 = 0x12;

/// Interrupt: receive.
const INT_RX: u32 = 1 << 4;
/// Interrupt: transmit.
const INT_TX: u32 = 1 << 5;
/// Interrupt: receive timeout.
const INT_RT: u32 = 1 << 6;
/// The eleven interrupt bits of IMSC/RIS/MIS/ICR.
const INT_MASK: u32 = 0x7ff;

/// Depth of the receive FIFO while LCR_H.FEN is set.
const RX_FIFO_DEPTH: usize = 32;

/// What the UART ignored or lost (debug logs only: the guest never sees an
/// error).
#[derive(Debug, thiserror::Error)]
pub enum Pl011Error {
    /// An access not 1, 2 or 4 bytes wide, not aligned to its width, past
    /// the device, or a write to a register's upper bytes.
    #[error("ignored {len}-byte access at offset {offset:#x}")]
    BadAccess {
        /// The offset into the device.
        offset: u64,
        /// The width of the access.
        len: usize,
    },
    /// A read of a reserved or write-only offset (reads as 0).
    #[error("nothing to read at offset {0:#x}")]
    NoRead(u64),
    /// A write to a reserved or read-only offset.
    #[error("nothing to write at offset {0:#x}")]
    NoWrite(u64),
    /// The output writer failed; the byte is in the tail but lost there.
    #[error("output: {0}")]
    Output(String),
    /// Console input beyond
    /// [`MAX_PENDING_INPUT`](crate::console::MAX_PENDING_INPUT) was dropped.
    #[error("{0} bytes of console input dropped")]
    InputDropped(usize),
}

/// The UART, its output tail and its pending console input.
pub struct Pl011 {
    out: TailWriter,
    irq: Arc<dyn IrqLine>,
    rx: VecDeque<u8>,
    pending: PendingInput,
    ilpr: u32,
    ibrd: u32,
    fbrd: u32,
    lcr_h: u32,
    cr: u32,
    ifls: u32,
    imsc: u32,
    ris: u32,
    dmacr: u32,
}

impl std::fmt::Debug for Pl011 {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pl011")
            .field("rx", &self.rx.len())
            .field("pending_input", &self.pending.len())
            .field("imsc", &self.imsc)
            .field("ris", &self.ris)
            .finish()
    }
}

impl Pl011 {
    /// A UART at reset, writing the guest's output to `out` and raising
    /// `irq`.
    pub fn new(out: Box<dyn Write + Send>, irq: Arc<dyn IrqLine>) -> Self {
        Self {
            out: TailWriter::new(out),
            irq,
            rx: VecDeque::with_capacity(RX_FIFO_DEPTH),
            pending: PendingInput::default(),
            ilpr: 0,
            ibrd: 0,
            fbrd: 0,
            lcr_h: 0,
            cr: CR_RESET,
            ifls: IFLS_RESET,
            imsc: 0,
            ris: 0,
            dmacr: 0,
        }
    }

    fn mis(&self) -> u32 {
        self.ris & self.imsc
    }

    /// The one place the line is raised: when the masked status has a bit
    /// it did not have at `before`.
    fn raise_if_gained(&self, before: u32) {
        if self.mis() & !before != 0 {
            self.irq.trigger();
        }
    }

    fn fifo_depth(&self) -> usize {
        if self.lcr_h & LCR_H_FEN != 0 {
            RX_FIFO_DEPTH
        } else {
            1
        }
    }

    fn flags(&self) -> u32 {
        let mut fr = FR_TXFE;
        if self.rx.is_empty() {
            fr |= FR_RXFE;
        }
        // Bytes already in the FIFO stay when FEN is cleared, so "full"
        // means at or over the depth.
        if self.rx.len() >= self.fifo_depth() {
            fr |= FR_RXFF;
        }
        fr
    }

    /// Moves pending input into the FIFO while it has room; bytes moved
    /// are input arriving (RX and RT).
    fn receive(&mut self) {
        let mut moved = false;
        while self.rx.len() < self.fifo_depth() {
            let Some(byte) = self.pending.pop() else {
                break;
            };
            self.rx.push_back(byte);
            moved = true;
        }
        if moved {
            self.ris |= INT_RX | INT_RT;
        }
    }

    /// Queues `bytes` behind the FIFO and fills it; says so when some are
    /// dropped.
    fn queue(&mut self, bytes: &[u8]) {
        let dropped = self.pending.push(bytes);
        if dropped > 0 {
            debug!("pl011: {}", Pl011Error::InputDropped(dropped));
        }
        self.receive();
    }

    fn transmit(&mut self, byte: u8) {
        if self.cr & CR_LBE != 0 {
            self.queue(&[byte]);
        } else if let Err(e) = self.out.write_all(&[byte]).and_then(|()| self.out.flush()) {
            debug!("pl011: {}", Pl011Error::Output(e.to_string()));
        }
        // The FIFO is empty again at once.
        self.ris |= INT_TX;
    }

    /// A DR read: the oldest received byte (0 when there is none).
    fn read_data(&mut self) -> u32 {
        let before = self.mis();
        let byte = self.rx.pop_front().unwrap_or(0);
        self.receive();
        if self.rx.is_empty() {
            self.ris &= !(INT_RX | INT_RT);
        }
        // Gains only if ICR had cleared RX and pending input just refilled.
        self.raise_if_gained(before);
        u32::from(byte)
    }

    /// The value of the register at `reg` (word-aligned), without side
    /// effects; `None` for reserved and write-only offsets.
    fn register(&self, reg: u64) -> Option<u32> {
        Some(match reg {
            // DR's upper bits are the receive error flags: never set.
            DR | RSR_ECR => 0,
            FR => self.flags(),
            ILPR => self.ilpr,
            IBRD => self.ibrd,
            FBRD => self.fbrd,
            LCR_H => self.lcr_h,
            CR => self.cr,
            IFLS => self.ifls,
            IMSC => self.imsc,
            RIS => self.ris,
            MIS => self.mis(),
            DMACR => self.dmacr,
            ID_BASE..PL011_SIZE => {
                let index = usize::try_from((reg - ID_BASE) / 4).ok()?;
                u32::from(*AMBA_IDS.get(index)?)
            }
            _ => return None,
        })
    }

    fn write_register(&mut self, reg: u64, value: u32) {
        let before = self.mis();
        match reg {
            DR => self.transmit(value as u8),
            // Clears receive errors, of which there are none.
            RSR_ECR => {}
            ILPR => self.ilpr = value & 0xff,
            IBRD => self.ibrd = value & 0xffff,
            FBRD => self.fbrd = value & 0x3f,
            LCR_H => {
                self.lcr_h = value & 0xff;
                // Enabling the FIFO makes room for pending input.
                self.receive();
            }
            CR => self.cr = value & 0xffff,
            IFLS => self.ifls = value & 0x3f,
            IMSC => {
                let unmasked = value & !self.imsc;
                self.imsc = value & INT_MASK;
                // The transmit FIFO is always empty, so TXIM finds it so.
                if unmasked & INT_TX != 0 {
                    self.ris |= INT_TX;
                }
            }
            ICR => self.ris &= !value,
            DMACR => self.dmacr = value & 0x7,
            _ => debug!("pl011: {}", Pl011Error::NoWrite(reg)),
        }
        self.raise_if_gained(before);
    }
}

/// The access's width and whether it is aligned to it within the device.
fn valid_access(offset: u64, len: usize) -> bool {
    matches!(len, 1 | 2 | 4) && offset < PL011_SIZE && offset % len as u64 == 0
}

impl BusDevice for Pl011 {
    fn read(&mut self, offset: u64, data: &mut [u8]) {
        data.fill(0);
        let len = data.len();
        if !valid_access(offset, len) {
            debug!("pl011: {}", Pl011Error::BadAccess { offset, len });
            return;
        }
        // A narrow read at offset 4n + lane sees that lane of the register.
        let lane = offset % 4;
        let reg = offset - lane;
        let value = if reg == DR && lane == 0 {
            self.read_data()
        } else if let Some(value) = self.register(reg) {
            value
        } else {
            debug!("pl011: {}", Pl011Error::NoRead(offset));
            return;
        };
        let bytes = (value >> (8 * lane)).to_le_bytes();
        data.copy_from_slice(&bytes[..len]);
    }

    fn write(&mut self, offset: u64, data: &[u8]) {
        let len = data.len();
        if !valid_access(offset, len) || offset % 4 != 0 {
            debug!("pl011: {}", Pl011Error::BadAccess { offset, len });
            return;
        }
        let mut word = [0u8; 4];
        word[..len].copy_from_slice(data);
        self.write_register(offset, u32::from_le_bytes(word));
    }
}

impl Console for Pl011 {
    fn tail(&self) -> Vec<u8> {
        self.out.tail()
    }

    fn enqueue_input(&mut self, bytes: &[u8]) {
        if bytes.is_empty() {
            return;
        }
        let before = self.mis();
        self.queue(bytes);
        // Input that found the FIFO full is still input arriving: after
        // the guest cleared RX through ICR, this is what tells it to read.
        if !self.rx.is_empty() {
            self.ris |= INT_RX | INT_RT;
        }
        self.raise_if_gained(before);
    }
}

#[cfg(test)]
mod tests;
