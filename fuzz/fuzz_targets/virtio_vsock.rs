//! virtio-vsock's event loop (TX packets, the muxer's connection table, credit, RX buffers) over real sockets (layout: `boxdesk_devices::vsock::fuzzing`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    boxdesk_devices::vsock::fuzzing::run(data);
});
