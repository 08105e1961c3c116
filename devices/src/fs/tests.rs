//! The device driven as Linux's virtio-fs driver drives it: FUSE requests
//! written into guest memory, put on the request queue, served by the real
//! passthrough over a real temporary directory.

use std::ffi::CString;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::time::{Duration, Instant};

use fuse_backend_rs::abi::fuse_abi::{
    Attr, CreateIn, EntryOut, InHeader, InitIn, MknodIn, OpenIn, OpenOut, OutHeader, ReadIn,
    SetattrIn, WriteIn,
};
use fuse_backend_rs::abi::virtio_fs::{RemovemappingIn, RemovemappingOne, SetupmappingIn};
use virtio_bindings::virtio_mmio::{
    VIRTIO_MMIO_SHM_BASE_HIGH, VIRTIO_MMIO_SHM_BASE_LOW, VIRTIO_MMIO_SHM_LEN_HIGH,
    VIRTIO_MMIO_SHM_LEN_LOW, VIRTIO_MMIO_SHM_SEL,
};
use virtio_queue::desc::RawDescriptor;
use virtio_queue::mock::MockSplitQueue;
use vm_memory::{ByteValued, Bytes, GuestAddress};

use super::dax::{Window, CHUNK, MIN_WINDOW};
use super::guard::{Identity, Policy};
use super::*;
use crate::virtio::mmio::test_driver::{memory, Driver};
use crate::virtio::STATUS_NEEDS_RESET;

const LOOKUP: u32 = 1;
const GETATTR: u32 = 3;
const SETATTR: u32 = 4;
const SYMLINK: u32 = 6;
const MKNOD: u32 = 8;
const MKDIR: u32 = 9;
const UNLINK: u32 = 10;
const RENAME: u32 = 12;
const OPEN: u32 = 14;
const READ: u32 = 15;
const WRITE: u32 = 16;
const INIT: u32 = 26;
const CREATE: u32 = 35;
const SETUPMAPPING: u32 = 48;
const REMOVEMAPPING: u32 = 49;
const ROOT: u64 = 1;

const IN: u64 = 0x10_0000;
const OUT: u64 = 0x20_0000;
const OUT_LEN: u32 = 0x2_0000;
const QSIZE: u16 = 256;

fn share(dir: &std::path::Path, writable: bool) -> FsShare {
    FsShare {
        tag: "fs0".into(),
        root: dir.to_path_buf(),
        policy: Policy {
            writable,
            identity: Identity::Invoker,
        },
        cache: Duration::from_secs(1),
    }
}

struct Guest<'a> {
    drv: Driver,
    req: MockSplitQueue<'a, Memory>,
    _hiprio: MockSplitQueue<'a, Memory>,
    mem: &'a Memory,
    next_desc: u16,
    unique: u64,
    init_reply: Vec<u8>,
}

impl<'a> Guest<'a> {
    /// A driver up to DRIVER_OK and FUSE INIT over a share of `dir`.
    fn new(mem: &'a Memory, dir: &std::path::Path, writable: bool) -> Self {
        Self::with_window(mem, dir, writable, None)
    }

    /// The same, the device having `window` as its DAX window.
    fn with_window(
        mem: &'a Memory,
        dir: &std::path::Path,
        writable: bool,
        window: Option<Arc<Window>>,
    ) -> Self {
        let mut fs = Fs::new(share(dir, writable)).unwrap();
        if let Some(w) = window {
            fs = fs.with_window(w);
        }
        let hiprio = MockSplitQueue::create(mem, GuestAddress(0), QSIZE);
        let req = MockSplitQueue::create(mem, GuestAddress(0x1_0000), QSIZE);
        let mut drv = Driver::new(Box::new(fs), mem.clone());
        let offered = drv.device_features();
        assert!(drv.negotiate(offered));
        drv.setup_queue(0, &hiprio, u32::from(QSIZE));
        drv.setup_queue(1, &req, u32::from(QSIZE));
        drv.driver_ok();
        assert!(drv.transport.is_activated());
        let mut g = Guest {
            drv,
            req,
            _hiprio: hiprio,
            mem,
            next_desc: 0,
            unique: 0,
            init_reply: Vec::new(),
        };
        // Linux's virtio-fs offers (among others) BIG_WRITES and MAX_PAGES.
        let init = InitIn {
            major: 7,
            minor: 33,
            max_readahead: 0x2_0000,
            flags: (1 << 5) | (1 << 22),
        };
        let (err, reply) = g.call(INIT, 0, init.as_slice());
        assert_eq!(err, 0, "INIT");
        g.init_reply = reply;
        g
    }

