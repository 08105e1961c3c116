//! The client side of the control socket, for the CLI: connect by name,
//! ask `info`, ask `stop`, lease the display ([`DisplayLease`]) and send
//! input ([`InputClient`]).
//!
//! This module owns reading replies within the protocol's limits: it never
//! reads more than [`REPLY_MAX`] bytes for one reply (nor for one record
//! line of a stream), never waits longer than [`CONNECT_TIMEOUT`] for a
//! listener that does not accept, nor longer than [`REPLY_TIMEOUT`] on a
//! silent helper; a peer that stalls is [`ClientError::Stalled`], naming
//! the sandbox. It also owns the lease's mapping of the frame slots: the
//! descriptor is mapped read-only, only once its file is known to hold
//! every slot the layout claims (and, on Linux, is sealed against
//! shrinking), so no record a helper sends can make a read leave the
//! mapping or fault. It must never decide what the CLI prints or exits
//! with, and never panic on anything a helper sends.

use std::io::{self, BufRead, BufReader, IoSliceMut, Read, Write};
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::ptr::NonNull;
use std::time::{Duration, Instant};

use boxdesk_platform::screen::{InputDevice, InputEvent, Layout, Record, BYTES_PER_PIXEL};

pub use crate::conn::dial::{connect_socket, is_timeout, ClientError, CONNECT_TIMEOUT};

use super::protocol::{self, Reply, REPLY_MAX};

/// How long a reply may take.
pub const REPLY_TIMEOUT: Duration = Duration::from_secs(5);
/// A failed read or write on a connection to sandbox `name`, a timeout
/// named as the stall it is.
fn io_error(name: &str, e: io::Error) -> ClientError {
    if is_timeout(&e) {
        ClientError::Stalled {
            name: name.to_owned(),
            socket: "control socket",
            after: REPLY_TIMEOUT,
        }
    } else {
        ClientError::Io(e)
    }
}

/// One control connection.
pub struct ControlClient {
    reader: BufReader<UnixStream>,
    name: String,
}

impl ControlClient {
    /// Connects to `sock`, the control socket of sandbox `name`.
    pub fn connect(sock: &Path, name: &str) -> Result<Self, ClientError> {
        let stream = connect_socket(sock, name, "control socket")?;
        Self::over(stream, name)
    }

    /// A client on `stream`, already connected to sandbox `name`'s helper.
    pub(crate) fn over(stream: UnixStream, name: &str) -> Result<Self, ClientError> {
        stream.set_read_timeout(Some(REPLY_TIMEOUT))?;
        stream.set_write_timeout(Some(REPLY_TIMEOUT))?;
        Ok(Self {
            reader: BufReader::with_capacity(REPLY_MAX, stream),
            name: name.to_owned(),
        })
    }

    /// A failed read or write, a timeout named as the stall it is.
    fn io(&self, e: io::Error) -> ClientError {
        io_error(&self.name, e)
    }

    /// The pid of the process listening on the socket, as the kernel
    /// recorded it at `connect` (`SO_PEERCRED`; `LOCAL_PEERPID` on macOS):
    /// known even when the helper never answers.
    pub fn peer_pid(&self) -> Option<i32> {
        let pid = boxdesk_platform::socket::peer_pid(self.reader.get_ref()).ok()?;
        Some(pid).filter(|&pid| pid > 0)
    }

    /// Sends one word and returns the reply's status line.
    pub fn request(&mut self, word: &str) -> Result<Reply, ClientError> {
        let sent = self
            .reader
            .get_mut()
            .write_all(format!("{word}\n").as_bytes());
        sent.map_err(|e| self.io(e))?;
        let mut budget = REPLY_MAX;
        let line = self.line(&mut budget)?;
        Ok(protocol::parse_status_line(&line))
    }

