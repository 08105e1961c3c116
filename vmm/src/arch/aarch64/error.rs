//! [`ArchError`]: why preparing an aarch64 guest for boot failed.
//!
//! Every failure a bad `Image`, initrd or size can cause is one of these,
//! with the numbers needed to fix it; nothing in this module tree panics on
//! file contents.

use std::io;

/// Why loading the kernel/initrd, building the FDT or setting up a vCPU
/// failed.
#[derive(Debug, thiserror::Error)]
pub enum ArchError {
    /// Reading the kernel image failed (I/O error, not its contents).
    #[error("cannot read the kernel image")]
    KernelRead(#[source] io::Error),
    /// The file is not an arm64 `Image` (no "ARM\x64" magic at offset 56).
    #[error("the kernel image is not an arm64 Image (magic {found:#010x} at offset 56, want 0x644d5241 \"ARM\\x64\")")]
    NotAnImage {
        /// The 32-bit value found where the magic belongs (0 when the file
        /// is shorter than the 64-byte header).
        found: u32,
    },
    /// An `Image`, but not one this VMM can boot.
    #[error("unsupported kernel image: {0}")]
    UnsupportedKernel(String),
    /// The kernel (its `image_size`, BSS included) does not fit in RAM below
    /// the FDT.
    #[error("the kernel needs guest RAM [{start:#x}, {end:#x}); RAM usable for it ends at {limit:#x}: give the guest more memory")]
    KernelTooLarge {
        /// Load address.
        start: u64,
        /// End of its `image_size`.
        end: u64,
        /// Where the FDT's block begins.
        limit: u64,
    },
    /// Reading the initrd failed.
    #[error("cannot read the initrd")]
    InitrdRead(#[source] io::Error),
    /// The initrd does not fit between the kernel and the FDT.
    #[error("the initrd ({size} bytes) does not fit in guest RAM between the kernel's end {low:#x} and the FDT at {limit:#x}: give the guest more memory")]
    InitrdTooLarge {
        /// Size of the initrd file.
        size: u64,
        /// The kernel's end.
        low: u64,
        /// The FDT's start.
        limit: u64,
    },
    /// The FDT could not be built (a `vm-fdt` error).
    #[error("cannot build the device tree: {0}")]
    Fdt(String),
    /// The FDT came out larger than its 2 MiB block.
    #[error("the device tree is {len} bytes; at most {max} fit")]
    FdtTooLarge {
        /// Its size.
        len: usize,
        /// The most allowed.
        max: u64,
    },
    /// The kernel command line contains a NUL byte.
    #[error("the kernel command line contains a NUL byte")]
    CmdlineNul,
    /// The vCPU count is out of range.
    #[error("{vcpus} vcpus: need 1 to {max}")]
    VcpuCount {
        /// The vCPU count asked for.
        vcpus: u32,
        /// The most vCPUs supported.
        max: u32,
    },
    /// Guest memory has no room for something (a layout other than
    /// [`ram_regions`](super::layout::ram_regions)).
    #[error("guest memory has no room for the {what} at {addr:#x} ({len} bytes)")]
    GuestMemory {
        /// What was being written.
        what: &'static str,
        /// Where.
        addr: u64,
        /// How many bytes.
        len: usize,
    },
    /// A hypervisor call on a vCPU failed.
    #[error("cannot {op} of vcpu {id}")]
    Vcpu {
        /// The vCPU id.
        id: u32,
        /// What was being done, e.g. "set the boot registers".
        op: &'static str,
        /// The hypervisor's error.
        #[source]
        source: boxdesk_hv::HvError,
    },
}
