//! Device interrupt lines on KVM: one eventfd per line, registered as an
//! irqfd for its GSI, so raising an edge is one `write(2)` from whichever
//! thread the device runs on, with no exit and no lock.

use boxdesk_devices::irq::IrqLine;
use boxdesk_hv::kvm::KvmVm;
use vmm_sys_util::eventfd::EventFd;

/// An edge-triggered line to GSI `gsi`.
#[derive(Debug)]
pub struct KvmIrq {
    event: EventFd,
}

impl KvmIrq {
    /// Registers a new irqfd for `gsi` on `vm`.
    pub fn new(vm: &KvmVm, gsi: u32) -> Result<Self, super::VmmError> {
        let event = EventFd::new(libc::EFD_NONBLOCK).map_err(|e| super::VmmError::Device {
            what: "irq eventfd",
            why: e.to_string(),
        })?;
        vm.register_irqfd(&event, gsi)?;
        Ok(Self { event })
    }
}

impl IrqLine for KvmIrq {
    fn trigger(&self) {
        // A full counter (2^64 - 2 pending edges) cannot happen: KVM reads
        // it at once. Nothing else can fail here.
        let _ = self.event.write(1);
    }
}
