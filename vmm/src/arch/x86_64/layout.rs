//! Where everything lives in an x86_64 guest's physical address space.
//!
//! RAM starts at 0. The 32-bit MMIO hole [`MMIO_HOLE_START`, 4 GiB) holds the
//! virtio-mmio slots, the IOAPIC, the local APICs and KVM's TSS; RAM that
//! would fall in it continues at 4 GiB instead. The boot structures below
//! 1 MiB (GDT, IDT, zero page, boot stack, page tables, command line, MP
//! table) are the Linux 64-bit boot protocol's, at the addresses Firecracker
//! uses; the kernel is loaded at 1 MiB.
//!
//! ```text
//! 0x0000_0500  GDT (4 entries)          0x0000_9000  PML4
//! 0x0000_0520  IDT (empty)              0x0000_a000  PDPT
//! 0x0000_7000  zero page (boot_params)  0x0000_b000  PD (2 MiB pages, 0..1 GiB)
//! 0x0000_8ff0  boot stack top           0x0002_0000  command line (4 KiB)
//! 0x0009_fc00  MP table (reserved)      0x0010_0000  kernel
//! 0xd000_0000  virtio-mmio slots        0xfec0_0000  IOAPIC, 0xfee0_0000 LAPIC
//! 0x1_0000_0000  RAM above the hole
//! ```

use vm_memory::{GuestAddress, GuestMemory, GuestMemoryMmap, GuestMemoryRegion};

/// GDT: null, 64-bit code, data, TSS (8 bytes each).
pub const GDT_START: u64 = 0x500;
/// IDT: one zero entry; the kernel installs its own before enabling
/// interrupts.
pub const IDT_START: u64 = 0x520;
/// The zero page (`struct boot_params`); RSI points here at entry.
pub const ZERO_PAGE_START: u64 = 0x7000;
/// Initial RSP/RBP of the boot vCPU (the stack grows down from here).
pub const BOOT_STACK_POINTER: u64 = 0x8ff0;
/// Page-map level 4 of the boot page tables (CR3).
pub const PML4_START: u64 = 0x9000;
/// The page-directory-pointer table the PML4's first entry points to.
pub const PDPTE_START: u64 = 0xa000;
/// The page directory: 512 × 2 MiB pages, identity-mapping 0..1 GiB.
pub const PDE_START: u64 = 0xb000;
/// Kernel command line (NUL-terminated).
pub const CMDLINE_START: u64 = 0x2_0000;
/// Largest command line, terminating NUL included.
pub const CMDLINE_MAX_SIZE: usize = 4096;
/// The MP floating pointer and configuration table (the last KiB of the
/// first 640 KiB, where Linux scans for it).
pub const MPTABLE_START: u64 = 0x9_fc00;
/// End of the range the e820 map reserves for the MP table. With many
/// vCPUs the table runs on into [0xa_0000, 1 MiB), which e820 does not list
/// as RAM either.
pub const MPTABLE_RESERVED_END: u64 = 0xa_0000;
/// Start of high memory: the kernel is loaded here.
pub const HIMEM_START: u64 = 0x10_0000;
/// Initrds end at or below this address: 896 MiB, below every Linux boot
/// protocol's `initrd_addr_max` (at least 0x37ff_ffff).
pub const INITRD_ADDR_LIMIT: u64 = 0x3800_0000;

/// Start of the 32-bit MMIO hole; nothing but devices between here and
/// 4 GiB.
pub const MMIO_HOLE_START: u64 = 0xd000_0000;
/// First address above 4 GiB, where RAM beyond the hole continues.
pub const FIRST_ADDR_PAST_32BITS: u64 = 1 << 32;
/// Size of the 32-bit MMIO hole.
pub const MMIO_HOLE_SIZE: u64 = FIRST_ADDR_PAST_32BITS - MMIO_HOLE_START;

/// First virtio-mmio slot (announced as `virtio_mmio.device=4K@ADDR:IRQ`).
pub const VIRTIO_MMIO_START: u64 = MMIO_HOLE_START;
/// Size of (and stride between) virtio-mmio slots.
pub const VIRTIO_MMIO_SIZE: u64 = 0x1000;
/// IRQ (IOAPIC GSI) of the first virtio-mmio slot; slot `n` has
/// `VIRTIO_MMIO_IRQ_BASE + n`. IRQs below are legacy ISA devices (4 is the
/// 8250 serial port, 1 the i8042).
pub const VIRTIO_MMIO_IRQ_BASE: u32 = 5;
/// Highest IRQ: the IOAPIC has 24 pins (0–23).
pub const IRQ_MAX: u32 = 23;
/// Number of virtio-mmio slots: one per IRQ from 5 to 23, i.e. 19.
pub const VIRTIO_MMIO_SLOTS: u32 = IRQ_MAX - VIRTIO_MMIO_IRQ_BASE + 1;

/// The IOAPIC's MMIO base.
pub const IOAPIC_START: u64 = 0xfec0_0000;
/// The local APICs' MMIO base.
pub const APIC_START: u64 = 0xfee0_0000;
/// KVM's three-page TSS for real-mode emulation (`VmConfig::tss_addr`).
pub const KVM_TSS_ADDR: u64 = 0xfffb_d000;

