//! One checked walk of a request's descriptor chain, for the devices whose
//! requests are device-readable bytes followed by device-writable buffers
//! (virtio-blk, virtio-gpu).
//!
//! Owns the rules every such chain must pass before the device reads a
//! byte of it: each descriptor inside guest memory, no device-readable one
//! after a device-writable one, the `next` links whole (a loop, a bad index
//! or an unreadable table ends it early), at most so many descriptors and
//! bytes, counted as the chain is walked. Zero-length descriptors are
//! skipped. Must never read guest memory it has not checked, nor allocate
//! by a length the guest chose before the cap is checked.

use virtio_queue::DescriptorChain;
use vm_memory::{Address, Bytes, GuestAddress, GuestMemory};

use super::Memory;

/// Why a chain was refused (the device then needs a reset).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ChainError {
    /// A descriptor points outside guest memory.
    #[error("descriptor {addr:#x}+{len:#x} is outside guest memory")]
    OutsideMemory {
        /// Its guest address.
        addr: u64,
        /// Its length.
        len: u32,
    },
    /// A device-readable descriptor follows a device-writable one.
    #[error("device-readable descriptor after a device-writable one")]
    ReadableAfterWritable,
    /// More descriptors than the device allows in one chain.
    #[error("more than {0} descriptors in one chain")]
    TooManyDescriptors(usize),
    /// More bytes than the device allows in one request.
    #[error("request over {0} bytes")]
    TooMuchData(u64),
    /// The chain is empty or ends early: a bad index, a loop or an
    /// unreadable descriptor table.
    #[error("descriptor chain is empty or ends early (bad index, loop or unreadable table)")]
    Truncated,
}

/// What one device allows in one chain.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Descriptors, zero-length ones included.
    pub descriptors: usize,
    /// Device-readable bytes.
    pub readable: u64,
    /// Device-readable and device-writable bytes together.
    pub total: u64,
}

/// One contiguous guest buffer of a chain, inside guest memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Segment {
    /// Where it starts.
    pub addr: GuestAddress,
    /// Its length (not zero).
    pub len: u64,
}

/// A chain that passed [`walk`]: its head and its two parts in order.
#[derive(Debug)]
pub struct Walked {
    /// The head descriptor's index (what the used ring is told).
    pub head: u16,
    /// The device-readable buffers.
    pub readable: Vec<Segment>,
    /// The device-writable buffers.
    pub writable: Vec<Segment>,
    /// The readable buffers' bytes in all.
    pub readable_len: u64,
    /// The writable buffers' bytes in all.
    pub writable_len: u64,
}

/// Walks and checks `chain` against `limits`.
pub fn walk(
    mem: &Memory,
    chain: DescriptorChain<&Memory>,
    limits: Limits,
) -> Result<Walked, ChainError> {
    let mut out = Walked {
        head: chain.head_index(),
        readable: Vec::new(),
        writable: Vec::new(),
        readable_len: 0,
        writable_len: 0,
    };
    // An empty chain "ends early" too.
    let mut last_has_next = true;
    for (count, desc) in chain.enumerate() {
        if count >= limits.descriptors {
            return Err(ChainError::TooManyDescriptors(limits.descriptors));
        }
        last_has_next = desc.has_next();
        let (addr, len) = (desc.addr(), desc.len());
        if len == 0 {
            continue;
        }
        if !mem.check_range(addr, len as usize) {
            return Err(ChainError::OutsideMemory { addr: addr.0, len });
        }
        let seg = Segment {
            addr,
            len: u64::from(len),
        };
        if desc.is_write_only() {
            out.writable_len += seg.len;
            out.writable.push(seg);
        } else {
            if !out.writable.is_empty() {
                return Err(ChainError::ReadableAfterWritable);
            }
            out.readable_len += seg.len;
            out.readable.push(seg);
            if out.readable_len > limits.readable {
                return Err(ChainError::TooMuchData(limits.readable));
            }
        }
        if out.readable_len + out.writable_len > limits.total {
            return Err(ChainError::TooMuchData(limits.total));
        }
    }
    if last_has_next {
        return Err(ChainError::Truncated);
    }
    Ok(out)
}

impl Walked {
    /// The readable part's bytes, copied out of guest memory (its length
    /// is within [`Limits::readable`]).
    pub fn read_readable(&self, mem: &Memory) -> Result<Vec<u8>, ChainError> {
        let mut bytes = vec![0u8; usize::try_from(self.readable_len).unwrap_or(usize::MAX)];
        let mut at = 0usize;
        for seg in &self.readable {
            // `walk` checked each segment against memory; `len` fits a u32.
            let n = seg.len as usize;
            mem.read_slice(&mut bytes[at..at + n], seg.addr)
                .map_err(|_| ChainError::OutsideMemory {
                    addr: seg.addr.0,
                    len: n as u32,
                })?;
            at += n;
        }
        Ok(bytes)
    }

    /// Writes `data` across the writable part, in order, as far as it
    /// reaches; the bytes written.
    pub fn respond(&self, mem: &Memory, data: &[u8]) -> u64 {
        let mut done = 0usize;
        for seg in &self.writable {
            if done == data.len() {
                break;
            }
            let n = (seg.len as usize).min(data.len() - done);
            if mem.write_slice(&data[done..done + n], seg.addr).is_err() {
                break;
            }
            done += n;
        }
        done as u64
    }
}

/// Calls `f` on each contiguous piece of bytes `[start, start + len)` of
/// the byte stream `segs` form, with the piece's offset in that range;
/// `None` when the range reaches beyond them (or an address overflows).
pub fn for_each_piece<E>(
    segs: &[Segment],
    start: u64,
    len: u64,
    mut f: impl FnMut(GuestAddress, u64, u64) -> Result<(), E>,
) -> Option<Result<(), E>> {
    let mut skip = start;
    let mut done = 0u64;
    for seg in segs {
        if done == len {
            break;
        }
        if skip >= seg.len {
            skip -= seg.len;
            continue;
        }
        let take = (seg.len - skip).min(len - done);
        let addr = seg.addr.checked_add(skip)?;
        if let Err(e) = f(addr, done, take) {
            return Some(Err(e));
        }
        done += take;
        skip = 0;
    }
    (done == len).then_some(Ok(()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn segs(lens: &[u64]) -> Vec<Segment> {
        let mut at = 0x1000;
        lens.iter()
            .map(|&len| {
                let s = Segment {
                    addr: GuestAddress(at),
                    len,
                };
                at += 0x1000;
                s
            })
            .collect()
    }

    #[test]
    fn a_range_across_segments_is_visited_piece_by_piece_with_its_offsets() {
        let mut seen = Vec::new();
        let r = for_each_piece(&segs(&[4, 3, 5]), 2, 7, |a, at, n| {
            seen.push((a.0, at, n));
            Ok::<(), ()>(())
        });
        assert_eq!(r, Some(Ok(())));
        assert_eq!(seen, [(0x1002, 0, 2), (0x2000, 2, 3), (0x3000, 5, 2)]);
    }

    #[test]
    fn a_range_beyond_the_segments_is_none_and_an_error_of_the_callback_stops_the_walk() {
        assert_eq!(
            for_each_piece(&segs(&[4]), 2, 3, |_, _, _| Ok::<(), ()>(())),
            None
        );
        let mut calls = 0;
        let r = for_each_piece(&segs(&[1, 1, 1]), 0, 3, |_, _, _| {
            calls += 1;
            Err("stop")
        });
        assert_eq!((r, calls), (Some(Err("stop")), 1));
    }
}
