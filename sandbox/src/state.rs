//! The per-sandbox state dir `$XDG_STATE_HOME/boxdesk/<name>/`: what backs
//! a sandbox's writable paths (`root/`, `work/`, `results/`), whichever
//! backend runs it, and the markers that say how its last run ended.
//!
//! One rule for its life, whoever dies first: the dir is made by `run`,
//! kept while the sandbox runs, kept when the sandbox or its helper dies
//! (the sandbox is then `dead`, see [`Leftover`]), and removed only by a
//! `stop` (unless `--keep`). A `run --name` over a dir that is already there
//! refuses unless asked to reuse it.
//!
//! This module owns the state dir's shape and its removal. Removal never
//! recurses on the stack (a sandbox can leave a tree thousands of levels
//! deep), never follows a symlink and never leaves the directory it was
//! asked to remove.

use std::ffi::{OsStr, OsString};
use std::fs::{self, DirBuilder};
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};

use nix::dir::Dir;
use nix::errno::Errno;
use nix::fcntl::{openat, AtFlags, OFlag};
use nix::sys::stat::{fchmod, fchmodat, fstat, fstatat, FchmodatFlags, Mode, SFlag};
use nix::unistd::{unlinkat, UnlinkatFlags};

/// Why a state dir cannot be prepared.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    /// The state dir (or a directory or marker in it) could not be made.
    #[error("cannot prepare the sandbox state dir {}", path.display())]
    Dir {
        /// The directory.
        path: PathBuf,
        /// What the OS said.
        #[source]
        source: io::Error,
    },
    /// A state dir of that name is already there.
    #[error("{} already holds the state of an earlier sandbox named {name} (its /work, /root and /results); `boxdesk stop {name}` removes it, `boxdesk run --reuse` runs over it", dir.display())]
    Leftover {
        /// The sandbox name.
        name: String,
        /// The state dir.
        dir: PathBuf,
    },
    /// The private state root failed its checks.
    #[error(transparent)]
    Root(#[from] boxdesk_platform::DirError),
}

/// The per-sandbox state dir `$XDG_STATE_HOME/boxdesk/<name>/`.
#[derive(Debug, Clone)]
pub struct StateDir {
    /// The directory itself.
    pub dir: PathBuf,
}

/// File in a state dir that marks it as `--keep`.
const KEEP_MARKER: &str = "keep";
/// File in a state dir saying why its sandbox ended without a `stop`.
const ENDED_MARKER: &str = "ended";
/// File in a state dir of a `--keep` sandbox that was stopped cleanly.
const STOPPED_MARKER: &str = "stopped";

/// How a state dir with no helper behind it came to be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Leftover {
    /// `--keep` and stopped cleanly.
    Stopped,
    /// The sandbox or its helper died; why, where the helper could say.
    Dead(Option<String>),
}

impl Leftover {
    /// The `state` word `ls` shows.
    pub fn word(&self) -> &'static str {
        match self {
            Leftover::Stopped => "stopped",
            Leftover::Dead(_) => "dead",
        }
    }
}

/// Who owns the writable dirs: the host uid and gid that root inside the
/// sandbox maps to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Owner {
    /// Host uid.
    pub uid: u32,
    /// Host gid.
    pub gid: u32,
}

impl Owner {
    /// This process's uid and gid.
    pub fn us() -> Self {
        // SAFETY: getuid/getgid cannot fail and touch no memory of ours.
        unsafe {
            Owner {
                uid: libc::getuid(),
                gid: libc::getgid(),
            }
        }
    }
}

