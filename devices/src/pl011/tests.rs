use super::*;
use crate::bus::Bus;
use crate::console::{shared, Captured, MAX_PENDING_INPUT, TAIL_BYTES};
use crate::irq::CountingIrq;

fn uart() -> (Pl011, Captured, Arc<CountingIrq>) {
    let out = Captured::default();
    let irq = Arc::new(CountingIrq::default());
    (Pl011::new(Box::new(out.clone()), irq.clone()), out, irq)
}

fn r32(u: &mut Pl011, offset: u64) -> u32 {
    let mut b = [0u8; 4];
    u.read(offset, &mut b);
    u32::from_le_bytes(b)
}

fn w32(u: &mut Pl011, offset: u64, value: u32) {
    u.write(offset, &value.to_le_bytes());
}

/// Reads DR until FR says the receive FIFO is empty.
fn drain(u: &mut Pl011) -> Vec<u8> {
    let mut got = Vec::new();
    while r32(u, FR) & FR_RXFE == 0 {
        got.push(r32(u, DR) as u8);
    }
    got
}

#[test]
fn the_primecell_and_peripheral_ids_read_back_as_a_pl011_r1p5() {
    let (mut u, _, _) = uart();
    let ids: Vec<u32> = (0..8).map(|i| r32(&mut u, 0xfe0 + 4 * i)).collect();
    assert_eq!(ids, [0x11, 0x10, 0x14, 0x00, 0x0d, 0xf0, 0x05, 0xb1]);
    let mut b = [0u8];
    u.read(0xff0, &mut b);
    assert_eq!(b, [0x0d], "a byte read sees the same ID");
}

#[test]
fn a_byte_written_to_dr_reaches_the_writer_and_the_tail_at_once() {
    let (mut u, out, _) = uart();
    for &b in b"Booting Linux on physical CPU 0x0\n" {
        w32(&mut u, DR, u32::from(b));
    }
    u.write(DR, b"!");
    assert_eq!(out.bytes(), b"Booting Linux on physical CPU 0x0\n!");
    assert_eq!(u.tail(), b"Booting Linux on physical CPU 0x0\n!");
    let fr = r32(&mut u, FR);
    assert_eq!(fr & (FR_TXFE | FR_BUSY | FR_RXFE), FR_TXFE | FR_RXFE);
}

#[test]
fn the_tail_keeps_only_the_last_4_kib_of_output() {
    let (mut u, out, _) = uart();
    for i in 0..(TAIL_BYTES + 10) {
        w32(&mut u, DR, (i % 251) as u32);
    }
    let tail = u.tail();
    assert_eq!(tail.len(), TAIL_BYTES);
    assert_eq!(tail[0], 10);
    assert_eq!(out.bytes().len(), TAIL_BYTES + 10);
}

#[test]
fn a_sent_byte_sets_txris_and_icr_clears_it() {
    let (mut u, _, irq) = uart();
    assert_eq!(r32(&mut u, RIS), 0);
    w32(&mut u, DR, u32::from(b'x'));
    assert_eq!(r32(&mut u, RIS), INT_TX);
    assert_eq!(r32(&mut u, MIS), 0, "TXIM is masked");
    assert_eq!(irq.count(), 0);
    w32(&mut u, ICR, INT_TX);
    assert_eq!(r32(&mut u, RIS), 0);
}

#[test]
fn unmasking_txim_with_the_fifo_empty_sets_txris_and_raises_one_edge() {
    let (mut u, _, irq) = uart();
    w32(&mut u, IMSC, INT_TX);
    assert_eq!(r32(&mut u, RIS), INT_TX);
    assert_eq!(r32(&mut u, MIS), INT_TX);
    assert_eq!(irq.count(), 1);
    // Writing the same mask again unmasks nothing.
    w32(&mut u, IMSC, INT_TX);
    assert_eq!(irq.count(), 1);
    w32(&mut u, ICR, INT_TX);
    assert_eq!(r32(&mut u, MIS), 0);
    w32(&mut u, IMSC, INT_TX);
    assert_eq!(r32(&mut u, MIS), 0, "TXIM was already unmasked");
    assert_eq!(irq.count(), 1);
}

