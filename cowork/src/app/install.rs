//! Putting boxdesk in the place of the app's helper, and back.
//!
//! `install` keeps the app's helper beside it as
//! `cowork-linux-helper`[`ORIGINAL_SUFFIX`], its sha256 and size recorded in
//! `cowork-linux-helper`[`MANIFEST_SUFFIX`], and puts a symlink to boxdesk
//! at `cowork-linux-helper`: the original is hard-linked aside first and the
//! symlink renamed over the helper, so the app never finds the path empty
//! (where hard links cannot be made, two renames, a moment apart). Then it
//! starts the helper as the app would ([`super::check`]) and puts the
//! original back if that fails. An app update that replaced the symlink
//! brings a new helper: installing again keeps that one, never the stale
//! copy. `uninstall` restores the kept helper only when its checksum still
//! matches, by a rename over the symlink (the same inode: byte for byte,
//! mode and owner). [`status`] only reads.
//!
//! Nothing outside the resources directory is touched; a directory that
//! nobody (or only root) may write is refused before anything changes, and
//! so is, as root, one that another user can change (root would start
//! whatever that user swapped in). Files are never written through a
//! symlink, and the kept helper is never removed unless the app's own
//! helper is back in its place.

use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::check::{self, CheckError};
use super::layout::{self, Access, AppDir, ReadOnly};
use super::HELPER;

/// The kept original's name: `cowork-linux-helper.boxdesk-orig`.
pub const ORIGINAL_SUFFIX: &str = ".boxdesk-orig";
/// The manifest's name: `cowork-linux-helper.boxdesk.json`.
pub const MANIFEST_SUFFIX: &str = ".boxdesk.json";
/// A temporary name while placing the symlink or the kept original.
const TEMP_SUFFIX: &str = ".boxdesk-tmp";
/// How long the check waits for the installed helper.
pub const CHECK_TIMEOUT: Duration = Duration::from_secs(20);

/// What `install` records beside the kept helper.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    /// The manifest's format (1).
    pub format: u32,
    /// The kept helper's file name, beside the manifest.
    pub original: String,
    /// Its sha256, hex.
    pub sha256: String,
    /// Its size in bytes.
    pub bytes: u64,
    /// What the symlink at the helper's path points to.
    pub link: PathBuf,
    /// When it was installed, seconds since the epoch.
    pub installed_unix: u64,
}

