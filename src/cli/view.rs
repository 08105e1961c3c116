//! `boxdesk view NAME`: a window showing a sandbox's display live, and
//! sending it the keyboard and pointer.
//!
//! This module owns the window: an X11 client on x11rb's pure-Rust
//! connection (no libX11 or libxcb, nothing loaded at run time, so it
//! works in the static release binaries), on an X server or, on a Wayland
//! desktop, through XWayland. The lease's XRGB8888 rows are a depth-24
//! ZPixmap of 32 bits per pixel on a little-endian server, sent as they
//! are (converted for any other pixmap format), scaled nearest-neighbour
//! when the window's size differs from the mode, in `PutImage` bands that
//! fit the server's request limit, and only the changed rows on a
//! present. It owns the thread that reads the lease's records and wakes
//! the event loop with the newest frame (a ClientMessage to the window),
//! and the translation of X events into `input` lines: key codes through
//! [`evdev_key`] (the X keycode less 8, as in the evdev keymap of every
//! Xorg, Xwayland and Xvfb server; X's auto-repeat dropped, the guest
//! repeats held keys itself), the pointer into `ptr abs` in display
//! pixels, buttons 1–3 into `BTN_LEFT`/`MIDDLE`/`RIGHT`, buttons 4 and 5
//! into `REL_WHEEL` steps. Losing focus closes the input connection (the
//! helper releases whatever it left down) and the next event opens a new
//! one. It must never block the event loop on the lease, and never leave
//! a key down in the guest after the window lost focus or closed.
//!
//! Only on Linux: elsewhere (XQuartz's keycodes are not evdev's) `boxdesk
//! view` says it is not available yet.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use boxdesk_platform::screen::{
    InputDevice, Record, ABS_X, ABS_Y, BTN_LEFT, BTN_MIDDLE, BTN_RIGHT, EV_ABS, EV_KEY, EV_REL,
    REL_WHEEL,
};
use boxdesk_sandbox::control::client::{DisplayLease, InputClient};
use boxdesk_sandbox::control::{ClientError, ControlClient};
use x11rb::connection::{Connection as _, RequestConnection as _};
use x11rb::protocol::xproto::{
    AtomEnum, ClientMessageEvent, ColormapAlloc, ConnectionExt as _, CreateGCAux, CreateWindowAux,
    EventMask, ImageFormat, ImageOrder, KeyPressEvent, KeyReleaseEvent, PropMode, Screen, Setup,
    VisualClass, Visualid, WindowClass,
};
use x11rb::protocol::Event;
use x11rb::rust_connection::RustConnection;
use x11rb::wrapper::ConnectionExt as _;

/// How long after a failed connect the input connection is not retried.
const RETRY_AFTER: Duration = Duration::from_secs(1);

/// The most bytes one `PutImage` carries even where the server takes
/// more: a band this size keeps the copy small and lets the lease
/// thread's wake-ups in between.
const BAND_BYTES: usize = 4 << 20;

/// The bytes of a `PutImage` request before its data.
const PUT_IMAGE_HEADER: usize = 24;

x11rb::atom_manager! {
    /// The atoms the window uses.
    Atoms: AtomsCookie {
        WM_PROTOCOLS,
        WM_DELETE_WINDOW,
        _NET_WM_NAME,
        UTF8_STRING,
        _BOXDESK_WAKE,
    }
}

/// One frame, ready for the window: `width * height` 0RGB pixels.
struct Frame {
    width: u32,
    height: u32,
    pixels: Vec<u32>,
}

/// A band of rows, `start..end`.
type Rows = (u32, u32);

/// What the lease thread hands the event loop: the newest frame (older
/// ones it replaced were never drawn), the display rows changed since
/// the event loop last looked, and, once, why the lease ended.
#[derive(Default)]
struct Mailbox {
    frame: Option<Frame>,
    changed: Option<Rows>,
    ended: Option<Ended>,
    /// A wake-up is on its way and the event loop has not looked yet.
    woken: bool,
}

