//! Where boxdesk keeps its files: the runtime dir (control and agent
//! sockets, detached logs), the state dir (per-sandbox writable trees) and
//! the data dir (images).
//!
//! This module owns creating those directories 0700 and checking owner and
//! mode *before* anything in them is trusted. It must never follow a
//! symlink for the runtime dir, never use a directory another uid owns, and
//! never repair a bad mode silently (no chmod): a wrong mode is refused with
//! the command that fixes it.

use std::ffi::{OsStr, OsString};
use std::fs::{self, DirBuilder, Metadata};
use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};

/// Why a boxdesk directory cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum DirError {
    /// The directory's parent (`$XDG_RUNTIME_DIR`, `$TMPDIR`…) does not
    /// exist; boxdesk creates only its own directory there.
    #[error("cannot create {}: {} does not exist", path.display(), parent.display())]
    ParentMissing {
        /// The directory boxdesk wanted.
        path: PathBuf,
        /// Its missing parent.
        parent: PathBuf,
    },
    /// Creating the directory failed for another reason.
    #[error("cannot create {}", path.display())]
    Create {
        /// The directory boxdesk wanted.
        path: PathBuf,
        /// What the OS said.
        #[source]
        source: io::Error,
    },
    /// The directory exists but could not be inspected.
    #[error("cannot inspect {}", path.display())]
    Inspect {
        /// The directory.
        path: PathBuf,
        /// What the OS said.
        #[source]
        source: io::Error,
    },
    /// The path is a symlink, which could point anywhere.
    #[error("{} is a symlink; refusing to follow it (remove it and let boxdesk create a directory)", path.display())]
    Symlink {
        /// The symlink.
        path: PathBuf,
    },
    /// The path exists and is not a directory.
    #[error("{} is not a directory", path.display())]
    NotADirectory {
        /// The offending path.
        path: PathBuf,
    },
    /// Another uid owns the directory, so it could read or plant sockets.
    #[error("{} is owned by uid {owner}, not {euid}", path.display())]
    WrongOwner {
        /// The directory.
        path: PathBuf,
        /// Its owner.
        owner: u32,
        /// Our effective uid.
        euid: u32,
    },
    /// Group or others have some access to the directory.
    #[error("{} has mode {mode:04o}, expected 0700; fix it with chmod 700 {}", path.display(), path.display())]
    WrongMode {
        /// The directory.
        path: PathBuf,
        /// Its permission bits (`st_mode & 0o7777`).
        mode: u32,
    },
    /// No runtime dir can be had that only this user could have created.
    #[error("no private runtime dir: XDG_RUNTIME_DIR is unset, {run_user} is not this user's, and neither XDG_STATE_HOME nor HOME is an absolute path; set XDG_RUNTIME_DIR to a directory only you can write")]
    NoRuntimeDir {
        /// The per-user runtime dir looked for (`/run/user/<uid>`).
        run_user: PathBuf,
    },
    /// Neither the XDG variable nor `$HOME` is set to an absolute path.
    #[error("cannot locate the {what} dir: neither {var} nor HOME is an absolute path")]
    NoHome {
        /// `"state"` or `"data"`.
        what: &'static str,
        /// The XDG variable consulted first.
        var: &'static str,
    },
}

/// The environment the directory resolution reads, captured once so tests
/// can point it at temp dirs instead of the real `/run/user` or `/tmp`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirEnv {
    /// `$XDG_RUNTIME_DIR`, used only when absolute.
    pub xdg_runtime_dir: Option<OsString>,
    /// `$TMPDIR`, used only when absolute and a directory of our own that
    /// nobody else can write.
    pub tmpdir: Option<OsString>,
    /// `/run` outside tests: root's runtime dir is `<run_root>/boxdesk`, a
    /// user's systemd one `<run_root>/user/<uid>`.
    pub run_root: PathBuf,
    /// `$XDG_STATE_HOME`, used only when absolute.
    pub xdg_state_home: Option<OsString>,
    /// `$XDG_DATA_HOME`, used only when absolute.
    pub xdg_data_home: Option<OsString>,
    /// `$HOME`, used only when absolute.
    pub home: Option<OsString>,
    /// The uid that must own every directory.
    pub euid: u32,
}

