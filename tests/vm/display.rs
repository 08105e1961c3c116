//! A VM's display and input end to end (`run --display`), in the nested
//! L1 on both arches: the guest's `/dev/fb0` through virtio-gpu into the
//! lease and `boxdesk screenshot`, and `input` lines through virtio-input
//! into the guest's `/dev/input/eventN`. One VM for all of it: each boot
//! costs nested minutes.

use std::time::{Duration, Instant};

use boxdesk_platform::screen::{InputDevice, Record, EV_ABS, EV_KEY};
use boxdesk_sandbox::control::ControlClient;

use super::{can_boot, kvm_env};
use crate::support::{Out, Started, TestEnv};

const W: u32 = 320;
const H: u32 = 200;

/// Pixel (x, y) of the pattern: bytes B, G, R, X as the guest writes them.
fn pattern() -> Vec<u8> {
    let mut p = Vec::with_capacity((W * H * 4) as usize);
    for y in 0..H {
        for x in 0..W {
            p.extend_from_slice(&[x as u8, y as u8, (x / 2 + y) as u8 ^ 0x5a, 0]);
        }
    }
    p
}

fn sh(sb: &Started<'_>, script: &str) -> Out {
    let out = sb.sh(script);
    assert_eq!(out.code(), 0, "{script}: {out}");
    out
}

fn lease(env: &TestEnv, name: &str) -> boxdesk_sandbox::control::client::DisplayLease {
    ControlClient::connect(&env.sock(name), name)
        .unwrap()
        .display()
        .unwrap()
}

/// The evdev events (type, code, value) in a file of `struct input_event`
/// (24 bytes on 64-bit: time, then u16 type, u16 code, i32 value) the guest
/// dumped with `od -An -v -tu1`.
fn events(od: &str) -> Vec<(u16, u16, i32)> {
    let bytes: Vec<u8> = od
        .split_ascii_whitespace()
        .map(|b| b.parse().unwrap())
        .collect();
    bytes
        .chunks_exact(24)
        .map(|e| {
            (
                u16::from_le_bytes([e[16], e[17]]),
                u16::from_le_bytes([e[18], e[19]]),
                i32::from_le_bytes([e[20], e[21], e[22], e[23]]),
            )
        })
        .collect()
}

/// The events of `/tmp/<file>` once at least `want` non-SYN, non-repeat
/// events are in (soft autorepeat may add value-2 key events).
fn guest_events(sb: &Started<'_>, file: &str, want: usize) -> Vec<(u16, u16, i32)> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let out = sh(sb, &format!("od -An -v -tu1 /tmp/{file}"));
        let got: Vec<_> = events(&out.stdout)
            .into_iter()
            .filter(|&(t, _, v)| t != 0 && !(t == EV_KEY && v == 2))
            .collect();
        if got.len() >= want || Instant::now() > deadline {
            return got;
        }
        std::thread::sleep(Duration::from_millis(300));
    }
}