/// How the lease ended.
enum Ended {
    /// `end WHY`: the sandbox stopped, or another lease replaced this one.
    End(&'static str),
    /// The connection broke or the helper broke the protocol.
    Lost(ClientError),
}

/// `boxdesk view NAME`.
pub fn view(name: &str) -> anyhow::Result<i32> {
    if cfg!(not(target_os = "linux")) {
        anyhow::bail!("boxdesk view is not available on this host yet");
    }
    let (_, paths) = super::sandbox_paths(name)?;
    let client = match ControlClient::connect(&paths.sock, name) {
        Ok(c) => c,
        Err(e) => return Err(super::ls::not_running(name, e)),
    };
    // The X server first: a viewer without a window must not take the
    // display from one that has.
    let (conn, screen) = connect_x()?;
    let lease = client.display()?;
    let size = lease.size();
    let window = Window::open(conn, screen, name, size)?;
    let mailbox = Arc::new(Mutex::new(Mailbox::default()));
    {
        let mailbox = Arc::clone(&mailbox);
        let waker = window.waker();
        std::thread::Builder::new()
            .name("lease".into())
            .spawn(move || read_lease(lease, &mailbox, &waker))
            .context("cannot start the display thread")?;
    }
    let mut viewer = Viewer {
        name: name.to_owned(),
        sock: paths.sock,
        mailbox,
        size,
        window,
        frame: None,
        dirty: None,
        held: None,
        input: None,
        retry_at: None,
        pointer: None,
        ended: None,
    };
    let ran = viewer.run();
    viewer.release_all();
    viewer.window.close();
    ran?;
    match viewer.ended {
        Some(Ended::End("stopped")) => eprintln!("boxdesk: {name} stopped"),
        Some(Ended::End("replaced")) => {
            eprintln!("boxdesk: another client took over the display of {name}")
        }
        Some(Ended::End(why)) => eprintln!("boxdesk: the display of {name} ended ({why})"),
        Some(Ended::Lost(e)) => {
            return Err(anyhow::Error::new(e).context(format!("lost the display of {name}")))
        }
        None => {}
    }
    Ok(0)
}

/// Connects to the X server `DISPLAY` names: the connection and its
/// screen's number.
fn connect_x() -> anyhow::Result<(Arc<RustConnection>, usize)> {
    let display = std::env::var("DISPLAY").unwrap_or_default();
    if display.is_empty() {
        anyhow::bail!("boxdesk view needs an X11 display (DISPLAY; on Wayland, XWayland)");
    }
    let (conn, screen) = RustConnection::connect(Some(&display))
        .with_context(|| format!("cannot connect to the X display {display}"))?;
    // Ask for BIG-REQUESTS now, so the first frame goes in one request.
    conn.prefetch_maximum_request_bytes();
    Ok((Arc::new(conn), screen))
}

/// The lease thread: copies each presented frame into the mailbox and
/// wakes the event loop, until the lease ends or the window is gone.
fn read_lease(mut lease: DisplayLease, mailbox: &Mutex<Mailbox>, waker: &Waker) {
    let mut last_size = None;
    loop {
        let record = lease.next(None);
        let mut m = mailbox.lock().unwrap_or_else(|p| p.into_inner());
        match record {
            Ok(Some(Record::Present { slot, rect, .. })) => {
                let (width, height) = lease.size();
                let Some(rows) = lease.rows(slot) else {
                    continue;
                };
                let mut pixels = Vec::with_capacity(width as usize * height as usize);
                for row in rows {
                    pixels.extend(
                        row.chunks_exact(4)
                            .map(|p| u32::from_le_bytes([p[0], p[1], p[2], 0])),
                    );
                }
                // After a mode change every row is new to the window.
                let changed = if last_size == Some((width, height)) {
                    let top = rect.y.min(height);
                    (top, rect.y.saturating_add(rect.h).clamp(top, height))
                } else {
                    (0, height)
                };
                last_size = Some((width, height));
                m.changed = Some(union(m.changed, changed));
                m.frame = Some(Frame {
                    width,
                    height,
                    pixels,
                });
            }
            Ok(Some(Record::Mode { .. }) | None) => continue,
            Ok(Some(Record::End(why))) => m.ended = Some(Ended::End(why)),
            Err(e) => m.ended = Some(Ended::Lost(e)),
        }
        let over = m.ended.is_some();
        let wake = !std::mem::replace(&mut m.woken, true);
        drop(m);
        if (wake && !waker.wake()) || over {
            return;
        }
    }
}

/// Wakes the event loop from another thread: a ClientMessage to the
/// window, over the window's own connection.
struct Waker {
    conn: Arc<RustConnection>,
    window: u32,
    atom: u32,
}

impl Waker {
    /// Whether the wake-up went out (not when the X connection broke).
    fn wake(&self) -> bool {
        let event = ClientMessageEvent::new(32, self.window, self.atom, [0u32; 5]);
        // With no event mask the server sends it to the window's creator.
        self.conn
            .send_event(false, self.window, EventMask::NO_EVENT, event)
            .is_ok()
            && self.conn.flush().is_ok()
    }
}

/// How a depth-24 image is laid out in the server's ZPixmap format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct PixelFormat {
    /// Bytes per pixel: 4, or 3 on servers that pack 24-bit pixels.
    bytes: usize,
    /// Whether the server wants the most significant byte first.
    msb_first: bool,
    /// Each row is padded to a multiple of this many bytes.
    pad: usize,
}

