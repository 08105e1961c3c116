//! The VM helper's private mount namespace: a [`View`] lists what the
//! helper may see — its image, its sockets, its state dir, its shares,
//! `/dev/kvm` — and [`View::enter`] makes that the whole of its file
//! system, at the same paths, before the helper has a second thread.
//!
//! How: a new mount namespace (as a user, in
//! a new user namespace mapping only the caller's uid and gid, so files
//! stay the caller's), every mount a slave of the host's (mounts made on
//! the host later still appear beneath a share; none of ours leak out), a
//! detached copy of each listed path's mounts (`open_tree`, Linux 5.2),
//! a tmpfs over `/tmp` as the new root, each copy attached in it at its
//! path (read-only unless writable), then the tmpfs becomes `/` and the
//! old root is detached. `/proc` holds only
//! the helper's own `/proc/PID` (the virtio-fs server reopens files
//! through `/proc/self/fd`); no other process's `/proc/PID/root` can lead
//! back out. The new root itself is read-only: nothing can be created
//! outside the bound paths. A user's helper then drops every capability
//! its user namespace gave it.
//!
//! Only what was open before stays reachable outside the view: the
//! helper's regular files and sockets. A directory descriptor would be a
//! way out (`..` from it climbs the old tree), so [`View::enter`] refuses
//! to finish with one open.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::MetadataExt;
use std::path::{Component, Path, PathBuf};

use nix::mount::{mount, umount2, MntFlags, MsFlags};
use nix::sched::{unshare, CloneFlags};

/// Why the view could not be entered (the helper then does not run).
#[derive(Debug, thiserror::Error)]
pub enum ViewError {
    /// A step failed.
    #[error("cannot {what}")]
    Step {
        /// The step, with its path where it has one.
        what: String,
        /// What the OS said.
        #[source]
        source: std::io::Error,
    },
    /// The process has more than one thread (a namespace is per thread).
    #[error("the VM helper has {0} threads; its mount namespace must come before the second")]
    Threads(usize),
    /// A listed path is not there.
    #[error("{} is not there to be placed in the VM helper's view", .0.display())]
    Missing(PathBuf),
    /// A path the view cannot hold at its own place: `/` itself (the
    /// view would be the whole file system) or one with `..` in it.
    #[error("the VM helper's view cannot hold {} (only paths below /, without ..)", .0.display())]
    Unplaceable(PathBuf),
    /// A directory stayed open from the old file system.
    #[error("descriptor {0} is a directory outside the VM helper's view; it would be a way out")]
    OpenDirectory(i32),
}

fn step(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> ViewError {
    let what = what.into();
    move |source| ViewError::Step { what, source }
}

fn nix_step(what: impl Into<String>) -> impl FnOnce(nix::errno::Errno) -> ViewError {
    let f = step(what);
    move |e| f(e.into())
}

/// One path of the view.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Entry {
    /// The host's file or directory at the same path.
    Bind { writable: bool },
    /// A symlink to this target (a system dir that is a link: `/bin`).
    Link(PathBuf),
}

/// An entry ready to be placed in the new root.
enum Place<'a> {
    /// The detached copy of a path's mounts, and whether it is writable.
    Tree(OwnedFd, bool),
    /// A symlink's target.
    Link(&'a Path),
}

/// What a jailed helper sees, path by path.
#[derive(Debug, Clone, Default)]
pub struct View {
    entries: Vec<(PathBuf, Entry)>,
}

impl View {
    /// An empty view: only `/proc/self`.
    pub fn new() -> View {
        View::default()
    }

    /// The host's `path` (file or directory, with what is mounted beneath
    /// it) at the same path; read-only unless `writable`. A path listed
    /// twice is writable when either says so.
    pub fn bind(&mut self, path: impl Into<PathBuf>, writable: bool) -> &mut View {
        let path = path.into();
        match self.entries.iter_mut().find(|(p, _)| *p == path) {
            Some((_, Entry::Bind { writable: w })) => *w |= writable,
            Some(_) => {}
            None => self.entries.push((path, Entry::Bind { writable })),
        }
        self
    }

