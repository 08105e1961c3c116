//! The virtio-mmio transport, version 2 (modern only), as one
//! [`BusDevice`] of [`MMIO_SIZE`] bytes.
//!
//! Owns: the register block of one device (`0x000..0x100`), feature
//! negotiation, the queues' configuration until `DRIVER_OK`, the device
//! status word and the InterruptStatus word (both shared with the device
//! through [`Interrupt`]). The configuration space at [`CONFIG_OFFSET`] is
//! forwarded to the device untouched.
//!
//! Must never: panic on anything a guest writes or reads (bad widths,
//! unknown registers, out-of-order status bits, absurd queue sizes are
//! ignored with a debug log); hand a device queues that fail
//! [`QueueT::is_valid`]; read or write guest memory itself (only the queue
//! check looks at it); expose the legacy (version 1) registers.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use tracing::debug;
use virtio_bindings::virtio_config::{
    VIRTIO_CONFIG_S_ACKNOWLEDGE, VIRTIO_CONFIG_S_DRIVER, VIRTIO_CONFIG_S_DRIVER_OK,
    VIRTIO_CONFIG_S_FAILED, VIRTIO_CONFIG_S_FEATURES_OK,
};
use virtio_bindings::virtio_mmio::{
    VIRTIO_MMIO_CONFIG_GENERATION, VIRTIO_MMIO_DEVICE_FEATURES, VIRTIO_MMIO_DEVICE_FEATURES_SEL,
    VIRTIO_MMIO_DEVICE_ID, VIRTIO_MMIO_DRIVER_FEATURES, VIRTIO_MMIO_DRIVER_FEATURES_SEL,
    VIRTIO_MMIO_INTERRUPT_ACK, VIRTIO_MMIO_INTERRUPT_STATUS, VIRTIO_MMIO_MAGIC_VALUE,
    VIRTIO_MMIO_QUEUE_AVAIL_HIGH, VIRTIO_MMIO_QUEUE_AVAIL_LOW, VIRTIO_MMIO_QUEUE_DESC_HIGH,
    VIRTIO_MMIO_QUEUE_DESC_LOW, VIRTIO_MMIO_QUEUE_NOTIFY, VIRTIO_MMIO_QUEUE_NUM,
    VIRTIO_MMIO_QUEUE_NUM_MAX, VIRTIO_MMIO_QUEUE_READY, VIRTIO_MMIO_QUEUE_SEL,
    VIRTIO_MMIO_QUEUE_USED_HIGH, VIRTIO_MMIO_QUEUE_USED_LOW, VIRTIO_MMIO_SHM_BASE_HIGH,
    VIRTIO_MMIO_SHM_BASE_LOW, VIRTIO_MMIO_SHM_LEN_HIGH, VIRTIO_MMIO_SHM_LEN_LOW,
    VIRTIO_MMIO_SHM_SEL, VIRTIO_MMIO_STATUS, VIRTIO_MMIO_VENDOR_ID, VIRTIO_MMIO_VERSION,
};
use virtio_bindings::virtio_ring::VIRTIO_RING_F_EVENT_IDX;
use virtio_queue::{Queue, QueueT};

use super::{
    ActivateError, Interrupt, Memory, VirtioDevice, STATUS_NEEDS_RESET, VIRTIO_F_VERSION_1,
};
use crate::bus::BusDevice;
use crate::irq::IrqLine;

/// The size of one virtio-mmio device's window on the bus.
pub const MMIO_SIZE: u64 = 0x1000;
/// Where the device's configuration space starts in the window.
pub const CONFIG_OFFSET: u64 = 0x100;
/// Offset of the `QueueNotify` register: the driver writes a queue's index
/// there (where a hypervisor can turn that write into an eventfd signal).
pub const QUEUE_NOTIFY_OFFSET: u64 = VIRTIO_MMIO_QUEUE_NOTIFY as u64;
/// The MagicValue register: "virt" in little endian.
pub const MAGIC_VALUE: u32 = 0x7472_6976;
/// The Version register: 2, the modern (virtio 1.x) transport.
pub const MMIO_VERSION: u32 = 2;
/// The VendorID register.
pub const VENDOR_ID: u32 = 0;

/// The status bits a driver may set.
const DRIVER_STATUS_BITS: u32 = VIRTIO_CONFIG_S_ACKNOWLEDGE
    | VIRTIO_CONFIG_S_DRIVER
    | VIRTIO_CONFIG_S_FEATURES_OK
    | VIRTIO_CONFIG_S_DRIVER_OK
    | VIRTIO_CONFIG_S_FAILED;

/// Why the transport refused a driver's step. Logged; the guest sees the
/// spec's answer (a status bit not set, `NEEDS_RESET`), never an error.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MmioError {
    /// A status write cleared bits, set unknown ones or skipped a step.
    #[error("status {from:#x} -> {to:#x} is not a valid transition")]
    StatusTransition {
        /// The status before.
        from: u32,
        /// The status written.
        to: u32,
    },
    /// The driver accepted features the device does not offer.
    #[error("driver features {driver:#x} are not a subset of the offered {offered:#x}")]
    FeaturesNotOffered {
        /// What the driver wrote.
        driver: u64,
        /// What the device offers.
        offered: u64,
    },
    /// The driver did not accept `VIRTIO_F_VERSION_1` (legacy drivers are refused).
    #[error("the driver did not accept VIRTIO_F_VERSION_1")]
    NoVersion1,
    /// A queue was not ready or lies outside guest memory at `DRIVER_OK`.
    #[error("queue {0} is not ready or not inside guest memory")]
    InvalidQueue(usize),
    /// The device refused to start.
    #[error("activation failed: {0}")]
    Activate(ActivateError),
    /// An access of the wrong width or alignment, or to an unknown register.
    #[error("ignored {len}-byte {op} at {offset:#x}")]
    BadAccess {
        /// `read` or `write`.
        op: &'static str,
        /// The offset in the window.
        offset: u64,
        /// The width of the access.
        len: usize,
    },
}

