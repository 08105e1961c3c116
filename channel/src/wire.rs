//! The encodings inside a payload: little-endian integers, `bytes`
//! (`u32` length + raw bytes) and lists (`u32` count + items).
//!
//! [`Cursor`] reads them from a payload that is already in memory and never
//! allocates more than the payload can hold: a list count is checked
//! against the bytes left before any `Vec` is sized from it.

use crate::frame::FrameError;

/// Reads fields from one frame's payload.
#[derive(Debug)]
pub struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    /// A cursor at the start of `buf`.
    pub fn new(buf: &'a [u8]) -> Self {
        Self { buf, pos: 0 }
    }

    fn take(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], FrameError> {
        let rest = &self.buf[self.pos..];
        if rest.len() < n {
            return Err(FrameError::Truncated(what));
        }
        self.pos += n;
        Ok(&rest[..n])
    }

    fn array<const N: usize>(&mut self, what: &'static str) -> Result<[u8; N], FrameError> {
        let mut out = [0; N];
        out.copy_from_slice(self.take(N, what)?);
        Ok(out)
    }

    /// A little-endian `u16`.
    pub fn u16(&mut self, what: &'static str) -> Result<u16, FrameError> {
        self.array(what).map(u16::from_le_bytes)
    }

    /// A little-endian `u32`.
    pub fn u32(&mut self, what: &'static str) -> Result<u32, FrameError> {
        self.array(what).map(u32::from_le_bytes)
    }

    /// A little-endian `i32`.
    pub fn i32(&mut self, what: &'static str) -> Result<i32, FrameError> {
        self.array(what).map(i32::from_le_bytes)
    }

    /// A little-endian `u64`.
    pub fn u64(&mut self, what: &'static str) -> Result<u64, FrameError> {
        self.array(what).map(u64::from_le_bytes)
    }

    /// A `bytes` field: `u32` length, then that many bytes.
    pub fn bytes(&mut self, what: &'static str) -> Result<&'a [u8], FrameError> {
        let len = self.u32(what)? as usize;
        self.take(len, what)
    }

    /// A list count, checked against what is left: every item is at least
    /// `min_item` bytes, so a count the payload cannot hold is refused here
    /// rather than sizing an allocation.
    pub fn count(&mut self, min_item: usize, what: &'static str) -> Result<usize, FrameError> {
        let n = self.u32(what)? as usize;
        if n.saturating_mul(min_item) > self.remaining() {
            return Err(FrameError::Truncated(what));
        }
        Ok(n)
    }

    /// Bytes not read yet.
    pub fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    /// Everything not read yet (a frame's trailing data).
    pub fn rest(&mut self) -> &'a [u8] {
        let rest = &self.buf[self.pos..];
        self.pos = self.buf.len();
        rest
    }

    /// Ends the payload: bytes left over are an error, so a field added or
    /// dropped by a peer is noticed instead of misread.
    pub fn finish(self, tag: u8) -> Result<(), FrameError> {
        match self.remaining() {
            0 => Ok(()),
            extra => Err(FrameError::TrailingBytes { tag, extra }),
        }
    }
}

/// Appends a little-endian `u32`.
pub fn put_u32(out: &mut Vec<u8>, v: u32) {
    out.extend_from_slice(&v.to_le_bytes());
}

/// Appends a `bytes` field. The caller has checked that the whole payload
/// fits in [`crate::MAX_PAYLOAD`], so the length fits in a `u32`.
pub fn put_bytes(out: &mut Vec<u8>, b: &[u8]) {
    put_u32(out, b.len() as u32);
    out.extend_from_slice(b);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_list_count_larger_than_the_payload_is_refused_before_allocating() {
        let mut c = Cursor::new(&[0xff, 0xff, 0xff, 0xff, 0, 0]);
        assert!(matches!(
            c.count(4, "args"),
            Err(FrameError::Truncated("args"))
        ));
    }

    #[test]
    fn a_bytes_length_past_the_end_is_truncated_not_a_panic() {
        let mut c = Cursor::new(&[9, 0, 0, 0, b'a']);
        assert!(matches!(
            c.bytes("path"),
            Err(FrameError::Truncated("path"))
        ));
    }
}
