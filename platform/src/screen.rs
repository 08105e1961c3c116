//! A sandbox's screen and input as the host sees them: the frame slots a
//! display device presents into, the mailbox that carries each present to
//! the one leaseholder, and the input events a control connection sends to
//! the guest. The display device (virtio-gpu) produces, the control
//! socket's `display` and `input` streams consume; neither knows the other.
//!
//! **Frame slots.** One shared-memory file (a memfd on Linux, sealed
//! against shrinking, growing and — where the kernel has it — any write
//! through a new mapping or descriptor: `F_SEAL_FUTURE_WRITE`; an unlinked
//! POSIX shm object on macOS) holds [`SLOTS`] frames of the largest mode,
//! each `stride * max_height` bytes, pixels `XRGB8888` (32-bit little
//! endian words: bytes B, G, R, X). Present `seq` lands in slot
//! `seq % SLOTS`, and every slot holds a whole frame: the producer copies
//! the rectangle changed since that slot last held a frame (the union of
//! the last [`SLOTS`] presents' rectangles), never the whole screen for a
//! small change. A slot is rewritten only [`SLOTS`] presents later; a
//! reader slower than that sees a torn frame, never a fault.
//!
//! **The lease.** One leaseholder at a time: a new lease replaces the old
//! one, whose stream ends with `end replaced`. A present never waits for
//! the leaseholder: what it has not taken yet is coalesced — at most one
//! `mode` and one `present` record are pending, a newer present replacing
//! the pending one with the union of both rectangles (the slot it names
//! holds the whole newest frame) — so a holder that stops reading costs
//! nothing but the records it skips.
//!
//! Must never: block the producer on the consumer; let a present write
//! outside the mapping (rectangles are clipped to the mode, the mode to
//! the slot geometry); hand out a descriptor that can resize the file.

use std::fmt;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use crate::sync::lock;

/// Frames in the shared file.
pub const SLOTS: u32 = 3;
/// Bytes per pixel.
pub const BYTES_PER_PIXEL: u32 = 4;
/// The pixel format's name in the `display` reply (DRM's name for it).
pub const FORMAT: &str = "XRGB8888";
/// The largest display a sandbox may have, each way.
pub const MAX_SIDE: u32 = 8192;
/// The smallest, each way.
pub const MIN_SIDE: u32 = 16;

/// Why a screen could not be made.
#[derive(Debug, thiserror::Error)]
pub enum ScreenError {
    /// A size outside [`MIN_SIDE`]..=[`MAX_SIDE`].
    #[error("display size {0}x{1} is out of range ({MIN_SIDE} to {MAX_SIDE} each way)")]
    Size(u32, u32),
    /// The shared memory could not be created, sized, sealed or mapped.
    #[error("frame slots: {what}: {error}")]
    Shm {
        /// The step that failed.
        what: &'static str,
        /// What the OS said.
        error: std::io::Error,
    },
}

/// A rectangle in pixels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Rect {
    /// Left edge.
    pub x: u32,
    /// Top edge.
    pub y: u32,
    /// Width.
    pub w: u32,
    /// Height.
    pub h: u32,
}

impl Rect {
    /// The rectangle `(0, 0, w, h)`.
    pub fn whole(w: u32, h: u32) -> Rect {
        Rect { x: 0, y: 0, w, h }
    }

    /// Whether it covers no pixel.
    pub fn is_empty(&self) -> bool {
        self.w == 0 || self.h == 0
    }

    /// The part of it inside `(0, 0, w, h)`.
    pub fn clip(&self, w: u32, h: u32) -> Rect {
        let x = self.x.min(w);
        let y = self.y.min(h);
        Rect {
            x,
            y,
            w: self.w.min(w - x),
            h: self.h.min(h - y),
        }
    }

