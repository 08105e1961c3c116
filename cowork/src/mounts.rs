//! Host folders into running namespace sandboxes.
//!
//! At start-up, while still single-threaded, the server enters a mount
//! namespace of its own ([`enter_private_namespace`]; unprivileged, inside
//! a user namespace that maps only our uid and gid onto themselves, so
//! files, peers and sandboxes see the same ids as outside). Everything it
//! mounts stays in that namespace: the host's mount table is never touched.
//!
//! A profile's sessions dir and home mirror are made *shared* mounts
//! ([`make_shared`]) before its sandboxes start; bwrap's copies of them are
//! slaves, so a folder attached later beneath them ([`attach`]) appears in
//! every running sandbox at once. A folder is attached as a detached clone
//! (`open_tree`), made read-only *before* it is attached when asked
//! (`mount_setattr`; flags set after attaching do not propagate), then
//! moved into place (`move_mount`).
//!
//! Paths from the client are resolved by [`resolve_in_home`]: lexically
//! under the user's home, no `..`, then opened beneath the home directory
//! with `openat2(RESOLVE_BENEATH)`, so no symlink leads outside; an
//! absolute link is followed and the directory reached must lie beneath
//! home. [`resolve_source`] adds the app's rules: a missing source beneath
//! home is created (0700, no link followed), a link to itself repaired,
//! and a folder outside home is any directory the user may read except the
//! kernel's filesystems ([`NEVER_SOURCES`]). Mount targets, in the sandboxes' (0700) dirs, are made 0700,
//! the sandbox's, and opened by [`dir_beneath`] without following any symlink, because
//! sandboxed processes can write the directories they are in. This module
//! never mounts by a path string the client chose.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};
use std::sync::OnceLock;

use boxdesk_sandbox::namespace::idmap::{
    setattr, userns_mapping_root_to, MountAttr, MOUNT_ATTR_IDMAP,
};

use super::names::NameError;

/// Why a folder cannot be mounted.
#[derive(Debug, thiserror::Error)]
pub enum MountError {
    /// This server could not get a mount namespace of its own.
    #[error("mounts are unavailable here: {0}")]
    Unavailable(String),
    /// The path has a `..` component or is not absolute.
    #[error("{0:?} has a `..` component")]
    DotDot(String),
    /// The path is not beneath the user's home.
    #[error("{path:?} is not under the home directory {}", home.display())]
    OutsideHome {
        /// The path asked for.
        path: String,
        /// The home directory.
        home: PathBuf,
    },
    /// A name is not one path component ([`crate::names`]).
    #[error("bad name {name:?}: {why}")]
    BadName {
        /// The name.
        name: String,
        /// What is wrong with it.
        why: NameError,
    },
    /// The path is one of the kernel's filesystems (or leads there).
    #[error("{} is the kernel's ({}): never mounted into a sandbox", path.display(), NEVER_SOURCES.join(", "))]
    Kernel {
        /// The path, as reached.
        path: PathBuf,
    },
    /// The user cannot read and search the directory outside home.
    #[error("{} is not a directory this user may read", path.display())]
    NoAccess {
        /// The path.
        path: PathBuf,
    },
    /// A system call failed.
    #[error("{what} {}: {error}", path.display())]
    Os {
        /// What was being done.
        what: &'static str,
        /// On which path.
        path: PathBuf,
        /// What the OS said.
        error: io::Error,
    },
}

fn os<'a>(what: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> MountError + 'a {
    move |source| MountError::Os {
        what,
        path: path.to_owned(),
        error: source,
    }
}

static SUPPORT: OnceLock<Result<(), String>> = OnceLock::new();

/// Enters a private mount namespace (and, when not root, a user namespace
/// mapping only our ids) and makes every inherited mount a slave, so
/// nothing mounted here reaches the host. Must be called while the process
/// is single-threaded; the outcome is kept for [`available`].
pub fn enter_private_namespace() -> Result<(), String> {
    let outcome = SUPPORT.get_or_init(|| unshare_private().map_err(|e| e.to_string()));
    outcome.clone()
}

