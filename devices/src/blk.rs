//! virtio-blk over a raw disk file (or block device): one request queue,
//! processed synchronously by whoever delivers its QueueNotify — the VMM's
//! notifier thread on KVM (an ioeventfd), the vCPU thread that wrote it on
//! Hypervisor.framework.
//!
//! Owns: the file (read with `pread`, written with `pwrite`, flushed with
//! `fdatasync`), the request queue once activated, the configuration space
//! (capacity in 512-byte sectors, `seg_max`) and the serial number.
//!
//! Must never: read or write outside guest memory (every descriptor is
//! checked against the memory map before use, and all copies go through
//! vm-memory's checked accessors via a bounce buffer); panic or loop on a
//! guest's descriptor chain; write to the file of a read-only disk; touch
//! the file beyond its last whole sector. A malformed chain (a descriptor
//! outside memory, a loop or bad index, device-readable after
//! device-writable, no header, no status byte, data of the wrong direction,
//! too many descriptors or too much data) marks the device `NEEDS_RESET`
//! through [`Interrupt::needs_reset`] and stops all processing until reset.

use std::collections::VecDeque;
use std::fs::File;
use std::io::{self, Seek, SeekFrom};
use std::os::unix::fs::FileExt;

use tracing::debug;
use virtio_bindings::virtio_blk::{
    VIRTIO_BLK_F_FLUSH, VIRTIO_BLK_F_RO, VIRTIO_BLK_F_SEG_MAX, VIRTIO_BLK_ID_BYTES,
    VIRTIO_BLK_S_IOERR, VIRTIO_BLK_S_OK, VIRTIO_BLK_S_UNSUPP, VIRTIO_BLK_T_FLUSH,
    VIRTIO_BLK_T_GET_ID, VIRTIO_BLK_T_IN, VIRTIO_BLK_T_OUT,
};
use virtio_bindings::virtio_ids::VIRTIO_ID_BLOCK;
use virtio_queue::{DescriptorChain, Queue, QueueOwnedT, QueueT};
use vm_memory::{Address, Bytes, GuestAddress};

use crate::virtio::chain::{self, ChainError, Limits, Segment, Walked as Chain};
use crate::virtio::{ActivateError, Interrupt, Memory, VirtioDevice, VIRTIO_F_VERSION_1};

/// The size of the request queue.
pub const QUEUE_SIZE: u16 = 256;
/// The sector size of the virtio-blk protocol.
pub const SECTOR_SIZE: u64 = 512;
/// `seg_max`: the most data descriptors in one request (the queue less
/// the header and the status descriptors).
pub const SEG_MAX: u32 = QUEUE_SIZE as u32 - 2;
/// The most descriptors one chain may have (direct or indirect).
pub const MAX_DESCRIPTORS: usize = QUEUE_SIZE as usize;
/// The most data bytes in one request: far above what Linux sends by
/// default (`max_sectors_kb` 1280 to 4096); a chain beyond it is malformed.
pub const MAX_DATA_BYTES: u64 = 64 << 20;
/// The length of the serial number (`GET_ID`).
pub const SERIAL_BYTES: usize = VIRTIO_BLK_ID_BYTES as usize;

/// The request header: type, reserved, sector.
const HEADER_BYTES: u64 = 16;
/// The size of the bounce buffer between the file and guest memory.
const BOUNCE_BYTES: usize = 128 << 10;
/// The length of the configuration space we expose (`capacity`, `size_max`,
/// `seg_max`, `geometry`, `blk_size`); the rest reads as zeros.
const CONFIG_BYTES: usize = 24;