/// Why boxdesk could not be installed or uninstalled. Nothing was changed
/// unless the variant says otherwise.
#[derive(Debug, thiserror::Error)]
pub enum InstallError {
    /// Nobody may write the directory; `alternative` says what to do.
    #[error("{} is read-only ({why}): boxdesk cannot replace the app's helper there; {alternative}", dir.display())]
    ReadOnly {
        /// The resources directory.
        dir: PathBuf,
        /// Why: the Nix store, an AppImage, a read-only mount.
        why: String,
        /// The exact way to make the app run boxdesk instead.
        alternative: String,
    },
    /// Only another user may write the directory (or its owner, this
    /// user, after a chmod).
    #[error("{} is {}", dir.display(), match *owner {
        0 => format!("writable only by root: run `sudo boxdesk cowork {command}`"),
        o if o == boxdesk_platform::euid() => format!("not writable (its mode forbids it): run `sudo boxdesk cowork {command}`"),
        o => format!("writable only by uid {o}: run `boxdesk cowork {command}` as that user (`sudo -u '#{o}' boxdesk cowork {command}`)"),
    })]
    NeedsRoot {
        /// The resources directory.
        dir: PathBuf,
        /// Its owner.
        owner: u32,
        /// The command to repeat under sudo, arguments included.
        command: String,
    },
    /// Run as root on a directory another user can change (it, or one
    /// above it): root would start what that user can swap in.
    #[error("{} is {why}: as root, boxdesk will not replace and start a helper where another user can swap it; run `boxdesk cowork {command}` as the app directory's owner, without sudo", path.display())]
    ChangeableByOthers {
        /// The directory another user can change.
        path: PathBuf,
        /// How.
        why: String,
        /// The command to repeat without sudo, arguments included.
        command: String,
    },
    /// There is no helper to replace.
    #[error("{} does not exist: this build of the app ships no Cowork helper", .0.display())]
    NoHelper(PathBuf),
    /// The helper's path already runs this boxdesk, by a link made by
    /// hand: the app's own helper is gone and cannot be kept.
    #[error("{} already runs boxdesk (a link made without `boxdesk cowork install`), so the app's own helper is not there to keep; reinstall the app to get it back, then run install again", .0.display())]
    HandMade(PathBuf),
    /// The helper is not a regular file (or a link to one).
    #[error("{} is not a regular file", .0.display())]
    NotAFile(PathBuf),
    /// boxdesk was never installed here.
    #[error("boxdesk is not installed in {} (no {HELPER}{MANIFEST_SUFFIX})", .0.display())]
    NotInstalled(PathBuf),
    /// The kept helper is not what was kept.
    #[error("{} does not match its recorded sha256 ({expected}, now {found}): left as it is", path.display())]
    Checksum {
        /// The kept helper.
        path: PathBuf,
        /// The recorded sha256.
        expected: String,
        /// What it hashes to now (or why it cannot be read).
        found: String,
    },
    /// The manifest cannot be read.
    #[error("cannot read {}: {why}", path.display())]
    Manifest {
        /// The manifest.
        path: PathBuf,
        /// Why.
        why: String,
    },
    /// The installed helper did not answer as the app needs; the app's
    /// own helper was put back when `restored`.
    #[error("the installed helper failed its check ({why}); {}", if *restored { "the app's own helper was put back" } else { "left as it is" })]
    CheckFailed {
        /// What went wrong.
        why: CheckError,
        /// Whether the original was restored.
        restored: bool,
    },
    /// A file operation failed.
    #[error("cannot {op} {}: {reason}", path.display())]
    Io {
        /// What was being done.
        op: &'static str,
        /// On what.
        path: PathBuf,
        /// What the OS said.
        reason: io::Error,
    },
}

fn io_err(op: &'static str, path: &Path) -> impl FnOnce(io::Error) -> InstallError {
    let path = path.to_owned();
    move |reason| InstallError::Io { op, path, reason }
}

/// The helper's path, the kept original's, the manifest's, in `dir`.
fn paths(dir: &Path) -> (PathBuf, PathBuf, PathBuf) {
    (
        dir.join(HELPER),
        dir.join(format!("{HELPER}{ORIGINAL_SUFFIX}")),
        dir.join(format!("{HELPER}{MANIFEST_SUFFIX}")),
    )
}

/// sha256 (hex) and size of the file at `path`, following a symlink.
pub fn digest(path: &Path) -> io::Result<(String, u64)> {
    // Non-blocking: a FIFO in the helper's place is refused below, not
    // waited on (a regular file reads the same either way).
    let mut f = File::options()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)?;
    if !f.metadata()?.is_file() {
        return Err(io::Error::other("not a regular file"));
    }
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 16];
    let mut bytes = 0u64;
    loop {
        let n = match f.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        h.update(&buf[..n]);
        bytes += n as u64;
    }
    let hex = h.finalize().iter().map(|b| format!("{b:02x}")).collect();
    Ok((hex, bytes))
}

fn read_manifest(path: &Path) -> Result<Option<Manifest>, InstallError> {
    let text = match fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io_err("read", path)(e)),
    };
    serde_json::from_str(&text)
        .map(Some)
        .map_err(|e| InstallError::Manifest {
            path: path.to_owned(),
            why: e.to_string(),
        })
}

fn write_manifest(path: &Path, m: &Manifest) -> Result<(), InstallError> {
    let tmp = temp(path);
    let _ = fs::remove_file(&tmp);
    let text = serde_json::to_string_pretty(m).unwrap_or_default() + "\n";
    // A new file, never through a link someone put at the temporary name
    // after the removal above (root may be writing).
    let mut f = File::options()
        .write(true)
        .create_new(true)
        .mode(0o644)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(&tmp)
        .map_err(io_err("create", &tmp))?;
    f.write_all(text.as_bytes())
        .map_err(io_err("write", &tmp))?;
    drop(f);
    fs::rename(&tmp, path).map_err(io_err("rename", &tmp))
}

