//! The hypervisor conformance suite: each behaviour is one body, run against
//! every backend this host builds (crosvm's `mmio_and_pio.rs` pattern), with
//! real guest code and real exits — hand-assembled x86_64 payloads in real,
//! protected and long mode, aarch64 payloads at EL1.
//!
//! Where a behaviour cannot be tested on a backend (or there is no
//! hypervisor at all), the test passes and prints `skipped: <why>`.

#[macro_use]
mod support;

#[cfg(target_arch = "aarch64")]
mod a64;
#[cfg(target_arch = "x86_64")]
mod x86;

mod control;
mod io;
mod memory;
