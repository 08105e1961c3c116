use boxdesk_platform::screen::{EV_ABS, EV_KEY, EV_REL};
use virtio_bindings::virtio_input::{
    virtio_input_config_select_VIRTIO_INPUT_CFG_ABS_INFO as CFG_ABS_INFO,
    virtio_input_config_select_VIRTIO_INPUT_CFG_EV_BITS as CFG_EV_BITS,
    virtio_input_config_select_VIRTIO_INPUT_CFG_ID_DEVIDS as CFG_ID_DEVIDS,
    virtio_input_config_select_VIRTIO_INPUT_CFG_ID_NAME as CFG_ID_NAME,
    virtio_input_config_select_VIRTIO_INPUT_CFG_ID_SERIAL as CFG_ID_SERIAL,
    virtio_input_config_select_VIRTIO_INPUT_CFG_PROP_BITS as CFG_PROP_BITS,
};
use virtio_bindings::virtio_mmio::VIRTIO_MMIO_STATUS;
use virtio_bindings::virtio_ring::{VRING_DESC_F_NEXT, VRING_DESC_F_WRITE};
use virtio_queue::desc::split::Descriptor;
use virtio_queue::desc::RawDescriptor;
use virtio_queue::mock::MockSplitQueue;

use super::*;
use crate::bus::BusDevice;
use crate::virtio::mmio::test_driver::{memory, Driver};
use crate::virtio::mmio::CONFIG_OFFSET;
use crate::virtio::{INT_CONFIG, INT_USED_RING, STATUS_NEEDS_RESET};

const KEY_A: u16 = 30;
const KEY_B: u16 = 48;
/// The event queue's rings.
const EVQ: u64 = 0x0;
/// The status queue's rings.
const STQ: u64 = 0x1_0000;
/// Event buffers: descriptor `i`'s 8 bytes are at `BUF + 8 * i`.
const BUF: u64 = 0x10_0000;
/// Status buffers, likewise.
const STATUS_BUF: u64 = 0x20_0000;
/// Far outside the 4 MiB of test memory.
const OUTSIDE: u64 = 0x1000_0000;

fn ev(kind: u16, code: u16, value: i32) -> Event {
    Event { kind, code, value }
}

const SYN: Event = Event::SYN_REPORT;

/// Reads the config space as a driver does: select, subsel, then size and
/// the union.
fn select(dev: &mut Input, select: u32, subsel: u16) -> (u8, Vec<u8>) {
    dev.write_config(0, &[select as u8]);
    dev.write_config(1, &[subsel as u8]);
    let mut cfg = [0u8; CONFIG_BYTES];
    dev.read_config(0, &mut cfg);
    assert_eq!((cfg[0], cfg[1]), (select as u8, subsel as u8));
    (cfg[2], cfg[8..].to_vec())
}

fn bit(bitmap: &[u8], code: u16) -> bool {
    bitmap[usize::from(code / 8)] & (1 << (code % 8)) != 0
}

/// One descriptor ring of a guest's queue, and where it posts next.
struct Ring<'a> {
    vq: MockSplitQueue<'a, Memory>,
    next_desc: u16,
    avail: u16,
    seen: u16,
}

impl<'a> Ring<'a> {
    fn new(mem: &'a Memory, at: u64) -> Self {
        Ring {
            // The mock places the used ring `len` bytes after the avail
            // ring's entries (not `2 * len`), so the two overlap once a
            // ring of `len` wraps; laid out for 4x the size, a queue of
            // QUEUE_SIZE has room.
            vq: MockSplitQueue::create(mem, GuestAddress(at), 4 * QUEUE_SIZE),
            next_desc: 0,
            avail: 0,
            seen: 0,
        }
    }

    /// Puts one chain on the ring: `descs` are stored from the next free
    /// slot on (their `next` fields as given), the head made available.
    fn post_raw(&mut self, descs: &[Descriptor]) -> u16 {
        let head = self.next_desc % QUEUE_SIZE;
        for (i, d) in descs.iter().enumerate() {
            let slot = (self.next_desc + i as u16) % QUEUE_SIZE;
            self.vq
                .desc_table()
                .store(slot, RawDescriptor::from(*d))
                .unwrap();
        }
        self.next_desc = self.next_desc.wrapping_add(descs.len() as u16);
        let avail = self.vq.avail();
        avail
            .ring()
            .ref_at(usize::from(self.avail % QUEUE_SIZE))
            .unwrap()
            .store(head);
        self.avail = self.avail.wrapping_add(1);
        avail.idx().store(self.avail);
        head
    }

