//! Bad input yields typed errors, never a panic or a large allocation.

use std::io::{self, Read};

use boxdesk_channel::{handshake, ChannelError, FrameError, FrameReader};

fn read_one(bytes: &[u8]) -> Result<Option<boxdesk_channel::Frame>, ChannelError> {
    FrameReader::new(bytes).read_frame()
}

/// A reader that yields `head` and then claims it has 4 GiB more; it
/// panics if anyone reads past `head`.
struct Bottomless<'a> {
    head: &'a [u8],
}

impl Read for Bottomless<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        assert!(
            !self.head.is_empty(),
            "read past the header: the payload was awaited"
        );
        let n = buf.len().min(self.head.len());
        buf[..n].copy_from_slice(&self.head[..n]);
        self.head = &self.head[n..];
        Ok(n)
    }
}

#[test]
fn a_length_over_max_payload_is_refused_before_allocating() {
    // Tag Stdout, length 0xFFFF_FFFF: a reader that had to supply 4 GiB is
    // never read past the header.
    let mut r = FrameReader::new(Bottomless {
        head: &[2, 0xff, 0xff, 0xff, 0xff],
    });
    let err = r.read_frame().unwrap_err();
    assert!(
        matches!(
            err,
            ChannelError::Frame(FrameError::TooLarge {
                tag: 2,
                len: 0xffff_ffff
            })
        ),
        "{err:?}"
    );
    let mut r = FrameReader::new(Bottomless {
        head: &[2, 1, 0, 0x10, 0],
    });
    assert!(matches!(
        r.read_frame(),
        Err(ChannelError::Frame(FrameError::TooLarge {
            len: 1_048_577,
            ..
        }))
    ));
}

#[test]
fn unknown_tags_0_and_200_are_typed_errors() {
    for tag in [0u8, 15, 200, 255] {
        let err = read_one(&[tag, 0, 0, 0, 0]).unwrap_err();
        assert!(
            matches!(err, ChannelError::Frame(FrameError::UnknownTag(t)) if t == tag),
            "{err:?}"
        );
    }
}

#[test]
fn an_unknown_tag_is_refused_before_its_payload_is_awaited() {
    let mut r = FrameReader::new(Bottomless {
        head: &[200, 0, 0, 1, 0],
    });
    assert!(matches!(
        r.read_frame(),
        Err(ChannelError::Frame(FrameError::UnknownTag(200)))
    ));
}

#[test]
fn truncated_headers_and_payloads_are_unexpected_eof() {
    for wire in [
        &[4u8][..],
        &[4, 4, 0],
        &[4, 4, 0, 0, 0, 1, 2],
        &[2, 0, 0, 2, 0, 1],
    ] {
        let err = read_one(wire).unwrap_err();
        assert!(
            matches!(err, ChannelError::UnexpectedEof(_)),
            "{wire:?}: {err:?}"
        );
    }
}

#[test]
fn fields_that_run_past_the_payload_are_truncated_errors() {
    // Exec whose command claims 100 bytes inside a 4-byte payload.
    let err = read_one(&[1, 4, 0, 0, 0, 100, 0, 0, 0]).unwrap_err();
    assert!(
        matches!(err, ChannelError::Frame(FrameError::Truncated("command"))),
        "{err:?}"
    );
    // Exit with 3 bytes.
    let err = read_one(&[4, 3, 0, 0, 0, 1, 2, 3]).unwrap_err();
    assert!(
        matches!(err, ChannelError::Frame(FrameError::Truncated(_))),
        "{err:?}"
    );
    // Exec with an arg count of 2^32-1.
    let err = read_one(&[1, 8, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff]).unwrap_err();
    assert!(
        matches!(err, ChannelError::Frame(FrameError::Truncated("args"))),
        "{err:?}"
    );
}

#[test]
fn bytes_after_the_last_field_are_refused() {
    let err = read_one(&[4, 5, 0, 0, 0, 1, 0, 0, 0, 9]).unwrap_err();
    assert!(
        matches!(
            err,
            ChannelError::Frame(FrameError::TrailingBytes { tag: 4, extra: 1 })
        ),
        "{err:?}"
    );
    let err = read_one(&[8, 1, 0, 0, 0, 0]).unwrap_err();
    assert!(
        matches!(
            err,
            ChannelError::Frame(FrameError::TrailingBytes { tag: 8, extra: 1 })
        ),
        "{err:?}"
    );
}

/// A stream that plays back a peer's bytes and records what we wrote.
struct Peer {
    input: io::Cursor<Vec<u8>>,
    written: Vec<u8>,
}

impl Peer {
    fn new(input: &[u8]) -> Self {
        Self {
            input: io::Cursor::new(input.to_vec()),
            written: Vec::new(),
        }
    }
}

impl Read for Peer {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.input.read(buf)
    }
}

impl io::Write for Peer {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.written.extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[test]
fn the_handshake_writes_our_header_before_reading_theirs() {
    let mut p = Peer::new(b"AGCH\x03\x00");
    handshake(&mut p).unwrap();
    assert_eq!(p.written, b"AGCH\x03\x00");
}

#[test]
fn wrong_magic_is_refused() {
    let err = handshake(&mut Peer::new(b"HTTP/1")).unwrap_err();
    assert!(
        matches!(err, ChannelError::BadMagic(m) if &m == b"HTTP"),
        "{err:?}"
    );
}

#[test]
fn versions_2_and_4_are_refused() {
    for v in [2u8, 4] {
        let err = handshake(&mut Peer::new(&[b'A', b'G', b'C', b'H', v, 0])).unwrap_err();
        assert!(
            matches!(err, ChannelError::UnsupportedVersion(got) if got == u16::from(v)),
            "{err:?}"
        );
        assert!(err.is_protocol_error());
    }
}

#[test]
fn a_truncated_header_is_unexpected_eof() {
    let err = handshake(&mut Peer::new(b"AGC")).unwrap_err();
    assert!(
        matches!(err, ChannelError::UnexpectedEof("the session header")),
        "{err:?}"
    );
}