    fn push(&mut self, parts: &[(u64, u32, bool)]) {
        let base = self.next_desc;
        let descs: Vec<RawDescriptor> = crate::virtio::mmio::test_driver::chain(parts, base, QSIZE)
            .into_iter()
            .map(Into::into)
            .collect();
        self.req.add_desc_chains(&descs, base).unwrap();
        self.next_desc = (base + parts.len() as u16) % QSIZE;
    }

    /// Notifies the request queue and waits for one used entry; its length.
    fn kick(&mut self) -> u32 {
        let before = self.req.used().idx().load();
        self.drv.notify(1);
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.req.used().idx().load() == before {
            assert!(Instant::now() < deadline, "no reply within 10 s");
            std::thread::sleep(Duration::from_millis(1));
        }
        std::thread::sleep(Duration::from_millis(2));
        let after = self.req.used().idx().load();
        let lens: Vec<u32> = (before..after)
            .map(|i| {
                self.req
                    .used()
                    .ring()
                    .ref_at(usize::from(i) % usize::from(QSIZE))
                    .unwrap()
                    .load()
                    .len()
            })
            .collect();
        assert_eq!(lens.len(), 1, "one used entry per request: {lens:?}");
        lens[0]
    }

    /// One request: its error (negative errno, 0) and the reply's payload.
    fn call(&mut self, opcode: u32, nodeid: u64, body: &[u8]) -> (i32, Vec<u8>) {
        self.unique += 1;
        let header = InHeader {
            len: (std::mem::size_of::<InHeader>() + body.len()) as u32,
            opcode,
            unique: self.unique,
            nodeid,
            uid: 0,
            gid: 0,
            pid: 1,
            padding: 0,
        };
        let mut msg = header.as_slice().to_vec();
        msg.extend_from_slice(body);
        self.mem.write_slice(&msg, GuestAddress(IN)).unwrap();
        self.push(&[(IN, msg.len() as u32, false), (OUT, OUT_LEN, true)]);
        let used = self.kick();
        let out: OutHeader = self.mem.read_obj(GuestAddress(OUT)).unwrap();
        assert_eq!(out.unique, self.unique);
        assert_eq!(
            out.len, used,
            "the used length is the reply's (opcode {opcode}, error {})",
            out.error
        );
        let mut payload = vec![0u8; out.len as usize - std::mem::size_of::<OutHeader>()];
        self.mem
            .read_slice(&mut payload, GuestAddress(OUT + 16))
            .unwrap();
        (out.error, payload)
    }

    fn entry(&mut self, opcode: u32, parent: u64, body: &[u8]) -> Result<EntryOut, i32> {
        match self.call(opcode, parent, body) {
            (0, p) => Ok(*EntryOut::from_slice(&p[..std::mem::size_of::<EntryOut>()]).unwrap()),
            (e, _) => Err(-e),
        }
    }

    fn lookup(&mut self, parent: u64, name: &str) -> Result<EntryOut, i32> {
        self.entry(LOOKUP, parent, &cstr(name))
    }

    fn open(&mut self, nodeid: u64, flags: i32) -> Result<u64, i32> {
        let body = OpenIn {
            flags: flags as u32,
            fuse_flags: 0,
        };
        match self.call(OPEN, nodeid, body.as_slice()) {
            (0, p) => Ok(OpenOut::from_slice(&p[..16]).unwrap().fh),
            (e, _) => Err(-e),
        }
    }

    fn create(&mut self, parent: u64, name: &str, mode: u32) -> Result<(EntryOut, u64), i32> {
        let mut body = CreateIn {
            flags: (libc::O_WRONLY | libc::O_CREAT) as u32,
            mode: libc::S_IFREG | mode,
            umask: 0o022,
            fuse_flags: 0,
        }
        .as_slice()
        .to_vec();
        body.extend_from_slice(&cstr(name));
        match self.call(CREATE, parent, &body) {
            (0, p) => {
                let n = std::mem::size_of::<EntryOut>();
                let e = *EntryOut::from_slice(&p[..n]).unwrap();
                Ok((e, OpenOut::from_slice(&p[n..n + 16]).unwrap().fh))
            }
            (e, _) => Err(-e),
        }
    }

