//! The control protocol of `<name>.sock`, as bytes: request lines in,
//! replies out. Pure: no sockets, no clock, no process state.
//!
//! A request is one word on one line, at most [`LINE_MAX`] bytes including
//! the `\n`. A reply starts `ok` or `err <why>` and is at most
//! [`REPLY_MAX`] bytes. This module owns the line limit, the NUL rule, the
//! word grammar, the escaping of an unknown word and every reply's shape.
//! It must never panic on peer input and never allocate more than
//! [`LINE_MAX`] bytes for one line, whatever a peer sends.

use std::fmt::Write as _;

/// Longest request line, including its `\n`.
pub const LINE_MAX: usize = 4096;
/// Longest reply, in bytes.
pub const REPLY_MAX: usize = 4096;
/// Longest escaped word echoed in an unknown-request reply.
pub const ECHO_MAX: usize = 64;
/// The version of this protocol, reported by `info` as `proto`.
pub const PROTO_VERSION: u32 = 1;
/// The words a helper speaks, in the order its error reply lists them.
pub const WORDS: &str = "info stop display input";

/// What a peer asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    /// `info`: the sandbox's shape and posture.
    Info,
    /// `stop`: answer `ok`, then tear the sandbox down.
    Stop,
    /// `display`: lease the scanout.
    Display,
    /// `input`: send keyboard and pointer events.
    Input,
    /// An empty line.
    Empty,
    /// Any other word, already escaped and cut to [`ECHO_MAX`] bytes.
    Unknown(String),
}

/// A line the helper refuses to read; the connection is closed after the
/// `err` reply [`ProtocolError::reply`] gives.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProtocolError {
    /// No `\n` within [`LINE_MAX`] bytes.
    #[error("request line over {LINE_MAX} bytes")]
    LineTooLong,
    /// The line holds a NUL byte.
    #[error("request line contains NUL")]
    Nul,
    /// The peer closed in the middle of a line.
    #[error("request line not terminated by a newline")]
    Unterminated,
}

impl ProtocolError {
    /// The `err` reply sent before closing the connection.
    pub fn reply(&self) -> String {
        format!("err {self}\n")
    }
}

impl Request {
    /// Parses one line (without its `\n`). Surrounding ASCII whitespace,
    /// including a `\r` from a `\r\n` peer, is ignored. A NUL is refused.
    pub fn parse(line: &[u8]) -> Result<Request, ProtocolError> {
        if line.contains(&0) {
            return Err(ProtocolError::Nul);
        }
        Ok(match line.trim_ascii() {
            b"" => Request::Empty,
            b"info" => Request::Info,
            b"stop" => Request::Stop,
            b"display" => Request::Display,
            b"input" => Request::Input,
            other => Request::Unknown(escape_word(other)),
        })
    }
}

/// Escapes every byte outside printable ASCII (and the backslash) as
/// `\xNN`, then cuts the result to [`ECHO_MAX`] bytes without splitting an
/// escape. Non-ASCII bytes are escaped too, so no bidi control or other
/// code point a terminal acts on can come back.
pub fn escape_word(word: &[u8]) -> String {
    let mut out = String::with_capacity(ECHO_MAX);
    for &b in word {
        let mut piece = String::with_capacity(4);
        match b {
            b'\\' => piece.push_str("\\\\"),
            0x20..=0x7e => piece.push(b as char),
            _ => {
                let _ = write!(piece, "\\x{b:02x}");
            }
        }
        if out.len() + piece.len() > ECHO_MAX {
            break;
        }
        out.push_str(&piece);
    }
    out
}

/// Splits a byte stream into request lines without ever holding more than
/// [`LINE_MAX`] bytes.
#[derive(Debug, Default)]
pub struct LineBuffer {
    buf: Vec<u8>,
}

impl LineBuffer {
    /// An empty buffer.
    pub fn new() -> Self {
        Self::default()
    }

    /// How many more bytes the caller may read before the next call to
    /// [`LineBuffer::next_line`] must find a newline: reading at most this
    /// much keeps the buffer within [`LINE_MAX`].
    pub fn room(&self) -> usize {
        LINE_MAX - self.buf.len()
    }

    /// Whether no byte of a next line has arrived.
    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    /// Appends received bytes; at most [`LineBuffer::room`] of them.
    pub fn push(&mut self, bytes: &[u8]) {
        let take = bytes.len().min(self.room());
        self.buf.extend_from_slice(&bytes[..take]);
    }

