//! `boxdesk view` under Xvfb: the window shows the presented pattern, and
//! a key typed into it reaches the sandbox's input sink. The screen is
//! read back with `xwd` (parsed here), the window found and typed into
//! with `xdotool`. Without Xvfb, xwd or xdotool (scripts/setup.sh installs
//! them) the test says `skipped: Xvfb not available`.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use boxdesk_platform::screen::{InputDevice, InputEvent, EV_KEY};

use super::{screen_showing, Desk, Serve, H, QUADRANTS, W};
use crate::support::TestEnv;

/// How long the window may take to show the pattern.
const SHOW_WITHIN: Duration = Duration::from_secs(20);

/// Whether `tool` runs at all.
fn have(tool: &str, arg: &str) -> bool {
    Command::new(tool)
        .arg(arg)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok()
}

/// A child killed (and reaped) on drop.
struct Reaped(Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// An Xvfb server on a display number it picked itself (`-displayfd`).
struct Xvfb {
    _server: Reaped,
    display: String,
}

impl Xvfb {
    fn start() -> Xvfb {
        let mut child = Command::new("Xvfb")
            .args([
                "-displayfd",
                "1",
                "-screen",
                "0",
                "1024x768x24",
                "-nolisten",
                "tcp",
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("start Xvfb");
        let stdout = child.stdout.take().unwrap();
        let server = Reaped(child);
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            let _ = BufReader::new(stdout).read_line(&mut line);
            let _ = tx.send(line);
        });
        let n = rx
            .recv_timeout(Duration::from_secs(20))
            .expect("Xvfb did not say its display number within 20 s");
        let n: u32 = n
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("Xvfb said {n:?}"));
        Xvfb {
            _server: server,
            display: format!(":{n}"),
        }
    }

    /// `TOOL ARGS` on this display: its stdout when it succeeded.
    fn run(&self, tool: &str, args: &[&str]) -> Option<Vec<u8>> {
        let out = Command::new(tool)
            .args(args)
            .env("DISPLAY", &self.display)
            .stdin(Stdio::null())
            .stderr(Stdio::null())
            .output()
            .ok()?;
        out.status.success().then_some(out.stdout)
    }

    /// `xdotool ARGS`, its output as text.
    fn xdotool(&self, args: &[&str]) -> Option<String> {
        let out = self.run("xdotool", args)?;
        Some(String::from_utf8_lossy(&out).into_owned())
    }
}

/// An X window dump (`xwd`), decoded to 0xRRGGBB pixels.
#[derive(Debug)]
struct Dump {
    width: u32,
    height: u32,
    pixels: Vec<u32>,
}

impl Dump {
    fn at(&self, x: u32, y: u32) -> Option<u32> {
        (x < self.width && y < self.height).then(|| self.pixels[(y * self.width + x) as usize])
    }
}

