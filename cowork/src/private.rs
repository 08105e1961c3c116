//! The cowork server's own directories on the host: its data and runtime
//! directories (0700). Its sandboxes' logs are opened, like every log, by
//! `boxdesk_sandbox::log::open` (0600, never through a symlink, ours).
//!
//! A directory is created 0700; one that already exists and is ours is
//! *tightened* to 0700 (earlier versions made them 0755, and refusing to
//! start over our own mistake would only break the app), with one log
//! line saying so. One owned by another uid, a symlink, or not a directory
//! is refused: this module never follows a symlink in the last component
//! and never uses, or changes, anything another user owns.
//!
//! The directories a sandbox uses (the sessions dir, the home mirror and
//! what the server makes beneath them) belong to the sandbox's outside
//! ids ([`sandbox_owner`]): ours when the server runs as a user, the
//! subordinate id root inside a sandbox has when it runs as root (a 0700
//! dir of the host's root would be closed to it). [`sandbox_dir`] hands
//! such a dir of ours over to those ids; one owned by anyone else is still
//! refused.
//!
//! Ancestors above the first directory a caller names (`$XDG_DATA_HOME`,
//! `$HOME`) are the user's business: missing ones are created with the
//! default mode, existing ones are left alone.

use std::fs::{DirBuilder, OpenOptions, Permissions};
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// Why a private directory or log cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum PrivateError {
    /// Another uid owns it: never used, never changed.
    #[error("{} is owned by uid {owner}, not {euid}: refusing to use it", path.display())]
    NotOurs {
        /// The path.
        path: PathBuf,
        /// Its owner.
        owner: u32,
        /// Who we are.
        euid: u32,
    },
    /// It is a symlink, or not the kind of file wanted.
    #[error("{} is not a {wanted} (a symlink or something else is in its place)", path.display())]
    WrongType {
        /// The path.
        path: PathBuf,
        /// "directory" or "regular file".
        wanted: &'static str,
    },
    /// A system call failed.
    #[error("cannot {what} {}: {error}", path.display())]
    Io {
        /// What was being done.
        what: &'static str,
        /// The path.
        path: PathBuf,
        /// What the OS said.
        error: io::Error,
    },
}

fn io_err<'a>(what: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> PrivateError + 'a {
    move |source| PrivateError::Io {
        what,
        path: path.to_owned(),
        error: source,
    }
}

/// Makes every directory from `top` down to `path` (which must be `top`
/// or beneath it) private: created 0700 when missing, tightened to 0700
/// when ours, refused otherwise. `top`'s own missing parents are created
/// with the default mode.
pub fn dirs(top: &Path, path: &Path) -> Result<(), PrivateError> {
    let rel = path
        .strip_prefix(top)
        .map_err(|_| PrivateError::WrongType {
            path: path.to_owned(),
            wanted: "directory",
        })?;
    if let Some(parent) = top.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent).map_err(io_err("create", parent))?;
    }
    let mut here = top.to_owned();
    dir(&here)?;
    for c in rel.components() {
        here.push(c);
        dir(&here)?;
    }
    Ok(())
}

static OWNER: OnceLock<(u32, u32)> = OnceLock::new();

/// Records who root inside this server's sandboxes is on the host (its
/// starter's [`boxdesk_sandbox::keeper::Starter::inside_owner`]); only the
/// first call counts.
pub fn set_sandbox_owner(owner: boxdesk_sandbox::state::Owner) {
    let _ = OWNER.set((owner.uid, owner.gid));
}

/// The host uid and gid of root inside a sandbox this server starts, as
/// [`set_sandbox_owner`] recorded it (ours until then).
pub fn sandbox_owner() -> (u32, u32) {
    *OWNER.get_or_init(|| {
        let us = boxdesk_sandbox::state::Owner::us();
        (us.uid, us.gid)
    })
}

/// Gives the directory open as `fd` (one the server just made beneath a
/// sandbox's dirs) to [`sandbox_owner`], when that is not us.
pub fn give_to_sandbox(fd: RawFd) -> io::Result<()> {
    let (uid, gid) = sandbox_owner();
    if uid == boxdesk_platform::euid() {
        return Ok(());
    }
    chown_unless_unmapped(&format!("/proc/self/fd/{fd}"), uid, gid)
}

/// chown; ids that do not exist in this user namespace (root of a user
/// namespace that maps no subordinate ids, where no sandbox could use
/// them either) leave the owner as it is.
fn chown_unless_unmapped(path: &str, uid: u32, gid: u32) -> io::Result<()> {
    match std::os::unix::fs::chown(path, Some(uid), Some(gid)) {
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => Ok(()),
        other => other,
    }
}

/// Makes exactly `path` a private directory of ours (its parent must
/// exist).
pub fn dir(path: &Path) -> Result<(), PrivateError> {
    ensure(path, false)
}

/// Makes exactly `path` a private directory of the sandbox's
/// ([`sandbox_owner`]): created 0700, one of ours handed over, one of the
/// sandbox's tightened, anyone else's refused.
pub fn sandbox_dir(path: &Path) -> Result<(), PrivateError> {
    ensure(path, true)
}