impl PixelFormat {
    /// The server's ZPixmap format for depth 24.
    fn of(setup: &Setup) -> anyhow::Result<PixelFormat> {
        let format = setup
            .pixmap_formats
            .iter()
            .find(|f| f.depth == 24)
            .context("the X server has no depth-24 pixmap format")?;
        let bytes = match format.bits_per_pixel {
            32 => 4,
            24 => 3,
            n => anyhow::bail!("the X server's depth-24 pixels are {n} bits, not 24 or 32"),
        };
        Ok(PixelFormat {
            bytes,
            msb_first: setup.image_byte_order == ImageOrder::MSB_FIRST,
            pad: usize::from(format.scanline_pad / 8).max(1),
        })
    }

    /// The bytes of one row of `width` pixels, padding included.
    fn row_bytes(self, width: usize) -> usize {
        (width * self.bytes).div_ceil(self.pad) * self.pad
    }

    /// Appends `row`, 0RGB pixels, in this format.
    fn encode(self, row: &[u32], out: &mut Vec<u8>) {
        let start = out.len();
        match (self.bytes, self.msb_first) {
            // XRGB8888 is what a little-endian server takes as it is.
            (4, false) => out.extend(row.iter().flat_map(|p| p.to_le_bytes())),
            (4, true) => out.extend(row.iter().flat_map(|p| p.to_be_bytes())),
            (_, false) => out.extend(row.iter().flat_map(|p| {
                let [b, g, r, _] = p.to_le_bytes();
                [b, g, r]
            })),
            (_, true) => out.extend(row.iter().flat_map(|p| {
                let [_, r, g, b] = p.to_be_bytes();
                [r, g, b]
            })),
        }
        out.resize(start + self.row_bytes(row.len()), 0);
    }
}

/// A depth-24 TrueColor visual with 8-bit red, green and blue where
/// XRGB8888 puts them, the root's when it is one.
fn rgb_visual(screen: &Screen) -> Option<Visualid> {
    let mut visuals = screen
        .allowed_depths
        .iter()
        .filter(|d| d.depth == 24)
        .flat_map(|d| &d.visuals)
        .filter(|v| {
            v.class == VisualClass::TRUE_COLOR
                && (v.red_mask, v.green_mask, v.blue_mask) == (0xff_0000, 0xff00, 0xff)
        })
        .map(|v| v.visual_id);
    let first = visuals.next()?;
    if first == screen.root_visual || visuals.any(|v| v == screen.root_visual) {
        Some(screen.root_visual)
    } else {
        Some(first)
    }
}

/// The X window and what drawing in it needs.
struct Window {
    conn: Arc<RustConnection>,
    id: u32,
    gc: u32,
    atoms: Atoms,
    format: PixelFormat,
    /// Width and height, as the last ConfigureNotify said.
    size: (u16, u16),
}