#[test]
fn an_edge_is_raised_exactly_when_the_masked_status_gains_a_bit() {
    let (mut u, _, irq) = uart();
    w32(&mut u, IMSC, INT_TX | INT_RX | INT_RT);
    assert_eq!(irq.count(), 1, "TX on unmasking");
    // TX still pending: more bytes and other registers add nothing.
    w32(&mut u, DR, u32::from(b'a'));
    w32(&mut u, IBRD, 13);
    w32(&mut u, CR, 0x301);
    let _ = r32(&mut u, MIS);
    assert_eq!(irq.count(), 1);
    // RX is a new bit.
    u.enqueue_input(b"k");
    assert_eq!(r32(&mut u, MIS), INT_TX | INT_RX | INT_RT);
    assert_eq!(irq.count(), 2);
    // Clearing TX, then sending again, gains TX back.
    w32(&mut u, ICR, INT_TX);
    assert_eq!(irq.count(), 2);
    w32(&mut u, DR, u32::from(b'b'));
    assert_eq!(irq.count(), 3);
    // Masking and unmasking a bit that stayed raw gains it again.
    w32(&mut u, IMSC, INT_TX);
    assert_eq!(irq.count(), 3);
    w32(&mut u, IMSC, INT_TX | INT_RX);
    assert_eq!(irq.count(), 4);
    // Draining RX drops a bit; that is no edge.
    assert_eq!(drain(&mut u), b"k");
    assert_eq!(r32(&mut u, MIS), INT_TX);
    assert_eq!(irq.count(), 4);
}

#[test]
fn console_input_sets_rx_clears_rxfe_and_reads_back_in_order() {
    let (mut u, _, irq) = uart();
    w32(&mut u, LCR_H, LCR_H_FEN | 0x60);
    w32(&mut u, IMSC, INT_RX | INT_RT);
    assert_eq!(irq.count(), 0);
    assert_ne!(r32(&mut u, FR) & FR_RXFE, 0);
    u.enqueue_input(b"root\n");
    assert_eq!(irq.count(), 1, "the receive interrupt fired");
    assert_eq!(r32(&mut u, RIS) & (INT_RX | INT_RT), INT_RX | INT_RT);
    assert_eq!(r32(&mut u, FR) & FR_RXFE, 0);
    assert_eq!(drain(&mut u), b"root\n");
    assert_eq!(r32(&mut u, RIS), 0, "RX and RT clear once the FIFO drains");
    assert_eq!(r32(&mut u, DR), 0, "an empty FIFO reads as 0");
    u.enqueue_input(b"ls\n");
    assert_eq!(irq.count(), 2, "input after the drain is a new edge");
    assert_eq!(drain(&mut u), b"ls\n");
}

#[test]
fn the_receive_fifo_holds_32_bytes_with_fen_and_one_without() {
    let (mut u, _, _) = uart();
    u.enqueue_input(b"ab");
    assert_eq!(u.rx.len(), 1);
    assert_ne!(r32(&mut u, FR) & FR_RXFF, 0);
    assert_eq!(drain(&mut u), b"ab", "the rest waits, in order");

    w32(&mut u, LCR_H, LCR_H_FEN);
    let input: Vec<u8> = (0..40).collect();
    u.enqueue_input(&input);
    assert_eq!(u.rx.len(), RX_FIFO_DEPTH);
    for _ in 0..8 {
        let _ = r32(&mut u, DR);
        assert_ne!(r32(&mut u, FR) & FR_RXFF, 0, "refilled from pending");
    }
    let _ = r32(&mut u, DR);
    assert_eq!(r32(&mut u, FR) & (FR_RXFF | FR_RXFE), 0);
    assert_eq!(drain(&mut u), &input[9..]);
}

#[test]
fn enabling_the_fifo_takes_in_pending_input() {
    let (mut u, _, irq) = uart();
    w32(&mut u, IMSC, INT_RX);
    u.enqueue_input(b"hello");
    assert_eq!(u.rx.len(), 1);
    w32(&mut u, ICR, INT_RX | INT_RT);
    w32(&mut u, LCR_H, LCR_H_FEN);
    assert_eq!(u.rx.len(), 5);
    assert_eq!(
        r32(&mut u, MIS),
        INT_RX,
        "bytes moving in are input arriving"
    );
    assert_eq!(irq.count(), 2);
    assert_eq!(drain(&mut u), b"hello");
}

#[test]
fn input_arriving_at_a_full_fifo_after_icr_cleared_rx_raises_a_new_edge() {
    let (mut u, _, irq) = uart();
    w32(&mut u, IMSC, INT_RX);
    u.enqueue_input(b"a");
    assert_eq!(irq.count(), 1);
    // As Linux's startup does: clear RX without reading.
    w32(&mut u, ICR, INT_RX | INT_RT);
    u.enqueue_input(b"b");
    assert_eq!(u.rx.len(), 1, "the one-byte FIFO was full");
    assert_eq!(irq.count(), 2);
    assert_eq!(drain(&mut u), b"ab");
}