/// By hand, not `#[from]`: the cause is in the message, so it is not a
/// `source()` too (a `{e:#}` chain prints it once).
impl From<ActivateError> for MmioError {
    fn from(e: ActivateError) -> Self {
        MmioError::Activate(e)
    }
}

/// One virtio-mmio (v2) device: the registers in front of a [`VirtioDevice`].
pub struct MmioTransport {
    device: Box<dyn VirtioDevice>,
    mem: Memory,
    irq: Arc<dyn IrqLine>,
    /// InterruptStatus; replaced by a fresh word on reset so that a device's
    /// stale [`Interrupt`] cannot touch the next generation.
    interrupt_status: Arc<AtomicU32>,
    /// The device status word (driver bits plus the device's `NEEDS_RESET`).
    device_status: Arc<AtomicU32>,
    /// The queues as the driver configures them (`None`: a size the device
    /// got wrong); copies (by state) go to the device at `DRIVER_OK`.
    queues: Vec<Option<Queue>>,
    queue_sel: u32,
    /// The shared-memory region the SHM registers show.
    shm_sel: u32,
    device_features_sel: u32,
    driver_features_sel: u32,
    driver_features: u64,
    activated: bool,
}

impl std::fmt::Debug for MmioTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MmioTransport")
            .field("device_type", &self.device.device_type())
            .field("status", &self.device_status.load(Ordering::SeqCst))
            .field(
                "interrupt_status",
                &self.interrupt_status.load(Ordering::SeqCst),
            )
            .field("activated", &self.activated)
            .finish()
    }
}

impl MmioTransport {
    /// The transport for `device` over guest memory `mem`, raising `irq`.
    ///
    /// A queue whose maximum size is not a power of two in `1..=32768` (a
    /// device bug) reads QueueNumMax 0, so the driver cannot set it up and
    /// the device never starts.
    pub fn new(device: Box<dyn VirtioDevice>, mem: Memory, irq: Arc<dyn IrqLine>) -> Self {
        let queues = device
            .queue_max_sizes()
            .iter()
            .map(|&max| {
                Queue::new(max)
                    .inspect_err(|e| {
                        debug!("virtio-mmio: device queue max size {max} refused: {e}")
                    })
                    .ok()
            })
            .collect();
        Self {
            device,
            mem,
            irq,
            interrupt_status: Arc::new(AtomicU32::new(0)),
            device_status: Arc::new(AtomicU32::new(0)),
            queues,
            queue_sel: 0,
            shm_sel: 0,
            device_features_sel: 0,
            driver_features_sel: 0,
            driver_features: 0,
            activated: false,
        }
    }

    /// The device status word as the driver reads it.
    pub fn device_status(&self) -> u32 {
        self.device_status.load(Ordering::SeqCst)
    }

    /// The InterruptStatus word as the driver reads it.
    pub fn interrupt_status(&self) -> u32 {
        self.interrupt_status.load(Ordering::SeqCst)
    }

    /// How many queues the device has (`QueueNotify` values `0..count`).
    pub fn queue_count(&self) -> usize {
        self.queues.len()
    }

    /// Whether the device was started (`DRIVER_OK` accepted) and not reset since.
    pub fn is_activated(&self) -> bool {
        self.activated
    }

    fn selected_queue(&self) -> Option<&Queue> {
        self.queues
            .get(usize::try_from(self.queue_sel).ok()?)?
            .as_ref()
    }

    /// The selected queue, while the driver may still configure it.
    fn configurable_queue(&mut self) -> Option<&mut Queue> {
        if self.device_status() & VIRTIO_CONFIG_S_DRIVER_OK != 0 {
            debug!("virtio-mmio: queue configuration after DRIVER_OK ignored");
            return None;
        }
        let sel = usize::try_from(self.queue_sel).ok()?;
        self.queues.get_mut(sel)?.as_mut()
    }

    fn read_register(&self, reg: u32) -> Option<u32> {
        let value = match reg {
            VIRTIO_MMIO_MAGIC_VALUE => MAGIC_VALUE,
            VIRTIO_MMIO_VERSION => MMIO_VERSION,
            VIRTIO_MMIO_DEVICE_ID => self.device.device_type(),
            VIRTIO_MMIO_VENDOR_ID => VENDOR_ID,
            VIRTIO_MMIO_DEVICE_FEATURES => {
                let features = self.device.features();
                match self.device_features_sel {
                    0 => features as u32,
                    1 => (features >> 32) as u32,
                    _ => 0,
                }
            }
            VIRTIO_MMIO_QUEUE_NUM_MAX => {
                self.selected_queue().map_or(0, |q| u32::from(q.max_size()))
            }
            VIRTIO_MMIO_QUEUE_READY => self.selected_queue().map_or(0, |q| u32::from(q.ready())),
            VIRTIO_MMIO_INTERRUPT_STATUS => self.interrupt_status(),
            VIRTIO_MMIO_STATUS => self.device_status(),
            VIRTIO_MMIO_CONFIG_GENERATION => 0,
            // The selected shared-memory region; a missing one has a
            // length (and base) of all ones.
            VIRTIO_MMIO_SHM_LEN_LOW
            | VIRTIO_MMIO_SHM_LEN_HIGH
            | VIRTIO_MMIO_SHM_BASE_LOW
            | VIRTIO_MMIO_SHM_BASE_HIGH => {
                let (base, len) = self
                    .device
                    .shm_region(self.shm_sel)
                    .unwrap_or((u64::MAX, u64::MAX));
                match reg {
                    VIRTIO_MMIO_SHM_LEN_LOW => len as u32,
                    VIRTIO_MMIO_SHM_LEN_HIGH => (len >> 32) as u32,
                    VIRTIO_MMIO_SHM_BASE_LOW => base as u32,
                    _ => (base >> 32) as u32,
                }
            }
            _ => return None,
        };
        Some(value)
    }

