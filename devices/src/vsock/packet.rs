//! Vsock packets as they sit in guest memory: the 44-byte
//! `virtio_vsock_hdr` ([`Header`]), reading a TX descriptor chain into a
//! header and a payload ([`read_tx`]), and writing a header and a payload
//! into an RX chain ([`RxBuffer`]).
//!
//! This module owns every guest-memory access of the vsock device and
//! validates each descriptor before it touches memory. It never decides
//! what a packet means (that is the muxer's job) and never panics on what
//! a guest wrote: a malformed chain is a [`ChainError`], a bad header is
//! [`TxRead::Rejected`] or [`TxRead::Unreadable`].

use virtio_queue::desc::split::Descriptor;
use virtio_queue::DescriptorChain;
use vm_memory::{Bytes, GuestAddress, GuestMemory};

use crate::virtio::Memory;

/// Size of `virtio_vsock_hdr`.
pub const HDR_LEN: usize = 44;
/// The largest payload one packet may carry (what Linux sends at most).
pub const MAX_PAYLOAD: usize = 64 * 1024;
/// The host's CID.
pub const HOST_CID: u64 = 2;
/// `VIRTIO_VSOCK_TYPE_STREAM`, the only socket type this device speaks.
pub const TYPE_STREAM: u16 = 1;
/// `VIRTIO_VSOCK_SHUTDOWN_RCV`: the sender will receive no more data.
pub const SHUTDOWN_RCV: u32 = 1;
/// `VIRTIO_VSOCK_SHUTDOWN_SEND`: the sender will send no more data.
pub const SHUTDOWN_SEND: u32 = 2;
/// Both shutdown flags.
pub const SHUTDOWN_BOTH: u32 = SHUTDOWN_RCV | SHUTDOWN_SEND;

/// `virtio_vsock_hdr.op`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u16)]
pub enum Op {
    /// Connection request.
    Request = 1,
    /// Connection accepted.
    Response = 2,
    /// Connection reset (refused or torn down).
    Rst = 3,
    /// Half- or full close, with [`SHUTDOWN_RCV`]/[`SHUTDOWN_SEND`] flags.
    Shutdown = 4,
    /// Stream data.
    Rw = 5,
    /// Unsolicited credit information.
    CreditUpdate = 6,
    /// Asks the peer for a [`Op::CreditUpdate`].
    CreditRequest = 7,
}

impl Op {
    /// The op a raw `op` field names, if any.
    pub fn from_raw(raw: u16) -> Option<Op> {
        Some(match raw {
            1 => Op::Request,
            2 => Op::Response,
            3 => Op::Rst,
            4 => Op::Shutdown,
            5 => Op::Rw,
            6 => Op::CreditUpdate,
            7 => Op::CreditRequest,
            _ => return None,
        })
    }
}

/// A `virtio_vsock_hdr`, fields in host order. `op` and `type_` stay raw
/// so that a header with an unknown value can still be answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Header {
    /// Source CID.
    pub src_cid: u64,
    /// Destination CID.
    pub dst_cid: u64,
    /// Source port.
    pub src_port: u32,
    /// Destination port.
    pub dst_port: u32,
    /// Payload length.
    pub len: u32,
    /// Socket type (`TYPE_STREAM`).
    pub type_: u16,
    /// Operation ([`Op`] as a number).
    pub op: u16,
    /// Op-specific flags (shutdown flags).
    pub flags: u32,
    /// Receive buffer space the sender has allocated for this connection.
    pub buf_alloc: u32,
    /// Bytes the sender has consumed from its receive buffer so far.
    pub fwd_cnt: u32,
}

fn le_u64(b: &[u8; HDR_LEN], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}

fn le_u32(b: &[u8; HDR_LEN], at: usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(a)
}

