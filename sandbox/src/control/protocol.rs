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

use boxdesk_platform::screen::{
    InputDevice, InputEvent, Layout, Record, Rect, BYTES_PER_PIXEL, EV_ABS, EV_KEY, EV_REL, FORMAT,
};

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

/// Parses one line of an `input` stream: `kbd|ptr TYPE CODE VALUE`, where
/// TYPE is `key`, `rel`, `abs` or a decimal event type, CODE a decimal
/// code and VALUE a decimal (signed) value. The error is the text of the
/// `err` reply, peer words escaped.
pub fn parse_input(line: &[u8]) -> Result<InputEvent, String> {
    const SHAPE: &str = "expected `kbd|ptr TYPE CODE VALUE`";
    let words: Vec<&[u8]> = line
        .split(|b| b.is_ascii_whitespace())
        .filter(|w| !w.is_empty())
        .take(5)
        .collect();
    let [device, kind, code, value] = words[..] else {
        return Err(format!("bad input line: {SHAPE}"));
    };
    let device = match device {
        b"kbd" => InputDevice::Keyboard,
        b"ptr" => InputDevice::Pointer,
        other => {
            return Err(format!(
                "unknown input device {}: {SHAPE}",
                escape_word(other)
            ))
        }
    };
    let number = |what: &str, w: &[u8]| -> Result<i64, String> {
        std::str::from_utf8(w)
            .ok()
            .filter(|s| s.len() <= 11)
            .and_then(|s| s.parse::<i64>().ok())
            .ok_or_else(|| format!("bad {what} {}: {SHAPE}", escape_word(w)))
    };
    let kind = match kind {
        b"key" => EV_KEY,
        b"rel" => EV_REL,
        b"abs" => EV_ABS,
        other => u16::try_from(number("type", other)?)
            .map_err(|_| format!("bad type {}: {SHAPE}", escape_word(other)))?,
    };
    let code = u16::try_from(number("code", code)?)
        .map_err(|_| format!("bad code {}: {SHAPE}", escape_word(code)))?;
    let value = i32::try_from(number("value", value)?)
        .map_err(|_| format!("bad value {}: {SHAPE}", escape_word(value)))?;
    Ok(InputEvent {
        device,
        kind,
        code,
        value,
    })
}

/// Parses the text after `ok ` of a `display` reply (what
/// [`Layout`]'s `Display` writes): `width W height H stride S format F
/// slots N slot_size B`, in any order, unknown keys ignored. `None` when a
/// key is missing or repeated, a number does not parse, the format is not
/// [`FORMAT`], or the numbers do not describe slots that hold the mode.
pub fn parse_layout(text: &str) -> Option<Layout> {
    let words: Vec<&str> = text.split_ascii_whitespace().take(64).collect();
    if words.len() % 2 != 0 {
        return None;
    }
    let (mut width, mut height, mut stride, mut slots, mut slot_size, mut format) =
        (None, None, None, None, None, None);
    for pair in words.chunks_exact(2) {
        let [key, value] = [pair[0], pair[1]];
        let slot = match key {
            "width" => &mut width,
            "height" => &mut height,
            "stride" => &mut stride,
            "slots" => &mut slots,
            "slot_size" => &mut slot_size,
            "format" => {
                if format.replace(value).is_some() {
                    return None;
                }
                continue;
            }
            _ => continue,
        };
        if slot.replace(decimal(value)?).is_some() {
            return None;
        }
    }
    let layout = Layout {
        width: u32::try_from(width?).ok()?,
        height: u32::try_from(height?).ok()?,
        stride: u32::try_from(stride?).ok()?,
        slots: u32::try_from(slots?).ok()?,
        slot_size: slot_size?,
    };
    (format? == FORMAT && holds(&layout, layout.width, layout.height) && layout.slots > 0)
        .then_some(layout)
}

/// Whether a mode of `width` x `height` fits `layout`'s slots: at least
/// one pixel each way, rows within the stride, every row within a slot.
pub fn holds(layout: &Layout, width: u32, height: u32) -> bool {
    let row = u64::from(width) * u64::from(BYTES_PER_PIXEL);
    width > 0
        && height > 0
        && row <= u64::from(layout.stride)
        && u64::from(layout.stride) * u64::from(height) <= layout.slot_size
}

/// Parses one record line of a `display` stream (without its `\n`):
/// `present SLOT SEQ X Y W H`, `mode W H` or `end WHY`. An `end` with a
/// reason this side does not know is `end unknown`. `None` for anything
/// else; whether the numbers fit the lease is the caller's to check.
pub fn parse_record(line: &str) -> Option<Record> {
    let words: Vec<&str> = line.split_ascii_whitespace().take(8).collect();
    let n = |i: usize| words.get(i).copied().and_then(decimal);
    let n32 = |i: usize| n(i).and_then(|v| u32::try_from(v).ok());
    match words.as_slice() {
        ["present", _, _, _, _, _, _] => Some(Record::Present {
            slot: n32(1)?,
            seq: n(2)?,
            rect: Rect {
                x: n32(3)?,
                y: n32(4)?,
                w: n32(5)?,
                h: n32(6)?,
            },
        }),
        ["mode", _, _] => Some(Record::Mode {
            width: n32(1)?,
            height: n32(2)?,
        }),
        ["end", why] => Some(Record::End(match *why {
            "replaced" => "replaced",
            "stopped" => "stopped",
            _ => "unknown",
        })),
        _ => None,
    }
}

/// A plain decimal (digits only, at most 20 of them) that fits a `u64`.
fn decimal(word: &str) -> Option<u64> {
    if word.is_empty() || word.len() > 20 || !word.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    word.parse().ok()
}