impl StateDir {
    /// Creates the state dir of `name` under the private boxdesk state root,
    /// with `root/`, `work/` and `results/` inside owned by `owner`. A dir
    /// already there is refused ([`StateError::Leftover`]) unless `reuse`.
    /// With `keep`, a `keep` marker says so to a later `stop` or `ls`.
    pub fn prepare(
        state_root: &Path,
        name: &str,
        keep: bool,
        reuse: bool,
        owner: Owner,
    ) -> Result<Self, StateError> {
        boxdesk_platform::dirs::ensure_private_dir(state_root)?;
        let dir = state_root.join(name);
        let io_err = |path: &Path| {
            let path = path.to_owned();
            move |source| StateError::Dir { path, source }
        };
        match DirBuilder::new().mode(0o700).create(&dir) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists && reuse && is_real_dir(&dir) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                return Err(StateError::Leftover {
                    name: name.to_owned(),
                    dir,
                })
            }
            Err(e) => return Err(io_err(&dir)(e)),
        }
        let s = StateDir { dir };
        for (path, mode) in [(s.root(), 0o700), (s.work(), 0o755), (s.results(), 0o755)] {
            match DirBuilder::new().mode(mode).create(&path) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists && is_real_dir(&path) => {}
                Err(e) => return Err(io_err(&path)(e)),
            }
        }
        s.hand_to(owner)?;
        for marker in [ENDED_MARKER, STOPPED_MARKER] {
            remove_file_if_there(&s.dir.join(marker)).map_err(io_err(&s.dir))?;
        }
        let marker = s.dir.join(KEEP_MARKER);
        let marked = if keep {
            fs::write(&marker, b"")
        } else {
            remove_file_if_there(&marker)
        };
        marked.map_err(io_err(&marker))?;
        Ok(s)
    }

    /// Makes `owner` the owner of `root/`, `work/` and `results/` (not of
    /// what is in them), where it is not already; never through a symlink.
    pub fn hand_to(&self, owner: Owner) -> Result<(), StateError> {
        for path in [self.root(), self.work(), self.results()] {
            let io_err = |source| StateError::Dir {
                path: path.clone(),
                source,
            };
            let meta = fs::symlink_metadata(&path).map_err(io_err)?;
            if (meta.uid(), meta.gid()) != (owner.uid, owner.gid) {
                std::os::unix::fs::lchown(&path, Some(owner.uid), Some(owner.gid))
                    .map_err(io_err)?;
            }
        }
        Ok(())
    }

    /// The state dir of `name` if it is there.
    pub fn existing(state_root: &Path, name: &str) -> Option<Self> {
        let dir = state_root.join(name);
        is_real_dir(&dir).then_some(StateDir { dir })
    }

    /// Every state dir under `state_root`, by name.
    pub fn all(state_root: &Path) -> Vec<(String, Self)> {
        let Ok(entries) = fs::read_dir(state_root) else {
            return Vec::new();
        };
        let mut out: Vec<(String, Self)> = entries
            .filter_map(Result::ok)
            .filter_map(|e| {
                let name = e.file_name().into_string().ok()?;
                boxdesk_platform::names::validate_name(&name).ok()?;
                Some((name, StateDir { dir: e.path() }))
            })
            .filter(|(_, s)| is_real_dir(&s.dir))
            .collect();
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }

    /// Whether the sandbox was started with `--keep`.
    pub fn keep(&self) -> bool {
        self.dir.join(KEEP_MARKER).exists()
    }

    /// How this dir was left, for a sandbox with no helper behind it.
    pub fn leftover(&self) -> Leftover {
        if self.dir.join(STOPPED_MARKER).exists() {
            return Leftover::Stopped;
        }
        let why = fs::read(self.dir.join(ENDED_MARKER))
            .ok()
            .map(|b| {
                String::from_utf8_lossy(&b[..b.len().min(512)])
                    .trim()
                    .to_owned()
            })
            .filter(|s| !s.is_empty());
        Leftover::Dead(why)
    }

    /// Records why the sandbox ended without a `stop` (for `ls`).
    pub fn mark_ended(&self, why: &str) {
        let _ = fs::write(self.dir.join(ENDED_MARKER), why.as_bytes());
    }

    /// Records a clean stop of a `--keep` sandbox.
    pub fn mark_stopped(&self) {
        let _ = fs::write(self.dir.join(STOPPED_MARKER), b"");
    }

    /// Backs `/root`.
    pub fn root(&self) -> PathBuf {
        self.dir.join("root")
    }
    /// Backs `/work`.
    pub fn work(&self) -> PathBuf {
        self.dir.join("work")
    }
    /// Backs `/results`.
    pub fn results(&self) -> PathBuf {
        self.dir.join("results")
    }
    /// The sandbox's copies of the host's `/etc` files whose links would
    /// dangle inside ([`crate::host_system::EtcFiles`]).
    pub fn etc(&self) -> PathBuf {
        self.dir.join("etc")
    }
    /// Where the helper binds the agent's listening socket (never visible
    /// inside the sandbox).
    pub fn agent_sock(&self) -> PathBuf {
        self.dir.join("agent.sock")
    }

    /// Removes the whole state dir ([`remove_tree`]).
    pub fn remove(&self) -> io::Result<()> {
        remove_tree(&self.dir)
    }
}

fn is_real_dir(p: &Path) -> bool {
    fs::symlink_metadata(p).is_ok_and(|m| m.is_dir())
}

