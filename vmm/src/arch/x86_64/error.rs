//! [`ArchError`]: why preparing an x86_64 guest for boot failed.
//!
//! Every failure a bad kernel or initrd file can cause is one of these, with
//! the numbers a user needs to fix it; nothing in this module tree panics on
//! file contents.

use std::io;

/// Why loading the kernel/initrd or setting up the boot state failed.
#[derive(Debug, thiserror::Error)]
pub enum ArchError {
    /// Reading the kernel image failed (I/O error, not its contents).
    #[error("cannot read the kernel image")]
    KernelRead(#[source] io::Error),
    /// The file is neither an ELF (vmlinux) nor a bzImage.
    #[error("the kernel image is neither a vmlinux ELF nor a bzImage (found no ELF magic and no \"HdrS\" setup header)")]
    NotAKernel,
    /// The file looks like a kernel but ends before what its headers promise.
    #[error("the kernel image is truncated: {0}")]
    KernelTruncated(String),
    /// A kernel, but not one this VMM can boot (32-bit, no 64-bit entry, …).
    #[error("unsupported kernel image: {0}")]
    UnsupportedKernel(String),
    /// The kernel would not fit in low guest RAM above 1 MiB.
    #[error("the kernel does not fit in guest memory: {0}")]
    KernelPlacement(String),
    /// linux-loader refused the image after our own checks passed.
    #[error("cannot load the kernel image")]
    KernelLoad(#[source] linux_loader::loader::Error),
    /// Reading the initrd failed.
    #[error("cannot read the initrd")]
    InitrdRead(#[source] io::Error),
    /// The initrd does not fit below the MMIO hole / initrd limit.
    #[error("the initrd ({size} bytes) does not fit in guest RAM between {low:#x} and {limit:#x}")]
    InitrdTooLarge {
        /// Size of the initrd file.
        size: u64,
        /// Lowest address it may start at (1 MiB).
        low: u64,
        /// Address it must end at or below.
        limit: u64,
    },
    /// The initrd was placed over the kernel (too little memory for both).
    #[error("the initrd at [{start:#x}, {end:#x}) overlaps the kernel at [0x100000, {kernel_end:#x}); give the guest more memory")]
    InitrdOverlapsKernel {
        /// Initrd start.
        start: u64,
        /// Initrd end (exclusive).
        end: u64,
        /// Kernel end (exclusive).
        kernel_end: u64,
    },
    /// The initrd lies above what the kernel's setup header allows.
    #[error("the initrd ends at {end:#x}, above the kernel's initrd_addr_max {max:#x}")]
    InitrdAboveKernelLimit {
        /// Initrd end (exclusive).
        end: u64,
        /// The kernel's `initrd_addr_max` (inclusive).
        max: u64,
    },
    /// The command line plus its NUL is longer than the limit.
    #[error("the kernel command line is {len} bytes; at most {max} fit")]
    CmdlineTooLong {
        /// Its length without the NUL.
        len: usize,
        /// Most bytes allowed without the NUL.
        max: usize,
    },
    /// The command line contains a NUL byte.
    #[error("the kernel command line contains a NUL byte")]
    CmdlineNul,
    /// The vCPU count or id is out of range.
    #[error("vcpu {id} of {vcpus}: need 1 <= vcpus <= {max} and id < vcpus")]
    VcpuCount {
        /// The vCPU id asked for.
        id: u32,
        /// The vCPU count asked for.
        vcpus: u32,
        /// The most vCPUs supported.
        max: u32,
    },
    /// A boot structure does not fit in guest memory (too little RAM, or a
    /// memory layout other than [`ram_regions`](super::layout::ram_regions)).
    #[error("guest memory has no room for the {what} at {addr:#x} ({len} bytes)")]
    GuestMemory {
        /// What was being written.
        what: &'static str,
        /// Where.
        addr: u64,
        /// How many bytes.
        len: usize,
    },
    /// The normalised CPUID needs more entries than a `CpuId` can hold.
    #[error(
        "the normalised cpuid has {have} entries, over the {} a CpuId holds",
        kvm_bindings::KVM_MAX_CPUID_ENTRIES
    )]
    CpuidFull {
        /// Entries after normalisation.
        have: usize,
    },
    /// A hypervisor call on a vCPU failed.
    #[error("cannot {op} of vcpu {id}")]
    Vcpu {
        /// The vCPU id.
        id: u32,
        /// What was being done, e.g. "set the cpuid".
        op: &'static str,
        /// The hypervisor's error.
        #[source]
        source: boxdesk_hv::HvError,
    },
}

impl ArchError {
    pub(super) fn truncated(what: impl Into<String>) -> Self {
        Self::KernelTruncated(what.into())
    }
}