/// Why a disk could not be made, or why a request chain was refused.
#[derive(Debug, thiserror::Error)]
pub enum BlkError {
    /// The file's size could not be read.
    #[error("cannot size the disk file: {0}")]
    Size(io::Error),
    /// The serial number is longer than 20 bytes.
    #[error("disk serial {0:?} is longer than 20 bytes")]
    SerialTooLong(String),
    /// The chain broke a rule every request chain keeps.
    #[error(transparent)]
    Chain(#[from] ChainError),
    /// The device-readable part is shorter than the 16-byte header.
    #[error("no 16-byte request header")]
    NoHeader,
    /// There is no device-writable byte for the status.
    #[error("no writable status byte")]
    NoStatus,
    /// Data buffers of the wrong direction for the request type.
    #[error("request type {0} has data buffers of the wrong direction")]
    WrongDirection(u32),
    /// The available ring index is beyond what the queue can hold.
    #[error("bad available ring: {0}")]
    AvailRing(String),
    /// The used ring could not be written.
    #[error("cannot update the used ring: {0}")]
    UsedRing(String),
    /// A checked guest memory access failed.
    #[error("guest memory access failed: {0}")]
    Memory(String),
}

/// What one request chain may hold.
const LIMITS: Limits = Limits {
    descriptors: MAX_DESCRIPTORS,
    readable: MAX_DATA_BYTES + HEADER_BYTES + 1,
    total: MAX_DATA_BYTES + HEADER_BYTES + 1,
};

/// [`chain::for_each_piece`], a range beyond the chain an error.
fn for_each_piece(
    segs: &[Segment],
    start: u64,
    len: u64,
    f: impl FnMut(GuestAddress, u64, u64) -> Result<(), BlkError>,
) -> Result<(), BlkError> {
    chain::for_each_piece(segs, start, len, f)
        .unwrap_or_else(|| Err(BlkError::Memory("range beyond the chain".into())))
}

/// Walks and checks one chain (see the module doc for what is refused).
fn parse_chain(mem: &Memory, chain: DescriptorChain<&Memory>) -> Result<Chain, BlkError> {
    let out = chain::walk(mem, chain, LIMITS)?;
    if out.readable_len < HEADER_BYTES {
        return Err(BlkError::NoHeader);
    }
    if out.writable_len == 0 {
        return Err(BlkError::NoStatus);
    }
    Ok(out)
}

/// The host side: the file and what is known about it.
struct Backend {
    file: File,
    read_only: bool,
    capacity_sectors: u64,
    serial: [u8; SERIAL_BYTES],
    bounce: Vec<u8>,
}

impl Backend {
    /// Does the request of `chain` and returns (status, bytes written to
    /// the guest's data buffers). `Err` only for a malformed chain.
    fn execute(&mut self, mem: &Memory, chain: &Chain) -> Result<(u8, u64), BlkError> {
        let mut header = [0u8; HEADER_BYTES as usize];
        for_each_piece(&chain.readable, 0, HEADER_BYTES, |addr, at, n| {
            mem.read_slice(&mut header[at as usize..(at + n) as usize], addr)
                .map_err(|e| BlkError::Memory(e.to_string()))
        })?;
        let [t0, t1, t2, t3, _, _, _, _, s @ ..] = header;
        let request = u32::from_le_bytes([t0, t1, t2, t3]);
        let sector = u64::from_le_bytes(s);
        let out_data = chain.readable_len - HEADER_BYTES;
        let in_data = chain.writable_len - 1;
        match request {
            VIRTIO_BLK_T_IN => {
                if out_data != 0 {
                    return Err(BlkError::WrongDirection(request));
                }
                Ok(self.read(mem, chain, sector, in_data))
            }
            VIRTIO_BLK_T_OUT => {
                if in_data != 0 {
                    return Err(BlkError::WrongDirection(request));
                }
                Ok((self.write(mem, chain, sector, out_data), 0))
            }
            VIRTIO_BLK_T_FLUSH => {
                let status = if self.read_only {
                    VIRTIO_BLK_S_OK
                } else {
                    match self.file.sync_data() {
                        Ok(()) => VIRTIO_BLK_S_OK,
                        Err(e) => {
                            debug!("virtio-blk: flush: {e}");
                            VIRTIO_BLK_S_IOERR
                        }
                    }
                };
                Ok((status as u8, 0))
            }
            VIRTIO_BLK_T_GET_ID => {
                let n = in_data.min(SERIAL_BYTES as u64);
                let serial = self.serial;
                for_each_piece(&chain.writable, 0, n, |addr, at, len| {
                    mem.write_slice(&serial[at as usize..(at + len) as usize], addr)
                        .map_err(|e| BlkError::Memory(e.to_string()))
                })?;
                Ok((VIRTIO_BLK_S_OK as u8, n))
            }
            other => {
                debug!("virtio-blk: unsupported request type {other}");
                Ok((VIRTIO_BLK_S_UNSUPP as u8, 0))
            }
        }
    }

    /// The byte offset of `len` bytes at `sector`, if inside the disk.
    fn range(&self, sector: u64, len: u64) -> Option<u64> {
        if len % SECTOR_SIZE != 0 {
            return None;
        }
        let end_sector = sector.checked_add(len / SECTOR_SIZE)?;
        (end_sector <= self.capacity_sectors).then(|| sector * SECTOR_SIZE)
    }

    fn read(&mut self, mem: &Memory, chain: &Chain, sector: u64, len: u64) -> (u8, u64) {
        let Some(offset) = self.range(sector, len) else {
            debug!("virtio-blk: read of {len} bytes at sector {sector} is outside the disk");
            return (VIRTIO_BLK_S_IOERR as u8, 0);
        };
        let bounce = &mut self.bounce;
        let file = &self.file;
        let result = for_each_piece(&chain.writable, 0, len, |addr, at, n| {
            let mut done = 0u64;
            while done < n {
                let chunk = (n - done).min(BOUNCE_BYTES as u64);
                let buf = &mut bounce[..chunk as usize];
                file.read_exact_at(buf, offset + at + done)
                    .map_err(|e| BlkError::Memory(format!("disk read: {e}")))?;
                let dst = addr
                    .checked_add(done)
                    .ok_or_else(|| BlkError::Memory("address overflow".into()))?;
                mem.write_slice(buf, dst)
                    .map_err(|e| BlkError::Memory(e.to_string()))?;
                done += chunk;
            }
            Ok(())
        });
        match result {
            Ok(()) => (VIRTIO_BLK_S_OK as u8, len),
            Err(e) => {
                debug!("virtio-blk: read at sector {sector}: {e}");
                (VIRTIO_BLK_S_IOERR as u8, 0)
            }
        }
    }