    /// `info`: the `key value` pairs, in the helper's order.
    pub fn info(&mut self) -> Result<Vec<(String, String)>, ClientError> {
        let sent = self.reader.get_mut().write_all(b"info\n");
        sent.map_err(|e| self.io(e))?;
        let mut budget = REPLY_MAX;
        match protocol::parse_status_line(&self.line(&mut budget)?) {
            Reply::Ok(_) => {}
            Reply::Err(why) => return Err(ClientError::Refused(why)),
        }
        let mut lines = Vec::new();
        loop {
            let line = self.line(&mut budget)?;
            if line.is_empty() {
                break;
            }
            lines.push(line);
        }
        Ok(protocol::parse_info_lines(lines.iter().map(String::as_str)))
    }

    /// `stop`: returns once the helper answered `ok` (it exits after).
    pub fn stop(&mut self) -> Result<(), ClientError> {
        match self.request("stop")? {
            Reply::Ok(_) => Ok(()),
            Reply::Err(why) => Err(ClientError::Refused(why)),
        }
    }

    /// `display`: leases the sandbox's screen. The reply's descriptor is
    /// mapped read-only; the lease's records follow on this connection,
    /// which the lease keeps (a newer lease, by anyone, ends this one).
    pub fn display(self) -> Result<DisplayLease, ClientError> {
        if !self.reader.buffer().is_empty() {
            return Err(ClientError::Malformed("bytes before the display reply"));
        }
        let name = self.name;
        let stream = self.reader.into_inner();
        let io = |e| io_error(&name, e);
        (&stream).write_all(b"display\n").map_err(io)?;
        let mut buf = vec![0u8; REPLY_MAX];
        let (mut got, fd) = recv_with_fd(&stream, &mut buf).map_err(io)?;
        // The kernel hands the descriptor over with the first bytes; the
        // rest of the line may come in later reads.
        let end = loop {
            if let Some(end) = buf[..got].iter().position(|&b| b == b'\n') {
                break end;
            }
            if got == buf.len() {
                return Err(ClientError::Malformed("over 4096 bytes"));
            }
            match (&stream).read(&mut buf[got..]) {
                Ok(0) => return Err(ClientError::Malformed("closed mid-reply")),
                Ok(n) => got += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(io(e)),
            }
        };
        let line =
            std::str::from_utf8(&buf[..end]).map_err(|_| ClientError::Malformed("not UTF-8"))?;
        let layout = match protocol::parse_status_line(line) {
            Reply::Err(why) if why == "no display" => return Err(ClientError::NoDisplay(name)),
            Reply::Err(why) => return Err(ClientError::Refused(why)),
            Reply::Ok(rest) => protocol::parse_layout(&rest).ok_or(ClientError::Malformed(
                "a display reply without a usable layout",
            ))?,
        };
        let fd = fd.ok_or(ClientError::Malformed(
            "a display reply without a descriptor",
        ))?;
        let frames = Frames::map(fd, &layout)?;
        Ok(DisplayLease {
            lines: Lines {
                stream,
                pending: buf[end + 1..got].to_vec(),
            },
            name,
            layout,
            frames,
            ended: None,
        })
    }

    /// `input`: turns this connection into an input stream.
    pub fn input(mut self) -> Result<InputClient, ClientError> {
        match self.request("input")? {
            Reply::Ok(_) => {}
            Reply::Err(why) if why == "no display" => {
                return Err(ClientError::NoDisplay(self.name))
            }
            Reply::Err(why) => return Err(ClientError::Refused(why)),
        }
        let pending = self.reader.buffer().to_vec();
        Ok(InputClient {
            lines: Lines {
                stream: self.reader.into_inner(),
                pending,
            },
            name: self.name,
        })
    }

    /// Reads one line (without `\n`), charging it to `budget`.
    fn line(&mut self, budget: &mut usize) -> Result<String, ClientError> {
        let mut buf = Vec::new();
        let limit = u64::try_from(*budget).unwrap_or(u64::MAX);
        let read = (&mut self.reader).take(limit).read_until(b'\n', &mut buf);
        let n = read.map_err(|e| self.io(e))?;
        *budget -= n;
        if buf.last() != Some(&b'\n') {
            return Err(ClientError::Malformed(if n as u64 == limit {
                "over 4096 bytes"
            } else {
                "closed mid-reply"
            }));
        }
        buf.pop();
        String::from_utf8(buf).map_err(|_| ClientError::Malformed("not UTF-8"))
    }
}

