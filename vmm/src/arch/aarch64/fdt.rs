//! The flattened device tree an aarch64 guest boots with, built with
//! `vm-fdt`: CPUs (PSCI enable-method, MPIDR), memory, `/chosen` (command
//! line, initrd, console), the GICv3, the armv8 timer's PPIs, PSCI 0.2, the
//! PL011 and PL031 with their clock, and one node per virtio-mmio device.
//!
//! Interrupt specifiers are GIC triples `<type number flags>`: type 0 is an
//! SPI (number = INTID − 32), 1 a PPI (INTID − 16). Device SPIs are
//! edge-rising because the VMM's interrupt lines are edges (irqfd,
//! `hv_gic_set_spi` pulses); the timer PPIs are level-high as the
//! architecture makes them. Pure data: nothing here touches a hypervisor.

use vm_fdt::FdtWriter;
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use boxdesk_hv::arch::aarch64::mpidr_for;

use super::layout::{self, AMBA_SIZE, RAM_START, RTC_SPI, RTC_START, UART_SPI, UART_START};
use super::loader::fdt_address;
use super::ArchError;

/// How the guest calls PSCI: `hvc`, which KVM answers in the kernel; `smc`
/// on Hypervisor.framework, which traps both to the VMM (`smc` as libkrun
/// uses there, keeping `hvc` free for a paravirtual interface).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PsciMethod {
    /// `hvc #0` (KVM).
    Hvc,
    /// `smc #0` (Hypervisor.framework).
    Smc,
}

impl PsciMethod {
    fn as_str(self) -> &'static str {
        match self {
            Self::Hvc => "hvc",
            Self::Smc => "smc",
        }
    }
}

/// What the device tree describes.
#[derive(Debug, Clone)]
pub struct FdtConfig<'a> {
    /// vCPUs (`cpu@N`, MPIDR from [`mpidr_for`]).
    pub vcpus: u32,
    /// RAM from [`RAM_START`].
    pub mem_bytes: u64,
    /// `/chosen/bootargs`.
    pub cmdline: &'a str,
    /// The initrd's guest address and size.
    pub initrd: Option<(GuestAddress, usize)>,
    /// virtio-mmio devices: address and SPI.
    pub virtio: &'a [(u64, u32)],
    /// PSCI's conduit.
    pub psci: PsciMethod,
}

/// The GIC's phandle (the root's interrupt-parent).
const GIC_PHANDLE: u32 = 1;
/// The 24 MHz APB clock's phandle (the AMBA devices' `apb_pclk`).
const CLOCK_PHANDLE: u32 = 2;
/// GIC interrupt types.
const SPI: u32 = 0;
const PPI: u32 = 1;
/// Interrupt flags (IRQ_TYPE_*).
const EDGE_RISING: u32 = 1;
const LEVEL_HIGH: u32 = 4;
/// The armv8 timer PPIs (INTID − 16): secure physical, non-secure physical,
/// virtual, hypervisor.
const TIMER_PPIS: [u32; 4] = [13, 14, 11, 10];

/// The FDT blob for `cfg`.
pub fn build(cfg: &FdtConfig<'_>) -> Result<Vec<u8>, ArchError> {
    if cfg.vcpus == 0 || cfg.vcpus > layout::MAX_VCPUS {
        return Err(ArchError::VcpuCount {
            vcpus: cfg.vcpus,
            max: layout::MAX_VCPUS,
        });
    }
    if cfg.cmdline.contains('\0') {
        return Err(ArchError::CmdlineNul);
    }
    tree(cfg).map_err(|e| ArchError::Fdt(e.to_string()))
}