    /// A well-linked chain of `(addr, len, device_writable)`.
    fn post(&mut self, parts: &[(u64, u32, bool)]) -> u16 {
        let base = self.next_desc % QUEUE_SIZE;
        let descs = crate::virtio::mmio::test_driver::chain(parts, base, QUEUE_SIZE);
        self.post_raw(&descs)
    }

    /// The used entries since the last call: (head, len).
    fn take_used(&mut self) -> Vec<(u16, u32)> {
        let used = self.vq.used();
        let idx = used.idx().load();
        let mut out = Vec::new();
        while self.seen != idx {
            let e = used
                .ring()
                .ref_at(usize::from(self.seen % QUEUE_SIZE))
                .unwrap()
                .load();
            out.push((e.id() as u16, e.len()));
            self.seen = self.seen.wrapping_add(1);
        }
        out
    }

    fn used_idx(&self) -> u16 {
        self.vq.used().idx().load()
    }
}

/// A guest with one input device brought up to DRIVER_OK, both queues of 64.
struct Guest<'a> {
    drv: Driver,
    mem: &'a Memory,
    eventq: Ring<'a>,
    statusq: Ring<'a>,
    handle: InputHandle,
}

impl<'a> Guest<'a> {
    fn new(mem: &'a Memory, dev: Input) -> Self {
        let handle = dev.handle();
        let mut drv = Driver::new(Box::new(dev), mem.clone());
        assert!(drv.negotiate(VIRTIO_F_VERSION_1));
        let mut g = Guest {
            drv,
            mem,
            eventq: Ring::new(mem, EVQ),
            statusq: Ring::new(mem, STQ),
            handle,
        };
        g.bring_up();
        g
    }

    fn bring_up(&mut self) {
        self.drv
            .setup_queue(0, &self.eventq.vq, u32::from(QUEUE_SIZE));
        self.drv
            .setup_queue(1, &self.statusq.vq, u32::from(QUEUE_SIZE));
        self.drv.driver_ok();
        assert!(self.drv.transport.is_activated());
    }

    /// Posts `n` 8-byte event buffers (each at `BUF + 8 * descriptor`),
    /// poisoned so an unwritten one shows.
    fn post_buffers(&mut self, n: usize) {
        for _ in 0..n {
            let slot = self.eventq.next_desc % QUEUE_SIZE;
            let addr = BUF + 8 * u64::from(slot);
            self.mem
                .write_slice(&[0xee; 8], GuestAddress(addr))
                .unwrap();
            self.eventq.post(&[(addr, 8, true)]);
        }
    }

    /// The events the device completed since the last call, in used order.
    fn events(&mut self) -> Vec<Event> {
        self.eventq
            .take_used()
            .into_iter()
            .map(|(head, len)| {
                assert_eq!(len as usize, EVENT_BYTES);
                let mut b = [0u8; 8];
                self.mem
                    .read_slice(&mut b, GuestAddress(BUF + 8 * u64::from(head)))
                    .unwrap();
                ev(
                    u16::from_le_bytes([b[0], b[1]]),
                    u16::from_le_bytes([b[2], b[3]]),
                    i32::from_le_bytes([b[4], b[5], b[6], b[7]]),
                )
            })
            .collect()
    }

    fn needs_reset(&mut self) -> bool {
        self.drv.status() & STATUS_NEEDS_RESET != 0
    }

    fn pending(&self) -> usize {
        lock(&self.handle.shared).pending.len()
    }
}

