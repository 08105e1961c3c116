//! PSCI (Arm Power State Coordination Interface, DEN0022) and the SMCCC
//! version call: function ids, decoding of a guest's `hvc`/`smc`, and the
//! answers that need no VMM state.
//!
//! Portable: compiled and unit-tested on every host. KVM answers PSCI in the
//! kernel (vCPUs are created with PSCI 0.2), so only the Hypervisor.framework
//! backend uses this. It never touches guest registers itself.

/// `PSCI_VERSION`.
pub const VERSION: u32 = 0x8400_0000;
/// `CPU_SUSPEND`, SMC32 form.
pub const CPU_SUSPEND_32: u32 = 0x8400_0001;
/// `CPU_SUSPEND`, SMC64 form.
pub const CPU_SUSPEND_64: u32 = 0xc400_0001;
/// `CPU_OFF`.
pub const CPU_OFF: u32 = 0x8400_0002;
/// `CPU_ON`, SMC32 form.
pub const CPU_ON_32: u32 = 0x8400_0003;
/// `CPU_ON`, SMC64 form.
pub const CPU_ON_64: u32 = 0xc400_0003;
/// `AFFINITY_INFO`, SMC32 form.
pub const AFFINITY_INFO_32: u32 = 0x8400_0004;
/// `AFFINITY_INFO`, SMC64 form.
pub const AFFINITY_INFO_64: u32 = 0xc400_0004;
/// `MIGRATE_INFO_TYPE`.
pub const MIGRATE_INFO_TYPE: u32 = 0x8400_0006;
/// `SYSTEM_OFF`.
pub const SYSTEM_OFF: u32 = 0x8400_0008;
/// `SYSTEM_RESET`.
pub const SYSTEM_RESET: u32 = 0x8400_0009;
/// `PSCI_FEATURES`.
pub const FEATURES: u32 = 0x8400_000a;
/// SMCCC `SMCCC_VERSION`.
pub const SMCCC_VERSION: u32 = 0x8000_0000;

/// PSCI return codes (written to x0).
pub mod ret {
    /// The call succeeded.
    pub const SUCCESS: i64 = 0;
    /// The function is not implemented.
    pub const NOT_SUPPORTED: i64 = -1;
    /// An argument is invalid.
    pub const INVALID_PARAMETERS: i64 = -2;
    /// The call is refused.
    pub const DENIED: i64 = -3;
    /// `CPU_ON` of a CPU that is already on.
    pub const ALREADY_ON: i64 = -4;
    /// `CPU_ON` of a CPU that is being turned on.
    pub const ON_PENDING: i64 = -5;
    /// `CPU_ON` with an entry point outside RAM.
    pub const INVALID_ADDRESS: i64 = -9;
}

/// The PSCI version the Hypervisor.framework backend reports: 1.0.
pub const REPORTED_VERSION: u32 = 1 << 16;

/// One decoded PSCI (or SMCCC version) call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PsciCall {
    /// `PSCI_VERSION`.
    Version,
    /// `CPU_SUSPEND`: idle the calling CPU until an interrupt.
    CpuSuspend {
        /// Requested power state.
        power_state: u64,
        /// Where a powerdown state resumes.
        entry: u64,
        /// x0 at `entry`.
        context: u64,
    },
    /// `CPU_OFF`: the calling CPU leaves; it never returns on success.
    CpuOff,
    /// `CPU_ON`: start the CPU whose MPIDR affinity is `target` at `entry`
    /// with x0 = `context`.
    CpuOn {
        /// MPIDR affinity fields of the CPU to start.
        target: u64,
        /// Guest-physical entry point.
        entry: u64,
        /// x0 at `entry`.
        context: u64,
    },
    /// `AFFINITY_INFO`: is `target` on (0), off (1) or pending (2)?
    AffinityInfo {
        /// MPIDR affinity fields asked about.
        target: u64,
        /// Lowest affinity level asked about.
        lowest_level: u64,
    },
    /// `MIGRATE_INFO_TYPE`.
    MigrateInfoType,
    /// `SYSTEM_OFF`.
    SystemOff,
    /// `SYSTEM_RESET`.
    SystemReset,
    /// `PSCI_FEATURES`: is `function` implemented?
    Features {
        /// The function id asked about.
        function: u32,
    },
    /// SMCCC `SMCCC_VERSION`.
    SmcccVersion,
    /// Any other function id.
    Unknown {
        /// The function id from w0.
        function: u32,
    },
}

