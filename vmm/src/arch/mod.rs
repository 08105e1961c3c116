//! Per-arch guest layout and vCPU set-up: where RAM, tables, the kernel and
//! the devices go, and the registers a boot vCPU starts with.
//!
//! [`aarch64`]'s layout, loader, device tree and PSCI state are portable
//! and unit-tested on every host; its `machine` and all of [`x86_64`] (KVM
//! register types) build only where they run. `host` is the machine of the
//! host's arch: KVM and Hypervisor.framework run guests of their own arch.

pub mod aarch64;
#[cfg(any(test, feature = "fuzzing"))]
pub mod fuzzing;
#[cfg(all(target_os = "linux", target_arch = "x86_64"))]
pub mod x86_64;

#[cfg(target_arch = "aarch64")]
pub use self::aarch64::{machine as host, ArchError};
#[cfg(all(target_os = "linux", target_arch = "x86_64"))]
pub use self::x86_64::{machine as host, ArchError};
