//! Device interrupt lines ([`IrqLine`]) wired to the hypervisor.
//!
//! KVM (both arches): one eventfd per line, registered as an irqfd for the
//! GSI (x86_64) or SPI (aarch64), so raising an edge is one `write(2)` from
//! whichever thread the device runs on, with no exit and no lock. KVM arm64
//! takes irqfds only once the vGIC is initialised, which needs every vCPU
//! to exist: [`Lines`] hands devices their lines at once and registers them
//! in [`Lines::connect`], after the VM is finalised and before any vCPU
//! runs; an edge raised before that waits in the eventfd's counter.
//! Hypervisor.framework: an edge is the line driven high then low through
//! [`Vm::set_irq_line`](boxdesk_hv::Vm::set_irq_line) (`hv_gic_set_spi` or
//! the userspace GIC).

use std::sync::Arc;

use super::HvVm;

/// The interrupt lines of one VM.
pub struct Lines {
    vm: Arc<HvVm>,
    /// Lines not yet registered with the hypervisor.
    #[cfg(target_os = "linux")]
    pending: Vec<(vmm_sys_util::eventfd::EventFd, u32)>,
}

impl Lines {
    /// No lines yet.
    pub fn new(vm: &Arc<HvVm>) -> Self {
        Self {
            vm: vm.clone(),
            #[cfg(target_os = "linux")]
            pending: Vec::new(),
        }
    }
}

#[cfg(target_os = "linux")]
mod sys {
    use std::sync::Arc;

    use boxdesk_devices::irq::IrqLine;
    use vmm_sys_util::eventfd::EventFd;

    use super::Lines;
    use crate::VmmError;

    /// An irqfd.
    #[derive(Debug)]
    struct KvmIrq {
        event: EventFd,
    }

    impl IrqLine for KvmIrq {
        fn trigger(&self) {
            // A full counter (2^64 - 2 pending edges) cannot happen: KVM
            // reads it at once. Nothing else can fail here.
            let _ = self.event.write(1);
        }
    }

    impl Lines {
        /// A new edge-triggered line `n` (a GSI on x86_64, an SPI on
        /// aarch64).
        pub fn line(&mut self, n: u32) -> Result<Arc<dyn IrqLine>, VmmError> {
            let fail = |e: std::io::Error| VmmError::Device {
                what: "irq eventfd",
                why: e.to_string(),
            };
            let event = EventFd::new(libc::EFD_NONBLOCK).map_err(fail)?;
            self.pending.push((event.try_clone().map_err(fail)?, n));
            Ok(Arc::new(KvmIrq { event }))
        }

        /// Registers every line as an irqfd.
        pub fn connect(self) -> Result<(), VmmError> {
            for (event, n) in &self.pending {
                self.vm.register_irqfd(event, *n)?;
            }
            Ok(())
        }
    }
}

#[cfg(not(target_os = "linux"))]
mod sys {
    use std::sync::Arc;

    use boxdesk_devices::irq::IrqLine;
    use boxdesk_hv::Vm as _;

    use super::Lines;
    use crate::{HvVm, VmmError};

    /// A line pulsed through the VM.
    struct VmIrq {
        vm: Arc<HvVm>,
        line: u32,
    }

    impl IrqLine for VmIrq {
        fn trigger(&self) {
            // A failure here would be the framework's; a device cannot act
            // on it.
            let _ = self.vm.set_irq_line(self.line, true);
            let _ = self.vm.set_irq_line(self.line, false);
        }
    }

    impl Lines {
        /// A new edge-triggered SPI `n`.
        pub fn line(&mut self, n: u32) -> Result<Arc<dyn IrqLine>, VmmError> {
            Ok(Arc::new(VmIrq {
                vm: self.vm.clone(),
                line: n,
            }))
        }

        /// Nothing to register: lines go through the VM.
        pub fn connect(self) -> Result<(), VmmError> {
            Ok(())
        }
    }
}
