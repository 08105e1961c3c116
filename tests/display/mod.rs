//! The display's client side, end to end: `boxdesk screenshot` and
//! `boxdesk view` against a real [`Screen`] served by the real control
//! server (`control::server::serve`) on `$XDG_RUNTIME_DIR/boxdesk/NAME.sock`,
//! where the CLI finds a sandbox by name. No VM: the test presents a known
//! pattern itself, and records the input events the helper accepts.

use std::fs;
use std::os::unix::fs::DirBuilderExt;
use std::os::unix::net::UnixListener;
use std::sync::Arc;
use std::time::{Duration, Instant};

use boxdesk_platform::screen::{InputEvent, Rect, Screen};
use boxdesk_sandbox::control::testing::Desk;
use boxdesk_sandbox::control::{server, Controlled};

use crate::support::TestEnv;

mod view;

/// The pattern's size.
const W: u32 = 320;
const H: u32 = 200;

/// The quadrants' colours, 0xRRGGBB: top left, top right, bottom left,
/// bottom right.
const QUADRANTS: [u32; 4] = [0xff0000, 0x00ff00, 0x0000ff, 0xffff00];

/// What the tests do with a [`Desk`].
trait Serve {
    /// Serves this desk as sandbox `name` of `env`, for the rest of the
    /// test process.
    fn serve(self: &Arc<Self>, env: &TestEnv, name: &str);
    /// Whether the sink got `event` within `limit`.
    fn got_within(&self, event: InputEvent, limit: Duration) -> bool;
}

impl Serve for Desk {
    fn serve(self: &Arc<Self>, env: &TestEnv, name: &str) {
        let dir = env.runtime();
        if !dir.exists() {
            fs::DirBuilder::new().mode(0o700).create(&dir).unwrap();
        }
        let listener = UnixListener::bind(env.sock(name)).unwrap();
        let desk: Arc<dyn Controlled> = Arc::clone(self) as _;
        std::thread::spawn(move || server::serve(listener, desk));
    }

    fn got_within(&self, event: InputEvent, limit: Duration) -> bool {
        let start = Instant::now();
        while start.elapsed() < limit {
            if self.events.lock().unwrap().contains(&event) {
                return true;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        false
    }
}

/// The pattern at `w` x `h`, as 0xRRGGBB per pixel: four solid quadrants,
/// and row 0 a gradient that differs in every channel from pixel to pixel.
fn pattern(w: u32, h: u32) -> Vec<u32> {
    let mut px = Vec::with_capacity((w * h) as usize);
    for y in 0..h {
        for x in 0..w {
            px.push(if y == 0 {
                let v = x * 255 / (w - 1);
                v << 16 | (255 - v) << 8 | ((x * 7) & 0xff)
            } else {
                QUADRANTS[usize::from(y >= h / 2) * 2 + usize::from(x >= w / 2)]
            });
        }
    }
    px
}

/// `pixels` as XRGB8888 bytes, the X byte set to garbage a reader must
/// ignore.
fn xrgb(pixels: &[u32]) -> Vec<u8> {
    pixels
        .iter()
        .flat_map(|p| (p | 0xab00_0000).to_le_bytes())
        .collect()
}

/// A screen of `W` x `H` showing the pattern at `w` x `h`.
fn screen_showing(w: u32, h: u32) -> Screen {
    let screen = Screen::new(W, H).unwrap();
    let frame = xrgb(&pattern(w, h));
    let seq = screen.present(&frame, (w * 4) as usize, w, h, Rect::whole(w, h));
    assert_eq!(seq, Some(1));
    screen
}

/// Decodes a PNG: width, height and 0xRRGGBB pixels (it must be 8-bit RGB).
fn decode_png(bytes: &[u8]) -> (u32, u32, Vec<u32>) {
    let decoder = png::Decoder::new(std::io::Cursor::new(bytes));
    let mut reader = decoder.read_info().expect("a PNG");
    let mut buf = vec![0; reader.output_buffer_size().unwrap()];
    let info = reader.next_frame(&mut buf).unwrap();
    assert_eq!(info.color_type, png::ColorType::Rgb);
    assert_eq!(info.bit_depth, png::BitDepth::Eight);
    let px = buf[..info.buffer_size()]
        .chunks_exact(3)
        .map(|c| u32::from(c[0]) << 16 | u32::from(c[1]) << 8 | u32::from(c[2]))
        .collect();
    (info.width, info.height, px)
}

#[test]
fn a_screenshot_is_the_presented_frame_pixel_for_pixel_in_a_file_or_on_stdout() {
    let env = TestEnv::new();
    Desk::new(Some(screen_showing(W, H))).serve(&env, "shot");
    let out = env.root().join("shot.png");
    let r = env.run(["screenshot".as_ref(), "shot".as_ref(), out.as_os_str()]);
    assert_eq!(r.code(), 0, "{r}");
    let (w, h, px) = decode_png(&fs::read(&out).unwrap());
    assert_eq!((w, h), (W, H));
    assert!(
        px == pattern(W, H),
        "the PNG's pixels differ from the frame"
    );
    let left: Vec<_> = fs::read_dir(env.root())
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .filter(|n| n.to_string_lossy().contains(".tmp"))
        .collect();
    assert!(left.is_empty(), "temporary files left: {left:?}");

    let stdout = env.cmd(["screenshot", "shot", "-"]).output().unwrap();
    assert!(stdout.status.success(), "{stdout:?}");
    assert_eq!(decode_png(&stdout.stdout), (W, H, pattern(W, H)));
}

#[test]
fn a_screenshot_is_taken_at_the_current_mode_not_the_largest() {
    let env = TestEnv::new();
    Desk::new(Some(screen_showing(160, 100))).serve(&env, "small");
    let out = env.root().join("small.png");
    let r = env.run(["screenshot".as_ref(), "small".as_ref(), out.as_os_str()]);
    assert_eq!(r.code(), 0, "{r}");
    assert_eq!(
        decode_png(&fs::read(&out).unwrap()),
        (160, 100, pattern(160, 100))
    );
}

#[test]
fn a_screen_that_never_drew_fails_the_screenshot_after_its_timeout_and_writes_nothing() {
    let env = TestEnv::new();
    Desk::new(Some(Screen::new(64, 64).unwrap())).serve(&env, "blank");
    let out = env.root().join("blank.png");
    let start = Instant::now();
    let r = env.run([
        "screenshot".as_ref(),
        "blank".as_ref(),
        out.as_os_str(),
        "--timeout".as_ref(),
        "1".as_ref(),
    ]);
    assert!(start.elapsed() >= Duration::from_secs(1), "{r}");
    assert_eq!(r.code(), 125, "{r}");
    assert_eq!(
        r.stderr, "boxdesk: blank has not drawn a frame within 1 s\n",
        "{r}"
    );
    assert!(!out.exists());
}

#[test]
fn a_sandbox_without_a_display_says_so_and_how_to_start_one() {
    let env = TestEnv::new();
    Desk::new(None).serve(&env, "headless");
    let out = env.root().join("headless.png");
    let r = env.run(["screenshot".as_ref(), "headless".as_ref(), out.as_os_str()]);
    assert_eq!(r.code(), 125, "{r}");
    assert_eq!(
        r.stderr, "boxdesk: headless has no display (start it with `boxdesk run --display`)\n",
        "{r}"
    );
    assert!(!out.exists());
}
