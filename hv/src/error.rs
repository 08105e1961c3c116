//! The crate-wide error: what any trait method can fail with.
//!
//! Backends keep their own enums (`KvmError`, `HvfError`); this one only wraps
//! them and adds the failures every backend shares.

use crate::memory::MemoryError;

/// Why a [`Hypervisor`](crate::Hypervisor), [`Vm`](crate::Vm) or
/// [`Vcpu`](crate::Vcpu) call failed.
#[derive(Debug, thiserror::Error)]
pub enum HvError {
    /// The KVM backend failed.
    #[cfg(kvm)]
    #[error(transparent)]
    Kvm(#[from] crate::kvm::KvmError),
    /// The Hypervisor.framework backend failed.
    #[cfg(hvf)]
    #[error(transparent)]
    Hvf(#[from] crate::hvf::HvfError),
    /// A guest memory mapping was refused.
    #[error(transparent)]
    Memory(#[from] MemoryError),
    /// `complete_read` was called but no MMIO/PIO read is waiting for data.
    #[error("no mmio or pio read is waiting for data")]
    NoPendingRead,
    /// `complete_read` got a different number of bytes than the guest asked for.
    #[error("read completion has {got} bytes, the guest asked for {want}")]
    ReadLength {
        /// Bytes the guest's access needs.
        want: usize,
        /// Bytes the caller passed.
        got: usize,
    },
    /// The operation is not available on this backend or host.
    #[error("not supported here: {0}")]
    Unsupported(&'static str),
}