    fn write_register(&mut self, reg: u32, value: u32) -> bool {
        match reg {
            VIRTIO_MMIO_DEVICE_FEATURES_SEL => self.device_features_sel = value,
            VIRTIO_MMIO_DRIVER_FEATURES => self.write_driver_features(value),
            VIRTIO_MMIO_DRIVER_FEATURES_SEL => self.driver_features_sel = value,
            VIRTIO_MMIO_QUEUE_SEL => self.queue_sel = value,
            VIRTIO_MMIO_SHM_SEL => self.shm_sel = value,
            VIRTIO_MMIO_QUEUE_NUM => match u16::try_from(value) {
                // `set_size` refuses (and logs) sizes that are not a power of
                // two no larger than the maximum.
                Ok(size) => self
                    .configurable_queue()
                    .into_iter()
                    .for_each(|q| q.set_size(size)),
                Err(_) => debug!("virtio-mmio: queue size {value} ignored"),
            },
            VIRTIO_MMIO_QUEUE_READY => self
                .configurable_queue()
                .into_iter()
                .for_each(|q| q.set_ready(value == 1)),
            VIRTIO_MMIO_QUEUE_DESC_LOW => self
                .configurable_queue()
                .into_iter()
                .for_each(|q| q.set_desc_table_address(Some(value), None)),
            VIRTIO_MMIO_QUEUE_DESC_HIGH => self
                .configurable_queue()
                .into_iter()
                .for_each(|q| q.set_desc_table_address(None, Some(value))),
            VIRTIO_MMIO_QUEUE_AVAIL_LOW => self
                .configurable_queue()
                .into_iter()
                .for_each(|q| q.set_avail_ring_address(Some(value), None)),
            VIRTIO_MMIO_QUEUE_AVAIL_HIGH => self
                .configurable_queue()
                .into_iter()
                .for_each(|q| q.set_avail_ring_address(None, Some(value))),
            VIRTIO_MMIO_QUEUE_USED_LOW => self
                .configurable_queue()
                .into_iter()
                .for_each(|q| q.set_used_ring_address(Some(value), None)),
            VIRTIO_MMIO_QUEUE_USED_HIGH => self
                .configurable_queue()
                .into_iter()
                .for_each(|q| q.set_used_ring_address(None, Some(value))),
            VIRTIO_MMIO_QUEUE_NOTIFY => self.notify(value),
            VIRTIO_MMIO_INTERRUPT_ACK => {
                self.interrupt_status.fetch_and(!value, Ordering::SeqCst);
            }
            VIRTIO_MMIO_STATUS => self.write_status(value),
            _ => return false,
        }
        true
    }

    fn write_driver_features(&mut self, value: u32) {
        let status = self.device_status();
        if status & VIRTIO_CONFIG_S_DRIVER == 0 || status & VIRTIO_CONFIG_S_FEATURES_OK != 0 {
            debug!("virtio-mmio: driver features written in status {status:#x} ignored");
            return;
        }
        let value = u64::from(value);
        match self.driver_features_sel {
            0 => self.driver_features = (self.driver_features & !0xffff_ffff) | value,
            1 => self.driver_features = (self.driver_features & 0xffff_ffff) | (value << 32),
            sel => debug!("virtio-mmio: driver features word {sel} ignored"),
        }
    }

    /// The driver notified queue `value` (a `QueueNotify` write, or the
    /// eventfd the hypervisor signals for one): the device is told if it
    /// runs and the queue exists; anything else is ignored.
    pub fn notify(&mut self, value: u32) {
        if !self.activated {
            debug!("virtio-mmio: notify before DRIVER_OK ignored");
            return;
        }
        match u16::try_from(value) {
            Ok(index) if usize::from(index) < self.queues.len() => self.device.queue_notify(index),
            _ => debug!("virtio-mmio: notify of unknown queue {value} ignored"),
        }
    }

    /// The driver's status write, per the virtio 1.x initialisation sequence.
    fn write_status(&mut self, value: u32) {
        if value == 0 {
            self.reset();
            return;
        }
        // NEEDS_RESET belongs to the device: the driver echoing it is no change.
        let old = self.device_status() & !STATUS_NEEDS_RESET;
        let mut new = value & !STATUS_NEEDS_RESET;
        if let Err(e) = check_transition(old, new) {
            debug!("virtio-mmio: {e}");
            return;
        }
        let added = new & !old;
        if added & VIRTIO_CONFIG_S_FEATURES_OK != 0 {
            match self.check_features() {
                Ok(()) => self.device.ack_features(self.driver_features),
                Err(e) => {
                    debug!("virtio-mmio: FEATURES_OK refused: {e}");
                    new &= !(VIRTIO_CONFIG_S_FEATURES_OK | VIRTIO_CONFIG_S_DRIVER_OK);
                }
            }
        }
        // Keep a NEEDS_RESET the device may be setting concurrently.
        let _ = self
            .device_status
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |cur| {
                Some(new | (cur & STATUS_NEEDS_RESET))
            });
        if added & new & VIRTIO_CONFIG_S_DRIVER_OK != 0 {
            if let Err(e) = self.activate() {
                debug!("virtio-mmio: DRIVER_OK failed: {e}");
                self.interrupt().needs_reset();
            }
        }
    }

    fn check_features(&self) -> Result<(), MmioError> {
        let offered = self.device.features();
        if self.driver_features & !offered != 0 {
            return Err(MmioError::FeaturesNotOffered {
                driver: self.driver_features,
                offered,
            });
        }
        if self.driver_features & VIRTIO_F_VERSION_1 == 0 {
            return Err(MmioError::NoVersion1);
        }
        Ok(())
    }

    fn interrupt(&self) -> Interrupt {
        Interrupt::new(
            Arc::clone(&self.interrupt_status),
            Arc::clone(&self.device_status),
            Arc::clone(&self.irq),
        )
    }

    fn activate(&mut self) -> Result<(), MmioError> {
        let event_idx = self.driver_features & (1 << VIRTIO_RING_F_EVENT_IDX) != 0;
        let mut queues = Vec::with_capacity(self.queues.len());
        for (i, q) in self.queues.iter().enumerate() {
            let q = q
                .as_ref()
                .filter(|q| q.is_valid(&self.mem))
                .ok_or(MmioError::InvalidQueue(i))?;
            let mut copy = Queue::try_from(q.state()).map_err(|_| MmioError::InvalidQueue(i))?;
            copy.set_event_idx(event_idx);
            queues.push(copy);
        }
        self.device
            .activate(self.mem.clone(), self.interrupt(), queues)?;
        self.activated = true;
        Ok(())
    }

    /// Status 0: the device, its queues and both status words start over.
    /// Stops the device for good once its VM has ended: as at a driver
    /// reset, its threads stop and its host side closes (a vsock muxer's
    /// connections, so their clients see the end at once).
    pub fn stop(&mut self) {
        self.reset();
    }

    fn reset(&mut self) {
        self.device.reset();
        self.queues.iter_mut().flatten().for_each(QueueT::reset);
        self.interrupt_status = Arc::new(AtomicU32::new(0));
        self.device_status = Arc::new(AtomicU32::new(0));
        self.queue_sel = 0;
        self.shm_sel = 0;
        self.device_features_sel = 0;
        self.driver_features_sel = 0;
        self.driver_features = 0;
        self.activated = false;
    }
}

