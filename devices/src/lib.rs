//! boxdesk-devices: the devices of a boxdesk microVM, written against
//! guest memory (`vm-memory`) and an interrupt line ([`irq::IrqLine`]) —
//! never against a hypervisor type, so the same code runs under KVM and
//! Hypervisor.framework and under unit tests with a mock guest driver.
//!
//! * [`bus`] — the address → device map a vCPU's MMIO/PIO exit goes to;
//! * [`virtio`] — the virtio-mmio (v2) transport and the [`virtio::VirtioDevice`]
//!   contract; [`vsock`] (virtio-vsock with the hybrid Unix-socket muxer)
//!   [`blk`] (virtio-blk over a raw file), [`gpu`] (virtio-gpu, 2D, one
//!   scanout presenting into a sandbox's screen), [`input`] (virtio-input: a
//!   keyboard and a tablet fed by the host) and `fs` (virtio-fs: a host
//!   directory served in-process, Linux hosts) implement it;
//! * [`serial`] — the 8250 UART (`vm-superio`), x86_64's console;
//!   [`i8042`] — the reset line;
//! * [`pl011`] — the Arm PL011 UART, aarch64's console; [`pl031`] — the
//!   Arm PL031 real-time clock (`vm-superio`);
//! * [`console`] — what both console UARTs share: the [`console::Console`]
//!   trait the VMM holds either by, the output tail and the bounded input
//!   queue.
//!
//! Devices never panic on what a guest writes: a bad descriptor chain marks
//! the device broken (`NEEDS_RESET`) and nothing outside guest memory is
//! read or written.
#![deny(missing_docs)]

pub mod blk;
pub mod bus;
pub mod console;
#[cfg(target_os = "linux")]
pub mod fs;
#[cfg(all(target_os = "linux", any(test, feature = "fuzzing")))]
pub mod fuzzing;
pub mod gpu;
pub mod i8042;
pub mod input;
pub mod irq;
pub mod pl011;
pub mod pl031;
pub mod serial;
pub mod virtio;
pub mod vsock;
