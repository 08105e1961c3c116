//! Guest-architecture types: registers and VM configuration.
//!
//! Both arches are plain data, compiled on every host so portable code (the
//! syndrome decoder, the userspace GIC) and its tests build everywhere.
//! [`Regs`] and [`VmConfig`] name the host arch's types: KVM and
//! Hypervisor.framework only run guests of the host's own arch. Nothing here
//! talks to a hypervisor or decides where anything lives in the guest.

pub mod aarch64;
pub mod x86_64;

cfg_if::cfg_if! {
    if #[cfg(target_arch = "x86_64")] {
        pub use self::x86_64::{Regs, VmConfig};
    } else if #[cfg(target_arch = "aarch64")] {
        pub use self::aarch64::{Regs, VmConfig};
    } else {
        /// Registers of a guest of the host's arch (none on this host).
        pub type Regs = ();
        /// VM configuration for the host's arch (none on this host).
        pub type VmConfig = ();
    }
}
