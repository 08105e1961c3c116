//! The kernel and initrd loaders with hostile files: x86_64 ELF and bzImage, arm64 `Image`, initrd placement (layout: `boxdesk_vmm::arch::fuzzing`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    boxdesk_vmm::arch::fuzzing::run(data);
});