impl Window {
    /// Opens `boxdesk: NAME`, `size` (the display's mode) large, on
    /// screen `screen`.
    fn open(
        conn: Arc<RustConnection>,
        screen: usize,
        name: &str,
        size: (u32, u32),
    ) -> anyhow::Result<Window> {
        let setup = conn.setup();
        let format = PixelFormat::of(setup)?;
        let screen = setup
            .roots
            .get(screen)
            .with_context(|| format!("the X server has no screen {screen}"))?;
        let visual = rgb_visual(screen)
            .context("the X server has no 24-bit TrueColor visual with 8-bit channels")?;
        let x = |e: x11rb::errors::ConnectionError| anyhow::anyhow!("cannot open a window: {e}");
        let atoms = Atoms::new(conn.as_ref())
            .map_err(x)?
            .reply()
            .context("cannot open a window")?;
        let clamp = |v: u32| u16::try_from(v.clamp(1, i16::MAX as u32)).unwrap_or(1);
        let size = (clamp(size.0), clamp(size.1));
        let id = conn.generate_id().context("cannot open a window")?;
        let mut aux = CreateWindowAux::new()
            .background_pixel(0)
            .border_pixel(0)
            .event_mask(
                EventMask::EXPOSURE
                    | EventMask::STRUCTURE_NOTIFY
                    | EventMask::KEY_PRESS
                    | EventMask::KEY_RELEASE
                    | EventMask::BUTTON_PRESS
                    | EventMask::BUTTON_RELEASE
                    | EventMask::POINTER_MOTION
                    | EventMask::FOCUS_CHANGE,
            );
        // Another visual than the root's needs a colormap of its own.
        if visual != screen.root_visual {
            let colormap = conn.generate_id().context("cannot open a window")?;
            conn.create_colormap(ColormapAlloc::NONE, colormap, screen.root, visual)
                .map_err(x)?;
            aux = aux.colormap(colormap);
        }
        conn.create_window(
            24,
            id,
            screen.root,
            0,
            0,
            size.0,
            size.1,
            0,
            WindowClass::INPUT_OUTPUT,
            visual,
            &aux,
        )
        .map_err(x)?;
        let title = format!("boxdesk: {name}");
        conn.change_property8(
            PropMode::REPLACE,
            id,
            AtomEnum::WM_NAME,
            AtomEnum::STRING,
            title.as_bytes(),
        )
        .map_err(x)?;
        conn.change_property8(
            PropMode::REPLACE,
            id,
            atoms._NET_WM_NAME,
            atoms.UTF8_STRING,
            title.as_bytes(),
        )
        .map_err(x)?;
        conn.change_property8(
            PropMode::REPLACE,
            id,
            AtomEnum::WM_CLASS,
            AtomEnum::STRING,
            b"boxdesk\0boxdesk\0",
        )
        .map_err(x)?;
        conn.change_property32(
            PropMode::REPLACE,
            id,
            atoms.WM_PROTOCOLS,
            AtomEnum::ATOM,
            &[atoms.WM_DELETE_WINDOW],
        )
        .map_err(x)?;
        let gc = conn.generate_id().context("cannot open a window")?;
        conn.create_gc(gc, id, &CreateGCAux::new().graphics_exposures(0))
            .map_err(x)?;
        conn.map_window(id).map_err(x)?;
        conn.flush().map_err(x)?;
        Ok(Window {
            conn,
            id,
            gc,
            atoms,
            format,
            size,
        })
    }

    /// What the lease thread wakes this window's event loop with.
    fn waker(&self) -> Waker {
        Waker {
            conn: Arc::clone(&self.conn),
            window: self.id,
            atom: self.atoms._BOXDESK_WAKE,
        }
    }

    /// Draws window rows `rows` of `frame` scaled to the window, in bands
    /// no request exceeds the server's limit with.
    fn put(&self, frame: &Frame, rows: Rows) -> anyhow::Result<()> {
        let (w, h) = (u32::from(self.size.0), u32::from(self.size.1));
        let (top, end) = (rows.0.min(h), rows.1.min(h));
        if w == 0 || top >= end {
            return Ok(());
        }
        let row_bytes = self.format.row_bytes(w as usize);
        let room = self
            .conn
            .maximum_request_bytes()
            .min(BAND_BYTES)
            .saturating_sub(PUT_IMAGE_HEADER);
        // A row always fits: X windows are under 32768 pixels wide, so a
        // row is under 128 KiB and the core limit is 256 KiB.
        let band = u32::try_from(room / row_bytes).unwrap_or(u32::MAX).max(1);
        let x = |e: x11rb::errors::ConnectionError| anyhow::anyhow!("drawing the window: {e}");
        let mut pixels = Vec::new();
        let mut data = Vec::new();
        let mut y = top;
        while y < end {
            let n = band.min(end - y);
            pixels.clear();
            scale_rows(frame, w, h, (y, y + n), &mut pixels);
            data.clear();
            for row in pixels.chunks_exact(w as usize) {
                self.format.encode(row, &mut data);
            }
            let (Ok(dst_y), Ok(height)) = (i16::try_from(y), u16::try_from(n)) else {
                break;
            };
            self.conn
                .put_image(
                    ImageFormat::Z_PIXMAP,
                    self.id,
                    self.gc,
                    self.size.0,
                    height,
                    0,
                    dst_y,
                    0,
                    24,
                    &data,
                )
                .map_err(x)?;
            y += n;
        }
        Ok(())
    }