    fn write(&mut self, nodeid: u64, fh: u64, data: &[u8]) -> i32 {
        let mut body = WriteIn {
            fh,
            offset: 0,
            size: data.len() as u32,
            ..Default::default()
        }
        .as_slice()
        .to_vec();
        body.extend_from_slice(data);
        self.call(WRITE, nodeid, &body).0
    }

    fn read(&mut self, nodeid: u64, fh: u64, size: u32) -> Result<Vec<u8>, i32> {
        let body = ReadIn {
            fh,
            offset: 0,
            size,
            ..Default::default()
        };
        match self.call(READ, nodeid, body.as_slice()) {
            (0, p) => Ok(p),
            (e, _) => Err(-e),
        }
    }

    fn mknod(&mut self, name: &str, mode: u32) -> Result<EntryOut, i32> {
        let mut body = MknodIn {
            mode,
            rdev: 0x0801,
            umask: 0,
            padding: 0,
        }
        .as_slice()
        .to_vec();
        body.extend_from_slice(&cstr(name));
        self.entry(MKNOD, ROOT, &body)
    }
}

fn cstr(s: &str) -> Vec<u8> {
    CString::new(s).unwrap().into_bytes_with_nul()
}

fn attr(e: &EntryOut) -> Attr {
    e.attr
}

#[test]
fn the_config_space_holds_the_tag_and_one_request_queue() {
    let dir = tempfile::tempdir().unwrap();
    let fs = Fs::new(share(dir.path(), true)).unwrap();
    assert_eq!(fs.device_type(), 26);
    assert_eq!(fs.queue_max_sizes(), &[1024, 1024]);
    let mut config = [0xffu8; 44];
    fs.read_config(0, &mut config);
    assert_eq!(&config[..3], b"fs0");
    assert!(config[3..36].iter().all(|&b| b == 0));
    assert_eq!(&config[36..40], &1u32.to_le_bytes());
    assert_eq!(&config[40..], &[0; 4], "past the end reads zeros");
}

#[test]
fn init_grants_the_guest_requests_of_one_mib() {
    let dir = tempfile::tempdir().unwrap();
    let mem = memory(4);
    let g = Guest::new(&mem, dir.path(), true);
    let r = &g.init_reply;
    let max_write = u32::from_le_bytes(r[20..24].try_into().unwrap());
    let max_pages = u16::from_le_bytes(r[28..30].try_into().unwrap());
    assert_eq!((max_write, max_pages), (1 << 20, 256));
}

#[test]
fn a_bad_tag_a_missing_directory_or_a_file_is_refused_as_a_share() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = share(dir.path(), true);
    s.tag = "x".repeat(37);
    assert!(matches!(Fs::new(s.clone()), Err(FsError::Tag(_))));
    s.tag = String::new();
    assert!(matches!(Fs::new(s.clone()), Err(FsError::Tag(_))));
    let file = dir.path().join("file");
    std::fs::write(&file, b"x").unwrap();
    for root in [dir.path().join("missing"), file] {
        let e = Fs::new(share(&root, true)).unwrap_err();
        assert!(e.to_string().contains(&root.display().to_string()), "{e}");
    }
}

#[test]
fn a_host_file_is_looked_up_opened_and_read_and_its_owner_shows_as_root() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("in"), b"hello from the host\n").unwrap();
    let mem = memory(4);
    let mut g = Guest::new(&mem, dir.path(), true);
    let e = g.lookup(ROOT, "in").unwrap();
    assert_eq!(attr(&e).size, 20);
    assert_eq!((attr(&e).uid, attr(&e).gid), (0, 0));
    let fh = g.open(e.nodeid, libc::O_RDONLY).unwrap();
    assert_eq!(
        g.read(e.nodeid, fh, 4096).unwrap(),
        b"hello from the host\n"
    );
    assert_eq!(g.lookup(ROOT, "nothing").unwrap_err(), libc::ENOENT);
}

