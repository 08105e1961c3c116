//! virtio-blk behind a ring, chains and requests from the input, over a 64 KiB disk (layout: `boxdesk_devices::fuzzing::blk`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    boxdesk_devices::fuzzing::blk(data);
});