fn temp(path: &Path) -> PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push(TEMP_SUFFIX);
    PathBuf::from(s)
}

/// Whether the file at `path` (followed) is the file at `boxdesk`.
fn same_file(path: &Path, boxdesk: &Path) -> bool {
    match (fs::metadata(path), fs::metadata(boxdesk)) {
        (Ok(a), Ok(b)) => (a.dev(), a.ino()) == (b.dev(), b.ino()),
        _ => false,
    }
}

/// What is at the helper's path.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "is", rename_all = "kebab-case")]
pub enum HelperFile {
    /// Nothing.
    Missing,
    /// A link to boxdesk.
    Boxdesk {
        /// Where it points.
        link: PathBuf,
    },
    /// The app's own helper (a file, or a link to one).
    App {
        /// Its sha256.
        sha256: String,
        /// Its size.
        bytes: u64,
    },
    /// Something that cannot be read as a file.
    Unreadable {
        /// Why.
        why: String,
    },
}

fn helper_file(helper: &Path, boxdesk: &Path, manifest: Option<&Manifest>) -> HelperFile {
    let Ok(meta) = fs::symlink_metadata(helper) else {
        return HelperFile::Missing;
    };
    if meta.file_type().is_symlink() {
        let link = fs::read_link(helper).unwrap_or_default();
        if manifest.is_some_and(|m| m.link == link) || same_file(helper, boxdesk) {
            return HelperFile::Boxdesk { link };
        }
    }
    match digest(helper) {
        Ok((sha256, bytes)) => HelperFile::App { sha256, bytes },
        Err(e) => HelperFile::Unreadable { why: e.to_string() },
    }
}

/// Where boxdesk stands in one resources directory.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum State {
    /// boxdesk is in place and the kept helper matches its checksum.
    Installed,
    /// boxdesk is in place but the kept helper is missing or changed.
    Damaged,
    /// boxdesk was installed, and an app update put its own helper back.
    ReplacedByUpdate,
    /// The app's own helper is in place; boxdesk was never installed.
    NotInstalled,
}

/// What [`status`] reports.
#[derive(Debug, Clone, Serialize)]
pub struct Status {
    /// The resources directory.
    pub resources: PathBuf,
    /// Its packaging.
    pub kind: layout::Kind,
    /// Where boxdesk stands.
    pub state: State,
    /// What is at the helper's path.
    pub helper: HelperFile,
    /// The manifest, when boxdesk was installed.
    pub manifest: Option<Manifest>,
    /// Whether the kept helper still matches the manifest.
    pub original_ok: Option<bool>,
    /// Whether this process may change the directory.
    pub writable: bool,
}

/// Where boxdesk stands in `app` (`boxdesk`: this boxdesk's path).
pub fn status(app: &AppDir, boxdesk: &Path) -> Result<Status, InstallError> {
    let (helper, original, manifest_path) = paths(&app.resources);
    let manifest = read_manifest(&manifest_path)?;
    let file = helper_file(&helper, boxdesk, manifest.as_ref());
    let original_ok = manifest
        .as_ref()
        .map(|m| digest(&original).is_ok_and(|(sha, _)| sha == m.sha256));
    let state = match (&file, &manifest, original_ok) {
        (HelperFile::Boxdesk { .. }, Some(_), Some(true)) => State::Installed,
        (HelperFile::Boxdesk { .. }, _, _) => State::Damaged,
        (_, Some(_), _) => State::ReplacedByUpdate,
        (_, None, _) => State::NotInstalled,
    };
    Ok(Status {
        resources: app.resources.clone(),
        kind: app.kind,
        state,
        helper: file,
        manifest,
        original_ok,
        writable: matches!(layout::access(&app.resources), Ok(Access::Writable)),
    })
}