#[test]
fn a_created_file_reaches_the_host_as_the_invoking_user_without_setuid_bits() {
    let dir = tempfile::tempdir().unwrap();
    let mem = memory(4);
    let mut g = Guest::new(&mem, dir.path(), true);
    let (e, fh) = g.create(ROOT, "out", 0o6755).unwrap();
    assert_eq!(g.write(e.nodeid, fh, b"out\n"), 0);
    let host = dir.path().join("out");
    assert_eq!(std::fs::read(&host).unwrap(), b"out\n");
    let meta = std::fs::metadata(&host).unwrap();
    assert_eq!(meta.permissions().mode() & 0o7777, 0o755);
    // SAFETY: geteuid cannot fail.
    assert_eq!(meta.uid(), unsafe { libc::geteuid() });
    let mut body = SetattrIn {
        valid: 1, // FATTR_MODE
        mode: libc::S_IFREG | 0o4777,
        ..Default::default()
    };
    assert_eq!(g.call(SETATTR, e.nodeid, body.as_slice()).0, 0);
    let mode = std::fs::metadata(&host).unwrap().permissions().mode();
    assert_eq!(mode & 0o7777, 0o777, "chmod u+s is stripped");
    body.valid = 2; // FATTR_UID
    body.uid = 1000;
    assert_eq!(g.call(SETATTR, e.nodeid, body.as_slice()).0, -libc::EPERM);
    body.uid = 0;
    assert_eq!(
        g.call(SETATTR, e.nodeid, body.as_slice()).0,
        0,
        "chown to root is a no-op"
    );
}

#[test]
fn a_read_only_share_refuses_every_change_with_erofs_and_the_host_is_untouched() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("keep"), b"original").unwrap();
    let mem = memory(4);
    let mut g = Guest::new(&mem, dir.path(), false);
    assert_eq!(g.create(ROOT, "new", 0o644).unwrap_err(), libc::EROFS);
    let mut mkdir = 0o755u32.to_le_bytes().to_vec();
    mkdir.extend_from_slice(&0u32.to_le_bytes());
    mkdir.extend_from_slice(&cstr("dir"));
    assert_eq!(g.entry(MKDIR, ROOT, &mkdir).unwrap_err(), libc::EROFS);
    assert_eq!(
        g.mknod("fifo", libc::S_IFIFO | 0o644).unwrap_err(),
        libc::EROFS
    );
    let keep = g.lookup(ROOT, "keep").unwrap();
    for flags in [libc::O_WRONLY, libc::O_RDWR, libc::O_RDONLY | libc::O_TRUNC] {
        assert_eq!(g.open(keep.nodeid, flags).unwrap_err(), libc::EROFS);
    }
    assert_eq!(g.call(UNLINK, ROOT, &cstr("keep")).0, -libc::EROFS);
    let fh = g.open(keep.nodeid, libc::O_RDONLY).unwrap();
    assert_eq!(g.write(keep.nodeid, fh, b"changed"), -libc::EROFS);
    assert_eq!(g.read(keep.nodeid, fh, 64).unwrap(), b"original");
    assert_eq!(std::fs::read(dir.path().join("keep")).unwrap(), b"original");
    let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
    assert_eq!(names.len(), 1);
}

#[test]
fn names_that_leave_the_directory_are_refused_and_symlinks_are_never_followed() {
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("secret"), b"secret").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mem = memory(4);
    let mut g = Guest::new(&mem, dir.path(), true);
    for bad in ["..", ".", "../secret", "a/b"] {
        assert_eq!(g.lookup(ROOT, bad).unwrap_err(), libc::EINVAL, "{bad}");
    }
    // The guest makes a symlink to outside the share, then uses it.
    let mut body = cstr("esc");
    body.extend_from_slice(&cstr(&outside.path().display().to_string()));
    let link = g.entry(SYMLINK, ROOT, &body).unwrap();
    assert_eq!(attr(&link).mode & libc::S_IFMT, libc::S_IFLNK);
    assert_eq!(
        g.open(link.nodeid, libc::O_RDONLY).unwrap_err(),
        libc::ELOOP
    );
    assert_eq!(g.lookup(link.nodeid, "secret").unwrap_err(), libc::ENOTDIR);
    let (err, _) = g.call(GETATTR, link.nodeid, &[0u8; 16]);
    assert_eq!(err, 0);
    // A node id the server never handed out reaches nothing.
    assert_eq!(g.lookup(0xdead_beef, "secret").unwrap_err(), libc::EBADF);
    assert_eq!(
        g.open(0xdead_beef, libc::O_RDONLY).unwrap_err(),
        libc::EBADF
    );
    let host = std::fs::symlink_metadata(dir.path().join("esc")).unwrap();
    assert!(host.file_type().is_symlink());
}