/// Parses an XWD file (X11's `XWDFileHeader`: 25 big-endian `CARD32`s,
/// the window name up to `header_size`, `ncolors` 12-byte colour entries,
/// then `height` rows of `bytes_per_line`) of a TrueColor ZPixmap of 24 or
/// 32 bits per pixel.
fn parse_xwd(b: &[u8]) -> Result<Dump, String> {
    let field = |i: usize| -> Result<u32, String> {
        b.get(i * 4..i * 4 + 4)
            .map(|w| u32::from_be_bytes([w[0], w[1], w[2], w[3]]))
            .ok_or_else(|| "short header".to_owned())
    };
    let header_size = field(0)? as usize;
    if field(1)? != 7 {
        return Err(format!("XWD version {}, expected 7", field(1)?));
    }
    if field(2)? != 2 {
        return Err(format!("pixmap format {}, expected ZPixmap (2)", field(2)?));
    }
    let (width, height) = (field(4)?, field(5)?);
    let byte_order = field(7)?; // 0: LSBFirst, 1: MSBFirst
    let bits_per_pixel = field(11)?;
    let bytes_per_line = field(12)? as usize;
    let masks = [field(14)?, field(15)?, field(16)?];
    let ncolors = field(19)? as usize;
    if bits_per_pixel != 32 && bits_per_pixel != 24 {
        return Err(format!("{bits_per_pixel} bits per pixel"));
    }
    let bpp = bits_per_pixel as usize / 8;
    let start = header_size + ncolors * 12;
    let need = start + bytes_per_line * height as usize;
    if b.len() < need || bytes_per_line < width as usize * bpp {
        return Err(format!("{} bytes, the header claims {need}", b.len()));
    }
    let channel = |v: u32, mask: u32| -> u32 {
        if mask == 0 {
            return 0;
        }
        let c = (v & mask) >> mask.trailing_zeros();
        let bits = mask.count_ones();
        if bits >= 8 {
            c >> (bits - 8)
        } else {
            c << (8 - bits)
        }
    };
    let mut pixels = Vec::with_capacity(width as usize * height as usize);
    for y in 0..height as usize {
        let row = &b[start + y * bytes_per_line..][..width as usize * bpp];
        for p in row.chunks_exact(bpp) {
            let v = if byte_order == 0 {
                p.iter().rev().fold(0u32, |a, &x| a << 8 | u32::from(x))
            } else {
                p.iter().fold(0u32, |a, &x| a << 8 | u32::from(x))
            };
            let [r, g, bl] = masks.map(|m| channel(v, m));
            pixels.push(r << 16 | g << 8 | bl);
        }
    }
    Ok(Dump {
        width,
        height,
        pixels,
    })
}

#[test]
fn an_xwd_dump_of_either_byte_order_parses_to_its_pixels() {
    let dump = |order: u32, px: [u8; 8]| {
        let mut f = [0u32; 25];
        f[0] = 100 + 4; // header and a 4-byte window name
        f[1] = 7;
        f[2] = 2;
        f[3] = 24;
        (f[4], f[5]) = (2, 1);
        f[7] = order;
        f[11] = 32;
        f[12] = 8;
        (f[14], f[15], f[16]) = (0xff0000, 0x00ff00, 0x0000ff);
        f[19] = 1;
        let mut b: Vec<u8> = f.iter().flat_map(|v| v.to_be_bytes()).collect();
        b.extend_from_slice(b"win\0");
        b.extend_from_slice(&[0; 12]);
        b.extend_from_slice(&px);
        b
    };
    let lsb = parse_xwd(&dump(0, [0x33, 0x22, 0x11, 0, 0xff, 0, 0, 0])).unwrap();
    assert_eq!((lsb.width, lsb.height), (2, 1));
    assert_eq!(lsb.pixels, [0x112233, 0x0000ff]);
    let msb = parse_xwd(&dump(1, [0, 0x11, 0x22, 0x33, 0, 0xff, 0, 0])).unwrap();
    assert_eq!(msb.pixels, [0x112233, 0xff0000]);
    assert!(parse_xwd(&dump(0, [0; 8])[..120]).is_err());
}

/// Where `(fx, fy)`, a fraction of the way across the window `(x, y, w,
/// h)`, is on the screen.
fn inside(geometry: (u32, u32, u32, u32), fx: f64, fy: f64) -> (u32, u32) {
    let (x, y, w, h) = geometry;
    (
        x + (f64::from(w) * fx) as u32,
        y + (f64::from(h) * fy) as u32,
    )
}

/// `X=…` `Y=…` `WIDTH=…` `HEIGHT=…` of `xdotool getwindowgeometry --shell`.
fn geometry(shell: &str) -> Option<(u32, u32, u32, u32)> {
    let get = |key: &str| {
        shell
            .lines()
            .find_map(|l| l.strip_prefix(key)?.strip_prefix('='))
            .and_then(|v| v.trim().parse().ok())
    };
    Some((get("X")?, get("Y")?, get("WIDTH")?, get("HEIGHT")?))
}