impl PsciCall {
    /// Decodes a call from x0..x3 as the guest left them at its `hvc`/`smc`.
    /// SMC32 forms take 32-bit arguments, so the upper halves are dropped.
    pub fn decode(x: [u64; 4]) -> Self {
        let function = x[0] as u32;
        let arg = |i: usize| {
            if function & 0x4000_0000 == 0 {
                x[i] & 0xffff_ffff
            } else {
                x[i]
            }
        };
        match function {
            VERSION => Self::Version,
            CPU_SUSPEND_32 | CPU_SUSPEND_64 => Self::CpuSuspend {
                power_state: arg(1),
                entry: arg(2),
                context: arg(3),
            },
            CPU_OFF => Self::CpuOff,
            CPU_ON_32 | CPU_ON_64 => Self::CpuOn {
                target: arg(1),
                entry: arg(2),
                context: arg(3),
            },
            AFFINITY_INFO_32 | AFFINITY_INFO_64 => Self::AffinityInfo {
                target: arg(1),
                lowest_level: arg(2),
            },
            MIGRATE_INFO_TYPE => Self::MigrateInfoType,
            SYSTEM_OFF => Self::SystemOff,
            SYSTEM_RESET => Self::SystemReset,
            FEATURES => Self::Features {
                function: x[1] as u32,
            },
            SMCCC_VERSION => Self::SmcccVersion,
            function => Self::Unknown { function },
        }
    }

    /// The x0 value for calls answered without any VMM state (version,
    /// features, migration type, unknown ids); `None` for the calls the VMM
    /// (or the backend, for SYSTEM_OFF/RESET) must act on.
    pub fn stateless_answer(&self) -> Option<i64> {
        match *self {
            Self::Version => Some(REPORTED_VERSION.into()),
            Self::SmcccVersion => Some(0x1_0001), // SMCCC 1.1
            // 2: no Trusted OS to migrate.
            Self::MigrateInfoType => Some(2),
            Self::Features { function } => Some(if implemented(function) {
                ret::SUCCESS
            } else {
                ret::NOT_SUPPORTED
            }),
            Self::Unknown { .. } => Some(ret::NOT_SUPPORTED),
            _ => None,
        }
    }
}

fn implemented(function: u32) -> bool {
    matches!(
        function,
        VERSION
            | CPU_SUSPEND_32
            | CPU_SUSPEND_64
            | CPU_OFF
            | CPU_ON_32
            | CPU_ON_64
            | AFFINITY_INFO_32
            | AFFINITY_INFO_64
            | MIGRATE_INFO_TYPE
            | SYSTEM_OFF
            | SYSTEM_RESET
            | FEATURES
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_on_smc64_keeps_its_64_bit_arguments() {
        let call = PsciCall::decode([CPU_ON_64.into(), 0x101, 0x8_8000_0000, 0xdead_beef_0000]);
        assert_eq!(
            call,
            PsciCall::CpuOn {
                target: 0x101,
                entry: 0x8_8000_0000,
                context: 0xdead_beef_0000
            }
        );
        assert_eq!(call.stateless_answer(), None);
    }

    #[test]
    fn smc32_calls_drop_the_upper_half_of_their_arguments() {
        let call = PsciCall::decode([CPU_ON_32.into(), 0xffff_0000_0000_0001, 0x1_4000_0000, 7]);
        assert_eq!(
            call,
            PsciCall::CpuOn {
                target: 1,
                entry: 0x4000_0000,
                context: 7
            }
        );
    }

    #[test]
    fn the_upper_half_of_x0_does_not_change_the_function() {
        let call = PsciCall::decode([0xffff_ffff_0000_0000 | u64::from(SYSTEM_OFF), 0, 0, 0]);
        assert_eq!(call, PsciCall::SystemOff);
    }

    #[test]
    fn version_reports_psci_1_0_and_smccc_1_1() {
        assert_eq!(
            PsciCall::decode([VERSION.into(), 0, 0, 0]).stateless_answer(),
            Some(0x1_0000)
        );
        let smccc = PsciCall::decode([SMCCC_VERSION.into(), 0, 0, 0]);
        assert_eq!(smccc.stateless_answer(), Some(0x1_0001));
    }

    #[test]
    fn features_says_which_functions_exist() {
        let on = PsciCall::decode([FEATURES.into(), CPU_ON_64.into(), 0, 0]);
        assert_eq!(on.stateless_answer(), Some(ret::SUCCESS));
        let suspend = PsciCall::decode([FEATURES.into(), 0x8400_000e, 0, 0]);
        assert_eq!(suspend.stateless_answer(), Some(ret::NOT_SUPPORTED));
    }

    #[test]
    fn an_unknown_function_is_answered_not_supported() {
        let call = PsciCall::decode([0xc200_0000, 0, 0, 0]);
        assert_eq!(
            call,
            PsciCall::Unknown {
                function: 0xc200_0000
            }
        );
        assert_eq!(call.stateless_answer(), Some(ret::NOT_SUPPORTED));
    }

    #[test]
    fn system_off_and_reset_are_left_to_the_backend() {
        for f in [SYSTEM_OFF, SYSTEM_RESET, CPU_OFF] {
            assert_eq!(
                PsciCall::decode([f.into(), 0, 0, 0]).stateless_answer(),
                None
            );
        }
    }
}
