//! The share's guard: a [`FileSystem`] in front of `fuse-backend-rs`'s
//! passthrough file system that holds every request to what a share
//! allows, whatever the guest sends.
//!
//! The passthrough keeps the containment that comes from how it opens
//! things: every host file is reached by `openat` relative to its parent's
//! `O_PATH` descriptor with `O_NOFOLLOW`, so a symlink in the share (the
//! guest may create any) is never followed on the host; node ids and file
//! handles are indexes into its own tables, never `open_by_handle_at` data.
//! The guard adds, before the passthrough sees a request:
//!
//! * names: empty, `.`, `..` or containing `/` are refused (`EINVAL`);
//! * a read-only share refuses every change with `EROFS`, opens for
//!   writing included — the server refuses, not only the guest's mount;
//! * only regular files are opened on the host (a FIFO, socket, device or
//!   symlink inode: `ENXIO`/`ELOOP`), so no open blocks a server thread;
//!   `create` never opens an existing name (`O_EXCL`);
//! * `mknod` makes FIFOs, sockets and regular files only (devices: `EPERM`);
//!   setuid and setgid bits are stripped from every mode set;
//!   `RENAME_WHITEOUT` (a device node) is refused;
//! * identity: every request runs as the server process (the invoking
//!   user), or as `nobody` for a share served as [`Identity::Nobody`]
//!   (its worker threads drop to it, [`super::worker`]); a
//!   file the guest creates belongs to the invoking user. The guest sees
//!   the invoking user's uid and gid as 0 and every other owner as
//!   `nobody` (65534); `chown` succeeds only to the guest's root (a
//!   no-op), else `EPERM`.
//!
//! * listings: a directory handle's listing is taken whole when the guest
//!   starts reading it (offset 0) and served from that snapshot, with
//!   offsets of our own. The host's `telldir` cookies are positions on some
//!   file systems (tmpfs before Linux 6.6), so a guest that deletes while
//!   it lists (`rm -r`) would skip entries and fail with `ENOTEMPTY`.
//!   READDIRPLUS is not offered, so every listing goes through here.
//!
//! * DAX mappings (`SETUPMAPPING`): regular files only, and a writable
//!   mapping only on a writable share (`EROFS`); the file is opened the
//!   passthrough's way (its `O_PATH` descriptor reopened) and the window
//!   ([`super::dax`]) checks where it goes.
//!
//! Extended attributes, locks and `ioctl` are not forwarded (`ENOSYS`: the
//! guest kernel keeps locks local).

use std::collections::HashMap;
use std::ffi::CStr;
use std::io;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use boxdesk_platform::sync::lock;

use fuse_backend_rs::abi::fuse_abi::{stat64, statvfs64, CreateIn};
use fuse_backend_rs::abi::virtio_fs::{RemovemappingOne, SetupmappingFlags};
use fuse_backend_rs::api::filesystem::{
    Context, DirEntry, Entry, FileSystem, FsOptions, OpenOptions, SetattrValid, ZeroCopyReader,
    ZeroCopyWriter,
};
use fuse_backend_rs::transport::FsCacheReqHandler;

/// The uid and gid the guest sees for every owner but the invoking user.
pub const NOBODY: u32 = 65534;

/// Who the host sees doing a share's requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Identity {
    /// The server process: the user who started the VM.
    Invoker,
    /// `nobody` (65534), for the host's own system shared read-only into a
    /// VM started by root (`--root host`): the guest's root reads what any
    /// user may, not `/etc/shadow`. Only possible when the server is root.
    Nobody,
}

/// What a share allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Policy {
    /// Whether the guest may change anything.
    pub writable: bool,
    /// Who the host sees.
    pub identity: Identity,
}

/// The most entries a listing snapshot holds; a bigger directory lists
/// its first this many.
pub const MAX_LISTING: usize = 1 << 20;

/// One entry of a listing snapshot: inode, type, name.
type Listed = (u64, u32, Box<[u8]>);

/// A [`FileSystem`] holding `F` to a share's [`Policy`].
pub struct Guard<F> {
    inner: F,
    policy: Policy,
    /// Listing snapshots by directory handle.
    listings: Mutex<HashMap<u64, Arc<[Listed]>>>,
    /// The server's effective uid and gid, shown to the guest as 0.
    uid: u32,
    gid: u32,
}

