//! The Intel MultiProcessor Specification 1.4 table, which tells a kernel
//! without ACPI its CPUs, the IOAPIC and how ISA IRQs reach it.
//!
//! Layout at [`MPTABLE_START`]: the 16-byte floating pointer, then the
//! configuration table — a 44-byte header and its entries in the order the
//! spec requires: one processor per vCPU (APIC id = vCPU id, the BSP flag on
//! 0), the ISA bus, the IOAPIC (id = `vcpus`, at [`IOAPIC_START`]), one
//! interrupt entry per IOAPIC pin 0–23 (ISA IRQ n → pin n, as KVM's default
//! GSI routing has it), and the local interrupts LINT0 = ExtINT,
//! LINT1 = NMI. Both parts carry checksums that make their bytes sum to 0.
//! Built as plain little-endian bytes: no `unsafe`.

use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use super::layout::{in_memory, APIC_START, IOAPIC_START, IRQ_MAX, MAX_VCPUS, MPTABLE_START};
use super::ArchError;

const FLOATING_POINTER_LEN: usize = 16;
const HEADER_LEN: usize = 44;
const PROCESSOR_LEN: usize = 20;
const ENTRY_LEN: usize = 8;

const MP_PROCESSOR: u8 = 0;
const MP_BUS: u8 = 1;
const MP_IOAPIC: u8 = 2;
const MP_INTSRC: u8 = 3;
const MP_LINTSRC: u8 = 4;

const MP_IRQ_INT: u8 = 0;
const MP_IRQ_NMI: u8 = 1;
const MP_IRQ_EXTINT: u8 = 3;
/// Polarity and trigger "conforming to the bus".
const MP_IRQFLAG_DEFAULT: u16 = 0;

const CPU_ENABLED: u8 = 1;
const CPU_BOOTPROCESSOR: u8 = 2;
const APIC_VERSION: u8 = 0x14;
/// CPU signature: family 6.
const CPU_SIGNATURE: u32 = 0x600;
const CPU_FEATURE_FPU: u32 = 1 << 0;
const CPU_FEATURE_APIC: u32 = 1 << 9;
const IOAPIC_USABLE: u8 = 1;
const SPEC_REV: u8 = 4;

/// Bytes the whole MP table takes for `vcpus` vCPUs.
pub fn mptable_size(vcpus: u8) -> usize {
    FLOATING_POINTER_LEN
        + HEADER_LEN
        + PROCESSOR_LEN * usize::from(vcpus)
        + ENTRY_LEN // bus
        + ENTRY_LEN // ioapic
        + ENTRY_LEN * (IRQ_MAX as usize + 1)
        + ENTRY_LEN * 2 // lint0, lint1
}

/// Writes the MP table for `vcpus` (1..=254) vCPUs at [`MPTABLE_START`].
pub fn setup_mptable(mem: &GuestMemoryMmap, vcpus: u8) -> Result<(), ArchError> {
    if vcpus == 0 || u32::from(vcpus) > MAX_VCPUS {
        return Err(ArchError::VcpuCount {
            id: 0,
            vcpus: vcpus.into(),
            max: MAX_VCPUS,
        });
    }
    let bytes = build(vcpus);
    let no_room = ArchError::GuestMemory {
        what: "MP table",
        addr: MPTABLE_START,
        len: bytes.len(),
    };
    if !in_memory(mem, MPTABLE_START, bytes.len()) {
        return Err(no_room);
    }
    mem.write_slice(&bytes, GuestAddress(MPTABLE_START))
        .map_err(|_| no_room)
}

fn checksum(bytes: &[u8]) -> u8 {
    bytes
        .iter()
        .fold(0u8, |s, &b| s.wrapping_add(b))
        .wrapping_neg()
}

