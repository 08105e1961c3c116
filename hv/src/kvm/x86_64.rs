//! x86_64 specifics of the KVM backend: in-kernel irqchip + PIT, TSS,
//! CPUID, MSRs, and the register conversions. CPUID *policy* (what the guest
//! should see) is the VMM's: this module hands out the host's supported set.

use kvm_bindings::{
    kvm_dtable, kvm_fpu, kvm_lapic_state, kvm_msr_entry, kvm_pit_config, kvm_regs, kvm_segment,
    kvm_sregs, CpuId, Msrs, KVM_MAX_CPUID_ENTRIES, KVM_PIT_SPEAKER_DUMMY,
};
use kvm_ioctls::{VcpuFd, VmFd};

use super::{Kvm, KvmError, KvmVcpu, KvmVm};
use crate::arch::x86_64::{DescriptorTable, GpRegs, Regs, Segment, SpecialRegs};
use crate::{HvError, VmConfig};

/// Per-VM x86_64 state.
#[derive(Debug)]
pub(super) struct VmArch {
    /// `KVM_GET_SUPPORTED_CPUID`, given to every new vCPU.
    cpuid: CpuId,
}

impl VmArch {
    pub fn new(kvm: &kvm_ioctls::Kvm, fd: &VmFd, config: &VmConfig) -> Result<Self, HvError> {
        if let Some(tss) = config.tss_addr {
            fd.set_tss_address(tss as usize)
                .map_err(|e| KvmError::IrqChip("KVM_SET_TSS_ADDR", e))?;
        }
        if config.irqchip {
            fd.create_irq_chip()
                .map_err(|e| KvmError::IrqChip("KVM_CREATE_IRQCHIP", e))?;
            let pit = kvm_pit_config {
                flags: KVM_PIT_SPEAKER_DUMMY,
                ..Default::default()
            };
            fd.create_pit2(pit)
                .map_err(|e| KvmError::IrqChip("KVM_CREATE_PIT2", e))?;
        }
        let cpuid = kvm
            .get_supported_cpuid(KVM_MAX_CPUID_ENTRIES)
            .map_err(|e| KvmError::Cpu("get the supported cpuid", e))?;
        Ok(Self { cpuid })
    }

    pub fn finalize(&self) -> Result<(), HvError> {
        Ok(())
    }
}

/// x86_64 lines are IOAPIC/PIC GSIs as they are.
pub(super) fn irq_line_number(line: u32) -> u32 {
    line
}

pub(super) fn init_vcpu(vm: &KvmVm, fd: &VcpuFd, id: u32) -> Result<(), HvError> {
    fd.set_cpuid2(&vm.arch.cpuid)
        .map_err(|e| KvmError::CreateVcpu(id, e))?;
    Ok(())
}

impl Kvm {
    /// `KVM_GET_SUPPORTED_CPUID`: what the host can give a guest; the VMM
    /// normalises it into its CPUID policy.
    pub fn supported_cpuid(&self) -> Result<CpuId, HvError> {
        Ok(self
            .kvm
            .get_supported_cpuid(KVM_MAX_CPUID_ENTRIES)
            .map_err(|e| KvmError::Cpu("get the supported cpuid", e))?)
    }

    /// `KVM_GET_MSR_INDEX_LIST`: the MSRs a vCPU's state includes.
    pub fn msr_index_list(&self) -> Result<Vec<u32>, HvError> {
        let list = self
            .kvm
            .get_msr_index_list()
            .map_err(|e| KvmError::Cpu("get the msr index list", e))?;
        Ok(list.as_slice().to_vec())
    }
}

impl KvmVcpu {
    /// `KVM_SET_CPUID2`: replaces the CPUID the guest sees.
    pub fn set_cpuid(&self, cpuid: &CpuId) -> Result<(), HvError> {
        Ok(self
            .fd
            .set_cpuid2(cpuid)
            .map_err(|e| KvmError::Cpu("set cpuid", e))?)
    }

    /// Reads the MSRs `indices`; returns (index, value) for those KVM knows.
    pub fn get_msrs(&self, indices: &[u32]) -> Result<Vec<(u32, u64)>, HvError> {
        let entries: Vec<_> = indices
            .iter()
            .map(|&index| kvm_msr_entry {
                index,
                ..Default::default()
            })
            .collect();
        let mut msrs =
            Msrs::from_entries(&entries).map_err(|_| HvError::Unsupported("more than 256 msrs"))?;
        let n = self
            .fd
            .get_msrs(&mut msrs)
            .map_err(|e| KvmError::Cpu("get msrs", e))?;
        Ok(msrs.as_slice()[..n]
            .iter()
            .map(|e| (e.index, e.data))
            .collect())
    }

    /// Writes (index, value) MSRs; fails unless KVM takes all of them.
    pub fn set_msrs(&self, values: &[(u32, u64)]) -> Result<(), HvError> {
        let entries: Vec<_> = values
            .iter()
            .map(|&(index, data)| kvm_msr_entry {
                index,
                data,
                ..Default::default()
            })
            .collect();
        let msrs =
            Msrs::from_entries(&entries).map_err(|_| HvError::Unsupported("more than 256 msrs"))?;
        let n = self
            .fd
            .set_msrs(&msrs)
            .map_err(|e| KvmError::Cpu("set msrs", e))?;
        if n != values.len() {
            return Err(HvError::Unsupported("an msr kvm does not know"));
        }
        Ok(())
    }

    /// `KVM_GET_FPU`.
    pub fn get_fpu(&self) -> Result<kvm_fpu, HvError> {
        Ok(self.fd.get_fpu().map_err(|e| KvmError::Regs("fpu", e))?)
    }