    /// The next complete line without its `\n`, `Ok(None)` when more bytes
    /// are needed, or an error when the buffered line is already over the
    /// limit.
    pub fn next_line(&mut self) -> Result<Option<Vec<u8>>, ProtocolError> {
        // A NUL is refused as soon as it arrives, not only once its line ends.
        match self.buf.iter().position(|&b| b == b'\n' || b == 0) {
            Some(i) if self.buf[i] == 0 => Err(ProtocolError::Nul),
            Some(i) => {
                let rest = self.buf.split_off(i + 1);
                let mut line = std::mem::replace(&mut self.buf, rest);
                line.pop();
                Ok(Some(line))
            }
            None if self.buf.len() >= LINE_MAX => Err(ProtocolError::LineTooLong),
            None => Ok(None),
        }
    }

    /// Called at end of stream: bytes left over are an unterminated line.
    pub fn finish(&self) -> Result<(), ProtocolError> {
        if self.buf.is_empty() {
            Ok(())
        } else {
            Err(ProtocolError::Unterminated)
        }
    }
}

/// `err unknown request <w>; speaks: info stop display input`.
pub fn unknown_reply(escaped_word: &str) -> String {
    format!("err unknown request {escaped_word}; speaks: {WORDS}\n")
}

/// The reply to an empty line.
pub fn empty_reply() -> String {
    format!("err empty request; speaks: {WORDS}\n")
}

/// The reply to `display` and `input` on a sandbox without a display.
pub const NO_DISPLAY: &str = "err no display\n";
/// The reply to `stop`, sent before the helper tears down.
pub const OK: &str = "ok\n";

/// Formats an `info` reply: `ok`, one `key value` line per pair, then an
/// empty line. Keys and values must be single tokens: any byte outside
/// printable ASCII or a space in them is escaped, and the reply is cut at
/// a line boundary to stay within [`REPLY_MAX`].
pub fn info_reply(pairs: &[(&str, String)]) -> String {
    let mut out = String::from(OK);
    for (key, value) in pairs {
        let line = format!("{} {}\n", token(key.as_bytes()), token(value.as_bytes()));
        // Keep room for the final empty line.
        if out.len() + line.len() + 1 > REPLY_MAX {
            break;
        }
        out.push_str(&line);
    }
    out.push('\n');
    out
}

fn token(s: &[u8]) -> String {
    let mut out = String::with_capacity(s.len());
    for &b in s {
        match b {
            0x21..=0x7e if b != b'\\' => out.push(b as char),
            _ => {
                let _ = write!(out, "\\x{b:02x}");
            }
        }
    }
    if out.is_empty() {
        out.push('-');
    }
    out
}

/// A parsed reply as a client sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    /// `ok` and the text after it on the same line (usually empty).
    Ok(String),
    /// `err` and the reason.
    Err(String),
}

/// Parses a reply's first line (without `\n`). Anything that starts
/// neither `ok` nor `err` is reported as an error reply naming it.
pub fn parse_status_line(line: &str) -> Reply {
    if line == "ok" {
        Reply::Ok(String::new())
    } else if let Some(rest) = line.strip_prefix("ok ") {
        Reply::Ok(rest.to_owned())
    } else if let Some(rest) = line.strip_prefix("err ") {
        Reply::Err(rest.to_owned())
    } else if line == "err" {
        Reply::Err(String::new())
    } else {
        Reply::Err(format!(
            "malformed reply {:?}",
            escape_word(line.as_bytes())
        ))
    }
}

