//! A split virtqueue laid out from arbitrary bytes, as the device fuzz
//! targets (`fs::fuzzing`, `gpu::fuzzing`) feed their devices: the
//! descriptor table, the avail ring's heads and the guest memory the
//! chains point at all come from the input, so every chain shape a driver
//! can build reaches the real device code.
//!
//! Layout of `data` (what follows a target's own first byte): 16
//! descriptors of 12 bytes (address and length as u32, wrapped into 2 MiB
//! so about half land in the 1 MiB of guest memory; flags and next as
//! u16), then `chains` avail heads (u16 each), then guest memory from
//! [`DATA`] on. Missing bytes read as zeros.

use virtio_queue::{Queue, QueueT};
use vm_memory::{Bytes, GuestAddress};

use super::Memory;

/// Guest memory: 1 MiB at 0.
pub const MEM: usize = 1 << 20;
/// Entries of the queue.
pub const QSIZE: u16 = 16;
const DESC: u64 = 0;
const AVAIL: u64 = 0x1000;
const USED: u64 = 0x2000;
/// Where the input's tail lands in guest memory.
pub const DATA: u64 = 0x1_0000;

fn u16_at(d: &[u8], i: usize) -> u16 {
    u16::from_le_bytes([
        d.get(i).copied().unwrap_or(0),
        d.get(i + 1).copied().unwrap_or(0),
    ])
}

fn u32_at(d: &[u8], i: usize) -> u32 {
    u32::from(u16_at(d, i)) | u32::from(u16_at(d, i + 2)) << 16
}

/// Guest memory and a ready queue with `chains` (at most [`QSIZE`])
/// available, laid out from `data`; `None` only if memory cannot be had.
pub fn build(data: &[u8], chains: u16) -> Option<(Memory, Queue)> {
    let mem = Memory::from_ranges(&[(GuestAddress(0), MEM)]).ok()?;
    let chains = chains.min(QSIZE);
    let mut at = 0;
    for i in 0..u64::from(QSIZE) {
        let addr = u64::from(u32_at(data, at) % (2 << 20));
        let len = u32_at(data, at + 4) % (2 << 20);
        let flags = u16_at(data, at + 8);
        let next = u16_at(data, at + 10);
        at += 12;
        let mut d = [0u8; 16];
        d[..8].copy_from_slice(&addr.to_le_bytes());
        d[8..12].copy_from_slice(&len.to_le_bytes());
        d[12..14].copy_from_slice(&flags.to_le_bytes());
        d[14..].copy_from_slice(&next.to_le_bytes());
        let _ = mem.write_slice(&d, GuestAddress(DESC + 16 * i));
    }
    let queue = ring(
        &mem,
        data.get(at..).unwrap_or_default(),
        chains,
        AVAIL,
        USED,
    )?;
    at += 2 * usize::from(chains);
    if let Some(rest) = data.get(at..) {
        let n = rest.len().min(MEM - DATA as usize);
        let _ = mem.write_slice(&rest[..n], GuestAddress(DATA));
    }
    Some((mem, queue))
}

/// A second queue over the same descriptor table (its own avail ring at
/// 0x3000, used ring at 0x4000), `chains` heads from `heads` (u16 each):
/// a device with an RX and a TX queue gets both from one input, and a
/// guest that shares descriptors between them is one of its shapes.
pub fn second(mem: &Memory, heads: &[u8], chains: u16) -> Option<Queue> {
    ring(mem, heads, chains.min(QSIZE), 0x3000, 0x4000)
}

/// A ready queue over the descriptor table at [`DESC`], its avail ring at
/// `avail` holding `chains` heads read from `heads` (u16 each, wrapped into
/// the queue), its used ring at `used`.
fn ring(mem: &Memory, heads: &[u8], chains: u16, avail: u64, used: u64) -> Option<Queue> {
    for i in 0..chains {
        let head = u16_at(heads, 2 * usize::from(i)) % QSIZE;
        let _ = mem.write_obj(head, GuestAddress(avail + 4 + 2 * u64::from(i)));
    }
    let _ = mem.write_obj(chains, GuestAddress(avail + 2));
    let mut queue = Queue::new(QSIZE).ok()?;
    queue.set_size(QSIZE);
    queue.set_desc_table_address(Some(DESC as u32), Some(0));
    queue.set_avail_ring_address(Some(avail as u32), Some(0));
    queue.set_used_ring_address(Some(used as u32), Some(0));
    queue.set_ready(true);
    Some(queue)
}

/// Runs every saved input of `fuzz/regressions/<target>` through `run`;
/// how many there were (the regressions' replay in `cargo test`: no
/// toolchain but stable needed).
#[cfg(test)]
pub(crate) fn replay(target: &str, run: fn(&[u8])) -> usize {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../fuzz/regressions")
        .join(target);
    let mut n = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        run(&std::fs::read(entry.unwrap().path()).unwrap());
        n += 1;
    }
    n
}
