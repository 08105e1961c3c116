//! [`VcpuExit`]: why [`Vcpu::run`](crate::Vcpu::run) returned, as plain
//! owned data.
//!
//! Nothing here borrows a backend's buffers (KVM's `kvm_run` page, HVF's exit
//! struct): a read is answered later with
//! [`Vcpu::complete_read`](crate::Vcpu::complete_read), so KVM and
//! Hypervisor.framework look the same to the VMM. This module never touches a
//! backend.

use std::fmt;
use std::ops::Deref;

use crate::psci::PsciCall;

/// Up to 8 bytes of MMIO or port I/O data, stored inline.
#[derive(Clone, Copy, PartialEq, Eq, Default)]
pub struct IoData {
    bytes: [u8; 8],
    len: u8,
}

impl IoData {
    /// The most bytes one access carries.
    pub const MAX: usize = 8;

    /// Copies `data`, or `None` when it is longer than [`IoData::MAX`].
    pub fn new(data: &[u8]) -> Option<Self> {
        let mut bytes = [0; 8];
        bytes.get_mut(..data.len())?.copy_from_slice(data);
        Some(Self {
            bytes,
            len: data.len() as u8,
        })
    }

    /// The value as a little-endian integer (guest byte order on both arches).
    pub fn to_u64(&self) -> u64 {
        u64::from_le_bytes(self.bytes)
    }
}

impl Deref for IoData {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        &self.bytes[..self.len as usize]
    }
}

impl fmt::Debug for IoData {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:02x?}", &**self)
    }
}

/// A guest-requested change of the whole VM's power state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SystemEvent {
    /// Power off (PSCI SYSTEM_OFF).
    Poweroff,
    /// Reboot (PSCI SYSTEM_RESET).
    Reset,
    /// The guest reported a crash (KVM's `KVM_SYSTEM_EVENT_CRASH`).
    Crash,
}

/// Why a vCPU stopped running guest code. Each variant says what the guest
/// did and what the caller must do before the next
/// [`run`](crate::Vcpu::run).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum VcpuExit {
    /// The guest accessed `len` bytes (1, 2, 4 or 8) at guest-physical `addr`
    /// where no memory is mapped. A write carries its bytes: hand them to the
    /// device and run again. A read (`write: None`) must be answered with
    /// [`complete_read`](crate::Vcpu::complete_read) of exactly `len` bytes
    /// before the next `run`; an unanswered read loads zeros.
    Mmio {
        /// Guest-physical address of the access.
        addr: u64,
        /// Access size in bytes.
        len: usize,
        /// The bytes written, or `None` for a read.
        write: Option<IoData>,
    },
    /// x86 port I/O (`in`/`out`) of `len` bytes (1, 2 or 4) on `port`; handled
    /// exactly as [`VcpuExit::Mmio`]. Never produced on aarch64.
    Pio {
        /// The I/O port.
        port: u16,
        /// Access size in bytes.
        len: usize,
        /// The bytes written, or `None` for a read.
        write: Option<IoData>,
    },
    /// x86 `hlt` with no in-kernel irqchip to wait for the interrupt: the
    /// vCPU is idle. Run again once an interrupt is due (or stop the vCPU).
    Hlt,
    /// The guest reset itself the hard way (x86 triple fault). The VM cannot
    /// continue; tear it down or reset it.
    Shutdown,
    /// The guest asked for the whole VM to power off, reset or report a
    /// crash (PSCI on aarch64). Stop every vCPU and act on it.
    SystemEvent(SystemEvent),
    /// A PSCI call the backend leaves to the VMM (Hypervisor.framework only:
    /// `CPU_ON`, `CPU_OFF`, `AFFINITY_INFO`); the PC is already
    /// past the `hvc`/`smc`. Act on it and write the PSCI return value to x0
    /// with [`set_regs`](crate::Vcpu::set_regs) before running again.
    Psci(PsciCall),
    /// A [`VcpuKick`](crate::VcpuKick) interrupted the run. The guest state
    /// is intact: check why you kicked, then run again or drop the vCPU.
    Cancelled,
    /// The hypervisor could not run the guest's instruction (KVM's emulation
    /// failure, e.g. `int3` or `xrstor` on an emulating nested KVM) or hit an
    /// internal error. Not recoverable: report `reason` and stop the VM.
    InternalError {
        /// What the backend knows about the failure.
        reason: String,
    },
    /// The hardware refused to enter the guest (invalid guest state). Not
    /// recoverable: report `reason` and stop the VM.
    FailEntry {
        /// The hardware's entry-failure code.
        reason: u64,
    },
    /// The guest touched guest-physical memory that is mapped but whose host
    /// pages cannot be had (KVM: `KVM_RUN` failed with `EFAULT`), e.g. a
    /// page of a host file mapped into the guest past that file's end. The
    /// backend does not say where. Fix the backing and run again, or treat
    /// it as fatal.
    MemoryFault,
    /// An exit this crate does not decode. Treat it as fatal and report it.
    Unknown {
        /// What the backend saw.
        what: String,
    },
}
