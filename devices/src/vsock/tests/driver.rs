//! A mock guest vsock driver for tests: guest memory, three split queues
//! laid out by `MockSplitQueue`, a full RX ring of buffers that it
//! re-posts as it reads them, TX packets (header and payload in separate
//! descriptors or one, alternately), raw chains for malformed-input tests,
//! and the guest's half of a stream's credit accounting ([`GuestStream`]).
//!
//! It drives the real [`Vsock`] on its real event thread; it polls the
//! used rings (no interrupt handler) and never touches the device's state.

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use virtio_bindings::bindings::virtio_ring::{VRING_DESC_F_NEXT, VRING_DESC_F_WRITE};
use virtio_queue::desc::split::Descriptor as SplitDescriptor;
use virtio_queue::desc::RawDescriptor;
use virtio_queue::mock::MockSplitQueue;
use virtio_queue::Queue;
use vm_memory::{Address, Bytes, GuestAddress};

use super::super::packet::{Header, Op, HDR_LEN, HOST_CID, TYPE_STREAM};
use super::super::Vsock;
use crate::irq::CountingIrq;
use crate::virtio::{Interrupt, Memory, VirtioDevice, STATUS_NEEDS_RESET};

/// The guest's CID in every test.
pub const GUEST_CID: u64 = 3;
/// Queue size (the device's maximum).
pub const QSIZE: u16 = 256;
const MEM_SIZE: usize = 32 << 20;
const QUEUE_BASES: [u64; 3] = [0x0, 0x4000, 0x8000];
/// Where each queue's used ring goes, from its base.
const USED_OFFSET: u64 = 0x2000;
/// Room per buffer slot: a header and the largest payload, rounded up.
const SLOT: u64 = 0x11000;
const RX_BUFS: u64 = 0x10_0000;
const TX_BUFS: u64 = 0x130_0000;
/// TX slots, two descriptors each; the descriptors above are for raw chains.
const TX_SLOTS: u16 = 120;
/// First descriptor index `send_raw` uses.
pub const RAW_DESC: u16 = 2 * TX_SLOTS;
/// Free guest memory for raw-chain tests.
pub const SCRATCH: u64 = 0x1c0_0000;
/// How long a test waits for anything.
pub const WAIT: Duration = Duration::from_secs(10);

/// One split queue from the driver's side.
struct Ring {
    desc: GuestAddress,
    avail: GuestAddress,
    used: GuestAddress,
    avail_idx: u16,
    used_seen: u16,
}

impl Ring {
    fn write_desc(&self, mem: &Memory, i: u16, addr: u64, len: u32, flags: u16, next: u16) {
        let d = RawDescriptor::from(SplitDescriptor::new(addr, len, flags, next));
        mem.write_obj(d, self.desc.unchecked_add(16 * u64::from(i)))
            .unwrap();
    }

    fn publish(&mut self, mem: &Memory, head: u16) {
        let slot = self
            .avail
            .unchecked_add(4 + 2 * u64::from(self.avail_idx % QSIZE));
        mem.write_obj(head.to_le(), slot).unwrap();
        self.avail_idx = self.avail_idx.wrapping_add(1);
        mem.store(
            self.avail_idx.to_le(),
            self.avail.unchecked_add(2),
            Ordering::Release,
        )
        .unwrap();
    }

    fn next_used(&mut self, mem: &Memory) -> Option<(u16, u32)> {
        let idx = u16::from_le(
            mem.load(self.used.unchecked_add(2), Ordering::Acquire)
                .unwrap(),
        );
        if idx == self.used_seen {
            return None;
        }
        let elem = self
            .used
            .unchecked_add(4 + 8 * u64::from(self.used_seen % QSIZE));
        let id = u32::from_le(mem.read_obj(elem).unwrap());
        let len = u32::from_le(mem.read_obj(elem.unchecked_add(4)).unwrap());
        self.used_seen = self.used_seen.wrapping_add(1);
        Some((u16::try_from(id).unwrap(), len))
    }
}

/// A packet the device put in an RX buffer.
#[derive(Debug, Clone)]
pub struct Packet {
    /// Its header.
    pub hdr: Header,
    /// Its payload (`hdr.len` bytes).
    pub payload: Vec<u8>,
}

impl Packet {
    /// Its op.
    pub fn op(&self) -> Option<Op> {
        self.hdr.op()
    }
}

/// The device under test and the mock guest around it.
pub struct Harness {
    /// The device.
    pub dev: Vsock,
    /// Guest memory.
    pub mem: Memory,
    rx: Ring,
    tx: Ring,
    rx_buf_len: u32,
    tx_free: Vec<u16>,
    tx_split: bool,
    device_status: Arc<AtomicU32>,
    /// Interrupt edges so far.
    pub irq: Arc<CountingIrq>,
    inbox: VecDeque<Packet>,
    /// Where the device listens (`<name>.agent`).
    pub uds: PathBuf,
    _dir: tempfile::TempDir,
}

