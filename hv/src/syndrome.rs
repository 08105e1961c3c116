//! Decoding of the Arm exception syndrome (ESR_EL2) a guest exit carries.
//!
//! Portable: compiled and unit-tested on every host. The Hypervisor.framework
//! backend turns each trapped exception into a [`Syndrome`] here and then into
//! a [`VcpuExit`](crate::VcpuExit); KVM decodes syndromes in the kernel. This
//! module only interprets bits: it never reads or writes vCPU state.

use crate::arch::aarch64::SysReg;

/// Exception class values (ESR_EL2.EC) this crate decodes.
pub mod ec {
    /// WFI or WFE.
    pub const WFX: u8 = 0x01;
    /// HVC from AArch64.
    pub const HVC64: u8 = 0x16;
    /// SMC from AArch64.
    pub const SMC64: u8 = 0x17;
    /// MSR, MRS or system instruction from AArch64.
    pub const SYS_REG: u8 = 0x18;
    /// Instruction abort from a lower exception level.
    pub const INSTRUCTION_ABORT: u8 = 0x20;
    /// Data abort from a lower exception level.
    pub const DATA_ABORT: u8 = 0x24;
    /// BRK from AArch64.
    pub const BRK64: u8 = 0x3c;
}

/// What kind of fault a data or instruction abort reports (DFSC/IFSC).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultKind {
    /// Nothing mapped at the address (translation fault at `level`).
    Translation {
        /// Stage-2 table level, 0..=3.
        level: u8,
    },
    /// Mapped, but the access is not permitted (e.g. a write to a
    /// write-protected page) at `level`.
    Permission {
        /// Stage-2 table level, 0..=3.
        level: u8,
    },
    /// Access flag fault at `level`.
    AccessFlag {
        /// Stage-2 table level, 0..=3.
        level: u8,
    },
    /// Any other status code.
    Other(u8),
}

impl FaultKind {
    fn decode(status: u8) -> Self {
        let level = status & 3;
        match status >> 2 {
            0b0001 => Self::Translation { level },
            0b0010 => Self::AccessFlag { level },
            0b0011 => Self::Permission { level },
            _ => Self::Other(status),
        }
    }
}

/// A data abort: a guest load or store that stage 2 did not allow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DataAbort {
    /// ISV: the fields below describe the access. Without it (load/store
    /// pair, writeback, SIMD…) the access cannot be emulated from the syndrome.
    pub valid: bool,
    /// Access size in bytes (SAS): 1, 2, 4 or 8.
    pub size: usize,
    /// SSE: a narrow load is sign-extended into the register.
    pub sign_extend: bool,
    /// SRT: the transfer register; 31 means xzr/wzr.
    pub reg: u8,
    /// SF: the register is 64 bits wide (else a W register).
    pub wide: bool,
    /// WnR: the access is a write.
    pub write: bool,
    /// S1PTW: the fault happened on a stage-1 table walk.
    pub s1ptw: bool,
    /// CM: a cache-maintenance instruction faulted.
    pub cache_maintenance: bool,
    /// What kind of fault it was.
    pub fault: FaultKind,
}

impl DataAbort {
    fn decode(iss: u32) -> Self {
        Self {
            valid: iss & (1 << 24) != 0,
            size: 1 << ((iss >> 22) & 3),
            sign_extend: iss & (1 << 21) != 0,
            reg: ((iss >> 16) & 0x1f) as u8,
            wide: iss & (1 << 15) != 0,
            write: iss & (1 << 6) != 0,
            s1ptw: iss & (1 << 7) != 0,
            cache_maintenance: iss & (1 << 8) != 0,
            fault: FaultKind::decode((iss & 0x3f) as u8),
        }
    }

    /// The register value a load of `data` (little-endian, `size` bytes)
    /// leaves in the transfer register: sign-extended when SSE says so, and
    /// cut to 32 bits for a W register.
    pub fn load_value(&self, data: u64) -> u64 {
        let bits = self.size as u32 * 8;
        let mut value = if bits >= 64 {
            data
        } else {
            data & ((1 << bits) - 1)
        };
        if self.sign_extend && bits < 64 {
            let shift = 64 - bits;
            value = (((value << shift) as i64) >> shift) as u64;
        }
        if !self.wide {
            value &= 0xffff_ffff;
        }
        value
    }
}