fn err(code: i32) -> io::Error {
    io::Error::from_raw_os_error(code)
}

const SETID_BITS: u32 = libc::S_ISUID | libc::S_ISGID;

/// A single path component the host may look up beneath its parent.
fn check_name(name: &CStr) -> io::Result<()> {
    match name.to_bytes() {
        b"" | b"." | b".." => Err(err(libc::EINVAL)),
        n if n.contains(&b'/') => Err(err(libc::EINVAL)),
        _ => Ok(()),
    }
}

/// Whether open `flags` (the guest's `O_*`) ask to change the file.
fn opens_for_writing(flags: u32) -> bool {
    let flags = flags as i32;
    flags & libc::O_ACCMODE != libc::O_RDONLY || flags & libc::O_TRUNC != 0
}

impl<F> Guard<F> {
    /// Guards `inner` with `policy`, as this process's effective ids.
    pub fn new(inner: F, policy: Policy) -> Self {
        // SAFETY: geteuid and getegid cannot fail and touch no memory.
        let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
        Guard {
            inner,
            policy,
            listings: Mutex::new(HashMap::new()),
            uid,
            gid,
        }
    }

    /// The share's policy.
    pub fn policy(&self) -> Policy {
        self.policy
    }

    fn writable(&self) -> io::Result<()> {
        if self.policy.writable {
            Ok(())
        } else {
            Err(err(libc::EROFS))
        }
    }

    /// The context the passthrough runs a request in: uid 0 there means
    /// "do not switch credentials", i.e. the serving thread's own (the
    /// worker drops a [`Identity::Nobody`] share's threads to `nobody`).
    fn ctx(&self, ctx: &Context) -> Context {
        Context {
            uid: 0,
            gid: 0,
            pid: ctx.pid,
        }
    }

    /// Host owners as the guest sees them.
    fn map_attr(&self, mut st: stat64) -> stat64 {
        st.st_uid = if st.st_uid == self.uid { 0 } else { NOBODY };
        st.st_gid = if st.st_gid == self.gid { 0 } else { NOBODY };
        st
    }

    fn map_entry(&self, mut e: Entry) -> Entry {
        e.attr = self.map_attr(e.attr);
        e
    }
}

impl<F: FileSystem<Inode = u64, Handle = u64>> Guard<F> {
    /// The whole listing of the open directory `handle`, read now.
    fn snapshot(&self, ctx: &Context, inode: u64, handle: u64) -> io::Result<Arc<[Listed]>> {
        let mut all: Vec<Listed> = Vec::new();
        let mut offset = 0;
        loop {
            let before = all.len();
            let mut next = offset;
            self.inner
                .readdir(&self.ctx(ctx), inode, handle, 64 << 10, offset, &mut |d| {
                    if all.len() >= MAX_LISTING {
                        return Ok(0);
                    }
                    all.push((d.ino, d.type_, d.name.into()));
                    next = d.offset;
                    Ok(1)
                })?;
            if all.len() == before || all.len() >= MAX_LISTING || next == offset {
                return Ok(all.into());
            }
            offset = next;
        }
    }

    /// Whether `inode` is a regular file, the only kind opened on the host
    /// (a FIFO would block a server thread; a device is not the share's).
    fn regular_file(&self, ctx: &Context, inode: u64) -> io::Result<()> {
        match self.kind(ctx, inode)? {
            libc::S_IFREG => Ok(()),
            libc::S_IFLNK => Err(err(libc::ELOOP)),
            libc::S_IFDIR => Err(err(libc::EISDIR)),
            _ => Err(err(libc::ENXIO)),
        }
    }

    /// The file type bits of `inode`.
    fn kind(&self, ctx: &Context, inode: u64) -> io::Result<u32> {
        let (st, _) = self.inner.getattr(&self.ctx(ctx), inode, None)?;
        Ok(st.st_mode & libc::S_IFMT)
    }
}

impl<F: FileSystem<Inode = u64, Handle = u64>> FileSystem for Guard<F> {
    type Inode = u64;
    type Handle = u64;

