//! Fuzzes the channel decoder: arbitrary bytes through the blocking reader
//! and the tokio codec must give the same frames, then the same kind of
//! ending, and never panic. Any frame decoded must re-encode to bytes that
//! decode to itself.
#![no_main]

use boxdesk_channel::{AgchCodec, Frame, FrameReader};
use libfuzzer_sys::fuzz_target;
use tokio_util::codec::Decoder;

fuzz_target!(|data: &[u8]| {
    let mut blocking = Vec::new();
    let mut r = FrameReader::new(data);
    let blocking_ok = loop {
        match r.read_frame() {
            Ok(Some(f)) => blocking.push(f),
            Ok(None) => break true,
            Err(_) => break false,
        }
    };

    let mut buf = bytes::BytesMut::from(data);
    let mut tokio = Vec::new();
    let tokio_ok = loop {
        match AgchCodec.decode_eof(&mut buf) {
            Ok(Some(f)) => tokio.push(f),
            Ok(None) => break true,
            Err(_) => break false,
        }
    };
    assert_eq!(blocking, tokio);
    assert_eq!(blocking_ok, tokio_ok);

    for f in blocking {
        let mut wire = Vec::new();
        f.encode(&mut wire).expect("a decoded frame fits the limit");
        let again = FrameReader::new(&wire[..]).read_frame().expect("re-decodes");
        assert_eq!(again.as_ref(), Some(&f));
    }
});
