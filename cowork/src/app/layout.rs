//! Where the app is installed, and whether its resources directory (the
//! one holding [`super::HELPER`]) can be written by this process.
//!
//! The places looked at, in order, are the layouts the app is shipped in:
//! Anthropic's own package (`/usr/lib/claude-desktop/resources`), the
//! claude-desktop-debian repack of it (`/usr/lib/claude-desktop-unofficial/
//! resources`), the AUR's claude-desktop-bin (`/usr/lib/claude-desktop-bin/
//! resources`), a Nix profile's `lib/claude-desktop/resources` (links into
//! the read-only store), and a running AppImage's mount under
//! `/tmp/.mount_*`. Anything else is named with `--app`.
//!
//! This module only reads. It never decides what to do about a directory
//! it cannot write; [`super::install`] says that.

use std::ffi::CString;
use std::fmt;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Component, Path, PathBuf};

use super::HELPER;

/// Which packaging of the app a resources directory belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Kind {
    /// Anthropic's package (`claude-desktop` from its apt repository).
    Official,
    /// claude-desktop-debian's repack (`claude-desktop-unofficial`).
    Unofficial,
    /// The AUR's `claude-desktop-bin`.
    AurBin,
    /// A Nix package (the store is read-only).
    Nix,
    /// A running AppImage (its image is mounted read-only).
    AppImage,
    /// A directory given with `--app` that matches none of the above.
    Given,
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Kind::Official => "the official package",
            Kind::Unofficial => "claude-desktop-debian's package",
            Kind::AurBin => "the AUR package claude-desktop-bin",
            Kind::Nix => "a Nix package",
            Kind::AppImage => "an AppImage",
            Kind::Given => "the directory given",
        })
    }
}

/// Path suffixes of the packages' resources directories, and their kind.
const LAYOUTS: [(&str, Kind); 4] = [
    ("usr/lib/claude-desktop/resources", Kind::Official),
    (
        "usr/lib/claude-desktop-unofficial/resources",
        Kind::Unofficial,
    ),
    ("usr/lib/claude-desktop-bin/resources", Kind::AurBin),
    ("lib/claude-desktop/resources", Kind::Nix),
];

/// Inside an AppImage's mount, where its resources directory may be.
const IN_APPIMAGE: [&str; 3] = [
    "resources",
    "usr/lib/claude-desktop/resources",
    "usr/lib/claude-desktop-unofficial/resources",
];

/// The app's resources directory, found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AppDir {
    /// The directory holding the helper, resolved (no symlink in it: what
    /// was checked is what is changed, even if a link on the way to it is
    /// re-pointed in between).
    pub resources: PathBuf,
    /// Whose layout it is.
    pub kind: Kind,
}

impl AppDir {
    /// The helper's path in it.
    pub fn helper(&self) -> PathBuf {
        self.resources.join(HELPER)
    }
}

/// Why no app could be found.
#[derive(Debug, thiserror::Error)]
pub enum LayoutError {
    /// None of the known places holds the app.
    #[error("no Claude Desktop install found (looked in {}); name it with --app DIR", shown(.0))]
    NotFound(Vec<PathBuf>),
    /// `--app` names a directory that holds no helper or `app.asar`, nor
    /// a `resources/` that does.
    #[error("{} is not the app's directory: neither it nor its resources/ holds {HELPER} or app.asar", .0.display())]
    NotTheApp(PathBuf),
    /// `--app` names an AppImage file.
    #[error("{} is an AppImage", .0.display())]
    AppImageFile(PathBuf),
}

