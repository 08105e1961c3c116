//! The register models a guest pokes (8250, i8042, PL011, PL031) through their bus interface, console input too (layout: `boxdesk_devices::fuzzing`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    boxdesk_devices::fuzzing::registers(data);
});
