//! Resolving a path beneath a directory without ever leaving it: the
//! guest agent's PutFile and GetFile beneath its `--root`, and the host
//! side of `boxdesk cp NAME:SRC DST` beneath DST. A leading `/` means the
//! root itself; a `..` component is refused; no symlink is followed in any
//! component.
//!
//! Resolution uses `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS)` where
//! the kernel has it. Where it does not (`ENOSYS` on kernels before 5.6 and
//! under qemu user emulation, `EPERM` from a seccomp filter, any kernel but
//! Linux) it walks one component at a time with `openat(O_NOFOLLOW)`: every
//! step names a single entry that is neither `..` nor a symlink, so the
//! walk can only go down and is exactly as strict.
//!
//! Never: resolve by string prefix, follow a symlink, or create anything
//! but directories (mode 0755) on the way to a target.

use std::ffi::{CStr, CString};
use std::fs::File;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::atomic::{AtomicU8, Ordering};

use nix::errno::Errno;
use nix::fcntl::AtFlags;
use nix::sys::stat::{fstat, fstatat, mkdirat, FileStat, Mode, SFlag};

/// How a directory on the way is opened: only to resolve beneath it.
#[cfg(target_os = "linux")]
const DIR_FLAGS: i32 = libc::O_PATH | libc::O_DIRECTORY;
/// Without `O_PATH`, a directory is opened for reading.
#[cfg(not(target_os = "linux"))]
const DIR_FLAGS: i32 = libc::O_RDONLY | libc::O_DIRECTORY;

/// An errno as its C name (`ENOENT`), the way the agent's Error frames
/// start.
fn errno_name(e: Errno) -> String {
    match e {
        Errno::UnknownErrno => "EUNKNOWN".into(),
        e => format!("{e:?}"),
    }
}

/// Why a path was refused or could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum PathError {
    /// A `..` component: paths never climb.
    #[error("EPERM: '..' is not allowed in a path")]
    DotDot,
    /// A NUL byte cannot be part of a path.
    #[error("EINVAL: path contains a NUL byte")]
    Nul,
    /// The path names the root itself where a file is needed.
    #[error("EISDIR: path names the root directory")]
    IsRoot,
    /// A component (or the target) is a symlink, which is never followed.
    #[error("ELOOP: a symlink in the path is not followed")]
    Symlink,
    /// The target exists but is not a regular file.
    #[error("{}: not a regular file ({kind})", errno_name(*.errno))]
    NotRegular {
        /// EISDIR for a directory, EINVAL otherwise.
        errno: Errno,
        /// What it is instead.
        kind: &'static str,
    },
    /// The system refused.
    #[error("{}: {}", errno_name(*.0), .0.desc())]
    Os(Errno),
}

impl From<Errno> for PathError {
    fn from(e: Errno) -> Self {
        match e {
            Errno::ELOOP => PathError::Symlink,
            e => PathError::Os(e),
        }
    }
}

/// The components of a peer path: split on `/`, empty and `.` dropped.
pub fn components(path: &[u8]) -> Result<Vec<&[u8]>, PathError> {
    if path.contains(&0) {
        return Err(PathError::Nul);
    }
    let mut out = Vec::new();
    for c in path.split(|&b| b == b'/') {
        match c {
            b"" | b"." => {}
            b".." => return Err(PathError::DotDot),
            c => out.push(c),
        }
    }
    Ok(out)
}

const OPENAT2_UNKNOWN: u8 = 0;
#[cfg_attr(not(target_os = "linux"), allow(dead_code))]
const OPENAT2_YES: u8 = 1;
const OPENAT2_NO: u8 = 2;

/// A root directory and how to resolve beneath it.
pub struct Beneath {
    root: OwnedFd,
    openat2: AtomicU8,
}

/// A regular file opened for reading, with what was learnt opening it.
pub struct Regular {
    /// The open file.
    pub file: File,
    /// `st_mode & 0o7777`.
    pub mode: u32,
    /// Size when opened.
    pub size: u64,
}