    /// Destroys the window, and with it what the lease thread still sends.
    fn close(&self) {
        let _ = self.conn.destroy_window(self.id);
        let _ = self.conn.flush();
    }
}

/// Whether the event loop goes on.
#[derive(Debug, PartialEq, Eq)]
enum Flow {
    Go,
    Close,
}

/// The window's event loop and what it sends.
struct Viewer {
    name: String,
    sock: PathBuf,
    mailbox: Arc<Mutex<Mailbox>>,
    /// The display's mode, for the pointer's scale before a frame came.
    size: (u32, u32),
    window: Window,
    frame: Option<Frame>,
    /// Window rows to draw once the queued events are handled.
    dirty: Option<Rows>,
    /// An event read ahead (after a key release) and not handled yet.
    held: Option<Event>,
    /// The `input` connection, opened at the first event after focus.
    input: Option<InputClient>,
    /// No connect attempt before this, after one failed.
    retry_at: Option<Instant>,
    /// The last pointer position sent, in display pixels.
    pointer: Option<(i32, i32)>,
    ended: Option<Ended>,
}

impl Viewer {
    /// Handles events until the window closes or the lease ends; draws
    /// whenever the queue runs dry.
    fn run(&mut self) -> anyhow::Result<()> {
        let conn = Arc::clone(&self.window.conn);
        let lost = |e| anyhow::Error::new(e).context("lost the X display");
        loop {
            let event = match self.held.take() {
                Some(event) => event,
                None => match conn.poll_for_event().map_err(lost)? {
                    Some(event) => event,
                    None => {
                        if let (Some(rows), Some(frame)) = (self.dirty.take(), &self.frame) {
                            self.window.put(frame, rows)?;
                        }
                        conn.flush().map_err(lost)?;
                        conn.wait_for_event().map_err(lost)?
                    }
                },
            };
            if self.handle(event)? == Flow::Close {
                return Ok(());
            }
        }
    }

    fn handle(&mut self, event: Event) -> anyhow::Result<Flow> {
        let id = self.window.id;
        let atoms = self.window.atoms;
        match event {
            Event::Expose(e) if e.window == id => {
                let top = u32::from(e.y);
                self.redraw((top, top + u32::from(e.height)));
            }
            Event::ConfigureNotify(e)
                if e.window == id && (e.width, e.height) != self.window.size =>
            {
                self.window.size = (e.width, e.height);
                self.redraw((0, u32::from(e.height)));
            }
            Event::ClientMessage(e) if e.window == id => {
                if e.type_ == atoms._BOXDESK_WAKE {
                    return Ok(self.take_mail());
                }
                if e.type_ == atoms.WM_PROTOCOLS
                    && e.format == 32
                    && e.data.as_data32()[0] == atoms.WM_DELETE_WINDOW
                {
                    return Ok(Flow::Close);
                }
            }
            Event::DestroyNotify(e) if e.window == id => return Ok(Flow::Close),
            Event::FocusOut(_) => self.release_all(),
            Event::KeyPress(e) => self.key(&e, true),
            Event::KeyRelease(e) => {
                let next = self.window.conn.poll_for_event();
                let next = next.context("lost the X display")?;
                if auto_repeat(&e, next.as_ref()) {
                    return Ok(Flow::Go);
                }
                self.held = next;
                self.key(&e, false);
            }
            Event::MotionNotify(e) => self.pointer_moved(e.event_x, e.event_y),
            Event::ButtonPress(e) => {
                self.pointer_moved(e.event_x, e.event_y);
                match button(e.detail) {
                    Some(Button::Key(code)) => self.send(InputDevice::Pointer, EV_KEY, code, 1),
                    Some(Button::Wheel(step)) => {
                        self.send(InputDevice::Pointer, EV_REL, REL_WHEEL, step)
                    }
                    None => {}
                }
            }
            Event::ButtonRelease(e) => {
                if let Some(Button::Key(code)) = button(e.detail) {
                    self.pointer_moved(e.event_x, e.event_y);
                    self.send(InputDevice::Pointer, EV_KEY, code, 0);
                }
            }
            Event::Error(e) => tracing::warn!("the X server refused a request: {e:?}"),
            _ => {}
        }
        Ok(Flow::Go)
    }

