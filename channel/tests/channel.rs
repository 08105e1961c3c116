//! Integration tests of boxdesk-channel: one binary, a module per area.

mod channel {
    mod errors;
    mod golden;
    mod props;
    mod roundtrip;
    mod session;
    mod tokio_codec;
}
