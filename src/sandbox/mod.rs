//! Sandboxes: which backend runs one, and the helper process (`boxdesk
//! __vmm`) that owns it for its whole life.
//!
//! `kvm` boots a microVM ([`crate::vmm`]) when the hypervisor can really
//! run a 64-bit guest (`boxdesk_hv::probe`, cached per boot); `auto` picks
//! it then and the namespace backend otherwise; `hvf` is macOS-only and not
//! wired into the helper yet. This module must never let a namespace
//! sandbox describe itself as a VM.

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
    #[error("the {0} backend is not available yet; use --backend namespace or kvm (or auto)")]
    NotYet(Backend),
    /// The hypervisor here cannot boot a VM.
    #[error("the kvm backend cannot run here: the hypervisor probe says {0}; use --backend namespace (or auto)")]
    CannotBoot(String),
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
    /// The backend that will really run: `kvm` only where the hypervisor
    /// probe says a VM can boot (else a clear error naming what the probe
    /// found); `auto` is `kvm` then and when a guest image is installed,
    /// `namespace` otherwise; `hvf` is refused.
    pub fn resolve(self) -> Result<Backend, BackendError> {
        match self {
            Backend::Namespace => Ok(Backend::Namespace),
            Backend::Hvf => Err(BackendError::NotYet(Backend::Hvf)),
            Backend::Kvm => match probe_cached() {
                (true, _) => Ok(Backend::Kvm),
                (false, why) => Err(BackendError::CannotBoot(why)),
            },
            Backend::Auto => {
                if !std::path::Path::new("/dev/kvm").exists() {
                    return Ok(Backend::Namespace);
                }
                let has_image = crate::vmm::image::find("x86_64", None, None).is_ok();
                Ok(if has_image && probe_cached().0 {
                    Backend::Kvm
                } else {
                    Backend::Namespace
                })
            }
        }
    }
}

/// `boxdesk_hv::probe()` (a tiny guest under a 40 ms deadline), remembered
/// for this boot in the runtime dir so `auto` costs one file read after
/// the first run: whether a VM can boot, and the probe's words.
pub fn probe_cached() -> (bool, String) {
    let boot_id = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap_or_default();
    let boot_id = boot_id.trim();
    let cache = boxdesk_platform::dirs::runtime_dir()
        .ok()
        .map(|d| d.join("hv-probe"));
    if let Some(text) = cache.as_ref().and_then(|c| std::fs::read_to_string(c).ok()) {
        let mut parts = text.splitn(3, '\n');
        if let (Some(id), Some(ok), Some(words)) = (parts.next(), parts.next(), parts.next()) {
            if id == boot_id && !boot_id.is_empty() {
                return (ok == "1", words.to_owned());
            }
        }
    }
    let p = boxdesk_hv::probe();
    let outcome = (p.can_boot(), p.to_string());
    if let Some(c) = cache {
        let tmp = c.with_extension("tmp");
        let text = format!("{boot_id}\n{}\n{}", u8::from(outcome.0), outcome.1);
        if std::fs::write(&tmp, text).is_ok() {
            let _ = std::fs::rename(&tmp, &c);
        }
    }
    outcome
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kvm_is_refused_with_the_probes_words_where_it_cannot_boot_and_auto_falls_back() {
        let (can_boot, words) = probe_cached();
        let kvm = "kvm".parse::<Backend>().unwrap().resolve();
        if can_boot {
            assert_eq!(kvm, Ok(Backend::Kvm));
            println!("skipped: this machine's KVM can boot; the refusal is not testable here");
        } else {
            let e = kvm.unwrap_err().to_string();
            assert!(e.contains(&words), "{e}");
            assert_eq!(Backend::Auto.resolve(), Ok(Backend::Namespace));
        }
        assert!("qemu".parse::<Backend>().is_err());
        assert!(Backend::Hvf.resolve().is_err());
    }
}
