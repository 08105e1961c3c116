//! The aarch64 guest's physical address space: devices and the GIC in the
//! first 2 GiB, RAM from 2 GiB up (docs/DESIGN.md, "Per-arch guest layout").
//!
//! ```text
//! 0x0800_0000  GICv3 distributor            64 KiB
//! 0x080a_0000  GICv3 redistributors         128 KiB per vCPU (up to MAX_VCPUS)
//! 0x0900_0000  PL011 UART (SPI 1)           4 KiB
//! 0x0901_0000  PL031 RTC (SPI 2)            4 KiB
//! 0x0a00_0000  virtio-mmio slot i (SPI 16+i), one per 16 KiB
//! 0x8000_0000  RAM: kernel at its text_offset … initrd, then the FDT at the top
//! ```
//!
//! Every base and size is a multiple of 16 KiB, Hypervisor.framework's page
//! size, so the same layout serves KVM (4 KiB pages) and HVF. Nothing here
//! touches memory or a hypervisor.

use boxdesk_hv::arch::aarch64::{GicConfig, GICD_SIZE, GICR_SIZE_PER_CPU};
use vm_memory::GuestAddress;

/// The guest's RAM starts here.
pub const RAM_START: u64 = 0x8000_0000;
/// The GICv3 distributor.
pub const GICD_START: u64 = 0x0800_0000;
/// The first vCPU's redistributor; the others follow contiguously.
pub const GICR_START: u64 = 0x080a_0000;
/// The most vCPUs a guest gets: their redistributors must end below the UART.
pub const MAX_VCPUS: u32 = ((UART_START - GICR_START) / GICR_SIZE_PER_CPU) as u32;
/// The PL011 UART (the console, `ttyAMA0`).
pub const UART_START: u64 = 0x0900_0000;
/// The PL031 RTC.
pub const RTC_START: u64 = 0x0901_0000;
/// The size of each AMBA device's register window.
pub const AMBA_SIZE: u64 = 0x1000;
/// The UART's SPI (INTID 33).
pub const UART_SPI: u32 = 1;
/// The RTC's SPI (INTID 34).
pub const RTC_SPI: u32 = 2;
/// The first virtio-mmio slot.
pub const VIRTIO_MMIO_START: u64 = 0x0a00_0000;
/// The distance between two virtio-mmio slots (one 16 KiB page each).
pub const VIRTIO_MMIO_STRIDE: u64 = 0x4000;
/// The register window of one virtio-mmio device.
pub const VIRTIO_MMIO_SIZE: u64 = 0x1000;
/// The SPI of virtio-mmio slot 0; slot i has `VIRTIO_SPI_BASE + i`.
pub const VIRTIO_SPI_BASE: u32 = 16;
/// The SPIs the GIC provides (INTIDs 32..32+SPIS).
pub const SPIS: u32 = 64;
/// Where the FDT may be, at most: one 2 MiB block at the top of RAM (the
/// kernel maps the blob with 2 MiB blocks; arm64 booting.rst).
pub const FDT_MAX_SIZE: u64 = 0x20_0000;
/// The alignment of the kernel's load base (arm64 booting.rst).
pub const KERNEL_ALIGN: u64 = 0x20_0000;

/// The guest RAM of `mem_bytes` bytes: one region at [`RAM_START`].
pub fn ram_regions(mem_bytes: u64) -> Vec<(GuestAddress, usize)> {
    vec![(GuestAddress(RAM_START), mem_bytes as usize)]
}

/// Address and SPI of virtio-mmio slot `index`, or `None` past the last SPI.
pub fn mmio_slot(index: usize) -> Option<(u64, u32)> {
    let i = u32::try_from(index).ok()?;
    let spi = VIRTIO_SPI_BASE.checked_add(i).filter(|s| *s < SPIS)?;
    Some((VIRTIO_MMIO_START + u64::from(i) * VIRTIO_MMIO_STRIDE, spi))
}

/// The GICv3 the VM gets: distributor, redistributors and SPIs above.
pub fn gic() -> GicConfig {
    GicConfig {
        distributor: GICD_START,
        redistributors: GICR_START,
        spis: SPIS,
    }
}

/// The distributor's and the redistributors' windows for `vcpus` vCPUs.
pub fn gic_regions(vcpus: u32) -> [(u64, u64); 2] {
    [
        (GICD_START, GICD_SIZE),
        (GICR_START, u64::from(vcpus) * GICR_SIZE_PER_CPU),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    const HVF_PAGE: u64 = 0x4000;

    #[test]
    fn every_window_is_16k_aligned_and_none_overlap() {
        let mut windows = vec![
            gic_regions(MAX_VCPUS)[0],
            gic_regions(MAX_VCPUS)[1],
            (UART_START, AMBA_SIZE),
            (RTC_START, AMBA_SIZE),
        ];
        let mut i = 0;
        while let Some((addr, _)) = mmio_slot(i) {
            windows.push((addr, VIRTIO_MMIO_SIZE));
            i += 1;
        }
        assert_eq!(i as u32, SPIS - VIRTIO_SPI_BASE, "one slot per free SPI");
        windows.sort();
        for w in windows.windows(2) {
            assert!(w[0].0 + w[0].1 <= w[1].0, "{w:x?} overlap");
        }
        for (addr, _) in &windows {
            assert_eq!(addr % HVF_PAGE, 0, "{addr:#x}");
        }
        assert!(windows.last().map(|(a, s)| a + s).unwrap() <= RAM_START);
        assert_eq!(RAM_START % HVF_PAGE, 0);
    }

    #[test]
    fn the_redistributors_of_the_most_vcpus_end_below_the_uart() {
        let [_, (base, size)] = gic_regions(MAX_VCPUS);
        assert!(base + size <= UART_START);
        const { assert!(MAX_VCPUS >= 8) };
    }

    #[test]
    fn virtio_slots_get_distinct_spis_that_leave_the_uart_and_rtc_alone() {
        assert_eq!(mmio_slot(0), Some((VIRTIO_MMIO_START, VIRTIO_SPI_BASE)));
        assert_eq!(
            mmio_slot(1),
            Some((VIRTIO_MMIO_START + VIRTIO_MMIO_STRIDE, VIRTIO_SPI_BASE + 1))
        );
        assert_eq!(mmio_slot((SPIS - VIRTIO_SPI_BASE) as usize), None);
        assert_eq!(mmio_slot(usize::MAX), None);
        assert!(VIRTIO_SPI_BASE > UART_SPI.max(RTC_SPI));
    }
}