    /// The smallest rectangle holding both (an empty one adds nothing).
    pub fn union(&self, other: &Rect) -> Rect {
        if self.is_empty() {
            return *other;
        }
        if other.is_empty() {
            return *self;
        }
        let x = self.x.min(other.x);
        let y = self.y.min(other.y);
        let right = (self.x + self.w).max(other.x + other.w);
        let bottom = (self.y + self.h).max(other.y + other.h);
        Rect {
            x,
            y,
            w: right - x,
            h: bottom - y,
        }
    }
}

/// How the frame slots are laid out: the `display` reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    /// The current mode's width.
    pub width: u32,
    /// The current mode's height.
    pub height: u32,
    /// Bytes from one row to the next (that of the largest mode).
    pub stride: u32,
    /// Frames in the file.
    pub slots: u32,
    /// Bytes per slot; slot `i` starts at `i * slot_size`.
    pub slot_size: u64,
}

impl fmt::Display for Layout {
    /// `width W height H stride S format XRGB8888 slots N slot_size B`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "width {} height {} stride {} format {FORMAT} slots {} slot_size {}",
            self.width, self.height, self.stride, self.slots, self.slot_size
        )
    }
}

/// One record of a `display` stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Record {
    /// Slot `slot` holds frame `seq`, changed in `rect` since the previous
    /// record the holder was sent.
    Present {
        /// Which slot.
        slot: u32,
        /// The present's number, from 1, counting every present.
        seq: u64,
        /// What changed.
        rect: Rect,
    },
    /// The guest changed the mode; the slots keep their geometry.
    Mode {
        /// New width.
        width: u32,
        /// New height.
        height: u32,
    },
    /// The lease is over: `replaced` by a newer one, or the VM `stopped`.
    End(&'static str),
}

impl fmt::Display for Record {
    /// `present SLOT SEQ X Y W H`, `mode W H`, `end WHY`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Record::Present { slot, seq, rect } => write!(
                f,
                "present {slot} {seq} {} {} {} {}",
                rect.x, rect.y, rect.w, rect.h
            ),
            Record::Mode { width, height } => write!(f, "mode {width} {height}"),
            Record::End(why) => write!(f, "end {why}"),
        }
    }
}

/// The shared file and our writable mapping of it.
struct Slots {
    fd: OwnedFd,
    base: *mut u8,
    len: usize,
}

// SAFETY: `base` points at a mapping owned by this value for its whole
// life; writes into it go through `Screen::present`, serialised by the
// screen's state mutex.
unsafe impl Send for Slots {}
// SAFETY: as above: no access happens through a shared reference without
// the state mutex held.
unsafe impl Sync for Slots {}

impl Drop for Slots {
    fn drop(&mut self) {
        // SAFETY: `base`/`len` are exactly the mapping made in `Slots::new`,
        // unmapped once, here.
        unsafe { libc::munmap(self.base.cast(), self.len) };
    }
}

fn shm_err(what: &'static str) -> impl FnOnce(std::io::Error) -> ScreenError {
    move |error| ScreenError::Shm { what, error }
}

impl Slots {
    fn new(len: usize) -> Result<Slots, ScreenError> {
        let fd = shared_file()?;
        let size = libc::off_t::try_from(len)
            .map_err(|_| shm_err("size")(std::io::ErrorKind::InvalidInput.into()))?;
        // SAFETY: ftruncate on a descriptor we own.
        if unsafe { libc::ftruncate(fd.as_raw_fd(), size) } != 0 {
            return Err(shm_err("ftruncate")(std::io::Error::last_os_error()));
        }
        // SAFETY: a fresh shared mapping of `len` bytes of our own file; the
        // kernel picks the address.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(shm_err("mmap")(std::io::Error::last_os_error()));
        }
        let slots = Slots {
            fd,
            base: base.cast(),
            len,
        };
        seal(&slots.fd)?;
        Ok(slots)
    }
}

