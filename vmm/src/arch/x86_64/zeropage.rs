//! The zero page: Linux's `struct boot_params` at [`ZERO_PAGE_START`], with
//! the setup header (copied from a bzImage, else built) and the e820 map.
//!
//! The e820 map follows Firecracker's (without its ACPI and PCI ranges,
//! which boxdesk does not have): [0, 0x9fc00) RAM, [0x9fc00, 0xa0000)
//! reserved for the MP table, [1 MiB, top of low RAM) RAM, and [4 GiB, …)
//! RAM when the guest has memory above the hole. [0xa0000, 1 MiB) is left
//! out, as on a PC (VGA, option ROMs, BIOS).

use linux_loader::loader::bootparam::{boot_e820_entry, boot_params};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use super::layout::{
    in_memory, CMDLINE_START, HIMEM_START, MPTABLE_RESERVED_END, MPTABLE_START, ZERO_PAGE_START,
};
use super::loader::LoadedKernel;
use super::ArchError;

/// e820 type: usable RAM.
pub const E820_RAM: u32 = 1;
/// e820 type: reserved.
pub const E820_RESERVED: u32 = 2;

/// `boot_flag`: the 0xaa55 boot-sector signature.
pub const KERNEL_BOOT_FLAG_MAGIC: u16 = 0xaa55;
/// `header`: "HdrS".
pub const KERNEL_HDR_MAGIC: u32 = 0x5372_6448;
/// `type_of_loader`: 0xff, a loader without an assigned id.
pub const KERNEL_LOADER_OTHER: u8 = 0xff;
/// `kernel_alignment` for an ELF kernel (a bzImage keeps its own).
pub const KERNEL_MIN_ALIGNMENT_BYTES: u32 = 0x100_0000;

/// One e820 range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct E820Entry {
    /// Start address.
    pub addr: u64,
    /// Length in bytes.
    pub size: u64,
    /// [`E820_RAM`] or [`E820_RESERVED`].
    pub kind: u32,
}

/// The e820 map for guest RAM `regions` (as from
/// [`ram_regions`](super::layout::ram_regions)): the first must start at 0
/// and reach past 1 MiB.
pub fn e820_map(regions: &[(GuestAddress, usize)]) -> Vec<E820Entry> {
    let mut map = vec![
        E820Entry {
            addr: 0,
            size: MPTABLE_START,
            kind: E820_RAM,
        },
        E820Entry {
            addr: MPTABLE_START,
            size: MPTABLE_RESERVED_END - MPTABLE_START,
            kind: E820_RESERVED,
        },
    ];
    for &(start, size) in regions {
        let (start, end) = (start.0, start.0 + size as u64);
        let start = start.max(HIMEM_START);
        if end > start {
            map.push(E820Entry {
                addr: start,
                size: end - start,
                kind: E820_RAM,
            });
        }
    }
    map
}

/// Writes the zero page for `kernel`: setup header, command line pointer
/// and size (`cmdline_len` bytes, NUL included, at [`CMDLINE_START`]), the
/// initrd, and the e820 map of `regions`.
pub fn write_zero_page(
    mem: &GuestMemoryMmap,
    kernel: &LoadedKernel,
    cmdline_len: usize,
    initrd: Option<(GuestAddress, usize)>,
    regions: &[(GuestAddress, usize)],
) -> Result<(), ArchError> {
    let mut params = boot_params::default();
    match kernel.setup_header {
        Some(hdr) => params.hdr = hdr,
        None => params.hdr.kernel_alignment = KERNEL_MIN_ALIGNMENT_BYTES,
    }
    params.hdr.type_of_loader = KERNEL_LOADER_OTHER;
    params.hdr.boot_flag = KERNEL_BOOT_FLAG_MAGIC;
    params.hdr.header = KERNEL_HDR_MAGIC;
    params.hdr.cmd_line_ptr = CMDLINE_START as u32;
    params.hdr.cmdline_size = cmdline_len as u32;
    if let Some((addr, size)) = initrd {
        let below_4g = u32::try_from(addr.0)
            .ok()
            .zip(u32::try_from(size).ok())
            .filter(|(a, s)| a.checked_add(*s).is_some());
        let Some((image, len)) = below_4g else {
            return Err(ArchError::GuestMemory {
                what: "initrd (it must lie below 4 GiB)",
                addr: addr.0,
                len: size,
            });
        };
        params.hdr.ramdisk_image = image;
        params.hdr.ramdisk_size = len;
    }
    let map = e820_map(regions);
    if map.len() > params.e820_table.len() {
        return Err(ArchError::GuestMemory {
            what: "e820 map",
            addr: ZERO_PAGE_START,
            len: map.len(),
        });
    }
    for (slot, e) in params.e820_table.iter_mut().zip(&map) {
        *slot = boot_e820_entry {
            addr: e.addr,
            size: e.size,
            type_: e.kind,
        };
    }
    params.e820_entries = map.len() as u8;

    let len = std::mem::size_of::<boot_params>();
    let no_room = ArchError::GuestMemory {
        what: "zero page",
        addr: ZERO_PAGE_START,
        len,
    };
    if !in_memory(mem, ZERO_PAGE_START, len) {
        return Err(no_room);
    }
    mem.write_obj(params, GuestAddress(ZERO_PAGE_START))
        .map_err(|_| no_room)
}

#[cfg(test)]
mod tests {
    use super::super::layout::{ram_regions, FIRST_ADDR_PAST_32BITS, MMIO_HOLE_START};
    use super::*;

    #[test]
    fn e820_map_of_a_small_guest_has_low_ram_reserved_mp_table_and_high_ram() {
        let map = e820_map(&ram_regions(128 << 20));
        assert_eq!(
            map,
            vec![
                E820Entry {
                    addr: 0,
                    size: 0x9_fc00,
                    kind: E820_RAM
                },
                E820Entry {
                    addr: 0x9_fc00,
                    size: 0x400,
                    kind: E820_RESERVED
                },
                E820Entry {
                    addr: 0x10_0000,
                    size: (128 << 20) - 0x10_0000,
                    kind: E820_RAM
                },
            ]
        );
    }

    #[test]
    fn e820_map_of_a_guest_spanning_the_hole_adds_ram_at_4_gib() {
        let map = e820_map(&ram_regions(4 << 30));
        assert_eq!(map.len(), 4);
        assert_eq!(map[2].addr + map[2].size, MMIO_HOLE_START);
        assert_eq!(
            map[3],
            E820Entry {
                addr: FIRST_ADDR_PAST_32BITS,
                size: (4 << 30) - MMIO_HOLE_START,
                kind: E820_RAM
            }
        );
    }
}
