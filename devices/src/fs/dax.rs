//! The DAX window of a virtio-fs device (shared-memory region 0, the
//! "cache"): a guest-physical range the VMM backs with host files on the
//! guest's request, so the guest reads and writes the host's page cache in
//! place instead of copying every byte through a request.
//!
//! The window is one host reservation (anonymous, `PROT_NONE`, nothing
//! committed), mapped into the guest as a memory slot. `FUSE_SETUPMAPPING`
//! maps part of a file the [guard](super::guard) let the server open over
//! part of it (`MAP_SHARED | MAP_FIXED`, writable only when the guest asked
//! to write); `FUSE_REMOVEMAPPING` and a device reset put the reservation
//! back. Ranges are whole [`CHUNK`]s, as Linux's FUSE DAX always sends them.
//!
//! Must never: map anything outside the window (every range is checked
//! against it before `mmap`); let a file shrunk on the host hang or end the
//! VM. The host has no page past a file's end: a guest touching one there
//! (its view of the size is stale) makes x86 KVM retry the fault forever
//! (its asynchronous page faults) and arm64 KVM fail `KVM_RUN` with
//! `EFAULT`. So every mapped file is watched (inotify `IN_MODIFY`, which a
//! truncation raises) by the window's own thread, and [`Window::trim`]
//! backs every mapped page past its file's end with zeros — at once on the
//! watch, and again when a vCPU meets such a page — so the guest reads
//! zeros there until it learns the new size.
//!
//! The window is not guest RAM to the devices: a request whose buffers lie
//! in it (direct I/O from or into a DAX mapping) gets `EFAULT`
//! ([`super::worker`]); the server never reads or writes the window itself.

use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::sync::{Arc, Mutex, Weak};

use boxdesk_platform::sync::lock;
use boxdesk_platform::threads::{self, Class};
use fuse_backend_rs::abi::virtio_fs::{RemovemappingOne, SetupmappingFlags};
use fuse_backend_rs::transport::FsCacheReqHandler;
use vm_memory::{GuestAddress, GuestMemoryRegion, GuestRegionMmap, MmapRegion};
use vmm_sys_util::eventfd::EventFd;

/// The unit of a mapping: 2 MiB, Linux's `FUSE_DAX_SZ`.
pub const CHUNK: u64 = 2 << 20;
/// The smallest window: Linux needs the window in whole memory sections
/// (128 MiB on x86_64 and on arm64 with 4 KiB pages) to give it struct pages.
pub const MIN_WINDOW: u64 = 128 << 20;
/// The largest window.
pub const MAX_WINDOW: u64 = 1 << 30;

