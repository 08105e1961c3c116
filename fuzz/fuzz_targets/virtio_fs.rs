//! virtio-fs as a guest drives it: descriptor table, avail ring and FUSE
//! messages all from the input (layout: `boxdesk_devices::fs::fuzzing`),
//! served by the real device over a fresh temporary directory.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    boxdesk_devices::fs::fuzzing::run(data);
});