/// Whether a driver may move the status from `old` to `new` (both without
/// `NEEDS_RESET`): bits are only added, each after its predecessor.
fn check_transition(old: u32, new: u32) -> Result<(), MmioError> {
    let refused = Err(MmioError::StatusTransition { from: old, to: new });
    let needs = |bit: u32, before: u32| new & bit == 0 || new & before != 0;
    if new & !DRIVER_STATUS_BITS != 0 || old & !new != 0 {
        return refused;
    }
    if !needs(VIRTIO_CONFIG_S_DRIVER, VIRTIO_CONFIG_S_ACKNOWLEDGE)
        || !needs(VIRTIO_CONFIG_S_FEATURES_OK, VIRTIO_CONFIG_S_DRIVER)
        || !needs(VIRTIO_CONFIG_S_DRIVER_OK, VIRTIO_CONFIG_S_FEATURES_OK)
    {
        return refused;
    }
    Ok(())
}

impl BusDevice for MmioTransport {
    fn read(&mut self, offset: u64, data: &mut [u8]) {
        data.fill(0);
        if offset >= CONFIG_OFFSET {
            self.device.read_config(offset - CONFIG_OFFSET, data);
            return;
        }
        let value = if data.len() == 4 && offset % 4 == 0 {
            // offset < CONFIG_OFFSET, so it fits.
            self.read_register(offset as u32)
        } else {
            None
        };
        match value {
            Some(v) => data.copy_from_slice(&v.to_le_bytes()),
            None => debug!(
                "virtio-mmio: {}",
                MmioError::BadAccess {
                    op: "read",
                    offset,
                    len: data.len()
                }
            ),
        }
    }

    fn write(&mut self, offset: u64, data: &[u8]) {
        if offset >= CONFIG_OFFSET {
            self.device.write_config(offset - CONFIG_OFFSET, data);
            return;
        }
        let handled = match <[u8; 4]>::try_from(data) {
            Ok(bytes) if offset % 4 == 0 => {
                self.write_register(offset as u32, u32::from_le_bytes(bytes))
            }
            _ => false,
        };
        if !handled {
            debug!(
                "virtio-mmio: {}",
                MmioError::BadAccess {
                    op: "write",
                    offset,
                    len: data.len()
                }
            );
        }
    }
}

/// A driver-side helper for tests: drives an [`MmioTransport`] through its
/// registers in the order Linux's `virtio_mmio` does.
#[cfg(test)]
pub(crate) mod test_driver {
    use std::sync::Arc;

    use virtio_queue::mock::MockSplitQueue;
    use vm_memory::GuestAddress;

    use super::*;
    use crate::irq::CountingIrq;

    /// Guest memory for tests: `mib` MiB at 0.
    pub(crate) fn memory(mib: usize) -> Memory {
        Memory::from_ranges(&[(GuestAddress(0), mib << 20)]).expect("test memory")
    }

    /// A well-linked chain of `(addr, len, device_writable)` starting at
    /// descriptor `base` of a ring of `size` (the last `next` wraps).
    pub(crate) fn chain(
        parts: &[(u64, u32, bool)],
        base: u16,
        size: u16,
    ) -> Vec<virtio_queue::desc::split::Descriptor> {
        use virtio_bindings::bindings::virtio_ring::{VRING_DESC_F_NEXT, VRING_DESC_F_WRITE};
        parts
            .iter()
            .enumerate()
            .map(|(i, &(addr, len, w))| {
                let mut flags = if w { VRING_DESC_F_WRITE as u16 } else { 0 };
                if i + 1 < parts.len() {
                    flags |= VRING_DESC_F_NEXT as u16;
                }
                let next = (u32::from(base) + i as u32 + 1) % u32::from(size);
                virtio_queue::desc::split::Descriptor::new(addr, len, flags, next as u16)
            })
            .collect()
    }

    /// The guest's side of one transport.
    pub(crate) struct Driver {
        pub(crate) transport: MmioTransport,
        pub(crate) irq: Arc<CountingIrq>,
    }

    impl Driver {
        pub(crate) fn new(device: Box<dyn VirtioDevice>, mem: Memory) -> Self {
            let irq = Arc::new(CountingIrq::default());
            let transport = MmioTransport::new(device, mem, irq.clone());
            Self { transport, irq }
        }

        pub(crate) fn read(&mut self, reg: u32) -> u32 {
            let mut b = [0u8; 4];
            self.transport.read(u64::from(reg), &mut b);
            u32::from_le_bytes(b)
        }

        pub(crate) fn write(&mut self, reg: u32, value: u32) {
            self.transport.write(u64::from(reg), &value.to_le_bytes());
        }

