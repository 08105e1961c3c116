//! The KVM backend (`#[cfg(kvm)]`: Linux), x86_64 and aarch64 hosts, over
//! rust-vmm's `kvm-ioctls`.
//!
//! Owns `/dev/kvm`, VM and vCPU file descriptors, memory slots, the in-kernel
//! interrupt controller (x86_64: PIC/IOAPIC/LAPIC + PIT; aarch64: vGICv3) and
//! the kick signal. Arch specifics live in `x86_64.rs` / `aarch64.rs`; the
//! rest is shared. Extras only KVM has (irqfd, CPUID, MSRs, FPU, LAPIC,
//! one-reg system registers) are inherent methods on [`KvmVm`] and
//! [`KvmVcpu`]. It must never decide guest layout (TSS and GIC addresses come
//! from [`VmConfig`]) and never block a signal it does not own.
//!
//! Kicks: each vCPU thread gets a handler for [`kick_signal()`] (SIGRTMIN);
//! a kick sets a flag and signals the thread; the handler sets `kvm_run`'s
//! `immediate_exit`, so `KVM_RUN` returns `EINTR` even when the signal lands
//! just before entry.

mod kick;
mod vcpu;
mod vm;

#[cfg(target_arch = "aarch64")]
mod aarch64;
#[cfg(target_arch = "x86_64")]
mod x86_64;

use std::sync::Arc;

use kvm_ioctls::Cap;

pub use kick::{kick_signal, KvmKick};
pub use vcpu::KvmVcpu;
pub use vm::KvmVm;

use crate::{Capabilities, HvError, Hypervisor, VmConfig};

/// Why a KVM call failed; the source is the errno.
#[derive(Debug, thiserror::Error)]
pub enum KvmError {
    /// `/dev/kvm` could not be opened.
    #[error("cannot open /dev/kvm")]
    Open(#[source] kvm_ioctls::Error),
    /// The KVM API version is not 12.
    #[error("unsupported kvm api version {0}")]
    ApiVersion(i32),
    /// A required capability is missing.
    #[error("kvm lacks {0}")]
    MissingCap(&'static str),
    /// `KVM_CREATE_VM` failed.
    #[error("cannot create vm")]
    CreateVm(#[source] kvm_ioctls::Error),
    /// Setting up the interrupt controller (irqchip, PIT, TSS, vGIC) failed.
    #[error("cannot set up the interrupt controller: {0}")]
    IrqChip(&'static str, #[source] kvm_ioctls::Error),
    /// `KVM_CREATE_VCPU` or vCPU initialisation failed.
    #[error("cannot create vcpu {0}")]
    CreateVcpu(u32, #[source] kvm_ioctls::Error),
    /// `KVM_SET_USER_MEMORY_REGION` failed.
    #[error("cannot map guest memory at {0:#x}")]
    MapMemory(u64, #[source] kvm_ioctls::Error),
    /// `KVM_GET_DIRTY_LOG` failed.
    #[error("cannot read the dirty log of slot {0}")]
    DirtyLog(u32, #[source] kvm_ioctls::Error),
    /// `KVM_RUN` failed.
    #[error("kvm_run failed")]
    Run(#[source] kvm_ioctls::Error),
    /// A register get/set ioctl failed.
    #[error("cannot access vcpu registers ({0})")]
    Regs(&'static str, #[source] kvm_ioctls::Error),
    /// `KVM_IRQ_LINE` or irqfd registration failed.
    #[error("cannot drive interrupt line {0}")]
    IrqLine(u32, #[source] kvm_ioctls::Error),
    /// `KVM_IOEVENTFD` registration failed.
    #[error("cannot register an ioeventfd at {0:#x}")]
    IoEvent(u64, #[source] kvm_ioctls::Error),
    /// CPUID or MSR ioctls failed.
    #[error("cannot {0}")]
    Cpu(&'static str, #[source] kvm_ioctls::Error),
    /// The kick signal handler could not be installed.
    #[error("cannot install the vcpu kick signal handler")]
    Signal(#[source] std::io::Error),
}

/// An open `/dev/kvm`.
#[derive(Debug)]
pub struct Kvm {
    kvm: Arc<kvm_ioctls::Kvm>,
}

impl Kvm {
    /// The underlying `kvm-ioctls` handle, for what this crate does not wrap.
    pub fn raw(&self) -> &kvm_ioctls::Kvm {
        &self.kvm
    }
}

impl Hypervisor for Kvm {
    type Vm = KvmVm;

    fn open() -> Result<Self, HvError> {
        let kvm = kvm_ioctls::Kvm::new().map_err(KvmError::Open)?;
        let version = kvm.get_api_version();
        if version != 12 {
            return Err(KvmError::ApiVersion(version).into());
        }
        for (cap, name) in [
            (Cap::UserMemory, "KVM_CAP_USER_MEMORY"),
            (Cap::ImmediateExit, "KVM_CAP_IMMEDIATE_EXIT"),
        ] {
            if !kvm.check_extension(cap) {
                return Err(KvmError::MissingCap(name).into());
            }
        }
        Ok(Self { kvm: Arc::new(kvm) })
    }

    fn capabilities(&self) -> Capabilities {
        let kvm = &self.kvm;
        // SAFETY: sysconf has no memory-safety preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        Capabilities {
            max_vcpus: kvm.get_max_vcpus() as u32,
            max_memory_slots: kvm.get_nr_memslots() as u32,
            page_size: u64::try_from(page).unwrap_or(4096),
            irqchip: kvm.check_extension(Cap::Irqchip),
            read_only_memory: kvm.check_extension(Cap::ReadonlyMem),
            dirty_log: true,
            ipa_bits: ipa_bits(kvm),
        }
    }

    fn create_vm(&self, config: &VmConfig) -> Result<KvmVm, HvError> {
        KvmVm::new(Arc::clone(&self.kvm), config)
    }
}

#[cfg(target_arch = "aarch64")]
fn ipa_bits(kvm: &kvm_ioctls::Kvm) -> u32 {
    match kvm.get_host_ipa_limit() {
        n if n > 0 => n as u32,
        _ => 40,
    }
}

#[cfg(not(target_arch = "aarch64"))]
fn ipa_bits(_: &kvm_ioctls::Kvm) -> u32 {
    0
}
