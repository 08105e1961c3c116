//! Sanitising Error messages so a peer cannot drive the reader's terminal.
//!
//! Every ASCII control character (0x00–0x1F, 0x7F) becomes `\xNN` and every
//! Unicode `Bidi_Control` code point (Trojan Source) becomes `\u{XXXX}`;
//! then the text is cut to [`ERROR_MSG_CAP`] bytes at a character boundary
//! that never splits an escape. Applied when an Error frame is encoded and
//! again when one is decoded.

use std::borrow::Cow;
use std::fmt::Write as _;

use crate::ERROR_MSG_CAP;

/// The `Bidi_Control` code points of Unicode.
fn is_bidi_control(c: char) -> bool {
    matches!(c, '\u{061C}' | '\u{200E}' | '\u{200F}' | '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}')
}

fn needs_escape(c: char) -> bool {
    c.is_ascii_control() || is_bidi_control(c)
}

/// Escapes control and bidi characters and caps the result at
/// [`ERROR_MSG_CAP`] bytes. Borrows when `msg` is already clean.
pub fn sanitize_error(msg: &str) -> Cow<'_, str> {
    if msg.len() <= ERROR_MSG_CAP && !msg.chars().any(needs_escape) {
        return Cow::Borrowed(msg);
    }
    let mut out = String::with_capacity(msg.len().min(ERROR_MSG_CAP));
    let mut piece = String::with_capacity(10);
    for c in msg.chars() {
        piece.clear();
        if c.is_ascii_control() {
            let _ = write!(piece, "\\x{:02x}", c as u32);
        } else if is_bidi_control(c) {
            let _ = write!(piece, "\\u{{{:04x}}}", c as u32);
        } else {
            piece.push(c);
        }
        if out.len() + piece.len() > ERROR_MSG_CAP {
            break;
        }
        out.push_str(&piece);
    }
    Cow::Owned(out)
}

/// [`sanitize_error`] for bytes off the wire: invalid UTF-8 becomes U+FFFD
/// first.
pub fn sanitize_error_bytes(msg: &[u8]) -> Cow<'_, str> {
    match String::from_utf8_lossy(msg) {
        Cow::Borrowed(s) => sanitize_error(s),
        Cow::Owned(s) => Cow::Owned(sanitize_error(&s).into_owned()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trojan_source_and_terminal_escapes_are_escaped() {
        assert_eq!(
            sanitize_error("\u{202E}evil\x1b[31m"),
            "\\u{202e}evil\\x1b[31m"
        );
    }

    #[test]
    fn a_clean_message_is_borrowed_unchanged() {
        assert!(matches!(
            sanitize_error("ENOENT: no such file"),
            Cow::Borrowed(_)
        ));
    }

    #[test]
    fn a_long_message_is_cut_to_the_cap_on_a_char_boundary() {
        let msg = "é".repeat(5000); // 10 000 bytes of 2-byte characters
        let out = sanitize_error(&msg);
        assert!(out.len() <= ERROR_MSG_CAP);
        assert_eq!(out.len(), ERROR_MSG_CAP); // 2048 whole characters fit exactly
        assert!(out.chars().all(|c| c == 'é'));
    }

    #[test]
    fn an_escape_is_never_split_by_the_cap() {
        let msg = format!("{}\x07", "a".repeat(ERROR_MSG_CAP - 2));
        let out = sanitize_error(&msg);
        assert_eq!(out.len(), ERROR_MSG_CAP - 2);
        assert!(!out.contains('\\'));
    }

    #[test]
    fn every_bidi_control_and_del_is_escaped() {
        for c in [
            '\u{061C}', '\u{200E}', '\u{200F}', '\u{202A}', '\u{202E}', '\u{2066}', '\u{2069}',
            '\x7f', '\0',
        ] {
            let out = sanitize_error(&c.to_string()).into_owned();
            assert!(out.starts_with('\\'), "{c:?} was not escaped: {out:?}");
        }
    }

    #[test]
    fn sanitising_twice_changes_nothing() {
        let once = sanitize_error("a\x1b\u{202e}b").into_owned();
        assert_eq!(sanitize_error(&once), once);
    }

    #[test]
    fn invalid_utf8_from_the_wire_becomes_replacement_characters() {
        assert_eq!(sanitize_error_bytes(b"bad \xff byte"), "bad \u{fffd} byte");
    }
}