/// A trapped MSR/MRS (EC 0x18).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SysRegAccess {
    /// The register accessed.
    pub reg: SysReg,
    /// The general-purpose register moved to or from; 31 means xzr.
    pub rt: u8,
    /// `true` for MRS (the guest reads the system register).
    pub read: bool,
}

/// One decoded ESR_EL2 value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Syndrome {
    /// A load or store stage 2 did not allow (MMIO, or a write-protected page).
    DataAbort(DataAbort),
    /// An instruction fetch stage 2 did not allow.
    InstructionAbort {
        /// What kind of fault it was.
        fault: FaultKind,
    },
    /// `wfi` (`wfe == false`) or `wfe`.
    Wfx {
        /// The instruction was WFE (or WFET).
        wfe: bool,
    },
    /// `hvc #imm`.
    Hvc {
        /// The immediate.
        imm: u16,
    },
    /// `smc #imm`.
    Smc {
        /// The immediate.
        imm: u16,
    },
    /// A trapped system register access.
    SysReg(SysRegAccess),
    /// `brk #imm`.
    Brk {
        /// The immediate.
        imm: u16,
    },
    /// Any other exception class.
    Other {
        /// ESR_EL2.EC.
        ec: u8,
        /// ESR_EL2.ISS.
        iss: u32,
    },
}

