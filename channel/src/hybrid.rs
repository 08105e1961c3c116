//! The hybrid-vsock preamble: the one line a client writes to a hybrid
//! socket (`<name>.agent`) before the AGCH stream, and the one line it gets
//! back. Every side parses and writes it here: the client
//! ([`crate::Session::connect_hybrid`]), the namespace backend's forwarder
//! (`boxdesk_sandbox::forward`) and the VMM's vsock muxer
//! (`boxdesk_devices::vsock`).
//!
//! # Grammar
//!
//! Bytes, not text: no case folding, no whitespace trimming, no locale.
//!
//! ```text
//! request = "CONNECT" SP port LF          ; at most REQUEST_MAX bytes
//! ok      = "OK" SP port LF               ; the host-side port of the stream
//! err     = "ERR" SP why LF               ; at most REPLY_MAX bytes
//! port    = "1"-"9" *9("0"-"9")           ; 1 ..= MAX_PORT, decimal
//! why     = 1*(%x20-7E)                   ; printable ASCII
//! ```
//!
//! So `CONNECT 1024\n` and nothing like it: no `\r`, no `+` or `-`, no
//! leading zero, no second space, no lower case, no port 0 (no one listens
//! there) and no 4294967295 (`VMADDR_PORT_ANY`, never a real port).
//! Firecracker and vhost-device-vsock are laxer (any case, any whitespace,
//! Rust's `u32` parse, which takes `+1024`); a strict grammar leaves a
//! server nothing to guess, and our only client writes the strict form.
//! Like them, a server reads no further than the `\n`, so a client may
//! write its first stream bytes in the same send as its line.
//!
//! # Rules every server follows
//!
//! * **The peer's uid first**: a peer that is not our effective uid is sent
//!   [`REPLY_FOREIGN`] and closed before a byte of it is read
//!   (`boxdesk_platform::socket::ensure_same_uid`, SO_PEERCRED).
//! * **The line is capped before it is buffered**: [`scan_request`] gives a
//!   verdict at the first byte that cannot continue a valid line, so a
//!   server never holds more than [`REQUEST_MAX`] bytes of it (the longest
//!   valid line, `CONNECT 4294967294\n`) and a refusal never waits for the
//!   rest of a bad line.
//! * **Bytes after the `\n` are the stream's**: our servers hand bytes a
//!   client sent right behind its line to the stream once it is up, in
//!   order, before anything they read later. Our client still waits for
//!   `OK` before it writes more: other hybrid-vsock servers
//!   (vhost-device-vsock, checked by `images/check-qemu.sh`) do not keep
//!   them.
//! * **A refusal is one `ERR <why>\n` line, then close**: [`Refusal`] is
//!   every reason and [`Refusal::reply`] its line. The line never quotes
//!   what the client sent.
//! * **A peer cut short**: closing before any byte is no request (closed
//!   silently); closing after some is [`ConnectError::Unterminated`].
//!
//! This module owns the bytes of both lines and nothing else: it never
//! touches a socket.

use std::fmt;

/// The highest port a line may name: `u32::MAX` is `VMADDR_PORT_ANY`.
pub const MAX_PORT: u32 = u32::MAX - 1;
/// The longest request line, `\n` included: `CONNECT 4294967294\n`.
/// [`scan_request`] never asks for more than this.
pub const REQUEST_MAX: usize = PREFIX.len() + 10 + 1;
/// The longest reply line, `\n` included, a client reads; every
/// [`Refusal::reply`] fits.
pub const REPLY_MAX: usize = 128;

/// [`Refusal::TooMany`]'s line, for servers that need it as a constant.
pub const REPLY_TOO_MANY: &[u8] = b"ERR too many connections\n";
/// [`Refusal::Stalled`]'s line.
pub const REPLY_STALLED: &[u8] = b"ERR no preamble in time\n";
/// [`Refusal::Foreign`]'s line.
pub const REPLY_FOREIGN: &[u8] = b"ERR permission denied\n";

const PREFIX: &[u8] = b"CONNECT ";
const OK: &[u8] = b"OK ";
const ERR: &[u8] = b"ERR ";

