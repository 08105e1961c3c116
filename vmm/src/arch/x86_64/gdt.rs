//! The boot GDT and IDT, and the segment registers they imply.
//!
//! Four 8-byte descriptors at [`GDT_START`]: null, a 64-bit code segment
//! (selector 0x08, flags 0xa09b), a flat data segment (0x10, 0xc093) and a
//! TSS (0x18, 0x808b) — what Linux expects on its 64-bit entry. The IDT at
//! [`IDT_START`] is one zero entry with limit 7; the kernel loads its own
//! before enabling interrupts. Segment limits are handed to the hypervisor
//! already scaled by the granularity bit (0xfffff pages → 0xffff_ffff).

use boxdesk_hv::arch::x86_64::{DescriptorTable, Segment};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use super::layout::{in_memory, GDT_START, IDT_START};
use super::ArchError;

/// Selector of the 64-bit code segment.
pub const CODE_SELECTOR: u16 = 0x08;
/// Selector of the data segment.
pub const DATA_SELECTOR: u16 = 0x10;
/// Selector of the TSS.
pub const TSS_SELECTOR: u16 = 0x18;

/// A GDT descriptor from the kernel's `GDT_ENTRY(flags, base, limit)`:
/// `flags` holds the access byte (bits 0–7) and the G/DB/L/AVL nibble
/// (bits 12–15).
pub const fn gdt_entry(flags: u16, base: u32, limit: u32) -> u64 {
    let (flags, base, limit) = (flags as u64, base as u64, limit as u64);
    ((base & 0xff00_0000) << 32)
        | ((flags & 0xf0ff) << 40)
        | ((limit & 0x000f_0000) << 32)
        | ((base & 0x00ff_ffff) << 16)
        | (limit & 0xffff)
}

/// The boot GDT: null, code64, data, TSS.
pub const BOOT_GDT: [u64; 4] = [
    gdt_entry(0, 0, 0),
    gdt_entry(0xa09b, 0, 0xfffff),
    gdt_entry(0xc093, 0, 0xfffff),
    gdt_entry(0x808b, 0, 0xfffff),
];

/// The segment register contents descriptor `entry` loads with `selector`.
pub fn segment_from_entry(entry: u64, selector: u16) -> Segment {
    let bit = |n: u32| (entry >> n) & 1 == 1;
    let raw_limit = ((entry >> 32) & 0x000f_0000) as u32 | (entry & 0xffff) as u32;
    let g = bit(55);
    let present = bit(47);
    Segment {
        base: ((entry >> 32) & 0xff00_0000) | ((entry >> 16) & 0x00ff_ffff),
        limit: if g {
            (raw_limit << 12) | 0xfff
        } else {
            raw_limit
        },
        selector,
        type_: ((entry >> 40) & 0xf) as u8,
        present,
        dpl: ((entry >> 45) & 3) as u8,
        db: bit(54),
        s: bit(44),
        l: bit(53),
        g,
        avl: bit(52),
        unusable: !present,
    }
}

/// What [`write_gdt`] set up, for the special registers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BootSegments {
    /// CS.
    pub code: Segment,
    /// DS, ES, FS, GS, SS.
    pub data: Segment,
    /// TR.
    pub tss: Segment,
    /// GDTR.
    pub gdt: DescriptorTable,
    /// IDTR.
    pub idt: DescriptorTable,
}

/// Writes the boot GDT at [`GDT_START`] and an empty IDT at [`IDT_START`].
pub fn write_gdt(mem: &GuestMemoryMmap) -> Result<BootSegments, ArchError> {
    let mut bytes = Vec::with_capacity(BOOT_GDT.len() * 8);
    for entry in BOOT_GDT {
        bytes.extend_from_slice(&entry.to_le_bytes());
    }
    let no_room = |what, addr, len| ArchError::GuestMemory { what, addr, len };
    if !in_memory(mem, GDT_START, bytes.len()) {
        return Err(no_room("GDT", GDT_START, bytes.len()));
    }
    mem.write_slice(&bytes, GuestAddress(GDT_START))
        .map_err(|_| no_room("GDT", GDT_START, bytes.len()))?;
    if !in_memory(mem, IDT_START, 8) {
        return Err(no_room("IDT", IDT_START, 8));
    }
    mem.write_obj(0u64, GuestAddress(IDT_START))
        .map_err(|_| no_room("IDT", IDT_START, 8))?;
    Ok(BootSegments {
        code: segment_from_entry(BOOT_GDT[1], CODE_SELECTOR),
        data: segment_from_entry(BOOT_GDT[2], DATA_SELECTOR),
        tss: segment_from_entry(BOOT_GDT[3], TSS_SELECTOR),
        gdt: DescriptorTable {
            base: GDT_START,
            limit: (bytes.len() - 1) as u16,
        },
        idt: DescriptorTable {
            base: IDT_START,
            limit: 7,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn memory() -> GuestMemoryMmap {
        GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 0x1_0000)]).unwrap()
    }

    #[test]
    fn gdt_entries_have_the_kernel_encoding() {
        assert_eq!(
            BOOT_GDT,
            [
                0,
                0x00af_9b00_0000_ffff,
                0x00cf_9300_0000_ffff,
                0x008f_8b00_0000_ffff
            ]
        );
    }

    #[test]
    fn gdt_entries_read_back_decode_to_the_expected_segments() {
        let mem = memory();
        let segs = write_gdt(&mem).unwrap();
        let read = |i: u64| -> u64 { mem.read_obj(GuestAddress(GDT_START + 8 * i)).unwrap() };
        assert_eq!(read(0), 0);

        let code = segment_from_entry(read(1), CODE_SELECTOR);
        assert_eq!(code, segs.code);
        assert_eq!(
            code,
            Segment {
                base: 0,
                limit: 0xffff_ffff,
                selector: 0x08,
                type_: 0xb,
                present: true,
                dpl: 0,
                db: false,
                s: true,
                l: true,
                g: true,
                avl: false,
                unusable: false,
            }
        );
        let data = segment_from_entry(read(2), DATA_SELECTOR);
        assert_eq!(data, segs.data);
        assert_eq!(
            (data.type_, data.db, data.l, data.s, data.g),
            (0x3, true, false, true, true)
        );
        assert_eq!(
            (data.selector, data.limit, data.base),
            (0x10, 0xffff_ffff, 0)
        );
        let tss = segment_from_entry(read(3), TSS_SELECTOR);
        assert_eq!(tss, segs.tss);
        assert_eq!(
            (tss.type_, tss.s, tss.present, tss.selector),
            (0xb, false, true, 0x18)
        );

        assert_eq!(
            segs.gdt,
            DescriptorTable {
                base: 0x500,
                limit: 31
            }
        );
        assert_eq!(
            segs.idt,
            DescriptorTable {
                base: 0x520,
                limit: 7
            }
        );
        assert_eq!(mem.read_obj::<u64>(GuestAddress(IDT_START)).unwrap(), 0);
    }

    #[test]
    fn segment_decoding_handles_base_and_byte_granular_limits() {
        let seg = segment_from_entry(gdt_entry(0x0093, 0x1234_5678, 0xabcde), 0x20);
        assert_eq!(seg.base, 0x1234_5678);
        assert_eq!(seg.limit, 0xabcde);
        assert!(!seg.g);
        assert!(segment_from_entry(0, 0).unusable);
    }

    #[test]
    fn gdt_without_memory_is_an_error() {
        let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0x1_0000), 0x1000)]).unwrap();
        assert!(matches!(
            write_gdt(&mem),
            Err(ArchError::GuestMemory { .. })
        ));
    }
}