    /// A symlink at `path` to `target`.
    pub fn link(&mut self, path: impl Into<PathBuf>, target: impl Into<PathBuf>) -> &mut View {
        self.entries.push((path.into(), Entry::Link(target.into())));
        self
    }

    fn ordered(&self) -> Vec<(&Path, &Entry)> {
        let mut v: Vec<_> = self.entries.iter().map(|(p, e)| (p.as_path(), e)).collect();
        v.sort_by_key(|(p, _)| p.components().count());
        v
    }

    /// Makes this view the process's whole file system; see the module
    /// doc. Call it while the process has one thread.
    pub fn enter(&self) -> Result<(), ViewError> {
        for (path, _) in &self.entries {
            let plain = path.is_absolute()
                && path.components().count() > 1
                && path
                    .components()
                    .all(|c| matches!(c, Component::RootDir | Component::Normal(_)));
            if !plain {
                return Err(ViewError::Unplaceable(path.to_owned()));
            }
        }
        let threads = count_threads()?;
        if threads != 1 {
            return Err(ViewError::Threads(threads));
        }
        let (uid, gid) = (nix::unistd::geteuid(), nix::unistd::getegid());
        if uid.is_root() {
            unshare(CloneFlags::CLONE_NEWNS).map_err(nix_step("unshare a mount namespace"))?;
        } else {
            unshare(CloneFlags::CLONE_NEWUSER | CloneFlags::CLONE_NEWNS)
                .map_err(nix_step("unshare a user and mount namespace"))?;
            std::fs::write("/proc/self/setgroups", "deny").map_err(step("deny setgroups"))?;
            std::fs::write("/proc/self/uid_map", format!("{uid} {uid} 1"))
                .map_err(step("map the uid"))?;
            std::fs::write("/proc/self/gid_map", format!("{gid} {gid} 1"))
                .map_err(step("map the gid"))?;
        }
        mount(
            None::<&str>,
            "/",
            None::<&str>,
            MsFlags::MS_REC | MsFlags::MS_SLAVE,
            None::<&str>,
        )
        .map_err(nix_step("make / a slave"))?;
        // Every source cloned (a detached copy of its mounts) while the
        // host's tree is still in view; attached in the new root later.
        let mut placed = Vec::new();
        for (path, entry) in self.ordered() {
            let place = match entry {
                Entry::Bind { writable } => match clone_tree(path) {
                    Ok(tree) => Place::Tree(tree, *writable),
                    // Nothing there, nothing to show: what needed it fails
                    // later as it would have (a `--kernel` that is not there).
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                    Err(e) => {
                        return Err(step(format!("take {} into the view", path.display()))(e))
                    }
                },
                Entry::Link(target) => Place::Link(target),
            };
            placed.push((path, place));
        }
        let own = PathBuf::from(format!("/proc/{}", std::process::id()));
        let own_fd = clone_tree(&own).map_err(step("take /proc/PID into the view"))?;
        // The new root: a tmpfs over /tmp, filled, then made `/`.
        let new = Path::new("/tmp");
        tmpfs(new, "mode=0755,size=1m")?;
        let mut bound: Vec<(&Path, bool)> = Vec::new();
        for (path, place) in placed {
            let at = beneath(new, path);
            match place {
                Place::Tree(fd, writable) => {
                    let outer = bound.iter().rev().find(|(b, _)| path.starts_with(b));
                    if outer.is_some_and(|&(_, w)| w || !writable) && same_file(&fd, &at) {
                        // Already there, as writable as it must be.
                        continue;
                    }
                    if outer.is_none() {
                        mountpoint(&at, is_dir(&fd))?;
                    } else if std::fs::symlink_metadata(&at).is_err() {
                        return Err(ViewError::Missing(path.to_owned()));
                    }
                    bind(&fd, &at, writable)?;
                    bound.push((path, writable));
                }
                Place::Link(target) => {
                    make_parents(&at)?;
                    std::os::unix::fs::symlink(target, &at)
                        .map_err(step(format!("link {}", path.display())))?;
                }
            }
        }
        // /proc: only this process's own directory, as /proc/self too.
        let at = beneath(new, &own);
        mountpoint(&at, true)?;
        bind(&own_fd, &at, true)?;
        drop(own_fd);
        std::os::unix::fs::symlink(std::process::id().to_string(), new.join("proc/self"))
            .map_err(step("link /proc/self"))?;

        // Nothing more is created: the new root is read-only (this mount,
        // not its superblock).
        mount(
            None::<&str>,
            new,
            None::<&str>,
            MsFlags::MS_BIND
                | MsFlags::MS_REMOUNT
                | MsFlags::MS_RDONLY
                | MsFlags::MS_NOSUID
                | MsFlags::MS_NODEV,
            None::<&str>,
        )
        .map_err(nix_step("make the new root read-only"))?;
        std::env::set_current_dir(new).map_err(step("enter the new root"))?;
        switch_root()?;
        if !uid.is_root() {
            drop_capabilities()?;
        }
        no_open_directories()
    }
}