/// Why a request line is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ConnectError {
    /// The line does not begin with `CONNECT ` (upper case, one space).
    #[error("expected CONNECT <port>")]
    NotConnect,
    /// The port is missing, signed, spaced or starts with a zero.
    #[error("bad port: decimal digits, no sign, no leading zero")]
    BadPort,
    /// The port is 0, or above [`MAX_PORT`].
    #[error("port out of range 1-4294967294")]
    PortRange,
    /// Something other than `\n` follows the port (a `\r`, a space…).
    #[error("expected a newline right after the port")]
    Trailing,
    /// The client closed (or half-closed) before its `\n`.
    #[error("closed before the end of the line")]
    Unterminated,
}

/// A whole request line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request {
    /// The guest port asked for.
    pub port: u32,
    /// Length of the line, `\n` included: the bytes after it are the
    /// stream's.
    pub len: usize,
}

/// What the bytes of a request received so far amount to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scan {
    /// A valid beginning: read more (never past [`REQUEST_MAX`] in all).
    Partial,
    /// A whole request.
    Connect(Request),
    /// No valid line starts this way.
    Refused(ConnectError),
}

/// Judges the bytes a client sent so far (its request line and perhaps
/// stream bytes after it), at the first byte that settles it.
pub fn scan_request(buf: &[u8]) -> Scan {
    let head = &buf[..buf.len().min(PREFIX.len())];
    if !PREFIX.starts_with(head) {
        return Scan::Refused(ConnectError::NotConnect);
    }
    let digits = buf.get(PREFIX.len()..).unwrap_or_default();
    match scan_port(digits) {
        PortScan::Partial => Scan::Partial,
        PortScan::Port { port, len } => Scan::Connect(Request {
            port,
            len: PREFIX.len() + len,
        }),
        PortScan::Bad(e) => Scan::Refused(e),
    }
}

/// The verdict on all a client sent before its end of stream (or, for a
/// server that stopped reading once [`request_settled`], on what it read):
/// a line still [`Scan::Partial`] is [`ConnectError::Unterminated`].
pub fn scan_request_at_eof(buf: &[u8]) -> Result<Request, ConnectError> {
    match scan_request(buf) {
        Scan::Connect(r) => Ok(r),
        Scan::Refused(e) => Err(e),
        Scan::Partial => Err(ConnectError::Unterminated),
    }
}

/// Whether a server has read enough to act: a whole line or a refusal.
/// For a server that reads in chunks and checks after each.
pub fn request_settled(buf: &[u8]) -> bool {
    scan_request(buf) != Scan::Partial
}

/// The request a client writes for `port`.
pub fn request(port: u32) -> String {
    format!("CONNECT {port}\n")
}

/// The line a server answers once the stream to the guest's port is up,
/// `host_port` naming the host's end of it.
pub fn ok_reply(host_port: u32) -> String {
    format!("OK {host_port}\n")
}

/// Why a server refuses a client: the `<why>` of its `ERR <why>\n` line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// The request line is not one.
    #[error(transparent)]
    Request(#[from] ConnectError),
    /// Nothing listens on that guest port.
    #[error("no listener on port {0}")]
    NoListener(u32),
    /// The guest did not answer for that port in time.
    #[error("port {0} did not answer in time")]
    NoAnswer(u32),
    /// The server's connection cap is reached.
    #[error("too many connections")]
    TooMany,
    /// No request line within the server's deadline.
    #[error("no preamble in time")]
    Stalled,
    /// The peer runs as another uid.
    #[error("permission denied")]
    Foreign,
    /// The agent behind the socket cannot be reached.
    #[error("the agent is not reachable")]
    Unreachable,
}

impl Refusal {
    /// The whole reply line: `ERR <why>\n`.
    pub fn reply(&self) -> String {
        format!("ERR {self}\n")
    }
}

/// A server's answer, as the client reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reply<'a> {
    /// A valid beginning of a line: read more (never past [`REPLY_MAX`]).
    Partial,
    /// `OK <port>`: the stream starts after this line, at byte `len`.
    Ok {
        /// The host-side port the server named.
        port: u32,
        /// Length of the line, `\n` included.
        len: usize,
    },
    /// `ERR <why>`: refused; `why` is printable ASCII.
    Err(&'a str),
    /// Not a reply this grammar allows.
    Malformed(BadReply),
}

