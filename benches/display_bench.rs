//! The display path's figures beside a plain `memcpy` of the same bytes,
//! measured in the same run (goal: a present's copy ≤ 2×
//! memcpy):
//!
//! * one 1920×1080 XRGB8888 frame (8,294,400 bytes) `memcpy`d — the
//!   baseline — into one buffer, and into three in turn (as presents
//!   rotate through the three slots);
//! * `Screen::present` of that whole frame: the copy into the frame slot
//!   a `RESOURCE_FLUSH` costs;
//! * the virtio-gpu engine's `TRANSFER_TO_HOST_2D` of the frame from
//!   guest pages scattered 4 KiB at a time (as Linux's fbdev backs it),
//!   then the `RESOURCE_FLUSH`: the whole device path of one guest frame;
//! * present → record: from `present` to the leaseholder reading its
//!   `present` line on a real control socket (p50/p99 of 300, one frame
//!   at a time so none coalesce).
//!
//! Run with `cargo bench -p boxdesk --bench display_bench`.

use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use boxdesk_devices::gpu::protocol::{Command, GpuRect, MemEntry};
use boxdesk_devices::gpu::state::Gpu2d;
use boxdesk_devices::virtio::Memory;
use boxdesk_platform::screen::{Record, Rect, Screen};
use boxdesk_sandbox::control::testing::Desk;
use boxdesk_sandbox::control::{server, ControlClient, Controlled};
use vm_memory::{Bytes, GuestAddress};

const W: u32 = 1920;
const H: u32 = 1080;
const FRAME: usize = (W * H * 4) as usize;
const ROUNDS: usize = 60;

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn pct(mut v: Vec<Duration>, p: f64) -> Duration {
    v.sort();
    v[((v.len() as f64 - 1.0) * p) as usize]
}

fn time(rounds: usize, mut f: impl FnMut(usize)) -> Duration {
    median(
        (0..rounds)
            .map(|i| {
                let t = Instant::now();
                f(i);
                t.elapsed()
            })
            .collect(),
    )
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn main() {
    let frame: Vec<u8> = (0..FRAME).map(|i| (i * 31 % 255) as u8).collect();
    let mut dst = vec![0u8; FRAME];
    // Touch every page first: no first-fault in any measured copy.
    dst.copy_from_slice(&frame);
    let memcpy = time(ROUNDS, |i| {
        dst.copy_from_slice(black_box(&frame));
        black_box(&mut dst)[i % FRAME] ^= 1;
    });

    // The same copy into three destinations in turn, as presents rotate
    // through three slots: the like-for-like baseline (the three and the
    // source no longer fit the last-level cache together).
    let mut three = [vec![0u8; FRAME], vec![0u8; FRAME], vec![0u8; FRAME]];
    for d in &mut three {
        d.copy_from_slice(&frame);
    }
    let memcpy3 = time(ROUNDS, |i| {
        let d = &mut three[i % 3];
        d.copy_from_slice(black_box(&frame));
        black_box(d)[i % FRAME] ^= 1;
    });

    let screen = Arc::new(Screen::new(W, H).unwrap());
    for _ in 0..3 {
        screen.present(&frame, (W * 4) as usize, W, H, Rect::whole(W, H));
    }
    let present = time(ROUNDS, |_| {
        black_box(screen.present(&frame, (W * 4) as usize, W, H, Rect::whole(W, H)));
    });

    // The device path over guest memory: the frame in 4 KiB pages, every
    // other page (scattered as a shmem GEM object's are).
    let pages = FRAME.div_ceil(4096);
    let mem = Memory::from_ranges(&[(GuestAddress(0), pages * 8192 + (1 << 20))]).unwrap();
    let mut entries = Vec::with_capacity(pages);
    for (i, chunk) in frame.chunks(4096).enumerate() {
        let at = GuestAddress((1 << 20) + i as u64 * 8192);
        mem.write_slice(chunk, at).unwrap();
        entries.push(MemEntry {
            addr: at.0,
            length: 4096,
        });
    }
    let gpu_screen = Arc::new(Screen::new(W, H).unwrap());
    let mut gpu = Gpu2d::new(gpu_screen);
    let whole = GpuRect {
        x: 0,
        y: 0,
        width: W,
        height: H,
    };
    for cmd in [
        Command::ResourceCreate2d {
            resource_id: 1,
            format: 2,
            width: W,
            height: H,
        },
        Command::AttachBacking {
            resource_id: 1,
            entries,
        },
        Command::SetScanout {
            rect: whole,
            scanout_id: 0,
            resource_id: 1,
        },
    ] {
        gpu.execute(&mem, cmd);
    }
    let device = time(ROUNDS, |_| {
        gpu.execute(
            &mem,
            Command::TransferToHost2d {
                rect: whole,
                offset: 0,
                resource_id: 1,
            },
        );
        gpu.execute(
            &mem,
            Command::ResourceFlush {
                rect: whole,
                resource_id: 1,
            },
        );
    });

    // present → record through the control socket.
    let lat = {
        let sock_dir = tempfile_dir();
        let sock = sock_dir.join("bench.sock");
        let listener = std::os::unix::net::UnixListener::bind(&sock).unwrap();
        let desk: Arc<dyn Controlled> = Arc::new(Desk {
            screen: Some(screen.clone()),
            events: Default::default(),
        });
        std::thread::spawn(move || server::serve(listener, desk));
        let mut lease = ControlClient::connect(&sock, "bench")
            .unwrap()
            .display()
            .unwrap();
        // The lease starts with the newest frame.
        let _ = lease.next(Some(Duration::from_secs(5))).unwrap();
        let small = Rect {
            x: 0,
            y: 0,
            w: 64,
            h: 64,
        };
        let mut v = Vec::with_capacity(300);
        for _ in 0..300 {
            let t = Instant::now();
            screen.present(&frame, (W * 4) as usize, W, H, small);
            match lease.next(Some(Duration::from_secs(5))).unwrap() {
                Some(Record::Present { .. }) => v.push(t.elapsed()),
                other => panic!("unexpected record {other:?}"),
            }
        }
        let _ = std::fs::remove_dir_all(&sock_dir);
        v
    };

    println!("display bench, one {W}x{H} XRGB8888 frame ({FRAME} bytes), median of {ROUNDS}:");
    println!("  memcpy (baseline)                 {:8.3} ms", ms(memcpy));
    println!(
        "  memcpy into 3 buffers in turn     {:8.3} ms  (as presents rotate through 3 slots)",
        ms(memcpy3)
    );
    println!(
        "  Screen::present, whole frame      {:8.3} ms  = {:.2}x memcpy, {:.2}x memcpy into 3 in turn (goal <= 2x)",
        ms(present),
        present.as_secs_f64() / memcpy.as_secs_f64(),
        present.as_secs_f64() / memcpy3.as_secs_f64()
    );
    println!(
        "  gpu TRANSFER_TO_HOST_2D + FLUSH   {:8.3} ms  = {:.2}x memcpy (two copies: guest pages -> resource -> slot)",
        ms(device),
        device.as_secs_f64() / memcpy.as_secs_f64()
    );
    println!(
        "  present -> record (64x64 damage)  p50 {:.1} us, p99 {:.1} us (of 300, through a control socket)",
        pct(lat.clone(), 0.5).as_secs_f64() * 1e6,
        pct(lat, 0.99).as_secs_f64() * 1e6
    );
}

/// A private directory for the bench's control socket.
fn tempfile_dir() -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("boxdesk-display-bench-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}
