//! The Hypervisor.framework backend (`#[cfg(hvf)]`: macOS on Apple silicon,
//! aarch64 guests), thin over `applevisor` (feature level `macos-13-0`).
//!
//! # Constraints this backend enforces
//!
//! * **One VM per process.** The framework keeps a single VM per process;
//!   [`Hvf::create_vm`](crate::Hypervisor::create_vm) refuses a second one
//!   with [`HvfError::VmExists`] while the first (or any of its vCPUs) lives.
//! * **Thread-bound vCPUs.** Every `hv_vcpu_*` call must come from the thread
//!   that created the vCPU, so [`HvfVcpu`] is not `Send`; other threads stop
//!   it through [`HvfKick`] (`hv_vcpus_exit`).
//! * **16 KiB granularity.** Guest memory is mapped in 16 KiB pages: region
//!   addresses and sizes (and host addresses) must be multiples of 16 KiB, and
//!   the dirty log has one bit per 16 KiB.
//! * **macOS 13 floor.** The in-framework GICv3 (`hv_gic_*`, macOS 15+) is
//!   looked up at runtime with `dlsym`; without it the portable userspace
//!   model in [`crate::gic`] serves the distributor/redistributor MMIO and the
//!   trapped `ICC_*` registers. One binary runs on 13, 14 and 15+.
//!
//! What the backend handles itself: data aborts (MMIO exits, or dirty-page
//! tracking by write protection), PSCI calls that need no VMM state, WFI
//! (waits for an interrupt, the virtual timer's deadline or a kick), virtual
//! timer activation and unmasking, trapped system registers. Everything
//! portable it uses (syndrome decoding, PSCI ids, the GIC state machine,
//! dirty bitmaps) lives outside this module and is unit-tested on Linux.
//! This module must never decide guest layout: GIC addresses come from
//! [`VmConfig`](crate::VmConfig).
//!
//! Not verifiable on the Linux build machines: this module is type-checked
//! and linted for `aarch64-apple-darwin` only (`hv/check-cross.sh`).

mod exit;
mod gic;
mod kick;
mod regs;
mod vcpu;
mod vm;

use applevisor::prelude::{Vcpu as HvVcpu, VirtualMachineConfig};

pub use kick::HvfKick;
pub use vcpu::HvfVcpu;
pub use vm::HvfVm;

use crate::{Capabilities, HvError, Hypervisor, VmConfig};

/// The framework's page size: mappings are made of 16 KiB pages.
pub const PAGE_SIZE: u64 = 0x4000;

/// Why a Hypervisor.framework call failed.
#[derive(Debug, thiserror::Error)]
pub enum HvfError {
    /// The host has no Hypervisor.framework support (or no entitlement).
    #[error("hypervisor.framework is not available (kern.hv_support = 0 or missing entitlement)")]
    Unavailable,
    /// A VM already exists in this process.
    #[error("hypervisor.framework allows one vm per process and this process already has one")]
    VmExists,
    /// A framework call failed.
    #[error("{0} failed")]
    Call(&'static str, #[source] applevisor::error::HypervisorError),
    /// A raw `hv_*` call returned an error code.
    #[error("{0} failed with hv_return_t {1:#x}")]
    Return(&'static str, i32),
    /// The guest did something this backend cannot emulate.
    #[error("cannot emulate: {0}")]
    Emulation(String),
}

/// Hypervisor.framework on this Mac.
#[derive(Debug)]
pub struct Hvf {
    _private: (),
}

fn hv_supported() -> bool {
    let mut value: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>();
    // SAFETY: the name is NUL-terminated, `value`/`len` describe a valid
    // c_int buffer, and no new value is written (null, 0).
    let rc = unsafe {
        libc::sysctlbyname(
            c"kern.hv_support".as_ptr(),
            (&mut value as *mut libc::c_int).cast(),
            &mut len,
            std::ptr::null_mut(),
            0,
        )
    };
    rc == 0 && value == 1
}

impl Hypervisor for Hvf {
    type Vm = HvfVm;

    fn open() -> Result<Self, HvError> {
        if !hv_supported() {
            return Err(HvfError::Unavailable.into());
        }
        Ok(Self { _private: () })
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            max_vcpus: HvVcpu::get_max_count().unwrap_or(1),
            max_memory_slots: vm::MAX_SLOTS,
            page_size: PAGE_SIZE,
            irqchip: true,
            read_only_memory: true,
            dirty_log: true,
            ipa_bits: VirtualMachineConfig::get_default_ipa_size().unwrap_or(36),
        }
    }

    fn create_vm(&self, config: &VmConfig) -> Result<HvfVm, HvError> {
        HvfVm::new(config)
    }
}
