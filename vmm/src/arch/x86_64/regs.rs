//! [`setup_vcpu`]: a KVM vCPU's boot state for the Linux 64-bit boot
//! protocol.
//!
//! Every vCPU gets its normalised CPUID, the boot MSRs, a reset FPU
//! (FCW 0x37f, MXCSR 0x1f80) and its local APIC's LINT0 = ExtINT,
//! LINT1 = NMI. The boot vCPU (id 0) also gets the GDT, the identity page
//! tables and long-mode registers: RIP = the kernel's 64-bit entry, RSI =
//! the zero page, RSP = RBP = the boot stack, RFLAGS = 2. The other vCPUs
//! stay in the INIT state, where KVM's in-kernel LAPIC holds them until the
//! kernel starts them with INIT-SIPI-SIPI.

use boxdesk_hv::arch::x86_64::{
    GpRegs, CR0_PE, CR0_PG, CR4_PAE, EFER_LMA, EFER_LME, RFLAGS_RESERVED,
};
use boxdesk_hv::kvm::{KvmError, KvmVcpu};
use boxdesk_hv::{HvError, Vcpu};
use kvm_bindings::{kvm_fpu, kvm_lapic_state, CpuId, KVM_MAX_CPUID_ENTRIES};
use vm_memory::{GuestAddress, GuestMemoryMmap};

use super::layout::{BOOT_STACK_POINTER, ZERO_PAGE_START};
use super::msr::boot_msrs;
use super::{cpuid, gdt, paging, ArchError};

/// Local APIC register offsets of LVT LINT0 and LINT1.
const APIC_LVT0: usize = 0x350;
const APIC_LVT1: usize = 0x360;
/// LVT delivery modes (bits 8–10).
const APIC_MODE_NMI: u32 = 0x4;
const APIC_MODE_EXTINT: u32 = 0x7;

/// The FPU state at boot: x87 control word 0x37f, MXCSR 0x1f80.
pub fn boot_fpu() -> kvm_fpu {
    kvm_fpu {
        fcw: 0x37f,
        mxcsr: 0x1f80,
        ..Default::default()
    }
}

fn lapic_reg(lapic: &kvm_lapic_state, offset: usize) -> u32 {
    let mut bytes = [0u8; 4];
    for (b, r) in bytes.iter_mut().zip(&lapic.regs[offset..offset + 4]) {
        *b = *r as u8;
    }
    u32::from_le_bytes(bytes)
}

fn set_lapic_reg(lapic: &mut kvm_lapic_state, offset: usize, value: u32) {
    for (r, b) in lapic.regs[offset..offset + 4]
        .iter_mut()
        .zip(value.to_le_bytes())
    {
        *r = b as _;
    }
}

/// Sets LINT0 to ExtINT (the PIC's output) and LINT1 to NMI, keeping the
/// other LVT bits.
pub fn configure_lint(lapic: &mut kvm_lapic_state) {
    for (offset, mode) in [(APIC_LVT0, APIC_MODE_EXTINT), (APIC_LVT1, APIC_MODE_NMI)] {
        let reg = lapic_reg(lapic, offset);
        set_lapic_reg(lapic, offset, (reg & !0x700) | (mode << 8));
    }
}

fn vcpu_error(id: u32, op: &'static str) -> impl FnOnce(HvError) -> ArchError {
    move |source| ArchError::Vcpu { id, op, source }
}

/// Prepares vCPU `id` (its KVM id) of `vcpus` for boot; for id 0 also writes
/// the GDT and page tables into `mem` and points it at `entry` (the
/// [`LoadedKernel::entry`](super::LoadedKernel::entry)). The CPUID it
/// normalises is the vCPU's current one, which `boxdesk-hv` sets to the
/// host's supported set at creation (normalising twice changes nothing).
/// Needs the in-kernel irqchip (for the LAPIC).
pub fn setup_vcpu(
    vcpu: &mut KvmVcpu,
    mem: &GuestMemoryMmap,
    id: u32,
    vcpus: u32,
    entry: GuestAddress,
) -> Result<(), ArchError> {
    let current = vcpu
        .raw()
        .get_cpuid2(KVM_MAX_CPUID_ENTRIES)
        .map_err(|e| KvmError::Cpu("get the vcpu cpuid", e).into())
        .map_err(vcpu_error(id, "read the cpuid"))?;
    setup_vcpu_with_cpuid(vcpu, mem, id, vcpus, entry, &current)
}