#[test]
fn the_keyboard_advertises_keys_esc_to_255_with_key_a_set_repeat_and_three_leds() {
    let mut kbd = Input::keyboard();
    assert_eq!(kbd.device_type(), 18);
    assert_eq!(kbd.features(), VIRTIO_F_VERSION_1);
    assert_eq!(kbd.queue_max_sizes(), &[64, 64]);
    let (size, keys) = select(&mut kbd, CFG_EV_BITS, EV_KEY);
    assert_eq!(size, 32, "bytes up to KEY 255");
    assert!(bit(&keys, KEY_A));
    assert!(bit(&keys, 1) && bit(&keys, 255));
    assert!(!bit(&keys, 0), "KEY_RESERVED is not a key");
    assert!(keys[32..].iter().all(|&b| b == 0));
    let (size, rep) = select(&mut kbd, CFG_EV_BITS, EV_REP);
    assert_eq!((size, rep[0]), (1, 0), "EV_REP supported, no codes");
    let (size, leds) = select(&mut kbd, CFG_EV_BITS, EV_LED);
    assert_eq!((size, leds[0]), (1, 0b111));
    for kind in [EV_REL, EV_ABS, 0x04, 0x05] {
        assert_eq!(select(&mut kbd, CFG_EV_BITS, kind).0, 0, "type {kind}");
    }
    assert_eq!(select(&mut kbd, CFG_ABS_INFO, 0).0, 0);
    assert_eq!(select(&mut kbd, CFG_PROP_BITS, 0).0, 0);
}

#[test]
fn the_tablet_reports_abs_x_and_abs_y_in_pixels_up_to_width_and_height_less_one() {
    let mut tab = Input::tablet(1280, 800);
    let (size, info) = select(&mut tab, CFG_ABS_INFO, ABS_X);
    assert_eq!(size, 20);
    let le = |i: usize| i32::from_le_bytes(info[i * 4..i * 4 + 4].try_into().unwrap());
    assert_eq!((le(0), le(1), le(2), le(3), le(4)), (0, 1279, 0, 0, 0));
    let (_, info) = select(&mut tab, CFG_ABS_INFO, ABS_Y);
    assert_eq!(i32::from_le_bytes(info[4..8].try_into().unwrap()), 799);
    assert_eq!(select(&mut tab, CFG_ABS_INFO, 2).0, 0, "no ABS_Z");

    let (size, abs) = select(&mut tab, CFG_EV_BITS, EV_ABS);
    assert_eq!((size, abs[0]), (1, 0b11));
    let (size, rel) = select(&mut tab, CFG_EV_BITS, EV_REL);
    assert_eq!(size, 2);
    assert!(bit(&rel, REL_WHEEL) && bit(&rel, REL_HWHEEL));
    let (size, keys) = select(&mut tab, CFG_EV_BITS, EV_KEY);
    assert_eq!(size, 35, "bytes up to BTN_EXTRA");
    for b in [BTN_LEFT, BTN_RIGHT, BTN_MIDDLE, BTN_SIDE, BTN_EXTRA] {
        assert!(bit(&keys, b));
    }
    assert!(!bit(&keys, KEY_A));
    assert_eq!(select(&mut tab, CFG_EV_BITS, EV_LED).0, 0);
    assert_eq!(select(&mut tab, CFG_PROP_BITS, 0).0, 0);
}

#[test]
fn names_serial_and_ids_read_back_through_the_transport() {
    let mem = memory(1);
    for (dev, name, product) in [
        (Input::keyboard(), &b"boxdesk keyboard"[..], 1u16),
        (Input::tablet(640, 480), &b"boxdesk tablet"[..], 3),
    ] {
        let mut drv = Driver::new(Box::new(dev), mem.clone());
        let read = |drv: &mut Driver, select: u32| {
            drv.transport.write(CONFIG_OFFSET, &[select as u8, 0]);
            let mut cfg = [0u8; CONFIG_BYTES];
            drv.transport.read(CONFIG_OFFSET, &mut cfg);
            let size = usize::from(cfg[2]);
            cfg[8..8 + size].to_vec()
        };
        assert_eq!(read(&mut drv, CFG_ID_NAME), name);
        assert_eq!(read(&mut drv, CFG_ID_SERIAL), b"boxdesk");
        let ids: Vec<u16> = read(&mut drv, CFG_ID_DEVIDS)
            .chunks(2)
            .map(|c| u16::from_le_bytes([c[0], c[1]]))
            .collect();
        assert_eq!(ids, [0x06, 0x0627, product, 1]);
    }
}