/// Refuses a directory this process may not change, saying what to do
/// instead; `command` is the subcommand with its arguments.
pub fn check_writable(app: &AppDir, command: &str, boxdesk: &Path) -> Result<(), InstallError> {
    let dir = &app.resources;
    let access = layout::access(dir).map_err(io_err("inspect", dir))?;
    let (why, alternative) = match access {
        Access::Writable if boxdesk_platform::euid() != 0 => return Ok(()),
        Access::Writable => {
            // Root, and the user who ran sudo (who could do as much
            // anyway), may own the path; nobody else may change it.
            let mut trusted = vec![0];
            trusted.extend(
                std::env::var("SUDO_UID")
                    .ok()
                    .and_then(|u| u.parse::<u32>().ok()),
            );
            return match layout::changeable_by_others(dir, &trusted)
                .map_err(io_err("inspect", dir))?
            {
                None => Ok(()),
                Some((path, why)) => Err(InstallError::ChangeableByOthers {
                    path,
                    why,
                    command: command.to_owned(),
                }),
            };
        }
        Access::OtherUser(owner) => {
            return Err(InstallError::NeedsRoot {
                dir: dir.clone(),
                owner,
                command: command.to_owned(),
            })
        }
        Access::ReadOnly(ReadOnly::Nix { item, rel }) => (
            format!("it is in the Nix store, {}", item.display()),
            format!(
                "override the package instead so its build links the helper to boxdesk, e.g. \
                 `claude-desktop.overrideAttrs (old: {{ postFixup = (old.postFixup or \"\") + \
                 \"ln -sf {} $out/{}/{HELPER}\"; }})`",
                boxdesk.display(),
                rel.display()
            ),
        ),
        Access::ReadOnly(ReadOnly::AppImage { mount }) => (
            format!(
                "it is inside a running AppImage, mounted at {}",
                mount.display()
            ),
            appimage_alternative(boxdesk),
        ),
        Access::ReadOnly(ReadOnly::Mount) => (
            "its file system is mounted read-only".to_owned(),
            format!(
                "bind boxdesk over the helper until the next boot instead: \
                 `sudo mount --bind {} {}`",
                boxdesk.display(),
                dir.join(HELPER).display()
            ),
        ),
    };
    Err(InstallError::ReadOnly {
        dir: dir.clone(),
        why,
        alternative,
    })
}

/// What to do with an AppImage: extract it and install into the copy, or
/// the claude-desktop-debian launcher's override.
pub fn appimage_alternative(boxdesk: &Path) -> String {
    format!(
        "either extract it (`./Claude*.AppImage --appimage-extract`), run the extracted \
         app, and `boxdesk cowork install --app squashfs-root`; or, with \
         claude-desktop-debian's AppImage, let its launcher start boxdesk: \
         `ln -s {} ~/.local/bin/{HELPER}` and put `COWORK_VM_BACKEND=bwrap` and \
         `COWORK_NODE_PATH=$HOME/.local/bin/{HELPER}` (the full path) in \
         ~/.config/claude-desktop-debian/environment",
        boxdesk.display()
    )
}

/// What [`install`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Installed {
    /// The helper's path, now a link to boxdesk.
    pub helper: PathBuf,
    /// The manifest as written.
    pub manifest: Manifest,
    /// The kept helper's path.
    pub original: PathBuf,
    /// Whether boxdesk was already in place (only the link refreshed).
    pub already: bool,
    /// Whether a kept helper from an earlier install was replaced by the
    /// app's newer one (an app update came in between).
    pub kept_newer: bool,
    /// The installed helper's answer to the check's `isRunning`.
    pub answer: serde_json::Value,
}