fn le_u16(b: &[u8; HDR_LEN], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

impl Header {
    /// Decodes the little-endian wire form.
    pub fn from_bytes(b: &[u8; HDR_LEN]) -> Header {
        Header {
            src_cid: le_u64(b, 0),
            dst_cid: le_u64(b, 8),
            src_port: le_u32(b, 16),
            dst_port: le_u32(b, 20),
            len: le_u32(b, 24),
            type_: le_u16(b, 28),
            op: le_u16(b, 30),
            flags: le_u32(b, 32),
            buf_alloc: le_u32(b, 36),
            fwd_cnt: le_u32(b, 40),
        }
    }

    /// Encodes the little-endian wire form.
    pub fn to_bytes(self) -> [u8; HDR_LEN] {
        let mut b = [0u8; HDR_LEN];
        b[0..8].copy_from_slice(&self.src_cid.to_le_bytes());
        b[8..16].copy_from_slice(&self.dst_cid.to_le_bytes());
        b[16..20].copy_from_slice(&self.src_port.to_le_bytes());
        b[20..24].copy_from_slice(&self.dst_port.to_le_bytes());
        b[24..28].copy_from_slice(&self.len.to_le_bytes());
        b[28..30].copy_from_slice(&self.type_.to_le_bytes());
        b[30..32].copy_from_slice(&self.op.to_le_bytes());
        b[32..36].copy_from_slice(&self.flags.to_le_bytes());
        b[36..40].copy_from_slice(&self.buf_alloc.to_le_bytes());
        b[40..44].copy_from_slice(&self.fwd_cnt.to_le_bytes());
        b
    }

    /// The op, if it is one this device knows.
    pub fn op(&self) -> Option<Op> {
        Op::from_raw(self.op)
    }
}

/// A descriptor chain the device cannot use: the driver is broken and the
/// device must be reset.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ChainError {
    /// The chain is empty, loops, names a descriptor outside its table or
    /// nests indirect tables.
    #[error("descriptor chain is empty, loops or leaves its table")]
    Broken,
    /// A descriptor points outside guest memory.
    #[error("descriptor {addr:#x}+{len:#x} is outside guest memory")]
    OutsideMemory {
        /// Its address.
        addr: u64,
        /// Its length.
        len: u32,
    },
    /// A TX chain has a device-writable descriptor, or an RX chain a
    /// device-readable one.
    #[error("descriptor has the wrong direction")]
    WrongDirection,
    /// An RX chain cannot hold even a header.
    #[error("rx buffer of {0} bytes cannot hold a header")]
    TooSmall(usize),
    /// Guest memory refused an access the checks had allowed.
    #[error("guest memory access failed")]
    Memory,
}

/// Walks a chain and returns its descriptors, all of one direction, all
/// inside guest memory.
fn segments(
    mem: &Memory,
    chain: DescriptorChain<&Memory>,
    writable: bool,
) -> Result<Vec<(GuestAddress, usize)>, ChainError> {
    let mut segs = Vec::new();
    let mut last: Option<Descriptor> = None;
    for desc in chain {
        if desc.is_write_only() != writable {
            return Err(ChainError::WrongDirection);
        }
        let len = desc.len() as usize;
        if len > 0 && !GuestMemory::check_range(mem, desc.addr(), len) {
            return Err(ChainError::OutsideMemory {
                addr: desc.addr().0,
                len: desc.len(),
            });
        }
        segs.push((desc.addr(), len));
        last = Some(desc);
    }
    // The iterator stops early, without an error, on a loop (its budget
    // runs out), a `next` outside the table or a bad indirect table: the
    // last descriptor it gave then still says `NEXT`.
    match last {
        Some(d) if !d.has_next() => Ok(segs),
        _ => Err(ChainError::Broken),
    }
}

/// Walks `len` bytes starting `offset` bytes into the segments, calling
/// `copy(guest address, range of the caller's buffer)` per piece; an
/// address overflow or segments shorter than asked is a memory error.
fn walk_segs(
    segs: &[(GuestAddress, usize)],
    mut offset: usize,
    len: usize,
    mut copy: impl FnMut(GuestAddress, std::ops::Range<usize>) -> Result<(), ChainError>,
) -> Result<(), ChainError> {
    let mut done = 0;
    for &(addr, seg_len) in segs {
        if done == len {
            break;
        }
        if offset >= seg_len {
            offset -= seg_len;
            continue;
        }
        let n = (seg_len - offset).min(len - done);
        let at = addr
            .0
            .checked_add(offset as u64)
            .ok_or(ChainError::Memory)?;
        copy(GuestAddress(at), done..done + n)?;
        done += n;
        offset = 0;
    }
    if done == len {
        Ok(())
    } else {
        Err(ChainError::Memory)
    }
}

/// Copies `buf.len()` bytes starting `offset` bytes into the segments.
fn gather(
    mem: &Memory,
    segs: &[(GuestAddress, usize)],
    offset: usize,
    buf: &mut [u8],
) -> Result<(), ChainError> {
    let len = buf.len();
    walk_segs(segs, offset, len, |at, r| {
        mem.read_slice(&mut buf[r], at)
            .map_err(|_| ChainError::Memory)
    })
}