impl DirEnv {
    /// The real environment of this process.
    pub fn from_process() -> Self {
        let var = |name| std::env::var_os(name);
        DirEnv {
            xdg_runtime_dir: var("XDG_RUNTIME_DIR"),
            tmpdir: var("TMPDIR"),
            run_root: PathBuf::from("/run"),
            xdg_state_home: var("XDG_STATE_HOME"),
            xdg_data_home: var("XDG_DATA_HOME"),
            home: var("HOME"),
            euid: crate::euid(),
        }
    }
}

/// The runtime dir of the real environment; see [`resolve_runtime_dir`].
pub fn runtime_dir() -> Result<PathBuf, DirError> {
    resolve_runtime_dir(&DirEnv::from_process())
}

/// Resolves, creates (0700) and checks the runtime dir.
///
/// Every candidate is a place no other user can create first, so nobody
/// can squat boxdesk's sockets (a shared `/tmp/boxdesk-<uid>` could be made
/// by anyone and would stop boxdesk for that user). In order:
///
/// 1. `$XDG_RUNTIME_DIR/boxdesk` when that variable is absolute: any
///    failed check there is an error;
/// 2. for root, `/run/boxdesk`;
/// 3. `/run/user/<uid>/boxdesk` when systemd made that dir for us (the
///    variable is lost under `su`, cron and some ssh set-ups);
/// 4. `$TMPDIR/boxdesk` when `$TMPDIR` is a directory of ours that nobody
///    else can write (a shared sticky `/tmp` is skipped);
/// 5. `<state dir>/run`, beneath the user's own home.
///
/// Parents are never created, except the state dir's in the last case.
pub fn resolve_runtime_dir(env: &DirEnv) -> Result<PathBuf, DirError> {
    if let Some(xdg) = absolute(env.xdg_runtime_dir.as_deref()) {
        let dir = xdg.join("boxdesk");
        create_private(&dir, env.euid)?;
        return Ok(dir);
    }
    if env.euid == 0 {
        let dir = env.run_root.join("boxdesk");
        create_private(&dir, env.euid)?;
        return Ok(dir);
    }
    let run_user = env.run_root.join("user").join(env.euid.to_string());
    let tmpdir = absolute(env.tmpdir.as_deref());
    for base in [Some(&run_user), tmpdir.as_ref()].into_iter().flatten() {
        if ours_alone(base, env.euid) {
            let dir = base.join("boxdesk");
            create_private(&dir, env.euid)?;
            return Ok(dir);
        }
    }
    let state = resolve_state_dir(env).map_err(|_| DirError::NoRuntimeDir {
        run_user: run_user.clone(),
    })?;
    ensure_private_dir(&state)?;
    let dir = state.join("run");
    create_private(&dir, env.euid)?;
    Ok(dir)
}

/// A directory (not a link) owned by `euid` that nobody else can write, so
/// nobody else can have made anything in it.
fn ours_alone(dir: &Path, euid: u32) -> bool {
    fs::symlink_metadata(dir).is_ok_and(|m| m.is_dir() && m.uid() == euid && m.mode() & 0o022 == 0)
}

/// `${XDG_STATE_HOME:-$HOME/.local/state}/boxdesk` of the real environment.
/// Not created; see [`ensure_private_dir`].
pub fn state_dir() -> Result<PathBuf, DirError> {
    resolve_state_dir(&DirEnv::from_process())
}

/// `${XDG_DATA_HOME:-$HOME/.local/share}/boxdesk` of the real environment.
/// Not created; see [`ensure_private_dir`].
pub fn data_dir() -> Result<PathBuf, DirError> {
    resolve_data_dir(&DirEnv::from_process())
}

/// [`state_dir`] for a given environment.
pub fn resolve_state_dir(env: &DirEnv) -> Result<PathBuf, DirError> {
    xdg_dir(env, env.xdg_state_home.as_deref(), ".local/state").ok_or(DirError::NoHome {
        what: "state",
        var: "XDG_STATE_HOME",
    })
}

/// [`data_dir`] for a given environment.
pub fn resolve_data_dir(env: &DirEnv) -> Result<PathBuf, DirError> {
    xdg_dir(env, env.xdg_data_home.as_deref(), ".local/share").ok_or(DirError::NoHome {
        what: "data",
        var: "XDG_DATA_HOME",
    })
}

