//! Session directories of the cowork frontend: `<root>/<session>/` under one profile's
//! sessions root (`$XDG_DATA_HOME/boxdesk/cowork/<profile>/sessions/`).
//!
//! Owns creating, measuring, deleting and pruning those directories. Sandboxed processes can
//! write anything into a session dir, and the user's real folders are bind-mounted at
//! `<session>/mnt/<name>`, so this module must never follow a symlink below the root, never
//! count, descend into or delete anything on the other side of a mount point, and never panic
//! on what it finds. Walks go through directory fds (`openat`/`unlinkat`, `O_NOFOLLOW`), never
//! through path strings. Linux only (statx, umount2, `/proc/self/fd`).

use std::collections::BTreeMap;
use std::ffi::{CStr, CString, OsStr};
use std::fmt::Display;
use std::io::{self, ErrorKind};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::names::{self, NameError};

/// Deepest directory nesting the walkers descend into (each level holds one fd).
const MAX_DEPTH: usize = 512;

/// One profile's sessions root, holding one directory per session.
#[derive(Debug, Clone)]
pub struct SessionsDir {
    root: PathBuf,
}

/// Why a sessions-dir operation failed.
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    /// The session name is not a single plain path component.
    #[error("invalid session name: {0}")]
    InvalidName(NameError),
    /// A path that must be a real directory is a symlink, a mount point, a file or else.
    #[error("not a directory: {}", .0.display())]
    NotADirectory(PathBuf),
    /// A system call on `path` failed.
    #[error("cannot {op} {}: {error}", path.display())]
    Io {
        /// What was being done ("create", "open", "statvfs", ...).
        op: &'static str,
        /// The path it was done to.
        path: PathBuf,
        /// The OS error.
        error: io::Error,
    },
}

/// Space on the sessions file system and what each session uses.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DiskInfo {
    /// Size of the file system holding the root, in bytes.
    pub total_bytes: u64,
    /// Bytes available to unprivileged users on it.
    pub free_bytes: u64,
    /// Every session directory, sorted by name.
    pub sessions: Vec<SessionUsage>,
}

impl DiskInfo {
    /// What the client is told under a recorded `quota` (bytes): the
    /// quota is the total, and free is what the quota leaves after the
    /// sessions' bytes, never more than the file system has free.
    pub fn within(mut self, quota: Option<u64>) -> DiskInfo {
        if let Some(q) = quota {
            let used = self
                .sessions
                .iter()
                .fold(0u64, |a, s| a.saturating_add(s.bytes));
            self.total_bytes = q;
            self.free_bytes = self.free_bytes.min(q.saturating_sub(used));
        }
        self
    }
}

/// Allocated size of one session directory.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SessionUsage {
    /// The session's name (its directory name).
    pub name: String,
    /// Allocated bytes of the dir and all beneath, without mounts or symlink targets.
    pub bytes: u64,
}

/// Outcome of [`SessionsDir::delete`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeleteReport {
    /// Sessions removed completely.
    pub deleted: Vec<String>,
    /// Sessions not (or not completely) removed, with the reason.
    pub errors: BTreeMap<String, String>,
}

/// What [`SessionsDir::prune`] removes, and when.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PruneOptions {
    /// Prune only when the free bytes (of the file system, or under `quota`) are below this.
    pub only_if_free_bytes_below: Option<u64>,
    /// Also remove old entries directly in `<session>/tmp`.
    pub include_session_tmp: bool,
    /// Minimum age (by lstat mtime) of a `tmp` entry to be removed.
    pub session_tmp_older_than: Duration,
    /// The recorded quota free space is judged under ([`DiskInfo::within`]).
    pub quota: Option<u64>,
}

/// Outcome of [`SessionsDir::prune`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PruneReport {
    /// Sessions where something was removed.
    pub pruned_sessions: Vec<String>,
    /// Sessions left alone: busy ones, or all when enough space was free.
    pub skipped_sessions: Vec<String>,
    /// Allocated bytes removed.
    pub freed_bytes: u64,
    /// Failures by session name (the empty name for failures of the root itself).
    pub errors: BTreeMap<String, String>,
}

type Dev = (u32, u32);
type Busy<'a> = &'a dyn Fn(&str) -> bool;

fn io_err(op: &'static str, path: &Path, source: io::Error) -> SessionError {
    let path = path.to_path_buf();
    SessionError::Io {
        op,
        path,
        error: source,
    }
}

fn cvt(r: libc::c_int) -> io::Result<libc::c_int> {
    (r >= 0).then_some(r).ok_or_else(io::Error::last_os_error)
}

