//! CPUID policy: the host's `KVM_GET_SUPPORTED_CPUID` turned into what one
//! vCPU of a `vcpus`-CPU guest should see.
//!
//! Topology: one package of `vcpus` single-threaded cores, APIC id = vCPU
//! id — in leaf 1, leaf 4 (Intel), leaves 0xb/0x1f (rebuilt with an SMT and
//! a core level) and AMD's 0x80000008/0x8000001d/0x8000001e. Features the
//! VMM cannot back are cleared: MONITOR/MWAIT and WAITPKG, VMX/SVM (no
//! nesting), thermal/power management (leaf 6 keeps only ARAT, so no
//! APERF/MPERF), debug store, and the PMU (leaf 0xa zero, PDCM and AMD's
//! core/NB/LLC counters off). The hypervisor bit and the TSC-deadline timer
//! (emulated by KVM's in-kernel LAPIC) are set. KVM's own leaves
//! (0x4000_0000..) are kept as KVM reports them.

use kvm_bindings::KVM_MAX_CPUID_ENTRIES;
use kvm_bindings::{kvm_cpuid_entry2, CpuId, KVM_CPUID_FLAG_SIGNIFCANT_INDEX};

use super::layout::MAX_VCPUS;
use super::ArchError;

/// The CPU vendor, from leaf 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Vendor {
    /// GenuineIntel.
    Intel,
    /// AuthenticAMD or HygonGenuine.
    Amd,
    /// Anything else: only vendor-neutral leaves are touched.
    Other,
}

/// The vendor leaf 0 of `entries` names.
pub fn vendor(entries: &[kvm_cpuid_entry2]) -> Vendor {
    let Some(leaf0) = entries.iter().find(|e| e.function == 0) else {
        return Vendor::Other;
    };
    let mut name = [0u8; 12];
    name[..4].copy_from_slice(&leaf0.ebx.to_le_bytes());
    name[4..8].copy_from_slice(&leaf0.edx.to_le_bytes());
    name[8..].copy_from_slice(&leaf0.ecx.to_le_bytes());
    match &name {
        b"GenuineIntel" => Vendor::Intel,
        b"AuthenticAMD" | b"HygonGenuine" => Vendor::Amd,
        _ => Vendor::Other,
    }
}

// Leaf 1 ECX.
const ECX_DTES64: u32 = 1 << 2;
const ECX_MONITOR: u32 = 1 << 3;
const ECX_DS_CPL: u32 = 1 << 4;
const ECX_VMX: u32 = 1 << 5;
const ECX_SMX: u32 = 1 << 6;
const ECX_EST: u32 = 1 << 7;
const ECX_TM2: u32 = 1 << 8;
const ECX_XTPR: u32 = 1 << 14;
const ECX_PDCM: u32 = 1 << 15;
/// TSC-deadline mode of the LAPIC timer.
pub const ECX_TSC_DEADLINE: u32 = 1 << 24;
/// "Running under a hypervisor".
pub const ECX_HYPERVISOR: u32 = 1 << 31;
// Leaf 1 EDX.
const EDX_DS: u32 = 1 << 21;
const EDX_ACPI: u32 = 1 << 22;
const EDX_HTT: u32 = 1 << 28;
const EDX_TM: u32 = 1 << 29;
const EDX_PBE: u32 = 1 << 31;
// Leaf 6 EAX: APIC timer always running.
const EAX_ARAT: u32 = 1 << 2;
// Leaf 7.0 ECX: UMONITOR/UMWAIT/TPAUSE.
const ECX_WAITPKG: u32 = 1 << 5;
// Leaf 7.0 EBX (Intel): FDP_EXCPTN_ONLY and deprecated FPU CS/DS.
const EBX_FDP_EXCPTN_ONLY: u32 = 1 << 6;
const EBX_ZERO_FCS_FDS: u32 = 1 << 13;
// Leaf 0x8000_0001 ECX (AMD).
const ECX_SVM: u32 = 1 << 2;
const ECX_PERFCTR_CORE: u32 = 1 << 23;
const ECX_PERFCTR_NB: u32 = 1 << 24;
const ECX_PERFCTR_LLC: u32 = 1 << 28;

/// Replaces bits `lo..=hi` of `reg` with `value` (clamped to the field).
fn set_field(reg: &mut u32, lo: u32, hi: u32, value: u32) {
    let width = hi - lo + 1;
    let max = if width == 32 {
        u32::MAX
    } else {
        (1 << width) - 1
    };
    *reg = (*reg & !(max << lo)) | (value.min(max) << lo);
}

/// Bits needed to number `n` things (0 for 1).
fn id_bits(n: u32) -> u32 {
    if n <= 1 {
        0
    } else {
        32 - (n - 1).leading_zeros()
    }
}

