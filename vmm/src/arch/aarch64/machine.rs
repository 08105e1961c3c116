//! The aarch64 machine the generic VMM ([`crate`]) assembles on an
//! aarch64 host: GICv3, PL011 console, PL031 RTC, virtio-mmio slots, the
//! device tree, the boot vCPU's registers, and PSCI calls the backend
//! leaves to the VMM (Hypervisor.framework: `CPU_ON`, `CPU_OFF`,
//! `AFFINITY_INFO`, `CPU_SUSPEND`).

use std::fs::File;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};

use boxdesk_devices::console::{self, SharedConsole};
use boxdesk_devices::pl011::{Pl011, PL011_SIZE};
use boxdesk_devices::pl031::{Pl031, PL031_SIZE};

use boxdesk_hv::arch::aarch64::{SysReg, PSTATE_EL1H_MASKED, SCTLR_EL1_RESET};
use boxdesk_hv::psci::{ret, PsciCall};
use boxdesk_hv::{Vcpu, VmConfig};
use vm_memory::{GuestAddress, GuestMemoryMmap};

use super::fdt::{self, FdtConfig, PsciMethod};
use super::layout::{self, RAM_START, RTC_START, UART_SPI, UART_START};
use super::loader::{self, LoadedKernel};
use super::power::CpuPower;
use super::ArchError;
use crate::{dev, irq, Buses, HvVcpu, VmmError};

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
    console: Box<dyn std::io::Write + Send>,
    _on_reset: Box<dyn Fn() + Send>,
    buses: &mut Buses,
) -> Result<SharedConsole, VmmError> {
    let (uart, device) = console::shared(Pl011::new(console, irqs.line(UART_SPI)?));
    buses
        .mmio
        .insert(UART_START, PL011_SIZE, device)
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
/// VMM reports them), and the agent's parameters (`agent`: the rootfs and
/// the shares). Devices are in the FDT, not here.
fn cmdline(agent: &str) -> String {
    let mut c =
        String::from("console=ttyAMA0 panic=-1 nomodules ipv6.disable=1 rdinit=/init quiet");
    c.push_str(agent);
    c
}

/// What the boot vCPU starts with, and (VMM-side PSCI) the power state
/// the secondaries wait on.
#[derive(Debug)]
pub struct Boot {
    entry: GuestAddress,
    fdt: GuestAddress,
    /// Guest RAM: where a `CPU_ON` entry point may be.
    ram: std::ops::Range<u64>,
    power: CpuPower,
}

impl Boot {
    /// Wakes secondaries waiting for `CPU_ON` to see the VM's stop flag.
    pub fn wake_all(&self) {
        self.power.wake_all();
    }
}

/// Writes the device tree.
pub fn write_boot(
    mem: &GuestMemoryMmap,
    loaded: &Loaded,
    slots: &[(u64, u32)],
    agent: &str,
    vcpus: u32,
    mem_bytes: u64,
) -> Result<Boot, ArchError> {
    let cmdline = cmdline(agent);
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
        power: CpuPower::new(vcpus),
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

/// Before vCPU `id` first runs: with VMM-side PSCI, a secondary waits for a
/// `CPU_ON` naming it. `false` when the VM stopped first.
pub fn before_run(
    vcpu: &mut HvVcpu,
    id: u32,
    boot: &Boot,
    stop: &AtomicBool,
) -> Result<bool, ArchError> {
    if VMM_PSCI && id > 0 {
        wait_for_cpu_on(vcpu, id, boot, stop)
    } else {
        Ok(true)
    }
}

/// Blocks until a `CPU_ON` names vCPU `id`, then starts it the way a CPU
/// leaves reset (MMU and caches off: it may have been on before a
/// `CPU_OFF`) at the requested entry. `false` when the VM stopped first.
fn wait_for_cpu_on(
    vcpu: &mut HvVcpu,
    id: u32,
    boot: &Boot,
    stop: &AtomicBool,
) -> Result<bool, ArchError> {
    let Some((entry, context)) = boot.power.wait_on(id, stop) else {
        return Ok(false);
    };
    vcpu.set_sys_reg(SysReg::SCTLR_EL1, SCTLR_EL1_RESET)
        .map_err(|source| ArchError::Vcpu {
            id,
            op: "reset SCTLR_EL1",
            source,
        })?;
    enter(vcpu, id, entry, context).map(|()| true)
}

/// Answers a PSCI call the backend left to the VMM (writing x0), or turns
/// the vCPU off until the next `CPU_ON`. `false` when the VM stopped while
/// it was off.
pub fn psci(
    vcpu: &mut HvVcpu,
    id: u32,
    call: PsciCall,
    boot: &Boot,
    stop: &AtomicBool,
) -> Result<bool, ArchError> {
    let answer = match call {
        PsciCall::CpuOn {
            target,
            entry,
            context,
        } => boot.power.cpu_on(target, entry, context, boot.ram.clone()),
        PsciCall::AffinityInfo {
            target,
            lowest_level,
        } => boot.power.affinity_info(target, lowest_level),
        PsciCall::CpuOff => {
            boot.power.cpu_off(id);
            return wait_for_cpu_on(vcpu, id, boot, stop);
        }
        _ => ret::NOT_SUPPORTED,
    };
    let err = |op| move |source| ArchError::Vcpu { id, op, source };
    let mut regs = vcpu.get_regs().map_err(err("read the registers"))?;
    regs.x[0] = answer as u64;
    vcpu.set_regs(&regs).map_err(err("answer a PSCI call"))?;
    Ok(true)
}
