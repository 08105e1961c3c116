//! The x86_64 machine the generic VMM ([`crate`]) assembles on KVM:
//! in-kernel PIC/IOAPIC/LAPIC and PIT, the 8250 console on COM1 (IRQ 4),
//! the i8042 reset line, virtio-mmio slots in the 32-bit hole announced on
//! the command line, the zero page and MP table, and each vCPU's boot state.

use std::fs::File;
use std::sync::{Arc, Mutex};

use boxdesk_devices::console::{self, SharedConsole};
use boxdesk_devices::i8042::I8042;
use boxdesk_devices::serial::{Serial, SERIAL_PORT_BASE, SERIAL_PORT_LEN};
use boxdesk_hv::VmConfig;
use vm_memory::{GuestAddress, GuestMemoryMmap};

use super::layout;
use super::{ArchError, LoadedKernel};
use crate::{dev, irq, Buses, HvVcpu, VmmError};

/// The most vCPUs this machine gives a guest.
pub const MAX_VCPUS: u32 = layout::MAX_VCPUS;

/// The console's IRQ (COM1).
const SERIAL_IRQ: u32 = 4;
/// The i8042's ports: 0x60 (data) to 0x64 (command/status).
const I8042_BASE: u64 = 0x60;
const I8042_LEN: u64 = 5;

/// The guest RAM regions (below the 32-bit MMIO hole, then above 4 GiB).
pub fn ram_regions(mem_bytes: u64) -> Vec<(GuestAddress, usize)> {
    layout::ram_regions(mem_bytes)
}

/// The in-kernel irqchip and the TSS address KVM needs.
pub fn vm_config(_vcpus: u32) -> VmConfig {
    VmConfig {
        irqchip: true,
        tss_addr: Some(layout::KVM_TSS_ADDR),
    }
}

/// The kernel and initrd, in guest memory.
#[derive(Debug, Clone)]
pub struct Loaded {
    kernel: LoadedKernel,
    initrd: (GuestAddress, usize),
}

/// Loads the kernel (vmlinux ELF or bzImage) and the initrd.
pub fn load(
    mem: &GuestMemoryMmap,
    kernel: &mut File,
    initrd: &mut File,
) -> Result<Loaded, ArchError> {
    Ok(Loaded {
        kernel: super::load_kernel(mem, kernel)?,
        initrd: super::load_initrd(mem, initrd)?,
    })
}

/// The 8250 console on COM1 and the i8042, whose reset calls `on_reset`.
pub fn add_devices(
    irqs: &mut irq::Lines,
    console: Box<dyn std::io::Write + Send>,
    on_reset: Box<dyn Fn() + Send>,
    buses: &mut Buses,
) -> Result<SharedConsole, VmmError> {
    let (serial, device) = console::shared(Serial::new(console, irqs.line(SERIAL_IRQ)?));
    buses
        .pio
        .insert(SERIAL_PORT_BASE, SERIAL_PORT_LEN, device)
        .map_err(dev("serial"))?;
    buses
        .pio
        .insert(
            I8042_BASE,
            I8042_LEN,
            Arc::new(Mutex::new(I8042::new(on_reset))),
        )
        .map_err(dev("i8042"))?;
    Ok(serial)
}

/// Address and GSI of virtio-mmio slot `i`.
pub fn virtio_slot(i: usize) -> Option<(u64, u32)> {
    layout::mmio_slot(i)
}

/// The kernel command line: console on the 8250, reset through the i8042,
/// no PCI/ACPI probing, panics reboot at once (the VMM reports them), one
/// `virtio_mmio.device=` per device, and the agent's parameters (`agent`:
/// the rootfs and the shares).
fn cmdline(devices: &[(u64, u32)], agent: &str) -> String {
    let mut c = String::from(
        "console=ttyS0 reboot=k panic=-1 pci=off nomodules i8042.noaux i8042.nomux i8042.nopnp i8042.dumbkbd \
         tsc=reliable ipv6.disable=1 rdinit=/init quiet",
    );
    for (addr, irq) in devices {
        c.push_str(&format!(" virtio_mmio.device=4K@{addr:#x}:{irq}"));
    }
    c.push_str(agent);
    c
}

/// What every vCPU starts from.
#[derive(Debug, Clone, Copy)]
pub struct Boot {
    entry: GuestAddress,
}

impl Boot {
    /// Nothing to wake: x86_64 vCPUs wait for their SIPI inside KVM.
    pub fn wake_all(&self) {}
}

/// Writes the command line, MP table and zero page.
pub fn write_boot(
    mem: &GuestMemoryMmap,
    loaded: &Loaded,
    slots: &[(u64, u32)],
    agent: &str,
    vcpus: u32,
    mem_bytes: u64,
) -> Result<Boot, ArchError> {
    let vcpus_u8 = u8::try_from(vcpus).map_err(|_| ArchError::VcpuCount {
        id: 0,
        vcpus,
        max: MAX_VCPUS,
    })?;
    super::configure_system(
        mem,
        &loaded.kernel,
        &cmdline(slots, agent),
        Some(loaded.initrd),
        mem_bytes,
        vcpus_u8,
    )?;
    Ok(Boot {
        entry: loaded.kernel.entry,
    })
}

/// Before a vCPU first runs: nothing (KVM's LAPIC holds the secondaries).
pub fn before_run(
    _vcpu: &mut HvVcpu,
    _id: u32,
    _boot: &Boot,
    _stop: &std::sync::atomic::AtomicBool,
) -> Result<bool, ArchError> {
    Ok(true)
}

/// CPUID, MSRs, FPU, LAPIC and (the boot vCPU) long-mode registers.
pub fn setup_vcpu(
    vcpu: &mut HvVcpu,
    mem: &GuestMemoryMmap,
    id: u32,
    vcpus: u32,
    boot: &Boot,
) -> Result<(), ArchError> {
    super::setup_vcpu(vcpu, mem, id, vcpus, boot.entry)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_command_line_announces_every_virtio_mmio_device() {
        let c = cmdline(
            &[(0xd000_0000, 5), (0xd000_1000, 6)],
            " boxdesk.rootfs=/dev/vda",
        );
        assert!(c.ends_with(" boxdesk.rootfs=/dev/vda"), "{c}");
        assert!(
            c.contains("virtio_mmio.device=4K@0xd0000000:5 virtio_mmio.device=4K@0xd0001000:6"),
            "{c}"
        );
        assert!(c.starts_with("console=ttyS0 reboot=k panic=-1"));
    }
}
