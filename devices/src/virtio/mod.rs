//! Virtio: the contract between the virtio-mmio transport ([`mmio`]) and a
//! device model ([`VirtioDevice`]), and the [`Interrupt`] a device raises.
//!
//! The transport owns the registers, feature negotiation, queue set-up and
//! the device status; a device owns its queues once [`VirtioDevice::activate`]
//! hands them over. A device that meets a bad descriptor chain calls
//! [`Interrupt::needs_reset`] and stops using its queues: the driver sees
//! `DEVICE_NEEDS_RESET` and a config-change interrupt.

pub mod chain;
#[cfg(any(test, feature = "fuzzing"))]
pub mod fuzz_ring;
pub mod mmio;

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use virtio_queue::Queue;
use vm_memory::GuestMemoryMmap;

use crate::irq::IrqLine;

/// `VIRTIO_F_VERSION_1`: every device offers it (virtio-mmio v2 only).
pub const VIRTIO_F_VERSION_1: u64 = 1 << 32;
/// InterruptStatus bit: a used ring was updated.
pub const INT_USED_RING: u32 = 1;
/// InterruptStatus bit: the configuration (or the status) changed.
pub const INT_CONFIG: u32 = 2;
/// Device status bit: the device needs a reset.
pub const STATUS_NEEDS_RESET: u32 = 0x40;

/// Guest memory as devices use it.
pub type Memory = GuestMemoryMmap<()>;

/// Why a device could not start.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ActivateError {
    /// The driver set up fewer queues than the device needs, or bad ones.
    #[error("bad queues: {0}")]
    Queues(String),
    /// The device's host side failed (a file, a socket).
    #[error("device back end: {0}")]
    Backend(String),
}

/// The interrupt of one virtio-mmio device: its InterruptStatus register,
/// its device-status `NEEDS_RESET` bit, and its line.
#[derive(Clone)]
pub struct Interrupt {
    status: Arc<AtomicU32>,
    device_status: Arc<AtomicU32>,
    line: Arc<dyn IrqLine>,
}

impl std::fmt::Debug for Interrupt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Interrupt")
            .field("status", &self.status.load(Ordering::SeqCst))
            .finish()
    }
}

impl Interrupt {
    /// An interrupt over shared InterruptStatus and device-status words
    /// (the transport's) and a line.
    pub fn new(
        status: Arc<AtomicU32>,
        device_status: Arc<AtomicU32>,
        line: Arc<dyn IrqLine>,
    ) -> Self {
        Self {
            status,
            device_status,
            line,
        }
    }

    /// Tells the driver a used ring was updated.
    pub fn signal_used(&self) {
        self.status.fetch_or(INT_USED_RING, Ordering::SeqCst);
        self.line.trigger();
    }

    /// Tells the driver the configuration changed.
    pub fn signal_config(&self) {
        self.status.fetch_or(INT_CONFIG, Ordering::SeqCst);
        self.line.trigger();
    }

    /// Marks the device broken (`DEVICE_NEEDS_RESET`) and tells the driver.
    pub fn needs_reset(&self) {
        self.device_status
            .fetch_or(STATUS_NEEDS_RESET, Ordering::SeqCst);
        self.signal_config();
    }
}

/// Copies `config[offset..]` into `data`: what a device's
/// [`VirtioDevice::read_config`] returns (zeros past the end).
pub fn read_config_bytes(config: &[u8], offset: u64, data: &mut [u8]) {
    data.fill(0);
    let Some(start) = usize::try_from(offset).ok().filter(|&o| o < config.len()) else {
        return;
    };
    let n = data.len().min(config.len() - start);
    data[..n].copy_from_slice(&config[start..start + n]);
}

/// A device model behind the virtio-mmio transport.
pub trait VirtioDevice: Send {
    /// The virtio device id (vsock 19, blk 2).
    fn device_type(&self) -> u32;
    /// The maximum size of each of its queues; the length is the number of queues.
    fn queue_max_sizes(&self) -> &[u16];
    /// The features it offers (must include [`VIRTIO_F_VERSION_1`]).
    fn features(&self) -> u64;
    /// The features the driver accepted (a subset of [`Self::features`]).
    /// The transport keeps them; no device here acts differently by them,
    /// so by default nothing is done.
    fn ack_features(&mut self, features: u64) {
        let _ = features;
    }
    /// Reads its configuration space at `offset` (out of range reads zeros:
    /// [`read_config_bytes`]).
    fn read_config(&self, offset: u64, data: &mut [u8]);
    /// Writes its configuration space; by default it is read-only and the
    /// write is ignored.
    fn write_config(&mut self, offset: u64, data: &[u8]) {
        tracing::debug!(
            "virtio device {}: {}-byte config write at {offset:#x} ignored",
            self.device_type(),
            data.len()
        );
    }
    /// Starts the device with the queues the driver set up (`DRIVER_OK`).
    fn activate(
        &mut self,
        mem: Memory,
        interrupt: Interrupt,
        queues: Vec<Queue>,
    ) -> Result<(), ActivateError>;
    /// The driver notified queue `index` (`QueueNotify`).
    fn queue_notify(&mut self, index: u16);
    /// The driver reset the device (status 0): drop queues and host state.
    fn reset(&mut self);
    /// Shared-memory region `id` (virtio 1.2 §2.10): its guest-physical
    /// address and length, or `None` when the device has no such region.
    fn shm_region(&self, id: u32) -> Option<(u64, u64)> {
        let _ = id;
        None
    }
}
