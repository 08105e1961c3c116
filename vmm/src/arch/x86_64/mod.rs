//! x86_64 guest boot: memory layout, kernel/initrd loading, boot structures
//! in guest memory, and the vCPUs' boot state — the Linux 64-bit boot
//! protocol as Firecracker drives it.
//!
//! # Order of use (the VMM's side)
//!
//! 1. Guest memory: `GuestMemoryMmap::from_ranges(&`[`layout::ram_regions`]`(mem_bytes))`.
//! 2. VM: `Kvm::create_vm(&VmConfig { irqchip: true, tss_addr:
//!    Some(`[`layout::KVM_TSS_ADDR`]`) })` — the in-kernel PIC/IOAPIC/LAPIC
//!    and PIT must exist before any vCPU; then `map_memory` every region of
//!    the guest memory.
//! 3. [`load_kernel`], then [`load_initrd`] (optional), then
//!    [`configure_system`] with the command line (virtio-mmio devices as
//!    `virtio_mmio.device=4K@ADDR:IRQ` from [`layout::mmio_slot`]).
//! 4. Per vCPU, on its own thread: `vm.create_vcpu(id)`, then
//!    [`setup_vcpu`] with the kernel's [`LoadedKernel::entry`] (it
//!    normalises the supported CPUID the vCPU was created with).
//! 5. Run every vCPU. vCPU 0 enters the kernel; the others wait in INIT
//!    until the kernel sends them SIPIs through the in-kernel LAPIC.
//!
//! # Code map
//!
//! * [`layout`]: addresses, sizes, IRQs, [`layout::ram_regions`];
//! * [`loader`]: [`load_kernel`] (ELF or bzImage), [`load_initrd`];
//! * [`boot`]: [`configure_system`] — command line, [`mptable`], [`zeropage`];
//! * [`cpuid`], [`msr`], [`gdt`], [`paging`], [`regs`]: [`setup_vcpu`];
//! * [`machine`]: the devices and boot steps the generic VMM calls;
//! * [`ArchError`]: every failure, with the numbers needed to fix it.

pub mod boot;
pub mod cpuid;
mod error;
pub mod gdt;
pub mod layout;
pub mod loader;
pub mod machine;
pub mod mptable;
pub mod msr;
pub mod paging;
pub mod regs;
pub mod zeropage;

pub use boot::configure_system;
pub use error::ArchError;
pub use loader::{load_initrd, load_kernel, KernelFormat, LoadedKernel};
pub use regs::{setup_vcpu, setup_vcpu_with_cpuid};