fn remove_file_if_there(p: &Path) -> io::Result<()> {
    match fs::remove_file(p) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// Removes `dir` and everything beneath it. A missing `dir` is not an
/// error.
///
/// Iterative: one directory descriptor open at a time, climbing back with
/// `..` checked against the device and inode recorded on the way down, so
/// a tree of any depth costs neither stack nor descriptors. Symlinks are
/// removed, never followed; directories the sandbox made unreadable or
/// unwritable are made `0700` first; a directory on another file system
/// (a mount point) is never entered.
pub fn remove_tree(dir: &Path) -> io::Result<()> {
    let (Some(parent), Some(name)) = (dir.parent(), dir.file_name()) else {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "refusing to remove a path with no parent",
        ));
    };
    let parent = match open_dir_at(None, parent.as_os_str()) {
        Ok(fd) => fd,
        Err(Errno::ENOENT) => return Ok(()),
        Err(e) => return Err(e.into()),
    };
    let top = match enter(&parent, name) {
        Ok(fd) => fd,
        Err(Errno::ENOENT) => return Ok(()),
        Err(Errno::ENOTDIR) => {
            return Ok(unlinkat(
                Some(parent.as_raw_fd()),
                name,
                UnlinkatFlags::NoRemoveDir,
            )?)
        }
        Err(e) => return Err(e.into()),
    };
    let dev = dev_of(&fstat(top.as_raw_fd())?);
    empty_tree(top, dev)?;
    match unlinkat(Some(parent.as_raw_fd()), name, UnlinkatFlags::RemoveDir) {
        Ok(()) | Err(Errno::ENOENT) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Empties the directory open as `top` (on device `dev`), leaving it.
fn empty_tree(top: OwnedFd, dev: u64) -> io::Result<()> {
    // The way down: each entered directory's name in its parent, and the
    // parent's (dev, ino) to check `..` against on the way back up.
    let mut down: Vec<(OsString, u64)> = Vec::new();
    let mut cur = top;
    loop {
        match first_nonempty_subdir(&cur, dev)? {
            Some(name) => {
                let here = fstat(cur.as_raw_fd())?.st_ino;
                let child = enter(&cur, &name)?;
                down.push((name, here));
                cur = child;
            }
            None => {
                let Some((name, parent_ino)) = down.pop() else {
                    return Ok(());
                };
                let up = open_dir_at(Some(&cur), OsStr::new(".."))?;
                let st = fstat(up.as_raw_fd())?;
                if st.st_ino != parent_ino || dev_of(&st) != dev {
                    return Err(io::Error::other(
                        "a directory moved while it was being removed",
                    ));
                }
                unlink_retrying(&up, &name, UnlinkatFlags::RemoveDir)?;
                cur = up;
            }
        }
    }
}

/// Removes every entry of `dir` that can go at once (files, symlinks,
/// empty directories) and returns the name of a directory that is not
/// empty, to be entered next; `None` once `dir` is empty.
fn first_nonempty_subdir(dir: &OwnedFd, dev: u64) -> io::Result<Option<OsString>> {
    loop {
        let mut removed_any = false;
        let mut listing = match Dir::openat(Some(dir.as_raw_fd()), ".", dir_flags(), Mode::empty())
        {
            Ok(d) => d,
            Err(Errno::EACCES) => {
                fchmod(dir.as_raw_fd(), Mode::from_bits_truncate(0o700))?;
                Dir::openat(Some(dir.as_raw_fd()), ".", dir_flags(), Mode::empty())?
            }
            Err(e) => return Err(e.into()),
        };
        let mut names: Vec<OsString> = Vec::new();
        for entry in listing.iter() {
            let entry = entry?;
            let name = entry.file_name().to_bytes();
            if name != b"." && name != b".." {
                names.push(OsStr::from_bytes(name).to_owned());
            }
            // Bounded batches keep memory flat in a huge directory.
            if names.len() >= 4096 {
                break;
            }
        }
        drop(listing);
        if names.is_empty() {
            return Ok(None);
        }
        for name in names {
            let st = match fstatat(
                Some(dir.as_raw_fd()),
                name.as_os_str(),
                AtFlags::AT_SYMLINK_NOFOLLOW,
            ) {
                Ok(st) => st,
                Err(Errno::ENOENT) => continue,
                Err(e) => return Err(e.into()),
            };
            let is_dir =
                SFlag::from_bits_truncate(st.st_mode & SFlag::S_IFMT.bits()) == SFlag::S_IFDIR;
            if !is_dir {
                unlink_retrying(dir, &name, UnlinkatFlags::NoRemoveDir)?;
                removed_any = true;
                continue;
            }
            if dev_of(&st) != dev {
                return Err(io::Error::other(format!(
                    "{} is a mount point; not removing across it",
                    name.to_string_lossy()
                )));
            }
            match unlinkat(
                Some(dir.as_raw_fd()),
                name.as_os_str(),
                UnlinkatFlags::RemoveDir,
            ) {
                Ok(()) | Err(Errno::ENOENT) => removed_any = true,
                Err(Errno::ENOTEMPTY | Errno::EEXIST) => return Ok(Some(name)),
                Err(Errno::EACCES | Errno::EPERM) => {
                    make_writable(dir)?;
                    return Ok(Some(name));
                }
                Err(e) => return Err(e.into()),
            }
        }
        if !removed_any {
            return Err(io::Error::other("directory entries cannot be removed"));
        }
    }
}

/// The device of `st` (a `u64` on Linux, an `i32` on macOS).
#[allow(clippy::unnecessary_cast)]
fn dev_of(st: &nix::sys::stat::FileStat) -> u64 {
    st.st_dev as u64
}

fn dir_flags() -> OFlag {
    OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC
}

fn open_dir_at(dir: Option<&OwnedFd>, name: &OsStr) -> Result<OwnedFd, Errno> {
    let fd = openat(dir.map(|d| d.as_raw_fd()), name, dir_flags(), Mode::empty())?;
    // SAFETY: openat returned a new descriptor that nothing else owns.
    Ok(unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) })
}

