//! aarch64 guests for the suite: a fixed test layout and instruction
//! encoders, each named after the instruction it returns.
//!
//! Test layout (test policy only): RAM at IPA 0..128 KiB, code at 0x8000, a
//! data word at 0xa000, MMIO at 0xd000_0000. The vCPU starts at EL1h with
//! the MMU off.

use boxdesk_hv::arch::aarch64::PSTATE_EL1H_MASKED;
use boxdesk_hv::{Hypervisor, MapFlags, Vcpu, VmConfig};
use vm_memory::{Bytes, MemoryRegionAddress};

use crate::support::Guest;

pub const RAM: usize = 0x2_0000;
pub const CODE: u64 = 0x8000;
pub const DATA: u64 = 0xa000;
pub const MMIO: u64 = 0xd000_0000;

/// A guest with RAM at 0 (plus `extra`), `code` at [`CODE`], PC there.
pub fn guest<H: Hypervisor>(hv: &H, code: &[u32], extra: &[(u64, usize, MapFlags)]) -> Guest<H> {
    guest_with(hv, &VmConfig::default(), code, extra)
}

/// As [`guest`], with a VM configuration.
pub fn guest_with<H: Hypervisor>(
    hv: &H,
    config: &VmConfig,
    code: &[u32],
    extra: &[(u64, usize, MapFlags)],
) -> Guest<H> {
    let mut regions = vec![(0, RAM, MapFlags::default())];
    regions.extend_from_slice(extra);
    let mut g = Guest::new(hv, config, &regions);
    for (i, insn) in code.iter().enumerate() {
        g.regions[0]
            .0
            .write_obj(*insn, MemoryRegionAddress(CODE + 4 * i as u64))
            .unwrap();
    }
    let mut regs = g.vcpu.get_regs().unwrap();
    regs.pc = CODE;
    regs.pstate = PSTATE_EL1H_MASKED;
    g.vcpu.set_regs(&regs).unwrap();
    g
}

/// `movz xD, #imm16, lsl #(16*hw)`
pub fn movz(rd: u32, imm: u16, hw: u32) -> u32 {
    0xd280_0000 | (hw << 21) | (u32::from(imm) << 5) | rd
}

/// `movk xD, #imm16, lsl #(16*hw)`
pub fn movk(rd: u32, imm: u16, hw: u32) -> u32 {
    0xf280_0000 | (hw << 21) | (u32::from(imm) << 5) | rd
}

/// `mov xD, #value` as movz + movk of each non-zero half-word.
pub fn mov64(rd: u32, value: u64) -> Vec<u32> {
    let mut out = vec![movz(rd, value as u16, 0)];
    for hw in 1..4 {
        let part = (value >> (16 * hw)) as u16;
        if part != 0 {
            out.push(movk(rd, part, hw));
        }
    }
    out
}

/// Size field of a load/store: 1, 2, 4, 8 bytes → 0..=3.
fn size_bits(size: usize) -> u32 {
    size.trailing_zeros() << 30
}

/// `strb|strh|str wT|str xT, [xN]`
pub fn str(size: usize, rt: u32, rn: u32) -> u32 {
    0x3900_0000 | size_bits(size) | (rn << 5) | rt
}

/// `ldrb|ldrh|ldr wT|ldr xT, [xN]`
pub fn ldr(size: usize, rt: u32, rn: u32) -> u32 {
    0x3940_0000 | size_bits(size) | (rn << 5) | rt
}

/// `hvc #0`
pub const HVC0: u32 = 0xd400_0002;
/// `1: b 1b`
pub const B_SELF: u32 = 0x1400_0000;