    fn write(&mut self, mem: &Memory, chain: &Chain, sector: u64, len: u64) -> u8 {
        if self.read_only {
            debug!("virtio-blk: write to a read-only disk refused");
            return VIRTIO_BLK_S_IOERR as u8;
        }
        let Some(offset) = self.range(sector, len) else {
            debug!("virtio-blk: write of {len} bytes at sector {sector} is outside the disk");
            return VIRTIO_BLK_S_IOERR as u8;
        };
        let bounce = &mut self.bounce;
        let file = &self.file;
        let result = for_each_piece(&chain.readable, HEADER_BYTES, len, |addr, at, n| {
            let mut done = 0u64;
            while done < n {
                let chunk = (n - done).min(BOUNCE_BYTES as u64);
                let buf = &mut bounce[..chunk as usize];
                let src = addr
                    .checked_add(done)
                    .ok_or_else(|| BlkError::Memory("address overflow".into()))?;
                mem.read_slice(buf, src)
                    .map_err(|e| BlkError::Memory(e.to_string()))?;
                file.write_all_at(buf, offset + at + done)
                    .map_err(|e| BlkError::Memory(format!("disk write: {e}")))?;
                done += chunk;
            }
            Ok(())
        });
        match result {
            Ok(()) => VIRTIO_BLK_S_OK as u8,
            Err(e) => {
                debug!("virtio-blk: write at sector {sector}: {e}");
                VIRTIO_BLK_S_IOERR as u8
            }
        }
    }
}

/// What the device holds between `DRIVER_OK` and reset.
struct Active {
    mem: Memory,
    interrupt: Interrupt,
    queue: Queue,
}

/// Drains the available ring. Returns whether used entries were added,
/// and the error that stopped it, if any.
fn process_queue(backend: &mut Backend, active: &mut Active) -> (bool, Result<(), BlkError>) {
    let mut used_any = false;
    loop {
        let next = match active.queue.iter(&active.mem) {
            Ok(mut requests) => requests.next(),
            Err(e) => return (used_any, Err(BlkError::AvailRing(e.to_string()))),
        };
        let Some(chain) = next else {
            return (used_any, Ok(()));
        };
        let result = parse_chain(&active.mem, chain).and_then(|chain| {
            let (status, written) = backend.execute(&active.mem, &chain)?;
            for_each_piece(&chain.writable, chain.writable_len - 1, 1, |addr, _, _| {
                active
                    .mem
                    .write_obj(status, addr)
                    .map_err(|e| BlkError::Memory(e.to_string()))
            })?;
            // `written + 1` is at most the writable length, a u32 sum.
            let used_len = u32::try_from(written + 1).unwrap_or(u32::MAX);
            active
                .queue
                .add_used(&active.mem, chain.head, used_len)
                .map_err(|e| BlkError::UsedRing(e.to_string()))
        });
        if let Err(e) = result {
            return (used_any, Err(e));
        }
        used_any = true;
    }
}

/// A virtio-blk device over one raw file.
pub struct Blk {
    backend: Backend,
    active: Option<Active>,
    /// Why the device stopped (until reset).
    broken: Option<BlkError>,
}

impl std::fmt::Debug for Blk {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Blk")
            .field("capacity_sectors", &self.backend.capacity_sectors)
            .field("read_only", &self.backend.read_only)
            .field("active", &self.active.is_some())
            .field("broken", &self.broken)
            .finish()
    }
}

impl Blk {
    /// A disk over `file` (its size, rounded down to whole sectors, is the
    /// capacity), read-only or not, answering `GET_ID` with `serial`
    /// (at most 20 bytes).
    pub fn new(mut file: File, read_only: bool, serial: &str) -> Result<Blk, BlkError> {
        if serial.len() > SERIAL_BYTES {
            return Err(BlkError::SerialTooLong(serial.to_string()));
        }
        let mut id = [0u8; SERIAL_BYTES];
        id[..serial.len()].copy_from_slice(serial.as_bytes());
        // Seeking works for block devices too, where metadata says 0.
        let size = file.seek(SeekFrom::End(0)).map_err(BlkError::Size)?;
        Ok(Blk {
            backend: Backend {
                file,
                read_only,
                capacity_sectors: size / SECTOR_SIZE,
                serial: id,
                bounce: vec![0; BOUNCE_BYTES],
            },
            active: None,
            broken: None,
        })
    }