/// The path that reopens exactly the file behind `fd` (a magic link, not a path lookup).
fn proc_fd(fd: RawFd) -> PathBuf {
    PathBuf::from(format!("/proc/self/fd/{fd}"))
}

/// `openat` that never follows a symlink in the last component.
fn open_at(dir: RawFd, name: &CStr, flags: libc::c_int) -> io::Result<OwnedFd> {
    let flags = flags | libc::O_NOFOLLOW | libc::O_CLOEXEC;
    // SAFETY: `name` is a valid NUL-terminated string that outlives the call.
    let fd = cvt(unsafe { libc::openat(dir, name.as_ptr(), flags) })?;
    // SAFETY: openat just returned this fd and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// What the walkers know about one entry (never about its symlink target).
struct Info {
    dir: bool,
    mount: bool,
    dev: Dev,
    mode: u32,
    bytes: u64,
    mtime: SystemTime,
}

/// Opens `name` in `dir` with `O_PATH|O_NOFOLLOW` (a symlink yields the link) and statx'es it.
fn open_entry(dir: RawFd, name: &CStr) -> io::Result<(OwnedFd, Info)> {
    let fd = open_at(dir, name, libc::O_PATH)?;
    // SAFETY: `statx` is plain old data, for which all-zero bytes are a valid value.
    let mut st: libc::statx = unsafe { std::mem::zeroed() };
    let mask = libc::STATX_TYPE | libc::STATX_MODE | libc::STATX_BLOCKS | libc::STATX_MTIME;
    let flags = libc::AT_EMPTY_PATH | libc::AT_SYMLINK_NOFOLLOW;
    // SAFETY: fd is open, the path is the empty C string AT_EMPTY_PATH wants, `st` is writable.
    cvt(unsafe { libc::statx(fd.as_raw_fd(), c"".as_ptr(), flags, mask, &mut st) })?;
    let (mode, root_attr) = (u32::from(st.stx_mode), libc::STATX_ATTR_MOUNT_ROOT as u64);
    let secs = u64::try_from(st.stx_mtime.tv_sec).unwrap_or(0);
    let mtime = Duration::new(secs, st.stx_mtime.tv_nsec);
    let info = Info {
        dir: mode & libc::S_IFMT == libc::S_IFDIR,
        mount: st.stx_attributes_mask & st.stx_attributes & root_attr != 0,
        dev: (st.stx_dev_major, st.stx_dev_minor),
        mode: mode & 0o7777,
        bytes: st.stx_blocks.saturating_mul(512),
        mtime: UNIX_EPOCH.checked_add(mtime).unwrap_or(UNIX_EPOCH),
    };
    Ok((fd, info))
}

/// Opens `name` in `dir` if it is a real directory: not a symlink, not a mount point.
fn open_dir(dir: RawFd, name: &CStr) -> io::Result<Option<(OwnedFd, Info)>> {
    match open_entry(dir, name) {
        Ok((fd, info)) if info.dir && !info.mount => Ok(Some((fd, info))),
        Err(e) if e.kind() != ErrorKind::NotFound => Err(e),
        _ => Ok(None),
    }
}

/// Names in the directory behind `fd` (reopened through its `/proc/self/fd` magic link).
fn list_dir(fd: RawFd) -> io::Result<Vec<CString>> {
    let mut names = Vec::new();
    for entry in std::fs::read_dir(proc_fd(fd))? {
        names.push(CString::new(entry?.file_name().into_vec())?);
    }
    Ok(names)
}

/// chmod of exactly the inode behind `fd` (an `O_PATH` fd cannot be fchmod'ed).
fn chmod_fd(fd: RawFd, mode: u32) -> io::Result<()> {
    std::fs::set_permissions(proc_fd(fd), std::fs::Permissions::from_mode(mode))
}

/// Lazily unmounts the mount on exactly the entry `name` of `dir`, never following a symlink.
fn detach(dir: RawFd, name: &CStr) -> io::Result<()> {
    let mut path = proc_fd(dir).into_os_string().into_vec();
    path.push(b'/');
    path.extend_from_slice(name.to_bytes());
    let path = CString::new(path)?;
    let flags = libc::MNT_DETACH | libc::UMOUNT_NOFOLLOW;
    // SAFETY: path is a valid NUL-terminated string that outlives the call.
    cvt(unsafe { libc::umount2(path.as_ptr(), flags) }).map(drop)
}

/// Allocated bytes of `name` in `dir` and beneath; no symlink followed, no mount crossed.
fn usage(dir: RawFd, name: &CStr, dev: Option<Dev>, depth: usize) -> u64 {
    match open_entry(dir, name) {
        Ok((fd, i)) if !i.mount && dev.is_none_or(|d| d == i.dev) => {
            let mut sum = i.bytes;
            if i.dir && depth < MAX_DEPTH {
                for c in list_dir(fd.as_raw_fd()).unwrap_or_default() {
                    sum = sum.saturating_add(usage(fd.as_raw_fd(), &c, Some(i.dev), depth + 1));
                }
            }
            sum
        }
        _ => 0,
    }
}

/// (total, free) bytes of the file system holding `path` or its nearest existing ancestor.
fn space(path: &Path) -> io::Result<(u64, u64)> {
    let mut p = path;
    let v = loop {
        let c = CString::new(p.as_os_str().as_bytes())?;
        // SAFETY: `statvfs` is plain old data, for which all-zero bytes are a valid value.
        let mut v: libc::statvfs = unsafe { std::mem::zeroed() };
        // SAFETY: c is a valid C string and v a writable statvfs buffer.
        match cvt(unsafe { libc::statvfs(c.as_ptr(), &mut v) }) {
            Err(e) if e.kind() == ErrorKind::NotFound => p = p.parent().ok_or(e)?,
            r => break r.map(|_| v)?,
        }
    };
    let size = |blocks: u64| blocks.saturating_mul(v.f_frsize);
    Ok((size(v.f_blocks), size(v.f_bavail)))
}

/// The one removal walker, shared by delete and prune.
#[derive(Default)]
struct Remover {
    /// Detach mount points met (delete); otherwise leave them, and their parents, in place.
    detach: bool,
    /// Device of the tree being removed; an entry on another device counts as a mount point.
    dev: Option<Dev>,
    entries: u64,
    bytes: u64,
}

impl Remover {
    /// Removes `name` in `dir` and all beneath (`rel`: its path from the sessions root, for
    /// messages) without following symlinks or touching anything behind a mount point. A
    /// vanished entry is no error; dirs get u+rwx first; siblings are tried after a failure.
    fn remove(&mut self, dir: RawFd, name: &CStr, rel: &Path) -> Result<(), String> {
        let fail = |what: &str, e: &dyn Display| format!("{what} {}: {e}", rel.display());
        let mut tries = 0;
        let (fd, info) = loop {
            let (fd, info) = match open_entry(dir, name) {
                Err(e) if e.kind() == ErrorKind::NotFound => return Ok(()),
                r => r.map_err(|e| fail("cannot open", &e))?,
            };
            if !info.mount && self.dev.is_none_or(|d| d == info.dev) {
                self.dev.get_or_insert(info.dev);
                break (fd, info);
            }
            drop(fd);
            tries += 1;
            if !self.detach || tries > 8 {
                return Err(fail("cannot remove", &"mount point left in place"));
            }
            detach(dir, name).map_err(|e| fail("cannot detach mount", &e))?;
            let path = super::logged(rel.display());
            tracing::info!(path = %path, "detached a mount in a session dir");
        };
        if info.dir {
            if rel.components().count() > MAX_DEPTH + 1 {
                return Err(fail("cannot remove", &"nested too deeply"));
            }
            if info.mode & 0o700 != 0o700 {
                // A failure shows up below, as a failed read or unlink.
                let _ = chmod_fd(fd.as_raw_fd(), info.mode | 0o700);
            }
            let mut res = Ok(());
            for child in list_dir(fd.as_raw_fd()).map_err(|e| fail("cannot read", &e))? {
                let child_rel = rel.join(OsStr::from_bytes(child.to_bytes()));
                res = res.and(self.remove(fd.as_raw_fd(), &child, &child_rel));
            }
            res?;
        }
        let flags = if info.dir { libc::AT_REMOVEDIR } else { 0 };
        // SAFETY: name is a valid NUL-terminated string; unlinkat never follows a symlink.
        let removed = cvt(unsafe { libc::unlinkat(dir, name.as_ptr(), flags) });
        removed.map_err(|e| fail("cannot remove", &e))?;
        self.entries += 1;
        self.bytes = self.bytes.saturating_add(info.bytes);
        Ok(())
    }

    /// Prunes one session (not busy): its caches and, if asked, its old `tmp` entries.
    fn prune(&mut self, root: RawFd, name: &str, opts: &PruneOptions) -> Result<(), String> {
        let dir_at = |d, n: &CStr| open_dir(d, n).map_err(|e| format!("cannot open {n:?}: {e}"));
        let c = CString::new(name).map_err(|e| e.to_string())?;
        let Some((session, info)) = dir_at(root, &c)? else {
            return Ok(());
        };
        let (s, at) = (session.as_raw_fd(), |p: &str| Path::new(name).join(p));
        self.dev = Some(info.dev);
        let mut res = self.remove(s, c".cache", &at(".cache"));
        res = res.and(match dir_at(s, c"home") {
            Ok(Some((home, _))) => self.remove(home.as_raw_fd(), c".cache", &at("home/.cache")),
            other => other.map(drop),
        });
        if !opts.include_session_tmp {
            return res;
        }
        let tmp = match dir_at(s, c"tmp") {
            Ok(Some((tmp, _))) => tmp,
            other => return res.and(other.map(drop)),
        };
        let names = match list_dir(tmp.as_raw_fd()) {
            Ok(names) => names,
            Err(e) => return res.and(Err(format!("cannot read tmp: {e}"))),
        };
        let now = SystemTime::now();
        let old = |i: Info| now.duration_since(i.mtime).unwrap_or_default();
        for child in names {
            let age = open_entry(tmp.as_raw_fd(), &child).map_or(Duration::ZERO, |(_, i)| old(i));
            if age > opts.session_tmp_older_than {
                let rel = at("tmp").join(OsStr::from_bytes(child.to_bytes()));
                res = res.and(self.remove(tmp.as_raw_fd(), &child, &rel));
            }
        }
        res
    }
}

impl SessionsDir {
    /// A sessions dir rooted at `root` (nothing is created yet).
    pub fn new(root: PathBuf) -> Self {
        Self { root }
    }

    /// The sessions root.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Creates the root (and parents) with mode 0700 if missing; fails if it is not a real dir.
    pub fn ensure(&self) -> Result<(), SessionError> {
        let mut builder = std::fs::DirBuilder::new();
        let made = builder.recursive(true).mode(0o700).create(&self.root);
        made.map_err(|e| io_err("create", &self.root, e))?;
        match std::fs::symlink_metadata(&self.root) {
            Ok(m) if m.is_dir() => Ok(()),
            Ok(_) => Err(SessionError::NotADirectory(self.root.clone())),
            Err(e) => Err(io_err("stat", &self.root, e)),
        }
    }

    /// Creates `<root>/<name>` with mode 0700 (and the root if missing), owned by the sandbox's
    /// ids ([`super::private::sandbox_owner`]), and returns its path. An existing real dir is
    /// fine; an existing symlink or non-dir is an error, never followed.
    pub fn create(&self, name: &str) -> Result<PathBuf, SessionError> {
        names::check(name).map_err(SessionError::InvalidName)?;
        self.ensure()?;
        let path = self.root.join(name);
        let root = self
            .open_root()
            .map_err(|e| io_err("open", &self.root, e))?;
        let c = CString::new(name).map_err(|_| SessionError::InvalidName(NameError::Nul))?;
        // SAFETY: c is a valid NUL-terminated string that outlives the call.
        let made = match cvt(unsafe { libc::mkdirat(root.as_raw_fd(), c.as_ptr(), 0o700) }) {
            Err(e) if e.kind() != ErrorKind::AlreadyExists => {
                return Err(io_err("create", &path, e))
            }
            r => r.is_ok(),
        };
        let opened = open_dir(root.as_raw_fd(), &c).map_err(|e| io_err("open", &path, e))?;
        let (fd, _) = opened.ok_or_else(|| SessionError::NotADirectory(path.clone()))?;
        if made {
            // The umask may have taken bits off.
            chmod_fd(fd.as_raw_fd(), 0o700).map_err(|e| io_err("chmod", &path, e))?;
        }
        // Its processes work in it: it is the sandbox's (also when an
        // older version left it to the server's root).
        super::private::give_to_sandbox(fd.as_raw_fd()).map_err(|e| io_err("chown", &path, e))?;
        Ok(path)
    }

    fn open_root(&self) -> io::Result<OwnedFd> {
        let c = CString::new(self.root.as_os_str().as_bytes())?;
        open_at(libc::AT_FDCWD, &c, libc::O_PATH | libc::O_DIRECTORY)
    }

    /// Session dirs in `root` (real dirs with UTF-8 names), sorted by name.
    fn list_sessions(root: RawFd) -> io::Result<Vec<(String, CString)>> {
        let is_dir = |n: &CString| open_entry(root, n).is_ok_and(|(_, i)| i.dir);
        let named = |n: CString| Some((n.to_str().ok()?.to_owned(), n)).filter(|(_, n)| is_dir(n));
        let mut v: Vec<_> = list_dir(root)?.into_iter().filter_map(named).collect();
        v.sort();
        Ok(v)
    }

    /// Space of the root's file system (of its nearest existing ancestor when the root is
    /// missing) and the allocated bytes of every session dir, never following symlinks nor
    /// counting anything behind a mount point. Sessions with non-UTF-8 names are left out.
    pub fn disk_info(&self) -> Result<DiskInfo, SessionError> {
        let space = space(&self.root).map_err(|e| io_err("statvfs", &self.root, e))?;
        let mut sessions = Vec::new();
        match self.open_root() {
            Ok(root) => {
                let listed = Self::list_sessions(root.as_raw_fd());
                for (name, c) in listed.map_err(|e| io_err("read", &self.root, e))? {
                    let bytes = usage(root.as_raw_fd(), &c, None, 0);
                    sessions.push(SessionUsage { name, bytes });
                }
            }
            Err(e) if e.kind() == ErrorKind::NotFound => {}
            Err(e) => return Err(io_err("open", &self.root, e)),
        }
        let (total_bytes, free_bytes) = space;
        Ok(DiskInfo {
            total_bytes,
            free_bytes,
            sessions,
        })
    }

    /// The free bytes [`Self::disk_info`] reports under `quota`.
    fn free_bytes(&self, quota: Option<u64>) -> io::Result<u64> {
        match quota {
            None => Ok(space(&self.root)?.1),
            Some(_) => self
                .disk_info()
                .map(|i| i.within(quota).free_bytes)
                .map_err(|e| io::Error::other(e.to_string())),
        }
    }

    /// Deletes the named session dirs, each on its own: invalid, busy (`busy(name)`) or missing
    /// names are reported and nothing is touched. Symlinks are unlinked, never followed; mount
    /// points are detached (`MNT_DETACH`) before their placeholder is removed, and one that
    /// cannot be detached stays in place with its parents, reported in `errors`.
    pub fn delete(&self, names: &[String], busy: &dyn Fn(&str) -> bool) -> DeleteReport {
        let mut report = DeleteReport::default();
        let root = self.open_root();
        for name in names {
            match Self::delete_one(&root, name, busy) {
                Ok(()) => report.deleted.push(name.clone()),
                Err(e) => {
                    let (shown, why) = (super::logged(name), super::logged(&e));
                    tracing::warn!(session = %shown, error = %why, "session not deleted");
                    report.errors.insert(name.clone(), e);
                }
            }
        }
        report
    }

    fn delete_one(root: &io::Result<OwnedFd>, name: &str, busy: Busy) -> Result<(), String> {
        names::check(name).map_err(|e| SessionError::InvalidName(e).to_string())?;
        if busy(name) {
            return Err("session has running processes".to_owned());
        }
        let gone = |e: &io::Error| match e.kind() {
            ErrorKind::NotFound => "no such session".to_owned(),
            _ => format!("cannot open session: {e}"),
        };
        let root = root.as_ref().map_err(gone)?.as_raw_fd();
        let c = CString::new(name).map_err(|e| e.to_string())?;
        open_entry(root, &c).map_err(|e| gone(&e))?;
        let mut remover = Remover {
            detach: true,
            ..Remover::default()
        };
        let res = remover.remove(root, &c, Path::new(name));
        res.map_err(|e| format!("cannot delete session: {e}"))
    }

    /// Removes `.cache`, `home/.cache` and (if asked) old entries of `tmp` in every session that
    /// is not busy, unless `only_if_free_bytes_below` is set and that much space is free. Uses
    /// the walker of [`Self::delete`] but leaves mount points mounted (reported in `errors`),
    /// since the session may be resumed.
    pub fn prune(&self, opts: &PruneOptions, busy: &dyn Fn(&str) -> bool) -> PruneReport {
        let mut report = PruneReport::default();
        let setup = self.open_root().and_then(|fd| {
            let sessions = Self::list_sessions(fd.as_raw_fd())?;
            let enough = match opts.only_if_free_bytes_below {
                Some(limit) => self.free_bytes(opts.quota)? >= limit,
                None => false,
            };
            Ok((fd, sessions, enough))
        });
        let (root, sessions, enough) = match setup {
            Ok(setup) => setup,
            Err(e) if e.kind() == ErrorKind::NotFound => return report,
            Err(e) => {
                let e = format!("cannot read sessions dir: {e}");
                report.errors.insert(String::new(), e);
                return report;
            }
        };
        for (name, _) in sessions {
            if enough || busy(&name) {
                report.skipped_sessions.push(name);
                continue;
            }
            let mut remover = Remover::default();
            let res = remover.prune(root.as_raw_fd(), &name, opts);
            report.freed_bytes = report.freed_bytes.saturating_add(remover.bytes);
            if remover.entries > 0 {
                report.pruned_sessions.push(name.clone());
            }
            if let Err(e) = res {
                let (shown, why) = (super::logged(&name), super::logged(&e));
                tracing::warn!(session = %shown, error = %why, "session not fully pruned");
                report.errors.insert(name, e);
            }
        }
        report
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;
    use std::os::unix::fs::symlink;
    use std::process::Command;

    const MIB: u64 = 1 << 20;
    const CHILD_ENV: &str = "BOXDESK_SESSIONS_MOUNT_CHILD";

    #[test]
    fn a_quota_is_the_total_and_bounds_free_by_what_sessions_use() {
        let (_t, dir) = setup();
        put(&dir.root().join("a/blob"), 2 * MIB);
        let info = dir.disk_info().unwrap();
        let used = info.sessions[0].bytes;
        assert!(used >= 2 * MIB, "{info:?}");
        let q = info.clone().within(Some(10 * MIB));
        assert_eq!(q.total_bytes, 10 * MIB);
        assert_eq!(q.free_bytes, (10 * MIB - used).min(info.free_bytes));
        let full = info.clone().within(Some(MIB));
        assert_eq!(full.free_bytes, 0, "over its quota, nothing is free");
        assert_eq!(info.clone().within(None), info);
        // prune judges free space under the same quota: 1 MiB of quota
        // leaves nothing free, so a prune "below 1 byte free" prunes.
        put(&dir.root().join("a/.cache/x"), MIB);
        let opts = PruneOptions {
            only_if_free_bytes_below: Some(1),
            include_session_tmp: false,
            session_tmp_older_than: Duration::ZERO,
            quota: Some(MIB),
        };
        let r = dir.prune(&opts, &|_| false);
        assert_eq!(r.pruned_sessions, ["a"], "{r:?}");
    }

    fn setup() -> (tempfile::TempDir, SessionsDir) {
        let tmp = tempfile::tempdir().unwrap();
        let dir = SessionsDir::new(tmp.path().join("sessions"));
        (tmp, dir)
    }

    /// Writes `len` bytes to `path`, creating its parents.
    fn put(path: &Path, len: u64) {
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(path, vec![7u8; len as usize]).unwrap();
    }

    fn len(path: &Path) -> u64 {
        fs::symlink_metadata(path).map_or(0, |m| m.len())
    }

    fn names(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn names_with_slash_dotdot_empty_or_nul_are_refused() {
        let (_t, dir) = setup();
        for bad in ["", ".", "..", "a/b", "/", "a\0b", &"x".repeat(256), "../x"] {
            assert!(
                matches!(dir.create(bad), Err(SessionError::InvalidName(_))),
                "{bad:?} accepted"
            );
        }
        for good in ["s1", ".hidden", "a b", &"x".repeat(255)] {
            dir.create(good).unwrap();
        }
        let report = dir.delete(&["..".to_owned()], &|_| false);
        assert_eq!(
            report.errors[".."], "invalid session name: dot or dot-dot",
            "delete checks names the same way"
        );
    }

    #[test]
    fn create_makes_a_private_dir_and_refuses_a_symlink_in_its_place() {
        let (t, dir) = setup();
        let s = dir.create("s1").unwrap();
        assert_eq!(
            fs::metadata(&s).unwrap().permissions().mode() & 0o777,
            0o700
        );
        assert_eq!(dir.create("s1").unwrap(), s);
        symlink(t.path(), dir.root().join("evil")).unwrap();
        assert!(matches!(
            dir.create("evil"),
            Err(SessionError::NotADirectory(_))
        ));
    }

    #[test]
    fn disk_info_counts_real_bytes_and_does_not_follow_symlinks() {
        let (t, dir) = setup();
        put(&t.path().join("big/blob"), 8 * MIB);
        let s1 = dir.create("s1").unwrap();
        put(&s1.join("a/b/file"), MIB);
        symlink(t.path().join("big"), s1.join("link")).unwrap();
        symlink(t.path().join("big"), dir.root().join("not-a-session")).unwrap();
        dir.create("s0").unwrap();
        let info = dir.disk_info().unwrap();
        assert!(info.total_bytes > 0 && info.free_bytes <= info.total_bytes);
        let got: Vec<_> = info.sessions.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(got, ["s0", "s1"]);
        let bytes = info.sessions[1].bytes;
        assert!((MIB..4 * MIB).contains(&bytes), "{bytes}");
    }

    #[test]
    fn disk_info_of_a_missing_root_reports_no_sessions_but_real_space() {
        let (_t, dir) = setup();
        let info = dir.disk_info().unwrap();
        assert!(info.sessions.is_empty() && info.total_bytes > 0);
    }

    #[test]
    fn delete_removes_read_only_nested_dirs_and_unlinks_symlinks_without_following() {
        let (t, dir) = setup();
        let outside = t.path().join("outside");
        put(&outside.join("precious"), 4);
        let s = dir.create("s1").unwrap();
        put(&s.join("ro/locked/deeper/f"), 1);
        put(&s.join("ro/f"), 1);
        symlink(&outside, s.join("ro/link")).unwrap();
        symlink(&outside, s.join("link")).unwrap();
        fs::set_permissions(s.join("ro/locked"), fs::Permissions::from_mode(0o000)).unwrap();
        fs::set_permissions(s.join("ro"), fs::Permissions::from_mode(0o500)).unwrap();
        let report = dir.delete(&names(&["s1"]), &|_| false);
        assert_eq!(report.deleted, ["s1"], "{report:?}");
        assert!(report.errors.is_empty() && fs::symlink_metadata(&s).is_err());
        assert_eq!(len(&outside.join("precious")), 4);
    }

    #[test]
    fn delete_refuses_invalid_busy_and_missing_names_without_touching_anything() {
        let (_t, dir) = setup();
        let s = dir.create("s1").unwrap();
        let report = dir.delete(&names(&["..", "s1", "gone", "a/b"]), &|n| n == "s1");
        assert!(report.deleted.is_empty());
        assert!(report.errors[".."].contains("invalid session name"));
        assert!(report.errors["a/b"].contains("invalid session name"));
        assert_eq!(report.errors["s1"], "session has running processes");
        assert_eq!(report.errors["gone"], "no such session");
        assert!(s.is_dir() && dir.root().is_dir());
    }

    #[test]
    fn prune_removes_caches_of_idle_sessions_and_keeps_other_files() {
        let (t, dir) = setup();
        put(&t.path().join("outside/precious"), 4);
        symlink(
            t.path().join("outside"),
            dir.create("s3").unwrap().join(".cache"),
        )
        .unwrap();
        for s in ["s1", "s2"] {
            let s = dir.create(s).unwrap();
            put(&s.join(".cache/pip/wheel"), MIB);
            put(&s.join("home/.cache/x"), 1);
            put(&s.join("home/notes.txt"), 4);
        }
        let report = dir.prune(&PruneOptions::default(), &|n| n == "s2");
        assert_eq!(report.pruned_sessions, ["s1", "s3"], "{report:?}");
        assert_eq!(report.skipped_sessions, ["s2"]);
        assert_eq!(len(&t.path().join("outside/precious")), 4);
        assert!(report.errors.is_empty() && report.freed_bytes >= MIB);
        let (s1, s2) = (dir.root().join("s1"), dir.root().join("s2"));
        assert!(!s1.join(".cache").exists() && !s1.join("home/.cache").exists());
        assert_eq!(len(&s1.join("home/notes.txt")), 4);
        assert_eq!(len(&s2.join(".cache/pip/wheel")), MIB);
    }

    #[test]
    fn prune_does_nothing_while_enough_space_is_free() {
        let (_t, dir) = setup();
        let cache = dir.create("s1").unwrap().join(".cache");
        fs::create_dir(&cache).unwrap();
        let mut opts = PruneOptions {
            only_if_free_bytes_below: Some(0),
            ..Default::default()
        };
        let report = dir.prune(&opts, &|_| false);
        assert_eq!(report.skipped_sessions, ["s1"]);
        assert!(report.pruned_sessions.is_empty() && cache.exists());
        opts.only_if_free_bytes_below = Some(u64::MAX);
        assert_eq!(dir.prune(&opts, &|_| false).pruned_sessions, ["s1"]);
        assert!(!cache.exists());
    }

    #[test]
    fn prune_removes_only_tmp_entries_older_than_the_limit() {
        let (_t, dir) = setup();
        let tmp = dir.create("s1").unwrap().join("tmp");
        put(&tmp.join("old-dir/sub/f"), 1);
        put(&tmp.join("old-file"), 1);
        put(&tmp.join("new-file"), 1);
        let two_days_ago = SystemTime::now() - Duration::from_secs(2 * 86400);
        for old in ["old-dir", "old-file"] {
            let f = fs::File::open(tmp.join(old)).unwrap();
            f.set_modified(two_days_ago).unwrap();
        }
        let day = Duration::from_secs(86400);
        let mut opts = PruneOptions {
            session_tmp_older_than: day,
            ..Default::default()
        };
        assert!(dir.prune(&opts, &|_| false).pruned_sessions.is_empty());
        opts.include_session_tmp = true;
        let report = dir.prune(&opts, &|_| false);
        assert_eq!(report.pruned_sessions, ["s1"], "{report:?}");
        assert!(!tmp.join("old-dir").exists() && !tmp.join("old-file").exists());
        assert!(tmp.join("new-file").exists());
    }

    /// Re-runs the mount test below under `unshare <args>`, with CHILD_ENV set to `phase`.
    fn rerun(args: &[&str], phase: &OsStr) -> io::Result<std::process::Output> {
        let path = module_path!().split_once("::").map_or("", |(_, rest)| rest);
        let test = format!("{path}::delete_and_disk_info_never_cross_a_mount_point");
        Command::new("unshare")
            .args(args)
            .arg(std::env::current_exe()?)
            .args([test.as_str(), "--exact", "--nocapture", "--test-threads=1"])
            .env(CHILD_ENV, phase)
            .output()
    }

    /// Runs in a private mount namespace: bind-mounts outside data (a dir and a single file)
    /// into a session and checks that disk_info and delete do not reach through. Then, from a
    /// nested user namespace, where those mounts are locked and cannot be detached, checks that
    /// delete reports it and leaves the mount points and their parents alone.
    fn mount_child() {
        println!("mount child started");
        let (t, dir) = setup();
        let outside = t.path().join("outside");
        put(&outside.join("precious"), 4 * MIB);
        put(&outside.join("single"), 8);
        let s = dir.create("s1").unwrap();
        fs::create_dir_all(s.join("mnt/proj")).unwrap();
        put(&s.join("mnt/single"), 0);
        put(&s.join("notes"), 5);
        for (src, dst) in [("", "mnt/proj"), ("single", "mnt/single")] {
            let src = CString::new(outside.join(src).into_os_string().into_vec()).unwrap();
            let dst = CString::new(s.join(dst).into_os_string().into_vec()).unwrap();
            let (none, bind) = (std::ptr::null(), libc::MS_BIND);
            // SAFETY: src and dst are valid C strings; MS_BIND ignores fstype and data.
            let r = unsafe { libc::mount(src.as_ptr(), dst.as_ptr(), none, bind, none.cast()) };
            assert_eq!(r, 0, "bind mount: {}", io::Error::last_os_error());
        }
        assert_eq!(
            len(&s.join("mnt/proj/precious")),
            4 * MIB,
            "bind mount not visible"
        );
        let info = dir.disk_info().unwrap();
        assert!(
            info.sessions[0].bytes < MIB,
            "mounted bytes counted: {info:?}"
        );
        let nested = ["--user", "--mount", "--map-root-user"];
        let out = rerun(&nested, dir.root().as_os_str()).unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        print!("{stdout}");
        assert!(
            stdout.contains("locked child ok"),
            "{stdout}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(s.join("mnt").is_dir() && !s.join("notes").exists());
        let report = dir.delete(&names(&["s1"]), &|_| false);
        assert_eq!(report.deleted, ["s1"], "{report:?}");
        assert!(fs::symlink_metadata(&s).is_err(), "session dir left behind");
        assert_eq!(len(&outside.join("precious")), 4 * MIB);
        assert_eq!(len(&outside.join("single")), 8);
        println!("mount child ok");
    }

    /// Deletes session `s1` under `root`, whose mounts are locked here (see above).
    fn locked_child(root: &Path) {
        let report = SessionsDir::new(root.to_path_buf()).delete(&names(&["s1"]), &|_| false);
        assert!(
            report.errors["s1"].contains(": cannot detach mount s1/mnt/"),
            "{report:?}"
        );
        assert_eq!(len(&root.join("s1/mnt/proj/precious")), 4 * MIB);
        assert_eq!(len(&root.join("s1/mnt/single")), 8);
        println!("locked child ok: {report:?}");
    }

    #[test]
    fn delete_and_disk_info_never_cross_a_mount_point() {
        match std::env::var_os(CHILD_ENV) {
            Some(phase) if phase == "outer" => return mount_child(),
            Some(root) => return locked_child(Path::new(&root)),
            None => {}
        }
        let args = ["--mount", "--propagation", "private", "--map-root-user"];
        let out = match rerun(&args, OsStr::new("outer")) {
            Ok(out) => out,
            Err(e) => return println!("skipped: needs user namespaces ({e})"),
        };
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        if !stdout.contains("mount child started") && stderr.contains("unshare:") {
            return println!("skipped: needs user namespaces ({})", stderr.trim());
        }
        let ok = out.status.success() && stdout.contains("mount child ok");
        assert!(ok, "child failed ({}):\n{stdout}\n{stderr}", out.status);
    }
}