/// Makes the current directory (a mount point) `/`: `pivot_root` and the
/// old root detached (the man page's idiom), or where the old root is the
/// initial ramfs, which cannot be pivoted, moved over `/` and `chroot`ed
/// into (as `switch_root` does).
fn switch_root() -> Result<(), ViewError> {
    match nix::unistd::pivot_root(".", ".") {
        Ok(()) => umount2(".", MntFlags::MNT_DETACH).map_err(nix_step("detach the old root"))?,
        Err(nix::errno::Errno::EINVAL) => {
            mount(Some("."), "/", None::<&str>, MsFlags::MS_MOVE, None::<&str>)
                .map_err(nix_step("move the new root over /"))?;
            nix::unistd::chroot(".").map_err(nix_step("enter the new root"))?;
        }
        Err(e) => return Err(nix_step("pivot to the new root")(e)),
    }
    std::env::set_current_dir("/").map_err(step("enter /"))
}

/// A detached copy of the mounts at `path` and beneath it
/// (`open_tree(OPEN_TREE_CLONE | AT_RECURSIVE)`, Linux 5.2): what a
/// recursive bind would attach, to be attached anywhere in this namespace
/// by [`attach`].
fn clone_tree(path: &Path) -> std::io::Result<OwnedFd> {
    const OPEN_TREE_CLONE: libc::c_uint = 1;
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes())
        .map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
    let flags =
        OPEN_TREE_CLONE | libc::O_CLOEXEC as libc::c_uint | libc::AT_RECURSIVE as libc::c_uint;
    // SAFETY: open_tree reads a NUL-terminated path that outlives the
    // call; a descriptor it returns is ours alone.
    let fd = unsafe { libc::syscall(libc::SYS_open_tree, libc::AT_FDCWD, c.as_ptr(), flags) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `fd` was just returned by the kernel and is owned by no one
    // else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// Attaches the detached tree `tree` at `at` (`move_mount`).
fn attach(tree: &OwnedFd, at: &Path) -> std::io::Result<()> {
    const MOVE_MOUNT_F_EMPTY_PATH: libc::c_uint = 0x4;
    let c = std::ffi::CString::new(at.as_os_str().as_encoded_bytes())
        .map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
    // SAFETY: move_mount reads two NUL-terminated paths that outlive the
    // call ("" with F_EMPTY_PATH: the tree's descriptor itself).
    let r = unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            tree.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_FDCWD,
            c.as_ptr(),
            MOVE_MOUNT_F_EMPTY_PATH,
        )
    };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

fn fd_stat(fd: &OwnedFd) -> Option<nix::sys::stat::FileStat> {
    nix::sys::stat::fstat(fd.as_raw_fd()).ok()
}

fn is_dir(fd: &OwnedFd) -> bool {
    fd_stat(fd).is_some_and(|st| st.st_mode & libc::S_IFMT == libc::S_IFDIR)
}

/// `path` (absolute) beneath `root`.
fn beneath(root: &Path, path: &Path) -> PathBuf {
    let mut p = root.to_owned();
    p.extend(
        path.components()
            .filter(|c| matches!(c, Component::Normal(_))),
    );
    p
}

fn tmpfs(at: &Path, data: &str) -> Result<(), ViewError> {
    mount(
        Some("tmpfs"),
        at,
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        Some(data),
    )
    .map_err(nix_step(format!("mount a tmpfs on {}", at.display())))
}

