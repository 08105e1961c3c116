//! The aarch64 machine the generic VMM ([`crate::vmm`]) assembles on an
//! aarch64 host: GICv3, PL011 console, PL031 RTC, virtio-mmio slots, the
//! device tree, the boot vCPU's registers, and PSCI calls the backend
//! leaves to the VMM (Hypervisor.framework: `CPU_ON`, `CPU_OFF`,
//! `AFFINITY_INFO`, `CPU_SUSPEND`).

use std::fs::File;
use std::sync::{Arc, Mutex};

use boxdesk_devices::console::Console;
use boxdesk_devices::pl011::{Pl011, PL011_SIZE};
use boxdesk_devices::pl031::{Pl031, PL031_SIZE};
use boxdesk_hv::arch::aarch64::PSTATE_EL1H_MASKED;
use boxdesk_hv::psci::{ret, PsciCall};
use boxdesk_hv::{Vcpu, VmConfig};
use vm_memory::{GuestAddress, GuestMemoryMmap};

use super::fdt::{self, FdtConfig, PsciMethod};
use super::layout::{self, RAM_START, RTC_START, UART_SPI, UART_START};
use super::loader::{self, LoadedKernel};
use super::power::CpuPower;
use super::ArchError;
use crate::vmm::{dev, irq, Buses, HvVcpu, VmmError};

/// The most vCPUs this machine gives a guest.
pub const MAX_VCPUS: u32 = layout::MAX_VCPUS;

/// Whether the VMM answers PSCI power calls (Hypervisor.framework traps
/// `smc` to us; KVM answers `hvc` in the kernel).
pub const VMM_PSCI: bool = cfg!(target_os = "macos");

/// The guest RAM regions.
pub fn ram_regions(mem_bytes: u64) -> Vec<(GuestAddress, usize)> {
    layout::ram_regions(mem_bytes)
}

/// The VM's interrupt controller: a GICv3.
pub fn vm_config(_vcpus: u32) -> VmConfig {
    VmConfig {
        gic: Some(layout::gic()),
    }
}

/// The kernel and initrd, in guest memory.
#[derive(Debug, Clone, Copy)]
pub struct Loaded {
    kernel: LoadedKernel,
    initrd: (GuestAddress, usize),
}

/// Loads the `Image` and the initrd.
pub fn load(
    mem: &GuestMemoryMmap,
    kernel: &mut File,
    initrd: &mut File,
) -> Result<Loaded, ArchError> {
    let kernel = loader::load_kernel(mem, kernel)?;
    let initrd = loader::load_initrd(mem, initrd, kernel.end)?;
    Ok(Loaded { kernel, initrd })
}

/// The PL011 console (SPI 1) and the PL031 RTC. `on_reset` is unused: an
/// aarch64 guest resets through PSCI.
pub fn add_devices(
    irqs: &mut irq::Lines,
    console: File,
    _on_reset: Box<dyn Fn() + Send>,
    buses: &mut Buses,
) -> Result<Arc<Mutex<dyn Console>>, VmmError> {
    let uart = Arc::new(Mutex::new(Pl011::new(
        Box::new(console),
        irqs.line(UART_SPI)?,
    )));
    buses
        .mmio
        .insert(UART_START, PL011_SIZE, uart.clone())
        .map_err(dev("pl011"))?;
    buses
        .mmio
        .insert(RTC_START, PL031_SIZE, Arc::new(Mutex::new(Pl031::new())))
        .map_err(dev("pl031"))?;
    Ok(uart)
}

/// Address and SPI of virtio-mmio slot `i`.
pub fn virtio_slot(i: usize) -> Option<(u64, u32)> {
    layout::mmio_slot(i)
}

/// The kernel command line: console on the PL011, panics reset at once (the
/// VMM reports them), and the agent's `boxdesk.rootfs=` contract. Devices
/// are in the FDT, not here.
fn cmdline(rootfs: Option<bool>) -> String {
    let mut c =
        String::from("console=ttyAMA0 panic=-1 nomodules ipv6.disable=1 rdinit=/init quiet");
    c.push_str(crate::vmm::rootfs_args(rootfs));
    c
}

