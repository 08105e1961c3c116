//! What the forked child does between `fork` and exec'ing bubblewrap.
//!
//! Everything is prepared in the parent ([`ChildSetup::new`]): the child
//! only makes system calls on memory it already has — no allocation, no
//! locks — because the helper is multi-threaded. In order:
//!
//! 1. the signal mask the helper blocks for its signal thread is cleared;
//! 2. the child joins the sandbox's cgroups (a write of `0` to each
//!    `cgroup.procs`, opened by the parent), while it still may;
//! 3. when boxdesk runs as root: **staging**. bubblewrap will run as the
//!    sandbox's unprivileged outside uid, which cannot walk into root's
//!    `0700` directories (`$XDG_STATE_HOME` under `/root`, a boxdesk binary
//!    in `/root/…`). So the child enters a mount namespace of its own (a
//!    slave of the host's, so mounts attached later still propagate), opens
//!    every bind source as root, covers `/run` with a small tmpfs, and
//!    binds each source at [`STAGE_DIR`]`/<i>` there; bubblewrap binds those
//!    instead. A `--share` is staged id-mapped ([`super::idmap`]: root's
//!    files are the sandbox root's, what it creates is root's), or plainly
//!    where its file system cannot be id-mapped. The host's mount table is
//!    never touched;
//! 4. a container's rlimits and OOM score are set, and the namespaces it
//!    joins (a pod's network, IPC, UTS) entered, while it still may;
//! 5. when boxdesk runs as root: it becomes the subordinate uid and gid
//!    (supplementary groups dropped first);
//! 6. descriptors are put where bubblewrap and the agent expect them, and
//!    every other one above stderr is closed.
//!
//! This module must never run code that allocates or takes a lock in the
//! child, and never leave the child with root's ids when asked to drop
//! them.

use std::ffi::{CStr, CString};
use std::io;
use std::os::fd::RawFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// Where staged sources appear in the child's private mount namespace.
pub const STAGE_DIR: &str = "/run/boxdesk-stage";

/// The tmpfs that covers `/run` in the child's private namespace.
const STAGE_ROOT: &CStr = c"/run";

/// The staged path of source number `i`.
pub fn staged_path(i: usize) -> PathBuf {
    PathBuf::from(format!("{STAGE_DIR}/{i}"))
}

/// One source to stage.
struct Source {
    host: CString,
    target: CString,
    is_dir: bool,
    /// Staged through an id-mapped mount (a share).
    idmap: bool,
}

/// Everything the child needs, made before the fork.
pub struct ChildSetup {
    cgroup_procs: Vec<RawFd>,
    stage: Vec<Source>,
    /// Filled in by the child (capacity reserved: no allocation there).
    stage_fds: Vec<RawFd>,
    drop_to: Option<(libc::uid_t, libc::gid_t)>,
    /// The id map of shares (a user namespace's descriptor).
    idmap: Option<super::idmap::MountAttr>,
    /// `(descriptor, where it must end up)`, applied last.
    place: Vec<(RawFd, RawFd)>,
    /// Resource limits to set (a container's), before any id is dropped.
    rlimits: Vec<crate::container::Rlimit>,
    /// The OOM score adjustment to write, as decimal digits.
    oom_score_adj: Option<CString>,
    /// Namespaces to enter (`setns`) while still privileged.
    joins: Vec<(RawFd, libc::c_int)>,
}

impl ChildSetup {
    /// `sources` are staged (root only: pass none otherwise), id-mapped
    /// through `userns` where marked; `drop_to` is the uid/gid to become;
    /// `place` the descriptors to move.
    pub fn new(
        cgroup_procs: Vec<RawFd>,
        sources: &[(PathBuf, bool)],
        userns: Option<RawFd>,
        drop_to: Option<(u32, u32)>,
        place: Vec<(RawFd, RawFd)>,
    ) -> io::Result<Self> {
        let cstr = |p: &Path| {
            CString::new(p.as_os_str().as_bytes())
                .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL in a path"))
        };
        let mut stage = Vec::with_capacity(sources.len());
        for (i, (src, idmap)) in sources.iter().enumerate() {
            let is_dir = std::fs::metadata(src)
                .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", src.display())))?
                .is_dir();
            stage.push(Source {
                host: cstr(src)?,
                target: cstr(&staged_path(i))?,
                is_dir,
                idmap: *idmap && userns.is_some(),
            });
        }
        Ok(ChildSetup {
            cgroup_procs,
            stage_fds: Vec::with_capacity(stage.len()),
            stage,
            drop_to,
            idmap: userns.map(|fd| super::idmap::MountAttr {
                attr_set: super::idmap::MOUNT_ATTR_IDMAP,
                userns_fd: fd as u64,
                ..Default::default()
            }),
            place,
            rlimits: Vec::new(),
            oom_score_adj: None,
            joins: Vec::new(),
        })
    }

    /// Also enters the namespace open as `fd` (of kind `CLONE_NEW*`) in the
    /// child, before it drops its privileges.
    pub fn join(&mut self, fd: RawFd, kind: libc::c_int) {
        self.joins.push((fd, kind));
    }

