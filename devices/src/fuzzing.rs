//! The fuzz paths of the devices that are one file each: the register
//! models ([`registers`]: 8250, i8042, PL011, PL031), virtio-blk behind a
//! guest-laid ring ([`blk`]) and the virtio-mmio transport driven register
//! by register with virtio-blk behind it ([`mmio`]). The fuzz targets
//! `registers`, `virtio_blk` and `virtio_mmio` (`fuzz/`) and the replay of
//! their regressions in `cargo test` call these; each drives the real
//! device over a real `GuestMemoryMmap`.
//!
//! Register accesses are 8 bytes of input each: kind (bit 0 write, bits
//! 1–2 the access width 1/2/4/8, bit 3 console input instead), offset
//! (u16 LE), then the value's bytes (u32 LE; a console input is those 4
//! bytes cut to `width`).

use std::io::{Seek, SeekFrom, Write};
use std::sync::atomic::AtomicU32;
use std::sync::Arc;

use vm_memory::{Bytes, GuestAddress};

use crate::blk::Blk;
use crate::bus::BusDevice;
use crate::console::Console;
use crate::i8042::I8042;
use crate::irq::CountingIrq;
use crate::pl011::Pl011;
use crate::pl031::Pl031;
use crate::serial::Serial;
use crate::virtio::mmio::MmioTransport;
use crate::virtio::{fuzz_ring, Interrupt, VirtioDevice};

/// The most register accesses one input makes.
const MAX_ACCESSES: usize = 256;
/// The disk behind virtio-blk: 64 KiB (128 sectors).
const DISK_BYTES: u64 = 64 << 10;

/// One register access as the input encodes it.
struct Access {
    write: bool,
    console: bool,
    width: usize,
    offset: u64,
    value: [u8; 8],
}

fn accesses(data: &[u8]) -> impl Iterator<Item = Access> + '_ {
    data.chunks_exact(8).take(MAX_ACCESSES).map(|a| {
        let mut value = [0u8; 8];
        value[..4].copy_from_slice(&a[4..8]);
        value[4..].copy_from_slice(&a[4..8]);
        Access {
            write: a[0] & 1 == 1,
            console: a[0] & 8 != 0,
            width: 1 << ((a[0] >> 1) & 3),
            offset: u64::from(u16::from_le_bytes([a[1], a[2]])),
            value,
        }
    })
}

fn access(dev: &mut dyn BusDevice, a: &Access) {
    let mut buf = a.value;
    if a.write {
        dev.write(a.offset, &buf[..a.width]);
    } else {
        dev.read(a.offset, &mut buf[..a.width]);
    }
}

/// The 8250, i8042, PL011 or PL031 (byte 0, modulo 4) through its bus
/// interface, the UARTs' console input too; panics only on a bug.
pub fn registers(data: &[u8]) {
    let Some((&which, rest)) = data.split_first() else {
        return;
    };
    let irq = Arc::new(CountingIrq::default());
    let out = Box::new(std::io::sink());
    match which % 4 {
        0 => uart(&mut Serial::new(out, irq), rest, 8),
        1 => {
            // Ports 0x60 (data) and 0x64 (command), as the PIO bus maps them.
            poke(&mut I8042::new(Box::new(|| {})), rest, 5);
        }
        2 => uart(&mut Pl011::new(out, irq), rest, 0x1000),
        _ => poke(&mut Pl031::new(), rest, 0x1000),
    }
}

/// Every access of `data` on `dev`, offsets wrapped into its `range`.
fn poke(dev: &mut dyn BusDevice, data: &[u8], range: u64) {
    for a in accesses(data) {
        access(
            dev,
            &Access {
                offset: a.offset % range,
                ..a
            },
        );
    }
}

fn uart<D: BusDevice + Console>(dev: &mut D, data: &[u8], range: u64) {
    for a in accesses(data) {
        if a.console {
            dev.enqueue_input(&a.value[..a.width]);
        } else {
            access(
                dev,
                &Access {
                    offset: a.offset % range,
                    ..a
                },
            );
        }
    }
}