/// What the boot vCPU starts with.
#[derive(Debug, Clone)]
pub struct Boot {
    entry: GuestAddress,
    fdt: GuestAddress,
    /// Guest RAM: where a `CPU_ON` entry point may be.
    ram: std::ops::Range<u64>,
}

/// Writes the device tree.
pub fn write_boot(
    mem: &GuestMemoryMmap,
    loaded: &Loaded,
    slots: &[(u64, u32)],
    rootfs: Option<bool>,
    vcpus: u32,
    mem_bytes: u64,
) -> Result<Boot, ArchError> {
    let cmdline = cmdline(rootfs);
    let fdt = fdt::write(
        mem,
        &FdtConfig {
            vcpus,
            mem_bytes,
            cmdline: &cmdline,
            initrd: Some(loaded.initrd),
            virtio: slots,
            psci: if VMM_PSCI {
                PsciMethod::Smc
            } else {
                PsciMethod::Hvc
            },
        },
    )?;
    Ok(Boot {
        entry: loaded.kernel.entry,
        fdt,
        ram: RAM_START..RAM_START + mem_bytes,
    })
}

/// The boot vCPU's registers: PC = the kernel's entry, x0 = the FDT, EL1h
/// with DAIF masked. The others are left off (see the module doc).
pub fn setup_vcpu(
    vcpu: &mut HvVcpu,
    _mem: &GuestMemoryMmap,
    id: u32,
    _vcpus: u32,
    boot: &Boot,
) -> Result<(), ArchError> {
    if id == 0 {
        enter(vcpu, id, boot.entry.0, boot.fdt.0)?;
    }
    Ok(())
}

/// Points `vcpu` at `pc` with x0 = `x0`, EL1h, DAIF masked.
fn enter(vcpu: &mut HvVcpu, id: u32, pc: u64, x0: u64) -> Result<(), ArchError> {
    let err = |op| move |source| ArchError::Vcpu { id, op, source };
    let mut regs = vcpu.get_regs().map_err(err("read the registers"))?;
    regs.x = [0; 31];
    regs.x[0] = x0;
    regs.pc = pc;
    regs.pstate = PSTATE_EL1H_MASKED;
    vcpu.set_regs(&regs).map_err(err("set the boot registers"))
}

/// The VMM's PSCI state, for [`VMM_PSCI`].
pub type Power = CpuPower;

/// Blocks a secondary vCPU until a `CPU_ON` names it, then points it at the
/// entry. `false` when the VM stopped first.
pub fn wait_for_cpu_on(
    vcpu: &mut HvVcpu,
    id: u32,
    power: &Power,
    stop: &std::sync::atomic::AtomicBool,
) -> Result<bool, ArchError> {
    match power.wait_on(id, stop) {
        Some((entry, context)) => enter(vcpu, id, entry, context).map(|()| true),
        None => Ok(false),
    }
}

/// What the vCPU thread does after a PSCI call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PsciNext {
    /// Run the guest again.
    Run,
    /// The vCPU turned itself off: wait for the next `CPU_ON`.
    Off,
}

/// Answers a PSCI call the backend left to the VMM, writing x0.
pub fn psci(
    vcpu: &mut HvVcpu,
    id: u32,
    call: PsciCall,
    power: &Power,
    boot: &Boot,
) -> Result<PsciNext, ArchError> {
    let answer = match call {
        PsciCall::CpuOn {
            target,
            entry,
            context,
        } => power.cpu_on(target, entry, context, boot.ram.clone()),
        PsciCall::AffinityInfo {
            target,
            lowest_level,
        } => power.affinity_info(target, lowest_level),
        PsciCall::CpuOff => {
            power.cpu_off(id);
            return Ok(PsciNext::Off);
        }
        // A standby suspend is a WFI the backend already waited out.
        PsciCall::CpuSuspend { .. } => ret::SUCCESS,
        _ => ret::NOT_SUPPORTED,
    };
    let err = |op| move |source| ArchError::Vcpu { id, op, source };
    let mut regs = vcpu.get_regs().map_err(err("read the registers"))?;
    regs.x[0] = answer as u64;
    vcpu.set_regs(&regs).map_err(err("answer a PSCI call"))?;
    Ok(PsciNext::Run)
}