#[test]
fn the_guests_framebuffer_reaches_the_lease_and_the_screenshot_and_input_lines_reach_the_guest() {
    let name = "the_guests_framebuffer_reaches_the_lease_and_the_screenshot_and_input_lines_reach_the_guest";
    if !can_boot(name) {
        return;
    }
    let env = kvm_env();
    let sb = env.start(
        "gpu1",
        &["--backend", "kvm", "--display", &format!("{W}x{H}")],
    );
    assert_eq!(env.info("gpu1")["display"], format!("{W}x{H}"));
    let geometry = sh(
        &sb,
        "cat /sys/class/graphics/fb0/virtual_size /sys/class/graphics/fb0/stride; \
         echo 0 > /sys/class/graphics/fbcon/cursor_blink",
    );
    assert_eq!(
        geometry.stdout,
        format!("{W},{H}\n{}\n", W * 4),
        "{geometry}"
    );

    // The pattern, written by the guest to /dev/fb0, in a present's slot.
    let pat = pattern();
    let src = env.root().join("pattern");
    std::fs::write(&src, &pat).unwrap();
    let cp = env.run(["cp", src.to_str().unwrap(), "gpu1:/tmp/pattern"]);
    assert_eq!(cp.code(), 0, "{cp}");
    let mut l = lease(&env, "gpu1");
    assert_eq!(l.size(), (W, H));
    sh(&sb, "dd if=/tmp/pattern of=/dev/fb0 bs=4096 2>/dev/null");
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut seen = 0;
    loop {
        assert!(
            Instant::now() < deadline,
            "no present showed the pattern ({seen} presents)"
        );
        match l.next(Some(Duration::from_secs(1))).unwrap() {
            Some(Record::Present { slot, .. }) => {
                seen += 1;
                let rows: Vec<u8> = l.rows(slot).unwrap().flatten().copied().collect();
                if rows == pat {
                    break;
                }
            }
            Some(Record::End(why)) => panic!("the lease ended: {why}"),
            _ => {}
        }
    }
    println!("{name}: the pattern after {seen} presents");

    // `boxdesk screenshot`: the same pixels as RGB.
    let png_path = env.root().join("shot.png");
    let shot = env.run(["screenshot", "gpu1", png_path.to_str().unwrap()]);
    assert_eq!(shot.code(), 0, "{shot}");
    let bytes = std::fs::read(&png_path).unwrap();
    let mut reader = png::Decoder::new(std::io::Cursor::new(&bytes[..]))
        .read_info()
        .unwrap();
    let mut rgb = vec![0; reader.output_buffer_size().unwrap()];
    let info = reader.next_frame(&mut rgb).unwrap();
    assert_eq!((info.width, info.height), (W, H));
    let want: Vec<u8> = pat
        .chunks_exact(4)
        .flat_map(|p| [p[2], p[1], p[0]])
        .collect();
    assert!(
        rgb[..info.buffer_size()] == want[..],
        "the screenshot differs from the pattern"
    );
    // The screenshot's lease replaced ours (after what was pending).
    loop {
        match l.next(Some(Duration::from_secs(5))).unwrap() {
            Some(Record::End(why)) => break assert_eq!(why, "replaced"),
            Some(_) => continue,
            None => panic!("the older lease did not end"),
        }
    }

    // Input: the keyboard's and the tablet's event devices, read by
    // background readers in their own sessions (an exec's session is swept
    // at its end).
    let devices = sh(
        &sb,
        "for d in /sys/class/input/event*; do echo ${d##*/} $(cat $d/device/name); done",
    );
    let dev = |want: &str| {
        devices
            .stdout
            .lines()
            .find(|l| l.ends_with(want))
            .and_then(|l| l.split_whitespace().next())
            .unwrap_or_else(|| panic!("no {want}: {devices}"))
            .to_owned()
    };
    let (kbd, tablet) = (dev("boxdesk keyboard"), dev("boxdesk tablet"));
    sh(
        &sb,
        &format!(
            "for d in {kbd} {tablet}; do setsid sh -c \"exec dd if=/dev/input/$d of=/tmp/$d bs=24 2>/dev/null\" \
             </dev/null >/dev/null 2>&1 & done; sleep 1"
        ),
    );
    let mut input = ControlClient::connect(&env.sock("gpu1"), "gpu1")
        .unwrap()
        .input()
        .unwrap();
    input.send(InputDevice::Keyboard, EV_KEY, 30, 1).unwrap();
    input.send(InputDevice::Keyboard, EV_KEY, 30, 0).unwrap();
    input.send(InputDevice::Pointer, EV_ABS, 0, 100).unwrap();
    input.send(InputDevice::Pointer, EV_ABS, 1, 50).unwrap();
    // Garbage and refused events: `err`, and the stream goes on.
    input_stream_of(&env);
    input
        .send(InputDevice::Pointer, EV_ABS, 0, W as i32)
        .unwrap();
    input.send(InputDevice::Keyboard, EV_KEY, 42, 1).unwrap();
    let refusals = input.refusals_within(Duration::from_secs(2)).unwrap();
    assert_eq!(refusals.len(), 1, "{refusals:?}");
    assert!(refusals[0].contains("out of range"), "{refusals:?}");
    // Closed with KEY_LEFTSHIFT down: the guest sees it released.
    drop(input);
    let keys = guest_events(&sb, &kbd, 4);
    assert_eq!(
        keys,
        [
            (EV_KEY, 30, 1),
            (EV_KEY, 30, 0),
            (EV_KEY, 42, 1),
            (EV_KEY, 42, 0)
        ]
    );
    let ptr = guest_events(&sb, &tablet, 2);
    assert_eq!(ptr, [(EV_ABS, 0, 100), (EV_ABS, 1, 50)]);
    let all = events(&sh(&sb, &format!("od -An -v -tu1 /tmp/{tablet}")).stdout);
    assert_eq!(all[1], (0, 0, 0), "each event is followed by SYN_REPORT");

    // A holder that never reads while the guest presents in a loop: the VM,
    // its agent and its control socket still answer.
    let stuck = lease(&env, "gpu1");
    let presents = || -> u64 { env.info("gpu1")["presents"].parse().unwrap() };
    let before = presents();
    let t0 = Instant::now();
    let mut writes = 0;
    // The guest kernel's fbdev coalesces writes into fewer flushes: write
    // until 10,000 presents went to the holder that does not read.
    while presents() - before < 10_000 && writes < 300_000 {
        sh(
            &sb,
            "i=0; while [ $i -lt 10000 ]; do printf '\\377' > /dev/fb0; i=$((i+1)); done",
        );
        writes += 10_000;
    }
    let (n, loop_time) = (presents() - before, t0.elapsed());
    assert!(n >= 10_000, "{n} presents after {writes} writes");
    assert_eq!(sb.sh("echo alive").stdout, "alive\n");
    drop(stuck);
    let mut fresh = lease(&env, "gpu1");
    let Some(Record::Present { seq, .. }) = fresh.next(Some(Duration::from_secs(10))).unwrap()
    else {
        panic!("a new lease starts with the newest frame");
    };
    println!("{name}: {n} presents from {writes} writes to /dev/fb0 in {loop_time:?} to a holder that never read; the next lease starts at present {seq}");
    assert!(seq >= before + n);
}

/// A raw `input` connection sending garbage: `err` back, nothing sent.
fn input_stream_of(env: &TestEnv) {
    use std::io::{BufRead, Write};
    let mut s = env.control("gpu1");
    s.write_all(b"input\nnot an event\n").unwrap();
    let mut r = std::io::BufReader::new(s);
    let mut line = String::new();
    r.read_line(&mut line).unwrap();
    assert_eq!(line, "ok\n");
    line.clear();
    r.read_line(&mut line).unwrap();
    assert!(line.starts_with("err bad input line"), "{line}");
}