/// Creates `path` 0700 if missing (its parents with the default mode),
/// then checks it is a directory owned by us with no group or other
/// access. A symlink to such a directory is accepted here (users move
/// `~/.local/state` around); the runtime dir is stricter.
pub fn ensure_private_dir(path: &Path) -> Result<(), DirError> {
    if let Some(parent) = path.parent() {
        fs::create_dir_all(parent).map_err(|source| DirError::Create {
            path: parent.to_owned(),
            source,
        })?;
    }
    make_dir(path)?;
    let meta = fs::metadata(path).map_err(|source| DirError::Inspect {
        path: path.to_owned(),
        source,
    })?;
    check_meta(path, &meta, crate::euid())
}

/// Checks, without following a symlink, that `path` is a directory owned by
/// `euid` with `mode & 0o077 == 0`.
pub fn check_private_dir(path: &Path, euid: u32) -> Result<(), DirError> {
    let meta = fs::symlink_metadata(path).map_err(|source| DirError::Inspect {
        path: path.to_owned(),
        source,
    })?;
    check_meta(path, &meta, euid)
}

fn create_private(path: &Path, euid: u32) -> Result<(), DirError> {
    make_dir(path)?;
    check_private_dir(path, euid)
}

/// Creates exactly `path` (not its parents) with mode 0700; an existing
/// entry is left for the checks to judge.
fn make_dir(path: &Path) -> Result<(), DirError> {
    match DirBuilder::new().mode(0o700).create(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Err(DirError::ParentMissing {
            path: path.to_owned(),
            parent: path.parent().unwrap_or(Path::new("/")).to_owned(),
        }),
        Err(source) => Err(DirError::Create {
            path: path.to_owned(),
            source,
        }),
    }
}

/// Owner first: "someone else's" says the most about a planted path.
fn check_meta(path: &Path, meta: &Metadata, euid: u32) -> Result<(), DirError> {
    let path = path.to_owned();
    if meta.uid() != euid {
        return Err(DirError::WrongOwner {
            path,
            owner: meta.uid(),
            euid,
        });
    }
    if meta.file_type().is_symlink() {
        return Err(DirError::Symlink { path });
    }
    if !meta.is_dir() {
        return Err(DirError::NotADirectory { path });
    }
    let mode = meta.mode() & 0o7777;
    if mode & 0o077 != 0 {
        return Err(DirError::WrongMode { path, mode });
    }
    Ok(())
}

fn xdg_dir(env: &DirEnv, xdg: Option<&OsStr>, fallback: &str) -> Option<PathBuf> {
    let base = absolute(xdg).or_else(|| absolute(env.home.as_deref()).map(|h| h.join(fallback)))?;
    Some(base.join("boxdesk"))
}

/// Unset, empty and relative values are ignored, as the XDG spec says.
fn absolute(value: Option<&OsStr>) -> Option<PathBuf> {
    value.map(PathBuf::from).filter(|p| p.is_absolute())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env() -> DirEnv {
        DirEnv {
            xdg_runtime_dir: None,
            tmpdir: None,
            run_root: PathBuf::from("/nonexistent-run"),
            xdg_state_home: None,
            xdg_data_home: None,
            home: Some("/home/u".into()),
            euid: 1000,
        }
    }

    #[test]
    fn the_state_dir_defaults_under_home_and_honours_an_absolute_xdg_state_home() {
        assert_eq!(
            resolve_state_dir(&env()).unwrap(),
            Path::new("/home/u/.local/state/boxdesk")
        );
        let e = DirEnv {
            xdg_state_home: Some("/s".into()),
            ..env()
        };
        assert_eq!(resolve_state_dir(&e).unwrap(), Path::new("/s/boxdesk"));
    }

    #[test]
    fn the_data_dir_ignores_a_relative_xdg_data_home() {
        let e = DirEnv {
            xdg_data_home: Some("rel/data".into()),
            ..env()
        };
        assert_eq!(
            resolve_data_dir(&e).unwrap(),
            Path::new("/home/u/.local/share/boxdesk")
        );
    }

    #[test]
    fn without_home_or_xdg_the_state_dir_is_an_error_naming_both() {
        let e = DirEnv {
            home: None,
            ..env()
        };
        let msg = resolve_state_dir(&e).unwrap_err().to_string();
        assert!(
            msg.contains("XDG_STATE_HOME") && msg.contains("HOME"),
            "{msg}"
        );
    }
}
