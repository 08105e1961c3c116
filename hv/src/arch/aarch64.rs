//! aarch64 guest registers, system-register encodings and VM configuration.
//!
//! [`SysReg`] uses the MRS/MSR encoding (op0, op1, CRn, CRm, op2), which is
//! also Hypervisor.framework's `hv_sys_reg_t` value and the low 16 bits of
//! KVM's sysreg one-reg id, so one type serves both backends and the
//! syndrome decoder.

/// A system register by its MRS/MSR encoding.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SysReg(pub u16);

impl SysReg {
    /// Encodes op0, op1, CRn, CRm, op2.
    pub const fn new(op0: u8, op1: u8, crn: u8, crm: u8, op2: u8) -> Self {
        Self(
            ((op0 as u16 & 3) << 14)
                | ((op1 as u16 & 7) << 11)
                | ((crn as u16 & 0xf) << 7)
                | ((crm as u16 & 0xf) << 3)
                | (op2 as u16 & 7),
        )
    }

    /// MPIDR_EL1: the vCPU's affinity (the GIC and PSCI name CPUs by it).
    pub const MPIDR_EL1: Self = Self::new(3, 0, 0, 0, 5);
    /// SCTLR_EL1: system control (MMU and caches on/off).
    pub const SCTLR_EL1: Self = Self::new(3, 0, 1, 0, 0);
    /// CNTV_CTL_EL0: virtual timer control.
    pub const CNTV_CTL_EL0: Self = Self::new(3, 3, 14, 3, 1);
    /// CNTV_CVAL_EL0: virtual timer compare value.
    pub const CNTV_CVAL_EL0: Self = Self::new(3, 3, 14, 3, 2);
    /// ICC_PMR_EL1: priority mask.
    pub const ICC_PMR_EL1: Self = Self::new(3, 0, 4, 6, 0);
    /// ICC_IAR0_EL1: acknowledge a group 0 interrupt.
    pub const ICC_IAR0_EL1: Self = Self::new(3, 0, 12, 8, 0);
    /// ICC_EOIR0_EL1: end of a group 0 interrupt.
    pub const ICC_EOIR0_EL1: Self = Self::new(3, 0, 12, 8, 1);
    /// ICC_HPPIR0_EL1: highest pending group 0 interrupt.
    pub const ICC_HPPIR0_EL1: Self = Self::new(3, 0, 12, 8, 2);
    /// ICC_BPR0_EL1: group 0 binary point.
    pub const ICC_BPR0_EL1: Self = Self::new(3, 0, 12, 8, 3);
    /// ICC_AP0R0_EL1: group 0 active priorities.
    pub const ICC_AP0R0_EL1: Self = Self::new(3, 0, 12, 8, 4);
    /// ICC_AP1R0_EL1: group 1 active priorities.
    pub const ICC_AP1R0_EL1: Self = Self::new(3, 0, 12, 9, 0);
    /// ICC_DIR_EL1: deactivate an interrupt.
    pub const ICC_DIR_EL1: Self = Self::new(3, 0, 12, 11, 1);
    /// ICC_RPR_EL1: running priority.
    pub const ICC_RPR_EL1: Self = Self::new(3, 0, 12, 11, 3);
    /// ICC_SGI1R_EL1: generate a group 1 SGI.
    pub const ICC_SGI1R_EL1: Self = Self::new(3, 0, 12, 11, 5);
    /// ICC_ASGI1R_EL1: generate an SGI for the other security state.
    pub const ICC_ASGI1R_EL1: Self = Self::new(3, 0, 12, 11, 6);
    /// ICC_SGI0R_EL1: generate a group 0 SGI.
    pub const ICC_SGI0R_EL1: Self = Self::new(3, 0, 12, 11, 7);
    /// ICC_IAR1_EL1: acknowledge a group 1 interrupt.
    pub const ICC_IAR1_EL1: Self = Self::new(3, 0, 12, 12, 0);
    /// ICC_EOIR1_EL1: end of a group 1 interrupt.
    pub const ICC_EOIR1_EL1: Self = Self::new(3, 0, 12, 12, 1);
    /// ICC_HPPIR1_EL1: highest pending group 1 interrupt.
    pub const ICC_HPPIR1_EL1: Self = Self::new(3, 0, 12, 12, 2);
    /// ICC_BPR1_EL1: group 1 binary point.
    pub const ICC_BPR1_EL1: Self = Self::new(3, 0, 12, 12, 3);
    /// ICC_CTLR_EL1: CPU interface control.
    pub const ICC_CTLR_EL1: Self = Self::new(3, 0, 12, 12, 4);
    /// ICC_SRE_EL1: system register enable.
    pub const ICC_SRE_EL1: Self = Self::new(3, 0, 12, 12, 5);
    /// ICC_IGRPEN0_EL1: group 0 enable.
    pub const ICC_IGRPEN0_EL1: Self = Self::new(3, 0, 12, 12, 6);
    /// ICC_IGRPEN1_EL1: group 1 enable.
    pub const ICC_IGRPEN1_EL1: Self = Self::new(3, 0, 12, 12, 7);
}

