//! The device as a guest driver sees it: queues over real guest memory.

use std::sync::Arc;
use std::time::{Duration, Instant};

use boxdesk_platform::screen::Screen;
use virtio_bindings::virtio_gpu::{
    virtio_gpu_ctrl_type_VIRTIO_GPU_CMD_GET_DISPLAY_INFO as GET_DISPLAY_INFO,
    virtio_gpu_ctrl_type_VIRTIO_GPU_RESP_ERR_INVALID_PARAMETER as ERR_INVALID_PARAMETER,
    virtio_gpu_ctrl_type_VIRTIO_GPU_RESP_OK_DISPLAY_INFO as OK_DISPLAY_INFO,
};
use virtio_queue::mock::MockSplitQueue;
use vm_memory::{Bytes, GuestAddress};

use super::Gpu;
use crate::virtio::mmio::test_driver::{chain, memory, Driver};
use crate::virtio::{Memory, STATUS_NEEDS_RESET};

const REQ: u64 = 0x10_0000;
const RESP: u64 = 0x11_0000;

struct Guest<'a> {
    drv: Driver,
    vq: MockSplitQueue<'a, Memory>,
    mem: &'a Memory,
    next: u16,
}

impl<'a> Guest<'a> {
    fn new(mem: &'a Memory) -> Self {
        let screen = Arc::new(Screen::new(320, 200).unwrap());
        let vq = MockSplitQueue::create(mem, GuestAddress(0), 256);
        let cq = MockSplitQueue::create(mem, GuestAddress(0x8000), 16);
        let mut drv = Driver::new(Box::new(Gpu::new(screen)), mem.clone());
        let offered = drv.device_features();
        assert!(drv.negotiate(offered));
        drv.setup_queue(0, &vq, 256);
        drv.setup_queue(1, &cq, 16);
        drv.driver_ok();
        Guest {
            drv,
            vq,
            mem,
            next: 0,
        }
    }

    fn push(&mut self, parts: &[(u64, u32, bool)]) {
        let descs = chain(parts, self.next, 256);
        let raw: Vec<_> = descs.iter().map(|&d| d.into()).collect();
        self.vq.add_desc_chains(&raw, self.next).unwrap();
        self.next += parts.len() as u16;
    }

    /// Notifies and waits for the used ring to reach `want` entries or
    /// the device to need a reset.
    fn kick(&mut self, want: u16) -> bool {
        self.drv.notify(0);
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if self.vq.used().idx().load() == want {
                return true;
            }
            if self.drv.status() & STATUS_NEEDS_RESET != 0 {
                return false;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        panic!("the device neither answered nor gave up");
    }

    fn response(&self, len: usize) -> Vec<u8> {
        let mut v = vec![0u8; len];
        self.mem.read_slice(&mut v, GuestAddress(RESP)).unwrap();
        v
    }
}

fn word(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap())
}

#[test]
fn get_display_info_over_the_control_queue_names_the_screen_size() {
    let mem = memory(4);
    let mut g = Guest::new(&mem);
    mem.write_slice(&GET_DISPLAY_INFO.to_le_bytes(), GuestAddress(REQ))
        .unwrap();
    g.push(&[(REQ, 24, false), (RESP, 408, true)]);
    assert!(g.kick(1));
    let r = g.response(408);
    assert_eq!(word(&r, 0), OK_DISPLAY_INFO);
    assert_eq!((word(&r, 32), word(&r, 36), word(&r, 40)), (320, 200, 1));
}

#[test]
fn a_short_request_gets_an_error_response_and_the_device_goes_on() {
    let mem = memory(4);
    let mut g = Guest::new(&mem);
    // RESOURCE_CREATE_2D without its fields.
    mem.write_slice(&0x101u32.to_le_bytes(), GuestAddress(REQ))
        .unwrap();
    g.push(&[(REQ, 24, false), (RESP, 24, true)]);
    assert!(g.kick(1));
    assert_eq!(word(&g.response(24), 0), ERR_INVALID_PARAMETER);
    mem.write_slice(&GET_DISPLAY_INFO.to_le_bytes(), GuestAddress(REQ))
        .unwrap();
    g.push(&[(REQ, 24, false), (RESP, 408, true)]);
    assert!(g.kick(2));
    assert_eq!(word(&g.response(4), 0), OK_DISPLAY_INFO);
}

#[test]
fn hostile_chains_mark_the_device_needs_reset_without_touching_memory_outside() {
    for parts in [
        // A request outside guest memory.
        vec![(64 << 20, 24, false), (RESP, 24, true)],
        // A readable descriptor after a writable one.
        vec![(RESP, 24, true), (REQ, 24, false)],
        // A request far past the largest command.
        vec![(REQ, 2 << 20, false), (RESP, 24, true)],
    ] {
        let mem = memory(4);
        let mut g = Guest::new(&mem);
        g.push(&parts);
        assert!(!g.kick(1), "{parts:?}");
        assert_eq!(g.vq.used().idx().load(), 0);
    }
}