    /// Also sets these resource limits and this OOM score adjustment (a
    /// container's) in the child, while it still may raise them.
    pub fn set_limits(&mut self, rlimits: &[crate::container::Rlimit], oom_score_adj: Option<i32>) {
        self.rlimits = rlimits.to_vec();
        self.oom_score_adj = oom_score_adj.and_then(|v| CString::new(v.to_string()).ok());
    }

    /// Runs in the forked child, before exec.
    ///
    /// # Safety
    /// Only in a child just forked from this process (as `pre_exec` runs
    /// it): it changes the calling process's namespaces, ids and
    /// descriptors.
    pub unsafe fn run(&mut self) -> io::Result<()> {
        // SAFETY: every call below is a plain system call on memory owned
        // by `self`, which the child has a copy of; nothing allocates
        // (`stage_fds` has its capacity reserved).
        unsafe {
            let mut empty: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut empty);
            check(libc::sigprocmask(
                libc::SIG_SETMASK,
                &empty,
                std::ptr::null_mut(),
            ))?;
            for &fd in &self.cgroup_procs {
                if libc::write(fd, b"0".as_ptr().cast(), 1) != 1 {
                    return Err(io::Error::last_os_error());
                }
            }
            if !self.stage.is_empty() {
                self.stage()?;
            }
            for l in &self.rlimits {
                let lim = libc::rlimit {
                    rlim_cur: l.soft,
                    rlim_max: l.hard,
                };
                check(libc::setrlimit(l.resource as _, &lim))?;
            }
            if let Some(adj) = &self.oom_score_adj {
                let fd = libc::open(
                    c"/proc/self/oom_score_adj".as_ptr(),
                    libc::O_WRONLY | libc::O_CLOEXEC,
                );
                if fd < 0 {
                    return Err(io::Error::last_os_error());
                }
                let len = adj.as_bytes().len();
                let wrote = libc::write(fd, adj.as_ptr().cast(), len);
                libc::close(fd);
                if wrote != len as isize {
                    return Err(io::Error::last_os_error());
                }
            }
            for &(fd, kind) in &self.joins {
                check(libc::setns(fd, kind))?;
            }
            if let Some((uid, gid)) = self.drop_to {
                check(libc::setgroups(0, std::ptr::null()))?;
                check(libc::setresgid(gid, gid, gid))?;
                check(libc::setresuid(uid, uid, uid))?;
                if libc::getuid() != uid || libc::geteuid() != uid {
                    return Err(io::Error::from_raw_os_error(libc::EPERM));
                }
            }
            place_fds(&self.place)?;
            // Nothing else the helper inherited (from whoever started it)
            // reaches the sandbox.
            let first_free = self.place.iter().map(|&(_, to)| to + 1).max().unwrap_or(3);
            close_from(first_free.max(3))
        }
    }

    /// Step 3 of the module doc.
    unsafe fn stage(&mut self) -> io::Result<()> {
        // SAFETY: see `run`; paths are NUL-terminated strings we own.
        unsafe {
            check(libc::unshare(libc::CLONE_NEWNS))?;
            check(libc::mount(
                std::ptr::null(),
                c"/".as_ptr(),
                std::ptr::null(),
                libc::MS_REC | libc::MS_SLAVE,
                std::ptr::null(),
            ))?;
            // Opened in this namespace: a bind needs a source mount of the
            // caller's own namespace.
            for s in &self.stage {
                let fd = libc::open(s.host.as_ptr(), libc::O_PATH | libc::O_CLOEXEC);
                if fd < 0 {
                    return Err(io::Error::last_os_error());
                }
                self.stage_fds.push(fd);
            }
            check(libc::mount(
                c"tmpfs".as_ptr(),
                STAGE_ROOT.as_ptr(),
                c"tmpfs".as_ptr(),
                libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
                c"mode=0755,size=1m".as_ptr().cast(),
            ))?;
            check(libc::mkdir(c"/run/boxdesk-stage".as_ptr(), 0o755))?;
            for (s, &fd) in self.stage.iter().zip(&self.stage_fds) {
                if s.is_dir {
                    check(libc::mkdir(s.target.as_ptr(), 0o755))?;
                } else {
                    let f = libc::open(
                        s.target.as_ptr(),
                        libc::O_CREAT | libc::O_WRONLY | libc::O_CLOEXEC,
                        0o644,
                    );
                    if f < 0 {
                        return Err(io::Error::last_os_error());
                    }
                    libc::close(f);
                }
                if s.idmap && self.stage_idmapped(fd, &s.target) {
                    libc::close(fd);
                    continue;
                }
                let mut buf = [0u8; 32];
                let from = proc_fd_path(&mut buf, fd);
                check(libc::mount(
                    from.as_ptr(),
                    s.target.as_ptr(),
                    std::ptr::null(),
                    libc::MS_BIND | libc::MS_REC,
                    std::ptr::null(),
                ))?;
                libc::close(fd);
            }
        }
        Ok(())
    }
}

