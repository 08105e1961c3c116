//! The i8042 keyboard controller, reduced to what a Linux guest booted with
//! `reboot=k` needs: the CPU-reset command (0xFE on port 0x64) calls the
//! VMM's reset callback. Ports 0x60 (data, offset 0) and 0x64
//! (status/command, offset 4) form one [`BusDevice`] of
//! [`I8042_PORT_LEN`] bytes at [`I8042_PORT_BASE`].
//!
//! So that Linux's probe does not wait out its 500 ms timeouts, the
//! controller answers the few commands the driver polls for (read/write the
//! control byte, the self tests, the output port); everything else —
//! keyboard traffic, the aux port, other commands — is ignored and no
//! interrupt is ever raised. The guest command line should carry
//! `i8042.noaux i8042.nomux i8042.nopnp i8042.dumbkbd` (as Firecracker's).
//!
//! Owns: the control byte, a one-byte output buffer, and the reset callback.
//! Must never: panic on any access (any width, any offset), or call the
//! callback for anything but command 0xFE.

use tracing::debug;

use crate::bus::BusDevice;

/// The first port of the controller (the data port).
pub const I8042_PORT_BASE: u64 = 0x60;
/// The length of its bus range: ports 0x60..=0x64.
pub const I8042_PORT_LEN: u64 = 5;

/// Offset of the data port (0x60).
const DATA: u64 = 0;
/// Offset of the status (read) and command (write) port (0x64).
const COMMAND: u64 = 4;

/// Status: the output buffer holds a byte for the guest.
const STATUS_OUTPUT_FULL: u8 = 0x01;
/// Status: the system flag (self test passed).
const STATUS_SYSTEM: u8 = 0x04;
/// Status: the last write went to the command port.
const STATUS_COMMAND: u8 = 0x08;

/// Command: read the control byte.
const CMD_READ_CTR: u8 = 0x20;
/// Command: write the control byte (next data byte).
const CMD_WRITE_CTR: u8 = 0x60;
/// Command: controller self test (answers 0x55).
const CMD_SELF_TEST: u8 = 0xaa;
/// Command: keyboard interface test (answers 0: no error).
const CMD_KBD_TEST: u8 = 0xab;
/// Command: read the output port.
const CMD_READ_OUTPUT: u8 = 0xd0;
/// Command: write the output port (next data byte).
const CMD_WRITE_OUTPUT: u8 = 0xd1;
/// Command: pulse the CPU reset line.
pub const CMD_RESET_CPU: u8 = 0xfe;

/// The control byte at power-on: keyboard interrupt, system flag,
/// translation, aux port disabled.
const DEFAULT_CTR: u8 = 0x01 | 0x04 | 0x20 | 0x40;
/// The output port at power-on: reset line high (not in reset), A20 on.
const DEFAULT_OUTPUT_PORT: u8 = 0x03;

/// What the controller ignored (for debug logs only: the guest never sees
/// an error).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum I8042Error {
    /// An access other than one byte at the data or the command port.
    #[error("ignored {len}-byte access at offset {offset:#x}")]
    BadAccess {
        /// The offset from port 0x60.
        offset: u64,
        /// The width of the access.
        len: usize,
    },
    /// A command this model does not implement.
    #[error("ignored command {0:#x}")]
    UnknownCommand(u8),
}

/// What the next byte written to the data port means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum DataWrite {
    /// Keyboard traffic: ignored.
    Keyboard,
    /// The new control byte.
    Control,
    /// The new output port value.
    OutputPort,
}

/// The i8042 controller.
pub struct I8042 {
    on_reset: Box<dyn Fn() + Send>,
    control: u8,
    output_port: u8,
    output: Option<u8>,
    last_was_command: bool,
    next_data: DataWrite,
}

impl std::fmt::Debug for I8042 {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("I8042")
            .field("control", &self.control)
            .field("output", &self.output)
            .finish()
    }
}

impl I8042 {
    /// A controller that calls `on_reset` each time the guest writes the
    /// CPU-reset command (0xFE to port 0x64).
    pub fn new(on_reset: Box<dyn Fn() + Send>) -> Self {
        Self {
            on_reset,
            control: DEFAULT_CTR,
            output_port: DEFAULT_OUTPUT_PORT,
            output: None,
            last_was_command: false,
            next_data: DataWrite::Keyboard,
        }
    }

    fn status(&self) -> u8 {
        let mut s = STATUS_SYSTEM;
        if self.output.is_some() {
            s |= STATUS_OUTPUT_FULL;
        }
        if self.last_was_command {
            s |= STATUS_COMMAND;
        }
        s
    }

    fn command(&mut self, cmd: u8) {
        self.next_data = DataWrite::Keyboard;
        match cmd {
            CMD_RESET_CPU => (self.on_reset)(),
            CMD_READ_CTR => self.output = Some(self.control),
            CMD_WRITE_CTR => self.next_data = DataWrite::Control,
            CMD_SELF_TEST => self.output = Some(0x55),
            CMD_KBD_TEST => self.output = Some(0x00),
            CMD_READ_OUTPUT => self.output = Some(self.output_port),
            CMD_WRITE_OUTPUT => self.next_data = DataWrite::OutputPort,
            other => debug!("i8042: {}", I8042Error::UnknownCommand(other)),
        }
    }
}

