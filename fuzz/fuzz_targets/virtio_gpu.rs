//! virtio-gpu as a guest drives it: descriptor table, avail ring, commands,
//! backing entries and pixels all from the input (layout:
//! `boxdesk_devices::gpu::fuzzing`), through the real parser, 2D engine and
//! screen.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    boxdesk_devices::gpu::fuzzing::run(data);
});