/// A memfd that can be sealed.
#[cfg(target_os = "linux")]
fn shared_file() -> Result<OwnedFd, ScreenError> {
    // SAFETY: the name is a NUL-terminated literal; the flags are valid.
    let fd = unsafe {
        libc::memfd_create(
            c"boxdesk-frames".as_ptr(),
            libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING,
        )
    };
    if fd < 0 {
        return Err(shm_err("memfd_create")(std::io::Error::last_os_error()));
    }
    // SAFETY: a descriptor memfd_create just returned, owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// An unlinked POSIX shared memory object (macOS has no memfd).
#[cfg(not(target_os = "linux"))]
fn shared_file() -> Result<OwnedFd, ScreenError> {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let name = format!(
        "/boxdesk-{}-{}\0",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    );
    // SAFETY: `name` is NUL-terminated; O_EXCL refuses an existing object.
    let fd = unsafe {
        libc::shm_open(
            name.as_ptr().cast(),
            libc::O_RDWR | libc::O_CREAT | libc::O_EXCL,
            0o600 as libc::c_uint,
        )
    };
    if fd < 0 {
        return Err(shm_err("shm_open")(std::io::Error::last_os_error()));
    }
    // SAFETY: as above; the descriptor keeps the object alive once unlinked.
    unsafe { libc::shm_unlink(name.as_ptr().cast()) };
    // SAFETY: a descriptor shm_open just returned, owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Seals the memfd: no shrink, no grow, no further seals, and (Linux 5.1+)
/// no write through any mapping or descriptor made from now on — our own
/// mapping, made before, stays writable.
#[cfg(target_os = "linux")]
fn seal(fd: &OwnedFd) -> Result<(), ScreenError> {
    const F_SEAL_FUTURE_WRITE: libc::c_int = 0x0010;
    let base = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW;
    for seals in [base | F_SEAL_FUTURE_WRITE, base] {
        // SAFETY: F_ADD_SEALS on a memfd we own, plain integer flags.
        if unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, seals) } == 0 {
            // SAFETY: as above.
            if unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, libc::F_SEAL_SEAL) } == 0 {
                return Ok(());
            }
            break;
        }
    }
    Err(shm_err("seal")(std::io::Error::last_os_error()))
}

/// macOS has no seals: the object is unlinked and only ever handed out as
/// a read-only descriptor.
#[cfg(not(target_os = "linux"))]
fn seal(_fd: &OwnedFd) -> Result<(), ScreenError> {
    Ok(())
}

/// What the producer and the leaseholder share.
#[derive(Debug)]
struct State {
    width: u32,
    height: u32,
    /// Presents so far.
    seq: u64,
    /// The rectangles of the last [`SLOTS`] presents, by `seq % SLOTS`.
    damage: [Rect; SLOTS as usize],
    /// The present each slot holds (0: none, or one of an older mode).
    held: [u64; SLOTS as usize],
    /// The current lease's number (0: none yet); a newer one ends it.
    lease: u64,
    /// Records not yet taken by the holder (a `mode`, then a `present`).
    mode: Option<(u32, u32)>,
    present: Option<(u64, Rect)>,
    stopped: bool,
}

/// The screen of one sandbox.
pub struct Screen {
    slots: Slots,
    max_width: u32,
    max_height: u32,
    state: Mutex<State>,
    wake: Condvar,
}

impl fmt::Debug for Screen {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Screen")
            .field("max", &(self.max_width, self.max_height))
            .finish_non_exhaustive()
    }
}

impl Screen {
    /// A screen of `width` x `height` (also its largest mode), all black.
    pub fn new(width: u32, height: u32) -> Result<Screen, ScreenError> {
        let ok = |s: u32| (MIN_SIDE..=MAX_SIDE).contains(&s);
        if !ok(width) || !ok(height) {
            return Err(ScreenError::Size(width, height));
        }
        let slot = width as usize * height as usize * BYTES_PER_PIXEL as usize;
        let slots = Slots::new(slot * SLOTS as usize)?;
        Ok(Screen {
            slots,
            max_width: width,
            max_height: height,
            state: Mutex::new(State {
                width,
                height,
                seq: 0,
                damage: [Rect::default(); SLOTS as usize],
                held: [0; SLOTS as usize],
                lease: 0,
                mode: None,
                present: None,
                stopped: false,
            }),
            wake: Condvar::new(),
        })
    }

