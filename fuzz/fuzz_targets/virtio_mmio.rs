//! The virtio-mmio transport driven register by register, virtio-blk behind it (layout: `boxdesk_devices::fuzzing::mmio`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    boxdesk_devices::fuzzing::mmio(data);
});