/// Puts a link to `boxdesk` at the helper's path of `app`, keeping the
/// app's helper, then checks it as the app would start it; `command` is
/// what to repeat under sudo if the directory needs root.
pub fn install(app: &AppDir, boxdesk: &Path, command: &str) -> Result<Installed, InstallError> {
    check_writable(app, command, boxdesk)?;
    let (helper, original, manifest_path) = paths(&app.resources);
    let manifest = read_manifest(&manifest_path)?;
    let (manifest, already, kept_newer) = match helper_file(&helper, boxdesk, manifest.as_ref()) {
        HelperFile::Missing => return Err(InstallError::NoHelper(helper)),
        HelperFile::Unreadable { .. } => return Err(InstallError::NotAFile(helper)),
        HelperFile::Boxdesk { link } => {
            let Some(m) = manifest else {
                return Err(InstallError::HandMade(helper));
            };
            verify(&original, &m)?;
            if link != boxdesk {
                place_link(&helper, boxdesk)?;
            }
            let m = Manifest {
                link: boxdesk.to_owned(),
                ..m
            };
            write_manifest(&manifest_path, &m)?;
            (m, true, false)
        }
        HelperFile::App { sha256, bytes } => {
            let m = Manifest {
                format: 1,
                original: format!("{HELPER}{ORIGINAL_SUFFIX}"),
                sha256,
                bytes,
                link: boxdesk.to_owned(),
                installed_unix: SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .map_or(0, |d| d.as_secs()),
            };
            write_manifest(&manifest_path, &m)?;
            if let Err(e) = keep_and_replace(&helper, &original, boxdesk) {
                // Back to how it was: the earlier manifest, or none.
                let _ = match &manifest {
                    Some(old) => write_manifest(&manifest_path, old),
                    None => {
                        fs::remove_file(&manifest_path).map_err(io_err("remove", &manifest_path))
                    }
                };
                return Err(e);
            }
            (m, false, manifest.is_some())
        }
    };
    match check::one_shot_is_running(&helper, CHECK_TIMEOUT) {
        Ok(answer) => Ok(Installed {
            helper,
            manifest,
            original,
            already,
            kept_newer,
            answer,
        }),
        Err(why) if !already => {
            let restored = restore(&helper, &original, &manifest_path).is_ok();
            Err(InstallError::CheckFailed { why, restored })
        }
        Err(why) => Err(InstallError::CheckFailed {
            why,
            restored: false,
        }),
    }
}

/// Errors unless the kept helper at `original` matches `m`.
fn verify(original: &Path, m: &Manifest) -> Result<(), InstallError> {
    match digest(original) {
        Ok((sha, _)) if sha == m.sha256 => Ok(()),
        Ok((sha, _)) => Err(InstallError::Checksum {
            path: original.to_owned(),
            expected: m.sha256.clone(),
            found: sha,
        }),
        Err(e) => Err(InstallError::Checksum {
            path: original.to_owned(),
            expected: m.sha256.clone(),
            found: e.to_string(),
        }),
    }
}

/// A symlink to `boxdesk` renamed over `helper` (atomic).
fn place_link(helper: &Path, boxdesk: &Path) -> Result<(), InstallError> {
    let tmp = temp(helper);
    let _ = fs::remove_file(&tmp);
    std::os::unix::fs::symlink(boxdesk, &tmp).map_err(io_err("create the link", &tmp))?;
    fs::rename(&tmp, helper).map_err(|e| {
        let _ = fs::remove_file(&tmp);
        io_err("replace", helper)(e)
    })
}

/// Keeps the helper as `original` (replacing a stale kept one) and puts
/// the link in its place.
fn keep_and_replace(helper: &Path, original: &Path, boxdesk: &Path) -> Result<(), InstallError> {
    let tmp = temp(original);
    let _ = fs::remove_file(&tmp);
    if fs::hard_link(helper, &tmp).is_ok() {
        fs::rename(&tmp, original).map_err(io_err("keep the app's helper as", original))?;
        return place_link(helper, boxdesk);
    }
    // No hard links here: two renames, with the helper's path empty
    // between them.
    fs::rename(helper, original).map_err(io_err("keep the app's helper as", original))?;
    place_link(helper, boxdesk).inspect_err(|_| {
        let _ = fs::rename(original, helper);
    })
}

/// Renames the kept helper back over the link and drops the manifest.
fn restore(helper: &Path, original: &Path, manifest: &Path) -> Result<(), InstallError> {
    fs::rename(original, helper).map_err(io_err("restore", helper))?;
    fs::remove_file(manifest).map_err(io_err("remove", manifest))
}