#[test]
fn mknod_makes_fifos_but_never_device_nodes_and_a_fifo_is_not_opened_on_the_host() {
    let dir = tempfile::tempdir().unwrap();
    let mem = memory(4);
    let mut g = Guest::new(&mem, dir.path(), true);
    for kind in [libc::S_IFCHR, libc::S_IFBLK] {
        assert_eq!(g.mknod("dev", kind | 0o666).unwrap_err(), libc::EPERM);
    }
    assert!(!dir.path().join("dev").exists());
    let fifo = g
        .mknod("fifo", libc::S_IFIFO | libc::S_ISUID | 0o644)
        .unwrap();
    let meta = std::fs::symlink_metadata(dir.path().join("fifo")).unwrap();
    assert!(meta.file_type().is_fifo());
    assert_eq!(meta.permissions().mode() & libc::S_ISUID, 0);
    // Opening a FIFO with no writer would block a server thread forever.
    assert_eq!(
        g.open(fifo.nodeid, libc::O_RDONLY).unwrap_err(),
        libc::ENXIO
    );
}

#[test]
fn create_never_opens_a_name_that_exists() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("there"), b"x").unwrap();
    nix::unistd::mkfifo(&dir.path().join("pipe"), nix::sys::stat::Mode::S_IRWXU).unwrap();
    let mem = memory(4);
    let mut g = Guest::new(&mem, dir.path(), true);
    assert_eq!(g.create(ROOT, "there", 0o644).unwrap_err(), libc::EEXIST);
    assert_eq!(g.create(ROOT, "pipe", 0o644).unwrap_err(), libc::EEXIST);
}

#[test]
fn a_garbage_request_gets_an_error_reply_and_the_device_keeps_serving() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("in"), b"x").unwrap();
    let mem = memory(4);
    let mut g = Guest::new(&mem, dir.path(), true);
    mem.write_slice(&[0xff, 0x01, 0x02], GuestAddress(IN))
        .unwrap();
    g.push(&[(IN, 3, false), (OUT, OUT_LEN, true)]);
    assert_eq!(g.kick(), 0);
    // A header whose length claims more than the chain holds.
    let h = InHeader {
        len: u32::MAX,
        opcode: LOOKUP,
        unique: 99,
        nodeid: ROOT,
        ..Default::default()
    };
    mem.write_slice(h.as_slice(), GuestAddress(IN)).unwrap();
    g.push(&[(IN, 40, false), (OUT, OUT_LEN, true)]);
    let used = g.kick();
    let out: OutHeader = mem.read_obj(GuestAddress(OUT)).unwrap();
    assert_eq!((out.unique, out.len), (99, used), "{out:?}");
    assert!(out.error < 0, "{out:?}");
    // A rename whose names lack their NULs: the server gives up without a
    // reply of its own; the device answers EIO for it.
    let (err, _) = g.call(RENAME, ROOT, &[&ROOT.to_le_bytes()[..], b"in"].concat());
    assert_eq!(err, -libc::EIO);
    assert_eq!(g.drv.status() & STATUS_NEEDS_RESET, 0);
    assert!(g.lookup(ROOT, "in").is_ok());
}