    /// The largest mode (what the guest is told the display is).
    pub fn max_size(&self) -> (u32, u32) {
        (self.max_width, self.max_height)
    }

    fn stride(&self) -> u32 {
        self.max_width * BYTES_PER_PIXEL
    }

    fn slot_size(&self) -> usize {
        self.stride() as usize * self.max_height as usize
    }

    /// Presents so far.
    pub fn presents(&self) -> u64 {
        lock(&self.state).seq
    }

    /// The layout a `display` reply states, at the current mode.
    pub fn layout(&self) -> Layout {
        let st = lock(&self.state);
        Layout {
            width: st.width,
            height: st.height,
            stride: self.stride(),
            slots: SLOTS,
            slot_size: self.slot_size() as u64,
        }
    }

    /// A read-only descriptor of the frame slots, for a leaseholder.
    pub fn reader_fd(&self) -> std::io::Result<OwnedFd> {
        reopen_read_only(&self.slots.fd)
    }

    /// Presents `rect` of a frame: `src` holds `height` rows of `stride`
    /// bytes of a `width` x `height` XRGB8888 image (the guest's mode).
    /// Copies into the next slot what changed since it last held a frame,
    /// and posts a record for the holder. A mode other than the last is
    /// announced first; sizes past the largest mode are clipped to it.
    /// Returns the present's number, or `None` when `src` is too short for
    /// what it claims (nothing is copied then).
    pub fn present(
        &self,
        src: &[u8],
        stride: usize,
        width: u32,
        height: u32,
        rect: Rect,
    ) -> Option<u64> {
        let row = width as usize * BYTES_PER_PIXEL as usize;
        let need = (height as usize)
            .checked_sub(1)
            .map_or(0, |last| last * stride + row);
        if stride < row || src.len() < need {
            return None;
        }
        let width = width.min(self.max_width);
        let height = height.min(self.max_height);
        let rect = rect.clip(width, height);
        let mut st = lock(&self.state);
        if st.stopped {
            return None;
        }
        if (width, height) != (st.width, st.height) {
            st.width = width;
            st.height = height;
            st.held = [0; SLOTS as usize];
            st.mode = Some((width, height));
            st.present = None;
        }
        st.seq += 1;
        let seq = st.seq;
        let i = (seq % u64::from(SLOTS)) as usize;
        st.damage[i] = rect;
        // What changed since this slot's frame: every present after it.
        let copy = if st.held[i] == 0 || seq - st.held[i] > u64::from(SLOTS) {
            Rect::whole(width, height)
        } else {
            (0..SLOTS as usize)
                .map(|k| st.damage[k])
                .fold(Rect::default(), |a, r| a.union(&r))
                .clip(width, height)
        };
        self.copy_into(i, src, stride, copy);
        st.held[i] = seq;
        let merged = match st.present.take() {
            Some((_, earlier)) => earlier.union(&rect),
            None => rect,
        };
        st.present = Some((seq, merged));
        drop(st);
        self.wake.notify_all();
        Some(seq)
    }

