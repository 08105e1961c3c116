//! A streaming UTF-8 decoder for process output: chunks arrive cut at
//! arbitrary byte boundaries, events must be valid UTF-8, and a character
//! cut in two must come out whole in the next event, never as U+FFFD.
//!
//! Owns the carried tail (at most 3 bytes). Bytes become U+FFFD only when
//! they really are invalid: a bad sequence, or an incomplete one at the end
//! of the stream.

/// Decodes one output stream.
#[derive(Debug, Default)]
pub struct Utf8Stream {
    /// The start of a character whose remaining bytes have not arrived.
    tail: Vec<u8>,
}

impl Utf8Stream {
    /// Appends the text of `chunk` (with any carried bytes in front) to
    /// `out`, keeping an incomplete last character for the next call.
    pub fn push(&mut self, chunk: &[u8], out: &mut String) {
        if self.tail.is_empty() {
            self.decode(chunk, out);
        } else {
            let mut joined = std::mem::take(&mut self.tail);
            joined.extend_from_slice(chunk);
            self.decode(&joined, out);
        }
    }

    /// Ends the stream: a carried incomplete character becomes U+FFFD.
    pub fn finish(&mut self, out: &mut String) {
        if !self.tail.is_empty() {
            self.tail.clear();
            out.push(char::REPLACEMENT_CHARACTER);
        }
    }

    fn decode(&mut self, mut bytes: &[u8], out: &mut String) {
        out.reserve(bytes.len());
        loop {
            match std::str::from_utf8(bytes) {
                Ok(s) => {
                    out.push_str(s);
                    return;
                }
                Err(e) => {
                    let (good, rest) = bytes.split_at(e.valid_up_to());
                    // SAFETY: `valid_up_to` is the length of the longest
                    // valid UTF-8 prefix.
                    out.push_str(unsafe { std::str::from_utf8_unchecked(good) });
                    match e.error_len() {
                        Some(bad) => {
                            out.push(char::REPLACEMENT_CHARACTER);
                            bytes = &rest[bad..];
                        }
                        None => {
                            // An incomplete character at the end: wait for
                            // the rest of it.
                            self.tail.extend_from_slice(rest);
                            return;
                        }
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn run(chunks: &[&[u8]]) -> String {
        let mut d = Utf8Stream::default();
        let mut out = String::new();
        for c in chunks {
            d.push(c, &mut out);
        }
        d.finish(&mut out);
        out
    }

    #[test]
    fn a_euro_sign_cut_after_its_first_byte_comes_out_whole() {
        assert_eq!(run(&[b"a\xe2", b"\x82\xacb"]), "a€b");
        assert_eq!(run(&[b"\xe2", b"\x82", b"\xac"]), "€");
    }

    #[test]
    fn invalid_bytes_become_one_replacement_each_and_decoding_goes_on() {
        assert_eq!(run(&[b"a\xffb"]), "a\u{fffd}b");
        assert_eq!(run(&[b"\xe2\x28"]), "\u{fffd}(");
    }

    #[test]
    fn an_incomplete_character_at_the_end_of_the_stream_is_a_replacement() {
        assert_eq!(run(&[b"ok\xf0\x9f"]), "ok\u{fffd}");
    }

    proptest! {
        #[test]
        fn any_split_of_valid_text_decodes_to_the_same_text(s in "\\PC{0,40}", cut in 0usize..200) {
            let b = s.as_bytes();
            let cut = cut.min(b.len());
            prop_assert_eq!(run(&[&b[..cut], &b[cut..]]), s);
        }

        #[test]
        fn any_split_of_any_bytes_matches_lossy_decoding_of_the_whole(b in proptest::collection::vec(any::<u8>(), 0..64), cut in 0usize..64) {
            let cut = cut.min(b.len());
            prop_assert_eq!(run(&[&b[..cut], &b[cut..]]), String::from_utf8_lossy(&b).into_owned());
        }
    }
}