    fn init(&self, capable: FsOptions) -> io::Result<FsOptions> {
        let mut opts = self.inner.init(capable)?;
        // Listings go through the snapshot; DAX is per mount (dax=always),
        // not per file.
        opts.remove(
            FsOptions::DO_READDIRPLUS | FsOptions::READDIRPLUS_AUTO | FsOptions::PERFILE_DAX,
        );
        // Requests of up to 1 MiB (256 pages; the passthrough asks for
        // neither, which leaves the guest at 4 KiB writes), and reads the
        // guest may issue side by side for the worker pool.
        opts |= FsOptions::BIG_WRITES | FsOptions::MAX_PAGES | FsOptions::ASYNC_READ;
        Ok(opts)
    }

    fn destroy(&self) {
        self.inner.destroy()
    }

    fn lookup(&self, ctx: &Context, parent: u64, name: &CStr) -> io::Result<Entry> {
        check_name(name)?;
        let e = self.inner.lookup(&self.ctx(ctx), parent, name)?;
        Ok(self.map_entry(e))
    }

    fn forget(&self, ctx: &Context, inode: u64, count: u64) {
        self.inner.forget(&self.ctx(ctx), inode, count)
    }

    fn batch_forget(&self, ctx: &Context, requests: Vec<(u64, u64)>) {
        self.inner.batch_forget(&self.ctx(ctx), requests)
    }

    fn getattr(
        &self,
        ctx: &Context,
        inode: u64,
        handle: Option<u64>,
    ) -> io::Result<(stat64, Duration)> {
        let (st, t) = self.inner.getattr(&self.ctx(ctx), inode, handle)?;
        Ok((self.map_attr(st), t))
    }

    fn setattr(
        &self,
        ctx: &Context,
        inode: u64,
        mut attr: stat64,
        handle: Option<u64>,
        mut valid: SetattrValid,
    ) -> io::Result<(stat64, Duration)> {
        self.writable()?;
        if valid.contains(SetattrValid::UID) {
            if attr.st_uid != 0 {
                return Err(err(libc::EPERM));
            }
            valid.remove(SetattrValid::UID);
        }
        if valid.contains(SetattrValid::GID) {
            if attr.st_gid != 0 {
                return Err(err(libc::EPERM));
            }
            valid.remove(SetattrValid::GID);
        }
        attr.st_mode &= !SETID_BITS;
        let (st, t) = self
            .inner
            .setattr(&self.ctx(ctx), inode, attr, handle, valid)?;
        Ok((self.map_attr(st), t))
    }

    fn readlink(&self, ctx: &Context, inode: u64) -> io::Result<Vec<u8>> {
        self.inner.readlink(&self.ctx(ctx), inode)
    }

    fn symlink(
        &self,
        ctx: &Context,
        linkname: &CStr,
        parent: u64,
        name: &CStr,
    ) -> io::Result<Entry> {
        self.writable()?;
        check_name(name)?;
        let e = self.inner.symlink(&self.ctx(ctx), linkname, parent, name)?;
        Ok(self.map_entry(e))
    }

    fn mknod(
        &self,
        ctx: &Context,
        parent: u64,
        name: &CStr,
        mode: u32,
        rdev: u32,
        umask: u32,
    ) -> io::Result<Entry> {
        self.writable()?;
        check_name(name)?;
        match mode & libc::S_IFMT {
            libc::S_IFIFO | libc::S_IFSOCK | libc::S_IFREG => {}
            _ => return Err(err(libc::EPERM)),
        }
        let e = self.inner.mknod(
            &self.ctx(ctx),
            parent,
            name,
            mode & !SETID_BITS,
            rdev,
            umask,
        )?;
        Ok(self.map_entry(e))
    }

    fn mkdir(
        &self,
        ctx: &Context,
        parent: u64,
        name: &CStr,
        mode: u32,
        umask: u32,
    ) -> io::Result<Entry> {
        self.writable()?;
        check_name(name)?;
        let e = self
            .inner
            .mkdir(&self.ctx(ctx), parent, name, mode & !SETID_BITS, umask)?;
        Ok(self.map_entry(e))
    }

    fn unlink(&self, ctx: &Context, parent: u64, name: &CStr) -> io::Result<()> {
        self.writable()?;
        check_name(name)?;
        self.inner.unlink(&self.ctx(ctx), parent, name)
    }

    fn rmdir(&self, ctx: &Context, parent: u64, name: &CStr) -> io::Result<()> {
        self.writable()?;
        check_name(name)?;
        self.inner.rmdir(&self.ctx(ctx), parent, name)
    }