    /// Copies `rect` of `src` into slot `slot`, row by row.
    fn copy_into(&self, slot: usize, src: &[u8], stride: usize, rect: Rect) {
        if rect.is_empty() {
            return;
        }
        let bpp = BYTES_PER_PIXEL as usize;
        let dst_stride = self.stride() as usize;
        let base = slot * self.slot_size();
        let n = rect.w as usize * bpp;
        // Whole rows of the same stride: one copy of all of them.
        let (rows, n, src_step, dst_step) = if n == stride && n == dst_stride {
            (1, n * rect.h as usize, 0, 0)
        } else {
            (rect.h as usize, n, stride, dst_stride)
        };
        for k in 0..rows {
            let y = rect.y as usize;
            let from = &src[y * stride + k * src_step + rect.x as usize * bpp..][..n];
            let at = base + y * dst_stride + k * dst_step + rect.x as usize * bpp;
            debug_assert!(at + n <= self.slots.len);
            // SAFETY: `rect` is clipped to the mode, the mode to the slot
            // geometry, so `at + n` stays inside the `slots.len`-byte
            // mapping; `from` is a live slice that cannot overlap it.
            unsafe {
                std::ptr::copy_nonoverlapping(from.as_ptr(), self.slots.base.add(at), n);
            }
        }
    }

    /// Starts a lease, ending the one before. Its first records are the
    /// current mode and the newest frame, whole (when there is one).
    pub fn lease(&self) -> Lease<'_> {
        let mut st = lock(&self.state);
        st.lease += 1;
        st.mode = None;
        st.present = (st.seq > 0).then(|| (st.seq, Rect::whole(st.width, st.height)));
        let id = st.lease;
        drop(st);
        self.wake.notify_all();
        Lease { screen: self, id }
    }

    /// Ends every lease with `end stopped`; later presents are dropped.
    pub fn stop(&self) {
        lock(&self.state).stopped = true;
        self.wake.notify_all();
    }
}

/// A leaseholder's view of the [`Screen`].
pub struct Lease<'a> {
    screen: &'a Screen,
    id: u64,
}

impl Lease<'_> {
    /// The next record, waiting up to `limit`; `None` when none came. After
    /// an [`Record::End`] every call returns it again.
    pub fn next(&self, limit: Duration) -> Option<Record> {
        let deadline = Instant::now() + limit;
        let mut st = lock(&self.screen.state);
        loop {
            if st.lease != self.id {
                return Some(Record::End("replaced"));
            }
            if st.stopped {
                return Some(Record::End("stopped"));
            }
            if let Some((width, height)) = st.mode.take() {
                return Some(Record::Mode { width, height });
            }
            if let Some((seq, rect)) = st.present.take() {
                let slot = (seq % u64::from(SLOTS)) as u32;
                return Some(Record::Present { slot, seq, rect });
            }
            let left = deadline.checked_duration_since(Instant::now())?;
            st = (self.screen.wake.wait_timeout(st, left))
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }
}

/// A new read-only open file description of the same memfd (so the
/// holder's descriptor cannot write or, being sealed, resize).
#[cfg(target_os = "linux")]
fn reopen_read_only(fd: &OwnedFd) -> std::io::Result<OwnedFd> {
    let path = format!("/proc/self/fd/{}", fd.as_raw_fd());
    Ok(std::fs::File::open(path)?.into())
}

/// macOS: no way to reopen an unlinked object read-only; a duplicate
/// (the object cannot be found by name, and nothing maps it writable but
/// us).
#[cfg(not(target_os = "linux"))]
fn reopen_read_only(fd: &OwnedFd) -> std::io::Result<OwnedFd> {
    fd.try_clone()
}

/// Which of a sandbox's input devices an event is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum InputDevice {
    /// The keyboard (`kbd`).
    Keyboard,
    /// The absolute pointer, a tablet (`ptr`).
    Pointer,
}

/// One evdev event (`struct input_event` without the time).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InputEvent {
    /// The device it goes to.
    pub device: InputDevice,
    /// `EV_KEY`, `EV_REL`, `EV_ABS`, …
    pub kind: u16,
    /// The key, button or axis.
    pub code: u16,
    /// Press (1), release (0), repeat (2), or a coordinate.
    pub value: i32,
}