#[test]
fn an_unknown_select_or_subsel_reads_size_zero_and_an_empty_union() {
    let mut kbd = Input::keyboard();
    for (sel, sub) in [(0, 0), (4, 0), (19, 0), (255, 255), (CFG_EV_BITS, 0x1f)] {
        let (size, union) = select(&mut kbd, sel, sub);
        assert_eq!(size, 0, "select {sel} subsel {sub}");
        assert!(union.iter().all(|&b| b == 0));
    }
}

#[test]
fn config_accesses_at_odd_offsets_and_lengths_never_panic_and_only_select_and_subsel_are_writable()
{
    let mut kbd = Input::keyboard();
    kbd.write_config(0, &[CFG_ID_NAME as u8, 0, 99, 1, 2, 3, 4, 5, b'X', b'Y']);
    let mut name = [0u8; 3];
    kbd.read_config(2, &mut name);
    assert_eq!(name[0], 16, "size is the device's, not what was written");
    kbd.read_config(8, &mut name);
    assert_eq!(&name, b"box");
    for offset in [0, 1, 3, 7, 9, 135, 136, 137, 4096, u64::MAX - 1, u64::MAX] {
        for len in [0, 1, 2, 3, 4, 8, 200] {
            let mut buf = vec![0xaa; len];
            kbd.read_config(offset, &mut buf);
            if offset >= CONFIG_BYTES as u64 {
                assert!(buf.iter().all(|&b| b == 0), "zeros past the end");
            }
            kbd.write_config(offset, &buf);
        }
    }
    // Writes that straddle the end of u64 select nothing and panic nowhere.
    kbd.write_config(u64::MAX, &[1, 2, 3]);
    // Every write put back what was read: ID_NAME is still selected.
    let mut cfg = [0u8; CONFIG_BYTES];
    kbd.read_config(0, &mut cfg);
    assert_eq!(&cfg[..3], &[CFG_ID_NAME as u8, 0, 16]);
    assert_eq!(&cfg[8..24], b"boxdesk keyboard");
}

#[test]
fn a_key_a_press_then_release_reaches_the_guest_as_key_syn_key_syn_in_order() {
    let mem = memory(4);
    let mut g = Guest::new(&mem, Input::keyboard());
    g.post_buffers(8);
    g.drv.notify(0);
    assert_eq!(g.eventq.used_idx(), 0, "nothing to send yet");
    g.handle.send(EV_KEY, KEY_A, 1).unwrap();
    g.handle.send(EV_KEY, KEY_A, 0).unwrap();
    assert_eq!(
        g.events(),
        [ev(EV_KEY, KEY_A, 1), SYN, ev(EV_KEY, KEY_A, 0), SYN]
    );
    assert_eq!(g.drv.ack_interrupt() & INT_USED_RING, INT_USED_RING);
    assert!(g.drv.irq.count() >= 2);
    // The untouched buffers stay as the guest left them.
    let mut b = [0u8; 8];
    mem.read_slice(&mut b, GuestAddress(BUF + 8 * 4)).unwrap();
    assert_eq!(b, [0xee; 8]);
    assert!(!g.needs_reset());
}

#[test]
fn events_sent_before_the_guest_posts_buffers_arrive_in_order_after_it_notifies() {
    let mem = memory(4);
    let mut g = Guest::new(&mem, Input::keyboard());
    g.handle.send(EV_KEY, KEY_A, 1).unwrap();
    g.handle.send(EV_KEY, KEY_B, 1).unwrap();
    g.handle.send(EV_KEY, KEY_A, 0).unwrap();
    assert_eq!(g.pending(), 6);
    assert_eq!(g.drv.irq.count(), 0);
    // Fewer buffers than events: the rest waits for the next notify.
    g.post_buffers(3);
    g.drv.notify(0);
    assert_eq!(
        g.events(),
        [ev(EV_KEY, KEY_A, 1), SYN, ev(EV_KEY, KEY_B, 1)]
    );
    assert_eq!(g.drv.irq.count(), 1);
    g.post_buffers(8);
    g.drv.notify(0);
    assert_eq!(g.events(), [SYN, ev(EV_KEY, KEY_A, 0), SYN]);
    assert_eq!(g.pending(), 0);
}