impl Harness {
    /// An active device whose RX ring holds 256 buffers of 4 KiB payload.
    pub fn new() -> Harness {
        Harness::with_rx_payload(4096)
    }

    /// An active device whose RX buffers each hold `payload` bytes after
    /// the header.
    pub fn with_rx_payload(payload: u32) -> Harness {
        let dir = tempfile::tempdir().unwrap();
        let uds = dir.path().join("vm.agent");
        let dev = Vsock::new(GUEST_CID, &uds).unwrap();
        let mut h = Harness::around(dev, uds, dir, payload);
        h.fill_rx();
        h
    }

    /// An active device with no RX buffer posted yet.
    pub fn without_rx() -> Harness {
        let dir = tempfile::tempdir().unwrap();
        let uds = dir.path().join("vm.agent");
        let dev = Vsock::new(GUEST_CID, &uds).unwrap();
        Harness::around(dev, uds, dir, 4096)
    }

    fn around(mut dev: Vsock, uds: PathBuf, dir: tempfile::TempDir, payload: u32) -> Harness {
        let mem = Memory::from_ranges(&[(GuestAddress(0), MEM_SIZE)]).unwrap();
        let mut rings = Vec::new();
        let mut queues: Vec<Queue> = Vec::new();
        for base in QUEUE_BASES {
            let mock = MockSplitQueue::create(&mem, GuestAddress(base), QSIZE);
            let mut q: Queue = mock.create_queue().unwrap();
            // The mock puts the used ring `size` bytes after the avail ring's
            // entries instead of `2 * size`: past 128 entries they overlap.
            // Move it to a page of its own.
            let used = GuestAddress(base + USED_OFFSET);
            q.try_set_used_ring_address(used).unwrap();
            queues.push(q);
            rings.push(Ring {
                desc: mock.desc_table_addr(),
                avail: mock.avail_addr(),
                used,
                avail_idx: 0,
                used_seen: 0,
            });
        }
        let status = Arc::new(AtomicU32::new(0));
        let device_status = Arc::new(AtomicU32::new(0));
        let irq = Arc::new(CountingIrq::default());
        let interrupt = Interrupt::new(status, device_status.clone(), irq.clone());
        dev.ack_features(dev.features());
        dev.activate(mem.clone(), interrupt, queues).unwrap();
        let mut rings = rings.into_iter();
        let (rx, tx) = (rings.next().unwrap(), rings.next().unwrap());
        Harness {
            dev,
            mem,
            rx,
            tx,
            rx_buf_len: HDR_LEN as u32 + payload,
            tx_free: (0..TX_SLOTS).rev().collect(),
            tx_split: false,
            device_status,
            irq,
            inbox: VecDeque::new(),
            uds,
            _dir: dir,
        }
    }

    /// `<uds>_<port>`, where guest connections to host port `port` go.
    pub fn port_path(&self, port: u32) -> PathBuf {
        let mut p = self.uds.as_os_str().to_owned();
        p.push(format!("_{port}"));
        PathBuf::from(p)
    }

    fn post_rx(&mut self, i: u16) {
        let addr = RX_BUFS + SLOT * u64::from(i);
        self.rx.write_desc(
            &self.mem,
            i,
            addr,
            self.rx_buf_len,
            VRING_DESC_F_WRITE as u16,
            0,
        );
        self.rx.publish(&self.mem, i);
    }

    /// Posts every RX buffer.
    pub fn fill_rx(&mut self) {
        for i in 0..QSIZE {
            self.post_rx(i);
        }
        self.dev.queue_notify(0);
    }

    /// Whether the device has set `DEVICE_NEEDS_RESET`.
    pub fn needs_reset(&self) -> bool {
        self.device_status.load(Ordering::SeqCst) & STATUS_NEEDS_RESET != 0
    }

    /// Collects used RX buffers into the inbox (re-posting them) and used
    /// TX slots into the free list. Returns how many packets arrived.
    pub fn poll(&mut self) -> usize {
        let mut got = 0;
        while let Some((id, len)) = self.rx.next_used(&self.mem) {
            let addr = GuestAddress(RX_BUFS + SLOT * u64::from(id));
            let mut raw = [0u8; HDR_LEN];
            self.mem.read_slice(&mut raw, addr).unwrap();
            let hdr = Header::from_bytes(&raw);
            assert_eq!(
                len as usize,
                HDR_LEN + hdr.len as usize,
                "used length matches the header"
            );
            let mut payload = vec![0u8; hdr.len as usize];
            self.mem
                .read_slice(&mut payload, addr.unchecked_add(HDR_LEN as u64))
                .unwrap();
            self.inbox.push_back(Packet { hdr, payload });
            self.post_rx(id);
            got += 1;
        }
        if got > 0 {
            self.dev.queue_notify(0);
        }
        while let Some((id, _)) = self.tx.next_used(&self.mem) {
            if id < RAW_DESC {
                self.tx_free.push(id / 2);
            }
        }
        got
    }