/// Why a window could not be made.
#[derive(Debug, thiserror::Error)]
pub enum DaxError {
    /// The size is not a multiple of [`MIN_WINDOW`] up to [`MAX_WINDOW`].
    #[error("DAX window of {0:#x} bytes: a multiple of 128 MiB up to 1 GiB")]
    Size(u64),
    /// The host reservation failed.
    #[error("cannot reserve the DAX window")]
    Reserve(#[source] vm_memory::mmap::MmapRegionError),
    /// The watch on mapped files could not be set up.
    #[error("cannot watch the DAX window's files")]
    Watch(#[source] io::Error),
}

/// The window size for a guest of `mem_bytes` of RAM: half of it, in whole
/// 128 MiB steps, from 128 MiB to 1 GiB. Linux spends 1/64 of the window on
/// its struct pages (8 MiB of RAM for a 512 MiB window).
pub fn window_size(mem_bytes: u64) -> u64 {
    ((mem_bytes / 2) / MIN_WINDOW * MIN_WINDOW).clamp(MIN_WINDOW, MAX_WINDOW)
}

/// What one chunk of the window holds.
struct Chunk {
    /// The file it maps (shared by the chunks of one request).
    file: Arc<File>,
    /// Where in the file the chunk starts.
    offset: u64,
    /// Bytes from the chunk's start backed by zeros instead of the file
    /// ([`Window::trim`]); `CHUNK` when none are.
    zeroed_from: u64,
    /// The inotify watch on the file.
    watch: i32,
}

/// What the window's lock guards.
#[derive(Default)]
struct Table {
    /// One entry per chunk of the window.
    chunks: Vec<Option<Chunk>>,
    /// How many chunks each inotify watch serves.
    watches: HashMap<i32, usize>,
}

/// One device's window.
pub struct Window {
    region: Arc<GuestRegionMmap<()>>,
    table: Mutex<Table>,
    /// The inotify instance watching mapped files for truncation.
    inotify: OwnedFd,
    /// Ends the watching thread.
    stop: EventFd,
    /// The watching thread, joined when the window goes.
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl Drop for Window {
    fn drop(&mut self) {
        let _ = self.stop.write(1);
        let thread = lock(&self.thread).take();
        // The watcher may itself hold the last reference for a moment.
        if let Some(t) = thread.filter(|t| t.thread().id() != std::thread::current().id()) {
            let _ = t.join();
        }
    }
}

impl std::fmt::Debug for Window {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Window")
            .field("guest", &self.guest_range())
            .finish()
    }
}

fn err(code: i32) -> io::Error {
    io::Error::from_raw_os_error(code)
}

impl Window {
    /// Reserves a window of `size` bytes at guest-physical `guest`.
    pub fn new(guest: GuestAddress, size: u64) -> Result<Arc<Window>, DaxError> {
        if size == 0 || size % MIN_WINDOW != 0 || size > MAX_WINDOW {
            return Err(DaxError::Size(size));
        }
        let region = MmapRegion::build(
            None,
            size as usize,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
        )
        .map_err(DaxError::Reserve)?;
        let region = GuestRegionMmap::new(region, guest).ok_or(DaxError::Size(size))?;
        // SAFETY: inotify_init1 takes flags only; the result is checked.
        let fd = unsafe { libc::inotify_init1(libc::IN_NONBLOCK | libc::IN_CLOEXEC) };
        if fd < 0 {
            return Err(DaxError::Watch(io::Error::last_os_error()));
        }
        // SAFETY: `fd` was just created and is owned by nothing else.
        let inotify = unsafe { OwnedFd::from_raw_fd(fd) };
        let window = Arc::new(Window {
            region: Arc::new(region),
            table: Mutex::new(Table {
                chunks: (0..size / CHUNK).map(|_| None).collect(),
                watches: HashMap::new(),
            }),
            inotify,
            stop: EventFd::new(libc::EFD_NONBLOCK).map_err(DaxError::Watch)?,
            thread: Mutex::new(None),
        });
        let weak = Arc::downgrade(&window);
        let inotify = window.inotify.try_clone().map_err(DaxError::Watch)?;
        let stop = window.stop.try_clone().map_err(DaxError::Watch)?;
        let thread = std::thread::Builder::new()
            .name("virtio-fs-dax".into())
            .spawn(move || watch(&weak, &inotify, &stop))
            .map_err(DaxError::Watch)?;
        *lock(&window.thread) = Some(thread);
        Ok(window)
    }

    /// The region to map into the guest as memory.
    pub fn region(&self) -> &Arc<GuestRegionMmap<()>> {
        &self.region
    }

    /// Guest-physical start and length.
    pub fn guest_range(&self) -> (u64, u64) {
        (self.region.start_addr().0, self.region.len())
    }

    /// Whether `[addr, addr + len)` lies inside the window.
    pub fn contains(&self, addr: u64, len: u64) -> bool {
        let (start, size) = self.guest_range();
        addr.checked_sub(start)
            .and_then(|o| o.checked_add(len))
            .is_some_and(|end| end <= size)
    }

    /// The chunks `[offset, offset + len)` covers, when that is whole
    /// chunks inside the window.
    fn chunk_range(&self, offset: u64, len: u64) -> io::Result<std::ops::Range<usize>> {
        let end = offset.checked_add(len).ok_or(err(libc::EINVAL))?;
        if len == 0 || offset % CHUNK != 0 || len % CHUNK != 0 || end > self.region.len() {
            return Err(err(libc::EINVAL));
        }
        Ok((offset / CHUNK) as usize..(end / CHUNK) as usize)
    }

    /// Maps `len` bytes of `fd` from `foffset` at `offset` in the window,
    /// writable if `writable`.
    pub fn map(
        &self,
        fd: BorrowedFd<'_>,
        foffset: u64,
        offset: u64,
        len: u64,
        writable: bool,
    ) -> io::Result<()> {
        let range = self.chunk_range(offset, len)?;
        if foffset % CHUNK != 0 || foffset.checked_add(len).is_none() {
            return Err(err(libc::EINVAL));
        }
        let file = Arc::new(File::from(fd.try_clone_to_owned()?));
        let watch = self.watch_file(&file)?;
        let prot = if writable {
            libc::PROT_READ | libc::PROT_WRITE
        } else {
            libc::PROT_READ
        };
        let mut table = lock(&self.table);
        // SAFETY: [offset, offset + len) was checked to lie inside the
        // window's reservation, which this window owns and nothing else
        // uses; MAP_FIXED replaces only those pages. The guest (through
        // the memory slot) is the only reader of them.
        let p = unsafe {
            libc::mmap(
                self.region.as_ptr().add(offset as usize).cast(),
                len as usize,
                prot,
                libc::MAP_SHARED | libc::MAP_FIXED,
                file.as_raw_fd(),
                foffset as libc::off_t,
            )
        };
        if p == libc::MAP_FAILED {
            let e = io::Error::last_os_error();
            // A failed MAP_FIXED may have unmapped the range already.
            let _ = self.reserve(offset, len);
            range.for_each(|i| self.set(&mut table, i, None));
            self.unwatch_unused(&mut table, watch);
            return Err(e);
        }
        for (k, i) in range.enumerate() {
            let chunk = Chunk {
                file: file.clone(),
                offset: foffset + k as u64 * CHUNK,
                zeroed_from: CHUNK,
                watch,
            };
            self.set(&mut table, i, Some(chunk));
        }
        Ok(())
    }

    /// Puts `chunk` (or nothing) at index `i`, counting watches.
    fn set(&self, table: &mut Table, i: usize, chunk: Option<Chunk>) {
        if let Some(c) = &chunk {
            *table.watches.entry(c.watch).or_default() += 1;
        }
        if let Some(old) = std::mem::replace(&mut table.chunks[i], chunk) {
            if let Some(n) = table.watches.get_mut(&old.watch) {
                *n -= 1;
            }
            self.unwatch_unused(table, old.watch);
        }
    }

    /// Watches `file` for changes (a truncation raises `IN_MODIFY`); the
    /// watch (one per inode: inotify gives the same one again).
    fn watch_file(&self, file: &File) -> io::Result<i32> {
        let path = format!("/proc/self/fd/{}\0", file.as_raw_fd());
        // SAFETY: `path` is NUL-terminated and outlives the call; the
        // descriptor is the window's own inotify instance.
        let wd = unsafe {
            libc::inotify_add_watch(
                self.inotify.as_raw_fd(),
                path.as_ptr().cast(),
                libc::IN_MODIFY,
            )
        };
        if wd < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(wd)
    }

    /// Drops watch `wd` when no chunk maps its file any more.
    fn unwatch_unused(&self, table: &mut Table, wd: i32) {
        if table.watches.get(&wd).is_some_and(|&n| n > 0) {
            return;
        }
        table.watches.remove(&wd);
        // SAFETY: removes a watch of the window's own inotify instance; an
        // unknown one is EINVAL, which changes nothing.
        unsafe { libc::inotify_rm_watch(self.inotify.as_raw_fd(), wd) };
    }

    /// Puts `[offset, offset + len)` back to the bare reservation; `len`
    /// `u64::MAX` means to the window's end.
    pub fn unmap(&self, offset: u64, len: u64) -> io::Result<()> {
        let len = if len == u64::MAX {
            self.region
                .len()
                .checked_sub(offset)
                .ok_or(err(libc::EINVAL))?
        } else {
            len
        };
        let range = self.chunk_range(offset, len)?;
        let mut table = lock(&self.table);
        self.reserve(offset, len)?;
        range.for_each(|i| self.set(&mut table, i, None));
        Ok(())
    }

    /// Unmaps everything (a device reset).
    pub fn clear(&self) {
        let _ = self.unmap(0, u64::MAX);
    }

    /// Replaces `[offset, offset + len)` with fresh anonymous pages:
    /// `PROT_NONE` (no access) or, for [`trim`](Self::trim), zeros.
    fn replace(&self, offset: u64, len: u64, prot: i32) -> io::Result<()> {
        // SAFETY: callers pass a range inside the window's own reservation
        // (checked by chunk_range or derived from a chunk's place); only
        // those pages are replaced.
        let p = unsafe {
            libc::mmap(
                self.region.as_ptr().add(offset as usize).cast(),
                len as usize,
                prot,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE | libc::MAP_FIXED,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    fn reserve(&self, offset: u64, len: u64) -> io::Result<()> {
        self.replace(offset, len, libc::PROT_NONE)
    }

    /// Backs with zeros every mapped page that lies past its file's end
    /// (the file shrank on the host); whether it changed anything. Called
    /// when a vCPU meets a page the host cannot provide.
    pub fn trim(&self) -> bool {
        let page = page_size();
        let mut table = lock(&self.table);
        let mut changed = false;
        for (i, slot) in table.chunks.iter_mut().enumerate() {
            let Some(c) = slot else { continue };
            let Ok(meta) = c.file.metadata() else {
                continue;
            };
            let end = meta.len().div_ceil(page) * page;
            let keep = end.saturating_sub(c.offset).min(CHUNK);
            if keep >= c.zeroed_from {
                continue;
            }
            let at = i as u64 * CHUNK + keep;
            if self
                .replace(at, c.zeroed_from - keep, libc::PROT_READ | libc::PROT_WRITE)
                .is_ok()
            {
                c.zeroed_from = keep;
                changed = true;
            }
        }
        changed
    }

    /// How many chunks are mapped.
    pub fn mapped_chunks(&self) -> usize {
        lock(&self.table).chunks.iter().flatten().count()
    }

    /// How many files are watched.
    pub fn watched_files(&self) -> usize {
        lock(&self.table).watches.len()
    }
}

/// The window's thread: trims the window whenever a watched file changed,
/// until the window is gone. Started before the helper is jailed, it
/// enters the device jail once there is one.
fn watch(window: &Weak<Window>, inotify: &OwnedFd, stop: &EventFd) {
    let mut entered = false;
    let mut buf = [0u8; 4096];
    loop {
        let mut fds = [
            libc::pollfd {
                fd: inotify.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: stop.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        // SAFETY: `fds` is a live array of two pollfds.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), 2, -1) };
        if n < 0 {
            if io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return;
        }
        if fds[1].revents != 0 {
            return;
        }
        if !entered && threads::jailed() {
            threads::enter(Class::Device);
            entered = true;
        }
        // Drain every pending event, then trim once.
        // SAFETY: reads into `buf`, which outlives the call.
        while unsafe {
            libc::read(
                inotify.as_fd().as_raw_fd(),
                buf.as_mut_ptr().cast(),
                buf.len(),
            )
        } > 0
        {}
        match window.upgrade() {
            Some(w) => {
                w.trim();
            }
            None => return,
        }
    }
}

fn page_size() -> u64 {
    // SAFETY: sysconf reads a constant and touches no memory.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    u64::try_from(p).ok().filter(|&p| p > 0).unwrap_or(4096)
}

/// The FUSE server's view of a window: what `SETUPMAPPING` and
/// `REMOVEMAPPING` do.
pub struct Requests(pub Arc<Window>);

impl FsCacheReqHandler for Requests {
    fn map(
        &mut self,
        foffset: u64,
        moffset: u64,
        len: u64,
        flags: u64,
        fd: RawFd,
    ) -> io::Result<()> {
        // SAFETY: the server lends a descriptor it holds open for the
        // length of this call; it is only duplicated here.
        let fd = unsafe { BorrowedFd::borrow_raw(fd) };
        let writable = flags & SetupmappingFlags::WRITE.bits() != 0;
        self.0.map(fd, foffset, moffset, len, writable)
    }

    fn unmap(&mut self, requests: Vec<RemovemappingOne>) -> io::Result<()> {
        requests
            .iter()
            .try_for_each(|r| self.0.unmap(r.moffset, r.len))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::fd::AsFd;

    fn window() -> Arc<Window> {
        Window::new(GuestAddress(1 << 36), MIN_WINDOW).unwrap()
    }

    fn file(bytes: usize) -> File {
        let mut f = tempfile::tempfile().unwrap();
        f.write_all(&vec![0xa5; bytes]).unwrap();
        f
    }

    fn byte_at(w: &Window, offset: u64) -> u8 {
        // SAFETY: tests read only chunks they mapped, inside the window.
        unsafe { *w.region.as_ptr().add(offset as usize) }
    }

    #[test]
    fn window_sizes_are_half_the_ram_in_128_mib_steps_within_bounds() {
        assert_eq!(window_size(64 << 20), MIN_WINDOW);
        assert_eq!(window_size(1 << 30), 512 << 20);
        assert_eq!(window_size(700 << 20), 256 << 20);
        assert_eq!(window_size(64 << 30), MAX_WINDOW);
        assert!(Window::new(GuestAddress(0), 100 << 20).is_err());
        assert!(Window::new(GuestAddress(0), 2 << 30).is_err());
    }

    #[test]
    fn a_mapped_chunk_shows_the_file_and_an_unmapped_one_is_gone() {
        let w = window();
        let f = file(CHUNK as usize);
        w.map(f.as_fd(), 0, 4 * CHUNK, CHUNK, false).unwrap();
        assert_eq!(byte_at(&w, 4 * CHUNK + 100), 0xa5);
        assert_eq!(w.mapped_chunks(), 1);
        w.unmap(4 * CHUNK, CHUNK).unwrap();
        assert_eq!(w.mapped_chunks(), 0);
    }

    #[test]
    fn ranges_outside_the_window_or_not_whole_chunks_are_refused() {
        let w = window();
        let f = file(4096);
        let einval = |r: io::Result<()>| r.unwrap_err().raw_os_error() == Some(libc::EINVAL);
        assert!(einval(w.map(f.as_fd(), 0, MIN_WINDOW, CHUNK, false)));
        assert!(einval(w.map(
            f.as_fd(),
            0,
            MIN_WINDOW - CHUNK,
            2 * CHUNK,
            false
        )));
        assert!(einval(w.map(
            f.as_fd(),
            0,
            u64::MAX - CHUNK + 1,
            CHUNK,
            false
        )));
        assert!(einval(w.map(f.as_fd(), 0, 4096, CHUNK, false)));
        assert!(einval(w.map(f.as_fd(), 0, 0, 4096, false)));
        assert!(einval(w.map(f.as_fd(), 0, 0, 0, false)));
        assert!(einval(w.map(f.as_fd(), 4096, 0, CHUNK, false)));
        assert!(einval(w.unmap(MIN_WINDOW, CHUNK)));
        assert!(einval(w.unmap(MIN_WINDOW + CHUNK, u64::MAX)));
        assert_eq!(w.mapped_chunks(), 0);
    }

    #[test]
    fn a_writable_mapping_writes_the_host_file() {
        let w = window();
        let f = file(CHUNK as usize);
        w.map(f.as_fd(), 0, 0, CHUNK, true).unwrap();
        // SAFETY: the chunk at 0 is mapped writable above.
        unsafe { *w.region.as_ptr().add(10) = 0x11 };
        let mut b = [0u8; 1];
        std::os::unix::fs::FileExt::read_exact_at(&f, &mut b, 10).unwrap();
        assert_eq!(b[0], 0x11);
    }

    #[test]
    fn pages_past_a_file_shrunk_on_the_host_read_as_zeros_after_a_trim() {
        let w = window();
        let f = file(CHUNK as usize);
        w.map(f.as_fd(), 0, 0, CHUNK, false).unwrap();
        f.set_len(4096 + 1).unwrap();
        // The window's inotify watcher may have trimmed already; the
        // trims are serialised, so after this one nothing is left to do.
        w.trim();
        assert!(!w.trim(), "a second trim finds nothing more to do");
        assert_eq!(
            byte_at(&w, 4096),
            0xa5,
            "the page holding the new end stays"
        );
        assert_eq!(byte_at(&w, 8192), 0);
        assert_eq!(byte_at(&w, CHUNK - 1), 0);
    }

    #[test]
    fn the_window_trims_by_itself_when_a_mapped_file_shrinks_on_the_host() {
        let w = window();
        let f = file(2 * CHUNK as usize);
        w.map(f.as_fd(), 0, 0, 2 * CHUNK, false).unwrap();
        assert_eq!(w.watched_files(), 1, "one file, one watch");
        f.set_len(4096).unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let zeroed = |w: &Window| lock(&w.table).chunks[1].as_ref().map(|c| c.zeroed_from);
        while zeroed(&w) != Some(0) {
            assert!(std::time::Instant::now() < deadline, "no trim within 10 s");
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        // Safe to read now: past the end the window holds zeros.
        assert_eq!(byte_at(&w, CHUNK + 5), 0);
        assert_eq!(byte_at(&w, 0), 0xa5);
        w.unmap(0, 2 * CHUNK).unwrap();
        assert_eq!(w.watched_files(), 0, "the watch goes with the last chunk");
    }

    #[test]
    fn a_reset_unmaps_every_chunk() {
        let w = window();
        let f = file(3 * CHUNK as usize);
        let mut r = Requests(w.clone());
        r.map(0, 0, 3 * CHUNK, 0, f.as_raw_fd()).unwrap();
        assert_eq!(w.mapped_chunks(), 3);
        w.clear();
        assert_eq!(w.mapped_chunks(), 0);
        assert_eq!(w.watched_files(), 0);
    }
}