#[test]
fn a_guest_that_takes_no_events_costs_at_most_the_pending_bound_and_loses_the_oldest_pairs() {
    let mem = memory(4);
    let mut g = Guest::new(&mem, Input::keyboard());
    let sent = 600usize;
    let code = |i: usize| 1 + (i % 255) as u16;
    for i in 0..sent {
        g.handle.send(EV_KEY, code(i), (i % 2) as i32).unwrap();
        assert!(g.pending() <= PENDING_EVENTS);
    }
    assert_eq!(g.pending(), PENDING_EVENTS);
    let dropped = sent - PENDING_EVENTS / 2;
    assert_eq!(lock(&g.handle.shared).dropped, dropped as u64);

    // The guest catches up, 64 buffers at a time (the rings wrap).
    let mut got = Vec::new();
    while got.len() < PENDING_EVENTS {
        g.post_buffers(usize::from(QUEUE_SIZE));
        g.drv.notify(0);
        let batch = g.events();
        assert!(!batch.is_empty());
        got.extend(batch);
    }
    let want: Vec<Event> = (dropped..sent)
        .flat_map(|i| [ev(EV_KEY, code(i), (i % 2) as i32), SYN])
        .collect();
    assert_eq!(got, want);
    assert!(!g.needs_reset());
}

#[test]
fn a_report_half_delivered_keeps_its_syn_when_the_pending_queue_overflows() {
    let mem = memory(4);
    let mut g = Guest::new(&mem, Input::keyboard());
    g.post_buffers(1);
    g.handle.send(EV_KEY, KEY_A, 1).unwrap();
    assert_eq!(g.events(), [ev(EV_KEY, KEY_A, 1)]);
    for _ in 0..PENDING_EVENTS {
        g.handle.send(EV_KEY, KEY_B, 1).unwrap();
    }
    assert!(g.pending() <= PENDING_EVENTS);
    g.post_buffers(2);
    g.drv.notify(0);
    assert_eq!(g.events(), [SYN, ev(EV_KEY, KEY_B, 1)]);
}

#[test]
fn unknown_codes_bad_key_values_and_out_of_range_coordinates_are_refused_and_nothing_is_written() {
    let mem = memory(4);
    let mut kbd = Guest::new(&mem, Input::keyboard());
    kbd.post_buffers(8);
    let unsupported = |kind, code| InputError::Unsupported {
        device: "kbd",
        kind,
        code,
    };
    assert_eq!(kbd.handle.send(EV_KEY, 0, 1), Err(unsupported(EV_KEY, 0)));
    assert_eq!(
        kbd.handle.send(EV_KEY, 256, 1),
        Err(unsupported(EV_KEY, 256))
    );
    assert_eq!(
        kbd.handle.send(EV_KEY, BTN_LEFT, 1),
        Err(unsupported(EV_KEY, BTN_LEFT))
    );
    assert_eq!(
        kbd.handle.send(EV_KEY, u16::MAX, 1),
        Err(unsupported(EV_KEY, u16::MAX))
    );
    assert_eq!(
        kbd.handle.send(EV_ABS, ABS_X, 1),
        Err(unsupported(EV_ABS, ABS_X))
    );
    for value in [-1, 3, i32::MAX, i32::MIN] {
        assert_eq!(
            kbd.handle.send(EV_KEY, KEY_A, value),
            Err(InputError::Value {
                kind: EV_KEY,
                code: KEY_A,
                value,
                min: 0,
                max: 2
            })
        );
    }
    assert!(kbd.events().is_empty());
    assert_eq!(kbd.pending(), 0);
    assert_eq!(kbd.drv.irq.count(), 0);

    let mem = memory(4);
    let mut tab = Guest::new(&mem, Input::tablet(1024, 768));
    tab.post_buffers(8);
    for (code, value, max) in [(ABS_X, 1024, 1023), (ABS_X, -1, 1023), (ABS_Y, 768, 767)] {
        assert_eq!(
            tab.handle.send(EV_ABS, code, value),
            Err(InputError::Value {
                kind: EV_ABS,
                code,
                value,
                min: 0,
                max
            })
        );
    }
    assert_eq!(
        tab.handle.send(EV_KEY, KEY_A, 1),
        Err(InputError::Unsupported {
            device: "ptr",
            kind: EV_KEY,
            code: KEY_A
        })
    );
    assert_eq!(
        tab.handle.send(EV_REL, 0, 5),
        Err(InputError::Unsupported {
            device: "ptr",
            kind: EV_REL,
            code: 0
        })
    );
    assert!(tab.events().is_empty());
    // The edges of the ranges are accepted.
    tab.handle.send(EV_ABS, ABS_X, 1023).unwrap();
    tab.handle.send(EV_ABS, ABS_Y, 0).unwrap();
    tab.handle.send(EV_REL, REL_WHEEL, -120).unwrap();
    tab.handle.send(EV_KEY, BTN_LEFT, 1).unwrap();
    assert_eq!(
        tab.events(),
        [
            ev(EV_ABS, ABS_X, 1023),
            SYN,
            ev(EV_ABS, ABS_Y, 0),
            SYN,
            ev(EV_REL, REL_WHEEL, -120),
            SYN,
            ev(EV_KEY, BTN_LEFT, 1),
            SYN
        ]
    );
}