/// What [`uninstall`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Uninstalled {
    /// The app's helper is back, byte for byte.
    Restored {
        /// The helper's path.
        helper: PathBuf,
        /// Its sha256.
        sha256: String,
    },
    /// An app update had already put its own helper back; the stale kept
    /// copy and the manifest were removed.
    AlreadyReplaced {
        /// The helper's path.
        helper: PathBuf,
    },
}

/// Puts the app's kept helper back in `app`, when its checksum matches.
pub fn uninstall(app: &AppDir, boxdesk: &Path, command: &str) -> Result<Uninstalled, InstallError> {
    let (helper, original, manifest_path) = paths(&app.resources);
    let manifest = read_manifest(&manifest_path)?
        .ok_or_else(|| InstallError::NotInstalled(app.resources.clone()))?;
    check_writable(app, command, boxdesk)?;
    match helper_file(&helper, boxdesk, Some(&manifest)) {
        HelperFile::Boxdesk { .. } | HelperFile::Missing => {
            verify(&original, &manifest)?;
            restore(&helper, &original, &manifest_path)?;
            Ok(Uninstalled::Restored {
                helper,
                sha256: manifest.sha256,
            })
        }
        // Something that is neither boxdesk nor a helper that runs (a
        // dangling link, a directory): the kept helper may be the only
        // one left, so it stays.
        HelperFile::Unreadable { .. } => Err(InstallError::NotAFile(helper)),
        HelperFile::App { .. } => {
            let _ = fs::remove_file(&original);
            fs::remove_file(&manifest_path).map_err(io_err("remove", &manifest_path))?;
            Ok(Uninstalled::AlreadyReplaced { helper })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_digest_is_the_sha256_of_the_bytes() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("f");
        fs::write(&p, b"abc").unwrap();
        let (sha, n) = digest(&p).unwrap();
        assert_eq!(
            sha,
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert_eq!(n, 3);
        assert!(digest(d.path()).is_err(), "a directory has no digest");
    }

    #[test]
    fn the_state_follows_what_is_at_the_helpers_path() {
        let d = tempfile::tempdir().unwrap();
        let boxdesk = d.path().join("boxdesk");
        fs::write(&boxdesk, b"boxdesk").unwrap();
        let app = AppDir {
            resources: d.path().to_owned(),
            kind: layout::Kind::Given,
        };
        let (helper, original, manifest) = paths(d.path());
        fs::write(&helper, b"the app's helper").unwrap();
        assert_eq!(status(&app, &boxdesk).unwrap().state, State::NotInstalled);
        let (sha, bytes) = digest(&helper).unwrap();
        let m = Manifest {
            format: 1,
            original: format!("{HELPER}{ORIGINAL_SUFFIX}"),
            sha256: sha,
            bytes,
            link: boxdesk.clone(),
            installed_unix: 0,
        };
        write_manifest(&manifest, &m).unwrap();
        keep_and_replace(&helper, &original, &boxdesk).unwrap();
        assert_eq!(fs::read_link(&helper).unwrap(), boxdesk);
        assert_eq!(fs::read(&original).unwrap(), b"the app's helper");
        assert_eq!(status(&app, &boxdesk).unwrap().state, State::Installed);
        fs::write(&original, b"changed").unwrap();
        assert_eq!(status(&app, &boxdesk).unwrap().state, State::Damaged);
        fs::remove_file(&helper).unwrap();
        fs::write(&helper, b"an update").unwrap();
        assert_eq!(
            status(&app, &boxdesk).unwrap().state,
            State::ReplacedByUpdate
        );
    }

    #[test]
    fn the_read_only_alternatives_name_the_exact_way_round() {
        let a = appimage_alternative(Path::new("/usr/local/bin/boxdesk"));
        assert!(a.contains("--appimage-extract"), "{a}");
        assert!(a.contains("COWORK_NODE_PATH="), "{a}");
        assert!(a.contains("ln -s /usr/local/bin/boxdesk"), "{a}");
    }
}