/// What a TX chain held.
#[derive(Debug, PartialEq, Eq)]
pub enum TxRead {
    /// A header and its `len` payload bytes (now in the payload buffer).
    Packet(Header),
    /// A header that names a connection but cannot be accepted (`len`
    /// over [`MAX_PAYLOAD`] or past the chain's end): answer with RST.
    Rejected(Header),
    /// Fewer bytes than a header: drop it, nobody can be answered.
    Unreadable,
}

/// Reads a TX chain (device-readable descriptors only) into a header and
/// `payload` (cleared first; at most [`MAX_PAYLOAD`] bytes).
pub fn read_tx(
    mem: &Memory,
    chain: DescriptorChain<&Memory>,
    payload: &mut Vec<u8>,
) -> Result<TxRead, ChainError> {
    payload.clear();
    let segs = segments(mem, chain, false)?;
    let total: usize = segs.iter().map(|s| s.1).sum();
    if total < HDR_LEN {
        return Ok(TxRead::Unreadable);
    }
    let mut raw = [0u8; HDR_LEN];
    gather(mem, &segs, 0, &mut raw)?;
    let hdr = Header::from_bytes(&raw);
    let len = hdr.len as usize;
    if len > MAX_PAYLOAD || len > total - HDR_LEN {
        return Ok(TxRead::Rejected(hdr));
    }
    payload.resize(len, 0);
    gather(mem, &segs, HDR_LEN, payload)?;
    Ok(TxRead::Packet(hdr))
}

/// A guest RX buffer (device-writable descriptors), checked and ready to
/// take one packet.
#[derive(Debug)]
pub struct RxBuffer {
    segs: Vec<(GuestAddress, usize)>,
    capacity: usize,
}

impl RxBuffer {
    /// Checks an RX chain: all writable, inside memory, room for a header.
    pub fn from_chain(
        mem: &Memory,
        chain: DescriptorChain<&Memory>,
    ) -> Result<RxBuffer, ChainError> {
        let segs = segments(mem, chain, true)?;
        let capacity = segs.iter().map(|s| s.1).sum();
        if capacity < HDR_LEN {
            return Err(ChainError::TooSmall(capacity));
        }
        Ok(RxBuffer { segs, capacity })
    }

    /// The payload bytes it can hold (at most [`MAX_PAYLOAD`]).
    pub fn payload_capacity(&self) -> usize {
        (self.capacity - HDR_LEN).min(MAX_PAYLOAD)
    }

    /// Writes `hdr` (whose `len` must be `payload.len()`) and `payload`;
    /// returns the bytes written, for the used ring.
    pub fn write(&self, mem: &Memory, hdr: &Header, payload: &[u8]) -> Result<u32, ChainError> {
        if payload.len() > self.payload_capacity() {
            return Err(ChainError::TooSmall(self.capacity));
        }
        self.scatter(mem, 0, &hdr.to_bytes())?;
        self.scatter(mem, HDR_LEN, payload)?;
        u32::try_from(HDR_LEN + payload.len()).map_err(|_| ChainError::Memory)
    }

    fn scatter(&self, mem: &Memory, offset: usize, buf: &[u8]) -> Result<(), ChainError> {
        walk_segs(&self.segs, offset, buf.len(), |at, r| {
            mem.write_slice(&buf[r], at).map_err(|_| ChainError::Memory)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_header_survives_encoding_and_decoding_field_by_field() {
        let h = Header {
            src_cid: 3,
            dst_cid: 2,
            src_port: 0x1234_5678,
            dst_port: 1024,
            len: 77,
            type_: TYPE_STREAM,
            op: Op::Shutdown as u16,
            flags: SHUTDOWN_BOTH,
            buf_alloc: 262_144,
            fwd_cnt: 0xdead_beef,
        };
        let b = h.to_bytes();
        assert_eq!(&b[0..8], &3u64.to_le_bytes());
        assert_eq!(&b[30..32], &4u16.to_le_bytes());
        assert_eq!(Header::from_bytes(&b), h);
        assert_eq!(h.op(), Some(Op::Shutdown));
    }

    #[test]
    fn unknown_op_numbers_are_not_ops() {
        assert_eq!(Op::from_raw(0), None);
        assert_eq!(Op::from_raw(8), None);
        assert_eq!(Op::from_raw(7), Some(Op::CreditRequest));
    }
}