fn shown(paths: &[PathBuf]) -> String {
    paths
        .iter()
        .map(|p| p.display().to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// Whether `dir` is a resources directory of the app: it holds the
/// helper (or what boxdesk left in its place) or `app.asar`.
fn holds_app(dir: &Path) -> bool {
    [
        HELPER.to_owned(),
        format!("{HELPER}{}", super::install::MANIFEST_SUFFIX),
        "app.asar".to_owned(),
    ]
    .iter()
    .any(|f| dir.join(f).symlink_metadata().is_ok())
}

/// The kind of the resources directory at `dir` (canonical where it can
/// be resolved): by where it lies, else by its path's ending.
pub fn kind_of(dir: &Path) -> Kind {
    let real = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_owned());
    if real.starts_with("/nix/store") {
        return Kind::Nix;
    }
    if appimage_mount(&real).is_some() {
        return Kind::AppImage;
    }
    LAYOUTS
        .iter()
        .find(|(suffix, _)| dir.ends_with(suffix) || real.ends_with(suffix))
        .map_or(Kind::Given, |(_, k)| *k)
}

/// The `/tmp/.mount_*` directory an AppImage's image is mounted on, when
/// `path` lies under one.
pub fn appimage_mount(path: &Path) -> Option<PathBuf> {
    let mut parts = path.components();
    let (Some(Component::RootDir), Some(Component::Normal(tmp)), Some(Component::Normal(m))) =
        (parts.next(), parts.next(), parts.next())
    else {
        return None;
    };
    (tmp == "tmp" && m.as_bytes().starts_with(b".mount_")).then(|| Path::new("/tmp").join(m))
}

/// The places looked at without `--app`, in order: the packages' paths,
/// then the Nix profiles of `home` and `user`.
pub fn candidates(home: Option<&Path>, user: Option<&str>) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = LAYOUTS[..3]
        .iter()
        .map(|(suffix, _)| Path::new("/").join(suffix))
        .collect();
    let nix = LAYOUTS[3].0;
    if let Some(user) = user.filter(|u| !u.is_empty() && !u.contains('/')) {
        v.push(Path::new("/etc/profiles/per-user").join(user).join(nix));
    }
    if let Some(home) = home.filter(|h| h.is_absolute()) {
        v.push(home.join(".nix-profile").join(nix));
    }
    v.push(Path::new("/run/current-system/sw").join(nix));
    v
}

/// Running AppImages' resources directories under `/tmp/.mount_*`.
fn appimages() -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir("/tmp") else {
        return Vec::new();
    };
    let mut found = Vec::new();
    for e in entries.flatten() {
        if !e.file_name().as_bytes().starts_with(b".mount_") {
            continue;
        }
        for inside in IN_APPIMAGE {
            let dir = e.path().join(inside);
            if dir.join(HELPER).symlink_metadata().is_ok() {
                found.push(dir);
            }
        }
    }
    found.sort();
    found
}

/// The app's resources directory: the one `app` names (the directory
/// itself or the app's directory above `resources/`), else the first
/// known place that holds it.
pub fn find(app: Option<&Path>) -> Result<AppDir, LayoutError> {
    if let Some(app) = app {
        return given(app);
    }
    let home = std::env::var_os("HOME").map(PathBuf::from);
    let user = std::env::var("SUDO_USER")
        .or_else(|_| std::env::var("USER"))
        .ok();
    let looked = candidates(home.as_deref(), user.as_deref());
    if let Some(dir) = looked.iter().find(|d| holds_app(d)) {
        return Ok(AppDir {
            kind: kind_of(dir),
            resources: resolved(dir),
        });
    }
    if let Some(dir) = appimages().into_iter().next() {
        return Ok(AppDir {
            resources: resolved(&dir),
            kind: Kind::AppImage,
        });
    }
    let mut looked = looked;
    looked.push(PathBuf::from("/tmp/.mount_*"));
    Err(LayoutError::NotFound(looked))
}

/// `dir` with every symlink in it resolved (as it is, when it cannot be).
fn resolved(dir: &Path) -> PathBuf {
    std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_owned())
}

fn given(app: &Path) -> Result<AppDir, LayoutError> {
    let abs = if app.is_absolute() {
        app.to_owned()
    } else {
        std::env::current_dir()
            .map(|d| d.join(app))
            .unwrap_or_else(|_| app.to_owned())
    };
    let is_file = std::fs::metadata(&abs).is_ok_and(|m| m.is_file());
    let name = abs.file_name().map(|n| n.to_string_lossy().to_lowercase());
    if is_file && name.is_some_and(|n| n.ends_with(".appimage")) {
        return Err(LayoutError::AppImageFile(abs));
    }
    for dir in [abs.clone(), abs.join("resources")] {
        if dir.is_dir() && holds_app(&dir) {
            return Ok(AppDir {
                kind: kind_of(&dir),
                resources: resolved(&dir),
            });
        }
    }
    Err(LayoutError::NotTheApp(abs))
}