    /// Takes what the lease thread left: the newest frame, its changed
    /// rows to draw, and whether the lease ended.
    fn take_mail(&mut self) -> Flow {
        let mut m = self.mailbox.lock().unwrap_or_else(|p| p.into_inner());
        m.woken = false;
        let frame = m.frame.take();
        let changed = m.changed.take();
        let ended = m.ended.take();
        drop(m);
        if let Some(frame) = frame {
            let h = u32::from(self.window.size.1);
            let same = self
                .frame
                .as_ref()
                .is_some_and(|f| (f.width, f.height) == (frame.width, frame.height));
            let rows = match changed {
                Some(rows) if same => band_in_window(rows, frame.height, h),
                _ => (0, h),
            };
            self.frame = Some(frame);
            self.redraw(rows);
        }
        match ended {
            Some(ended) => {
                self.ended = Some(ended);
                Flow::Close
            }
            None => Flow::Go,
        }
    }

    /// Marks window rows `rows` to be drawn.
    fn redraw(&mut self, rows: Rows) {
        if rows.0 < rows.1 {
            self.dirty = Some(union(self.dirty, rows));
        }
    }

    fn key(&mut self, event: &KeyPressEvent, down: bool) {
        if let Some(key) = evdev_key(event.detail) {
            self.send(InputDevice::Keyboard, EV_KEY, key, i32::from(down));
        }
    }

    /// Sends one event, connecting first when needed. A connection that
    /// fails is dropped (its keys released) and retried later.
    fn send(&mut self, device: InputDevice, kind: u16, code: u16, value: i32) {
        if self.input.is_none() {
            if self.retry_at.is_some_and(|at| Instant::now() < at) {
                return;
            }
            match ControlClient::connect(&self.sock, &self.name).and_then(ControlClient::input) {
                Ok(input) => {
                    self.input = Some(input);
                    self.retry_at = None;
                }
                Err(e) => {
                    tracing::warn!("cannot send input to {}: {e}", self.name);
                    self.retry_at = Some(Instant::now() + RETRY_AFTER);
                    return;
                }
            }
        }
        let Some(input) = &mut self.input else {
            return;
        };
        let sent = input
            .send(device, kind, code, value)
            .and_then(|()| input.refusals());
        match sent {
            Ok(refused) => {
                for why in refused {
                    tracing::debug!("{} refused an input event: {why}", self.name);
                }
            }
            Err(e) => {
                tracing::warn!("input to {}: {e}", self.name);
                self.input = None;
            }
        }
    }

    /// Releases every key and button held in the guest: closing the
    /// `input` connection makes the helper release them.
    fn release_all(&mut self) {
        self.input = None;
        self.pointer = None;
    }

    /// The display's size: the newest frame's, else the lease's.
    fn display_size(&self) -> (u32, u32) {
        self.frame
            .as_ref()
            .map_or(self.size, |f| (f.width, f.height))
    }

    fn pointer_moved(&mut self, x: i16, y: i16) {
        let (ww, wh) = self.window.size;
        let (dw, dh) = self.display_size();
        let at = (
            to_display(x, u32::from(ww), dw),
            to_display(y, u32::from(wh), dh),
        );
        if self.pointer == Some(at) {
            return;
        }
        let old = self.pointer.replace(at);
        if old.map(|o| o.0) != Some(at.0) {
            self.send(InputDevice::Pointer, EV_ABS, ABS_X, at.0);
        }
        if old.map(|o| o.1) != Some(at.1) {
            self.send(InputDevice::Pointer, EV_ABS, ABS_Y, at.1);
        }
    }
}

/// The Linux evdev key code (linux/input-event-codes.h) of X keycode
/// `keycode`: 8 less, as in the evdev keymap of every Xorg, Xwayland and
/// Xvfb server; `None` below 9, which is no key.
fn evdev_key(keycode: u8) -> Option<u16> {
    keycode
        .checked_sub(8)
        .filter(|&code| code >= 1)
        .map(u16::from)
}

/// Whether `release` and the event after it, `next`, are X's auto-repeat
/// of a held key: a press of the same key at the same time. The guest
/// repeats held keys itself, so both are dropped.
fn auto_repeat(release: &KeyReleaseEvent, next: Option<&Event>) -> bool {
    matches!(next, Some(Event::KeyPress(press))
        if press.detail == release.detail && press.time == release.time)
}