/// Receives what the peer sent (at most `buf.len()` bytes) and the first
/// descriptor passed with it; any further descriptors are closed.
fn recv_with_fd(stream: &UnixStream, buf: &mut [u8]) -> io::Result<(usize, Option<OwnedFd>)> {
    use nix::sys::socket::{recvmsg, ControlMessageOwned, MsgFlags};
    // Close-on-exec from the start where the OS can; elsewhere nothing in
    // the CLI execs while a lease is open.
    #[cfg(any(target_os = "linux", target_os = "android"))]
    let flags = MsgFlags::MSG_CMSG_CLOEXEC;
    #[cfg(not(any(target_os = "linux", target_os = "android")))]
    let flags = MsgFlags::empty();
    let mut space = nix::cmsg_space!([RawFd; 1]);
    loop {
        let mut iov = [IoSliceMut::new(buf)];
        let msg = match recvmsg::<()>(stream.as_raw_fd(), &mut iov, Some(&mut space), flags) {
            Ok(msg) => msg,
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(e.into()),
        };
        let mut fd = None;
        for cmsg in msg.cmsgs()? {
            if let ControlMessageOwned::ScmRights(fds) = cmsg {
                for raw in fds {
                    // SAFETY: the kernel just installed `raw` in this
                    // process for this message; nothing else owns it.
                    let owned = unsafe { OwnedFd::from_raw_fd(raw) };
                    if fd.is_none() {
                        fd = Some(owned);
                    }
                }
            }
        }
        return Ok((msg.bytes, fd));
    }
}

/// Most frame slots a lease maps.
const SLOTS_MAX: u32 = 16;

/// The frame slots, mapped read-only and shared.
struct Frames {
    base: NonNull<u8>,
    len: usize,
}

// SAFETY: a read-only mapping owned by this value for its whole life;
// nothing about it is tied to the thread that made it.
unsafe impl Send for Frames {}
// SAFETY: as above; it is only ever read.
unsafe impl Sync for Frames {}

impl Frames {
    /// Maps `fd` for `layout`'s slots, once its file is known to hold them.
    fn map(fd: OwnedFd, layout: &Layout) -> Result<Frames, ClientError> {
        let len = u64::from(layout.slots)
            .checked_mul(layout.slot_size)
            .and_then(|n| usize::try_from(n).ok())
            .filter(|_| layout.slots <= SLOTS_MAX)
            .ok_or(ClientError::Malformed("frame slots too large to map"))?;
        let file = std::fs::File::from(fd);
        let meta = file.metadata()?;
        if !meta.is_file() || meta.len() < len as u64 {
            return Err(ClientError::Malformed(
                "frame slots larger than the file shared",
            ));
        }
        if !cannot_shrink(&file) {
            return Err(ClientError::Malformed("a frame slot file that can shrink"));
        }
        // SAFETY: a fresh read-only shared mapping of `len` bytes of a file
        // that holds at least that many and cannot shrink; the kernel
        // picks the address. The descriptor may close after: the mapping
        // keeps the file.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(ClientError::Io(io::Error::last_os_error()));
        }
        let base = NonNull::new(base.cast()).ok_or(ClientError::Malformed("mapped at 0"))?;
        Ok(Frames { base, len })
    }

    /// Every byte of every slot.
    fn bytes(&self) -> &[u8] {
        // SAFETY: `base`/`len` are the live mapping made in `Frames::map`,
        // readable for as long as `self`. The helper writes into it while
        // we read (a slot `SLOTS` presents old may be rewritten): bytes
        // read then are torn pixels, never invalid values or a fault.
        unsafe { std::slice::from_raw_parts(self.base.as_ptr(), self.len) }
    }
}

impl Drop for Frames {
    fn drop(&mut self) {
        // SAFETY: exactly the mapping made in `Frames::map`, unmapped once.
        unsafe { libc::munmap(self.base.as_ptr().cast(), self.len) };
    }
}