fn tree(cfg: &FdtConfig<'_>) -> Result<Vec<u8>, vm_fdt::Error> {
    let mut f = FdtWriter::new()?;
    let root = f.begin_node("")?;
    f.property_string("compatible", "linux,dummy-virt")?;
    f.property_u32("#address-cells", 2)?;
    f.property_u32("#size-cells", 2)?;
    f.property_u32("interrupt-parent", GIC_PHANDLE)?;

    let cpus = f.begin_node("cpus")?;
    f.property_u32("#address-cells", 1)?;
    f.property_u32("#size-cells", 0)?;
    for id in 0..cfg.vcpus {
        let mpidr = (mpidr_for(id) & 0x00ff_ffff) as u32;
        let cpu = f.begin_node(&format!("cpu@{mpidr:x}"))?;
        f.property_string("device_type", "cpu")?;
        f.property_string("compatible", "arm,arm-v8")?;
        f.property_string("enable-method", "psci")?;
        f.property_u32("reg", mpidr)?;
        f.end_node(cpu)?;
    }
    f.end_node(cpus)?;

    let memory = f.begin_node(&format!("memory@{RAM_START:x}"))?;
    f.property_string("device_type", "memory")?;
    f.property_array_u64("reg", &[RAM_START, cfg.mem_bytes])?;
    f.end_node(memory)?;

    let chosen = f.begin_node("chosen")?;
    f.property_string("bootargs", cfg.cmdline)?;
    f.property_string("stdout-path", &format!("/pl011@{UART_START:x}"))?;
    if let Some((start, size)) = cfg.initrd {
        f.property_u64("linux,initrd-start", start.0)?;
        f.property_u64("linux,initrd-end", start.0 + size as u64)?;
    }
    f.end_node(chosen)?;

    let [(gicd, gicd_size), (gicr, gicr_size)] = layout::gic_regions(cfg.vcpus);
    let gic = f.begin_node(&format!("intc@{gicd:x}"))?;
    f.property_string("compatible", "arm,gic-v3")?;
    f.property_null("interrupt-controller")?;
    f.property_u32("#interrupt-cells", 3)?;
    f.property_u32("#address-cells", 2)?;
    f.property_u32("#size-cells", 2)?;
    f.property_null("ranges")?;
    f.property_array_u64("reg", &[gicd, gicd_size, gicr, gicr_size])?;
    f.property_phandle(GIC_PHANDLE)?;
    f.end_node(gic)?;

    let timer = f.begin_node("timer")?;
    f.property_string("compatible", "arm,armv8-timer")?;
    f.property_null("always-on")?;
    let cells: Vec<u32> = TIMER_PPIS
        .iter()
        .flat_map(|ppi| [PPI, *ppi, LEVEL_HIGH])
        .collect();
    f.property_array_u32("interrupts", &cells)?;
    f.end_node(timer)?;

    let psci = f.begin_node("psci")?;
    f.property_string_list("compatible", vec!["arm,psci-0.2".into(), "arm,psci".into()])?;
    f.property_string("method", cfg.psci.as_str())?;
    f.end_node(psci)?;

    let clock = f.begin_node("apb-pclk")?;
    f.property_string("compatible", "fixed-clock")?;
    f.property_u32("#clock-cells", 0)?;
    f.property_u32("clock-frequency", 24_000_000)?;
    f.property_string("clock-output-names", "clk24mhz")?;
    f.property_phandle(CLOCK_PHANDLE)?;
    f.end_node(clock)?;

    let uart = f.begin_node(&format!("pl011@{UART_START:x}"))?;
    f.property_string_list(
        "compatible",
        vec!["arm,pl011".into(), "arm,primecell".into()],
    )?;
    f.property_array_u64("reg", &[UART_START, AMBA_SIZE])?;
    f.property_array_u32("interrupts", &[SPI, UART_SPI, EDGE_RISING])?;
    f.property_array_u32("clocks", &[CLOCK_PHANDLE, CLOCK_PHANDLE])?;
    f.property_string_list("clock-names", vec!["uartclk".into(), "apb_pclk".into()])?;
    f.end_node(uart)?;

    let rtc = f.begin_node(&format!("pl031@{RTC_START:x}"))?;
    f.property_string_list(
        "compatible",
        vec!["arm,pl031".into(), "arm,primecell".into()],
    )?;
    f.property_array_u64("reg", &[RTC_START, AMBA_SIZE])?;
    f.property_array_u32("interrupts", &[SPI, RTC_SPI, LEVEL_HIGH])?;
    f.property_u32("clocks", CLOCK_PHANDLE)?;
    f.property_string("clock-names", "apb_pclk")?;
    f.end_node(rtc)?;

    for (addr, spi) in cfg.virtio {
        let dev = f.begin_node(&format!("virtio_mmio@{addr:x}"))?;
        f.property_string("compatible", "virtio,mmio")?;
        f.property_array_u64("reg", &[*addr, layout::VIRTIO_MMIO_SIZE])?;
        f.property_array_u32("interrupts", &[SPI, *spi, EDGE_RISING])?;
        f.property_null("dma-coherent")?;
        f.end_node(dev)?;
    }

    f.end_node(root)?;
    f.finish()
}

/// Builds the FDT for `cfg` and writes it at [`fdt_address`]; returns that
/// address (the boot vCPU's x0).
pub fn write(mem: &GuestMemoryMmap, cfg: &FdtConfig<'_>) -> Result<GuestAddress, ArchError> {
    let blob = build(cfg)?;
    if blob.len() as u64 > layout::FDT_MAX_SIZE {
        return Err(ArchError::FdtTooLarge {
            len: blob.len(),
            max: layout::FDT_MAX_SIZE,
        });
    }
    let at = GuestAddress(fdt_address(cfg.mem_bytes));
    mem.write_slice(&blob, at)
        .map_err(|_| ArchError::GuestMemory {
            what: "device tree",
            addr: at.0,
            len: blob.len(),
        })?;
    Ok(at)
}

#[cfg(test)]
mod tests;