/// The MP table's bytes, floating pointer first.
fn build(vcpus: u8) -> Vec<u8> {
    let ioapic_id = vcpus;
    let mut table = Vec::with_capacity(mptable_size(vcpus));
    let mut entries: u16 = 0;

    // Configuration table header; length, count and checksum filled below.
    table.extend_from_slice(b"PCMP");
    table.extend_from_slice(&0u16.to_le_bytes()); // base table length
    table.push(SPEC_REV);
    table.push(0); // checksum
    table.extend_from_slice(b"BOXDESK ");
    table.extend_from_slice(b"MICROVM     ");
    table.extend_from_slice(&0u32.to_le_bytes()); // OEM table pointer
    table.extend_from_slice(&0u16.to_le_bytes()); // OEM table size
    table.extend_from_slice(&0u16.to_le_bytes()); // entry count
    table.extend_from_slice(&(APIC_START as u32).to_le_bytes());
    table.extend_from_slice(&0u32.to_le_bytes()); // extended length + checksum, reserved

    for id in 0..vcpus {
        let flags = CPU_ENABLED | if id == 0 { CPU_BOOTPROCESSOR } else { 0 };
        table.extend_from_slice(&[MP_PROCESSOR, id, APIC_VERSION, flags]);
        table.extend_from_slice(&CPU_SIGNATURE.to_le_bytes());
        table.extend_from_slice(&(CPU_FEATURE_APIC | CPU_FEATURE_FPU).to_le_bytes());
        table.extend_from_slice(&[0; 8]);
        entries += 1;
    }
    table.extend_from_slice(&[MP_BUS, 0]);
    table.extend_from_slice(b"ISA   ");
    table.extend_from_slice(&[MP_IOAPIC, ioapic_id, APIC_VERSION, IOAPIC_USABLE]);
    table.extend_from_slice(&(IOAPIC_START as u32).to_le_bytes());
    entries += 2;
    for irq in 0..=IRQ_MAX as u8 {
        table.extend_from_slice(&[MP_INTSRC, MP_IRQ_INT]);
        table.extend_from_slice(&MP_IRQFLAG_DEFAULT.to_le_bytes());
        table.extend_from_slice(&[0, irq, ioapic_id, irq]); // bus, bus irq, ioapic, pin
        entries += 1;
    }
    // LINT0 of the BSP is wired to the PIC (ExtINT), LINT1 of all to NMI.
    for (kind, dest_apic, lint) in [(MP_IRQ_EXTINT, 0, 0), (MP_IRQ_NMI, 0xff, 1)] {
        table.extend_from_slice(&[MP_LINTSRC, kind]);
        table.extend_from_slice(&MP_IRQFLAG_DEFAULT.to_le_bytes());
        table.extend_from_slice(&[0, 0, dest_apic, lint]);
        entries += 1;
    }

    let len = table.len() as u16;
    table[4..6].copy_from_slice(&len.to_le_bytes());
    table[34..36].copy_from_slice(&entries.to_le_bytes());
    table[7] = checksum(&table);

    let mut out = Vec::with_capacity(FLOATING_POINTER_LEN + table.len());
    out.extend_from_slice(b"_MP_");
    out.extend_from_slice(&((MPTABLE_START + FLOATING_POINTER_LEN as u64) as u32).to_le_bytes());
    out.extend_from_slice(&[1, SPEC_REV, 0, 0, 0, 0, 0, 0]); // length in 16 bytes, rev, checksum, features
    out[10] = checksum(&out);
    out.extend_from_slice(&table);
    out
}

#[cfg(test)]
mod tests {
    use super::super::layout::ram_regions;
    use super::*;

    fn sum(bytes: &[u8]) -> u8 {
        bytes.iter().fold(0u8, |s, &b| s.wrapping_add(b))
    }

    /// Reads the table back: (floating pointer, configuration table).
    fn read_back(mem: &GuestMemoryMmap) -> (Vec<u8>, Vec<u8>) {
        let mut fp = vec![0u8; 16];
        mem.read_slice(&mut fp, GuestAddress(MPTABLE_START))
            .unwrap();
        let addr = u32::from_le_bytes(fp[4..8].try_into().unwrap());
        let mut header = vec![0u8; HEADER_LEN];
        mem.read_slice(&mut header, GuestAddress(addr.into()))
            .unwrap();
        let len = u16::from_le_bytes([header[4], header[5]]);
        let mut table = vec![0u8; len.into()];
        mem.read_slice(&mut table, GuestAddress(addr.into()))
            .unwrap();
        (fp, table)
    }