/// Turns the host's supported CPUID into vCPU `vcpu_id`'s of `vcpus`
/// (1..=254). Fails for an id/count out of range, or when the rebuilt
/// topology leaves do not fit the table.
pub fn normalize(cpuid: &mut CpuId, vcpu_id: u32, vcpus: u32) -> Result<(), ArchError> {
    if vcpus == 0 || vcpus > MAX_VCPUS || vcpu_id >= vcpus {
        return Err(ArchError::VcpuCount {
            id: vcpu_id,
            vcpus,
            max: MAX_VCPUS,
        });
    }
    let mut entries = cpuid.as_slice().to_vec();
    let vendor = vendor(&entries);
    for e in &mut entries {
        normalize_entry(e, vendor, vcpu_id, vcpus);
    }
    for leaf in [0xb, 0x1f] {
        if entries.iter().any(|e| e.function == leaf) {
            entries.retain(|e| e.function != leaf);
            entries.extend(topology_leaf(leaf, vcpu_id, vcpus));
        }
    }
    if entries.len() > KVM_MAX_CPUID_ENTRIES {
        // A rich host (or a nested one) can fill the table once the
        // topology leaves gain their subleaves: entries that say nothing
        // (all registers zero) are what a guest loses least by.
        entries.retain(|e| e.eax | e.ebx | e.ecx | e.edx != 0 || e.function & 0x7fff_ffff == 0);
    }
    let have = entries.len();
    *cpuid = CpuId::from_entries(&entries).map_err(|_| ArchError::CpuidFull { have })?;
    Ok(())
}

/// Leaf 0xb/0x1f: subleaf 0 = SMT level (1 thread), subleaf 1 = core level
/// (`vcpus` cores); later subleaves read as zero (invalid level).
fn topology_leaf(leaf: u32, apic_id: u32, vcpus: u32) -> [kvm_cpuid_entry2; 2] {
    let level = |index: u32, shift: u32, count: u32, kind: u32| kvm_cpuid_entry2 {
        function: leaf,
        index,
        flags: KVM_CPUID_FLAG_SIGNIFCANT_INDEX,
        eax: shift,
        ebx: count,
        ecx: (kind << 8) | index,
        edx: apic_id,
        ..Default::default()
    };
    [level(0, 0, 1, 1), level(1, id_bits(vcpus), vcpus, 2)]
}