/// One line of an `input` stream, as [`parse_input`] reads it back.
pub fn input_line(event: &InputEvent) -> String {
    let device = match event.device {
        InputDevice::Keyboard => "kbd",
        InputDevice::Pointer => "ptr",
    };
    let kind = match event.kind {
        EV_KEY => "key".to_owned(),
        EV_REL => "rel".to_owned(),
        EV_ABS => "abs".to_owned(),
        other => other.to_string(),
    };
    format!("{device} {kind} {} {}\n", event.code, event.value)
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

    #[test]
    fn input_lines_parse_by_name_or_number_and_bad_ones_say_what_is_expected() {
        let ev = |device, kind, code, value| InputEvent {
            device,
            kind,
            code,
            value,
        };
        assert_eq!(
            parse_input(b"kbd key 30 1"),
            Ok(ev(InputDevice::Keyboard, EV_KEY, 30, 1))
        );
        assert_eq!(
            parse_input(b" ptr  3 0 -5\r"),
            Ok(ev(InputDevice::Pointer, EV_ABS, 0, -5))
        );
        assert_eq!(
            parse_input(b"ptr rel 8 2147483647"),
            Ok(ev(InputDevice::Pointer, EV_REL, 8, i32::MAX))
        );
        for bad in [
            &b"kbd key 30"[..],
            b"kbd key 30 1 extra",
            b"mouse key 30 1",
            b"kbd wheel 30 1",
            b"kbd key 65536 1",
            b"kbd key -1 1",
            b"kbd key 30 2147483648",
            b"kbd key 30 99999999999999999999",
            b"kbd key 0x1e 1",
            b"",
        ] {
            let e = parse_input(bad).unwrap_err();
            assert!(e.contains("kbd|ptr TYPE CODE VALUE"), "{e}");
        }
        assert_eq!(
            parse_input(b"\x1b[31m key 1 1").unwrap_err(),
            "unknown input device \\x1b[31m: expected `kbd|ptr TYPE CODE VALUE`"
        );
    }

    #[test]
    fn a_display_reply_parses_back_into_the_layout_the_helper_wrote() {
        let layout = Layout {
            width: 64,
            height: 32,
            stride: 256,
            slots: 3,
            slot_size: 8192,
        };
        assert_eq!(parse_layout(&layout.to_string()), Some(layout));
        let reordered =
            "slots 3 format XRGB8888 slot_size 8192 height 32 stride 256 width 64 hz 60";
        assert_eq!(parse_layout(reordered), Some(layout));
    }

    #[test]
    fn a_layout_that_is_incomplete_inconsistent_or_not_xrgb8888_is_refused() {
        for bad in [
            "",
            "width 64 height 32 stride 256 format XRGB8888 slots 3",
            "width 64 height 32 stride 256 format XRGB8888 slots 3 slot_size",
            "width 64 height 32 stride 256 format RGB565 slots 3 slot_size 8192",
            "width 65 height 32 stride 256 format XRGB8888 slots 3 slot_size 8192",
            "width 64 height 33 stride 256 format XRGB8888 slots 3 slot_size 8192",
            "width 64 height 32 stride 256 format XRGB8888 slots 0 slot_size 8192",
            "width 0 height 32 stride 256 format XRGB8888 slots 3 slot_size 8192",
            "width -64 height 32 stride 256 format XRGB8888 slots 3 slot_size 8192",
            "width 4294967296 height 32 stride 256 format XRGB8888 slots 3 slot_size 8192",
            "width 64 width 64 height 32 stride 256 format XRGB8888 slots 3 slot_size 8192",
            "width 64 height 32 stride 256 format XRGB8888 slots 3 slot_size 99999999999999999999999",
        ] {
            assert_eq!(parse_layout(bad), None, "{bad}");
        }
    }

    #[test]
    fn every_record_the_helper_writes_parses_back_to_itself() {
        for record in [
            Record::Present {
                slot: 2,
                seq: u64::MAX,
                rect: Rect {
                    x: 1,
                    y: 2,
                    w: 3,
                    h: 4,
                },
            },
            Record::Mode {
                width: 800,
                height: 600,
            },
            Record::End("replaced"),
            Record::End("stopped"),
        ] {
            assert_eq!(parse_record(&record.to_string()), Some(record));
        }
        assert_eq!(parse_record("end reboot"), Some(Record::End("unknown")));
    }

    #[test]
    fn a_malformed_record_line_is_none_never_a_panic() {
        for bad in [
            "",
            "present",
            "present 1 2 3 4 5",
            "present 1 2 3 4 5 6 7",
            "present 1 2 3 4 5 -6",
            "present 4294967296 1 0 0 1 1",
            "present 1 18446744073709551616 0 0 1 1",
            "present +1 1 0 0 1 1",
            "mode 1",
            "mode x y",
            "end",
            "end a b",
            "frame 1 2",
            "\u{202e}mode 1 1",
        ] {
            assert_eq!(parse_record(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn an_input_line_parses_back_to_the_event_it_was_made_from() {
        for event in [
            InputEvent {
                device: InputDevice::Keyboard,
                kind: EV_KEY,
                code: 30,
                value: 1,
            },
            InputEvent {
                device: InputDevice::Pointer,
                kind: EV_REL,
                code: 8,
                value: -1,
            },
            InputEvent {
                device: InputDevice::Pointer,
                kind: 5,
                code: 0,
                value: i32::MIN,
            },
        ] {
            let line = input_line(&event);
            assert!(line.ends_with('\n'), "{line}");
            assert_eq!(parse_input(line.trim_end().as_bytes()), Ok(event));
        }
    }
}
