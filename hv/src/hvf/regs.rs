//! Register access for [`HvfVcpu`]: the general registers by `hv_reg_t`, the
//! rest of [`Regs`] and selected system registers by `hv_sys_reg_t`.

use applevisor::prelude::{Reg, SysReg as HvSysReg};

use super::{HvfError, HvfVcpu};
use crate::arch::aarch64::{Regs, SysReg};
use crate::HvError;

/// x0..x30 in order.
const X: [Reg; 31] = [
    Reg::X0,
    Reg::X1,
    Reg::X2,
    Reg::X3,
    Reg::X4,
    Reg::X5,
    Reg::X6,
    Reg::X7,
    Reg::X8,
    Reg::X9,
    Reg::X10,
    Reg::X11,
    Reg::X12,
    Reg::X13,
    Reg::X14,
    Reg::X15,
    Reg::X16,
    Reg::X17,
    Reg::X18,
    Reg::X19,
    Reg::X20,
    Reg::X21,
    Reg::X22,
    Reg::X23,
    Reg::X24,
    Reg::X25,
    Reg::X26,
    Reg::X27,
    Reg::X28,
    Reg::X29,
    Reg::X30,
];

/// The system registers this backend reads and writes by encoding.
fn hv_sys_reg(reg: SysReg) -> Option<HvSysReg> {
    const KNOWN: [HvSysReg; 18] = [
        HvSysReg::MPIDR_EL1,
        HvSysReg::SCTLR_EL1,
        HvSysReg::CPACR_EL1,
        HvSysReg::TTBR0_EL1,
        HvSysReg::TTBR1_EL1,
        HvSysReg::TCR_EL1,
        HvSysReg::SPSR_EL1,
        HvSysReg::ELR_EL1,
        HvSysReg::SP_EL0,
        HvSysReg::ESR_EL1,
        HvSysReg::FAR_EL1,
        HvSysReg::MAIR_EL1,
        HvSysReg::VBAR_EL1,
        HvSysReg::TPIDR_EL1,
        HvSysReg::CNTKCTL_EL1,
        HvSysReg::CNTV_CTL_EL0,
        HvSysReg::CNTV_CVAL_EL0,
        HvSysReg::SP_EL1,
    ];
    KNOWN.into_iter().find(|r| *r as u16 == reg.0)
}

fn call<T>(
    what: &'static str,
    r: Result<T, applevisor::error::HypervisorError>,
) -> Result<T, HvfError> {
    r.map_err(|e| HvfError::Call(what, e))
}

impl HvfVcpu {
    /// General register `n` (31 reads as zero: xzr).
    pub(super) fn x(&self, n: u8) -> Result<u64, HvfError> {
        match X.get(n as usize) {
            Some(&r) => call("hv_vcpu_get_reg", self.vcpu.get_reg(r)),
            None => Ok(0),
        }
    }

    /// Sets general register `n` (31 is xzr: ignored).
    pub(super) fn set_x(&self, n: u8, value: u64) -> Result<(), HvfError> {
        match X.get(n as usize) {
            Some(&r) => call("hv_vcpu_set_reg", self.vcpu.set_reg(r, value)),
            None => Ok(()),
        }
    }

    /// Moves the PC past the trapped instruction.
    pub(super) fn advance_pc(&self) -> Result<(), HvfError> {
        let pc = call("hv_vcpu_get_reg", self.vcpu.get_reg(Reg::PC))?;
        call("hv_vcpu_set_reg", self.vcpu.set_reg(Reg::PC, pc + 4))
    }

    /// Reads a system register; `Unsupported` for one outside the list the
    /// backend knows (MPIDR, SCTLR, translation, exception and timer regs).
    pub fn get_sys_reg(&self, reg: SysReg) -> Result<u64, HvError> {
        let r = hv_sys_reg(reg).ok_or(HvError::Unsupported("this system register on hvf"))?;
        Ok(call("hv_vcpu_get_sys_reg", self.vcpu.get_sys_reg(r))?)
    }

    /// Writes a system register (same list as [`get_sys_reg`](Self::get_sys_reg)).
    pub fn set_sys_reg(&self, reg: SysReg, value: u64) -> Result<(), HvError> {
        let r = hv_sys_reg(reg).ok_or(HvError::Unsupported("this system register on hvf"))?;
        Ok(call(
            "hv_vcpu_set_sys_reg",
            self.vcpu.set_sys_reg(r, value),
        )?)
    }

    pub(super) fn read_regs(&self) -> Result<Regs, HvError> {
        let mut regs = Regs::default();
        for (v, n) in regs.x.iter_mut().zip(0..) {
            *v = self.x(n)?;
        }
        regs.pc = call("hv_vcpu_get_reg", self.vcpu.get_reg(Reg::PC))?;
        regs.pstate = call("hv_vcpu_get_reg", self.vcpu.get_reg(Reg::CPSR))?;
        regs.sp = self.get_sys_reg(SysReg(HvSysReg::SP_EL0 as u16))?;
        regs.sp_el1 = self.get_sys_reg(SysReg(HvSysReg::SP_EL1 as u16))?;
        regs.elr_el1 = self.get_sys_reg(SysReg(HvSysReg::ELR_EL1 as u16))?;
        regs.spsr_el1 = self.get_sys_reg(SysReg(HvSysReg::SPSR_EL1 as u16))?;
        Ok(regs)
    }

    pub(super) fn write_regs(&self, regs: &Regs) -> Result<(), HvError> {
        for (&v, n) in regs.x.iter().zip(0..) {
            self.set_x(n, v)?;
        }
        call("hv_vcpu_set_reg", self.vcpu.set_reg(Reg::PC, regs.pc))?;
        call("hv_vcpu_set_reg", self.vcpu.set_reg(Reg::CPSR, regs.pstate))?;
        self.set_sys_reg(SysReg(HvSysReg::SP_EL0 as u16), regs.sp)?;
        self.set_sys_reg(SysReg(HvSysReg::SP_EL1 as u16), regs.sp_el1)?;
        self.set_sys_reg(SysReg(HvSysReg::ELR_EL1 as u16), regs.elr_el1)?;
        self.set_sys_reg(SysReg(HvSysReg::SPSR_EL1 as u16), regs.spsr_el1)?;
        Ok(())
    }
}
