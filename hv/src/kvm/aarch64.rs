//! aarch64 specifics of the KVM backend: vCPU init with PSCI 0.2, the
//! in-kernel vGICv3, SPI line numbering, and register access through
//! `KVM_{GET,SET}_ONE_REG`. Where the GIC lives is the VMM's choice
//! ([`GicConfig`]); this module only passes it on.

use std::mem::offset_of;

use kvm_bindings::{
    kvm_create_device, kvm_device_attr, kvm_device_type_KVM_DEV_TYPE_ARM_VGIC_V3, kvm_regs,
    kvm_vcpu_init, user_pt_regs, KVM_ARM_IRQ_TYPE_SHIFT, KVM_ARM_IRQ_TYPE_SPI,
    KVM_ARM_VCPU_POWER_OFF, KVM_ARM_VCPU_PSCI_0_2, KVM_DEV_ARM_VGIC_CTRL_INIT,
    KVM_DEV_ARM_VGIC_GRP_ADDR, KVM_DEV_ARM_VGIC_GRP_CTRL, KVM_DEV_ARM_VGIC_GRP_NR_IRQS,
    KVM_REG_ARM64, KVM_REG_ARM64_SYSREG, KVM_REG_ARM_CORE, KVM_REG_SIZE_U64,
    KVM_VGIC_V3_ADDR_TYPE_DIST, KVM_VGIC_V3_ADDR_TYPE_REDIST,
};
use kvm_ioctls::{DeviceFd, VcpuFd, VmFd};

use super::{KvmError, KvmVcpu, KvmVm};
use crate::arch::aarch64::{GicConfig, Regs, SysReg};
use crate::{HvError, VmConfig};

/// Per-VM aarch64 state: the vGIC, once created.
#[derive(Debug)]
pub(super) struct VmArch {
    gic: Option<DeviceFd>,
}

fn attr(
    gic: &DeviceFd,
    group: u32,
    attr: u64,
    value: Option<&u64>,
    what: &'static str,
) -> Result<(), KvmError> {
    let attr = kvm_device_attr {
        flags: 0,
        group,
        attr,
        addr: value.map_or(0, |v| v as *const u64 as u64),
    };
    gic.set_device_attr(&attr)
        .map_err(|e| KvmError::IrqChip(what, e))
}

impl VmArch {
    pub fn new(_: &kvm_ioctls::Kvm, fd: &VmFd, config: &VmConfig) -> Result<Self, HvError> {
        let Some(GicConfig {
            distributor,
            redistributors,
            spis,
        }) = config.gic
        else {
            return Ok(Self { gic: None });
        };
        let mut device = kvm_create_device {
            type_: kvm_device_type_KVM_DEV_TYPE_ARM_VGIC_V3,
            fd: 0,
            flags: 0,
        };
        let gic = fd
            .create_device(&mut device)
            .map_err(|e| KvmError::IrqChip("create the vgic-v3", e))?;
        let grp = KVM_DEV_ARM_VGIC_GRP_ADDR;
        attr(
            &gic,
            grp,
            KVM_VGIC_V3_ADDR_TYPE_DIST.into(),
            Some(&distributor),
            "place the distributor",
        )?;
        let redist = KVM_VGIC_V3_ADDR_TYPE_REDIST.into();
        attr(
            &gic,
            grp,
            redist,
            Some(&redistributors),
            "place the redistributors",
        )?;
        let irqs = u64::from(32 + spis.div_ceil(32) * 32);
        // NR_IRQS reads a u32 at `addr`; a little-endian u64 starts with it.
        attr(
            &gic,
            KVM_DEV_ARM_VGIC_GRP_NR_IRQS,
            0,
            Some(&irqs),
            "set the interrupt count",
        )?;
        Ok(Self { gic: Some(gic) })
    }

    pub fn finalize(&self) -> Result<(), HvError> {
        if let Some(gic) = &self.gic {
            let (grp, init) = (KVM_DEV_ARM_VGIC_GRP_CTRL, KVM_DEV_ARM_VGIC_CTRL_INIT.into());
            attr(gic, grp, init, None, "initialise the vgic")?;
        }
        Ok(())
    }
}

/// aarch64 lines are SPIs: `KVM_IRQ_LINE` wants type SPI and INTID 32 + n.
pub(super) fn irq_line_number(line: u32) -> u32 {
    (KVM_ARM_IRQ_TYPE_SPI << KVM_ARM_IRQ_TYPE_SHIFT) | (line + 32)
}