#[test]
fn syn_led_and_rep_events_from_the_host_are_refused_as_unsupported() {
    let mem = memory(4);
    let mut g = Guest::new(&mem, Input::keyboard());
    g.post_buffers(4);
    for (kind, code) in [
        (EV_SYN, SYN_REPORT),
        (EV_LED, LED_CAPSL),
        (EV_REP, 0),
        (0x1f, 0),
    ] {
        assert_eq!(
            g.handle.send(kind, code, 0),
            Err(InputError::Unsupported {
                device: "kbd",
                kind,
                code
            })
        );
    }
    assert!(g.events().is_empty());
}

#[test]
fn events_before_driver_ok_or_after_a_reset_are_refused_as_not_ready() {
    let kbd = Input::keyboard();
    let handle = kbd.handle();
    assert_eq!(handle.send(EV_KEY, KEY_A, 1), Err(InputError::NotReady));

    let mem = memory(4);
    let mut drv = Driver::new(Box::new(kbd), mem.clone());
    assert!(drv.negotiate(VIRTIO_F_VERSION_1));
    assert_eq!(handle.send(EV_KEY, KEY_A, 1), Err(InputError::NotReady));

    let mut g = Guest::new(&mem, Input::keyboard());
    g.handle.send(EV_KEY, KEY_A, 1).unwrap();
    assert_eq!(g.pending(), 2);
    g.drv.write(VIRTIO_MMIO_STATUS, 0);
    assert_eq!(g.pending(), 0, "a reset drops what was pending");
    assert_eq!(g.handle.send(EV_KEY, KEY_A, 0), Err(InputError::NotReady));
    assert_eq!(g.eventq.used_idx(), 0);
}

/// Posts `parts` as one chain, sends a key and expects the device to have
/// given up: no used entry, NEEDS_RESET and a config interrupt, and later
/// sends refused without touching memory.
fn expect_needs_reset_after(parts: &[(u64, u32, bool)]) {
    let mem = memory(4);
    let mut g = Guest::new(&mem, Input::keyboard());
    g.handle.send(EV_KEY, KEY_A, 1).unwrap();
    mem.write_slice(&[0xee; 64], GuestAddress(BUF)).unwrap();
    g.eventq.post(parts);
    g.drv.notify(0);
    assert_eq!(g.eventq.used_idx(), 0, "no used entry for a bad chain");
    assert!(g.needs_reset());
    assert_eq!(g.drv.ack_interrupt() & INT_CONFIG, INT_CONFIG);
    assert_eq!(g.pending(), 0);

    g.post_buffers(4);
    let irqs = g.drv.irq.count();
    assert_eq!(g.handle.send(EV_KEY, KEY_A, 0), Err(InputError::NotReady));
    g.drv.notify(0);
    g.drv.notify(1);
    assert_eq!(g.eventq.used_idx(), 0);
    assert_eq!(g.drv.irq.count(), irqs);
    let mut b = [0u8; 64];
    mem.read_slice(&mut b, GuestAddress(BUF)).unwrap();
    assert_eq!(b, [0xee; 64], "guest memory untouched");
}

