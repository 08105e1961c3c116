//! The virtio-fs request path as a guest drives it, from arbitrary bytes:
//! the fuzz target `virtio_fs` (`fuzz/`) and the replay of its
//! regressions in `cargo test` both call [`run`].
//!
//! Layout of an input: byte 0 picks a read-only or writable share and how
//! many chains are on the ring (1–4); then 16 descriptors of 12 bytes
//! (address and length as u32, wrapped into 2 MiB so about half land in
//! the 1 MiB of guest memory; flags and next as u16), the avail ring's
//! heads (u16 each); the rest is guest memory from 64 KiB on, where the
//! FUSE messages are. The descriptor table, the rings and the messages
//! are all the fuzzer's: every chain shape a driver can build, through the
//! real device code, over a fresh temporary directory.

use std::sync::Arc;
use std::time::Duration;

use fuse_backend_rs::api::server::Server;
use virtio_queue::{Queue, QueueT};
use vm_memory::{Bytes, GuestAddress};

use super::guard::{Guard, Identity, Policy};
use super::{worker, Fs, FsShare};
use crate::irq::CountingIrq;
use crate::virtio::{Interrupt, Memory};

const MEM: usize = 1 << 20;
const QSIZE: u16 = 16;
const DESC: u64 = 0;
const AVAIL: u64 = 0x1000;
const USED: u64 = 0x2000;
const DATA: u64 = 0x1_0000;

fn u16_at(d: &[u8], i: usize) -> u16 {
    u16::from_le_bytes([
        d.get(i).copied().unwrap_or(0),
        d.get(i + 1).copied().unwrap_or(0),
    ])
}

fn u32_at(d: &[u8], i: usize) -> u32 {
    u32::from(u16_at(d, i)) | u32::from(u16_at(d, i + 2)) << 16
}

/// Feeds one input through the device; panics only on a bug.
pub fn run(data: &[u8]) {
    let Some(&first) = data.first() else {
        return;
    };
    let Ok(dir) = tempfile::tempdir() else {
        return;
    };
    let _ = std::fs::write(dir.path().join("file"), b"contents\n");
    let _ = std::fs::create_dir(dir.path().join("sub"));
    let share = FsShare {
        tag: "fz".into(),
        root: dir.path().to_path_buf(),
        policy: Policy {
            writable: first & 1 == 1,
            identity: Identity::Invoker,
        },
        cache: Duration::ZERO,
    };
    let Ok(fs) = Fs::new(share) else {
        return;
    };
    let Ok(mem) = Memory::from_ranges(&[(GuestAddress(0), MEM)]) else {
        return;
    };
    let chains = u16::from(first >> 1) % 4 + 1;
    let mut at = 1;
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
    for i in 0..chains {
        let head = u16_at(data, at) % QSIZE;
        at += 2;
        let _ = mem.write_obj(head, GuestAddress(AVAIL + 4 + 2 * u64::from(i)));
    }
    let _ = mem.write_obj(chains, GuestAddress(AVAIL + 2));
    if let Some(rest) = data.get(at..) {
        let n = rest.len().min(MEM - DATA as usize);
        let _ = mem.write_slice(&rest[..n], GuestAddress(DATA));
    }
    let Ok(mut queue) = Queue::new(QSIZE) else {
        return;
    };
    queue.set_size(QSIZE);
    queue.set_desc_table_address(Some(DESC as u32), Some(0));
    queue.set_avail_ring_address(Some(AVAIL as u32), Some(0));
    queue.set_used_ring_address(Some(USED as u32), Some(0));
    queue.set_ready(true);
    let status = Arc::new(std::sync::atomic::AtomicU32::new(0));
    let interrupt = Interrupt::new(status.clone(), status, Arc::new(CountingIrq::default()));
    let server: Arc<Server<Guard<_>>> = fs.server.clone();
    worker::serve_here(mem, interrupt, queue, server);
}

#[cfg(test)]
mod tests {
    /// The fuzz target's saved inputs (`fuzz/regressions/virtio_fs`),
    /// replayed on every `cargo test`: no toolchain but stable needed.
    #[test]
    fn every_saved_fuzz_input_runs_through_the_device_without_a_panic() {
        let dir =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/regressions/virtio_fs");
        let mut n = 0;
        for entry in std::fs::read_dir(&dir).unwrap() {
            let data = std::fs::read(entry.unwrap().path()).unwrap();
            super::run(&data);
            n += 1;
        }
        assert!(n > 0, "no inputs in {}", dir.display());
    }
}
