//! JSON text for the hot path of process output: an output event built
//! straight into a frame, its text escaped in runs rather than character
//! by character.
//!
//! Owns escaping only; it never decides what an event says (that is
//! [`crate::process`]) and never parses JSON.

use bytes::{BufMut, Bytes, BytesMut};
use serde_json::Value;

use super::envelope;

/// An output event frame: `{"type":kind,"id":id,"data":text}`. This is
/// the hot path of process output, so the text is escaped here in runs
/// rather than character by character.
pub fn output_event(kind: &str, id: &Value, text: &str) -> Bytes {
    let mut w = BytesMut::with_capacity(text.len() + 64).writer();
    w.get_mut().put_u32(0);
    w.get_mut().put_slice(b"{\"type\":\"");
    w.get_mut().put_slice(kind.as_bytes());
    w.get_mut().put_slice(b"\",\"id\":");
    // Writing JSON into memory cannot fail.
    let _ = serde_json::to_writer(&mut w, id);
    let mut out = w.into_inner();
    out.put_slice(b",\"data\":\"");
    escape_json(text, &mut out);
    out.put_slice(b"\"}");
    envelope::finish(out)
}

/// Each byte's escaped form, padded to 8 bytes, and its length: the
/// escaper stores 8 bytes per input byte unconditionally and advances by
/// the length, so the loop has no branch per byte.
const ESCAPES: ([[u8; 8]; 256], [u8; 256]) = {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut seq = [[0u8; 8]; 256];
    let mut len = [1u8; 256];
    let mut b = 0;
    while b < 256 {
        let (s, n): ([u8; 8], u8) = match b as u8 {
            b'"' => ([b'\\', b'"', 0, 0, 0, 0, 0, 0], 2),
            b'\\' => ([b'\\', b'\\', 0, 0, 0, 0, 0, 0], 2),
            b'\n' => ([b'\\', b'n', 0, 0, 0, 0, 0, 0], 2),
            b'\r' => ([b'\\', b'r', 0, 0, 0, 0, 0, 0], 2),
            b'\t' => ([b'\\', b't', 0, 0, 0, 0, 0, 0], 2),
            0..=0x1f => (
                [b'\\', b'u', b'0', b'0', HEX[b >> 4], HEX[b & 0xf], 0, 0],
                6,
            ),
            c => ([c, 0, 0, 0, 0, 0, 0, 0], 1),
        };
        seq[b] = s;
        len[b] = n;
        b += 1;
    }
    (seq, len)
};

/// Appends `s` escaped for the inside of a JSON string: `"`, `\\` and
/// control characters; everything else (UTF-8 included) as it is.
///
/// Process output is this path's whole load, so it works in 16-byte
/// blocks: a block with nothing to escape is one copy (the test is a
/// branch-free fold the compiler vectorises), a block of NULs — common in
/// binary output, each NUL being the 6-byte `\u0000` — is one 96-byte
/// copy, and only other blocks go byte by byte through the table.
pub fn escape_json(s: &str, out: &mut BytesMut) {
    const BLOCK: usize = 16;
    const NULS: [u8; 6 * BLOCK] = {
        let mut a = [0u8; 6 * BLOCK];
        let mut i = 0;
        while i < BLOCK {
            let e = *b"\\u0000";
            let mut k = 0;
            while k < 6 {
                a[i * 6 + k] = e[k];
                k += 1;
            }
            i += 1;
        }
        a
    };
    let needs = |b: u8| b < 0x20 || b == b'"' || b == b'\\';
    let bytes = s.as_bytes();
    out.reserve(bytes.len() + 8);
    let mut blocks = bytes.chunks_exact(BLOCK);
    for block in &mut blocks {
        if !block.iter().fold(false, |a, &b| a | needs(b)) {
            out.extend_from_slice(block);
        } else if block.iter().fold(0u8, |a, &b| a | b) == 0 {
            out.extend_from_slice(&NULS);
        } else {
            escape_bytes(block, out);
        }
    }
    escape_bytes(blocks.remainder(), out);
}

/// The byte-by-byte path of [`escape_json`].
fn escape_bytes(bytes: &[u8], out: &mut BytesMut) {
    let (seq, len) = &ESCAPES;
    out.reserve(bytes.len() * 6 + 8);
    let spare = out.spare_capacity_mut();
    let mut j = 0;
    for &b in bytes {
        let from = &seq[usize::from(b)];
        // Each byte needs at most 6 of the `6 * len + 8` reserved, so
        // `j + 8` stays within the spare capacity.
        let to = &mut spare[j..j + 8];
        for (t, f) in to.iter_mut().zip(from) {
            t.write(*f);
        }
        j += usize::from(len[usize::from(b)]);
    }
    // SAFETY: the loop initialised the first `j` bytes of the spare
    // capacity: every output byte was written by some store.
    unsafe { out.set_len(out.len() + j) };
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    proptest::proptest! {
        #[test]
        fn escaped_text_parses_back_to_the_same_text(t in "\\PC*|[\\x00-\\x20\"\\\\]*") {
            let f = output_event("stderr", &json!(1), &t);
            let v: Value = serde_json::from_slice(&f[4..]).unwrap();
            proptest::prop_assert_eq!(v["data"].as_str().unwrap(), t.as_str());
        }
    }

    #[test]
    fn every_block_shape_escapes_exactly_like_serde_json() {
        let mut t = String::new();
        t.push_str(&"\0".repeat(40));
        t.push_str("plain text block over sixteen bytes, then \"quotes\" and \\ and \n\t\u{1}");
        t.push_str(&"€".repeat(20));
        t.push_str(&"\0a".repeat(20));
        for cut in 0..t.len() {
            if !t.is_char_boundary(cut) {
                continue;
            }
            let mut out = BytesMut::new();
            escape_json(&t[cut..], &mut out);
            let want = serde_json::to_string(&t[cut..]).unwrap();
            assert_eq!(&out[..], &want.as_bytes()[1..want.len() - 1], "from {cut}");
        }
    }

    #[test]
    fn output_events_are_framed_json_with_escaped_text() {
        let f = output_event("stdout", &json!("p1"), "a\"\u{0}€");
        let v: Value = serde_json::from_slice(&f[4..]).unwrap();
        assert_eq!(
            v,
            json!({"type": "stdout", "id": "p1", "data": "a\"\u{0}€"})
        );
        assert_eq!(
            u32::from_be_bytes([f[0], f[1], f[2], f[3]]) as usize,
            f.len() - 4
        );
    }
}