/// Parses the `key value` lines of an `info` reply (after `ok`, up to the
/// empty line). A line without a space gets an empty value.
pub fn parse_info_lines<'a>(lines: impl IntoIterator<Item = &'a str>) -> Vec<(String, String)> {
    lines
        .into_iter()
        .take_while(|l| !l.is_empty())
        .map(|l| match l.split_once(' ') {
            Some((k, v)) => (k.to_owned(), v.to_owned()),
            None => (l.to_owned(), String::new()),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_four_words_parse_and_whitespace_around_them_is_ignored() {
        assert_eq!(Request::parse(b"info"), Ok(Request::Info));
        assert_eq!(Request::parse(b"stop\r"), Ok(Request::Stop));
        assert_eq!(Request::parse(b"  display "), Ok(Request::Display));
        assert_eq!(Request::parse(b"input"), Ok(Request::Input));
        assert_eq!(Request::parse(b""), Ok(Request::Empty));
    }

    #[test]
    fn an_unknown_word_is_echoed_escaped_in_the_reply_naming_the_known_words() {
        let Ok(Request::Unknown(w)) = Request::parse(b"frob\x1b[31m") else {
            panic!("not unknown");
        };
        assert_eq!(w, "frob\\x1b[31m");
        assert_eq!(
            unknown_reply(&w),
            "err unknown request frob\\x1b[31m; speaks: info stop display input\n"
        );
    }

    #[test]
    fn a_word_with_a_nul_is_refused() {
        assert_eq!(Request::parse(b"in\0fo"), Err(ProtocolError::Nul));
    }

    #[test]
    fn the_echoed_word_is_cut_to_64_bytes_without_splitting_an_escape() {
        let w = escape_word(&[b'a'; 200]);
        assert_eq!(w.len(), ECHO_MAX);
        let mut word = vec![b'a'; 62];
        word.push(0x07);
        let w = escape_word(&word);
        assert_eq!(w, "a".repeat(62), "a split escape leaked: {w}");
        let w = escape_word(&[0xffu8; 40]);
        assert!(w.len() <= ECHO_MAX && w.len() % 4 == 0, "{w}");
    }

    #[test]
    fn non_ascii_and_bidi_controls_are_escaped_byte_by_byte() {
        assert_eq!(escape_word("\u{202e}".as_bytes()), "\\xe2\\x80\\xae");
        assert_eq!(escape_word(b"a\\b"), "a\\\\b");
    }

    #[test]
    fn lines_are_split_across_pushes_and_several_per_push() {
        let mut lb = LineBuffer::new();
        lb.push(b"in");
        assert_eq!(lb.next_line(), Ok(None));
        lb.push(b"fo\nstop\nx");
        assert_eq!(lb.next_line(), Ok(Some(b"info".to_vec())));
        assert_eq!(lb.next_line(), Ok(Some(b"stop".to_vec())));
        assert_eq!(lb.next_line(), Ok(None));
        assert_eq!(lb.finish(), Err(ProtocolError::Unterminated));
    }

    #[test]
    fn a_nul_is_refused_before_its_line_ends() {
        let mut lb = LineBuffer::new();
        lb.push(b"in\0");
        assert_eq!(lb.next_line(), Err(ProtocolError::Nul));
    }

    #[test]
    fn a_line_of_exactly_4096_bytes_with_its_newline_is_accepted() {
        let mut lb = LineBuffer::new();
        let mut line = vec![b'a'; LINE_MAX - 1];
        line.push(b'\n');
        lb.push(&line);
        assert_eq!(lb.next_line().unwrap().unwrap().len(), LINE_MAX - 1);
    }

    #[test]
    fn a_line_over_4096_bytes_is_refused_and_never_buffered_past_the_limit() {
        let mut lb = LineBuffer::new();
        lb.push(&vec![b'a'; LINE_MAX + 100]);
        assert_eq!(lb.room(), 0);
        assert_eq!(lb.next_line(), Err(ProtocolError::LineTooLong));
        assert!(ProtocolError::LineTooLong.reply().starts_with("err "));
    }

    #[test]
    fn an_info_reply_is_ok_then_key_value_lines_then_an_empty_line() {
        let r = info_reply(&[("proto", "1".into()), ("name", "dev".into())]);
        assert_eq!(r, "ok\nproto 1\nname dev\n\n");
        let lines: Vec<&str> = r.lines().collect();
        assert_eq!(parse_status_line(lines[0]), Reply::Ok(String::new()));
        assert_eq!(
            parse_info_lines(lines[1..].iter().copied()),
            vec![("proto".into(), "1".into()), ("name".into(), "dev".into())]
        );
    }

    #[test]
    fn an_info_value_with_spaces_or_newlines_stays_one_token() {
        let r = info_reply(&[("rootfs", "a b\nc".into()), ("empty", String::new())]);
        assert_eq!(r, "ok\nrootfs a\\x20b\\x0ac\nempty -\n\n");
    }

    #[test]
    fn an_info_reply_never_exceeds_4096_bytes() {
        let big: Vec<(&str, String)> = (0..200).map(|_| ("key", "v".repeat(60))).collect();
        let r = info_reply(&big);
        assert!(r.len() <= REPLY_MAX);
        assert!(r.ends_with("\n\n"));
    }

    #[test]
    fn status_lines_parse_ok_err_and_garbage() {
        assert_eq!(
            parse_status_line("err no display"),
            Reply::Err("no display".into())
        );
        assert!(matches!(parse_status_line("hello"), Reply::Err(m) if m.contains("malformed")));
    }
}