/// What an X pointer button is to the guest.
#[derive(Debug, PartialEq, Eq)]
enum Button {
    /// A button: its `BTN_*` code.
    Key(u16),
    /// A wheel step (on press only): up `1`, down `-1`.
    Wheel(i32),
}

/// The X pointer button `detail`, for the guest; `None` for those it is
/// not sent.
fn button(detail: u8) -> Option<Button> {
    Some(match detail {
        1 => Button::Key(BTN_LEFT),
        2 => Button::Key(BTN_MIDDLE),
        3 => Button::Key(BTN_RIGHT),
        4 => Button::Wheel(1),
        5 => Button::Wheel(-1),
        _ => return None,
    })
}

/// A window coordinate `at` along a side of `window` pixels, as a display
/// pixel along a side of `display` (clamped inside it).
fn to_display(at: i16, window: u32, display: u32) -> i32 {
    if window == 0 || at <= 0 {
        return 0;
    }
    let scaled = u64::from(at.unsigned_abs()) * u64::from(display) / u64::from(window);
    let last = u64::from(display.saturating_sub(1));
    i32::try_from(scaled.min(last)).unwrap_or(i32::MAX)
}

/// The smallest band holding both `a` (when there is one) and `b`.
fn union(a: Option<Rows>, b: Rows) -> Rows {
    a.map_or(b, |a| (a.0.min(b.0), a.1.max(b.1)))
}

/// The window rows, of a window `window` rows high, that show display
/// rows `rows` of a display `display` rows high, as [`scale_rows`] picks
/// them: window row `y` shows display row `y * display / window`.
fn band_in_window(rows: Rows, display: u32, window: u32) -> Rows {
    if display == 0 {
        return (0, 0);
    }
    let at = |y: u32| {
        let w = (u64::from(y.min(display)) * u64::from(window)).div_ceil(u64::from(display));
        u32::try_from(w).unwrap_or(window)
    };
    (at(rows.0), at(rows.1))
}