    fn rename(
        &self,
        ctx: &Context,
        olddir: u64,
        oldname: &CStr,
        newdir: u64,
        newname: &CStr,
        flags: u32,
    ) -> io::Result<()> {
        self.writable()?;
        check_name(oldname)?;
        check_name(newname)?;
        if flags & libc::RENAME_WHITEOUT != 0 {
            return Err(err(libc::EINVAL));
        }
        self.inner
            .rename(&self.ctx(ctx), olddir, oldname, newdir, newname, flags)
    }

    fn link(&self, ctx: &Context, inode: u64, newparent: u64, newname: &CStr) -> io::Result<Entry> {
        self.writable()?;
        check_name(newname)?;
        let e = self.inner.link(&self.ctx(ctx), inode, newparent, newname)?;
        Ok(self.map_entry(e))
    }

    fn open(
        &self,
        ctx: &Context,
        inode: u64,
        flags: u32,
        fuse_flags: u32,
    ) -> io::Result<(Option<u64>, OpenOptions, Option<u32>)> {
        if opens_for_writing(flags) {
            self.writable()?;
        }
        self.regular_file(ctx, inode)?;
        self.inner.open(&self.ctx(ctx), inode, flags, fuse_flags)
    }

    fn setupmapping(
        &self,
        ctx: &Context,
        inode: u64,
        handle: u64,
        foffset: u64,
        len: u64,
        flags: u64,
        moffset: u64,
        vu_req: &mut dyn FsCacheReqHandler,
    ) -> io::Result<()> {
        if flags & SetupmappingFlags::WRITE.bits() != 0 {
            self.writable()?;
        }
        self.regular_file(ctx, inode)?;
        self.inner.setupmapping(
            &self.ctx(ctx),
            inode,
            handle,
            foffset,
            len,
            flags,
            moffset,
            vu_req,
        )
    }

    fn removemapping(
        &self,
        ctx: &Context,
        inode: u64,
        requests: Vec<RemovemappingOne>,
        vu_req: &mut dyn FsCacheReqHandler,
    ) -> io::Result<()> {
        self.inner
            .removemapping(&self.ctx(ctx), inode, requests, vu_req)
    }

    fn create(
        &self,
        ctx: &Context,
        parent: u64,
        name: &CStr,
        args: CreateIn,
    ) -> io::Result<(Entry, Option<u64>, OpenOptions, Option<u32>)> {
        self.writable()?;
        check_name(name)?;
        let args = CreateIn {
            flags: args.flags | libc::O_EXCL as u32,
            mode: args.mode & !SETID_BITS,
            ..args
        };
        let (e, h, o, p) = self.inner.create(&self.ctx(ctx), parent, name, args)?;
        Ok((self.map_entry(e), h, o, p))
    }

    fn read(
        &self,
        ctx: &Context,
        inode: u64,
        handle: u64,
        w: &mut dyn ZeroCopyWriter,
        size: u32,
        offset: u64,
        lock_owner: Option<u64>,
        flags: u32,
    ) -> io::Result<usize> {
        self.inner.read(
            &self.ctx(ctx),
            inode,
            handle,
            w,
            size,
            offset,
            lock_owner,
            flags,
        )
    }

    fn write(
        &self,
        ctx: &Context,
        inode: u64,
        handle: u64,
        r: &mut dyn ZeroCopyReader,
        size: u32,
        offset: u64,
        lock_owner: Option<u64>,
        delayed_write: bool,
        flags: u32,
        fuse_flags: u32,
    ) -> io::Result<usize> {
        self.writable()?;
        self.inner.write(
            &self.ctx(ctx),
            inode,
            handle,
            r,
            size,
            offset,
            lock_owner,
            delayed_write,
            flags,
            fuse_flags,
        )
    }

    fn flush(&self, ctx: &Context, inode: u64, handle: u64, lock_owner: u64) -> io::Result<()> {
        self.inner.flush(&self.ctx(ctx), inode, handle, lock_owner)
    }

    fn fsync(&self, ctx: &Context, inode: u64, datasync: bool, handle: u64) -> io::Result<()> {
        self.inner.fsync(&self.ctx(ctx), inode, datasync, handle)
    }