/// Whether [`enter_private_namespace`] succeeded.
pub fn available() -> Result<(), MountError> {
    match SUPPORT.get() {
        Some(Ok(())) => Ok(()),
        Some(Err(why)) => Err(MountError::Unavailable(why.clone())),
        None => Err(MountError::Unavailable("no private mount namespace".into())),
    }
}

fn unshare_private() -> io::Result<()> {
    // SAFETY: getuid/getgid cannot fail.
    let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
    let flags = if uid == 0 {
        libc::CLONE_NEWNS
    } else {
        libc::CLONE_NEWUSER | libc::CLONE_NEWNS
    };
    // SAFETY: unshare takes flags only; the caller is single-threaded, as
    // CLONE_NEWUSER requires.
    if unsafe { libc::unshare(flags) } != 0 {
        return Err(io::Error::last_os_error());
    }
    if uid != 0 {
        std::fs::write("/proc/self/setgroups", "deny")?;
        std::fs::write("/proc/self/uid_map", format!("{uid} {uid} 1"))?;
        std::fs::write("/proc/self/gid_map", format!("{gid} {gid} 1"))?;
    }
    let root = c"/";
    // SAFETY: a propagation change on "/" with no source, type or data.
    let rc = unsafe {
        libc::mount(
            std::ptr::null(),
            root.as_ptr(),
            std::ptr::null(),
            libc::MS_REC | libc::MS_SLAVE,
            std::ptr::null(),
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn cpath(p: &Path) -> io::Result<CString> {
    CString::new(p.as_os_str().as_bytes()).map_err(|_| io::ErrorKind::InvalidInput.into())
}

/// Binds `real` at `staged` (an empty directory elsewhere, under the
/// runtime dir) and makes that a shared mount, once: mounts attached
/// beneath `staged` then reach the sandboxes' copies of it, while `real`
/// itself never carries a mount — so no folder a client mounts (even the
/// whole home, which holds `real`) can contain one, and walking `real`
/// never crosses into a user's folder.
pub fn make_shared(real: &Path, staged: &Path) -> Result<(), MountError> {
    available()?;
    let dir = staged;
    let c = cpath(dir).map_err(os("naming", dir))?;
    if !is_mount_root(dir).map_err(os("inspecting", dir))? {
        let r = cpath(real).map_err(os("naming", real))?;
        // SAFETY: a bind of an existing directory on an existing one.
        let rc = unsafe {
            libc::mount(
                r.as_ptr(),
                c.as_ptr(),
                std::ptr::null(),
                libc::MS_BIND,
                std::ptr::null(),
            )
        };
        if rc != 0 {
            return Err(os("binding", dir)(io::Error::last_os_error()));
        }
    }
    // SAFETY: a propagation change on a mount we own.
    let rc = unsafe {
        libc::mount(
            std::ptr::null(),
            c.as_ptr(),
            std::ptr::null(),
            libc::MS_SHARED,
            std::ptr::null(),
        )
    };
    if rc != 0 {
        return Err(os("sharing", dir)(io::Error::last_os_error()));
    }
    Ok(())
}

/// Whether `path` is the root of a mount (`statx` STATX_ATTR_MOUNT_ROOT),
/// not following a final symlink.
pub fn is_mount_root(path: &Path) -> io::Result<bool> {
    let c = cpath(path)?;
    statx_mount_root(libc::AT_FDCWD, &c, libc::AT_SYMLINK_NOFOLLOW)
}

/// Whether the directory open as `fd` is the root of a mount.
fn fd_is_mount_root(fd: &OwnedFd) -> io::Result<bool> {
    statx_mount_root(fd.as_raw_fd(), c"", libc::AT_EMPTY_PATH)
}

fn statx_mount_root(dir: i32, path: &std::ffi::CStr, flags: i32) -> io::Result<bool> {
    // SAFETY: statx is plain old data; all-zero is a valid value.
    let mut stx: libc::statx = unsafe { std::mem::zeroed() };
    // SAFETY: `path` is a valid C string and `stx` a valid out-pointer.
    let rc = unsafe { libc::statx(dir, path.as_ptr(), flags, libc::STATX_BASIC_STATS, &mut stx) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    let attr = libc::STATX_ATTR_MOUNT_ROOT as u64;
    Ok(stx.stx_attributes_mask & attr != 0 && stx.stx_attributes & attr != 0)
}

/// The components of a client path (`subpath` relative to `/`, or an
/// absolute path) with `.` dropped; `..` is refused.
pub fn components(path: &str) -> Result<Vec<&str>, MountError> {
    let mut out = Vec::new();
    for c in Path::new(path).components() {
        match c {
            Component::RootDir | Component::CurDir => {}
            Component::ParentDir => return Err(MountError::DotDot(path.into())),
            Component::Normal(n) => out.push(n.to_str().unwrap_or_default()),
            Component::Prefix(_) => return Err(MountError::DotDot(path.into())),
        }
    }
    Ok(out)
}

/// The part of `path` (relative to `/`) beneath `home`, checked lexically.
pub fn rel_to_home(home: &Path, path: &str) -> Result<PathBuf, MountError> {
    let comps = components(path)?;
    let abs: PathBuf = std::iter::once("/").chain(comps).collect();
    match abs.strip_prefix(home) {
        Ok(rel) => Ok(rel.to_owned()),
        Err(_) => Err(MountError::OutsideHome {
            path: path.into(),
            home: home.to_owned(),
        }),
    }
}

/// Opens the existing directory `path` (relative to `/`) beneath `home`
/// as an `O_PATH` descriptor; `..`, paths outside home, symlinks leading
/// outside and missing directories are refused, and nothing is created. A
/// link that stays beneath home, absolute or relative, is followed: the
/// check is on the directory the descriptor holds, so nothing can swap it.
pub fn resolve_in_home(home: &Path, path: &str) -> Result<OwnedFd, MountError> {
    let rel = rel_to_home(home, path)?;
    let home_fd = open_dir(home)?;
    let names: Vec<String> = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    let beneath = walk(
        &home_fd,
        &names,
        home,
        libc::RESOLVE_BENEATH | libc::RESOLVE_NO_MAGICLINKS,
        Make::Nothing,
    );
    match beneath {
        // An absolute link (`~/code -> /home/u/src/code`), which
        // RESOLVE_BENEATH refuses even when it stays inside: followed, and
        // the directory it reached must still lie beneath home.
        Err(MountError::Os { error, .. }) if error.raw_os_error() == Some(libc::EXDEV) => {
            let fd = walk(
                &home_fd,
                &names,
                home,
                libc::RESOLVE_NO_MAGICLINKS,
                Make::Nothing,
            )?;
            let real = real_path(&fd).map_err(os("naming", home))?;
            let real_home = std::fs::canonicalize(home).map_err(os("naming", home))?;
            if !real.starts_with(&real_home) {
                return Err(MountError::OutsideHome {
                    path: path.into(),
                    home: home.to_owned(),
                });
            }
            Ok(fd)
        }
        r => r,
    }
}

/// Where a folder outside home never comes from: the kernel's own
/// filesystems, the host's processes, devices and kernel state.
pub const NEVER_SOURCES: [&str; 3] = ["/proc", "/sys", "/dev"];

/// Opens the source of a folder mount, `path` (relative to `/`), as an
/// `O_PATH` descriptor, by the rules the app relies on (docs/COWORK.md,
/// "Folder mounts"):
///
/// * beneath home: as [`resolve_in_home`]; a missing directory is created
///   (0700, as this user, each component opened without following any
///   link), and a link at the source that points to itself (the app's
///   known `.mcpb-cache` leftover) is replaced by a directory;
/// * elsewhere: an existing directory this user may read and search,
///   links followed, never one under [`NEVER_SOURCES`] or leading there;
///   nothing is created. The caller refuses boxdesk's own roots.
pub fn resolve_source(home: &Path, path: &str) -> Result<OwnedFd, MountError> {
    let comps = components(path)?;
    let abs: PathBuf = std::iter::once("/").chain(comps.iter().copied()).collect();
    if !abs.starts_with(home) {
        return outside_home(&abs);
    }
    let errno = |e: &MountError| match e {
        MountError::Os { error, .. } => error.raw_os_error(),
        _ => None,
    };
    match resolve_in_home(home, path) {
        Err(e) if errno(&e) == Some(libc::ENOENT) => {
            let rel = rel_to_home(home, path)?;
            let names: Vec<String> = rel
                .components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect();
            let home_fd = open_dir(home)?;
            let no_links = libc::RESOLVE_BENEATH | libc::RESOLVE_NO_SYMLINKS;
            walk(&home_fd, &names, home, no_links, Make::AsUser)?;
            resolve_in_home(home, path)
        }
        Err(e) if errno(&e) == Some(libc::ELOOP) => {
            if repair_self_link(home, &abs)? {
                resolve_in_home(home, path)
            } else {
                Err(e)
            }
        }
        r => r,
    }
}

/// Replaces the link at `abs` (beneath `home`) by an empty 0700 directory
/// when it points to itself; returns whether it did.
fn repair_self_link(home: &Path, abs: &Path) -> Result<bool, MountError> {
    let (Some(parent), Some(name)) = (abs.parent(), abs.file_name()) else {
        return Ok(false);
    };
    if !parent.starts_with(home) {
        return Ok(false);
    }
    let parent_str = parent.to_string_lossy();
    let dir = resolve_in_home(home, &parent_str)?;
    let c =
        CString::new(name.as_bytes()).map_err(|_| MountError::DotDot(abs.display().to_string()))?;
    let mut buf = [0u8; libc::PATH_MAX as usize];
    // SAFETY: `dir` is a valid directory fd, `c` a valid C string and
    // `buf` a writable buffer of the length passed.
    let n = unsafe {
        libc::readlinkat(
            dir.as_raw_fd(),
            c.as_ptr(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    };
    if n < 0 {
        return Ok(false);
    }
    let target = Path::new(std::ffi::OsStr::from_bytes(&buf[..n as usize]));
    let real_parent = real_path(&dir).map_err(os("naming", parent))?;
    let lands = boxdesk_sandbox::host_system::normalize(&real_parent.join(target));
    if lands != real_parent.join(name) && target != Path::new(name) {
        return Ok(false);
    }
    tracing::info!(
        "{}: a link to itself, replaced by a directory",
        abs.display()
    );
    // SAFETY: as above; unlinkat removes the link itself, never its target.
    if unsafe { libc::unlinkat(dir.as_raw_fd(), c.as_ptr(), 0) } != 0 {
        return Err(os("removing", abs)(io::Error::last_os_error()));
    }
    // SAFETY: as above.
    if unsafe { libc::mkdirat(dir.as_raw_fd(), c.as_ptr(), 0o700) } != 0 {
        return Err(os("creating", abs)(io::Error::last_os_error()));
    }
    Ok(true)
}

/// Opens `abs` (outside home), following links, as an existing directory
/// this user may read and search, not under [`NEVER_SOURCES`].
fn outside_home(abs: &Path) -> Result<OwnedFd, MountError> {
    let kernel = |p: &Path| NEVER_SOURCES.iter().any(|n| p.starts_with(n));
    if kernel(abs) {
        return Err(MountError::Kernel {
            path: abs.to_owned(),
        });
    }
    let root = open_dir(Path::new("/"))?;
    let names: Vec<String> = abs
        .components()
        .filter_map(|c| match c {
            Component::Normal(n) => Some(n.to_string_lossy().into_owned()),
            _ => None,
        })
        .collect();
    let fd = walk(
        &root,
        &names,
        Path::new("/"),
        libc::RESOLVE_NO_MAGICLINKS,
        Make::Nothing,
    )?;
    let real = real_path(&fd).map_err(os("naming", abs))?;
    if kernel(&real) {
        return Err(MountError::Kernel { path: real });
    }
    // SAFETY: faccessat2 on a valid fd with an empty path and AT_EMPTY_PATH
    // checks the directory the descriptor holds, with our real ids.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_faccessat2,
            fd.as_raw_fd(),
            c"".as_ptr(),
            libc::R_OK | libc::X_OK,
            libc::AT_EMPTY_PATH,
        )
    };
    if rc != 0 {
        return Err(MountError::NoAccess { path: real });
    }
    Ok(fd)
}

/// Opens (creating as needed, 0700 and the sandbox's: `base` is always one
/// of the dirs sandboxes see) the directory `base/names…` without
/// following any symlink on the way; each name is checked.
pub fn dir_beneath(base: &Path, names: &[&str]) -> Result<OwnedFd, MountError> {
    for n in names {
        super::names::check(n).map_err(|why| MountError::BadName {
            name: (*n).to_owned(),
            why,
        })?;
    }
    let base_fd = open_dir(base)?;
    let names: Vec<String> = names.iter().map(|s| (*s).to_owned()).collect();
    walk(
        &base_fd,
        &names,
        base,
        libc::RESOLVE_BENEATH | libc::RESOLVE_NO_SYMLINKS,
        Make::ForSandbox,
    )
}

fn open_dir(p: &Path) -> Result<OwnedFd, MountError> {
    let c = cpath(p).map_err(os("naming", p))?;
    // SAFETY: `c` is a valid C string; the returned fd is owned below.
    let fd = unsafe {
        libc::open(
            c.as_ptr(),
            libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(os("opening", p)(io::Error::last_os_error()));
    }
    // SAFETY: `fd` is a fresh descriptor nobody else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Whether [`walk`] makes the directories it does not find (0700).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Make {
    /// A missing one is an error.
    Nothing,
    /// Made, then given to the sandbox's ids (the sandboxes' own dirs).
    ForSandbox,
    /// Made, and left this user's (the user's folders).
    AsUser,
}

/// Opens `names` one at a time beneath `start` with `resolve` flags,
/// making each missing directory as `make` says.
fn walk(
    start: &OwnedFd,
    names: &[String],
    shown: &Path,
    resolve: u64,
    make: Make,
) -> Result<OwnedFd, MountError> {
    let mut cur = open_at(start, ".", resolve).map_err(os("opening", shown))?;
    let mut here = shown.to_owned();
    for n in names {
        here.push(n);
        let c = CString::new(n.as_bytes()).map_err(|_| MountError::BadName {
            name: n.clone(),
            why: NameError::Nul,
        })?;
        let mut made = false;
        if make != Make::Nothing {
            // SAFETY: `cur` is a valid directory fd and `c` a valid C
            // string; mkdirat never follows a symlink in its last component.
            let rc = unsafe { libc::mkdirat(cur.as_raw_fd(), c.as_ptr(), 0o700) };
            made = rc == 0;
            if rc != 0 {
                let e = io::Error::last_os_error();
                if e.raw_os_error() != Some(libc::EEXIST) {
                    return Err(os("creating", &here)(e));
                }
            }
        }
        cur = open_at(&cur, n, resolve).map_err(os("opening", &here))?;
        if made && make == Make::ForSandbox {
            super::private::give_to_sandbox(cur.as_raw_fd()).map_err(os("chown", &here))?;
        }
    }
    Ok(cur)
}

fn open_at(dir: &OwnedFd, name: &str, resolve: u64) -> io::Result<OwnedFd> {
    let c = CString::new(name).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: open_how is plain old data; all-zero is a valid value.
    let mut how: libc::open_how = unsafe { std::mem::zeroed() };
    how.flags = (libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC) as u64;
    how.resolve = resolve;
    // SAFETY: `how` is a valid open_how of the size passed; `c` is a valid
    // C string and `dir` a valid directory fd.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_openat2,
            dir.as_raw_fd(),
            c.as_ptr(),
            &how as *const libc::open_how,
            std::mem::size_of::<libc::open_how>(),
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: openat2 returned a fresh descriptor nobody else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

const OPEN_TREE_CLONE: libc::c_uint = 1;
const MOVE_MOUNT_F_EMPTY_PATH: libc::c_uint = 0x4;
const MOVE_MOUNT_T_EMPTY_PATH: libc::c_uint = 0x40;
const MOUNT_ATTR_RDONLY: u64 = 0x1;

/// Most mounts stacked on one target that [`attach`] and [`detach_all`]
/// take off before giving up.
const MAX_STACK: usize = 16;

/// Mounts the tree at `src` (an `O_PATH` descriptor from
/// [`resolve_in_home`]) on the directory `base/names…` (made and opened
/// by [`dir_beneath`]), read-only throughout when `read_only`. Mounts
/// already there are taken off first, so re-mounting a name replaces it.
pub fn attach(
    src: &OwnedFd,
    base: &Path,
    names: &[&str],
    read_only: bool,
    shown: &Path,
) -> Result<(), MountError> {
    available()?;
    let mut target = dir_beneath(base, names)?;
    for _ in 0..MAX_STACK {
        if !fd_is_mount_root(&target).map_err(os("inspecting", shown))? {
            break;
        }
        detach(&fd_path(&target));
        // The old descriptor is on the mount just taken off.
        target = dir_beneath(base, names)?;
    }
    let empty = c"";
    // SAFETY: open_tree on a valid fd with an empty path; the result is a
    // fresh descriptor owned below.
    let tree = unsafe {
        libc::syscall(
            libc::SYS_open_tree,
            src.as_raw_fd(),
            empty.as_ptr(),
            OPEN_TREE_CLONE
                | libc::O_CLOEXEC as libc::c_uint
                | libc::AT_RECURSIVE as libc::c_uint
                | libc::AT_EMPTY_PATH as libc::c_uint,
        )
    };
    if tree < 0 {
        return Err(os("cloning", shown)(io::Error::last_os_error()));
    }
    // SAFETY: open_tree returned a fresh descriptor nobody else owns.
    let tree = unsafe { OwnedFd::from_raw_fd(tree as i32) };
    if let Some(userns) = root_idmap() {
        // A root-started server's sandboxes are root of their own user
        // namespace, a subordinate id outside: through this mount, files
        // the host's root owns are theirs, and what they create lands as
        // root's, as if root had written it. A file system that cannot be
        // id-mapped is attached plainly (the sandbox then only reads what
        // others may read).
        let idmap = MountAttr {
            attr_set: MOUNT_ATTR_IDMAP,
            attr_clr: 0,
            propagation: 0,
            userns_fd: userns.as_raw_fd() as u64,
        };
        if let Err(e) = setattr(&tree, &idmap) {
            tracing::warn!(
                "{}: cannot id-map the mount for a root-started sandbox ({e}); attached as it is",
                super::logged(shown.display())
            );
        }
    }
    if read_only {
        let attr = MountAttr {
            attr_set: MOUNT_ATTR_RDONLY,
            attr_clr: 0,
            propagation: 0,
            userns_fd: 0,
        };
        setattr(&tree, &attr).map_err(os("making read-only", shown))?;
    }
    // SAFETY: moves the detached tree onto the target directory; both are
    // valid descriptors and the paths are empty.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            tree.as_raw_fd(),
            empty.as_ptr(),
            target.as_raw_fd(),
            empty.as_ptr(),
            MOVE_MOUNT_F_EMPTY_PATH | MOVE_MOUNT_T_EMPTY_PATH,
        )
    };
    if rc != 0 {
        return Err(os("mounting on", shown)(io::Error::last_os_error()));
    }
    Ok(())
}

/// When this server runs as root: a user namespace mapping 0 to the
/// sandboxes' subordinate ids, the id map of [`attach`]'s mounts. Made
/// once; `None` as a user (the sandboxes then are the user) or where user
/// namespaces cannot be made.
fn root_idmap() -> Option<&'static OwnedFd> {
    static USERNS: OnceLock<Option<OwnedFd>> = OnceLock::new();
    USERNS
        .get_or_init(|| {
            if boxdesk_platform::euid() != 0 {
                return None;
            }
            let (uid, gid) = super::private::sandbox_owner();
            match userns_mapping_root_to(uid, gid) {
                Ok(fd) => Some(fd),
                Err(e) => {
                    tracing::warn!("no id-mapped mounts for sandboxes: {e}");
                    None
                }
            }
        })
        .as_ref()
}

/// Lazily unmounts whatever is mounted at `path` (errors ignored: nothing
/// mounted is the outcome wanted).
pub fn detach(path: &Path) {
    if let Ok(c) = cpath(path) {
        // SAFETY: `c` is a valid C string; MNT_DETACH only unmounts.
        unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
    }
}

/// Takes every mount beneath `sessions/<only>` (beneath `sessions` when
/// `only` is `None`) off. Which mounts is this process's mountinfo's word:
/// a sandbox can move its session's `mnt` (and what is mounted in it)
/// anywhere in its session, or put a link to another session's `mnt`, or
/// to `/`, in its place; a walk by path would then miss its own mounts and
/// take others off. So each mount point listed there is opened beneath
/// `sessions` with no symlink followed on the way, checked to be a mount's
/// root, and taken off through `/proc/self/fd/N`; deepest first, again
/// until none is left (mounts stack).
pub fn detach_all(sessions: &Path, only: Option<&str>) {
    let no_links = libc::RESOLVE_BENEATH | libc::RESOLVE_NO_SYMLINKS;
    let Ok(base) = open_dir(sessions) else {
        return;
    };
    // The sessions dir as mountinfo names it.
    let Ok(root) = real_path(&base) else {
        return;
    };
    let within = only.map_or_else(|| root.clone(), |name| root.join(name));
    for _ in 0..MAX_STACK {
        let Ok(points) = boxdesk_platform::mountinfo::own_mount_points() else {
            return;
        };
        let mut took = false;
        // (a mount is listed after the one it sits on)
        for point in points.iter().rev() {
            if point == &root || !point.starts_with(&within) {
                continue;
            }
            let Some(names) = normal_names(point.strip_prefix(&root).unwrap_or(point)) else {
                continue;
            };
            let Ok(target) = walk(&base, &names, sessions, no_links, Make::Nothing) else {
                continue;
            };
            if fd_is_mount_root(&target).unwrap_or(false) {
                detach(&fd_path(&target));
                took = true;
            }
        }
        if !took {
            return;
        }
    }
}

/// A relative path's names, when it has only plain ones (UTF-8, no `.`
/// or `..`).
fn normal_names(rel: &Path) -> Option<Vec<String>> {
    rel.components()
        .map(|c| match c {
            Component::Normal(n) => n.to_str().map(str::to_owned),
            _ => None,
        })
        .collect()
}

/// `/proc/self/fd/N` of `fd`: the very directory it holds, whatever
/// happened to its path since.
fn fd_path(fd: &OwnedFd) -> PathBuf {
    PathBuf::from(format!("/proc/self/fd/{}", fd.as_raw_fd()))
}

/// The real path of the directory open as `fd`.
pub fn real_path(fd: &OwnedFd) -> io::Result<PathBuf> {
    std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_paths_are_checked_against_home_before_anything_is_opened() {
        let home = Path::new("/home/u");
        assert_eq!(
            rel_to_home(home, "home/u/proj/a").unwrap(),
            Path::new("proj/a")
        );
        assert_eq!(
            rel_to_home(home, "/home/u/./proj").unwrap(),
            Path::new("proj")
        );
        assert!(matches!(
            rel_to_home(home, "home/u/../../etc"),
            Err(MountError::DotDot(_))
        ));
        assert!(matches!(
            rel_to_home(home, "etc"),
            Err(MountError::OutsideHome { .. })
        ));
        assert!(matches!(
            rel_to_home(home, "home/user2"),
            Err(MountError::OutsideHome { .. })
        ));
    }

    #[test]
    fn names_must_be_one_component_and_are_checked_before_anything_is_made() {
        let t = tempfile::tempdir().unwrap();
        for bad in ["", ".", "..", "a/b", "a\0b"] {
            assert!(
                matches!(
                    dir_beneath(t.path(), &["first", bad]),
                    Err(MountError::BadName { .. })
                ),
                "{bad:?}"
            );
            assert!(!t.path().join("first").exists(), "{bad:?}");
        }
        dir_beneath(t.path(), &[".skills"]).unwrap();
    }

    #[test]
    fn a_link_is_followed_where_it_lands_beneath_home_and_refused_where_it_leaves() {
        let t = tempfile::tempdir().unwrap();
        let home = t.path().join("home");
        std::fs::create_dir_all(home.join("real")).unwrap();
        std::os::unix::fs::symlink("/etc", home.join("esc")).unwrap();
        std::os::unix::fs::symlink("real", home.join("inside")).unwrap();
        // Absolute, and back inside home: followed, as the design says.
        std::os::unix::fs::symlink(home.join("real"), home.join("abs")).unwrap();
        // Absolute, out and back in through a link outside home: still
        // judged by where it lands.
        std::os::unix::fs::symlink(t.path(), home.join("up")).unwrap();
        let rel = |p: &str| format!("{}/{p}", home.display());
        assert!(resolve_in_home(&home, &rel("real")).is_ok());
        assert!(resolve_in_home(&home, &rel("inside")).is_ok());
        let abs = resolve_in_home(&home, &rel("abs")).unwrap();
        assert_eq!(
            real_path(&abs).unwrap(),
            home.join("real").canonicalize().unwrap()
        );
        assert!(resolve_in_home(&home, &rel("up/home/real")).is_ok());
        assert!(resolve_in_home(&home, &rel("up")).is_err());
        assert!(resolve_in_home(&home, &rel("esc")).is_err());
    }

    #[test]
    fn a_missing_source_folder_is_refused_and_nothing_is_created_in_home() {
        let t = tempfile::tempdir().unwrap();
        let home = t.path().join("home");
        std::fs::create_dir_all(home.join("real")).unwrap();
        let rel = |p: &str| format!("{}/{p}", home.display());
        let e = resolve_in_home(&home, &rel("real/new/dir")).unwrap_err();
        assert!(e.to_string().contains("No such file"), "{e}");
        assert!(!home.join("real/new").exists());
        assert!(resolve_in_home(&home, &rel("gone")).is_err());
        assert!(!home.join("gone").exists());
    }

    #[test]
    fn a_descriptor_names_its_real_path_for_the_containment_check() {
        let t = tempfile::tempdir().unwrap();
        let fd = open_dir(t.path()).unwrap();
        assert_eq!(real_path(&fd).unwrap(), t.path().canonicalize().unwrap());
        assert!(!fd_is_mount_root(&fd).unwrap());
    }

    #[test]
    fn mount_targets_never_follow_a_symlink() {
        let t = tempfile::tempdir().unwrap();
        std::fs::create_dir(t.path().join("s")).unwrap();
        std::os::unix::fs::symlink("/tmp", t.path().join("s/mnt")).unwrap();
        assert!(dir_beneath(t.path(), &["s", "mnt", "x"]).is_err());
        assert!(dir_beneath(t.path(), &["s", "ok", "x"]).is_ok());
        assert!(t.path().join("s/ok/x").is_dir());
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(t.path().join("s/ok/x"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o700);
    }
}