impl ChildSetup {
    /// Mounts an id-mapped clone of the tree at `fd` on `target`; false
    /// (nothing mounted) where that cannot be done, for a plain bind.
    ///
    /// # Safety
    /// In the forked child only (see [`ChildSetup::run`]).
    unsafe fn stage_idmapped(&self, fd: RawFd, target: &CStr) -> bool {
        let Some(attr) = &self.idmap else {
            return false;
        };
        let flags = 1 /* OPEN_TREE_CLONE */
            | libc::O_CLOEXEC as libc::c_uint
            | libc::AT_RECURSIVE as libc::c_uint
            | libc::AT_EMPTY_PATH as libc::c_uint;
        // SAFETY: plain system calls on descriptors and C strings this
        // child owns; `attr` is a valid mount_attr of the size passed.
        unsafe {
            let tree = libc::syscall(libc::SYS_open_tree, fd, c"".as_ptr(), flags);
            if tree < 0 {
                return false;
            }
            let tree = tree as RawFd;
            let set = libc::syscall(
                libc::SYS_mount_setattr,
                tree,
                c"".as_ptr(),
                (libc::AT_EMPTY_PATH | libc::AT_RECURSIVE) as libc::c_uint,
                attr as *const super::idmap::MountAttr,
                std::mem::size_of::<super::idmap::MountAttr>(),
            );
            let moved = set == 0
                && libc::syscall(
                    libc::SYS_move_mount,
                    tree,
                    c"".as_ptr(),
                    libc::AT_FDCWD,
                    target.as_ptr(),
                    0x4 as libc::c_uint, /* MOVE_MOUNT_F_EMPTY_PATH */
                ) == 0;
            libc::close(tree);
            moved
        }
    }
}

fn check(rc: libc::c_int) -> io::Result<()> {
    if rc == -1 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// `/proc/self/fd/<fd>` NUL-terminated in `buf`, without allocating.
fn proc_fd_path(buf: &mut [u8; 32], fd: RawFd) -> &CStr {
    const PREFIX: &[u8] = b"/proc/self/fd/";
    buf[..PREFIX.len()].copy_from_slice(PREFIX);
    let mut digits = [0u8; 10];
    let mut n = fd.max(0) as u32;
    let mut len = 0;
    loop {
        digits[len] = b'0' + (n % 10) as u8;
        len += 1;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    for i in 0..len {
        buf[PREFIX.len() + i] = digits[len - 1 - i];
    }
    buf[PREFIX.len() + len] = 0;
    // The buffer holds exactly one NUL, just written.
    CStr::from_bytes_until_nul(&buf[..]).unwrap_or(c"/proc/self/fd/")
}

/// Moves each `(fd, to)` into place with close-on-exec cleared on `to`,
/// safe against a source that sits on another pair's target: every source
/// is first duplicated above all targets.
///
/// # Safety
/// Async-signal-safe; the descriptors must be open.
unsafe fn place_fds(place: &[(RawFd, RawFd)]) -> io::Result<()> {
    const HIGH: RawFd = 100;
    // SAFETY: fcntl and dup2 on open descriptors.
    unsafe {
        let mut tmp = [0 as RawFd; 16];
        if place.len() > tmp.len() {
            return Err(io::Error::from_raw_os_error(libc::EMFILE));
        }
        for (i, &(fd, _)) in place.iter().enumerate() {
            tmp[i] = libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, HIGH);
            if tmp[i] < 0 {
                return Err(io::Error::last_os_error());
            }
        }
        for (i, &(_, to)) in place.iter().enumerate() {
            if libc::dup2(tmp[i], to) == -1 {
                return Err(io::Error::last_os_error());
            }
            libc::close(tmp[i]);
        }
    }
    Ok(())
}

/// Closes every descriptor from `first` up.
///
/// # Safety
/// Async-signal-safe; nothing at or above `first` may be in use.
unsafe fn close_from(first: RawFd) -> io::Result<()> {
    // SAFETY: close_range takes plain integers; the fallback closes each
    // descriptor number up to the limit.
    unsafe {
        if libc::syscall(
            libc::SYS_close_range,
            first as libc::c_uint,
            libc::c_uint::MAX,
            0,
        ) == 0
        {
            return Ok(());
        }
        // Kernels before 5.9.
        let mut lim: libc::rlimit = std::mem::zeroed();
        let max = if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 {
            lim.rlim_cur.min(1 << 20) as RawFd
        } else {
            1024
        };
        for fd in first..max {
            libc::close(fd);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_descriptor_path_is_written_without_allocating() {
        let mut buf = [0u8; 32];
        assert_eq!(proc_fd_path(&mut buf, 7).to_bytes(), b"/proc/self/fd/7");
        assert_eq!(
            proc_fd_path(&mut buf, 2_147_483_647).to_bytes(),
            b"/proc/self/fd/2147483647"
        );
        assert_eq!(proc_fd_path(&mut buf, 0).to_bytes(), b"/proc/self/fd/0");
    }
}
