//! The traits every backend implements: [`Hypervisor`] → [`Vm`] → [`Vcpu`],
//! plus the [`VcpuKick`] handle that stops a running vCPU.
//!
//! Shaped by the strictest backend (Hypervisor.framework): one VM per
//! process, and each vCPU bound to the thread that created it — so [`Vcpu`]
//! is not `Send` and is created by [`Vm::create_vcpu`] on its run thread,
//! while [`Vm`] is `Send + Sync` to be shared with those threads. Exits are
//! owned values ([`VcpuExit`]); reads are answered through
//! [`Vcpu::complete_read`]. No guest layout is decided here.

use std::sync::Arc;

use vm_memory::bitmap::Bitmap;
use vm_memory::GuestRegionMmap;

use crate::{Capabilities, DirtyLog, HvError, MapFlags, MemorySlot, Regs, VcpuExit, VmConfig};

/// A host hypervisor that can create VMs.
pub trait Hypervisor: Sized {
    /// The VM type this backend creates.
    type Vm: Vm;

    /// Opens the hypervisor (`/dev/kvm`; Hypervisor.framework's support
    /// check). Fails when the host has none; use [`probe`](crate::probe())
    /// to learn whether it can really run a guest.
    fn open() -> Result<Self, HvError>;

    /// What this hypervisor offers on this host.
    fn capabilities(&self) -> Capabilities;

    /// Creates a VM with the interrupt controller `config` asks for.
    /// Hypervisor.framework allows one live VM per process and says so.
    fn create_vm(&self, config: &VmConfig) -> Result<Self::Vm, HvError>;
}

/// One VM: guest memory, interrupt lines, vCPUs. Shared by its vCPU threads.
pub trait Vm: Send + Sync {
    /// The vCPU type this VM creates.
    type Vcpu: Vcpu;

    /// Maps `region` at its guest address. The VM holds a reference to the
    /// region, keeping its host mapping alive until it is unmapped or the VM
    /// is dropped. Address and size must be multiples of
    /// [`Capabilities::page_size`]; regions must not overlap.
    fn map_memory<B>(
        &self,
        region: &Arc<GuestRegionMmap<B>>,
        flags: MapFlags,
    ) -> Result<MemorySlot, HvError>
    where
        B: Bitmap + Send + Sync + 'static;

    /// Removes a mapping; guest accesses there become [`VcpuExit::Mmio`].
    fn unmap_memory(&self, slot: MemorySlot) -> Result<(), HvError>;

    /// Returns the pages of `slot` the guest wrote since the last call (or
    /// since mapping) and clears the log. The slot must have been mapped with
    /// [`MapFlags::log_dirty`].
    fn dirty_log(&self, slot: MemorySlot) -> Result<DirtyLog, HvError>;

    /// Creates vCPU `id` on the calling thread, which must be the thread that
    /// runs it. x86_64: the vCPU starts with the host's supported CPUID (the
    /// VMM may replace it). aarch64: MPIDR is
    /// [`mpidr_for(id)`](crate::arch::aarch64::mpidr_for); on KVM it has PSCI
    /// 0.2 and vCPUs other than 0 start powered off until a PSCI `CPU_ON`
    /// (answered in the kernel); on Hypervisor.framework `CPU_ON` comes back
    /// as [`VcpuExit::Psci`] for the VMM to act on.
    fn create_vcpu(&self, id: u32) -> Result<Self::Vcpu, HvError>;

    /// Finishes the interrupt controller once every vCPU exists (aarch64 KVM
    /// vGIC initialisation); call it before the first run. A no-op where
    /// nothing needs finishing.
    fn finalize(&self) -> Result<(), HvError>;

    /// Drives interrupt line `line` to `level`: a GSI of the in-kernel
    /// IOAPIC/PIC on x86_64; an SPI number (INTID − 32) on aarch64. An edge
    /// is `true` then `false`. Needs the interrupt controller from
    /// [`VmConfig`].
    fn set_irq_line(&self, line: u32, level: bool) -> Result<(), HvError>;
}

/// One virtual CPU, used only on the thread that created it.
pub trait Vcpu {
    /// The handle that interrupts this vCPU from other threads.
    type Kick: VcpuKick;

    /// The id it was created with.
    fn id(&self) -> u32;

    /// Runs guest code until the next exit that needs the caller. A pending
    /// [`VcpuKick::kick`] makes it return [`VcpuExit::Cancelled`] without
    /// entering the guest.
    fn run(&mut self) -> Result<VcpuExit, HvError>;

    /// Answers the MMIO or port read of the last exit with `data`, exactly
    /// `len` bytes (little-endian). Call it before the next [`run`](Self::run).
    fn complete_read(&mut self, data: &[u8]) -> Result<(), HvError>;

    /// Reads the register state.
    fn get_regs(&self) -> Result<Regs, HvError>;

    /// Writes the register state.
    fn set_regs(&mut self, regs: &Regs) -> Result<(), HvError>;

    /// A handle other threads use to stop this vCPU's [`run`](Self::run).
    fn kick_handle(&self) -> Self::Kick;
}

/// Makes a vCPU's current or next [`Vcpu::run`] return
/// [`VcpuExit::Cancelled`] promptly (KVM: signal + `immediate_exit`;
/// Hypervisor.framework: `hv_vcpus_exit`). Kicking a vCPU that is not in
/// `run` is remembered until it next runs; kicking one that is gone does
/// nothing.
pub trait VcpuKick: Clone + Send + Sync + 'static {
    /// Interrupts the vCPU.
    fn kick(&self);
}