impl Beneath {
    /// Opens `dir` (trusted configuration, so followed normally) as the root.
    pub fn open(dir: &Path) -> Result<Beneath, PathError> {
        let c = CString::new(dir.as_os_str().as_bytes()).map_err(|_| PathError::Nul)?;
        let root = open_raw(None, &c, DIR_FLAGS)?;
        Ok(Beneath {
            root,
            openat2: AtomicU8::new(OPENAT2_UNKNOWN),
        })
    }

    /// Forces the component-by-component walk, as on a kernel without
    /// `openat2` (for tests of the fallback).
    pub fn without_openat2(self) -> Beneath {
        self.openat2.store(OPENAT2_NO, Ordering::Relaxed);
        self
    }

    /// Opens `comps` beneath `dir` with `flags` (plus `O_NOFOLLOW |
    /// O_CLOEXEC`), never following a symlink. Each component must be one
    /// plain name (as [`components`] gives): the walk would climb a `..`.
    fn open_at(&self, dir: BorrowedFd<'_>, comps: &[&[u8]], flags: i32) -> Result<OwnedFd, Errno> {
        if comps.is_empty() {
            return dir.try_clone_to_owned().map_err(|_| Errno::EMFILE);
        }
        for c in comps {
            plain(c)?;
        }
        #[cfg(target_os = "linux")]
        if self.openat2.load(Ordering::Relaxed) != OPENAT2_NO {
            let joined = CString::new(comps.join(&b'/')).map_err(|_| Errno::EINVAL)?;
            // No O_NOFOLLOW here: with it a trailing symlink would be
            // opened as itself (or be ENOTDIR); without it
            // RESOLVE_NO_SYMLINKS refuses it with ELOOP like any other.
            match openat2(dir, &joined, flags | libc::O_CLOEXEC) {
                Err(Errno::ENOSYS | Errno::EPERM | Errno::E2BIG) => {
                    self.openat2.store(OPENAT2_NO, Ordering::Relaxed);
                }
                r => {
                    self.openat2.store(OPENAT2_YES, Ordering::Relaxed);
                    return r;
                }
            }
        }
        let flags = flags | libc::O_NOFOLLOW | libc::O_CLOEXEC;
        let mut cur: Option<OwnedFd> = None;
        for (i, comp) in comps.iter().enumerate() {
            let name = CString::new(*comp).map_err(|_| Errno::EINVAL)?;
            let last = i + 1 == comps.len();
            let f = if last {
                flags
            } else {
                DIR_FLAGS | libc::O_NOFOLLOW | libc::O_CLOEXEC
            };
            let at = cur.as_ref().map_or(dir, |c| c.as_fd());
            let next = open_raw(Some(at), &name, f).map_err(|e| classify(at, &name, e))?;
            cur = Some(next);
        }
        cur.ok_or(Errno::ENOENT)
    }

    /// The directory `comps` names (an `O_PATH` descriptor on Linux),
    /// creating missing directories (0755) when `create` is set.
    pub fn dir(&self, comps: &[&[u8]], create: bool) -> Result<OwnedFd, PathError> {
        let dir_flags = DIR_FLAGS;
        match self.open_at(self.root.as_fd(), comps, dir_flags) {
            Ok(fd) => return Ok(fd),
            Err(Errno::ENOENT) if create => {}
            Err(e) => return Err(e.into()),
        }
        let mut cur = self.root.try_clone().map_err(|_| Errno::EMFILE)?;
        for comp in comps {
            let next = match self.open_at(cur.as_fd(), &[comp], dir_flags) {
                Err(Errno::ENOENT) => {
                    match mkdirat(
                        Some(cur.as_raw_fd()),
                        *comp,
                        Mode::from_bits_truncate(0o755),
                    ) {
                        Ok(()) | Err(Errno::EEXIST) => {}
                        Err(e) => return Err(e.into()),
                    }
                    self.open_at(cur.as_fd(), &[comp], dir_flags)?
                }
                r => r?,
            };
            cur = next;
        }
        Ok(cur)
    }

