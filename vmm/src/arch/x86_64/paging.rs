//! Identity page tables for the first 1 GiB, which the 64-bit boot protocol
//! needs: a PML4 at [`PML4_START`] whose first entry points to the PDPT at
//! [`PDPTE_START`], whose first entry points to the page directory at
//! [`PDE_START`] of 512 present, writable 2 MiB pages. Each table page is
//! zeroed first, so stale entries cannot survive a reboot.

use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use super::layout::{in_memory, PDE_START, PDPTE_START, PML4_START};
use super::ArchError;

/// Present + writable.
const TABLE_FLAGS: u64 = 0x3;
/// Present + writable + page size (2 MiB).
const LARGE_PAGE_FLAGS: u64 = 0x83;
const PAGE: usize = 4096;

/// Writes the boot page tables; returns the value for CR3.
pub fn write_identity_tables(mem: &GuestMemoryMmap) -> Result<u64, ArchError> {
    let mut pml4 = vec![0u8; PAGE];
    pml4[..8].copy_from_slice(&(PDPTE_START | TABLE_FLAGS).to_le_bytes());
    let mut pdpt = vec![0u8; PAGE];
    pdpt[..8].copy_from_slice(&(PDE_START | TABLE_FLAGS).to_le_bytes());
    let mut pd = vec![0u8; PAGE];
    for (i, entry) in pd.chunks_exact_mut(8).enumerate() {
        entry.copy_from_slice(&(((i as u64) << 21) | LARGE_PAGE_FLAGS).to_le_bytes());
    }
    for (what, addr, table) in [
        ("PML4", PML4_START, &pml4),
        ("PDPT", PDPTE_START, &pdpt),
        ("page directory", PDE_START, &pd),
    ] {
        let no_room = ArchError::GuestMemory {
            what,
            addr,
            len: PAGE,
        };
        if !in_memory(mem, addr, PAGE) {
            return Err(no_room);
        }
        mem.write_slice(table, GuestAddress(addr))
            .map_err(|_| no_room)?;
    }
    Ok(PML4_START)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Walks the tables for `va` like the MMU: the physical address, or None.
    fn translate(mem: &GuestMemoryMmap, cr3: u64, va: u64) -> Option<u64> {
        let entry = |table: u64, index: u64| -> u64 {
            mem.read_obj(GuestAddress((table & !0xfff) + index * 8))
                .unwrap()
        };
        let pml4e = entry(cr3, (va >> 39) & 0x1ff);
        if pml4e & 1 == 0 {
            return None;
        }
        let pdpte = entry(pml4e & 0x000f_ffff_ffff_f000, (va >> 30) & 0x1ff);
        if pdpte & 1 == 0 {
            return None;
        }
        let pde = entry(pdpte & 0x000f_ffff_ffff_f000, (va >> 21) & 0x1ff);
        if pde & 1 == 0 || pde & 0x80 == 0 {
            return None;
        }
        Some((pde & 0x000f_ffff_ffe0_0000) | (va & 0x1f_ffff))
    }

    #[test]
    fn page_tables_map_the_first_gib_identity_with_2_mib_pages() {
        let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 0x10_0000)]).unwrap();
        // Stale data must not survive.
        mem.write_obj(0xdead_beefu64, GuestAddress(PML4_START + 8))
            .unwrap();
        let cr3 = write_identity_tables(&mem).unwrap();
        assert_eq!(cr3, 0x9000);
        assert_eq!(
            mem.read_obj::<u64>(GuestAddress(PML4_START)).unwrap(),
            0xa003
        );
        assert_eq!(
            mem.read_obj::<u64>(GuestAddress(PDPTE_START)).unwrap(),
            0xb003
        );
        for i in 0..512u64 {
            let pde: u64 = mem.read_obj(GuestAddress(PDE_START + 8 * i)).unwrap();
            assert_eq!(pde, (i << 21) | 0x83);
        }
        for va in [0, 0x7000, 0x10_0000, 0x123_4567, (1 << 30) - 1] {
            assert_eq!(translate(&mem, cr3, va), Some(va), "{va:#x}");
        }
        assert_eq!(translate(&mem, cr3, 1 << 30), None);
        assert_eq!(translate(&mem, cr3, 1 << 39), None);
    }

    #[test]
    fn page_tables_without_memory_are_an_error() {
        let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 0xa000)]).unwrap();
        assert!(matches!(
            write_identity_tables(&mem),
            Err(ArchError::GuestMemory { what: "PDPT", .. })
        ));
    }
}