    /// Entry types in table order.
    fn entry_types(table: &[u8]) -> Vec<u8> {
        let mut types = Vec::new();
        let mut off = HEADER_LEN;
        while off < table.len() {
            let kind = table[off];
            types.push(kind);
            off += if kind == MP_PROCESSOR {
                PROCESSOR_LEN
            } else {
                ENTRY_LEN
            };
        }
        assert_eq!(off, table.len());
        types
    }

    fn memory() -> GuestMemoryMmap {
        GuestMemoryMmap::from_ranges(&ram_regions(2 << 20)).unwrap()
    }

    #[test]
    fn mp_table_checksums_are_valid() {
        let mem = memory();
        for vcpus in [1, 2, 7, 254] {
            setup_mptable(&mem, vcpus).unwrap();
            let (fp, table) = read_back(&mem);
            assert_eq!(&fp[..4], b"_MP_");
            assert_eq!(sum(&fp), 0, "floating pointer checksum, {vcpus} vcpus");
            assert_eq!(&table[..4], b"PCMP");
            assert_eq!(sum(&table), 0, "table checksum, {vcpus} vcpus");
            assert_eq!(table.len() + 16, mptable_size(vcpus));
        }
    }

    #[test]
    fn mp_table_has_one_processor_per_vcpu_with_the_bsp_flag_on_0() {
        let mem = memory();
        setup_mptable(&mem, 4).unwrap();
        let (_, table) = read_back(&mem);
        let types = entry_types(&table);
        assert_eq!(types.iter().filter(|&&t| t == MP_PROCESSOR).count(), 4);
        assert_eq!(
            u16::from_le_bytes([table[34], table[35]]) as usize,
            types.len(),
            "entry count"
        );
        for id in 0..4u8 {
            let cpu = &table[HEADER_LEN + PROCESSOR_LEN * usize::from(id)..];
            assert_eq!(cpu[1], id, "apic id");
            let bsp = cpu[3] & CPU_BOOTPROCESSOR != 0;
            assert_eq!(bsp, id == 0);
            assert_ne!(cpu[3] & CPU_ENABLED, 0);
        }
    }

    #[test]
    fn mp_table_lists_isa_bus_ioapic_24_irqs_and_two_local_interrupts_in_order() {
        let mem = memory();
        setup_mptable(&mem, 2).unwrap();
        let (_, table) = read_back(&mem);
        let mut expected = vec![MP_PROCESSOR; 2];
        expected.extend([MP_BUS, MP_IOAPIC]);
        expected.extend([MP_INTSRC; 24]);
        expected.extend([MP_LINTSRC; 2]);
        assert_eq!(entry_types(&table), expected);
        let bus = HEADER_LEN + 2 * PROCESSOR_LEN;
        assert_eq!(&table[bus + 2..bus + 8], b"ISA   ");
        let ioapic = &table[bus + 8..bus + 16];
        assert_eq!(ioapic[1], 2, "ioapic id = vcpus");
        assert_eq!(
            u32::from_le_bytes(ioapic[4..8].try_into().unwrap()),
            0xfec0_0000
        );
        let irq5 = &table[bus + 16 + 5 * 8..][..8];
        assert_eq!((irq5[1], irq5[5], irq5[6], irq5[7]), (MP_IRQ_INT, 5, 2, 5));
        let lint = &table[table.len() - 16..];
        assert_eq!((lint[1], lint[7]), (MP_IRQ_EXTINT, 0));
        assert_eq!((lint[9], lint[15]), (MP_IRQ_NMI, 1));
    }

    #[test]
    fn mp_table_refuses_zero_or_too_many_vcpus_and_missing_memory() {
        let mem = memory();
        assert!(matches!(
            setup_mptable(&mem, 0),
            Err(ArchError::VcpuCount { .. })
        ));
        assert!(matches!(
            setup_mptable(&mem, 255),
            Err(ArchError::VcpuCount { .. })
        ));
        let small = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 0x9_f000)]).unwrap();
        assert!(matches!(
            setup_mptable(&small, 1),
            Err(ArchError::GuestMemory { .. })
        ));
    }
}