    /// The capacity in 512-byte sectors.
    pub fn capacity_sectors(&self) -> u64 {
        self.backend.capacity_sectors
    }

    fn config(&self) -> [u8; CONFIG_BYTES] {
        let mut c = [0u8; CONFIG_BYTES];
        c[0..8].copy_from_slice(&self.backend.capacity_sectors.to_le_bytes());
        c[12..16].copy_from_slice(&SEG_MAX.to_le_bytes());
        c
    }
}

impl VirtioDevice for Blk {
    fn device_type(&self) -> u32 {
        VIRTIO_ID_BLOCK
    }

    fn queue_max_sizes(&self) -> &[u16] {
        &[QUEUE_SIZE]
    }

    fn features(&self) -> u64 {
        let mut f = VIRTIO_F_VERSION_1 | 1 << VIRTIO_BLK_F_SEG_MAX | 1 << VIRTIO_BLK_F_FLUSH;
        if self.backend.read_only {
            f |= 1 << VIRTIO_BLK_F_RO;
        }
        f
    }

    fn read_config(&self, offset: u64, data: &mut [u8]) {
        crate::virtio::read_config_bytes(&self.config(), offset, data);
    }

    fn activate(
        &mut self,
        mem: Memory,
        interrupt: Interrupt,
        queues: Vec<Queue>,
    ) -> Result<(), ActivateError> {
        let mut queues = VecDeque::from(queues);
        let (Some(queue), true) = (queues.pop_front(), queues.is_empty()) else {
            return Err(ActivateError::Queues(format!(
                "virtio-blk has one queue, got {}",
                queues.len() + 1
            )));
        };
        self.active = Some(Active {
            mem,
            interrupt,
            queue,
        });
        self.broken = None;
        Ok(())
    }

    fn queue_notify(&mut self, index: u16) {
        if index != 0 || self.broken.is_some() {
            return;
        }
        let Some(active) = self.active.as_mut() else {
            return;
        };
        let (used_any, result) = process_queue(&mut self.backend, active);
        if used_any && active.queue.needs_notification(&active.mem).unwrap_or(true) {
            active.interrupt.signal_used();
        }
        if let Err(e) = result {
            debug!("virtio-blk: device needs reset: {e}");
            active.interrupt.needs_reset();
            self.broken = Some(e);
        }
    }