    /// `KVM_SET_FPU` (e.g. FCW 0x37f and MXCSR 0x1f80 at boot).
    pub fn set_fpu(&self, fpu: &kvm_fpu) -> Result<(), HvError> {
        Ok(self.fd.set_fpu(fpu).map_err(|e| KvmError::Regs("fpu", e))?)
    }

    /// `KVM_GET_LAPIC` (needs the in-kernel irqchip).
    pub fn get_lapic(&self) -> Result<kvm_lapic_state, HvError> {
        Ok(self
            .fd
            .get_lapic()
            .map_err(|e| KvmError::Regs("lapic", e))?)
    }

    /// `KVM_SET_LAPIC` (e.g. LINT0 = ExtINT, LINT1 = NMI at boot).
    pub fn set_lapic(&self, lapic: &kvm_lapic_state) -> Result<(), HvError> {
        Ok(self
            .fd
            .set_lapic(lapic)
            .map_err(|e| KvmError::Regs("lapic", e))?)
    }
}

fn segment_from(s: &kvm_segment) -> Segment {
    Segment {
        base: s.base,
        limit: s.limit,
        selector: s.selector,
        type_: s.type_,
        present: s.present != 0,
        dpl: s.dpl,
        db: s.db != 0,
        s: s.s != 0,
        l: s.l != 0,
        g: s.g != 0,
        avl: s.avl != 0,
        unusable: s.unusable != 0,
    }
}

fn segment_to(s: &Segment) -> kvm_segment {
    kvm_segment {
        base: s.base,
        limit: s.limit,
        selector: s.selector,
        type_: s.type_,
        present: s.present.into(),
        dpl: s.dpl,
        db: s.db.into(),
        s: s.s.into(),
        l: s.l.into(),
        g: s.g.into(),
        avl: s.avl.into(),
        unusable: s.unusable.into(),
        padding: 0,
    }
}

fn dtable_from(t: &kvm_dtable) -> DescriptorTable {
    DescriptorTable {
        base: t.base,
        limit: t.limit,
    }
}

fn dtable_to(t: &DescriptorTable) -> kvm_dtable {
    kvm_dtable {
        base: t.base,
        limit: t.limit,
        padding: [0; 3],
    }
}

pub(super) fn get_regs(fd: &VcpuFd) -> Result<Regs, HvError> {
    let r = fd
        .get_regs()
        .map_err(|e| KvmError::Regs("KVM_GET_REGS", e))?;
    let s = fd
        .get_sregs()
        .map_err(|e| KvmError::Regs("KVM_GET_SREGS", e))?;
    Ok(Regs {
        gp: GpRegs {
            rax: r.rax,
            rbx: r.rbx,
            rcx: r.rcx,
            rdx: r.rdx,
            rsi: r.rsi,
            rdi: r.rdi,
            rsp: r.rsp,
            rbp: r.rbp,
            r8: r.r8,
            r9: r.r9,
            r10: r.r10,
            r11: r.r11,
            r12: r.r12,
            r13: r.r13,
            r14: r.r14,
            r15: r.r15,
            rip: r.rip,
            rflags: r.rflags,
        },
        sregs: SpecialRegs {
            cs: segment_from(&s.cs),
            ds: segment_from(&s.ds),
            es: segment_from(&s.es),
            fs: segment_from(&s.fs),
            gs: segment_from(&s.gs),
            ss: segment_from(&s.ss),
            tr: segment_from(&s.tr),
            ldt: segment_from(&s.ldt),
            gdt: dtable_from(&s.gdt),
            idt: dtable_from(&s.idt),
            cr0: s.cr0,
            cr2: s.cr2,
            cr3: s.cr3,
            cr4: s.cr4,
            cr8: s.cr8,
            efer: s.efer,
            apic_base: s.apic_base,
        },
    })
}

pub(super) fn set_regs(fd: &VcpuFd, regs: &Regs) -> Result<(), HvError> {
    // Start from the current sregs: the pending-interrupt bitmap is not ours.
    let mut s: kvm_sregs = fd
        .get_sregs()
        .map_err(|e| KvmError::Regs("KVM_GET_SREGS", e))?;
    let n = &regs.sregs;
    s.cs = segment_to(&n.cs);
    s.ds = segment_to(&n.ds);
    s.es = segment_to(&n.es);
    s.fs = segment_to(&n.fs);
    s.gs = segment_to(&n.gs);
    s.ss = segment_to(&n.ss);
    s.tr = segment_to(&n.tr);
    s.ldt = segment_to(&n.ldt);
    s.gdt = dtable_to(&n.gdt);
    s.idt = dtable_to(&n.idt);
    (s.cr0, s.cr2, s.cr3, s.cr4, s.cr8) = (n.cr0, n.cr2, n.cr3, n.cr4, n.cr8);
    (s.efer, s.apic_base) = (n.efer, n.apic_base);
    fd.set_sregs(&s)
        .map_err(|e| KvmError::Regs("KVM_SET_SREGS", e))?;
    let g = &regs.gp;
    let r = kvm_regs {
        rax: g.rax,
        rbx: g.rbx,
        rcx: g.rcx,
        rdx: g.rdx,
        rsi: g.rsi,
        rdi: g.rdi,
        rsp: g.rsp,
        rbp: g.rbp,
        r8: g.r8,
        r9: g.r9,
        r10: g.r10,
        r11: g.r11,
        r12: g.r12,
        r13: g.r13,
        r14: g.r14,
        r15: g.r15,
        rip: g.rip,
        rflags: g.rflags,
    };
    fd.set_regs(&r)
        .map_err(|e| KvmError::Regs("KVM_SET_REGS", e))?;
    Ok(())
}