    /// The next packet, waiting up to `timeout`.
    pub fn recv_within(&mut self, timeout: Duration) -> Option<Packet> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(p) = self.inbox.pop_front() {
                return Some(p);
            }
            if self.poll() == 0 {
                if Instant::now() >= deadline {
                    return None;
                }
                std::thread::sleep(Duration::from_micros(20));
            }
        }
    }

    /// The next packet; fails the test after [`WAIT`].
    pub fn recv(&mut self) -> Packet {
        self.recv_within(WAIT).expect("a packet from the device")
    }

    /// The next packet with `op` for `host_port` → `guest_port`, skipping
    /// (and dropping) credit updates; fails on anything else.
    pub fn expect(&mut self, op: Op) -> Packet {
        loop {
            let p = self.recv();
            if p.op() == Some(Op::CreditUpdate) && op != Op::CreditUpdate {
                continue;
            }
            assert_eq!(p.op(), Some(op), "unexpected packet {:?}", p.hdr);
            return p;
        }
    }

    /// Whether no packet arrives within `quiet`.
    pub fn silent_for(&mut self, quiet: Duration) -> bool {
        match self.recv_within(quiet) {
            None => true,
            Some(p) => {
                self.inbox.push_front(p);
                false
            }
        }
    }

    /// Sends a packet if a TX slot is free; `false` otherwise.
    pub fn try_send(&mut self, hdr: &Header, payload: &[u8]) -> bool {
        if self.tx_free.is_empty() {
            self.poll();
        }
        let Some(slot) = self.tx_free.pop() else {
            return false;
        };
        let base = TX_BUFS + SLOT * u64::from(slot);
        let (d0, d1) = (2 * slot, 2 * slot + 1);
        self.mem
            .write_slice(&hdr.to_bytes(), GuestAddress(base))
            .unwrap();
        // Alternate the two layouts Linux uses: header and payload in one
        // buffer, or in two descriptors.
        self.tx_split = !self.tx_split;
        let len = u32::try_from(payload.len()).unwrap();
        if payload.is_empty() {
            self.tx
                .write_desc(&self.mem, d0, base, HDR_LEN as u32, 0, 0);
        } else if self.tx_split {
            let data = base + 0x100;
            self.mem.write_slice(payload, GuestAddress(data)).unwrap();
            self.tx.write_desc(
                &self.mem,
                d0,
                base,
                HDR_LEN as u32,
                VRING_DESC_F_NEXT as u16,
                d1,
            );
            self.tx.write_desc(&self.mem, d1, data, len, 0, 0);
        } else {
            self.mem
                .write_slice(payload, GuestAddress(base + HDR_LEN as u64))
                .unwrap();
            self.tx
                .write_desc(&self.mem, d0, base, HDR_LEN as u32 + len, 0, 0);
        }
        self.tx.publish(&self.mem, d0);
        self.dev.queue_notify(1);
        true
    }

    /// Sends a packet, waiting for a free TX slot.
    pub fn send(&mut self, hdr: &Header, payload: &[u8]) {
        let deadline = Instant::now() + WAIT;
        while !self.try_send(hdr, payload) {
            assert!(Instant::now() < deadline, "no tx slot came back");
            std::thread::sleep(Duration::from_micros(20));
        }
    }

    /// Publishes a raw TX chain: `descs` are (addr, len, flags, next) at
    /// indices from [`RAW_DESC`]; the head is the first.
    pub fn send_raw(&mut self, descs: &[(u64, u32, u16, u16)]) {
        for (i, &(addr, len, flags, next)) in descs.iter().enumerate() {
            let idx = RAW_DESC + u16::try_from(i).unwrap();
            self.tx.write_desc(&self.mem, idx, addr, len, flags, next);
        }
        self.tx.publish(&self.mem, RAW_DESC);
        self.dev.queue_notify(1);
    }

    /// Posts one raw RX descriptor at ring index `i` (on a harness made
    /// with [`Harness::without_rx`]).
    pub fn post_raw_rx(&mut self, i: u16, addr: u64, len: u32, flags: u16) {
        self.rx.write_desc(&self.mem, i, addr, len, flags, 0);
        self.rx.publish(&self.mem, i);
        self.dev.queue_notify(0);
    }

    /// Waits until `cond` holds.
    pub fn wait_for(&mut self, what: &str, mut cond: impl FnMut(&mut Harness) -> bool) {
        let deadline = Instant::now() + WAIT;
        while !cond(self) {
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

/// The guest's half of one stream: ports and credit in both directions.
#[derive(Debug, Clone)]
pub struct GuestStream {
    /// The guest-side port.
    pub guest_port: u32,
    /// The host-side port.
    pub host_port: u32,
    /// Receive buffer the guest advertises.
    pub buf_alloc: u32,
    /// Bytes the guest application consumed.
    pub fwd_cnt: u32,
    last_fwd_cnt_sent: u32,
    peer_buf_alloc: u32,
    peer_fwd_cnt: u32,
    /// Bytes the guest sent.
    pub tx_cnt: u32,
}

impl GuestStream {
    /// A stream between `guest_port` and `host_port`, advertising `buf_alloc`.
    pub fn new(guest_port: u32, host_port: u32, buf_alloc: u32) -> GuestStream {
        GuestStream {
            guest_port,
            host_port,
            buf_alloc,
            fwd_cnt: 0,
            last_fwd_cnt_sent: 0,
            peer_buf_alloc: 0,
            peer_fwd_cnt: 0,
            tx_cnt: 0,
        }
    }

    /// A header from this stream's guest end, carrying its credit.
    pub fn hdr(&mut self, op: Op, flags: u32, len: u32) -> Header {
        self.last_fwd_cnt_sent = self.fwd_cnt;
        Header {
            src_cid: GUEST_CID,
            dst_cid: HOST_CID,
            src_port: self.guest_port,
            dst_port: self.host_port,
            len,
            type_: TYPE_STREAM,
            op: op as u16,
            flags,
            buf_alloc: self.buf_alloc,
            fwd_cnt: self.fwd_cnt,
        }
    }

    /// Whether `p` belongs to this stream.
    pub fn owns(&self, p: &Packet) -> bool {
        p.hdr.dst_port == self.guest_port && p.hdr.src_port == self.host_port
    }

    /// Takes the host's credit from a packet it sent.
    pub fn absorb(&mut self, p: &Packet) {
        self.peer_buf_alloc = p.hdr.buf_alloc;
        self.peer_fwd_cnt = p.hdr.fwd_cnt;
    }

    /// Bytes the host can take now.
    pub fn peer_credit(&self) -> u32 {
        self.peer_buf_alloc
            .saturating_sub(self.tx_cnt.wrapping_sub(self.peer_fwd_cnt))
    }

    /// The guest application read `n` bytes; `true` when a credit update
    /// is due (half the buffer consumed since the host last heard).
    pub fn consume(&mut self, n: usize) -> bool {
        self.fwd_cnt = self.fwd_cnt.wrapping_add(u32::try_from(n).unwrap());
        self.fwd_cnt.wrapping_sub(self.last_fwd_cnt_sent) >= self.buf_alloc / 2
    }

    /// An RW header for `len` bytes (counted as sent).
    pub fn rw(&mut self, len: usize) -> Header {
        let len = u32::try_from(len).unwrap();
        self.tx_cnt = self.tx_cnt.wrapping_add(len);
        self.hdr(Op::Rw, 0, len)
    }
}

/// A position-weighted checksum of a byte stream (Fletcher-like): the
/// same for any chunking of the same bytes, different for reordered or
/// changed bytes. Cheap enough not to hide the device's speed.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Checksum {
    /// Bytes so far.
    pub len: u64,
    sum: u64,
    weighted: u64,
}

impl Checksum {
    /// Adds the next bytes of the stream.
    pub fn update(&mut self, bytes: &[u8]) {
        let (mut sum, mut weighted) = (0u64, 0u64);
        for (i, &b) in bytes.iter().enumerate() {
            sum = sum.wrapping_add(u64::from(b));
            weighted = weighted.wrapping_add(u64::from(b).wrapping_mul(i as u64 + 1));
        }
        // Shift this chunk's weights by the bytes before it.
        self.weighted = self
            .weighted
            .wrapping_add(weighted)
            .wrapping_add(sum.wrapping_mul(self.len));
        self.sum = self.sum.wrapping_add(sum);
        self.len += bytes.len() as u64;
    }
}

/// Deterministic bytes of stream `seed` starting at `offset`.
pub fn pattern(seed: u64, offset: u64, buf: &mut [u8]) {
    for (i, b) in buf.iter_mut().enumerate() {
        let x = (offset + i as u64).wrapping_add(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15));
        *b = (x.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 56) as u8;
    }
}