#[test]
fn a_descriptor_outside_guest_memory_marks_the_device_needs_reset() {
    let dir = tempfile::tempdir().unwrap();
    let mem = memory(4);
    let mut g = Guest::new(&mem, dir.path(), true);
    g.push(&[(IN, 40, false), (0x1_0000_0000, OUT_LEN, true)]);
    g.drv.notify(1);
    let deadline = Instant::now() + Duration::from_secs(10);
    while g.drv.status() & STATUS_NEEDS_RESET == 0 {
        assert!(Instant::now() < deadline, "no NEEDS_RESET within 10 s");
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn a_guest_that_deletes_while_it_lists_sees_every_entry_once() {
    // rm -r's pattern: read a batch, unlink it, read on from the offset.
    // tmpfs offsets are positions on older kernels; the listing snapshot
    // keeps them stable wherever the share lives.
    let base = std::path::Path::new("/dev/shm");
    let dir = if base.is_dir() {
        tempfile::tempdir_in(base).unwrap()
    } else {
        tempfile::tempdir().unwrap()
    };
    // 100: the mock driver's rings serve about 128 requests per test.
    for i in 0..100 {
        std::fs::write(dir.path().join(format!("file-{i:03}")), b"x").unwrap();
    }
    let mem = memory(4);
    let mut g = Guest::new(&mem, dir.path(), true);
    const OPENDIR: u32 = 27;
    const READDIR: u32 = 28;
    let body = OpenIn {
        flags: libc::O_RDONLY as u32,
        fuse_flags: 0,
    };
    let (err, p) = g.call(OPENDIR, ROOT, body.as_slice());
    assert_eq!(err, 0);
    let fh = OpenOut::from_slice(&p[..16]).unwrap().fh;
    let mut seen = std::collections::BTreeSet::new();
    let mut offset = 0;
    loop {
        let body = ReadIn {
            fh,
            offset,
            size: 1024,
            ..Default::default()
        };
        let (err, p) = g.call(READDIR, ROOT, body.as_slice());
        assert_eq!(err, 0);
        if p.is_empty() {
            break;
        }
        let mut at = 0;
        let mut names = Vec::new();
        while at + 24 <= p.len() {
            let off = u64::from_le_bytes(p[at + 8..at + 16].try_into().unwrap());
            let len = u32::from_le_bytes(p[at + 16..at + 20].try_into().unwrap()) as usize;
            names.push(String::from_utf8(p[at + 24..at + 24 + len].to_vec()).unwrap());
            offset = off;
            at += (24 + len).div_ceil(8) * 8;
        }
        for n in names {
            assert!(seen.insert(n.clone()), "{n} listed twice");
            assert_eq!(g.call(UNLINK, ROOT, &cstr(&n)).0, 0, "unlink {n}");
        }
    }
    assert_eq!(seen.len(), 100, "every entry listed once");
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
}

/// Where the tests' DAX windows sit in the guest's physical space.
const WINDOW_AT: u64 = 1 << 36;

fn window() -> Arc<Window> {
    Window::new(GuestAddress(WINDOW_AT), MIN_WINDOW).unwrap()
}

impl Guest<'_> {
    fn setupmapping(&mut self, nodeid: u64, moffset: u64, write: bool) -> i32 {
        let body = SetupmappingIn {
            fh: 0,
            foffset: 0,
            len: CHUNK,
            flags: if write { 3 } else { 2 },
            moffset,
        };
        self.call(SETUPMAPPING, nodeid, body.as_slice()).0
    }

    fn shm(&mut self, id: u32) -> (u64, u64) {
        self.drv.write(VIRTIO_MMIO_SHM_SEL, id);
        let r = |d: &mut Driver, lo, hi| u64::from(d.read(lo)) | u64::from(d.read(hi)) << 32;
        (
            r(
                &mut self.drv,
                VIRTIO_MMIO_SHM_BASE_LOW,
                VIRTIO_MMIO_SHM_BASE_HIGH,
            ),
            r(
                &mut self.drv,
                VIRTIO_MMIO_SHM_LEN_LOW,
                VIRTIO_MMIO_SHM_LEN_HIGH,
            ),
        )
    }
}

#[test]
fn a_window_is_shared_memory_region_0_and_a_device_without_one_has_none() {
    let dir = tempfile::tempdir().unwrap();
    let mem = memory(4);
    let mut g = Guest::with_window(&mem, dir.path(), true, Some(window()));
    assert_eq!(g.shm(0), (WINDOW_AT, MIN_WINDOW));
    assert_eq!(g.shm(1), (u64::MAX, u64::MAX));
    let mut bare = Guest::new(&mem, dir.path(), true);
    assert_eq!(bare.shm(0), (u64::MAX, u64::MAX));
    assert_eq!(bare.setupmapping(ROOT, 0, false), -libc::EINVAL);
}

#[test]
fn setupmapping_maps_a_share_file_into_the_window_and_removemapping_takes_it_back() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("f"), b"mapped bytes").unwrap();
    let mem = memory(4);
    let w = window();
    let mut g = Guest::with_window(&mem, dir.path(), true, Some(w.clone()));
    let f = g.lookup(ROOT, "f").unwrap();
    assert_eq!(g.setupmapping(f.nodeid, 2 * CHUNK, true), 0);
    assert_eq!(w.mapped_chunks(), 1);
    // SAFETY: the chunk at 2 * CHUNK maps the file (12 bytes) just above.
    let seen =
        unsafe { std::slice::from_raw_parts(w.region().as_ptr().add(2 * CHUNK as usize), 12) };
    assert_eq!(seen, b"mapped bytes");
    // Outside the window, or not a whole chunk: refused, nothing mapped.
    assert_eq!(g.setupmapping(f.nodeid, MIN_WINDOW, false), -libc::EINVAL);
    assert_eq!(g.setupmapping(f.nodeid, 4096, false), -libc::EINVAL);
    let mut body = RemovemappingIn { count: 1 }.as_slice().to_vec();
    let one = RemovemappingOne {
        moffset: 2 * CHUNK,
        len: CHUNK,
    };
    body.extend_from_slice(one.as_slice());
    assert_eq!(g.call(REMOVEMAPPING, f.nodeid, &body).0, 0);
    assert_eq!(w.mapped_chunks(), 0);
}