fn ensure(path: &Path, for_sandbox: bool) -> Result<(), PrivateError> {
    match DirBuilder::new().mode(0o700).create(path) {
        Err(e) if e.kind() != io::ErrorKind::AlreadyExists => {
            return Err(io_err("create", path)(e));
        }
        _ => {}
    }
    // O_PATH: a directory of ours with mode 0000 can still be opened, and
    // the descriptor pins exactly the inode that is checked and changed.
    let fd = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_PATH | libc::O_DIRECTORY | libc::O_NOFOLLOW)
        .open(path)
        .map_err(|e| match e.raw_os_error() {
            Some(libc::ELOOP | libc::ENOTDIR) => PrivateError::WrongType {
                path: path.to_owned(),
                wanted: "directory",
            },
            _ => io_err("open", path)(e),
        })?;
    let meta = fd.metadata().map_err(io_err("inspect", path))?;
    let sandbox = for_sandbox.then(sandbox_owner);
    if sandbox.is_none_or(|(uid, _)| meta.uid() != uid) {
        ours(path, &meta)?;
    }
    // An O_PATH descriptor can be neither fchmod'ed nor fchown'ed; its
    // magic link names exactly the inode just checked.
    let magic = format!("/proc/self/fd/{}", fd.as_raw_fd());
    if let Some((uid, gid)) = sandbox.filter(|&(uid, gid)| (meta.uid(), meta.gid()) != (uid, gid)) {
        chown_unless_unmapped(&magic, uid, gid).map_err(io_err("chown", path))?;
    }
    if meta.mode() & 0o7777 != 0o700 {
        std::fs::set_permissions(&magic, Permissions::from_mode(0o700))
            .map_err(io_err("chmod", path))?;
        tracing::info!(
            "tightened {} from mode {:04o} to 0700",
            path.display(),
            meta.mode() & 0o7777
        );
    }
    Ok(())
}

fn ours(path: &Path, meta: &std::fs::Metadata) -> Result<(), PrivateError> {
    let euid = boxdesk_platform::euid();
    if meta.uid() != euid {
        return Err(PrivateError::NotOurs {
            path: path.to_owned(),
            owner: meta.uid(),
            euid,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mode(p: &Path) -> u32 {
        std::fs::symlink_metadata(p).unwrap().mode() & 0o7777
    }

    #[test]
    fn missing_dirs_are_made_0700_from_top_down_and_open_ones_tightened() {
        let t = tempfile::tempdir().unwrap();
        let top = t.path().join("share/boxdesk");
        let deep = top.join("cowork/p/sessions");
        std::fs::create_dir_all(top.join("cowork")).unwrap();
        std::fs::set_permissions(top.join("cowork"), Permissions::from_mode(0o755)).unwrap();
        dirs(&top, &deep).unwrap();
        for p in [&top, &top.join("cowork"), &top.join("cowork/p"), &deep] {
            assert_eq!(mode(p), 0o700, "{}", p.display());
        }
        // The user's own dirs above `top` are not ours to judge.
        assert_ne!(mode(&t.path().join("share")), 0);
    }

    #[test]
    fn a_symlink_or_a_file_in_a_dirs_place_is_refused_and_its_target_untouched() {
        let t = tempfile::tempdir().unwrap();
        let elsewhere = t.path().join("elsewhere");
        std::fs::create_dir(&elsewhere).unwrap();
        std::fs::set_permissions(&elsewhere, Permissions::from_mode(0o755)).unwrap();
        std::os::unix::fs::symlink(&elsewhere, t.path().join("link")).unwrap();
        std::fs::write(t.path().join("file"), "").unwrap();
        for name in ["link", "file"] {
            let e = dir(&t.path().join(name)).unwrap_err();
            assert!(matches!(e, PrivateError::WrongType { .. }), "{name}: {e}");
        }
        assert_eq!(mode(&elsewhere), 0o755);
    }

    #[test]
    fn a_sandbox_dir_of_ours_is_handed_to_the_sandboxs_ids_and_anyone_elses_refused() {
        let t = tempfile::tempdir().unwrap();
        let (uid, gid) = sandbox_owner();
        let d = t.path().join("sessions");
        std::fs::create_dir(&d).unwrap();
        std::fs::set_permissions(&d, Permissions::from_mode(0o755)).unwrap();
        sandbox_dir(&d).unwrap();
        let meta = std::fs::metadata(&d).unwrap();
        assert_eq!((meta.uid(), meta.gid(), mode(&d)), (uid, gid, 0o700));
        sandbox_dir(&d).unwrap();
        if boxdesk_platform::euid() != 0 {
            return println!("skipped: the rest makes a dir another uid owns, which needs root");
        }
        // That a root-started sandbox is never root outside is its
        // starter's to hold (the namespace backend's is tested there).
        std::os::unix::fs::chown(&d, Some(65534), Some(65534)).unwrap();
        assert!(matches!(sandbox_dir(&d), Err(PrivateError::NotOurs { .. })));
    }

    #[test]
    fn a_dir_or_log_of_another_uid_is_refused_and_left_as_it_is() {
        if boxdesk_platform::euid() != 0 {
            return println!("skipped: making a file another uid owns needs root");
        }
        let t = tempfile::tempdir().unwrap();
        let (d, log) = (t.path().join("d"), t.path().join("x.log"));
        std::fs::create_dir(&d).unwrap();
        std::fs::set_permissions(&d, Permissions::from_mode(0o755)).unwrap();
        std::fs::write(&log, "").unwrap();
        for p in [&d, &log] {
            std::os::unix::fs::chown(p, Some(65534), Some(65534)).unwrap();
        }
        assert!(matches!(dir(&d), Err(PrivateError::NotOurs { .. })));
        let e = boxdesk_sandbox::log::open(&log).unwrap_err();
        assert!(e.to_string().contains("refusing"), "{e}");
        assert_eq!(mode(&d), 0o755);
    }
}
