//! boxdesk-hv: one [`Hypervisor`] trait over KVM (Linux, x86_64 and aarch64)
//! and Hypervisor.framework (macOS, Apple silicon).
//!
//! # Walkthrough
//!
//! Open the host's hypervisor, create a VM, map guest RAM that
//! [`vm_memory`] owns, create a vCPU **on the thread that will run it**, and
//! turn each [`VcpuExit`] into one bus call:
//!
//! ```no_run
//! use boxdesk_hv::{DefaultHypervisor, Hypervisor, MapFlags, Vcpu, VcpuExit, Vm, VmConfig};
//! use vm_memory::{Bytes, GuestAddress, GuestRegionMmap, MemoryRegionAddress, MmapRegion};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let hv = DefaultHypervisor::open()?;
//! let vm = hv.create_vm(&VmConfig::default())?;
//! let ram: GuestRegionMmap = GuestRegionMmap::new(MmapRegion::new(0x10_0000)?, GuestAddress(0)).unwrap();
//! let ram = std::sync::Arc::new(ram); // the VM holds it while mapped
//! ram.write_slice(&[0xe6, 0x10, 0xf4], MemoryRegionAddress(0))?; // out 0x10, al; hlt
//! vm.map_memory(&ram, MapFlags::default())?;
//!
//! let mut vcpu = vm.create_vcpu(0)?; // !Send: it stays on this thread
//! let kick = vcpu.kick_handle(); // Send + Sync: give it to whoever stops the VM
//! loop {
//!     match vcpu.run()? {
//!         VcpuExit::Pio { port, write: Some(data), .. } => println!("out {port:#x} {data:?}"),
//!         VcpuExit::Pio { len, write: None, .. } | VcpuExit::Mmio { len, write: None, .. } => {
//!             vcpu.complete_read(&vec![0xff; len])?
//!         }
//!         VcpuExit::Hlt | VcpuExit::Cancelled => break,
//!         other => panic!("unexpected {other:?}"),
//!     }
//! }
//! # drop(kick);
//! # Ok(())
//! # }
//! ```
//!
//! # Code map
//!
//! * [`hypervisor`]: the traits [`Hypervisor`], [`Vm`], [`Vcpu`], [`VcpuKick`];
//! * [`exit`]: [`VcpuExit`] and what the caller must do after each variant;
//! * [`arch`]: register structs and VM configuration per guest arch;
//! * [`memory`]: slot bookkeeping, [`MapFlags`], [`DirtyLog`];
//! * [`probe()`]: what this host can really run;
//! * portable aarch64 pieces, compiled and unit-tested everywhere:
//!   [`syndrome`] (ESR_EL2 decoding), [`psci`], [`gic`] (userspace GICv3);
//! * backends: `kvm` (`#[cfg(kvm)]`: Linux) and `hvf` (`#[cfg(hvf)]`:
//!   macOS on aarch64), selected by `build.rs` with `cfg_aliases`.
//!
//! This crate holds mechanism only: where RAM, devices or the GIC live in the
//! guest's address space is the VMM's policy, passed in through [`VmConfig`]
//! and [`Vm::map_memory`].
#![deny(missing_docs)]

pub mod arch;
pub mod caps;
mod error;
pub mod exit;
pub mod gic;
pub mod hypervisor;
pub mod memory;
pub mod probe;
pub mod psci;
pub mod syndrome;

#[cfg(kvm)]
pub mod kvm;

#[cfg(hvf)]
pub mod hvf;

pub use arch::{Regs, VmConfig};
pub use caps::Capabilities;
pub use error::HvError;
pub use exit::{IoData, SystemEvent, VcpuExit};
pub use hypervisor::{Hypervisor, Vcpu, VcpuKick, Vm};
pub use memory::{DirtyLog, MapFlags, MemoryError, MemorySlot};
pub use probe::{probe, Probe};

cfg_if::cfg_if! {
    if #[cfg(kvm)] {
        /// The backend this host builds: KVM on Linux.
        pub type DefaultHypervisor = kvm::Kvm;
    } else if #[cfg(hvf)] {
        /// The backend this host builds: Hypervisor.framework on macOS.
        pub type DefaultHypervisor = hvf::Hvf;
    }
}
