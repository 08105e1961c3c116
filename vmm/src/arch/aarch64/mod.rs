//! aarch64 guest boot: memory layout, `Image`/initrd loading, the device
//! tree, PSCI power states, and (on an aarch64 host) the machine the VMM
//! assembles — Linux's arm64 boot protocol as Firecracker and Cloud
//! Hypervisor drive it.
//!
//! # Order of use (the VMM's side, [`machine`])
//!
//! 1. Guest memory: [`layout::ram_regions`] (RAM from 2 GiB).
//! 2. VM with the GICv3 of [`layout::gic`] (KVM's vGICv3; `hv_gic` or the
//!    userspace model on Hypervisor.framework); map RAM.
//! 3. [`loader::load_kernel`] at RAM start + `text_offset`,
//!    [`loader::load_initrd`] below the FDT block, then [`fdt::write`] in
//!    the last 2 MiB of RAM with every device's address and SPI.
//! 4. Per vCPU, on its own thread: create it; the boot vCPU gets PC = the
//!    kernel's entry, x0 = the FDT, PSTATE = EL1h with DAIF masked. The
//!    others start off: KVM holds them until PSCI `CPU_ON` in the kernel;
//!    on Hypervisor.framework their threads wait in [`power::CpuPower`]
//!    until the VMM sees the `CPU_ON`.
//!
//! # Code map
//!
//! * [`layout`]: addresses, SPIs, sizes (all 16 KiB-aligned for HVF);
//! * [`loader`]: the `Image` header, kernel and initrd placement;
//! * [`fdt`]: the device tree (`vm-fdt`);
//! * [`power`]: `CPU_ON`/`CPU_OFF`/`AFFINITY_INFO` state for VMM-side PSCI;
//! * [`ArchError`]: every failure, with the numbers needed to fix it.
//!
//! Everything but `machine` is portable and unit-tested on every host.

mod error;
pub mod fdt;
pub mod layout;
pub mod loader;
#[cfg(target_arch = "aarch64")]
pub mod machine;
pub mod power;

pub use error::ArchError;