/// A disk of [`DISK_BYTES`] in memory (a memfd), its first bytes `seed`.
fn disk(seed: &[u8]) -> Option<std::fs::File> {
    // SAFETY: the name is a NUL-terminated literal; the call has no other
    // input and its result is checked.
    let fd = unsafe { libc::memfd_create(c"boxdesk-fuzz-disk".as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return None;
    }
    // SAFETY: `fd` was just created and is owned by nothing else.
    let mut file = unsafe { <std::fs::File as std::os::fd::FromRawFd>::from_raw_fd(fd) };
    file.set_len(DISK_BYTES).ok()?;
    file.write_all(&seed[..seed.len().min(512)]).ok()?;
    file.seek(SeekFrom::Start(0)).ok()?;
    Some(file)
}

/// virtio-blk behind a ring laid out from the input: byte 0 picks
/// read-only (bit 0) and how many chains are on the ring (1–16, bits
/// 1–4); the rest is [`fuzz_ring`]'s layout. Requests of every type, with
/// every chain shape, against a 64 KiB disk; panics only on a bug.
pub fn blk(data: &[u8]) {
    let Some((&first, rest)) = data.split_first() else {
        return;
    };
    let Some(file) = disk(rest) else {
        return;
    };
    let Ok(mut device) = Blk::new(file, first & 1 == 1, "fuzz") else {
        return;
    };
    let Some((mem, queue)) = fuzz_ring::build(rest, u16::from(first >> 1) % 16 + 1) else {
        return;
    };
    let status = Arc::new(AtomicU32::new(0));
    let interrupt = Interrupt::new(status.clone(), status, Arc::new(CountingIrq::default()));
    device.ack_features(device.features());
    if device.activate(mem, interrupt, vec![queue]).is_ok() {
        device.queue_notify(0);
        // A second kick with nothing new must find nothing to do.
        device.queue_notify(0);
    }
}

/// The virtio-mmio transport with virtio-blk behind it, driven register
/// by register: byte 0 is how many accesses follow (each 8 bytes, offsets
/// wrapped into the 4 KiB slot), then guest memory as [`fuzz_ring`] lays
/// it out after them, so a driver that points its queue at 0/0x1000/0x2000
/// finds the input's rings there. Feature negotiation, queue set-up,
/// status changes, resets, notifies and config space in any order;
/// panics only on a bug.
pub fn mmio(data: &[u8]) {
    let Some((&count, rest)) = data.split_first() else {
        return;
    };
    let (ops, ring) = rest.split_at((usize::from(count) * 8).min(rest.len()));
    let Some((mem, _)) = fuzz_ring::build(ring, 0) else {
        return;
    };
    let Some(file) = disk(ring) else {
        return;
    };
    let Ok(device) = Blk::new(file, false, "fuzz") else {
        return;
    };
    let irq = Arc::new(CountingIrq::default());
    let mut transport = MmioTransport::new(Box::new(device), mem.clone(), irq);
    poke(&mut transport, ops, 0x1000);
    // Whatever the device wrote stayed inside guest memory.
    let mut probe = [0u8; 1];
    let _ = mem.read_slice(&mut probe, GuestAddress(0));
    transport.stop();
}

#[cfg(test)]
mod tests {
    use crate::virtio::fuzz_ring::replay;

    /// The fuzz targets' saved inputs (`fuzz/regressions/{registers,
    /// virtio_blk,virtio_mmio}`), replayed on every `cargo test`.
    #[test]
    fn every_saved_register_blk_and_mmio_fuzz_input_runs_without_a_panic() {
        assert!(replay("registers", super::registers) > 0);
        assert!(replay("virtio_blk", super::blk) > 0);
        assert!(replay("virtio_mmio", super::mmio) > 0);
    }
}