/// `KVM_ARM_VCPU_INIT` with the host's preferred target and PSCI 0.2;
/// vCPUs other than 0 start powered off, waiting for PSCI CPU_ON.
pub(super) fn init_vcpu(vm: &KvmVm, fd: &VcpuFd, id: u32) -> Result<(), HvError> {
    let mut init = kvm_vcpu_init::default();
    vm.fd
        .get_preferred_target(&mut init)
        .map_err(|e| KvmError::CreateVcpu(id, e))?;
    init.features[0] |= 1 << KVM_ARM_VCPU_PSCI_0_2;
    if id > 0 {
        init.features[0] |= 1 << KVM_ARM_VCPU_POWER_OFF;
    }
    fd.vcpu_init(&init)
        .map_err(|e| KvmError::CreateVcpu(id, e))?;
    Ok(())
}

/// The one-reg id of the 64-bit core register at `offset` in `kvm_regs`.
const fn core(offset: usize) -> u64 {
    KVM_REG_ARM64 | KVM_REG_SIZE_U64 | KVM_REG_ARM_CORE as u64 | (offset / 4) as u64
}

const X0: usize = offset_of!(kvm_regs, regs) + offset_of!(user_pt_regs, regs);
const SP: u64 = core(offset_of!(kvm_regs, regs) + offset_of!(user_pt_regs, sp));
const PC: u64 = core(offset_of!(kvm_regs, regs) + offset_of!(user_pt_regs, pc));
const PSTATE: u64 = core(offset_of!(kvm_regs, regs) + offset_of!(user_pt_regs, pstate));
const SP_EL1: u64 = core(offset_of!(kvm_regs, sp_el1));
const ELR_EL1: u64 = core(offset_of!(kvm_regs, elr_el1));
const SPSR_EL1: u64 = core(offset_of!(kvm_regs, spsr));

fn get(fd: &VcpuFd, id: u64) -> Result<u64, KvmError> {
    let mut bytes = [0u8; 8];
    fd.get_one_reg(id, &mut bytes)
        .map_err(|e| KvmError::Regs("KVM_GET_ONE_REG", e))?;
    Ok(u64::from_le_bytes(bytes))
}

fn set(fd: &VcpuFd, id: u64, value: u64) -> Result<(), KvmError> {
    fd.set_one_reg(id, &value.to_le_bytes())
        .map_err(|e| KvmError::Regs("KVM_SET_ONE_REG", e))?;
    Ok(())
}

fn all_ids() -> impl Iterator<Item = u64> {
    (0..31)
        .map(|i| core(X0 + 8 * i))
        .chain([SP, PC, PSTATE, SP_EL1, ELR_EL1, SPSR_EL1])
}

pub(super) fn get_regs(fd: &VcpuFd) -> Result<Regs, HvError> {
    let mut values = [0u64; 37];
    for (v, id) in values.iter_mut().zip(all_ids()) {
        *v = get(fd, id)?;
    }
    let mut regs = Regs::default();
    regs.x.copy_from_slice(&values[..31]);
    [
        regs.sp,
        regs.pc,
        regs.pstate,
        regs.sp_el1,
        regs.elr_el1,
        regs.spsr_el1,
    ] = [
        values[31], values[32], values[33], values[34], values[35], values[36],
    ];
    Ok(regs)
}

pub(super) fn set_regs(fd: &VcpuFd, regs: &Regs) -> Result<(), HvError> {
    let tail = [
        regs.sp,
        regs.pc,
        regs.pstate,
        regs.sp_el1,
        regs.elr_el1,
        regs.spsr_el1,
    ];
    for (id, value) in all_ids().zip(regs.x.iter().chain(tail.iter())) {
        set(fd, id, *value)?;
    }
    Ok(())
}

fn sys_id(reg: SysReg) -> u64 {
    KVM_REG_ARM64 | KVM_REG_SIZE_U64 | u64::from(KVM_REG_ARM64_SYSREG) | u64::from(reg.0)
}

impl KvmVcpu {
    /// Reads a system register (e.g. [`SysReg::MPIDR_EL1`] for the FDT).
    pub fn get_sys_reg(&self, reg: SysReg) -> Result<u64, HvError> {
        Ok(get(&self.fd, sys_id(reg))?)
    }

    /// Writes a system register.
    pub fn set_sys_reg(&self, reg: SysReg, value: u64) -> Result<(), HvError> {
        Ok(set(&self.fd, sys_id(reg), value)?)
    }
}
