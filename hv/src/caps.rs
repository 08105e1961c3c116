//! [`Capabilities`]: what a backend on this host offers, asked once. Plain
//! data: it never changes behaviour by itself; callers decide what to do
//! with a missing feature.

/// Limits and optional features of the host's hypervisor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capabilities {
    /// Most vCPUs one VM may have.
    pub max_vcpus: u32,
    /// Most memory regions one VM may map at once.
    pub max_memory_slots: u32,
    /// Granule of guest memory mappings: 4 KiB (KVM) or 16 KiB
    /// (Hypervisor.framework). Region addresses and sizes are multiples of it.
    pub page_size: u64,
    /// An in-kernel (or in-framework) interrupt controller can be created.
    pub irqchip: bool,
    /// [`MapFlags::read_only`](crate::MapFlags::read_only) is honoured.
    pub read_only_memory: bool,
    /// [`Vm::dirty_log`](crate::Vm::dirty_log) works.
    pub dirty_log: bool,
    /// Guest-physical address bits (0 when the backend does not say).
    pub ipa_bits: u32,
}