#[test]
fn a_read_only_share_maps_files_for_reading_only_and_nothing_but_files_is_mapped() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("f"), b"x").unwrap();
    std::fs::create_dir(dir.path().join("d")).unwrap();
    nix::unistd::mkfifo(&dir.path().join("p"), nix::sys::stat::Mode::S_IRWXU).unwrap();
    let mem = memory(4);
    let w = window();
    let mut g = Guest::with_window(&mem, dir.path(), false, Some(w.clone()));
    let f = g.lookup(ROOT, "f").unwrap().nodeid;
    assert_eq!(g.setupmapping(f, 0, true), -libc::EROFS);
    assert_eq!(g.setupmapping(f, 0, false), 0);
    let d = g.lookup(ROOT, "d").unwrap().nodeid;
    assert_eq!(g.setupmapping(d, CHUNK, false), -libc::EISDIR);
    // A FIFO opened with no writer would block a server thread forever.
    let p = g.lookup(ROOT, "p").unwrap().nodeid;
    assert_eq!(g.setupmapping(p, CHUNK, false), -libc::ENXIO);
    assert_eq!(g.setupmapping(0xdead_beef, CHUNK, false), -libc::EBADF);
    assert_eq!(w.mapped_chunks(), 1);
}

#[test]
fn a_request_whose_buffer_lies_in_the_window_gets_efault_and_the_device_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("f"), b"contents").unwrap();
    let mem = memory(4);
    let mut g = Guest::with_window(&mem, dir.path(), true, Some(window()));
    let f = g.lookup(ROOT, "f").unwrap().nodeid;
    let fh = g.open(f, libc::O_RDONLY).unwrap();
    // A READ whose data buffer is a page of the window (direct I/O into a
    // DAX mapping): header and reply header in RAM, the data not.
    g.unique += 1;
    let header = InHeader {
        len: (std::mem::size_of::<InHeader>() + std::mem::size_of::<ReadIn>()) as u32,
        opcode: READ,
        unique: g.unique,
        nodeid: f,
        ..Default::default()
    };
    let body = ReadIn {
        fh,
        size: 4096,
        ..Default::default()
    };
    let msg = [header.as_slice(), body.as_slice()].concat();
    mem.write_slice(&msg, GuestAddress(IN)).unwrap();
    g.push(&[
        (IN, msg.len() as u32, false),
        (OUT, 16, true),
        (WINDOW_AT, 4096, true),
    ]);
    assert_eq!(g.kick(), 16);
    let out: OutHeader = mem.read_obj(GuestAddress(OUT)).unwrap();
    assert_eq!((out.unique, out.error), (g.unique, -libc::EFAULT));
    assert_eq!(g.drv.status() & STATUS_NEEDS_RESET, 0);
    assert_eq!(g.read(f, fh, 64).unwrap(), b"contents");
}