        /// `virtio_add_status`: read, OR, write.
        pub(crate) fn add_status(&mut self, bit: u32) {
            let s = self.read(VIRTIO_MMIO_STATUS);
            self.write(VIRTIO_MMIO_STATUS, s | bit);
        }

        pub(crate) fn device_features(&mut self) -> u64 {
            self.write(VIRTIO_MMIO_DEVICE_FEATURES_SEL, 1);
            let high = u64::from(self.read(VIRTIO_MMIO_DEVICE_FEATURES));
            self.write(VIRTIO_MMIO_DEVICE_FEATURES_SEL, 0);
            (high << 32) | u64::from(self.read(VIRTIO_MMIO_DEVICE_FEATURES))
        }

        /// Reset, ACKNOWLEDGE, DRIVER, write `features`, FEATURES_OK; true
        /// when the device kept FEATURES_OK.
        pub(crate) fn negotiate(&mut self, features: u64) -> bool {
            self.write(VIRTIO_MMIO_STATUS, 0);
            self.add_status(VIRTIO_CONFIG_S_ACKNOWLEDGE);
            self.add_status(VIRTIO_CONFIG_S_DRIVER);
            self.write(VIRTIO_MMIO_DRIVER_FEATURES_SEL, 1);
            self.write(VIRTIO_MMIO_DRIVER_FEATURES, (features >> 32) as u32);
            self.write(VIRTIO_MMIO_DRIVER_FEATURES_SEL, 0);
            self.write(VIRTIO_MMIO_DRIVER_FEATURES, features as u32);
            self.add_status(VIRTIO_CONFIG_S_FEATURES_OK);
            self.read(VIRTIO_MMIO_STATUS) & VIRTIO_CONFIG_S_FEATURES_OK != 0
        }

        /// `vm_setup_vq` for queue `index` with the rings of `vq`, `size` entries.
        pub(crate) fn setup_queue(
            &mut self,
            index: u32,
            vq: &MockSplitQueue<'_, Memory>,
            size: u32,
        ) {
            self.write(VIRTIO_MMIO_QUEUE_SEL, index);
            assert_eq!(self.read(VIRTIO_MMIO_QUEUE_READY), 0);
            assert!(self.read(VIRTIO_MMIO_QUEUE_NUM_MAX) >= size);
            self.write(VIRTIO_MMIO_QUEUE_NUM, size);
            let split = |a: GuestAddress| (a.0 as u32, (a.0 >> 32) as u32);
            let (lo, hi) = split(vq.desc_table_addr());
            self.write(VIRTIO_MMIO_QUEUE_DESC_LOW, lo);
            self.write(VIRTIO_MMIO_QUEUE_DESC_HIGH, hi);
            let (lo, hi) = split(vq.avail_addr());
            self.write(VIRTIO_MMIO_QUEUE_AVAIL_LOW, lo);
            self.write(VIRTIO_MMIO_QUEUE_AVAIL_HIGH, hi);
            let (lo, hi) = split(vq.used_addr());
            self.write(VIRTIO_MMIO_QUEUE_USED_LOW, lo);
            self.write(VIRTIO_MMIO_QUEUE_USED_HIGH, hi);
            self.write(VIRTIO_MMIO_QUEUE_READY, 1);
        }

        pub(crate) fn driver_ok(&mut self) {
            self.add_status(VIRTIO_CONFIG_S_DRIVER_OK);
        }

        pub(crate) fn notify(&mut self, index: u32) {
            self.write(VIRTIO_MMIO_QUEUE_NOTIFY, index);
        }

        pub(crate) fn status(&mut self) -> u32 {
            self.read(VIRTIO_MMIO_STATUS)
        }