/// Whether the file can never get shorter than it is now: a memfd sealed
/// with `F_SEAL_SHRINK` (what the helper shares on Linux).
#[cfg(any(target_os = "linux", target_os = "android"))]
fn cannot_shrink(file: &std::fs::File) -> bool {
    use nix::fcntl::{fcntl, FcntlArg, SealFlag};
    fcntl(file.as_raw_fd(), FcntlArg::F_GET_SEALS)
        .is_ok_and(|s| SealFlag::from_bits_truncate(s).contains(SealFlag::F_SEAL_SHRINK))
}

/// macOS has no seals: the helper shares an unlinked object only it can
/// resize, and it never does.
#[cfg(not(any(target_os = "linux", target_os = "android")))]
fn cannot_shrink(_file: &std::fs::File) -> bool {
    true
}

/// The lines of a stream, read within [`REPLY_MAX`] bytes each.
struct Lines {
    stream: UnixStream,
    /// Bytes read past the last line taken.
    pending: Vec<u8>,
}

impl Lines {
    /// The next line (without `\n`), waiting until `deadline` (`None`:
    /// for ever); `Ok(None)` when none came in time. End of stream is
    /// `Ok(Some(Err(())))`, for the caller to name.
    #[allow(clippy::type_complexity)]
    fn next(&mut self, deadline: Option<Instant>) -> io::Result<Option<Result<Vec<u8>, ()>>> {
        use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
        loop {
            if let Some(i) = self.pending.iter().position(|&b| b == b'\n') {
                let mut line: Vec<u8> = self.pending.drain(..=i).collect();
                line.pop();
                return Ok(Some(Ok(line)));
            }
            if self.pending.len() >= REPLY_MAX {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "a line over 4096 bytes",
                ));
            }
            let wait = match deadline {
                None => PollTimeout::NONE,
                Some(at) => {
                    let left = at.saturating_duration_since(Instant::now());
                    PollTimeout::try_from(left).unwrap_or(PollTimeout::MAX)
                }
            };
            let mut fds = [PollFd::new(self.stream.as_fd(), PollFlags::POLLIN)];
            match poll(&mut fds, wait) {
                Ok(0) if deadline.is_some_and(|at| Instant::now() >= at) => return Ok(None),
                Ok(0) | Err(nix::errno::Errno::EINTR) => continue,
                Ok(_) => {}
                Err(e) => return Err(e.into()),
            }
            let mut chunk = [0u8; REPLY_MAX];
            let room = REPLY_MAX - self.pending.len();
            match (&self.stream).read(&mut chunk[..room]) {
                Ok(0) => return Ok(Some(Err(()))),
                Ok(n) => self.pending.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if is_timeout(&e) => {}
                Err(e) => return Err(e),
            }
        }
    }
}

/// A lease of a sandbox's display: its frame slots, mapped read-only, and
/// the stream of records saying which slot holds the newest frame.
pub struct DisplayLease {
    lines: Lines,
    name: String,
    /// The reply's layout, its size kept at the current mode.
    layout: Layout,
    frames: Frames,
    /// Once `end` came, its reason.
    ended: Option<&'static str>,
}

impl std::fmt::Debug for DisplayLease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DisplayLease")
            .field("name", &self.name)
            .field("layout", &self.layout)
            .field("ended", &self.ended)
            .finish_non_exhaustive()
    }
}

impl DisplayLease {
    /// The slots' layout, `width` and `height` being the current mode.
    pub fn layout(&self) -> Layout {
        self.layout
    }

    /// The current mode: width and height in pixels.
    pub fn size(&self) -> (u32, u32) {
        (self.layout.width, self.layout.height)
    }

