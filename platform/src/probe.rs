//! Capability probes for `boxdesk doctor`: is bubblewrap installed, can we
//! open `/dev/kvm`, may we create user namespaces.
//!
//! This module owns reporting what the host offers, each answer with the
//! reason and a hint. It must never change the host (no sysctl, no chmod,
//! no module loading) and never decide the backend: `--backend auto` still
//! probes a real VM in the hypervisor crate before trusting `/dev/kvm`.

mod bwrap;
mod kvm;
mod userns;

use std::fmt;

pub use bwrap::bwrap;
pub use kvm::dev_kvm;
pub use userns::user_namespaces;

/// The outcome of one probe.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Probe {
    /// The capability is there.
    Available {
        /// What was found, e.g. the path and version of `bwrap`.
        detail: String,
    },
    /// The capability is absent or unusable.
    Missing {
        /// What is wrong, naming the path or setting that failed.
        why: String,
        /// What the user can do about it, when there is something.
        hint: Option<String>,
    },
}

impl Probe {
    /// Whether the capability is there.
    pub fn is_available(&self) -> bool {
        matches!(self, Probe::Available { .. })
    }

    fn missing(why: impl Into<String>, hint: Option<&str>) -> Self {
        Probe::Missing {
            why: why.into(),
            hint: hint.map(str::to_owned),
        }
    }
}

impl fmt::Display for Probe {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Probe::Available { detail } => write!(f, "available: {detail}"),
            Probe::Missing { why, hint: None } => write!(f, "missing: {why}"),
            Probe::Missing {
                why,
                hint: Some(hint),
            } => write!(f, "missing: {why}; try: {hint}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_probe_displays_its_reason_and_hint() {
        let p = Probe::missing("bwrap is not on PATH", Some("apt-get install bubblewrap"));
        assert_eq!(
            p.to_string(),
            "missing: bwrap is not on PATH; try: apt-get install bubblewrap"
        );
        assert!(!p.is_available());
    }

    #[test]
    fn an_available_probe_displays_its_detail() {
        let p = Probe::Available {
            detail: "/usr/bin/bwrap: bubblewrap 0.9.0".into(),
        };
        assert_eq!(p.to_string(), "available: /usr/bin/bwrap: bubblewrap 0.9.0");
        assert!(p.is_available());
    }
}