/// Why a reply line is not one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum BadReply {
    /// Neither `OK ` nor `ERR ` starts it.
    #[error("the answer is neither OK nor ERR")]
    Unknown,
    /// `OK` with a port outside the grammar.
    #[error("the OK line has a bad port")]
    BadPort,
    /// `ERR` with no reason, or one that is not printable ASCII.
    #[error("the ERR line has a bad reason")]
    BadReason,
    /// No `\n` within [`REPLY_MAX`] bytes.
    #[error("the answer line is too long")]
    TooLong,
}

/// Judges the bytes a server sent so far: its line and perhaps stream
/// bytes after it (a client reads in chunks; [`Reply::Ok`] says where the
/// stream starts). Only the first [`REPLY_MAX`] bytes are looked at.
pub fn scan_reply(buf: &[u8]) -> Reply<'_> {
    if buf.starts_with(OK) {
        return match scan_port(&buf[OK.len()..]) {
            PortScan::Partial => Reply::Partial,
            PortScan::Port { port, len } => Reply::Ok {
                port,
                len: OK.len() + len,
            },
            PortScan::Bad(_) => Reply::Malformed(BadReply::BadPort),
        };
    }
    if buf.starts_with(ERR) {
        let rest = &buf[ERR.len()..buf.len().min(REPLY_MAX)];
        let end = rest.iter().position(|&b| b == b'\n');
        let why = &rest[..end.unwrap_or(rest.len())];
        if !why.iter().all(|b| (0x20..=0x7e).contains(b)) || (end.is_some() && why.is_empty()) {
            return Reply::Malformed(BadReply::BadReason);
        }
        return match end {
            // All printable ASCII, so UTF-8.
            Some(_) => Reply::Err(std::str::from_utf8(why).unwrap_or_default()),
            None if buf.len() >= REPLY_MAX => Reply::Malformed(BadReply::TooLong),
            None => Reply::Partial,
        };
    }
    let n = buf.len();
    if OK.starts_with(buf) || ERR.starts_with(buf) || n == 0 {
        Reply::Partial
    } else {
        Reply::Malformed(BadReply::Unknown)
    }
}

/// What the bytes after `CONNECT ` or `OK ` amount to.
enum PortScan {
    Partial,
    /// `len` counts the digits and the `\n`.
    Port {
        port: u32,
        len: usize,
    },
    Bad(ConnectError),
}

/// `port LF`, judged at the first byte that settles it: at most 10 digits
/// and the `\n`, as 11 digits without a leading zero exceed [`MAX_PORT`].
fn scan_port(buf: &[u8]) -> PortScan {
    let mut port: u64 = 0;
    for (i, &b) in buf.iter().enumerate() {
        match b {
            b'\n' if i == 0 => return PortScan::Bad(ConnectError::BadPort),
            b'\n' => {
                return match u32::try_from(port) {
                    Ok(port @ 1..=MAX_PORT) => PortScan::Port { port, len: i + 1 },
                    _ => PortScan::Bad(ConnectError::PortRange),
                }
            }
            b'0'..=b'9' if i > 0 && port == 0 => return PortScan::Bad(ConnectError::BadPort),
            b'0'..=b'9' => {
                port = port * 10 + u64::from(b - b'0');
                if port > u64::from(MAX_PORT) {
                    return PortScan::Bad(ConnectError::PortRange);
                }
            }
            _ if i == 0 => return PortScan::Bad(ConnectError::BadPort),
            _ => return PortScan::Bad(ConnectError::Trailing),
        }
    }
    PortScan::Partial
}

/// One request line and what every server must answer to it: the cases
/// both servers' tests (the forwarder's and the muxer's) run, so that they
/// refuse the same lines with the same reply. `None`: accepted (the server
/// then answers `OK` or a refusal of its own, such as
/// [`Refusal::NoListener`]).
#[derive(Debug, Clone, Copy)]
pub struct Case {
    /// What the client writes, then it half-closes.
    pub sent: &'static [u8],
    /// The refusal every server answers, if any.
    pub refused: Option<Refusal>,
}