#[test]
fn console_input_beyond_the_pending_bound_is_dropped() {
    let (mut u, _, _) = uart();
    w32(&mut u, LCR_H, LCR_H_FEN);
    let input: Vec<u8> = (0..MAX_PENDING_INPUT + 100).map(|i| i as u8).collect();
    u.enqueue_input(&input);
    assert_eq!(u.rx.len() + u.pending.len(), MAX_PENDING_INPUT);
    let got = drain(&mut u);
    assert_eq!(got, &input[..MAX_PENDING_INPUT]);
}

#[test]
fn loopback_sends_written_bytes_to_the_receive_fifo_not_the_writer() {
    let (mut u, out, _) = uart();
    w32(&mut u, CR, CR_RESET | CR_LBE | 1);
    w32(&mut u, DR, 0);
    assert!(out.bytes().is_empty());
    assert!(u.tail().is_empty());
    assert_eq!(r32(&mut u, RIS), INT_TX | INT_RX | INT_RT);
    assert_eq!(drain(&mut u), [0]);
    w32(&mut u, CR, CR_RESET | 1);
    w32(&mut u, DR, u32::from(b'z'));
    assert_eq!(out.bytes(), b"z");
}

#[test]
fn registers_keep_what_the_guest_writes_within_their_width() {
    let (mut u, _, _) = uart();
    assert_eq!(r32(&mut u, CR), CR_RESET);
    assert_eq!(r32(&mut u, IFLS), IFLS_RESET);
    for (reg, mask) in [
        (ILPR, 0xff),
        (IBRD, 0xffff),
        (FBRD, 0x3f),
        (LCR_H, 0xff),
        (CR, 0xffff),
        (IFLS, 0x3f),
        (IMSC, 0x7ff),
        (DMACR, 0x7),
    ] {
        w32(&mut u, reg, u32::MAX);
        assert_eq!(r32(&mut u, reg), mask, "register {reg:#x}");
    }
    // Read-only and write-only registers.
    w32(&mut u, FR, 0);
    assert_eq!(r32(&mut u, FR) & FR_TXFE, FR_TXFE);
    assert_eq!(r32(&mut u, ICR), 0);
    w32(&mut u, 0xfe0, 0);
    assert_eq!(r32(&mut u, 0xfe0), 0x11);
}

#[test]
fn narrow_reads_see_their_lane_and_narrow_writes_go_to_the_low_bytes() {
    let (mut u, out, _) = uart();
    let mut b = [0u8];
    u.read(CR + 1, &mut b);
    assert_eq!(b, [0x03], "TXE and RXE are CR's bits 8 and 9");
    let mut h = [0u8; 2];
    u.read(CR, &mut h);
    assert_eq!(u16::from_le_bytes(h), 0x300);
    u.write(IBRD, &[0x34, 0x12]);
    assert_eq!(r32(&mut u, IBRD), 0x1234);
    u.write(IBRD + 1, &[0x56]);
    assert_eq!(r32(&mut u, IBRD), 0x1234, "upper-lane writes are ignored");
    u.write(DR + 1, b"x");
    assert!(out.bytes().is_empty());
}

#[test]
fn no_access_panics_and_ignored_reads_are_zero() {
    let (mut u, _, _) = uart();
    u.enqueue_input(b"some input");
    let offsets = (0..PL011_SIZE + 16).chain([u64::MAX - 3, u64::MAX]);
    for offset in offsets.clone() {
        for len in 1..=8usize {
            let mut data = [0xaau8; 8];
            u.read(offset, &mut data[..len]);
            let valid = matches!(len, 1 | 2 | 4) && offset < PL011_SIZE && offset % len as u64 == 0;
            if !valid {
                assert!(data[..len].iter().all(|&b| b == 0), "{len} at {offset:#x}");
            }
        }
    }
    for offset in offsets {
        for len in 1..=8usize {
            let data = [0x5au8; 8];
            u.write(offset, &data[..len]);
        }
    }
    let mut empty = [];
    u.read(0, &mut empty);
    u.write(0, &[]);
}

#[test]
fn the_uart_works_as_a_shared_console_on_the_bus() {
    let out = Captured::default();
    let irq = Arc::new(CountingIrq::default());
    let (console, device) = shared(Pl011::new(Box::new(out.clone()), irq));
    let mut bus = Bus::default();
    bus.insert(0x0900_0000, PL011_SIZE, device).unwrap();
    assert!(bus.write(0x0900_0000, b"$"));
    console.lock().unwrap().enqueue_input(b"y");
    let mut b = [0u8];
    assert!(bus.read(0x0900_0000, &mut b));
    assert_eq!(b, *b"y");
    assert_eq!(console.lock().unwrap().tail(), b"$");
    assert_eq!(out.bytes(), b"$");
}