#[test]
fn a_device_readable_event_buffer_marks_the_device_needs_reset_and_later_sends_touch_nothing() {
    expect_needs_reset_after(&[(BUF, 8, false)]);
}

#[test]
fn a_readable_descriptor_after_a_writable_one_on_the_event_queue_marks_needs_reset() {
    expect_needs_reset_after(&[(BUF, 8, true), (BUF + 8, 8, false)]);
}

#[test]
fn an_event_buffer_of_four_bytes_marks_the_device_needs_reset() {
    expect_needs_reset_after(&[(BUF, 4, true)]);
}

#[test]
fn an_event_buffer_outside_guest_memory_marks_the_device_needs_reset() {
    expect_needs_reset_after(&[(OUTSIDE, 8, true)]);
}

#[test]
fn an_event_buffer_running_off_the_end_of_guest_memory_marks_the_device_needs_reset() {
    expect_needs_reset_after(&[((4 << 20) - 4, 8, true)]);
}

#[test]
fn a_loop_in_an_event_chain_marks_the_device_needs_reset() {
    let mem = memory(4);
    let mut g = Guest::new(&mem, Input::keyboard());
    g.handle.send(EV_KEY, KEY_A, 1).unwrap();
    let flags = (VRING_DESC_F_NEXT | VRING_DESC_F_WRITE) as u16;
    g.eventq.post_raw(&[
        Descriptor::new(BUF, 4, flags, 1),
        Descriptor::new(BUF + 8, 2, flags, 0),
    ]);
    g.drv.notify(0);
    assert!(g.needs_reset());
    assert_eq!(g.eventq.used_idx(), 0);
}

#[test]
fn an_avail_index_running_ahead_of_the_event_queue_marks_the_device_needs_reset() {
    let mem = memory(4);
    let mut g = Guest::new(&mem, Input::keyboard());
    g.eventq.vq.avail().idx().store(QUEUE_SIZE + 1);
    assert_eq!(g.handle.send(EV_KEY, KEY_A, 1), Err(InputError::NotReady));
    assert!(g.needs_reset());
    assert_eq!(g.handle.send(EV_KEY, KEY_A, 0), Err(InputError::NotReady));
}

#[test]
fn an_event_split_across_small_descriptors_is_written_whole() {
    let mem = memory(4);
    let mut g = Guest::new(&mem, Input::keyboard());
    let at = BUF + 0x800;
    g.eventq
        .post(&[(at, 3, true), (at + 3, 0, true), (at + 3, 5, true)]);
    g.handle.send(EV_KEY, KEY_A, 2).unwrap();
    let used = g.eventq.take_used();
    assert_eq!(used, [(0, 8)]);
    let mut b = [0u8; 8];
    mem.read_slice(&mut b, GuestAddress(at)).unwrap();
    assert_eq!(b, ev(EV_KEY, KEY_A, 2).bytes());
    assert_eq!(b, [1, 0, 30, 0, 2, 0, 0, 0]);
}

#[test]
fn status_chains_from_the_guest_are_completed_with_length_zero() {
    let mem = memory(4);
    let mut g = Guest::new(&mem, Input::keyboard());
    for i in 0..3u64 {
        let at = STATUS_BUF + 8 * i;
        mem.write_slice(&ev(EV_LED, LED_CAPSL, 1).bytes(), GuestAddress(at))
            .unwrap();
        g.statusq.post(&[(at, 8, false)]);
    }
    // A short one and a device-writable one are read no further.
    g.statusq.post(&[(STATUS_BUF + 0x100, 2, false)]);
    g.statusq.post(&[(STATUS_BUF + 0x200, 8, true)]);
    g.drv.notify(1);
    let used = g.statusq.take_used();
    assert_eq!(used.len(), 5);
    assert!(used.iter().all(|&(_, len)| len == 0));
    assert_eq!(g.drv.ack_interrupt(), INT_USED_RING);
    assert!(!g.needs_reset());
    // The event queue is not disturbed.
    g.post_buffers(2);
    g.handle.send(EV_KEY, KEY_A, 1).unwrap();
    assert_eq!(g.events(), [ev(EV_KEY, KEY_A, 1), SYN]);
}

