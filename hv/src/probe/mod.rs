//! [`probe()`]: what this host can really run, found by running a short
//! guest loop under a deadline — not by the existence of `/dev/kvm`.
//!
//! Hardware KVM (or KVM nested under qemu TCG, which is a complete KVM) runs
//! the loop in well under a millisecond. An emulating nested KVM (kvm_pvm's
//! instruction emulator) takes about half a microsecond per instruction, and
//! cannot run everything a kernel needs (`int3`, `xrstor`), so it is reported
//! as `accelerated: false`: good for tests, not for booting Linux. This module
//! owns the probe guest's private memory layout; it decides nothing for the
//! VMM.

#[cfg(any(kvm, hvf))]
mod payload;

use std::fmt;
#[cfg(any(kvm, hvf))]
use std::time::Duration;

/// What the host can run, as [`probe()`] found it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Probe {
    /// KVM works. `accelerated: false` means guest code runs, but through a
    /// slow instruction emulator that cannot boot Linux.
    Kvm {
        /// The probe loop finished within the deadline.
        accelerated: bool,
    },
    /// Hypervisor.framework works.
    Hvf,
    /// No hypervisor can run a guest here.
    None {
        /// Why not, for the user.
        why: String,
    },
}

impl Probe {
    /// Whether a VM backend should be used (an accelerated hypervisor).
    pub fn can_boot(&self) -> bool {
        matches!(self, Self::Kvm { accelerated: true } | Self::Hvf)
    }
}

impl fmt::Display for Probe {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Kvm { accelerated: true } => f.write_str("kvm (accelerated)"),
            Self::Kvm { accelerated: false } => {
                f.write_str("kvm (emulated: guest code runs slowly and cannot boot Linux)")
            }
            Self::Hvf => f.write_str("hvf (Hypervisor.framework)"),
            Self::None { why } => write!(f, "none ({why})"),
        }
    }
}

/// How long the probe loop may take before the hypervisor counts as
/// emulated. The loop is ~6×10⁵ instructions: under 1 ms on hardware or
/// nested-under-TCG KVM, ~300 ms on an emulating KVM.
#[cfg(any(kvm, hvf))]
const DEADLINE: Duration = Duration::from_millis(40);

/// Probes the host's hypervisor by running a short guest under a deadline.
/// Takes at most about 50 ms; creates and drops one VM (on
/// Hypervisor.framework, do it before the VMM creates its own).
pub fn probe() -> Probe {
    cfg_if::cfg_if! {
        if #[cfg(any(kvm, hvf))] {
            let outcome = payload::run::<crate::DefaultHypervisor>(DEADLINE);
            classify(outcome, cfg!(hvf))
        } else {
            Probe::None { why: "no supported hypervisor on this OS".into() }
        }
    }
}

/// How the probe guest ended.
#[derive(Debug)]
#[cfg_attr(not(any(kvm, hvf)), allow(dead_code))]
enum Outcome {
    /// It reached its final exit in time.
    Finished,
    /// The deadline kicked it first.
    TooSlow,
    /// The hypervisor could not run one of its instructions (the reason is
    /// kept for `Debug`).
    EmulationFailure(#[allow(dead_code)] String),
    /// No VM could be created or run.
    Unavailable(String),
}

#[cfg_attr(not(any(kvm, hvf)), allow(dead_code))]
fn classify(outcome: Outcome, hvf: bool) -> Probe {
    match (outcome, hvf) {
        (Outcome::Unavailable(why), _) => Probe::None { why },
        (Outcome::Finished, true) => Probe::Hvf,
        (Outcome::TooSlow | Outcome::EmulationFailure(_), true) => Probe::None {
            why: "Hypervisor.framework did not run the probe guest".into(),
        },
        (Outcome::Finished, false) => Probe::Kvm { accelerated: true },
        (Outcome::TooSlow | Outcome::EmulationFailure(_), false) => {
            Probe::Kvm { accelerated: false }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kvm_that_misses_the_deadline_is_reported_as_emulated() {
        assert_eq!(
            classify(Outcome::TooSlow, false),
            Probe::Kvm { accelerated: false }
        );
        let failed = Outcome::EmulationFailure("int3".into());
        assert_eq!(classify(failed, false), Probe::Kvm { accelerated: false });
        assert!(!Probe::Kvm { accelerated: false }.can_boot());
    }

    #[test]
    fn a_kvm_that_finishes_in_time_is_accelerated() {
        let probe = classify(Outcome::Finished, false);
        assert_eq!(probe, Probe::Kvm { accelerated: true });
        assert!(probe.can_boot());
    }

    #[test]
    fn a_missing_hypervisor_says_why() {
        let probe = classify(Outcome::Unavailable("/dev/kvm: no such file".into()), false);
        assert_eq!(probe.to_string(), "none (/dev/kvm: no such file)");
    }

    #[test]
    fn hvf_counts_only_when_the_guest_finished() {
        assert_eq!(classify(Outcome::Finished, true), Probe::Hvf);
        assert!(matches!(
            classify(Outcome::TooSlow, true),
            Probe::None { .. }
        ));
    }
}