/// `EV_SYN`.
pub const EV_SYN: u16 = 0;
/// `EV_KEY`: keys and buttons.
pub const EV_KEY: u16 = 1;
/// `EV_REL`: relative axes (the wheel).
pub const EV_REL: u16 = 2;
/// `EV_ABS`: absolute axes.
pub const EV_ABS: u16 = 3;
/// `BTN_LEFT`.
pub const BTN_LEFT: u16 = 0x110;
/// `BTN_RIGHT`.
pub const BTN_RIGHT: u16 = 0x111;
/// `BTN_MIDDLE`.
pub const BTN_MIDDLE: u16 = 0x112;
/// `BTN_SIDE`.
pub const BTN_SIDE: u16 = 0x113;
/// `BTN_EXTRA`.
pub const BTN_EXTRA: u16 = 0x114;
/// `REL_HWHEEL`: the horizontal wheel.
pub const REL_HWHEEL: u16 = 0x06;
/// `REL_WHEEL`: the wheel.
pub const REL_WHEEL: u16 = 0x08;
/// `ABS_X`.
pub const ABS_X: u16 = 0x00;
/// `ABS_Y`.
pub const ABS_Y: u16 = 0x01;

/// Why an input event was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InputError {
    /// The device does not report this type and code.
    #[error("{device} does not report type {kind} code {code}")]
    Unsupported {
        /// `kbd` or `ptr`.
        device: &'static str,
        /// The event type.
        kind: u16,
        /// The code.
        code: u16,
    },
    /// A value outside what the code takes.
    #[error("value {value} is out of range for type {kind} code {code} ({min} to {max})")]
    Value {
        /// The event type.
        kind: u16,
        /// The code.
        code: u16,
        /// What was sent.
        value: i32,
        /// Least allowed.
        min: i32,
        /// Most allowed.
        max: i32,
    },
    /// The guest's driver is not running (yet, or any more).
    #[error("the guest's input driver is not ready")]
    NotReady,
}

/// Where a sandbox's input events go (its virtio-input devices). Each
/// accepted event reaches the guest followed by a `SYN_REPORT`.
pub trait InputSink: Send + Sync {
    /// Sends one event, or says why it is refused (nothing is sent then).
    fn send(&self, event: InputEvent) -> Result<(), InputError>;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read_slot(s: &Screen, slot: u32) -> Vec<u8> {
        let fd = s.reader_fd().unwrap();
        let mut all = Vec::new();
        std::io::Read::read_to_end(&mut std::fs::File::from(fd), &mut all).unwrap();
        let n = s.slot_size();
        all[slot as usize * n..][..n].to_vec()
    }

    fn frame(w: u32, h: u32, v: u8) -> Vec<u8> {
        vec![v; (w * h * 4) as usize]
    }

    #[test]
    fn a_present_copies_the_frame_into_its_slot_and_posts_one_record() {
        let s = Screen::new(32, 16).unwrap();
        let lease = s.lease();
        assert_eq!(lease.next(Duration::ZERO), None);
        let f = frame(32, 16, 7);
        assert_eq!(s.present(&f, 128, 32, 16, Rect::whole(32, 16)), Some(1));
        let rec = lease.next(Duration::from_secs(1)).unwrap();
        assert_eq!(
            rec,
            Record::Present {
                slot: 1,
                seq: 1,
                rect: Rect::whole(32, 16)
            }
        );
        assert_eq!(rec.to_string(), "present 1 1 0 0 32 16");
        assert_eq!(read_slot(&s, 1), f);
    }

    #[test]
    fn each_slot_holds_the_whole_newest_frame_after_small_changes() {
        let s = Screen::new(16, 16).unwrap();
        let mut img = frame(16, 16, 1);
        s.present(&img, 64, 16, 16, Rect::whole(16, 16));
        for n in 0..7u32 {
            // Change one row at a time, presenting only that row.
            img[(n * 64) as usize..][..64].fill(10 + n as u8);
            let seq = s.present(
                &img,
                64,
                16,
                16,
                Rect {
                    x: 0,
                    y: n,
                    w: 16,
                    h: 1,
                },
            );
            let slot = (seq.unwrap() % u64::from(SLOTS)) as u32;
            assert_eq!(read_slot(&s, slot), img, "after row {n}");
        }
    }