/// Most vCPUs: APIC ids 0..=253, the IOAPIC takes id `vcpus`, 255 is the
/// broadcast id.
pub const MAX_VCPUS: u32 = 254;

/// Guest-physical address and IRQ (IOAPIC GSI) of virtio-mmio slot
/// `index` (each [`VIRTIO_MMIO_SIZE`] bytes); `None` past the last slot.
pub fn mmio_slot(index: usize) -> Option<(u64, u32)> {
    let n = u32::try_from(index)
        .ok()
        .filter(|&n| n < VIRTIO_MMIO_SLOTS)?;
    Some((
        VIRTIO_MMIO_START + u64::from(n) * VIRTIO_MMIO_SIZE,
        VIRTIO_MMIO_IRQ_BASE + n,
    ))
}

/// The RAM regions (guest address, size) of a guest with `mem_bytes` of
/// RAM, rounded down to whole 4 KiB pages: [0, min(mem, hole)) and, for what
/// does not fit below the hole, [4 GiB, 4 GiB + rest). Empty for less than
/// one page.
pub fn ram_regions(mem_bytes: u64) -> Vec<(GuestAddress, usize)> {
    let mem = mem_bytes & !0xfff;
    let low = mem.min(MMIO_HOLE_START);
    let high = mem - low;
    let mut regions = Vec::with_capacity(2);
    if low > 0 {
        regions.push((GuestAddress(0), low as usize));
    }
    if high > 0 {
        regions.push((GuestAddress(FIRST_ADDR_PAST_32BITS), high as usize));
    }
    regions
}

/// End (exclusive) of the RAM region at guest address 0 in `mem`, capped at
/// the MMIO hole: the top of "low" RAM. 0 when nothing is mapped at 0.
pub fn low_ram_end(mem: &GuestMemoryMmap) -> u64 {
    mem.find_region(GuestAddress(0))
        .map_or(0, |r| r.len().min(MMIO_HOLE_START))
}

/// Whether `[addr, addr + len)` lies entirely in `mem`.
pub(super) fn in_memory(mem: &GuestMemoryMmap, addr: u64, len: usize) -> bool {
    len == 0 || mem.check_range(GuestAddress(addr), len)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;
    const GIB: u64 = 1 << 30;

    #[test]
    fn ram_regions_with_small_memory_is_one_region_at_zero() {
        assert_eq!(
            ram_regions(256 * MIB),
            vec![(GuestAddress(0), (256 * MIB) as usize)]
        );
    }

    #[test]
    fn ram_regions_rounds_down_to_pages_and_is_empty_below_one_page() {
        assert_eq!(
            ram_regions(64 * MIB + 123),
            vec![(GuestAddress(0), (64 * MIB) as usize)]
        );
        assert!(ram_regions(0).is_empty());
        assert!(ram_regions(4095).is_empty());
    }

    #[test]
    fn ram_regions_exactly_filling_low_memory_has_no_high_region() {
        assert_eq!(
            ram_regions(MMIO_HOLE_START),
            vec![(GuestAddress(0), MMIO_HOLE_START as usize)]
        );
    }

    #[test]
    fn ram_regions_spanning_the_hole_continue_at_4_gib() {
        let regions = ram_regions(4 * GIB);
        assert_eq!(
            regions,
            vec![
                (GuestAddress(0), MMIO_HOLE_START as usize),
                (GuestAddress(4 * GIB), MMIO_HOLE_SIZE as usize),
            ]
        );
        let total: usize = regions.iter().map(|r| r.1).sum();
        assert_eq!(total as u64, 4 * GIB);
    }

    #[test]
    fn low_ram_end_is_capped_at_the_hole() {
        let mem = GuestMemoryMmap::from_ranges(&ram_regions(4 * GIB)).unwrap();
        assert_eq!(low_ram_end(&mem), MMIO_HOLE_START);
        let mem = GuestMemoryMmap::from_ranges(&ram_regions(32 * MIB)).unwrap();
        assert_eq!(low_ram_end(&mem), 32 * MIB);
    }

    #[test]
    fn virtio_mmio_slots_start_in_the_hole_with_irq_5() {
        assert_eq!(VIRTIO_MMIO_SLOTS, 19);
        assert_eq!(mmio_slot(0), Some((0xd000_0000, 5)));
        assert_eq!(mmio_slot(18), Some((0xd001_2000, 23)));
        assert_eq!(mmio_slot(19), None);
        assert_eq!(mmio_slot(usize::MAX), None);
    }

    #[test]
    fn boot_structures_do_not_overlap() {
        let ranges = [
            (GDT_START, 32),
            (IDT_START, 8),
            (ZERO_PAGE_START, 4096),
            (BOOT_STACK_POINTER - 0x800, 0x800),
            (PML4_START, 4096),
            (PDPTE_START, 4096),
            (PDE_START, 4096),
            (CMDLINE_START, CMDLINE_MAX_SIZE as u64),
            (MPTABLE_START, MPTABLE_RESERVED_END - MPTABLE_START),
        ];
        for (i, a) in ranges.iter().enumerate() {
            assert!(a.0 + a.1 <= HIMEM_START);
            for b in &ranges[i + 1..] {
                assert!(
                    a.0 + a.1 <= b.0 || b.0 + b.1 <= a.0,
                    "{a:x?} overlaps {b:x?}"
                );
            }
        }
    }
}