    /// The next record, waiting up to `timeout` (`None`: for ever);
    /// `Ok(None)` when none came in time. A `mode` record changes
    /// [`DisplayLease::size`]. After an [`Record::End`] every call returns
    /// it again. A record that does not parse or does not fit the lease
    /// (a slot past the last, a rectangle outside the mode, a mode larger
    /// than the slots) is [`ClientError::Malformed`]; the helper closing
    /// without `end` is [`ClientError::Closed`].
    pub fn next(&mut self, timeout: Option<Duration>) -> Result<Option<Record>, ClientError> {
        if let Some(why) = self.ended {
            return Ok(Some(Record::End(why)));
        }
        let deadline = timeout.and_then(|t| Instant::now().checked_add(t));
        let line = match self.lines.next(deadline) {
            Ok(Some(Ok(line))) => line,
            Ok(Some(Err(()))) => return Err(ClientError::Closed(self.name.clone())),
            Ok(None) => return Ok(None),
            Err(e) if e.kind() == io::ErrorKind::InvalidData => {
                return Err(ClientError::Malformed("a record line over 4096 bytes"))
            }
            Err(e) => return Err(io_error(&self.name, e)),
        };
        let record = std::str::from_utf8(&line)
            .ok()
            .and_then(protocol::parse_record)
            .ok_or(ClientError::Malformed("a record line that does not parse"))?;
        match record {
            Record::Present { slot, rect, .. } => {
                let inside = |at: u32, len: u32, side: u32| {
                    u64::from(at) + u64::from(len) <= u64::from(side)
                };
                if slot >= self.layout.slots
                    || !inside(rect.x, rect.w, self.layout.width)
                    || !inside(rect.y, rect.h, self.layout.height)
                {
                    return Err(ClientError::Malformed("a present outside the lease"));
                }
            }
            Record::Mode { width, height } => {
                if !protocol::holds(&self.layout, width, height) {
                    return Err(ClientError::Malformed("a mode the frame slots cannot hold"));
                }
                self.layout.width = width;
                self.layout.height = height;
            }
            Record::End(why) => self.ended = Some(why),
        }
        Ok(Some(record))
    }

    /// Every byte of slot `slot` (`slot_size` of them, rows `stride`
    /// apart); `None` past the last slot. The helper rewrites a slot
    /// [`boxdesk_platform::screen::SLOTS`] presents after it named it: a
    /// reader slower than that reads a torn frame.
    pub fn frame(&self, slot: u32) -> Option<&[u8]> {
        if slot >= self.layout.slots {
            return None;
        }
        let size = usize::try_from(self.layout.slot_size).ok()?;
        self.frames.bytes().get(slot as usize * size..)?.get(..size)
    }

    /// The rows of slot `slot` at the current mode, top to bottom: `height`
    /// rows of `width` XRGB8888 pixels (bytes B, G, R, X each).
    pub fn rows(&self, slot: u32) -> Option<impl Iterator<Item = &[u8]> + '_> {
        let frame = self.frame(slot)?;
        let stride = self.layout.stride as usize;
        let row = self.layout.width as usize * BYTES_PER_PIXEL as usize;
        Some(
            frame
                .chunks(stride.max(1))
                .take(self.layout.height as usize)
                .filter_map(move |r| r.get(..row)),
        )
    }
}

/// An `input` stream: each [`InputClient::send`] one event, no reply on
/// success. Whatever the stream left pressed is released by the helper
/// when it is dropped.
pub struct InputClient {
    lines: Lines,
    name: String,
}