impl BusDevice for I8042 {
    fn read(&mut self, offset: u64, data: &mut [u8]) {
        data.fill(0);
        let [byte] = data else {
            debug!(
                "i8042: {}",
                I8042Error::BadAccess {
                    offset,
                    len: data.len()
                }
            );
            return;
        };
        *byte = match offset {
            DATA => self.output.take().unwrap_or(0),
            COMMAND => self.status(),
            _ => 0,
        };
    }

    fn write(&mut self, offset: u64, data: &[u8]) {
        let &[byte] = data else {
            debug!(
                "i8042: {}",
                I8042Error::BadAccess {
                    offset,
                    len: data.len()
                }
            );
            return;
        };
        match offset {
            DATA => {
                self.last_was_command = false;
                match std::mem::replace(&mut self.next_data, DataWrite::Keyboard) {
                    DataWrite::Control => self.control = byte,
                    DataWrite::OutputPort => self.output_port = byte,
                    DataWrite::Keyboard => {}
                }
            }
            COMMAND => {
                self.last_was_command = true;
                self.command(byte);
            }
            _ => debug!("i8042: {}", I8042Error::BadAccess { offset, len: 1 }),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    use super::*;

    fn controller() -> (I8042, Arc<AtomicUsize>) {
        let resets = Arc::new(AtomicUsize::new(0));
        let r = resets.clone();
        let dev = I8042::new(Box::new(move || {
            r.fetch_add(1, Ordering::SeqCst);
        }));
        (dev, resets)
    }

    fn inb(dev: &mut I8042, offset: u64) -> u8 {
        let mut b = [0xffu8];
        dev.read(offset, &mut b);
        b[0]
    }

    #[test]
    fn writing_0xfe_to_port_0x64_fires_the_reset_callback() {
        let (mut dev, resets) = controller();
        // What Linux's `reboot=k` does: wait for the input buffer, then 0xFE.
        assert_eq!(inb(&mut dev, COMMAND) & 0x02, 0);
        dev.write(COMMAND, &[CMD_RESET_CPU]);
        assert_eq!(resets.load(Ordering::SeqCst), 1);
        dev.write(COMMAND, &[CMD_RESET_CPU]);
        assert_eq!(resets.load(Ordering::SeqCst), 2);
    }

    #[test]
    fn nothing_but_0xfe_on_the_command_port_fires_the_reset_callback() {
        let (mut dev, resets) = controller();
        dev.write(DATA, &[CMD_RESET_CPU]);
        dev.write(COMMAND, &[0xfc]);
        dev.write(COMMAND, &[CMD_RESET_CPU, 0]);
        dev.write(COMMAND, &[]);
        dev.write(1, &[CMD_RESET_CPU]);
        dev.write(CMD_WRITE_OUTPUT.into(), &[0]);
        dev.write(COMMAND, &[CMD_WRITE_OUTPUT]);
        dev.write(DATA, &[0]);
        assert_eq!(resets.load(Ordering::SeqCst), 0);
    }

    #[test]
    fn the_status_port_reads_an_empty_idle_controller() {
        let (mut dev, _) = controller();
        let status = inb(&mut dev, COMMAND);
        assert_eq!(status & (STATUS_OUTPUT_FULL | 0x02), 0);
        assert_eq!(inb(&mut dev, DATA), 0);
        let mut wide = [0xffu8; 4];
        dev.read(COMMAND, &mut wide);
        assert_eq!(wide, [0; 4]);
        assert_eq!(inb(&mut dev, 2), 0);
    }

    #[test]
    fn the_control_byte_and_self_tests_answer_as_linux_polls_for_them() {
        let (mut dev, _) = controller();
        dev.write(COMMAND, &[CMD_SELF_TEST]);
        assert_ne!(inb(&mut dev, COMMAND) & STATUS_OUTPUT_FULL, 0);
        assert_eq!(inb(&mut dev, DATA), 0x55);
        assert_eq!(inb(&mut dev, COMMAND) & STATUS_OUTPUT_FULL, 0);
        dev.write(COMMAND, &[CMD_READ_CTR]);
        assert_eq!(inb(&mut dev, DATA), DEFAULT_CTR);
        dev.write(COMMAND, &[CMD_WRITE_CTR]);
        dev.write(DATA, &[0x47]);
        dev.write(COMMAND, &[CMD_READ_CTR]);
        assert_eq!(inb(&mut dev, DATA), 0x47);
        dev.write(COMMAND, &[CMD_KBD_TEST]);
        assert_eq!(inb(&mut dev, DATA), 0);
        dev.write(COMMAND, &[0xa7]);
        assert_eq!(inb(&mut dev, COMMAND) & STATUS_OUTPUT_FULL, 0);
    }
}