/// As [`setup_vcpu`], normalising `supported_cpuid` — the host's
/// `KVM_GET_SUPPORTED_CPUID` from
/// [`Kvm::supported_cpuid`](boxdesk_hv::kvm::Kvm::supported_cpuid) — instead
/// of the vCPU's current CPUID.
pub fn setup_vcpu_with_cpuid(
    vcpu: &mut KvmVcpu,
    mem: &GuestMemoryMmap,
    id: u32,
    vcpus: u32,
    entry: GuestAddress,
    supported_cpuid: &CpuId,
) -> Result<(), ArchError> {
    let mut cpuid = supported_cpuid.clone();
    cpuid::normalize(&mut cpuid, id, vcpus)?;
    vcpu.set_cpuid(&cpuid)
        .map_err(vcpu_error(id, "set the cpuid"))?;
    vcpu.set_msrs(&boot_msrs())
        .map_err(vcpu_error(id, "set the boot msrs"))?;
    vcpu.set_fpu(&boot_fpu())
        .map_err(vcpu_error(id, "set the fpu"))?;
    let mut lapic = vcpu.get_lapic().map_err(vcpu_error(
        id,
        "read the local apic (is the irqchip created?)",
    ))?;
    configure_lint(&mut lapic);
    vcpu.set_lapic(&lapic)
        .map_err(vcpu_error(id, "set the local apic"))?;
    if id == 0 {
        setup_boot_cpu(vcpu, mem, entry)?;
    }
    Ok(())
}

/// GDT, page tables and long-mode registers of the boot vCPU.
fn setup_boot_cpu(
    vcpu: &mut KvmVcpu,
    mem: &GuestMemoryMmap,
    entry: GuestAddress,
) -> Result<(), ArchError> {
    let segments = gdt::write_gdt(mem)?;
    let cr3 = paging::write_identity_tables(mem)?;
    let mut regs = vcpu
        .get_regs()
        .map_err(vcpu_error(0, "read the registers"))?;
    let s = &mut regs.sregs;
    s.cs = segments.code;
    (s.ds, s.es, s.fs, s.gs, s.ss) = (
        segments.data,
        segments.data,
        segments.data,
        segments.data,
        segments.data,
    );
    s.tr = segments.tss;
    s.gdt = segments.gdt;
    s.idt = segments.idt;
    s.cr0 |= CR0_PE | CR0_PG;
    s.cr3 = cr3;
    s.cr4 |= CR4_PAE;
    s.efer |= EFER_LME | EFER_LMA;
    regs.gp = GpRegs {
        rip: entry.0,
        rsp: BOOT_STACK_POINTER,
        rbp: BOOT_STACK_POINTER,
        rsi: ZERO_PAGE_START,
        rflags: RFLAGS_RESERVED,
        ..GpRegs::default()
    };
    vcpu.set_regs(&regs)
        .map_err(vcpu_error(0, "set the boot registers"))
}

#[cfg(test)]
mod tests {
    use boxdesk_hv::kvm::Kvm;
    use boxdesk_hv::{Hypervisor, MapFlags, Vm, VmConfig};
    use vm_memory::Bytes;

    use super::super::layout::{ram_regions, KVM_TSS_ADDR, PML4_START};
    use super::super::msr::{MSR_IA32_MISC_ENABLE, MSR_LSTAR, MSR_MTRR_DEF_TYPE};
    use super::*;

    #[test]
    fn lint0_becomes_extint_and_lint1_nmi_keeping_other_bits() {
        let mut lapic = kvm_lapic_state::default();
        set_lapic_reg(&mut lapic, APIC_LVT0, 0x0001_0000); // masked
        set_lapic_reg(&mut lapic, APIC_LVT1, 0x0000_0700);
        configure_lint(&mut lapic);
        assert_eq!(lapic_reg(&lapic, APIC_LVT0), 0x0001_0700);
        assert_eq!(lapic_reg(&lapic, APIC_LVT1), 0x0000_0400);
    }

    #[test]
    fn boot_fpu_has_the_reset_control_words() {
        let fpu = boot_fpu();
        assert_eq!((fpu.fcw, fpu.mxcsr), (0x37f, 0x1f80));
    }