impl Syndrome {
    /// Decodes an ESR_EL2 value.
    pub fn decode(esr: u64) -> Self {
        let class = ((esr >> 26) & 0x3f) as u8;
        let iss = (esr & 0x1ff_ffff) as u32;
        let imm = iss as u16;
        match class {
            ec::DATA_ABORT => Self::DataAbort(DataAbort::decode(iss)),
            ec::INSTRUCTION_ABORT => Self::InstructionAbort {
                fault: FaultKind::decode((iss & 0x3f) as u8),
            },
            ec::WFX => Self::Wfx { wfe: iss & 1 != 0 },
            ec::HVC64 => Self::Hvc { imm },
            ec::SMC64 => Self::Smc { imm },
            ec::BRK64 => Self::Brk { imm },
            ec::SYS_REG => Self::SysReg(SysRegAccess {
                reg: SysReg::new(
                    ((iss >> 20) & 3) as u8,
                    ((iss >> 14) & 7) as u8,
                    ((iss >> 10) & 0xf) as u8,
                    ((iss >> 1) & 0xf) as u8,
                    ((iss >> 17) & 7) as u8,
                ),
                rt: ((iss >> 5) & 0x1f) as u8,
                read: iss & 1 != 0,
            }),
            ec => Self::Other { ec, iss },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn esr(class: u8, iss: u32) -> u64 {
        (u64::from(class) << 26) | (1 << 25) | u64::from(iss)
    }

    #[test]
    fn a_32_bit_store_from_w1_decodes_as_a_valid_write() {
        // str w1, [x0] to unmapped IPA: ISV, SAS=2, SRT=1, WnR, DFSC=translation L3.
        let iss = (1 << 24) | (2 << 22) | (1 << 16) | (1 << 6) | 0b000111;
        let Syndrome::DataAbort(da) = Syndrome::decode(esr(ec::DATA_ABORT, iss)) else {
            panic!("not a data abort");
        };
        assert!(da.valid && da.write && !da.wide && !da.sign_extend);
        assert_eq!((da.size, da.reg), (4, 1));
        assert_eq!(da.fault, FaultKind::Translation { level: 3 });
    }

    #[test]
    fn every_access_size_decodes_from_sas() {
        for (sas, size) in [(0, 1), (1, 2), (2, 4), (3, 8)] {
            let iss = (1 << 24) | (sas << 22);
            let Syndrome::DataAbort(da) = Syndrome::decode(esr(ec::DATA_ABORT, iss)) else {
                panic!("not a data abort");
            };
            assert_eq!(da.size, size);
        }
    }

    #[test]
    fn a_load_pair_has_no_valid_syndrome() {
        let Syndrome::DataAbort(da) = Syndrome::decode(esr(ec::DATA_ABORT, 0b000111)) else {
            panic!("not a data abort");
        };
        assert!(!da.valid);
    }

    #[test]
    fn a_write_to_a_write_protected_page_is_a_permission_fault() {
        let iss = (1 << 24) | (3 << 22) | (1 << 15) | (1 << 6) | 0b001111;
        let Syndrome::DataAbort(da) = Syndrome::decode(esr(ec::DATA_ABORT, iss)) else {
            panic!("not a data abort");
        };
        assert_eq!(da.fault, FaultKind::Permission { level: 3 });
    }

    #[test]
    fn ldrsb_into_x_sign_extends_to_64_bits() {
        let iss = (1 << 24) | (1 << 21) | (3 << 16) | (1 << 15);
        let Syndrome::DataAbort(da) = Syndrome::decode(esr(ec::DATA_ABORT, iss)) else {
            panic!("not a data abort");
        };
        assert_eq!(da.load_value(0x80), 0xffff_ffff_ffff_ff80);
        assert_eq!(da.load_value(0x7f), 0x7f);
    }

    #[test]
    fn ldrsh_into_w_sign_extends_to_32_bits_only() {
        let iss = (1 << 24) | (1 << 22) | (1 << 21);
        let Syndrome::DataAbort(da) = Syndrome::decode(esr(ec::DATA_ABORT, iss)) else {
            panic!("not a data abort");
        };
        assert_eq!(da.load_value(0x8001), 0xffff_8001);
    }

    #[test]
    fn a_narrow_unsigned_load_ignores_bytes_beyond_its_size() {
        let iss = (1 << 24) | (1 << 22) | (1 << 15);
        let Syndrome::DataAbort(da) = Syndrome::decode(esr(ec::DATA_ABORT, iss)) else {
            panic!("not a data abort");
        };
        assert_eq!(da.load_value(0xdead_beef), 0xbeef);
    }

    #[test]
    fn hvc_smc_and_brk_carry_their_immediate() {
        assert_eq!(
            Syndrome::decode(esr(ec::HVC64, 0)),
            Syndrome::Hvc { imm: 0 }
        );
        assert_eq!(
            Syndrome::decode(esr(ec::SMC64, 0x12)),
            Syndrome::Smc { imm: 0x12 }
        );
        assert_eq!(
            Syndrome::decode(esr(ec::BRK64, 0xf000)),
            Syndrome::Brk { imm: 0xf000 }
        );
    }

    #[test]
    fn wfi_and_wfe_are_told_apart() {
        assert_eq!(
            Syndrome::decode(esr(ec::WFX, 0)),
            Syndrome::Wfx { wfe: false }
        );
        assert_eq!(
            Syndrome::decode(esr(ec::WFX, 1)),
            Syndrome::Wfx { wfe: true }
        );
    }

    #[test]
    fn mrs_of_icc_iar1_el1_decodes_register_and_direction() {
        // mrs x2, ICC_IAR1_EL1 (op0=3 op1=0 CRn=12 CRm=12 op2=0)
        let iss = (3 << 20) | (12 << 10) | (2 << 5) | (12 << 1) | 1;
        let Syndrome::SysReg(access) = Syndrome::decode(esr(ec::SYS_REG, iss)) else {
            panic!("not a sysreg trap");
        };
        assert_eq!(access.reg, SysReg::ICC_IAR1_EL1);
        assert_eq!((access.rt, access.read), (2, true));
    }

    #[test]
    fn an_unknown_class_keeps_its_bits() {
        assert_eq!(
            Syndrome::decode(esr(0x07, 0x1234)),
            Syndrome::Other {
                ec: 0x07,
                iss: 0x1234
            }
        );
    }
}
