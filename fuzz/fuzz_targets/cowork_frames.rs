//! Fuzzes cowork's side of the Claude Desktop helper protocol as a client
//! feeds it: the bytes are cut into frames by the real codec (u32 BE
//! length, 10 MiB cap judged from the length alone), every frame body is
//! parsed as an envelope, and every request's parameters are decoded by
//! the method table (`methods::check`, the decoding `call` does, without
//! acting); the reply to it and its redacted debug view are built.
//!
//! * A body that is not a request is an `EnvelopeError`; the connection
//!   ends exactly for the kinds that say so.
//! * The reply body is JSON with a boolean `success`, within the frame cap.
#![no_main]

use boxdesk_cowork::envelope::{codec, parse, reply, MAX_BODY};
use boxdesk_cowork::methods::{check, redacted};
use bytes::BytesMut;
use libfuzzer_sys::fuzz_target;
use tokio_util::codec::Decoder;

fuzz_target!(|data: &[u8]| {
    let mut framing = codec();
    let mut buf = BytesMut::from(data);
    // The cap refuses a length at its 4 bytes: the rest is never buffered.
    while let Ok(Some(body)) = framing.decode(&mut buf) {
        let outcome = match parse(&body) {
            Ok(req) => {
                let _ = redacted(&req.params);
                let id = req.id.clone();
                let result = check(&req.method, req.params).map(|()| serde_json::Value::Null);
                (id, result.map_err(|e| e.to_string()))
            }
            Err(e) => {
                if e.closes() {
                    assert!(e.id().is_none());
                }
                (e.id().cloned(), Err(e.to_string()))
            }
        };
        let body = reply(outcome.0.as_ref(), outcome.1);
        assert!(body.len() <= MAX_BODY, "a reply over the frame cap");
        let back: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert!(back["success"].is_boolean());
    }
});