fn make_parents(at: &Path) -> Result<(), ViewError> {
    match at.parent() {
        Some(parent) => {
            std::fs::create_dir_all(parent).map_err(step(format!("make {}", parent.display())))
        }
        None => Ok(()),
    }
}

/// An empty directory or file at `at` on the new root's tmpfs.
fn mountpoint(at: &Path, dir: bool) -> Result<(), ViewError> {
    make_parents(at)?;
    let made = if dir {
        std::fs::create_dir(at)
    } else {
        std::fs::File::create(at).map(drop)
    };
    match made {
        Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => {
            Err(step(format!("make {}", at.display()))(e))
        }
        _ => Ok(()),
    }
}

fn same_file(fd: &OwnedFd, at: &Path) -> bool {
    match (fd_stat(fd), std::fs::symlink_metadata(at)) {
        (Some(a), Ok(b)) => a.st_dev == b.dev() && a.st_ino == b.ino(),
        _ => false,
    }
}

/// Attaches the tree `from` at `at`, then makes it read-only unless
/// `writable`, keeping the flags a user namespace may not clear.
fn bind(from: &OwnedFd, at: &Path, writable: bool) -> Result<(), ViewError> {
    let what = || format!("bind {} in the VM helper's view", at.display());
    attach(from, at).map_err(step(what()))?;
    if writable {
        return Ok(());
    }
    let kept = nix::sys::statvfs::statvfs(at).map_err(nix_step(what()))?;
    let mut flags = MsFlags::MS_BIND | MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY;
    use nix::sys::statvfs::FsFlags;
    for (has, set) in [
        (FsFlags::ST_NOSUID, MsFlags::MS_NOSUID),
        (FsFlags::ST_NODEV, MsFlags::MS_NODEV),
        (FsFlags::ST_NOEXEC, MsFlags::MS_NOEXEC),
        (FsFlags::ST_NOATIME, MsFlags::MS_NOATIME),
        (FsFlags::ST_NODIRATIME, MsFlags::MS_NODIRATIME),
    ] {
        if kept.flags().contains(has) {
            flags |= set;
        }
    }
    // Linux's ST_RELATIME, which musl's headers (and so nix there) lack.
    const ST_RELATIME: u64 = 0x1000;
    if kept.flags().bits() as u64 & ST_RELATIME != 0 {
        flags |= MsFlags::MS_RELATIME;
    }
    mount(None::<&str>, at, None::<&str>, flags, None::<&str>).map_err(nix_step(what()))
}

fn count_threads() -> Result<usize, ViewError> {
    Ok(std::fs::read_dir("/proc/self/task")
        .map_err(step("count the helper's threads"))?
        .count())
}

/// Clears the effective, permitted and inheritable sets (capset(2), v3).
fn drop_capabilities() -> Result<(), ViewError> {
    #[repr(C)]
    struct Header {
        version: u32,
        pid: i32,
    }
    #[repr(C)]
    #[derive(Clone, Copy)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    const V3: u32 = 0x2008_0522;
    let header = Header {
        version: V3,
        pid: 0,
    };
    let data = [Data {
        effective: 0,
        permitted: 0,
        inheritable: 0,
    }; 2];
    // SAFETY: capset reads a v3 header and two data structs, both live
    // and laid out as capability.h declares them.
    let r = unsafe { libc::syscall(libc::SYS_capset, &header, data.as_ptr()) };
    if r != 0 {
        return Err(step("drop capabilities")(std::io::Error::last_os_error()));
    }
    Ok(())
}

/// Refuses a directory descriptor left open from the old root.
fn no_open_directories() -> Result<(), ViewError> {
    let fds: Vec<i32> = std::fs::read_dir("/proc/self/fd")
        .map_err(step("list the helper's descriptors"))?
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    for fd in fds {
        // A descriptor closed since the listing (the listing's own) fails.
        let is_dir =
            nix::sys::stat::fstat(fd).is_ok_and(|st| st.st_mode & libc::S_IFMT == libc::S_IFDIR);
        if is_dir {
            return Err(ViewError::OpenDirectory(fd));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
