//! virtio-input as a guest drives it and the host feeds it: the ring, the
//! guest's buffers and the host's events all from the input (layout:
//! `boxdesk_devices::input::fuzzing`), through the real device.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    boxdesk_devices::input::fuzzing::run(data);
});