impl std::fmt::Debug for InputClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InputClient")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl InputClient {
    /// Sends one event: `device`, its type (`EV_KEY`, `EV_REL`, `EV_ABS`…),
    /// code and value.
    pub fn send(
        &mut self,
        device: InputDevice,
        kind: u16,
        code: u16,
        value: i32,
    ) -> Result<(), ClientError> {
        let line = protocol::input_line(&InputEvent {
            device,
            kind,
            code,
            value,
        });
        (&self.lines.stream)
            .write_all(line.as_bytes())
            .map_err(|e| io_error(&self.name, e))
    }

    /// The reasons of the `err` lines the helper sent for refused events
    /// so far, without waiting (the helper answers only refusals, after
    /// the event; read them or it stalls once the socket's buffer fills).
    pub fn refusals(&mut self) -> Result<Vec<String>, ClientError> {
        self.refusals_within(Duration::ZERO)
    }

    /// [`InputClient::refusals`], waiting up to `wait` for the first one.
    pub fn refusals_within(&mut self, wait: Duration) -> Result<Vec<String>, ClientError> {
        let mut deadline = Instant::now().checked_add(wait);
        let mut out = Vec::new();
        loop {
            match self.lines.next(deadline) {
                Ok(Some(Ok(line))) => {
                    let text = String::from_utf8_lossy(&line);
                    match protocol::parse_status_line(&text) {
                        Reply::Err(why) => out.push(why),
                        Reply::Ok(_) => {
                            return Err(ClientError::Malformed("`ok` in an input stream"))
                        }
                    }
                    deadline = Some(Instant::now());
                }
                Ok(Some(Err(()))) => return Err(ClientError::Closed(self.name.clone())),
                Ok(None) => return Ok(out),
                Err(e) if e.kind() == io::ErrorKind::InvalidData => {
                    return Err(ClientError::Malformed("a reply line over 4096 bytes"))
                }
                Err(e) => return Err(io_error(&self.name, e)),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::control::server::handle;
    use crate::control::testing::Desk;
    use boxdesk_platform::screen::{Rect, Screen, EV_KEY};
    use std::io::IoSlice;
    use std::sync::Arc;
    use std::thread::JoinHandle;

    fn desk(w: u32, h: u32) -> Arc<Desk> {
        Desk::new(Some(Screen::new(w, h).unwrap()))
    }

    /// A client talking to the real server over a socket pair.
    fn connect(desk: &Arc<Desk>) -> (ControlClient, JoinHandle<()>) {
        let (client, server) = UnixStream::pair().unwrap();
        let d = Arc::clone(desk);
        let t = std::thread::spawn(move || handle(server, &*d));
        (ControlClient::over(client, "t").unwrap(), t)
    }

    /// `w` x `h` pixels, each a different colour: 0x00RRGGBB = (x, y, x^y).
    fn pattern(w: u32, h: u32) -> Vec<u8> {
        let mut out = Vec::new();
        for y in 0..h {
            for x in 0..w {
                let px = ((x ^ y) & 0xff) | (y & 0xff) << 8 | (x & 0xff) << 16;
                out.extend_from_slice(&px.to_le_bytes());
            }
        }
        out
    }

    #[test]
    fn a_lease_starts_with_the_newest_frame_whole_and_its_rows_are_that_frame() {
        let d = desk(64, 32);
        let img = pattern(64, 32);
        d.screen().present(&img, 256, 64, 32, Rect::whole(64, 32));
        let (c, t) = connect(&d);
        let mut lease = c.display().unwrap();
        assert_eq!(lease.size(), (64, 32));
        assert_eq!(lease.layout().slot_size, 8192);
        let Some(Record::Present { slot, seq: 1, rect }) =
            lease.next(Some(Duration::from_secs(5))).unwrap()
        else {
            panic!("no present");
        };
        assert_eq!(rect, Rect::whole(64, 32));
        let rows: Vec<u8> = lease.rows(slot).unwrap().flatten().copied().collect();
        assert_eq!(rows, img);
        assert_eq!(lease.frame(slot).unwrap().len(), 8192);
        assert!(lease.frame(3).is_none() && lease.rows(3).is_none());
        drop(lease);
        t.join().unwrap();
    }

    #[test]
    fn a_mode_record_changes_the_size_rows_are_read_at() {
        let d = desk(64, 32);
        let (c, t) = connect(&d);
        let mut lease = c.display().unwrap();
        assert_eq!(lease.next(Some(Duration::from_millis(50))).unwrap(), None);
        let img = pattern(40, 20);
        d.screen().present(&img, 160, 40, 20, Rect::whole(40, 20));
        let wait = Some(Duration::from_secs(5));
        assert_eq!(
            lease.next(wait).unwrap(),
            Some(Record::Mode {
                width: 40,
                height: 20
            })
        );
        assert_eq!(lease.size(), (40, 20));
        let Some(Record::Present { slot, .. }) = lease.next(wait).unwrap() else {
            panic!("no present");
        };
        let rows: Vec<&[u8]> = lease.rows(slot).unwrap().collect();
        assert_eq!(rows.len(), 20);
        assert_eq!(rows.concat(), img);
        drop(lease);
        t.join().unwrap();
    }

    #[test]
    fn next_returns_none_when_no_record_comes_in_time() {
        let d = desk(16, 16);
        let (c, t) = connect(&d);
        let mut lease = c.display().unwrap();
        let start = Instant::now();
        assert_eq!(lease.next(Some(Duration::from_millis(300))).unwrap(), None);
        assert!(start.elapsed() >= Duration::from_millis(300));
        assert_eq!(lease.next(Some(Duration::ZERO)).unwrap(), None);
        drop(lease);
        t.join().unwrap();
    }

    #[test]
    fn a_newer_lease_ends_the_older_with_end_replaced_and_it_stays_ended() {
        let d = desk(16, 16);
        let (c1, t1) = connect(&d);
        let mut old = c1.display().unwrap();
        let (c2, t2) = connect(&d);
        let new = c2.display().unwrap();
        let wait = Some(Duration::from_secs(5));
        assert_eq!(old.next(wait).unwrap(), Some(Record::End("replaced")));
        assert_eq!(old.next(wait).unwrap(), Some(Record::End("replaced")));
        t1.join().unwrap();
        d.screen().stop();
        let mut new = new;
        assert_eq!(new.next(wait).unwrap(), Some(Record::End("stopped")));
        t2.join().unwrap();
    }

    #[test]
    fn a_sandbox_without_a_display_is_no_display_for_both_streams() {
        let d = Desk::new(None);
        let (c, _t) = connect(&d);
        let e = c.display().unwrap_err();
        assert!(matches!(&e, ClientError::NoDisplay(n) if n == "t"), "{e:?}");
        assert_eq!(
            e.to_string(),
            "t has no display (start it with `boxdesk run --display`)"
        );
        let (c, _t) = connect(&d);
        assert!(matches!(c.input(), Err(ClientError::NoDisplay(_))));
    }

    #[test]
    fn input_events_reach_the_sink_refusals_come_back_and_keys_are_released_at_close() {
        let d = desk(16, 16);
        let (c, t) = connect(&d);
        let mut input = c.input().unwrap();
        input.send(InputDevice::Keyboard, EV_KEY, 30, 1).unwrap();
        input.send(InputDevice::Keyboard, EV_KEY, 300, 1).unwrap();
        input.send(InputDevice::Pointer, 3, 1, 7).unwrap();
        assert_eq!(
            input.refusals_within(Duration::from_secs(5)).unwrap(),
            ["kbd does not report type 1 code 300"]
        );
        assert!(input.refusals().unwrap().is_empty());
        drop(input);
        t.join().unwrap();
        let got: Vec<_> = (d.events.lock().unwrap().iter())
            .map(|e| (e.device, e.kind, e.code, e.value))
            .collect();
        assert_eq!(
            got,
            [
                (InputDevice::Keyboard, EV_KEY, 30, 1),
                (InputDevice::Pointer, 3, 1, 7),
                (InputDevice::Keyboard, EV_KEY, 30, 0)
            ]
        );
    }

    /// A fake helper: answers `display` with `reply`, passing `fd` when
    /// given, then writes `after` and closes.
    fn fake(reply: &str, fd: Option<OwnedFd>, after: &str) -> Result<DisplayLease, ClientError> {
        use nix::sys::socket::{sendmsg, ControlMessage, MsgFlags};
        let (client, server) = UnixStream::pair().unwrap();
        let (reply, after) = (reply.to_owned(), after.to_owned());
        let t = std::thread::spawn(move || {
            let mut word = [0u8; 8];
            (&server).read_exact(&mut word).unwrap();
            assert_eq!(&word, b"display\n");
            let raw: Vec<RawFd> = fd.iter().map(|f| f.as_raw_fd()).collect();
            let cmsgs = [ControlMessage::ScmRights(&raw)];
            let cmsgs = if raw.is_empty() { &[][..] } else { &cmsgs[..] };
            let iov = [IoSlice::new(reply.as_bytes())];
            sendmsg::<()>(server.as_raw_fd(), &iov, cmsgs, MsgFlags::empty(), None).unwrap();
            let _ = (&server).write_all(after.as_bytes());
        });
        let lease = ControlClient::over(client, "t").unwrap().display();
        t.join().unwrap();
        lease
    }

    const LAYOUT: &str = "ok width 16 height 16 stride 64 format XRGB8888 slots 3 slot_size 1024\n";

    fn slots_fd() -> OwnedFd {
        let s = Screen::new(16, 16).unwrap();
        s.reader_fd().unwrap()
    }

    #[test]
    fn a_display_reply_without_a_descriptor_or_with_a_bad_layout_is_malformed() {
        let e = fake(LAYOUT, None, "").unwrap_err();
        assert!(
            matches!(e, ClientError::Malformed(m) if m.contains("descriptor")),
            "{e:?}"
        );
        let bad = "ok width 16 height 16 stride 32 format XRGB8888 slots 3 slot_size 1024\n";
        let e = fake(bad, Some(slots_fd()), "").unwrap_err();
        assert!(
            matches!(e, ClientError::Malformed(m) if m.contains("layout")),
            "{e:?}"
        );
        let e = fake("err busy\n", None, "").unwrap_err();
        assert!(
            matches!(&e, ClientError::Refused(w) if w == "busy"),
            "{e:?}"
        );
    }

    #[test]
    fn slots_larger_than_the_file_or_a_file_that_can_shrink_are_refused_before_mapping() {
        let big = "ok width 16 height 16 stride 64 format XRGB8888 slots 3 slot_size 4096\n";
        let e = fake(big, Some(slots_fd()), "").unwrap_err();
        assert!(
            matches!(e, ClientError::Malformed(m) if m.contains("larger")),
            "{e:?}"
        );
        let file = tempfile::tempfile().unwrap();
        file.set_len(3 * 1024).unwrap();
        let e = fake(LAYOUT, Some(file.into()), "").unwrap_err();
        assert!(
            matches!(e, ClientError::Malformed(m) if m.contains("shrink")),
            "{e:?}"
        );
    }

    #[test]
    fn a_record_that_does_not_parse_or_fit_the_lease_is_an_error_not_a_panic() {
        for bad in [
            "present 1 1 0 0 16\n",
            "present 3 1 0 0 1 1\n",
            "present 0 1 8 0 9 1\n",
            "present 0 1 4294967295 0 2 1\n",
            "mode 17 16\n",
            "mode 0 16\n",
            "\u{ff}\n",
        ] {
            let mut lease = fake(LAYOUT, Some(slots_fd()), bad).unwrap();
            let e = lease.next(Some(Duration::from_secs(5))).unwrap_err();
            assert!(matches!(e, ClientError::Malformed(_)), "{bad:?}: {e:?}");
        }
        let mut lease = fake(LAYOUT, Some(slots_fd()), &"x".repeat(5000)).unwrap();
        let e = lease.next(Some(Duration::from_secs(5))).unwrap_err();
        assert!(
            matches!(e, ClientError::Malformed(m) if m.contains("4096")),
            "{e:?}"
        );
    }

    #[test]
    fn records_in_the_same_read_as_the_reply_are_kept_and_a_close_without_end_is_closed() {
        let mut lease = fake(LAYOUT, Some(slots_fd()), "mode 8 8\npresent 2 5 0 0 8 8\n").unwrap();
        let wait = Some(Duration::from_secs(5));
        assert_eq!(
            lease.next(wait).unwrap(),
            Some(Record::Mode {
                width: 8,
                height: 8
            })
        );
        assert!(matches!(
            lease.next(wait).unwrap(),
            Some(Record::Present {
                slot: 2,
                seq: 5,
                ..
            })
        ));
        assert!(matches!(lease.next(wait), Err(ClientError::Closed(n)) if n == "t"));
    }
}