impl fmt::Display for Case {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.sent.escape_ascii().to_string())
    }
}

const fn case(sent: &'static [u8], refused: ConnectError) -> Case {
    Case {
        sent,
        refused: Some(Refusal::Request(refused)),
    }
}

/// The edge cases of the grammar, with the one answer each gets from any
/// server.
pub const CASES: &[Case] = &[
    Case {
        sent: b"CONNECT 1024\n",
        refused: None,
    },
    Case {
        sent: b"CONNECT 4294967294\n",
        refused: None,
    },
    case(b"\n", ConnectError::NotConnect),
    case(b"HELLO 1\n", ConnectError::NotConnect),
    case(b"connect 1024\n", ConnectError::NotConnect),
    case(b"CONNECT\t1024\n", ConnectError::NotConnect),
    case(b"CONNECT\n", ConnectError::NotConnect),
    case(b"\0CONNECT 1024\n", ConnectError::NotConnect),
    case("CONNECT\u{a0}1024\n".as_bytes(), ConnectError::NotConnect),
    case(b"CONNECT \n", ConnectError::BadPort),
    case(b"CONNECT  1024\n", ConnectError::BadPort),
    case(b"CONNECT +1024\n", ConnectError::BadPort),
    case(b"CONNECT -1\n", ConnectError::BadPort),
    case(b"CONNECT 01024\n", ConnectError::BadPort),
    case(b"CONNECT 00\n", ConnectError::BadPort),
    case(b"CONNECT x\n", ConnectError::BadPort),
    case("CONNECT \u{661}\n".as_bytes(), ConnectError::BadPort),
    case(b"CONNECT 0\n", ConnectError::PortRange),
    case(b"CONNECT 4294967295\n", ConnectError::PortRange),
    case(b"CONNECT 4294967296\n", ConnectError::PortRange),
    case(b"CONNECT 99999999999999999999\n", ConnectError::PortRange),
    case(b"CONNECT 1024\r\n", ConnectError::Trailing),
    case(b"CONNECT 1024 \n", ConnectError::Trailing),
    case(b"CONNECT 10 24\n", ConnectError::Trailing),
    case(b"CONNECT 1024\0\n", ConnectError::Trailing),
    case(b"CONNECT 1024", ConnectError::Unterminated),
    case(b"CONN", ConnectError::Unterminated),
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_case_gets_the_answer_the_table_gives() {
        for c in CASES {
            let got = match scan_request_at_eof(c.sent) {
                Ok(r) => {
                    assert_eq!(r.len, c.sent.len(), "{c}");
                    assert_eq!(request(r.port).as_bytes(), c.sent, "{c}");
                    None
                }
                Err(e) => Some(Refusal::Request(e)),
            };
            assert_eq!(got, c.refused, "{c}");
        }
    }

    #[test]
    fn the_bytes_after_the_line_belong_to_the_stream() {
        assert_eq!(
            scan_request(b"CONNECT 1024\nAGCH\x03\x00"),
            Scan::Connect(Request {
                port: 1024,
                len: 13
            })
        );
    }

    #[test]
    fn a_valid_beginning_waits_for_more_and_a_bad_one_is_refused_at_once() {
        for partial in [
            &b""[..],
            b"C",
            b"CONNECT",
            b"CONNECT ",
            b"CONNECT 0",
            b"CONNECT 429496729",
        ] {
            assert_eq!(scan_request(partial), Scan::Partial, "{partial:?}");
        }
        assert_eq!(scan_request(b"G"), Scan::Refused(ConnectError::NotConnect));
        assert_eq!(
            scan_request(b"CONNECT +"),
            Scan::Refused(ConnectError::BadPort)
        );
        assert_eq!(
            scan_request(b"CONNECT 01"),
            Scan::Refused(ConnectError::BadPort)
        );
        assert_eq!(
            scan_request(b"CONNECT 1\r"),
            Scan::Refused(ConnectError::Trailing)
        );
        assert_eq!(
            scan_request(b"CONNECT 4294967295"),
            Scan::Refused(ConnectError::PortRange),
            "a port already too big needs no newline to be refused"
        );
    }

    #[test]
    fn no_request_is_partial_at_request_max_bytes() {
        let longest = b"CONNECT 4294967294\n";
        assert_eq!(longest.len(), REQUEST_MAX);
        assert_eq!(scan_request(&longest[..REQUEST_MAX - 1]), Scan::Partial);
        for last in 0..=255u8 {
            let mut line = longest[..REQUEST_MAX - 1].to_vec();
            line.push(last);
            assert_ne!(scan_request(&line), Scan::Partial, "{last}");
        }
        for digit in b'1'..=b'9' {
            let mut line = b"CONNECT ".to_vec();
            line.resize(REQUEST_MAX, digit);
            assert_ne!(scan_request(&line), Scan::Partial, "{line:?}");
        }
        assert_eq!(
            scan_request(&[b'C'; 1000]),
            Scan::Refused(ConnectError::NotConnect)
        );
    }

    #[test]
    fn the_constant_replies_are_the_refusals_lines() {
        assert_eq!(Refusal::TooMany.reply().as_bytes(), REPLY_TOO_MANY);
        assert_eq!(Refusal::Stalled.reply().as_bytes(), REPLY_STALLED);
        assert_eq!(Refusal::Foreign.reply().as_bytes(), REPLY_FOREIGN);
    }

    #[test]
    fn every_refusal_reads_back_as_its_reason_within_reply_max() {
        let mut all = vec![
            Refusal::NoListener(u32::MAX),
            Refusal::NoAnswer(u32::MAX),
            Refusal::TooMany,
            Refusal::Stalled,
            Refusal::Foreign,
            Refusal::Unreachable,
        ];
        all.extend(CASES.iter().filter_map(|c| c.refused));
        for r in all {
            let line = r.reply();
            assert!(line.len() <= REPLY_MAX, "{line}");
            assert_eq!(scan_reply(line.as_bytes()), Reply::Err(&r.to_string()));
        }
    }

    #[test]
    fn an_ok_line_names_its_port_and_anything_else_is_malformed() {
        assert_eq!(
            scan_reply(ok_reply(1 << 30).as_bytes()),
            Reply::Ok {
                port: 1 << 30,
                len: 14
            }
        );
        assert_eq!(scan_reply(b"OK 1\nAGCH"), Reply::Ok { port: 1, len: 5 });
        for partial in [&b""[..], b"O", b"OK", b"OK 12", b"E", b"ERR", b"ERR no"] {
            assert_eq!(scan_reply(partial), Reply::Partial, "{partial:?}");
        }
        let bad = [
            (&b"OK\n"[..], BadReply::Unknown),
            (b"ok 1\n", BadReply::Unknown),
            (b"HTTP/1.1 400\n", BadReply::Unknown),
            (b"OK 0\n", BadReply::BadPort),
            (b"OK 1\r\n", BadReply::BadPort),
            (b"OK +1\n", BadReply::BadPort),
            (b"OK 4294967295\n", BadReply::BadPort),
            (b"ERR \n", BadReply::BadReason),
            (b"ERR a\tb\n", BadReply::BadReason),
            (b"ERR \xc3\xa9\n", BadReply::BadReason),
        ];
        for (line, why) in bad {
            assert_eq!(scan_reply(line), Reply::Malformed(why), "{line:?}");
        }
        let mut long = b"ERR ".to_vec();
        long.resize(REPLY_MAX, b'x');
        assert_eq!(scan_reply(&long), Reply::Malformed(BadReply::TooLong));
        assert_eq!(scan_reply(&long[..REPLY_MAX - 1]), Reply::Partial);
        long.push(b'\n');
        assert_eq!(
            scan_reply(&long),
            Reply::Malformed(BadReply::TooLong),
            "a newline past REPLY_MAX does not make the line one"
        );
        long[REPLY_MAX - 1] = b'\n';
        assert!(matches!(scan_reply(&long), Reply::Err(_)), "the longest is");
    }
}