    /// Opens the regular file `comps` names, for reading.
    pub fn regular(&self, comps: &[&[u8]]) -> Result<Regular, PathError> {
        let Some((name, parent)) = comps.split_last() else {
            return Err(PathError::IsRoot);
        };
        let dir = self.dir(parent, false)?;
        let name = CString::new(*name).map_err(|_| PathError::Nul)?;
        open_regular(dir.as_fd(), &name, |d, n, f| {
            self.open_at(d, &[n.to_bytes()], f)
        })
    }

    /// Creates (or truncates) the regular file `comps` names, for writing,
    /// with `mode` (less the umask) when new. Its directory must exist. A
    /// symlink at the target is refused, not followed, and so is anything
    /// that is not a regular file (a FIFO is not waited on).
    pub fn create_file(&self, comps: &[&[u8]], mode: u32) -> Result<File, PathError> {
        let Some((name, parent)) = comps.split_last() else {
            return Err(PathError::IsRoot);
        };
        plain(name)?;
        let dir = self.dir(parent, false)?;
        let name = CString::new(*name).map_err(|_| PathError::Nul)?;
        let flags = libc::O_WRONLY
            | libc::O_CREAT
            | libc::O_TRUNC
            | libc::O_NOFOLLOW
            | libc::O_NONBLOCK
            | libc::O_NOCTTY;
        let fd = open_raw_mode(Some(dir.as_fd()), &name, flags, (mode & 0o7777) as _)
            .map_err(|e| classify(dir.as_fd(), &name, e))?;
        check_regular(&fstat(fd.as_raw_fd())?)?;
        // Regular files ignore O_NONBLOCK; cleared all the same.
        nix::fcntl::fcntl(
            fd.as_raw_fd(),
            nix::fcntl::FcntlArg::F_SETFL(nix::fcntl::OFlag::empty()),
        )?;
        Ok(File::from(fd))
    }
}

/// One component: a single plain name, never `..` (the walk would climb
/// it), `.`, empty, or holding a `/`.
fn plain(c: &[u8]) -> Result<(), Errno> {
    match c {
        b".." => Err(Errno::EPERM),
        b"" | b"." => Err(Errno::EINVAL),
        c if c.contains(&b'/') => Err(Errno::EINVAL),
        _ => Ok(()),
    }
}

/// Opens the regular file `name` in `dir` without following a symlink and
/// without opening anything else (a FIFO would block, a device could act):
/// the entry is checked first, then the open file is checked to be it.
pub fn open_regular(
    dir: BorrowedFd<'_>,
    name: &CStr,
    open: impl FnOnce(BorrowedFd<'_>, &CStr, i32) -> Result<OwnedFd, Errno>,
) -> Result<Regular, PathError> {
    let before = fstatat(Some(dir.as_raw_fd()), name, AtFlags::AT_SYMLINK_NOFOLLOW)?;
    check_regular(&before)?;
    let fd = open(
        dir,
        name,
        libc::O_RDONLY | libc::O_NONBLOCK | libc::O_NOCTTY,
    )?;
    let st = fstat(fd.as_raw_fd())?;
    check_regular(&st)?;
    if (st.st_dev, st.st_ino) != (before.st_dev, before.st_ino) {
        return Err(PathError::Os(Errno::EAGAIN));
    }
    Ok(Regular {
        file: File::from(fd),
        mode: mode_bits(st.st_mode) & 0o7777,
        size: st.st_size as u64,
    })
}

/// What a `stat` says an entry is, for messages.
pub fn kind(st: &FileStat) -> &'static str {
    match SFlag::from_bits_truncate(st.st_mode & SFlag::S_IFMT.bits()) {
        SFlag::S_IFREG => "regular file",
        SFlag::S_IFDIR => "directory",
        SFlag::S_IFLNK => "symlink",
        SFlag::S_IFIFO => "fifo",
        SFlag::S_IFSOCK => "socket",
        SFlag::S_IFCHR => "character device",
        SFlag::S_IFBLK => "block device",
        _ => "unknown file type",
    }
}