/// Opens the subdirectory `name` of `dir` without following a symlink,
/// making it `0700` first if the sandbox left it unreadable.
fn enter(dir: &OwnedFd, name: &OsStr) -> Result<OwnedFd, Errno> {
    match open_dir_at(Some(dir), name) {
        Err(Errno::EACCES) => {
            let st = fstatat(Some(dir.as_raw_fd()), name, AtFlags::AT_SYMLINK_NOFOLLOW)?;
            if SFlag::from_bits_truncate(st.st_mode & SFlag::S_IFMT.bits()) != SFlag::S_IFDIR {
                return Err(Errno::ENOTDIR);
            }
            // Not a symlink (checked just above; nothing inside runs any
            // more), so following is the same as not following.
            fchmodat(
                Some(dir.as_raw_fd()),
                name,
                Mode::from_bits_truncate(0o700),
                FchmodatFlags::FollowSymlink,
            )?;
            open_dir_at(Some(dir), name)
        }
        other => other,
    }
}

fn make_writable(dir: &OwnedFd) -> io::Result<()> {
    Ok(fchmod(
        dir.as_fd().as_raw_fd(),
        Mode::from_bits_truncate(0o700),
    )?)
}

/// `unlinkat`, once more after making `dir` writable if it was not.
fn unlink_retrying(dir: &OwnedFd, name: &OsStr, how: UnlinkatFlags) -> io::Result<()> {
    let again = |how| unlinkat(Some(dir.as_raw_fd()), name, how);
    match again(how) {
        Ok(()) | Err(Errno::ENOENT) => Ok(()),
        Err(Errno::EACCES | Errno::EPERM) => {
            make_writable(dir)?;
            match again(how) {
                Ok(()) | Err(Errno::ENOENT) => Ok(()),
                Err(e) => Err(e.into()),
            }
        }
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn me() -> Owner {
        // SAFETY: getuid/getgid cannot fail.
        unsafe {
            Owner {
                uid: libc::getuid(),
                gid: libc::getgid(),
            }
        }
    }

    #[test]
    fn a_tree_ten_thousand_levels_deep_is_removed_on_a_small_stack() {
        let root = tempfile::tempdir().unwrap();
        let top = root.path().join("deep");
        fs::create_dir(&top).unwrap();
        // Built with relative paths from a descriptor: the absolute path
        // would be far over PATH_MAX.
        let mut cur = open_dir_at(None, top.as_os_str()).unwrap();
        for i in 0..10_000 {
            nix::sys::stat::mkdirat(Some(cur.as_raw_fd()), "d", Mode::from_bits_truncate(0o755))
                .unwrap();
            if i % 1000 == 0 {
                let f = openat(
                    Some(cur.as_raw_fd()),
                    "f",
                    OFlag::O_CREAT | OFlag::O_WRONLY | OFlag::O_CLOEXEC,
                    Mode::from_bits_truncate(0o644),
                )
                .unwrap();
                nix::unistd::close(f).unwrap();
            }
            cur = open_dir_at(Some(&cur), OsStr::new("d")).unwrap();
        }
        drop(cur);
        let t = std::thread::Builder::new()
            .stack_size(64 * 1024)
            .spawn(move || remove_tree(&top).map(|()| top))
            .unwrap();
        let top = t.join().expect("no stack overflow").unwrap();
        assert!(!top.exists());
        assert!(root.path().exists());
    }

    #[test]
    fn symlinks_inside_are_removed_and_never_followed() {
        let root = tempfile::tempdir().unwrap();
        let outside = root.path().join("outside");
        fs::create_dir(&outside).unwrap();
        fs::write(outside.join("precious"), b"x").unwrap();
        let top = root.path().join("state");
        fs::create_dir_all(top.join("work/a")).unwrap();
        std::os::unix::fs::symlink(&outside, top.join("work/link")).unwrap();
        std::os::unix::fs::symlink(&outside, top.join("work/a/link")).unwrap();
        remove_tree(&top).unwrap();
        assert!(!top.exists());
        assert_eq!(fs::read(outside.join("precious")).unwrap(), b"x");
    }

    #[test]
    fn directories_left_unreadable_or_unwritable_are_removed_too() {
        let root = tempfile::tempdir().unwrap();
        let top = root.path().join("state");
        fs::create_dir_all(top.join("a/b/c")).unwrap();
        fs::write(top.join("a/b/c/f"), b"x").unwrap();
        fs::set_permissions(top.join("a/b/c"), fs::Permissions::from_mode(0o555)).unwrap();
        fs::set_permissions(top.join("a/b"), fs::Permissions::from_mode(0o000)).unwrap();
        remove_tree(&top).unwrap();
        assert!(!top.exists());
    }

    #[test]
    fn a_wide_directory_is_emptied_in_batches() {
        let root = tempfile::tempdir().unwrap();
        let top = root.path().join("wide");
        fs::create_dir(&top).unwrap();
        for i in 0..10_000 {
            fs::write(top.join(format!("f{i}")), b"").unwrap();
        }
        for i in 0..50 {
            fs::create_dir_all(top.join(format!("d{i}/x"))).unwrap();
        }
        remove_tree(&top).unwrap();
        assert!(!top.exists());
    }

    #[test]
    fn removing_what_is_not_there_is_not_an_error() {
        let root = tempfile::tempdir().unwrap();
        remove_tree(&root.path().join("absent")).unwrap();
        remove_tree(&root.path().join("absent/below")).unwrap();
    }

    #[test]
    fn a_second_prepare_of_the_same_name_is_refused_unless_reused() {
        let root = tempfile::tempdir().unwrap();
        let state_root = root.path().join("boxdesk");
        let s = StateDir::prepare(&state_root, "x", false, false, me()).unwrap();
        fs::write(s.work().join("kept"), b"1").unwrap();
        let e = StateDir::prepare(&state_root, "x", false, false, me()).unwrap_err();
        let msg = e.to_string();
        assert!(matches!(e, StateError::Leftover { .. }), "{msg}");
        assert!(msg.contains(&s.dir.display().to_string()), "{msg}");
        assert!(
            msg.contains("--reuse") && msg.contains("boxdesk stop x"),
            "{msg}"
        );
        let again = StateDir::prepare(&state_root, "x", false, true, me()).unwrap();
        assert_eq!(fs::read(again.work().join("kept")).unwrap(), b"1");
    }

    #[test]
    fn a_leftover_says_whether_it_was_stopped_or_died_and_why() {
        let root = tempfile::tempdir().unwrap();
        let state_root = root.path().join("boxdesk");
        let s = StateDir::prepare(&state_root, "x", true, false, me()).unwrap();
        assert_eq!(s.leftover(), Leftover::Dead(None));
        s.mark_ended("the agent was killed (signal 9)");
        assert_eq!(
            s.leftover(),
            Leftover::Dead(Some("the agent was killed (signal 9)".into()))
        );
        let s = StateDir::prepare(&state_root, "x", true, true, me()).unwrap();
        assert_eq!(
            s.leftover(),
            Leftover::Dead(None),
            "a new run clears the marker"
        );
        s.mark_stopped();
        assert_eq!(s.leftover().word(), "stopped");
        assert!(s.keep());
        let all = StateDir::all(&state_root);
        assert_eq!(all.len(), 1);
        assert_eq!(all[0].0, "x");
    }
}