/// The aarch64 register state `get_regs`/`set_regs` move.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Regs {
    /// x0..x30.
    pub x: [u64; 31],
    /// SP_EL0.
    pub sp: u64,
    /// The program counter.
    pub pc: u64,
    /// PSTATE (SPSR layout: NZCV, DAIF, mode).
    pub pstate: u64,
    /// SP_EL1.
    pub sp_el1: u64,
    /// ELR_EL1.
    pub elr_el1: u64,
    /// SPSR_EL1.
    pub spsr_el1: u64,
}

/// PSTATE for entering a kernel: EL1h with D, A, I and F masked (0x3c5).
pub const PSTATE_EL1H_MASKED: u64 = 0x3c5;

/// SCTLR_EL1 as a CPU comes out of reset: MMU and caches off, the RES1
/// bits set (what KVM gives a vCPU on PSCI `CPU_ON`).
pub const SCTLR_EL1_RESET: u64 = 0x30d0_0800;

/// Where the VMM puts an in-kernel (or framework) GICv3.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GicConfig {
    /// Guest-physical base of the distributor ([`GICD_SIZE`] bytes).
    pub distributor: u64,
    /// Guest-physical base of the redistributors ([`GICR_SIZE_PER_CPU`]
    /// bytes per vCPU, contiguous).
    pub redistributors: u64,
    /// Shared peripheral interrupts to provide (INTIDs 32..32+spis); rounded
    /// up to a multiple of 32.
    pub spis: u32,
}

/// Size of the GICv3 distributor frame.
pub const GICD_SIZE: u64 = 0x1_0000;
/// Size of one vCPU's redistributor (RD_base + SGI_base frames).
pub const GICR_SIZE_PER_CPU: u64 = 0x2_0000;
/// INTID of the EL1 virtual timer PPI, as Linux and the FDT expect it.
pub const VTIMER_INTID: u32 = 27;

/// What to create with an aarch64 VM.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct VmConfig {
    /// The GICv3 to create, or `None` for a VM without interrupt controller.
    pub gic: Option<GicConfig>,
}

/// The MPIDR_EL1 affinity KVM gives vCPU `id` (Aff0 = id % 16,
/// Aff1 = (id / 16) % 256, Aff2 = id / 4096), bit 31 (RES1) set; the
/// Hypervisor.framework backend uses the same.
pub fn mpidr_for(id: u32) -> u64 {
    let id = u64::from(id);
    (1 << 31) | (id & 0xf) | (((id >> 4) & 0xff) << 8) | (((id >> 12) & 0xff) << 16)
}

/// Whether CNTV_CTL_EL0 = `ctl` drives the timer interrupt: enabled,
/// condition met (ISTATUS) and not masked (IMASK clear).
pub fn vtimer_asserted(ctl: u64) -> bool {
    ctl & 0b111 == 0b101
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sysreg_encodings_match_hypervisor_framework_values() {
        assert_eq!(SysReg::MPIDR_EL1.0, 0xc005);
        assert_eq!(SysReg::SCTLR_EL1.0, 0xc080);
        assert_eq!(SysReg::CNTV_CTL_EL0.0, 0xdf19);
        assert_eq!(SysReg::CNTV_CVAL_EL0.0, 0xdf1a);
    }

    #[test]
    fn the_vtimer_asserts_only_when_enabled_fired_and_unmasked() {
        assert!(vtimer_asserted(0b101));
        assert!(!vtimer_asserted(0b111), "masked");
        assert!(!vtimer_asserted(0b001), "not fired");
        assert!(!vtimer_asserted(0b100), "disabled");
    }
}
