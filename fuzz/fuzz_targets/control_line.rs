//! Fuzzes the control socket's line protocol (`boxdesk_sandbox::control::
//! protocol`) as a peer feeds it: the bytes arrive in chunks (sizes from
//! byte 0) through a `LineBuffer`, and every line it yields is parsed as a
//! request word, an `input` line, a display layout and a record.
//!
//! * The buffer never holds more than `LINE_MAX` bytes and yields lines
//!   without `\n` or NUL; once it refuses, the connection is over.
//! * An unknown word is echoed escaped: printable ASCII, at most
//!   `ECHO_MAX` bytes.
//! * An accepted `input` line reads back as itself through `input_line`;
//!   an accepted layout holds its own mode.
#![no_main]

use boxdesk_sandbox::control::protocol::{
    holds, input_line, parse_input, parse_layout, parse_record, LineBuffer, Request, ECHO_MAX,
    LINE_MAX,
};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&chunk, bytes)) = data.split_first() else {
        return;
    };
    let chunk = usize::from(chunk).max(1) * 37;
    let mut buf = LineBuffer::new();
    let mut rest = bytes;
    'feed: while !rest.is_empty() {
        let take = chunk.min(rest.len()).min(buf.room().max(1));
        buf.push(&rest[..take]);
        rest = &rest[take..];
        loop {
            match buf.next_line() {
                Ok(Some(line)) => {
                    assert!(line.len() < LINE_MAX);
                    assert!(!line.contains(&b'\n') && !line.contains(&0));
                    one_line(&line);
                }
                Ok(None) => break,
                Err(_) => break 'feed,
            }
        }
        assert!(buf.room() <= LINE_MAX);
    }
    let _ = buf.finish();
});

fn one_line(line: &[u8]) {
    if let Ok(Request::Unknown(word)) = Request::parse(line) {
        assert!(word.len() <= ECHO_MAX);
        assert!(word.bytes().all(|b| (0x20..=0x7e).contains(&b)));
    }
    if let Ok(event) = parse_input(line) {
        let back = input_line(&event);
        assert_eq!(parse_input(back.trim_end().as_bytes()), Ok(event));
    }
    if let Ok(text) = std::str::from_utf8(line) {
        if let Some(layout) = parse_layout(text) {
            assert!(holds(&layout, layout.width, layout.height));
        }
        let _ = parse_record(text);
    }
}