/// Why a resources directory cannot be written, whoever runs boxdesk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReadOnly {
    /// In the Nix store: `item` is the store path, `rel` the resources
    /// directory inside it.
    Nix {
        /// `/nix/store/<hash>-<name>`.
        item: PathBuf,
        /// The resources directory relative to `item`.
        rel: PathBuf,
    },
    /// Inside a running AppImage's image, mounted at `mount`.
    AppImage {
        /// `/tmp/.mount_*`.
        mount: PathBuf,
    },
    /// On a file system mounted read-only.
    Mount,
}

/// Whether this process may change a resources directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Access {
    /// It may.
    Writable,
    /// Nobody may.
    ReadOnly(ReadOnly),
    /// Only another user (root, where a package installed it) may: its
    /// owner's uid.
    OtherUser(u32),
}

/// What this process may do to `dir` (resolved first: a Nix profile's
/// link leads into the store).
pub fn access(dir: &Path) -> io::Result<Access> {
    let real = std::fs::canonicalize(dir)?;
    let mut parts = real.components();
    if real.starts_with("/nix/store") {
        let item: PathBuf = parts.by_ref().take(4).collect();
        return Ok(Access::ReadOnly(ReadOnly::Nix {
            rel: parts.as_path().to_owned(),
            item,
        }));
    }
    if let Some(mount) = appimage_mount(&real) {
        return Ok(Access::ReadOnly(ReadOnly::AppImage { mount }));
    }
    let c = CString::new(real.as_os_str().as_bytes())?;
    // SAFETY: `statvfs` is plain old data, for which all-zero bytes are a valid value.
    let mut v: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: c is a valid C string and v a writable statvfs buffer.
    if unsafe { libc::statvfs(c.as_ptr(), &mut v) } != 0 {
        return Err(io::Error::last_os_error());
    }
    if v.f_flag & libc::ST_RDONLY != 0 {
        return Ok(Access::ReadOnly(ReadOnly::Mount));
    }
    // SAFETY: c is a valid C string; faccessat only reads it.
    let r = unsafe { libc::faccessat(libc::AT_FDCWD, c.as_ptr(), libc::W_OK, libc::AT_EACCESS) };
    if r == 0 {
        return Ok(Access::Writable);
    }
    let e = io::Error::last_os_error();
    match e.raw_os_error() {
        Some(libc::EROFS) => Ok(Access::ReadOnly(ReadOnly::Mount)),
        Some(libc::EACCES | libc::EPERM) => Ok(Access::OtherUser(std::fs::metadata(&real)?.uid())),
        _ => Err(e),
    }
}

