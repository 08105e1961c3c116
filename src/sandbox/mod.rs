//! Sandboxes: which backend runs one, and the helper process (`boxdesk
//! __vmm`) that owns it for its whole life.
//!
//! Only the namespace backend exists; `kvm` and `hvf` are named so that
//! asking for them gets a clear "not available yet" rather than a silent
//! fallback. This module must never let a namespace sandbox describe
//! itself as a VM.

pub mod forward;
pub mod helper;
pub mod lock;
pub mod namespace;
pub mod seccomp;

use std::fmt;
use std::str::FromStr;

/// A backend a user can ask for (`--backend`, `BOXDESK_BACKEND`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// The best one that can run here.
    Auto,
    /// Linux KVM.
    Kvm,
    /// macOS Hypervisor.framework.
    Hvf,
    /// bubblewrap namespaces.
    Namespace,
}

/// Why a backend cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BackendError {
    /// The word names no backend.
    #[error("unknown backend {0:?}; expected auto, kvm, hvf or namespace")]
    Unknown(String),
    /// The backend is named in the design but not built yet.
    #[error("the {0} backend is not available yet: boxdesk has no VM backend so far; use --backend namespace (or auto)")]
    NotYet(Backend),
}

impl FromStr for Backend {
    type Err = BackendError;

    fn from_str(s: &str) -> Result<Self, BackendError> {
        match s {
            "auto" => Ok(Backend::Auto),
            "kvm" => Ok(Backend::Kvm),
            "hvf" => Ok(Backend::Hvf),
            "namespace" => Ok(Backend::Namespace),
            other => Err(BackendError::Unknown(other.to_owned())),
        }
    }
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Backend::Auto => "auto",
            Backend::Kvm => "kvm",
            Backend::Hvf => "hvf",
            Backend::Namespace => "namespace",
        })
    }
}

impl Backend {
    /// The backend that will really run: `auto` is `namespace` until a VM
    /// backend exists; `kvm` and `hvf` are refused.
    pub fn resolve(self) -> Result<Backend, BackendError> {
        match self {
            Backend::Auto | Backend::Namespace => Ok(Backend::Namespace),
            other => Err(BackendError::NotYet(other)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_resolves_to_namespace_and_vm_backends_are_not_available_yet() {
        assert_eq!(Backend::Auto.resolve(), Ok(Backend::Namespace));
        let e = "kvm".parse::<Backend>().unwrap().resolve().unwrap_err();
        assert!(e.to_string().contains("not available yet"), "{e}");
        assert!("qemu".parse::<Backend>().is_err());
    }
}