        /// `vm_interrupt`: read InterruptStatus, write it to InterruptACK.
        pub(crate) fn ack_interrupt(&mut self) -> u32 {
            let s = self.read(VIRTIO_MMIO_INTERRUPT_STATUS);
            self.write(VIRTIO_MMIO_INTERRUPT_ACK, s);
            s
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use virtio_queue::mock::MockSplitQueue;
    use vm_memory::GuestAddress;

    use super::test_driver::{memory, Driver};
    use super::*;
    use crate::virtio::{INT_CONFIG, INT_USED_RING};

    const FAKE_FEATURE: u64 = 1 << 3;

    #[derive(Default)]
    struct Seen {
        acked: Option<u64>,
        activations: usize,
        queues: Vec<(u16, bool)>,
        notified: Vec<u16>,
        resets: usize,
        config: Vec<u8>,
        interrupt: Option<Interrupt>,
    }

    struct FakeDevice {
        seen: Arc<Mutex<Seen>>,
        sizes: Vec<u16>,
        fail_activate: bool,
    }

    impl FakeDevice {
        fn boxed(sizes: &[u16]) -> (Box<dyn VirtioDevice>, Arc<Mutex<Seen>>) {
            let seen = Arc::new(Mutex::new(Seen {
                config: (0u8..16).collect(),
                ..Seen::default()
            }));
            let dev = FakeDevice {
                seen: seen.clone(),
                sizes: sizes.to_vec(),
                fail_activate: false,
            };
            (Box::new(dev), seen)
        }
    }

    impl VirtioDevice for FakeDevice {
        fn device_type(&self) -> u32 {
            42
        }
        fn queue_max_sizes(&self) -> &[u16] {
            &self.sizes
        }
        fn features(&self) -> u64 {
            VIRTIO_F_VERSION_1 | FAKE_FEATURE
        }
        fn ack_features(&mut self, features: u64) {
            self.seen.lock().unwrap().acked = Some(features);
        }
        fn read_config(&self, offset: u64, data: &mut [u8]) {
            let seen = self.seen.lock().unwrap();
            for (i, b) in data.iter_mut().enumerate() {
                *b = seen.config.get(offset as usize + i).copied().unwrap_or(0);
            }
        }
        fn write_config(&mut self, offset: u64, data: &[u8]) {
            let mut seen = self.seen.lock().unwrap();
            for (i, b) in data.iter().enumerate() {
                if let Some(slot) = seen.config.get_mut(offset as usize + i) {
                    *slot = *b;
                }
            }
        }
        fn activate(
            &mut self,
            _mem: Memory,
            interrupt: Interrupt,
            queues: Vec<Queue>,
        ) -> Result<(), ActivateError> {
            if self.fail_activate {
                return Err(ActivateError::Backend("no".into()));
            }
            let mut seen = self.seen.lock().unwrap();
            seen.activations += 1;
            seen.queues = queues.iter().map(|q| (q.size(), q.ready())).collect();
            seen.interrupt = Some(interrupt);
            Ok(())
        }
        fn queue_notify(&mut self, index: u16) {
            self.seen.lock().unwrap().notified.push(index);
        }
        fn reset(&mut self) {
            let mut seen = self.seen.lock().unwrap();
            seen.resets += 1;
            seen.interrupt = None;
        }
    }

    /// A transport for a fake device with two queues of 16, brought up to
    /// (but not including) DRIVER_OK, and the memory its rings live in.
    fn negotiated(mem: &Memory) -> (Driver, Arc<Mutex<Seen>>) {
        let (dev, seen) = FakeDevice::boxed(&[16, 16]);
        let mut drv = Driver::new(dev, mem.clone());
        assert!(drv.negotiate(VIRTIO_F_VERSION_1 | FAKE_FEATURE));
        (drv, seen)
    }

    #[test]
    fn the_identity_registers_read_magic_version_2_the_device_id_and_the_vendor() {
        let (dev, _) = FakeDevice::boxed(&[16]);
        let mut drv = Driver::new(dev, memory(1));
        assert_eq!(drv.read(VIRTIO_MMIO_MAGIC_VALUE), 0x7472_6976);
        assert_eq!(drv.read(VIRTIO_MMIO_VERSION), 2);
        assert_eq!(drv.read(VIRTIO_MMIO_DEVICE_ID), 42);
        assert_eq!(drv.read(VIRTIO_MMIO_VENDOR_ID), VENDOR_ID);
        assert_eq!(drv.read(VIRTIO_MMIO_CONFIG_GENERATION), 0);
        assert_eq!(drv.device_features(), VIRTIO_F_VERSION_1 | FAKE_FEATURE);
        drv.write(VIRTIO_MMIO_DEVICE_FEATURES_SEL, 7);
        assert_eq!(drv.read(VIRTIO_MMIO_DEVICE_FEATURES), 0);
    }

    #[test]
    fn a_linux_style_bring_up_hands_the_device_its_valid_queues_and_forwards_notifies() {
        let mem = memory(1);
        let vq0 = MockSplitQueue::create(&mem, GuestAddress(0x1_0000), 16);
        let vq1 = MockSplitQueue::create(&mem, GuestAddress(0x2_0000), 16);
        let (mut drv, seen) = negotiated(&mem);
        assert_eq!(
            seen.lock().unwrap().acked,
            Some(VIRTIO_F_VERSION_1 | FAKE_FEATURE)
        );
        drv.notify(0);
        assert!(
            seen.lock().unwrap().notified.is_empty(),
            "notify before DRIVER_OK reaches nobody"
        );
        drv.setup_queue(0, &vq0, 8);
        drv.setup_queue(1, &vq1, 16);
        drv.driver_ok();
        assert!(drv.transport.is_activated());
        assert_eq!(drv.status() & STATUS_NEEDS_RESET, 0);
        assert_eq!(drv.status(), 0xf);
        drv.notify(1);
        drv.notify(2);
        drv.notify(0x1_0000);
        let s = seen.lock().unwrap();
        assert_eq!(s.activations, 1);
        assert_eq!(s.queues, vec![(8, true), (16, true)]);
        assert_eq!(s.notified, vec![1]);
    }

    #[test]
    fn features_ok_is_refused_when_the_driver_sets_a_feature_not_offered() {
        let (dev, seen) = FakeDevice::boxed(&[16]);
        let mut drv = Driver::new(dev, memory(1));
        assert!(!drv.negotiate(VIRTIO_F_VERSION_1 | 1 << 5));
        assert_eq!(
            drv.status(),
            VIRTIO_CONFIG_S_ACKNOWLEDGE | VIRTIO_CONFIG_S_DRIVER
        );
        assert_eq!(seen.lock().unwrap().acked, None);
    }

    #[test]
    fn features_ok_is_refused_to_a_legacy_driver_without_version_1() {
        let (dev, _) = FakeDevice::boxed(&[16]);
        let mut drv = Driver::new(dev, memory(1));
        assert!(!drv.negotiate(FAKE_FEATURE));
        assert!(drv.negotiate(VIRTIO_F_VERSION_1));
    }

    #[test]
    fn driver_features_are_frozen_once_features_ok_is_set() {
        let mem = memory(1);
        let (mut drv, seen) = negotiated(&mem);
        drv.write(VIRTIO_MMIO_DRIVER_FEATURES_SEL, 0);
        drv.write(VIRTIO_MMIO_DRIVER_FEATURES, 0);
        assert_eq!(
            seen.lock().unwrap().acked,
            Some(VIRTIO_F_VERSION_1 | FAKE_FEATURE)
        );
        assert_eq!(
            drv.status() & VIRTIO_CONFIG_S_FEATURES_OK,
            VIRTIO_CONFIG_S_FEATURES_OK
        );
    }

    #[test]
    fn status_bits_out_of_order_or_taken_back_are_refused() {
        let (dev, _) = FakeDevice::boxed(&[16]);
        let mut drv = Driver::new(dev, memory(1));
        drv.write(VIRTIO_MMIO_STATUS, VIRTIO_CONFIG_S_DRIVER);
        assert_eq!(drv.status(), 0);
        drv.write(
            VIRTIO_MMIO_STATUS,
            VIRTIO_CONFIG_S_ACKNOWLEDGE | VIRTIO_CONFIG_S_DRIVER_OK,
        );
        assert_eq!(drv.status(), 0);
        drv.add_status(VIRTIO_CONFIG_S_ACKNOWLEDGE);
        drv.add_status(VIRTIO_CONFIG_S_DRIVER);
        drv.write(VIRTIO_MMIO_STATUS, VIRTIO_CONFIG_S_ACKNOWLEDGE);
        assert_eq!(
            drv.status(),
            VIRTIO_CONFIG_S_ACKNOWLEDGE | VIRTIO_CONFIG_S_DRIVER
        );
        drv.write(VIRTIO_MMIO_STATUS, 0x3 | 0x10);
        assert_eq!(drv.status(), 0x3);
        drv.add_status(VIRTIO_CONFIG_S_FAILED);
        assert_eq!(drv.status(), 0x83);
    }

    #[test]
    fn driver_ok_with_a_queue_outside_guest_memory_sets_needs_reset_and_starts_nothing() {
        let mem = memory(1);
        let vq0 = MockSplitQueue::create(&mem, GuestAddress(0x1_0000), 16);
        let (mut drv, seen) = negotiated(&mem);
        drv.setup_queue(0, &vq0, 16);
        drv.write(VIRTIO_MMIO_QUEUE_SEL, 1);
        drv.write(VIRTIO_MMIO_QUEUE_DESC_LOW, 0);
        drv.write(VIRTIO_MMIO_QUEUE_DESC_HIGH, 0x10);
        drv.write(VIRTIO_MMIO_QUEUE_READY, 1);
        drv.driver_ok();
        assert!(!drv.transport.is_activated());
        assert_ne!(drv.status() & STATUS_NEEDS_RESET, 0);
        assert_eq!(drv.ack_interrupt(), INT_CONFIG);
        assert_eq!(drv.irq.count(), 1);
        assert_eq!(seen.lock().unwrap().activations, 0);
    }

    #[test]
    fn driver_ok_with_a_queue_never_made_ready_sets_needs_reset() {
        let mem = memory(1);
        let vq0 = MockSplitQueue::create(&mem, GuestAddress(0x1_0000), 16);
        let (mut drv, seen) = negotiated(&mem);
        drv.setup_queue(0, &vq0, 16);
        drv.driver_ok();
        assert_ne!(drv.status() & STATUS_NEEDS_RESET, 0);
        assert_eq!(seen.lock().unwrap().activations, 0);
    }

    #[test]
    fn a_device_that_fails_to_activate_leaves_needs_reset_set() {
        let mem = memory(1);
        let vq = MockSplitQueue::create(&mem, GuestAddress(0x1_0000), 16);
        let seen = Arc::new(Mutex::new(Seen::default()));
        let dev = FakeDevice {
            seen: seen.clone(),
            sizes: vec![16],
            fail_activate: true,
        };
        let mut drv = Driver::new(Box::new(dev), mem.clone());
        assert!(drv.negotiate(VIRTIO_F_VERSION_1));
        drv.setup_queue(0, &vq, 16);
        drv.driver_ok();
        assert!(!drv.transport.is_activated());
        assert_ne!(drv.status() & STATUS_NEEDS_RESET, 0);
        drv.notify(0);
        assert!(seen.lock().unwrap().notified.is_empty());
    }

    #[test]
    fn writing_zero_to_status_resets_the_device_its_queues_and_the_interrupt_status() {
        let mem = memory(1);
        let vq0 = MockSplitQueue::create(&mem, GuestAddress(0x1_0000), 16);
        let vq1 = MockSplitQueue::create(&mem, GuestAddress(0x2_0000), 16);
        let (mut drv, seen) = negotiated(&mem);
        drv.setup_queue(0, &vq0, 8);
        drv.setup_queue(1, &vq1, 16);
        drv.driver_ok();
        let stale = seen.lock().unwrap().interrupt.clone().unwrap();
        stale.signal_used();
        assert_eq!(drv.read(VIRTIO_MMIO_INTERRUPT_STATUS), INT_USED_RING);
        let resets_before = seen.lock().unwrap().resets;

        drv.write(VIRTIO_MMIO_STATUS, 0);
        assert_eq!(seen.lock().unwrap().resets, resets_before + 1);
        assert_eq!(drv.status(), 0);
        assert_eq!(drv.read(VIRTIO_MMIO_INTERRUPT_STATUS), 0);
        assert!(!drv.transport.is_activated());
        for q in 0..2 {
            drv.write(VIRTIO_MMIO_QUEUE_SEL, q);
            assert_eq!(drv.read(VIRTIO_MMIO_QUEUE_READY), 0);
        }
        // The old generation's interrupt no longer reaches the registers.
        stale.needs_reset();
        assert_eq!(drv.status(), 0);
        assert_eq!(drv.read(VIRTIO_MMIO_INTERRUPT_STATUS), 0);
        drv.notify(0);
        assert!(seen.lock().unwrap().notified.is_empty());
    }

    #[test]
    fn accesses_of_the_wrong_width_or_alignment_are_ignored_and_read_as_zero() {
        let mem = memory(1);
        let (mut drv, seen) = negotiated(&mem);
        let mut b = [0xaau8; 2];
        drv.transport
            .read(u64::from(VIRTIO_MMIO_MAGIC_VALUE), &mut b);
        assert_eq!(b, [0, 0]);
        let mut b = [0xaau8; 8];
        drv.transport
            .read(u64::from(VIRTIO_MMIO_MAGIC_VALUE), &mut b);
        assert_eq!(b, [0; 8]);
        let mut b = [0xaau8; 4];
        drv.transport
            .read(u64::from(VIRTIO_MMIO_MAGIC_VALUE) + 1, &mut b);
        assert_eq!(b, [0; 4]);
        drv.transport.read(0x0fc, &mut []);
        // A 1-byte or 8-byte status write changes nothing; neither does a misaligned one.
        drv.transport.write(u64::from(VIRTIO_MMIO_STATUS), &[0]);
        drv.transport.write(u64::from(VIRTIO_MMIO_STATUS), &[0; 8]);
        drv.transport
            .write(u64::from(VIRTIO_MMIO_STATUS) + 2, &[0; 4]);
        drv.transport.write(u64::from(VIRTIO_MMIO_STATUS), &[]);
        assert_eq!(drv.status(), 0xb);
        assert_eq!(seen.lock().unwrap().resets, 1);
        // Unknown and legacy registers.
        assert_eq!(drv.read(0x40), 0);
        drv.write(0x40, 1);
        assert_eq!(drv.read(0x0f8), 0);
    }

    #[test]
    fn interrupt_ack_clears_only_the_acknowledged_bits() {
        let mem = memory(1);
        let vq0 = MockSplitQueue::create(&mem, GuestAddress(0x1_0000), 16);
        let vq1 = MockSplitQueue::create(&mem, GuestAddress(0x2_0000), 16);
        let (mut drv, seen) = negotiated(&mem);
        drv.setup_queue(0, &vq0, 16);
        drv.setup_queue(1, &vq1, 16);
        drv.driver_ok();
        let irq = seen.lock().unwrap().interrupt.clone().unwrap();
        irq.signal_used();
        irq.signal_config();
        assert_eq!(drv.irq.count(), 2);
        assert_eq!(
            drv.read(VIRTIO_MMIO_INTERRUPT_STATUS),
            INT_USED_RING | INT_CONFIG
        );
        drv.write(VIRTIO_MMIO_INTERRUPT_ACK, INT_USED_RING);
        assert_eq!(drv.read(VIRTIO_MMIO_INTERRUPT_STATUS), INT_CONFIG);
        assert_eq!(drv.ack_interrupt(), INT_CONFIG);
        assert_eq!(drv.read(VIRTIO_MMIO_INTERRUPT_STATUS), 0);
    }

    #[test]
    fn config_space_accesses_of_any_width_reach_the_device() {
        let (dev, seen) = FakeDevice::boxed(&[16]);
        let mut drv = Driver::new(dev, memory(1));
        let mut b = [0u8; 1];
        drv.transport.read(CONFIG_OFFSET + 5, &mut b);
        assert_eq!(b, [5]);
        let mut b = [0u8; 2];
        drv.transport.read(CONFIG_OFFSET + 2, &mut b);
        assert_eq!(b, [2, 3]);
        let mut b = [0u8; 8];
        drv.transport.read(CONFIG_OFFSET + 12, &mut b);
        assert_eq!(b, [12, 13, 14, 15, 0, 0, 0, 0]);
        drv.transport.write(CONFIG_OFFSET + 1, &[0xee, 0xff]);
        assert_eq!(&seen.lock().unwrap().config[..4], &[0, 0xee, 0xff, 3]);
        let mut b = [0xaau8; 4];
        drv.transport.read(MMIO_SIZE - 4, &mut b);
        assert_eq!(b, [0; 4]);
    }

    #[test]
    fn a_selected_queue_that_does_not_exist_reads_as_absent_and_ignores_writes() {
        let mem = memory(1);
        let (mut drv, _) = negotiated(&mem);
        drv.write(VIRTIO_MMIO_QUEUE_SEL, 2);
        assert_eq!(drv.read(VIRTIO_MMIO_QUEUE_NUM_MAX), 0);
        drv.write(VIRTIO_MMIO_QUEUE_NUM, 16);
        drv.write(VIRTIO_MMIO_QUEUE_READY, 1);
        assert_eq!(drv.read(VIRTIO_MMIO_QUEUE_READY), 0);
        drv.write(VIRTIO_MMIO_QUEUE_SEL, u32::MAX);
        assert_eq!(drv.read(VIRTIO_MMIO_QUEUE_NUM_MAX), 0);
        drv.write(VIRTIO_MMIO_QUEUE_SEL, 0);
        assert_eq!(drv.read(VIRTIO_MMIO_QUEUE_NUM_MAX), 16);
    }

    #[test]
    fn queue_configuration_after_driver_ok_is_ignored() {
        let mem = memory(1);
        let vq = MockSplitQueue::create(&mem, GuestAddress(0x1_0000), 16);
        let (dev, seen) = FakeDevice::boxed(&[16]);
        let mut drv = Driver::new(dev, mem.clone());
        assert!(drv.negotiate(VIRTIO_F_VERSION_1));
        drv.setup_queue(0, &vq, 16);
        drv.driver_ok();
        drv.write(VIRTIO_MMIO_QUEUE_READY, 0);
        assert_eq!(drv.read(VIRTIO_MMIO_QUEUE_READY), 1);
        assert_eq!(seen.lock().unwrap().activations, 1);
        // A second DRIVER_OK write (no new bit) does not activate again.
        drv.add_status(VIRTIO_CONFIG_S_DRIVER_OK);
        assert_eq!(seen.lock().unwrap().activations, 1);
    }

    #[test]
    fn a_queue_size_the_device_got_wrong_reads_as_absent_and_keeps_the_device_from_starting() {
        let mem = memory(1);
        let vq = MockSplitQueue::create(&mem, GuestAddress(0x1_0000), 16);
        let (dev, seen) = FakeDevice::boxed(&[16, 3, 16]);
        let mut drv = Driver::new(dev, mem.clone());
        assert!(drv.negotiate(VIRTIO_F_VERSION_1));
        drv.write(VIRTIO_MMIO_QUEUE_SEL, 1);
        assert_eq!(drv.read(VIRTIO_MMIO_QUEUE_NUM_MAX), 0);
        drv.write(VIRTIO_MMIO_QUEUE_SEL, 2);
        assert_eq!(drv.read(VIRTIO_MMIO_QUEUE_NUM_MAX), 16);
        drv.setup_queue(0, &vq, 16);
        drv.driver_ok();
        assert_ne!(drv.status() & STATUS_NEEDS_RESET, 0);
        assert_eq!(seen.lock().unwrap().activations, 0);
    }
}