/// The first of `dir` (resolved) and the directories above it that a user
/// not in `trusted` can change — owned by another uid, or writable by its
/// group or others without the sticky bit — with why; `None` when only
/// the trusted uids can. Root must not replace and start a file there:
/// whoever can change the path can swap what root runs.
pub fn changeable_by_others(dir: &Path, trusted: &[u32]) -> io::Result<Option<(PathBuf, String)>> {
    let real = std::fs::canonicalize(dir)?;
    for d in real.ancestors() {
        let m = std::fs::symlink_metadata(d)?;
        if !trusted.contains(&m.uid()) {
            return Ok(Some((d.to_owned(), format!("owned by uid {}", m.uid()))));
        }
        if m.mode() & 0o022 != 0 && m.mode() & 0o1000 == 0 {
            return Ok(Some((
                d.to_owned(),
                "writable by its group or by others".to_owned(),
            )));
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_directory_others_may_write_is_changeable_by_others_unless_sticky() {
        use std::os::unix::fs::PermissionsExt;
        let d = tempfile::tempdir().unwrap();
        let open = d.path().join("open");
        std::fs::create_dir(&open).unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
        let (at, why) = changeable_by_others(&open, &[0]).unwrap().unwrap();
        assert_eq!(at, std::fs::canonicalize(&open).unwrap());
        assert!(
            why.contains("writable") || why.contains("owned by uid"),
            "{why}"
        );
        // Sticky, like /tmp: others may add entries but not swap ours.
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o1777)).unwrap();
        let found = changeable_by_others(&open, &[0]).unwrap();
        if boxdesk_platform::euid() == 0 {
            assert!(
                found
                    .as_ref()
                    .is_none_or(|(at, _)| at != &std::fs::canonicalize(&open).unwrap()),
                "{found:?}"
            );
        } else {
            // Ours, not root's: changeable by us.
            assert!(found.is_some());
        }
    }

    #[test]
    fn the_packages_layouts_are_told_apart_by_their_paths() {
        assert_eq!(
            kind_of(Path::new("/x/usr/lib/claude-desktop/resources")),
            Kind::Official
        );
        assert_eq!(
            kind_of(Path::new("/usr/lib/claude-desktop-unofficial/resources")),
            Kind::Unofficial
        );
        assert_eq!(
            kind_of(Path::new("/usr/lib/claude-desktop-bin/resources")),
            Kind::AurBin
        );
        assert_eq!(
            kind_of(Path::new(
                "/tmp/.mount_Claude1/usr/lib/claude-desktop/resources"
            )),
            Kind::AppImage
        );
        assert_eq!(kind_of(Path::new("/opt/elsewhere")), Kind::Given);
    }

    #[test]
    fn an_appimage_mount_is_only_a_direct_child_of_tmp() {
        assert_eq!(
            appimage_mount(Path::new("/tmp/.mount_abc/resources")),
            Some(PathBuf::from("/tmp/.mount_abc"))
        );
        assert_eq!(appimage_mount(Path::new("/tmp/x/.mount_abc")), None);
        assert_eq!(appimage_mount(Path::new("/var/tmp/.mount_abc")), None);
    }

    #[test]
    fn the_candidates_cover_every_package_and_the_nix_profiles() {
        let c = candidates(Some(Path::new("/home/u")), Some("u"));
        assert_eq!(c[0], Path::new("/usr/lib/claude-desktop/resources"));
        assert!(c.contains(&PathBuf::from(
            "/home/u/.nix-profile/lib/claude-desktop/resources"
        )));
        assert!(c.contains(&PathBuf::from(
            "/etc/profiles/per-user/u/lib/claude-desktop/resources"
        )));
        assert_eq!(candidates(None, Some("../x")).len(), 4);
    }

    #[test]
    fn app_given_as_its_own_dir_or_as_the_dir_above_resources_is_found() {
        let d = tempfile::tempdir().unwrap();
        let res = d.path().join("usr/lib/claude-desktop/resources");
        std::fs::create_dir_all(&res).unwrap();
        std::fs::write(res.join(HELPER), b"helper").unwrap();
        let app = find(Some(&d.path().join("usr/lib/claude-desktop"))).unwrap();
        assert_eq!(app.resources, std::fs::canonicalize(&res).unwrap());
        assert_eq!(app.kind, Kind::Official);
        assert_eq!(find(Some(&res)).unwrap(), app);
        // Named through a link: the resolved directory is what is changed.
        let link = d.path().join("link");
        std::os::unix::fs::symlink(res.parent().unwrap(), &link).unwrap();
        assert_eq!(find(Some(&link)).unwrap().resources, app.resources);
        assert!(matches!(
            find(Some(d.path())),
            Err(LayoutError::NotTheApp(_))
        ));
        let image = d.path().join("Claude-1.0.AppImage");
        std::fs::write(&image, b"ELF").unwrap();
        assert!(matches!(
            find(Some(&image)),
            Err(LayoutError::AppImageFile(_))
        ));
        assert_eq!(access(&res).unwrap(), Access::Writable);
    }
}
