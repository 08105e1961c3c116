//! The MSR values every vCPU starts with (Firecracker's boot set): the
//! SYSENTER/SYSCALL MSRs and KERNEL_GS_BASE cleared, TSC 0, fast strings
//! enabled, and MTRRs enabled with write-back as the default memory type.

/// IA32_TIME_STAMP_COUNTER.
pub const MSR_IA32_TSC: u32 = 0x10;
/// IA32_SYSENTER_CS.
pub const MSR_IA32_SYSENTER_CS: u32 = 0x174;
/// IA32_SYSENTER_ESP.
pub const MSR_IA32_SYSENTER_ESP: u32 = 0x175;
/// IA32_SYSENTER_EIP.
pub const MSR_IA32_SYSENTER_EIP: u32 = 0x176;
/// IA32_MISC_ENABLE.
pub const MSR_IA32_MISC_ENABLE: u32 = 0x1a0;
/// IA32_MTRR_DEF_TYPE.
pub const MSR_MTRR_DEF_TYPE: u32 = 0x2ff;
/// STAR: SYSCALL/SYSRET segments.
pub const MSR_STAR: u32 = 0xc000_0081;
/// LSTAR: 64-bit SYSCALL target.
pub const MSR_LSTAR: u32 = 0xc000_0082;
/// CSTAR: compatibility-mode SYSCALL target.
pub const MSR_CSTAR: u32 = 0xc000_0083;
/// SYSCALL_MASK (FMASK).
pub const MSR_SYSCALL_MASK: u32 = 0xc000_0084;
/// KERNEL_GS_BASE (the SWAPGS value).
pub const MSR_KERNEL_GS_BASE: u32 = 0xc000_0102;

/// IA32_MISC_ENABLE bit 0: fast string operations.
pub const MISC_ENABLE_FAST_STRING: u64 = 1;
/// IA32_MTRR_DEF_TYPE bit 11: MTRRs enabled.
pub const MTRR_ENABLE: u64 = 1 << 11;
/// Memory type write-back.
pub const MTRR_MEM_TYPE_WB: u64 = 6;

/// (index, value) of each boot MSR.
pub fn boot_msrs() -> Vec<(u32, u64)> {
    vec![
        (MSR_IA32_SYSENTER_CS, 0),
        (MSR_IA32_SYSENTER_ESP, 0),
        (MSR_IA32_SYSENTER_EIP, 0),
        (MSR_STAR, 0),
        (MSR_CSTAR, 0),
        (MSR_KERNEL_GS_BASE, 0),
        (MSR_SYSCALL_MASK, 0),
        (MSR_LSTAR, 0),
        (MSR_IA32_TSC, 0),
        (MSR_IA32_MISC_ENABLE, MISC_ENABLE_FAST_STRING),
        (MSR_MTRR_DEF_TYPE, MTRR_ENABLE | MTRR_MEM_TYPE_WB),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn boot_msrs_enable_fast_strings_and_write_back_mtrrs() {
        let msrs = boot_msrs();
        assert!(msrs.contains(&(0x1a0, 1)));
        assert!(msrs.contains(&(0x2ff, 0x806)));
        let mut indices: Vec<_> = msrs.iter().map(|m| m.0).collect();
        indices.sort_unstable();
        indices.dedup();
        assert_eq!(indices.len(), msrs.len(), "no duplicates");
    }
}