    /// Needs /dev/kvm (skipped without it); creates a VM but never runs a
    /// vCPU: this machine's /dev/kvm cannot boot Linux.
    #[test]
    fn setup_vcpu_on_kvm_puts_the_boot_cpu_in_long_mode_and_leaves_aps_in_init() {
        let kvm = match Kvm::open() {
            Ok(kvm) => kvm,
            Err(e) => {
                eprintln!("skipped: no usable /dev/kvm ({e})");
                return;
            }
        };
        let vm = kvm
            .create_vm(&VmConfig {
                irqchip: true,
                tss_addr: Some(KVM_TSS_ADDR),
            })
            .unwrap();
        let (mem, regions) = crate::guest_ram(&ram_regions(256 << 20)).unwrap();
        for region in &regions {
            vm.map_memory(region, MapFlags::default()).unwrap();
        }
        let supported = kvm.supported_cpuid().unwrap();
        let entry = GuestAddress(0x100_0000);

        let mut bsp = vm.create_vcpu(0).unwrap();
        let mut ap = vm.create_vcpu(1).unwrap();
        let ap_before = ap.get_regs().unwrap();
        setup_vcpu(&mut bsp, &mem, 0, 2, entry).unwrap();
        setup_vcpu_with_cpuid(&mut ap, &mem, 1, 2, entry, &supported).unwrap();
        // Again, as after a reboot: the vCPU's CPUID is normalised already.
        setup_vcpu(&mut bsp, &mem, 0, 2, entry).unwrap();

        let regs = bsp.get_regs().unwrap();
        let gp = regs.gp;
        assert_eq!(
            (gp.rip, gp.rsi, gp.rsp, gp.rbp),
            (0x100_0000, 0x7000, 0x8ff0, 0x8ff0)
        );
        assert_eq!(gp.rflags, 2);
        let s = regs.sregs;
        assert_eq!(s.cr0 & (CR0_PE | CR0_PG), CR0_PE | CR0_PG);
        assert_eq!(s.cr4 & CR4_PAE, CR4_PAE);
        assert_eq!(s.efer & (EFER_LME | EFER_LMA), EFER_LME | EFER_LMA);
        assert_eq!(s.cr3, PML4_START);
        assert_eq!((s.cs.selector, s.cs.l, s.cs.present), (0x08, true, true));
        assert_eq!(
            (s.ds.selector, s.ss.selector, s.tr.selector),
            (0x10, 0x10, 0x18)
        );
        assert_eq!((s.gdt.base, s.gdt.limit, s.idt.base), (0x500, 31, 0x520));
        assert_eq!(
            mem.read_obj::<u64>(GuestAddress(PML4_START)).unwrap(),
            0xa003
        );

        let msrs = bsp
            .get_msrs(&[MSR_IA32_MISC_ENABLE, MSR_MTRR_DEF_TYPE, MSR_LSTAR])
            .unwrap();
        assert!(msrs.contains(&(MSR_MTRR_DEF_TYPE, 0x806)), "{msrs:x?}");
        assert!(msrs.contains(&(MSR_LSTAR, 0)), "{msrs:x?}");
        let misc = msrs.iter().find(|m| m.0 == MSR_IA32_MISC_ENABLE).unwrap();
        assert_eq!(misc.1 & 1, 1, "fast strings");
        assert_eq!(bsp.get_fpu().unwrap().fcw, 0x37f);
        let lapic = bsp.get_lapic().unwrap();
        assert_eq!((lapic_reg(&lapic, APIC_LVT0) >> 8) & 7, APIC_MODE_EXTINT);
        assert_eq!((lapic_reg(&lapic, APIC_LVT1) >> 8) & 7, APIC_MODE_NMI);

        for (vcpu, id) in [(&bsp, 0), (&ap, 1)] {
            let cpuid = vcpu.raw().get_cpuid2(256).unwrap();
            let leaf1 = cpuid.as_slice().iter().find(|e| e.function == 1).unwrap();
            assert_eq!(leaf1.ebx >> 24, id, "apic id of vcpu {id}");
            assert_ne!(leaf1.ecx & cpuid::ECX_HYPERVISOR, 0);
        }
        // The AP keeps its reset state: real mode, waiting for SIPI.
        let ap_after = ap.get_regs().unwrap();
        assert_eq!(ap_after, ap_before);
        assert_eq!(ap_after.sregs.cr0 & CR0_PE, 0);
    }

    #[test]
    fn setup_vcpu_refuses_an_id_beyond_the_count() {
        let Ok(kvm) = Kvm::open() else {
            eprintln!("skipped: no usable /dev/kvm");
            return;
        };
        let vm = kvm
            .create_vm(&VmConfig {
                irqchip: true,
                tss_addr: Some(KVM_TSS_ADDR),
            })
            .unwrap();
        let mem = GuestMemoryMmap::from_ranges(&ram_regions(16 << 20)).unwrap();
        let mut vcpu = vm.create_vcpu(0).unwrap();
        let err = setup_vcpu(&mut vcpu, &mem, 3, 2, GuestAddress(0x100_0000)).unwrap_err();
        assert!(matches!(err, ArchError::VcpuCount { .. }), "{err}");
    }
}