    fn fallocate(
        &self,
        ctx: &Context,
        inode: u64,
        handle: u64,
        mode: u32,
        offset: u64,
        length: u64,
    ) -> io::Result<()> {
        self.writable()?;
        self.inner
            .fallocate(&self.ctx(ctx), inode, handle, mode, offset, length)
    }

    fn release(
        &self,
        ctx: &Context,
        inode: u64,
        flags: u32,
        handle: u64,
        flush: bool,
        flock_release: bool,
        lock_owner: Option<u64>,
    ) -> io::Result<()> {
        self.inner.release(
            &self.ctx(ctx),
            inode,
            flags,
            handle,
            flush,
            flock_release,
            lock_owner,
        )
    }

    fn statfs(&self, ctx: &Context, inode: u64) -> io::Result<statvfs64> {
        let mut st = self.inner.statfs(&self.ctx(ctx), inode)?;
        if !self.policy.writable {
            st.f_flag |= libc::ST_RDONLY;
        }
        Ok(st)
    }

    fn opendir(
        &self,
        ctx: &Context,
        inode: u64,
        flags: u32,
    ) -> io::Result<(Option<u64>, OpenOptions)> {
        self.inner.opendir(&self.ctx(ctx), inode, flags)
    }

    fn readdir(
        &self,
        ctx: &Context,
        inode: u64,
        handle: u64,
        _size: u32,
        offset: u64,
        add_entry: &mut dyn FnMut(DirEntry) -> io::Result<usize>,
    ) -> io::Result<()> {
        let known = (offset != 0)
            .then(|| lock(&self.listings).get(&handle).cloned())
            .flatten();
        let listing = match known {
            Some(l) => l,
            None => {
                let l = self.snapshot(ctx, inode, handle)?;
                lock(&self.listings).insert(handle, l.clone());
                l
            }
        };
        let start = usize::try_from(offset).unwrap_or(usize::MAX);
        for (i, (ino, type_, name)) in listing.iter().enumerate().skip(start) {
            let entry = DirEntry {
                ino: *ino,
                offset: i as u64 + 1,
                type_: *type_,
                name,
            };
            if add_entry(entry)? == 0 {
                break;
            }
        }
        Ok(())
    }

    fn fsyncdir(&self, ctx: &Context, inode: u64, datasync: bool, handle: u64) -> io::Result<()> {
        self.inner.fsyncdir(&self.ctx(ctx), inode, datasync, handle)
    }

    fn releasedir(&self, ctx: &Context, inode: u64, flags: u32, handle: u64) -> io::Result<()> {
        lock(&self.listings).remove(&handle);
        self.inner.releasedir(&self.ctx(ctx), inode, flags, handle)
    }

    fn access(&self, ctx: &Context, inode: u64, mask: u32) -> io::Result<()> {
        if mask as i32 & libc::W_OK != 0 {
            self.writable()?;
        }
        self.inner.access(&self.ctx(ctx), inode, mask)
    }

    fn lseek(
        &self,
        ctx: &Context,
        inode: u64,
        handle: u64,
        offset: u64,
        whence: u32,
    ) -> io::Result<u64> {
        self.inner
            .lseek(&self.ctx(ctx), inode, handle, offset, whence)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_that_could_leave_the_parent_are_refused() {
        for bad in [&b""[..], b".", b"..", b"a/b", b"/etc", b"../x"] {
            let name = std::ffi::CString::new(bad).unwrap();
            assert_eq!(
                check_name(&name).unwrap_err().raw_os_error(),
                Some(libc::EINVAL),
                "{bad:?}"
            );
        }
        for good in [&b"a"[..], b"...", b".hidden", b"x..y", b"with space"] {
            assert!(check_name(&std::ffi::CString::new(good).unwrap()).is_ok());
        }
    }

    #[test]
    fn truncating_or_writable_opens_count_as_writing() {
        assert!(!opens_for_writing(libc::O_RDONLY as u32));
        assert!(!opens_for_writing(
            (libc::O_RDONLY | libc::O_NOATIME) as u32
        ));
        assert!(opens_for_writing(libc::O_WRONLY as u32));
        assert!(opens_for_writing(libc::O_RDWR as u32));
        assert!(opens_for_writing((libc::O_RDONLY | libc::O_TRUNC) as u32));
    }
}