#[test]
fn the_viewer_shows_the_display_sends_a_key_typed_there_and_closes_when_its_lease_is_taken() {
    if !(have("Xvfb", "-help") && have("xwd", "-help") && have("xdotool", "version")) {
        println!(
            "skipped: Xvfb not available (with xwd and xdotool; scripts/setup.sh installs them)"
        );
        return;
    }
    let env = TestEnv::new();
    let desk = Desk::new(Some(screen_showing(W, H)));
    desk.serve(&env, "win");
    let x = Xvfb::start();
    let log = env.root().join("view.log");
    let mut cmd = env.cmd(["view", "win"]);
    cmd.env("DISPLAY", &x.display)
        .env_remove("WAYLAND_DISPLAY")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap());
    let mut viewer = Reaped(cmd.spawn().expect("start boxdesk view"));
    let log_text = || std::fs::read_to_string(&log).unwrap_or_default();

    // The window, found by its title, shows the four quadrants.
    let start = Instant::now();
    let mut seen = String::from("no window yet");
    let window = loop {
        if let Some(status) = viewer.0.try_wait().unwrap() {
            panic!("boxdesk view exited ({status}):\n{}", log_text());
        }
        assert!(
            start.elapsed() < SHOW_WITHIN,
            "the window did not show the pattern within {SHOW_WITHIN:?}: {seen}\n{}",
            log_text()
        );
        std::thread::sleep(Duration::from_millis(200));
        let Some(ids) = x.xdotool(&["search", "--name", "^boxdesk: win$"]) else {
            continue;
        };
        let Some(id) = ids.split_whitespace().next().map(str::to_owned) else {
            continue;
        };
        let Some(geo) = x
            .xdotool(&["getwindowgeometry", "--shell", &id])
            .and_then(|s| geometry(&s))
        else {
            continue;
        };
        let Some(dump) = x.run("xwd", &["-root", "-silent"]) else {
            continue;
        };
        let dump = parse_xwd(&dump).unwrap();
        let got: Vec<Option<u32>> = [(0.25, 0.25), (0.75, 0.25), (0.25, 0.75), (0.75, 0.75)]
            .iter()
            .map(|&(fx, fy)| {
                let (px, py) = inside(geo, fx, fy);
                dump.at(px, py)
            })
            .collect();
        if got == QUADRANTS.map(Some) {
            assert_eq!((geo.2, geo.3), (W, H), "the window is the display's size");
            break id;
        }
        seen = format!("window {id} at {geo:?} shows {got:06x?}");
    };

    // A key typed into the focused window is pressed and released in the
    // sandbox, as KEY_A.
    x.xdotool(&["windowfocus", "--sync", &window])
        .expect("xdotool windowfocus");
    x.xdotool(&["key", "a"]).expect("xdotool key");
    let key = |value| InputEvent {
        device: InputDevice::Keyboard,
        kind: EV_KEY,
        code: 30,
        value,
    };
    for value in [1, 0] {
        assert!(
            desk.got_within(key(value), Duration::from_secs(10)),
            "no KEY_A {value}: got {:?}\n{}",
            desk.events.lock().unwrap(),
            log_text()
        );
    }
    let events = desk.events.lock().unwrap().clone();
    let press = events.iter().position(|e| *e == key(1)).unwrap();
    let release = events.iter().position(|e| *e == key(0)).unwrap();
    assert!(press < release, "{events:?}");

    // A screenshot takes the lease: the window closes, saying why.
    let shot = env.cmd(["screenshot", "win", "-"]).output().unwrap();
    assert!(shot.status.success(), "{shot:?}");
    let start = Instant::now();
    let status = loop {
        if let Some(status) = viewer.0.try_wait().unwrap() {
            break status;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "the viewer outlived its lease:\n{}",
            log_text()
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "{status}\n{}", log_text());
    assert!(
        log_text().contains("another client took over the display of win"),
        "{}",
        log_text()
    );
}