fn check_regular(st: &FileStat) -> Result<(), PathError> {
    match kind(st) {
        "regular file" => Ok(()),
        "symlink" => Err(PathError::Symlink),
        "directory" => Err(PathError::NotRegular {
            errno: Errno::EISDIR,
            kind: "directory",
        }),
        other => Err(PathError::NotRegular {
            errno: Errno::EINVAL,
            kind: other,
        }),
    }
}

/// In the fallback walk a symlink component shows up as `ENOTDIR` (with
/// `O_DIRECTORY`) or `ELOOP`; report both as the symlink they are.
fn classify(dir: BorrowedFd<'_>, name: &CStr, e: Errno) -> Errno {
    if e == Errno::ENOTDIR {
        if let Ok(st) = fstatat(Some(dir.as_raw_fd()), name, AtFlags::AT_SYMLINK_NOFOLLOW) {
            if kind(&st) == "symlink" {
                return Errno::ELOOP;
            }
        }
    }
    e
}

/// A `mode_t` as the `u32` it is on Linux (`u16` on macOS); also what
/// `openat`'s variadic mode argument takes.
#[allow(clippy::useless_conversion)]
fn mode_bits(m: libc::mode_t) -> u32 {
    u32::from(m)
}

/// `openat(2)`; `None` resolves relative to the current directory.
pub fn open_raw(dir: Option<BorrowedFd<'_>>, name: &CStr, flags: i32) -> Result<OwnedFd, Errno> {
    open_raw_mode(dir, name, flags, 0)
}

/// `openat(2)` with a creation mode, retried on `EINTR`.
pub fn open_raw_mode(
    dir: Option<BorrowedFd<'_>>,
    name: &CStr,
    flags: i32,
    mode: libc::mode_t,
) -> Result<OwnedFd, Errno> {
    let at = dir.map_or(libc::AT_FDCWD, |d| d.as_raw_fd());
    loop {
        // SAFETY: `name` is NUL-terminated and outlives the call; `at` is
        // AT_FDCWD or a descriptor borrowed for the call.
        let fd =
            unsafe { libc::openat(at, name.as_ptr(), flags | libc::O_CLOEXEC, mode_bits(mode)) };
        if fd >= 0 {
            // SAFETY: openat returned a new descriptor that nothing else owns.
            return Ok(unsafe { OwnedFd::from_raw_fd(fd) });
        }
        match Errno::last() {
            Errno::EINTR => continue,
            e => return Err(e),
        }
    }
}

/// `openat2(2)` with `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS`.
#[cfg(target_os = "linux")]
fn openat2(dir: BorrowedFd<'_>, path: &CStr, flags: i32) -> Result<OwnedFd, Errno> {
    openat2_resolve(
        dir,
        path,
        flags,
        libc::RESOLVE_BENEATH | libc::RESOLVE_NO_SYMLINKS,
    )
}

/// `openat2(2)` of `path` in `dir` with `flags` and the `RESOLVE_*` bits
/// `resolve`, retried on `EINTR` (Linux 5.6).
#[cfg(target_os = "linux")]
pub fn openat2_resolve(
    dir: BorrowedFd<'_>,
    path: &CStr,
    flags: i32,
    resolve: u64,
) -> Result<OwnedFd, Errno> {
    // SAFETY: open_how is a plain C struct; all-zero is a valid value.
    let mut how: libc::open_how = unsafe { std::mem::zeroed() };
    how.flags = flags as u64;
    how.resolve = resolve;
    loop {
        // SAFETY: `path` is NUL-terminated, `how` is a valid open_how whose
        // size is passed, and both outlive the call.
        let fd = unsafe {
            libc::syscall(
                libc::SYS_openat2,
                dir.as_raw_fd(),
                path.as_ptr(),
                &mut how as *mut libc::open_how,
                std::mem::size_of::<libc::open_how>(),
            )
        };
        if fd >= 0 {
            // SAFETY: the syscall returned a new descriptor nothing else owns.
            return Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) });
        }
        match Errno::last() {
            Errno::EINTR => continue,
            e => return Err(e),
        }
    }
}
