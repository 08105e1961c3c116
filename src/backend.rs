//! Which backend runs a sandbox. It lives in the binary because it needs
//! both sides: the VMM's image lookup and the hypervisor probe.
//!
//! `kvm` (Linux) and `hvf` (macOS on Apple silicon) boot a microVM
//! ([`boxdesk_vmm`]) when the hypervisor can really run a guest
//! (`boxdesk_hv::probe`, cached per boot); `auto` picks this OS's one then
//! and the namespace backend otherwise. The namespace backend
//! (`boxdesk_sandbox::namespace`) exists on Linux only; elsewhere asking
//! for it (or for `auto` with no VM backend) is a clear error. This module
//! must never let a namespace sandbox describe itself as a VM.

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
    /// The backend exists on Linux only.
    #[error("the {0} backend needs Linux")]
    NeedsLinux(Backend),
    /// The backend exists on macOS on Apple silicon only.
    #[error(
        "the {0} backend needs macOS on Apple silicon; on Linux use kvm or namespace (or auto)"
    )]
    NeedsMac(Backend),
    /// `auto` found nothing that runs on this OS (macOS: no namespace
    /// backend, and hvf cannot boot or has no image).
    #[error("no backend can run here: the namespace backend needs Linux and the hvf backend cannot run ({0})")]
    NoneHere(String),
    /// The hypervisor here cannot boot a VM.
    #[error("the {0} backend cannot run here: the hypervisor probe says {1}; {hint}", hint = if cfg!(target_os = "linux") { "use --backend namespace (or auto)" } else { "see boxdesk doctor" })]
    CannotBoot(Backend, String),
    /// `--net` asked of a backend that has no network to give yet.
    #[error("--net is not available with the {0} backend yet: VMs have no network device; use --backend namespace for a sandbox with the host's network")]
    NoNet(Backend),
    /// `--kernel`, `--initrd` or `--rootfs` asked of a backend that boots
    /// nothing.
    #[error(
        "--kernel, --initrd and --rootfs need the {vm} backend (this sandbox uses {0})",
        vm = Backend::HOST_VM
    )]
    BootsNothing(Backend),
    /// `--share` or `--root host` asked of a backend with no file server.
    #[error("--share and --root host are not available with the {0} backend: boxdesk's virtio-fs server runs on Linux hosts only (it needs O_PATH and /proc/self/fd); use a Linux host")]
    NoShares(Backend),
    /// `--display` asked of a backend with no devices.
    #[error("--display needs the {vm} backend: the {0} backend has no screen or input devices", vm = Backend::HOST_VM)]
    NoDisplay(Backend),
}

/// The `run` flags that only some backends can honour.
#[derive(Debug, Clone, Copy, Default)]
pub struct Asks {
    /// `--net`: the host's network.
    pub net: bool,
    /// `--kernel`, `--initrd` or `--rootfs`: what a VM boots.
    pub boot: bool,
    /// `--share` or `--root host`: host folders inside.
    pub shares: bool,
    /// `--display`: a screen and input devices.
    pub display: bool,
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
    /// This OS's VM backend: `kvm` on Linux, `hvf` on macOS.
    pub const HOST_VM: Backend = if cfg!(target_os = "macos") {
        Backend::Hvf
    } else {
        Backend::Kvm
    };

    /// Whether this backend boots a VM (`kvm`, `hvf`).
    pub fn is_vm(self) -> bool {
        matches!(self, Backend::Kvm | Backend::Hvf)
    }

    /// Refuses, before anything starts, what this (resolved) backend cannot
    /// honour: the one place the CLI learns what a backend can do. The
    /// backends refuse the same at start ([`boxdesk_sandbox::running::
    /// StartError`]); this only says it sooner.
    pub fn refuse(self, asks: Asks) -> Result<(), BackendError> {
        if self.is_vm() && asks.net {
            return Err(BackendError::NoNet(self));
        }
        if !self.is_vm() && asks.boot {
            return Err(BackendError::BootsNothing(self));
        }
        if self == Backend::Hvf && asks.shares {
            return Err(BackendError::NoShares(self));
        }
        if !self.is_vm() && asks.display {
            return Err(BackendError::NoDisplay(self));
        }
        Ok(())
    }

    /// The backend that will really run: the VM backend of this OS (`kvm`
    /// on Linux, `hvf` on macOS) only where the hypervisor probe says a VM
    /// can boot (else a clear error naming what the probe found); the other
    /// OS's is refused. `auto` is the VM backend when it can boot and a
    /// guest image is installed, else `namespace` on Linux (and an error
    /// naming why on macOS, which has no namespace backend).
    pub fn resolve(self) -> Result<Backend, BackendError> {
        match self {
            Backend::Namespace if !cfg!(target_os = "linux") => Err(BackendError::NeedsLinux(self)),
            Backend::Namespace => Ok(Backend::Namespace),
            Backend::Kvm | Backend::Hvf if self != Self::HOST_VM => Err(match self {
                Backend::Kvm => BackendError::NeedsLinux(self),
                _ => BackendError::NeedsMac(self),
            }),
            Backend::Kvm | Backend::Hvf => match probe_cached() {
                (true, _) => Ok(self),
                (false, why) => Err(BackendError::CannotBoot(self, why)),
            },
            Backend::Auto => match vm_here() {
                Ok(b) => Ok(b),
                Err(_) if cfg!(target_os = "linux") => Ok(Backend::Namespace),
                Err(why) => Err(BackendError::NoneHere(why)),
            },
        }
    }
}

/// The VM backend `auto` picks where a VM can boot here (the hypervisor
/// probe says so and a guest image is installed), else why not.
pub fn vm_here() -> Result<Backend, String> {
    if cfg!(target_os = "linux") && !std::path::Path::new("/dev/kvm").exists() {
        return Err("no /dev/kvm".to_owned());
    }
    boxdesk_vmm::image::find(std::env::consts::ARCH, None, None).map_err(|e| e.to_string())?;
    match probe_cached() {
        (true, _) => Ok(Backend::HOST_VM),
        (false, why) => Err(why),
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
            if cfg!(target_os = "linux") {
                assert_eq!(Backend::Auto.resolve(), Ok(Backend::Namespace));
            }
        }
        assert!("qemu".parse::<Backend>().is_err());
        let other = if Backend::HOST_VM == Backend::Kvm {
            Backend::Hvf
        } else {
            Backend::Kvm
        };
        let e = other.resolve().unwrap_err().to_string();
        assert!(e.contains("needs"), "{e}");
    }

    #[test]
    fn shares_are_refused_on_hvf_only_and_the_reason_names_the_missing_server() {
        let shares = Asks {
            shares: true,
            ..Asks::default()
        };
        let e = Backend::Hvf.refuse(shares).unwrap_err().to_string();
        assert!(
            e.contains("--share and --root host are not available with the hvf backend"),
            "{e}"
        );
        assert!(e.contains("Linux hosts only"), "{e}");
        assert!(Backend::Kvm.refuse(shares).is_ok());
        assert!(Backend::Namespace.refuse(shares).is_ok());
    }

    #[test]
    fn the_namespace_backend_is_linux_only_and_says_so_elsewhere() {
        let ns = Backend::Namespace.resolve();
        if cfg!(target_os = "linux") {
            assert_eq!(ns, Ok(Backend::Namespace));
        } else {
            let e = ns.unwrap_err().to_string();
            assert_eq!(e, "the namespace backend needs Linux");
            assert!(matches!(
                Backend::Auto.resolve(),
                Ok(Backend::Hvf) | Err(BackendError::NoneHere(_))
            ));
        }
    }
}
