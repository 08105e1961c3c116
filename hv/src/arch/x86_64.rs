//! x86_64 guest registers and VM configuration.
//!
//! The layout follows KVM's `kvm_regs`/`kvm_sregs` so the KVM backend's
//! conversion is a field copy; the VMM fills these from its own boot policy.

/// A segment register as the CPU caches it (selector plus hidden part).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Segment {
    /// Linear base address.
    pub base: u64,
    /// Limit in bytes (already scaled when `granularity` is set).
    pub limit: u32,
    /// The visible selector.
    pub selector: u16,
    /// Type field (4 bits: code/data, accessed, readable/writable…).
    pub type_: u8,
    /// Present bit.
    pub present: bool,
    /// Descriptor privilege level, 0..=3.
    pub dpl: u8,
    /// D/B: 32-bit default operand size.
    pub db: bool,
    /// S: code or data segment (not a system segment).
    pub s: bool,
    /// L: 64-bit code segment.
    pub l: bool,
    /// G: limit counted in 4 KiB units.
    pub g: bool,
    /// AVL bit.
    pub avl: bool,
    /// The segment is unusable (a null selector in protected mode).
    pub unusable: bool,
}

impl Segment {
    /// A real-mode segment: base = selector × 16, 64 KiB limit.
    pub fn real_mode(selector: u16, code: bool) -> Self {
        Self {
            base: u64::from(selector) << 4,
            limit: 0xffff,
            selector,
            type_: if code { 0xb } else { 0x3 },
            present: true,
            s: true,
            ..Self::default()
        }
    }

    /// A flat 4 GiB protected-mode segment: 32-bit code or data.
    pub fn flat32(selector: u16, code: bool) -> Self {
        Self {
            limit: 0xffff_ffff,
            selector,
            type_: if code { 0xb } else { 0x3 },
            present: true,
            db: true,
            s: true,
            g: true,
            ..Self::default()
        }
    }

    /// A 64-bit code segment (L set, D clear) or a flat data segment.
    pub fn flat64(selector: u16, code: bool) -> Self {
        let mut seg = Self::flat32(selector, code);
        if code {
            seg.l = true;
            seg.db = false;
        }
        seg
    }
}

/// GDTR or IDTR.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DescriptorTable {
    /// Linear base address.
    pub base: u64,
    /// Limit in bytes (size − 1).
    pub limit: u16,
}

/// General-purpose registers, RIP and RFLAGS.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[allow(missing_docs)] // the register names are the documentation
pub struct GpRegs {
    pub rax: u64,
    pub rbx: u64,
    pub rcx: u64,
    pub rdx: u64,
    pub rsi: u64,
    pub rdi: u64,
    pub rsp: u64,
    pub rbp: u64,
    pub r8: u64,
    pub r9: u64,
    pub r10: u64,
    pub r11: u64,
    pub r12: u64,
    pub r13: u64,
    pub r14: u64,
    pub r15: u64,
    pub rip: u64,
    pub rflags: u64,
}

/// Segment, descriptor-table and control registers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[allow(missing_docs)] // the register names are the documentation
pub struct SpecialRegs {
    pub cs: Segment,
    pub ds: Segment,
    pub es: Segment,
    pub fs: Segment,
    pub gs: Segment,
    pub ss: Segment,
    pub tr: Segment,
    pub ldt: Segment,
    pub gdt: DescriptorTable,
    pub idt: DescriptorTable,
    pub cr0: u64,
    pub cr2: u64,
    pub cr3: u64,
    pub cr4: u64,
    pub cr8: u64,
    pub efer: u64,
    pub apic_base: u64,
}

/// The x86_64 register state `get_regs`/`set_regs` move.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Regs {
    /// General-purpose registers, RIP, RFLAGS.
    pub gp: GpRegs,
    /// Segments, descriptor tables, control registers, EFER, APIC base.
    pub sregs: SpecialRegs,
}

/// CR0.PE: protected mode.
pub const CR0_PE: u64 = 1;
/// CR0.PG: paging.
pub const CR0_PG: u64 = 1 << 31;
/// CR4.PAE: physical address extension (required for long mode).
pub const CR4_PAE: u64 = 1 << 5;
/// EFER.LME: long mode enable.
pub const EFER_LME: u64 = 1 << 8;
/// EFER.LMA: long mode active.
pub const EFER_LMA: u64 = 1 << 10;
/// RFLAGS bit 1, which always reads as one.
pub const RFLAGS_RESERVED: u64 = 1 << 1;

/// What to create with an x86_64 VM.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct VmConfig {
    /// Create the in-kernel irqchip (PIC, IOAPIC, local APICs) and a PIT.
    /// Note: with it, `hlt` with interrupts disabled never exits to userspace.
    pub irqchip: bool,
    /// Where KVM may put its three-page TSS (Intel real-mode support,
    /// `KVM_SET_TSS_ADDR`); must not overlap RAM or MMIO. `None` leaves KVM's
    /// default. Firecracker uses `0xfffb_d000`.
    pub tss_addr: Option<u64>,
}
