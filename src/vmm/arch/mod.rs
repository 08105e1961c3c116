//! Per-arch guest layout and vCPU set-up: where RAM, tables, the kernel and
//! the devices go, and the registers a boot vCPU starts with.

pub mod x86_64;

pub use x86_64::ArchError;
