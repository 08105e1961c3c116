//! Interrupt lines as devices see them. The VMM wires an [`IrqLine`] to
//! KVM (irqfd or `KVM_IRQ_LINE`), to `hv_gic_set_spi`, to the userspace
//! GIC, or, in tests, to a counter.

use std::sync::atomic::{AtomicU64, Ordering};

/// One interrupt line of one device.
pub trait IrqLine: Send + Sync {
    /// Raises an edge on the line (virtio-mmio, serial).
    fn trigger(&self);
}

/// An [`IrqLine`] that counts its edges: for tests.
#[derive(Debug, Default)]
pub struct CountingIrq(pub AtomicU64);

impl CountingIrq {
    /// Edges so far.
    pub fn count(&self) -> u64 {
        self.0.load(Ordering::SeqCst)
    }
}

impl IrqLine for CountingIrq {
    fn trigger(&self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}