fn normalize_entry(e: &mut kvm_cpuid_entry2, vendor: Vendor, apic_id: u32, vcpus: u32) {
    match e.function {
        0x1 => {
            set_field(&mut e.ebx, 8, 15, 8); // CLFLUSH line: 64 bytes
            set_field(&mut e.ebx, 16, 23, vcpus.next_power_of_two());
            set_field(&mut e.ebx, 24, 31, apic_id);
            e.ecx &= !(ECX_DTES64
                | ECX_MONITOR
                | ECX_DS_CPL
                | ECX_VMX
                | ECX_SMX
                | ECX_EST
                | ECX_TM2
                | ECX_XTPR
                | ECX_PDCM);
            e.ecx |= ECX_HYPERVISOR | ECX_TSC_DEADLINE;
            e.edx &= !(EDX_DS | EDX_ACPI | EDX_TM | EDX_PBE | EDX_HTT);
            if vcpus > 1 {
                e.edx |= EDX_HTT;
            }
        }
        0x4 if vendor == Vendor::Intel && e.eax & 0x1f != 0 => {
            let level = (e.eax >> 5) & 0x7;
            let sharing = if level >= 3 { vcpus - 1 } else { 0 };
            set_field(&mut e.eax, 14, 25, sharing);
            set_field(&mut e.eax, 26, 31, vcpus - 1);
        }
        0x5 | 0xa | 0x8000_000a | 0x8000_0022 => {
            (e.eax, e.ebx, e.ecx, e.edx) = (0, 0, 0, 0);
        }
        0x6 => {
            (e.eax, e.ebx, e.ecx, e.edx) = (e.eax & EAX_ARAT, 0, 0, 0);
        }
        0x7 if e.index == 0 => {
            e.ecx &= !ECX_WAITPKG;
            if vendor == Vendor::Intel {
                e.ebx |= EBX_FDP_EXCPTN_ONLY | EBX_ZERO_FCS_FDS;
            }
        }
        0x8000_0001 => {
            e.ecx &= !(ECX_SVM | ECX_PERFCTR_CORE | ECX_PERFCTR_NB | ECX_PERFCTR_LLC);
        }
        0x8000_0008 if vendor == Vendor::Amd => {
            set_field(&mut e.ecx, 0, 7, vcpus - 1); // NC: cores - 1
            set_field(&mut e.ecx, 12, 15, id_bits(vcpus)); // ApicIdSize
        }
        0x8000_001d if vendor == Vendor::Amd && e.eax & 0x1f != 0 => {
            let level = (e.eax >> 5) & 0x7;
            let sharing = if level >= 3 { vcpus - 1 } else { 0 };
            set_field(&mut e.eax, 14, 25, sharing);
        }
        0x8000_001e if vendor == Vendor::Amd => {
            e.eax = apic_id; // extended APIC id
            set_field(&mut e.ebx, 0, 7, apic_id); // core id
            set_field(&mut e.ebx, 8, 15, 0); // threads per core - 1
            set_field(&mut e.ecx, 0, 10, 0); // node 0, one node per package
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(function: u32, index: u32, regs: [u32; 4]) -> kvm_cpuid_entry2 {
        kvm_cpuid_entry2 {
            function,
            index,
            eax: regs[0],
            ebx: regs[1],
            ecx: regs[2],
            edx: regs[3],
            ..Default::default()
        }
    }

    fn vendor_leaf(name: &[u8; 12]) -> kvm_cpuid_entry2 {
        let word = |i: usize| u32::from_le_bytes(name[i..i + 4].try_into().unwrap());
        entry(0, 0, [0x1f, word(0), word(8), word(4)])
    }

    const KVM_SIGNATURE: [u32; 4] = [0x4000_0001, 0x4b4d_564b, 0x564b_4d56, 0x4d];

    /// What a host might report: everything on, stale topology.
    fn synthetic(name: &[u8; 12]) -> CpuId {
        CpuId::from_entries(&[
            vendor_leaf(name),
            entry(1, 0, [0x000a_0f10, 0x0702_0800, 0x7ffa_f3ff, 0xffff_ffff]),
            entry(4, 0, [0x1c00_4121, 1, 2, 3]),
            entry(4, 1, [0x1c00_4163, 1, 2, 3]),
            entry(4, 2, [0, 0, 0, 0]),
            entry(5, 0, [0x40, 0x40, 3, 0x1120]),
            entry(6, 0, [0x77, 9, 0xb, 0]),
            entry(7, 0, [0, 0xffff_ffff, 0xffff_ffff, 0xffff_ffff]),
            entry(0xa, 0, [0x0704_0802, 0, 0, 0x603]),
            entry(0xb, 0, [1, 2, 0x100, 7]),
            entry(0x1f, 0, [1, 2, 0x100, 7]),
            entry(0x4000_0000, 0, KVM_SIGNATURE),
            entry(0x8000_0001, 0, [0, 0, 0xffff_ffff, 0xffff_ffff]),
            entry(0x8000_0008, 0, [0x3030, 0, 0x7007, 0]),
            entry(0x8000_000a, 0, [1, 0x8000, 0, 0xffff]),
            entry(0x8000_001e, 0, [9, 0x0105, 0x0301, 0]),
        ])
        .unwrap()
    }

    fn get(c: &CpuId, function: u32, index: u32) -> kvm_cpuid_entry2 {
        *c.as_slice()
            .iter()
            .find(|e| e.function == function && e.index == index)
            .unwrap_or_else(|| panic!("leaf {function:#x}.{index} missing"))
    }

    fn regs(e: kvm_cpuid_entry2) -> [u32; 4] {
        [e.eax, e.ebx, e.ecx, e.edx]
    }

    #[test]
    fn cpuid_normalization_sets_apic_ids_and_the_hypervisor_bit() {
        for id in 0..4 {
            let mut c = synthetic(b"GenuineIntel");
            normalize(&mut c, id, 4).unwrap();
            let l1 = get(&c, 1, 0);
            assert_eq!(l1.ebx >> 24, id, "initial apic id");
            assert_eq!((l1.ebx >> 16) & 0xff, 4, "logical processors");
            assert_eq!((l1.ebx >> 8) & 0xff, 8, "clflush");
            assert_ne!(l1.ecx & ECX_HYPERVISOR, 0);
            assert_ne!(l1.ecx & ECX_TSC_DEADLINE, 0);
            assert_ne!(l1.edx & EDX_HTT, 0);
            for leaf in [0xb, 0x1f] {
                assert_eq!(get(&c, leaf, 0).edx, id, "x2apic id in {leaf:#x}");
                assert_eq!(get(&c, leaf, 1).edx, id);
            }
        }
    }

    #[test]
    fn cpuid_normalization_removes_what_the_vmm_cannot_back() {
        let mut c = synthetic(b"GenuineIntel");
        normalize(&mut c, 0, 1).unwrap();
        let l1 = get(&c, 1, 0);
        for bit in [
            ECX_MONITOR,
            ECX_VMX,
            ECX_SMX,
            ECX_EST,
            ECX_TM2,
            ECX_PDCM,
            ECX_DTES64,
        ] {
            assert_eq!(l1.ecx & bit, 0, "leaf 1 ecx bit {bit:#x}");
        }
        for bit in [EDX_DS, EDX_ACPI, EDX_TM, EDX_PBE, EDX_HTT] {
            assert_eq!(l1.edx & bit, 0, "leaf 1 edx bit {bit:#x}");
        }
        assert_eq!(regs(get(&c, 5, 0)), [0; 4], "monitor/mwait leaf");
        assert_eq!(
            regs(get(&c, 6, 0)),
            [EAX_ARAT, 0, 0, 0],
            "no aperf/mperf, no epb"
        );
        assert_eq!(regs(get(&c, 0xa, 0)), [0; 4], "no pmu");
        assert_eq!(get(&c, 7, 0).ecx & ECX_WAITPKG, 0);
        assert_eq!(
            get(&c, 0x8000_0001, 0).ecx & (ECX_SVM | ECX_PERFCTR_CORE),
            0
        );
        assert_eq!(regs(get(&c, 0x8000_000a, 0)), [0; 4]);
        assert_eq!(
            regs(get(&c, 0x4000_0000, 0)),
            KVM_SIGNATURE,
            "kvm leaves kept"
        );
        assert_eq!(regs(get(&c, 0, 0)), regs(vendor_leaf(b"GenuineIntel")));
    }

    #[test]
    fn cpuid_normalization_describes_single_threaded_cores_in_one_package() {
        let mut c = synthetic(b"GenuineIntel");
        normalize(&mut c, 2, 6).unwrap();
        let smt = get(&c, 0xb, 0);
        assert_eq!(regs(smt), [0, 1, 0x100, 2]);
        let core = get(&c, 0xb, 1);
        assert_eq!(regs(core), [3, 6, 0x201, 2]);
        assert_eq!(core.flags & KVM_CPUID_FLAG_SIGNIFCANT_INDEX, 1);
        assert_eq!(regs(get(&c, 0x1f, 1)), [3, 6, 0x201, 2]);
        assert_eq!(c.as_slice().iter().filter(|e| e.function == 0xb).count(), 2);
        // Leaf 4: L1 private to a core, L3 shared by all; 6 cores per package.
        let l1d = get(&c, 4, 0).eax;
        assert_eq!(((l1d >> 14) & 0xfff, l1d >> 26), (0, 5));
        let l3 = get(&c, 4, 1).eax;
        assert_eq!(((l3 >> 14) & 0xfff, l3 >> 26), (5, 5));
        assert_eq!(regs(get(&c, 4, 2)), [0; 4], "terminator untouched");
    }

    #[test]
    fn cpuid_normalization_on_amd_sets_core_count_and_extended_apic_id() {
        let mut c = synthetic(b"AuthenticAMD");
        normalize(&mut c, 3, 4).unwrap();
        let ecx = get(&c, 0x8000_0008, 0).ecx;
        assert_eq!((ecx & 0xff, (ecx >> 12) & 0xf), (3, 2));
        let ext = get(&c, 0x8000_001e, 0);
        assert_eq!((ext.eax, ext.ebx & 0xffff, ext.ecx & 0x7ff), (3, 3, 0));
        // Intel-only leaf 4 is left alone on AMD.
        assert_eq!(regs(get(&c, 4, 0)), [0x1c00_4121, 1, 2, 3]);
        assert_eq!(get(&c, 1, 0).ebx >> 24, 3);
    }

    #[test]
    fn cpuid_normalization_refuses_ids_out_of_range() {
        let mut c = synthetic(b"GenuineIntel");
        assert!(matches!(
            normalize(&mut c, 4, 4),
            Err(ArchError::VcpuCount { .. })
        ));
        assert!(matches!(
            normalize(&mut c, 0, 0),
            Err(ArchError::VcpuCount { .. })
        ));
        assert!(matches!(
            normalize(&mut c, 0, 255),
            Err(ArchError::VcpuCount { .. })
        ));
    }

    #[test]
    fn cpuid_normalization_is_idempotent() {
        let mut once = synthetic(b"AuthenticAMD");
        normalize(&mut once, 1, 2).unwrap();
        let mut twice = once.clone();
        normalize(&mut twice, 1, 2).unwrap();
        let key = |e: &kvm_cpuid_entry2| (e.function, e.index);
        let mut a = once.as_slice().to_vec();
        let mut b = twice.as_slice().to_vec();
        a.sort_by_key(key);
        b.sort_by_key(key);
        assert_eq!(a, b);
    }
}