/// Appends window rows `rows` of `frame` scaled nearest-neighbour to a
/// `w` x `h` window (copied as they are when the sizes match) to `out`.
fn scale_rows(frame: &Frame, w: u32, h: u32, rows: Rows, out: &mut Vec<u32>) {
    let (fw, fh) = (frame.width as usize, frame.height as usize);
    let (w, h) = (w as usize, h as usize);
    let (top, end) = (rows.0 as usize, (rows.1 as usize).min(h));
    if fw == 0 || fh == 0 || frame.pixels.len() < fw * fh {
        out.resize(out.len() + w * end.saturating_sub(top), 0);
        return;
    }
    let columns: Vec<usize> = (0..w).map(|x| x * fw / w).collect();
    for y in top..end {
        let src = &frame.pixels[(y * fh / h) * fw..][..fw];
        if w == fw {
            out.extend_from_slice(src);
        } else {
            out.extend(columns.iter().map(|&sx| src[sx]));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(detail: u8, time: u32) -> KeyPressEvent {
        KeyPressEvent {
            detail,
            time,
            ..KeyPressEvent::default()
        }
    }

    #[test]
    fn an_x_keycode_is_the_evdev_code_plus_8_and_codes_below_9_are_no_key() {
        assert_eq!(evdev_key(9), Some(1)); // Escape
        assert_eq!(evdev_key(38), Some(30)); // A
        assert_eq!(evdev_key(36), Some(28)); // Return
        assert_eq!(evdev_key(116), Some(108)); // Down
        assert_eq!(evdev_key(255), Some(247));
        assert_eq!(evdev_key(8), None);
        assert_eq!(evdev_key(0), None);
    }

    #[test]
    fn a_release_followed_by_a_press_of_the_same_key_at_the_same_time_is_auto_repeat() {
        let release = key(38, 1000);
        assert!(auto_repeat(&release, Some(&Event::KeyPress(key(38, 1000)))));
        // A real release, then typing the key again or another key.
        assert!(!auto_repeat(&release, None));
        assert!(!auto_repeat(
            &release,
            Some(&Event::KeyPress(key(38, 1090)))
        ));
        assert!(!auto_repeat(
            &release,
            Some(&Event::KeyPress(key(39, 1000)))
        ));
        assert!(!auto_repeat(
            &release,
            Some(&Event::KeyRelease(key(38, 1000)))
        ));
    }

    #[test]
    fn buttons_1_to_3_are_left_middle_right_and_4_and_5_wheel_steps() {
        assert_eq!(button(1), Some(Button::Key(BTN_LEFT)));
        assert_eq!(button(2), Some(Button::Key(BTN_MIDDLE)));
        assert_eq!(button(3), Some(Button::Key(BTN_RIGHT)));
        assert_eq!(button(4), Some(Button::Wheel(1)));
        assert_eq!(button(5), Some(Button::Wheel(-1)));
        assert_eq!(button(8), None);
    }

    #[test]
    fn window_coordinates_scale_back_to_display_pixels_inside_the_display() {
        assert_eq!(to_display(0, 640, 320), 0);
        assert_eq!(to_display(639, 640, 320), 319);
        assert_eq!(to_display(320, 640, 320), 160);
        assert_eq!(to_display(5000, 640, 320), 319);
        assert_eq!(to_display(-3, 640, 320), 0);
        assert_eq!(to_display(10, 0, 320), 0);
        assert_eq!(to_display(100, 200, 0), 0);
    }

    #[test]
    fn a_frame_is_copied_as_is_at_its_size_and_nearest_neighbour_scaled_otherwise() {
        let frame = Frame {
            width: 2,
            height: 2,
            pixels: vec![1, 2, 3, 4],
        };
        let scaled = |w, h, rows| {
            let mut out = Vec::new();
            scale_rows(&frame, w, h, rows, &mut out);
            out
        };
        assert_eq!(scaled(2, 2, (0, 2)), [1, 2, 3, 4]);
        assert_eq!(
            scaled(4, 4, (0, 4)),
            [1, 1, 2, 2, 1, 1, 2, 2, 3, 3, 4, 4, 3, 3, 4, 4]
        );
        assert_eq!(scaled(1, 1, (0, 1)), [1]);
        // A band is those rows of the whole.
        assert_eq!(scaled(4, 4, (2, 3)), [3, 3, 4, 4]);
        assert_eq!(scaled(3, 1, (0, 5)), [1, 1, 2]);
    }

    #[test]
    fn changed_display_rows_redraw_the_window_rows_that_show_them() {
        assert_eq!(band_in_window((3, 7), 10, 10), (3, 7));
        assert_eq!(band_in_window((1, 2), 2, 4), (2, 4));
        // Halved: window row 1 shows display row 2, none shows row 1.
        assert_eq!(band_in_window((1, 2), 4, 2), (1, 1));
        assert_eq!(band_in_window((2, 3), 4, 2), (1, 2));
        assert_eq!(band_in_window((0, 4), 4, 3), (0, 3));
        assert_eq!(band_in_window((0, 9), 4, 3), (0, 3));
        assert_eq!(band_in_window((0, 1), 0, 3), (0, 0));
        // Every window row is drawn from a row in its band.
        for (display, window) in [(768, 1000), (1000, 768), (7, 3)] {
            for y in 0..window {
                let src = y * display / window;
                let (top, end) = band_in_window((src, src + 1), display, window);
                assert!((top..end).contains(&y), "{display}->{window}: row {y}");
            }
        }
    }

    #[test]
    fn rows_are_encoded_for_the_servers_byte_order_pixel_size_and_padding() {
        let row = [0x0011_2233, 0x00ff_0000];
        let encode = |bytes, msb_first, pad| {
            let format = PixelFormat {
                bytes,
                msb_first,
                pad,
            };
            let mut out = Vec::new();
            format.encode(&row, &mut out);
            assert_eq!(out.len(), format.row_bytes(row.len()));
            out
        };
        assert_eq!(encode(4, false, 4), [0x33, 0x22, 0x11, 0, 0, 0, 0xff, 0]);
        assert_eq!(encode(4, true, 4), [0, 0x11, 0x22, 0x33, 0, 0xff, 0, 0]);
        assert_eq!(encode(3, false, 4), [0x33, 0x22, 0x11, 0, 0, 0xff, 0, 0]);
        assert_eq!(encode(3, true, 1), [0x11, 0x22, 0x33, 0xff, 0, 0]);
    }

    #[test]
    fn changed_bands_merge_into_one() {
        assert_eq!(union(None, (3, 5)), (3, 5));
        assert_eq!(union(Some((3, 5)), (0, 1)), (0, 5));
        assert_eq!(union(Some((3, 5)), (4, 9)), (3, 9));
    }
}
