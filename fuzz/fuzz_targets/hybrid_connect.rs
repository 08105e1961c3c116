//! Fuzzes the hybrid-vsock preamble parser (`boxdesk_channel::hybrid`):
//! arbitrary bytes as a client's request and as a server's reply must never
//! panic, and every verdict must keep the module's promises.
//!
//! * A request is judged at the first byte that settles it: every longer
//!   input starting with those bytes gets the same verdict, and nothing is
//!   still `Partial` at `REQUEST_MAX` bytes.
//! * An accepted request is exactly the line a client writes for its port,
//!   the port in range; the bytes after it are not looked at.
//! * A reply is `Ok` only for the `OK` line of its port, `Err` only for a
//!   printable reason that reads back as that line; never `Partial` at
//!   `REPLY_MAX` bytes.
#![no_main]

use boxdesk_channel::hybrid::{
    ok_reply, request, scan_reply, scan_request, scan_request_at_eof, Reply, Scan, MAX_PORT,
    REPLY_MAX, REQUEST_MAX,
};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let verdict = scan_request(data);
    // The shortest prefix that settles it settles every longer input.
    let settled_at =
        (0..=data.len().min(REQUEST_MAX)).find(|&k| scan_request(&data[..k]) != Scan::Partial);
    match settled_at {
        Some(k) => assert_eq!(scan_request(&data[..k]), verdict),
        None => {
            assert!(data.len() < REQUEST_MAX, "partial at {} bytes", data.len());
            assert_eq!(verdict, Scan::Partial);
        }
    }
    match verdict {
        Scan::Connect(r) => {
            assert!((1..=MAX_PORT).contains(&r.port));
            assert!(r.len <= REQUEST_MAX);
            assert_eq!(&data[..r.len], request(r.port).as_bytes());
            assert_eq!(scan_request_at_eof(data), Ok(r));
        }
        Scan::Refused(e) => assert_eq!(scan_request_at_eof(data), Err(e)),
        Scan::Partial => assert!(scan_request_at_eof(data).is_err()),
    }

    match scan_reply(data) {
        Reply::Ok { port, len } => {
            assert!((1..=MAX_PORT).contains(&port));
            assert_eq!(&data[..len], ok_reply(port).as_bytes());
        }
        Reply::Err(why) => {
            assert!(!why.is_empty() && why.bytes().all(|b| (0x20..=0x7e).contains(&b)));
            let line = format!("ERR {why}\n");
            assert!(line.len() <= REPLY_MAX);
            assert!(data.starts_with(line.as_bytes()));
        }
        Reply::Partial => assert!(data.len() < REPLY_MAX, "partial at {} bytes", data.len()),
        Reply::Malformed(_) => {}
    }
});