#[test]
fn a_status_buffer_outside_guest_memory_marks_the_device_needs_reset() {
    let mem = memory(4);
    let mut g = Guest::new(&mem, Input::keyboard());
    g.statusq.post(&[(OUTSIDE, 8, false)]);
    g.drv.notify(1);
    assert_eq!(g.statusq.used_idx(), 0);
    assert!(g.needs_reset());
    assert_eq!(g.handle.send(EV_KEY, KEY_A, 1), Err(InputError::NotReady));
}

#[test]
fn after_needs_reset_a_driver_reset_and_bring_up_makes_the_device_work_again() {
    let mem = memory(4);
    let mut g = Guest::new(&mem, Input::keyboard());
    g.eventq.post(&[(OUTSIDE, 8, true)]);
    assert_eq!(g.handle.send(EV_KEY, KEY_A, 1), Err(InputError::NotReady));
    assert!(g.needs_reset());

    g.eventq = Ring::new(&mem, 0x4_0000);
    g.statusq = Ring::new(&mem, 0x5_0000);
    assert!(g.drv.negotiate(VIRTIO_F_VERSION_1));
    g.bring_up();
    assert!(!g.needs_reset());
    g.post_buffers(2);
    g.handle.send(EV_KEY, KEY_B, 1).unwrap();
    assert_eq!(g.events(), [ev(EV_KEY, KEY_B, 1), SYN]);
}

#[test]
fn inputs_routes_keyboard_events_to_the_keyboard_and_pointer_events_to_the_tablet() {
    let mem = memory(4);
    let mut kbd = Guest::new(&mem, Input::keyboard());
    let tab_mem = memory(4);
    let mut tab = Guest::new(&tab_mem, Input::tablet(800, 600));
    kbd.post_buffers(4);
    tab.post_buffers(4);
    let inputs = Inputs {
        keyboard: kbd.handle.clone(),
        pointer: tab.handle.clone(),
    };
    assert_eq!(inputs.keyboard.device(), InputDevice::Keyboard);
    assert_eq!(inputs.pointer.device(), InputDevice::Pointer);
    let sink: Arc<dyn InputSink> = Arc::new(inputs);
    let send = |device, kind, code, value| {
        sink.send(InputEvent {
            device,
            kind,
            code,
            value,
        })
    };
    send(InputDevice::Keyboard, EV_KEY, KEY_A, 1).unwrap();
    send(InputDevice::Pointer, EV_ABS, ABS_X, 799).unwrap();
    assert_eq!(
        send(InputDevice::Pointer, EV_KEY, KEY_A, 1),
        Err(InputError::Unsupported {
            device: "ptr",
            kind: EV_KEY,
            code: KEY_A
        })
    );
    assert_eq!(
        send(InputDevice::Keyboard, EV_KEY, BTN_LEFT, 1),
        Err(InputError::Unsupported {
            device: "kbd",
            kind: EV_KEY,
            code: BTN_LEFT
        })
    );
    assert_eq!(kbd.events(), [ev(EV_KEY, KEY_A, 1), SYN]);
    assert_eq!(tab.events(), [ev(EV_ABS, ABS_X, 799), SYN]);
}

#[test]
fn a_handle_sends_from_another_thread_while_the_guest_notifies() {
    let mem = memory(4);
    let mut g = Guest::new(&mem, Input::keyboard());
    let handle = g.handle.clone();
    let sender = std::thread::spawn(move || {
        for i in 0..200 {
            handle.send(EV_KEY, KEY_A, i % 2).unwrap();
        }
    });
    let mut got = Vec::new();
    while got.len() < 400 {
        // Reuse only buffers already read back.
        let outstanding = g.eventq.avail.wrapping_sub(g.eventq.seen);
        g.post_buffers(usize::from(QUEUE_SIZE - outstanding));
        g.drv.notify(0);
        got.extend(g.events());
        std::thread::yield_now();
    }
    sender.join().unwrap();
    let want: Vec<Event> = (0..200)
        .flat_map(|i| [ev(EV_KEY, KEY_A, i % 2), SYN])
        .collect();
    assert_eq!(got, want);
}