    #[test]
    fn a_holder_that_does_not_read_gets_one_coalesced_record_with_the_union() {
        let s = Screen::new(64, 64).unwrap();
        let lease = s.lease();
        let f = frame(64, 64, 3);
        for i in 0..10_000u32 {
            s.present(
                &f,
                256,
                64,
                64,
                Rect {
                    x: i % 60,
                    y: 5,
                    w: 2,
                    h: 2,
                },
            );
        }
        assert_eq!(
            lease.next(Duration::ZERO),
            Some(Record::Present {
                slot: 10_000 % SLOTS,
                seq: 10_000,
                rect: Rect {
                    x: 0,
                    y: 5,
                    w: 61,
                    h: 2
                }
            })
        );
        assert_eq!(lease.next(Duration::ZERO), None);
    }

    #[test]
    fn a_new_lease_ends_the_old_one_and_starts_with_the_newest_frame() {
        let s = Screen::new(16, 16).unwrap();
        s.present(
            &frame(16, 16, 1),
            64,
            16,
            16,
            Rect {
                x: 1,
                y: 1,
                w: 2,
                h: 2,
            },
        );
        let old = s.lease();
        let new = s.lease();
        assert_eq!(old.next(Duration::ZERO), Some(Record::End("replaced")));
        assert_eq!(
            new.next(Duration::ZERO),
            Some(Record::Present {
                slot: 1,
                seq: 1,
                rect: Rect::whole(16, 16)
            })
        );
        s.stop();
        assert_eq!(new.next(Duration::ZERO), Some(Record::End("stopped")));
    }

    #[test]
    fn a_mode_change_is_announced_before_its_first_present_and_clipped_to_the_largest() {
        let s = Screen::new(32, 32).unwrap();
        let lease = s.lease();
        let f = frame(64, 20, 9);
        s.present(&f, 256, 64, 20, Rect::whole(64, 20));
        assert_eq!(
            lease.next(Duration::ZERO),
            Some(Record::Mode {
                width: 32,
                height: 20
            })
        );
        let Some(Record::Present { rect, .. }) = lease.next(Duration::ZERO) else {
            panic!("no present");
        };
        assert_eq!(rect, Rect::whole(32, 20));
        assert_eq!(
            s.layout().to_string(),
            "width 32 height 20 stride 128 format XRGB8888 slots 3 slot_size 4096"
        );
    }

    #[test]
    fn a_source_shorter_than_it_claims_is_refused_and_nothing_is_copied() {
        let s = Screen::new(16, 16).unwrap();
        assert_eq!(s.present(&[0; 100], 64, 16, 16, Rect::whole(16, 16)), None);
        assert_eq!(s.present(&[0; 1024], 10, 16, 16, Rect::whole(16, 16)), None);
        assert_eq!(read_slot(&s, 1), vec![0; 1024]);
    }

    #[test]
    fn the_holders_descriptor_cannot_write_or_resize_the_slots() {
        let s = Screen::new(16, 16).unwrap();
        let fd = s.reader_fd().unwrap();
        let f = std::fs::File::from(fd);
        assert!(std::io::Write::write_all(&mut &f, b"x").is_err());
        assert!(f.set_len(1).is_err());
        // SAFETY: a test mapping of a descriptor we own, unmapped at once.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                4096,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                f.as_raw_fd(),
                0,
            )
        };
        assert_eq!(p, libc::MAP_FAILED, "a writable mapping must be refused");
    }

    #[test]
    fn sizes_outside_the_range_are_refused() {
        assert!(matches!(
            Screen::new(8, 100),
            Err(ScreenError::Size(8, 100))
        ));
        assert!(Screen::new(100, 9000).is_err());
    }
}