    fn reset(&mut self) {
        self.active = None;
        self.broken = None;
    }
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};

    use tempfile::NamedTempFile;
    use virtio_bindings::virtio_ring::{
        VRING_DESC_F_INDIRECT, VRING_DESC_F_NEXT, VRING_DESC_F_WRITE,
    };
    use virtio_queue::desc::split::Descriptor;
    use virtio_queue::desc::RawDescriptor;
    use virtio_queue::mock::MockSplitQueue;

    use super::*;
    use crate::virtio::mmio::test_driver::{memory, Driver};
    use crate::virtio::{INT_CONFIG, INT_USED_RING, STATUS_NEEDS_RESET};

    const HDR: u64 = 0x10_0000;
    const DATA: u64 = 0x20_0000;
    const STATUS: u64 = 0x30_0000;
    const SECTORS: u64 = 64;

    /// A disk of 64 sectors, sector `i` filled with byte `i`.
    fn disk() -> NamedTempFile {
        let mut f = NamedTempFile::new().unwrap();
        for i in 0..SECTORS {
            f.write_all(&[i as u8; SECTOR_SIZE as usize]).unwrap();
        }
        f
    }

    /// A guest with a blk device over `file`, its queue of 256 at 0, up to DRIVER_OK.
    struct Guest<'a> {
        drv: Driver,
        vq: MockSplitQueue<'a, Memory>,
        mem: &'a Memory,
        next_desc: u16,
    }

    impl<'a> Guest<'a> {
        fn new(mem: &'a Memory, file: &NamedTempFile, read_only: bool) -> Self {
            let blk = Blk::new(file.reopen().unwrap(), read_only, "boxdesk-disk-0").unwrap();
            let vq = MockSplitQueue::create(mem, GuestAddress(0), QUEUE_SIZE);
            let mut drv = Driver::new(Box::new(blk), mem.clone());
            let offered = drv.device_features();
            assert!(drv.negotiate(offered));
            drv.setup_queue(0, &vq, u32::from(QUEUE_SIZE));
            drv.driver_ok();
            assert!(drv.transport.is_activated());
            Guest {
                drv,
                vq,
                mem,
                next_desc: 0,
            }
        }

        /// Puts a chain of raw descriptors (flags and next as given) on the ring.
        fn push_raw(&mut self, descs: &[Descriptor]) {
            let raw: Vec<RawDescriptor> = descs.iter().map(|&d| d.into()).collect();
            self.vq.add_desc_chains(&raw, self.next_desc).unwrap();
            self.next_desc += descs.len() as u16;
        }

        /// Puts a well-linked chain of `(addr, len, device_writable)` on the ring.
        fn push(&mut self, parts: &[(u64, u32, bool)]) {
            let descs = crate::virtio::mmio::test_driver::chain(parts, self.next_desc, u16::MAX);
            self.push_raw(&descs);
        }

        fn header(&self, request: u32, sector: u64) {
            let mut h = [0u8; 16];
            h[..4].copy_from_slice(&request.to_le_bytes());
            h[8..].copy_from_slice(&sector.to_le_bytes());
            self.mem.write_slice(&h, GuestAddress(HDR)).unwrap();
            self.mem.write_obj(0xffu8, GuestAddress(STATUS)).unwrap();
        }

        /// A request with a data buffer of `len` at DATA; returns (status, used len).
        fn request(
            &mut self,
            request: u32,
            sector: u64,
            len: u32,
            device_writes: bool,
        ) -> (u8, u32) {
            self.header(request, sector);
            let mut parts = vec![(HDR, 16, false)];
            if len > 0 {
                parts.push((DATA, len, device_writes));
            }
            parts.push((STATUS, 1, true));
            self.push(&parts);
            self.kick()
        }

        /// QueueNotify; returns the status byte and the last used entry's length.
        fn kick(&mut self) -> (u8, u32) {
            let before = self.vq.used().idx().load();
            self.drv.notify(0);
            let after = self.vq.used().idx().load();
            assert_eq!(after, before.wrapping_add(1), "one used entry per request");
            let elem = self
                .vq
                .used()
                .ring()
                .ref_at(usize::from(before))
                .unwrap()
                .load();
            let status = self.mem.read_obj::<u8>(GuestAddress(STATUS)).unwrap();
            (status, elem.len())
        }

        fn data(&self, len: usize) -> Vec<u8> {
            let mut v = vec![0u8; len];
            self.mem.read_slice(&mut v, GuestAddress(DATA)).unwrap();
            v
        }

        /// Notifies and expects the device to have given up on the chain.
        fn kick_expecting_needs_reset(&mut self) {
            let before = self.vq.used().idx().load();
            self.drv.notify(0);
            assert_eq!(
                self.vq.used().idx().load(),
                before,
                "no used entry for a bad chain"
            );
            assert_ne!(self.drv.status() & STATUS_NEEDS_RESET, 0);
            assert_eq!(self.drv.ack_interrupt() & INT_CONFIG, INT_CONFIG);
        }
    }

    #[test]
    fn a_read_returns_the_sectors_of_the_file_with_status_ok() {
        let mem = memory(4);
        let file = disk();
        let mut g = Guest::new(&mem, &file, false);
        let (status, used) = g.request(VIRTIO_BLK_T_IN, 3, 1024, true);
        assert_eq!(status, VIRTIO_BLK_S_OK as u8);
        assert_eq!(used, 1025);
        let data = g.data(1024);
        assert!(data[..512].iter().all(|&b| b == 3));
        assert!(data[512..].iter().all(|&b| b == 4));
        assert_eq!(g.drv.ack_interrupt(), INT_USED_RING);
        assert_eq!(g.drv.irq.count(), 1);
    }

    #[test]
    fn a_write_reaches_the_file_and_a_later_read_sees_it() {
        let mem = memory(4);
        let file = disk();
        let mut g = Guest::new(&mem, &file, false);
        mem.write_slice(&[0x5a; 512], GuestAddress(DATA)).unwrap();
        let (status, used) = g.request(VIRTIO_BLK_T_OUT, 10, 512, false);
        assert_eq!((status, used), (VIRTIO_BLK_S_OK as u8, 1));
        let mut on_disk = Vec::new();
        file.reopen().unwrap().read_to_end(&mut on_disk).unwrap();
        assert!(on_disk[10 * 512..11 * 512].iter().all(|&b| b == 0x5a));
        assert!(on_disk[11 * 512..12 * 512].iter().all(|&b| b == 11));
        mem.write_slice(&[0; 512], GuestAddress(DATA)).unwrap();
        assert_eq!(
            g.request(VIRTIO_BLK_T_IN, 10, 512, true).0,
            VIRTIO_BLK_S_OK as u8
        );
        assert!(g.data(512).iter().all(|&b| b == 0x5a));
    }

    #[test]
    fn a_request_framed_across_odd_descriptors_is_read_as_one_byte_stream() {
        let mem = memory(4);
        let file = disk();
        let mut g = Guest::new(&mem, &file, false);
        g.header(VIRTIO_BLK_T_IN, 1);
        // Header in two pieces; data in three pieces, the last one sharing
        // its descriptor with the status byte.
        g.push(&[
            (HDR, 5, false),
            (HDR + 5, 11, false),
            (DATA, 100, true),
            (DATA + 100, 0, true),
            (DATA + 100, 412, true),
            (DATA + 512, 513, true),
        ]);
        let before = g.vq.used().idx().load();
        g.drv.notify(0);
        assert_eq!(g.vq.used().idx().load(), before.wrapping_add(1));
        let data = g.data(1025);
        assert!(data[..512].iter().all(|&b| b == 1));
        assert!(data[512..1024].iter().all(|&b| b == 2));
        assert_eq!(data[1024], VIRTIO_BLK_S_OK as u8);
    }

    #[test]
    fn flush_completes_with_status_ok() {
        let mem = memory(4);
        let file = disk();
        let mut g = Guest::new(&mem, &file, false);
        assert_eq!(
            g.request(VIRTIO_BLK_T_FLUSH, 0, 0, false),
            (VIRTIO_BLK_S_OK as u8, 1)
        );
    }

    #[test]
    fn get_id_returns_the_serial_padded_to_20_bytes() {
        let mem = memory(4);
        let file = disk();
        let mut g = Guest::new(&mem, &file, false);
        mem.write_slice(&[0xee; 20], GuestAddress(DATA)).unwrap();
        let (status, used) = g.request(VIRTIO_BLK_T_GET_ID, 0, 20, true);
        assert_eq!((status, used), (VIRTIO_BLK_S_OK as u8, 21));
        assert_eq!(g.data(20), b"boxdesk-disk-0\0\0\0\0\0\0");
    }

    #[test]
    fn a_read_or_write_past_the_last_sector_fails_with_ioerr() {
        let mem = memory(4);
        let file = disk();
        let mut g = Guest::new(&mem, &file, false);
        assert_eq!(
            g.request(VIRTIO_BLK_T_IN, SECTORS - 1, 1024, true).0,
            VIRTIO_BLK_S_IOERR as u8
        );
        assert_eq!(
            g.request(VIRTIO_BLK_T_IN, SECTORS, 512, true).0,
            VIRTIO_BLK_S_IOERR as u8
        );
        assert_eq!(
            g.request(VIRTIO_BLK_T_IN, u64::MAX, 512, true).0,
            VIRTIO_BLK_S_IOERR as u8
        );
        assert_eq!(
            g.request(VIRTIO_BLK_T_OUT, SECTORS, 512, false).0,
            VIRTIO_BLK_S_IOERR as u8
        );
        assert_eq!(
            g.request(VIRTIO_BLK_T_IN, SECTORS - 1, 512, true).0,
            VIRTIO_BLK_S_OK as u8
        );
        // Not a whole number of sectors.
        assert_eq!(
            g.request(VIRTIO_BLK_T_IN, 0, 100, true).0,
            VIRTIO_BLK_S_IOERR as u8
        );
        assert_eq!(g.drv.status() & STATUS_NEEDS_RESET, 0);
        assert_eq!(
            file.reopen().unwrap().metadata().unwrap().len(),
            SECTORS * SECTOR_SIZE
        );
    }

    #[test]
    fn a_write_to_a_read_only_disk_fails_with_ioerr_and_leaves_the_file_alone() {
        let mem = memory(4);
        let file = disk();
        let mut g = Guest::new(&mem, &file, true);
        assert_ne!(g.drv.device_features() & (1 << VIRTIO_BLK_F_RO), 0);
        mem.write_slice(&[0x77; 512], GuestAddress(DATA)).unwrap();
        assert_eq!(
            g.request(VIRTIO_BLK_T_OUT, 0, 512, false).0,
            VIRTIO_BLK_S_IOERR as u8
        );
        let mut on_disk = Vec::new();
        file.reopen().unwrap().read_to_end(&mut on_disk).unwrap();
        assert!(on_disk[..512].iter().all(|&b| b == 0));
        assert_eq!(
            g.request(VIRTIO_BLK_T_IN, 2, 512, true).0,
            VIRTIO_BLK_S_OK as u8
        );
        assert_eq!(
            g.request(VIRTIO_BLK_T_FLUSH, 0, 0, false).0,
            VIRTIO_BLK_S_OK as u8
        );
    }

    #[test]
    fn an_unknown_request_type_is_answered_unsupp() {
        let mem = memory(4);
        let file = disk();
        let mut g = Guest::new(&mem, &file, false);
        assert_eq!(g.request(11, 0, 16, false).0, VIRTIO_BLK_S_UNSUPP as u8);
        assert_eq!(g.drv.status() & STATUS_NEEDS_RESET, 0);
    }

    #[test]
    fn the_config_space_holds_the_capacity_in_sectors_and_seg_max() {
        let file = disk();
        let blk = Blk::new(file.reopen().unwrap(), false, "").unwrap();
        assert_eq!(blk.features() & (1 << VIRTIO_BLK_F_RO), 0);
        assert_ne!(blk.features() & VIRTIO_F_VERSION_1, 0);
        let mut cap = [0u8; 8];
        blk.read_config(0, &mut cap);
        assert_eq!(u64::from_le_bytes(cap), SECTORS);
        let mut seg = [0u8; 4];
        blk.read_config(12, &mut seg);
        assert_eq!(u32::from_le_bytes(seg), SEG_MAX);
        let mut tail = [0xffu8; 8];
        blk.read_config(20, &mut tail);
        assert_eq!(tail, [0; 8]);
        blk.read_config(u64::MAX, &mut tail);
        assert_eq!(tail, [0; 8]);
    }

    #[test]
    fn a_serial_longer_than_20_bytes_is_refused() {
        let file = disk();
        let err = Blk::new(file.reopen().unwrap(), false, "a-serial-of-21-bytes!").unwrap_err();
        assert!(matches!(err, BlkError::SerialTooLong(_)));
    }

    #[test]
    fn a_descriptor_outside_guest_memory_marks_the_device_needs_reset() {
        let mem = memory(4);
        let file = disk();
        let mut g = Guest::new(&mem, &file, false);
        g.header(VIRTIO_BLK_T_IN, 0);
        g.push(&[
            (HDR, 16, false),
            (0x1000_0000, 512, true),
            (STATUS, 1, true),
        ]);
        g.kick_expecting_needs_reset();
    }

    #[test]
    fn a_descriptor_running_off_the_end_of_guest_memory_marks_the_device_needs_reset() {
        let mem = memory(4);
        let file = disk();
        let mut g = Guest::new(&mem, &file, false);
        g.header(VIRTIO_BLK_T_IN, 0);
        g.push(&[
            (HDR, 16, false),
            ((4 << 20) - 256, 512, true),
            (STATUS, 1, true),
        ]);
        g.kick_expecting_needs_reset();
    }

    #[test]
    fn a_loop_in_the_chain_marks_the_device_needs_reset() {
        let mem = memory(4);
        let file = disk();
        let mut g = Guest::new(&mem, &file, false);
        g.header(VIRTIO_BLK_T_IN, 0);
        let next = VRING_DESC_F_NEXT as u16;
        let write = VRING_DESC_F_WRITE as u16;
        g.push_raw(&[
            Descriptor::new(HDR, 16, next, 1),
            Descriptor::new(DATA, 512, next | write, 2),
            Descriptor::new(STATUS, 1, next | write, 1),
        ]);
        g.kick_expecting_needs_reset();
    }

    #[test]
    fn a_next_index_beyond_the_queue_marks_the_device_needs_reset() {
        let mem = memory(4);
        let file = disk();
        let mut g = Guest::new(&mem, &file, false);
        g.header(VIRTIO_BLK_T_IN, 0);
        g.push_raw(&[Descriptor::new(HDR, 16, VRING_DESC_F_NEXT as u16, 999)]);
        g.kick_expecting_needs_reset();
    }

    #[test]
    fn a_chain_with_more_data_than_the_limit_marks_the_device_needs_reset() {
        let mem = memory(4);
        let file = disk();
        let mut g = Guest::new(&mem, &file, false);
        g.header(VIRTIO_BLK_T_OUT, 0);
        // 65 descriptors of 1 MiB, all inside memory (the same buffer): 65 MiB.
        let mut parts = vec![(HDR, 16, false)];
        parts.extend((0..65).map(|_| (0x10_0000, 1 << 20, false)));
        parts.push((STATUS, 1, true));
        g.push(&parts);
        g.kick_expecting_needs_reset();
        let mut on_disk = Vec::new();
        file.reopen().unwrap().read_to_end(&mut on_disk).unwrap();
        assert!(
            on_disk[..512].iter().all(|&b| b == 0),
            "nothing was written"
        );
    }

    #[test]
    fn a_chain_over_4_gib_in_all_marks_the_device_needs_reset() {
        let mem = memory(4);
        let file = disk();
        let mut g = Guest::new(&mem, &file, false);
        g.header(VIRTIO_BLK_T_IN, 0);
        g.push(&[(HDR, 16, false), (DATA, u32::MAX, true), (STATUS, 1, true)]);
        g.kick_expecting_needs_reset();
    }

    #[test]
    fn a_chain_without_a_status_descriptor_marks_the_device_needs_reset() {
        let mem = memory(4);
        let file = disk();
        let mut g = Guest::new(&mem, &file, false);
        mem.write_slice(&[0x33; 512], GuestAddress(DATA)).unwrap();
        g.header(VIRTIO_BLK_T_OUT, 0);
        g.push(&[(HDR, 16, false), (DATA, 512, false)]);
        g.kick_expecting_needs_reset();
        let mut on_disk = Vec::new();
        file.reopen().unwrap().read_to_end(&mut on_disk).unwrap();
        assert!(
            on_disk[..512].iter().all(|&b| b == 0),
            "nothing was written"
        );
    }

    #[test]
    fn a_chain_without_a_whole_header_marks_the_device_needs_reset() {
        let mem = memory(4);
        let file = disk();
        let mut g = Guest::new(&mem, &file, false);
        g.push(&[(HDR, 8, false), (STATUS, 1, true)]);
        g.kick_expecting_needs_reset();
    }

    #[test]
    fn a_readable_descriptor_after_a_writable_one_marks_the_device_needs_reset() {
        let mem = memory(4);
        let file = disk();
        let mut g = Guest::new(&mem, &file, false);
        g.header(VIRTIO_BLK_T_IN, 0);
        g.push(&[
            (HDR, 16, false),
            (DATA, 512, true),
            (DATA, 512, false),
            (STATUS, 1, true),
        ]);
        g.kick_expecting_needs_reset();
    }

    #[test]
    fn a_read_whose_data_buffer_is_device_readable_marks_the_device_needs_reset() {
        let mem = memory(4);
        let file = disk();
        let mut g = Guest::new(&mem, &file, false);
        g.header(VIRTIO_BLK_T_IN, 0);
        g.push(&[(HDR, 16, false), (DATA, 512, false), (STATUS, 1, true)]);
        g.kick_expecting_needs_reset();
    }

    #[test]
    fn an_avail_index_running_ahead_of_the_queue_marks_the_device_needs_reset() {
        let mem = memory(4);
        let file = disk();
        let mut g = Guest::new(&mem, &file, false);
        g.vq.avail().idx().store(QUEUE_SIZE + 1);
        g.kick_expecting_needs_reset();
    }

    #[test]
    fn an_indirect_table_that_loops_or_lies_outside_memory_marks_the_device_needs_reset() {
        let mem = memory(4);
        let file = disk();
        let mut g = Guest::new(&mem, &file, false);
        g.push_raw(&[Descriptor::new(
            0x1000_0000,
            16 * 4,
            VRING_DESC_F_INDIRECT as u16,
            0,
        )]);
        g.kick_expecting_needs_reset();
    }

    #[test]
    fn after_a_bad_chain_the_device_ignores_notifies_until_the_driver_resets_it() {
        let mem = memory(4);
        let file = disk();
        let mut g = Guest::new(&mem, &file, false);
        g.header(VIRTIO_BLK_T_IN, 0);
        g.push(&[
            (HDR, 16, false),
            (0x1000_0000, 512, true),
            (STATUS, 1, true),
        ]);
        g.kick_expecting_needs_reset();
        g.header(VIRTIO_BLK_T_IN, 0);
        g.push(&[(HDR, 16, false), (DATA, 512, true), (STATUS, 1, true)]);
        let before = g.vq.used().idx().load();
        g.drv.notify(0);
        assert_eq!(g.vq.used().idx().load(), before);

        // The driver resets and starts over with fresh rings.
        let vq = MockSplitQueue::create(&mem, GuestAddress(0x8_0000), QUEUE_SIZE);
        let offered = g.drv.device_features();
        assert!(g.drv.negotiate(offered));
        g.drv.setup_queue(0, &vq, u32::from(QUEUE_SIZE));
        g.drv.driver_ok();
        assert_eq!(g.drv.status() & STATUS_NEEDS_RESET, 0);
        g.vq = vq;
        g.next_desc = 0;
        let (status, _) = g.request(VIRTIO_BLK_T_IN, 5, 512, true);
        assert_eq!(status, VIRTIO_BLK_S_OK as u8);
        assert!(g.data(512).iter().all(|&b| b == 5));
    }

    #[test]
    fn several_requests_in_one_notify_all_complete_with_one_interrupt() {
        let mem = memory(4);
        let file = disk();
        let mut g = Guest::new(&mem, &file, false);
        for i in 0..3u64 {
            let hdr = HDR + 0x100 * i;
            let mut h = [0u8; 16];
            h[8..].copy_from_slice(&(i + 7).to_le_bytes());
            mem.write_slice(&h, GuestAddress(hdr)).unwrap();
            g.push(&[
                (hdr, 16, false),
                (DATA + 0x1000 * i, 512, true),
                (STATUS + i, 1, true),
            ]);
        }
        g.drv.notify(0);
        assert_eq!(g.vq.used().idx().load(), 3);
        assert_eq!(g.drv.irq.count(), 1);
        for i in 0..3u64 {
            let mut v = [0u8; 512];
            mem.read_slice(&mut v, GuestAddress(DATA + 0x1000 * i))
                .unwrap();
            assert!(v.iter().all(|&b| b == (i + 7) as u8));
            assert_eq!(mem.read_obj::<u8>(GuestAddress(STATUS + i)).unwrap(), 0);
        }
    }
}
